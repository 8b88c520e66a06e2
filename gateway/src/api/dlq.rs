//! The dead-letter list's routes: `GET /v1/dlq[?function&since&dropped&limit]`,
//! `GET /v1/dlq/{id}`, `POST /v1/dlq/{id}/redrive` and `POST /v1/dlq/{id}/drop`.
//!
//! Owner-scoped as jobs are: a developer lists only its own entries and another owner's entry
//! answers 404 exactly as an unknown one does (show, re-drive, drop), so ids of others reveal
//! nothing; an admin sees and acts on all. A re-drive and a drop are recorded in the gateway's
//! audit trail with their actor, in the transaction that does them.
//!
//! Must not know: the firing table's SQL, NATS.

use crate::auth::Caller;
use crate::firing::{DeadLetterFilter, DlqError, MAX_LIST};
use crate::http_error::HttpError;
use crate::replay;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use htfaas_functions::audit::Subject;
use htfaas_functions::proto::{DeadLetter, DropRequest, MAX_DROP_REASON_CHARS, RedriveRequest};
use std::sync::Arc;

/// A list's length when the query names none.
const DEFAULT_LIST: usize = 100;

#[derive(Debug, serde::Deserialize)]
pub(super) struct ListQuery {
    function: Option<String>,
    since: Option<String>,
    #[serde(default)]
    dropped: bool,
    limit: Option<usize>,
}

fn not_found(id: u64) -> HttpError {
    HttpError(StatusCode::NOT_FOUND, format!("dead-letter entry {id} not found"))
}

/// An entry number from its path segment, parsed after the credential is checked (a bad one
/// without a token is 401, as any request without one).
fn entry_id(segment: &str) -> Result<u64, HttpError> {
    segment.parse().map_err(|_| HttpError(StatusCode::NOT_FOUND, format!("dead-letter entry {segment:?} not found")))
}

fn store_error(e: impl std::fmt::Display) -> HttpError {
    HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("dead-letter list: {e}"))
}

fn dlq_error(e: DlqError) -> HttpError {
    match e {
        DlqError::NotFound(id) => not_found(id),
        DlqError::Conflict(why) => HttpError(StatusCode::CONFLICT, why),
        DlqError::Store(e) => store_error(e),
    }
}

/// `GET /v1/dlq`: the caller's entries (an admin's: everyone's), newest first.
pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let Query(q) = Query::<ListQuery>::try_from_uri(&uri)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid query: {}", e.body_text())))?;
    let since_ms = q
        .since
        .as_deref()
        .map(|s| replay::parse_time(s, replay::now_ms()))
        .transpose()
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("since: {e}")))?;
    let filter = DeadLetterFilter {
        owner: (!caller.is_admin()).then(|| caller.name.clone()),
        function: q.function,
        since_ms,
        dropped: q.dropped,
        limit: q.limit.unwrap_or(DEFAULT_LIST).min(MAX_LIST),
    };
    let list = shared.firings.call(move |f| f.dead_letters(&filter)).await.map_err(store_error)?;
    Ok(Json(list).into_response())
}

/// Entry `id` when the caller may see it; another owner's is 404, worded as an unknown one.
async fn own_entry(shared: &Shared, caller: &Caller, id: u64) -> Result<DeadLetter, HttpError> {
    let entry = shared.firings.call(move |f| f.dead_letter(id)).await.map_err(store_error)?;
    match entry {
        Some(e) if caller.owns(&e.owner) => Ok(e),
        _ => Err(not_found(id)),
    }
}

/// `GET /v1/dlq/{id}`.
pub(super) async fn show(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let id = entry_id(&id)?;
    Ok(Json(own_entry(&shared, &caller, id).await?).into_response())
}

fn subject(e: &DeadLetter) -> Subject {
    Subject {
        job: e.job_id.clone(),
        owner: Some(e.owner.clone()).filter(|o| !o.is_empty()),
        function: Some(e.function.clone()).filter(|f| !f.is_empty()),
        digest: e.digest.clone(),
        event_id: Some(e.event.id.clone()).filter(|i| !i.is_empty()),
        paths: vec![e.event.path.clone()].into_iter().filter(|p| !p.is_empty()).collect(),
        ..Subject::default()
    }
}

/// `POST /v1/dlq/{id}/redrive|drop`.
pub(super) async fn act(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let id = entry_id(&id)?;
    if !matches!(action.as_str(), "redrive" | "drop") {
        return Err(HttpError(StatusCode::NOT_FOUND, format!("no action {action:?} on a dead-letter entry")));
    }
    let entry = own_entry(&shared, &caller, id).await?;
    let by = caller.name.clone();
    match action.as_str() {
        "redrive" => {
            let request: RedriveRequest = if body.is_empty() {
                RedriveRequest::default()
            } else {
                serde_json::from_slice(&body)
                    .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid RedriveRequest: {e}")))?
            };
            let args = serde_json::json!({ "entry": id, "n": request.n, "kind": entry.kind.as_str() });
            let record = crate::audit::admin_action(&by, "dlq.redrive", subject(&entry), args);
            let now = replay::now_ms();
            let done = shared
                .firings
                .call(move |f| Ok(f.redrive(id, request.n, &by, record, now)))
                .await
                .map_err(store_error)?
                .map_err(dlq_error)?;
            let status = if done.created { StatusCode::CREATED } else { StatusCode::OK };
            Ok((status, Json(done)).into_response())
        }
        _ => {
            let request: DropRequest = serde_json::from_slice(&body)
                .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid DropRequest: {e}")))?;
            let reason = request.reason.trim().to_owned();
            if reason.is_empty()
                || reason.chars().count() > MAX_DROP_REASON_CHARS
                || reason.chars().any(char::is_control)
            {
                return Err(HttpError(
                    StatusCode::BAD_REQUEST,
                    format!("a drop needs a reason of 1-{MAX_DROP_REASON_CHARS} printable characters"),
                ));
            }
            let args = serde_json::json!({ "entry": id, "reason": reason, "kind": entry.kind.as_str() });
            let record = crate::audit::admin_action(&by, "dlq.drop", subject(&entry), args);
            let now = replay::now_ms();
            let dropped = shared
                .firings
                .call(move |f| Ok(f.drop_dead_letter(id, &by, &reason, record, now)))
                .await
                .map_err(store_error)?
                .map_err(dlq_error)?;
            Ok(Json(dropped).into_response())
        }
    }
}
