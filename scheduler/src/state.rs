//! [`Shared`]: the state the HTTP handlers, the EP sessions and the dispatcher share (the
//! store, the EP table, verifiers, site policy, URL trust, the audit signer, the counters, the
//! attach key, the annexes' records, the warm list and the gateway renewals go to),
//! built once by [`crate::run`].
//!
//! Must not know: what is done with it (handlers, sessions, dispatch are above it).

use crate::annex_store::AnnexStore;
use crate::config::OwnerLimits;
use crate::matching::EpTable;
use crate::metrics::Metrics;
use crate::policy::SitePolicy;
use crate::queue::Queue;
use crate::trust::UrlTrust;
use htfaas_functions::Digest;
use htfaas_functions::audit::{AuditSigner, CheckpointPolicy};
use htfaas_functions::token::{SigningKey, Verifier};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// State shared by the HTTP handlers, EP sessions and the dispatcher.
pub struct Shared {
    /// The durable queue.
    pub(crate) queue: Queue,
    /// Attached EPs and their free resources ([`Shared::eps`] locks it).
    pub(crate) eps: EpLock,
    /// Wakes the dispatcher (submit, attach, finish, detach).
    pub(crate) wake: Notify,
    /// Verifiers of submit tokens, by issuer.
    pub(crate) submit_verifiers: HashMap<String, Verifier>,
    /// Verifier of our own attach tokens.
    pub(crate) attach_verifier: Verifier,
    /// Bearer of the admin endpoints.
    pub(crate) admin_token: String,
    /// Cancelled at shutdown; EP sessions watch it.
    pub(crate) shutdown: CancellationToken,
    /// EP sessions, awaited at shutdown.
    pub(crate) sessions: TaskTracker,
    /// Per-owner limits: idle ones checked at submit, running ones by matching.
    pub(crate) limits: OwnerLimits,
    /// Fair share, groups, classes, requirements, leases and retries.
    pub(crate) policy: SitePolicy,
    /// The storages and module stores a job's URLs must name ([`crate::trust`]).
    pub(crate) trust: UrlTrust,
    /// Signs the audit trail's checkpoints (the trail is in the queue's store).
    pub(crate) audit_signer: Arc<AuditSigner>,
    /// When it signs.
    pub(crate) audit_policy: CheckpointPolicy,
    /// Refusal counters and the dispatch latency of `GET /metrics` ([`crate::metrics`]).
    pub(crate) metrics: Metrics,
    /// Signs attach tokens: an annex's ([`crate::annex`]).
    pub(crate) attach_key: SigningKey,
    /// The issuer of attach tokens ([`crate::Config::name`]).
    pub(crate) name: String,
    /// The annexes' records ([`crate::annex_store`]).
    pub(crate) annexes: AnnexStore,
    /// The modules attached EPs compile ahead of their first job ([`crate::warm`]).
    pub(crate) warm: WarmList,
    /// Where running jobs' macaroons are renewed ([`crate::renew`]); none: never.
    pub(crate) gateway: Option<crate::gateway_client::Gateway>,
    /// Where ended jobs' spans are exported; none when not configured.
    pub(crate) otlp: Option<crate::otlp::Otlp>,
}

impl Shared {
    /// The EP table. A poisoned lock is taken over: the table holds no invariant that a
    /// panicking holder could have broken halfway (each method completes or does nothing).
    pub(crate) fn eps(&self) -> MutexGuard<'_, EpTable> {
        self.eps.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The EP table's lock, taken through [`Shared::eps`] only.
#[derive(Debug, Default)]
pub(crate) struct EpLock(Mutex<EpTable>);

/// Most modules on the warm list.
pub const MAX_WARM: usize = 1024;

/// One module on the warm list ([`crate::warm`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WarmEntry {
    pub(crate) digest: Digest,
    pub(crate) module_url: String,
    /// The function's owner: only EPs that may run its jobs are told.
    pub(crate) owner: String,
}

/// The warm list ([`crate::warm`]): modules EPs compile ahead of their first job, oldest first,
/// at most [`MAX_WARM`].
#[derive(Debug, Default)]
pub struct WarmList(Mutex<VecDeque<WarmEntry>>);

impl WarmList {
    /// Adds `entry` unless its digest is there; whether it was new.
    pub(crate) fn add(&self, entry: WarmEntry) -> bool {
        let mut list = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if list.iter().any(|e| e.digest == entry.digest) {
            return false;
        }
        if list.len() >= MAX_WARM {
            list.pop_front();
        }
        list.push_back(entry);
        true
    }

    pub(crate) fn snapshot(&self) -> Vec<WarmEntry> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// Modules on the list.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
