//! The job-end notification publisher: it takes the outbox's entries
//! ([`Queue::outbox`], written in the transaction that ended each job) oldest first, publishes
//! each on JetStream ([`JOBS_STREAM`], subject `htfaas.jobs.<owner>.<function>.<state>`, header
//! `Nats-Msg-Id` = `<job id>.<seq>`), and deletes an entry only once its PubAck came
//! ([`Queue::outbox_done`]).
//!
//! Nothing is lost: with NATS down (or the stream missing, or a publish refused) the entries
//! stay, and the publisher tries again after a backoff (from [`MIN_BACKOFF`], doubled to
//! [`MAX_BACKOFF`]); a scheduler that stops or crashes finds them in its store when it starts
//! again. A notification is published at least once; a second publish of the same entry (its
//! PubAck lost, the scheduler killed before the delete) is dropped by the stream's duplicate
//! window ([`DUPLICATE_WINDOW`]), and a consumer that needs more can key on the message id.
//!
//! Every `.await` of [`run`] is safe to cancel: the outbox is the state, and an entry published
//! but not deleted is published again (and dropped as a duplicate).
//!
//! Must not know: `Shared`, HTTP, EP sessions, who reads the stream.

use crate::queue::Queue;
use async_nats::jetstream;
use htfaas_functions::nats::NatsCredential;
use htfaas_functions::proto::{JOBS_MAX_AGE_S, JOBS_STREAM, JOBS_SUBJECTS, JobNotification};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Most entries published at once (their PubAcks awaited together).
pub const BATCH: usize = 256;
/// How often an empty outbox is looked at again.
pub const POLL: Duration = Duration::from_millis(100);
/// First wait after a failure.
pub const MIN_BACKOFF: Duration = Duration::from_millis(200);
/// Longest wait after failures.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The stream's duplicate window: a re-publish of one entry within it is dropped.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(600);

/// Where and how the scheduler publishes notifications (`Config::nats_url` and the rest).
#[derive(Debug, Clone)]
pub struct NotifySettings {
    /// The servers (one, or a cluster's).
    pub servers: Vec<async_nats::ServerAddr>,
    /// The scheduler's NATS credential, if the server wants one.
    pub credential: Option<NatsCredential>,
    /// Replicas of [`JOBS_STREAM`] when the scheduler creates it.
    pub replicas: usize,
}

/// The stream of notifications: [`JOBS_SUBJECTS`], file storage, kept [`JOBS_MAX_AGE_S`].
pub fn stream_config(replicas: usize) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: JOBS_STREAM.to_owned(),
        subjects: vec![JOBS_SUBJECTS.to_owned()],
        max_age: Duration::from_secs(JOBS_MAX_AGE_S),
        storage: jetstream::stream::StorageType::File,
        duplicate_window: DUPLICATE_WINDOW,
        num_replicas: replicas.max(1),
        ..Default::default()
    }
}

/// Publishes the outbox until `shutdown`; see the module's doc.
pub async fn run(queue: Queue, settings: NotifySettings, shutdown: CancellationToken) {
    let options = htfaas_functions::nats::connect_options("htfaas-scheduler", settings.credential.as_ref())
        .retry_on_initial_connect();
    let client = tokio::select! {
        () = shutdown.cancelled() => return,
        c = options.connect(settings.servers.clone()) => c,
    };
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("job-end notifications are off: the NATS connection could not be set up: {e}");
            return;
        }
    };
    let js = jetstream::new(client);
    let mut backoff = MIN_BACKOFF;
    let mut stream_ready = false;
    tracing::info!(stream = JOBS_STREAM, "publishing job-end notifications");
    loop {
        if shutdown.is_cancelled() {
            break;
        }
        let step = if stream_ready { publish_some(&queue, &js).await } else { ensure_stream(&js, &settings).await };
        let wait = match step {
            Ok(Step::Ready) => {
                stream_ready = true;
                backoff = MIN_BACKOFF;
                continue;
            }
            Ok(Step::Published(n)) => {
                backoff = MIN_BACKOFF;
                tracing::debug!(notifications = n, "published");
                continue;
            }
            Ok(Step::Idle) => POLL,
            Err(e) => {
                tracing::warn!("job-end notifications wait (retrying in {backoff:?}): {e:#}");
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
        }
    }
    tracing::info!("job-end notification publisher stopped");
}

/// What one round did.
enum Step {
    /// The stream exists.
    Ready,
    /// This many entries published and deleted.
    Published(usize),
    /// Nothing to publish.
    Idle,
}

async fn ensure_stream(js: &jetstream::Context, settings: &NotifySettings) -> anyhow::Result<Step> {
    use anyhow::Context as _;
    js.get_or_create_stream(stream_config(settings.replicas))
        .await
        .with_context(|| format!("create the JetStream stream {JOBS_STREAM}"))?;
    Ok(Step::Ready)
}

async fn publish_some(queue: &Queue, js: &jetstream::Context) -> anyhow::Result<Step> {
    use anyhow::Context as _;
    let batch = queue.outbox(BATCH).await.context("read the outbox")?;
    if batch.is_empty() {
        return Ok(Step::Idle);
    }
    let mut acks = Vec::with_capacity(batch.len());
    let mut failed = None;
    for n in &batch {
        match publish(js, n).await {
            Ok(ack) => acks.push((n.seq, ack)),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let mut done = Vec::with_capacity(acks.len());
    for (seq, ack) in acks {
        match ack.await {
            Ok(_) => done.push(seq),
            Err(e) => {
                failed.get_or_insert_with(|| anyhow::anyhow!("the PubAck of entry {seq}: {e}"));
            }
        }
    }
    let published = done.len();
    if !done.is_empty() {
        queue.outbox_done(done).await.context("delete the published entries")?;
    }
    match failed {
        Some(e) if published == 0 => Err(e),
        Some(e) => {
            tracing::warn!("some job-end notifications wait: {e:#}");
            Ok(Step::Published(published))
        }
        None => Ok(Step::Published(published)),
    }
}

async fn publish(js: &jetstream::Context, n: &JobNotification) -> anyhow::Result<jetstream::context::PublishAckFuture> {
    let payload = serde_json::to_vec(n)?;
    let message = jetstream::message::PublishMessage::build().payload(payload.into()).message_id(n.msg_id());
    js.send_publish(n.subject(), message).await.map_err(|e| anyhow::anyhow!("publish {}: {e}", n.subject()))
}
