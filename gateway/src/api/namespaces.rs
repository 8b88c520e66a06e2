//! `/v1/namespaces`: an admin grants, lists and revokes namespace grants
//! ([`crate::namespaces::Namespaces`]), each change audited.
//!
//! A change brings the ingest's owner lanes in step before it is answered
//! ([`crate::lanes::after_change`]); a revocation also removes the unfinished jobs that needed
//! the grant (`sweep`), and a held job is released only while its namespace still allows it
//! ([`crate::jobs::still_allowed`]). Must not know: events.

use super::blocking;
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use htfaas_functions::namespace::Right;
use htfaas_functions::namespace::{Grant, GrantEntry, GrantSource};
use htfaas_functions::proto::JobRecord;
use htfaas_functions::{Registry, RegistryError};
use std::sync::Arc;

pub(super) fn grant_of(body: &Bytes) -> Result<Grant, HttpError> {
    let grant: Grant = serde_json::from_slice(body)
        .map_err(|e| HttpError::new(StatusCode::BAD_REQUEST, format!("invalid grant: {e}")))?;
    grant.validate().map_err(|e| HttpError::new(StatusCode::BAD_REQUEST, format!("invalid grant: {e}")))?;
    Ok(grant)
}

pub(super) fn audit_subject(grant: &Grant) -> htfaas_functions::audit::Subject {
    htfaas_functions::audit::Subject {
        owner: Some(grant.principal.clone()),
        // Annex and group grants name no path.
        paths: if matches!(grant.right, Right::Annex | Right::Group) { vec![] } else { vec![grant.value.clone()] },
        ..Default::default()
    }
}

/// `GET /v1/namespaces`: every grant for an admin, the caller's own for a developer.
pub(super) async fn list(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let principal = (!caller.is_admin()).then_some(caller.name.as_str());
    Ok(Json(shared.namespaces.list(principal)).into_response())
}

/// Applies `change` to the stored grants and reloads them; what `change` answered.
pub(super) async fn apply(
    shared: &Arc<Shared>,
    grant: &Grant,
    change: fn(&Registry, &Grant) -> Result<bool, RegistryError>,
) -> Result<bool, HttpError> {
    let (s, g) = (shared.clone(), grant.clone());
    blocking(move || {
        let changed = change(&s.registry, &g)?;
        s.namespaces.reload(&s.registry)?;
        Ok(changed)
    })
    .await
}

/// Records `action` on `grant` in the gateway's trail (after it was applied).
pub(super) async fn record(shared: &Shared, headers: &HeaderMap, action: &str, grant: &Grant) {
    let args = serde_json::json!({ "right": grant.right, "value": grant.value });
    super::audit::record_admin(shared, headers, action, audit_subject(grant), args).await;
}

/// `POST /v1/namespaces`: grants one right (201, or 200 when it was granted already).
pub(super) async fn grant(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    lanes: Option<Extension<crate::lanes::Lanes>>,
    body: Bytes,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    let grant = grant_of(&body)?;
    let new = apply(&shared, &grant, Registry::grant).await?;
    if new {
        // The owner's lane reads the new directory before the grant is answered.
        crate::lanes::after_change(lanes.as_deref(), "a grant").await;
    }
    tracing::info!(%grant, new, "namespace granted");
    if new {
        record(&shared, &headers, "namespace.grant", &grant).await;
    }
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(GrantEntry { grant, source: GrantSource::Admin })).into_response())
}

/// `POST /v1/namespaces/revoke`: takes one right back (404 when it was not granted; 409 for a
/// grant of the site's configuration, which only the configuration can take back). Functions
/// registered under it stay registered, and their firings are refused from now on; the
/// principal's unfinished jobs that needed it are removed ([`sweep`]), before the answer.
pub(super) async fn revoke(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    lanes: Option<Extension<crate::lanes::Lanes>>,
    body: Bytes,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    let grant = grant_of(&body)?;
    if shared.namespaces.configured.contains(&grant) {
        return Err(HttpError::new(
            StatusCode::CONFLICT,
            format!("{grant} is granted by the gateway's configuration (namespaces); remove it there"),
        ));
    }
    if !apply(&shared, &grant, Registry::revoke_grant).await? {
        return Err(HttpError::new(StatusCode::NOT_FOUND, format!("{grant} is not granted")));
    }
    tracing::info!(%grant, "namespace revoked");
    crate::lanes::after_change(lanes.as_deref(), "a revocation").await;
    record(&shared, &headers, "namespace.revoke", &grant).await;
    match sweep(&shared, &grant).await {
        Ok(removed) if !removed.is_empty() => tracing::warn!(%grant, jobs = ?removed, "unfinished jobs removed"),
        Ok(_) => {}
        Err(e) => tracing::warn!(%grant, "the revocation's sweep of unfinished jobs failed: {}", e.1),
    }
    sweep_again(shared.clone(), grant.clone());
    Ok(Json(GrantEntry { grant, source: GrantSource::Admin }).into_response())
}

/// How long after a revocation its sweep runs once more: longer than a submission that had
/// passed its namespace check before the grant went can take to reach the scheduler (each of
/// its storage and scheduler requests is bounded by 10 s), so such a job is swept too.
const SWEEP_AGAIN: std::time::Duration = std::time::Duration::from_secs(45);

/// Most unfinished jobs one sweep looks at.
const SWEEP_MAX: usize = 10_000;

/// After `grant` was taken back: every unfinished job of its principal (an owner's, or those
/// charged to a group), and every other principal's unfinished job of a function the principal
/// owns, that the namespaces no longer allow, is removed, with the reason; a held
/// job is not left to be released, an idle one is not dispatched, a running one is stopped.
/// Runs again after [`SWEEP_AGAIN`] for a job whose submission was under way. Returns the ids
/// removed now.
pub(super) async fn sweep(shared: &Arc<Shared>, grant: &Grant) -> Result<Vec<String>, HttpError> {
    let encode = htfaas_functions::percent::path;
    let mut selections = match grant.principal.strip_prefix(htfaas_functions::namespace::GROUP_PREFIX) {
        Some(group) => vec![format!("group={}", encode(group))],
        None => vec![format!("owner={}", encode(&grant.principal))],
    };
    // Other principals' runs of the principal's functions (a bearer's manual run) need the
    // function owner's namespace too.
    let (s, owner) = (shared.clone(), grant.principal.clone());
    let functions = blocking(move || s.registry.statuses()).await?;
    selections.extend(
        functions
            .iter()
            .filter(|f| f.record.manifest.owner == owner)
            .map(|f| format!("function={}", encode(&f.record.manifest.name))),
    );
    let (mut jobs, mut seen) = (Vec::new(), std::collections::HashSet::new());
    for selection in selections {
        let path = format!("/v1/jobs?unfinished=true&{selection}&limit={SWEEP_MAX}");
        let more: Vec<JobRecord> = super::forward::scheduler_json(&shared.scheduler(), &path).await?;
        jobs.extend(more.into_iter().filter(|j| seen.insert(j.id.clone())));
    }
    let mut removed = Vec::new();
    for job in jobs {
        let (s, checked) = (shared.clone(), job.clone());
        let allowed = blocking(move || Ok(crate::jobs::still_allowed(&s.namespaces, &s.registry, &checked))).await?;
        let Err(why) = allowed else { continue };
        let reason = format!("the grant {grant} was revoked: {why}");
        let url = format!("{}/v1/jobs/{}/remove", shared.submitter_base(), job.id);
        let action = htfaas_functions::proto::JobAction { reason: reason.clone() };
        match shared.http.post(url).bearer_auth(&shared.scheduler_admin_token).json(&action).send().await {
            Ok(r) if r.status().is_success() => {
                tracing::warn!(job = %job.id, owner = %job.owner, "job removed: {reason}");
                removed.push(job.id);
            }
            // Ended meanwhile (409), or the scheduler is away: the second sweep tries again.
            Ok(r) => tracing::info!(job = %job.id, status = %r.status(), "sweep: job not removed"),
            Err(e) => tracing::warn!(job = %job.id, "sweep: scheduler unreachable: {e}"),
        }
    }
    Ok(removed)
}

/// [`sweep`] once more after [`SWEEP_AGAIN`], in the background.
pub(super) fn sweep_again(shared: Arc<Shared>, grant: Grant) {
    tokio::spawn(async move {
        tokio::time::sleep(SWEEP_AGAIN).await;
        if let Err(e) = sweep(&shared, &grant).await {
            tracing::warn!(%grant, "the revocation's second sweep failed: {}", e.1);
        }
    });
}
