//! Relaying to the scheduler with its admin token, once this API has checked the caller: a
//! GET's or any request's answer passed on as it is ([`forward`], [`forward_get`], [`proxy`]
//! for admin routes), or parsed ([`scheduler_json`]).
//!
//! Must not know: which routes relay, who may call them.

use crate::auth::Scheduler;
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use htfaas_functions::proto::ApiError;

/// GETs `path` from the scheduler (admin token) and parses its JSON answer; a refusal keeps
/// the scheduler's status and reason.
pub(super) async fn scheduler_json<T: serde::de::DeserializeOwned>(
    scheduler: &Scheduler<'_>,
    path: &str,
) -> Result<T, HttpError> {
    let url = format!("{}{path}", scheduler.url);
    let resp = scheduler
        .http
        .get(url)
        .bearer_auth(scheduler.admin_token)
        .send()
        .await
        .map_err(|e| HttpError(StatusCode::BAD_GATEWAY, format!("scheduler unreachable: {e}")))?;
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let body = resp.bytes().await.map_err(|e| HttpError(StatusCode::BAD_GATEWAY, format!("scheduler answer: {e}")))?;
    if !status.is_success() {
        let reason = serde_json::from_slice::<ApiError>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(200).collect());
        return Err(HttpError(status, reason));
    }
    serde_json::from_slice(&body).map_err(|e| HttpError(StatusCode::BAD_GATEWAY, format!("scheduler answer: {e}")))
}

/// An admin route's GET, relayed to the scheduler.
pub(super) async fn proxy(shared: &Shared, headers: &HeaderMap, path: &str) -> Result<Response, HttpError> {
    shared.require_admin(headers)?;
    forward_get(&shared.scheduler(), path).await
}

/// Relays a GET of `path` to the scheduler (the caller's scope already checked).
pub(super) async fn forward_get(scheduler: &Scheduler<'_>, path: &str) -> Result<Response, HttpError> {
    let url = format!("{}{path}", scheduler.url);
    forward(scheduler.http.get(url).bearer_auth(scheduler.admin_token)).await
}

/// Sends a request to the scheduler and relays its status and JSON body.
pub(super) async fn forward(request: reqwest::RequestBuilder) -> Result<Response, HttpError> {
    let resp =
        request.send().await.map_err(|e| HttpError(StatusCode::BAD_GATEWAY, format!("scheduler unreachable: {e}")))?;
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let body = resp.bytes().await.map_err(|e| HttpError(StatusCode::BAD_GATEWAY, format!("scheduler answer: {e}")))?;
    Ok((status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}
