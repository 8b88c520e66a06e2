//! `/v1/identities` (admin): the identities of the site's OIDC provider bound to owners
//! ([`htfaas_functions::registry::identities`]), and unbinding one, audited, so that another
//! identity may take the owner name (an owner's first identity holds it until then).
//!
//! An unbinding takes the binding's grants out of force at once and makes every token be
//! resolved again. Must not know: tokens, the identity map's rules.

use super::blocking;
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use htfaas_functions::registry::identities::Binding;
use std::sync::Arc;

/// `GET /v1/identities`: every bound identity, by owner.
pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<Vec<Binding>>, HttpError> {
    shared.require_admin(&headers)?;
    let s = shared.clone();
    Ok(Json(blocking(move || s.registry.identities()).await?))
}

/// `DELETE /v1/identities/{owner}`: frees the owner name; the binding removed, or 404.
pub(super) async fn unbind(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(owner): Path<String>,
) -> Result<Json<Binding>, HttpError> {
    shared.require_admin(&headers)?;
    let (s, o) = (shared.clone(), owner.clone());
    let removed = blocking(move || {
        let binding = s.registry.identities()?.into_iter().find(|b| b.owner == o);
        if binding.is_some() {
            s.registry.unbind_identity(&o)?;
            s.namespaces.reload(&s.registry)?;
        }
        Ok(binding)
    })
    .await?;
    let binding =
        removed.ok_or_else(|| HttpError(StatusCode::NOT_FOUND, format!("no identity is bound to owner {owner:?}")))?;
    if let Some(ids) = &shared.identities {
        ids.forget_resolved();
    }
    let subject = htfaas_functions::audit::Subject { owner: Some(owner.clone()), ..Default::default() };
    let args = serde_json::json!({ "issuer": binding.issuer, "sub": binding.sub, "rule": binding.rule });
    super::audit::record_admin(&shared, &headers, "identity.unbind", subject, args).await;
    Ok(Json(binding))
}
