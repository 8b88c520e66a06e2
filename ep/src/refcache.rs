//! The EP's cache of reference files by content ([`RefCache`]): `work_dir/refs/<sha256 hex>`,
//! each one a hard link of a file a job downloaded, named by the sha256 the EP computed over the
//! bytes it received, and linked into a later job's `/input/ref/…` instead of fetching the same
//! bytes again. Bounded in bytes (the EP's `ref_cache_mb`), the least recently
//! used going first (a hit sets the file's modification time, which orders the files found
//! again after a restart).
//!
//! A cached file is never written again: it is made read-only (0444) before it is linked in,
//! the directory is the EP's own (0700), and the job directories it is linked into are emptied
//! by unlinking (`scratch`), never by truncating a file with other links. A file found here
//! by a new EP process is hashed once before it is served, so a file changed while the EP was
//! down is dropped, never handed out under a name it does not hash to.
//!
//! Leaf: it links files by a digest it is given. Which digest to believe, and whether a job may
//! read the bytes at all, is its caller's (`refs`); must not know: jobs, the network, the
//! storage.

use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Prefix of a link being put in place: never a sha256 hex, so `open` removes any left over.
const TMP_PREFIX: &str = ".tmp-";

/// The EP's reference files by content, shared by its jobs. Every method blocks (file system
/// calls): call it off the async threads.
#[derive(Debug)]
pub(crate) struct RefCache {
    /// `work_dir/refs`: `<sha256 hex>` files, and links on their way in.
    dir: PathBuf,
    /// Most bytes kept; a file larger than it is never kept.
    max_bytes: u64,
    /// The index; every change of the directory happens under it, so the two agree.
    state: Mutex<State>,
}

/// The index of what the directory holds.
#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// The clock of [`Entry::last_use`].
    clock: u64,
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn total(&self) -> u64 {
        self.entries.values().map(|e| e.bytes).sum()
    }
}

#[derive(Debug)]
struct Entry {
    bytes: u64,
    /// When it was last kept or served, on [`State::clock`].
    last_use: u64,
    /// Its bytes hash to its name: kept by this process, or hashed since it was found.
    checked: bool,
}

impl RefCache {
    /// The cache at `dir` keeping at most `max_bytes`, or `None` when `max_bytes` is 0 (off).
    /// Makes `dir` (0700); indexes the files found there, ordered by modification time, and
    /// removes anything else (links a crash left on their way in); then removes the least
    /// recently used past `max_bytes`.
    pub(crate) fn open(dir: PathBuf, max_bytes: u64) -> io::Result<Option<RefCache>> {
        if max_bytes == 0 {
            return Ok(None);
        }
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let mut found = Vec::new();
        for item in std::fs::read_dir(&dir)? {
            let item = item?;
            let meta = std::fs::symlink_metadata(item.path())?;
            match item.file_name().to_str() {
                Some(name) if is_sha256_hex(name) && meta.is_file() => {
                    let used = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                    found.push((used, name.to_owned(), meta.len()));
                }
                _ if meta.is_dir() => std::fs::remove_dir_all(item.path())?,
                _ => std::fs::remove_file(item.path())?,
            }
        }
        found.sort();
        let mut state = State::default();
        for (_, name, bytes) in found {
            let last_use = state.tick();
            state.entries.insert(name, Entry { bytes, last_use, checked: false });
        }
        let cache = RefCache { dir, max_bytes, state: Mutex::new(state) };
        cache.evict(&mut cache.lock());
        Ok(Some(cache))
    }

    /// Links the cached file of content `sha256` at `dest` (replacing what is there by
    /// unlinking it) and marks it used: its size, or `None` when the cache does not hold those
    /// bytes (then `dest` is left as it was).
    pub(crate) fn link(&self, sha256: &str, dest: &Path) -> io::Result<Option<u64>> {
        let Some(mut entry) = self.lock().entries.get(sha256).map(|e| (e.bytes, e.checked)) else {
            return Ok(None);
        };
        let path = self.dir.join(sha256);
        if !entry.1 {
            // Found by this process, not kept by it: hashed once, outside the lock.
            let hashed = hash_file(&path);
            let mut state = self.lock();
            match hashed {
                Ok((hex, bytes)) if hex == sha256 => {
                    if let Some(e) = state.entries.get_mut(sha256) {
                        (e.bytes, e.checked) = (bytes, true);
                    }
                    entry = (bytes, true);
                }
                _ => {
                    tracing::warn!(path = %path.display(), "a cached reference file does not hash to its name; removed");
                    self.forget(&mut state, sha256);
                    return Ok(None);
                }
            }
        }
        let mut state = self.lock();
        if !state.entries.contains_key(sha256) {
            return Ok(None);
        }
        unlink(dest)?;
        match std::fs::hard_link(&path, dest) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && !path.exists() => {
                tracing::warn!(path = %path.display(), "a cached reference file is gone; forgotten");
                self.forget(&mut state, sha256);
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        let tick = state.tick();
        if let Some(e) = state.entries.get_mut(sha256) {
            e.last_use = tick;
        }
        drop(state);
        // Best effort: only the order after a restart depends on it.
        if let Ok(f) = std::fs::File::open(&path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        Ok(Some(entry.0))
    }

    /// Keeps `file` (a regular file the EP wrote, `sha256` being the hash the EP computed over
    /// its bytes) as the cached copy of that content: made read-only, then hard-linked in.
    /// `false` when it is not kept: larger than the cache, not a regular file, or a name that
    /// is no sha256. Content already held is only marked used. Past the bound, the least
    /// recently used files go.
    pub(crate) fn keep(&self, sha256: &str, file: &Path) -> io::Result<bool> {
        let meta = std::fs::symlink_metadata(file)?;
        if !is_sha256_hex(sha256) || !meta.is_file() || meta.len() > self.max_bytes {
            return Ok(false);
        }
        // One inode under two names from here on: the job's and the cache's.
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o444))?;
        let mut state = self.lock();
        let tick = state.tick();
        if let Some(e) = state.entries.get_mut(sha256) {
            e.last_use = tick;
            return Ok(true);
        }
        let tmp = self.dir.join(format!("{TMP_PREFIX}{:016x}", rand::random::<u64>()));
        std::fs::hard_link(file, &tmp)?;
        if let Err(e) = std::fs::rename(&tmp, self.dir.join(sha256)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        state.entries.insert(sha256.to_owned(), Entry { bytes: meta.len(), last_use: tick, checked: true });
        self.evict(&mut state);
        Ok(true)
    }

    /// Bytes held.
    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.lock().total()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Each change is one insert or remove with its file: a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes the least recently used files while the cache holds more than `max_bytes`.
    fn evict(&self, state: &mut State) {
        let mut total = state.total();
        if total <= self.max_bytes {
            return;
        }
        let mut by_use: Vec<(u64, String)> = state.entries.iter().map(|(k, e)| (e.last_use, k.clone())).collect();
        by_use.sort();
        for (_, sha256) in by_use {
            if total <= self.max_bytes {
                break;
            }
            total = total.saturating_sub(state.entries.get(&sha256).map_or(0, |e| e.bytes));
            self.forget(state, &sha256);
        }
    }

    /// Drops `sha256` from the index and the directory (a job's link to it stays whole).
    fn forget(&self, state: &mut State, sha256: &str) {
        state.entries.remove(sha256);
        if let Err(e) = unlink(&self.dir.join(sha256)) {
            tracing::warn!("failed to remove cached reference file {sha256}: {e}");
        }
    }
}

/// Removes the name `path` (not followed if a link); nothing there is fine. Blocking.
pub(crate) fn unlink(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// 64 lowercase hex digits: a sha256 as the EP writes it, and the only names the cache holds.
fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The sha256 hex of the file at `path` and its length, streamed.
fn hash_file(path: &Path) -> io::Result<(String, u64)> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut len = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok((hex::encode(hasher.finalize()), len));
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
}

#[cfg(test)]
mod tests;
