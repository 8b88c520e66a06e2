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
    let who = Principal {
        name: &claims.sub,
        group: claims.group.as_deref(),
        digest: claims.function.as_ref(),
        token: RunToken::Bearer { token: &token, jti: &claims.jti },
    };
    let reply = start(&shared, who, name, &run.path, run.annex).await?;
    Ok((StatusCode::CREATED, Json(reply)))
}

/// Who starts a run, and with which submit token.
#[derive(Debug, Clone, Copy)]
pub(super) struct Principal<'a> {
    /// The principal the run acts as when it is not the function's owner: the bearer.
    pub name: &'a str,
    /// The accounting group its token names, if any.
    pub group: Option<&'a str>,
    /// The one function digest its token allows, if it is bound to one.
    pub digest: Option<&'a htfaas_functions::digest::Digest>,
    /// The submit token the job is submitted with.
    pub token: RunToken<'a>,
}

/// The submit token of a run.
#[derive(Debug, Clone, Copy)]
pub(super) enum RunToken<'a> {
    /// The bearer's own: the scheduler checks its limits and counts its uses; the renewal
    /// grant names its `jti`, so revoking it reaches the job.
    Bearer {
        /// The token.
        token: &'a str,
        /// Its `jti`.
        jti: &'a str,
    },
    /// One minted for exactly this job, for `actor`, a caller of the API (an API or OIDC
    /// token); the invocation is recorded in the gateway's trail with its actor.
    Minted {
        /// Who called.
        actor: &'a str,
    },
    /// One minted for exactly this job, for the function's owner: `actor`, an admin, runs it as
    /// the owner whoever the admin is (as a replay does); the trail names the admin.
    AsOwner {
        /// Who called.
        actor: &'a str,
    },
}

/// Starts `name`'s run on `path` for `who` ([`Principal`]): every check of a manual run, then
/// the job built ([`crate::jobs::prepare`]) and submitted; the scheduler's answer.
pub(super) async fn start(
    shared: &Arc<Shared>,
    who: Principal<'_>,
    name: String,
    path: &str,
    annex: Option<String>,
) -> Result<htfaas_functions::proto::SubmitResponse, HttpError> {
    if !htfaas_functions::manifest::is_clean_abs_path(path) || path.ends_with('/') {
        return Err(HttpError(StatusCode::BAD_REQUEST, format!("{path:?} is not a clean absolute file path")));
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
    if !manual_run_allowed(&m.trigger, path) {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!(
                "{path} does not match the trigger {} of function {} (a manual run needs the trigger true for \
                 the path alone: a test on size, class or owner is unknown for it)",
                m.trigger, m.name
            ),
        ));
    }
    // A caller of the API who owns the function runs it as its owner, in its group; so does
    // an admin.
    let (name, group) = match who.token {
        RunToken::AsOwner { .. } => (m.owner.as_str(), m.group.as_deref()),
        RunToken::Minted { .. } if who.name == m.owner => (who.name, m.group.as_deref()),
        _ => (who.name, who.group),
    };
    let who = Principal { name, group, ..who };
    let runs_as = crate::jobs::RunsAs::of(m, who.name, group);
    // `prepare` refuses it too (for a re-run); here it is a 403 before the scheduler's
    // preflight or the storage is asked anything.
    if matches!(runs_as, crate::jobs::RunsAs::Bearer { .. }) && !m.secrets.is_empty() {
        return Err(HttpError(StatusCode::FORBIDDEN, crate::jobs::bearer_secrets_refusal(m, who.name)));
    }
    // The principal's own namespace: it reads the file and has the outputs written where it
    // may. A token's group widens it only with the principal's group grant.
    let bearer_ns = shared
        .namespaces
        .for_principal(who.name, group)
        .map_err(|e| HttpError(StatusCode::FORBIDDEN, e.to_string()))?;
    if !bearer_ns.may_read(path) {
        return Err(HttpError(StatusCode::FORBIDDEN, format!("{path} is outside the read namespace of {}", who.name)));
    }
    if !bearer_ns.may_write(&m.outputs.dir) {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!("function {} writes to {}, outside the write namespace of {}", m.name, m.outputs.dir, who.name),
        ));
    }
    if who.digest.is_some_and(|d| *d != m.module) {
        return Err(HttpError(StatusCode::FORBIDDEN, format!("the token does not allow function {}", m.module)));
    }
    let annex = match (&m.annex, annex) {
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
            return Err(HttpError(StatusCode::FORBIDDEN, format!("{} may not use annex {a:?}", who.name)));
        }
    }
    if let RunToken::Bearer { token, .. } = who.token {
        shared.submitter.preflight(token).await.map_err(scheduler_failure)?;
    }
    let run_id = htfaas_functions::token::new_jti();
    let (source, id) = match who.token {
        RunToken::Bearer { jti, .. } => ("submit", format!("{jti}/{run_id}")),
        RunToken::Minted { .. } | RunToken::AsOwner { .. } => ("invoke", format!("{}/{run_id}", who.name)),
    };
    let event = htfaas_functions::proto::EventRef::new(source, id, path.to_owned());
    let mut request = crate::jobs::prepare(shared.jobs(), &function, runs_as, event, format!("{source}:{run_id}"), &[])
        .await
        .map_err(|e| match e {
            crate::jobs::JobError::Transient(e) => HttpError(StatusCode::SERVICE_UNAVAILABLE, e),
            crate::jobs::JobError::Permanent(e) => HttpError(StatusCode::BAD_GATEWAY, e),
        })?;
    request.annex = annex;
    let minted;
    let (token, jti) = match who.token {
        RunToken::Bearer { token, jti } => (token, jti),
        RunToken::Minted { .. } | RunToken::AsOwner { .. } => {
            minted = shared.submitter.mint(who.name, group, &request).map_err(scheduler_failure)?;
            (minted.1.as_str(), minted.0.jti.as_str())
        }
    };
    // The job's renewal grant names the token it was submitted with.
    request.renewal = Some(
        shared
            .submitter
            .grant(runs_as.name(m), jti, &m.outputs.dir, &request)
            .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("mint the renewal grant: {e}")))?,
    );
    let reply = shared.submitter.submit_with_token(token, &request).await.map_err(scheduler_failure)?;
    tracing::info!(job = %reply.job_id, jti, principal = who.name, function = %m.name, source, "job submitted by a caller");
    // Who invoked, beside whom the run acts as (the scheduler's trail has the latter alone).
    if let RunToken::Minted { actor } | RunToken::AsOwner { actor } = who.token {
        let subject = htfaas_functions::audit::Subject {
            job: Some(reply.job_id.clone()),
            token_jti: Some(jti.to_owned()),
            paths: vec![path.to_owned()],
            ..super::audit::audit_function(&function)
        };
        let args = serde_json::json!({ "job": reply.job_id, "path": path, "runs_as": who.name });
        super::audit::record_action(shared, actor, "function.invoke", subject, args).await;
    }
    Ok(reply)
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
