//! Compile ahead: the scheduler's [`SchedulerMsg::Warm`] names a module of a
//! registered function; the EP fetches it as it fetches a job's module (the URL's origin must be
//! one of [`Settings::origins`], checked here before anything is fetched; the bytes must hash
//! to the digest), compiles it and writes the artifact to its disk cache
//! ([`Runtime::prepare`](crate::runtime::Runtime::prepare)), so that the first event's job loads
//! it in milliseconds instead of compiling it (a Python component: 5-13 s).
//!
//! One module at a time, on a task of its own fed by a bounded queue ([`MAX_QUEUED`]; a module
//! already queued is not queued twice, and past the bound a warm is dropped and counted): the
//! link never waits for it, and no job waits behind it unless the job needs that very module,
//! in which case it waits for this compile (the per-module lock of `job`) rather than starting
//! a second one. A refused warm (origin, digest) is logged and counted
//! (`htfaas_ep_warm_refused_total`), as is a failed one (`htfaas_ep_warm_failed_total`); a
//! module refused for its compile time is remembered as refused, like a job's.
//!
//! [`SchedulerMsg::Warm`]: htfaas_functions::proto::SchedulerMsg::Warm
//!
//! Must not know: the attach protocol (the link hands messages in), users.

use crate::config::Settings;
use crate::job::{Jobs, ModuleMiss};
use crate::runtime::Prepared;
use htfaas_functions::Digest;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Most modules waiting to be compiled ahead.
pub(crate) const MAX_QUEUED: usize = 1024;

/// The queue of modules to compile ahead, and its worker.
pub(crate) struct Warmer {
    settings: Arc<Settings>,
    tx: mpsc::Sender<(Digest, String)>,
    /// Digests queued or being compiled, so a repeated message is not queued twice.
    pending: Arc<Mutex<HashSet<Digest>>>,
    worker: tokio::task::JoinHandle<()>,
}

impl Warmer {
    /// Starts the worker, which compiles through `jobs` (sharing its per-module locks).
    pub(crate) fn start(settings: Arc<Settings>, jobs: Arc<Jobs>) -> Warmer {
        let (tx, mut rx) = mpsc::channel::<(Digest, String)>(MAX_QUEUED);
        let pending: Arc<Mutex<HashSet<Digest>>> = Arc::default();
        let (done, s) = (pending.clone(), settings.clone());
        let worker = tokio::spawn(async move {
            while let Some((digest, url)) = rx.recv().await {
                warm_one(&s, &jobs, &digest, &url).await;
                done.lock().unwrap_or_else(|p| p.into_inner()).remove(&digest);
            }
        });
        Warmer { settings, tx, pending, worker }
    }

    /// Queues `digest` from `module_url` unless its origin is not allowed (refused and counted),
    /// it is already compiled in memory, or already queued. Never waits.
    pub(crate) fn warm(&self, digest: Digest, module_url: String) {
        let m = &self.settings.metrics;
        if let Err(e) = self.settings.origins.check("module_url", &module_url) {
            m.warm_refused_origin.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(digest = %digest.short(), "warm message refused: {e}");
            return;
        }
        if self.settings.runtime.cached(&digest).is_some() {
            return;
        }
        if !self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(digest.clone()) {
            return;
        }
        if self.tx.try_send((digest.clone(), module_url)).is_err() {
            self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&digest);
            m.warm_failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(digest = %digest.short(), "warm queue full ({MAX_QUEUED}); module left to its first job");
        }
    }
}

impl Drop for Warmer {
    fn drop(&mut self) {
        self.worker.abort();
    }
}

/// Fetches and compiles one module, counting what happened.
async fn warm_one(settings: &Settings, jobs: &Jobs, digest: &Digest, url: &str) {
    let m = &settings.metrics;
    let started = std::time::Instant::now();
    match jobs.warm(digest, url).await {
        Ok(Prepared::Ready) => tracing::debug!(digest = %digest.short(), "warm: already compiled"),
        Ok(Prepared::Compiled) => {
            m.warmed.fetch_add(1, Ordering::Relaxed);
            tracing::info!(digest = %digest.short(), compile_ms = crate::runtime::millis(started.elapsed()),
                "module compiled ahead of its first job");
        }
        Err(ModuleMiss::Digest(why)) => {
            m.warm_refused_digest.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(digest = %digest.short(), "warm refused: {why}");
        }
        Err(ModuleMiss::Failed(outcome)) => {
            m.warm_failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(digest = %digest.short(), "warm failed: {}", outcome.reason());
        }
    }
}
