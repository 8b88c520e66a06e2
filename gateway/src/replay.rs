// Long because it holds dry runs, replays and fn test over one recorded-events reader; kept whole until issue 19 splits it along its layers.
//! Replay and dry-run over recorded events: `htfaas events replay`, `htfaas fn test` and
//! `htfaas fn register --dry-run`.
//!
//! The events stream ([`EVENTS_STREAM`]) keeps every message the gateway consumes for
//! [`EVENTS_MAX_AGE_S`](htfaas_functions::proto::EVENTS_MAX_AGE_S). A [`Reader`] reads a
//! window of it, from `since` to `until` or to the stream's last sequence when the request
//! began (so it ends), through an ephemeral pull
//! consumer that acks nothing: the gateway's durable consumer is not touched. Each message is
//! parsed by the same [`event::decide`] as the ingest loop (message id `nats-seq-<seq>`);
//! ignored, not-enabled and malformed messages are counted, never fatal. [`run`] then
//! evaluates the [`Target`]s' triggers on each event, with the ingest's loop guard (a function
//! never fires on a file in its own output directory):
//!
//! - a dry run lists the (event, function) pairs that would fire and submits nothing;
//! - a replay fires each pair with [`crate::ingest::fire_all`] under a replay id, so its jobs
//!   have dedupe keys of their own: a replay re-runs on purpose, and re-issuing the same replay
//!   id starts nothing twice (which also makes a failed or cut-short replay safe to repeat).
//!
//! Bounded: at most [`MAX_EVENTS`] messages (default [`DEFAULT_LIMIT`]) and [`TIME_BUDGET`]
//! per request, and at most [`MAX_LISTED`] pairs listed; a report that stopped early says so
//! and where to resume. [`test_event`] answers how one event parses and what one function's
//! trigger says about it, part by part.
//!
//! Times: RFC 3339 (`2026-11-22T10:00:00Z`), Unix seconds, or relative to now (`-2h`, `-30m`,
//! `-7d`); see [`parse_time`].
//!
//! The requests and answers ([`ReplayRequest`], [`RegisterQuery`], [`TestRequest`], [`Report`],
//! [`TestReport`], [`TimeArg`]) are wire types and live in [`htfaas_functions::proto`]; what
//! they mean is decided here: [`plan`], [`register_window`], [`to_unix_ms`].

use crate::state::Shared;
use crate::event::{self, Decision, EventError, SourcePolicy};
use async_nats::jetstream::{self, consumer::AckPolicy, consumer::DeliverPolicy, consumer::PullConsumer};
use futures_util::StreamExt as _;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::{
    EVENTS_STREAM, EVENTS_SUBJECTS, Pair, PartVerdict, RegisterQuery, ReplayRequest, Report, TestReport, TestRequest,
    TimeArg,
};
use htfaas_functions::trigger::{Rule, RuleError, Truth};
use htfaas_functions::{FunctionRecord, Trigger};
use std::time::{Duration, Instant};

/// Most messages one request reads.
pub const MAX_EVENTS: u64 = 100_000;
/// Messages one request reads when it names no limit.
pub const DEFAULT_LIMIT: u64 = 10_000;
/// Longest one request reads and fires; below the 30 s an htfaas client waits for an answer.
pub const TIME_BUDGET: Duration = Duration::from_secs(20);
/// Most (event, function) pairs one report lists (all are counted).
pub const MAX_LISTED: usize = 10_000;
/// How far back a dry-run registration looks when it names no `since`: one day.
pub const DEFAULT_DRY_RUN_WINDOW_S: u64 = 86_400;
/// Messages fetched at once.
const BATCH: u64 = 256;

/// Why a replay or dry run could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The request itself is wrong (a time, a limit, a replay id).
    #[error("{0}")]
    BadRequest(String),
    /// No such recorded message.
    #[error("{0}")]
    NotFound(String),
    /// NATS or the events stream could not be read.
    #[error("recorded events unavailable: {0}")]
    Unavailable(String),
}

/// Unix milliseconds of `time`, relative times counted back from `now_ms`.
pub fn to_unix_ms(time: &TimeArg, now_ms: u64) -> Result<u64, String> {
    match time {
        TimeArg::Unix(s) => s.checked_mul(1000).ok_or_else(|| format!("{s}: out of range")),
        TimeArg::Text(t) => parse_time(t, now_ms),
    }
}

/// Parses a time: RFC 3339 with any offset (`2026-11-22T10:00:00Z`, `…+01:00`, fractions
/// allowed), Unix seconds (`1795000000`), or a span before `now_ms` (`-90s`, `-30m`, `-2h`,
/// `-7d`). Returns Unix milliseconds.
pub fn parse_time(text: &str, now_ms: u64) -> Result<u64, String> {
    let t = text.trim();
    if let Some(span) = t.strip_prefix('-') {
        let (number, unit) = span.split_at(span.find(|c: char| !c.is_ascii_digit()).unwrap_or(span.len()));
        let n: u64 = number.parse().map_err(|_| format!("{text:?}: want -<number><s|m|h|d>, e.g. -2h"))?;
        let unit_ms: u64 = match unit {
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(format!("{text:?}: unknown unit {unit:?} (s, m, h, d)")),
        };
        let back = n.checked_mul(unit_ms).ok_or_else(|| format!("{text:?}: out of range"))?;
        return now_ms.checked_sub(back).ok_or_else(|| format!("{text:?}: before 1970"));
    }
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        let s: u64 = t.parse().map_err(|_| format!("{text:?}: out of range"))?;
        return s.checked_mul(1000).ok_or_else(|| format!("{text:?}: out of range"));
    }
    let parsed = async_nats::datetime::parse_rfc3339(t)
        .map_err(|e| format!("{text:?}: want RFC 3339 (2026-11-22T10:00:00Z), Unix seconds or -<n><s|m|h|d> ({e})"))?;
    let ms = parsed.unix_timestamp_nanos() / 1_000_000;
    u64::try_from(ms).map_err(|_| format!("{text:?}: before 1970"))
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds, e.g. `2026-11-22T10:00:00.250Z`.
pub fn fmt_time(ms: u64) -> String {
    let (days, ms_of_day) = (ms / 86_400_000, ms % 86_400_000);
    // Howard Hinnant's civil_from_days, for days on or after 1970-01-01.
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let (h, m, s, milli) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A fresh replay id: `r<unix ms>-<8 hex>`.
pub fn new_replay_id() -> String {
    let jti = htfaas_functions::token::new_jti().replace('-', "");
    format!("r{}-{}", now_ms(), &jti[..8.min(jti.len())])
}

/// Checks a replay id given by a caller: 1–64 of `[A-Za-z0-9_-]`.
pub fn check_replay_id(id: &str) -> Result<(), ReplayError> {
    if (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        Ok(())
    } else {
        Err(ReplayError::BadRequest(format!("bad replay id {id:?}: want 1 to 64 of [A-Za-z0-9_-]")))
    }
}

/// Which recorded messages to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// First recording time read, Unix ms (inclusive).
    pub since_ms: u64,
    /// Last recording time read, Unix ms (inclusive); none: up to the stream's last message
    /// when the request began.
    pub until_ms: Option<u64>,
    /// Most messages read, at most [`MAX_EVENTS`].
    pub limit: u64,
}

impl Window {
    /// The window of a request's `since`, `until` and `limit`, checked; relative times count
    /// back from `now_ms`.
    pub fn resolve(
        since: &TimeArg,
        until: Option<&TimeArg>,
        limit: Option<u64>,
        now_ms: u64,
    ) -> Result<Window, ReplayError> {
        let since_ms = to_unix_ms(since, now_ms).map_err(|e| ReplayError::BadRequest(format!("since: {e}")))?;
        let until_ms = until
            .map(|u| to_unix_ms(u, now_ms))
            .transpose()
            .map_err(|e| ReplayError::BadRequest(format!("until: {e}")))?;
        if until_ms.is_some_and(|u| u < since_ms) {
            return Err(ReplayError::BadRequest("until is before since".into()));
        }
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if limit == 0 || limit > MAX_EVENTS {
            return Err(ReplayError::BadRequest(format!("limit must be 1..={MAX_EVENTS}")));
        }
        Ok(Window { since_ms, until_ms, limit })
    }
}

/// One recorded message, parsed.
#[derive(Debug)]
pub struct Recorded {
    /// Its stream sequence.
    pub seq: u64,
    /// When the stream stored it, Unix ms.
    pub recorded_ms: u64,
    /// What [`event::decide`] made of it.
    pub decision: Result<Decision, EventError>,
}

/// Reads a [`Window`] of the events stream in order, through an ephemeral consumer that acks
/// nothing. Call [`Reader::close`] when done (else the server drops the consumer after a
/// minute of inactivity).
pub struct Reader {
    /// The stream and the consumer; none when there is nothing to read.
    source: Option<(jetstream::stream::Stream, PullConsumer)>,
    /// Last stream sequence when the request began: the reader ends there.
    end_seq: u64,
    until_ms: Option<u64>,
    limit: u64,
    /// Messages read so far.
    read: u64,
    /// The last message read: (sequence, recording time).
    last: Option<(u64, u64)>,
    /// Why it stopped before the end of its window, if it did.
    cut: Option<String>,
    done: bool,
    policy: std::sync::Arc<SourcePolicy>,
    /// Which paths each subject may speak for: a recorded event outside them replays as it
    /// was ingested, refused.
    bindings: std::sync::Arc<crate::event::binding::Bindings>,
}

fn unavailable(what: &str) -> impl FnOnce(String) -> ReplayError + '_ {
    move |e| ReplayError::Unavailable(format!("{what}: {e}"))
}

impl Reader {
    /// Opens `window` on the events stream of `js`, parsing with `policy` and refusing what
    /// `bindings` refuses (read as malformed). A missing or empty
    /// stream reads as no message.
    pub async fn open(
        js: &jetstream::Context,
        window: &Window,
        policy: std::sync::Arc<SourcePolicy>,
        bindings: std::sync::Arc<crate::event::binding::Bindings>,
    ) -> Result<Reader, ReplayError> {
        let mut reader = Reader {
            source: None,
            end_seq: 0,
            until_ms: window.until_ms,
            limit: window.limit,
            read: 0,
            last: None,
            cut: None,
            done: true,
            policy,
            bindings,
        };
        let mut stream = match js.get_stream(EVENTS_STREAM).await {
            Ok(stream) => stream,
            Err(e)
                if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref j)
                    if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
            {
                return Ok(reader);
            }
            Err(e) => return Err(unavailable("look up the events stream")(e.to_string())),
        };
        let end_seq =
            stream.info().await.map_err(|e| unavailable("read the events stream")(e.to_string()))?.state.last_sequence;
        if end_seq == 0 {
            return Ok(reader);
        }
        let start_time = async_nats::datetime::from_nanos(i128::from(window.since_ms) * 1_000_000)
            .map_err(|e| ReplayError::BadRequest(format!("since: {e}")))?;
        let config = jetstream::consumer::pull::Config {
            deliver_policy: DeliverPolicy::ByStartTime { start_time },
            ack_policy: AckPolicy::None,
            filter_subjects: EVENTS_SUBJECTS.iter().map(|s| s.to_string()).collect(),
            inactive_threshold: Duration::from_secs(60),
            memory_storage: true,
            description: Some("htfaas replay (ephemeral)".into()),
            ..Default::default()
        };
        let consumer: PullConsumer =
            stream.create_consumer(config).await.map_err(|e| unavailable("create a replay consumer")(e.to_string()))?;
        reader.done = consumer.cached_info().num_pending == 0;
        reader.source = Some((stream, consumer));
        reader.end_seq = end_seq;
        Ok(reader)
    }

    /// The next messages in stream order, or `None` at the end of the window (or of the
    /// limit).
    pub async fn next_batch(&mut self) -> Result<Option<Vec<Recorded>>, ReplayError> {
        let Some((_, consumer)) = &self.source else { return Ok(None) };
        if self.done {
            return Ok(None);
        }
        let want = BATCH.min(self.limit - self.read);
        if want == 0 {
            self.done = true;
            if self.last.is_some_and(|(seq, _)| seq < self.end_seq) {
                self.cut = Some(format!("the limit of {} messages", self.limit));
            }
            return Ok(None);
        }
        let mut messages = consumer
            .fetch()
            .max_messages(want as usize)
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .map_err(|e| unavailable("fetch recorded events")(e.to_string()))?;
        let mut batch = Vec::new();
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| unavailable("fetch recorded events")(e.to_string()))?;
            let Ok(info) = message.info() else {
                tracing::warn!("recorded message without JetStream info, skipped");
                continue;
            };
            let seq = info.stream_sequence;
            let recorded_ms = u64::try_from(info.published.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
            if seq > self.end_seq || self.until_ms.is_some_and(|u| recorded_ms > u) {
                self.done = true;
                break;
            }
            let decision = event::decide_bound(
                &message.subject,
                message.headers.as_ref(),
                &message.payload,
                &format!("nats-seq-{seq}"),
                &self.policy,
                &self.bindings,
            );
            self.read += 1;
            self.last = Some((seq, recorded_ms));
            batch.push(Recorded { seq, recorded_ms, decision });
            if seq >= self.end_seq {
                self.done = true;
                break;
            }
        }
        if batch.is_empty() {
            self.done = true;
            return Ok(None);
        }
        Ok(Some(batch))
    }

    /// Deletes the consumer (best effort).
    pub async fn close(self) {
        if let Some((stream, consumer)) = self.source {
            let name = consumer.cached_info().name.clone();
            if let Err(e) = stream.delete_consumer(&name).await {
                tracing::debug!(consumer = %name, "replay consumer not deleted (it expires): {e}");
            }
        }
    }
}

/// A function whose trigger is evaluated on the recorded events: a registered one, or a
/// candidate manifest (version 0) for a dry-run registration.
pub struct Target {
    /// The function.
    pub record: FunctionRecord,
    /// Its trigger, compiled.
    rule: Rule,
}

impl Target {
    /// Compiles `record`'s trigger.
    pub fn new(record: FunctionRecord) -> Result<Target, RuleError> {
        let rule = record.manifest.trigger.compile()?;
        Ok(Target { record, rule })
    }

    /// Every function of `records` whose trigger compiles (a stored one always should).
    pub fn all(records: Vec<FunctionRecord>) -> Vec<Target> {
        records
            .into_iter()
            .filter_map(|record| {
                let name = record.manifest.name.clone();
                Target::new(record)
                    .map_err(|e| tracing::error!(function = %name, "stored trigger does not compile: {e}"))
                    .ok()
            })
            .collect()
    }

    /// Whether `event` fires this function: its trigger is true, and the file is not in the
    /// function's own output directory (the ingest's loop guard).
    pub fn fires_on(&self, event: &StorageEvent) -> bool {
        self.rule.matches(event) && !event.path.starts_with(&self.record.manifest.outputs.dir)
    }
}

/// What to do with the pairs that match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// List them.
    DryRun,
    /// Fire them under this replay id.
    Replay(String),
}

/// Reads `window` of the recorded events and evaluates `targets` on each event: lists the
/// pairs that fire (dry run) or fires them (replay). Stops after [`TIME_BUDGET`].
pub async fn run(
    shared: &Shared,
    js: &jetstream::Context,
    window: &Window,
    targets: &[Target],
    mode: &Mode,
) -> Result<Report, ReplayError> {
    let started = Instant::now();
    let mut report = Report {
        dry_run: *mode == Mode::DryRun,
        replay_id: match mode {
            Mode::DryRun => None,
            Mode::Replay(id) => Some(id.clone()),
        },
        since: fmt_time(window.since_ms),
        until: window.until_ms.map(fmt_time),
        functions: targets.iter().map(|t| t.record.manifest.name.clone()).collect(),
        ..Report::default()
    };
    let mut reader = Reader::open(js, window, shared.sources(), shared.source_paths.clone()).await?;
    let result = scan(shared, &mut reader, targets, mode, started, &mut report).await;
    if report.stopped.is_none() {
        report.stopped = reader.cut.take();
    }
    if report.stopped.is_some() {
        report.resume_since = reader.last.map(|(_, ms)| fmt_time(ms));
    }
    reader.close().await;
    result?;
    tracing::info!(replay = ?report.replay_id, scanned = report.scanned, matched = report.matched,
        fired = report.fired, failures = report.failures, "replay done");
    Ok(report)
}

async fn scan(
    shared: &Shared,
    reader: &mut Reader,
    targets: &[Target],
    mode: &Mode,
    started: Instant,
    report: &mut Report,
) -> Result<(), ReplayError> {
    loop {
        if started.elapsed() >= TIME_BUDGET {
            report.stopped = Some(format!("the time budget of {}s", TIME_BUDGET.as_secs()));
            return Ok(());
        }
        let Some(batch) = reader.next_batch().await? else { return Ok(()) };
        for recorded in batch {
            report.scanned += 1;
            let event = match recorded.decision {
                Ok(Decision::Fire(e)) => e,
                Ok(Decision::Ignore(_)) => {
                    report.ignored += 1;
                    continue;
                }
                Ok(Decision::NotEnabled(_)) => {
                    report.not_enabled += 1;
                    continue;
                }
                Err(_) => {
                    report.malformed += 1;
                    continue;
                }
            };
            report.parsed += 1;
            let matching: Vec<&Target> = targets.iter().filter(|t| t.fires_on(&event)).collect();
            if matching.is_empty() {
                continue;
            }
            let n = matching.len() as u64;
            report.matched += n;
            let fired = match mode {
                Mode::DryRun => None,
                Mode::Replay(id) => {
                    // One transaction per event, as the ingest does.
                    let records: Vec<FunctionRecord> = matching.iter().map(|t| t.record.clone()).collect();
                    let verdict = crate::ingest::fire_all(shared, &event, &records, Some(id.as_str())).await;
                    let ok = verdict == crate::ingest::Verdict::Ack;
                    if ok {
                        report.fired += n;
                    } else {
                        report.failures += n;
                    }
                    Some(ok)
                }
            };
            let recorded_at = fmt_time(recorded.recorded_ms);
            for target in matching {
                if report.pairs.len() < MAX_LISTED {
                    report.pairs.push(pair(recorded.seq, &recorded_at, &event, target, fired));
                } else {
                    report.pairs_truncated = true;
                }
            }
        }
    }
}

fn pair(seq: u64, recorded: &str, event: &StorageEvent, target: &Target, fired: Option<bool>) -> Pair {
    Pair {
        seq,
        recorded: recorded.to_owned(),
        event_id: event.id.clone(),
        path: event.path.clone(),
        kind: event.kind.as_str().to_owned(),
        msg_type: event.msg_type.clone(),
        time: event.time.clone(),
        function: target.record.manifest.name.clone(),
        version: target.record.version,
        fired,
    }
}

/// Where recorded events are read from: the gateway's JetStream context. Handed to the API as
/// an `axum::Extension`; the API answers 503 on the routes that read recorded events without it.
#[derive(Clone)]
pub struct Events(pub jetstream::Context);

impl Events {
    /// Connects to NATS at `nats_url` as `credential`.
    pub async fn connect(
        nats_url: &str,
        credential: Option<&htfaas_functions::nats::NatsCredential>,
    ) -> anyhow::Result<Events> {
        use anyhow::Context as _;
        let client = htfaas_functions::nats::connect_options("htfaas-gateway-replay", credential)
            .connect(nats_url)
            .await
            .with_context(|| format!("connect to NATS at {nats_url} (replay)"))?;
        Ok(Events(jetstream::new(client)))
    }
}

/// The window and the mode `request` asks for, checked; relative times count back from
/// `now_ms`.
pub fn plan(request: &ReplayRequest, now_ms: u64) -> Result<(Window, Mode), ReplayError> {
    let window = Window::resolve(&request.since, request.until.as_ref(), request.limit, now_ms)?;
    let mode = match (request.dry_run, &request.replay_id) {
        (true, Some(_)) => return Err(ReplayError::BadRequest("a dry run takes no replay_id".into())),
        (true, None) => Mode::DryRun,
        (false, Some(id)) => {
            check_replay_id(id)?;
            Mode::Replay(id.clone())
        }
        (false, None) => Mode::Replay(new_replay_id()),
    };
    Ok((window, mode))
}

/// The window a dry-run registration's `query` asks for, checked (no `since`:
/// [`DEFAULT_DRY_RUN_WINDOW_S`] ago).
pub fn register_window(query: &RegisterQuery, now_ms: u64) -> Result<Window, ReplayError> {
    let since = match &query.since {
        Some(s) => TimeArg::Text(s.clone()),
        None => TimeArg::Text(format!("-{DEFAULT_DRY_RUN_WINDOW_S}s")),
    };
    Window::resolve(&since, query.until.clone().map(TimeArg::Text).as_ref(), query.limit, now_ms)
}

/// A manifest not registered, as the [`Target`] of a dry run (version 0). The caller has
/// validated it as a registration would.
pub fn candidate(manifest: htfaas_functions::FunctionManifest) -> Result<Target, ReplayError> {
    let record = FunctionRecord { schema: 1, version: 0, registered_at: now_ms() / 1000, manifest };
    Target::new(record).map_err(|e| ReplayError::BadRequest(format!("invalid manifest: trigger: {e}")))
}

/// Most headers a test request may give.
const MAX_TEST_HEADERS: usize = 64;

/// Tests `record`'s trigger on the message `request` gives or names (`events` reads a recorded
/// one), parsed with `policy` and held to `bindings` (the paths its subject may speak for) as
/// the ingest does.
pub async fn test_request(
    events: Option<&Events>,
    record: &FunctionRecord,
    request: &TestRequest,
    policy: &SourcePolicy,
    bindings: &crate::event::binding::Bindings,
) -> Result<TestReport, ReplayError> {
    match (&request.event, request.seq) {
        (Some(event), None) => {
            if request.headers.len() > MAX_TEST_HEADERS {
                return Err(ReplayError::BadRequest(format!("at most {MAX_TEST_HEADERS} headers")));
            }
            let mut headers = async_nats::HeaderMap::new();
            for (name, value) in &request.headers {
                let n: async_nats::header::HeaderName =
                    name.parse().map_err(|e| ReplayError::BadRequest(format!("header name {name:?}: {e}")))?;
                let v: async_nats::HeaderValue =
                    value.parse().map_err(|e| ReplayError::BadRequest(format!("header {name} value: {e}")))?;
                headers.insert(n, v);
            }
            let payload = serde_json::to_vec(event).map_err(|e| ReplayError::BadRequest(format!("event: {e}")))?;
            let subject = request.subject.as_deref().unwrap_or(htfaas_functions::proto::EVENTS_SUBJECT);
            let headers = (!request.headers.is_empty()).then_some(&headers);
            Ok(test_event(record, subject, headers, &payload, "test", policy, bindings))
        }
        (None, Some(seq)) => {
            if request.subject.is_some() || !request.headers.is_empty() {
                return Err(ReplayError::BadRequest("a recorded message (seq) has its own subject and headers".into()));
            }
            let Some(Events(js)) = events else {
                return Err(ReplayError::Unavailable("the gateway reads no recorded events".into()));
            };
            let stream =
                js.get_stream(EVENTS_STREAM).await.map_err(|e| unavailable("the events stream")(e.to_string()))?;
            let message = stream.get_raw_message(seq).await.map_err(|e| {
                if matches!(e.kind(), jetstream::stream::RawMessageErrorKind::NoMessageFound) {
                    ReplayError::NotFound(format!("no recorded message with sequence {seq}"))
                } else {
                    unavailable("read a recorded message")(e.to_string())
                }
            })?;
            let headers = (!message.headers.is_empty()).then_some(&message.headers);
            let id = format!("nats-seq-{seq}");
            Ok(test_event(record, &message.subject, headers, &message.payload, &id, policy, bindings))
        }
        _ => Err(ReplayError::BadRequest("give either event (with subject, headers) or seq".into())),
    }
}

/// `true`, `false` or `undefined`.
pub fn truth_str(t: Truth) -> &'static str {
    match t {
        Truth::True => "true",
        Truth::False => "false",
        Truth::Undefined => "undefined",
    }
}

/// Parses one message as the ingest would (`subject`, `headers`, `payload`, `message_id`) and
/// evaluates `record`'s trigger on it.
pub fn test_event(
    record: &FunctionRecord,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    message_id: &str,
    policy: &SourcePolicy,
    bindings: &crate::event::binding::Bindings,
) -> TestReport {
    let trigger: &Trigger = &record.manifest.trigger;
    let mut report = TestReport {
        function: record.manifest.name.clone(),
        version: record.version,
        trigger: trigger.to_string(),
        outcome: String::new(),
        reason: None,
        event: None,
        verdict: None,
        parts: Vec::new(),
        own_output: false,
        fires: false,
    };
    let event = match event::decide_bound(subject, headers, payload, message_id, policy, bindings) {
        Ok(Decision::Fire(e)) => e,
        Ok(Decision::Ignore(why)) => {
            report.outcome = "ignored".into();
            report.reason = Some(why.to_owned());
            return report;
        }
        Ok(Decision::NotEnabled(ty)) => {
            report.outcome = "not-enabled".into();
            report.reason = Some(format!("type {ty} is not enabled by the site"));
            return report;
        }
        Err(e @ event::EventError::OutOfBounds { .. }) => {
            report.outcome = "out-of-bounds".into();
            report.reason = Some(e.to_string());
            return report;
        }
        Err(e) => {
            report.outcome = "malformed".into();
            report.reason = Some(e.to_string());
            return report;
        }
    };
    report.outcome = "event".into();
    let whole = trigger.compile().map(|r| r.evaluate(&event));
    report.verdict = Some(match &whole {
        Ok(t) => truth_str(*t).to_owned(),
        Err(e) => format!("the trigger does not compile: {e}"),
    });
    if !trigger.path.is_empty()
        && let Ok(rule) = Rule::path_glob(&trigger.path)
    {
        let verdict = truth_str(rule.evaluate(&event)).to_owned();
        report.parts.push(PartVerdict { part: "path".into(), text: trigger.path.clone(), verdict });
    }
    if let Some(text) = &trigger.rule
        && let Ok(rule) = Rule::parse(text)
    {
        let verdict = truth_str(rule.evaluate(&event)).to_owned();
        report.parts.push(PartVerdict { part: "rule".into(), text: text.clone(), verdict });
    }
    report.own_output = event.path.starts_with(&record.manifest.outputs.dir);
    report.fires = whole == Ok(Truth::True) && !report.own_output;
    report.event = Some(*event);
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::manifest::{Outputs, Resources};
    use htfaas_functions::{Digest, FunctionManifest};

    const NOW: u64 = 1_795_000_000_000;

    #[test]
    fn times_parse_as_rfc3339_unix_seconds_or_relative() {
        assert_eq!(parse_time("2026-11-22T10:00:00Z", NOW), Ok(1_795_341_600_000));
        assert_eq!(parse_time("2026-11-22T11:00:00+01:00", NOW), Ok(1_795_341_600_000));
        assert_eq!(parse_time("2026-11-22T10:00:00.250Z", NOW), Ok(1_795_341_600_250));
        assert_eq!(parse_time(" 1795341600 ", NOW), Ok(1_795_341_600_000));
        assert_eq!(parse_time("0", NOW), Ok(0));
        assert_eq!(parse_time("-2h", NOW), Ok(NOW - 7_200_000));
        assert_eq!(parse_time("-90s", NOW), Ok(NOW - 90_000));
        assert_eq!(parse_time("-30m", NOW), Ok(NOW - 1_800_000));
        assert_eq!(parse_time("-7d", NOW), Ok(NOW - 7 * 86_400_000));
        for (bad, want) in [
            ("", "want RFC 3339"),
            ("yesterday", "want RFC 3339"),
            ("2026-11-22 10:00", "want RFC 3339"),
            ("-2w", "unknown unit \"w\""),
            ("-h", "want -<number>"),
            ("-99999999999999999999d", "want -<number>"),
            ("-999999999d", "before 1970"),
            ("99999999999999999999", "out of range"),
            ("1960-01-01T00:00:00Z", "before 1970"),
        ] {
            let e = parse_time(bad, NOW).expect_err(bad);
            assert!(e.contains(want), "{bad:?}: {e}");
        }
        assert_eq!(to_unix_ms(&TimeArg::Unix(1_795_341_600), NOW), Ok(1_795_341_600_000));
        assert!(to_unix_ms(&TimeArg::Unix(u64::MAX), NOW).is_err());
        // JSON: a number is Unix seconds, a string any of the above.
        let t: TimeArg = serde_json::from_str("1795341600").expect("number");
        assert_eq!(t, TimeArg::Unix(1_795_341_600));
        let t: TimeArg = serde_json::from_str(r#""-2h""#).expect("string");
        assert_eq!(to_unix_ms(&t, NOW), Ok(NOW - 7_200_000));
    }

    #[test]
    fn times_format_as_utc_and_round_trip() {
        assert_eq!(fmt_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(fmt_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(fmt_time(1_795_341_600_250), "2026-11-22T10:00:00.250Z");
        for ms in [0, 1, 951_782_400_000, 1_795_341_600_250, 4_102_444_799_999] {
            assert_eq!(parse_time(&fmt_time(ms), NOW), Ok(ms));
        }
    }

    #[test]
    fn windows_are_checked_and_bounded() {
        let since = TimeArg::Text("-2h".into());
        let w = Window::resolve(&since, None, None, NOW).expect("resolves");
        assert_eq!(w, Window { since_ms: NOW - 7_200_000, until_ms: None, limit: DEFAULT_LIMIT });
        let w = Window::resolve(&since, Some(&TimeArg::Text("-1h".into())), Some(MAX_EVENTS), NOW).expect("ok");
        assert_eq!((w.until_ms, w.limit), (Some(NOW - 3_600_000), MAX_EVENTS));
        for (until, limit, want) in [
            (Some(TimeArg::Text("-3h".into())), None, "until is before since"),
            (None, Some(0), "limit must be"),
            (None, Some(MAX_EVENTS + 1), "limit must be"),
            (Some(TimeArg::Text("soon".into())), None, "until: \"soon\""),
        ] {
            let e = Window::resolve(&since, until.as_ref(), limit, NOW).expect_err(want);
            assert!(matches!(&e, ReplayError::BadRequest(m) if m.contains(want)), "{e}");
        }
        assert!(Window::resolve(&TimeArg::Text("x".into()), None, None, NOW).is_err());
    }

    #[test]
    fn replay_ids_are_fresh_and_checked() {
        let (a, b) = (new_replay_id(), new_replay_id());
        assert_ne!(a, b);
        assert!(a.starts_with('r') && check_replay_id(&a).is_ok(), "{a}");
        assert!(check_replay_id("nightly_2026-11-22").is_ok());
        for bad in ["", "a b", "a/b", "x#y", &"r".repeat(65)] {
            assert!(check_replay_id(bad).is_err(), "{bad:?}");
        }
    }

    fn record(trigger: Trigger) -> FunctionRecord {
        FunctionRecord {
            schema: 1,
            version: 3,
            registered_at: 0,
            manifest: FunctionManifest {
                name: "a".into(),
                owner: "alice".into(),
                module: Digest::of(b"\0asm\x01\0\0\0"),
                trigger,
                resources: Resources::default(),
                outputs: Outputs { dir: "/data/raw/out/".into(), replace: false },
                args: vec![],
                env: vec![],
                annex: None,
                class: None,
                limits: Default::default(),
            },
        }
    }

    fn transfer(path: &str, size: Option<u64>) -> Vec<u8> {
        let mut v = serde_json::json!({
            "msgType": "transfer", "isWrite": "write", "isP2p": false, "status": {"code": 0, "msg": ""},
            "cellName": "pool-a", "cellDomain": "poolDomain", "transferPath": path, "pnfsid": "0000BEEF",
            "session": format!("s-{path}"),
        });
        if let Some(size) = size {
            v["fileSize"] = size.into();
        }
        serde_json::to_vec(&v).expect("json")
    }

    fn test(trigger: Trigger, payload: &[u8]) -> TestReport {
        let subject = htfaas_functions::proto::EVENTS_SUBJECT;
        test_event(
            &record(trigger),
            subject,
            None,
            payload,
            "nats-seq-7",
            &SourcePolicy::default(),
            &crate::event::binding::Bindings::default(),
        )
    }

    #[test]
    fn a_test_holds_the_event_to_the_paths_its_subject_may_speak_for() {
        use crate::event::binding::{Bindings, SourcePaths};
        let subject = htfaas_functions::proto::EVENTS_SUBJECT;
        let bound = Bindings::new(Some(vec![SourcePaths { subject: subject.into(), paths: vec!["/data/".into()] }]))
            .expect("bindings");
        let trigger = Trigger::on_path("/site/**");
        let policy = SourcePolicy::default();
        let r = test_event(&record(trigger.clone()), subject, None, &transfer("/site/x", None), "t", &policy, &bound);
        assert_eq!((r.outcome.as_str(), r.fires), ("out-of-bounds", false), "{r:?}");
        assert!(r.reason.as_deref().is_some_and(|why| why.contains("/site/x")), "{r:?}");
        let r =
            test_event(&record(trigger), subject, None, &transfer("/site/x", None), "t", &policy, &Bindings::default());
        assert_eq!((r.outcome.as_str(), r.fires), ("event", true), "without bindings: {r:?}");
    }

    #[test]
    fn a_test_says_how_the_event_parsed_and_what_each_part_of_the_trigger_says() {
        let both = Trigger { rule: Some("size > 1kB".into()), ..Trigger::on_path("/data/raw/**") };
        let r = test(both.clone(), &transfer("/data/raw/x.h5", Some(5000)));
        assert_eq!((r.outcome.as_str(), r.verdict.as_deref(), r.fires), ("event", Some("true"), true));
        assert_eq!((r.function.as_str(), r.version), ("a", 3));
        let event = r.event.expect("an event");
        assert_eq!((event.path.as_str(), event.size), ("/data/raw/x.h5", Some(5000)));
        assert_eq!(event.source.message.as_deref(), Some("nats-seq-7"));
        let parts: Vec<(&str, &str)> = r.parts.iter().map(|p| (p.part.as_str(), p.verdict.as_str())).collect();
        assert_eq!(parts, [("path", "true"), ("rule", "true")]);

        // The rule is false, the path true: the parts say which.
        let r = test(both.clone(), &transfer("/data/raw/x.h5", Some(10)));
        assert_eq!((r.verdict.as_deref(), r.fires), (Some("false"), false));
        let parts: Vec<&str> = r.parts.iter().map(|p| p.verdict.as_str()).collect();
        assert_eq!(parts, ["true", "false"]);
        // Unknown size: undefined, which does not fire.
        let r = test(both.clone(), &transfer("/data/raw/x.h5", None));
        assert_eq!((r.verdict.as_deref(), r.fires), (Some("undefined"), false));
        // True, but in the function's own output directory: the loop guard.
        let r = test(both, &transfer("/data/raw/out/x.h5", Some(5000)));
        assert_eq!((r.verdict.as_deref(), r.own_output, r.fires), (Some("true"), true, false));

        // Not events: malformed, ignored, not enabled; no verdict.
        let r = test(Trigger::on_path("/data/**"), b"{not json");
        assert_eq!((r.outcome.as_str(), r.verdict, r.fires), ("malformed", None, false));
        assert!(r.reason.expect("reason").starts_with("not a dCache billing message"));
        let mut p2p: serde_json::Value = serde_json::from_slice(&transfer("/data/a", None)).expect("json");
        p2p["isP2p"] = true.into();
        let r = test(Trigger::on_path("/data/**"), &serde_json::to_vec(&p2p).expect("json"));
        assert_eq!(r.outcome, "ignored");
        let mut remove: serde_json::Value = serde_json::from_slice(&transfer("/data/a", None)).expect("json");
        remove["msgType"] = "remove".into();
        let r = test(Trigger::on_path("/data/**"), &serde_json::to_vec(&remove).expect("json"));
        assert_eq!(r.outcome, "not-enabled", "{r:?}");
    }

    #[test]
    fn targets_fire_on_true_triggers_outside_their_own_outputs() {
        let t = Target::new(record(Trigger::on_path("/data/raw/**"))).expect("compiles");
        let event = |path: &str| {
            let d = event::decide(
                htfaas_functions::proto::EVENTS_SUBJECT,
                None,
                &transfer(path, Some(1)),
                "nats-seq-1",
                &SourcePolicy::default(),
            );
            match d {
                Ok(Decision::Fire(e)) => *e,
                other => panic!("{other:?}"),
            }
        };
        assert!(t.fires_on(&event("/data/raw/a")));
        assert!(!t.fires_on(&event("/data/other/a")));
        assert!(!t.fires_on(&event("/data/raw/out/a")), "its own output");
        let mut bad = record(Trigger::on_path("/data/raw/**"));
        bad.manifest.trigger = Trigger::on_path("");
        assert_eq!(Target::all(vec![bad, record(Trigger::on_path("/x/**"))]).len(), 1);
    }
}
