//! The namespace on disk: mapping clean [`NsPath`]s under the data directory, without ever
//! leaving it.
//!
//! Paths are already free of `.`/`..` ([`crate::paths`]); what remains is symlinks. Reads
//! canonicalize the target and refuse anything that resolves outside the (canonical) data
//! directory, then open the canonical path with `O_NOFOLLOW`. Writes walk the parent
//! directories one by one, creating missing ones and refusing symlinks that lead outside; the
//! file itself is written to a temporary name in the final directory and renamed into place
//! (a symlink at the target is replaced, never followed). Only this process writes the data
//! directory and it never creates symlinks, so the check-then-open window is not exploitable
//! by clients; an administrator's symlinks inside the tree are followed when they stay inside.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

use crate::error::HttpError;
use crate::paths::NsPath;

fn outside(p: &NsPath) -> HttpError {
    HttpError::Forbidden(format!("{} resolves outside the served namespace", p.as_str()))
}

fn internal(what: &str, e: std::io::Error) -> HttpError {
    tracing::error!("failed to {what}: {e}");
    HttpError::Internal(what.to_owned())
}

/// `root/a/b` for `/a/b` (lexically; no symlinks resolved).
fn lexical(root: &Path, p: &NsPath) -> PathBuf {
    let mut out = root.to_path_buf();
    out.extend(p.segments());
    out
}

/// What a GET serves: a small file read whole, or an open file and its length.
pub enum Opened {
    /// The whole file, of at most the asked-for bytes.
    Whole(bytes::Bytes),
    /// The open file (to stream) and its length.
    File(tokio::fs::File, u64),
}

/// Opens an existing regular file for reading, and reads it whole when it holds at most
/// `small` bytes: resolving, opening, checking and reading in one call off the async threads
/// (each `tokio::fs` call is a hand-off of its own). With `sha256`, also the sha256 of what it
/// holds, streamed through once from the very descriptor then served (so a file replaced by a
/// `PUT` meanwhile cannot give one file's digest with another's bytes).
pub async fn read(root: &Path, p: &NsPath, small: u64, sha256: bool) -> Result<(Opened, Option<[u8; 32]>), HttpError> {
    let (root, p) = (root.to_owned(), p.clone());
    blocking(move || {
        use std::io::{Read as _, Seek as _};
        let (mut file, len) = open_read_blocking(&root, &p)?;
        if len > small {
            let mut digest = None;
            if sha256 {
                digest = Some(match kept_sha256(&file, len) {
                    Some(kept) => kept,
                    None => {
                        let d = hash(&mut file, len).map_err(|e| internal("read a file", e))?;
                        file.rewind().map_err(|e| internal("rewind a file", e))?;
                        keep_sha256(&file, len, &d);
                        d
                    }
                });
            }
            return Ok((Opened::File(tokio::fs::File::from_std(file), len), digest));
        }
        let mut whole = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        file.take(small).read_to_end(&mut whole).map_err(|e| internal("read a file", e))?;
        let digest: Option<[u8; 32]> = sha256.then(|| sha2::Sha256::digest(&whole).into());
        Ok((Opened::Whole(bytes::Bytes::from(whole)), digest))
    })
    .await
}

/// The extended attribute that keeps a large file's sha256 once a `Want-Digest` asked for it:
/// its length, modification time and digest. Uploads replace a file by a rename (a new inode,
/// without it), so it is never another file's; the length and time guard against a change
/// made beside this server.
pub const SHA256_XATTR: &str = "user.htfaas.sha256";

/// What [`SHA256_XATTR`] holds for `file` of `len` bytes with `digest`: length (8 bytes),
/// modification time (seconds, 8; nanoseconds, 4), digest (32), little-endian.
fn sha256_record(file: &std::fs::File, len: u64, digest: &[u8; 32]) -> Option<Vec<u8>> {
    let modified = file.metadata().ok()?.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
    let mut v = Vec::with_capacity(52);
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&modified.as_secs().to_le_bytes());
    v.extend_from_slice(&modified.subsec_nanos().to_le_bytes());
    v.extend_from_slice(digest);
    Some(v)
}

/// The sha256 kept on `file` ([`SHA256_XATTR`]) when it still describes the file as it is
/// (`len` bytes, the same modification time). Blocking.
fn kept_sha256(file: &std::fs::File, len: u64) -> Option<[u8; 32]> {
    let mut buf = [0u8; 64];
    let n = rustix::fs::fgetxattr(file, SHA256_XATTR, &mut buf[..]).ok()?;
    let kept = buf.get(..n)?;
    let digest: [u8; 32] = kept.get(20..52)?.try_into().ok()?;
    (n == 52 && sha256_record(file, len, &digest).as_deref() == Some(kept)).then_some(digest)
}

/// Keeps `digest` on `file` for the next `Want-Digest` ([`SHA256_XATTR`]); a file system
/// without user extended attributes keeps nothing (the digest is computed each time). Blocking.
fn keep_sha256(file: &std::fs::File, len: u64, digest: &[u8; 32]) {
    let Some(record) = sha256_record(file, len, digest) else { return };
    if let Err(e) = rustix::fs::fsetxattr(file, SHA256_XATTR, &record, rustix::fs::XattrFlags::empty()) {
        tracing::debug!("cannot keep a file's sha256: {e}");
    }
}

/// The sha256 of the first `len` bytes of `file`, read from where it is. Blocking.
fn hash(file: &mut std::fs::File, len: u64) -> std::io::Result<[u8; 32]> {
    use std::io::Read as _;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = file.take(len);
    loop {
        let n = left.read(&mut buf)?;
        if n == 0 {
            return Ok(hasher.finalize().into());
        }
        hasher.update(&buf[..n]);
    }
}

/// Runs `f` (file system calls) off the async threads, in one hand-off.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, HttpError> + Send + 'static,
) -> Result<T, HttpError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| HttpError::Internal(format!("file system task: {e}")))?
}

/// Opens an existing regular file for reading. Blocking.
fn open_read_blocking(root: &Path, p: &NsPath) -> Result<(std::fs::File, u64), HttpError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let not_found = || HttpError::NotFound(format!("{} does not exist", p.as_str()));
    let real = match std::fs::canonicalize(lexical(root, p)) {
        Ok(r) => r,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => return Err(not_found()),
        Err(e) => return Err(internal("resolve a path", e)),
    };
    if !real.starts_with(root) {
        return Err(outside(p));
    }
    let file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&real) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(not_found()),
        Err(e) => return Err(internal("open a file", e)),
    };
    let meta = file.metadata().map_err(|e| internal("stat a file", e))?;
    if !meta.is_file() {
        return Err(HttpError::NotFound(format!("{} is not a regular file", p.as_str())));
    }
    Ok((file, meta.len()))
}

/// Where a PUT writes.
#[derive(Debug)]
pub struct Target {
    /// Canonical directory the file goes into.
    pub dir: PathBuf,
    /// Final path (`dir/<name>`).
    pub path: PathBuf,
    /// File name.
    pub name: String,
    /// Whether something (file or symlink) is already there.
    pub exists: bool,
}

/// Resolves the parent directory of `p` inside `root`; with `create`, missing directories are
/// made. Without `create`, a missing parent gives `Ok(None)`. In one call off the async threads.
pub async fn target(root: &Path, p: &NsPath, create: bool) -> Result<Option<Target>, HttpError> {
    let (root, p) = (root.to_owned(), p.clone());
    blocking(move || target_blocking(&root, &p, create)).await
}

/// [`target`], blocking.
fn target_blocking(root: &Path, p: &NsPath, create: bool) -> Result<Option<Target>, HttpError> {
    let Some((dir, name)) = parent_blocking(root, p, create)? else { return Ok(None) };
    let path = dir.join(&name);
    let exists = match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => return Err(HttpError::Conflict(format!("{} is a directory", p.as_str()))),
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::NotFound => false,
        Err(e) => return Err(internal("inspect a file", e)),
    };
    Ok(Some(Target { dir, path, name, exists }))
}

/// The canonical directory `p`'s last segment is in, and that segment: the parent directories
/// walked one by one inside `root`, a symlink among them followed only when it stays inside;
/// with `create`, missing ones are made, without, a missing one gives `Ok(None)`. Blocking.
fn parent_blocking(root: &Path, p: &NsPath, create: bool) -> Result<Option<(PathBuf, String)>, HttpError> {
    let segs: Vec<&str> = p.segments().collect();
    let Some((name, dirs)) = segs.split_last() else {
        return Err(HttpError::BadRequest("a file path is needed, not /".into()));
    };
    let mut dir = root.to_path_buf();
    for seg in dirs {
        let next = dir.join(seg);
        match std::fs::symlink_metadata(&next) {
            Ok(m) if m.is_dir() => dir = next,
            Ok(m) if m.file_type().is_symlink() => {
                let real = std::fs::canonicalize(&next).map_err(|_| outside(p))?;
                if !real.starts_with(root) || !real.is_dir() {
                    return Err(outside(p));
                }
                dir = real;
            }
            Ok(_) => return Err(HttpError::Conflict(format!("a parent of {} is a file", p.as_str()))),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if !create {
                    return Ok(None);
                }
                match std::fs::create_dir(&next) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::AlreadyExists && next.is_dir() => {}
                    Err(e) => return Err(crate::error::io_error("create a directory", p.as_str(), &e)),
                }
                dir = next;
            }
            Err(e) => return Err(internal("inspect a directory", e)),
        }
    }
    Ok(Some((dir, (*name).to_owned())))
}

/// What a removal found at its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// A file (or a symlink, removed itself, never followed).
    File,
    /// An empty directory.
    Dir,
}

/// Removes what is at `p`: a file or a symlink (the link, never its target), or an empty
/// directory; a directory with entries is refused (409), as dCache's WebDAV door does, so one
/// request never removes a tree. The parent directories are walked as for a write (a symlink
/// leading outside is refused), the root is never removed, and the parent is fsynced when
/// `fsync`. In one call off the async threads.
pub async fn remove(root: &Path, p: &NsPath, fsync: bool) -> Result<Removed, HttpError> {
    if p.is_root() {
        return Err(HttpError::Forbidden("the root directory is never removed".into()));
    }
    let (root, p) = (root.to_owned(), p.clone());
    blocking(move || {
        let missing = || HttpError::NotFound(format!("{} does not exist", p.as_str()));
        let Some((dir, name)) = parent_blocking(&root, &p, false)? else { return Err(missing()) };
        let path = dir.join(name);
        let removed = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => match std::fs::remove_dir(&path) {
                Ok(()) => Removed::Dir,
                Err(e) if e.kind() == ErrorKind::DirectoryNotEmpty => {
                    return Err(HttpError::Conflict(format!("{} is a directory that is not empty", p.as_str())));
                }
                Err(e) if e.kind() == ErrorKind::NotFound => return Err(missing()),
                Err(e) => return Err(internal("remove a directory", e)),
            },
            Ok(_) => match std::fs::remove_file(&path) {
                Ok(()) => Removed::File,
                Err(e) if e.kind() == ErrorKind::NotFound => return Err(missing()),
                Err(e) => return Err(internal("remove a file", e)),
            },
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(missing()),
            Err(e) => return Err(internal("inspect a file", e)),
        };
        if fsync {
            sync_dir_blocking(&dir)?;
        }
        Ok(removed)
    })
    .await
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name (one segment).
    pub name: String,
    /// Whether it is a directory.
    pub dir: bool,
    /// Bytes (0 for a directory).
    pub size: u64,
    /// Last modification, Unix seconds.
    pub mtime_s: u64,
}

/// Whether `name` is a PUT's temporary file (`.<name>.upload-<32 hex>`), not yet a file.
fn is_upload_in_progress(name: &str) -> bool {
    name.starts_with('.')
        && name
            .rsplit_once(".upload-")
            .is_some_and(|(_, id)| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Removes, under `root`, every PUT's temporary file last written before `before`: an upload a
/// killed storage process left behind (this process's own uploads are all newer). Symbolic
/// links are not followed. Returns how many were removed; a file it cannot remove is logged.
pub fn remove_stale_uploads(root: &Path, before: std::time::SystemTime) -> usize {
    let mut removed = 0;
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                dirs.push(entry.path());
                continue;
            }
            let stale = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t < before);
            if kind.is_file() && stale && is_upload_in_progress(&entry.file_name().to_string_lossy()) {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => removed += 1,
                    Err(e) => tracing::warn!(path = %entry.path().display(), "cannot remove a stale upload: {e}"),
                }
            }
        }
    }
    removed
}

/// The directory at `p` and its entries: regular files and directories, not symlinks (a
/// listing shows what is there, and a link's target may be anything) nor uploads in progress.
/// At most `max` entries; `Ok(None)` when `p` is no directory.
pub async fn list_dir(root: &Path, p: &NsPath, max: usize) -> Result<Option<(Entry, Vec<Entry>)>, HttpError> {
    let real = match tokio::fs::canonicalize(lexical(root, p)).await {
        Ok(r) => r,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => return Ok(None),
        Err(e) => return Err(internal("resolve a path", e)),
    };
    if !real.starts_with(root) {
        return Err(outside(p));
    }
    let entry = |name: String, m: &std::fs::Metadata| Entry {
        name,
        dir: m.is_dir(),
        size: if m.is_dir() { 0 } else { m.len() },
        mtime_s: m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs()),
    };
    let meta = tokio::fs::metadata(&real).await.map_err(|e| internal("stat a directory", e))?;
    if !meta.is_dir() {
        return Ok(None);
    }
    let this = entry(p.segments().last().unwrap_or_default().to_owned(), &meta);
    let mut read = tokio::fs::read_dir(&real).await.map_err(|e| internal("read a directory", e))?;
    let mut entries = Vec::new();
    while let Some(e) = read.next_entry().await.map_err(|e| internal("read a directory", e))? {
        let Ok(name) = e.file_name().into_string() else { continue };
        let Ok(m) = tokio::fs::symlink_metadata(e.path()).await else { continue };
        if !(m.is_file() || m.is_dir()) || is_upload_in_progress(&name) {
            continue;
        }
        if entries.len() >= max {
            return Err(HttpError::TooLarge(format!("{} holds more than {max} entries", p.as_str())));
        }
        entries.push(entry(name, &m));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some((this, entries)))
}

/// Whether a file (or symlink) exists at `p`, without creating anything, and the writer scope
/// recorded on it ([`WRITER_SCOPE_XATTR`]) when it is a file that has one: in one walk, in one
/// call off the async threads.
pub async fn existing(root: &Path, p: &NsPath) -> Result<(bool, Option<String>), HttpError> {
    let (root, p) = (root.to_owned(), p.clone());
    blocking(move || {
        let Some(t) = target_blocking(&root, &p, false)? else { return Ok((false, None)) };
        Ok((t.exists, if t.exists { scope_of(&t.path) } else { None }))
    })
    .await
}

/// The extended attribute that records the writer of a file: the issuer's writer of the
/// macaroon that wrote it and that macaroon's path scope ([`crate::auth::writer_identity`]: a
/// function's runs as one principal, and its output directory). A macaroon of the same writer
/// and scope may rewrite the file with `UPLOAD` alone (a job's rerun, or a later run of the
/// same function as the same principal); any other replacement needs `DELETE` (see
/// `routes::put`). A file written before writers were recorded has only a scope (an older
/// attribute) and needs `DELETE`.
pub const WRITER_SCOPE_XATTR: &str = "user.htfaas.writer";

/// The writer scope recorded on the file at `path`, if it has one. Blocking.
fn scope_of(path: &Path) -> Option<String> {
    let mut buf = [0u8; 8192];
    // Not following a symlink: a link has no scope of its own, so replacing it needs DELETE.
    match rustix::fs::lgetxattr(path, WRITER_SCOPE_XATTR, &mut buf[..]) {
        Ok(n) => std::str::from_utf8(buf.get(..n).unwrap_or_default()).ok().map(str::to_owned),
        Err(_) => None,
    }
}

/// Stores `body` at `p` in one call off the async threads: the parent directories made, a new
/// temporary file written (and fsynced when `fsync`), `writer` recorded on it, renamed into
/// place (the directory fsynced when `fsync`), as a streamed upload does in several. The
/// temporary file is removed on failure. Returns the target.
pub async fn store_whole(
    root: &Path,
    p: &NsPath,
    body: bytes::Bytes,
    writer: Option<String>,
    fsync: bool,
) -> Result<Target, HttpError> {
    use std::io::Write as _;
    let (root, p) = (root.to_owned(), p.clone());
    blocking(move || {
        let target =
            target_blocking(&root, &p, true)?.ok_or_else(|| HttpError::Internal("parent directory vanished".into()))?;
        let tmp = target.dir.join(upload_name(&target.name));
        let io = |what: &str, e: &std::io::Error| crate::error::io_error(what, p.as_str(), e);
        let written = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(|e| io("create the upload file", &e))?;
            file.write_all(&body).map_err(|e| io("write the upload file", &e))?;
            if fsync {
                file.sync_all().map_err(|e| io("sync the upload file", &e))?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            discard_upload(&tmp);
            return Err(e);
        }
        place_upload(&tmp, &target, p.as_str(), writer.as_deref(), fsync)?;
        Ok(target)
    })
    .await
}

/// Puts the upload written at `tmp` (of the namespace path `p`) in place at `target`: records
/// `writer` on it, renames it into place and, with `fsync`, syncs the directory; a rename that
/// fails removes `tmp`. In one call off the async threads.
pub async fn place(
    tmp: PathBuf,
    target: Target,
    p: &NsPath,
    writer: Option<String>,
    fsync: bool,
) -> Result<(), HttpError> {
    let p = p.clone();
    blocking(move || place_upload(&tmp, &target, p.as_str(), writer.as_deref(), fsync)).await
}

/// [`place`], blocking.
fn place_upload(tmp: &Path, target: &Target, p: &str, writer: Option<&str>, fsync: bool) -> Result<(), HttpError> {
    if let Some(writer) = writer {
        set_writer_scope(tmp, writer);
    }
    if let Err(e) = std::fs::rename(tmp, &target.path) {
        discard_upload(tmp);
        return Err(crate::error::io_error("rename the upload into place", p, &e));
    }
    if fsync {
        sync_dir_blocking(&target.dir)?;
    }
    Ok(())
}

/// Removes an upload's temporary file that is not going into place (a failure to is logged).
/// Blocking.
pub fn discard_upload(tmp: &Path) {
    if let Err(rm) = std::fs::remove_file(tmp)
        && rm.kind() != ErrorKind::NotFound
    {
        tracing::warn!("failed to remove {}: {rm}", tmp.display());
    }
}

/// The temporary name an upload of `name` is written under in its directory
/// (`.<name>.upload-<uuid>`, which [`remove_stale_uploads`] knows).
pub fn upload_name(name: &str) -> String {
    format!(".{name}.upload-{}", uuid::Uuid::new_v4().simple())
}

/// Records `scope` (a writer identity) as the writer of the (not yet renamed) upload at `tmp`. A file system
/// without user extended attributes records nothing (the file then needs `DELETE` to be
/// replaced, as in dCache).
fn set_writer_scope(tmp: &Path, scope: &str) {
    if let Err(e) = rustix::fs::setxattr(tmp, WRITER_SCOPE_XATTR, scope.as_bytes(), rustix::fs::XattrFlags::empty()) {
        tracing::warn!("cannot record the writer scope of {}: {e}", tmp.display());
    }
}

/// fsyncs a directory so a rename into it is durable. Blocking.
fn sync_dir_blocking(dir: &Path) -> Result<(), HttpError> {
    let d = std::fs::File::open(dir).map_err(|e| internal("open a directory", e))?;
    d.sync_all().map_err(|e| internal("sync a directory", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large file's sha256 is computed once and kept beside it; what is kept is used while
    /// the file is as it was, and computed again once it changed.
    #[tokio::test]
    async fn a_large_files_sha256_is_kept_and_used_while_the_file_is_unchanged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("data/big.dat");
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        let bytes = vec![7u8; 200_000];
        std::fs::write(&path, &bytes).expect("write");
        let p = NsPath::parse("/data/big.dat").expect("path");
        let (_, first) = read(dir.path(), &p, 1024, true).await.expect("read");
        let want: [u8; 32] = sha2::Sha256::digest(&bytes).into();
        assert_eq!(first, Some(want));
        let file = std::fs::File::open(&path).expect("open");
        if kept_sha256(&file, bytes.len() as u64).is_none() {
            return; // no user extended attributes here: nothing is kept, nothing to test
        }
        // What is kept is what is served: a record altered to another digest is believed...
        let other = [9u8; 32];
        keep_sha256(&file, bytes.len() as u64, &other);
        assert_eq!(read(dir.path(), &p, 1024, true).await.expect("read").1, Some(other), "the kept one");
        // ...until the file changes: then it is computed again.
        std::fs::write(&path, vec![8u8; 200_001]).expect("rewrite in place");
        let want: [u8; 32] = sha2::Sha256::digest(vec![8u8; 200_001]).into();
        assert_eq!(read(dir.path(), &p, 1024, true).await.expect("read").1, Some(want), "computed again");
    }

    /// An upload a killed process left is removed at the next start; a file, an upload of the
    /// running process (newer than its start) and a name that only looks alike are kept.
    #[test]
    fn stale_uploads_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = dir.path().join("data/out");
        std::fs::create_dir_all(&sub).expect("dirs");
        let stale = sub.join(format!(".a.dat.upload-{}", "0".repeat(32)));
        std::fs::write(&stale, "partial").expect("stale");
        std::fs::write(sub.join("a.dat"), "whole").expect("file");
        std::fs::write(sub.join(".b.upload-short"), "kept").expect("look-alike");
        let started = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
        assert_eq!(remove_stale_uploads(dir.path(), started), 1);
        assert!(!stale.exists() && sub.join("a.dat").exists() && sub.join(".b.upload-short").exists());
        std::fs::write(&stale, "this process's").expect("fresh");
        assert_eq!(remove_stale_uploads(dir.path(), std::time::SystemTime::UNIX_EPOCH), 0, "newer than the start");
        assert!(stale.exists());
    }
}
