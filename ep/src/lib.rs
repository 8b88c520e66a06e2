//! htfaas execution point (EP).
//!
//! An EP dials the scheduler (`GET {scheduler_url}/v1/ep/attach`, WebSocket, `Bearer` attach
//! token), says [`Hello`](htfaas_functions::proto::Hello) with the slots it offers, and then runs
//! every [`JobAssignment`](htfaas_functions::proto::JobAssignment) it is sent, answering each
//! with one [`JobReport`](htfaas_functions::proto::JobReport), whatever happens.
//!
//! - [`Config`] → [`Config::resolve`] → [`Settings`]: the engine, linker, HTTP client, TLS trust
//!   (system roots plus [`Config::tls_ca_file`], the same for `wss://` and `https://`),
//!   directories, and the slots and labels advertised (what [`detect`] found where the config
//!   leaves it open), built once;
//! - [`run`] / [`run_with`]: the attach loop (reconnects with backoff, keeps reports across
//!   disconnects, drains on shutdown (telling the scheduler `Draining`) or stops at once,
//!   cancels a job on the scheduler's `Cancel`, and ends with an error when the scheduler
//!   refuses the attach token for good: HTTP 401/403, close code 4401/4403);
//! - [`detect`]: cores, memory, free disk, GPUs of the host (cgroup limits included);
//! - `origins`: the only places a job's module, input and outputs may be fetched from or
//!   stored to ([`Config::allowed_origins`]), checked before any transfer and on every redirect;
//! - [`runtime`]: the wasm host alone (engine, module cache, one run in a fresh store, stopped by
//!   its wall-time cap or its [`CancelSignal`](runtime::CancelSignal)); no network;
//! - `warm`: modules compiled ahead of their first job, as the scheduler names them;
//! - `job`: one assignment end to end (module fetch and verify, input download, run, output
//!   upload, clean-up), each step stopped by a cancel;
//! - `checkpoint`: a job's `/checkpoint`, restored before its run, stored when its guest asks
//!   (its checkpoint exit code) or is stopped, deleted once the job ends for good;
//! - `refs`, `refcache`: a job's reference files under `/input/ref/`, linked from the EP's
//!   cache by content ([`Config::ref_cache_mb`]) when the storage names bytes it holds;
//! - `renew`: a job's macaroons kept valid while it needs them: renewed through the
//!   scheduler before a use and while the job runs, when they expire first;
//! - [`local`]: one run on a local file with no stack (`htfaas fn run`), in the same runtime
//!   and limits as a job;
//! - `metrics`: the optional Prometheus listener ([`Config::metrics_listen`]);
//! - the lifecycle watcher: leaves at the end of [`Settings::lifetime`] (or of the lifetime the
//!   scheduler set since: `SchedulerMsg::Lifetime`, an annex's end, longer or shorter), or
//!   after [`Settings::idle_shutdown`] without a running job (a running job holds it off).
//!
//! Invariants: the EP knows nothing about NATS or users; a guest failure is an
//! [`Outcome`](htfaas_functions::proto::Outcome), never an `Err`; macaroons and the attach
//! token appear only in `Authorization` headers, never in logs.

mod artifacts;
mod checkpoint;
mod code;
mod compile;
mod config;
mod counters;
pub mod detect;
mod guest_log;
mod job;
mod kept_token;
mod lifecycle;
mod link;
pub mod local;
mod metrics;
pub mod native;
mod native_job;
mod options;
mod origins;
mod refcache;
mod refs;
mod renew;
mod report_log;
pub mod runtime;
mod scratch;
mod sleep;
mod slots;
mod tls;
mod transfer;
mod warm;

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub use config::{Config, DEFAULT_DRAIN_TIMEOUT, DEFAULT_SIGTERM_DRAIN_TIMEOUT, STOP_GRACE, Settings, check_labels};
pub use runtime::{Runtime, RuntimeOptions};

/// Runs the EP until `shutdown` is cancelled, then drains: [`run_with`] with `shutdown` as the
/// drain and no quick stop.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_with(settings, shutdown, CancellationToken::new()).await
}

/// Runs the EP: attaches to the scheduler (reconnecting with backoff from 100 ms to 5 s), runs
/// each assignment in its own task and reports it. Reports of jobs that end while disconnected
/// are sent after the next attach.
///
/// - `drain` (SIGTERM in `htfaas ep`; also the end of [`Settings::lifetime`] or
///   [`Settings::idle_shutdown`]): the EP sends `Draining` (the scheduler then assigns it
///   nothing more; an `Assign` already on its way is answered at once with a `Cancelled`
///   report, reason `EP draining`), keeps the session while running jobs finish and their
///   reports go out, up to [`Settings::drain_timeout`], then closes and returns. Jobs still
///   running at that deadline are stopped as below.
/// - `stop` (SIGINT or a second SIGTERM in `htfaas ep`): the EP says `Draining` too, cancels
///   every running job and does not report them (the scheduler runs them again when the
///   session closes), sends the reports of jobs already finished, waits up to [`STOP_GRACE`]
///   (or, while native jobs run, their longest vacate time and a few seconds: a native job gets
///   SIGTERM and its vacate time before its group is killed; a wasm job is interrupted at once)
///   for the cancelled jobs to clean up, then closes and returns.
///
/// Returns an error, without reconnecting, when the scheduler refuses the attach token for good
/// (HTTP 401/403 on attach, close code 4401/4403); jobs still running then are cancelled and
/// their reports lost (the scheduler hands them to another EP).
pub async fn run_with(mut settings: Settings, drain: CancellationToken, stop: CancellationToken) -> anyhow::Result<()> {
    let listener = settings.metrics_listener.take();
    let settings = Arc::new(settings);
    // The metrics stay up while the EP drains, and go with it.
    let metrics_stop = CancellationToken::new();
    let metrics = listener.map(|l| {
        tracing::info!(addr = ?l.local_addr().ok(), "serving metrics");
        tokio::spawn(metrics::serve(l, settings.clone(), metrics_stop.clone()))
    });
    // The EP's own reasons to leave (lifetime, idle) end it the same way a drain does.
    if let Some(lifetime) = settings.lifetime {
        settings.lease.start(lifetime);
    }
    let leave = drain.child_token();
    let watcher = tokio::spawn(watch_lifecycle(settings.clone(), leave.clone()));
    let native = settings.native.clone();
    let sweeper = native.clone().map(|host| tokio::spawn(sweep_handlers(host)));
    let result = link::run(settings, leave, stop).await;
    watcher.abort();
    if let (Some(host), Some(sweeper)) = (native, sweeper) {
        sweeper.abort();
        native::handlers::retire(host.handlers.retire_all()).await;
    }
    metrics_stop.cancel();
    if let Some(m) = metrics {
        let _ = m.await;
    }
    result
}

/// Retires idle handlers past their idle time, until aborted.
async fn sweep_handlers(host: Arc<native::host::NativeHost>) {
    let mut tick = tokio::time::interval(host.handlers.sweep_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let expired = host.handlers.sweep(std::time::Instant::now());
        if !expired.is_empty() {
            tracing::debug!(count = expired.len(), "idle handlers retired");
            native::handlers::retire(expired).await;
        }
    }
}

/// Cancels `leave` when the lifetime is over or the EP has been idle too long. Watches even
/// without a lifetime of its own: the scheduler may set one (an annex's end).
async fn watch_lifecycle(settings: Arc<Settings>, leave: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = leave.cancelled() => return,
            _ = tick.tick() => {}
        }
        if settings.lease.over() {
            tracing::info!(lifetime = ?settings.lifetime, "lifetime reached; leaving");
            break;
        }
        if let (Some(limit), Some(idle)) = (settings.idle_shutdown, settings.activity.idle_for())
            && idle >= limit
        {
            tracing::info!(?idle, "idle too long; leaving");
            break;
        }
    }
    leave.cancel();
}
