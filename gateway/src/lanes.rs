//! The owners' lanes (fair ingest): one durable JetStream consumer per owner with a
//! registered function, reading the path subjects (`storage.dcache.billing.path.<dir>._`,
//! [`htfaas_functions::proto::path_subject`]) of its owner's read namespace and firing only
//! that owner's functions, each in the ingest's batch loop ([`ingest::run_lane`]: group
//! commit, ack after commit, NAK with backoff).
//!
//! Why: with one consumer over one stream, an owner's flood of 100,000 events sat in front of
//! every other owner's next event (39 s, `htfaas overload`). A firing is always inside its
//! owner's read namespace (registration confines the trigger, [`crate::jobs::confine`] checks
//! the path again), so an owner's lane needs to read only the subjects under the directories
//! its functions' triggers are bounded to (inside its namespace: the registration checked it;
//! [`htfaas_functions::proto::path_filters`]), and another owner's backlog is not on it. The
//! triggers' bounds rather than the grants: tighter (alice's lane on `/data/flood/` does not
//! read bob's `/data/bob/` though her grant covers `/data/`), and an event under a revoked
//! grant is still read and its firing refused at job time, audited, as before lanes. A path two owners may read is read by both lanes, each firing its own owner's
//! functions: no double firing (the firing key is event id, function, digest, and a function
//! has one owner). The default lane ([`ingest::run`]) reads what names no directory (the plain
//! billing subject of a dCache bridge, CloudEvents) and fires every owner's functions, as
//! before lanes. The subject of a message in a lane is checked against its path
//! ([`htfaas_functions::sources::EventError::SubjectPath`]): a lying publisher fires nothing it routed.
//!
//! When: [`Lanes::sync`] at start, after each registration and grant change (before the API
//! answers), and every [`RESYNC`] (a lane whose loop failed is started again; a failed sync is
//! retried). A new lane is made with `DeliverPolicy::New`: no function of its owner existed
//! when older path-subject messages were published (or its namespace did not cover them), so
//! none of them could have fired one, and replaying them would only make work (`htfaas events
//! replay` is there for a deliberate re-run). An existing lane (a gateway restart) resumes where
//! its acks left it; one whose owner's triggers changed gets the new filters in place (its
//! position stays); one whose owner has no function left (or none bounded and no read directory) is stopped and
//! its consumer deleted, and so is, at start, any lane consumer of this gateway no owner needs.
//!
//! Cost per lane: one durable consumer in nats-server (its state, on disk with the stream),
//! one outstanding pull with a heartbeat every 15 s, one task, up to `2 × BATCH_MAX` messages
//! buffered by the client; a message under a directory N owners may read is delivered N times
//! (counted N times in `events_received`). No bound is enforced: lanes are one per owner with a
//! function, meant for tens to a few hundred owners; past that, owners sharing a namespace
//! would share a lane (not built).
//!
//! Must not know: HTTP, the firing table's SQL, how a message is decided and fired
//! ([`ingest`]'s).

use crate::ingest;
use crate::state::Shared;
use anyhow::Context as _;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::stream::Stream;
use futures_util::StreamExt as _;
use htfaas_functions::Digest;
use htfaas_functions::proto::path_filters;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often the lanes are checked against the registry and the grants even when nothing
/// told them to: a failed lane loop is restarted, a failed sync retried.
pub const RESYNC: Duration = Duration::from_secs(10);

/// The owners' lanes of one gateway. Cheap to clone (one shared set).
#[derive(Clone)]
pub struct Lanes {
    inner: Arc<Inner>,
}

struct Inner {
    /// The events stream (and its connection).
    stream: Stream,
    /// The default lane's consumer name: each lane's is `<base>-lane-<hash of its owner>`.
    base: String,
    /// Deliveries of a message at most (as the default lane).
    max_deliver: i64,
    /// What the lanes' loops fire with, and where owners and grants are read.
    shared: Arc<Shared>,
    /// Stops every lane.
    shutdown: CancellationToken,
    /// The running lanes by owner; the lock also makes syncs one at a time.
    lanes: tokio::sync::Mutex<BTreeMap<String, Lane>>,
}

/// One running lane.
struct Lane {
    /// Its durable consumer.
    consumer: String,
    /// Its subject filters now.
    filters: Vec<String>,
    /// Stops its loop.
    stop: CancellationToken,
    /// Its loop ([`ingest::run_lane`]).
    task: JoinHandle<anyhow::Result<()>>,
}

/// The durable consumer name of `owner`'s lane: `<base>-lane-` and 16 hex digits of the
/// SHA-256 of the owner's name (valid whatever characters the name has, and distinct for
/// distinct owners but with probability 2^-64 per pair).
pub fn consumer_name(base: &str, owner: &str) -> String {
    format!("{base}-lane-{}", &Digest::of(owner.as_bytes()).hex()[..16])
}

impl Lanes {
    /// Makes (or resumes) the lanes of every owner with a function, deletes this gateway's
    /// lane consumers no owner needs, and keeps them in step every [`RESYNC`] until
    /// `shutdown`. `base` is the default lane's consumer name.
    pub async fn start(
        stream: Stream,
        base: &str,
        max_deliver: i64,
        shared: Arc<Shared>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Lanes> {
        let lanes = Lanes {
            inner: Arc::new(Inner {
                stream,
                base: base.to_owned(),
                max_deliver,
                shared,
                shutdown,
                lanes: tokio::sync::Mutex::default(),
            }),
        };
        lanes.sync().await?;
        lanes.delete_strays().await?;
        let again = lanes.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RESYNC);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = again.inner.shutdown.cancelled() => break,
                    _ = tick.tick() => {}
                }
                if let Err(e) = again.sync().await {
                    tracing::warn!("could not bring the ingest lanes in step (retrying in {RESYNC:?}): {e:#}");
                }
            }
        });
        Ok(lanes)
    }

    /// What each owner's lane should read: the path filters of the directories its functions'
    /// triggers are bounded to (registration confines them to the owner's read namespace), or,
    /// when a trigger bounds no path (stored before namespaces were mandatory), of its read
    /// directories; for every owner with a function and a directory.
    fn wanted(&self) -> BTreeMap<String, Vec<String>> {
        let shared = &self.inner.shared;
        shared
            .triggers
            .owner_dirs()
            .into_iter()
            .filter_map(|(owner, dirs)| {
                let dirs = dirs.unwrap_or_else(|| shared.namespaces.of(&owner, None).read_dirs().to_vec());
                let filters = path_filters(dirs.iter().map(String::as_str).filter(|d| d.starts_with('/')));
                (!filters.is_empty()).then_some((owner, filters))
            })
            .collect()
    }

    /// Brings the lanes in step with the registry and the grants now: makes the lanes of new
    /// owners, updates the filters of those whose triggers changed, restarts a lane whose loop
    /// ended, stops and deletes those no owner needs. Returns once every lane it could make
    /// reads (the first error, after trying every owner).
    pub async fn sync(&self) -> anyhow::Result<()> {
        let inner = &self.inner;
        let mut lanes = inner.lanes.lock().await;
        if inner.shutdown.is_cancelled() {
            return Ok(());
        }
        let wanted = self.wanted();
        let gone: Vec<String> = lanes.keys().filter(|o| !wanted.contains_key(*o)).cloned().collect();
        for owner in gone {
            let Some(lane) = lanes.remove(&owner) else { continue };
            lane.stop.cancel();
            let _ = lane.task.await;
            match inner.stream.delete_consumer(&lane.consumer).await {
                Ok(_) => tracing::info!(
                    owner,
                    consumer = lane.consumer,
                    "ingest lane deleted (no function or no read grant)"
                ),
                Err(e) => tracing::warn!(owner, consumer = lane.consumer, "could not delete an ingest lane: {e}"),
            }
        }
        let mut first_error = None;
        for (owner, filters) in wanted {
            let (same, running) = match lanes.get(&owner) {
                Some(lane) => (lane.filters == filters, !lane.task.is_finished()),
                None => (false, false),
            };
            if same && running {
                continue;
            }
            if let Err(e) = self.open(&mut lanes, &owner, filters, running).await {
                tracing::error!(owner, "could not open the ingest lane: {e:#}");
                first_error.get_or_insert(e);
            }
        }
        inner.shared.stats.ingest_lanes.store(lanes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        first_error.map_or(Ok(()), Err)
    }

    /// Makes, finds or updates `owner`'s consumer with `filters`, and starts its loop unless
    /// one is `running`.
    async fn open(
        &self,
        lanes: &mut BTreeMap<String, Lane>,
        owner: &str,
        filters: Vec<String>,
        running: bool,
    ) -> anyhow::Result<()> {
        let inner = &self.inner;
        let consumer = consumer_name(&inner.base, owner);
        let config = pull_config(&consumer, inner.max_deliver, filters.clone(), owner);
        let handle = ingest::durable_lane(&inner.stream, config).await?;
        if running && let Some(lane) = lanes.get_mut(owner) {
            tracing::info!(owner, consumer, ?filters, "ingest lane's subjects updated");
            lane.filters = filters;
            return Ok(());
        }
        if let Some(old) = lanes.remove(owner) {
            match old.task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(owner, "the ingest lane's loop ended: {e:#}; starting it again"),
                Err(e) => tracing::warn!(owner, "the ingest lane's loop failed: {e}; starting it again"),
            }
        }
        let stop = inner.shutdown.child_token();
        let task = tokio::spawn(ingest::run_lane(handle, inner.shared.clone(), Some(owner.to_owned()), stop.clone()));
        tracing::info!(owner, consumer, ?filters, "ingest lane reading");
        lanes.insert(owner.to_owned(), Lane { consumer, filters, stop, task });
        Ok(())
    }

    /// Deletes the lane consumers of this gateway (named `<base>-lane-…`) that no owner needs
    /// now: left by an owner whose grants went while the gateway was down.
    async fn delete_strays(&self) -> anyhow::Result<()> {
        let inner = &self.inner;
        let lanes = inner.lanes.lock().await;
        let ours = format!("{}-lane-", inner.base);
        let mut names = inner.stream.consumer_names();
        let mut strays = Vec::new();
        while let Some(name) = names.next().await {
            let name = name.context("list the events stream's consumers")?;
            if name.starts_with(&ours) && !lanes.values().any(|l| l.consumer == name) {
                strays.push(name);
            }
        }
        for name in strays {
            match inner.stream.delete_consumer(&name).await {
                Ok(_) => tracing::info!(consumer = name, "stray ingest lane deleted"),
                Err(e) => tracing::warn!(consumer = name, "could not delete a stray ingest lane: {e}"),
            }
        }
        Ok(())
    }

    /// Each lane's consumer (the default lane's first) with its messages not yet acked
    /// (JetStream's count of those not yet delivered, plus those delivered and not acked;
    /// `None` when the lookup failed). One JetStream request per lane.
    pub async fn pending(&self) -> Vec<(String, Option<u64>)> {
        let inner = &self.inner;
        let mut consumers = vec![inner.base.clone()];
        consumers.extend(inner.lanes.lock().await.values().map(|l| l.consumer.clone()));
        let mut out = Vec::with_capacity(consumers.len());
        for consumer in consumers {
            let info = inner.stream.consumer_info(&consumer).await;
            out.push((consumer, info.ok().map(|i| i.num_pending + i.num_ack_pending as u64)));
        }
        out
    }

    /// Stops every lane (their in-flight batches finish) and waits for them.
    pub async fn stop(&self) {
        let mut lanes = self.inner.lanes.lock().await;
        for (_, lane) in std::mem::take(&mut *lanes) {
            lane.stop.cancel();
            match lane.task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("an ingest lane ended: {e:#}"),
                Err(e) => tracing::warn!("an ingest lane failed: {e}"),
            }
        }
    }
}

/// [`Lanes::sync`] after `what` changed the registry or the grants (the API, before it
/// answers): a failure is logged, not answered (the change is made; the next [`RESYNC`]
/// tries again). Nothing without lanes (an API without an ingest: tests).
pub async fn after_change(lanes: Option<&Lanes>, what: &str) {
    let Some(lanes) = lanes else { return };
    if let Err(e) = lanes.sync().await {
        tracing::error!("after {what}, the ingest lanes could not be brought in step (retrying in {RESYNC:?}): {e:#}");
    }
}

/// An owner's lane's consumer: [`ingest::lane_config`] with `filters`, delivering only
/// messages published from its creation on ([`DeliverPolicy::New`], see the module's doc).
fn pull_config(
    consumer: &str,
    max_deliver: i64,
    filters: Vec<String>,
    owner: &str,
) -> async_nats::jetstream::consumer::pull::Config {
    let description = format!("htfaas ingest lane of {owner}");
    async_nats::jetstream::consumer::pull::Config {
        deliver_policy: DeliverPolicy::New,
        ..ingest::lane_config(consumer, max_deliver, filters, Some(description))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_names_are_valid_consumer_names_and_distinct() {
        let a = consumer_name("gateway", "alice");
        assert!(a.starts_with("gateway-lane-") && a.len() == "gateway-lane-".len() + 16, "{a}");
        for owner in ["alice", "bob", "a.b", "a b", "*", ">", "ünï", ""] {
            let n = consumer_name("gateway", owner);
            assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "{n}");
        }
        assert_ne!(consumer_name("gateway", "alice"), consumer_name("gateway", "alice "));
    }
}
