//! The EP's image cache: native images (root filesystems built by mmdebstrap, shipped as tar
//! archives named by their sha256) unpacked once into `<dir>/<hex>/`, kept while their total
//! size fits, the least recently used unpinned ones removed first. Sites may publish unpacked
//! images on a shared read-only file system (`<site_dir>/<hex>/`): those are the site's, found
//! by [`ImageCache::get`] and never written nor removed.
//!
//! **What an image may contain.** An image is not trusted until unpacked: its digest is checked
//! before anything is written, then every entry is checked as it is unpacked, into a fresh
//! temporary directory and never through a symbolic link:
//! - a path is relative (after an optional `./`) and has no `..`; else the image is refused;
//! - a symbolic link with an **absolute** target is kept as it is. Real images need them: a
//!   bookworm image made by `mmdebstrap --variant=essential --include=python3-minimal` holds
//!   49 among its 204 symbolic links, the dynamic loader's own
//!   (`usr/lib64/ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/...`), `etc/alternatives/*`,
//!   `dev/fd -> /proc/self/fd` (unpacked here, it is GNU tar's tree less the device nodes and
//!   the setuid bits, and python3 runs in it under bubblewrap). They are resolved inside the
//!   sandbox, where the image is `/`;
//!   on the host nothing follows them, because the EP never writes through a link: an entry
//!   whose parent is a link (`a -> /etc`, then `a/passwd`) is refused, files are created with
//!   `O_CREAT|O_EXCL|O_NOFOLLOW`, and a second entry at a path already taken is refused (a
//!   directory entry again over a directory excepted). None of these occur in real images;
//! - a symbolic link with a relative target that climbs out of the root (`..` resolved
//!   lexically against the link's own directory) is refused (real images have none);
//! - a hard link names an earlier regular file of the image, else the image is refused;
//! - device nodes and fifos are skipped (the sandbox has its own `/dev`), and counted;
//! - modes keep their permission bits, never setuid, setgid or sticky; directories are also
//!   the EP's to write (`u+rwx`, so it can remove them); ownership is not applied: everything
//!   is the EP user's, and the guest, another uid, reads by the "other" bits as on any host;
//! - at most [`Limits::bytes`] of entry data and [`Limits::entries`] entries, and at most
//!   [`HEADER_BUDGET`] bytes of tar headers (long names, pax records) between two entries'
//!   data, counted on the decompressed stream as it is read: a small gzip inflating past a
//!   limit is stopped after writing at most the limit, and its temporary directory removed.
//!
//! The mount points a read-only root needs (`input output tmp proc dev`) are made after the
//! entries; one the image made as anything but a directory refuses the image.
//!
//! The cache directory belongs to one EP process: at open it removes the `.tmp-*` leftovers of
//! a predecessor. Every unpacked root and the cache directory itself must be searchable by the
//! jobs' uids (bubblewrap binds the root as them).
//!
//! Must not know: jobs, the link, the network, where a tar comes from.

use htfaas_functions::Digest;
use sha2::{Digest as _, Sha256};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, BufRead as _, BufReader, Read, Seek as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The directories made in every root after its entries: bubblewrap mounts over them, and
/// cannot make them in a read-only root.
pub const MOUNT_POINTS: [&str; 6] = ["input", "output", "checkpoint", "tmp", "proc", "dev"];
/// Most bytes of tar headers (long names, pax records, sparse maps) read between the data of
/// two entries; the tar reader keeps them in memory.
pub const HEADER_BUDGET: u64 = 1024 * 1024;
/// The prefix of temporary directories in the cache directory (unpacking, or being removed).
const TMP_PREFIX: &str = ".tmp-";

/// Bounds of one image, checked while it is unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of entry data. Default: 8 GiB.
    pub bytes: u64,
    /// Most entries. Default: 1,000,000.
    pub entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { bytes: 8 << 30, entries: 1_000_000 }
    }
}

/// Why an image could not be made available.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The file's bytes are not the image asked for.
    #[error("image digest mismatch: expected {expected}, the file is {actual}")]
    DigestMismatch {
        /// The digest asked for.
        expected: Digest,
        /// The digest of the file's bytes.
        actual: Digest,
    },
    /// An entry the cache refuses to unpack; nothing of the image is kept.
    #[error("image refused: entry {entry:?}: {reason}")]
    Unsafe {
        /// The entry's path as the archive spells it.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The image is past one of its [`Limits`] (or [`HEADER_BUDGET`]); nothing of it is kept.
    #[error("image too large: more than {max} {what}")]
    TooLarge {
        /// What was counted.
        what: &'static str,
        /// The limit.
        max: u64,
    },
    /// The file is not a readable tar (or gzip'd tar).
    #[error("image is not a readable tar{}: {source}", at_entry(.entry.as_deref()))]
    Malformed {
        /// The entry being read, if any.
        entry: Option<String>,
        /// What the reader said.
        #[source]
        source: io::Error,
    },
    /// The EP's own file system failed.
    #[error("image cache: {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// ` (at entry "name")`, or nothing.
fn at_entry(entry: Option<&str>) -> String {
    entry.map(|e| format!(" (at entry {e:?})")).unwrap_or_default()
}

impl ImageError {
    fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> ImageError {
        let context = context.into();
        move |source| ImageError::Io { context, source }
    }

    fn unsafe_entry(entry: &str, reason: impl Into<String>) -> ImageError {
        ImageError::Unsafe { entry: entry.to_owned(), reason: reason.into() }
    }
}

/// One available image: its root, and, for the cache's own, what eviction needs.
#[derive(Debug)]
struct Cached {
    /// The unpacked root.
    path: PathBuf,
    /// Bytes of file data in it (hard links once); 0 for a site's image.
    bytes: u64,
    /// When it was last unpacked or asked for, on the cache's own clock (larger is later).
    last_use: AtomicU64,
}

/// An unpacked image's root, pinned against eviction while this guard (or a clone) lives.
#[derive(Debug, Clone)]
pub struct ImageRoot {
    entry: Arc<Cached>,
}

impl ImageRoot {
    /// The root directory: the sandbox's read-only `/`.
    pub fn path(&self) -> &Path {
        &self.entry.path
    }
}

/// What [`unpack_into`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Unpacked {
    /// Bytes of file data written (hard links not counted again): the image's size in the cache.
    pub(crate) bytes: u64,
    /// Entries read, for the log.
    pub(crate) entries: u64,
    /// Device nodes and fifos not created, for the log.
    pub(crate) skipped: u64,
}

/// The cache's index, behind one lock.
#[derive(Debug, Default)]
struct State {
    /// The cache's own unpacked images (never the sites').
    entries: HashMap<Digest, Arc<Cached>>,
    /// The clock of `Cached::last_use`.
    clock: u64,
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

/// The EP's unpacked images, and the sites' published ones.
#[derive(Debug)]
pub struct ImageCache {
    /// Where the cache's roots are, `<dir>/<hex>/`, and its temporary directories.
    dir: PathBuf,
    /// Most bytes of the cache's own images kept (pinned ones may exceed it until unpinned).
    max_bytes: u64,
    /// Bounds of each image unpacked.
    limits: Limits,
    /// Read-only directories of site-published roots, `<site_dir>/<hex>/`, in order.
    site_dirs: Vec<PathBuf>,
    /// The index: shared by concurrent `get`s and `unpack`s, which change it in one step each.
    state: Mutex<State>,
}

impl ImageCache {
    /// Opens (or makes) the cache at `dir`, keeping at most `max_bytes` of images unpinned, with
    /// `site_dirs` searched after it. Removes leftover temporary directories, indexes the roots
    /// there (size, and last use from each root's modification time), and removes the least
    /// recently used ones past `max_bytes`.
    pub fn open(dir: PathBuf, max_bytes: u64, site_dirs: Vec<PathBuf>) -> io::Result<ImageCache> {
        // The EP's own (0700): the sandbox gets an image through the EP's binds, never by path.
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        let mut found = Vec::new();
        for item in fs::read_dir(&dir)? {
            let item = item?;
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            let meta = item.metadata()?;
            if name.starts_with(TMP_PREFIX) {
                tracing::info!(path = %item.path().display(), "removing a leftover of the image cache");
                remove_any(&item.path(), &meta)?;
                continue;
            }
            let Ok(digest) = format!("sha256:{name}").parse::<Digest>() else { continue };
            if !meta.is_dir() {
                continue;
            }
            let bytes = tree_bytes(&item.path())?;
            let used = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            found.push((used, digest, item.path(), bytes));
        }
        found.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let mut state = State::default();
        for (_, digest, path, bytes) in found {
            let last_use = AtomicU64::new(state.tick());
            state.entries.insert(digest, Arc::new(Cached { path, bytes, last_use }));
        }
        let cache = ImageCache { dir, max_bytes, limits: Limits::default(), site_dirs, state: Mutex::new(state) };
        cache.evict();
        Ok(cache)
    }

    /// The same cache with other bounds for each image unpacked from now on.
    pub fn with_limits(mut self, limits: Limits) -> ImageCache {
        self.limits = limits;
        self
    }

    /// The image `digest`, pinned: the cache's own if unpacked (its last use refreshed), else
    /// the first site directory's `<hex>/` directory; `None` if neither has it.
    pub fn get(&self, digest: &Digest) -> Option<ImageRoot> {
        if let Some(root) = self.cached(digest) {
            return Some(root);
        }
        self.site_dirs
            .iter()
            .map(|d| d.join(digest.hex()))
            .find(|p| p.is_dir())
            .map(|path| ImageRoot { entry: Arc::new(Cached { path, bytes: 0, last_use: AtomicU64::new(0) }) })
    }

    /// The digests of the cache's own images, most recently used first, at most `max` (an
    /// EP's Hello lists them so the scheduler prefers it for their jobs).
    pub fn held(&self, max: usize) -> Vec<Digest> {
        let state = self.lock();
        let mut all: Vec<(u64, &Digest)> =
            state.entries.iter().map(|(d, e)| (e.last_use.load(Ordering::Relaxed), d)).collect();
        all.sort_by(|a, b| b.cmp(a));
        all.into_iter().take(max).map(|(_, d)| d.clone()).collect()
    }

    /// Bytes of the cache's own images (the sites' not counted).
    pub fn cached_bytes(&self) -> u64 {
        self.lock().entries.values().map(|e| e.bytes).sum()
    }

    /// Makes image `digest` available from the tar (plain or gzip'd) at `tar`, and pins it.
    /// Blocking. The file must be the EP's own (not written while this runs): its bytes are
    /// checked against `digest` before anything is unpacked, then read again to unpack into a
    /// temporary directory renamed to `<dir>/<hex>/`. If the image is already in the cache,
    /// that one is given. Past `max_bytes`, the least recently used unpinned images are removed.
    pub fn unpack(&self, digest: &Digest, tar: &Path) -> Result<ImageRoot, ImageError> {
        if let Some(root) = self.cached(digest) {
            return Ok(root);
        }
        let (tmp, unpacked) = self.unpack_to_temp(digest, tar)?;
        let root = self.install(digest, &tmp, unpacked)?;
        self.evict();
        Ok(root)
    }

    /// Checks the digest of the file at `tar` and unpacks it into a new temporary directory:
    /// that directory and what was unpacked. On error nothing is left.
    fn unpack_to_temp(&self, digest: &Digest, tar: &Path) -> Result<(PathBuf, Unpacked), ImageError> {
        let mut file = fs::File::open(tar).map_err(ImageError::io(format!("open {}", tar.display())))?;
        let actual = hash(&mut file).map_err(ImageError::io(format!("read {}", tar.display())))?;
        if actual != *digest {
            return Err(ImageError::DigestMismatch { expected: digest.clone(), actual });
        }
        file.rewind().map_err(ImageError::io(format!("rewind {}", tar.display())))?;
        let tmp = self.dir.join(format!("{TMP_PREFIX}{:016x}", rand::random::<u64>()));
        fs::DirBuilder::new().mode(0o700).create(&tmp).map_err(ImageError::io(format!("make {}", tmp.display())))?;
        let unpacked = open_archive(file)
            .map_err(|source| ImageError::Malformed { entry: None, source })
            .and_then(|stream| unpack_into(&tmp, stream, self.limits))
            .and_then(|unpacked| {
                // Searchable by the jobs' uids, now that it is whole.
                fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
                    .map_err(ImageError::io(format!("open up {}", tmp.display())))?;
                Ok(unpacked)
            });
        match unpacked {
            Ok(u) => Ok((tmp, u)),
            Err(e) => {
                remove_quietly(&tmp);
                Err(e)
            }
        }
    }

    /// Renames the unpacked temporary directory `tmp` to image `digest`'s root and indexes it,
    /// pinned; if another unpack of the same image got there first, removes `tmp` and gives
    /// that one.
    fn install(&self, digest: &Digest, tmp: &Path, unpacked: Unpacked) -> Result<ImageRoot, ImageError> {
        let final_path = self.dir.join(digest.hex());
        let mut state = self.lock();
        if let Some(existing) = state.entries.get(digest).cloned() {
            drop(state);
            remove_quietly(tmp);
            return Ok(self.touch(existing));
        }
        if let Err(source) = fs::rename(tmp, &final_path) {
            drop(state);
            remove_quietly(tmp);
            return Err(ImageError::Io { context: format!("rename into {}", final_path.display()), source });
        }
        let last_use = AtomicU64::new(state.tick());
        let entry = Arc::new(Cached { path: final_path, bytes: unpacked.bytes, last_use });
        state.entries.insert(digest.clone(), entry.clone());
        drop(state);
        tracing::info!(
            image.digest = digest.short(),
            bytes = unpacked.bytes,
            entries = unpacked.entries,
            skipped = unpacked.skipped,
            "image unpacked"
        );
        Ok(ImageRoot { entry })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves the index consistent (each change is
        // one insert or remove), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cache's own image `digest`, pinned, its last use refreshed.
    fn cached(&self, digest: &Digest) -> Option<ImageRoot> {
        let entry = self.lock().entries.get(digest).cloned()?;
        Some(self.touch(entry))
    }

    /// Marks `entry` used now (in memory, and on disk for the next open), pinned.
    fn touch(&self, entry: Arc<Cached>) -> ImageRoot {
        entry.last_use.store(self.lock().tick(), Ordering::Relaxed);
        // Best effort: only the order after a restart depends on it.
        if let Ok(f) = fs::File::open(&entry.path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        ImageRoot { entry }
    }

    /// Removes the least recently used unpinned images while the cache's own exceed
    /// `max_bytes`: each is renamed to a temporary name under the lock (so no crash leaves half
    /// an image under its digest), then deleted.
    fn evict(&self) {
        let mut doomed = Vec::new();
        {
            let mut state = self.lock();
            let mut total: u64 = state.entries.values().map(|e| e.bytes).sum();
            let mut candidates: Vec<(u64, Digest)> = state
                .entries
                .iter()
                .filter(|(_, e)| Arc::strong_count(e) == 1)
                .map(|(d, e)| (e.last_use.load(Ordering::Relaxed), d.clone()))
                .collect();
            candidates.sort();
            for (_, digest) in candidates {
                if total <= self.max_bytes {
                    break;
                }
                let Some(entry) = state.entries.get(&digest) else { continue };
                let grave = self.dir.join(format!("{TMP_PREFIX}evict-{:016x}", rand::random::<u64>()));
                match fs::rename(&entry.path, &grave) {
                    Ok(()) => {
                        total = total.saturating_sub(entry.bytes);
                        tracing::info!(image.digest = digest.short(), bytes = entry.bytes, "image evicted");
                        state.entries.remove(&digest);
                        doomed.push(grave);
                    }
                    Err(e) => tracing::warn!(path = %entry.path.display(), "failed to evict an image: {e}"),
                }
            }
        }
        for grave in doomed {
            remove_quietly(&grave);
        }
    }
}

/// The sha256 of what `file` holds from where it is, streamed.
fn hash(file: &mut fs::File) -> io::Result<Digest> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(Digest::from_hasher(hasher));
        }
        hasher.update(&buf[..n]);
    }
}

/// The tar stream of `file`: gunzipped if it starts with gzip's magic bytes.
fn open_archive(file: fs::File) -> io::Result<Box<dyn Read>> {
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let gzip = reader.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzip { Box::new(flate2::bufread::MultiGzDecoder::new(reader)) } else { Box::new(reader) })
}

/// How far the tar reader may read in the decompressed stream, moved on by [`unpack_into`]
/// as each entry's size becomes known.
#[derive(Debug, Default)]
struct Budget {
    /// Bytes handed to the tar reader so far.
    pos: Cell<u64>,
    /// The position it may not read past.
    end: Cell<u64>,
    /// Whether it tried to.
    exceeded: Cell<bool>,
}

/// The decompressed stream, cut at its [`Budget`].
struct Bounded<R> {
    /// The decompressed stream.
    inner: R,
    /// Shared with [`unpack_into`], which moves its end.
    budget: Rc<Budget>,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = self.budget.end.get().saturating_sub(self.budget.pos.get());
        if room == 0 && !buf.is_empty() {
            self.budget.exceeded.set(true);
            return Err(io::Error::other("image stream past its budget"));
        }
        let want = usize::try_from(room).unwrap_or(usize::MAX).min(buf.len());
        let n = self.inner.read(&mut buf[..want])?;
        self.budget.pos.set(self.budget.pos.get() + n as u64);
        Ok(n)
    }
}

/// Unpacks the tar `stream` into the empty directory `root` by the rules of this module's
/// documentation, then makes the [`MOUNT_POINTS`]. On error `root` holds part of the image:
/// the caller removes it.
pub(crate) fn unpack_into(root: &Path, stream: impl Read, limits: Limits) -> Result<Unpacked, ImageError> {
    let budget = Rc::new(Budget { end: Cell::new(HEADER_BUDGET), ..Budget::default() });
    let mut archive = tar::Archive::new(Bounded { inner: stream, budget: budget.clone() });
    let read_error = |entry: Option<&str>, source: io::Error| {
        if budget.exceeded.get() {
            ImageError::TooLarge { what: "bytes of tar headers between two entries", max: HEADER_BUDGET }
        } else {
            ImageError::Malformed { entry: entry.map(str::to_owned), source }
        }
    };
    let mut writer = Writer { root, dirs: HashSet::new(), files: HashSet::new(), done: Unpacked::default() };
    for entry in archive.entries().map_err(|e| read_error(None, e))? {
        let mut entry = entry.map_err(|e| read_error(None, e))?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        writer.done.entries += 1;
        if writer.done.entries > limits.entries {
            return Err(ImageError::TooLarge { what: "entries", max: limits.entries });
        }
        // Every entry's data counts, even one not written: the reader skips it all the same.
        let size = entry.size();
        let total = writer.done.bytes.saturating_add(size);
        if total > limits.bytes {
            return Err(ImageError::TooLarge { what: "bytes unpacked", max: limits.bytes });
        }
        // Its data, the padding to a block, and the next entry's headers.
        budget.end.set(budget.pos.get().saturating_add(size).saturating_add(511).saturating_add(HEADER_BUDGET));
        writer.entry(&name, &mut entry).map_err(|e| match e {
            ImageError::Malformed { entry, source } => read_error(entry.as_deref(), source),
            e => e,
        })?;
    }
    for point in MOUNT_POINTS {
        let path = root.join(point);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(ImageError::unsafe_entry(point, "a mount point must be a directory")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::DirBuilder::new().mode(0o755).create(&path).map_err(ImageError::io(format!("make /{point}")))?;
            }
            Err(e) => return Err(ImageError::Io { context: format!("inspect /{point}"), source: e }),
        }
    }
    Ok(writer.done)
}

/// Writes one image's entries under `root`, never through a symbolic link.
struct Writer<'a> {
    /// The temporary root everything is written under.
    root: &'a Path,
    /// Directories known to be real ones (relative paths): each is checked once.
    dirs: HashSet<PathBuf>,
    /// Regular files written so far (relative paths): what a hard link may name.
    files: HashSet<PathBuf>,
    /// What was done so far, and the bounds' counters.
    done: Unpacked,
}

impl Writer<'_> {
    fn entry<R: Read>(&mut self, name: &str, entry: &mut tar::Entry<'_, R>) -> Result<(), ImageError> {
        let malformed = |source| ImageError::Malformed { entry: Some(name.to_owned()), source };
        let path = entry.path().map_err(malformed)?;
        let rel = relative(&path).map_err(|reason| ImageError::unsafe_entry(name, reason))?;
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().map_err(malformed)? & 0o777;
        if rel.as_os_str().is_empty() {
            // The root itself (`./`): it stays as the cache made it.
            return match kind {
                tar::EntryType::Directory => Ok(()),
                _ => Err(ImageError::unsafe_entry(name, "only a directory may be the image's root")),
            };
        }
        match kind {
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                self.done.skipped += 1;
                return Ok(());
            }
            // Pax global headers carry no file.
            tar::EntryType::XGlobalHeader => return Ok(()),
            _ => {}
        }
        self.parents(name, &rel)?;
        let full = self.root.join(&rel);
        let exists = fs::symlink_metadata(&full);
        if let Ok(meta) = &exists
            && !(kind == tar::EntryType::Directory && meta.is_dir())
        {
            return Err(ImageError::unsafe_entry(name, "a second entry at a path already taken"));
        }
        match kind {
            tar::EntryType::Directory => {
                if exists.is_err() {
                    fs::DirBuilder::new().mode(0o700).create(&full).map_err(ImageError::io(format!("make {name}")))?;
                }
                fs::set_permissions(&full, fs::Permissions::from_mode(mode | 0o700))
                    .map_err(ImageError::io(format!("set the mode of {name}")))?;
                self.dirs.insert(rel);
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&full)
                    .map_err(ImageError::io(format!("create {name}")))?;
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = entry.read(&mut buf).map_err(malformed)?;
                    if n == 0 {
                        break;
                    }
                    file.write_all(&buf[..n]).map_err(ImageError::io(format!("write {name}")))?;
                    self.done.bytes += n as u64;
                }
                file.set_permissions(fs::Permissions::from_mode(mode))
                    .map_err(ImageError::io(format!("set the mode of {name}")))?;
                self.files.insert(rel);
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(malformed)?
                    .ok_or_else(|| ImageError::unsafe_entry(name, "a symbolic link without a target"))?;
                if target.as_os_str().is_empty() {
                    return Err(ImageError::unsafe_entry(name, "a symbolic link without a target"));
                }
                if !target.is_absolute() && climbs_out(&rel, &target) {
                    return Err(ImageError::unsafe_entry(
                        name,
                        format!("a symbolic link out of the image (to {})", target.display()),
                    ));
                }
                std::os::unix::fs::symlink(&target, &full).map_err(ImageError::io(format!("make link {name}")))?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(malformed)?
                    .ok_or_else(|| ImageError::unsafe_entry(name, "a hard link without a target"))?;
                let to = relative(&target).ok().filter(|t| self.files.contains(t)).ok_or_else(|| {
                    ImageError::unsafe_entry(
                        name,
                        format!("a hard link to {}, not an earlier file of the image", target.display()),
                    )
                })?;
                fs::hard_link(self.root.join(&to), &full).map_err(ImageError::io(format!("link {name}")))?;
            }
            other => {
                return Err(ImageError::unsafe_entry(name, format!("entry type {other:?} is not supported")));
            }
        }
        Ok(())
    }

    /// Makes sure every parent of `rel` is a real directory, making the missing ones; refuses
    /// the entry if one is a symbolic link or anything else.
    fn parents(&mut self, name: &str, rel: &Path) -> Result<(), ImageError> {
        let mut parent = PathBuf::new();
        let Some(dir) = rel.parent() else { return Ok(()) };
        for c in dir.components() {
            parent.push(c);
            if self.dirs.contains(&parent) {
                continue;
            }
            let full = self.root.join(&parent);
            match fs::symlink_metadata(&full) {
                Ok(meta) if meta.is_dir() => {}
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(ImageError::unsafe_entry(
                        name,
                        format!("its parent {} is a symbolic link", parent.display()),
                    ));
                }
                Ok(_) => {
                    return Err(ImageError::unsafe_entry(
                        name,
                        format!("its parent {} is not a directory", parent.display()),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::DirBuilder::new()
                        .mode(0o755)
                        .create(&full)
                        .map_err(ImageError::io(format!("make {}", parent.display())))?;
                }
                Err(e) => return Err(ImageError::Io { context: format!("inspect {}", parent.display()), source: e }),
            }
            self.dirs.insert(parent.clone());
        }
        Ok(())
    }
}

/// `path` as a path below the root, `.` components dropped; `Err` says why it is none.
fn relative(path: &Path) -> Result<PathBuf, &'static str> {
    let mut rel = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => rel.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err("a path with `..`"),
            Component::RootDir | Component::Prefix(_) => return Err("an absolute path"),
        }
    }
    Ok(rel)
}

/// Whether the relative symbolic link target `target` of the link at `link` (relative to the
/// root) climbs above the root, resolving `..` lexically from the link's directory.
fn climbs_out(link: &Path, target: &Path) -> bool {
    let mut depth = link.parent().map_or(0, |p| p.components().count());
    for c in target.components() {
        match c {
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return true,
            },
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return true,
        }
    }
    false
}

/// Bytes of file data under `root` (hard links once), not following links.
fn tree_bytes(root: &Path) -> io::Result<u64> {
    let mut bytes = 0u64;
    let mut seen = HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for item in fs::read_dir(&dir)? {
            let item = item?;
            let meta = item.metadata()?;
            if meta.is_dir() {
                stack.push(item.path());
            } else if meta.is_file() && (meta.nlink() == 1 || seen.insert((meta.dev(), meta.ino()))) {
                bytes += meta.len();
            }
        }
    }
    Ok(bytes)
}

/// Removes `path` (a directory tree or a file, never following a link).
fn remove_any(path: &Path, meta: &fs::Metadata) -> io::Result<()> {
    if meta.is_dir() { fs::remove_dir_all(path) } else { fs::remove_file(path) }
}

/// Removes the directory tree `path`; a failure is logged (it is removed at the next open).
fn remove_quietly(path: &Path) {
    if let Err(e) = fs::remove_dir_all(path) {
        tracing::warn!(path = %path.display(), "failed to remove a temporary image directory: {e}");
    }
}

#[cfg(test)]
mod tests;
