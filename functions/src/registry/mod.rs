//! The registry: wasm modules stored by content digest, and versioned function records, in
//! SQLite (WAL) plus a blob directory.
//!
//! Invariants: a stored (name, version) never changes; module bytes are only ever addressed by
//! their digest, and a blob is written to a temporary file and renamed into place, so a reader
//! never sees a partial module.
//!
//! A function name has one owner, for good: the first registration of a name claims it in
//! `function_owners`, in the registration's own transaction, and every later registration of
//! the name by another owner is refused ([`RegistryError::NotOwner`]) in that same transaction,
//! so two owners registering one new name at the same moment cannot both succeed. Every read of
//! versions goes through the `owned_versions` view (versions whose manifest names the name's
//! owner), so a version another owner slipped in before the claim existed is never served.
//!
//! What an owner does with a function besides registering versions (pin one, disable, delete)
//! is [`lifecycle`]: a row per function beside its immutable versions; its sealed secrets are
//! [`secrets`]. The identities of the site's OIDC provider bound to owners are [`identities`].
//!
//! Calls block on disk; async callers use `spawn_blocking`.

pub mod identities;
pub mod images;
pub mod lifecycle;
pub mod secrets;

pub use lifecycle::FunctionStatus;

use crate::digest::Digest;
use crate::manifest::{FunctionManifest, FunctionRecord, ManifestError};
use crate::namespace::{Grant, Right};
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
    /// The bytes are not an image (a tar, plain or gzip'd, within [`images::MAX_IMAGE_BYTES`]).
    #[error("not an image: {0}")]
    NotImage(String),
    /// The image is named by function versions (the message names them) and is kept.
    #[error("{0}; it is kept")]
    InUse(String),
    /// The manifest names a module (or, native, an image) that was never uploaded.
    #[error(
        "{0} is not in the registry; upload it first (`htfaas fn register` uploads a module; `htfaas image push` an image)"
    )]
    UnknownModule(Digest),
    /// No such function.
    #[error("function {0:?} not found")]
    NotFound(String),
    /// The name is another owner's (the name, the owner who asked).
    #[error("function {0} belongs to another owner")]
    NotOwner(String, String),
    /// The function has no such version.
    #[error("function {0:?} has no version {1}")]
    NoSuchVersion(String, u32),
    /// SQLite failed.
    #[error("registry database: {0}")]
    Db(rusqlite::Error),
    /// A namespace grant is invalid.
    #[error("invalid grant: {0}")]
    Grant(String),
    /// Blob I/O failed.
    #[error("registry storage: {0}")]
    Io(std::io::Error),
    /// A stored record did not parse.
    #[error("corrupt registry record: {0}")]
    Corrupt(String),
    /// The owner's module uploads would pass its [`ModuleQuota`]; the message names both.
    #[error("{0}")]
    QuotaExceeded(String),
    /// The owner name a mapped identity would take is bound to another identity.
    #[error("{0}")]
    IdentityTaken(String),
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<rusqlite::Error> for RegistryError {
    fn from(e: rusqlite::Error) -> RegistryError {
        RegistryError::Db(e)
    }
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<std::io::Error> for RegistryError {
    fn from(e: std::io::Error) -> RegistryError {
        RegistryError::Io(e)
    }
}

/// How many distinct modules and images, and how many bytes of them, one owner may upload
/// ([`Registry::put_module_for`]); an admin's uploads count against none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModuleQuota {
    /// Distinct modules per owner. Default: 100.
    pub max_modules: u64,
    /// Their bytes together. Default: 1 GiB.
    pub max_bytes: u64,
}

impl Default for ModuleQuota {
    fn default() -> ModuleQuota {
        ModuleQuota { max_modules: 100, max_bytes: 1 << 30 }
    }
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
        crate::store::create_private_dir(&blob_dir)?;
        crate::store::prepare_private_db(&dir.join("registry.sqlite"))?;
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
        create_owners(&conn)?;
        images::create_tables(&conn)?;
        lifecycle::create_table(&conn)?;
        secrets::create_table(&conn)?;
        identities::create_table(&conn)?;
        // Namespace grants ([`crate::namespace`]): who may trigger on, read and write where.
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS grants (
                 principal TEXT NOT NULL, right TEXT NOT NULL, value TEXT NOT NULL,
                 granted_at INTEGER NOT NULL, PRIMARY KEY (principal, right, value));",
        )?;
        // Who uploaded which module, for the per-owner quota ([`Registry::put_module_for`]).
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS module_uploads (
                 owner TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL,
                 PRIMARY KEY (owner, digest));",
        )?;
        Ok(Registry { conn: Mutex::new(conn), blob_dir })
    }

    /// [`Registry::put_module`] for `owner`, within `quota`: a module it uploaded before is
    /// answered again at no cost; a new one is refused ([`RegistryError::QuotaExceeded`]) when
    /// it would take the owner past `quota.max_modules` modules or `quota.max_bytes` bytes.
    pub fn put_module_for(&self, owner: &str, bytes: &[u8], quota: ModuleQuota) -> Result<Digest, RegistryError> {
        let digest = Digest::of(bytes);
        self.reserve(owner, &digest, bytes.len() as u64, quota, "modules")?;
        self.put_module(bytes).inspect_err(|_| self.unreserve(owner, &digest))
    }

    /// Counts `size` bytes of `digest` against `owner`'s `quota` (`what` names the kind in the
    /// refusal), under the lock so that concurrent uploads cannot both pass; a digest the owner
    /// holds already costs nothing.
    fn reserve(
        &self,
        owner: &str,
        digest: &Digest,
        size: u64,
        quota: ModuleQuota,
        what: &str,
    ) -> Result<(), RegistryError> {
        let conn = self.conn();
        let (count, used): (i64, i64) = conn.query_row(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM module_uploads WHERE owner = ?1",
            [owner],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let known: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM module_uploads WHERE owner = ?1 AND digest = ?2)",
            params![owner, digest.as_str()],
            |r| r.get(0),
        )?;
        if known {
            return Ok(());
        }
        let (count, used) = (u64::try_from(count).unwrap_or(0), u64::try_from(used).unwrap_or(0));
        if count >= quota.max_modules {
            return Err(RegistryError::QuotaExceeded(format!(
                "owner {owner} has uploaded {count} {what}; the quota is {} (remove functions' old {what} \
                 or ask an admin)",
                quota.max_modules
            )));
        }
        if used.saturating_add(size) > quota.max_bytes {
            return Err(RegistryError::QuotaExceeded(format!(
                "owner {owner} has uploaded {used} bytes of {what}; {size} more would pass the quota of {} bytes",
                quota.max_bytes
            )));
        }
        conn.execute(
            "INSERT INTO module_uploads (owner, digest, size) VALUES (?1, ?2, ?3)",
            params![owner, digest.as_str(), i64::try_from(size).unwrap_or(i64::MAX)],
        )?;
        Ok(())
    }

    /// Takes back a [`Registry::reserve`] whose upload failed.
    fn unreserve(&self, owner: &str, digest: &Digest) {
        let _ = self
            .conn()
            .execute("DELETE FROM module_uploads WHERE owner = ?1 AND digest = ?2", params![owner, digest.as_str()]);
    }

    pub(crate) fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
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
            params![digest.as_str(), bytes.len() as i64, crate::time::now_s() as i64],
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

    /// Where `manifest`'s code is stored: its module, or for a native function its image;
    /// [`RegistryError::UnknownModule`] when it was never uploaded.
    pub fn code_path(&self, manifest: &FunctionManifest) -> Result<PathBuf, RegistryError> {
        let stored = match manifest.runtime {
            crate::manifest::RuntimeKind::Wasm => self.module_path(&manifest.module)?,
            crate::manifest::RuntimeKind::Native => self.image_path(&manifest.module)?,
        };
        stored.ok_or_else(|| RegistryError::UnknownModule(manifest.module.clone()))
    }

    /// Registers `manifest` as the next version of its name, which then fires: a pin is lifted
    /// and a deleted function lives again (a disabled one stays disabled). Registering the same
    /// manifest as the latest version again returns that version unchanged (and lifts the pin).
    pub fn register(&self, manifest: FunctionManifest) -> Result<FunctionRecord, RegistryError> {
        manifest.validate()?;
        self.code_path(&manifest)?;
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        claim(&tx, &manifest.name, &manifest.owner)?;
        secrets::check_kinds(&tx, &manifest)?;
        lifecycle::on_register(&tx, &manifest.name)?;
        if let Some(latest) = latest_in(&tx, &manifest.name)?
            && latest.manifest == manifest
        {
            tx.commit()?;
            return Ok(latest);
        }
        let version = latest_version(&tx, &manifest.name)? + 1;
        let record = FunctionRecord { schema: 1, version, registered_at: crate::time::now_s(), manifest };
        let text = serde_json::to_string(&record).map_err(|e| RegistryError::Corrupt(e.to_string()))?;
        tx.execute(
            "INSERT INTO functions (name, version, record) VALUES (?1, ?2, ?3)",
            params![record.manifest.name, version, text],
        )?;
        tx.commit()?;
        Ok(record)
    }

    /// The live version of every function not deleted (its pinned version, or the latest),
    /// disabled ones included, by name.
    pub fn list(&self) -> Result<Vec<FunctionRecord>, RegistryError> {
        Ok(self.statuses()?.into_iter().map(|s| s.record).collect())
    }

    /// The latest version of `name`, deleted or not (whose the name is).
    pub fn latest(&self, name: &str) -> Result<FunctionRecord, RegistryError> {
        latest_in(&self.conn(), name)?.ok_or_else(|| RegistryError::NotFound(name.to_owned()))
    }

    /// The owner of the name `name`, if anyone ever registered it (deleted or not).
    pub fn owner_of(&self, name: &str) -> Result<Option<String>, RegistryError> {
        owner_in(&self.conn(), name)
    }

    /// Stores a namespace grant; whether it is new (granting twice changes nothing).
    pub fn grant(&self, grant: &Grant) -> Result<bool, RegistryError> {
        grant.validate().map_err(|e| RegistryError::Grant(e.0))?;
        let n = self.conn().execute(
            "INSERT OR IGNORE INTO grants (principal, right, value, granted_at) VALUES (?1, ?2, ?3, ?4)",
            params![grant.principal, grant.right.as_str(), grant.value, crate::time::now_s() as i64],
        )?;
        Ok(n == 1)
    }

    /// Removes a namespace grant; whether there was one.
    pub fn revoke_grant(&self, grant: &Grant) -> Result<bool, RegistryError> {
        let n = self.conn().execute(
            "DELETE FROM grants WHERE principal = ?1 AND right = ?2 AND value = ?3",
            params![grant.principal, grant.right.as_str(), grant.value],
        )?;
        Ok(n == 1)
    }

    /// Every stored namespace grant, by principal, right and value.
    pub fn grants(&self) -> Result<Vec<Grant>, RegistryError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT principal, right, value FROM grants ORDER BY principal, right, value")?;
        let rows =
            stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))?;
        rows.map(|row| {
            let (principal, right, value) = row?;
            let right =
                Right::parse(&right).ok_or_else(|| RegistryError::Corrupt(format!("unknown right {right:?}")))?;
            Ok(Grant { principal, right, value })
        })
        .collect()
    }
}

/// The owners' table and the view every read of versions goes through. A registry from before
/// the table gets each name's owner from its first version; a name that holds versions of
/// other owners too (registered in a race before the claim existed) is logged, and those
/// versions are left out of every read.
fn create_owners(conn: &Connection) -> Result<(), RegistryError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS function_owners (
             name TEXT PRIMARY KEY, owner TEXT NOT NULL, claimed_at INTEGER NOT NULL);
         INSERT OR IGNORE INTO function_owners (name, owner, claimed_at)
             SELECT f.name, json_extract(f.record, '$.manifest.owner'), 0 FROM functions f
             WHERE f.version = (SELECT MIN(version) FROM functions g WHERE g.name = f.name)
               AND json_valid(f.record) AND json_extract(f.record, '$.manifest.owner') IS NOT NULL;
         CREATE VIEW IF NOT EXISTS owned_versions AS
             SELECT f.name, f.version, f.record FROM functions f JOIN function_owners o ON o.name = f.name
             WHERE json_extract(f.record, '$.manifest.owner') = o.owner;",
    )?;
    let mut stmt = conn.prepare(
        "SELECT DISTINCT f.name FROM functions f LEFT JOIN owned_versions v ON v.name = f.name AND v.version = f.version
         WHERE v.name IS NULL",
    )?;
    let mixed = stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>()?;
    if !mixed.is_empty() {
        tracing::error!(
            functions = ?mixed,
            "these names hold versions of an owner other than the name's (registered in a race by an \
             older build): those versions are never served; review them in the audit trail"
        );
    }
    Ok(())
}

/// Claims `name` for `owner` in the registration's transaction, or refuses when it is another's.
fn claim(tx: &Connection, name: &str, owner: &str) -> Result<(), RegistryError> {
    tx.execute(
        "INSERT OR IGNORE INTO function_owners (name, owner, claimed_at) VALUES (?1, ?2, ?3)",
        params![name, owner, crate::time::now_s() as i64],
    )?;
    match owner_in(tx, name)? {
        Some(o) if o == owner => Ok(()),
        _ => Err(RegistryError::NotOwner(name.to_owned(), owner.to_owned())),
    }
}

fn owner_in(conn: &Connection, name: &str) -> Result<Option<String>, RegistryError> {
    Ok(conn.query_row("SELECT owner FROM function_owners WHERE name = ?1", [name], |r| r.get(0)).optional()?)
}

fn latest_version(conn: &Connection, name: &str) -> Result<u32, RegistryError> {
    let v: Option<u32> = conn.query_row("SELECT MAX(version) FROM functions WHERE name = ?1", [name], |r| r.get(0))?;
    Ok(v.unwrap_or(0))
}

fn latest_in(conn: &Connection, name: &str) -> Result<Option<FunctionRecord>, RegistryError> {
    let text: Option<String> = conn
        .query_row("SELECT record FROM owned_versions WHERE name = ?1 ORDER BY version DESC LIMIT 1", [name], |r| {
            r.get(0)
        })
        .optional()?;
    text.map(|t| parse_record(&t)).transpose()
}

pub(crate) fn parse_record(text: &str) -> Result<FunctionRecord, RegistryError> {
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

    pub(super) fn manifest(module: Digest) -> FunctionManifest {
        FunctionManifest {
            runtime: Default::default(),
            command: Vec::new(),
            handler: false,
            retry: None,
            name: "checksum".into(),
            owner: "alice".into(),
            module,
            trigger: Trigger::on_path("/data/raw/**"),
            resources: Resources::default(),
            outputs: Outputs::into_dir("/data/checksums/"),
            args: vec![],
            env: vec![],
            annex: None,
            class: None,
            limits: Default::default(),
            group: None,
            secrets: Default::default(),
            webhook: None,
            max_concurrent: None,
            inputs: Default::default(),
            vacate_s: None,
            checkpoint: None,
        }
    }

    /// One owner cannot fill the registry's disk: past its quota of modules or
    /// bytes a new upload is refused, naming the quota; a module it uploaded before is
    /// answered again at no cost; another owner's quota is its own.
    #[test]
    fn an_owner_past_its_module_quota_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        let quota = ModuleQuota { max_modules: 2, max_bytes: 20 };
        let module = |n: u8| [b"\0asm\x01\0\0\0".as_slice(), &[n]].concat();
        reg.put_module_for("mallory", &module(1), quota).expect("first");
        reg.put_module_for("mallory", &module(2), quota).expect("second");
        reg.put_module_for("mallory", &module(1), quota).expect("the first again, free");
        let err = reg.put_module_for("mallory", &module(3), quota).expect_err("a third");
        assert_eq!(
            err.to_string(),
            "owner mallory has uploaded 2 modules; the quota is 2 (remove functions' old modules or ask an admin)"
        );
        assert!(reg.module_path(&Digest::of(&module(3))).expect("lookup").is_none(), "nothing stored");
        let err = reg.put_module_for("alice", &[b"\0asm\x01\0\0\0".as_slice(), &[0; 13]].concat(), quota);
        assert_eq!(
            err.map_err(|e| e.to_string()).expect_err("too many bytes"),
            "owner alice has uploaded 0 bytes of modules; 21 more would pass the quota of 20 bytes"
        );
        reg.put_module_for("alice", &module(3), quota).expect("alice's own quota");
    }

    /// A name is claimed by its first registration, in its transaction: of two owners
    /// registering 100 new names side by side, exactly one gets each name, and no name ever
    /// holds a version of the other.
    #[test]
    fn a_name_has_one_owner_even_when_two_register_it_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = std::sync::Arc::new(Registry::open(dir.path()).expect("open"));
        let digest = reg.put_module(WASM).expect("put");
        let racers: Vec<_> = ["alice", "mallory"]
            .into_iter()
            .map(|owner| {
                let (reg, digest) = (reg.clone(), digest.clone());
                std::thread::spawn(move || {
                    (0..100)
                        .map(|i| {
                            let m = FunctionManifest {
                                name: format!("f{i}"),
                                owner: owner.into(),
                                ..manifest(digest.clone())
                            };
                            reg.register(m).is_ok()
                        })
                        .collect::<Vec<bool>>()
                })
            })
            .collect();
        let won: Vec<Vec<bool>> = racers.into_iter().map(|t| t.join().expect("racer")).collect();
        for (i, (alice, mallory)) in won[0].iter().zip(&won[1]).enumerate() {
            assert!(alice ^ mallory, "f{i}: exactly one owner registers it");
            let owners: std::collections::BTreeSet<String> =
                reg.versions(&format!("f{i}")).expect("versions").into_iter().map(|v| v.manifest.owner).collect();
            assert_eq!(owners.len(), 1, "f{i}: {owners:?}");
        }
        let e = reg.register(manifest(digest)).map(|_| ()).and_then(|()| {
            reg.register(FunctionManifest { owner: "mallory".into(), ..manifest(Digest::of(WASM)) }).map(|_| ())
        });
        assert_eq!(e.expect_err("taken").to_string(), "function checksum belongs to another owner");
    }

    /// A registry written before names were claimed, holding a name with versions of two
    /// owners (the race of an older build): the name is its first version's owner's, and the
    /// other owner's versions are never served.
    #[test]
    fn a_name_raced_by_an_older_build_serves_only_its_first_owners_versions() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let reg = Registry::open(dir.path()).expect("open");
            let digest = reg.put_module(WASM).expect("put");
            reg.register(manifest(digest.clone())).expect("alice's v1");
            let conn = reg.conn();
            // What the older build left: mallory's v2 of alice's name, and no claim.
            let foreign = FunctionRecord {
                schema: 1,
                version: 2,
                registered_at: 0,
                manifest: FunctionManifest { owner: "mallory".into(), secrets: vec!["K".into()], ..manifest(digest) },
            };
            conn.execute(
                "INSERT INTO functions (name, version, record) VALUES ('checksum', 2, ?1)",
                [serde_json::to_string(&foreign).expect("json")],
            )
            .expect("insert");
            conn.execute_batch("DROP VIEW owned_versions; DROP TABLE function_owners;").expect("as before");
        }
        let reg = Registry::open(dir.path()).expect("reopen");
        assert_eq!(reg.owner_of("checksum").expect("owner").as_deref(), Some("alice"));
        assert_eq!(reg.latest("checksum").expect("latest").version, 1);
        assert_eq!(reg.live("checksum").expect("live").manifest.owner, "alice");
        assert_eq!(reg.versions("checksum").expect("versions").len(), 1);
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
