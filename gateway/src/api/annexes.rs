//! `/v1/annexes` (admin): the front door of annexes, whose records and tokens the
//! scheduler keeps ([`htfaas_functions::proto::AnnexRecord`]).
//!
//! Creating one is where the namespace is checked: the request is parsed and checked
//! ([`AnnexRequest::check`]), then its owner must hold the annex right for its name
//! (`htfaas ns grant OWNER annex NAME`, [`crate::namespaces`]) — else 403 and the scheduler is
//! never asked, so no token is minted — then the scheduler mints the annex's attach token and
//! keeps the record. Every change is recorded in the gateway's trail (`annex.create` with the
//! token's `jti`, never the token; `annex.jobs|extend|drain|delete`). Reads and the other
//! actions are proxied as they are, with the annex name checked here ([`check_name`]).
//!
//! Must not know: events, jobs, how the scheduler keeps annexes.

use super::forward::{forward, forward_get, proxy};
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use htfaas_functions::audit::Subject;
use htfaas_functions::manifest::check_name;
use htfaas_functions::proto::{AnnexCreated, AnnexExtend, AnnexJobs, AnnexRequest};
use std::sync::Arc;

/// The annex actions the scheduler knows.
pub(super) const ANNEX_ACTIONS: [&str; 4] = ["jobs", "extend", "drain", "delete"];

fn bad(message: impl Into<String>) -> HttpError {
    HttpError(StatusCode::BAD_REQUEST, message.into())
}

fn annex_name(name: &str) -> Result<(), HttpError> {
    check_name(name).map_err(|e| bad(format!("bad annex name: {e}")))
}

/// `POST /v1/annexes`: checks the owner's annex right, then has the scheduler mint the token.
pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    let request: AnnexRequest =
        serde_json::from_slice(&body).map_err(|e| bad(format!("invalid annex request: {e}")))?;
    request.check().map_err(|e| bad(format!("invalid annex request: {e}")))?;
    if !shared.namespaces.of(&request.owner, None).may_use_annex(&request.name) {
        tracing::info!(annex = %request.name, owner = %request.owner, "annex refused: no annex right");
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!(
                "{} may not use annex {:?} (grant it first: htfaas ns grant {} annex {})",
                request.owner, request.name, request.owner, request.name
            ),
        ));
    }
    tracing::info!(annex = %request.name, owner = %request.owner, count = request.count, "annex requested");
    let url = format!("{}/v1/annexes", shared.submitter_base());
    let sent = shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&request).send().await;
    let resp = sent.map_err(|e| HttpError(StatusCode::BAD_GATEWAY, format!("scheduler unreachable: {e}")))?;
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let answer =
        resp.bytes().await.map_err(|e| HttpError(StatusCode::BAD_GATEWAY, format!("scheduler answer: {e}")))?;
    if status.is_success() {
        let created: AnnexCreated = serde_json::from_slice(&answer)
            .map_err(|e| HttpError(StatusCode::BAD_GATEWAY, format!("scheduler answer: {e}")))?;
        let subject = Subject {
            owner: Some(request.owner.clone()),
            token_jti: Some(created.annex.token_jti.clone()),
            ..Subject::default()
        };
        let args = serde_json::json!({
            "annex": request.name, "provider": request.provider, "count": request.count, "cpus": request.cpus,
            "memory_mb": request.memory_mb, "lifetime_s": request.lifetime_s,
            "idle_shutdown_s": request.idle_shutdown_s, "partition": request.partition,
            "token_exp_ms": created.annex.token_exp_ms,
        });
        super::audit::record_admin(&shared, &headers, "annex.create", subject, args).await;
    }
    Ok((status, [(axum::http::header::CONTENT_TYPE, "application/json")], answer).into_response())
}

/// `GET /v1/annexes`.
pub(super) async fn list(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, HttpError> {
    proxy(&shared, &headers, "/v1/annexes").await
}

/// `GET /v1/annexes/{name}`.
pub(super) async fn show(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    annex_name(&name)?;
    forward_get(&shared.scheduler(), &format!("/v1/annexes/{name}")).await
}

/// `POST /v1/annexes/{name}/{jobs,extend,drain,delete}`: the body parsed into its type here.
pub(super) async fn act(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    annex_name(&name)?;
    let args = match action.as_str() {
        "jobs" => serde_json::to_value(
            serde_json::from_slice::<AnnexJobs>(&body).map_err(|e| bad(format!("invalid annex jobs: {e}")))?,
        ),
        "extend" => serde_json::to_value(
            serde_json::from_slice::<AnnexExtend>(&body).map_err(|e| bad(format!("invalid annex extension: {e}")))?,
        ),
        "drain" | "delete" => Ok(serde_json::json!({})),
        other => {
            let known = ANNEX_ACTIONS.join(", ");
            return Err(HttpError(StatusCode::NOT_FOUND, format!("no annex action {other:?} ({known})")));
        }
    }
    .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("annex action: {e}")))?;
    tracing::info!(annex = %name, %action, "annex action requested");
    let url = format!("{}/v1/annexes/{name}/{action}", shared.submitter_base());
    let done = forward(shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&args)).await?;
    let mut args = args;
    args["annex"] = serde_json::Value::String(name);
    Ok(super::audit::record_forwarded(&shared, &headers, &format!("annex.{action}"), Subject::default(), args, done)
        .await)
}
