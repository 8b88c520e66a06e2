//! The registry: wasm modules stored by content digest, and versioned function records, in
//! SQLite (WAL) plus a blob directory.
//!
//! Invariants: a stored (name, version) never changes; module bytes are only ever addressed by
//! their digest, and a blob is written to a temporary file and renamed into place, so a reader
//! never sees a partial module.
//!
//! Calls block on disk; async callers use `spawn_blocking`.

use crate::Digest;
use crate::manifest::{FunctionManifest, FunctionRecord, ManifestError};
use rusqlite::{Connection, OptionalExtension, params};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Largest module accepted, bytes.
pub const MAX_MODULE_BYTES: usize = 64 * 1024 * 1024;

/// Why a registry call failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The manifest is invalid.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The bytes are not a wasm module.
    #[error("not a WebAssembly module: {0}")]
    NotWasm(String),
    /// The manifest names a module that was never uploaded.
    #[error("module {0} is not in the registry; upload it first")]
    UnknownModule(Digest),
    /// No such function.
    #[error("function {0:?} not found")]
    NotFound(String),
    /// SQLite failed.
    #[error("registry database: {0}")]
    Db(#[from] rusqlite::Error),
    /// Blob I/O failed.
    #[error("registry storage: {0}")]
    Io(#[from] std::io::Error),
    /// A stored record did not parse.
    #[error("corrupt registry record: {0}")]
    Corrupt(String),
}

/// The function registry.
pub struct Registry {
    /// One connection: registration is rare, reads are small.
    conn: Mutex<Connection>,
    /// `<dir>/modules/<hex>.wasm`.
    blob_dir: PathBuf,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("blob_dir", &self.blob_dir).finish_non_exhaustive()
    }
}

impl Registry {
    /// Opens (creating if needed) the registry in `dir`.
    pub fn open(dir: &Path) -> Result<Registry, RegistryError> {
        let blob_dir = dir.join("modules");
        std::fs::create_dir_all(&blob_dir)?;
        let conn = Connection::open(dir.join("registry.sqlite"))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS modules (
                 digest TEXT PRIMARY KEY, size INTEGER NOT NULL, stored_at INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS functions (
                 name TEXT NOT NULL, version INTEGER NOT NULL, record TEXT NOT NULL,
                 PRIMARY KEY (name, version));",
        )?;
        Ok(Registry { conn: Mutex::new(conn), blob_dir })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite inconsistent (transactions roll back).
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores module bytes (idempotent) and returns their digest.
    pub fn put_module(&self, bytes: &[u8]) -> Result<Digest, RegistryError> {
        if bytes.len() > MAX_MODULE_BYTES {
            return Err(RegistryError::NotWasm(format!("larger than {MAX_MODULE_BYTES} bytes")));
        }
        if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
            return Err(RegistryError::NotWasm("missing the \\0asm magic".into()));
        }
        let digest = Digest::of(bytes);
        let path = self.blob_path(&digest);
        if !path.exists() {
            let tmp = self.blob_dir.join(format!(".{}.{}.tmp", digest.hex(), uuid::Uuid::new_v4()));
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
        }
        self.conn().execute(
            "INSERT OR IGNORE INTO modules (digest, size, stored_at) VALUES (?1, ?2, ?3)",
            params![digest.as_str(), bytes.len() as i64, crate::token::now_s() as i64],
        )?;
        Ok(digest)
    }

    fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blob_dir.join(format!("{}.wasm", digest.hex()))
    }

    /// Path of a stored module, if it is stored.
    pub fn module_path(&self, digest: &Digest) -> Result<Option<PathBuf>, RegistryError> {
        let known: Option<i64> = self
            .conn()
            .query_row("SELECT size FROM modules WHERE digest = ?1", [digest.as_str()], |r| r.get(0))
            .optional()?;
        Ok(known.map(|_| self.blob_path(digest)))
    }

    /// Registers `manifest` as the next version of its name. Registering the same manifest as
    /// the latest version again returns that version unchanged.
    pub fn register(&self, manifest: FunctionManifest) -> Result<FunctionRecord, RegistryError> {
        manifest.validate()?;
        if self.module_path(&manifest.module)?.is_none() {
            return Err(RegistryError::UnknownModule(manifest.module.clone()));
        }
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        if let Some(latest) = latest_in(&tx, &manifest.name)?
            && latest.manifest == manifest
        {
            return Ok(latest);
        }
        let version = latest_version(&tx, &manifest.name)? + 1;
        let record = FunctionRecord { schema: 1, version, registered_at: crate::token::now_s(), manifest };
        let text = serde_json::to_string(&record).map_err(|e| RegistryError::Corrupt(e.to_string()))?;
        tx.execute(
            "INSERT INTO functions (name, version, record) VALUES (?1, ?2, ?3)",
            params![record.manifest.name, version, text],
        )?;
        tx.commit()?;
        Ok(record)
    }

    /// The latest version of every function, by name.
    pub fn list(&self) -> Result<Vec<FunctionRecord>, RegistryError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT f.record FROM functions f
             JOIN (SELECT name, MAX(version) AS v FROM functions GROUP BY name) l
               ON f.name = l.name AND f.version = l.v
             ORDER BY f.name",
        )?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        rows.map(|text| parse_record(&text?)).collect()
    }

    /// The latest version of `name`.
    pub fn latest(&self, name: &str) -> Result<FunctionRecord, RegistryError> {
        latest_in(&self.conn(), name)?.ok_or_else(|| RegistryError::NotFound(name.to_owned()))
    }
}

fn latest_version(conn: &Connection, name: &str) -> Result<u32, RegistryError> {
    let v: Option<u32> = conn.query_row("SELECT MAX(version) FROM functions WHERE name = ?1", [name], |r| r.get(0))?;
    Ok(v.unwrap_or(0))
}

fn latest_in(conn: &Connection, name: &str) -> Result<Option<FunctionRecord>, RegistryError> {
    let text: Option<String> = conn
        .query_row("SELECT record FROM functions WHERE name = ?1 ORDER BY version DESC LIMIT 1", [name], |r| r.get(0))
        .optional()?;
    text.map(|t| parse_record(&t)).transpose()
}

fn parse_record(text: &str) -> Result<FunctionRecord, RegistryError> {
    let record: FunctionRecord = serde_json::from_str(text).map_err(|e| RegistryError::Corrupt(e.to_string()))?;
    if record.schema != 1 {
        return Err(RegistryError::Corrupt(format!("unknown record schema {}", record.schema)));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{Outputs, Resources, Trigger};

    const WASM: &[u8] = b"\0asm\x01\0\0\0";

    fn manifest(module: Digest) -> FunctionManifest {
        FunctionManifest {
            name: "checksum".into(),
            owner: "alice".into(),
            module,
            trigger: Trigger::on_path("/data/raw/**"),
            resources: Resources::default(),
            outputs: Outputs { dir: "/data/checksums/".into() },
            args: vec![],
            env: vec![],
            annex: None,
            class: None,
        }
    }

    #[test]
    fn register_versions_and_survives_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        let digest = reg.put_module(WASM).expect("put");
        assert_eq!(digest, Digest::of(WASM));
        let v1 = reg.register(manifest(digest.clone())).expect("register");
        assert_eq!(v1.version, 1);
        assert_eq!(reg.register(manifest(digest.clone())).expect("same again").version, 1);
        let mut changed = manifest(digest);
        changed.trigger.path = "/data/other/**".into();
        assert_eq!(reg.register(changed).expect("register v2").version, 2);
        drop(reg);
        let reg = Registry::open(dir.path()).expect("reopen");
        let list = reg.list().expect("list");
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].version, 2);
        let path = reg.module_path(&Digest::of(WASM)).expect("lookup").expect("stored");
        assert_eq!(std::fs::read(path).expect("read"), WASM);
    }

    #[test]
    fn a_bad_trigger_rule_is_refused_and_a_new_rule_is_a_new_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        let digest = reg.put_module(WASM).expect("put");
        let mut bad = manifest(digest.clone());
        bad.trigger.rule = Some("size > 1 and".into());
        let e = reg.register(bad).expect_err("refused");
        assert!(matches!(&e, RegistryError::Manifest(m) if m.field == "trigger.rule"), "{e}");
        assert!(e.to_string().contains("at column 13: expected a test"), "{e}");
        assert_eq!(reg.register(manifest(digest.clone())).expect("v1").version, 1);
        let mut ruled = manifest(digest);
        ruled.trigger.rule = Some("size > 1MB".into());
        assert_eq!(reg.register(ruled.clone()).expect("v2").version, 2);
        assert_eq!(reg.latest("checksum").expect("latest").manifest.trigger, ruled.trigger);
    }

    #[test]
    fn refuses_non_wasm_and_unknown_modules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        assert!(matches!(reg.put_module(b"#!/bin/sh\nrm -rf /"), Err(RegistryError::NotWasm(_))));
        assert!(matches!(reg.register(manifest(Digest::of(b"never uploaded"))), Err(RegistryError::UnknownModule(_))));
        assert!(matches!(reg.latest("nope"), Err(RegistryError::NotFound(_))));
    }
}
