//! `POST /v1/functions/{name}/runs`: the bearer of a submit token runs a registered function on
//! a file, the way a triggered job runs ([`crate::jobs::prepare`], then the scheduler).
//!
//! The run acts as the bearer ([`crate::jobs::RunsAs`]): inside the bearer's namespace (and the
//! function's owner's), accounted and audited to the bearer, with a write macaroon issued for
//! the bearer's runs of the function. It runs the version that fires now: a disabled function
//! is refused (409), a deleted one is not found, a pinned one runs its pinned version. Only the
//! owner's own tokens run a function that has secrets: another bearer would read them in its
//! job's log and outputs.
//!
//! Must not know: the JetStream consumer, the firing table.

use super::blocking;
use crate::auth::bearer;
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use htfaas_functions::proto::RunRequest;
use std::sync::Arc;

/// The bearer of a submit token runs a registered function on a file: the same path a
/// triggered job takes (macaroons, scheduler, EP), accounted to the token's subject.
pub(super) async fn run_function(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<impl IntoResponse, HttpError> {
    let token = bearer(&headers)
        .ok_or_else(|| HttpError(StatusCode::UNAUTHORIZED, "submit token required (Authorization: Bearer)".into()))?
        .to_owned();
    if shared.api_verifier.verify_api(&token).is_ok() {
        return Err(HttpError(
            StatusCode::UNAUTHORIZED,
            "an API token is not a submit token (see `htfaas token submit`)".into(),
        ));
    }
    let claims = shared
        .submitter
        .verify(&token)
        .map_err(|e| HttpError(StatusCode::UNAUTHORIZED, format!("submit token: {e}")))?;
    let run: RunRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid request: {e}")))?;
    if !htfaas_functions::manifest::is_clean_abs_path(&run.path) || run.path.ends_with('/') {
        return Err(HttpError(StatusCode::BAD_REQUEST, format!("{:?} is not a clean absolute file path", run.path)));
    }
    let s = shared.clone();
    let status = blocking(move || s.registry.status(&name)).await?;
    if !status.enabled {
        return Err(HttpError(
            StatusCode::CONFLICT,
            format!("function {} is disabled: it runs nothing until its owner enables it", status.record.manifest.name),
        ));
    }
    let function = status.record;
    let m = &function.manifest;
    if !manual_run_allowed(&m.trigger, &run.path) {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!(
                "{} does not match the trigger {} of function {} (a manual run needs the trigger true for \
                 the path alone: a test on size, class or owner is unknown for it)",
                run.path, m.trigger, m.name
            ),
        ));
    }
    let runs_as = crate::jobs::RunsAs::of(m, &claims.sub, claims.group.as_deref());
    // `prepare` refuses it too (for a re-run); here it is a 403 before the scheduler's
    // preflight or the storage is asked anything.
    if matches!(runs_as, crate::jobs::RunsAs::Bearer { .. }) && !m.secrets.is_empty() {
        return Err(HttpError(StatusCode::FORBIDDEN, crate::jobs::bearer_secrets_refusal(m, &claims.sub)));
    }
    // The bearer's own namespace: it reads the file and has the outputs written where it may. A
    // token's group widens it only with the bearer's group grant.
    let bearer_ns = shared
        .namespaces
        .for_principal(&claims.sub, claims.group.as_deref())
        .map_err(|e| HttpError(StatusCode::FORBIDDEN, e.to_string()))?;
    if !bearer_ns.may_read(&run.path) {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!("{} is outside the read namespace of {}", run.path, claims.sub),
        ));
    }
    if !bearer_ns.may_write(&m.outputs.dir) {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!("function {} writes to {}, outside the write namespace of {}", m.name, m.outputs.dir, claims.sub),
        ));
    }
    if claims.function.as_ref().is_some_and(|d| *d != m.module) {
        return Err(HttpError(StatusCode::FORBIDDEN, format!("the token does not allow function {}", m.module)));
    }
    let annex = match (&m.annex, run.annex) {
        (Some(fixed), Some(asked)) if *fixed != asked => {
            return Err(HttpError(
                StatusCode::BAD_REQUEST,
                format!("function {} runs only on annex {fixed:?}, not {asked:?}", m.name),
            ));
        }
        (fixed, asked) => asked.or_else(|| fixed.clone()),
    };
    if let Some(a) = &annex {
        htfaas_functions::manifest::check_name(a)
            .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("annex name {e}")))?;
        if !bearer_ns.may_use_annex(a) {
            return Err(HttpError(StatusCode::FORBIDDEN, format!("{} may not use annex {a:?}", claims.sub)));
        }
    }
    shared.submitter.preflight(&token).await.map_err(scheduler_failure)?;
    let run_id = htfaas_functions::token::new_jti();
    let event = htfaas_functions::proto::EventRef::new("submit", format!("{}/{run_id}", claims.jti), run.path.clone());
    let mut request = crate::jobs::prepare(shared.jobs(), &function, runs_as, event, format!("submit:{run_id}"))
        .await
        .map_err(|e| match e {
            crate::jobs::JobError::Transient(e) => HttpError(StatusCode::SERVICE_UNAVAILABLE, e),
            crate::jobs::JobError::Permanent(e) => HttpError(StatusCode::BAD_GATEWAY, e),
        })?;
    request.annex = annex;
    // The job's renewal grant names the bearer's token.
    request.renewal = Some(
        shared
            .submitter
            .grant(&claims.sub, &claims.jti, &m.outputs.dir, &request)
            .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("mint the renewal grant: {e}")))?,
    );
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
pub(super) fn manual_run_allowed(trigger: &htfaas_functions::Trigger, path: &str) -> bool {
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
        traceparent: None,
    };
    trigger.compile().is_ok_and(|rule| rule.evaluate(&event) == Truth::True)
}

/// The scheduler's refusal with its own status and reason; unavailability as 503.
pub(super) fn scheduler_failure(e: crate::submit::SubmitError) -> HttpError {
    match e {
        crate::submit::SubmitError::Refused { status, reason } => {
            HttpError(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY), reason)
        }
        crate::submit::SubmitError::Busy(reason) => HttpError(StatusCode::TOO_MANY_REQUESTS, reason),
        e => HttpError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}
