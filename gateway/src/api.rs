// Long because it holds the API's handlers and authentication (split: auth, registry, runs, proxy, audit); kept whole until issue 19 splits it along its layers.
//! The gateway's HTTP API: the registry (modules and functions), runs by submit-token bearers,
//! and views of jobs, accounting and revocations (proxied to the scheduler, which owns them).
//!
//! A bearer's run is checked twice before any macaroon is requested: the token locally
//! (signature, issuer, audience, expiry), then by the scheduler's preflight (revocation, uses
//! left), so a revoked or spent token never makes the storage issue credentials.
//!
//! Every route but `GET /healthz`, `GET /v1/openapi.json` and `GET /v1/modules/{digest}` needs a
//! credential, checked here before anything else ([`require_caller`], [`require_admin`]):
//!
//! - the **admin token** of the config (the bootstrap credential, compared in constant time):
//!   scope `admin`, name `admin`;
//! - an **API token** ([`htfaas_functions::token::ApiClaims`], `htfaas token api`): a JWT the
//!   gateway's key signed for [`htfaas_functions::token::API_AUDIENCE`], with `sub` (the owner
//!   it acts as) and `scope`. A revocation naming its `jti`, its `sub` or its issuer refuses it
//!   (401) within [`REVOCATIONS_FRESH_S`] seconds: the [`authenticate`] layer reads the
//!   scheduler's revocations through [`RevocationCache`];
//! - a **submit token**, only on `POST /v1/functions/{name}/runs` (and no API token there).
//!
//! No credential, or one that does not verify: 401. A developer on an admin route: 403. A
//! developer sees and changes only what its `sub` owns: registering a function needs the
//! manifest's `owner` to be the `sub` and the name to be free or already its own (403
//! otherwise); testing another owner's function is 403; lists (functions, jobs, accounting) are
//! filtered to its own; audit queries get `owner=<sub>` forced (another `owner` is 403); another
//! owner's job (view, history, log, analyze, hold, release, remove) answers 404 exactly as an
//! unknown job does, so job ids of others reveal nothing.
//!
//! | route | scope | what |
//! |---|---|---|
//! | `GET /healthz` | none | liveness |
//! | `GET /v1/openapi.json` | none | the OpenAPI 3.1 document of this API ([`crate::openapi`]) |
//! | `POST /v1/modules` | developer | body = wasm bytes → `ModuleUploaded` (`{"digest":…}`) |
//! | `GET /v1/modules/{digest}` | none | module bytes (content-addressed; EPs verify the digest) |
//! | `POST /v1/functions` | developer (own) | body = `FunctionManifest` → `FunctionRecord` |
//! | `POST /v1/functions?dry_run=true[&since&until&limit]` | developer (own) | manifest, checked, not kept → `Report` |
//! | `GET /v1/functions` | developer (own) | `Vec<FunctionRecord>` |
//! | `POST /v1/functions/{name}/test` | developer (own) | body `TestRequest` → `TestReport` |
//! | `POST /v1/events/replay` | admin | body `ReplayRequest` → `Report` |
//! | `POST /v1/functions/{name}/runs` | submit token | body `RunRequest` (`{"path":…, "annex"?:…}`) → `SubmitResponse` |
//! | `GET /v1/jobs[/{id}]` | developer (own) | the scheduler's `JobRecord`s |
//! | `POST /v1/jobs/{id}/hold\|release\|remove` | developer (own) | body `JobAction` → the job (the scheduler acts) |
//! | `GET /v1/jobs/{id}/history` | developer (own) | `Vec<Attempt>`, first attempt first |
//! | `GET /v1/jobs/{id}/log` | developer (own) | `JobLog`: the guest's stdout and stderr of its last reported run |
//! | `GET /v1/jobs/{id}/analyze` | developer (own) | `JobAnalysis`: why it runs or does not |
//! | `GET /v1/accounting` | developer (own) | `Vec<Account>` |
//! | `GET /v1/accounting/report?by=owner\|group\|function[&since_ms&until_ms&period_s]` | admin | `AccountingReport`: jobs, hours and bytes per key and period, from the job records |
//! | `GET /v1/eps` | admin | `Vec<EpInfo>`: attached EPs and names with an admin setting |
//! | `POST /v1/eps/{name}/drain\|disable\|enable\|pause\|resume` | admin | body `EpAction` → `EpInfo` |
//! | `GET /v1/priorities` | admin | `PriorityReport` (fair-share standing of owners and groups) |
//! | `POST /v1/accounting/{owner}/factor` | admin | body `FactorRequest` → `OwnerPriority` |
//! | `POST /v1/revocations` | admin | body `RevokeRequest` → `Revocation` (the scheduler enforces it) |
//! | `GET /v1/revocations` | admin | every recorded revocation |
//! | `GET /v1/stats` | admin | `StatsSnapshot`: ingest counters |
//! | `GET /v1/audit[?job&token&owner&file&function&event&since&until&limit]` | developer (own) | the scheduler's audit records (`functions::audit::AuditRecord`s) |
//! | `GET /v1/audit/verify` | admin | the scheduler's `functions::audit::VerifyReport` of its trail |
//! | `GET /v1/audit/keys[?trail=gateway\|scheduler]` | admin | the JWKS of both audit keys (or of one trail's) |
//! | `GET /v1/lineage?file=PATH[&depth=N]` | admin | `Lineage`: the jobs that wrote and read the file, and back to its first upload ([`crate::audit::lineage`]) |
//!
//! Every audit route takes `?trail=gateway` for the gateway's own trail ([`crate::audit`]:
//! events matched, tokens minted, macaroons obtained, admin actions); without it, or with
//! `trail=scheduler`, it reads the scheduler's.
//!
//! [`ROUTES`] lists every (method, path) the router serves with its [`Access`]; a unit test
//! checks it against the `.route(…)` calls of [`router`], another against the OpenAPI document,
//! so a route cannot be added without being documented with its scope.
//!
//! A dry-run registration answers the recorded events (default: of the last day) its trigger would
//! fire on; a test says how one message (given, or recorded: `{"seq": N}`) parses and what the
//! trigger says, part by part; a replay (`{"since", "until"?, "function"?, "dry_run"?, "limit"?,
//! "replay_id"?}`) lists or fires again what the recorded events fire ([`crate::replay`]).
//! Times (`since`, `until`) are RFC 3339 strings (`2026-11-22T10:00:00Z`), Unix seconds (a JSON
//! number or a string of digits) or spans before now (`-2h`): [`crate::replay::parse_time`]. The
//! routes that read recorded events need a [`crate::replay::Events`] extension on the router
//! (the gateway's JetStream context) and answer 503 without one.
//!
//! Every scheduler route is proxied with the scheduler's admin token after this API's own scope
//! check; path segments are checked here (job ids `[A-Za-z0-9-]`, EP names and owners 1–128
//! printable characters without `/`, percent-encoded when forwarded) and bodies parsed into
//! their `proto` type, so the scheduler only ever sees well-formed requests.
//!
//! Every body and answer named above is a type of [`htfaas_functions::proto`] (the one owner of
//! what crosses a process boundary), except the registry's own `FunctionManifest` and
//! `FunctionRecord`.

use crate::Shared;
use crate::replay::{self, ReplayError};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use htfaas_functions::proto::{
    Account, AccountingBy, AccountingQuery, AuditTrail, JobRecord, Revocation, RevocationTarget,
};
use htfaas_functions::proto::{ApiError, ModuleUploaded, RegisterQuery, ReplayRequest, RunRequest, TestRequest};
use htfaas_functions::registry::MAX_MODULE_BYTES;
use htfaas_functions::token::constant_time_eq;
use htfaas_functions::token::{ApiClaims, Scope};
use htfaas_functions::{Digest, FunctionManifest, RegistryError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An error answer: status plus [`ApiError`] body.
#[derive(Debug)]
pub struct Failure(StatusCode, String);

impl Failure {
    /// An answer of `status` saying `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Failure {
        Failure(status, message.into())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(ApiError { error: self.1 })).into_response()
    }
}

impl From<ReplayError> for Failure {
    fn from(e: ReplayError) -> Self {
        let status = match &e {
            ReplayError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ReplayError::NotFound(_) => StatusCode::NOT_FOUND,
            ReplayError::Unavailable(_) => {
                tracing::warn!("replay: {e}");
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        Failure(status, e.to_string())
    }
}

impl From<RegistryError> for Failure {
    fn from(e: RegistryError) -> Self {
        let status = match &e {
            RegistryError::Manifest(_) | RegistryError::NotWasm(_) | RegistryError::UnknownModule(_) => {
                StatusCode::BAD_REQUEST
            }
            RegistryError::Grant(_) => StatusCode::BAD_REQUEST,
            RegistryError::NotFound(_) => StatusCode::NOT_FOUND,
            RegistryError::QuotaExceeded(_) => StatusCode::FORBIDDEN,
            RegistryError::Db(_) | RegistryError::Io(_) | RegistryError::Corrupt(_) => {
                tracing::error!("registry failure: {e}");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        Failure(status, e.to_string())
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No credential.
    Public,
    /// A submit token (never an API token).
    SubmitToken,
    /// An API token of either scope (a developer only for what its `sub` owns) or the admin token.
    Developer,
    /// The admin scope: an admin API token or the admin token.
    Admin,
}

impl Access {
    /// The name in the OpenAPI document's `x-htfaas-scope`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Public => "none",
            Access::SubmitToken => "submit",
            Access::Developer => "developer",
            Access::Admin => "admin",
        }
    }
}

/// One operation of this API.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// HTTP method, upper case.
    pub method: &'static str,
    /// The documented path (OpenAPI template).
    pub path: &'static str,
    /// The router's path that serves it (a shared template for verbs checked in the handler).
    pub route: &'static str,
    /// Who may call it.
    pub access: Access,
}

const fn op(method: &'static str, path: &'static str, route: &'static str, access: Access) -> Route {
    Route { method, path, route, access }
}

/// Every operation the router serves: keep it next to [`router`] (a unit test compares the two,
/// `openapi` tests compare it with the document).
pub const ROUTES: &[Route] = &[
    op("GET", "/healthz", "/healthz", Access::Public),
    op("GET", "/v1/openapi.json", "/v1/openapi.json", Access::Public),
    op("POST", "/v1/modules", "/v1/modules", Access::Developer),
    op("GET", "/v1/modules/{digest}", "/v1/modules/{digest}", Access::Public),
    op("POST", "/v1/functions", "/v1/functions", Access::Developer),
    op("GET", "/v1/functions", "/v1/functions", Access::Developer),
    op("POST", "/v1/functions/{name}/runs", "/v1/functions/{name}/runs", Access::SubmitToken),
    op("POST", "/v1/functions/{name}/test", "/v1/functions/{name}/test", Access::Developer),
    op("POST", "/v1/events/replay", "/v1/events/replay", Access::Admin),
    op("GET", "/v1/jobs", "/v1/jobs", Access::Developer),
    op("GET", "/v1/jobs/{id}", "/v1/jobs/{id}", Access::Developer),
    op("GET", "/v1/jobs/{id}/history", "/v1/jobs/{id}/{action}", Access::Developer),
    op("GET", "/v1/jobs/{id}/log", "/v1/jobs/{id}/{action}", Access::Developer),
    op("GET", "/v1/jobs/{id}/analyze", "/v1/jobs/{id}/{action}", Access::Developer),
    op("POST", "/v1/jobs/{id}/hold", "/v1/jobs/{id}/{action}", Access::Developer),
    op("POST", "/v1/jobs/{id}/release", "/v1/jobs/{id}/{action}", Access::Developer),
    op("POST", "/v1/jobs/{id}/remove", "/v1/jobs/{id}/{action}", Access::Developer),
    op("GET", "/v1/accounting", "/v1/accounting", Access::Developer),
    op("GET", "/v1/accounting/report", "/v1/accounting/report", Access::Admin),
    op("POST", "/v1/accounting/{owner}/factor", "/v1/accounting/{owner}/factor", Access::Admin),
    op("GET", "/v1/eps", "/v1/eps", Access::Admin),
    op("POST", "/v1/eps/{name}/drain", "/v1/eps/{name}/{action}", Access::Admin),
    op("POST", "/v1/eps/{name}/disable", "/v1/eps/{name}/{action}", Access::Admin),
    op("POST", "/v1/eps/{name}/enable", "/v1/eps/{name}/{action}", Access::Admin),
    op("POST", "/v1/eps/{name}/pause", "/v1/eps/{name}/{action}", Access::Admin),
    op("POST", "/v1/eps/{name}/resume", "/v1/eps/{name}/{action}", Access::Admin),
    op("GET", "/v1/priorities", "/v1/priorities", Access::Admin),
    op("POST", "/v1/revocations", "/v1/revocations", Access::Admin),
    op("GET", "/v1/revocations", "/v1/revocations", Access::Admin),
    op("GET", "/v1/stats", "/v1/stats", Access::Admin),
    op("GET", "/v1/audit", "/v1/audit", Access::Developer),
    op("GET", "/v1/audit/verify", "/v1/audit/verify", Access::Admin),
    op("GET", "/v1/audit/keys", "/v1/audit/keys", Access::Admin),
    op("GET", "/v1/lineage", "/v1/lineage", Access::Admin),
    op("GET", "/v1/namespaces", "/v1/namespaces", Access::Developer),
    op("POST", "/v1/namespaces", "/v1/namespaces", Access::Admin),
    op("POST", "/v1/namespaces/revoke", "/v1/namespaces/revoke", Access::Admin),
    op("GET", "/metrics", "/metrics", Access::Admin),
    // The console's static pages (`crate::console::routes`, merged): the page asks for a token
    // and calls the routes above with it.
    op("GET", "/console", "/console", Access::Public),
    op("GET", "/console/", "/console/", Access::Public),
    op("GET", "/console/app.js", "/console/app.js", Access::Public),
    op("GET", "/console/style.css", "/console/style.css", Access::Public),
];

/// The router, with its state. Every route added here goes into [`ROUTES`] and the OpenAPI
/// document ([`crate::openapi`]) too, with its scope.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/openapi.json", get(openapi_document))
        .route("/v1/modules", post(put_module).layer(DefaultBodyLimit::max(MAX_MODULE_BYTES)))
        .route("/v1/modules/{digest}", get(get_module))
        .route("/v1/functions", post(register).get(list_functions))
        .route("/v1/functions/{name}/runs", post(run_function))
        .route("/v1/functions/{name}/test", post(test_function))
        .route("/v1/events/replay", post(replay_events))
        .route("/v1/jobs", get(proxy_jobs))
        .route("/v1/jobs/{id}", get(proxy_job))
        .route("/v1/jobs/{id}/{action}", post(proxy_job_action).get(proxy_job_view))
        .route("/v1/accounting", get(proxy_accounting))
        .route("/v1/accounting/report", get(proxy_accounting_report))
        .route("/v1/accounting/{owner}/factor", post(proxy_set_factor))
        .route("/v1/eps", get(proxy_eps))
        .route("/v1/eps/{name}/{action}", post(proxy_ep_action))
        .route("/v1/priorities", get(proxy_priorities))
        .route("/v1/revocations", post(proxy_revoke).get(proxy_revocations))
        .route("/v1/stats", get(stats))
        .route("/v1/audit", get(proxy_audit))
        .route("/v1/audit/verify", get(proxy_audit_verify))
        .route("/v1/audit/keys", get(proxy_audit_keys))
        .route("/v1/lineage", get(lineage))
        .route("/v1/namespaces", get(crate::namespaces::list).post(crate::namespaces::grant))
        .route("/v1/namespaces/revoke", post(crate::namespaces::revoke))
        .route("/metrics", get(crate::metrics::serve))
        .layer(axum::middleware::from_fn_with_state(shared.clone(), authenticate))
        .merge(crate::console::routes())
        .with_state(shared)
}

async fn openapi_document() -> impl IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], crate::openapi::DOCUMENT)
}

/// The name a caller with the static admin token acts as.
pub const ADMIN_NAME: &str = "admin";

/// Who is calling, once the credential is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The owner an API token acts as (its `sub`); [`ADMIN_NAME`] for the admin token.
    pub name: String,
    /// What it may do.
    pub scope: Scope,
}

impl Caller {
    /// Whether it has the admin scope.
    pub fn is_admin(&self) -> bool {
        self.scope == Scope::Admin
    }

    /// Whether it may see and act on what `owner` owns.
    pub fn owns(&self, owner: &str) -> bool {
        self.is_admin() || self.name == owner
    }
}

/// The bearer credential of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The caller of a route open to either scope: the admin token, or an API token that verifies
/// (signature, `kid`, issuer, audience, expiry, a known scope; revocation is checked by the
/// [`authenticate`] layer). 401 otherwise.
pub fn require_caller(shared: &Shared, headers: &HeaderMap) -> Result<Caller, Failure> {
    let token = bearer(headers).ok_or_else(|| {
        Failure(StatusCode::UNAUTHORIZED, "API token required (Authorization: Bearer; see `htfaas token api`)".into())
    })?;
    if constant_time_eq(token.as_bytes(), shared.admin_token.as_bytes()) {
        return Ok(Caller { name: ADMIN_NAME.into(), scope: Scope::Admin });
    }
    let claims = shared
        .api_verifier
        .verify_api(token)
        .map_err(|e| Failure(StatusCode::UNAUTHORIZED, format!("API token refused: {e}")))?;
    Ok(Caller { name: claims.sub, scope: claims.scope })
}

/// Checks that the caller has the admin scope: 401 without a valid credential, 403 with a
/// developer's.
pub fn require_admin(shared: &Shared, headers: &HeaderMap) -> Result<(), Failure> {
    let caller = require_caller(shared, headers)?;
    if caller.is_admin() {
        return Ok(());
    }
    Err(Failure(
        StatusCode::FORBIDDEN,
        format!("this route needs scope admin; the token of {:?} has scope {}", caller.name, caller.scope),
    ))
}

/// How long a fetched list of revocations is used before it is fetched again, seconds.
pub const REVOCATIONS_FRESH_S: u64 = 5;
/// How long an old list is still used while the scheduler cannot be asked, seconds; past it,
/// API tokens are refused with 503.
pub const REVOCATIONS_STALE_S: u64 = 60;

/// The scheduler's revocations as the API-token check reads them: fetched
/// (`GET /v1/revocations`, with the scheduler's admin token) at most every
/// [`REVOCATIONS_FRESH_S`] seconds, by one request at a time.
#[derive(Debug, Default)]
pub struct RevocationCache {
    state: tokio::sync::Mutex<RevocationState>,
}

#[derive(Debug, Default)]
struct RevocationState {
    /// The last list fetched, and when.
    fetched: Option<(Instant, Vec<Revocation>)>,
    /// When a fetch last failed (so that a down scheduler is asked once a second, not per request).
    failed_at: Option<Instant>,
}

impl RevocationCache {
    /// `Err` (401) when a revocation names the token's `jti`, its `sub` or its issuer.
    async fn check(&self, shared: &Shared, claims: &ApiClaims) -> Result<(), Failure> {
        let mut state = self.state.lock().await;
        let fresh =
            state.fetched.as_ref().is_some_and(|(at, _)| at.elapsed() < Duration::from_secs(REVOCATIONS_FRESH_S));
        let backing_off = state.failed_at.is_some_and(|at| at.elapsed() < Duration::from_secs(1));
        if !fresh && !backing_off {
            match fetch_revocations(shared).await {
                Ok(list) => *state = RevocationState { fetched: Some((Instant::now(), list)), failed_at: None },
                Err(e) => {
                    tracing::warn!("cannot read the scheduler's revocations: {e}");
                    state.failed_at = Some(Instant::now());
                }
            }
        }
        let usable = state.fetched.as_ref().filter(|(at, _)| at.elapsed() < Duration::from_secs(REVOCATIONS_STALE_S));
        let Some((_, list)) = usable else {
            return Err(Failure(
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot check API-token revocations: the scheduler does not answer".into(),
            ));
        };
        match list.iter().find(|r| names_api_token(&r.target, claims)) {
            Some(r) => Err(Failure(StatusCode::UNAUTHORIZED, format!("API token revoked: {}", r.reason))),
            None => Ok(()),
        }
    }
}

/// Whether `target` revokes an API token: its `jti`, its owner (`sub`) or its issuer, as for
/// submit tokens.
fn names_api_token(target: &RevocationTarget, claims: &ApiClaims) -> bool {
    match target {
        RevocationTarget::Jti(j) => *j == claims.jti,
        RevocationTarget::Owner(o) => *o == claims.sub,
        RevocationTarget::Issuer(i) => *i == claims.iss,
    }
}

async fn fetch_revocations(shared: &Shared) -> Result<Vec<Revocation>, String> {
    let resp = shared
        .http
        .get(format!("{}/v1/revocations", shared.submitter_base()))
        .bearer_auth(&shared.scheduler_admin_token)
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("the scheduler answered {}", resp.status()));
    }
    resp.json().await.map_err(|e| e.to_string())
}

/// The layer in front of every route: a bearer that verifies as an API token is refused (401)
/// when revoked, before any handler runs. Whether the route takes it is the handler's check.
pub async fn authenticate(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let claims = bearer(request.headers()).and_then(|t| shared.api_verifier.verify_api(t).ok());
    if let Some(claims) = claims
        && let Err(refused) = shared.api_revocations.check(&shared, &claims).await
    {
        tracing::info!(jti = %claims.jti, sub = %claims.sub, "API token refused: {}", refused.1);
        return refused.into_response();
    }
    next.run(request).await
}

/// Runs a registry call on the blocking pool; its error as the API's answer.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RegistryError> + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("registry task: {e}")))?
        .map_err(Failure::from)
}

async fn put_module(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, Failure> {
    let caller = require_caller(&shared, &headers)?;
    let s = shared.clone();
    // A developer's uploads count against its owner's module quota; an admin's against none.
    let digest = if caller.is_admin() {
        blocking(move || s.registry.put_module(&body)).await?
    } else {
        let quota = shared.module_quota;
        blocking(move || s.registry.put_module_for(&caller.name, &body, quota)).await?
    };
    crate::audit::record_admin(&shared, &headers, "module.upload", audit_digest(&digest), serde_json::json!({})).await;
    Ok((StatusCode::CREATED, Json(ModuleUploaded { digest })))
}

async fn get_module(State(shared): State<Arc<Shared>>, Path(digest): Path<String>) -> Result<Response, Failure> {
    let digest: Digest = digest.parse().map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("{e}")))?;
    let s = shared.clone();
    let d = digest.clone();
    let path = blocking(move || s.registry.module_path(&d))
        .await?
        .ok_or_else(|| Failure(StatusCode::NOT_FOUND, format!("module {digest} not found")))?;
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("open module: {e}")))?;
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok(([(axum::http::header::CONTENT_TYPE, "application/wasm")], body).into_response())
}

/// The recorded events, or 503 when the router was built without them.
fn recorded(events: Option<Extension<replay::Events>>) -> Result<replay::Events, Failure> {
    events.map(|Extension(e)| e).ok_or_else(|| {
        Failure(
            StatusCode::SERVICE_UNAVAILABLE,
            "this gateway API was started without access to recorded events".into(),
        )
    })
}

async fn register(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    events: Option<Extension<replay::Events>>,
    uri: axum::http::Uri,
    body: Bytes,
) -> Result<Response, Failure> {
    let caller = require_caller(&shared, &headers)?;
    let Query(query) = Query::<RegisterQuery>::try_from_uri(&uri)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid query: {}", e.body_text())))?;
    let manifest: FunctionManifest = serde_json::from_slice(&body)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid manifest: {e}")))?;
    if !caller.owns(&manifest.owner) {
        return Err(Failure(
            StatusCode::FORBIDDEN,
            format!(
                "the manifest's owner is {:?}; a developer token of {:?} registers only its own functions",
                manifest.owner, caller.name
            ),
        ));
    }
    // Confined to its owner's namespace: where it may fire, write and run (a dry run too), once
    // it is known to be a manifest at all.
    manifest.validate().map_err(RegistryError::from)?;
    if let Err(e) = shared.namespaces.of(&manifest.owner, None).confine(&manifest) {
        tracing::info!(function = %manifest.name, owner = %manifest.owner, "registration refused: {e}");
        return Err(Failure(StatusCode::FORBIDDEN, format!("function {}: {e}", manifest.name)));
    }
    if query.dry_run {
        return dry_run_registration(&shared, events, &query, manifest).await;
    }
    if query != RegisterQuery::default() {
        return Err(Failure(StatusCode::BAD_REQUEST, "since, until and limit go with dry_run=true".into()));
    }
    let s = shared.clone();
    let name = manifest.name.clone();
    let taken = blocking(move || match s.registry.latest(&name) {
        Ok(existing) => Ok(Some(existing.manifest.owner)),
        Err(RegistryError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    })
    .await?;
    if let Some(owner) = taken.filter(|o| !caller.owns(o)) {
        tracing::info!(function = %manifest.name, %owner, caller = %caller.name, "registration refused: not the owner");
        return Err(Failure(StatusCode::FORBIDDEN, format!("function {} belongs to another owner", manifest.name)));
    }
    let s = shared.clone();
    let record = blocking(move || {
        let record = s.registry.register(manifest)?;
        s.triggers.reload(&s.registry)?;
        Ok(record)
    })
    .await?;
    tracing::info!(function = %record.manifest.name, version = record.version, "function registered");
    crate::audit::record_admin(&shared, &headers, "function.register", audit_function(&record), audit_args(&record))
        .await;
    Ok((StatusCode::CREATED, Json(record)).into_response())
}

/// `POST /v1/functions?dry_run=true`: the manifest is checked as a registration checks it (same
/// errors), not stored, and answered with the recorded events its trigger would fire on.
async fn dry_run_registration(
    shared: &Arc<Shared>,
    events: Option<Extension<replay::Events>>,
    query: &RegisterQuery,
    manifest: FunctionManifest,
) -> Result<Response, Failure> {
    let window = replay::register_window(query, replay::now_ms())?;
    let s = shared.clone();
    let manifest = blocking(move || {
        manifest.validate()?;
        if s.registry.module_path(&manifest.module)?.is_none() {
            return Err(RegistryError::UnknownModule(manifest.module.clone()));
        }
        Ok(manifest)
    })
    .await?;
    let events = recorded(events)?;
    let target = replay::candidate(manifest)?;
    let report = replay::run(shared, &events.0, &window, &[target], &replay::Mode::DryRun).await?;
    Ok((StatusCode::OK, Json(report)).into_response())
}

/// `POST /v1/functions/{name}/test`: how one message parses, and what the function's trigger
/// says about it.
async fn test_function(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    events: Option<Extension<replay::Events>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<impl IntoResponse, Failure> {
    let caller = require_caller(&shared, &headers)?;
    let request: TestRequest =
        serde_json::from_slice(&body).map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid test: {e}")))?;
    let s = shared.clone();
    let record = blocking(move || s.registry.latest(&name)).await?;
    if !caller.owns(&record.manifest.owner) {
        return Err(Failure(
            StatusCode::FORBIDDEN,
            format!("function {} belongs to another owner", record.manifest.name),
        ));
    }
    let events = events.map(|Extension(e)| e);
    let report =
        replay::test_request(events.as_ref(), &record, &request, &shared.sources(), &shared.source_paths).await?;
    // A recorded message is another's unless it is an event inside the caller's read namespace:
    // a developer learns nothing of it, not even that it exists.
    if let Some(seq) = request.seq
        && !caller.is_admin()
        && !report.event.as_ref().is_some_and(|e| shared.namespaces.of(&caller.name, None).may_read(&e.path))
    {
        return Err(Failure(
            StatusCode::NOT_FOUND,
            format!("no recorded event with sequence {seq} in the read namespace of {}", caller.name),
        ));
    }
    Ok(Json(report))
}

/// `POST /v1/events/replay`: a dry run lists the (event, function) pairs of the recorded events
/// that fire; a replay fires them again, under a replay id.
async fn replay_events(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    events: Option<Extension<replay::Events>>,
    body: Bytes,
) -> Result<impl IntoResponse, Failure> {
    require_admin(&shared, &headers)?;
    let request: ReplayRequest = serde_json::from_slice(&body)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid replay request: {e}")))?;
    let (window, mode) = replay::plan(&request, replay::now_ms())?;
    let events = recorded(events)?;
    let s = shared.clone();
    let function = request.function.clone();
    let records = blocking(move || match function {
        Some(name) => Ok(vec![s.registry.latest(&name)?]),
        None => s.registry.list(),
    })
    .await?;
    if let replay::Mode::Replay(id) = &mode {
        tracing::info!(replay = %id, function = ?request.function, since = window.since_ms, "replay requested");
    }
    let report = replay::run(&shared, &events.0, &window, &replay::Target::all(records), &mode).await?;
    crate::audit::record_replay(&shared, &headers, &mode, &report).await;
    Ok(Json(report))
}

/// `GET /v1/functions`: every function for an admin, a developer's own otherwise.
async fn list_functions(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<impl IntoResponse, Failure> {
    let caller = require_caller(&shared, &headers)?;
    let s = shared.clone();
    let mut records = blocking(move || s.registry.list()).await?;
    records.retain(|r| caller.owns(&r.manifest.owner));
    Ok(Json(records))
}

async fn stats(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<impl IntoResponse, Failure> {
    require_admin(&shared, &headers)?;
    Ok(Json(shared.stats.snapshot()))
}

/// Most jobs the scheduler lists in one answer (its `MAX_LIST_LIMIT`): what a developer's
/// list is filtered from.
const SCHEDULER_MAX_LIST: usize = 10_000;
/// A list's length when the query names none (the scheduler's `DEFAULT_LIST_LIMIT`).
const DEFAULT_LIST: usize = 100;

/// `GET /v1/jobs[?limit=n]`: an admin's query goes to the scheduler as it came; a developer
/// gets its own jobs among the scheduler's newest [`SCHEDULER_MAX_LIST`], newest first, at most
/// `limit`.
async fn proxy_jobs(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    RawQuery(query): RawQuery,
) -> Result<Response, Failure> {
    let caller = require_caller(&shared, &headers)?;
    if caller.is_admin() {
        let suffix = query.map(|q| format!("?{q}")).unwrap_or_default();
        return forward_get(&shared, &format!("/v1/jobs{suffix}")).await;
    }
    #[derive(serde::Deserialize)]
    struct ListQuery {
        limit: Option<usize>,
    }
    let Query(list) = Query::<ListQuery>::try_from_uri(&uri)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid query: {}", e.body_text())))?;
    let mut jobs: Vec<JobRecord> = scheduler_json(&shared, &format!("/v1/jobs?limit={SCHEDULER_MAX_LIST}")).await?;
    jobs.retain(|j| j.owner == caller.name);
    jobs.truncate(list.limit.unwrap_or(DEFAULT_LIST).min(SCHEDULER_MAX_LIST));
    Ok(Json(jobs).into_response())
}

async fn proxy_job(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let caller = require_caller(&shared, &headers)?;
    check_job_id(&id)?;
    if !caller.is_admin() {
        return Ok(Json(own_job(&shared, &caller, &id).await?).into_response());
    }
    forward_get(&shared, &format!("/v1/jobs/{id}")).await
}

/// The job `id` when the caller may see it; another owner's job is 404, worded as the
/// scheduler words an unknown one, so that it reveals nothing.
async fn own_job(shared: &Shared, caller: &Caller, id: &str) -> Result<JobRecord, Failure> {
    let job: JobRecord = scheduler_json(shared, &format!("/v1/jobs/{id}")).await?;
    if !caller.owns(&job.owner) {
        return Err(Failure(StatusCode::NOT_FOUND, format!("job {id:?} not found")));
    }
    Ok(job)
}

/// GETs `path` from the scheduler (admin token) and parses its JSON answer; a refusal keeps
/// the scheduler's status and reason.
async fn scheduler_json<T: serde::de::DeserializeOwned>(shared: &Shared, path: &str) -> Result<T, Failure> {
    let url = format!("{}{path}", shared.submitter_base());
    let resp = shared
        .http
        .get(url)
        .bearer_auth(&shared.scheduler_admin_token)
        .send()
        .await
        .map_err(|e| Failure(StatusCode::BAD_GATEWAY, format!("scheduler unreachable: {e}")))?;
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let body = resp.bytes().await.map_err(|e| Failure(StatusCode::BAD_GATEWAY, format!("scheduler answer: {e}")))?;
    if !status.is_success() {
        let reason = serde_json::from_slice::<ApiError>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(200).collect());
        return Err(Failure(status, reason));
    }
    serde_json::from_slice(&body).map_err(|e| Failure(StatusCode::BAD_GATEWAY, format!("scheduler answer: {e}")))
}

/// Job ids are `[A-Za-z0-9-]+` (uuids), so they go into the scheduler's URL as they are.
fn check_job_id(id: &str) -> Result<(), Failure> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(Failure(StatusCode::BAD_REQUEST, format!("bad job id {id:?}: want [A-Za-z0-9-]")));
    }
    Ok(())
}

/// Checks an EP name or an owner taken from the path and returns it percent-encoded for the
/// scheduler's URL: 1–128 printable characters, no `/`, and not `.` or `..` (which URL parsers
/// resolve as directory steps, even percent-encoded).
fn path_name(what: &str, name: &str) -> Result<String, Failure> {
    let ok = (1..=128).contains(&name.chars().count())
        && !name.chars().any(|c| c.is_control() || c == '/')
        && name != "."
        && name != "..";
    if !ok {
        return Err(Failure(
            StatusCode::BAD_REQUEST,
            format!("bad {what} {name:?}: want 1 to 128 printable characters, no '/', not '.' or '..'"),
        ));
    }
    Ok(crate::storage_client::encode_path(name))
}

/// `GET /v1/jobs/{id}/history|analyze|log`: shares its path with the job actions, not its method.
async fn proxy_job_view(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((id, view)): Path<(String, String)>,
) -> Result<Response, Failure> {
    let caller = require_caller(&shared, &headers)?;
    check_job_id(&id)?;
    if !matches!(view.as_str(), "history" | "analyze" | "log") {
        return Err(Failure(StatusCode::NOT_FOUND, format!("no job view {view:?} (history, analyze, log)")));
    }
    if !caller.is_admin() {
        own_job(&shared, &caller, &id).await?;
    }
    forward_get(&shared, &format!("/v1/jobs/{id}/{view}")).await
}

async fn proxy_job_action(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, Failure> {
    let caller = require_caller(&shared, &headers)?;
    check_job_id(&id)?;
    if !matches!(action.as_str(), "hold" | "release" | "remove") {
        return Err(Failure(StatusCode::NOT_FOUND, format!("no job action {action:?} (hold, release, remove)")));
    }
    let request: htfaas_functions::proto::JobAction = serde_json::from_slice(&body)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid job action: {e}")))?;
    if !caller.is_admin() {
        own_job(&shared, &caller, &id).await?;
    }
    tracing::info!(job = %id, %action, caller = %caller.name, reason = %request.reason, "job action requested");
    let url = format!("{}/v1/jobs/{id}/{action}", shared.submitter_base());
    let done = forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await?;
    let job = htfaas_functions::audit::Subject { job: Some(id), ..Default::default() };
    let args = serde_json::json!({ "reason": request.reason });
    Ok(crate::audit::record_forwarded(&shared, &headers, &format!("job.{action}"), job, args, done).await)
}

/// `GET /v1/accounting`: every owner's account for an admin, a developer's own otherwise.
async fn proxy_accounting(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, Failure> {
    let caller = require_caller(&shared, &headers)?;
    if caller.is_admin() {
        return forward_get(&shared, "/v1/accounting").await;
    }
    let mut accounts: Vec<Account> = scheduler_json(&shared, "/v1/accounting").await?;
    accounts.retain(|a| a.owner == caller.name);
    Ok(Json(accounts).into_response())
}

/// `GET /v1/accounting/report`: the query is parsed into an `AccountingQuery` here and sent on
/// re-encoded (digits and fixed words), so the scheduler sees only well-formed ones.
async fn proxy_accounting_report(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<AccountingQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    let Query(q) = query.map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid accounting query: {e}")))?;
    let by = match q.by {
        AccountingBy::Owner => "owner",
        AccountingBy::Group => "group",
        AccountingBy::Function => "function",
    };
    let mut path = format!("/v1/accounting/report?by={by}");
    for (name, value) in [("since_ms", q.since_ms), ("until_ms", q.until_ms), ("period_s", q.period_s)] {
        if let Some(v) = value {
            path.push_str(&format!("&{name}={v}"));
        }
    }
    forward_get(&shared, &path).await
}

async fn proxy_priorities(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, Failure> {
    proxy(&shared, &headers, "/v1/priorities").await
}

async fn proxy_set_factor(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(owner): Path<String>,
    body: Bytes,
) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    let encoded = path_name("owner", &owner)?;
    let request: htfaas_functions::proto::FactorRequest = serde_json::from_slice(&body)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid factor request: {e}")))?;
    tracing::info!(%owner, factor = request.factor, "priority factor change requested");
    let url = format!("{}/v1/accounting/{encoded}/factor", shared.submitter_base());
    let done = forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await?;
    let subject = htfaas_functions::audit::Subject { owner: Some(owner), ..Default::default() };
    let args = serde_json::json!({ "factor": request.factor });
    Ok(crate::audit::record_forwarded(&shared, &headers, "owner.set_factor", subject, args, done).await)
}

async fn proxy_eps(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, Failure> {
    proxy(&shared, &headers, "/v1/eps").await
}

/// The EP actions the scheduler knows.
const EP_ACTIONS: [&str; 5] = ["drain", "disable", "enable", "pause", "resume"];

/// `POST /v1/eps/{name}/{action}`. Which fields of the body each action takes (`deadline_s`
/// for drain, `group` for pause and resume) is the scheduler's rule; it is checked there.
async fn proxy_ep_action(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    let encoded = path_name("EP name", &name)?;
    if !EP_ACTIONS.contains(&action.as_str()) {
        return Err(Failure(StatusCode::NOT_FOUND, format!("no EP action {action:?} ({})", EP_ACTIONS.join(", "))));
    }
    let request: htfaas_functions::proto::EpAction = serde_json::from_slice(&body)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid EP action: {e}")))?;
    tracing::info!(ep = %name, %action, reason = %request.reason, "EP action requested");
    let url = format!("{}/v1/eps/{encoded}/{action}", shared.submitter_base());
    let done = forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await?;
    let args = serde_json::json!({ "ep": name, "request": request });
    Ok(crate::audit::record_forwarded(&shared, &headers, &format!("ep.{action}"), Default::default(), args, done).await)
}

/// `GET /v1/audit`: an admin's query goes to the scheduler as it came (the scheduler parses it
/// and refuses unknown parameters); a developer's is parsed here and gets `owner=<sub>`.
async fn proxy_audit(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, Failure> {
    let caller = require_caller(&shared, &headers)?;
    let (trail, query) = audit_trail(query)?;
    if caller.is_admin() && trail == AuditTrail::Scheduler {
        let suffix = query.map(|q| format!("?{q}")).unwrap_or_default();
        return forward_get(&shared, &format!("/v1/audit{suffix}")).await;
    }
    let uri: axum::http::Uri = format!("/v1/audit?{}", query.unwrap_or_default())
        .parse()
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid audit query: {e}")))?;
    let Query(mut filter) = Query::<htfaas_functions::audit::AuditFilter>::try_from_uri(&uri)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid audit query: {}", e.body_text())))?;
    if caller.is_admin() {
        return gateway_audit(&shared, filter).await;
    }
    if filter.owner.as_ref().is_some_and(|o| *o != caller.name) {
        return Err(Failure(
            StatusCode::FORBIDDEN,
            format!("a developer token of {:?} reads only its own audit records", caller.name),
        ));
    }
    filter.owner = Some(caller.name);
    if trail == AuditTrail::Gateway {
        return gateway_audit(&shared, filter).await;
    }
    let mut url = reqwest::Url::parse(&format!("{}/v1/audit", shared.submitter_base()))
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("scheduler URL: {e}")))?;
    if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(&filter) {
        let mut pairs = url.query_pairs_mut();
        for (k, v) in fields {
            match v {
                serde_json::Value::String(s) => pairs.append_pair(&k, &s),
                serde_json::Value::Null => continue,
                other => pairs.append_pair(&k, &other.to_string()),
            };
        }
    }
    forward(shared.http.get(url).bearer_auth(&shared.scheduler_admin_token)).await
}

/// `GET /v1/audit/verify[?trail=gateway]`: the scheduler's trail (default) or the gateway's,
/// checked under its writer's key.
async fn proxy_audit_verify(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    match audit_trail(query)? {
        (AuditTrail::Scheduler, None) => forward_get(&shared, "/v1/audit/verify").await,
        (AuditTrail::Gateway, None) => {
            let report = crate::audit::verify(&shared).await.map_err(|e| {
                tracing::error!("verify the gateway's audit trail: {e}");
                Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("verify the gateway's audit trail: {e}"))
            })?;
            Ok(Json(report).into_response())
        }
        (_, Some(q)) => Err(Failure(StatusCode::BAD_REQUEST, format!("unknown audit verify parameters {q:?}"))),
    }
}

/// `GET /v1/audit/keys[?trail=]`: both audit keys in one JWKS (kids `scheduler-audit-1`,
/// `gateway-audit-1`), so one file verifies a copy of either trail; or one trail's.
async fn proxy_audit_keys(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    let gateway = shared.audit.signer.jwks();
    match query.as_deref() {
        Some("trail=gateway") => return Ok(Json(gateway).into_response()),
        Some("trail=scheduler") => return forward_get(&shared, "/v1/audit/keys").await,
        Some(q) => return Err(Failure(StatusCode::BAD_REQUEST, format!("unknown audit keys parameters {q:?}"))),
        None => {}
    }
    let mut both: serde_json::Value = scheduler_json(&shared, "/v1/audit/keys").await?;
    let ours = serde_json::to_value(&gateway).ok();
    let ours = ours.as_ref().and_then(|v| v.get("keys")).and_then(|k| k.as_array()).cloned().unwrap_or_default();
    match both.get_mut("keys").and_then(|k| k.as_array_mut()) {
        Some(keys) => keys.extend(ours),
        None => return Err(Failure(StatusCode::BAD_GATEWAY, "the scheduler's audit keys are not a JWKS".into())),
    }
    Ok(Json(both).into_response())
}

/// `?trail=gateway|scheduler` taken out of an audit route's query: the trail and the rest.
fn audit_trail(query: Option<String>) -> Result<(AuditTrail, Option<String>), Failure> {
    let Some(query) = query else { return Ok((AuditTrail::Scheduler, None)) };
    let mut trail = AuditTrail::Scheduler;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.strip_prefix("trail=") {
            Some("gateway") => trail = AuditTrail::Gateway,
            Some("scheduler") => trail = AuditTrail::Scheduler,
            Some(other) => {
                return Err(Failure(StatusCode::BAD_REQUEST, format!("unknown trail {other:?} (gateway, scheduler)")));
            }
            None => rest.push(pair),
        }
    }
    Ok((trail, (!rest.is_empty()).then(|| rest.join("&"))))
}

/// The gateway trail's records `filter` selects (limit as the scheduler's: default 1000, at
/// most 100,000).
async fn gateway_audit(shared: &Shared, mut filter: htfaas_functions::audit::AuditFilter) -> Result<Response, Failure> {
    filter.limit = Some(filter.limit.unwrap_or(1000).min(100_000));
    let records = crate::audit::query(shared, filter).await.map_err(|e| {
        tracing::error!("query the gateway's audit trail: {e}");
        Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("query the gateway's audit trail: {e}"))
    })?;
    Ok(Json(records).into_response())
}

/// `GET /v1/lineage?file=PATH[&depth=N]`: where the file comes from, from both trails.
async fn lineage(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<htfaas_functions::proto::LineageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    let Query(q) = query.map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid lineage query: {e}")))?;
    let depth = q.depth.unwrap_or(crate::audit::MAX_LINEAGE_DEPTH);
    let lineage = crate::audit::lineage(&shared, &q.file, depth).await.map_err(|e| {
        tracing::warn!(file = %q.file, "lineage: {e}");
        Failure(StatusCode::BAD_GATEWAY, format!("lineage of {}: {e}", q.file))
    })?;
    Ok(Json(lineage).into_response())
}

/// The audit subject of a module.
fn audit_digest(digest: &Digest) -> htfaas_functions::audit::Subject {
    htfaas_functions::audit::Subject { digest: Some(digest.as_str().to_owned()), ..Default::default() }
}

/// The audit subject of a registered function.
fn audit_function(record: &htfaas_functions::FunctionRecord) -> htfaas_functions::audit::Subject {
    let m = &record.manifest;
    htfaas_functions::audit::Subject {
        function: Some(m.name.clone()),
        owner: Some(m.owner.clone()),
        digest: Some(m.module.as_str().to_owned()),
        paths: vec![m.outputs.dir.clone()],
        ..Default::default()
    }
}

/// What a registration's record keeps of the function: version and trigger.
fn audit_args(record: &htfaas_functions::FunctionRecord) -> serde_json::Value {
    serde_json::json!({ "version": record.version, "trigger": record.manifest.trigger })
}

/// The audit subject of a revocation's target.
fn audit_revocation(target: &RevocationTarget) -> htfaas_functions::audit::Subject {
    let mut subject = htfaas_functions::audit::Subject::default();
    match target {
        RevocationTarget::Jti(jti) => subject.token_jti = Some(jti.clone()),
        RevocationTarget::Owner(owner) => subject.owner = Some(owner.clone()),
        RevocationTarget::Issuer(_) => {}
    }
    subject
}

async fn proxy_revocations(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, Failure> {
    proxy(&shared, &headers, "/v1/revocations").await
}

async fn proxy_revoke(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    let request: htfaas_functions::proto::RevokeRequest = serde_json::from_slice(&body)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid revocation: {e}")))?;
    tracing::warn!(target = ?request.target, reason = %request.reason, "revocation requested");
    let url = format!("{}/v1/revocations", shared.submitter_base());
    let done = forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await?;
    let subject = audit_revocation(&request.target);
    let args = serde_json::json!({ "target": request.target, "reason": request.reason });
    Ok(crate::audit::record_forwarded(&shared, &headers, "token.revoke", subject, args, done).await)
}

/// An admin route's GET, relayed to the scheduler.
async fn proxy(shared: &Shared, headers: &HeaderMap, path: &str) -> Result<Response, Failure> {
    require_admin(shared, headers)?;
    forward_get(shared, path).await
}

/// Relays a GET of `path` to the scheduler (the caller's scope already checked).
async fn forward_get(shared: &Shared, path: &str) -> Result<Response, Failure> {
    let url = format!("{}{path}", shared.submitter_base());
    forward(shared.http.get(url).bearer_auth(&shared.scheduler_admin_token)).await
}

/// Sends a request to the scheduler and relays its status and JSON body.
async fn forward(request: reqwest::RequestBuilder) -> Result<Response, Failure> {
    let resp =
        request.send().await.map_err(|e| Failure(StatusCode::BAD_GATEWAY, format!("scheduler unreachable: {e}")))?;
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let body = resp.bytes().await.map_err(|e| Failure(StatusCode::BAD_GATEWAY, format!("scheduler answer: {e}")))?;
    Ok((status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

impl Shared {
    fn submitter_base(&self) -> String {
        self.submitter.scheduler_url().to_owned()
    }
}

/// The bearer of a submit token runs a registered function on a file: the same path a
/// triggered job takes (macaroons, scheduler, EP), accounted to the token's subject.
async fn run_function(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<impl IntoResponse, Failure> {
    let token = bearer(&headers)
        .ok_or_else(|| Failure(StatusCode::UNAUTHORIZED, "submit token required (Authorization: Bearer)".into()))?
        .to_owned();
    if shared.api_verifier.verify_api(&token).is_ok() {
        return Err(Failure(
            StatusCode::UNAUTHORIZED,
            "an API token is not a submit token (see `htfaas token submit`)".into(),
        ));
    }
    let claims =
        shared.submitter.verify(&token).map_err(|e| Failure(StatusCode::UNAUTHORIZED, format!("submit token: {e}")))?;
    let run: RunRequest =
        serde_json::from_slice(&body).map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid request: {e}")))?;
    if !htfaas_functions::manifest::is_clean_abs_path(&run.path) || run.path.ends_with('/') {
        return Err(Failure(StatusCode::BAD_REQUEST, format!("{:?} is not a clean absolute file path", run.path)));
    }
    let s = shared.clone();
    let function = blocking(move || s.registry.latest(&name)).await?;
    let m = &function.manifest;
    if !manual_run_allowed(&m.trigger, &run.path) {
        return Err(Failure(
            StatusCode::FORBIDDEN,
            format!(
                "{} does not match the trigger {} of function {} (a manual run needs the trigger true for \
                 the path alone: a test on size, class or owner is unknown for it)",
                run.path, m.trigger, m.name
            ),
        ));
    }
    // The bearer's own namespace: it reads the file and has the outputs written where it may.
    let bearer_ns = shared.namespaces.of(&claims.sub, claims.group.as_deref());
    if !bearer_ns.may_read(&run.path) {
        return Err(Failure(
            StatusCode::FORBIDDEN,
            format!("{} is outside the read namespace of {}", run.path, claims.sub),
        ));
    }
    if !bearer_ns.may_write(&m.outputs.dir) {
        return Err(Failure(
            StatusCode::FORBIDDEN,
            format!("function {} writes to {}, outside the write namespace of {}", m.name, m.outputs.dir, claims.sub),
        ));
    }
    if claims.function.as_ref().is_some_and(|d| *d != m.module) {
        return Err(Failure(StatusCode::FORBIDDEN, format!("the token does not allow function {}", m.module)));
    }
    let annex = match (&m.annex, run.annex) {
        (Some(fixed), Some(asked)) if *fixed != asked => {
            return Err(Failure(
                StatusCode::BAD_REQUEST,
                format!("function {} runs only on annex {fixed:?}, not {asked:?}", m.name),
            ));
        }
        (fixed, asked) => asked.or_else(|| fixed.clone()),
    };
    if let Some(a) = &annex {
        htfaas_functions::manifest::check_name(a)
            .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("annex name {e}")))?;
        if !bearer_ns.may_use_annex(a) {
            return Err(Failure(StatusCode::FORBIDDEN, format!("{} may not use annex {a:?}", claims.sub)));
        }
    }
    shared.submitter.preflight(&token).await.map_err(scheduler_failure)?;
    let run_id = htfaas_functions::token::new_jti();
    let event = htfaas_functions::proto::EventRef::new("submit", format!("{}/{run_id}", claims.jti), run.path.clone());
    let mut request =
        crate::ingest::prepare(&shared, &function, event, format!("submit:{run_id}")).await.map_err(|e| match e {
            crate::ingest::Failure::Transient(e) => Failure(StatusCode::SERVICE_UNAVAILABLE, e),
            crate::ingest::Failure::Permanent(e) => Failure(StatusCode::BAD_GATEWAY, e),
        })?;
    request.annex = annex;
    let reply = shared.submitter.submit_with_token(&token, &request).await.map_err(scheduler_failure)?;
    tracing::info!(job = %reply.job_id, jti = %claims.jti, function = %m.name, "job submitted by token bearer");
    Ok((StatusCode::CREATED, Json(reply)))
}

/// Whether a token bearer may run a function with `trigger` on `path`. The trigger is
/// evaluated on the event a manual run stands for: a write (`kind == "write"`) of `path`, of
/// type `manual`, from no storage source (`source` reads `cloudevents`). A manual run knows no
/// size, storage class or owner, so tests on those are undefined; the run is allowed only when
/// the trigger is true for what it does know (an undefined test could otherwise let a bearer
/// past a rule such as `size > 1MB` or `owner == "x"` on any path).
fn manual_run_allowed(trigger: &htfaas_functions::Trigger, path: &str) -> bool {
    use htfaas_functions::event::{EventKind, EventSource, SourceKind, StorageEvent};
    use htfaas_functions::trigger::Truth;
    let event = StorageEvent {
        source: EventSource { kind: SourceKind::Cloudevents, producer: "submit".into(), message: None },
        kind: EventKind::Write,
        msg_type: "manual".into(),
        path: path.to_owned(),
        size: None,
        storage_class: None,
        owner: None,
        macaroon: None,
        id: "submit:manual".into(),
        time: None,
    };
    trigger.compile().is_ok_and(|rule| rule.evaluate(&event) == Truth::True)
}

/// The scheduler's refusal with its own status and reason; unavailability as 503.
fn scheduler_failure(e: crate::submit::SubmitError) -> Failure {
    match e {
        crate::submit::SubmitError::Refused { status, reason } => {
            Failure(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY), reason)
        }
        crate::submit::SubmitError::Busy(reason) => Failure(StatusCode::TOO_MANY_REQUESTS, reason),
        e => Failure(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The (method, router path) pairs of the `.route(…)` calls in [`router`]'s source, and in
    /// the console's `routes()` it merges.
    fn routed_in_source() -> std::collections::BTreeSet<(String, String)> {
        let mut out = routed_in(include_str!("api.rs"), "pub fn router(");
        out.extend(routed_in(include_str!("console.rs"), "pub fn routes<"));
        out
    }

    fn routed_in(src: &str, function: &str) -> std::collections::BTreeSet<(String, String)> {
        let start = src.find(function).expect("the router function in the source");
        let body = &src[start..];
        let body = &body[..body.find("\n}\n").expect("end of router")];
        let body = body.replace(".merge(crate::console::routes())", "");
        for other in [".merge(", ".nest(", ".fallback(", ".route_service("] {
            assert!(!body.contains(other), "router uses {other}: list its routes in ROUTES and teach this test");
        }
        let mut out = std::collections::BTreeSet::new();
        for chunk in body.split(".route(\"").skip(1) {
            let (path, rest) = chunk.split_once('"').expect("a path literal");
            let mut depth = 1;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let args = &rest[..end];
            let mut methods = 0;
            for m in ["get", "post", "put", "delete", "patch", "head", "options", "any"] {
                for (i, _) in args.match_indices(&format!("{m}(")) {
                    let word_start =
                        !args[..i].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
                    if word_start {
                        assert_ne!(m, "any", "{path}: any() serves every method; list them");
                        out.insert((m.to_uppercase(), path.to_owned()));
                        methods += 1;
                    }
                }
            }
            assert!(methods > 0, "no method found for route {path}");
        }
        out
    }

    #[test]
    fn routes_lists_exactly_what_the_router_serves() {
        let listed: std::collections::BTreeSet<(String, String)> =
            ROUTES.iter().map(|r| (r.method.to_owned(), r.route.to_owned())).collect();
        let routed = routed_in_source();
        assert!(routed.len() > 20, "the source scan found too few routes: {routed:?}");
        let unlisted: Vec<_> = routed.difference(&listed).collect();
        let stale: Vec<_> = listed.difference(&routed).collect();
        assert!(unlisted.is_empty(), "routes of router() missing from ROUTES (and so from openapi.json): {unlisted:?}");
        assert!(stale.is_empty(), "ROUTES entries the router does not serve: {stale:?}");
    }

    /// The claim checks of [`require_caller`] and [`require_admin`], on a gateway's state.
    #[tokio::test]
    async fn api_tokens_are_checked_for_audience_expiry_key_and_scope() {
        use htfaas_functions::token::{API_AUDIENCE, LEEWAY_S, SUBMIT_AUDIENCE, SigningKey, SubmitClaims, now_s};
        let dir = tempfile::tempdir().expect("tempdir");
        let config: crate::Config = serde_json::from_value(serde_json::json!({
            "listen": "127.0.0.1:0", "nats_url": "nats://127.0.0.1:1",
            "registry_dir": dir.path().join("registry"), "storage_url": "http://127.0.0.1:1",
            "storage_user": "gateway", "scheduler_url": "http://127.0.0.1:1",
            "scheduler_admin_token": "s", "signing_key_file": dir.path().join("submit.pem"), "admin_token": "adm",
        }))
        .expect("config");
        let shared = config.resolve().await.expect("resolve").shared();
        let key = SigningKey::load_or_create(&dir.path().join("submit.pem"), "gateway-1").expect("the gateway's key");
        let headers = |token: &str| {
            let mut h = HeaderMap::new();
            h.insert(axum::http::header::AUTHORIZATION, format!("Bearer {token}").parse().expect("header"));
            h
        };
        let refused = |r: Result<Caller, Failure>| match r {
            Ok(c) => panic!("accepted as {c:?}"),
            Err(Failure(status, message)) => (status, message),
        };

        let dev = key.sign(&ApiClaims::new("htfaas-gateway", "alice", Scope::Developer, 60)).expect("sign");
        let caller = require_caller(&shared, &headers(&dev)).expect("a developer token");
        assert_eq!(caller, Caller { name: "alice".into(), scope: Scope::Developer });
        assert!(caller.owns("alice") && !caller.owns("bob"));
        let Err(Failure(status, message)) = require_admin(&shared, &headers(&dev)) else {
            panic!("developer as admin")
        };
        assert_eq!(
            (status, message.as_str()),
            (StatusCode::FORBIDDEN, r#"this route needs scope admin; the token of "alice" has scope developer"#)
        );
        let admin = key.sign(&ApiClaims::new("htfaas-gateway", "root", Scope::Admin, 60)).expect("sign");
        assert!(require_admin(&shared, &headers(&admin)).is_ok());
        assert!(require_admin(&shared, &headers("adm")).is_ok(), "the configured admin token");
        assert!(require_caller(&shared, &headers("adm")).is_ok_and(|c| c.owns("anyone")));

        let mut wrong_aud = ApiClaims::new("htfaas-gateway", "alice", Scope::Admin, 60);
        wrong_aud.aud = SUBMIT_AUDIENCE.into();
        let (status, message) = refused(require_caller(&shared, &headers(&key.sign(&wrong_aud).expect("sign"))));
        assert_eq!((status, message.as_str()), (StatusCode::UNAUTHORIZED, "API token refused: wrong audience"));

        let mut expired = ApiClaims::new("htfaas-gateway", "alice", Scope::Admin, 0);
        expired.exp = now_s() - LEEWAY_S - 10;
        let (status, message) = refused(require_caller(&shared, &headers(&key.sign(&expired).expect("sign"))));
        assert_eq!((status, message.as_str()), (StatusCode::UNAUTHORIZED, "API token refused: token expired"));

        let mut root = serde_json::to_value(ApiClaims::new("htfaas-gateway", "alice", Scope::Admin, 60)).expect("json");
        root["scope"] = "root".into();
        let (status, message) = refused(require_caller(&shared, &headers(&key.sign(&root).expect("sign"))));
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(
            message.starts_with("API token refused: invalid token: API token claims: unknown variant `root`"),
            "{message}"
        );

        let (other, _) = SigningKey::generate("gateway-1").expect("keygen");
        let forged = other.sign(&ApiClaims::new("htfaas-gateway", "alice", Scope::Admin, 60)).expect("sign");
        assert_eq!(refused(require_caller(&shared, &headers(&forged))).1, "API token refused: invalid signature");

        let mut other_issuer = ApiClaims::new("elsewhere", "alice", Scope::Admin, 60);
        other_issuer.aud = API_AUDIENCE.into();
        assert_eq!(
            refused(require_caller(&shared, &headers(&key.sign(&other_issuer).expect("sign")))).1,
            "API token refused: wrong issuer"
        );

        let submit = SubmitClaims {
            iss: "htfaas-gateway".into(),
            sub: "alice".into(),
            aud: SUBMIT_AUDIENCE.into(),
            exp: now_s() + 60,
            iat: now_s(),
            jti: "j".into(),
            jobs: 1,
            cpus: 1,
            memory_mb: 1,
            runtime_s: 1,
            function: None,
            group: None,
        };
        let submit = key.sign(&submit).expect("sign");
        assert_eq!(refused(require_caller(&shared, &headers(&submit))).1, "API token refused: wrong audience");
        assert!(shared.submitter.verify(&dev).is_err(), "an API token is no submit token");

        assert_eq!(refused(require_caller(&shared, &HeaderMap::new())).0, StatusCode::UNAUTHORIZED);
        assert_eq!(refused(require_caller(&shared, &headers("adm-but-longer"))).0, StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn a_revocation_names_an_api_token_by_jti_owner_or_issuer() {
        let claims = ApiClaims::new("gw", "alice", Scope::Developer, 60);
        assert!(names_api_token(&RevocationTarget::Jti(claims.jti.clone()), &claims));
        assert!(names_api_token(&RevocationTarget::Owner("alice".into()), &claims));
        assert!(names_api_token(&RevocationTarget::Issuer("gw".into()), &claims));
        assert!(!names_api_token(&RevocationTarget::Owner("bob".into()), &claims));
        assert!(!names_api_token(&RevocationTarget::Jti("other".into()), &claims));
    }

    #[test]
    fn path_names_are_checked_and_encoded_as_one_segment() {
        assert_eq!(path_name("EP name", "ep-1.site_a").ok().as_deref(), Some("ep-1.site_a"));
        assert_eq!(path_name("owner", "alice@lab x").ok().as_deref(), Some("alice%40lab%20x"));
        assert_eq!(path_name("owner", "é").ok().as_deref(), Some("%C3%A9"));
        assert!(path_name("EP name", &"e".repeat(128)).is_ok());
        // `..` and `.` are refused: URL parsers resolve them, even percent-encoded.
        for bad in ["", ".", "..", "a/b", "a\nb", "a\u{7f}", &"e".repeat(129)] {
            let Err(Failure(status, message)) = path_name("EP name", bad) else { panic!("{bad:?} accepted") };
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert!(message.starts_with(&format!("bad EP name {bad:?}: want 1 to 128")), "{message}");
        }
    }

    #[test]
    fn a_manual_run_is_allowed_only_when_the_trigger_is_true_for_its_path() {
        use htfaas_functions::Trigger;
        let glob = Trigger::on_path("/data/raw/**");
        assert!(manual_run_allowed(&glob, "/data/raw/a.h5"));
        assert!(!manual_run_allowed(&glob, "/data/other/a.h5"));
        // Unknown size or owner: undefined, so refused (issue 18: an undefined rule let a
        // bearer run the function on any path).
        let rule = Trigger::on_rule(r#"path suffix ".h5" and size > 1MB"#);
        assert!(!manual_run_allowed(&rule, "/data/x/a.h5"));
        assert!(!manual_run_allowed(&Trigger::on_rule(r#"owner == "x""#), "/data/x/a.h5"));
        assert!(!manual_run_allowed(&Trigger::on_rule(r#"path prefix "/data/" or size > 1MB"#), "/x"));
        assert!(manual_run_allowed(&Trigger::on_rule(r#"path suffix ".h5" or size > 1MB"#), "/data/x/a.h5"));
        // A rule for another kind or type is false for a manual run.
        assert!(!manual_run_allowed(&Trigger::on_rule(r#"kind == "remove""#), "/data/x/a.h5"));
        assert!(!manual_run_allowed(&Trigger::on_rule(r#"type == "transfer""#), "/data/x/a.h5"));
        assert!(manual_run_allowed(&Trigger::on_rule(r#"type in ["transfer", "manual"]"#), "/data/x/a.h5"));
        assert!(!manual_run_allowed(&Trigger::on_path(""), "/data/x/a.h5"));
    }

    /// The routes that read recorded events, against a real nats-server
    /// (`HTFAAS_NATS_SERVER`, or `.tools/venv/bin/nats-server`) and a gateway API on
    /// `127.0.0.1:0` (no scheduler: a replay's firings wait in the firing table).
    mod recorded {
        use super::*;
        use serde_json::{Value, json};
        use std::time::{Duration, Instant};

        const ADMIN: &str = "admin-token";

        /// A nats-server with JetStream in a temporary directory; killed on drop.
        struct Nats {
            child: std::process::Child,
            url: String,
            _dir: tempfile::TempDir,
        }

        impl Drop for Nats {
            fn drop(&mut self) {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }

        async fn start_nats() -> (Nats, async_nats::jetstream::Context) {
            let binary = std::env::var_os("HTFAAS_NATS_SERVER").map(std::path::PathBuf::from).unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/venv/bin/nats-server")
            });
            assert!(binary.is_file(), "nats-server not found at {} (set HTFAAS_NATS_SERVER)", binary.display());
            let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
            let dir = tempfile::tempdir().expect("tempdir");
            let child = std::process::Command::new(&binary)
                .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
                .arg(dir.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start nats-server");
            let nats = Nats { child, url: format!("nats://127.0.0.1:{port}"), _dir: dir };
            let deadline = Instant::now() + Duration::from_secs(20);
            let client = loop {
                if let Ok(c) = async_nats::connect(&nats.url).await {
                    break c;
                }
                assert!(Instant::now() < deadline, "nats-server did not start");
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let js = async_nats::jetstream::new(client);
            crate::ingest::ensure_events_stream(&js).await.expect("events stream");
            (nats, js)
        }

        /// A gateway API (with the recorded events of `js` when given) and its state.
        async fn start_api(
            dir: &std::path::Path,
            js: Option<async_nats::jetstream::Context>,
        ) -> (String, Arc<Shared>, tokio_util::sync::CancellationToken) {
            let config: crate::Config = serde_json::from_value(json!({
                "listen": "127.0.0.1:0", "nats_url": "nats://127.0.0.1:1",
                "registry_dir": dir.join("registry"), "storage_url": "http://127.0.0.1:1",
                "storage_user": "gateway", "scheduler_url": "http://127.0.0.1:1",
                "scheduler_admin_token": "s", "signing_key_file": dir.join("submit.pem"), "admin_token": ADMIN,
                "namespaces": [{"principal": "alice", "right": "read", "value": "/data/"},
                    {"principal": "alice", "right": "write", "value": "/out/"}],
            }))
            .expect("config");
            let shared = config.resolve().await.expect("resolve").shared();
            let mut app = router(shared.clone());
            if let Some(js) = js {
                app = app.layer(Extension(replay::Events(js)));
            }
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let base = format!("http://{}", listener.local_addr().expect("addr"));
            let shutdown = tokio_util::sync::CancellationToken::new();
            let s = shutdown.clone();
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(s.cancelled_owned()).await });
            (base, shared, shutdown)
        }

        fn transfer(path: &str, size: u64) -> Vec<u8> {
            serde_json::to_vec(&json!({
                "msgType": "transfer", "isWrite": "write", "isP2p": false, "status": {"code": 0, "msg": ""},
                "cellName": "pool-a", "cellDomain": "poolDomain", "transferPath": path, "pnfsid": "0000BEEF",
                "session": format!("s-{path}"), "fileSize": size,
            }))
            .expect("json")
        }

        fn manifest(module: &Digest, name: &str, trigger: Value) -> Value {
            json!({"name": name, "owner": "alice", "module": module, "trigger": trigger,
                "outputs": {"dir": format!("/out/{name}/")}})
        }

        /// POSTs `body` to `path` as the admin; returns status and JSON body.
        async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
            let resp = crate::http_client()
                .expect("client")
                .post(format!("{base}{path}"))
                .bearer_auth(ADMIN)
                .json(body)
                .send()
                .await
                .expect("request");
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or(Value::Null))
        }

        fn paths(report: &Value) -> Vec<String> {
            let mut paths: Vec<String> = report["pairs"]
                .as_array()
                .map(|ps| ps.iter().map(|p| format!("{}:{}", p["function"], p["path"])).collect())
                .unwrap_or_default();
            paths.sort();
            paths
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn replays_tests_and_dry_run_registrations_read_the_recorded_events() {
            let (_nats, js) = start_nats().await;
            let mut seqs = Vec::new();
            for bytes in [transfer("/data/raw/a.h5", 5000), transfer("/data/other/b.h5", 10), b"{not json".to_vec()] {
                let ack = js.publish(htfaas_functions::proto::EVENTS_SUBJECT, bytes.into()).await.expect("publish");
                seqs.push(ack.await.expect("stored").sequence);
            }
            let dir = tempfile::tempdir().expect("tempdir");
            let (base, shared, shutdown) = start_api(dir.path(), Some(js)).await;
            let module = shared.registry.put_module(b"\0asm\x01\0\0\0").expect("module");
            let (status, _) =
                post(&base, "/v1/functions", &manifest(&module, "a", json!({"path": "/data/raw/**"}))).await;
            assert_eq!(status, 201);

            // A dry run: the one pair, every message counted.
            let (status, dry) = post(&base, "/v1/events/replay", &json!({"since": "-1h", "dry_run": true})).await;
            assert_eq!(status, 200, "{dry}");
            assert_eq!(paths(&dry), [r#""a":"/data/raw/a.h5""#], "{dry}");
            assert_eq!((&dry["scanned"], &dry["parsed"], &dry["malformed"]), (&json!(3), &json!(2), &json!(1)));
            assert_eq!(dry["pairs"][0]["seq"], json!(seqs[0]));
            // A replay under a given id queues the pair; re-issued, it is found taken.
            let replay = json!({"since": 0, "function": "a", "replay_id": "r-test"});
            let (status, first) = post(&base, "/v1/events/replay", &replay).await;
            assert_eq!(status, 200, "{first}");
            assert_eq!(
                (&first["fired"], &first["failures"], &first["replay_id"]),
                (&json!(1), &json!(0), &json!("r-test"))
            );
            let deduplicated = shared.stats.jobs_deduplicated.load(std::sync::atomic::Ordering::Relaxed);
            let (status, _) = post(&base, "/v1/events/replay", &replay).await;
            assert_eq!(status, 200);
            assert_eq!(shared.stats.jobs_deduplicated.load(std::sync::atomic::Ordering::Relaxed), deduplicated + 1);
            // Refused requests.
            for (body, want_status, want) in [
                (json!({"since": "yesterday"}), 400, "since: \"yesterday\": want RFC 3339"),
                (json!({"since": "-1h", "dry_run": true, "replay_id": "x"}), 400, "a dry run takes no replay_id"),
                (json!({"since": "-1h", "replay_id": "a b"}), 400, "bad replay id"),
                (json!({"since": "-1h", "limit": 0}), 400, "limit must be"),
                (json!({"since": "-1h", "function": "nope"}), 404, "not found"),
                (json!({"since": "-1h", "typo": 1}), 400, "unknown field"),
            ] {
                let (status, answer) = post(&base, "/v1/events/replay", &body).await;
                assert_eq!(status, want_status, "{body}: {answer}");
                assert!(answer["error"].as_str().is_some_and(|e| e.contains(want)), "{body}: {answer}");
            }

            // Tests: a recorded message by sequence, a given one, neither.
            let (status, t) = post(&base, "/v1/functions/a/test", &json!({"seq": seqs[0]})).await;
            assert_eq!((status, &t["verdict"], &t["fires"]), (200, &json!("true"), &json!(true)), "{t}");
            assert_eq!(t["event"]["source"]["message"], json!(format!("nats-seq-{}", seqs[0])));
            let (status, t) = post(&base, "/v1/functions/a/test", &json!({"seq": seqs[2]})).await;
            assert_eq!((status, &t["outcome"], &t["fires"]), (200, &json!("malformed"), &json!(false)), "{t}");
            let other: Value = serde_json::from_slice(&transfer("/data/other/c.h5", 1)).expect("json");
            let (status, t) = post(&base, "/v1/functions/a/test", &json!({"event": other})).await;
            assert_eq!((status, &t["verdict"], &t["parts"][0]["verdict"]), (200, &json!("false"), &json!("false")));
            let (status, t) = post(&base, "/v1/functions/a/test", &json!({"seq": 999})).await;
            assert_eq!(status, 404, "{t}");
            let (status, t) = post(&base, "/v1/functions/a/test", &json!({})).await;
            assert_eq!(status, 400, "{t}");

            // A dry-run registration: the recorded events its trigger fires on; not stored.
            // One that could fire anywhere is refused as its registration would be (issue 18).
            let anywhere = manifest(&module, "b", json!({"rule": "name suffix \".h5\""}));
            let (status, report) = post(&base, "/v1/functions?dry_run=true&since=-1h", &anywhere).await;
            assert_eq!(status, 403, "{report}");
            let b = manifest(&module, "b", json!({"rule": "path prefix \"/data/\" and name suffix \".h5\""}));
            let (status, report) = post(&base, "/v1/functions?dry_run=true&since=-1h", &b).await;
            assert_eq!(status, 200, "{report}");
            assert_eq!(paths(&report), [r#""b":"/data/other/b.h5""#, r#""b":"/data/raw/a.h5""#], "{report}");
            let listed = crate::http_client()
                .expect("client")
                .get(format!("{base}/v1/functions"))
                .bearer_auth(ADMIN)
                .send()
                .await
                .expect("list")
                .json::<Vec<htfaas_functions::FunctionRecord>>()
                .await
                .expect("records");
            assert_eq!(listed.iter().map(|f| f.manifest.name.as_str()).collect::<Vec<_>>(), ["a"]);
            // Refused as a registration refuses it, with the same error.
            let unknown = Digest::of(b"not stored");
            for bad in [
                manifest(&module, "b", json!({"rule": "path glob and size > 1"})),
                manifest(&unknown, "b", json!({"path": "/data/**"})),
            ] {
                let (status, dry_err) = post(&base, "/v1/functions?dry_run=true", &bad).await;
                let (real_status, real_err) = post(&base, "/v1/functions", &bad).await;
                assert_eq!((status, &dry_err), (real_status, &real_err));
                assert_eq!(status, 400, "{dry_err}");
            }
            let (status, e) = post(&base, "/v1/functions?since=-1h", &b).await;
            assert_eq!(status, 400, "{e}");
            shutdown.cancel();
        }

        #[tokio::test]
        async fn without_recorded_events_replays_answer_503_and_given_events_are_still_tested() {
            let dir = tempfile::tempdir().expect("tempdir");
            let (base, shared, shutdown) = start_api(dir.path(), None).await;
            let module = shared.registry.put_module(b"\0asm\x01\0\0\0").expect("module");
            let a = manifest(&module, "a", json!({"path": "/data/raw/**"}));
            assert_eq!(post(&base, "/v1/functions", &a).await.0, 201);
            let (status, e) = post(&base, "/v1/events/replay", &json!({"since": "-1h", "dry_run": true})).await;
            assert_eq!(status, 503, "{e}");
            assert_eq!(post(&base, "/v1/functions?dry_run=true", &a).await.0, 503);
            assert_eq!(post(&base, "/v1/functions/a/test", &json!({"seq": 1})).await.0, 503);
            let event: Value = serde_json::from_slice(&transfer("/data/raw/x", 1)).expect("json");
            let (status, t) = post(&base, "/v1/functions/a/test", &json!({"event": event})).await;
            assert_eq!((status, &t["fires"]), (200, &json!(true)), "{t}");
            // Admin only.
            let resp = crate::http_client()
                .expect("client")
                .post(format!("{base}/v1/events/replay"))
                .json(&json!({"since": "-1h"}))
                .send()
                .await
                .expect("request");
            assert_eq!(resp.status().as_u16(), 401);
            shutdown.cancel();
        }
    }
}
