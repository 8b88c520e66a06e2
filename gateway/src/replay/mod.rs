//! Replay and dry-run over recorded events: `htfaas events replay`, `htfaas fn test` and
//! `htfaas fn register --dry-run`.
//!
//! The events stream ([`EVENTS_STREAM`](htfaas_functions::proto::EVENTS_STREAM)) keeps every
//! message the gateway consumes for
//! [`EVENTS_MAX_AGE_S`](htfaas_functions::proto::EVENTS_MAX_AGE_S). A [`Reader`] reads a
//! window of it, from `since` to `until` or to the stream's last sequence when the request
//! began (so it ends), through an ephemeral pull
//! consumer that acks nothing: the gateway's durable consumer is not touched. Each message is
//! parsed by the same [`sources::decide`](htfaas_functions::sources::decide) as the ingest loop
//! (message id `nats-seq-<seq>`); ignored, not-enabled and malformed messages are counted, never fatal. [`run`] then
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
//! The requests and answers ([`ReplayRequest`], [`RegisterQuery`],
//! [`TestRequest`](htfaas_functions::proto::TestRequest), [`Report`],
//! [`TestReport`](htfaas_functions::proto::TestReport), [`TimeArg`]) are wire types and live in
//! [`htfaas_functions::proto`]; what they mean is decided here: [`plan`], [`register_window`],
//! [`to_unix_ms`].
//!
//! Here: the requests' windows and times, and the replay's run over the events; the reader of
//! the recorded events is `reader`, a function's test on one message `test`. Must not know:
//! HTTP (the API's routes call it), the JetStream consumer of the ingest loop, the firing
//! table's SQL (a replay fires through [`crate::ingest::fire_all`]).

use crate::state::Shared;
use async_nats::jetstream;
use htfaas_functions::FunctionRecord;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::{Pair, RegisterQuery, ReplayRequest, Report, TimeArg};
use htfaas_functions::sources::Decision;
use htfaas_functions::trigger::{Rule, RuleError};
use std::time::{Duration, Instant};

mod reader;
mod test;

pub use reader::{Events, Reader, Recorded};
pub use test::{test_event, test_request, truth_str};

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

/// Why a time ([`parse_time`], [`to_unix_ms`]) is refused; the message quotes the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// Unix seconds whose milliseconds do not fit in 64 bits.
    #[error("{0}: out of range")]
    UnixOutOfRange(u64),
    /// `-` not followed by a number that fits in 64 bits.
    #[error("{0:?}: want -<number><s|m|h|d>, e.g. -2h")]
    BadSpan(String),
    /// A span with a unit other than s, m, h and d.
    #[error("{text:?}: unknown unit {unit:?} (s, m, h, d)")]
    UnknownUnit {
        /// The time as given.
        text: String,
        /// The unit as given.
        unit: String,
    },
    /// A number too large for Unix milliseconds.
    #[error("{0:?}: out of range")]
    OutOfRange(String),
    /// A time before the Unix epoch.
    #[error("{0:?}: before 1970")]
    BeforeEpoch(String),
    /// Neither RFC 3339, Unix seconds nor a span.
    #[error("{text:?}: want RFC 3339 (2026-11-22T10:00:00Z), Unix seconds or -<n><s|m|h|d> ({why})")]
    Unparsable {
        /// The time as given.
        text: String,
        /// What the RFC 3339 parser said.
        why: String,
    },
}

/// Unix milliseconds of `time`, relative times counted back from `now_ms`.
pub fn to_unix_ms(time: &TimeArg, now_ms: u64) -> Result<u64, TimeError> {
    match time {
        TimeArg::Unix(s) => s.checked_mul(1000).ok_or(TimeError::UnixOutOfRange(*s)),
        TimeArg::Text(t) => parse_time(t, now_ms),
    }
}

/// Parses a time: RFC 3339 with any offset (`2026-11-22T10:00:00Z`, `…+01:00`, fractions
/// allowed), Unix seconds (`1795000000`), or a span before `now_ms` (`-90s`, `-30m`, `-2h`,
/// `-7d`). Returns Unix milliseconds.
pub fn parse_time(text: &str, now_ms: u64) -> Result<u64, TimeError> {
    let t = text.trim();
    if let Some(span) = t.strip_prefix('-') {
        let (number, unit) = span.split_at(span.find(|c: char| !c.is_ascii_digit()).unwrap_or(span.len()));
        let n: u64 = number.parse().map_err(|_| TimeError::BadSpan(text.to_owned()))?;
        let unit_ms: u64 = match unit {
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(TimeError::UnknownUnit { text: text.to_owned(), unit: unit.to_owned() }),
        };
        let back = n.checked_mul(unit_ms).ok_or_else(|| TimeError::OutOfRange(text.to_owned()))?;
        return now_ms.checked_sub(back).ok_or_else(|| TimeError::BeforeEpoch(text.to_owned()));
    }
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        let s: u64 = t.parse().map_err(|_| TimeError::OutOfRange(text.to_owned()))?;
        return s.checked_mul(1000).ok_or_else(|| TimeError::OutOfRange(text.to_owned()));
    }
    htfaas_functions::time::parse_rfc3339_ms(t).ok_or_else(|| TimeError::Unparsable {
        text: text.to_owned(),
        why: "not YYYY-MM-DDTHH:MM:SS[.frac] then Z or ±HH:MM, or before 1970".to_owned(),
    })
}

pub use htfaas_functions::time::{now_ms, utc_timestamp_ms as fmt_time};

/// A fresh replay id: `r<unix ms>-<8 hex>`.
pub fn new_replay_id() -> String {
    format!("r{}-{}", now_ms(), htfaas_functions::token::random_tag())
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

    /// Every function of `records` whose trigger compiles (a stored one always should), but
    /// those scheduled on no file: no event fires them.
    pub fn all(records: Vec<FunctionRecord>) -> Vec<Target> {
        records
            .into_iter()
            .filter(|record| !record.manifest.trigger.on_no_file())
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

/// What a replay or dry run uses of the gateway ([`run`]): the source policy and the
/// subjects' paths its [`Reader`] decides with, the firing table and counters a replay fires
/// into ([`crate::ingest::fire_all`]).
#[derive(Clone, Copy)]
pub struct ReplayContext<'a> {
    /// The site's source policy (read once, when the run starts).
    pub sources: &'a htfaas_functions::sources::PolicyCell,
    /// Which paths each events subject may speak for.
    pub source_paths: &'a std::sync::Arc<htfaas_functions::sources::binding::Bindings>,
    /// The durable firing table.
    pub firings: &'a crate::firing::Firings,
    /// Counters.
    pub stats: &'a crate::stats::Stats,
}

impl<'a> ReplayContext<'a> {
    /// The parts of `shared` a replay uses.
    pub fn of(shared: &'a Shared) -> ReplayContext<'a> {
        ReplayContext {
            sources: &shared.source_policy,
            source_paths: &shared.source_paths,
            firings: &shared.firings,
            stats: &shared.stats,
        }
    }
}

/// Reads `window` of the recorded events and evaluates `targets` on each event: lists the
/// pairs that fire (dry run) or fires them (replay). Stops after [`TIME_BUDGET`].
pub async fn run(
    context: ReplayContext<'_>,
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
    let mut reader = Reader::open(js, window, context.sources.current(), context.source_paths.clone()).await?;
    let result = scan(context.firings, context.stats, &mut reader, targets, mode, started, &mut report).await;
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
    firings: &crate::firing::Firings,
    stats: &crate::stats::Stats,
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
                    let verdict = crate::ingest::fire_all(firings, stats, &event, &records, Some(id.as_str())).await;
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
        group: target.record.manifest.trigger.collect.as_ref().and_then(|c| c.group_of(&event.path)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::Trigger;
    use htfaas_functions::manifest::{Outputs, Resources};
    use htfaas_functions::proto::TestReport;
    use htfaas_functions::sources::{self, SourcePolicy};
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
            let e = parse_time(bad, NOW).expect_err(bad).to_string();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
        assert_eq!(to_unix_ms(&TimeArg::Unix(1_795_341_600), NOW), Ok(1_795_341_600_000));
        assert_eq!(to_unix_ms(&TimeArg::Unix(u64::MAX), NOW), Err(TimeError::UnixOutOfRange(u64::MAX)));
        assert_eq!(TimeError::UnixOutOfRange(u64::MAX).to_string(), format!("{}: out of range", u64::MAX));
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
                runtime: Default::default(),
                command: Vec::new(),
                handler: false,
                retry: None,
                name: "a".into(),
                owner: "alice".into(),
                module: Digest::of(b"\0asm\x01\0\0\0"),
                trigger,
                resources: Resources::default(),
                outputs: Outputs::into_dir("/data/raw/out/"),
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
            &htfaas_functions::sources::binding::Bindings::default(),
        )
    }

    #[test]
    fn a_test_holds_the_event_to_the_paths_its_subject_may_speak_for() {
        use htfaas_functions::sources::binding::{Bindings, SourcePaths};
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
            let d = sources::decide(
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
