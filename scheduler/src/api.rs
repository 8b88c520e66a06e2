//! The HTTP API. Every error answer is an `ApiError` naming the failed check.
//!
//! | route | credential | answer |
//! |---|---|---|
//! | `POST /v1/jobs` | submit token | `SubmitRequest` → 201 `SubmitResponse` (200 when the dedupe key already had a job; 429 when the owner is at the idle limit) |
//! | `POST /v1/jobs/batch` | a submit token per job | `SubmitBatch` → 200 `SubmitBatchResponse`: each job answered with the status `POST /v1/jobs` would give it, those accepted stored in one write (400 for a body that is no batch, empty, or over `MAX_SUBMIT_BATCH` jobs) |
//! | `POST /v1/preflight` | submit token | 200 `{"remaining": n}`: would a submission pass now? Uses nothing |
//! | `POST /v1/modules/warm` | submit token naming the digest | `WarmRequest` → 200 `WarmResponse`: EPs compile the module ahead of its first job ([`crate::warm`]; 403 for another digest or a URL no module store has). Uses nothing |
//! | `GET /v1/ep/attach` | attach token | WebSocket upgrade to an EP session ([`crate::ep_link`]) |
//! | `GET /v1/jobs[?limit=n]`, `GET /v1/jobs/{id}` | admin | `JobRecord`s, newest first (`?unfinished=true&owner=o`, `&group=g` or `&function=f`: the idle, held and running jobs of an owner, a group or a function, oldest first; `?ended_since_ms=t[&ended_until_ms=u][&after=id]`: the jobs that ended in the window, in the order they ended, a page of `limit` after the job `after`: the accounting export) |
//! | `POST /v1/fired` | admin | `FiredQuery` → `FiredPaths`: which paths have a job of a function (`events backfill`) |
//! | `POST /v1/jobs/{id}/hold` | admin | `JobAction` → 200 `JobRecord`: idle or running → `held` (a running job is stopped) |
//! | `POST /v1/jobs/{id}/release` | admin | `JobAction` → 200 `JobRecord`: held → `idle`, dispatched again |
//! | `POST /v1/jobs/{id}/remove` | admin | `JobAction` → 200 `JobRecord`: idle, running or held → `removed` (a running job is stopped) |
//! | `GET /v1/jobs/{id}/history` | admin | the job's run attempts (`Attempt`s), first first |
//! | `GET /v1/jobs/{id}/analyze` | admin | `JobAnalysis`: why it is (not) running |
//! | `GET /v1/jobs/{id}/log` | admin | `JobLog`: the guest's stdout and stderr of its last reported run |
//! | `GET /v1/accounting` | admin | every owner's `Account` |
//! | `GET /v1/accounting/report?by=owner\|group\|function[&since_ms&until_ms&period_s]` | admin | `AccountingReport` ([`crate::report`]; 400 for a bad query, `period_s` 0, or more than [`crate::report::MAX_PERIODS`] periods) |
//! | `GET /v1/priorities` | admin | `PriorityReport`: fair share per owner and group (`condor_userprio`) |
//! | `POST /v1/accounting/{owner}/factor` | admin | `FactorRequest` → 200 `OwnerPriority` |
//! | `GET /v1/eps` | admin | every attached EP and every EP name with admin settings (`EpInfo`) |
//! | `POST /v1/eps/{name}/{drain,disable,enable,pause,resume}` | admin | `EpAction` → 200 `EpInfo` ([`crate::admin`]) |
//! | `POST /v1/revocations` | admin | `RevokeRequest` → 200 `Revocation` (applied and recorded) |
//! | `GET /v1/revocations` | admin | every `Revocation`, oldest first |
//! | `GET /v1/audit?job=&token=&owner=&file=&function=&event=&since=&until=&limit=` | admin | the audit records selected (`AuditRecord`s, in seq order; `since`/`until` Unix ms, `limit` default [`DEFAULT_AUDIT_LIMIT`], at most [`MAX_AUDIT_LIMIT`]; an unknown parameter is 400) |
//! | `GET /v1/audit/verify` | admin | `VerifyReport` of the whole trail, under the scheduler's audit key |
//! | `GET /v1/audit/keys` | admin | the audit key's JWKS (for verifying a copy of the trail offline) |
//! | `GET /metrics` | admin | Prometheus metrics, OpenMetrics text ([`crate::metrics`]) |
//! | `/v1/annexes…` | admin | annexes: [`crate::annex_api`] |
//! | `GET /healthz` | none | `ok` |
//!
//! Order of checks on submit: token (401: signature, `kid`, issuer, audience, expiry), then
//! revocation (403 `token revoked: <reason>`), then the request itself (400), then its URLs
//! ([`crate::trust`], 403: the module must be a module store's URL for the job's digest, the
//! input and output must be on a trusted storage), then the site policy and the request against
//! the token's limits (403), then, in one transaction, revocation again, dedupe (200
//! with the existing job), token use (401 when used up), and the owner's idle limit
//! ([`crate::Config::max_idle_jobs_per_owner`]: 429 `owner <o> has <n> idle jobs, the limit is
//! <max>; try again later`, counting idle and held jobs). A refused submission counts no use of
//! its token, so the same token passes once the owner's queue drains; 429 is transient, and the
//! gateway retries the event later. A 2xx answer means the job is committed to disk.
//!
//! Preflight runs the same checks as a submission, up to and including the use count, without
//! a request and without counting a use: the gateway calls it before asking the storage for a
//! bearer's macaroons, and gets the very status and message a submission would get (except the
//! idle limit, which depends on the dedupe key: a submission answers that one).
//!
//! Attach: token (401), then revocation (403 `attach token revoked: <reason>`), both before the
//! upgrade. The session keeps the connection's peer address (served with connect info), to
//! which jobs that ask for it have their macaroons bound.
//!
//! Job actions ([`crate::actions`]): 401 without the admin token, then 400 for a body that is not
//! a `JobAction` or a reason that is empty, longer than 1024 bytes or holds a control character,
//! then 404 for an unknown job, then 409 when the job's state does not allow the action (already
//! held; not held, for a release; completed, failed or removed).
//!
//! Revocations: 400 when the value is empty or longer than 256 characters or the reason longer
//! than 1024.
//!
//! Every refused submission (any 4xx of `POST /v1/jobs`, or of a job in a batch) is recorded in the audit trail as
//! `job.refused` with its status and reason, the verified token's `jti` and owner (or, for a
//! token that parsed but did not verify, its claimed `jti` as `unverified_jti`), and the
//! request's function and event when the body parsed. The token itself is never recorded.
//! Audit queries and verification read the store on connections of their own (read-only), so
//! they do not hold up the queue.

use crate::actions::Action;
use crate::error::QueueError;
use crate::failure::ApiFailure;
use crate::metrics::{Reason, Token};
use crate::queue::{Refusal, Submitted};
use crate::revocation::Credential;
use crate::state::Shared;
use crate::submission::{self, Known};
use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use htfaas_functions::audit::{self, AuditFilter, AuditRecord, VerifyReport};
use htfaas_functions::proto::{
    Account, AccountingQuery, AccountingReport, Attempt, EpAction, EpInfo, FactorRequest, JobAction, JobAnalysis,
    JobLog, JobRecord, OwnerPriority, PriorityReport, Revocation, RevokeRequest, SubmitRequest, SubmitResponse,
};
use htfaas_functions::proto::{
    BatchAnswer, BatchJob, MAX_SUBMIT_BATCH, MAX_SUBMIT_BATCH_BYTES, SubmitBatch, SubmitBatchResponse,
};
use htfaas_functions::proto::{FiredPaths, FiredQuery, MAX_FIRED_QUERY};
use htfaas_functions::token::constant_time_eq;
use htfaas_functions::token::{AttachClaims, SubmitClaims};

use jsonwebtoken::jwk::JwkSet;
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;

/// Largest submit body, bytes.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Default and largest `?limit=` of `GET /v1/jobs`.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// Largest `?limit=` of `GET /v1/jobs`.
pub const MAX_LIST_LIMIT: usize = 10_000;
/// Who a revocation is recorded as made by: the one admin credential.
pub const ADMIN_NAME: &str = "admin";
/// Default `?limit=` of `GET /v1/audit`.
pub const DEFAULT_AUDIT_LIMIT: u64 = 1000;
/// Largest `?limit=` of `GET /v1/audit`.
pub const MAX_AUDIT_LIMIT: u64 = 100_000;

/// The router, with `shared` as state.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/jobs", post(submit).get(list_jobs))
        .route("/v1/jobs/batch", post(submit_batch).layer(DefaultBodyLimit::max(MAX_SUBMIT_BATCH_BYTES)))
        .route("/v1/preflight", post(preflight))
        .route("/v1/modules/warm", post(warm))
        .route("/v1/revocations", post(revoke).get(list_revocations))
        .route("/v1/fired", post(fired))
        .route("/v1/jobs/{id}", get(get_job))
        .route("/v1/jobs/{id}/hold", post(hold))
        .route("/v1/jobs/{id}/release", post(release))
        .route("/v1/jobs/{id}/remove", post(remove))
        .route("/v1/jobs/{id}/history", get(history))
        .route("/v1/jobs/{id}/analyze", get(analyze))
        .route("/v1/jobs/{id}/log", get(job_log))
        .route("/v1/accounting", get(accounting))
        .route("/v1/accounting/report", get(accounting_report))
        .route("/v1/accounting/{owner}/factor", post(set_factor))
        .route("/v1/priorities", get(priorities))
        .route("/v1/eps", get(list_eps))
        .route("/v1/eps/{name}/{verb}", post(ep_action))
        .route("/v1/ep/attach", get(attach))
        .route("/v1/audit", get(audit_query))
        .route("/v1/audit/verify", get(audit_verify))
        .route("/v1/audit/keys", get(audit_keys))
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .merge(crate::annex_api::routes(require_admin))
        .fallback(|| async { ApiFailure::not_found("no such endpoint") })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(shared)
}

/// The token after `Bearer ` in `Authorization`, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    htfaas_functions::token::bearer(headers.get(header::AUTHORIZATION)?.to_str().ok()?)
}

fn require_admin(shared: &Shared, headers: &HeaderMap) -> Result<(), ApiFailure> {
    let Some(token) = bearer(headers) else {
        shared.metrics.refused(Token::Admin, Reason::Missing);
        return Err(ApiFailure::unauthorized("missing admin bearer token"));
    };
    if constant_time_eq(token.as_bytes(), shared.admin_token.as_bytes()) {
        Ok(())
    } else {
        shared.metrics.refused(Token::Admin, Reason::WrongToken);
        Err(ApiFailure::unauthorized("invalid admin token"))
    }
}

/// The bearer's submit token, verified and not revoked: what preflight and warm check first.
fn authorize_submit(shared: &Shared, headers: &HeaderMap) -> Result<SubmitClaims, ApiFailure> {
    submission::authorize(shared, bearer(headers))
}

#[tracing::instrument(name = "scheduler.submit", skip_all,
    fields(owner = tracing::field::Empty, token.jti = tracing::field::Empty, trace_id = tracing::field::Empty,
           job.id = tracing::field::Empty, created = tracing::field::Empty))]
async fn submit(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiFailure> {
    let mut known = Known::default();
    let answer = accept(&shared, &headers, body, &mut known).await;
    if let Err(refusal) = &answer
        && refusal.status.is_client_error()
    {
        // The answer stands whether or not its record could be written: a refusal changes
        // nothing, so failing closed is the safe side.
        let refusal = refusal_of(known, refusal);
        if let Err(e) = shared.queue.record_refusals(vec![refusal]).await {
            tracing::error!("failed to record a refused submission in the audit trail: {e}");
        }
    }
    answer
}

/// The submission proper; fills `known` with what a refusal's record says.
async fn accept(
    shared: &Shared,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    known: &mut Known,
) -> Result<Response, ApiFailure> {
    let parse = || {
        let body = body.map_err(|e| ApiFailure { status: e.status(), message: format!("request body: {e}") })?;
        serde_json::from_slice::<SubmitRequest>(&body)
            .map_err(|e| ApiFailure::bad_request(format!("invalid request body: {e}")))
    };
    let job = submission::check(shared, bearer(headers), parse, known)?;
    let done = shared.queue.submit(job).await.inspect_err(|e| submission::count_refusal(shared, e))?;
    let span = tracing::Span::current();
    span.record("job.id", done.job_id.as_str());
    span.record("created", done.created);
    let status = if done.created {
        tracing::info!("job queued");
        shared.metrics.submitted(&done.job_id);
        shared.wake.notify_one();
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(response(done))).into_response())
}

/// `POST /v1/jobs/batch`: each job checked as `POST /v1/jobs` checks one, with its own token;
/// those that pass are stored in one write ([`crate::queue::Queue::submit_many`]), and the
/// refusals recorded in one more. Always 200 with one answer per job, unless the body is not
/// a batch (400) or the store failed (its status for the whole batch: nothing was stored).
#[tracing::instrument(name = "scheduler.submit_batch", skip_all, fields(jobs = tracing::field::Empty))]
async fn submit_batch(
    State(shared): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<SubmitBatchResponse>, ApiFailure> {
    let body = body.map_err(|e| ApiFailure { status: e.status(), message: format!("request body: {e}") })?;
    let batch: SubmitBatch =
        serde_json::from_slice(&body).map_err(|e| ApiFailure::bad_request(format!("invalid batch: {e}")))?;
    if batch.jobs.is_empty() || batch.jobs.len() > MAX_SUBMIT_BATCH {
        return Err(ApiFailure::bad_request(format!(
            "a batch holds 1 to {MAX_SUBMIT_BATCH} jobs, not {}",
            batch.jobs.len()
        )));
    }
    tracing::Span::current().record("jobs", batch.jobs.len());
    let mut answers: Vec<Option<BatchAnswer>> = Vec::with_capacity(batch.jobs.len());
    let mut accepted = Vec::new();
    let mut refusals = Vec::new();
    for (i, item) in batch.jobs.into_iter().enumerate() {
        let mut known = Known::default();
        let BatchJob { token, request } = item;
        match submission::check(&shared, Some(&token), || Ok(request), &mut known) {
            Ok(job) => {
                accepted.push((i, job, known));
                answers.push(None);
            }
            Err(refusal) => {
                answers.push(Some(refused(&refusal)));
                refusals.push(refusal_of(known, &refusal));
            }
        }
    }
    if !accepted.is_empty() {
        let (jobs, places): (Vec<_>, Vec<_>) = accepted.into_iter().map(|(i, job, known)| (job, (i, known))).unzip();
        let stored = shared.queue.submit_many(jobs).await?;
        let mut created = false;
        for ((place, known), done) in places.into_iter().zip(stored) {
            answers[place] = Some(match done {
                Ok(done) => {
                    if done.created {
                        created = true;
                        shared.metrics.submitted(&done.job_id);
                    }
                    let status = if done.created { StatusCode::CREATED } else { StatusCode::OK };
                    BatchAnswer { status: status.as_u16(), job: Some(response(done)), error: None }
                }
                Err(e) => {
                    submission::count_refusal(&shared, &e);
                    let refusal = ApiFailure::from(e);
                    refusals.push(refusal_of(known, &refusal));
                    refused(&refusal)
                }
            });
        }
        if created {
            shared.wake.notify_one();
        }
    }
    if !refusals.is_empty()
        && let Err(e) = shared.queue.record_refusals(refusals).await
    {
        tracing::error!("failed to record refused submissions in the audit trail: {e}");
    }
    // Every place is answered above; an empty one would be a bug, answered as a failure.
    let unanswered = || refused(&ApiFailure::internal("answer a job of the batch", &"it was not answered"));
    let results = answers.into_iter().map(|a| a.unwrap_or_else(unanswered)).collect();
    Ok(Json(SubmitBatchResponse { results }))
}

/// A batch's answer for a job refused with `f`.
fn refused(f: &ApiFailure) -> BatchAnswer {
    BatchAnswer { status: f.status.as_u16(), job: None, error: Some(f.message.clone()) }
}

/// A stored job as the API answers it.
fn response(done: Submitted) -> SubmitResponse {
    SubmitResponse { job_id: done.job_id, created: done.created }
}

/// The record of a submission refused with `f`.
fn refusal_of(known: Known, f: &ApiFailure) -> Refusal {
    Refusal { subject: known.subject, status: f.status.as_u16(), reason: f.message.clone(), detail: known.detail }
}

/// `POST /v1/preflight`: the submit checks up to the use count, counting nothing.
#[tracing::instrument(name = "scheduler.preflight", skip_all, fields(owner = tracing::field::Empty))]
async fn preflight(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, ApiFailure> {
    let claims = authorize_submit(&shared, &headers).inspect_err(|e| tracing::info!("refused: {}", e.message))?;
    tracing::Span::current().record("owner", claims.sub.as_str());
    let uses = shared.queue.uses(claims.jti.clone()).await?;
    if uses >= u64::from(claims.jobs) {
        shared.metrics.refused(Token::Submit, Reason::UsedUp);
        return Err(QueueError::TokenUsed { uses, jobs: claims.jobs }.into());
    }
    Ok(Json(serde_json::json!({ "remaining": u64::from(claims.jobs) - uses })).into_response())
}

async fn warm(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<htfaas_functions::proto::WarmResponse>, ApiFailure> {
    let claims = authorize_submit(&shared, &headers).inspect_err(|e| tracing::info!("warm refused: {}", e.message))?;
    crate::warm::request(&shared, &claims, body).map(Json)
}

/// `POST /v1/revocations`: applies a revocation everywhere and answers once it is recorded.
async fn revoke(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Revocation>, ApiFailure> {
    require_admin(&shared, &headers)?;
    let body = body.map_err(|e| ApiFailure { status: e.status(), message: format!("request body: {e}") })?;
    let req: RevokeRequest =
        serde_json::from_slice(&body).map_err(|e| ApiFailure::bad_request(format!("invalid revocation: {e}")))?;
    crate::revocation::validate(&req).map_err(|e| ApiFailure::bad_request(e.to_string()))?;
    Ok(Json(crate::revoke::revoke(&shared, req, ADMIN_NAME).await?))
}

async fn list_revocations(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<Vec<Revocation>>, ApiFailure> {
    require_admin(&shared, &headers)?;
    Ok(Json(shared.queue.revocations().await?))
}

#[derive(Deserialize)]
struct ListParams {
    limit: Option<usize>,
    /// Only the unfinished jobs (idle, held, running), oldest first: of `owner`, charged to
    /// `group`, or of `function` (a revoked grant's sweep at the gateway).
    #[serde(default)]
    unfinished: bool,
    owner: Option<String>,
    group: Option<String>,
    function: Option<String>,
    /// Only the jobs of this event trace (32 lower-case hex digits), oldest first.
    trace: Option<String>,
    /// Only the jobs that ended (completed, failed, removed) from this time on, Unix ms, in
    /// the order they ended (the accounting export); with `ended_until_ms` and `after`.
    ended_since_ms: Option<u64>,
    /// With `ended_since_ms`: before this time, Unix ms. Default: no end.
    ended_until_ms: Option<u64>,
    /// With `ended_since_ms`: after this job, of the same end time (the next page).
    after: Option<String>,
}

async fn list_jobs(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Vec<JobRecord>>, ApiFailure> {
    require_admin(&shared, &headers)?;
    let Query(params) = params.map_err(|e| ApiFailure::bad_request(format!("invalid query: {e}")))?;
    let limit = params.limit.unwrap_or(DEFAULT_LIST_LIMIT).min(MAX_LIST_LIMIT);
    if let Some(trace) = params.trace {
        if !htfaas_functions::trace::is_trace_id(&trace) {
            return Err(ApiFailure::bad_request("trace must be 32 lower-case hex digits, not all zero"));
        }
        return Ok(Json(shared.queue.list_by_trace(trace, limit).await?));
    }
    if let Some(since) = params.ended_since_ms {
        if params.unfinished || params.owner.is_some() || params.group.is_some() || params.function.is_some() {
            return Err(ApiFailure::bad_request("ended_since_ms goes with ended_until_ms, after and limit only"));
        }
        let until = params.ended_until_ms.unwrap_or(u64::MAX);
        return Ok(Json(shared.queue.list_ended(since, until, params.after, limit).await?));
    }
    if params.ended_until_ms.is_some() || params.after.is_some() {
        return Err(ApiFailure::bad_request("ended_until_ms and after go with ended_since_ms"));
    }
    if params.unfinished {
        if params.owner.is_none() && params.group.is_none() && params.function.is_none() {
            return Err(ApiFailure::bad_request("unfinished goes with owner, group or function"));
        }
        return Ok(Json(shared.queue.list_unfinished(params.owner, params.group, params.function, limit).await?));
    }
    if params.owner.is_some() || params.group.is_some() || params.function.is_some() {
        return Err(ApiFailure::bad_request("owner, group and function go with unfinished=true"));
    }
    Ok(Json(shared.queue.list(limit).await?))
}

/// `POST /v1/fired` (admin): which of the paths has a job of the function.
async fn fired(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Json<FiredQuery>, JsonRejection>,
) -> Result<Json<FiredPaths>, ApiFailure> {
    require_admin(&shared, &headers)?;
    let Json(q) = body.map_err(|e| ApiFailure::bad_request(format!("invalid FiredQuery: {}", e.body_text())))?;
    if q.paths.len() > MAX_FIRED_QUERY {
        return Err(ApiFailure::bad_request(format!("at most {MAX_FIRED_QUERY} paths per query")));
    }
    Ok(Json(FiredPaths { paths: shared.queue.fired_paths(q.owner, q.function, q.paths).await? }))
}

async fn get_job(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<JobRecord>, ApiFailure> {
    require_admin(&shared, &headers)?;
    match shared.queue.get(id.clone()).await? {
        Some(job) => Ok(Json(job)),
        None => Err(ApiFailure::not_found(format!("job {id:?} not found"))),
    }
}

/// A job action: admin, then the body, then the job (see the module docs for the statuses).
async fn act(
    shared: &Shared,
    headers: &HeaderMap,
    id: String,
    body: Result<Bytes, BytesRejection>,
    action: Action,
) -> Result<Json<JobRecord>, ApiFailure> {
    require_admin(shared, headers)?;
    let body = body.map_err(|e| ApiFailure { status: e.status(), message: format!("request body: {e}") })?;
    let req: JobAction =
        serde_json::from_slice(&body).map_err(|e| ApiFailure::bad_request(format!("invalid job action: {e}")))?;
    crate::actions::validate_reason(&req.reason).map_err(|e| ApiFailure::bad_request(e.to_string()))?;
    Ok(Json(crate::actions::apply(shared, id, action, req.reason, ADMIN_NAME).await?))
}

async fn hold(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<JobRecord>, ApiFailure> {
    act(&shared, &headers, id, body, Action::Hold).await
}

async fn release(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<JobRecord>, ApiFailure> {
    act(&shared, &headers, id, body, Action::Release).await
}

async fn remove(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<JobRecord>, ApiFailure> {
    act(&shared, &headers, id, body, Action::Remove).await
}

async fn history(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Vec<Attempt>>, ApiFailure> {
    require_admin(&shared, &headers)?;
    Ok(Json(shared.queue.history(id).await?))
}

async fn job_log(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<JobLog>, ApiFailure> {
    require_admin(&shared, &headers)?;
    match shared.queue.log(id.clone()).await? {
        Some(log) => Ok(Json(JobLog { job_id: id, log })),
        None => Err(ApiFailure::not_found(format!("job {id:?} not found"))),
    }
}

async fn analyze(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<JobAnalysis>, ApiFailure> {
    require_admin(&shared, &headers)?;
    Ok(Json(crate::admin::analyze(&shared, id).await?))
}

async fn priorities(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Json<PriorityReport>, ApiFailure> {
    require_admin(&shared, &headers)?;
    Ok(Json(crate::admin::priorities(&shared).await?))
}

async fn set_factor(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(owner): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<OwnerPriority>, ApiFailure> {
    require_admin(&shared, &headers)?;
    let body = body.map_err(|e| ApiFailure { status: e.status(), message: format!("request body: {e}") })?;
    let req: FactorRequest =
        serde_json::from_slice(&body).map_err(|e| ApiFailure::bad_request(format!("invalid factor request: {e}")))?;
    Ok(Json(crate::admin::set_factor(&shared, owner, req.factor, ADMIN_NAME).await?))
}

async fn list_eps(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Json<Vec<EpInfo>>, ApiFailure> {
    require_admin(&shared, &headers)?;
    Ok(Json(shared.eps().infos()))
}

async fn ep_action(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((name, verb)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<EpInfo>, ApiFailure> {
    require_admin(&shared, &headers)?;
    let verb = crate::admin::EpVerb::parse(&verb).ok_or_else(|| {
        ApiFailure::not_found(format!("no EP action {verb:?} (drain, disable, enable, pause, resume)"))
    })?;
    let body = body.map_err(|e| ApiFailure { status: e.status(), message: format!("request body: {e}") })?;
    let req: EpAction =
        serde_json::from_slice(&body).map_err(|e| ApiFailure::bad_request(format!("invalid EP action: {e}")))?;
    Ok(Json(crate::admin::ep_action(&shared, name, verb, req, ADMIN_NAME).await?))
}

/// `GET /v1/audit`: the records the query selects, read on a connection of its own.
async fn audit_query(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    filter: Result<Query<AuditFilter>, QueryRejection>,
) -> Result<Json<Vec<AuditRecord>>, ApiFailure> {
    require_admin(&shared, &headers)?;
    let Query(mut filter) = filter.map_err(|e| ApiFailure::bad_request(format!("invalid audit query: {e}")))?;
    filter.limit = Some(filter.limit.unwrap_or(DEFAULT_AUDIT_LIMIT).min(MAX_AUDIT_LIMIT));
    let path = shared.queue.path().to_owned();
    let records = tokio::task::spawn_blocking(move || audit::query(&path, &filter))
        .await
        .map_err(|e| ApiFailure::internal("query the audit trail", &e))?
        .map_err(|e| ApiFailure::internal("query the audit trail", &e))?;
    Ok(Json(records))
}

/// `GET /v1/audit/verify`: the whole trail checked under the scheduler's audit key.
async fn audit_verify(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Json<VerifyReport>, ApiFailure> {
    require_admin(&shared, &headers)?;
    let path = shared.queue.path().to_owned();
    let keys = shared.audit_signer.keys();
    let report = tokio::task::spawn_blocking(move || audit::verify(&path, &keys))
        .await
        .map_err(|e| ApiFailure::internal("verify the audit trail", &e))?
        .map_err(|e| ApiFailure::internal("verify the audit trail", &e))?;
    Ok(Json(report))
}

/// `GET /v1/audit/keys`: the public audit key, as a JWKS.
async fn audit_keys(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Json<JwkSet>, ApiFailure> {
    require_admin(&shared, &headers)?;
    Ok(Json(shared.audit_signer.jwks()))
}

/// `GET /metrics`: Prometheus metrics ([`crate::metrics`]).
async fn metrics(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, ApiFailure> {
    require_admin(&shared, &headers)?;
    let path = shared.queue.path().to_owned();
    let store = (shared.queue.writes(), shared.queue.write_batches());
    crate::metrics::render(&shared.metrics, path, store, || crate::metrics::EpFigures::of(&shared.eps())).await
}

async fn accounting(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Json<Vec<Account>>, ApiFailure> {
    require_admin(&shared, &headers)?;
    Ok(Json(shared.queue.accounts().await?))
}

/// `GET /v1/accounting/report`: computed on a connection of its own, off the queue's.
async fn accounting_report(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<AccountingQuery>, QueryRejection>,
) -> Result<Json<AccountingReport>, ApiFailure> {
    require_admin(&shared, &headers)?;
    let Query(query) = query.map_err(|e| ApiFailure::bad_request(format!("invalid accounting query: {e}")))?;
    let path = shared.queue.path().to_owned();
    let now = crate::queue::now_ms();
    let report = tokio::task::spawn_blocking(move || crate::report::report(&path, &query, now))
        .await
        .map_err(|e| ApiFailure::internal("compute the accounting report", &e))?;
    match report {
        Ok(report) => Ok(Json(report)),
        Err(crate::report::ReportError::BadQuery(m)) => Err(ApiFailure::bad_request(m)),
        Err(e) => Err(ApiFailure::internal("compute the accounting report", &e)),
    }
}

/// Verifies the attach token and that it is not revoked, and only then upgrades. The router
/// must be served with `into_make_service_with_connect_info::<SocketAddr>()`.
async fn attach(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiFailure> {
    let token = bearer(&headers)
        .ok_or_else(|| ApiFailure::unauthorized("missing bearer attach token"))
        .inspect_err(|_| shared.metrics.refused(Token::Attach, Reason::Missing))?;
    let claims: AttachClaims = shared.attach_verifier.verify(token).map_err(|e| {
        shared.metrics.refused(Token::Attach, Reason::of(&e));
        tracing::info!("attach refused: {e}");
        ApiFailure::unauthorized(format!("attach token refused: {e}"))
    })?;
    if let Some(reason) = shared.queue.revoked_reason(&Credential::of_attach(&claims)) {
        shared.metrics.refused(Token::Attach, Reason::Revoked);
        tracing::info!("attach refused: token revoked: {reason}");
        return Err(ApiFailure::forbidden(format!("attach token revoked: {reason}")));
    }
    let upgrade = upgrade.map_err(|e| ApiFailure::bad_request(format!("expected a WebSocket upgrade: {e}")))?;
    let shutdown = shared.shutdown.clone();
    let sessions = shared.sessions.clone();
    let shared = shared.clone();
    Ok(upgrade
        .max_message_size(crate::ep_link::MAX_MESSAGE_BYTES)
        .on_upgrade(move |ws| sessions.track_future(crate::ep_link::serve(ws, claims, peer.ip(), shared, shutdown))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{SubmitInvalid, validate};

    #[test]
    fn input_names_must_be_one_clean_segment() {
        let mut req = crate::testing::request("k");
        for bad in ["../x", "..", ".", "", "a/b", "a\\b", "a\0"] {
            req.input.as_mut().expect("an input").name = bad.into();
            assert_eq!(validate(&req), Err(SubmitInvalid::InputName(bad.into())), "{bad:?} accepted");
        }
        req.input.as_mut().expect("an input").name = "a.dat".into();
        assert_eq!(validate(&req), Ok(()));
        req.output.url = "http://s/out".into();
        assert_eq!(validate(&req), Err(SubmitInvalid::OutputUrl));
        req.output.url = "file:///out/".into();
        assert_eq!(validate(&req), Err(SubmitInvalid::OutputUrl));
        assert_eq!(
            SubmitInvalid::InputName("..".into()).to_string(),
            "input.name \"..\" must be one path segment, not . or .."
        );
    }

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "bearer abc".parse().expect("header"));
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().expect("header"));
        assert_eq!(bearer(&h), None);
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
