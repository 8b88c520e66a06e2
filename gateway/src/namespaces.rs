//! Namespace grants at the gateway: the site's configured grants (`Config::namespaces`), those
//! an admin made (kept in the registry) and those the identity map gives the identities it
//! bound (kept with each binding, in force while the map still holds the rule that gave them:
//! [`Namespaces::set_live_rules`]), held in memory for the checks of every
//! registration, firing, manual run, dry run and test ([`Namespaces::of`]). The API an admin
//! grants, lists and revokes them with (`/v1/namespaces`, each change audited) is
//! [`crate::api::namespaces`].
//!
//! What is inside a namespace is [`htfaas_functions::namespace`]'s to say; this module only
//! keeps the grants. Must not know: events, jobs, HTTP.

use htfaas_functions::Registry;
use htfaas_functions::namespace::{Grant, GrantEntry, GrantSource, Namespace, NamespaceError};
use htfaas_functions::registry::RegistryError;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// Every grant in force: the configured ones and the stored ones, also by principal (a firing
/// looks up its owner's, whatever the number of owners).
#[derive(Debug)]
pub struct Namespaces {
    pub(crate) configured: Vec<Grant>,
    all: RwLock<Arc<Index>>,
    /// The (issuer, rule) pairs of the identity map in force; `None` without a map (then no
    /// binding's grants are in force).
    live_rules: RwLock<Option<HashSet<(String, String)>>>,
}

#[derive(Debug, Default)]
struct Index {
    list: Vec<Grant>,
    by_principal: HashMap<String, Vec<Grant>>,
    /// The grants in `list` that come from the identity map only.
    mapped: HashSet<Grant>,
}

impl Namespaces {
    /// The configured grants (each checked) and those stored in `registry`.
    pub fn load(configured: Vec<Grant>, registry: &Registry) -> Result<Namespaces, RegistryError> {
        for g in &configured {
            g.validate().map_err(|e| RegistryError::Grant(format!("{g}: {e}")))?;
        }
        let ns = Namespaces { configured, all: RwLock::new(Arc::default()), live_rules: RwLock::new(None) };
        ns.reload(registry)?;
        Ok(ns)
    }

    /// Which identity map rules are in force (their bindings' grants count); `None`: no map.
    /// Takes effect at the next [`Namespaces::reload`].
    pub fn set_live_rules(&self, rules: Option<Vec<(String, String)>>) {
        *self.live_rules.write().unwrap_or_else(|p| p.into_inner()) = rules.map(|r| r.into_iter().collect());
    }

    /// Reads the stored grants and the bound identities' grants again (after a grant, a
    /// revocation, a sign-in that bound or changed an identity, a new identity map).
    pub fn reload(&self, registry: &Registry) -> Result<(), RegistryError> {
        let mut all = self.configured.clone();
        all.extend(registry.grants()?);
        let mut mapped = HashSet::new();
        let live = self.live_rules.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(live) = live {
            for b in registry.identities()? {
                if !live.contains(&(b.issuer.clone(), b.rule.clone())) {
                    continue;
                }
                // A binding's grants are its owner's only, whatever the stored row says.
                mapped.extend(b.grants.into_iter().filter(|g| g.principal == b.owner && !all.contains(g)));
            }
        }
        all.extend(mapped.iter().cloned());
        all.sort();
        all.dedup();
        let mut by_principal: HashMap<String, Vec<Grant>> = HashMap::new();
        for g in &all {
            by_principal.entry(g.principal.clone()).or_default().push(g.clone());
        }
        *self.all.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Index { list: all, by_principal, mapped });
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

    /// The namespace a function's runs have: its owner's, widened by its manifest's accounting
    /// group's grants when it names one, which the owner must be granted (`group` right, the
    /// owner's own grant). The error names the group.
    pub fn for_manifest(&self, m: &htfaas_functions::FunctionManifest) -> Result<Namespace, NamespaceError> {
        self.for_principal(&m.owner, m.group.as_deref())
    }

    /// The namespace `principal` acts in when it charges `group`: its own, widened by the
    /// group's grants only when it holds a `group` grant for it (a submit token's `group`
    /// claim or a manifest's `group` alone widens nothing). The error names the group.
    pub fn for_principal(&self, principal: &str, group: Option<&str>) -> Result<Namespace, NamespaceError> {
        match group {
            None => Ok(self.of(principal, None)),
            Some(group) if self.of(principal, None).may_charge_group(group) => Ok(self.of(principal, Some(group))),
            Some(group) => Err(NamespaceError(format!(
                "{principal} may not charge runs to the accounting group {group:?} (no group grant)"
            ))),
        }
    }

    /// Whether nothing at all is granted (every function would be refused).
    pub fn is_empty(&self) -> bool {
        self.index().list.is_empty()
    }

    /// Every grant with where it comes from; only `principal`'s when given.
    pub fn list(&self, principal: Option<&str>) -> Vec<GrantEntry> {
        let index = self.index();
        index
            .list
            .iter()
            .filter(|g| principal.is_none_or(|p| g.principal == p))
            .map(|g| GrantEntry {
                grant: g.clone(),
                source: if self.configured.contains(g) {
                    GrantSource::Config
                } else if index.mapped.contains(g) {
                    GrantSource::Map
                } else {
                    GrantSource::Admin
                },
            })
            .collect()
    }
}
