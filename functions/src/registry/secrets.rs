//! The functions' secrets as the registry keeps them: one row per (function, name), the value
//! sealed by the gateway ([`crate::seal`], slot `secret:<function>:<name>`, or
//! `webhook-key:<function>:<name>` for a failure webhook's signing key, which no run opens)
//! before it reaches this module. Every read and write names the owner too: a function's
//! secrets are its owner's, and a name is only ever one owner's ([`super`]). Setting a function's secrets replaces them all (a rotation); they are not
//! versioned with the manifest: every version of the function, and a rollback, runs with the
//! current values.
//!
//! Must not know: the seal key, the values, who may set them.

use super::{Registry, RegistryError};
use crate::manifest::{FunctionManifest, ManifestError};
use rusqlite::{Connection, params};
use std::collections::BTreeSet;

/// Creates the table (at open).
pub(super) fn create_table(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS function_secrets (
             name TEXT NOT NULL, key TEXT NOT NULL, sealed TEXT NOT NULL, set_at INTEGER NOT NULL,
             PRIMARY KEY (name, key));",
    )
}

/// Refuses, in a registration's transaction, a manifest that would let a run see a failure
/// webhook's key: its `secrets` naming a name any version of the function signs webhooks with,
/// or its webhook's key named among any version's `secrets`. (A value is sealed as one kind or
/// the other when it is set: the gateway seals a webhook key where no run opens it.)
pub(super) fn check_kinds(tx: &Connection, m: &FunctionManifest) -> Result<(), RegistryError> {
    let (keys, runs) = kinds(tx, &m.name)?;
    if let Some(name) = m.secrets.iter().find(|s| keys.contains(*s)) {
        return Err(RegistryError::Manifest(ManifestError {
            field: "secrets",
            reason: format!(
                "{name} is the signing key of this function's failure webhook (webhook.key_secret of a version): \
                 its runs never get it"
            ),
        }));
    }
    if let Some(w) = m.webhook.as_ref().filter(|w| runs.contains(&w.key_secret)) {
        return Err(RegistryError::Manifest(ManifestError {
            field: "webhook.key_secret",
            reason: format!(
                "{} is a secret a version of this function gives its runs: a webhook key must be a secret no run \
                 gets (name another, e.g. WEBHOOK_KEY)",
                w.key_secret
            ),
        }));
    }
    Ok(())
}

/// The names `name`'s versions sign webhooks with, and the names its versions give their runs.
fn kinds(conn: &Connection, name: &str) -> Result<(BTreeSet<String>, BTreeSet<String>), RegistryError> {
    let mut stmt = conn.prepare_cached("SELECT record FROM owned_versions WHERE name = ?1")?;
    let rows = stmt.query_map([name], |r| r.get::<_, String>(0))?;
    let (mut keys, mut runs) = (BTreeSet::new(), BTreeSet::new());
    for text in rows {
        let record = super::parse_record(&text?)?;
        keys.extend(record.manifest.webhook.map(|w| w.key_secret));
        runs.extend(record.manifest.secrets);
    }
    Ok((keys, runs))
}

impl Registry {
    /// Replaces every secret of the function `name` of `owner` with `sealed` ((name, sealed
    /// value) pairs); [`RegistryError::NotOwner`] when the name is not `owner`'s.
    pub fn set_secrets(&self, owner: &str, name: &str, sealed: &[(String, String)]) -> Result<(), RegistryError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        if super::owner_in(&tx, name)?.as_deref() != Some(owner) {
            return Err(RegistryError::NotOwner(name.to_owned(), owner.to_owned()));
        }
        tx.execute("DELETE FROM function_secrets WHERE name = ?1", [name])?;
        let now = crate::time::now_s() as i64;
        for (key, value) in sealed {
            tx.execute(
                "INSERT INTO function_secrets (name, key, sealed, set_at) VALUES (?1, ?2, ?3, ?4)",
                params![name, key, value, now],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The secrets of the function `name` of `owner`, (name, sealed value), by name: none when
    /// the name is not `owner`'s.
    pub fn sealed_secrets(&self, owner: &str, name: &str) -> Result<Vec<(String, String)>, RegistryError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT s.key, s.sealed FROM function_secrets s JOIN function_owners o ON o.name = s.name
             WHERE s.name = ?1 AND o.owner = ?2 ORDER BY s.key",
        )?;
        let rows = stmt.query_map([name, owner], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The names of the secrets of the function `name` of `owner`, sorted.
    pub fn secret_names(&self, owner: &str, name: &str) -> Result<Vec<String>, RegistryError> {
        Ok(self.sealed_secrets(owner, name)?.into_iter().map(|(k, _)| k).collect())
    }

    /// The names `name`'s versions sign their failure webhooks with (sealed as webhook keys,
    /// which no run opens).
    pub fn webhook_key_names(&self, name: &str) -> Result<BTreeSet<String>, RegistryError> {
        Ok(kinds(&self.conn(), name)?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_secrets_replaces_them_all_and_survives_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        let module = reg.put_module(b"\0asm\x01\0\0\0").expect("module");
        for name in ["f", "g"] {
            reg.register(FunctionManifest { name: name.into(), ..super::super::tests::manifest(module.clone()) })
                .expect("register");
        }
        reg.set_secrets("alice", "f", &[("B".into(), "sealed-b".into()), ("A".into(), "sealed-a".into())])
            .expect("set");
        reg.set_secrets("alice", "g", &[("A".into(), "other".into())]).expect("set g");
        assert_eq!(reg.secret_names("alice", "f").expect("names"), ["A", "B"]);
        reg.set_secrets("alice", "f", &[("C".into(), "sealed-c".into())]).expect("rotate");
        // Another owner neither sets nor reads them, and an unregistered name has none.
        assert!(matches!(reg.set_secrets("mallory", "f", &[]), Err(RegistryError::NotOwner(..))));
        assert!(matches!(reg.set_secrets("mallory", "h", &[]), Err(RegistryError::NotOwner(..))));
        assert!(reg.sealed_secrets("mallory", "f").expect("none of mallory's").is_empty());
        drop(reg);
        let reg = Registry::open(dir.path()).expect("reopen");
        assert_eq!(reg.sealed_secrets("alice", "f").expect("f"), [("C".to_owned(), "sealed-c".to_owned())]);
        assert_eq!(reg.sealed_secrets("alice", "g").expect("g"), [("A".to_owned(), "other".to_owned())]);
        assert!(reg.sealed_secrets("alice", "h").expect("none").is_empty());
    }

    /// A run never gets a webhook's key: a version naming another version's key among its
    /// secrets is refused, and so is a key that another version gives its runs.
    #[test]
    fn a_webhook_key_is_never_a_run_secret_of_any_version() {
        use crate::manifest::Webhook;
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        let module = reg.put_module(b"\0asm\x01\0\0\0").expect("module");
        let base = super::super::tests::manifest(module);
        let hooked = FunctionManifest {
            webhook: Some(Webhook { url: "https://hooks.example.org/h".into(), key_secret: "HOOK".into() }),
            ..base.clone()
        };
        reg.register(hooked).expect("v1 with a webhook");
        assert_eq!(reg.webhook_key_names("checksum").expect("names").into_iter().collect::<Vec<_>>(), ["HOOK"]);
        let leaking = FunctionManifest { secrets: vec!["HOOK".into()], ..base.clone() };
        let e = reg.register(leaking).expect_err("v2 listing the key");
        assert!(e.to_string().contains("HOOK is the signing key of this function's failure webhook"), "{e}");
        let db = FunctionManifest { name: "other".into(), secrets: vec!["DB".into()], ..base.clone() };
        reg.register(db.clone()).expect("a run secret");
        let keyed = FunctionManifest {
            webhook: Some(Webhook { url: "https://hooks.example.org/h".into(), key_secret: "DB".into() }),
            secrets: vec![],
            ..db
        };
        let e = reg.register(keyed).expect_err("a key another version's runs get");
        assert!(e.to_string().contains("DB is a secret a version of this function gives its runs"), "{e}");
    }
}
