//! The scheduler, htfaas's access point (HTCondor's schedd with direct attach, no central
//! manager).
//!
//! - `api`: `POST /v1/jobs` verifies a submit token and queues the job durably;
//!   `POST /v1/preflight` runs the same checks without using the token; `GET /v1/ep/attach`
//!   verifies an attach token and upgrades to a WebSocket; admin queries, job actions and
//!   revocations.
//! - [`queue`]: the SQLite store of jobs, run attempts, submit-token uses, owner accounts
//!   (with decayed usage and priority factors), group usage, revocations and EP admin settings
//!   (schema version 5, migrated stepwise from any earlier one on open).
//! - [`ep_link`]: one attached EP session (Hello → Welcome, Assign → Finished, Cancel), closed
//!   when its attach token expires or is revoked.
//! - `matching`: the table of attached EPs and `matching::select`, the matching policy
//!   (fair share, group quotas, partitionable resources, owner restriction, annex, per-owner
//!   running limit, drains and group pauses); `matching::EpSlot::refusal` says why not.
//! - [`policy`]: the site policy as configured: fair share, accounting groups, job classes,
//!   requirements, leases and retries.
//! - [`requirements`]: ClassAd-like requirement expressions (submit and hold requirements).
//! - `admin`: EP drain, disable, enable and group pause; `analyze`; priorities and factors.
//! - `annex`: annexes: an annex's attach token minted, its record kept
//!   (`annex_store`, a file of its own), its batch jobs recorded, its end extended or brought
//!   forward and told to its EPs (`SchedulerMsg::Lifetime`), its token revoked on delete.
//! - [`dispatch`]: the task that matches idle jobs to EPs and sends them, with their macaroons
//!   attenuated to the job's lifetime.
//! - `revocation`: what a revocation names and the in-memory revoked set; `revoke` applies
//!   one everywhere at once.
//! - `actions`: an admin's hold, release and remove of one job (`condor_hold`,
//!   `condor_release`, `condor_rm`); a held job is never matched until released.
//! - [`config`]: [`Config`] → [`Settings`], including the per-owner limits ([`OwnerLimits`]).
//! - `state`: `state::Shared`, what the handlers, sessions and the dispatcher share.
//! - `attach`: the attach protocol's version, close codes and bounds, and
//!   [`mint_attach_token`].
//! - `error` and `failure`: the store's [`QueueError`], and [`ApiFailure`], the one HTTP
//!   error answer.
//! - [`doubt`]: an EP's report checked before it counts: usage clamped to what the scheduler
//!   observed, outputs only under the job's output directory and bounded, else refused.
//! - [`trust`]: which URLs a job may name: input and output on the site's storages, the module
//!   at a module store's URL for the job's digest; no other URL reaches an EP.
//! - `warm`: compile ahead: the modules of registered functions, which attached
//!   EPs are told to compile before their first job (`SchedulerMsg::Warm`).
//! - `notify`: job-end notifications: the outbox the store fills in the
//!   transaction that ends a job, published on JetStream (`htfaas.jobs.<owner>.<function>.<state>`)
//!   and deleted after the PubAck.
//! - `metrics`: `GET /metrics` (Prometheus): jobs by state, dispatch latency, EP slots,
//!   refused credentials by reason, audit records.
//! - `report`: accounting reports over the job records, on a connection of their own.
//! - [`seal`]: the macaroons a job keeps in the store, sealed so that a copy of the file cannot
//!   use them.
//! - `renew`: renewing a running job's macaroons: an EP's `Renew`, checked (its
//!   session runs the job, within its run time, not revoked), sent to the gateway with the
//!   job's renewal grant, its answer attenuated as at dispatch.
//!
//! Invariants: an EP never learns a job's owner (a `JobAssignment` has none); an EP's owner
//! restriction and annex come from its attach token, never from its word: an owner-bound EP
//! only ever gets that owner's jobs, an annex EP only that annex's jobs, and an annex job runs
//! only on its annex; an EP holds a job's macaroons only as attenuated copies that expire soon
//! after the job must end (and, when the job asks, work only from the EP's address); a revoked
//! token is refused from the moment of its revocation, and nothing it started keeps running; a
//! job is `running` only on a live session (one whose lease holds); when that session ends it
//! runs again after a backoff, or is held past the retry limit, and so does a job whose EP
//! reports the storage unavailable (held with `HOLD_CODE_STORAGE`), while a storage's refusal
//! fails the job at once; a full disk refuses writes (`507` on submit, [`QueueError::DiskFull`])
//! and changes nothing committed, and a report the store cannot take yet is kept and tried
//! again until it can.
//! The scheduler holds ids, URLs and digests, never function bytes.
//!
//! Audit: every decision above is recorded in a tamper-evident trail kept in the queue's store,
//! in the decision's own transaction ([`queue`] lists what is recorded); its head is signed
//! (a checkpoint, with the key of [`Config::audit_key_file`]) by the dispatcher's housekeeping
//! tick when due and at shutdown. `GET /v1/audit`, `/v1/audit/verify` and `/v1/audit/keys`
//! (`api`) serve it.
//!
//! Shutdown (on the token given to [`run`]): stop accepting HTTP and close EP sessions (their
//! running jobs return to idle), stop the dispatcher and the notification publisher, wait for all of it (at most
//! [`EXIT_DEADLINE`]), sign the audit trail's head, then close the store.

mod actions;
mod admin;
mod annex;
mod annex_api;
mod annex_store;
mod api;
mod attach;
pub mod config;
pub mod dispatch;
pub mod doubt;
pub mod ep_link;
mod error;
mod failure;
mod gateway_client;
mod matching;
mod metrics;
mod notify;
mod otlp;
pub mod policy;
pub mod queue;
mod renew;
mod report;
mod reports;
pub mod requirements;
mod revocation;
mod revoke;
pub mod seal;
mod state;
mod submission;
#[cfg(test)]
mod testing;
pub mod trust;
mod validate;
mod warm;

pub use attach::mint_attach_token;
pub use config::{ATTACH_KID, Config, OwnerLimits, Settings, TrustedIssuer};
pub use error::QueueError;
pub use failure::ApiFailure;

use anyhow::Context as _;
use state::{EpLock, Shared};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long shutdown waits for sessions and the dispatcher.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(8);

/// Serves until `shutdown` is cancelled, then shuts down in order (see the crate docs).
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let url = settings.url();
    let Settings {
        listener,
        local_addr: _,
        queue,
        name,
        attach_key,
        attach_verifier,
        submit_verifiers,
        admin_token,
        tls,
        limits,
        policy,
        trust,
        audit_signer,
        audit_policy,
        http,
        annexes,
        notify,
        gateway,
        otlp,
    } = settings;
    tracing::info!(annexes = annexes.list().len(), "annex records read");
    let shared = Arc::new(Shared {
        queue,
        eps: EpLock::default(),
        wake: Notify::new(),
        submit_verifiers,
        attach_verifier,
        admin_token,
        shutdown: shutdown.clone(),
        sessions: TaskTracker::new(),
        limits,
        policy,
        trust,
        audit_signer,
        audit_policy,
        metrics: metrics::Metrics::new(),
        attach_key,
        name: name.clone(),
        annexes,
        warm: state::WarmList::default(),
        gateway,
        otlp,
    });
    {
        let rows = shared.queue.ep_admin().await.context("read the EPs' admin settings")?;
        let mut eps = shared.eps();
        for r in rows {
            let admin = matching::EpAdmin {
                state: r.state,
                deadline_ms: r.deadline_ms,
                paused: r.paused.into_iter().collect(),
                reason: r.reason,
            };
            eps.set_admin(&r.name, admin);
        }
    }
    let dispatcher = tokio::spawn(dispatch::run(shared.clone(), shutdown.child_token()));
    let publisher = notify.map(|n| tokio::spawn(notify::run(shared.queue.clone(), n, shutdown.child_token())));
    shared.wake.notify_one();
    tracing::info!(%url, name = %name, "scheduler listening");

    // Each request carries its peer's address (`ConnectInfo`): the attach route keeps it for
    // binding macaroons. Slow heads, stalled bodies and connection floods: `http`'s limits, on
    // the TLS listener (after its own handshake limits) as on the plain one.
    let app = api::router(shared.clone());
    let stop = shutdown.clone();
    let served = htfaas_functions::serve::serve_tcp(listener, tls, app, http, stop).await.context("serve HTTP");
    tracing::info!("HTTP stopped; closing EP sessions");
    // Whatever ended serving, end everything else too.
    shutdown.cancel();
    shared.sessions.close();
    if tokio::time::timeout(EXIT_DEADLINE, shared.sessions.wait()).await.is_err() {
        tracing::warn!("EP sessions still open after {EXIT_DEADLINE:?}; exiting anyway");
    }
    match tokio::time::timeout(EXIT_DEADLINE, dispatcher).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("dispatcher task failed: {e}"),
        Err(_) => {
            tracing::warn!("dispatcher still running after {EXIT_DEADLINE:?}; exiting anyway")
        }
    }
    if let Some(publisher) = publisher
        && tokio::time::timeout(EXIT_DEADLINE, publisher).await.is_err()
    {
        tracing::warn!("notification publisher still running after {EXIT_DEADLINE:?}; exiting anyway");
    }
    // Everything recorded by now (the sessions' lost attempts included) is signed.
    match shared.queue.audit_checkpoint(shared.audit_signer.clone(), shared.audit_policy, true).await {
        Ok(Some(cp)) => tracing::info!(seq = cp.seq, "audit trail checkpointed"),
        Ok(None) => {}
        Err(e) => tracing::error!("failed to checkpoint the audit trail at shutdown: {e}"),
    }
    tracing::info!("scheduler stopped");
    served
}
