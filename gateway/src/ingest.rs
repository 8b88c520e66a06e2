//! The ingest loop: JetStream durable consumer → [`event::decide`] → triggers → durable
//! firings ([`crate::firing`]), which the dispatcher turns into jobs.
//!
//! One stream ([`EVENTS_STREAM`]) holds every source's subjects ([`EVENTS_SUBJECTS`]: dCache
//! billing messages and `storage.cloudevents.>`); one durable consumer reads them all, in
//! stream order, and hands each message's subject and headers to [`event::decide`].
//!
//! Delivery contract: a message is acked only after one firing per matching function is
//! committed to the gateway's firing table (durable before ack); from there the dispatcher
//! asks the storage for macaroons and submits, retrying transient failures (storage or
//! scheduler down) with backoff, with rate limits and debounce applied. Only a failure to write
//! the table NAKs the message, with a growing delay, at most `max_deliver` times. A copy of an
//! event (redelivery, a duplicate message, a redelivery after a restart) finds its firing's key
//! (event id + function + digest) taken and starts nothing; the scheduler's own dedupe key on
//! each submission stays a second line of defence. Malformed, ignored and not-enabled messages
//! are counted and acked at once.

use crate::Shared;
use crate::event::{self, Decision, SubjectSource};
use crate::stats::Stats;
use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind, consumer::AckPolicy, consumer::PullConsumer, consumer::pull};
use futures_util::StreamExt as _;
use htfaas_functions::FunctionRecord;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::{
    Cause, EVENTS_MAX_AGE_S, EVENTS_STREAM, EVENTS_SUBJECTS, EventRef, FunctionRef, InputSpec, OutputSpec,
    SubmitRequest,
};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Connects to NATS, ensures the events stream covers every source's subjects and the durable
/// consumer reads them all.
pub async fn connect(nats_url: &str, consumer: &str, max_deliver: i64) -> anyhow::Result<PullConsumer> {
    let client = async_nats::ConnectOptions::new()
        .name("htfaas-gateway")
        .connect(nats_url)
        .await
        .with_context(|| format!("connect to NATS at {nats_url}"))?;
    let js = jetstream::new(client);
    let stream = ensure_events_stream(&js).await?;
    let config = consumer_config(consumer, max_deliver);
    match stream.get_consumer::<pull::Config>(consumer).await {
        Ok(existing) => {
            let have = &existing.cached_info().config;
            let filter = (have.filter_subject.clone(), have.filter_subjects.clone());
            if filter == (config.filter_subject.clone(), config.filter_subjects.clone()) {
                return Ok(existing);
            }
            // Created by an older gateway that read only the billing subject.
            tracing::info!(consumer, old = ?filter, new = ?config.filter_subjects, "widening the consumer's subjects");
            stream
                .update_consumer(config)
                .await
                .with_context(|| format!("update the durable consumer {consumer} to every event subject"))
        }
        Err(_) => stream
            .get_or_create_consumer(consumer, config)
            .await
            .with_context(|| format!("create or find the durable consumer {consumer}")),
    }
}

fn consumer_config(consumer: &str, max_deliver: i64) -> pull::Config {
    pull::Config {
        durable_name: Some(consumer.to_owned()),
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_secs(60),
        max_deliver,
        filter_subjects: EVENTS_SUBJECTS.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// Creates the events stream, or widens an existing one (made by the storage, or by a gateway
/// that read only dCache billing messages) to every subject of [`EVENTS_SUBJECTS`], keeping
/// its other subjects and its messages.
pub async fn ensure_events_stream(js: &jetstream::Context) -> anyhow::Result<jetstream::stream::Stream> {
    let stream = match js.get_stream(EVENTS_STREAM).await {
        Ok(stream) => stream,
        Err(e)
            if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            return js
                .get_or_create_stream(events_stream_config())
                .await
                .with_context(|| format!("create the JetStream stream {EVENTS_STREAM}"));
        }
        Err(e) => return Err(e).with_context(|| format!("look up the JetStream stream {EVENTS_STREAM}")),
    };
    let mut config = stream.cached_info().config.clone();
    let missing: Vec<String> = EVENTS_SUBJECTS
        .iter()
        .filter(|s| !config.subjects.iter().any(|have| have == *s))
        .map(|s| s.to_string())
        .collect();
    if missing.is_empty() {
        return Ok(stream);
    }
    tracing::info!(stream = EVENTS_STREAM, ?missing, "adding event subjects to the existing stream");
    config.subjects.extend(missing);
    js.update_stream(&config).await.with_context(|| format!("add the event subjects to the stream {EVENTS_STREAM}"))?;
    js.get_stream(EVENTS_STREAM).await.with_context(|| format!("look up the JetStream stream {EVENTS_STREAM}"))
}

/// The stream that keeps storage events: every source's subjects, file storage, kept 7 days.
pub fn events_stream_config() -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: EVENTS_STREAM.to_owned(),
        subjects: EVENTS_SUBJECTS.iter().map(|s| s.to_string()).collect(),
        max_age: Duration::from_secs(EVENTS_MAX_AGE_S),
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    }
}

/// What to tell JetStream about one message.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Done with it (fired, ignored, malformed or refused for good).
    Ack,
    /// Try again later.
    Retry,
}

/// Consumes until `shutdown`. Cancel-safe at the `select!`: a message being handled is finished
/// first, and an unacked message is redelivered after `ack_wait`.
pub async fn run(consumer: PullConsumer, shared: Arc<Shared>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut messages = consumer.messages().await.context("start consuming events")?;
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => break,
            next = messages.next() => next,
        };
        let message = match next {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                tracing::warn!("event stream error (continuing): {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            None => anyhow::bail!("the JetStream consumer stream ended"),
        };
        Stats::bump(&shared.stats.events_received);
        match SubjectSource::of(&message.subject) {
            Some(SubjectSource::DcacheBilling) => Stats::bump(&shared.stats.events_dcache_billing),
            Some(SubjectSource::Cloudevents) => Stats::bump(&shared.stats.events_cloudevents),
            None => {}
        }
        let (seq, delivered) = match message.info() {
            Ok(info) => (info.stream_sequence, info.delivered),
            Err(e) => {
                tracing::warn!("message without JetStream info: {e}");
                (0, 1)
            }
        };
        let message_id = format!("nats-seq-{seq}");
        let verdict = handle(&shared, &message.subject, message.headers.as_ref(), &message.payload, &message_id).await;
        let ack = match verdict {
            Verdict::Ack => message.double_ack().await,
            Verdict::Retry => {
                let delay = Duration::from_millis(500u64.saturating_mul(1 << delivered.clamp(0, 6) as u32));
                tracing::info!(seq, delivered, ?delay, "event will be redelivered");
                message.ack_with(AckKind::Nak(Some(delay))).await
            }
        };
        if let Err(e) = ack {
            // Not fatal: the message is redelivered, and the dedupe key keeps it to one job.
            tracing::warn!(seq, "could not ack event: {e}");
        }
    }
    tracing::info!("ingest stopped");
    Ok(())
}

/// Decides and acts on one message.
#[tracing::instrument(name = "gateway.ingest_event", skip_all,
    fields(messaging.destination.name = %subject, event = %message_id))]
pub async fn handle(
    shared: &Shared,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    message_id: &str,
) -> Verdict {
    let policy = shared.sources();
    let event = match event::decide(subject, headers, payload, message_id, &policy) {
        Ok(Decision::Fire(e)) => e,
        Ok(Decision::Ignore(why)) => {
            tracing::debug!("ignored: {why}");
            Stats::bump(&shared.stats.events_ignored);
            return Verdict::Ack;
        }
        Ok(Decision::NotEnabled(ty)) => {
            tracing::debug!("ignored: type {ty} not enabled by the site");
            Stats::bump(&shared.stats.events_not_enabled);
            return Verdict::Ack;
        }
        Err(e) => {
            tracing::warn!("malformed event skipped: {e}");
            Stats::bump(&shared.stats.events_malformed);
            return Verdict::Ack;
        }
    };
    let functions: Vec<FunctionRecord> = shared
        .triggers
        .matching(&event)
        .into_iter()
        // A function never fires on its own outputs (the simplest loop guard).
        .filter(|f| !event.path.starts_with(&f.manifest.outputs.dir))
        .collect();
    if functions.is_empty() {
        tracing::debug!(path = %event.path, "no trigger matches");
        Stats::bump(&shared.stats.events_unmatched);
        return Verdict::Ack;
    }
    fire_all(shared, &event, &functions, None).await
}

/// Queues one firing per function in `functions` on `event` in the durable firing table
/// ([`crate::firing`]), in one transaction; the dispatcher turns each into a job. At most one
/// firing ever per (event, function, digest): a copy of an event already queued is dropped
/// here, before any macaroon is asked for. `replay` names a replay run (`htfaas events
/// replay`), whose firings get keys of their own, so a replay re-runs what already ran once.
/// Returns [`Verdict::Ack`] once the firings are on disk, [`Verdict::Retry`] only when the
/// table could not be written.
pub async fn fire_all(
    shared: &Shared,
    event: &StorageEvent,
    functions: &[FunctionRecord],
    replay: Option<&str>,
) -> Verdict {
    let inserted = shared
        .firings
        .insert_async(event.clone(), functions.to_vec(), replay.map(str::to_owned), crate::firing::now_ms())
        .await;
    match inserted {
        Ok(done) => {
            let stats = &shared.stats;
            stats.firings_queued.fetch_add(done.queued, Ordering::Relaxed);
            stats.firings_deduplicated.fetch_add(done.deduplicated, Ordering::Relaxed);
            // A dropped copy started no second job, as a copy the scheduler drops.
            stats.jobs_deduplicated.fetch_add(done.deduplicated, Ordering::Relaxed);
            stats.firings_superseded.fetch_add(done.superseded, Ordering::Relaxed);
            stats.firings_loop_guarded.fetch_add(done.loop_guarded, Ordering::Relaxed);
            if done.queued == 0 && done.deduplicated > 0 {
                Stats::bump(&stats.events_duplicate);
            }
            stats.firings_pending.store(shared.firings.pending(), Ordering::Relaxed);
            Verdict::Ack
        }
        Err(e) => {
            tracing::error!(path = %event.path, "could not queue the event's firings, will retry: {e}");
            Stats::bump(&shared.stats.transient_failures);
            Verdict::Retry
        }
    }
}

/// Why a job could not be prepared or submitted.
#[derive(Debug)]
pub enum Failure {
    /// Storage or scheduler unreachable: retry later.
    Transient(String),
    /// Refused for good.
    Permanent(String),
}

/// The key the scheduler dedupes a job on (per owner, forever):
/// `<event id>#<function>@<digest>`, with `#replay:<id>` for a replay's jobs.
pub fn scheduler_dedupe_key(event: &StorageEvent, function: &FunctionRecord, replay: Option<&str>) -> String {
    let mut key = format!("{}#{}@{}", event.id, function.manifest.name, function.manifest.module);
    if let Some(replay) = replay {
        key.push_str("#replay:");
        key.push_str(replay);
    }
    key
}

/// What a job keeps of its event: the source kind and producer (`dcache-billing:pool-a-1@pool-aDomain`,
/// `xrootd-notify:xrootd://host:1094`), the occurrence's id and the path, and the job that
/// wrote the file when one did (`cause`, from the firing).
pub fn event_ref(event: &StorageEvent, cause: Option<Cause>) -> EventRef {
    EventRef {
        caused_by: cause,
        ..EventRef::new(format!("{}:{}", event.source.kind.as_str(), event.source.producer), &event.id, &event.path)
    }
}

/// Builds the job for `function` on the file `event.path`: a read macaroon for exactly that
/// file and a write macaroon for exactly the function's output directory, from the storage.
/// The job asks the scheduler to bind both to its EP's address when the gateway is configured
/// to (`Shared::bind_macaroons_to_ep`, only ever true for the dCache dialect).
pub async fn prepare(
    shared: &Shared,
    function: &FunctionRecord,
    event: EventRef,
    dedupe_key: String,
) -> Result<SubmitRequest, Failure> {
    let m = &function.manifest;
    let storage_err = |e: crate::storage_client::StorageError| {
        if e.is_transient() { Failure::Transient(e.to_string()) } else { Failure::Permanent(e.to_string()) }
    };
    let read = shared.storage.read_macaroon(&event.path).await.map_err(storage_err)?;
    let write = shared.storage.write_macaroon(&m.outputs.dir).await.map_err(storage_err)?;
    let name = event.path.rsplit('/').next().unwrap_or_default().to_owned();
    Ok(SubmitRequest {
        function: FunctionRef {
            name: m.name.clone(),
            version: function.version,
            digest: m.module.clone(),
            module_url: format!("{}/v1/modules/{}", shared.public_url, m.module),
        },
        resources: m.resources,
        input: InputSpec { url: shared.storage.url_of(&event.path), name, macaroon: read },
        output: OutputSpec { url: shared.storage.url_of(&m.outputs.dir), macaroon: write },
        args: m.args.clone(),
        env: m.env.clone(),
        event,
        dedupe_key,
        annex: m.annex.clone(),
        bind_ep_address: shared.bind_macaroons_to_ep,
        class: m.class.clone(),
    })
}
