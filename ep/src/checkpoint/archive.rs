//! A job's `/checkpoint` as one tar file, both ways: [`pack`] writes the directory as a
//! deterministic archive (the same tree gives the same bytes, so the same sha256: how the
//! scheduler tells progress), and [`unpack`] writes an archive back into an empty directory by
//! strict rules, whatever the archive holds.
//!
//! The rules, both ways: regular files and directories only; a path is relative, made of plain
//! names (no `/` at its start, no `..`, no `.` but a leading one); no symbolic or hard link,
//! device or fifo is read from the directory or written into it; at most [`MAX_ENTRIES`]
//! entries; the archive no larger than the checkpoint's bound, and the files unpacked no more
//! than that bound either. Nothing is ever followed: files are opened with `O_NOFOLLOW`, created
//! with `O_EXCL`, and every parent is a directory this unpacking made.
//!
//! Blocking; the caller runs it off the async threads. Must not know: the network, jobs,
//! the storage.

use sha2::{Digest as _, Sha256};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Component, Path, PathBuf};

/// Most entries (files and directories) of one checkpoint.
pub(crate) const MAX_ENTRIES: u64 = 100_000;
/// Mode of the files written ([`unpack`]) and recorded ([`pack`]).
const FILE_MODE: u32 = 0o600;
/// Mode of the directories written and recorded.
const DIR_MODE: u32 = 0o700;

/// Why a checkpoint could not be packed or unpacked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ArchiveError {
    /// An entry the rules refuse (its path, or its kind).
    #[error("checkpoint entry {entry:?} refused: {why}")]
    Refused { entry: String, why: String },
    /// More entries than [`MAX_ENTRIES`].
    #[error("the checkpoint has more than {MAX_ENTRIES} entries")]
    TooManyEntries,
    /// Bigger than its bound: the archive (packing) or the files in it (unpacking).
    #[error("the checkpoint is over its bound of {max} bytes")]
    OverBound { max: u64 },
    /// The archive is no tar, or reading or writing failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> ArchiveError {
    let context = context.into();
    move |source| ArchiveError::Io { context, source }
}

/// What [`unpack`] wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unpacked {
    pub(crate) entries: u64,
    pub(crate) bytes: u64,
}

/// Writes the tar file `archive` into `dest` (made here: it must not exist), by the module's
/// rules, its files' bytes bounded by `max_bytes`. On error `dest` holds part of it: the caller
/// removes it (or leaves it to the job directory's removal).
pub(crate) fn unpack(archive: &Path, dest: &Path, max_bytes: u64) -> Result<Unpacked, ArchiveError> {
    fs::DirBuilder::new().mode(DIR_MODE).create(dest).map_err(io_error(format!("make {}", dest.display())))?;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(archive)
        .map_err(io_error("open the checkpoint"))?;
    let mut tar = tar::Archive::new(io::BufReader::new(file));
    let mut done = Unpacked::default();
    let malformed = |e| ArchiveError::Io { context: "read the checkpoint".into(), source: e };
    for entry in tar.entries().map_err(malformed)? {
        let mut entry = entry.map_err(malformed)?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let refused = |why: &str| ArchiveError::Refused { entry: name.clone(), why: why.into() };
        done.entries += 1;
        if done.entries > MAX_ENTRIES {
            return Err(ArchiveError::TooManyEntries);
        }
        let kind = entry.header().entry_type();
        // Pax headers carry attributes of the next entry (a long name): the reader applies them.
        if matches!(kind, tar::EntryType::XGlobalHeader | tar::EntryType::XHeader) {
            continue;
        }
        let path = entry.path().map_err(malformed)?.into_owned();
        let rel = relative(&path).map_err(refused)?;
        match kind {
            tar::EntryType::Directory => {
                if rel.as_os_str().is_empty() {
                    continue; // `./`: the directory itself
                }
                let full = dest.join(&rel);
                match fs::symlink_metadata(&full) {
                    Ok(meta) if meta.is_dir() => {}
                    Ok(_) => return Err(refused("a second entry at a path already taken")),
                    Err(_) => {
                        parents(dest, &rel, &name)?;
                        fs::DirBuilder::new().mode(DIR_MODE).create(&full).map_err(io_error(format!("make {name}")))?;
                    }
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if rel.as_os_str().is_empty() {
                    return Err(refused("a file with no name"));
                }
                let size = entry.size();
                done.bytes = done.bytes.saturating_add(size);
                if done.bytes > max_bytes {
                    return Err(ArchiveError::OverBound { max: max_bytes });
                }
                parents(dest, &rel, &name)?;
                let mut out = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(FILE_MODE)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(dest.join(&rel))
                    .map_err(|e| match e.kind() {
                        io::ErrorKind::AlreadyExists => refused("a second entry at a path already taken"),
                        _ => ArchiveError::Io { context: format!("create {name}"), source: e },
                    })?;
                let copied = io::copy(&mut (&mut entry).take(size), &mut out).map_err(malformed)?;
                if copied != size {
                    return Err(refused("its data is cut short"));
                }
            }
            tar::EntryType::Symlink => return Err(refused("a symbolic link")),
            tar::EntryType::Link => return Err(refused("a hard link")),
            tar::EntryType::Char | tar::EntryType::Block => return Err(refused("a device")),
            tar::EntryType::Fifo => return Err(refused("a fifo")),
            other => return Err(refused(&format!("entry type {other:?}: only files and directories"))),
        }
    }
    Ok(done)
}

/// `path` as plain names under the checkpoint directory (empty for the directory itself), or
/// why it is refused: absolute, with `..`, or with a `.` after its start.
fn relative(path: &Path) -> Result<PathBuf, &'static str> {
    let mut rel = PathBuf::new();
    for (i, c) in path.components().enumerate() {
        match c {
            Component::Normal(n) => rel.push(n),
            Component::CurDir if i == 0 => {}
            Component::RootDir | Component::Prefix(_) => return Err("an absolute path"),
            Component::ParentDir => return Err("a path with `..`"),
            Component::CurDir => return Err("a path with `.`"),
        }
    }
    Ok(rel)
}

/// Makes sure each parent of `rel` under `dest` is a real directory (making the missing ones),
/// refusing the entry when one is anything else. Blocking.
fn parents(dest: &Path, rel: &Path, name: &str) -> Result<(), ArchiveError> {
    let Some(dir) = rel.parent() else { return Ok(()) };
    let mut at = dest.to_owned();
    for c in dir.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(ArchiveError::Refused {
                    entry: name.into(),
                    why: "a parent that is not a directory".into(),
                });
            }
            Err(_) => fs::DirBuilder::new().mode(DIR_MODE).create(&at).map_err(io_error(format!("make {name}")))?,
        }
    }
    Ok(())
}

/// What [`pack`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Packed {
    /// sha256 of the archive, hex.
    pub(crate) sha256: String,
    /// Its size, bytes.
    pub(crate) bytes: u64,
    /// Entries left out (links, devices, fifos, sockets, names that are not UTF-8), one note each.
    pub(crate) skipped: Vec<String>,
}

/// Writes the tree `src` as the tar file `archive` (created or truncated), deterministically:
/// entries in byte order of their names, depth first; each directory before what it holds;
/// mode 0600 or 0700, owner 0, time 0, no user or group name. Only regular files and
/// directories go in (nothing is followed; anything else is skipped and noted). Fails once
/// the archive passes `max_bytes` ([`ArchiveError::OverBound`]) or [`MAX_ENTRIES`].
pub(crate) fn pack(src: &Path, archive: &Path, max_bytes: u64) -> Result<Packed, ArchiveError> {
    let file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(archive)
        .map_err(io_error("create the checkpoint archive"))?;
    let sink = Sink { out: io::BufWriter::with_capacity(1 << 20, file), hash: Sha256::new(), bytes: 0, max: max_bytes };
    let mut builder = tar::Builder::new(sink);
    let mut skipped = Vec::new();
    let mut entries = 0u64;
    let over = |e: io::Error, max| {
        if e.get_ref().is_some_and(|inner| inner.is::<PastBound>()) {
            ArchiveError::OverBound { max }
        } else {
            ArchiveError::Io { context: "write the checkpoint archive".into(), source: e }
        }
    };
    // (relative path, host path), popped from the end: pushed in reverse order.
    let mut pending: Vec<(String, PathBuf)> = sorted_children(src, "", &mut skipped)?.into_iter().rev().collect();
    while let Some((rel, full)) = pending.pop() {
        let meta = fs::symlink_metadata(&full).map_err(io_error(format!("inspect {rel}")))?;
        let kind = meta.file_type();
        if !(kind.is_dir() || kind.is_file()) {
            skipped.push(format!("skipped {rel:?} in /checkpoint: {}", kind_name(&kind)));
            continue;
        }
        entries += 1;
        if entries > MAX_ENTRIES {
            return Err(ArchiveError::TooManyEntries);
        }
        let mut header = tar::Header::new_gnu();
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        if kind.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(DIR_MODE);
            header.set_size(0);
            builder.append_data(&mut header, format!("{rel}/"), io::empty()).map_err(|e| over(e, max_bytes))?;
            let children = sorted_children(&full, &rel, &mut skipped)?;
            pending.extend(children.into_iter().rev());
        } else {
            let size = meta.len();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(FILE_MODE);
            header.set_size(size);
            let file = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&full)
                .map_err(io_error(format!("open {rel}")))?;
            let data = Exact { inner: file.take(size), left: size };
            builder.append_data(&mut header, &rel, data).map_err(|e| over(e, max_bytes))?;
        }
    }
    let mut sink = builder.into_inner().map_err(|e| over(e, max_bytes))?;
    sink.out.flush().map_err(io_error("write the checkpoint archive"))?;
    let Sink { hash, bytes, .. } = sink;
    Ok(Packed { sha256: hex::encode(hash.finalize()), bytes, skipped })
}

/// The entries of directory `dir` (relative paths under `prefix`), sorted by name; a name that
/// is not UTF-8 is skipped and noted (a tar path must be text to round-trip).
fn sorted_children(
    dir: &Path,
    prefix: &str,
    skipped: &mut Vec<String>,
) -> Result<Vec<(String, PathBuf)>, ArchiveError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(format!("list {}", display(prefix))))? {
        let entry = entry.map_err(io_error(format!("list {}", display(prefix))))?;
        let raw = entry.file_name();
        let Some(name) = raw.to_str() else {
            skipped.push(format!("skipped {raw:?} in /checkpoint: its name is not UTF-8"));
            continue;
        };
        let rel = if prefix.is_empty() { name.to_owned() } else { format!("{prefix}/{name}") };
        out.push((rel, entry.path()));
    }
    out.sort();
    Ok(out)
}

fn display(prefix: &str) -> &str {
    if prefix.is_empty() { "/checkpoint" } else { prefix }
}

fn kind_name(kind: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_fifo() {
        "a fifo"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a device"
    }
}

/// The marker error of a [`Sink`] past its bound.
#[derive(Debug)]
struct PastBound;

impl std::fmt::Display for PastBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the checkpoint archive is past its bound")
    }
}

impl std::error::Error for PastBound {}

/// The archive's file, hashed and counted as it is written, refusing to pass `max` bytes.
struct Sink {
    out: io::BufWriter<fs::File>,
    hash: Sha256,
    bytes: u64,
    max: u64,
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.saturating_add(buf.len() as u64) > self.max {
            return Err(io::Error::other(PastBound));
        }
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A file's bytes up to the size its header says, failing if the file is shorter (it shrank
/// since it was measured): an archive whose entry is cut short would be corrupt.
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.left > 0 && !buf.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a file shrank while it was packed"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
