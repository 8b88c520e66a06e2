//! Namespace grants at the gateway: the site's configured grants (`Config::namespaces`) plus
//! those an admin made (kept in the registry), held in memory for the checks of every
//! registration, firing, manual run, dry run and test ([`Namespaces::of`]); and the API an
//! admin grants, lists and revokes them with (`/v1/namespaces`), each change audited.
//!
//! What is inside a namespace is [`htfaas_functions::namespace`]'s to say; this module only
//! keeps the grants and serves them. It knows nothing of events or jobs.

use crate::Shared;
use crate::api::{Failure, blocking, require_admin, require_caller};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use htfaas_functions::Registry;
use htfaas_functions::namespace::{Grant, GrantEntry, GrantSource, Namespace};
use htfaas_functions::registry::RegistryError;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Every grant in force: the configured ones and the stored ones, also by principal (a firing
/// looks up its owner's, whatever the number of owners).
#[derive(Debug)]
pub struct Namespaces {
    configured: Vec<Grant>,
    all: RwLock<Arc<Index>>,
}

#[derive(Debug, Default)]
struct Index {
    list: Vec<Grant>,
    by_principal: HashMap<String, Vec<Grant>>,
}

impl Namespaces {
    /// The configured grants (each checked) and those stored in `registry`.
    pub fn load(configured: Vec<Grant>, registry: &Registry) -> Result<Namespaces, RegistryError> {
        for g in &configured {
            g.validate().map_err(|e| RegistryError::Grant(format!("{g}: {e}")))?;
        }
        let ns = Namespaces { configured, all: RwLock::new(Arc::default()) };
        ns.reload(registry)?;
        Ok(ns)
    }

    /// Reads the stored grants again (after a grant or a revocation).
    pub fn reload(&self, registry: &Registry) -> Result<(), RegistryError> {
        let mut all = self.configured.clone();
        all.extend(registry.grants()?);
        all.sort();
        all.dedup();
        let mut by_principal: HashMap<String, Vec<Grant>> = HashMap::new();
        for g in &all {
            by_principal.entry(g.principal.clone()).or_default().push(g.clone());
        }
        *self.all.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Index { list: all, by_principal });
        Ok(())
    }

    fn index(&self) -> Arc<Index> {
        self.all.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The namespace of `owner` (and of its accounting `group`, if any) now.
    pub fn of(&self, owner: &str, group: Option<&str>) -> Namespace {
        let index = self.index();
        let group_key = group.map(|g| format!("{}{g}", htfaas_functions::namespace::GROUP_PREFIX));
        let principals = [Some(owner), group_key.as_deref()];
        let grants = principals.into_iter().flatten().filter_map(|p| index.by_principal.get(p)).flatten();
        Namespace::of(grants, owner, group)
    }

    /// Whether nothing at all is granted (every function would be refused).
    pub fn is_empty(&self) -> bool {
        self.index().list.is_empty()
    }

    /// Every grant with where it comes from; only `principal`'s when given.
    pub fn list(&self, principal: Option<&str>) -> Vec<GrantEntry> {
        self.index()
            .list
            .iter()
            .filter(|g| principal.is_none_or(|p| g.principal == p))
            .map(|g| GrantEntry {
                grant: g.clone(),
                source: if self.configured.contains(g) { GrantSource::Config } else { GrantSource::Admin },
            })
            .collect()
    }
}

fn grant_of(body: &Bytes) -> Result<Grant, Failure> {
    let grant: Grant = serde_json::from_slice(body)
        .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, format!("invalid grant: {e}")))?;
    grant.validate().map_err(|e| Failure::new(StatusCode::BAD_REQUEST, format!("invalid grant: {e}")))?;
    Ok(grant)
}

fn audit_subject(grant: &Grant) -> htfaas_functions::audit::Subject {
    htfaas_functions::audit::Subject {
        owner: Some(grant.principal.clone()),
        paths: if grant.right == htfaas_functions::namespace::Right::Annex {
            vec![]
        } else {
            vec![grant.value.clone()]
        },
        ..Default::default()
    }
}

/// `GET /v1/namespaces`: every grant for an admin, the caller's own for a developer.
pub(crate) async fn list(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, Failure> {
    let caller = require_caller(&shared, &headers)?;
    let principal = (!caller.is_admin()).then_some(caller.name.as_str());
    Ok(Json(shared.namespaces.list(principal)).into_response())
}

/// Applies `change` to the stored grants and reloads them; what `change` answered.
async fn apply(
    shared: &Arc<Shared>,
    grant: &Grant,
    change: fn(&Registry, &Grant) -> Result<bool, RegistryError>,
) -> Result<bool, Failure> {
    let (s, g) = (shared.clone(), grant.clone());
    blocking(move || {
        let changed = change(&s.registry, &g)?;
        s.namespaces.reload(&s.registry)?;
        Ok(changed)
    })
    .await
}

/// Records `action` on `grant` in the gateway's trail (after it was applied).
async fn record(shared: &Shared, headers: &HeaderMap, action: &str, grant: &Grant) {
    let args = serde_json::json!({ "right": grant.right, "value": grant.value });
    crate::audit::record_admin(shared, headers, action, audit_subject(grant), args).await;
}

/// `POST /v1/namespaces`: grants one right (201, or 200 when it was granted already).
pub(crate) async fn grant(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    let grant = grant_of(&body)?;
    let new = apply(&shared, &grant, Registry::grant).await?;
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
pub(crate) async fn revoke(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Failure> {
    require_admin(&shared, &headers)?;
    let grant = grant_of(&body)?;
    if shared.namespaces.configured.contains(&grant) {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            format!("{grant} is granted by the gateway's configuration (namespaces); remove it there"),
        ));
    }
    if !apply(&shared, &grant, Registry::revoke_grant).await? {
        return Err(Failure::new(StatusCode::NOT_FOUND, format!("{grant} is not granted")));
    }
    tracing::info!(%grant, "namespace revoked");
    record(&shared, &headers, "namespace.revoke", &grant).await;
    Ok(Json(GrantEntry { grant, source: GrantSource::Admin }).into_response())
}
