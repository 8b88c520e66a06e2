//! A function's life beside its versions: which version fires (the latest, or one an owner
//! pinned: a rollback), whether it fires at all (disabled: its matching events are counted, no
//! job is made), and whether it is deleted (it fires nothing and is listed nowhere; its versions
//! stay, for the audit trail and lineage, and the name stays its owner's).
//!
//! One row per function in `function_state`; no row is the default: enabled, unpinned, not
//! deleted. Versions themselves never change ([`super`]). A job always carries the digest it
//! was fired with, so a rollback changes what fires from then on, never a job already made.
//!
//! Must not know: triggers, jobs, who may do what (the gateway checks the caller first).

use super::{Registry, RegistryError, parse_record};
use crate::manifest::FunctionRecord;
use rusqlite::{Connection, OptionalExtension as _, params};
use serde::{Deserialize, Serialize};

/// A function as it stands: the version that fires and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionStatus {
    /// The live version: the pinned one, or the latest.
    #[serde(flatten)]
    pub record: FunctionRecord,
    /// Its newest version.
    pub latest_version: u32,
    /// Whether its events make jobs.
    pub enabled: bool,
    /// The version an owner pinned (a rollback), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<u32>,
}

/// Creates the table (at open).
pub(super) fn create_table(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS function_state (
             name TEXT PRIMARY KEY, pinned INTEGER, enabled INTEGER NOT NULL DEFAULT 1,
             deleted INTEGER NOT NULL DEFAULT 0, changed_at INTEGER NOT NULL);",
    )
}

/// A registration lifts the pin and undeletes (in the registration's transaction).
pub(super) fn on_register(conn: &Connection, name: &str) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE function_state SET pinned = NULL, deleted = 0, changed_at = ?2 WHERE name = ?1",
        params![name, crate::time::now_s() as i64],
    )?;
    Ok(())
}

/// The live versions with their state, `name` alone or every function, not deleted, by name.
fn select(conn: &Connection, name: Option<&str>) -> Result<Vec<FunctionStatus>, RegistryError> {
    let mut stmt = conn.prepare_cached(
        "SELECT f.record, l.v, COALESCE(s.enabled, 1), s.pinned FROM owned_versions f
         JOIN (SELECT name, MAX(version) AS v FROM owned_versions GROUP BY name) l ON f.name = l.name
         LEFT JOIN function_state s ON s.name = f.name
         WHERE f.version = COALESCE(s.pinned, l.v) AND COALESCE(s.deleted, 0) = 0
           AND (?1 IS NULL OR f.name = ?1)
         ORDER BY f.name",
    )?;
    let rows = stmt.query_map([name], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?, r.get::<_, bool>(2)?, r.get::<_, Option<u32>>(3)?))
    })?;
    rows.map(|row| {
        let (text, latest_version, enabled, pinned) = row?;
        Ok(FunctionStatus { record: parse_record(&text)?, latest_version, enabled, pinned })
    })
    .collect()
}

/// Sets `column` of `name`'s state row (made if missing).
fn set(conn: &Connection, name: &str, column: &str, value: Option<i64>) -> rusqlite::Result<()> {
    // `column` is one of this module's literals, never input.
    conn.execute(
        &format!(
            "INSERT INTO function_state (name, {column}, changed_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO UPDATE SET {column} = excluded.{column}, changed_at = excluded.changed_at"
        ),
        params![name, value, crate::time::now_s() as i64],
    )?;
    Ok(())
}

impl Registry {
    /// Every function not deleted, as it stands, by name.
    pub fn statuses(&self) -> Result<Vec<FunctionStatus>, RegistryError> {
        select(&self.conn(), None)
    }

    /// `name` as it stands; [`RegistryError::NotFound`] when it is missing or deleted.
    pub fn status(&self, name: &str) -> Result<FunctionStatus, RegistryError> {
        select(&self.conn(), Some(name))?.pop().ok_or_else(|| RegistryError::NotFound(name.to_owned()))
    }

    /// The version of `name` that fires (pinned or latest); not found when deleted.
    pub fn live(&self, name: &str) -> Result<FunctionRecord, RegistryError> {
        Ok(self.status(name)?.record)
    }

    /// Every version of `name`, oldest first, deleted or not.
    pub fn versions(&self, name: &str) -> Result<Vec<FunctionRecord>, RegistryError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT record FROM owned_versions WHERE name = ?1 ORDER BY version")?;
        let rows = stmt.query_map([name], |r| r.get::<_, String>(0))?;
        let versions = rows.map(|t| parse_record(&t?)).collect::<Result<Vec<_>, _>>()?;
        if versions.is_empty() {
            return Err(RegistryError::NotFound(name.to_owned()));
        }
        Ok(versions)
    }

    /// Makes `version` of `name` the one that fires (a rollback), or, with `None`, the latest
    /// again. The function must not be deleted.
    pub fn pin(&self, name: &str, version: Option<u32>) -> Result<FunctionStatus, RegistryError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        if select(&tx, Some(name))?.is_empty() {
            return Err(RegistryError::NotFound(name.to_owned()));
        }
        if let Some(v) = version {
            let exists: Option<u32> = tx
                .query_row(
                    "SELECT version FROM owned_versions WHERE name = ?1 AND version = ?2",
                    params![name, v],
                    |r| r.get(0),
                )
                .optional()?;
            if exists.is_none() {
                return Err(RegistryError::NoSuchVersion(name.to_owned(), v));
            }
        }
        set(&tx, name, "pinned", version.map(i64::from))?;
        let status = select(&tx, Some(name))?.pop().ok_or_else(|| RegistryError::NotFound(name.to_owned()))?;
        tx.commit()?;
        Ok(status)
    }

    /// The version before the live one of `name` (what `fn rollback` goes to without `--to`).
    pub fn previous_version(&self, name: &str) -> Result<u32, RegistryError> {
        let live = self.status(name)?.record.version;
        let conn = self.conn();
        let previous: Option<u32> = conn.query_row(
            "SELECT MAX(version) FROM owned_versions WHERE name = ?1 AND version < ?2",
            params![name, live],
            |r| r.get(0),
        )?;
        previous.ok_or(RegistryError::NoSuchVersion(name.to_owned(), live.saturating_sub(1)))
    }

    /// Disables or enables `name` (not deleted).
    pub fn set_enabled(&self, name: &str, enabled: bool) -> Result<FunctionStatus, RegistryError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        if select(&tx, Some(name))?.is_empty() {
            return Err(RegistryError::NotFound(name.to_owned()));
        }
        set(&tx, name, "enabled", Some(i64::from(enabled)))?;
        let status = select(&tx, Some(name))?.pop().ok_or_else(|| RegistryError::NotFound(name.to_owned()))?;
        tx.commit()?;
        Ok(status)
    }

    /// Deletes `name`: it fires nothing and is listed nowhere; its versions and modules stay.
    /// Returns the version that was live. Registering the name again (its owner only) brings it
    /// back as a new version.
    pub fn delete(&self, name: &str) -> Result<FunctionRecord, RegistryError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let live = select(&tx, Some(name))?.pop().ok_or_else(|| RegistryError::NotFound(name.to_owned()))?;
        set(&tx, name, "deleted", Some(1))?;
        set(&tx, name, "pinned", None)?;
        tx.commit()?;
        Ok(live.record)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::manifest;
    use super::*;

    fn registry() -> (tempfile::TempDir, Registry, crate::Digest) {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        let digest = reg.put_module(b"\0asm\x01\0\0\0").expect("put");
        (dir, reg, digest)
    }

    fn two_versions(reg: &Registry, digest: &crate::Digest) {
        reg.register(manifest(digest.clone())).expect("v1");
        let mut v2 = manifest(digest.clone());
        v2.trigger.path = "/data/v2/**".into();
        reg.register(v2).expect("v2");
    }

    #[test]
    fn a_pinned_version_fires_until_a_new_registration_or_unpin() {
        let (_dir, reg, digest) = registry();
        two_versions(&reg, &digest);
        assert_eq!(reg.live("checksum").expect("live").version, 2);
        assert_eq!(reg.previous_version("checksum").expect("previous"), 1);
        let s = reg.pin("checksum", Some(1)).expect("pin");
        assert_eq!((s.record.version, s.latest_version, s.pinned), (1, 2, Some(1)));
        assert_eq!(reg.list().expect("list")[0].version, 1, "the trigger cache reads the pinned one");
        assert!(matches!(reg.previous_version("checksum"), Err(RegistryError::NoSuchVersion(_, 0))));
        assert!(matches!(reg.pin("checksum", Some(7)), Err(RegistryError::NoSuchVersion(_, 7))));
        assert!(matches!(reg.pin("nope", None), Err(RegistryError::NotFound(_))));
        assert_eq!(reg.pin("checksum", None).expect("unpin").record.version, 2);
        reg.pin("checksum", Some(1)).expect("pin again");
        // Registering the latest manifest again makes it live again, as a new one would.
        let mut v2 = manifest(digest);
        v2.trigger.path = "/data/v2/**".into();
        assert_eq!(reg.register(v2).expect("again").version, 2);
        assert_eq!(reg.status("checksum").expect("status").pinned, None);
        assert_eq!(reg.versions("checksum").expect("versions").len(), 2);
    }

    #[test]
    fn disabled_and_deleted_functions_keep_their_versions() {
        let (dir, reg, digest) = registry();
        two_versions(&reg, &digest);
        assert!(!reg.set_enabled("checksum", false).expect("disable").enabled);
        // Disabled: still listed (its events are counted), and a new version stays disabled.
        assert_eq!(reg.list().expect("list").len(), 1);
        let mut v3 = manifest(digest.clone());
        v3.trigger.path = "/data/v3/**".into();
        reg.register(v3).expect("v3");
        assert!(!reg.status("checksum").expect("status").enabled);
        assert!(reg.set_enabled("checksum", true).expect("enable").enabled);

        assert_eq!(reg.delete("checksum").expect("delete").version, 3);
        assert!(reg.list().expect("list").is_empty());
        assert!(matches!(reg.live("checksum"), Err(RegistryError::NotFound(_))));
        assert!(matches!(reg.set_enabled("checksum", true), Err(RegistryError::NotFound(_))));
        assert!(matches!(reg.delete("checksum"), Err(RegistryError::NotFound(_))));
        // Its versions stay, and the name stays its owner's.
        assert_eq!(reg.versions("checksum").expect("versions").len(), 3);
        assert_eq!(reg.latest("checksum").expect("latest").manifest.owner, "alice");
        assert!(reg.module_path(&digest).expect("module").is_some());
        // Survives a reopen; registering again brings it back.
        drop(reg);
        let reg = Registry::open(dir.path()).expect("reopen");
        assert!(reg.list().expect("list").is_empty());
        reg.register(manifest(digest)).expect("again");
        let s = reg.status("checksum").expect("back");
        assert_eq!((s.record.version, s.enabled), (4, true));
    }
}
