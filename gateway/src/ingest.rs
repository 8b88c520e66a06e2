//! The ingest loop: JetStream durable consumer → [`sources::decide`] → triggers → durable
//! firings ([`crate::firing`]), which the dispatcher turns into jobs.
//!
//! One stream ([`EVENTS_STREAM`]) holds every source's subjects ([`EVENTS_SUBJECTS`]: dCache
//! billing messages, plain and on path subjects, and `storage.cloudevents.>`). Durable
//! consumers read it in *lanes* ([`run_lane`], each in stream order, each handing a message's
//! subject and headers to [`sources::decide`]): the default lane (the consumer named in the
//! configuration, made here by [`connect_with`]) reads the subjects that do not say whose
//! event it is ([`DEFAULT_LANE_SUBJECTS`]) and fires every owner's functions; each owner's lane
//! ([`crate::lanes`]) reads the path subjects of its owner's read namespace and fires only that
//! owner's functions ([`Matcher::owner`]), so one owner's backlog never sits in front of
//! another's events.
//!
//! Delivery contract: a message is acked only after one firing per matching function is
//! committed to the gateway's firing table (durable before ack); from there the dispatcher
//! asks the storage for macaroons and submits, retrying transient failures (storage or
//! scheduler down) with backoff, with rate limits and debounce applied. A copy of an event
//! (redelivery, a duplicate message, a redelivery after a restart) finds its firing's key
//! (event id + function + digest) taken and starts nothing; the scheduler's own dedupe key on
//! each submission stays a second line of defence.
//!
//! Group commit: the loop works in batches ([`run`]). It waits for one message, then takes
//! what the client already holds, up to [`BATCH_MAX`], without waiting for more (a lone event
//! is committed at once; a backlog, or messages arriving during a commit, make the next batch
//! large). Each message is decided and matched ([`plan`]), then the firings of all the batch's
//! events are inserted in ONE transaction, one fsync ([`crate::firing::Firings::insert_batch`]:
//! each event as alone, in arrival order — two copies in one batch make one firing, debounce
//! supersedes in order, the loop guard looks up each event). Only after the commit is every
//! message of the batch acked, malformed, ignored, not-enabled and unmatched ones included
//! (they are counted then). If the transaction fails nothing of the batch was written and
//! every message is NAKed, with a delay growing with its deliveries, at most `max_deliver`
//! times; a crash between commit and ack redelivers the batch, whose keys are then taken.
//! Nothing is acked before it is durable, and nothing is lost.
//!
//! Faults: a lost NATS connection (nats-server killed and restarted) is retried by
//! the client for ever with backoff, counted ([`connect_with`]: `nats_disconnects`,
//! `nats_reconnects`), and the loop goes on: the consumer is durable, so it resumes where its
//! acks left it; an ack lost with the connection makes JetStream redeliver that message after
//! `ack_wait`, and its key drops the copy. A full disk under the firing table (`SQLITE_FULL`)
//! fails the batch's transaction like any other failure: nothing acked, everything redelivered,
//! logged as a full disk and counted (`firings_store_full`).
//!
//! Each step takes what it uses, not the whole gateway: [`run`] borrows an [`Intake`] from
//! [`Shared`] once; [`plan`] reads a [`Matcher`] (source policy, subjects' paths, triggers);
//! [`handle_batch`], [`fire_batch`] and [`fire_all`] the firing table and the counters.
//!
//! Must not know: HTTP, the firing table's SQL, jobs and the scheduler (the dispatcher's).

use crate::firing::{Firings, NewFirings};
use crate::state::Shared;
use crate::stats::Stats;
use crate::triggers::TriggerCache;
use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind, consumer::AckPolicy, consumer::PullConsumer, consumer::pull};
use futures_util::{FutureExt as _, StreamExt as _};
use htfaas_functions::FunctionRecord;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::{DEFAULT_LANE_SUBJECTS, EVENTS_MAX_AGE_S, EVENTS_STREAM, EVENTS_SUBJECTS};
use htfaas_functions::sources::binding::Bindings;
use htfaas_functions::sources::{self, Decision, PolicyCell, SubjectSource};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Connects to NATS, ensures the events stream covers every source's subjects and the durable
/// consumer of the default lane reads [`DEFAULT_LANE_SUBJECTS`].
pub async fn connect(nats_url: &str, consumer: &str, max_deliver: i64) -> anyhow::Result<PullConsumer> {
    Ok(connect_with(nats_url, None, consumer, max_deliver, 1, None).await?.0)
}

/// [`connect`] as `credential` (see [`htfaas_functions::nats`]), counting the connection's
/// losses and returns in `shared`'s
/// `Stats::nats_disconnects` and `Stats::nats_reconnects` (and logging them). The client
/// reconnects on its own, for ever, with backoff; the consumer is durable, so a NATS restart
/// loses nothing: what was not acked is delivered again. Returns the default lane's consumer
/// and the events stream (on the same connection), on which the owners' lanes are made
/// ([`crate::lanes`]).
pub async fn connect_with(
    nats_url: &str,
    credential: Option<&htfaas_functions::nats::NatsCredential>,
    consumer: &str,
    max_deliver: i64,
    replicas: usize,
    shared: Option<Arc<Shared>>,
) -> anyhow::Result<(PullConsumer, jetstream::stream::Stream)> {
    let client = htfaas_functions::nats::connect_options("htfaas-gateway", credential)
        .event_callback(move |event| {
            let shared = shared.clone();
            async move { connection_event(shared.as_deref().map(|s| &s.stats), &event) }
        })
        .connect(htfaas_functions::nats::servers(nats_url)?)
        .await
        .with_context(|| format!("connect to NATS at {nats_url}"))?;
    let js = jetstream::new(client);
    let stream = ensure_events_stream(&js, replicas).await?;
    let consumer = durable_lane(&stream, default_lane_config(consumer, max_deliver)).await?;
    Ok((consumer, stream))
}

/// The default lane's consumer: [`DEFAULT_LANE_SUBJECTS`].
pub fn default_lane_config(consumer: &str, max_deliver: i64) -> pull::Config {
    lane_config(consumer, max_deliver, DEFAULT_LANE_SUBJECTS.iter().map(|s| s.to_string()).collect(), None)
}

/// Finds the durable consumer `config` names, or makes it with `config`. One found with other
/// filters or another `ack_wait` (made by an older gateway, or before its owner's namespace
/// changed) is updated to `config`'s; its position in the stream stays.
pub async fn durable_lane(stream: &jetstream::stream::Stream, config: pull::Config) -> anyhow::Result<PullConsumer> {
    let consumer = config.durable_name.clone().unwrap_or_default();
    match stream.get_consumer::<pull::Config>(&consumer).await {
        Ok(existing) => {
            let have = &existing.cached_info().config;
            let filter = (have.filter_subject.clone(), have.filter_subjects.clone());
            if filter == (config.filter_subject.clone(), config.filter_subjects.clone()) && have.ack_wait == ACK_WAIT {
                return Ok(existing);
            }
            // Created by an older gateway (one that read every subject on one consumer, or
            // waited longer for a lost ack), or its owner's namespace changed.
            tracing::info!(consumer, old = ?filter, new = ?config.filter_subjects, ack_wait = ?ACK_WAIT, "updating the consumer");
            let deliver_policy = have.deliver_policy;
            stream
                .update_consumer(pull::Config { deliver_policy, ..config })
                .await
                .with_context(|| format!("update the durable consumer {consumer}'s subjects"))
        }
        Err(_) => stream
            .get_or_create_consumer(&consumer, config)
            .await
            .with_context(|| format!("create or find the durable consumer {consumer}")),
    }
}

/// Logs and counts (in `stats`, when given) what happened to the NATS connection.
fn connection_event(stats: Option<&Stats>, event: &async_nats::Event) {
    use async_nats::Event;
    match event {
        Event::Disconnected => {
            tracing::warn!("lost the NATS connection; reconnecting (unacked events will come again)");
            if let Some(stats) = stats {
                Stats::bump(&stats.nats_disconnects);
            }
        }
        Event::Connected => {
            let Some(stats) = stats else { return };
            // The first connection is no reconnection.
            if stats.nats_disconnects.load(Ordering::Relaxed) > stats.nats_reconnects.load(Ordering::Relaxed) {
                tracing::info!("NATS connection back; the durable consumer resumes");
                Stats::bump(&stats.nats_reconnects);
            }
        }
        other => tracing::info!("NATS connection: {other}"),
    }
}

/// How long JetStream waits for the ack of a delivered event before it delivers it again: what
/// a gateway killed with a batch in hand (delivered, not yet committed) costs that batch. A
/// batch commits in milliseconds, so this is far above its handling time; a redelivery that
/// comes anyway is dropped by the firing key.
pub const ACK_WAIT: Duration = Duration::from_secs(10);

/// A lane's durable consumer: `filters` (never empty: a consumer without a filter reads every
/// subject), explicit acks, [`ACK_WAIT`], `max_deliver` deliveries at most; `description`
/// names an owner's lane for an operator listing the consumers.
pub fn lane_config(
    consumer: &str,
    max_deliver: i64,
    filters: Vec<String>,
    description: Option<String>,
) -> pull::Config {
    pull::Config {
        durable_name: Some(consumer.to_owned()),
        description,
        ack_policy: AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_deliver,
        filter_subjects: filters,
        ..Default::default()
    }
}

/// Creates the events stream with `replicas` copies of each message, or widens an existing one
/// (made by the storage, or by a gateway that read only dCache billing messages) to every
/// subject of [`EVENTS_SUBJECTS`] and to at least `replicas`, keeping its other subjects and
/// its messages.
pub async fn ensure_events_stream(
    js: &jetstream::Context,
    replicas: usize,
) -> anyhow::Result<jetstream::stream::Stream> {
    let stream = match js.get_stream(EVENTS_STREAM).await {
        Ok(stream) => stream,
        Err(e)
            if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            return js
                .get_or_create_stream(jetstream::stream::Config { num_replicas: replicas, ..events_stream_config() })
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
    if missing.is_empty() && config.num_replicas >= replicas {
        return Ok(stream);
    }
    tracing::info!(
        stream = EVENTS_STREAM,
        ?missing,
        replicas = replicas.max(config.num_replicas),
        "widening the existing events stream"
    );
    config.subjects.extend(missing);
    config.num_replicas = config.num_replicas.max(replicas);
    js.update_stream(&config).await.with_context(|| format!("widen the stream {EVENTS_STREAM}"))?;
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

/// Most messages taken into one batch (one transaction, one fsync).
pub const BATCH_MAX: usize = 256;
/// Messages each pull request asks JetStream for: twice a batch, so that under load the
/// client holds the next full batch while one is being committed.
const PULL_BATCH: usize = 2 * BATCH_MAX;
/// The pull requests' idle heartbeat (the client's default).
const PULL_HEARTBEAT: Duration = Duration::from_secs(15);

/// What to tell JetStream about a message (or a batch of them).
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Done with it (fired, ignored, malformed or refused for good).
    Ack,
    /// Try again later.
    Retry,
}

/// Why a message needs nothing written; counted once its batch is acked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Valid, but no event (failed transfer, p2p copy, …).
    Ignored,
    /// An event type the site did not enable.
    NotEnabled,
    /// Not an event of its source.
    Malformed,
    /// An event whose subject may not speak for its path ([`sources::binding`]).
    OutOfBounds,
    /// An event no trigger matches.
    Unmatched,
    /// An event only disabled functions match: how many.
    Disabled(u32),
}

/// What deciding and matching made of one message, before anything is written.
#[derive(Debug)]
pub enum Plan {
    /// Nothing to write: acked with its batch.
    Skip(Skip),
    /// Firings to insert: the event, the functions it fires, and how many disabled functions
    /// it matched besides (counted, not fired).
    Fire(Box<StorageEvent>, Vec<FunctionRecord>, u32),
}

/// What deciding and matching a message reads ([`plan`]): the site's source policy, which
/// paths each events subject may speak for, the compiled triggers, and whose functions fire.
#[derive(Clone, Copy)]
pub struct Matcher<'a> {
    /// Only this owner's functions fire (an owner's lane); `None`: every owner's (the default
    /// lane, replays).
    pub owner: Option<&'a str>,
    /// Which sources and types become events (read once per message).
    pub sources: &'a PolicyCell,
    /// Which paths each events subject may speak for ([`sources::binding`]).
    pub source_paths: &'a Bindings,
    /// The registered functions' compiled triggers.
    pub triggers: &'a TriggerCache,
    /// Where jobs keep their checkpoints: writes there fire nothing.
    pub checkpoint_dir: Option<&'a str>,
}

/// What the ingest loop's steps use of the gateway, borrowed once when the loop starts
/// ([`Intake::of`]): the [`Matcher`] that plans each message, the firing table the batch is
/// committed to, the counters.
#[derive(Clone, Copy)]
pub struct Intake<'a> {
    /// Decides and matches each message.
    pub matcher: Matcher<'a>,
    /// The durable firing table ([`fire_batch`]).
    pub firings: &'a Firings,
    /// Counters.
    pub stats: &'a Stats,
}

impl<'a> Intake<'a> {
    /// The parts of `shared` the ingest uses.
    pub fn of(shared: &'a Shared) -> Intake<'a> {
        Intake {
            matcher: Matcher {
                owner: None,
                sources: &shared.source_policy,
                source_paths: &shared.source_paths,
                triggers: &shared.triggers,
                checkpoint_dir: shared.checkpoint_dir.as_deref(),
            },
            firings: &shared.firings,
            stats: &shared.stats,
        }
    }
}

/// The default lane: [`run_lane`] firing every owner's functions.
pub async fn run(consumer: PullConsumer, shared: Arc<Shared>, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_lane(consumer, shared, None, shutdown).await
}

/// One lane: consumes until `shutdown`, firing only `owner`'s functions when given, in batches: waits for a message, takes with it what the client
/// already holds (up to [`BATCH_MAX`]; no waiting, so a lone event is committed at once and a
/// backlog makes large batches), decides and matches each, commits all their firings in one
/// transaction ([`handle_batch`]), and only then acks every message of the batch — or, when
/// the transaction failed, NAKs every one with a growing delay. Cancel-safe at the `select!`
/// (and at the non-blocking polls, which lose nothing): a batch being handled is finished
/// first, and an unacked message is redelivered after `ack_wait`.
pub async fn run_lane(
    consumer: PullConsumer,
    shared: Arc<Shared>,
    owner: Option<String>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(PULL_BATCH)
        .heartbeat(PULL_HEARTBEAT)
        .messages()
        .await
        .context("start consuming events")?;
    let mut intake = Intake::of(&shared);
    intake.matcher.owner = owner.as_deref();
    let mut ended = false;
    while !ended {
        let next = tokio::select! {
            _ = shutdown.cancelled() => break,
            next = messages.next() => next,
        };
        let first = match next {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                tracing::warn!("event stream error (continuing): {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            None => anyhow::bail!("the JetStream consumer stream ended"),
        };
        let mut batch = vec![first];
        while batch.len() < BATCH_MAX {
            match messages.next().now_or_never() {
                Some(Some(Ok(m))) => batch.push(m),
                Some(Some(Err(e))) => {
                    tracing::warn!("event stream error (continuing): {e}");
                    break;
                }
                Some(None) => {
                    ended = true;
                    break;
                }
                // Nothing more at hand: commit what we have now.
                None => break,
            }
        }
        let plans = batch.iter().map(|m| plan_message(&intake, m)).collect();
        let verdict = handle_batch(intake.firings, intake.stats, plans).await;
        Stats::bump(&intake.stats.ingest_batches);
        settle(&batch, verdict).await;
    }
    if ended {
        anyhow::bail!("the JetStream consumer stream ended");
    }
    tracing::info!(lane = owner.as_deref().unwrap_or("(default)"), "ingest stopped");
    Ok(())
}

/// Counts one delivered message and plans it.
fn plan_message(intake: &Intake<'_>, message: &jetstream::Message) -> Plan {
    let stats = intake.stats;
    Stats::bump(&stats.events_received);
    match SubjectSource::of(&message.subject) {
        Some(SubjectSource::DcacheBilling) => Stats::bump(&stats.events_dcache_billing),
        Some(SubjectSource::Cloudevents) => Stats::bump(&stats.events_cloudevents),
        None => {}
    }
    let message_id = format!("nats-seq-{}", delivery(message).0);
    plan(&intake.matcher, &message.subject, message.headers.as_ref(), &message.payload, &message_id)
}

/// The message's stream sequence and delivery count.
fn delivery(message: &jetstream::Message) -> (u64, i64) {
    match message.info() {
        Ok(info) => (info.stream_sequence, info.delivered),
        Err(e) => {
            tracing::warn!("message without JetStream info: {e}");
            (0, 1)
        }
    }
}

/// Tells JetStream the batch's verdict about each of its messages, all at once: acked (and the
/// ack confirmed), or NAKed with a delay that grows with each message's deliveries.
async fn settle(batch: &[jetstream::Message], verdict: Verdict) {
    let acks = batch.iter().map(|message| {
        let verdict = &verdict;
        async move {
            let (seq, delivered) = delivery(message);
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
    });
    futures_util::future::join_all(acks).await;
}

/// Decides and matches one message: what, if anything, it fires.
#[tracing::instrument(name = "gateway.ingest_event", skip_all,
    fields(messaging.destination.name = %subject, event = %message_id))]
pub fn plan(
    matcher: &Matcher<'_>,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    message_id: &str,
) -> Plan {
    let policy = matcher.sources.current();
    let event = match sources::decide_bound(subject, headers, payload, message_id, &policy, matcher.source_paths) {
        Ok(Decision::Fire(e)) => e,
        Ok(Decision::Ignore(why)) => {
            tracing::debug!("ignored: {why}");
            return Plan::Skip(Skip::Ignored);
        }
        Ok(Decision::NotEnabled(ty)) => {
            tracing::debug!("ignored: type {ty} not enabled by the site");
            return Plan::Skip(Skip::NotEnabled);
        }
        Err(e @ sources::EventError::OutOfBounds { .. }) => {
            tracing::warn!("event refused: {e}");
            return Plan::Skip(Skip::OutOfBounds);
        }
        Err(e) => {
            tracing::warn!("malformed event skipped: {e}");
            return Plan::Skip(Skip::Malformed);
        }
    };
    // A job's checkpoint is its own state, not data: storing one fires nothing.
    if matcher.checkpoint_dir.is_some_and(|d| event.path.starts_with(d)) {
        tracing::debug!(path = %event.path, "a checkpoint: fires nothing");
        return Plan::Skip(Skip::Ignored);
    }
    // An owner's lane fires its owner's functions only (other lanes fire the others'); a
    // function never fires on its own outputs (the simplest loop guard).
    let keep = |f: &FunctionRecord| {
        matcher.owner.is_none_or(|o| f.manifest.owner == o) && !event.path.starts_with(&f.manifest.outputs.dir)
    };
    let functions: Vec<FunctionRecord> = matcher.triggers.matching(&event).into_iter().filter(|f| keep(f)).collect();
    let disabled = u32::try_from(matcher.triggers.disabled_matching(&event, keep)).unwrap_or(u32::MAX);
    if functions.is_empty() {
        if disabled > 0 {
            tracing::debug!(path = %event.path, disabled, "only disabled functions match");
            return Plan::Skip(Skip::Disabled(disabled));
        }
        tracing::debug!(path = %event.path, "no trigger matches");
        return Plan::Skip(Skip::Unmatched);
    }
    Plan::Fire(event, functions, disabled)
}

/// Decides and acts on one message: a batch of one.
pub async fn handle(
    intake: &Intake<'_>,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    message_id: &str,
) -> Verdict {
    let plans = vec![plan(&intake.matcher, subject, headers, payload, message_id)];
    handle_batch(intake.firings, intake.stats, plans).await
}

/// Acts on a batch of planned messages: the firings of all its events in one transaction
/// ([`fire_batch`]). [`Verdict::Ack`] (for every message, skipped ones included, which are
/// counted then) once they are committed; [`Verdict::Retry`] (for every message) when the
/// transaction failed, and nothing of the batch was written.
#[tracing::instrument(name = "gateway.ingest_batch", skip_all, fields(messages = plans.len()))]
pub async fn handle_batch(firings: &Firings, stats: &Stats, plans: Vec<Plan>) -> Verdict {
    let mut skipped = Vec::new();
    let mut batch = Vec::new();
    let mut disabled = 0u64;
    for p in plans {
        match p {
            Plan::Skip(why) => skipped.push(why),
            Plan::Fire(event, functions, n) => {
                disabled += u64::from(n);
                batch.push(NewFirings { event: *event, functions, replay: None })
            }
        }
    }
    let verdict = fire_batch(firings, stats, batch).await;
    if verdict == Verdict::Ack {
        stats.firings_disabled.fetch_add(disabled, std::sync::atomic::Ordering::Relaxed);
        for why in skipped {
            if let Skip::Disabled(n) = why {
                stats.firings_disabled.fetch_add(u64::from(n), std::sync::atomic::Ordering::Relaxed);
                Stats::bump(&stats.events_disabled);
                continue;
            }
            Stats::bump(match why {
                Skip::Ignored => &stats.events_ignored,
                Skip::NotEnabled => &stats.events_not_enabled,
                Skip::Malformed => &stats.events_malformed,
                Skip::OutOfBounds => &stats.events_out_of_bounds,
                Skip::Unmatched | Skip::Disabled(_) => &stats.events_unmatched,
            });
        }
    }
    verdict
}

/// Queues one firing per function in `functions` on `event` in the durable firing table
/// ([`crate::firing`]); the dispatcher turns each into a job. At most one firing ever per
/// (event, function, digest): a copy of an event already queued is dropped here, before any
/// macaroon is asked for. `replay` names a replay run (`htfaas events replay`), whose firings
/// get keys of their own, so a replay re-runs what already ran once. A batch of one
/// ([`fire_batch`]).
pub async fn fire_all(
    firings: &Firings,
    stats: &Stats,
    event: &StorageEvent,
    functions: &[FunctionRecord],
    replay: Option<&str>,
) -> Verdict {
    let one = NewFirings { event: event.clone(), functions: functions.to_vec(), replay: replay.map(str::to_owned) };
    fire_batch(firings, stats, vec![one]).await
}

/// Queues the firings of every event of `batch` in ONE transaction
/// ([`crate::firing::Firings::insert_batch`]: one fsync for the batch, each event as alone).
/// Returns [`Verdict::Ack`] once they are all on disk (at once for an empty batch),
/// [`Verdict::Retry`] when the table could not be written: then none was.
pub async fn fire_batch(firings: &Firings, stats: &Stats, batch: Vec<NewFirings>) -> Verdict {
    if batch.is_empty() {
        return Verdict::Ack;
    }
    let (events, first_path) = (batch.len() as u64, batch[0].event.path.clone());
    match firings.insert_batch_async(batch, crate::firing::now_ms()).await {
        Ok(done) => {
            for d in done {
                stats.firings_queued.fetch_add(d.queued, Ordering::Relaxed);
                stats.firings_deduplicated.fetch_add(d.deduplicated, Ordering::Relaxed);
                // A dropped copy started no second job, as a copy the scheduler drops.
                stats.jobs_deduplicated.fetch_add(d.deduplicated, Ordering::Relaxed);
                stats.firings_superseded.fetch_add(d.superseded, Ordering::Relaxed);
                stats.firings_loop_guarded.fetch_add(d.loop_guarded, Ordering::Relaxed);
                stats.firings_collected.fetch_add(d.collected, Ordering::Relaxed);
                stats.firings_not_collected.fetch_add(d.not_collected, Ordering::Relaxed);
                if d.queued > 0 {
                    Stats::bump(&stats.events_fired);
                } else if d.collected > 0 {
                    Stats::bump(&stats.events_collected);
                } else if d.deduplicated > 0 {
                    Stats::bump(&stats.events_duplicate);
                } else if d.loop_guarded > 0 {
                    Stats::bump(&stats.events_loop_guarded);
                }
            }
            stats.firings_pending.store(firings.pending(), Ordering::Relaxed);
            Verdict::Ack
        }
        Err(e) if e.is_disk_full() => {
            tracing::error!(
                events,
                path = %first_path,
                "the firing table's disk is full: a batch of events was not written and not acked; \
                 JetStream redelivers it, and it goes through once there is room: {e}"
            );
            Stats::bump(&stats.firings_store_full);
            stats.transient_failures.fetch_add(events, Ordering::Relaxed);
            Verdict::Retry
        }
        Err(e) => {
            tracing::error!(events, path = %first_path, "could not queue the firings of a batch of events, will retry: {e}");
            // One per event whose firings were not written (each is redelivered).
            stats.transient_failures.fetch_add(events, Ordering::Relaxed);
            Verdict::Retry
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::FunctionManifest;
    use htfaas_functions::manifest::{Outputs, Resources, Trigger};
    use htfaas_functions::proto::EVENTS_SUBJECT;

    /// A gateway state in `dir` with two functions on `/data/**`.
    async fn shared(dir: &std::path::Path) -> Arc<Shared> {
        let config: crate::config::Config = serde_json::from_value(serde_json::json!({
            "listen": "127.0.0.1:0", "nats_url": "nats://127.0.0.1:1",
            "registry_dir": dir.join("registry"), "storage_url": "http://127.0.0.1:1",
            "storage_user": "gateway", "scheduler_url": "http://127.0.0.1:1",
            "scheduler_admin_token": "s", "signing_key_file": dir.join("submit.pem"), "admin_token": "a",
        }))
        .expect("config");
        let shared = config.resolve().await.expect("resolve").shared();
        let module = shared.registry.put_module(b"\0asm\x01\0\0\0").expect("module");
        for name in ["a", "b"] {
            shared
                .registry
                .register(FunctionManifest {
                    runtime: Default::default(),
                    command: Vec::new(),
                    handler: false,
                    retry: None,
                    name: name.into(),
                    owner: "alice".into(),
                    module: module.clone(),
                    trigger: Trigger::on_path("/data/**"),
                    resources: Resources::default(),
                    outputs: Outputs::into_dir(format!("/out/{name}/")),
                    args: vec![],
                    env: vec![],
                    annex: None,
                    class: None,
                    limits: Default::default(),
                    group: None,
                    secrets: Default::default(),
                    webhook: None,
                    max_concurrent: None,
                    inputs: Default::default(),
                    vacate_s: None,
                    checkpoint: None,
                })
                .expect("register");
        }
        shared.triggers.reload(&shared.registry).expect("reload");
        shared
    }

    fn write(path: &str, session: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "msgType": "transfer", "isWrite": "write", "isP2p": false, "status": {"code": 0, "msg": ""},
            "cellName": "pool-a", "cellDomain": "poolDomain", "transferPath": path, "pnfsid": "0000BEEF",
            "session": session, "fileSize": 10,
        }))
        .expect("json")
    }

    fn plans(shared: &Shared, payloads: &[Vec<u8>]) -> Vec<Plan> {
        let matcher = Intake::of(shared).matcher;
        payloads
            .iter()
            .enumerate()
            .map(|(i, p)| plan(&matcher, EVENTS_SUBJECT, None, p, &format!("nats-seq-{i}")))
            .collect()
    }

    #[tokio::test]
    async fn a_batch_is_committed_and_counted_whole_or_retried_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = shared(dir.path()).await;
        let failed = serde_json::to_vec(&serde_json::json!({
            "msgType": "transfer", "isWrite": "write", "isP2p": false, "status": {"code": 666, "msg": "no"},
            "cellName": "pool-a", "cellDomain": "poolDomain", "transferPath": "/data/f", "pnfsid": "0000BEEF",
            "session": "s-f", "fileSize": 10,
        }))
        .expect("json");
        let batch = [
            write("/data/x", "s1"),
            b"{not json".to_vec(),
            write("/data/x", "s1"),
            write("/elsewhere/y", "s2"),
            failed,
            write("/data/z", "s3"),
        ];

        // The table refuses the batch: nothing is written or counted as done; all come again.
        let file = dir.path().join("firings.sqlite");
        let side = rusqlite::Connection::open(&file).expect("open");
        side.execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON firings WHEN NEW.path = '/data/z' \
             BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
        )
        .expect("trigger");
        assert_eq!(handle_batch(&shared.firings, &shared.stats, plans(&shared, &batch)).await, Verdict::Retry);
        let s = shared.stats.snapshot();
        assert_eq!((s.firings_queued, s.events_malformed, s.events_unmatched, s.events_ignored), (0, 0, 0, 0));
        assert_eq!(s.transient_failures, 3, "the three events with firings");
        assert_eq!(shared.firings.list(0, 100).expect("list").len(), 0);

        // Redelivered: one transaction; the copy inside the batch makes no second firing.
        side.execute_batch("DROP TRIGGER refuse;").expect("drop");
        assert_eq!(handle_batch(&shared.firings, &shared.stats, plans(&shared, &batch)).await, Verdict::Ack);
        let s = shared.stats.snapshot();
        assert_eq!((s.firings_queued, s.firings_deduplicated, s.events_duplicate), (4, 2, 1));
        assert_eq!((s.events_malformed, s.events_unmatched, s.events_ignored), (1, 1, 1));
        assert_eq!(s.firings_pending, 4);
        let keys: Vec<_> = shared.firings.list(0, 100).expect("list").into_iter().map(|f| f.function).collect();
        assert_eq!(keys, ["a", "b", "a", "b"]);

        // A batch with nothing to write is acked without a transaction; a lone event is a batch.
        assert_eq!(handle_batch(&shared.firings, &shared.stats, plans(&shared, &[b"[]".to_vec()])).await, Verdict::Ack);
        assert_eq!(
            handle(&Intake::of(&shared), EVENTS_SUBJECT, None, &write("/data/w", "s9"), "nats-seq-9").await,
            Verdict::Ack
        );
        assert_eq!(shared.stats.snapshot().firings_queued, 6);
    }

    /// The firing table's disk is full (`SQLITE_FULL`, here by capping the file's size
    /// with `PRAGMA max_page_count` at what it holds). The batch is not written, its messages are
    /// not acked but NAKed for redelivery, the full disk is counted and nothing crashes; once
    /// there is room the redelivered batch goes through whole.
    #[tokio::test]
    async fn a_full_firing_table_acks_nothing_and_the_redelivery_goes_through_once_there_is_room() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = shared(dir.path()).await;
        let batch: Vec<Vec<u8>> = (0..64).map(|i| write(&format!("/data/full/f{i}.dat"), &format!("s{i}"))).collect();
        let cap = shared.firings.set_max_page_count(1).expect("cap the file at its size");
        assert!(cap >= 1, "{cap}");

        assert_eq!(handle_batch(&shared.firings, &shared.stats, plans(&shared, &batch)).await, Verdict::Retry);
        let s = shared.stats.snapshot();
        assert_eq!((s.firings_queued, s.transient_failures), (0, 64), "{s:?}");
        assert_eq!(shared.stats.firings_store_full.load(Ordering::Relaxed), 1);
        assert_eq!(shared.firings.list(0, 1000).expect("reads still work").len(), 0);
        assert_eq!(shared.firings.pending(), 0);
        // The error itself says what happened.
        let many: Vec<NewFirings> = plans(&shared, &batch)
            .into_iter()
            .map(|p| match p {
                Plan::Fire(event, functions, _) => NewFirings { event: *event, functions, replay: None },
                Plan::Skip(why) => panic!("{why:?}"),
            })
            .collect();
        let e = shared.firings.insert_batch(&many, crate::firing::now_ms()).expect_err("full");
        assert!(e.is_disk_full(), "{e}");
        assert_eq!(e.to_string(), "firing store: database or disk is full");

        // Room again: the redelivered batch is written whole and acked.
        shared.firings.set_max_page_count(u32::MAX).expect("lift the cap");
        assert_eq!(handle_batch(&shared.firings, &shared.stats, plans(&shared, &batch)).await, Verdict::Ack);
        let s = shared.stats.snapshot();
        assert_eq!((s.firings_queued, s.firings_pending), (128, 128), "{s:?}");
        assert_eq!(shared.stats.firings_store_full.load(Ordering::Relaxed), 1);
    }
}
