//! The feeds of the dead-letter list from NATS:
//!
//! - failed jobs: a durable consumer (`<consumer>-dlq`) of the scheduler's job-end
//!   notifications ([`JOBS_STREAM`], only the subjects of failed jobs), each notification
//!   entered with [`crate::firing::Firings::dead_letter_job`] and acked once committed;
//! - events JetStream gave up on: the server's `MAX_DELIVERIES` advisories about the events
//!   stream are kept in a stream of their own ([`ADVISORIES_STREAM`], made here), so none is lost
//!   while the gateway is down; a durable consumer (`<consumer>-maxdeliver`) reads each, fetches
//!   the event by its stream sequence, plans it as the ingest would ([`crate::ingest::plan`]) and
//!   enters it for each function it fires ([`crate::firing::Firings::dead_letter_event`]). An
//!   event that fires nothing (or no longer exists in the stream) needs no entry: it would have
//!   made no firing.
//!
//! Nothing is lost: the consumer is durable, so notifications published while the gateway is
//! down wait in the stream; a notification whose entry could not be written (the disk full) is
//! not acked and comes again after [`RETRY`]; a notification that does not parse is counted
//! and dropped (it would never parse). The stream is the scheduler's: until it exists the feed
//! looks again every [`RETRY`]. Every `.await` here is safe to cancel (an entry written but not
//! acked comes again and adds nothing: its key is the job id).
//!
//! Must not know: HTTP, the firing table's SQL.

use crate::state::Shared;
use async_nats::jetstream::{self, consumer::pull};
use futures_util::StreamExt as _;
use htfaas_functions::proto::{EVENTS_STREAM, JOBS_STREAM, JOBS_SUBJECT_PREFIX, JobNotification};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long the feed waits before looking again (the stream missing, NATS down, a write failed).
pub const RETRY: Duration = Duration::from_secs(1);

/// The durable consumer's name for the gateway's `consumer`.
pub fn consumer_name(consumer: &str) -> String {
    format!("{consumer}-dlq")
}

/// The stream that keeps the server's max-deliveries advisories about the events stream.
pub const ADVISORIES_STREAM: &str = "HTFAAS_ADVISORIES";

/// The advisories it keeps.
pub fn advisory_subjects() -> String {
    format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{EVENTS_STREAM}.>")
}

/// Feeds failed jobs and undeliverable events into the dead-letter list until `shutdown`.
pub async fn run(js: jetstream::Context, consumer: String, shared: Arc<Shared>, shutdown: CancellationToken) {
    tokio::join!(
        retrying(&shutdown, "the dead-letter feed", || feed(&js, &consumer, &shared)),
        retrying(&shutdown, "the dead-letter feed", || feed_max_deliveries(&js, &consumer, &shared)),
    );
}

/// What became of one notification a feed handled (the webhook feed's deliveries, the
/// checkpoint sweep's clearings).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Done, or nothing to do: ack.
    Done,
    /// Worth another try after a backoff.
    Again(String),
    /// Given up.
    Refused(String),
}

/// Tells JetStream what became of `message` (delivered `tries` times): ack when done; else
/// another try after `backoff[tries - 1]` (the last repeats) while fewer than `max_deliver`
/// tries were made; else end it. Returns whether it was given up (`what` names the feed in the
/// log).
pub(crate) async fn settle(
    message: &jetstream::Message,
    handled: Handled,
    max_deliver: i64,
    backoff: &[Duration],
    what: &str,
) -> bool {
    let tries = message.info().map(|i| i.delivered).unwrap_or(1);
    match handled {
        Handled::Done => {
            let _ = message.ack().await;
            false
        }
        Handled::Again(why) if tries < max_deliver && !backoff.is_empty() => {
            let wait = backoff[usize::try_from(tries - 1).unwrap_or(0).min(backoff.len() - 1)];
            tracing::info!(subject = %message.subject, tries, "{what} tried again in {wait:?}: {why}");
            let _ = message.ack_with(jetstream::AckKind::Nak(Some(wait))).await;
            false
        }
        Handled::Again(why) | Handled::Refused(why) => {
            tracing::warn!(subject = %message.subject, tries, "{what} given up: {why}");
            let _ = message.ack_with(jetstream::AckKind::Term).await;
            true
        }
    }
}

/// Runs `step` again after [`RETRY`] whenever it ends, until `shutdown`; `what` names it in the
/// log (the dead-letter feeds, the webhook feed).
pub(crate) async fn retrying<F, Fut>(shutdown: &CancellationToken, what: &str, mut step: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    loop {
        let fed = tokio::select! {
            () = shutdown.cancelled() => break,
            r = step() => r,
        };
        if let Err(e) = fed {
            tracing::debug!("{what} waits ({RETRY:?}): {e:#}");
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

async fn feed(js: &jetstream::Context, consumer: &str, shared: &Arc<Shared>) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let stream = js.get_stream(JOBS_STREAM).await.with_context(|| format!("look up the stream {JOBS_STREAM}"))?;
    let name = consumer_name(consumer);
    let config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some("htfaas gateway: failed jobs into the dead-letter list".into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(30),
        filter_subject: format!("{JOBS_SUBJECT_PREFIX}.*.*.failed"),
        ..Default::default()
    };
    let consumer = stream.get_or_create_consumer(&name, config).await.with_context(|| format!("make {name}"))?;
    tracing::info!(consumer = %name, "feeding failed jobs into the dead-letter list");
    let mut messages = consumer.messages().await.context("pull notifications")?;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| anyhow::anyhow!("read a notification: {e}"))?;
        let notification: JobNotification = match serde_json::from_slice(&message.payload) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(subject = %message.subject, "a job-end notification that does not parse, dropped: {e}");
                let _ = message.ack_with(jetstream::AckKind::Term).await;
                continue;
            }
        };
        let firings = shared.firings.clone();
        let n = notification.clone();
        let added = firings.call(move |f| f.dead_letter_job(&n, crate::firing::now_ms())).await;
        match added {
            Ok(added) => {
                if added {
                    tracing::info!(job = %notification.job_id, function = %notification.function,
                        owner = %notification.owner, "failed job entered in the dead-letter list");
                }
                if let Err(e) = message.ack().await {
                    tracing::warn!(job = %notification.job_id, "ack of a notification failed (it comes again): {e}");
                }
            }
            Err(e) => {
                tracing::error!(job = %notification.job_id, "the dead-letter list could not take a failed job (retrying): {e}");
                let _ = message.ack_with(jetstream::AckKind::Nak(Some(RETRY))).await;
            }
        }
    }
    anyhow::bail!("the notifications' pull ended")
}

/// What the gateway reads of a max-deliveries advisory.
#[derive(Debug, serde::Deserialize)]
struct MaxDeliveries {
    stream: String,
    consumer: String,
    stream_seq: u64,
    deliveries: u64,
}

async fn feed_max_deliveries(js: &jetstream::Context, consumer: &str, shared: &Arc<Shared>) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let advisories = js
        .get_or_create_stream(jetstream::stream::Config {
            name: ADVISORIES_STREAM.to_owned(),
            subjects: vec![advisory_subjects()],
            max_age: Duration::from_secs(htfaas_functions::proto::EVENTS_MAX_AGE_S),
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .with_context(|| format!("make the stream {ADVISORIES_STREAM}"))?;
    let events = js.get_stream(EVENTS_STREAM).await.with_context(|| format!("look up the stream {EVENTS_STREAM}"))?;
    let name = format!("{consumer}-maxdeliver");
    let config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some("htfaas gateway: undeliverable events into the dead-letter list".into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(30),
        ..Default::default()
    };
    let reader = advisories.get_or_create_consumer(&name, config).await.with_context(|| format!("make {name}"))?;
    let mut messages = reader.messages().await.context("pull advisories")?;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| anyhow::anyhow!("read an advisory: {e}"))?;
        let advisory: MaxDeliveries = match serde_json::from_slice(&message.payload) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(subject = %message.subject, "an advisory that does not parse, dropped: {e}");
                let _ = message.ack_with(jetstream::AckKind::Term).await;
                continue;
            }
        };
        let reason = format!(
            "JetStream gave up delivering it: {} deliveries to consumer {} of stream {} (max_deliver)",
            advisory.deliveries, advisory.consumer, advisory.stream
        );
        let planned = match events.get_raw_message(advisory.stream_seq).await {
            Ok(m) => {
                let id = format!("nats-seq-{}", m.sequence);
                let intake = crate::ingest::Intake::of(shared);
                crate::ingest::plan(&intake.matcher, &m.subject, Some(&m.headers), &m.payload, &id)
            }
            Err(e) => {
                tracing::warn!(seq = advisory.stream_seq, "an undeliverable event is gone from the stream: {e}");
                crate::ingest::Plan::Skip(crate::ingest::Skip::Unmatched)
            }
        };
        let crate::ingest::Plan::Fire(event, functions, _) = planned else {
            let _ = message.ack().await;
            continue;
        };
        let seq = advisory.stream_seq;
        let added = shared
            .firings
            .call(move |f| f.dead_letter_event(seq, Some(event.as_ref()), &functions, &reason, crate::firing::now_ms()))
            .await;
        match added {
            Ok(n) => {
                tracing::warn!(seq, entries = n, "an event JetStream gave up on entered the dead-letter list");
                let _ = message.ack().await;
            }
            Err(e) => {
                tracing::error!(seq, "the dead-letter list could not take an undeliverable event (retrying): {e}");
                let _ = message.ack_with(jetstream::AckKind::Nak(Some(RETRY))).await;
            }
        }
    }
    anyhow::bail!("the advisories' pull ended")
}
