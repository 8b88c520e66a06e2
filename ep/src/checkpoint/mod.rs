//! A job's checkpoint on the EP (HTCondor's `checkpoint_exit_code` and
//! `transfer_checkpoint_files`; the shapes are [`htfaas_functions::checkpoint`]): restored into
//! `/checkpoint` before the run, stored after a run that asked for it or was stopped, deleted
//! once the job no longer needs it.
//!
//! - **The guest's view**: a job whose assignment has `checkpoint` sees a writable directory
//!   `/checkpoint` (a wasm preopen; a read-write bind in a native sandbox) in its scratch
//!   directory, whose bytes count against the scratch bound like its outputs'. A job without
//!   one sees no such directory.
//! - **Restore** ([`restore`], after the input and reference files, before the run): `GET` the
//!   job's [`CHECKPOINT_FILE`](htfaas_functions::checkpoint::CHECKPOINT_FILE) with its
//!   checkpoint macaroon, by [`crate::transfer`]'s retry rules, its URL checked against the
//!   EP's origins like the input's. A 404 starts the guest afresh (`restored`: none). One
//!   larger than its bound, or an archive the rules of [`archive`] refuse (a path out of the
//!   directory, a link, a device, too many entries, more bytes than the bound), fails the
//!   attempt as [`Outcome::InputFailed`] naming why: starting afresh would silently throw away
//!   work the job believes kept, and the next attempt would find the same file. A storage
//!   away on every try is [`Outcome::StorageUnavailable`] (the job runs again later).
//! - **Save** ([`settle`], once the run ended): when the guest exited with the checkpoint exit
//!   code, its outcome is [`Outcome::Checkpointed`] (see [`exit_outcome`]) and its outputs are
//!   not stored (it is not finished, nor failed: they are discarded whatever
//!   `outputs.on_failure` says); when the run was stopped before its end (a scheduler's cancel,
//!   the EP leaving, its run time reached: [`Outcome::Cancelled`], [`Outcome::TimeExceeded`]),
//!   whatever `/checkpoint` then holds is kept too. `/checkpoint` is packed into one tar
//!   ([`archive::pack`]: deterministic, so the same state gives the same sha256, how the
//!   scheduler tells an attempt that progressed from one that did not), refused over its bound
//!   (`not_saved` says why; nothing is stored), else `PUT` over the previous one. For a
//!   checkpoint exit a refusal fails the attempt: [`Outcome::OutputExceeded`] over the bound,
//!   [`Outcome::OutputFailed`] or [`Outcome::StorageUnavailable`] for a failed `PUT`. An empty
//!   `/checkpoint` is stored as an empty archive.
//! - **Delete**: a job ending for good on this EP (a success, or any outcome but a checkpoint
//!   exit, a stop and [`Outcome::StorageUnavailable`]) deletes its checkpoint and then its
//!   area's directory, best effort: a 404 is fine, a failure is logged and changes nothing. A failure that a retry policy runs
//!   again so starts afresh, as a checkpoint may be what made it fail. A scheduler's cancel
//!   says whether the job ends (a removal: the checkpoint and its area go) or may run again (a
//!   hold, or a cancel from a scheduler that does not say: it is stored). The gateway clears
//!   the area of a job removed or failed away from an EP once it is told the job ended.
//! - **Stops**: a native guest gets SIGTERM and its vacate time before it is killed, time to
//!   write its state; a wasm guest is interrupted at once, between two instructions. Either way
//!   what `/checkpoint` holds at that moment is what is kept, so a guest writes its state
//!   atomically: a temporary file, then a rename over the old one.
//!
//! The archive is written next to the guest's directories in the job directory, never in
//! them; checkpoint bytes count in the report's `bytes_in` and `bytes_out`. The macaroon goes
//! into `Authorization` headers only.
//!
//! Below the job: must not know the attach protocol (`tokio_tungstenite`), slots (`slots`).

mod archive;
mod store;

use crate::config::Settings;
use crate::counters::CheckpointEvent;
use crate::runtime::CancelSignal;
use crate::transfer::{Transfer, off_thread, put_file};
use archive::ArchiveError;
use htfaas_functions::checkpoint::{CheckpointReport, CheckpointSpec, SavedCheckpoint};
use htfaas_functions::proto::{JobAssignment, JobReport, Outcome};
use std::path::{Path, PathBuf};

/// The guest's `/checkpoint`, in the job directory.
const DIR: &str = "checkpoint";
/// The archive on its way in or out, in the job directory beside (not in) what the guest sees.
const ARCHIVE: &str = "checkpoint.tar";

/// The outcome of a run of a job whose checkpoints are `spec` that ended with `outcome`: its
/// checkpoint exit code makes it [`Outcome::Checkpointed`].
pub(crate) fn exit_outcome(spec: Option<&CheckpointSpec>, outcome: Outcome) -> Outcome {
    match (spec, outcome) {
        (Some(CheckpointSpec { exit_code: Some(code), .. }), Outcome::Exited { exit_code }) if exit_code == *code => {
            Outcome::Checkpointed { exit_code }
        }
        (_, outcome) => outcome,
    }
}

/// Makes the job's `/checkpoint` in `job_dir` (made already) from its stored checkpoint, or
/// empty when there is none; `None` for a job without checkpoints. Counts what it reads into
/// `report.usage.bytes_in` and sets `report.checkpoint` once done. A cancel stops the download
/// ([`CancelSignal::outcome`]); the unpacking, bounded, is not cut short.
pub(crate) async fn restore(
    s: &Settings,
    job: &JobAssignment,
    macaroon: &str,
    job_dir: &Path,
    report: &mut JobReport,
    retries: &mut u32,
    cancel: &CancelSignal,
) -> Result<Option<PathBuf>, Outcome> {
    let Some(spec) = &job.checkpoint else { return Ok(None) };
    let failed = |reason: String| Outcome::InputFailed { reason: format!("checkpoint: {reason}") };
    s.origins.check("checkpoint url", &spec.url).map_err(|e| failed(e.to_string()))?;
    let (dir, tar) = (job_dir.join(DIR), job_dir.join(ARCHIVE));
    let url = spec.file_url();
    let from = Transfer { http: &s.http, url: &url, macaroon, traceparent: job.traceparent.as_deref() };
    let mut n = 0;
    let fetched = tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        f = store::fetch(&from, &tar, spec.max_bytes, &mut n, retries) => Some(f),
    };
    report.usage.bytes_in += n;
    let Some(fetched) = fetched else { return Err(cancel.outcome()) };
    let restored = fetched.map_err(|e| {
        s.metrics.checkpoint(CheckpointEvent::Failed);
        e.outcome(failed)
    })?;
    let (at, max) = (dir.clone(), spec.max_bytes);
    let made = match &restored {
        None => off_thread(move || make_private_dir(&at))
            .await
            .map_err(|e| ArchiveError::Io { context: "make /checkpoint".into(), source: e }),
        Some(_) => {
            let from = tar.clone();
            let unpacked = off_thread(move || {
                let done = archive::unpack(&from, &at, max);
                let _ = std::fs::remove_file(&from);
                Ok(done)
            })
            .await;
            unpacked.unwrap_or_else(|e| Err(ArchiveError::Io { context: "unpack the checkpoint".into(), source: e }))
        }
        .map(|_| ()),
    };
    if let Err(e) = made {
        let event = match e {
            ArchiveError::OverBound { .. } | ArchiveError::TooManyEntries => CheckpointEvent::OverBound,
            _ => CheckpointEvent::Failed,
        };
        s.metrics.checkpoint(event);
        return Err(failed(e.to_string()));
    }
    if restored.is_some() {
        s.metrics.checkpoint(CheckpointEvent::Restored);
        tracing::info!(bytes = n, "checkpoint restored");
    }
    report.checkpoint = Some(CheckpointReport { restored, saved: None, not_saved: None });
    Ok(Some(dir))
}

/// Makes `dir`, private to the EP (and, for a native job, handed to its uid later). Blocking.
fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}

/// What [`settle`] does with a job's checkpoint, by how the job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Store `/checkpoint`; `exit`: the guest asked for it (a failure to store fails the job).
    Save { exit: bool },
    /// Leave the stored one as it is.
    Keep,
    /// The job no longer needs one.
    Delete,
}

/// What to do with the checkpoint of a job that ended with `outcome`; `restored`: its
/// `/checkpoint` was made (else there is nothing of this attempt to store); `ends`: the
/// scheduler's cancel said the job ends for good (removed), so its checkpoint goes.
fn then(outcome: &Outcome, restored: bool, ends: bool) -> Then {
    match outcome {
        Outcome::Cancelled { .. } if ends => Then::Delete,
        Outcome::Checkpointed { .. } => Then::Save { exit: true },
        Outcome::Cancelled { .. } | Outcome::TimeExceeded { .. } if restored => Then::Save { exit: false },
        Outcome::Cancelled { .. } | Outcome::TimeExceeded { .. } | Outcome::StorageUnavailable { .. } => Then::Keep,
        _ => Then::Delete,
    }
}

/// Once the job's steps ended (its guest's, if it ran, included) and before its directory
/// goes: stores, keeps or deletes its checkpoint by how it ended (see the module's docs),
/// recording what it did in `report.checkpoint` (and, for a checkpoint exit that could not be
/// stored, in `report.outcome`).
pub(crate) async fn settle(
    s: &Settings,
    job: &JobAssignment,
    macaroon: &str,
    job_dir: &Path,
    ends: bool,
    report: &mut JobReport,
    retries: &mut u32,
) {
    let Some(spec) = &job.checkpoint else { return };
    let url = spec.file_url();
    let at = Transfer { http: &s.http, url: &url, macaroon, traceparent: job.traceparent.as_deref() };
    if s.origins.check("checkpoint url", &spec.url).is_err() {
        return; // refused before anything was fetched: nothing of the job's is there to touch
    }
    match then(&report.outcome, report.checkpoint.is_some(), ends) {
        Then::Keep => {}
        Then::Delete => clear(&at, &spec.url, retries).await,
        Then::Save { exit } => {
            let saved = save(s, spec, &at, job_dir, &mut report.usage.bytes_out, retries).await;
            let ckpt = report.checkpoint.get_or_insert_with(CheckpointReport::default);
            match saved {
                Ok(done) => ckpt.saved = Some(done),
                Err((why, failure)) => {
                    tracing::warn!("checkpoint not stored: {why}");
                    ckpt.not_saved = Some(why);
                    if exit {
                        report.outcome = failure;
                        // The job failed for good (unless the storage was away): the checkpoint
                        // it started from is of no more use.
                        if then(&report.outcome, true, ends) == Then::Delete {
                            clear(&at, &spec.url, retries).await;
                        }
                    }
                }
            }
        }
    }
}

/// Clears the job's checkpoint area, best effort: the checkpoint file `at`, then the area's
/// directory `area` (with the same macaroon, whose scope it is), so a job that ended leaves
/// nothing under the site's checkpoint directory. A failure is logged and changes nothing.
async fn clear(at: &Transfer<'_>, area: &str, retries: &mut u32) {
    let dir = Transfer { url: area, ..*at };
    for (what, target) in [("checkpoint", at), ("checkpoint area", &dir)] {
        if let Err(e) = store::delete(target, retries).await {
            let why = e.outcome(|reason| Outcome::OutputFailed { reason }).reason();
            tracing::warn!("failed to delete the job's {what}: {why}");
            return;
        }
    }
}

/// Packs `/checkpoint` and stores it; on failure, why (for `not_saved`) and the outcome of a
/// checkpoint exit that failed so.
async fn save(
    s: &Settings,
    spec: &CheckpointSpec,
    at: &Transfer<'_>,
    job_dir: &Path,
    bytes_out: &mut u64,
    retries: &mut u32,
) -> Result<SavedCheckpoint, (String, Outcome)> {
    let (dir, tar, max) = (job_dir.join(DIR), job_dir.join(ARCHIVE), spec.max_bytes);
    let to = tar.clone();
    let packed = off_thread(move || Ok(archive::pack(&dir, &to, max))).await;
    let packed = packed.unwrap_or_else(|e| Err(ArchiveError::Io { context: "pack the checkpoint".into(), source: e }));
    let packed = packed.map_err(|e| {
        let over = matches!(e, ArchiveError::OverBound { .. } | ArchiveError::TooManyEntries);
        s.metrics.checkpoint(if over { CheckpointEvent::OverBound } else { CheckpointEvent::Failed });
        let why = format!("checkpoint not stored: {e}");
        let outcome = if over {
            Outcome::OutputExceeded { reason: why.clone() }
        } else {
            Outcome::OutputFailed { reason: why.clone() }
        };
        (why, outcome)
    })?;
    for note in &packed.skipped {
        tracing::info!("{note}");
    }
    let put = put_file(at, &tar, packed.bytes, retries).await;
    let _ = tokio::fs::remove_file(&tar).await;
    match put {
        Ok(sha256) => {
            *bytes_out += packed.bytes;
            s.metrics.checkpoint(CheckpointEvent::Saved);
            tracing::info!(bytes = packed.bytes, sha256 = %sha256, "checkpoint stored");
            Ok(SavedCheckpoint { sha256, bytes: packed.bytes })
        }
        Err(e) => {
            s.metrics.checkpoint(CheckpointEvent::Failed);
            let outcome = e.outcome(|reason| Outcome::OutputFailed { reason: format!("checkpoint: {reason}") });
            Err((format!("checkpoint not stored: {}", outcome.reason()), outcome))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_stored_on_its_exit_and_on_a_stop_kept_while_needed_and_deleted_at_the_end() {
        let cancelled = Outcome::Cancelled { reason: "hold".into() };
        let timed_out = Outcome::TimeExceeded { limit_s: 1, vacate: None };
        assert_eq!(then(&Outcome::Checkpointed { exit_code: 85 }, true, false), Then::Save { exit: true });
        assert_eq!(then(&cancelled, true, false), Then::Save { exit: false });
        assert_eq!(then(&timed_out, true, false), Then::Save { exit: false });
        assert_eq!(then(&cancelled, false, false), Then::Keep, "stopped before /checkpoint was made");
        assert_eq!(then(&cancelled, true, true), Then::Delete, "a removal: the checkpoint goes");
        assert_eq!(then(&cancelled, false, true), Then::Delete);
        assert_eq!(then(&timed_out, false, false), Then::Keep);
        assert_eq!(then(&Outcome::StorageUnavailable { reason: "away".into() }, true, false), Then::Keep);
        for ended in [
            Outcome::Exited { exit_code: 0 },
            Outcome::Exited { exit_code: 3 },
            Outcome::Trapped { message: "x".into() },
            Outcome::OutputExceeded { reason: "x".into() },
            Outcome::InputFailed { reason: "x".into() },
        ] {
            assert_eq!(then(&ended, true, false), Then::Delete, "{ended:?}");
        }
    }

    #[test]
    fn only_the_checkpoint_exit_code_is_a_checkpoint_exit() {
        let mut spec =
            CheckpointSpec { url: "http://s/c/".into(), macaroon: "m".into(), max_bytes: 1, exit_code: Some(85) };
        let exited = |code| Outcome::Exited { exit_code: code };
        assert_eq!(exit_outcome(Some(&spec), exited(85)), Outcome::Checkpointed { exit_code: 85 });
        assert_eq!(exit_outcome(Some(&spec), exited(84)), exited(84));
        assert_eq!(
            exit_outcome(Some(&spec), Outcome::Trapped { message: "x".into() }),
            Outcome::Trapped { message: "x".into() }
        );
        spec.exit_code = None;
        assert_eq!(exit_outcome(Some(&spec), exited(85)), exited(85), "only a stop keeps one");
        assert_eq!(exit_outcome(None, exited(85)), exited(85));
    }
}
