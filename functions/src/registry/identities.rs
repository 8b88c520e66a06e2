//! Identities bound to owners: the first verified identity (issuer and `sub`) the site's
//! identity map ([`crate::identity_map`]) makes an owner of claims that owner name, in the
//! transaction that writes the claim; a different identity mapped to the same name later is
//! refused ([`RegistryError::IdentityTaken`]), so no second issuer, and no regex that captures
//! another person's name, takes over an owner's functions, files or secrets. The same identity
//! coming back updates its row (the rule that matched, its groups and grants, when last seen).
//!
//! A binding also keeps what its rule granted at that sign-in; the gateway holds those grants
//! in force while the map still has a rule of that name for that issuer ([`crate::identity_map`]).
//!
//! Must not know: tokens, HTTP, the map's expressions.

use super::{Registry, RegistryError};
use crate::identity_map::{Identity, Mapped};
use crate::namespace::Grant;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

/// Creates the table (at open).
pub(super) fn create_table(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS identities (
             owner TEXT PRIMARY KEY, issuer TEXT NOT NULL, sub TEXT NOT NULL, rule TEXT NOT NULL,
             groups TEXT NOT NULL, grants TEXT NOT NULL,
             first_seen INTEGER NOT NULL, last_seen INTEGER NOT NULL);",
    )
}

/// An owner bound to an identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// The owner name.
    pub owner: String,
    /// The identity's issuer.
    pub issuer: String,
    /// The identity's `sub`.
    pub sub: String,
    /// The rule that mapped it last.
    pub rule: String,
    /// Its accounting groups, as that rule made them.
    pub groups: Vec<String>,
    /// The grants that rule gave it (its `group` grants included).
    pub grants: Vec<Grant>,
    /// First sign-in, Unix seconds.
    pub first_seen: u64,
    /// Last sign-in that was resolved (a token is resolved once), Unix seconds.
    pub last_seen: u64,
}

/// What [`Registry::bind_identity`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// The owner name was free: the identity claimed it.
    New,
    /// The identity held it already; the rule, groups or grants changed.
    Changed,
    /// The identity held it already, as mapped now.
    Same,
}

impl Registry {
    /// Binds `mapped.owner` to `identity`, or refuses: the check and the claim are one
    /// immediate transaction, so two identities mapped to one new name at once cannot both
    /// hold it.
    pub fn bind_identity(&self, identity: &Identity, mapped: &Mapped, now_s: u64) -> Result<Bound, RegistryError> {
        let groups = serde_json::to_string(&mapped.groups).map_err(|e| RegistryError::Corrupt(e.to_string()))?;
        let grants = serde_json::to_string(&mapped.grants).map_err(|e| RegistryError::Corrupt(e.to_string()))?;
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let held: Option<(String, String, String, String, String)> = tx
            .query_row(
                "SELECT issuer, sub, rule, groups, grants FROM identities WHERE owner = ?1",
                [&mapped.owner],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()?;
        let bound = match held {
            Some((issuer, sub, ..)) if issuer != identity.issuer || sub != identity.sub => {
                return Err(RegistryError::IdentityTaken(format!(
                    "owner {:?} is bound to another identity (issuer {issuer:?}); an admin must unbind it first",
                    mapped.owner
                )));
            }
            Some((_, _, rule, g, a)) if rule == mapped.rule && g == groups && a == grants => Bound::Same,
            Some(_) => Bound::Changed,
            None => Bound::New,
        };
        tx.execute(
            "INSERT INTO identities (owner, issuer, sub, rule, groups, grants, first_seen, last_seen)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)
             ON CONFLICT (owner) DO UPDATE SET rule = excluded.rule, groups = excluded.groups,
                 grants = excluded.grants, last_seen = excluded.last_seen",
            params![mapped.owner, identity.issuer, identity.sub, mapped.rule, groups, grants, now_s as i64],
        )?;
        tx.commit()?;
        Ok(bound)
    }

    /// Every bound identity, by owner.
    pub fn identities(&self) -> Result<Vec<Binding>, RegistryError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT owner, issuer, sub, rule, groups, grants, first_seen, last_seen FROM identities ORDER BY owner",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                Binding {
                    owner: r.get(0)?,
                    issuer: r.get(1)?,
                    sub: r.get(2)?,
                    rule: r.get(3)?,
                    groups: Vec::new(),
                    grants: Vec::new(),
                    first_seen: r.get::<_, i64>(6)?.max(0) as u64,
                    last_seen: r.get::<_, i64>(7)?.max(0) as u64,
                },
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
            ))
        })?;
        rows.map(|row| {
            let (mut b, groups, grants) = row?;
            b.groups =
                serde_json::from_str(&groups).map_err(|e| RegistryError::Corrupt(format!("{}: {e}", b.owner)))?;
            b.grants =
                serde_json::from_str(&grants).map_err(|e| RegistryError::Corrupt(format!("{}: {e}", b.owner)))?;
            Ok(b)
        })
        .collect()
    }

    /// Removes `owner`'s binding (an admin frees the name for another identity); whether
    /// there was one.
    pub fn unbind_identity(&self, owner: &str) -> Result<bool, RegistryError> {
        Ok(self.conn().execute("DELETE FROM identities WHERE owner = ?1", [owner])? == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::Right;

    fn mapped(owner: &str, rule: &str) -> Mapped {
        Mapped {
            rule: rule.into(),
            owner: owner.into(),
            groups: vec!["cms".into()],
            grants: vec![Grant { principal: owner.into(), right: Right::Read, value: format!("/data/{owner}/") }],
        }
    }

    fn id(issuer: &str, sub: &str) -> Identity {
        Identity { issuer: issuer.into(), sub: sub.into(), groups: vec![] }
    }

    #[test]
    fn the_first_identity_claims_an_owner_and_no_other_identity_takes_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        let alice = id("https://idp-a", "alice");
        assert_eq!(reg.bind_identity(&alice, &mapped("alice", "staff"), 10).expect("bind"), Bound::New);
        assert_eq!(reg.bind_identity(&alice, &mapped("alice", "staff"), 20).expect("again"), Bound::Same);
        assert_eq!(reg.bind_identity(&alice, &mapped("alice", "other"), 30).expect("changed"), Bound::Changed);
        // Another issuer's alice, and another sub of the same issuer, are refused.
        for other in [id("https://idp-b", "alice"), id("https://idp-a", "alice2")] {
            let err = reg.bind_identity(&other, &mapped("alice", "staff"), 40).expect_err("taken");
            assert!(matches!(err, RegistryError::IdentityTaken(_)), "{err}");
        }
        let all = reg.identities().expect("list");
        assert_eq!(all.len(), 1);
        let b = &all[0];
        assert_eq!((b.issuer.as_str(), b.sub.as_str(), b.rule.as_str()), ("https://idp-a", "alice", "other"));
        assert_eq!((b.first_seen, b.last_seen), (10, 30));
        assert_eq!(b.grants, mapped("alice", "x").grants);
        assert!(reg.unbind_identity("alice").expect("unbind"));
        let bob_as_alice = id("https://idp-b", "alice");
        assert_eq!(reg.bind_identity(&bob_as_alice, &mapped("alice", "staff"), 50).expect("freed"), Bound::New);
    }
}
