//! A running job's scratch: how many files and bytes its `/output` and scratch may hold, the
//! watcher that stops the guest when it goes past them, and the job directories kept emptied
//! for the next job ([`SpareDirs`]).
//!
//! Below the job: it measures directories; it must not know about transfers or the link.

use crate::config::Settings;
use crate::runtime::CancelSignal;
use htfaas_functions::proto::{JobAssignment, Outcome};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the scratch watcher walks a running job's `/output`.
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(100);

/// The limits a job's scratch directory is held to: the EP's settings, each narrowed by what
/// the job asks for (`limits` of its assignment, `disk_mb` of its resources).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScratchLimits {
    /// [`Settings::max_output_files`] or the job's `max_output_files`, the lower: entries of
    /// any kind anywhere under `/output`.
    pub(crate) max_files: usize,
    /// [`Settings::max_output_bytes`] or the job's `max_output_bytes`, the lower: bytes of
    /// regular files under `/output`.
    pub(crate) max_output_bytes: u64,
    /// [`Settings::max_scratch_bytes`] or the job's `disk_mb`, the lower: input plus outputs
    /// (plus `/checkpoint`, for a job that keeps checkpoints).
    pub(crate) max_scratch_bytes: Option<u64>,
    /// The input's size (it is read-only to the guest).
    pub(crate) input_bytes: u64,
}

/// The lower of two optional bounds (`None`: unbounded).
fn lower<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What a walk of `/output` found; it stops counting once past the file limit.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Measured {
    entries: usize,
    bytes: u64,
    /// Bytes of regular files under `/checkpoint`: they count against the scratch bound only.
    checkpoint_bytes: u64,
}

/// Most entries of `/checkpoint` a watcher's walk counts (the checkpoint's own bound on
/// entries refuses more when it is stored).
const CHECKPOINT_WALK_ENTRIES: usize = 100_000;

impl Measured {
    /// Whether the walk found no entry at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

impl ScratchLimits {
    /// The bounds of `job` on this EP; `input_bytes` is set once the input is in.
    pub(crate) fn for_job(s: &Settings, job: &JobAssignment) -> ScratchLimits {
        let asked_files = job.limits.max_output_files.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let asked_disk = (job.resources.disk_mb > 0).then(|| job.resources.disk_mb.saturating_mul(1 << 20));
        ScratchLimits {
            max_files: lower(Some(s.max_output_files), asked_files).unwrap_or(s.max_output_files),
            max_output_bytes: lower(Some(s.max_output_bytes), job.limits.max_output_bytes)
                .unwrap_or(s.max_output_bytes),
            max_scratch_bytes: lower(s.max_scratch_bytes, asked_disk),
            input_bytes: 0,
        }
    }

    /// Why `m` is past a limit, if it is.
    pub(crate) fn exceeded(&self, m: Measured) -> Option<String> {
        if m.entries > self.max_files {
            return Some(format!(
                "more than {} files and directories in /output, past the output file limit of {}",
                self.max_files, self.max_files
            ));
        }
        if m.bytes > self.max_output_bytes {
            return Some(format!(
                "at least {} output bytes, more than the output byte limit of {}",
                m.bytes, self.max_output_bytes
            ));
        }
        let total = self.input_bytes.saturating_add(m.bytes).saturating_add(m.checkpoint_bytes);
        let what = if m.checkpoint_bytes > 0 { "input, outputs and /checkpoint" } else { "input and outputs" };
        match self.max_scratch_bytes {
            Some(max) if total > max => {
                Some(format!("{what} hold at least {total} bytes, more than the scratch limit of {max} bytes"))
            }
            _ => None,
        }
    }

    /// Walks `dir` (and `checkpoint`, the job's `/checkpoint` if it has one) once, off the async
    /// threads, and says why it is past a limit, if it is.
    pub(crate) async fn check_now(&self, dir: &Path, checkpoint: Option<&Path>) -> Option<String> {
        let (dir, checkpoint, max_files) = (dir.to_owned(), checkpoint.map(Path::to_owned), self.max_files);
        let walk = move || {
            let mut m = measure(&dir, max_files)?;
            if let Some(c) = checkpoint {
                m.checkpoint_bytes = measure(&c, CHECKPOINT_WALK_ENTRIES)?.bytes;
            }
            Ok(m)
        };
        let measured = tokio::task::spawn_blocking(walk)
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(format!("output measuring task failed: {e}"))));
        self.judge(&measured)
    }

    /// Why `measured` is past a limit, if it is; a walk that failed is logged and passes (the
    /// upload lists the outputs again and fails on its own).
    pub(crate) fn judge(&self, measured: &std::io::Result<Measured>) -> Option<String> {
        match measured {
            Ok(m) => self.exceeded(*m),
            Err(e) => {
                tracing::warn!("failed to measure the job's outputs: {e}");
                None
            }
        }
    }
}

/// Entries (any kind, any depth; symlinks not followed) and regular-file bytes under `dir`,
/// stopping once past `max_entries`, so a guest's flood of files keeps the walk short.
/// Blocking.
pub(crate) fn measure(dir: &Path, max_entries: usize) -> std::io::Result<Measured> {
    let mut m = Measured::default();
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            m.entries += 1;
            if m.entries > max_entries {
                return Ok(m);
            }
            // DirEntry::metadata does not follow symlinks.
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // removed meanwhile
                Err(e) => return Err(e),
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() {
                m.bytes = m.bytes.saturating_add(meta.len());
            }
        }
    }
    Ok(m)
}

/// Watches a running guest: forwards the job's cancel to `stop` (returning `None`), and stops
/// the guest through `stop` once its scratch (`output_dir`, and `checkpoint_dir` when it has
/// one) passes a limit (returning why). Checks every
/// [`WATCH_EVERY`]; never returns otherwise. Cancel-safe.
pub(crate) async fn watch_scratch(
    limits: ScratchLimits,
    output_dir: PathBuf,
    checkpoint_dir: Option<PathBuf>,
    cancel: &CancelSignal,
    stop: &CancelSignal,
) -> Option<String> {
    // The first walk one period in: a guest that just started has written nothing yet, and
    // the job walks `/output` once more when the guest ends.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + WATCH_EVERY, WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                let reason = match cancel.outcome() {
                    Outcome::Cancelled { reason } => reason,
                    _ => String::new(),
                };
                stop.cancel(&reason);
                return None;
            }
            _ = tick.tick() => {}
        }
        if let Some(reason) = limits.check_now(&output_dir, checkpoint_dir.as_deref()).await {
            tracing::info!("stopping the guest: {reason}");
            stop.cancel(&reason);
            return Some(reason);
        }
    }
}

/// Most emptied job directories kept for later jobs.
const MAX_SPARE_DIRS: usize = 16;

/// Job directories (`<jobs_dir>/<job>/{input,output}`) emptied after their job and kept, so the
/// next job renames one into place instead of making three directories and removing them
/// again: `ext4_mkdir` alone was 6 % of the whole path's CPU (BENCHMARKS.md).
///
/// A directory is kept only if, once emptied, it holds exactly an empty `input/` and an empty
/// `output/` (real directories, not links); anything else, or any error, and it is removed
/// whole, as every job directory was before. Spares are named `.spare-<n>`, which no job
/// directory can be (those never start with a dot), and go with the rest of `jobs/` when the
/// EP starts.
pub(crate) struct SpareDirs {
    jobs_dir: PathBuf,
    spare: Spares,
    next: std::sync::atomic::AtomicU64,
}

/// The emptied directories waiting for a job, shared with each [`JobDir`] not made yet.
type Spares = std::sync::Arc<std::sync::Mutex<Vec<PathBuf>>>;

impl SpareDirs {
    pub(crate) fn new(jobs_dir: PathBuf) -> SpareDirs {
        SpareDirs { jobs_dir, spare: Spares::default(), next: std::sync::atomic::AtomicU64::new(0) }
    }

    /// `dir`, to be made by [`JobDir::make_then`] from a spare taken now (or anew): a blocking
    /// step its caller runs in the same call off the async threads as what it writes there
    /// first, saving that call a hand-off of its own.
    pub(crate) fn claim(&self, dir: &Path) -> JobDir {
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).pop();
        JobDir { spares: self.spare.clone(), dir: dir.to_owned(), spare, busy: DirLock::default() }
    }

    /// Empties `dir` and keeps it as a spare, or removes it whole (see the type's docs); never
    /// keeps it unless `reusable` (no guest thread of its job is left behind, still holding it).
    /// With `keep_input` (a wasm job's: no process of its own that could hold the file open),
    /// its input file's inode is kept too, emptied, for the next job's input ([`KEPT_INPUT`]).
    /// `busy` is the directory's [`JobDir::lock`]: a making and first write that a cancel left
    /// running off the async threads end before the directory is emptied, so nothing they write
    /// lands in a spare.
    pub(crate) async fn give_back(&self, dir: PathBuf, reusable: bool, keep_input: bool, busy: Option<DirLock>) {
        let room = reusable && self.spare.lock().unwrap_or_else(|p| p.into_inner()).len() < MAX_SPARE_DIRS;
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let spare = self.jobs_dir.join(format!(".spare-{n}"));
        let kept = tokio::task::spawn_blocking(move || {
            let _done = busy.as_ref().map(|b| b.lock().unwrap_or_else(|p| p.into_inner()));
            if room && empty_job_dir(&dir, keep_input).is_ok() && std::fs::rename(&dir, &spare).is_ok() {
                return Some(spare);
            }
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!("failed to remove job dir {}: {e}", dir.display());
                }
                _ => {}
            }
            None
        })
        .await
        .ok()
        .flatten();
        if let Some(spare) = kept {
            self.spare.lock().unwrap_or_else(|p| p.into_inner()).push(spare);
        }
    }
}

/// Held while a job directory is made and first written ([`JobDir::make_then`]), and taken by
/// [`SpareDirs::give_back`] before it empties the directory.
pub(crate) type DirLock = std::sync::Arc<std::sync::Mutex<()>>;

/// A job directory claimed and not made yet ([`SpareDirs::claim`]); one dropped unmade puts
/// its spare back in the list, so a job that never got to its first write leaves no directory
/// behind outside the list.
pub(crate) struct JobDir {
    spares: Spares,
    dir: PathBuf,
    spare: Option<PathBuf>,
    busy: DirLock,
}

impl JobDir {
    /// Where the directory is (or is to be).
    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// The lock [`SpareDirs::give_back`] takes before emptying the directory.
    pub(crate) fn lock(&self) -> DirLock {
        self.busy.clone()
    }

    /// Makes the directory with an empty `input/` and `output/` (removing what a crashed EP
    /// left there), from the spare or anew, then runs `first`, its first write; both under the
    /// directory's lock. `input`: the file `first` writes in `input/` ([`open_input`]), which
    /// takes the spare's kept input inode, if it has one; any other is removed, so the guest
    /// finds only its own input. The outer error is the making's, the inner one `first`'s.
    /// Blocking.
    pub(crate) fn make_then<T>(
        mut self,
        input: Option<&Path>,
        first: impl FnOnce() -> std::io::Result<T>,
    ) -> std::io::Result<std::io::Result<T>> {
        let busy = self.busy.clone();
        let _held = busy.lock().unwrap_or_else(|p| p.into_inner());
        make_job_dir(&self.dir, self.spare.take())?;
        // The spare's kept input, if any, becomes `input`; else it goes (one call either way
        // when there is none: the rename or the removal finds nothing). `first` overwrites it
        // and cuts it to the new input's length, so it is taken only while it is still a
        // regular file of one link: no other name (a cached reference file's, say) sees that.
        let kept = self.dir.join("input").join(KEPT_INPUT);
        let reused = input
            .filter(|i| i.parent() == kept.parent())
            .is_some_and(|i| one_link(&kept) && std::fs::rename(&kept, i).is_ok());
        if !reused {
            match std::fs::remove_file(&kept) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(first())
    }
}

impl Drop for JobDir {
    fn drop(&mut self) {
        if let Some(spare) = self.spare.take() {
            self.spares.lock().unwrap_or_else(|p| p.into_inner()).push(spare);
        }
    }
}

/// Whether `path` is a regular file (not followed if a link) with no other name. Blocking.
fn one_link(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file() && m.nlink() == 1)
}

/// Makes `dir` (removing what a crashed EP left there) from `spare` or anew. Blocking.
fn make_job_dir(dir: &Path, spare: Option<PathBuf>) -> std::io::Result<()> {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(e);
    }
    if let Some(spare) = spare {
        if std::fs::rename(&spare, dir).is_ok() {
            return Ok(());
        }
        let _ = std::fs::remove_dir_all(&spare);
    }
    // 0700: a job's scratch holds its input, another owner's file, from the next user of the
    // host as much as from the next job.
    use std::os::unix::fs::DirBuilderExt as _;
    let mut private = std::fs::DirBuilder::new();
    private.recursive(true).mode(0o700);
    for d in [dir.join("input"), dir.join("output")] {
        private.create(d)?;
    }
    Ok(())
}

/// The name under which a spare keeps its last input file's inode for the next job's input
/// ([`JobDir::make_then`] renames it into place before the first write, which overwrites it).
const KEPT_INPUT: &str = ".kept-input";

/// Opens the input file at `path` (in a directory [`JobDir::make_then`] made) for the job's
/// first write: created if missing, or the spare's kept inode, which still holds the input
/// before (another owner's, maybe), opened without truncating it and its times set to now.
/// The caller writes the input from the file's start and then cuts the file to its length
/// (`set_len`) before any guest sees it, as [`write_input`] does.
///
/// Why not `O_TRUNC`: ext4 flushes a file that was truncated to nothing and written again
/// when it is closed (`auto_da_alloc`), so emptying the kept inode cost a disk write per job,
/// and the truncation itself freed its blocks only for the next input to allocate them again
/// (together a tenth of the EP's CPU, BENCHMARKS.md). Overwritten in place, the blocks stay
/// allocated and the page cache writes them back in its own time. Not followed if a link.
/// Blocking.
pub(crate) fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new().write(true).create(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
    let now = std::time::SystemTime::now();
    file.set_times(std::fs::FileTimes::new().set_accessed(now).set_modified(now))?;
    Ok(file)
}

/// Writes `body` as the job's input file at `path` ([`open_input`]), cut to its length.
/// Blocking.
pub(crate) fn write_input(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut file = open_input(path)?;
    file.write_all(body)?;
    file.set_len(body.len() as u64)
}

/// Removes everything under `dir/input` and `dir/output` by unlinking it (links as links, never
/// followed; a reference file hard-linked from the EP's cache loses this name only), then
/// checks that `dir` holds exactly those two, empty, real directories, as the EP made them:
/// mode 0700 and no extended attributes. A guest that owns its `/output` (a native one, in its
/// user namespace) may change its mode or set a `user.*` attribute on it; kept, that directory
/// would carry either to the next job, another owner's maybe: a channel between owners.
///
/// With `keep_input`, one input file is kept as [`KEPT_INPUT`] instead of removed: each job's
/// input taking a new inode and freeing it had ext4 search past every inode freed in the last
/// seconds, a fifth of the EP's CPU at hundreds of jobs a second (BENCHMARKS.md). It is kept
/// only as nothing of the job before can reach the next through it ([`fit_for_the_next_job`]);
/// its bytes stay until the next input overwrites them ([`open_input`]).
fn empty_job_dir(dir: &Path, keep_input: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let unfit = || std::io::Error::other("not a job directory");
    for sub in ["input", "output"] {
        let sub_dir = dir.join(sub);
        let meta = std::fs::symlink_metadata(&sub_dir)?;
        if !meta.is_dir() || meta.permissions().mode() & 0o7777 != 0o700 || has_xattrs(&sub_dir)? {
            return Err(unfit());
        }
        let mut kept = !(keep_input && sub == "input");
        for entry in std::fs::read_dir(&sub_dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else if !kept && fit_for_the_next_job(&path)? {
                kept = true;
                if entry.file_name() != KEPT_INPUT {
                    std::fs::rename(&path, sub_dir.join(KEPT_INPUT))?;
                }
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        let left = names_in(&sub_dir)?;
        if !(left.is_empty() || (sub == "input" && left == [KEPT_INPUT])) {
            return Err(unfit());
        }
    }
    if names_in(dir)? != ["input", "output"] {
        return Err(unfit());
    }
    Ok(())
}

/// The names in directory `dir`, sorted.
fn names_in(dir: &Path) -> std::io::Result<Vec<std::ffi::OsString>> {
    let mut names = std::fs::read_dir(dir)?.map(|e| e.map(|e| e.file_name())).collect::<Result<Vec<_>, _>>()?;
    names.sort();
    Ok(names)
}

/// Whether the input file at `path` may be kept for the next job's input: a regular file (not
/// followed if a link) with one link (no name elsewhere, such as the EP's cache of reference
/// files, that would see the next input written over it), no extended attributes, no execute,
/// set-id or sticky bit and nothing writable but by its owner (as the EP writes inputs).
/// `false`: remove it. Its bytes and times are the next input's to replace ([`open_input`]:
/// times set to now, then the bytes written and cut to their length).
fn fit_for_the_next_job(path: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::symlink_metadata(path)?;
    Ok(meta.file_type().is_file() && meta.nlink() == 1 && meta.mode() & 0o7133 == 0 && !has_xattrs(path)?)
}

/// Whether `path` (not followed if a link) carries any extended attribute.
fn has_xattrs(path: &Path) -> std::io::Result<bool> {
    let mut names = [0u8; 256];
    match rustix::fs::llistxattr(path, &mut names[..]) {
        Ok(n) => Ok(n > 0),
        // More names than the buffer holds: some, then.
        Err(rustix::io::Errno::RANGE) => Ok(true),
        // A file system without extended attributes has none to carry.
        Err(rustix::io::Errno::NOTSUP) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes `dir` with an empty `input/` and `output/` off the async threads, as a job's first
    /// write does.
    async fn take(spares: &SpareDirs, dir: &Path) {
        let job_dir = spares.claim(dir);
        let made = tokio::task::spawn_blocking(move || job_dir.make_then(None, || Ok(()))).await.expect("join");
        made.expect("make").expect("nothing written");
    }

    #[tokio::test]
    async fn spare_job_dirs_are_emptied_reused_and_never_kept_when_unfit() {
        let jobs = tempfile::tempdir().expect("tempdir");
        let spares = SpareDirs::new(jobs.path().to_owned());
        // A job leaves an input, outputs in a subdirectory, and a link out of its scratch.
        let a = jobs.path().join("a");
        take(&spares, &a).await;
        std::fs::write(a.join("input/in.dat"), b"in").expect("write");
        std::fs::create_dir_all(a.join("output/sub")).expect("mkdir");
        std::fs::write(a.join("output/sub/o"), b"out").expect("write");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("keep"), b"k").expect("write");
        std::os::unix::fs::symlink(outside.path(), a.join("output/link")).expect("symlink");
        spares.give_back(a.clone(), true, false, None).await;
        assert!(!a.exists(), "the job's own directory is gone");
        assert!(outside.path().join("keep").exists(), "a link is removed, not followed");
        // The next job gets the emptied directory under its own name.
        let b = jobs.path().join("b");
        take(&spares, &b).await;
        assert_eq!(std::fs::read_dir(jobs.path()).expect("list").count(), 1, "the spare was renamed, not copied");
        for sub in ["", "input", "output"] {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(b.join(sub)).expect("stat").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{sub:?} is the EP's alone");
        }
        for sub in ["input", "output"] {
            assert_eq!(std::fs::read_dir(b.join(sub)).expect("list").count(), 0, "{sub} is empty");
        }
        // A directory a guest thread may still hold is removed whole, not kept.
        spares.give_back(b.clone(), false, false, None).await;
        assert_eq!(std::fs::read_dir(jobs.path()).expect("list").count(), 0, "not kept");
        // Nor one holding anything else.
        take(&spares, &b).await;
        std::fs::write(b.join("stray"), b"x").expect("write");
        spares.give_back(b.clone(), true, false, None).await;
        assert_eq!(std::fs::read_dir(jobs.path()).expect("list").count(), 0, "nothing kept");
        assert!(spares.spare.lock().expect("lock").is_empty());
    }

    /// A wasm job's input file keeps its inode for the next job's input: the next job, with a
    /// shorter input, reads only its own bytes (none of the longer input before), sees no
    /// other file, and a file that a link, an attribute or its mode makes unfit, or a native
    /// job's, is removed instead.
    #[tokio::test]
    async fn a_spare_keeps_its_input_inode_for_the_next_input_cut_to_its_bytes_and_only_when_fit() {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let jobs = tempfile::tempdir().expect("tempdir");
        let spares = SpareDirs::new(jobs.path().to_owned());
        let write_input = |dir: PathBuf, name: &'static str, body: &'static [u8]| {
            let job_dir = spares.claim(&dir);
            let at = dir.join("input").join(name);
            let first = at.clone();
            job_dir.make_then(Some(&at), move || write_input(&first, body)).expect("make").expect("write");
            std::fs::metadata(&at).expect("stat").ino()
        };
        let a = jobs.path().join("a");
        let first = write_input(a.clone(), "raw.dat", b"owner one's secret input");
        spares.give_back(a, true, true, None).await;
        let b = jobs.path().join("b");
        let second = write_input(b.clone(), "other.dat", b"two");
        assert_eq!(first, second, "the inode is reused");
        assert_eq!(names_in(&b.join("input")).expect("list"), ["other.dat"], "the guest sees its own input alone");
        assert_eq!(std::fs::read(b.join("input/other.dat")).expect("read"), b"two", "nothing of the input before");

        // Unfit: a second link to it, group-writable, an attribute, or a native job's.
        /// What a case does to the input file before its directory is given back.
        type Spoil = Box<dyn Fn(&Path)>;
        let spoilers: [(&str, Spoil, bool); 4] = [
            (
                "a second name in /output",
                Box::new(|f: &Path| {
                    let alias = f.parent().and_then(Path::parent).expect("job dir").join("output/alias");
                    std::fs::hard_link(f, alias).expect("link");
                }),
                true,
            ),
            (
                "its mode",
                Box::new(|f: &Path| {
                    std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o664)).expect("chmod")
                }),
                true,
            ),
            (
                "an attribute",
                Box::new(|f: &Path| {
                    let _ = rustix::fs::setxattr(f, "user.note", b"hi", rustix::fs::XattrFlags::empty());
                }),
                true,
            ),
            ("a native job", Box::new(|_: &Path| {}), false),
        ];
        for (what, spoil, keep_input) in spoilers {
            let c = jobs.path().join("c");
            write_input(c.clone(), "in", b"x");
            spoil(&c.join("input/in"));
            if what == "an attribute" && !has_xattrs(&c.join("input/in")).expect("list") {
                eprintln!("this file system takes no user attributes; skipping that case");
                std::fs::remove_file(c.join("input/in")).expect("rm");
            }
            spares.give_back(c, true, keep_input, None).await;
            // The directory is kept (nothing else is wrong with it), its input file is not.
            let spare = spares.spare.lock().expect("lock").last().cloned().expect("a spare");
            assert_eq!(std::fs::read_dir(spare.join("input")).expect("list").count(), 0, "{what}: not kept");
            let d = jobs.path().join("d");
            write_input(d.clone(), "in", b"y");
            assert_eq!(names_in(&d.join("input")).expect("list"), ["in"], "{what}");
            spares.give_back(d, true, false, None).await;
        }
    }

    /// A job directory holding other names of cached files (reference files linked from the
    /// EP's cache) is emptied by unlinking: the cached bytes stay whole; and a kept input that
    /// got a second name after it was kept is not taken (the next input written over it would
    /// reach that name).
    #[tokio::test]
    async fn emptying_and_reusing_a_job_dir_never_truncates_a_file_with_another_name() {
        use std::os::unix::fs::MetadataExt as _;
        let jobs = tempfile::tempdir().expect("tempdir");
        let cache = tempfile::tempdir().expect("tempdir");
        let cached = cache.path().join("constants");
        std::fs::write(&cached, b"cached constants").expect("write");
        let spares = SpareDirs::new(jobs.path().to_owned());
        let a = jobs.path().join("a");
        let job_dir = spares.claim(&a);
        let input = a.join("input/in.dat");
        let first = input.clone();
        job_dir.make_then(Some(&input), move || write_input(&first, b"input")).expect("make").expect("write");
        std::fs::create_dir_all(a.join("input/ref/calib")).expect("mkdir");
        std::fs::hard_link(&cached, a.join("input/ref/calib/gains.txt")).expect("link");
        std::fs::hard_link(&cached, a.join("input/constants")).expect("link at the top, where an input is kept");
        spares.give_back(a, true, true, None).await;
        assert_eq!(std::fs::read(&cached).expect("read"), b"cached constants", "not truncated");
        assert_eq!(std::fs::metadata(&cached).expect("stat").nlink(), 1, "the job's names are gone");

        // The spare's kept input, given a second name meanwhile, is not the next input.
        let spare = spares.spare.lock().expect("lock").last().cloned().expect("a spare");
        let alias = cache.path().join("alias");
        std::fs::write(spare.join("input").join(KEPT_INPUT), b"still here").expect("write");
        std::fs::hard_link(spare.join("input").join(KEPT_INPUT), &alias).expect("link");
        let b = jobs.path().join("b");
        let job_dir = spares.claim(&b);
        let input = b.join("input/next.dat");
        let first = input.clone();
        job_dir.make_then(Some(&input), move || write_input(&first, b"next")).expect("make").expect("write");
        assert_eq!(std::fs::read(&alias).expect("read"), b"still here", "the other name keeps its bytes");
        assert_eq!(names_in(&b.join("input")).expect("list"), ["next.dat"]);
        assert_eq!(std::fs::read(&input).expect("read"), b"next");
    }

    /// A guest that owns its `/output` may change its mode or give it an attribute; either
    /// would reach the next job through a kept directory, so such a directory is not kept.
    #[tokio::test]
    async fn a_dir_whose_mode_or_attributes_a_guest_changed_is_not_kept() {
        use std::os::unix::fs::PermissionsExt as _;
        let jobs = tempfile::tempdir().expect("tempdir");
        let spares = SpareDirs::new(jobs.path().to_owned());
        let a = jobs.path().join("a");
        take(&spares, &a).await;
        std::fs::set_permissions(a.join("output"), std::fs::Permissions::from_mode(0o777)).expect("chmod");
        spares.give_back(a.clone(), true, false, None).await;
        assert!(spares.spare.lock().expect("lock").is_empty(), "a changed mode is not kept");

        take(&spares, &a).await;
        let set =
            rustix::fs::setxattr(a.join("output"), "user.note", b"for the next owner", rustix::fs::XattrFlags::empty());
        if let Err(e) = set {
            eprintln!("this file system takes no user attributes ({e}); the mode case stands alone");
            return;
        }
        assert!(has_xattrs(&a.join("output")).expect("list"));
        spares.give_back(a.clone(), true, false, None).await;
        assert!(spares.spare.lock().expect("lock").is_empty(), "an attribute is not kept");
        assert_eq!(std::fs::read_dir(jobs.path()).expect("list").count(), 0, "removed whole");
        // An untouched one still is.
        take(&spares, &a).await;
        spares.give_back(a, true, false, None).await;
        assert_eq!(spares.spare.lock().expect("lock").len(), 1);
    }

    #[tokio::test]
    async fn a_claimed_dir_is_made_from_its_spare_and_one_never_made_gives_the_spare_back() {
        let jobs = tempfile::tempdir().expect("tempdir");
        let spares = SpareDirs::new(jobs.path().to_owned());
        let a = jobs.path().join("a");
        take(&spares, &a).await;
        spares.give_back(a, true, false, None).await;
        assert_eq!(spares.spare.lock().expect("lock").len(), 1, "one spare kept");
        // Claimed and dropped unmade (the job failed before its first write): the spare is
        // listed again, still on disk, and no job directory was made.
        let b = jobs.path().join("b");
        drop(spares.claim(&b));
        assert!(!b.exists());
        let listed = spares.spare.lock().expect("lock").clone();
        assert_eq!(listed.len(), 1, "the spare is back in the list");
        assert!(listed[0].join("input").is_dir(), "and still on disk");
        // Claimed and made off the async threads: the spare is renamed into place.
        let made = spares.claim(&b);
        let busy = made.lock();
        let wrote = tokio::task::spawn_blocking(move || made.make_then(None, || Ok(7))).await.expect("join");
        assert_eq!(wrote.expect("made").expect("first write"), 7);
        assert!(b.join("input").is_dir() && b.join("output").is_dir());
        assert!(spares.spare.lock().expect("lock").is_empty(), "the spare was used");
        assert_eq!(std::fs::read_dir(jobs.path()).expect("list").count(), 1, "renamed, not copied");
        // Given back while its lock is held (a first write a cancel left running): the
        // emptying waits for the write, so what it wrote is not kept in a spare.
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let writer = {
            let (busy, b) = (busy.clone(), b.clone());
            std::thread::spawn(move || {
                let _held = busy.lock().expect("lock");
                locked_tx.send(()).expect("locked");
                release_rx.recv().expect("released");
                std::fs::write(b.join("input/late"), b"x").expect("the late write");
            })
        };
        locked_rx.recv().expect("the writer holds the lock");
        let back = tokio::spawn({
            let jobs_dir = jobs.path().to_owned();
            let (b, busy) = (b.clone(), busy.clone());
            async move { SpareDirs::new(jobs_dir).give_back(b, true, false, Some(busy)).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(b.exists(), "not emptied while the write holds the lock");
        release_tx.send(()).expect("release");
        writer.join().expect("the writer");
        back.await.expect("given back");
        assert!(!b.exists());
        let kept: Vec<_> = std::fs::read_dir(jobs.path()).expect("list").flatten().map(|e| e.path()).collect();
        assert!(kept.iter().all(|d| std::fs::read_dir(d.join("input")).expect("input").next().is_none()), "{kept:?}");
    }

    #[test]
    fn measure_counts_everything_and_stops_past_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a"), b"12345").expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/b"), b"123").expect("write");
        let m = measure(dir.path(), 10).expect("walk");
        assert_eq!((m.entries, m.bytes), (3, 8));
        assert_eq!(measure(dir.path(), 1).expect("walk").entries, 2);
        let limits = ScratchLimits { max_files: 2, max_output_bytes: 7, max_scratch_bytes: Some(9), input_bytes: 3 };
        let why = limits.exceeded(m).expect("past the file limit");
        assert_eq!(why, "more than 2 files and directories in /output, past the output file limit of 2");
        let m = |entries, bytes, checkpoint_bytes| Measured { entries, bytes, checkpoint_bytes };
        let why = limits.exceeded(m(1, 8, 0)).expect("past the byte limit");
        assert_eq!(why, "at least 8 output bytes, more than the output byte limit of 7");
        let why = limits.exceeded(m(1, 7, 0)).expect("past the scratch limit");
        assert_eq!(why, "input and outputs hold at least 10 bytes, more than the scratch limit of 9 bytes");
        assert_eq!(limits.exceeded(m(2, 6, 0)), None);
        let why = limits.exceeded(m(2, 6, 1)).expect("a checkpoint counts against the scratch limit");
        assert_eq!(
            why,
            "input, outputs and /checkpoint hold at least 10 bytes, more than the scratch limit of 9 bytes"
        );
    }
}
