//! `htfaas bridge xrootd-notify`: XRootD `ofs.notify` lines to CloudEvents on NATS JetStream.
//!
//! XRootD writes one line per namespace event to a program's stdin or to a FIFO:
//!
//! ```text
//! ofs.notify closew create rm mv |/usr/bin/htfaas bridge xrootd-notify --nats nats://…   # program
//! ofs.notify closew create rm mv >/var/spool/xrootd/notify.fifo                           # FIFO
//! ofs.notifymsg closew $TID closew $LFN $FSIZE     # recommended: the closew line with the size
//! ```
//!
//! Each line is parsed by [`parse_line`] into [`BridgedEvent`]s and each event is published as
//! one structured [`CloudEvent`] on `storage.cloudevents.xrootd-notify`, waiting for the
//! JetStream PubAck. The gateway's ingest reads it there like any other source.
//!
//! # Lines
//!
//! `<tid> <event> <fields…> [<size>]`, fields separated by white space; `<tid>` is XRootD's
//! trace id `user.pid:fd@host`, whose `user` becomes [`BridgedEvent::owner`] (XRootD's login
//! name, at most 8 characters, not an authenticated identity; `unknown`, which XrdHttp uses
//! when it has none, becomes no owner). A trailing decimal `<size>` is accepted after the
//! default fields of every event but `mv`, as a `notifymsg` with `$FSIZE` writes it.
//!
//! | line (default format) | event(s) | kind |
//! |---|---|---|
//! | `<tid> closew <path>` | one | [`EventKind::Write`]: the final close of a file opened for writing (also an XrdHttp PUT) |
//! | `<tid> create <mode> <path>` | one | [`EventKind::Create`] |
//! | `<tid> rm <path>` | one | [`EventKind::Remove`] |
//! | `<tid> mv <path> <path2>` | two | [`EventKind::Remove`] for `<path>`, [`EventKind::Write`] for `<path2>` (like inotify's `IN_MOVED_FROM`/`IN_MOVED_TO`; XRootD does not say whether a directory moved) |
//! | `<tid> closer <path>` | one | [`EventKind::Read`] |
//! | `<tid> mkdir <mode> <path>`, `chmod <mode> <path>`, `rmdir`, `openr`, `openw`, `fwrite <path>` | one | [`EventKind::Other`] (visible to rules, never fired by default) |
//! | `<tid> trunc <size>` | none | no path: ignored (counted) |
//!
//! A path is an XRootD LFN; `Settings::path_prefix` is put in front of it to make the site's
//! storage path. It must be absolute and clean ([`is_clean_abs_path`], not `/`); a trailing `/`
//! is dropped. Paths containing white space cannot be told apart from the fields and are
//! skipped. Anything else that does not parse (an unknown event, too few fields, a bad mode,
//! invalid UTF-8, a line over [`MAX_LINE_BYTES`]) is counted as skipped and logged, never fatal.
//!
//! # CloudEvents
//!
//! `specversion` `1.0`; `type` `org.htfaas.storage.xrootd-notify.<event>`; `source`
//! `xrootd://<source host>`; `id` `<bridge instance>-<line sequence>` (and `.0`/`.1` for the two
//! events of an `mv`): fixed when the line is read, so every retry of a publish carries the same
//! id; `subject` the path; `time` when the bridge read the line; `data` the [`BridgedEvent`]. The
//! NATS message has the headers `Nats-Msg-Id` (the CE id: JetStream's duplicate window drops a
//! retried publish that had in fact arrived) and `content-type: application/cloudevents+json`.
//!
//! # Delivery
//!
//! At least once from the moment a line is read; nothing before that. Events wait in a bounded
//! buffer ([`Settings::max_pending`]) until JetStream acknowledges them, one at a time, in
//! order; a failed publish (NATS down, no stream yet: the gateway creates the stream, the bridge
//! never does) is retried with backoff until it succeeds or the bridge shuts down. While the
//! buffer is full the bridge stops reading: the pipe fills, xrootd's notify thread blocks, its
//! own queue (`ofs.notify msgs`, 90 small / 10 big messages by default) fills, and **xrootd
//! drops events** ("Ran out of message objects" in its log). XRootD itself keeps nothing: events
//! raised while no bridge reads are lost once the pipe and that queue are full, and each data
//! server reports only its own. Consumers that must not miss a file reconcile with a listing.
//!
//! # Input
//!
//! Program mode reads stdin; when stdin ends (xrootd stops, or restarts the program), the bridge
//! publishes what it holds and returns. FIFO mode (`--fifo PATH`, the path of `ofs.notify
//! … >PATH`; xrootd creates the FIFO) waits for the FIFO to exist, then opens it read-write
//! (Linux), so that it never sees end-of-file when xrootd stops or restarts: the next xrootd
//! writes to the same FIFO. If the path comes to name another file (the FIFO was deleted and
//! made anew), the bridge reopens it. It runs until `shutdown`.
//!
//! # Shutdown
//!
//! On `shutdown` the bridge stops reading, spends at most [`DRAIN_DEADLINE`] publishing what it
//! holds, logs its counts ([`Stats`]) and returns them; events still unpublished then are counted
//! as `lost`.
//!
//! [`BridgedEvent`]: htfaas_functions::event::BridgedEvent
//! [`BridgedEvent::owner`]: htfaas_functions::event::BridgedEvent::owner
//! [`CloudEvent`]: htfaas_functions::event::CloudEvent
//! [`EventKind::Write`]: htfaas_functions::event::EventKind::Write
//! [`EventKind::Create`]: htfaas_functions::event::EventKind::Create
//! [`EventKind::Remove`]: htfaas_functions::event::EventKind::Remove
//! [`EventKind::Read`]: htfaas_functions::event::EventKind::Read
//! [`EventKind::Other`]: htfaas_functions::event::EventKind::Other
//! [`is_clean_abs_path`]: htfaas_functions::manifest::is_clean_abs_path
//!
//! Here: the settings and the read and publish loops; the notify line format is `parse`, the
//! bounded line reader and the inputs (stdin, FIFO) `reader`, the counts `stats`. Must not
//! know: the gateway (it only publishes on NATS).

use anyhow::Context as _;
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use htfaas_functions::event::SourceKind;
use htfaas_functions::proto::CLOUDEVENTS_SUBJECT_PREFIX;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod parse;
mod reader;
mod stats;

pub use parse::*;
pub use reader::*;
pub use stats::*;

/// The longest line the bridge accepts, newline excluded; a longer line is skipped whole.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// After `shutdown`, how long the bridge keeps trying to publish what it holds.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);
/// Backoff between publish attempts: from the first value, doubling, up to the second.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// How long one publish may wait for the server's PubAck, by default.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a FIFO path is checked for having been replaced, and a missing FIFO looked for.
const FIFO_CHECK: Duration = Duration::from_millis(500);
/// Media type of a structured-mode CloudEvent in JSON.
pub const CLOUDEVENTS_CONTENT_TYPE: &str = "application/cloudevents+json";

/// Where the notify lines come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Standard input: xrootd started the bridge as its notify program (`ofs.notify … |prog`).
    Stdin,
    /// The FIFO of `ofs.notify … >PATH`, created by xrootd.
    Fifo(PathBuf),
}

/// How the bridge runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// NATS server URL (`--nats`).
    pub nats_url: String,
    /// The bridge's NATS credential (`--nats-nkey-seed-file`), which the server lets publish on
    /// `storage.cloudevents.xrootd-notify` only. Default: none.
    pub nats_credential: Option<htfaas_functions::nats::NatsCredential>,
    /// Where the lines come from (`--fifo PATH`; default stdin).
    pub input: Input,
    /// Put in front of every XRootD LFN to make the site's storage path (`--path-prefix`):
    /// absolute and clean; a trailing `/` is ignored. Default: empty, the LFN is the path.
    pub path_prefix: String,
    /// The XRootD server's host name: the CloudEvents `source` is `xrootd://<source_host>`
    /// (`--source-host`). Default: this machine's host name ([`default_source_host`]).
    pub source_host: String,
    /// Events read but not yet acknowledged by JetStream, at most; when that many wait, the
    /// bridge stops reading. Default: 1024.
    pub max_pending: usize,
    /// How often the counts are logged (only when they changed). Default: 60 s.
    pub stats_interval: Duration,
    /// How long one publish waits for its PubAck before the bridge retries it. Default:
    /// [`PUBLISH_TIMEOUT`].
    pub publish_timeout: Duration,
    /// The counts, shared: whoever holds a clone reads them live. Default: fresh ones.
    pub stats: Arc<Stats>,
}

impl Settings {
    /// The defaults, for a NATS server and an input.
    pub fn new(nats_url: impl Into<String>, input: Input) -> Settings {
        Settings {
            nats_url: nats_url.into(),
            nats_credential: None,
            input,
            path_prefix: String::new(),
            source_host: default_source_host(),
            max_pending: 1024,
            stats_interval: Duration::from_secs(60),
            publish_timeout: PUBLISH_TIMEOUT,
            stats: Arc::default(),
        }
    }
}

/// This machine's host name (`/proc/sys/kernel/hostname`), or `localhost`.
pub fn default_source_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| valid_host(h))
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Whether `h` can stand as the authority of `xrootd://<h>`: a host name, an IPv4 address or
/// a bracketed IPv6 address, optionally with a port.
fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 255
        && h.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':' | b'[' | b']'))
}

/// The subject the bridge publishes on: `storage.cloudevents.xrootd-notify`.
pub fn subject() -> String {
    format!("{CLOUDEVENTS_SUBJECT_PREFIX}.{}", SourceKind::XrootdNotify.as_str())
}

/// One event ready to publish: its id is fixed, so every attempt is the same message.
#[derive(Debug)]
struct Pending {
    id: String,
    payload: Bytes,
}

/// Runs the bridge until `shutdown`, or (reading stdin) the end of its input and the
/// publication of every event read. Returns the counts.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<StatsSnapshot> {
    let prefix = normalize_prefix(&settings.path_prefix)?;
    anyhow::ensure!(valid_host(&settings.source_host), "bad source host {:?}", settings.source_host);
    anyhow::ensure!(settings.max_pending > 0, "max_pending must be at least 1");
    // Starts (and keeps reading, up to the buffer) while NATS is down.
    let client =
        crate::nats::connect_nats("htfaas-bridge-xrootd-notify", settings.nats_credential.as_ref(), &settings.nats_url)
            .await?;
    let js = jetstream::ContextBuilder::new().timeout(settings.publish_timeout).build(client);
    let subject = subject();
    tracing::info!(
        nats = %settings.nats_url,
        %subject,
        source = %format!("xrootd://{}", settings.source_host),
        prefix = %prefix,
        input = ?settings.input,
        "xrootd-notify bridge starting"
    );

    let stats = settings.stats.clone();
    let (tx, rx) = mpsc::channel::<Pending>(settings.max_pending);
    let give_up = CancellationToken::new();
    let mut publisher = tokio::spawn(publish_loop(js, subject, rx, stats.clone(), give_up.clone()));

    let read = read_loop(&settings, &prefix, tx, &stats, &shutdown).await;
    // The reader is done (shutdown, end of input or an error) and has dropped the sender: the
    // publisher ends once it published everything. At the end of the input it has until
    // shutdown; after shutdown or a read error, DRAIN_DEADLINE.
    let finished = if read.is_ok() {
        tokio::select! {
            r = &mut publisher => Some(r),
            _ = shutdown.cancelled() => None,
        }
    } else {
        None
    };
    let finished = match finished {
        Some(r) => Some(r),
        None => tokio::time::timeout(DRAIN_DEADLINE, &mut publisher).await.ok(),
    };
    if finished.is_none() {
        give_up.cancel();
        publisher.abort();
    }
    if let Some(Err(e)) = finished {
        tracing::error!("the publisher task failed: {e}");
    }
    let end = stats.snapshot();
    log_stats("stopped", &end);
    if end.unpublished() > 0 {
        tracing::warn!(
            lost = end.unpublished(),
            "events read but not published by shutdown (NATS unreachable, or no stream)"
        );
    }
    read.map(|()| end)
}

/// Reads lines until shutdown or the end of stdin; queues the events of each.
async fn read_loop(
    settings: &Settings,
    prefix: &str,
    tx: mpsc::Sender<Pending>,
    stats: &Stats,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let start = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let instance = format!("{:x}-{}", start.as_nanos(), std::process::id());
    let source_host = settings.source_host.as_str();
    let (mut reader, mut fifo_id) = match &settings.input {
        Input::Stdin => (LineReader::new(open_stdin()), None),
        Input::Fifo(path) => match open_fifo(path, shutdown).await? {
            Some((r, id)) => (LineReader::new(r), Some(id)),
            None => return Ok(()),
        },
    };
    let mut check = tokio::time::interval(FIFO_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stats_tick =
        tokio::time::interval_at(tokio::time::Instant::now() + settings.stats_interval, settings.stats_interval);
    stats_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_logged = stats.snapshot();
    loop {
        // Safe to cancel: `next_line` keeps what it read; the ticks lose nothing.
        let line = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            line = reader.next_line() => line,
            _ = check.tick(), if fifo_id.is_some() => {
                if let (Input::Fifo(path), Some(id)) = (&settings.input, fifo_id) {
                    let now = std::fs::metadata(path).ok().map(|m| file_id(&m));
                    if now != Some(id) {
                        tracing::warn!(fifo = %path.display(), "the FIFO was replaced or removed; reopening");
                        match open_fifo(path, shutdown).await? {
                            Some((r, id)) => {
                                reader = LineReader::new(r);
                                fifo_id = Some(id);
                            }
                            None => return Ok(()),
                        }
                    }
                }
                continue;
            }
            _ = stats_tick.tick() => {
                let now = stats.snapshot();
                if now != last_logged {
                    log_stats("running", &now);
                    last_logged = now;
                }
                continue;
            }
        };
        let line = match line {
            Ok(Some(line)) => line,
            Ok(None) => match &settings.input {
                Input::Stdin => {
                    tracing::info!("end of input (stdin closed)");
                    return Ok(());
                }
                Input::Fifo(path) => {
                    // Not expected: we hold the FIFO read-write. Reopen it.
                    tracing::warn!(fifo = %path.display(), "end of the FIFO; reopening");
                    tokio::time::sleep(FIFO_CHECK).await;
                    match open_fifo(path, shutdown).await? {
                        Some((r, id)) => {
                            reader = LineReader::new(r);
                            fifo_id = Some(id);
                        }
                        None => return Ok(()),
                    }
                    continue;
                }
            },
            Err(e) => match &settings.input {
                Input::Stdin => return Err(e).context("read stdin"),
                Input::Fifo(path) => {
                    tracing::warn!(fifo = %path.display(), "cannot read the FIFO ({e}); reopening");
                    tokio::time::sleep(FIFO_CHECK).await;
                    match open_fifo(path, shutdown).await? {
                        Some((r, id)) => {
                            reader = LineReader::new(r);
                            fifo_id = Some(id);
                        }
                        None => return Ok(()),
                    }
                    continue;
                }
            },
        };
        let seq = bump(&stats.lines);
        let parsed = match line {
            Err(e) => Err((e, String::new())),
            Ok(bytes) => match std::str::from_utf8(&bytes) {
                Ok(text) => parse_line(text).map_err(|e| (e, excerpt(text))),
                Err(_) => Err((LineError::NotUtf8, excerpt(&String::from_utf8_lossy(&bytes)))),
            },
        };
        let events = match parsed {
            Ok(events) => events,
            Err((e, text)) => {
                warn_skipped(stats, &e, &text);
                continue;
            }
        };
        if events.is_empty() {
            bump(&stats.ignored);
            continue;
        }
        let time = htfaas_functions::time::utc_timestamp_ms(htfaas_functions::time::now_ms());
        let many = events.len() > 1;
        for (k, mut event) in events.into_iter().enumerate() {
            event.path = format!("{prefix}{}", event.path);
            let id = if many { format!("{instance}-{seq}.{k}") } else { format!("{instance}-{seq}") };
            let ce = cloud_event(&event, id.clone(), source_host, time.clone());
            let payload = match serde_json::to_vec(&ce) {
                Ok(p) => Bytes::from(p),
                Err(e) => {
                    tracing::error!("cannot encode a CloudEvent: {e}");
                    continue;
                }
            };
            let pending = Pending { id, payload };
            let pending = match tx.try_send(pending) {
                Ok(()) => {
                    bump(&stats.queued);
                    continue;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => anyhow::bail!("the publisher stopped"),
                Err(mpsc::error::TrySendError::Full(p)) => p,
            };
            tracing::warn!(
                max_pending = settings.max_pending,
                "buffer full (NATS slow or unreachable): reading paused; xrootd drops events once its queue is full"
            );
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                sent = tx.send(pending) => {
                    sent.map_err(|_| anyhow::anyhow!("the publisher stopped"))?;
                    bump(&stats.queued);
                    tracing::info!("buffer has room again: reading resumed");
                }
            }
        }
    }
}

/// Counts a skipped line and logs it (the first 20, then at powers of two).
fn warn_skipped(stats: &Stats, e: &LineError, text: &str) {
    let n = bump(&stats.skipped);
    if n <= 20 || n.is_power_of_two() {
        tracing::warn!(skipped = n, "skipping an ofs.notify line: {e}: {text:?}");
    }
}

/// Publishes the queued events in order, each until JetStream acknowledges it or `give_up`.
async fn publish_loop(
    js: jetstream::Context,
    subject: String,
    mut rx: mpsc::Receiver<Pending>,
    stats: Arc<Stats>,
    give_up: CancellationToken,
) {
    while let Some(p) = rx.recv().await {
        let mut backoff = RETRY_BACKOFF.0;
        let mut failures = 0u32;
        loop {
            match publish_once(&js, &subject, &p).await {
                Ok(ack) => {
                    bump(&stats.published);
                    if ack.duplicate {
                        bump(&stats.duplicates);
                    }
                    if failures > 0 {
                        tracing::info!(id = %p.id, attempts = failures + 1, "published after retrying");
                    }
                    break;
                }
                Err(e) => {
                    failures += 1;
                    bump(&stats.publish_failures);
                    if failures == 1 || failures.is_power_of_two() {
                        let hint = match e.kind() {
                            jetstream::context::PublishErrorKind::StreamNotFound => {
                                " (no stream covers the subject yet: the gateway creates it)"
                            }
                            _ => "",
                        };
                        tracing::warn!(id = %p.id, attempt = failures, "cannot publish to {subject}: {e}{hint}; retrying");
                    }
                    tokio::select! {
                        _ = give_up.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RETRY_BACKOFF.1);
                }
            }
        }
    }
}

async fn publish_once(
    js: &jetstream::Context,
    subject: &str,
    p: &Pending,
) -> Result<jetstream::publish::PublishAck, jetstream::context::PublishError> {
    let message = PublishMessage::build()
        .payload(p.payload.clone())
        .message_id(&p.id)
        .header("content-type", CLOUDEVENTS_CONTENT_TYPE);
    js.send_publish(subject.to_owned(), message).await?.await
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::event::{BridgedEvent, EventKind};

    fn ev(kind: EventKind, msg_type: &str, path: &str, size: Option<u64>, owner: Option<&str>) -> BridgedEvent {
        BridgedEvent { kind, msg_type: msg_type.into(), path: path.into(), size, owner: owner.map(Into::into) }
    }

    const TID: &str = "alice.12:29@[::127.0.0.1]";

    #[test]
    fn every_default_line_form_parses() {
        let one = |line: &str| {
            let mut v = parse_line(line).expect(line);
            assert_eq!(v.len(), 1, "{line}");
            v.remove(0)
        };
        let a = Some("alice");
        assert_eq!(one(&format!("{TID} closew /store/a.dat")), ev(EventKind::Write, "closew", "/store/a.dat", None, a));
        assert_eq!(
            one(&format!("{TID} create 664 /store/a.dat")),
            ev(EventKind::Create, "create", "/store/a.dat", None, a)
        );
        assert_eq!(one(&format!("{TID} rm /store/a.dat")), ev(EventKind::Remove, "rm", "/store/a.dat", None, a));
        assert_eq!(one(&format!("{TID} closer /store/a.dat")), ev(EventKind::Read, "closer", "/store/a.dat", None, a));
        assert_eq!(one(&format!("{TID} mkdir 755 /store/d/")), ev(EventKind::Other, "mkdir", "/store/d", None, a));
        assert_eq!(
            one(&format!("{TID} chmod 0644 /store/a.dat")),
            ev(EventKind::Other, "chmod", "/store/a.dat", None, a)
        );
        for e in ["rmdir", "openr", "openw", "fwrite"] {
            assert_eq!(one(&format!("{TID} {e} /store/x")), ev(EventKind::Other, e, "/store/x", None, a));
        }
        assert_eq!(
            parse_line(&format!("{TID} mv /store/tmp/a.part /store/a.dat")).expect("mv"),
            vec![
                ev(EventKind::Remove, "mv", "/store/tmp/a.part", None, a),
                ev(EventKind::Write, "mv", "/store/a.dat", None, a)
            ]
        );
        assert_eq!(parse_line(&format!("{TID} trunc 0")).expect("trunc"), vec![]);
        assert_eq!(parse_line("").expect("blank"), vec![]);
        assert_eq!(parse_line("   \r").expect("blank"), vec![]);
        // A CR before the newline and tabs are white space too.
        assert_eq!(one(&format!("{TID}\tclosew\t/store/a.dat\r")).path, "/store/a.dat");
    }

    #[test]
    fn notifymsg_with_size_and_the_lines_xrootd_5_5_writes() {
        // ofs.notifymsg closew $TID closew $LFN $FSIZE, as seen from a real xrootd 5.5.3 PUT.
        let v = parse_line("faasadmi.2:28@[::127.0.0.1] closew /store/a/b.txt 11").expect("closew");
        assert_eq!(v, vec![ev(EventKind::Write, "closew", "/store/a/b.txt", Some(11), Some("faasadmi"))]);
        let v = parse_line("unknown.9:29@[::127.0.0.1] create 664 /store/out/result.txt").expect("create");
        assert_eq!(v, vec![ev(EventKind::Create, "create", "/store/out/result.txt", None, None)]);
        let v = parse_line(&format!("{TID} rm /store/a 0")).expect("rm with a size");
        assert_eq!(v[0].size, Some(0));
        let big = format!("{TID} closew /store/a {}", u64::MAX);
        assert_eq!(parse_line(&big).expect("u64")[0].size, Some(u64::MAX));
    }

    #[test]
    fn the_owner_is_the_user_of_the_trace_id() {
        assert_eq!(owner_of_tid("alice.12:29@host.example.org").as_deref(), Some("alice"));
        assert_eq!(owner_of_tid("a.b.77:3@[::1]").as_deref(), Some("a.b"), "a dot in the user");
        assert_eq!(owner_of_tid("unknown.9:29@[::127.0.0.1]"), None, "XrdHttp without a name");
        for bad in ["alice", "alice@host", "alice.x:1@h", "alice.1:x@h", ".1:2@h", "alice.1:@h", "al\u{7}ce.1:2@h"] {
            assert_eq!(owner_of_tid(bad), None, "{bad}");
        }
        // An odd trace id costs the owner, not the event.
        let v = parse_line("someone closew /store/a").expect("closew");
        assert_eq!(v, vec![ev(EventKind::Write, "closew", "/store/a", None, None)]);
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        use LineError::*;
        let cases: &[(&str, LineError)] = &[
            ("hello", TooFewFields("hello".into())),
            ("hello world", UnknownEvent("world".into())),
            (&format!("{TID} closew"), TooFewFields("closew".into())),
            (&format!("{TID} create /store/a"), TooFewFields("create".into())),
            (&format!("{TID} create rw-r--r-- /store/a"), BadMode("rw-r--r--".into())),
            (&format!("{TID} create 6648 /store/a"), BadMode("6648".into())),
            (&format!("{TID} mv /store/a"), TooFewFields("mv".into())),
            (&format!("{TID} mv /store/a /store/b 12"), Unexpected("12".into())),
            (&format!("{TID} closew /store/my file.txt"), Unexpected("file.txt".into())),
            (&format!("{TID} closew /store/a 12 13"), Unexpected("13".into())),
            (&format!("{TID} closew /store/a -1"), Unexpected("-1".into())),
            (&format!("{TID} closew /store/a 18446744073709551616"), Unexpected("18446744073709551616".into())),
            (&format!("{TID} CLOSEW /store/a"), UnknownEvent("CLOSEW".into())),
        ];
        for (line, want) in cases {
            assert_eq!(parse_line(line).as_ref(), Err(want), "{line}");
        }
        // Messages name the problem.
        assert_eq!(
            parse_line(&format!("{TID} closew a/b")).expect_err("relative").to_string(),
            "path \"a/b\" is not a clean absolute path"
        );
        // Arbitrary bytes (as lossy text) never panic.
        let mut x: u32 = 12345;
        for _ in 0..2000 {
            let bytes: Vec<u8> = (0..40)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    b" /.\tacdeilmorsvw0123456789@:\xff"[(x >> 16) as usize % 29]
                })
                .collect();
            let _ = parse_line(&String::from_utf8_lossy(&bytes));
        }
    }

    #[test]
    fn paths_must_be_clean_and_absolute() {
        for bad in ["a/b", "/store/../etc/passwd", "/store/./a", "/store//a", "/", "//", "/a\\b", "/a\u{1}b", "~/a"] {
            let line = format!("{TID} closew {bad}");
            assert_eq!(parse_line(&line), Err(LineError::BadPath(bad.into())), "{line}");
            let line = format!("{TID} mv /store/ok {bad}");
            assert_eq!(parse_line(&line), Err(LineError::BadPath(bad.into())), "{line}");
        }
        assert_eq!(parse_line(&format!("{TID} rmdir /store/d/")).expect("dir")[0].path, "/store/d");
        // Long excerpts are cut in errors.
        let long = format!("/{}/../x", "a".repeat(500));
        match parse_line(&format!("{TID} rm {long}")) {
            Err(LineError::BadPath(p)) => assert!(p.chars().count() <= 121 && p.ends_with('…'), "{p}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn overlong_lines_are_refused() {
        let line = format!("{TID} closew /{}", "a".repeat(MAX_LINE_BYTES));
        assert_eq!(parse_line(&line), Err(LineError::TooLong));
    }

    #[tokio::test]
    async fn the_line_reader_bounds_lines_and_keeps_going() {
        let long = "x".repeat(MAX_LINE_BYTES + 1);
        let exact = "y".repeat(MAX_LINE_BYTES);
        let huge = "z".repeat(5 * MAX_LINE_BYTES);
        let input = format!("first\n{long}\n{exact}\n\n{huge}\nlast\nno newline");
        let mut r = LineReader::new(input.as_bytes());
        let mut got = Vec::new();
        while let Some(line) = r.next_line().await.expect("read") {
            got.push(line.map(|l| String::from_utf8(l).expect("utf8")));
        }
        assert_eq!(
            got,
            vec![
                Ok("first".to_owned()),
                Err(LineError::TooLong),
                Ok(exact),
                Ok(String::new()),
                Err(LineError::TooLong),
                Ok("last".to_owned()),
                Ok("no newline".to_owned()),
            ]
        );
        // An overlong last line without a newline.
        let mut r = LineReader::new(huge.as_bytes());
        assert_eq!(r.next_line().await.expect("read"), Some(Err(LineError::TooLong)));
        assert_eq!(r.next_line().await.expect("read"), None);
    }

    #[test]
    fn cloud_events_carry_the_event() {
        let e = ev(EventKind::Write, "closew", "/site/store/a.dat", Some(11), Some("alice"));
        let ce = cloud_event(&e, "abc-7".into(), "xrd1.example.org", "2026-11-21T22:35:15.903Z".into());
        let json = serde_json::to_value(&ce).expect("json");
        assert_eq!(
            json,
            serde_json::json!({
                "specversion": "1.0",
                "id": "abc-7",
                "source": "xrootd://xrd1.example.org",
                "type": "org.htfaas.storage.xrootd-notify.closew",
                "subject": "/site/store/a.dat",
                "time": "2026-11-21T22:35:15.903Z",
                "datacontenttype": "application/json",
                "data": {"kind": "write", "msg_type": "closew", "path": "/site/store/a.dat", "size": 11, "owner": "alice"},
            })
        );
        let back: BridgedEvent = serde_json::from_value(json["data"].clone()).expect("data is a BridgedEvent");
        assert_eq!(back, e);
        assert_eq!(subject(), "storage.cloudevents.xrootd-notify");
    }

    #[test]
    fn prefixes_and_hosts() {
        assert_eq!(normalize_prefix("").expect("empty"), "");
        assert_eq!(normalize_prefix("/pnfs/site/").expect("slash"), "/pnfs/site");
        assert_eq!(normalize_prefix("/").expect("root"), "");
        for bad in ["pnfs", "/a/../b", "/a//b"] {
            assert!(normalize_prefix(bad).is_err(), "{bad}");
        }
        assert!(valid_host("xrd1.example.org") && valid_host("127.0.0.1:1094") && valid_host("[::1]"));
        assert!(!valid_host("") && !valid_host("a b") && !valid_host("a/b"));
        assert!(valid_host(&default_source_host()));
    }
}
