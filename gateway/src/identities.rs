//! The site's own users at the API: a bearer token of a configured OIDC issuer
//! ([`crate::oidc`]) is verified, mapped by the site's identity map
//! ([`htfaas_functions::identity_map`]) to an owner, its accounting groups and grants, and the
//! owner name is bound to that identity in the registry (the first identity claims it; another
//! is refused: [`htfaas_functions::registry::identities`]). Such owners need no admin step:
//! the grants their rule gives are in force while the map keeps the rule
//! ([`crate::namespaces::Namespaces::set_live_rules`]).
//!
//! - A token is resolved once: the caller it maps to is kept, keyed by the token's SHA-256,
//!   until the token expires or the map changes. A refusal is kept too, so a client retrying a
//!   refused token writes one `identity.refused` record, not one per request.
//! - The map file is watched ([`MAP_POLL`]): a change that parses replaces the map, drops
//!   every resolved token and re-derives the grants in force; one that does not parse keeps
//!   the previous map, says why in the log and in [`Identities::map_error`].
//! - An OIDC identity is never an admin: admins keep the admin token or an admin API token.
//! - WLCG scopes ([`check_scopes`], [`check_storage_scopes`]): a token with a `scope` claim
//!   may use the API only as far as its `compute.*` scopes say, and get a file credential only
//!   within its `storage.*` scopes; without the claim, as its mapping says.
//!
//! Must not know: routes and handlers, the firing table's SQL.

use crate::auth::Caller;
use crate::http_error::HttpError;
use crate::oidc::Oidc;
use axum::http::{Method, StatusCode};
use htfaas_functions::audit::AuditDraft;
use htfaas_functions::identity_map::{IdentityMap, MapError, Mapped};
use htfaas_functions::registry::identities::Bound;
use htfaas_functions::token::Scope;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

/// How often the map file is looked at for a change.
pub const MAP_POLL: Duration = Duration::from_secs(2);
/// Most tokens kept resolved (or refused) at once; past it, expired ones are dropped, then all.
const MAX_RESOLVED: usize = 10_000;
/// Longest a refusal is kept before the same token is looked at again, seconds.
const REFUSAL_KEPT_S: u64 = 60;

/// A verified, mapped caller, as a request sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcCaller {
    /// Who it acts as (scope developer).
    pub caller: Caller,
    /// The identity's issuer.
    pub issuer: String,
    /// The identity's `sub`.
    pub sub: String,
    /// The rule that mapped it.
    pub rule: String,
    /// Its accounting groups.
    pub groups: Vec<String>,
    /// The token's `jti`, if any (revocations may name it).
    pub jti: Option<String>,
    /// The token's WLCG scopes, when it has a `scope` claim.
    pub scopes: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
enum Resolved {
    Caller { who: OidcCaller, until_s: u64, generation: u64 },
    Refused { why: String, until_s: u64, generation: u64 },
}

/// The identity map file and what was last read from it.
#[derive(Debug)]
struct MapFile {
    path: PathBuf,
    current: RwLock<Loaded>,
}

#[derive(Debug, Clone)]
struct Loaded {
    map: Arc<IdentityMap>,
    generation: u64,
    stamp: Option<(SystemTime, u64)>,
    error: Option<String>,
}

/// OIDC callers: the verifier, the map, the tokens resolved.
#[derive(Debug)]
pub struct Identities {
    oidc: Oidc,
    map: MapFile,
    resolved: Mutex<HashMap<[u8; 32], Resolved>>,
    /// Changes of the map file taken, and refused (the previous map kept): `/metrics`.
    pub reloads: [std::sync::atomic::AtomicU64; 2],
}

impl Identities {
    /// Reads the map at `map_path` (a map that does not load stops the gateway from starting:
    /// there is no previous one to keep).
    pub fn load(oidc: Oidc, map_path: &Path) -> Result<Identities, MapError> {
        let (map, stamp) = read_map(map_path)?;
        let loaded = Loaded { map: Arc::new(map), generation: 1, stamp, error: None };
        Ok(Identities {
            oidc,
            map: MapFile { path: map_path.to_owned(), current: RwLock::new(loaded) },
            resolved: Mutex::new(HashMap::new()),
            reloads: Default::default(),
        })
    }

    /// The verifier.
    pub fn oidc(&self) -> &Oidc {
        &self.oidc
    }

    /// The map in force.
    pub fn map(&self) -> Arc<IdentityMap> {
        self.loaded().map
    }

    fn loaded(&self) -> Loaded {
        self.map.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Which map is in force (each one that loads counts up): resolved tokens carry it.
    fn generation(&self) -> u64 {
        self.map.current.read().unwrap_or_else(|p| p.into_inner()).generation
    }

    /// Why the map file's latest change was not taken (the previous map is in force), if so.
    pub fn map_error(&self) -> Option<String> {
        self.loaded().error
    }

    /// The (issuer, rule) pairs of the map in force: bound identities keep their grants while
    /// their rule is one of these.
    pub fn live_rules(&self) -> Vec<(String, String)> {
        let map = self.map();
        map.rule_names().filter_map(|r| map.issuer_of(r).map(|i| (i.to_owned(), r.to_owned()))).collect()
    }

    /// Reads the map file again if it changed; `Ok(true)` when a new map is in force, `Err`
    /// (the previous map kept) when the change does not load.
    pub fn reload_if_changed(&self) -> Result<bool, MapError> {
        let stamp = stamp_of(&self.map.path);
        if stamp == self.loaded().stamp {
            return Ok(false);
        }
        match read_map(&self.map.path) {
            Ok((map, stamp)) => {
                self.reloads[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut current = self.map.current.write().unwrap_or_else(|p| p.into_inner());
                *current = Loaded { map: Arc::new(map), generation: current.generation + 1, stamp, error: None };
                drop(current);
                self.resolved.lock().unwrap_or_else(|p| p.into_inner()).clear();
                Ok(true)
            }
            Err(e) => {
                self.reloads[1].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut current = self.map.current.write().unwrap_or_else(|p| p.into_inner());
                // Remember the broken file's stamp: it is reported once, not at every poll.
                current.stamp = stamp;
                current.error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// The caller a token resolved to earlier (and still may act as), if any.
    pub fn cached(&self, token: &str) -> Option<OidcCaller> {
        match self.standing(token)? {
            Resolved::Caller { who, .. } => Some(who),
            Resolved::Refused { .. } => None,
        }
    }

    /// Forgets every token resolved (and refused): the next request of each is looked at
    /// again (after an admin unbound an owner).
    pub fn forget_resolved(&self) {
        self.resolved.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// What `token` resolved to earlier, while it stands: under the map in force and before
    /// its time is up.
    fn standing(&self, token: &str) -> Option<Resolved> {
        let generation = self.generation();
        let now = htfaas_functions::time::now_s();
        let all = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        all.get(&key(token))
            .filter(|r| match r {
                Resolved::Caller { until_s, generation: g, .. } | Resolved::Refused { until_s, generation: g, .. } => {
                    *g == generation && *until_s > now
                }
            })
            .cloned()
    }

    fn keep(&self, token: &str, entry: Resolved) {
        let mut all = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() >= MAX_RESOLVED {
            let now = htfaas_functions::time::now_s();
            all.retain(|_, r| match r {
                Resolved::Caller { until_s, .. } | Resolved::Refused { until_s, .. } => *until_s > now,
            });
            if all.len() >= MAX_RESOLVED {
                all.clear();
            }
        }
        all.insert(key(token), entry);
    }
}

/// What resolving a token needs besides [`Identities`]: where bindings are kept, where
/// records go, the grants to refresh.
pub struct Resolve<'a, B> {
    /// Binds an owner to an identity in the registry and, when the binding is new or changed,
    /// reads the grants in force again; off the async workers
    /// ([`htfaas_functions::Registry::bind_identity`], [`crate::namespaces::Namespaces::reload`]).
    pub bind: B,
    /// The gateway's trail.
    pub firings: &'a crate::firing::Firings,
}

/// Resolves an OIDC bearer `token`: the caller it maps to, or a 401 saying why (recorded as
/// `identity.refused` when the token verified and was refused for who it is).
pub async fn resolve<B, F>(ids: &Identities, at: Resolve<'_, B>, token: &str) -> Result<OidcCaller, HttpError>
where
    B: FnOnce(htfaas_functions::identity_map::Identity, Mapped) -> F,
    F: std::future::Future<Output = Result<Bound, String>>,
{
    match ids.standing(token) {
        Some(Resolved::Caller { who, .. }) => return Ok(who),
        Some(Resolved::Refused { why, .. }) => return Err(unauthorized(why)),
        None => {}
    }
    let generation = ids.generation();
    let verified = match ids.oidc.verify(token).await {
        Ok(v) => v,
        // A token that does not verify says nothing of anyone: not recorded, not kept (a
        // failed key fetch must not refuse a good token for a minute).
        Err(e) => {
            tracing::info!("OIDC token refused: {e}");
            return Err(unauthorized(e.to_string()));
        }
    };
    let refuse = |why: String, owner: Option<&str>| {
        let draft = AuditDraft::identity_refused(&verified.identity, owner, verified.jti.as_deref(), &why);
        (why, draft)
    };
    // A rule may run the site's mapping program (bounded, seconds at most): off the async workers.
    let (map, identity) = (ids.map(), verified.identity.clone());
    let decided = tokio::task::spawn_blocking(move || map.map(&identity))
        .await
        .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("identity map task: {e}")))?;
    let outcome = match decided {
        Err(e) => Err(refuse(e.to_string(), None)),
        Ok(mapped) => match (at.bind)(verified.identity.clone(), mapped.clone()).await {
            Ok(bound) => Ok((mapped, bound)),
            Err(e) => Err(refuse(e, Some(&mapped.owner))),
        },
    };
    match outcome {
        Ok((mapped, bound)) => {
            if bound != Bound::Same {
                let draft = AuditDraft::identity_mapped(
                    &verified.identity,
                    &mapped,
                    verified.jti.as_deref(),
                    bound == Bound::New,
                );
                append(at.firings, draft).await;
                tracing::info!(owner = %mapped.owner, rule = %mapped.rule, sub = %verified.identity.sub, first = bound == Bound::New, "OIDC identity mapped");
            }
            let who = OidcCaller {
                caller: Caller { name: mapped.owner.clone(), scope: Scope::Developer },
                issuer: verified.identity.issuer.clone(),
                sub: verified.identity.sub.clone(),
                rule: mapped.rule.clone(),
                groups: mapped.groups.clone(),
                jti: verified.jti.clone(),
                scopes: verified.scopes.clone(),
            };
            ids.keep(token, Resolved::Caller { who: who.clone(), until_s: verified.exp, generation });
            Ok(who)
        }
        Err((why, draft)) => {
            tracing::warn!(issuer = %verified.identity.issuer, sub = %verified.identity.sub, "OIDC identity refused: {why}");
            append(at.firings, draft).await;
            let until_s = verified.exp.min(htfaas_functions::time::now_s() + REFUSAL_KEPT_S);
            ids.keep(token, Resolved::Refused { why: why.clone(), until_s, generation });
            Err(unauthorized(why))
        }
    }
}

async fn append(firings: &crate::firing::Firings, draft: AuditDraft) {
    if let Err(e) = firings.append_async(draft).await {
        tracing::error!("failed to record an identity decision in the audit trail: {e}");
    }
}

fn unauthorized(why: String) -> HttpError {
    HttpError(StatusCode::UNAUTHORIZED, why)
}

/// Whether a token's WLCG scopes allow `method` on the API: reads (`GET`, `HEAD`) need any
/// `compute.*` scope, changes need `compute.create` or `compute.modify`, and a `DELETE` also
/// `compute.cancel`. A token without a `scope` claim passes (its mapping limits it).
pub fn check_scopes(scopes: Option<&[String]>, method: &Method) -> Result<(), HttpError> {
    let Some(scopes) = scopes else { return Ok(()) };
    let has = |s: &str| scopes.iter().any(|x| x == s);
    let ok = if method == Method::GET || method == Method::HEAD {
        scopes.iter().any(|s| s.starts_with("compute."))
    } else if method == Method::DELETE {
        has("compute.create") || has("compute.modify") || has("compute.cancel")
    } else {
        has("compute.create") || has("compute.modify")
    };
    if ok {
        return Ok(());
    }
    Err(HttpError(
        StatusCode::FORBIDDEN,
        format!(
            "the token's scopes ({}) do not allow {method} on this API (compute.read for reads, compute.create or \
             compute.modify for changes)",
            scopes.join(" ")
        ),
    ))
}

/// Whether a token's WLCG scopes allow a file credential for `path`: a read needs
/// `storage.read:<dir>`, a write (new files) `storage.create:<dir>` or `storage.modify:<dir>`,
/// with `path` at or beneath `<dir>` (whole segments: `storage.read:/data` covers `/data/x`,
/// not `/database`). A token without a `scope` claim passes (its namespace alone limits it);
/// one with the claim and no such scope is refused (403).
pub fn check_storage_scopes(scopes: Option<&[String]>, write: bool, path: &str) -> Result<(), HttpError> {
    let Some(scopes) = scopes else { return Ok(()) };
    let kinds: &[&str] = if write { &["storage.create:", "storage.modify:"] } else { &["storage.read:"] };
    let covered = scopes.iter().any(|s| kinds.iter().any(|k| s.strip_prefix(k).is_some_and(|dir| beneath(dir, path))));
    if covered {
        return Ok(());
    }
    let wanted = if write { "storage.create or storage.modify" } else { "storage.read" };
    Err(HttpError(
        StatusCode::FORBIDDEN,
        format!(
            "the token's scopes ({}) do not allow {path}: it needs {wanted} on it or a directory above",
            scopes.join(" ")
        ),
    ))
}

/// Whether `path` is `dir` or inside it, by whole segments.
fn beneath(dir: &str, path: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    dir.is_empty() || path == dir || path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
}

/// Watches the map file until `shutdown`: a change that loads replaces the map and re-derives
/// the grants in force; one that does not is logged and leaves the map as it was.
pub async fn watch(
    ids: &Identities,
    registry: &htfaas_functions::Registry,
    namespaces: &crate::namespaces::Namespaces,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut every = tokio::time::interval(MAP_POLL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        // A stat every poll; the file is read, and the grants with it, only after a change.
        match ids.reload_if_changed() {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(path = %ids.map.path.display(), "identity map reloaded");
                namespaces.set_live_rules(Some(ids.live_rules()));
                if let Err(e) = namespaces.reload(registry) {
                    tracing::error!("cannot read the grants again after the identity map changed: {e}");
                }
            }
            Err(e) => {
                tracing::error!(path = %ids.map.path.display(), "identity map not reloaded, the previous one stays: {e}")
            }
        }
    }
}

fn key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn read_map(path: &Path) -> Result<(IdentityMap, Option<(SystemTime, u64)>), MapError> {
    let stamp = stamp_of(path);
    let text = std::fs::read(path).map_err(|e| MapError::Invalid(format!("{}: {e}", path.display())))?;
    let map = IdentityMap::parse(&text).map_err(|e| MapError::Invalid(format!("{}: {e}", path.display())))?;
    Ok((map, stamp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scopes(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn wlcg_scopes_allow_reads_and_changes_as_documented() {
        let cases = [
            ("compute.read", Method::GET, true),
            ("compute.read", Method::POST, false),
            ("compute.read", Method::DELETE, false),
            ("compute.create", Method::POST, true),
            ("compute.modify", Method::PUT, true),
            ("compute.cancel", Method::DELETE, true),
            ("compute.cancel", Method::POST, false),
            ("storage.read:/data", Method::GET, false),
            ("storage.read:/data storage.create:/data", Method::POST, false),
            ("", Method::GET, false),
        ];
        for (s, method, ok) in cases {
            let got = check_scopes(Some(&scopes(s)), &method);
            assert_eq!(got.is_ok(), ok, "{s:?} {method}: {got:?}");
            if let Err(e) = got {
                assert_eq!(e.0, StatusCode::FORBIDDEN);
            }
        }
        // No `scope` claim: the mapping alone limits the token.
        assert!(check_scopes(None, &Method::DELETE).is_ok());
    }

    #[test]
    fn storage_scopes_cover_whole_segments_and_the_right_kind() {
        let s = scopes("compute.create storage.read:/data storage.create:/out/carol");
        let ok = |write: bool, path: &str| check_storage_scopes(Some(&s), write, path).is_ok();
        assert!(ok(false, "/data/carol/run-1.dat") && ok(false, "/data"));
        assert!(!ok(false, "/database/x"), "a prefix is a directory, not a string prefix");
        assert!(!ok(false, "/out/carol/x"), "create does not read");
        assert!(ok(true, "/out/carol/new.dat"));
        assert!(!ok(true, "/data/carol/new.dat"), "read does not write");
        assert!(!ok(true, "/out/carolx/new.dat"));
        assert!(check_storage_scopes(Some(&scopes("storage.modify:/")), true, "/any/where").is_ok());
        assert!(check_storage_scopes(Some(&scopes("compute.create")), false, "/data/x").is_err());
        assert!(check_storage_scopes(None, true, "/data/x").is_ok());
    }
}
