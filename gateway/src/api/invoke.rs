//! `POST /v1/functions/{name}/invoke`: a caller of the API (an API or OIDC token) runs a
//! registered function on a file of its own namespace and, when it asks, waits for the answer.
//!
//! The run is a manual run ([`super::runs::start`]: the same checks, the same job) whose submit
//! token the gateway mints for exactly this job, for the caller: the function's owner runs it as
//! its owner (its group, its secrets), anyone else as a bearer (inside its own namespace and
//! the owner's, without the owner's secrets); an admin runs it as its owner, as a replay does.
//! With `wait_s`, the answer holds the job as it ended: its outcome, exit code and outputs'
//! paths; a job that does not end within the wait is answered 202 with its id alone, and goes
//! on.
//!
//! Must not know: the JetStream consumer, the firing table.

use super::runs::{Principal, RunToken, start};
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use htfaas_functions::proto::{InvokeRequest, InvokeResponse, JobRecord, MAX_INVOKE_WAIT_S};
use std::sync::Arc;
use std::time::Duration;

/// Longest pause between two looks at a waited-for job.
const MAX_POLL: Duration = Duration::from_millis(500);

/// Runs function `name` for the calling developer; see the module docs.
pub(super) async fn invoke(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<impl IntoResponse, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let req: InvokeRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid request: {e}")))?;
    if req.wait_s > MAX_INVOKE_WAIT_S {
        return Err(HttpError(StatusCode::BAD_REQUEST, format!("wait_s must be 0..={MAX_INVOKE_WAIT_S}")));
    }
    let actor = &caller.name;
    let token = if caller.is_admin() { RunToken::AsOwner { actor } } else { RunToken::Minted { actor } };
    let who = Principal { name: &caller.name, group: None, digest: None, token };
    let reply = start(&shared, who, name, &req.path, req.annex).await?;
    let job = match req.wait_s {
        0 => None,
        s => ended(&shared, &reply.job_id, Duration::from_secs(s)).await?,
    };
    let status = if job.is_some() { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(InvokeResponse { job_id: reply.job_id, job })))
}

/// Job `id` once it has ended (completed, failed or removed), looked at with a growing pause;
/// `None` when it has not within `wait`. A held job is waited for: a release may still run it.
async fn ended(shared: &Shared, id: &str, wait: Duration) -> Result<Option<JobRecord>, HttpError> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(20);
    loop {
        let job: JobRecord = super::forward::scheduler_json(&shared.scheduler(), &format!("/v1/jobs/{id}")).await?;
        if job.state.is_final() {
            return Ok(Some(job));
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(MAX_POLL);
    }
}
