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
    /// [`Settings::max_scratch_bytes`] or the job's `disk_mb`, the lower: input plus outputs.
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
struct Measured {
    entries: usize,
    bytes: u64,
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
    fn exceeded(&self, m: Measured) -> Option<String> {
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
        let total = self.input_bytes.saturating_add(m.bytes);
        match self.max_scratch_bytes {
            Some(max) if total > max => Some(format!(
                "input and outputs hold at least {total} bytes, more than the scratch limit of {max} bytes"
            )),
            _ => None,
        }
    }

    /// Walks `dir` once (off the async threads) and says why it is past a limit, if it is.
    pub(crate) async fn check_now(&self, dir: &Path) -> Option<String> {
        let (dir, max_files) = (dir.to_owned(), self.max_files);
        match tokio::task::spawn_blocking(move || measure(&dir, max_files)).await {
            Ok(Ok(m)) => self.exceeded(m),
            Ok(Err(e)) => {
                tracing::warn!("failed to measure the job's outputs: {e}");
                None
            }
            Err(e) => {
                tracing::warn!("output measuring task failed: {e}");
                None
            }
        }
    }
}

/// Entries (any kind, any depth; symlinks not followed) and regular-file bytes under `dir`,
/// stopping once past `max_entries`, so a guest's flood of files keeps the walk short.
/// Blocking.
fn measure(dir: &Path, max_entries: usize) -> std::io::Result<Measured> {
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
/// the guest through `stop` once its scratch passes a limit (returning why). Checks every
/// [`WATCH_EVERY`]; never returns otherwise. Cancel-safe.
pub(crate) async fn watch_scratch(
    limits: ScratchLimits,
    output_dir: PathBuf,
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
        if let Some(reason) = limits.check_now(&output_dir).await {
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
    spare: std::sync::Mutex<Vec<PathBuf>>,
    next: std::sync::atomic::AtomicU64,
}

impl SpareDirs {
    pub(crate) fn new(jobs_dir: PathBuf) -> SpareDirs {
        SpareDirs { jobs_dir, spare: std::sync::Mutex::default(), next: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Makes `dir` with an empty `input/` and `output/`: a spare renamed into place, else new;
    /// in one call off the async threads (each `tokio::fs` call is a hand-off of its own).
    pub(crate) async fn take(&self, dir: &Path) -> std::io::Result<()> {
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || make_job_dir(&dir, spare)).await.map_err(std::io::Error::other)?
    }

    /// Empties `dir` and keeps it as a spare, or removes it whole (see the type's docs); never
    /// keeps it unless `reusable` (no guest thread of its job is left behind, still holding it).
    pub(crate) async fn give_back(&self, dir: PathBuf, reusable: bool) {
        let room = reusable && self.spare.lock().unwrap_or_else(|p| p.into_inner()).len() < MAX_SPARE_DIRS;
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let spare = self.jobs_dir.join(format!(".spare-{n}"));
        let kept = tokio::task::spawn_blocking(move || {
            if room && empty_job_dir(&dir).is_ok() && std::fs::rename(&dir, &spare).is_ok() {
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

/// Removes everything under `dir/input` and `dir/output` (links as links, never followed), then
/// checks that `dir` holds exactly those two, empty, real directories.
fn empty_job_dir(dir: &Path) -> std::io::Result<()> {
    let unfit = || std::io::Error::other("not a job directory");
    for sub in ["input", "output"] {
        let sub = dir.join(sub);
        if !std::fs::symlink_metadata(&sub)?.is_dir() {
            return Err(unfit());
        }
        for entry in std::fs::read_dir(&sub)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(entry.path())?;
            } else {
                std::fs::remove_file(entry.path())?;
            }
        }
        if std::fs::read_dir(&sub)?.next().is_some() {
            return Err(unfit());
        }
    }
    let mut names: Vec<_> = std::fs::read_dir(dir)?.map(|e| e.map(|e| e.file_name())).collect::<Result<_, _>>()?;
    names.sort();
    if names != ["input", "output"] {
        return Err(unfit());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spare_job_dirs_are_emptied_reused_and_never_kept_when_unfit() {
        let jobs = tempfile::tempdir().expect("tempdir");
        let spares = SpareDirs::new(jobs.path().to_owned());
        // A job leaves an input, outputs in a subdirectory, and a link out of its scratch.
        let a = jobs.path().join("a");
        spares.take(&a).await.expect("take");
        std::fs::write(a.join("input/in.dat"), b"in").expect("write");
        std::fs::create_dir_all(a.join("output/sub")).expect("mkdir");
        std::fs::write(a.join("output/sub/o"), b"out").expect("write");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("keep"), b"k").expect("write");
        std::os::unix::fs::symlink(outside.path(), a.join("output/link")).expect("symlink");
        spares.give_back(a.clone(), true).await;
        assert!(!a.exists(), "the job's own directory is gone");
        assert!(outside.path().join("keep").exists(), "a link is removed, not followed");
        // The next job gets the emptied directory under its own name.
        let b = jobs.path().join("b");
        spares.take(&b).await.expect("take");
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
        spares.give_back(b.clone(), false).await;
        assert_eq!(std::fs::read_dir(jobs.path()).expect("list").count(), 0, "not kept");
        // Nor one holding anything else.
        spares.take(&b).await.expect("take");
        std::fs::write(b.join("stray"), b"x").expect("write");
        spares.give_back(b.clone(), true).await;
        assert_eq!(std::fs::read_dir(jobs.path()).expect("list").count(), 0, "nothing kept");
        assert!(spares.spare.lock().expect("lock").is_empty());
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
        let why = limits.exceeded(Measured { entries: 1, bytes: 8 }).expect("past the byte limit");
        assert_eq!(why, "at least 8 output bytes, more than the output byte limit of 7");
        let why = limits.exceeded(Measured { entries: 1, bytes: 7 }).expect("past the scratch limit");
        assert_eq!(why, "input and outputs hold at least 10 bytes, more than the scratch limit of 9 bytes");
        assert_eq!(limits.exceeded(Measured { entries: 2, bytes: 6 }), None);
    }
}
