//! `/v1/namespaces`: an admin grants, lists and revokes namespace grants
//! ([`crate::namespaces::Namespaces`]), each change audited.
//!
//! A change brings the ingest's owner lanes in step before it is answered
//! ([`crate::lanes::after_change`]). Must not know: events, jobs.

use super::*;
use htfaas_functions::Registry;
use htfaas_functions::namespace::Right;
use htfaas_functions::namespace::{Grant, GrantEntry, GrantSource};

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
/// registered under it stay registered, and their firings are refused from now on.
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
    Ok(Json(GrantEntry { grant, source: GrantSource::Admin }).into_response())
}
