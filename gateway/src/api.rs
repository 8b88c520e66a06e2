//! The gateway's HTTP API: the registry (modules and functions), runs by submit-token bearers,
//! and views of jobs, accounting and revocations (proxied to the scheduler, which owns them).
//!
//! A bearer's run is checked twice before any macaroon is requested: the token locally
//! (signature, issuer, audience, expiry), then by the scheduler's preflight (revocation, uses
//! left), so a revoked or spent token never makes the storage issue credentials.
//!
//! | route | auth | what |
//! |---|---|---|
//! | `GET /healthz` | none | liveness |
//! | `POST /v1/modules` | admin | body = wasm bytes → `ModuleUploaded` (`{"digest":…}`) |
//! | `GET /v1/modules/{digest}` | none | module bytes (content-addressed; EPs verify the digest) |
//! | `POST /v1/functions` | admin | body = `FunctionManifest` → `FunctionRecord` |
//! | `POST /v1/functions?dry_run=true[&since&until&limit]` | admin | manifest, checked, not kept → `Report` |
//! | `POST /v1/functions/{name}/test` | admin | body `TestRequest` → `TestReport` |
//! | `POST /v1/events/replay` | admin | body `ReplayRequest` → `Report` |
//! | `POST /v1/functions/{name}/runs` | submit token | body `RunRequest` (`{"path":…, "annex"?:…}`) → `SubmitResponse` |
//! | `GET /v1/jobs[/{id}]`, `GET /v1/accounting` | admin | the scheduler's answer |
//! | `POST /v1/jobs/{id}/hold\|release\|remove` | admin | body `JobAction` → the job (the scheduler acts) |
//! | `GET /v1/jobs/{id}/history` | admin | `Vec<Attempt>`, first attempt first |
//! | `GET /v1/jobs/{id}/log` | admin | `JobLog`: the guest's stdout and stderr of its last reported run |
//! | `GET /v1/jobs/{id}/analyze` | admin | `JobAnalysis`: why it runs or does not |
//! | `GET /v1/eps` | admin | `Vec<EpInfo>`: attached EPs and names with an admin setting |
//! | `POST /v1/eps/{name}/drain\|disable\|enable\|pause\|resume` | admin | body `EpAction` → `EpInfo` |
//! | `GET /v1/priorities` | admin | `PriorityReport` (fair-share standing of owners and groups) |
//! | `POST /v1/accounting/{owner}/factor` | admin | body `FactorRequest` → `OwnerPriority` |
//! | `POST /v1/revocations` | admin | body `RevokeRequest` → `Revocation` (the scheduler enforces it) |
//! | `GET /v1/revocations` | admin | every recorded revocation |
//! | `GET /v1/stats` | admin | `StatsSnapshot`: ingest counters |
//! | `GET /v1/audit[?job&token&owner&file&function&event&since&until&limit]` | admin | the scheduler's audit records (`functions::audit::AuditRecord`s) |
//! | `GET /v1/audit/verify` | admin | the scheduler's `functions::audit::VerifyReport` of its trail |
//! | `GET /v1/audit/keys` | admin | the JWKS of the scheduler's audit key |
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
//! Every scheduler route is proxied with the scheduler's admin token after this API's own admin
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
use htfaas_functions::proto::{ApiError, ModuleUploaded, RegisterQuery, ReplayRequest, RunRequest, TestRequest};
use htfaas_functions::registry::MAX_MODULE_BYTES;
use htfaas_functions::{Digest, FunctionManifest, RegistryError};
use std::sync::Arc;

/// An error answer: status plus [`ApiError`] body.
pub struct Failure(StatusCode, String);

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
            RegistryError::NotFound(_) => StatusCode::NOT_FOUND,
            RegistryError::Db(_) | RegistryError::Io(_) | RegistryError::Corrupt(_) => {
                tracing::error!("registry failure: {e}");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        Failure(status, e.to_string())
    }
}

/// The router, with its state.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
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
        .route("/v1/accounting/{owner}/factor", post(proxy_set_factor))
        .route("/v1/eps", get(proxy_eps))
        .route("/v1/eps/{name}/{action}", post(proxy_ep_action))
        .route("/v1/priorities", get(proxy_priorities))
        .route("/v1/revocations", post(proxy_revoke).get(proxy_revocations))
        .route("/v1/stats", get(stats))
        .route("/v1/audit", get(proxy_audit))
        .route("/v1/audit/verify", get(proxy_audit_verify))
        .route("/v1/audit/keys", get(proxy_audit_keys))
        .with_state(shared)
}

fn require_admin(shared: &Shared, headers: &HeaderMap) -> Result<(), Failure> {
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(t) if constant_time_eq(t.as_bytes(), shared.admin_token.as_bytes()) => Ok(()),
        Some(_) => Err(Failure(StatusCode::UNAUTHORIZED, "wrong admin token".into())),
        None => Err(Failure(StatusCode::UNAUTHORIZED, "admin token required (Authorization: Bearer)".into())),
    }
}

/// Compares without an early exit, so timing does not reveal the matching prefix.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn blocking<T: Send + 'static>(
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
    require_admin(&shared, &headers)?;
    let s = shared.clone();
    let digest = blocking(move || s.registry.put_module(&body)).await?;
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
    require_admin(&shared, &headers)?;
    let Query(query) = Query::<RegisterQuery>::try_from_uri(&uri)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid query: {}", e.body_text())))?;
    let manifest: FunctionManifest = serde_json::from_slice(&body)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid manifest: {e}")))?;
    if query.dry_run {
        return dry_run_registration(&shared, events, &query, manifest).await;
    }
    if query != RegisterQuery::default() {
        return Err(Failure(StatusCode::BAD_REQUEST, "since, until and limit go with dry_run=true".into()));
    }
    let s = shared.clone();
    let record = blocking(move || {
        let record = s.registry.register(manifest)?;
        s.triggers.reload(&s.registry)?;
        Ok(record)
    })
    .await?;
    tracing::info!(function = %record.manifest.name, version = record.version, "function registered");
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
    require_admin(&shared, &headers)?;
    let request: TestRequest =
        serde_json::from_slice(&body).map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid test: {e}")))?;
    let s = shared.clone();
    let record = blocking(move || s.registry.latest(&name)).await?;
    let events = events.map(|Extension(e)| e);
    Ok(Json(replay::test_request(events.as_ref(), &record, &request, &shared.sources()).await?))
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
    Ok(Json(report))
}

async fn list_functions(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<impl IntoResponse, Failure> {
    require_admin(&shared, &headers)?;
    let s = shared.clone();
    Ok(Json(blocking(move || s.registry.list()).await?))
}

async fn stats(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<impl IntoResponse, Failure> {
    require_admin(&shared, &headers)?;
    Ok(Json(shared.stats.snapshot()))
}

async fn proxy_jobs(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, Failure> {
    let suffix = query.map(|q| format!("?{q}")).unwrap_or_default();
    proxy(&shared, &headers, &format!("/v1/jobs{suffix}")).await
}

async fn proxy_job(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    check_job_id(&id)?;
    proxy(&shared, &headers, &format!("/v1/jobs/{id}")).await
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
    require_admin(&shared, &headers)?;
    check_job_id(&id)?;
    if !matches!(view.as_str(), "history" | "analyze" | "log") {
        return Err(Failure(StatusCode::NOT_FOUND, format!("no job view {view:?} (history, analyze, log)")));
    }
    proxy(&shared, &headers, &format!("/v1/jobs/{id}/{view}")).await
}

async fn proxy_job_action(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    check_job_id(&id)?;
    if !matches!(action.as_str(), "hold" | "release" | "remove") {
        return Err(Failure(StatusCode::NOT_FOUND, format!("no job action {action:?} (hold, release, remove)")));
    }
    let request: htfaas_functions::proto::JobAction = serde_json::from_slice(&body)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid job action: {e}")))?;
    tracing::info!(job = %id, %action, reason = %request.reason, "job action requested");
    let url = format!("{}/v1/jobs/{id}/{action}", shared.submitter_base());
    forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await
}

async fn proxy_accounting(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, Failure> {
    proxy(&shared, &headers, "/v1/accounting").await
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
    forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await
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
    forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await
}

/// `GET /v1/audit`: the query goes to the scheduler as it came (the scheduler parses it and
/// refuses unknown parameters).
async fn proxy_audit(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, Failure> {
    let suffix = query.map(|q| format!("?{q}")).unwrap_or_default();
    proxy(&shared, &headers, &format!("/v1/audit{suffix}")).await
}

async fn proxy_audit_verify(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, Failure> {
    proxy(&shared, &headers, "/v1/audit/verify").await
}

async fn proxy_audit_keys(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, Failure> {
    proxy(&shared, &headers, "/v1/audit/keys").await
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
    forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await
}

async fn proxy(shared: &Shared, headers: &HeaderMap, path: &str) -> Result<Response, Failure> {
    require_admin(shared, headers)?;
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
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| Failure(StatusCode::UNAUTHORIZED, "submit token required (Authorization: Bearer)".into()))?
        .to_owned();
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
            format!("{} does not match the trigger {} of function {}", run.path, m.trigger, m.name),
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
/// size, storage class or owner, so tests on those are undefined; the run is refused only when
/// the trigger is false for what it does know.
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
    trigger.compile().is_ok_and(|rule| rule.evaluate(&event) != Truth::False)
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
    fn a_manual_run_is_refused_only_when_the_trigger_is_false_for_its_path() {
        use htfaas_functions::Trigger;
        let glob = Trigger::on_path("/data/raw/**");
        assert!(manual_run_allowed(&glob, "/data/raw/a.h5"));
        assert!(!manual_run_allowed(&glob, "/data/other/a.h5"));
        // Unknown size: undefined, so allowed; a false path test still refuses.
        let rule = Trigger::on_rule(r#"path suffix ".h5" and size > 1MB"#);
        assert!(manual_run_allowed(&rule, "/data/x/a.h5"));
        assert!(!manual_run_allowed(&rule, "/data/x/a.root"));
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
            let b = manifest(&module, "b", json!({"rule": "name suffix \".h5\""}));
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
