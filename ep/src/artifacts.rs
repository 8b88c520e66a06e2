//! Compiled artifacts on disk: `<cache_dir>/<digest hex>.<engine tag>.cwasm`, each tagged
//! with this EP's key so only its own, for this very engine, is ever deserialized (see the
//! "Artifacts on disk" part of [`crate::runtime`]'s docs).
//!
//! Below the runtime: it stores and verifies bytes; it must not know about guests' runs,
//! jobs or the network.

use crate::code::{Code, GuestKind};
use hmac::{Hmac, Mac};
use htfaas_functions::Digest;
use rand::RngCore as _;
use sha2::Sha256;
use std::fs::{self, File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use wasmtime::component::Component;
use wasmtime::{Engine, Module};

/// First bytes of every artifact file: names the format and its version.
pub const ARTIFACT_MAGIC: &[u8; 8] = b"htfcwsm1";
/// Length of the HMAC-SHA256 tag after the magic.
const TAG_LEN: usize = 32;
/// Magic plus tag.
const ARTIFACT_HEADER: usize = ARTIFACT_MAGIC.len() + TAG_LEN;
/// Larger files are refused unread: no module this EP accepts compiles to that much.
const MAX_ARTIFACT_BYTES: u64 = 1 << 30;
/// What the tag is about, so the key can never vouch for anything else.
const TAG_DOMAIN: &[u8] = b"htfaas-ep compiled artifact v1\0";
/// Length of the cache key, bytes.
const KEY_LEN: usize = 32;
/// Temporary files older than this, left by a crash mid-write, are removed at start.
const STALE_TMP: Duration = Duration::from_secs(3600);

/// `<dir>/<digest hex>.<engine tag>.cwasm` files tagged with `<dir>/key`; see the module docs.
pub(crate) struct ArtifactCache {
    dir: PathBuf,
    /// [`RuntimeOptions::max_disk_artifacts`](crate::RuntimeOptions::max_disk_artifacts).
    max_artifacts: usize,
    key: [u8; KEY_LEN],
    /// This engine's [`Engine::precompile_compatibility_hash`], as the bytes it hashes.
    engine_id: Vec<u8>,
    /// 16 hex digits naming this engine configuration in file names, so EPs with different
    /// engines (fuel or not, another wasmtime) can share a directory without evicting each
    /// other's artifacts.
    engine_tag: String,
}

/// Artifact bytes whose tag verified: the only input [`deserialize_verified`] takes.
pub(crate) struct VerifiedArtifact {
    file: Vec<u8>,
}

impl VerifiedArtifact {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.file[ARTIFACT_HEADER..]
    }
}

/// Collects what a [`std::hash::Hash`] impl feeds, so the engine's compatibility hash can be
/// put under the tag as is (no hasher whose algorithm might change between Rust releases).
pub(crate) struct HashBytes(Vec<u8>);

impl std::hash::Hasher for HashBytes {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn finish(&self) -> u64 {
        0
    }
}

impl ArtifactCache {
    /// Creates `dir` (0700) if needed, reads or makes its key, and removes stale temporary files.
    pub(crate) fn open(dir: &Path, engine: &Engine, max_artifacts: usize) -> anyhow::Result<ArtifactCache> {
        use anyhow::Context as _;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("create the artifact cache {}", dir.display()))?;
        let key = load_or_make_key(dir).with_context(|| format!("key of the artifact cache {}", dir.display()))?;
        let mut id = HashBytes(Vec::new());
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut id);
        remove_stale_tmp(dir);
        let engine_tag = hex::encode(&<Sha256 as sha2::Digest>::digest(&id.0)[..8]);
        Ok(ArtifactCache { dir: dir.to_owned(), max_artifacts: max_artifacts.max(1), key, engine_id: id.0, engine_tag })
    }

    pub(crate) fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.{}.cwasm", digest.hex(), self.engine_tag))
    }

    /// The MAC of an artifact of `digest` for this engine, before finalisation.
    fn mac(&self, digest: &Digest, artifact: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(TAG_DOMAIN);
        for part in [digest.as_str().as_bytes(), &self.engine_id, artifact] {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac
    }

    /// The artifact for `digest`: `Ok(None)` when there is none, `Err(why)` when there is one
    /// but it must not be used. The file is read whole before the check, so what is checked is
    /// what gets deserialized.
    pub(crate) fn read(&self, digest: &Digest) -> Result<Option<VerifiedArtifact>, ArtifactUnfit> {
        let file = match File::open(self.path(digest)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ArtifactUnfit::Open(e)),
        };
        let len = file.metadata().map_err(ArtifactUnfit::Stat)?.len();
        if len > MAX_ARTIFACT_BYTES {
            return Err(ArtifactUnfit::TooLarge(len));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        file.take(MAX_ARTIFACT_BYTES).read_to_end(&mut bytes).map_err(ArtifactUnfit::Read)?;
        if bytes.len() < ARTIFACT_HEADER || !bytes.starts_with(ARTIFACT_MAGIC) {
            return Err(ArtifactUnfit::NoHeader);
        }
        let (tag, artifact) = bytes[ARTIFACT_MAGIC.len()..].split_at(TAG_LEN);
        if self.mac(digest, artifact).verify_slice(tag).is_err() {
            return Err(ArtifactUnfit::BadTag);
        }
        Ok(Some(VerifiedArtifact { file: bytes }))
    }

    /// Writes the artifact for `digest` with its tag: temporary file, fsync, rename, fsync dir.
    pub(crate) fn write(&self, digest: &Digest, artifact: &[u8]) -> std::io::Result<()> {
        let tag = self.mac(digest, artifact).finalize().into_bytes();
        let mut file = Vec::with_capacity(ARTIFACT_HEADER + artifact.len());
        file.extend_from_slice(ARTIFACT_MAGIC);
        file.extend_from_slice(&tag);
        file.extend_from_slice(artifact);
        write_atomically(&self.dir, &self.path(digest), &file)?;
        self.trim();
        Ok(())
    }

    /// Deletes the oldest artifacts past
    /// [`RuntimeOptions::max_disk_artifacts`](crate::RuntimeOptions::max_disk_artifacts); failures
    /// are logged (a full cache only costs disk).
    pub(crate) fn trim(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else { return };
        let mut artifacts: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if artifacts.len() <= self.max_artifacts {
            return;
        }
        artifacts.sort();
        let excess = artifacts.len() - self.max_artifacts;
        for (_, path) in artifacts.into_iter().take(excess) {
            match fs::remove_file(&path) {
                Ok(()) => tracing::debug!(path = %path.display(), "deleted an old compiled artifact (cache full)"),
                Err(e) => tracing::warn!(path = %path.display(), "failed to delete an old compiled artifact: {e}"),
            }
        }
    }
}

/// Turns verified artifact bytes into a module or component (`kind` comes from the wasm bytes,
/// whose digest the tag covers; wasmtime refuses an artifact of the other kind).
#[allow(unsafe_code)]
pub(crate) fn deserialize_verified(
    engine: &Engine,
    artifact: &VerifiedArtifact,
    kind: GuestKind,
) -> wasmtime::Result<Code> {
    // SAFETY: `Module::deserialize` maps the bytes as machine code, so they must be an artifact
    // wasmtime itself produced for a compatible engine. A `VerifiedArtifact` carries an
    // HMAC-SHA256 tag over (digest, this engine's precompile-compatibility hash, these bytes)
    // under this cache's secret key, which only this EP holds (0600): so this EP serialized
    // exactly these bytes with an engine configured like this one. The bytes were read into
    // memory before the check, so nothing changed them in between. wasmtime also checks its own
    // header (version, target, flags) and refuses a mismatch with an error.
    unsafe {
        match kind {
            GuestKind::Module => Module::deserialize(engine, artifact.bytes()).map(Code::Module),
            GuestKind::Component => Component::deserialize(engine, artifact.bytes()).map(Code::Component),
        }
    }
}

/// The cache key in `<dir>/key`, made (random, 0600) when missing. A key file that is not 32
/// bytes, or that others may read or write, is replaced, which retires every artifact made with it.
pub(crate) fn load_or_make_key(dir: &Path) -> anyhow::Result<[u8; KEY_LEN]> {
    use anyhow::Context as _;
    let path = dir.join("key");
    let replace = match read_key(&path) {
        Ok(Some(key)) => return Ok(key),
        Ok(None) => false,
        Err(why) => {
            tracing::warn!(path = %path.display(), "replacing the artifact cache key (cached artifacts will be compiled again): {why}");
            true
        }
    };
    let mut key = [0u8; KEY_LEN];
    rand::rngs::OsRng.try_fill_bytes(&mut key).context("draw a random key")?;
    let tmp = tmp_path(dir, "key");
    let made = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(&key)?;
        f.sync_all()?;
        if replace { fs::rename(&tmp, &path) } else { fs::hard_link(&tmp, &path) }
    })();
    let _ = fs::remove_file(&tmp);
    match made {
        Ok(()) => {
            sync_dir(dir);
            Ok(key)
        }
        // Another runtime on the same directory made it first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match read_key(&path) {
            Ok(Some(key)) => Ok(key),
            Ok(None) => anyhow::bail!("{} vanished while being created", path.display()),
            Err(why) => anyhow::bail!("{}: {why}", path.display()),
        },
        Err(e) => Err(e).with_context(|| format!("write {}", path.display())),
    }
}

/// Why a cached artifact is not used ([`ArtifactCache::read`]); the cause of an I/O error is
/// shown in the message, so it is not also returned as the source.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ArtifactUnfit {
    /// The file is there but could not be opened.
    #[error("open: {0}")]
    Open(std::io::Error),
    /// Its size could not be read.
    #[error("stat: {0}")]
    Stat(std::io::Error),
    /// It is larger than any artifact this EP writes (its size, bytes).
    #[error("{0} bytes, more than any artifact this EP writes")]
    TooLarge(u64),
    /// It could not be read.
    #[error("read: {0}")]
    Read(std::io::Error),
    /// It does not start with the artifact header.
    #[error("not an htfaas artifact (no header)")]
    NoHeader,
    /// Its tag does not verify under this EP's key and engine.
    #[error("its tag does not verify (modified, truncated, written with another key or for another engine)")]
    BadTag,
}

/// Why the key file is present but unfit ([`read_key`]); the cause of an I/O error is shown in
/// the message, so it is not also returned as the source.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyUnfit {
    /// Its metadata could not be read.
    #[error("stat: {0}")]
    Stat(std::io::Error),
    /// It is not a regular file (a directory, a symbolic link…).
    #[error("not a regular file")]
    NotAFile,
    /// Others than its owner may read or write it (its permission bits).
    #[error("mode {0:o} lets others at it")]
    Mode(u32),
    /// It could not be read.
    #[error("read: {0}")]
    Read(std::io::Error),
    /// It is not [`KEY_LEN`] bytes long (its length).
    #[error("{0} bytes, want {KEY_LEN}")]
    Length(usize),
}

/// The key at `path`: `Ok(None)` if absent, `Err(why)` if present but unfit.
pub(crate) fn read_key(path: &Path) -> Result<Option<[u8; KEY_LEN]>, KeyUnfit> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(KeyUnfit::Stat(e)),
    };
    if !meta.is_file() {
        return Err(KeyUnfit::NotAFile);
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyUnfit::Mode(mode));
    }
    let bytes = fs::read(path).map_err(KeyUnfit::Read)?;
    let len = bytes.len();
    bytes.try_into().map(Some).map_err(|_| KeyUnfit::Length(len))
}

/// A fresh temporary name in `dir` for a file that will become `name`.
pub(crate) fn tmp_path(dir: &Path, name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{name}.tmp-{}-{n}", std::process::id()))
}

/// Writes `bytes` to `path` so that readers see the old file or the whole new one, never part.
pub(crate) fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("artifact");
    let tmp = tmp_path(dir, name);
    let written = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    sync_dir(dir);
    Ok(())
}

/// Makes a rename in `dir` durable; a failure only costs durability, so it is logged.
pub(crate) fn sync_dir(dir: &Path) {
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        tracing::debug!(dir = %dir.display(), "failed to fsync the directory: {e}");
    }
}

/// Removes `*.tmp-*` files older than [`STALE_TMP`] (a crash mid-write leaves them).
pub(crate) fn remove_stale_tmp(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let stale = entry.file_name().to_str().is_some_and(|n| n.contains(".tmp-"))
            && entry
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP);
        if stale {
            let _ = fs::remove_file(entry.path());
        }
    }
}
