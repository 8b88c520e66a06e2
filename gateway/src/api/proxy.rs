//! The scheduler's routes, proxied with its admin token after this API's own scope check:
//! jobs (own ones for a developer), accounting, priorities, EPs, revocations.
//!
//! Must not know: the firing table, the JetStream consumer.

use super::blocking;
use super::forward::{forward, forward_get, proxy, scheduler_json};
use crate::auth::{Caller, Scheduler};
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use htfaas_functions::proto::{Account, AccountingBy, AccountingQuery, JobRecord, RevocationTarget};
use std::sync::Arc;

/// Most jobs the scheduler lists in one answer (its `MAX_LIST_LIMIT`): what a developer's
/// list is filtered from.
pub(super) const SCHEDULER_MAX_LIST: usize = 10_000;
/// A list's length when the query names none (the scheduler's `DEFAULT_LIST_LIMIT`).
pub(super) const DEFAULT_LIST: usize = 100;

/// `GET /v1/jobs[?limit=n]`: an admin's query goes to the scheduler as it came; a developer
/// gets its own jobs among the scheduler's newest [`SCHEDULER_MAX_LIST`], newest first, at most
/// `limit`.
pub(super) async fn proxy_jobs(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    if caller.is_admin() {
        let suffix = query.map(|q| format!("?{q}")).unwrap_or_default();
        return forward_get(&shared.scheduler(), &format!("/v1/jobs{suffix}")).await;
    }
    #[derive(serde::Deserialize)]
    struct ListQuery {
        limit: Option<usize>,
        trace: Option<String>,
        ended_since_ms: Option<u64>,
    }
    let Query(list) = Query::<ListQuery>::try_from_uri(&uri)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid query: {}", e.body_text())))?;
    if list.ended_since_ms.is_some() {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            "the accounting export (ended_since_ms) is an admin's: it lists every owner's runs".into(),
        ));
    }
    // A trace's jobs are asked of the scheduler by the trace id alone, checked here
    // to be one: nothing else of the caller's query reaches it.
    let trace = match list.trace {
        Some(t) if htfaas_functions::trace::is_trace_id(&t) => format!("&trace={t}"),
        Some(_) => {
            return Err(HttpError(StatusCode::BAD_REQUEST, "trace must be 32 lower-case hex digits".into()));
        }
        None => String::new(),
    };
    let mut jobs: Vec<JobRecord> =
        scheduler_json(&shared.scheduler(), &format!("/v1/jobs?limit={SCHEDULER_MAX_LIST}{trace}")).await?;
    jobs.retain(|j| j.owner == caller.name);
    jobs.truncate(list.limit.unwrap_or(DEFAULT_LIST).min(SCHEDULER_MAX_LIST));
    Ok(Json(jobs).into_response())
}

pub(super) async fn proxy_job(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    check_job_id(&id)?;
    if !caller.is_admin() {
        return Ok(Json(own_job(&shared.scheduler(), &caller, &id).await?).into_response());
    }
    forward_get(&shared.scheduler(), &format!("/v1/jobs/{id}")).await
}

/// The job `id` when the caller may see it; another owner's job is 404, worded as the
/// scheduler words an unknown one, so that it reveals nothing.
pub(super) async fn own_job(scheduler: &Scheduler<'_>, caller: &Caller, id: &str) -> Result<JobRecord, HttpError> {
    let job: JobRecord = scheduler_json(scheduler, &format!("/v1/jobs/{id}")).await?;
    if !caller.owns(&job.owner) {
        return Err(HttpError(StatusCode::NOT_FOUND, format!("job {id:?} not found")));
    }
    Ok(job)
}

/// Job ids are `[A-Za-z0-9-]+` (uuids), so they go into the scheduler's URL as they are.
pub(super) fn check_job_id(id: &str) -> Result<(), HttpError> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(HttpError(StatusCode::BAD_REQUEST, format!("bad job id {id:?}: want [A-Za-z0-9-]")));
    }
    Ok(())
}

/// Checks an EP name or an owner taken from the path and returns it percent-encoded for the
/// scheduler's URL: 1–128 printable characters, no `/`, and not `.` or `..` (which URL parsers
/// resolve as directory steps, even percent-encoded).
pub(super) fn path_name(what: &str, name: &str) -> Result<String, HttpError> {
    let ok = (1..=128).contains(&name.chars().count())
        && !name.chars().any(|c| c.is_control() || c == '/')
        && name != "."
        && name != "..";
    if !ok {
        return Err(HttpError(
            StatusCode::BAD_REQUEST,
            format!("bad {what} {name:?}: want 1 to 128 printable characters, no '/', not '.' or '..'"),
        ));
    }
    Ok(htfaas_functions::percent::path(name))
}

/// `GET /v1/jobs/{id}/history|analyze|log`: shares its path with the job actions, not its method.
pub(super) async fn proxy_job_view(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((id, view)): Path<(String, String)>,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    check_job_id(&id)?;
    if !matches!(view.as_str(), "history" | "analyze" | "log") {
        return Err(HttpError(StatusCode::NOT_FOUND, format!("no job view {view:?} (history, analyze, log)")));
    }
    if !caller.is_admin() {
        own_job(&shared.scheduler(), &caller, &id).await?;
    }
    forward_get(&shared.scheduler(), &format!("/v1/jobs/{id}/{view}")).await
}

pub(super) async fn proxy_job_action(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    check_job_id(&id)?;
    if !matches!(action.as_str(), "hold" | "release" | "remove") {
        return Err(HttpError(StatusCode::NOT_FOUND, format!("no job action {action:?} (hold, release, remove)")));
    }
    let request: htfaas_functions::proto::JobAction = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid job action: {e}")))?;
    let job = if caller.is_admin() { None } else { Some(own_job(&shared.scheduler(), &caller, &id).await?) };
    // A held job runs again only if its principal may still do what it does: a grant taken
    // back while it was held (its macaroons are still valid) stops it here.
    if action == "release" {
        let job = match job {
            Some(job) => job,
            None => scheduler_json(&shared.scheduler(), &format!("/v1/jobs/{id}")).await?,
        };
        let s = shared.clone();
        let allowed = blocking(move || Ok(crate::jobs::still_allowed(&s.namespaces, &s.registry, &job))).await?;
        if let Err(why) = allowed {
            tracing::info!(job = %id, caller = %caller.name, "release refused: {why}");
            return Err(HttpError(
                StatusCode::FORBIDDEN,
                format!("job {id} cannot be released: {why} (a grant was taken back since it was made; remove it)"),
            ));
        }
    }
    tracing::info!(job = %id, %action, caller = %caller.name, reason = %request.reason, "job action requested");
    let url = format!("{}/v1/jobs/{id}/{action}", shared.submitter_base());
    let done = forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await?;
    let job = htfaas_functions::audit::Subject { job: Some(id), ..Default::default() };
    let args = serde_json::json!({ "reason": request.reason });
    Ok(super::audit::record_forwarded(&shared, &headers, &format!("job.{action}"), job, args, done).await)
}

/// `GET /v1/accounting`: every owner's account for an admin, a developer's own otherwise.
pub(super) async fn proxy_accounting(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    if caller.is_admin() {
        return forward_get(&shared.scheduler(), "/v1/accounting").await;
    }
    let mut accounts: Vec<Account> = scheduler_json(&shared.scheduler(), "/v1/accounting").await?;
    accounts.retain(|a| a.owner == caller.name);
    Ok(Json(accounts).into_response())
}

/// `GET /v1/accounting/report`: the query is parsed into an `AccountingQuery` here and sent on
/// re-encoded (digits and fixed words), so the scheduler sees only well-formed ones.
pub(super) async fn proxy_accounting_report(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<AccountingQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    let Query(q) = query.map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid accounting query: {e}")))?;
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
    forward_get(&shared.scheduler(), &path).await
}

pub(super) async fn proxy_priorities(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    proxy(&shared, &headers, "/v1/priorities").await
}

pub(super) async fn proxy_set_factor(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(owner): Path<String>,
    body: Bytes,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    let encoded = path_name("owner", &owner)?;
    let request: htfaas_functions::proto::FactorRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid factor request: {e}")))?;
    tracing::info!(%owner, factor = request.factor, "priority factor change requested");
    let url = format!("{}/v1/accounting/{encoded}/factor", shared.submitter_base());
    let done = forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await?;
    let subject = htfaas_functions::audit::Subject { owner: Some(owner), ..Default::default() };
    let args = serde_json::json!({ "factor": request.factor });
    Ok(super::audit::record_forwarded(&shared, &headers, "owner.set_factor", subject, args, done).await)
}

pub(super) async fn proxy_eps(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, HttpError> {
    proxy(&shared, &headers, "/v1/eps").await
}

/// The EP actions the scheduler knows.
pub(super) const EP_ACTIONS: [&str; 5] = ["drain", "disable", "enable", "pause", "resume"];

/// `POST /v1/eps/{name}/{action}`. Which fields of the body each action takes (`deadline_s`
/// for drain, `group` for pause and resume) is the scheduler's rule; it is checked there.
pub(super) async fn proxy_ep_action(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    let encoded = path_name("EP name", &name)?;
    if !EP_ACTIONS.contains(&action.as_str()) {
        return Err(HttpError(StatusCode::NOT_FOUND, format!("no EP action {action:?} ({})", EP_ACTIONS.join(", "))));
    }
    let request: htfaas_functions::proto::EpAction = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid EP action: {e}")))?;
    tracing::info!(ep = %name, %action, reason = %request.reason, "EP action requested");
    let url = format!("{}/v1/eps/{encoded}/{action}", shared.submitter_base());
    let done = forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await?;
    let args = serde_json::json!({ "ep": name, "request": request });
    Ok(super::audit::record_forwarded(&shared, &headers, &format!("ep.{action}"), Default::default(), args, done).await)
}

/// The audit subject of a revocation's target.
pub(super) fn audit_revocation(target: &RevocationTarget) -> htfaas_functions::audit::Subject {
    let mut subject = htfaas_functions::audit::Subject::default();
    match target {
        RevocationTarget::Jti(jti) => subject.token_jti = Some(jti.clone()),
        RevocationTarget::Owner(owner) => subject.owner = Some(owner.clone()),
        RevocationTarget::Issuer(_) => {}
    }
    subject
}

pub(super) async fn proxy_revocations(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    proxy(&shared, &headers, "/v1/revocations").await
}

pub(super) async fn proxy_revoke(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    let request: htfaas_functions::proto::RevokeRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid revocation: {e}")))?;
    tracing::warn!(target = ?request.target, reason = %request.reason, "revocation requested");
    let url = format!("{}/v1/revocations", shared.submitter_base());
    let done = forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request)).await?;
    let subject = audit_revocation(&request.target);
    let args = serde_json::json!({ "target": request.target, "reason": request.reason });
    Ok(super::audit::record_forwarded(&shared, &headers, "token.revoke", subject, args, done).await)
}
