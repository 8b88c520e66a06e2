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
//! | `POST /v1/modules` | admin | body = wasm bytes → `{"digest":…}` |
//! | `GET /v1/modules/{digest}` | none | module bytes (content-addressed; EPs verify the digest) |
//! | `POST /v1/functions` | admin | body = `FunctionManifest` → `FunctionRecord` |
//! | `GET /v1/functions` | admin | latest `FunctionRecord` of each function |
//! | `POST /v1/functions/{name}/runs` | submit token | body `{"path":…, "annex"?:…}` → `SubmitResponse` |
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
//! | `GET /v1/stats` | admin | ingest counters |
//!
//! Every scheduler route is proxied with the scheduler's admin token after this API's own admin
//! check; path segments are checked here (job ids `[A-Za-z0-9-]`, EP names and owners 1–128
//! printable characters without `/`, percent-encoded when forwarded) and bodies parsed into
//! their `proto` type, so the scheduler only ever sees well-formed requests.

use crate::Shared;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use htfaas_functions::proto::ApiError;
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
    Ok((StatusCode::CREATED, Json(serde_json::json!({ "digest": digest }))))
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

async fn register(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, Failure> {
    require_admin(&shared, &headers)?;
    let manifest: FunctionManifest = serde_json::from_slice(&body)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("invalid manifest: {e}")))?;
    let s = shared.clone();
    let record = blocking(move || {
        let record = s.registry.register(manifest)?;
        s.triggers.reload(&s.registry)?;
        Ok(record)
    })
    .await?;
    tracing::info!(function = %record.manifest.name, version = record.version, "function registered");
    Ok((StatusCode::CREATED, Json(record)))
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

/// Body of `POST /v1/functions/{name}/runs`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RunRequest {
    /// Storage path of the input file; it must match the function's trigger.
    path: String,
    /// Run on this annex. Allowed only when the function names none or the same one.
    #[serde(default)]
    annex: Option<String>,
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
    let event = htfaas_functions::proto::EventRef {
        source: "submit".into(),
        id: format!("{}/{run_id}", claims.jti),
        path: run.path.clone(),
    };
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
}
