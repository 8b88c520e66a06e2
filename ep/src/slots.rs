//! Running out of room on the host: the pooling allocator's instance slots and a run's table
//! of WASI resources, told apart from the guest's own failures.
//!
//! - A full pool is the EP's state, not the job's fault: the runtime says so
//!   ([`GuestRun::no_free_slot`](crate::runtime::GuestRun::no_free_slot)), the job waits up to
//!   [`SLOT_WAIT`] for a slot to free, and if none does it is *returned* to the scheduler: a
//!   [`Outcome::Cancelled`](htfaas_functions::proto::Outcome::Cancelled) that the scheduler did
//!   not ask for, which it records as `returned` and queues again at once, nothing charged
//!   (the path a draining EP uses for an assignment that crossed its `Draining`). Never a
//!   failure of the job.
//! - A guest past its table of open resources traps with a message naming the limit.
//! - A guest thread the job layer had to leave behind (a host call that ignored the deadline)
//!   holds its pool slot until it returns; [`Abandoned`] counts such threads, and they are
//!   logged when left and when they end.
//!
//! Knows wasmtime's error types; nothing of the network.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use wasmtime::component::ResourceTableError;

/// How long a job whose guest found no free slot keeps trying (every [`SLOT_RETRY`]) before it
/// is returned to the scheduler.
pub(crate) const SLOT_WAIT: Duration = Duration::from_secs(2);
/// Pause between two tries for a slot.
pub(crate) const SLOT_RETRY: Duration = Duration::from_millis(100);

/// The reason of the `Cancelled` report that returns a job for want of a slot.
pub(crate) fn returned_reason(why: &str) -> String {
    format!("returned by the EP, not run: {why}; the scheduler runs it again")
}

/// `Some(why)` when `e` is the pool refusing an instance, memory, table or fiber stack because
/// every slot is taken.
pub(crate) fn pool_full(e: &wasmtime::Error) -> Option<String> {
    e.chain()
        .find_map(|cause| cause.downcast_ref::<wasmtime::PoolConcurrencyLimitError>())
        .map(|full| format!("no free instance slot on this EP (every slot of its pool is taken: {full})"))
}

/// `Some(message)` when `e` is a guest trapped because its table of WASI resources is full.
pub(crate) fn table_full(e: &wasmtime::Error, limit: usize) -> Option<String> {
    let full =
        e.chain().any(|cause| matches!(cause.downcast_ref::<ResourceTableError>(), Some(ResourceTableError::Full)));
    full.then(|| {
        format!(
            "too many open files: the guest held {limit} WASI resources at once (open files and \
             directories, streams, pollables), the EP's limit per job"
        )
    })
}

/// Guest threads left running after their job was reported; each holds a pool slot.
#[derive(Debug, Clone, Default)]
pub(crate) struct Abandoned {
    count: Arc<AtomicUsize>,
}

impl Abandoned {
    /// Threads left behind and still running.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// A fresh mark for one guest thread, shared by the job (which may leave it) and the thread.
    pub(crate) fn mark(&self) -> ThreadMark {
        ThreadMark { state: Arc::new(std::sync::Mutex::new(ThreadState::Running)), count: self.count.clone() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ThreadState {
    Running,
    Left,
    Done,
}

/// One guest thread's state: running, left behind by its job, or done.
#[derive(Debug, Clone)]
pub(crate) struct ThreadMark {
    state: Arc<std::sync::Mutex<ThreadState>>,
    count: Arc<AtomicUsize>,
}

impl ThreadMark {
    /// The job stops waiting for the thread (counted until [`ThreadMark::done`]).
    pub(crate) fn leave(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *s == ThreadState::Running {
            *s = ThreadState::Left;
            let now = self.count.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(abandoned = now, "guest thread left behind; it holds a pool slot until it returns");
        }
    }

    /// Whether the job stopped waiting for a thread that has not returned yet.
    pub(crate) fn is_left(&self) -> bool {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) == ThreadState::Left
    }

    /// The thread returned (its store, and slot, are gone).
    pub(crate) fn done(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *s == ThreadState::Left {
            let now = self.count.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
            tracing::info!(abandoned = now, "a guest thread left behind returned; its slot is free");
        }
        *s = ThreadState::Done;
    }
}
