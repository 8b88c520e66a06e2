//! A wasm guest's run on a thread of its own ([`run_on_thread`]), taken from the kept guest
//! threads ([`super::threads`]), and the walk of its `/output` made there as the run ends.
//!
//! Must not know: the link, the job's transfers beyond that walk, native runs.

use super::threads;
use crate::runtime::{CancelSignal, Guest, GuestJob, GuestRun, RunLimits, Runtime, millis};
use crate::slots::ThreadMark;
use crate::transfer::{Outputs, walk_outputs};
use htfaas_functions::proto::Outcome;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long past its wall-time cap, or after a cancel, a job waits for its guest's thread before
/// leaving it behind (only a guest stuck in a blocking host call takes that long; others stop
/// within one epoch tick).
const ABANDON_GRACE: Duration = Duration::from_secs(2);

/// Runs the guest on a thread of its own and waits for it without blocking the async runtime.
/// The wait is not cut short by a cancel: `cancel` stops the guest itself, so its usage is kept.
///
/// A backstop for a guest stuck in a host call that ignores the deadline (no sleep does since
/// `crate::sleep`; a file operation on a hung filesystem could): past the wall-time cap plus
/// [`ABANDON_GRACE`], or [`ABANDON_GRACE`] after a cancel, the job stops waiting and reports
/// without that thread's usage. The thread, counted by `mark` while left behind (it holds a
/// pool slot), ends by itself when its call returns (the epoch callback then stops the guest at
/// once); its job directory is gone by then and its result is dropped.
pub(super) async fn run_on_thread(
    threads: &threads::GuestThreads,
    rt: Arc<Runtime>,
    guest: Guest,
    job: GuestJob,
    cancel: CancelSignal,
    (limits, max_files): (RunLimits, usize),
    mark: ThreadMark,
) -> (GuestRun, Option<Outputs>) {
    let limit_s = job.resources.runtime_s;
    let started = Instant::now();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stop = cancel.clone();
    let on_thread = mark.clone();
    let spawned = threads.run(
        "ep-guest",
        Box::new(move || {
            let ran = rt.run_job_limited(&guest, &job, &stop, limits);
            // The walk of `/output` the job makes once the guest ended, on this thread while
            // it is here: a hand-off to a blocking thread of its own saved. A stopped run is not
            // walked (its job stores nothing); a thread left behind walks as its call returns,
            // and the result is dropped with the rest.
            let walked = (!stop.is_cancelled()).then(|| walk_outputs(&job.output_dir, max_files));
            on_thread.done();
            let _ = tx.send((ran, walked));
        }),
    );
    let failed = |outcome: Outcome, note: Option<String>| GuestRun {
        notes: note.into_iter().collect(),
        ..GuestRun::unrun(outcome, millis(started.elapsed()))
    };
    if let Err(e) = spawned {
        let reason = format!("EP could not start a thread for the guest: {e}");
        return (failed(Outcome::ModuleFailed { reason }, None), None);
    }
    let cap = Duration::from_secs(limit_s).saturating_add(ABANDON_GRACE);
    let give_up = async {
        tokio::select! {
            _ = tokio::time::sleep(cap) => Outcome::TimeExceeded { limit_s, vacate: None },
            _ = async { cancel.cancelled().await; tokio::time::sleep(ABANDON_GRACE).await } => cancel.outcome(),
        }
    };
    tokio::select! {
        biased;
        ran = rx => ran.unwrap_or_else(|_| {
            let reason = "EP internal error: the guest's thread panicked".into();
            (failed(Outcome::ModuleFailed { reason }, None), None)
        }),
        outcome = give_up => {
            mark.leave();
            tracing::warn!("guest blocked in a host call did not stop; leaving its thread behind");
            let note = "the guest was blocked in a host call and did not stop; its output and usage are lost";
            (failed(outcome, Some(note.into())), None)
        }
    }
}
