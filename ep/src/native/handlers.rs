//! The EP's warm handlers: idle [`Worker`]s kept between runs, each under the key its caller
//! gave it, so that the next run of the same function version starts without starting Python,
//! numpy or whatever the handler loads.
//!
//! A worker is handed out only for the very key it was made for (the caller's key names the
//! function, its version, image, command, environment with secrets, and resources: never
//! shared between functions, owners or versions). A kept worker is dropped:
//! - after [`HandlerOptions::idle_for`] without a run ([`Handlers::sweep`]);
//! - when a run of a newer version of its function is taken ([`Handlers::take`]); a worker of
//!   an older version that is serving then is not kept after;
//! - on [`Handlers::retire_all`] (a revocation at the scheduler), and any worker serving then is
//!   not kept after;
//! - when more than [`HandlerOptions::max_idle`] are kept (the longest idle first);
//! - when it died, or burned CPU while idle (that time would be charged to nobody): found
//!   when a run would take it, or by the sweep.
//!
//! The pool only sorts workers; the caller drops the ones it returns with [`Worker::retire`].
//!
//! Must not know: jobs, the link, the network.

use super::worker::Worker;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// CPU time an idle worker may use (a runtime's housekeeping) before it is dropped, ms.
pub const IDLE_CPU_MS: u64 = 200;

/// How long and how many workers are kept.
#[derive(Debug, Clone, Copy)]
pub struct HandlerOptions {
    /// Idle time after which a worker is dropped.
    pub idle_for: Duration,
    /// Most idle workers kept.
    pub max_idle: usize,
}

/// The idle workers.
#[derive(Debug)]
pub struct Handlers {
    options: HandlerOptions,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    idle: Vec<Idle>,
    /// The newest version of each function a run was taken for.
    newest: HashMap<String, u32>,
    /// Counts [`Handlers::retire_all`]: a worker lent before one is not kept after.
    epoch: u64,
}

#[derive(Debug)]
struct Idle {
    ticket: Ticket,
    worker: Worker,
    since: Instant,
    /// Its group's CPU time when it went idle, ms.
    cpu_ms: u64,
}

impl Idle {
    /// Whether it may serve: alive, and quiet since it went idle (CPU it used then would be
    /// charged to nobody).
    fn fit(&mut self) -> bool {
        if self.worker.usage().cpu_ms.saturating_sub(self.cpu_ms) > IDLE_CPU_MS {
            tracing::warn!(function = %self.ticket.function, "a handler burned CPU while idle; dropped");
            return false;
        }
        self.worker.is_alive()
    }
}

/// What a worker is kept under; [`Handlers::take`] gives one, [`Handlers::give_back`] takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    key: String,
    function: String,
    version: u32,
    epoch: u64,
}

impl Handlers {
    /// No worker yet.
    pub fn new(options: HandlerOptions) -> Handlers {
        Handlers { options, state: Mutex::new(State::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// For a run of `function` at `version` whose workers go under `key`: an idle worker of
    /// that key, alive and quiet, if one is kept (the most recently used); the ticket to give
    /// it (or a new one) back with; and the workers to retire now (of older versions of
    /// `function`, or of this key but dead or busy while idle).
    pub fn take(&self, key: &str, function: &str, version: u32) -> (Option<Worker>, Ticket, Vec<Worker>) {
        let mut state = self.state();
        let newest = state.newest.entry(function.to_owned()).or_insert(version);
        *newest = (*newest).max(version);
        let newest = *newest;
        let ticket = Ticket { key: key.to_owned(), function: function.to_owned(), version, epoch: state.epoch };
        let mut retired = Vec::new();
        let mut found = None;
        let idle = std::mem::take(&mut state.idle);
        // Newest last: the search from the end finds the most recently used. Only a worker of
        // this key is looked at closely (its group's files, its process); the others wait for
        // the sweep.
        for mut kept in idle.into_iter().rev() {
            let stale = kept.ticket.function == function && kept.ticket.version < newest;
            if stale || (found.is_none() && kept.ticket.key == key && !kept.fit()) {
                retired.push(kept.worker);
            } else if found.is_none() && kept.ticket.key == key {
                found = Some(kept.worker);
            } else {
                state.idle.push(kept);
            }
        }
        state.idle.reverse();
        (found, ticket, retired)
    }

    /// Keeps `worker`, lent with `ticket`, for the next run of its key, unless it may not be
    /// kept (a newer version of its function was taken, or [`Handlers::retire_all`] came since);
    /// returns what to retire (it, or the longest idle past `max_idle`).
    pub fn give_back(&self, worker: Worker, ticket: Ticket) -> Vec<Worker> {
        let mut state = self.state();
        let newest = state.newest.get(&ticket.function).copied().unwrap_or(ticket.version);
        if ticket.epoch != state.epoch || ticket.version < newest || self.options.max_idle == 0 {
            return vec![worker];
        }
        let cpu_ms = worker.usage().cpu_ms;
        state.idle.push(Idle { ticket, worker, since: Instant::now(), cpu_ms });
        let over = state.idle.len().saturating_sub(self.options.max_idle);
        state.idle.drain(..over).map(|i| i.worker).collect()
    }

    /// The workers idle for longer than `idle_for` at `now`, dead, or busy while idle, taken
    /// out to retire.
    pub fn sweep(&self, now: Instant) -> Vec<Worker> {
        let mut state = self.state();
        let idle = std::mem::take(&mut state.idle);
        let mut expired = Vec::new();
        for mut i in idle {
            if now.saturating_duration_since(i.since) >= self.options.idle_for || !i.fit() {
                expired.push(i.worker);
            } else {
                state.idle.push(i);
            }
        }
        expired
    }

    /// Every idle worker, taken out to retire; the ones serving now are not kept after.
    pub fn retire_all(&self) -> Vec<Worker> {
        let mut state = self.state();
        state.epoch += 1;
        std::mem::take(&mut state.idle).into_iter().map(|i| i.worker).collect()
    }

    /// The CPU time the idle worker of `key` used since it went idle, ms.
    #[cfg(test)]
    pub(crate) fn idle_cpu_ms(&self, key: &str) -> Option<u64> {
        let state = self.state();
        let kept = state.idle.iter().find(|i| i.ticket.key == key)?;
        Some(kept.worker.usage().cpu_ms.saturating_sub(kept.cpu_ms))
    }

    /// How many are idle now.
    pub fn idle(&self) -> usize {
        self.state().idle.len()
    }

    /// How often [`Handlers::sweep`] should run: often enough that none outlives `idle_for` by
    /// much, at most once a second.
    pub fn sweep_every(&self) -> Duration {
        (self.options.idle_for / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}

/// Retires `workers` (kills them and removes their directories) off the async threads.
pub async fn retire(workers: Vec<Worker>) {
    for w in workers {
        w.retire().await;
    }
}
