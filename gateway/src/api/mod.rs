//! The gateway's HTTP API: the registry (modules and functions), runs by submit-token bearers,
//! and views of jobs, accounting and revocations (proxied to the scheduler, which owns them).
//! Long because it holds the route table three times, side by side so one review sees all three:
//! the table below, [`ROUTES`] (with each route's scope) and [`router`].
//!
//! A bearer's run is checked twice before any macaroon is requested: the token locally
//! (signature, issuer, audience, expiry), then by the scheduler's preflight (revocation, uses
//! left), so a revoked or spent token never makes the storage issue credentials.
//!
//! Every route but `GET /healthz`, `GET /v1/openapi.json`, `GET /v1/modules/{digest}` and `GET /v1/images/{digest}` needs a
//! credential, checked here before anything else (`crate::auth::require_caller`, `crate::auth::require_admin`):
//!
//! - the **admin token** of the config (the bootstrap credential, compared in constant time):
//!   scope `admin`, name `admin`;
//! - an **API token** ([`htfaas_functions::token::ApiClaims`], `htfaas token api`): a JWT the
//!   gateway's key signed for [`htfaas_functions::token::API_AUDIENCE`], with `sub` (the owner
//!   it acts as) and `scope`. A revocation naming its `jti`, its `sub` or its issuer refuses it
//!   (401) within `crate::auth::REVOCATIONS_FRESH_S` seconds: the [`authenticate`] layer reads the
//!   scheduler's revocations through `crate::auth::RevocationCache`;
//! - a **token of the site's OIDC provider** (an issuer in `oidc_issuers`): verified against
//!   the issuer's keys, mapped by the identity map to an owner with scope `developer`, and
//!   checked by the [`authenticate`] layer before any handler runs (its WLCG scopes against the
//!   method, revocations naming its `jti`, its owner or its issuer): [`crate::identities`];
//! - a **submit token**, only on `POST /v1/functions/{name}/runs` (and no API token there);
//! - a job's **renewal grant**, only on `POST /v1/renewals` (the scheduler presents it; no
//!   API or submit token passes there).
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
//! | `POST /v1/images[?tag=NAME]` | developer | body = an image tar (plain or gzip'd), streamed → `ModuleUploaded` (`images`) |
//! | `GET /v1/images` | developer (own) | `Vec<ImageInfo>` |
//! | `GET /v1/images/{digest}` | none | image bytes (content-addressed; EPs verify the digest and every entry) |
//! | `GET /v1/images/{digest}/info` | developer (own) | `ImageInfo` (with the versions that name it); a tag for `{digest}` too |
//! | `DELETE /v1/images/{digest}` | developer (own) | 204; 409 while a function version names it |
//! | `POST /v1/functions` | developer (own) | body = `FunctionManifest` → `FunctionRecord` |
//! | `POST /v1/functions?dry_run=true[&since&until&limit]` | developer (own) | manifest, checked, not kept → `Report` |
//! | `GET /v1/functions` | developer (own) | `Vec<FunctionStatus>` (the live version of each, with `latest_version`, `enabled`, `pinned`) |
//! | `GET /v1/functions/{name}` | developer (own) | `FunctionStatus` |
//! | `DELETE /v1/functions/{name}` | developer (own) | the live `FunctionRecord`; its versions stay |
//! | `GET /v1/functions/{name}/versions` | developer (own) | `Vec<FunctionRecord>`, oldest first |
//! | `POST /v1/functions/{name}/pin` | developer (own) | `PinRequest` → `FunctionStatus` (a rollback) |
//! | `POST /v1/functions/{name}/disable`, `…/enable` | developer (own) | `FunctionStatus` |
//! | `GET /v1/whoami` | developer | `WhoAmI`: the credential's owner and scope |
//! | `POST /v1/files/credential` | developer (own namespace) | `FileCredentialRequest` → `FileCredential`: a macaroon for one file (read) or new files in its directory (write) |
//! | `PUT /v1/functions/{name}/secrets` | developer (own) | `{"NAME": "value", …}` (replaces all) → `SecretNames` |
//! | `GET /v1/functions/{name}/secrets` | developer (own) | `SecretNames` (never a value) |
//! | `POST /v1/functions/{name}/test` | developer (own) | body `TestRequest` → `TestReport` |
//! | `POST /v1/events/replay` | admin | body `ReplayRequest` → `Report` |
//! | `POST /v1/events/backfill` | developer (own function) | body `BackfillRequest` → `BackfillReport`: the function fired once on each file under a directory that never fired it (`crate::backfill`) |
//! | `POST /v1/functions/{name}/runs` | submit token | body `RunRequest` (`{"path":…, "annex"?:…}`) → `SubmitResponse` |
//! | `POST /v1/functions/{name}/invoke` | developer (a file of its own namespace) | `InvokeRequest` → `InvokeResponse` (200 with the ended job within `wait_s`, else 202): a manual run with a submit token minted for exactly the job (`invoke`) |
//! | `POST /v1/renewals` | renewal grant (the scheduler's) | body `RenewRequest` → `RenewResponse`: fresh macaroons of a running job (`renewals`) |
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
//! | `GET /v1/stats/history` | admin | `StatsHistory`: the counters every 2 s for the last hour |
//! | `GET /v1/audit[?job&token&owner&file&function&event&since&until&limit]` | developer (own) | the scheduler's audit records (`functions::audit::AuditRecord`s) |
//! | `GET /v1/audit/verify` | admin | the scheduler's `functions::audit::VerifyReport` of its trail |
//! | `GET /v1/audit/keys[?trail=gateway\|scheduler]` | admin | the JWKS of both audit keys (or of one trail's) |
//! | `POST /v1/annexes` | admin | body `AnnexRequest` → 201 `AnnexCreated` (403 unless the owner holds the annex right: `annexes`) |
//! | `GET /v1/annexes[/{name}]` | admin | `AnnexView`s: each annex's record and its attached EPs |
//! | `POST /v1/annexes/{name}/jobs\|extend\|drain\|delete` | admin | `AnnexJobs` → `AnnexRecord`; `AnnexExtend` → `AnnexRecord`; → `AnnexView`; → `AnnexDeleted` |
//! | `GET /v1/dlq[?function&since&dropped&limit]` | developer (own) | `Vec<DeadLetter>`: firings that could not become jobs and failed jobs, newest first (`dlq`) |
//! | `GET /v1/dlq/{id}` | developer (own) | `DeadLetter`, with its re-drives and drop |
//! | `POST /v1/dlq/{id}/redrive` | developer (own) | body `RedriveRequest` (`{"n"?: N}`) → 201 (or 200: re-drive `n` was there) `RedriveResponse` |
//! | `POST /v1/dlq/{id}/drop` | developer (own) | body `DropRequest` (`{"reason": …}`) → `DeadLetter` |
//! | `POST /v1/audit/rerun` | developer (own) | body `RerunRequest` (`{"file": …}`) → 201 `Rerun`: the function version that wrote the file runs again on the same input bytes into a scratch directory (`rerun`) |
//! | `GET /v1/identities` | admin | `Vec<Binding>`: the OIDC identities bound to owners (`identities`) |
//! | `DELETE /v1/identities/{owner}` | admin | the `Binding` removed (404 without one): the owner name is free for another identity |
//! | `GET /v1/lineage?file=PATH[&depth=N]` | admin | `Lineage`: the jobs that wrote and read the file, and back to its first upload ([`audit::lineage`]) |
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

use crate::auth::bearer;
use crate::http_error::HttpError;
use crate::replay::ReplayError;
use crate::state::Shared;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use htfaas_functions::RegistryError;
use htfaas_functions::registry::MAX_MODULE_BYTES;
use std::sync::Arc;

mod annexes;
pub mod audit;
mod dlq;
mod events;
mod files;
mod forward;
mod identities;
mod images;
mod invoke;
mod lifecycle;
pub mod metrics;
pub mod namespaces;
mod proxy;
mod registry;
mod renewals;
mod rerun;
mod runs;

impl From<ReplayError> for HttpError {
    fn from(e: ReplayError) -> Self {
        let status = match &e {
            ReplayError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ReplayError::NotFound(_) => StatusCode::NOT_FOUND,
            ReplayError::Unavailable(_) => {
                tracing::warn!("replay: {e}");
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        HttpError(status, e.to_string())
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No credential.
    Public,
    /// A submit token (never an API token).
    SubmitToken,
    /// A job's renewal grant, which only the scheduler holds (never an API or
    /// submit token).
    RenewalGrant,
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
            Access::RenewalGrant => "renewal",
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
    op("POST", "/v1/images", "/v1/images", Access::Developer),
    op("GET", "/v1/images", "/v1/images", Access::Developer),
    op("GET", "/v1/images/{digest}", "/v1/images/{digest}", Access::Public),
    op("DELETE", "/v1/images/{digest}", "/v1/images/{digest}", Access::Developer),
    op("GET", "/v1/images/{digest}/info", "/v1/images/{digest}/info", Access::Developer),
    op("POST", "/v1/functions", "/v1/functions", Access::Developer),
    op("GET", "/v1/functions", "/v1/functions", Access::Developer),
    op("GET", "/v1/functions/{name}", "/v1/functions/{name}", Access::Developer),
    op("DELETE", "/v1/functions/{name}", "/v1/functions/{name}", Access::Developer),
    op("GET", "/v1/functions/{name}/versions", "/v1/functions/{name}/versions", Access::Developer),
    op("POST", "/v1/functions/{name}/pin", "/v1/functions/{name}/pin", Access::Developer),
    op("POST", "/v1/functions/{name}/disable", "/v1/functions/{name}/disable", Access::Developer),
    op("POST", "/v1/functions/{name}/enable", "/v1/functions/{name}/enable", Access::Developer),
    op("GET", "/v1/whoami", "/v1/whoami", Access::Developer),
    op("POST", "/v1/files/credential", "/v1/files/credential", Access::Developer),
    op("PUT", "/v1/functions/{name}/secrets", "/v1/functions/{name}/secrets", Access::Developer),
    op("GET", "/v1/functions/{name}/secrets", "/v1/functions/{name}/secrets", Access::Developer),
    op("POST", "/v1/functions/{name}/runs", "/v1/functions/{name}/runs", Access::SubmitToken),
    op("POST", "/v1/functions/{name}/invoke", "/v1/functions/{name}/invoke", Access::Developer),
    op("POST", "/v1/functions/{name}/test", "/v1/functions/{name}/test", Access::Developer),
    op("POST", "/v1/renewals", "/v1/renewals", Access::RenewalGrant),
    op("POST", "/v1/events/backfill", "/v1/events/backfill", Access::Developer),
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
    op("GET", "/v1/stats/history", "/v1/stats/history", Access::Admin),
    op("GET", "/v1/audit", "/v1/audit", Access::Developer),
    op("GET", "/v1/audit/verify", "/v1/audit/verify", Access::Admin),
    op("GET", "/v1/audit/keys", "/v1/audit/keys", Access::Admin),
    op("GET", "/v1/lineage", "/v1/lineage", Access::Admin),
    op("POST", "/v1/audit/rerun", "/v1/audit/rerun", Access::Developer),
    op("GET", "/v1/namespaces", "/v1/namespaces", Access::Developer),
    op("POST", "/v1/namespaces", "/v1/namespaces", Access::Admin),
    op("POST", "/v1/namespaces/revoke", "/v1/namespaces/revoke", Access::Admin),
    op("GET", "/v1/identities", "/v1/identities", Access::Admin),
    op("DELETE", "/v1/identities/{owner}", "/v1/identities/{owner}", Access::Admin),
    op("POST", "/v1/annexes", "/v1/annexes", Access::Admin),
    op("GET", "/v1/annexes", "/v1/annexes", Access::Admin),
    op("GET", "/v1/annexes/{name}", "/v1/annexes/{name}", Access::Admin),
    op("POST", "/v1/annexes/{name}/jobs", "/v1/annexes/{name}/{action}", Access::Admin),
    op("POST", "/v1/annexes/{name}/extend", "/v1/annexes/{name}/{action}", Access::Admin),
    op("POST", "/v1/annexes/{name}/drain", "/v1/annexes/{name}/{action}", Access::Admin),
    op("POST", "/v1/annexes/{name}/delete", "/v1/annexes/{name}/{action}", Access::Admin),
    op("GET", "/v1/dlq", "/v1/dlq", Access::Developer),
    op("GET", "/v1/dlq/{id}", "/v1/dlq/{id}", Access::Developer),
    op("POST", "/v1/dlq/{id}/redrive", "/v1/dlq/{id}/{action}", Access::Developer),
    op("POST", "/v1/dlq/{id}/drop", "/v1/dlq/{id}/{action}", Access::Developer),
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
        .route("/v1/modules", post(registry::put_module).layer(DefaultBodyLimit::max(MAX_MODULE_BYTES)))
        .route("/v1/modules/{digest}", get(registry::get_module))
        .route("/v1/images", post(images::put_image).get(images::list_images).layer(DefaultBodyLimit::disable()))
        .route("/v1/images/{digest}", get(images::get_image).delete(images::delete_image))
        .route("/v1/images/{digest}/info", get(images::show_image))
        .route("/v1/functions", post(registry::register).get(registry::list_functions))
        .route("/v1/functions/{name}", get(lifecycle::show).delete(lifecycle::delete))
        .route("/v1/functions/{name}/versions", get(lifecycle::versions))
        .route("/v1/functions/{name}/pin", post(lifecycle::pin))
        .route("/v1/functions/{name}/disable", post(lifecycle::disable))
        .route("/v1/functions/{name}/enable", post(lifecycle::enable))
        .route("/v1/whoami", get(files::whoami))
        .route("/v1/files/credential", post(files::credential))
        .route("/v1/functions/{name}/secrets", put(lifecycle::set_secrets).get(lifecycle::secret_names))
        .route("/v1/functions/{name}/runs", post(runs::run_function))
        .route("/v1/functions/{name}/invoke", post(invoke::invoke))
        .route("/v1/functions/{name}/test", post(events::test_function))
        .route("/v1/renewals", post(renewals::renew))
        .route("/v1/events/replay", post(events::replay_events))
        .route("/v1/events/backfill", post(events::backfill_events))
        .route("/v1/jobs", get(proxy::proxy_jobs))
        .route("/v1/jobs/{id}", get(proxy::proxy_job))
        .route("/v1/jobs/{id}/{action}", post(proxy::proxy_job_action).get(proxy::proxy_job_view))
        .route("/v1/accounting", get(proxy::proxy_accounting))
        .route("/v1/accounting/report", get(proxy::proxy_accounting_report))
        .route("/v1/accounting/{owner}/factor", post(proxy::proxy_set_factor))
        .route("/v1/eps", get(proxy::proxy_eps))
        .route("/v1/eps/{name}/{action}", post(proxy::proxy_ep_action))
        .route("/v1/priorities", get(proxy::proxy_priorities))
        .route("/v1/revocations", post(proxy::proxy_revoke).get(proxy::proxy_revocations))
        .route("/v1/stats", get(metrics::stats))
        .route("/v1/stats/history", get(metrics::stats_history))
        .route("/v1/audit", get(audit::proxy_audit))
        .route("/v1/audit/verify", get(audit::proxy_audit_verify))
        .route("/v1/audit/keys", get(audit::proxy_audit_keys))
        .route("/v1/lineage", get(audit::get_lineage))
        .route("/v1/audit/rerun", post(rerun::rerun))
        .route("/v1/namespaces", get(namespaces::list).post(namespaces::grant))
        .route("/v1/namespaces/revoke", post(namespaces::revoke))
        .route("/v1/identities", get(identities::list))
        .route("/v1/identities/{owner}", delete(identities::unbind))
        .route("/v1/annexes", post(annexes::create).get(annexes::list))
        .route("/v1/annexes/{name}", get(annexes::show))
        .route("/v1/annexes/{name}/{action}", post(annexes::act))
        .route("/v1/dlq", get(dlq::list))
        .route("/v1/dlq/{id}", get(dlq::show))
        .route("/v1/dlq/{id}/{action}", post(dlq::act))
        .route("/metrics", get(metrics::serve))
        .layer(axum::middleware::from_fn_with_state(shared.clone(), authenticate))
        .merge(crate::console::routes())
        .with_state(shared)
}

async fn openapi_document() -> impl IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], crate::openapi::DOCUMENT)
}

/// The layer in front of every route: a bearer that verifies as an API token is refused (401)
/// when revoked, before any handler runs. Whether the route takes it is the handler's check.
pub async fn authenticate(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let (Some(ids), Some(token)) = (&shared.identities, bearer(request.headers()))
        && ids.oidc().claims_issuer(token).is_some()
    {
        if let Err(refused) = oidc_caller(&shared, ids, token, request.method(), request.uri().path()).await {
            return refused.into_response();
        }
        return next.run(request).await;
    }
    let claims = bearer(request.headers()).and_then(|t| shared.api_verifier.verify_api(t).ok());
    if let Some(claims) = claims
        && let Err(refused) = shared.api_revocations.check(&shared.scheduler(), &claims).await
    {
        tracing::info!(jti = %claims.jti, sub = %claims.sub, "API token refused: {}", refused.1);
        return refused.into_response();
    }
    next.run(request).await
}

/// Resolves a bearer of a configured OIDC issuer ([`crate::identities::resolve`]) and checks
/// it as an API token is checked: its WLCG `compute.*` scopes against the method (a file
/// credential's `storage.*` scopes are its handler's), then the scheduler's revocations (its
/// `jti`, its owner, its issuer).
async fn oidc_caller(
    shared: &Arc<Shared>,
    ids: &crate::identities::Identities,
    token: &str,
    method: &axum::http::Method,
    path: &str,
) -> Result<(), HttpError> {
    let s = shared.clone();
    let bind = move |identity: htfaas_functions::identity_map::Identity,
                     mapped: htfaas_functions::identity_map::Mapped| async move {
        tokio::task::spawn_blocking(move || {
            let bound = s.registry.bind_identity(&identity, &mapped, htfaas_functions::time::now_s());
            let bound = bound.map_err(|e| e.to_string())?;
            if bound != htfaas_functions::registry::identities::Bound::Same
                && let Err(e) = s.namespaces.reload(&s.registry)
            {
                tracing::error!(owner = %mapped.owner, "cannot read the grants again after a sign-in: {e}");
            }
            Ok(bound)
        })
        .await
        .map_err(|e| format!("registry task: {e}"))?
    };
    let at = crate::identities::Resolve { bind, firings: &shared.firings };
    let who = crate::identities::resolve(ids, at, token).await?;
    // A file credential is a storage operation: its handler checks the `storage.*` scopes.
    if path != "/v1/files/credential" {
        crate::identities::check_scopes(who.scopes.as_deref(), method)?;
    }
    // A token without a `jti` is named by its owner or issuer only.
    let jti = who.jti.as_deref().unwrap_or("\0");
    match shared.api_revocations.reason_for(&shared.scheduler(), jti, &who.caller.name, &who.issuer).await? {
        Some(reason) => {
            tracing::info!(owner = %who.caller.name, sub = %who.sub, "OIDC token refused: revoked: {reason}");
            Err(HttpError(StatusCode::UNAUTHORIZED, format!("token revoked: {reason}")))
        }
        None => Ok(()),
    }
}

/// Runs a registry call on the blocking pool; its error as the API's answer.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RegistryError> + Send + 'static,
) -> Result<T, HttpError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("registry task: {e}")))?
        .map_err(HttpError::from)
}

#[cfg(test)]
mod tests {
    use super::proxy::path_name;
    use super::runs::*;
    use super::*;
    use crate::auth::*;
    use crate::replay;
    use axum::extract::Extension;
    use axum::http::HeaderMap;
    use htfaas_functions::Digest;
    use htfaas_functions::proto::RevocationTarget;
    use htfaas_functions::token::{ApiClaims, Scope};
    use std::time::{Duration, Instant};

    /// The (method, router path) pairs of the `.route(…)` calls in [`router`]'s source, and in
    /// the console's `routes()` it merges.
    fn routed_in_source() -> std::collections::BTreeSet<(String, String)> {
        let mut out = routed_in(include_str!("mod.rs"), "pub fn router(");
        out.extend(routed_in(include_str!("../console.rs"), "pub fn routes<"));
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
        let config: crate::config::Config = serde_json::from_value(serde_json::json!({
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
        let refused = |r: Result<Caller, HttpError>| match r {
            Ok(c) => panic!("accepted as {c:?}"),
            Err(HttpError(status, message)) => (status, message),
        };

        let dev = key.sign(&ApiClaims::new("htfaas-gateway", "alice", Scope::Developer, 60)).expect("sign");
        let caller = shared.require_caller(&headers(&dev)).expect("a developer token");
        assert_eq!(caller, Caller { name: "alice".into(), scope: Scope::Developer });
        assert!(caller.owns("alice") && !caller.owns("bob"));
        let Err(HttpError(status, message)) = shared.require_admin(&headers(&dev)) else {
            panic!("developer as admin")
        };
        assert_eq!(
            (status, message.as_str()),
            (StatusCode::FORBIDDEN, r#"this route needs scope admin; the token of "alice" has scope developer"#)
        );
        let admin = key.sign(&ApiClaims::new("htfaas-gateway", "root", Scope::Admin, 60)).expect("sign");
        assert!(shared.require_admin(&headers(&admin)).is_ok());
        assert!(shared.require_admin(&headers("adm")).is_ok(), "the configured admin token");
        assert!(shared.require_caller(&headers("adm")).is_ok_and(|c| c.owns("anyone")));

        let mut wrong_aud = ApiClaims::new("htfaas-gateway", "alice", Scope::Admin, 60);
        wrong_aud.aud = SUBMIT_AUDIENCE.into();
        let (status, message) = refused(shared.require_caller(&headers(&key.sign(&wrong_aud).expect("sign"))));
        assert_eq!((status, message.as_str()), (StatusCode::UNAUTHORIZED, "API token refused: wrong audience"));

        let mut expired = ApiClaims::new("htfaas-gateway", "alice", Scope::Admin, 0);
        expired.exp = now_s() - LEEWAY_S - 10;
        let (status, message) = refused(shared.require_caller(&headers(&key.sign(&expired).expect("sign"))));
        assert_eq!((status, message.as_str()), (StatusCode::UNAUTHORIZED, "API token refused: token expired"));

        let mut root = serde_json::to_value(ApiClaims::new("htfaas-gateway", "alice", Scope::Admin, 60)).expect("json");
        root["scope"] = "root".into();
        let (status, message) = refused(shared.require_caller(&headers(&key.sign(&root).expect("sign"))));
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(
            message.starts_with("API token refused: invalid token: API token claims: unknown variant `root`"),
            "{message}"
        );

        let (other, _) = SigningKey::generate("gateway-1").expect("keygen");
        let forged = other.sign(&ApiClaims::new("htfaas-gateway", "alice", Scope::Admin, 60)).expect("sign");
        assert_eq!(refused(shared.require_caller(&headers(&forged))).1, "API token refused: invalid signature");

        let mut other_issuer = ApiClaims::new("elsewhere", "alice", Scope::Admin, 60);
        other_issuer.aud = API_AUDIENCE.into();
        assert_eq!(
            refused(shared.require_caller(&headers(&key.sign(&other_issuer).expect("sign")))).1,
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
        assert_eq!(refused(shared.require_caller(&headers(&submit))).1, "API token refused: wrong audience");
        assert!(shared.submitter.verify(&dev).is_err(), "an API token is no submit token");

        assert_eq!(refused(shared.require_caller(&HeaderMap::new())).0, StatusCode::UNAUTHORIZED);
        assert_eq!(refused(shared.require_caller(&headers("adm-but-longer"))).0, StatusCode::UNAUTHORIZED);
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
            let Err(HttpError(status, message)) = path_name("EP name", bad) else { panic!("{bad:?} accepted") };
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
        // Unknown size or owner: undefined, so refused (an undefined rule let a
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
            crate::ingest::ensure_events_stream(&js, 1).await.expect("events stream");
            (nats, js)
        }

        /// A gateway API (with the recorded events of `js` when given) and its state.
        async fn start_api(
            dir: &std::path::Path,
            js: Option<async_nats::jetstream::Context>,
        ) -> (String, Arc<Shared>, tokio_util::sync::CancellationToken) {
            let config: crate::config::Config = serde_json::from_value(json!({
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
            let resp = crate::clients::http_client()
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
            // One that could fire anywhere is refused as its registration would be.
            let anywhere = manifest(&module, "b", json!({"rule": "name suffix \".h5\""}));
            let (status, report) = post(&base, "/v1/functions?dry_run=true&since=-1h", &anywhere).await;
            assert_eq!(status, 403, "{report}");
            let b = manifest(&module, "b", json!({"rule": "path prefix \"/data/\" and name suffix \".h5\""}));
            let (status, report) = post(&base, "/v1/functions?dry_run=true&since=-1h", &b).await;
            assert_eq!(status, 200, "{report}");
            assert_eq!(paths(&report), [r#""b":"/data/other/b.h5""#, r#""b":"/data/raw/a.h5""#], "{report}");
            let listed = crate::clients::http_client()
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
            let resp = crate::clients::http_client()
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
