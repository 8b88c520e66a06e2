//! The annexes' records: one small JSON file next to the job store
//! ([`crate::Config::annex_file`]), read once at start and rewritten whole on every change —
//! written to a temporary file, fsynced, renamed over the old one, and the directory fsynced —
//! before the change is visible or answered. Mode 0600, though it holds no credential (an
//! annex's attach token is named by its `jti`, never kept).
//!
//! Why a file of its own and not a table of the job store: annexes change a few times in their
//! life (create, a batch job recorded, extend, delete), while the job store's writer is the
//! scheduler's hot path with a versioned schema of its own; a record's every reader here is
//! the scheduler (the gateway and `htfaas annex list` ask it over HTTP), so one writer, the
//! lock below, is enough.
//!
//! Stored format: `{"version": 1, "annexes": [AnnexRecord, …]}`; a file of another version is
//! refused at start, never rewritten.
//!
//! Layer: a store. Must not know: axum, EP sessions, tokens, `Shared`.

use htfaas_functions::proto::AnnexRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Version of the stored format.
pub const ANNEX_FILE_VERSION: u32 = 1;

/// Why the annexes' file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum AnnexStoreError {
    /// Reading or writing the file failed.
    #[error("annex records {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The file is not what this build writes.
    #[error("annex records {path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredFile {
    version: u32,
    annexes: Vec<AnnexRecord>,
}

/// The records, in memory and on disk; cheap to clone.
#[derive(Clone, Debug)]
pub struct AnnexStore {
    path: PathBuf,
    /// What the file holds: readers take it briefly, never across a write.
    records: Arc<Mutex<Arc<BTreeMap<String, AnnexRecord>>>>,
    /// One change at a time, from reading the records to swapping in the written ones.
    writer: Arc<tokio::sync::Mutex<()>>,
}

impl AnnexStore {
    /// Reads `path` (none yet: no annex).
    pub fn open(path: &Path) -> Result<AnnexStore, AnnexStoreError> {
        let records = match std::fs::read(path) {
            Ok(bytes) => {
                let stored: StoredFile = serde_json::from_slice(&bytes)
                    .map_err(|e| AnnexStoreError::Format { path: path.to_owned(), reason: e.to_string() })?;
                if stored.version != ANNEX_FILE_VERSION {
                    return Err(AnnexStoreError::Format {
                        path: path.to_owned(),
                        reason: format!(
                            "version {} (this build reads version {ANNEX_FILE_VERSION}): written by a newer build?",
                            stored.version
                        ),
                    });
                }
                stored.annexes.into_iter().map(|r| (r.name.clone(), r)).collect()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => return Err(AnnexStoreError::Io { path: path.to_owned(), source }),
        };
        Ok(AnnexStore {
            path: path.to_owned(),
            records: Arc::new(Mutex::new(Arc::new(records))),
            writer: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    fn snapshot(&self) -> Arc<BTreeMap<String, AnnexRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The record of annex `name`.
    pub fn get(&self, name: &str) -> Option<AnnexRecord> {
        self.snapshot().get(name).cloned()
    }

    /// Every record, by name.
    pub fn list(&self) -> Vec<AnnexRecord> {
        self.snapshot().values().cloned().collect()
    }

    /// Changes the record of `name`: `change` gets it (or `None`) and answers what it becomes
    /// (`None`: removed) and what to return. The new records are on disk before anyone sees
    /// them; an error of `change` changes nothing.
    pub async fn change<T, E: From<AnnexStoreError>>(
        &self,
        name: &str,
        change: impl FnOnce(Option<AnnexRecord>) -> Result<(Option<AnnexRecord>, T), E>,
    ) -> Result<T, E> {
        let _one = self.writer.lock().await;
        let mut records = (*self.snapshot()).clone();
        let (new, out) = change(records.get(name).cloned())?;
        match new {
            Some(r) => records.insert(name.to_owned(), r),
            None => records.remove(name),
        };
        let stored = StoredFile { version: ANNEX_FILE_VERSION, annexes: records.values().cloned().collect() };
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &stored))
            .await
            .map_err(|e| AnnexStoreError::Io { path: self.path.clone(), source: std::io::Error::other(e) })??;
        *self.records.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(records);
        Ok(out)
    }
}

/// `stored` to `path`: a temporary file beside it (0600), fsynced, renamed over it, the
/// directory fsynced.
fn write_atomically(path: &Path, stored: &StoredFile) -> Result<(), AnnexStoreError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| AnnexStoreError::Io { path: path.to_owned(), source };
    let bytes = serde_json::to_vec_pretty(stored).map_err(|e| io(std::io::Error::other(e)))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "annexes".into())
    ));
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::proto::AnnexState;

    fn record(name: &str) -> AnnexRecord {
        AnnexRecord {
            name: name.into(),
            owner: "alice".into(),
            provider: "slurm".into(),
            count: 1,
            cpus: 1,
            memory_mb: 512,
            idle_shutdown_s: Some(60),
            partition: None,
            created_ms: 1,
            ends_ms: 2,
            drain_s: 30,
            token_jti: "j".into(),
            token_exp_ms: 3,
            state: AnnexState::Active,
            jobs: vec!["7".into()],
        }
    }

    #[tokio::test]
    async fn records_survive_a_reopen_and_a_failed_change_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("annexes.json");
        let store = AnnexStore::open(&path).expect("open empty");
        assert!(store.list().is_empty());
        store.change::<_, AnnexStoreError>("a", |_| Ok((Some(record("a")), ()))).await.expect("insert");
        store.change::<_, AnnexStoreError>("b", |_| Ok((Some(record("b")), ()))).await.expect("insert");
        let refused: Result<(), AnnexStoreError> =
            store.change("a", |_| Err(AnnexStoreError::Format { path: path.clone(), reason: "no".into() })).await;
        assert!(refused.is_err());
        store.change::<_, AnnexStoreError>("b", |_| Ok((None, ()))).await.expect("remove");
        let again = AnnexStore::open(&path).expect("reopen");
        assert_eq!(again.list(), vec![record("a")]);
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_file_of_another_version_or_garbage_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("annexes.json");
        std::fs::write(&path, r#"{"version": 2, "annexes": []}"#).expect("write");
        let e = AnnexStore::open(&path).expect_err("newer");
        assert!(e.to_string().contains("version 2"), "{e}");
        std::fs::write(&path, "{").expect("write");
        assert!(AnnexStore::open(&path).is_err());
    }
}
