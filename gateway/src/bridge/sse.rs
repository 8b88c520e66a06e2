// Long because it holds the dCache SSE bridge: client, parser and publisher of one channel; kept whole until issue 19 splits it along its layers.
//! `htfaas bridge dcache-sse`: dCache frontend storage events (SSE `inotify` channel) to
//! CloudEvents on NATS JetStream.
//!
//! The protocol (dCache's frontend REST API, `/api/v1/events`): `POST /events/channels` makes a
//! channel (201 + `Location`); `POST <channel>/subscriptions/inotify` with
//! `{"path":…,"flags":[…]}` adds a watch (201 + `Location` = the subscription URL); `GET
//! <channel>` with `Accept: text/event-stream` (and `Last-Event-ID` on a resume) is the stream.
//! Events carry only the file name and the subscription URL, so the bridge keeps the map
//! subscription URL → watched path.
//!
//! Delivery: each event becomes one CloudEvent on `storage.cloudevents.dcache-sse`, id
//! `<channel id>/<sse id>` (also the `Nats-Msg-Id`), so a replay after a resume is dropped by
//! JetStream's duplicate window and by the gateway's dedupe. The SSE id is written to the
//! [state file](State) only after the PubAck, so a crash resumes at the last published event.
//! While a publish is retried nothing more is read from the stream.
//!
//! Loss: dCache drops events when a resume point has left its buffer (SYSTEM `EVENT_LOSS`),
//! when it is overloaded (inotify `IN_Q_OVERFLOW`) and when a channel was garbage-collected
//! (404 on the channel: the bridge makes a new one and subscribes again). Each is published as a
//! loss marker (type `org.htfaas.storage.dcache-sse.event-loss`, kind `other`, `msg_type`
//! `EVENT_LOSS` or `IN_Q_OVERFLOW`, path = the watched directory), counted and logged at WARN,
//! so operators or a reconciliation scan know which tree to look at again. An `IN_Q_OVERFLOW`
//! marker has the usual id; the others, which dCache does not replay, have
//! `<channel id>/event-loss-<unix ms>-<n>` or `<channel id>/channel-lost-<unix ms>-<n>`, one per
//! watch root `n`.
//!
//! Directory events (`IN_ISDIR`) are not published: a function has no input to read in a
//! directory. With `recursive`, the bridge emulates recursive watches as dCache's maintainers
//! advise (dCache/dcache#5095): on `IN_CREATE|IN_ISDIR` or `IN_MOVED_TO|IN_ISDIR` under a
//! watched directory it subscribes the new directory too, and on `IN_MOVED_FROM|IN_ISDIR` it
//! drops the watches of the old tree. Files written into a new directory before its watch
//! exists are not reported (dCache has no recursive watch to close that gap).
//!
//! Self and management events (`IN_DELETE_SELF`, `IN_MOVE_SELF`, `IN_IGNORED`, `IN_UNMOUNT`)
//! and SYSTEM `NEW_SUBSCRIPTION`, `SUBSCRIPTION_CLOSED`, `SHUTDOWN` are logged, not published;
//! `IN_IGNORED` and `SUBSCRIPTION_CLOSED` end a watch. SYSTEM `COMPETING_CLIENT` means another
//! reader took the channel (dCache allows one): logged as an error, the bridge backs off at the
//! longest delay before it reads again.
//!
//! Nothing read from the network can panic the bridge: a malformed SSE event (overlong line,
//! event too large, not UTF-8) or malformed JSON is counted, logged at WARN and skipped.

use super::rfc3339;
use anyhow::Context as _;
use async_nats::jetstream::{self, message::PublishMessage};
use futures_util::StreamExt as _;
use htfaas_functions::event::{BridgedEvent, CE_TYPE_PREFIX, CloudEvent, EventKind, SourceKind};
use htfaas_functions::proto::CLOUDEVENTS_SUBJECT_PREFIX;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// inotify flags subscribed when none are given.
pub const DEFAULT_FLAGS: [&str; 4] = ["IN_CLOSE_WRITE", "IN_MOVED_TO", "IN_CREATE", "IN_DELETE"];

/// The flags dCache's inotify selector accepts (dCache frontend `selector-schema.json`).
pub const KNOWN_FLAGS: [&str; 20] = [
    "IN_ACCESS",
    "IN_ATTRIB",
    "IN_CLOSE_WRITE",
    "IN_CLOSE_NOWRITE",
    "IN_CREATE",
    "IN_DELETE",
    "IN_DELETE_SELF",
    "IN_MODIFY",
    "IN_MOVE_SELF",
    "IN_MOVED_FROM",
    "IN_MOVED_TO",
    "IN_OPEN",
    "IN_ALL_EVENTS",
    "IN_CLOSE",
    "IN_MOVE",
    "IN_DONT_FOLLOW",
    "IN_EXCL_UNLINK",
    "IN_MASK_ADD",
    "IN_ONESHOT",
    "IN_ONLYDIR",
];

/// The `msg_type` suffix of loss markers' CloudEvent type: `org.htfaas.storage.dcache-sse.event-loss`.
pub const LOSS_TYPE_SUFFIX: &str = "event-loss";

/// Longest SSE line accepted; a longer one makes its event refused.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Largest SSE event (the sum of its field values) accepted.
pub const MAX_EVENT_BYTES: usize = 256 * 1024;

/// How long one control request (channel, subscription) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one publish may wait for its PubAck before it is retried.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// State file format version.
const STATE_VERSION: u32 = 1;

/// How the bridge authenticates to the frontend (dCache refuses anonymous access with 401).
/// Secrets are read from their file at each request, so a rotated token is picked up.
#[derive(Debug, Clone)]
pub enum Auth {
    /// `Authorization: Bearer <file content, trimmed>` (an OIDC token or a macaroon).
    Bearer {
        /// File holding the token.
        token_file: PathBuf,
    },
    /// HTTP Basic with `user` and the secret in `secret_file` (trimmed).
    Basic {
        /// dCache user name.
        user: String,
        /// File holding the password.
        secret_file: PathBuf,
    },
}

/// How the bridge runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Frontend REST base URL, e.g. `https://dcache.example.org:3880/api/v1` (no trailing `/`
    /// needed).
    pub frontend: String,
    /// Credentials for the frontend.
    pub auth: Auth,
    /// Extra trusted CA certificates (PEM), besides the system roots.
    pub ca_file: Option<PathBuf>,
    /// Absolute paths to watch (directories, or files), each its own subscription.
    pub watch: Vec<String>,
    /// inotify flags of each subscription. Default: [`DEFAULT_FLAGS`]. With `recursive`,
    /// `IN_CREATE` and `IN_MOVED_TO` are added to see new directories, but file events are
    /// published only for the flags asked for here.
    pub flags: Vec<String>,
    /// Emulate recursive watches (see the module doc).
    pub recursive: bool,
    /// The state file: channel, subscriptions and the last published SSE id (see [`State`]).
    pub state_file: PathBuf,
    /// NATS URL, e.g. `nats://127.0.0.1:4222`.
    pub nats_url: String,
    /// The bridge's NATS credential (`--nats-nkey-seed-file`), which the server lets publish on
    /// `storage.cloudevents.dcache-sse` only. Default: none.
    pub nats_credential: Option<htfaas_functions::nats::NatsCredential>,
    /// First reconnect and republish delay; doubled up to `backoff_max`. Default 1 s.
    pub backoff_min: Duration,
    /// Longest reconnect and republish delay, and the pause after `COMPETING_CLIENT`. Default 60 s.
    pub backoff_max: Duration,
}

impl Settings {
    /// Settings with the defaults for everything optional: no extra CA, [`DEFAULT_FLAGS`], not
    /// recursive, backoff 1 s to 60 s.
    pub fn new(frontend: &str, auth: Auth, watch: Vec<String>, state_file: PathBuf, nats_url: &str) -> Settings {
        Settings {
            frontend: frontend.to_owned(),
            auth,
            ca_file: None,
            watch,
            flags: DEFAULT_FLAGS.iter().map(|f| (*f).to_owned()).collect(),
            recursive: false,
            state_file,
            nats_url: nats_url.to_owned(),
            nats_credential: None,
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
        }
    }

    /// Checks the settings; the frontend base without a trailing `/`.
    fn validate(&mut self) -> anyhow::Result<()> {
        self.frontend = self.frontend.trim_end_matches('/').to_owned();
        let url =
            reqwest::Url::parse(&self.frontend).with_context(|| format!("parse frontend URL {}", self.frontend))?;
        anyhow::ensure!(matches!(url.scheme(), "http" | "https"), "frontend URL {} is not http(s)", self.frontend);
        anyhow::ensure!(!self.watch.is_empty(), "no path to watch");
        let mut seen = std::collections::BTreeSet::new();
        self.watch.retain(|p| seen.insert(p.clone()));
        for p in &self.watch {
            anyhow::ensure!(valid_watch_path(p), "watch path {p:?} is not absolute without a trailing '/'");
        }
        if self.flags.is_empty() {
            self.flags = DEFAULT_FLAGS.iter().map(|f| (*f).to_owned()).collect();
        }
        for f in &self.flags {
            anyhow::ensure!(KNOWN_FLAGS.contains(&f.as_str()), "unknown inotify flag {f:?}");
        }
        anyhow::ensure!(self.backoff_min > Duration::ZERO && self.backoff_min <= self.backoff_max, "bad backoff");
        Ok(())
    }

    /// The flags each subscription asks dCache for.
    fn subscribe_flags(&self) -> Vec<String> {
        let mut flags = self.flags.clone();
        if self.recursive {
            for f in ["IN_CREATE", "IN_MOVED_TO", "IN_MOVED_FROM"] {
                if !flags
                    .iter()
                    .any(|g| g == f || g == "IN_ALL_EVENTS" || (g == "IN_MOVE" && f.starts_with("IN_MOVED")))
                {
                    flags.push(f.to_owned());
                }
            }
        }
        flags
    }

    /// Whether file events with this primary flag were asked for.
    fn wants(&self, flag: &str) -> bool {
        self.flags.iter().any(|g| {
            g == flag
                || g == "IN_ALL_EVENTS"
                || (g == "IN_CLOSE" && matches!(flag, "IN_CLOSE_WRITE" | "IN_CLOSE_NOWRITE"))
                || (g == "IN_MOVE" && matches!(flag, "IN_MOVED_FROM" | "IN_MOVED_TO"))
        })
    }

    /// Whether `path` is one of the configured roots or (recursive) below one.
    fn covers(&self, path: &str) -> bool {
        self.watch.iter().any(|root| root == path || (self.recursive && is_below(path, root)))
    }
}

/// `^/(.*[^/])?$`, as dCache's selector wants, and no empty, `.` or `..` segment.
fn valid_watch_path(p: &str) -> bool {
    p == "/"
        || (p.starts_with('/')
            && !p.ends_with('/')
            && p[1..].split('/').all(|s| !s.is_empty() && s != "." && s != ".."))
}

/// Whether `path` is strictly below `dir`.
fn is_below(path: &str, dir: &str) -> bool {
    if dir == "/" {
        return path.len() > 1 && path.starts_with('/');
    }
    path.len() > dir.len() + 1 && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}

/// `dir` + `/` + `name`, without doubling the root's slash.
fn join(dir: &str, name: &str) -> String {
    if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") }
}

// ---------------------------------------------------------------------------------------------
// SSE parsing
// ---------------------------------------------------------------------------------------------

/// One event of the stream, dispatched at a blank line (WHATWG "server-sent events").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event` field; `message` when absent.
    pub event: String,
    /// The `data` fields joined with `\n`; `None` when the block had no `data` field (only an
    /// `id`: the resume point moved on, nothing to dispatch).
    pub data: Option<String>,
    /// The `id` field of this block, when it had one (`Some("")` resets the resume point).
    pub id: Option<String>,
}

/// What the parser yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// A complete event.
    Event(SseEvent),
    /// An event dropped because one of its lines was too long or not UTF-8, or it was too
    /// large; its `id`, when it had one (so the resume point can move past it).
    Refused {
        /// The block's `id` field.
        id: Option<String>,
        /// Why.
        reason: &'static str,
    },
}

/// An incremental `text/event-stream` parser with bounded memory: lines end in CRLF, LF or CR
/// (also split across chunks), `:` starts a comment, a field without `:` has an empty value,
/// one space after the `:` is dropped, a blank line dispatches. A line longer than `max_line`
/// is not kept: it is skipped to its end and its event is refused. An incomplete event at the
/// end of the stream is discarded (a new parser per connection).
#[derive(Debug)]
pub struct SseParser {
    max_line: usize,
    max_event: usize,
    /// The current line, not yet terminated.
    line: Vec<u8>,
    /// The current line is overlong: drop bytes until its end.
    skipping: bool,
    /// The last byte was a CR: a following LF belongs to the same line end.
    after_cr: bool,
    /// Bytes seen so far, to strip a leading BOM once.
    at_start: bool,
    event: String,
    data: String,
    has_data: bool,
    id: Option<String>,
    /// Bytes of field values in the current event.
    size: usize,
    refused: Option<&'static str>,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::new(MAX_LINE_BYTES, MAX_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser refusing lines over `max_line` bytes and events over `max_event` bytes.
    pub fn new(max_line: usize, max_event: usize) -> SseParser {
        SseParser {
            max_line,
            max_event,
            line: Vec::new(),
            skipping: false,
            after_cr: false,
            at_start: true,
            event: String::new(),
            data: String::new(),
            has_data: false,
            id: None,
            size: 0,
            refused: None,
        }
    }

    /// Feeds the next chunk of the stream; complete events are pushed to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseItem>) {
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
                Some(i) => {
                    self.push(&rest[..i]);
                    self.after_cr = rest[i] == b'\r';
                    rest = &rest[i + 1..];
                    self.end_line(out);
                }
                None => {
                    self.push(rest);
                    rest = &[];
                }
            }
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.skipping {
            return;
        }
        if self.line.len() + bytes.len() > self.max_line {
            self.skipping = true;
            self.line = Vec::new();
            self.refuse("line too long");
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    fn refuse(&mut self, reason: &'static str) {
        self.refused.get_or_insert(reason);
        self.data = String::new();
    }

    fn end_line(&mut self, out: &mut Vec<SseItem>) {
        if self.skipping {
            self.skipping = false;
            return;
        }
        let mut line = std::mem::take(&mut self.line);
        if self.at_start {
            self.at_start = false;
            if line.starts_with(&[0xEF, 0xBB, 0xBF]) {
                line.drain(..3);
            }
        }
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let Ok(line) = String::from_utf8(line) else {
            self.refuse("line is not UTF-8");
            return;
        };
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        // A `data` line after the first adds its value and the `\n` that joins it.
        self.size += value.len() + usize::from(field == "data" && self.has_data);
        if self.size > self.max_event {
            self.refuse("event too large");
            return;
        }
        match field {
            "event" => value.clone_into(&mut self.event),
            "data" => {
                if self.refused.is_none() {
                    if self.has_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                }
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            // `retry` (the server's reconnect delay) is not used: the bridge has its own backoff.
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        let id = self.id.take();
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        let has_data = std::mem::replace(&mut self.has_data, false);
        self.size = 0;
        if let Some(reason) = self.refused.take() {
            out.push(SseItem::Refused { id, reason });
            return;
        }
        if !has_data && id.is_none() {
            return;
        }
        let event = if event.is_empty() { "message".to_owned() } else { event };
        out.push(SseItem::Event(SseEvent { event, data: has_data.then_some(data), id }));
    }
}

// ---------------------------------------------------------------------------------------------
// inotify mapping
// ---------------------------------------------------------------------------------------------

/// The `data` of an `inotify` or `SYSTEM` SSE event: `{"event":…,"subscription":…}`.
#[derive(Debug, Deserialize)]
struct InotifyData {
    event: InotifyEvent,
    subscription: String,
}

/// dCache's inotify event object (its four shapes: child, move, self, management).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct InotifyEvent {
    /// The child's name (child and move events).
    #[serde(default)]
    pub name: Option<String>,
    /// The flags, e.g. `["IN_MOVED_TO","IN_ISDIR"]`.
    pub mask: Vec<String>,
    /// Pairs `IN_MOVED_FROM` and `IN_MOVED_TO` of one rename.
    #[serde(default)]
    pub cookie: Option<serde_json::Value>,
}

/// What one inotify event means to the bridge, given the watched path of its subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A file event: published with type `org.htfaas.storage.dcache-sse.<event.msg_type>`.
    Publish(BridgedEvent),
    /// A directory event (`IN_ISDIR`): not published; `flag` at `path` drives recursion.
    Directory {
        /// The primary flag, e.g. `IN_CREATE`.
        flag: String,
        /// The directory's path.
        path: String,
    },
    /// `IN_Q_OVERFLOW`: dCache dropped events of this watch; a loss marker.
    Overflow,
    /// A self or management event (`IN_DELETE_SELF`, `IN_MOVE_SELF`, `IN_IGNORED`,
    /// `IN_UNMOUNT`): logged; `IN_IGNORED` ends the watch.
    Watch {
        /// The primary flag.
        flag: String,
    },
}

/// Flags that qualify another flag rather than name an event.
const MODIFIERS: [&str; 1] = ["IN_ISDIR"];

/// Maps a parsed inotify event of a subscription watching `watched`. An error is a malformed
/// event (no flag, a child event without a usable name).
pub fn map_inotify(ev: &InotifyEvent, watched: &str) -> Result<Action, String> {
    let Some(flag) = ev.mask.iter().find(|f| !MODIFIERS.contains(&f.as_str())) else {
        return Err(format!("no event flag in mask {:?}", ev.mask));
    };
    let is_dir = ev.mask.iter().any(|f| f == "IN_ISDIR");
    match flag.as_str() {
        "IN_Q_OVERFLOW" => return Ok(Action::Overflow),
        "IN_IGNORED" | "IN_UNMOUNT" | "IN_DELETE_SELF" | "IN_MOVE_SELF" => {
            return Ok(Action::Watch { flag: flag.clone() });
        }
        _ => {}
    }
    let Some(name) = ev.name.as_deref() else {
        return Err(format!("{flag} without a name"));
    };
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(format!("{flag} with an unusable name {name:?}"));
    }
    let path = join(watched, name);
    // What the gateway would refuse (a backslash, say) is refused here, at its source.
    if !htfaas_functions::manifest::is_clean_abs_path(&path) {
        return Err(format!("{flag} with an unusable name {name:?}"));
    }
    if is_dir {
        return Ok(Action::Directory { flag: flag.clone(), path });
    }
    let kind = match flag.as_str() {
        "IN_CLOSE_WRITE" | "IN_MOVED_TO" => EventKind::Write,
        "IN_CREATE" => EventKind::Create,
        "IN_DELETE" | "IN_MOVED_FROM" => EventKind::Remove,
        _ => EventKind::Other,
    };
    Ok(Action::Publish(BridgedEvent { kind, msg_type: flag.clone(), path, size: None, owner: None }))
}

/// The CloudEvent type of a published event or loss marker.
pub fn ce_type(suffix: &str) -> String {
    format!("{CE_TYPE_PREFIX}{}.{suffix}", SourceKind::DcacheSse.as_str())
}

/// The NATS subject the bridge publishes on: `storage.cloudevents.dcache-sse`.
pub fn subject() -> String {
    format!("{CLOUDEVENTS_SUBJECT_PREFIX}.{}", SourceKind::DcacheSse.as_str())
}

/// A loss marker for `watched`: kind `other`, `msg_type` `EVENT_LOSS` or `IN_Q_OVERFLOW`.
pub fn loss_marker(channel: &str, id: String, msg_type: &str, watched: &str) -> CloudEvent {
    let data = BridgedEvent {
        kind: EventKind::Other,
        msg_type: msg_type.to_owned(),
        path: watched.to_owned(),
        size: None,
        owner: None,
    };
    cloud_event(channel, id, ce_type(LOSS_TYPE_SUFFIX), data)
}

fn cloud_event(channel: &str, id: String, ty: String, data: BridgedEvent) -> CloudEvent {
    CloudEvent {
        specversion: "1.0".to_owned(),
        id,
        source: channel.to_owned(),
        ty,
        subject: Some(data.path.clone()),
        time: Some(rfc3339(SystemTime::now())),
        datacontenttype: Some("application/json".to_owned()),
        data: Some(serde_json::to_value(&data).unwrap_or(serde_json::Value::Null)),
        extensions: BTreeMap::new(),
    }
}

/// The last path segment of a channel URL: its id.
fn channel_id(channel: &str) -> &str {
    channel.trim_end_matches('/').rsplit('/').next().unwrap_or(channel)
}

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()
}

// ---------------------------------------------------------------------------------------------
// State file
// ---------------------------------------------------------------------------------------------

/// What the bridge keeps across restarts, as JSON in the state file (written to a temporary
/// file, synced, renamed):
///
/// ```json
/// {"version":1,"frontend":"https://fe:3880/api/v1",
///  "channel":"https://fe:3880/api/v1/events/channels/MwcX…",
///  "subscriptions":{"https://…/subscriptions/inotify/AACF…":"/data/incoming"},
///  "last_event_id":"41","pending_loss":false}
/// ```
///
/// `last_event_id` is the SSE id of the last event handled (published and acked, or skipped
/// on purpose) on `channel`; `pending_loss` says a lost channel's loss markers are still to be
/// published. A local file, not a wire type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Format version (1).
    pub version: u32,
    /// The frontend the channel belongs to: a state of another frontend is not reused.
    pub frontend: String,
    /// The channel URL, once made.
    #[serde(default)]
    pub channel: Option<String>,
    /// Subscription URL → watched path.
    #[serde(default)]
    pub subscriptions: BTreeMap<String, String>,
    /// The resume point (`Last-Event-ID`).
    #[serde(default)]
    pub last_event_id: Option<String>,
    /// A channel was lost and its loss markers are not published yet.
    #[serde(default)]
    pub pending_loss: bool,
}

impl State {
    fn fresh(frontend: &str) -> State {
        State {
            version: STATE_VERSION,
            frontend: frontend.to_owned(),
            channel: None,
            subscriptions: BTreeMap::new(),
            last_event_id: None,
            pending_loss: false,
        }
    }

    /// Reads the state file; a missing file, or one of another frontend, gives a fresh state.
    pub fn load(file: &Path, frontend: &str) -> anyhow::Result<State> {
        let bytes = match std::fs::read(file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::fresh(frontend)),
            Err(e) => return Err(e).with_context(|| format!("read state file {}", file.display())),
        };
        let state: State =
            serde_json::from_slice(&bytes).with_context(|| format!("parse state file {}", file.display()))?;
        anyhow::ensure!(state.version == STATE_VERSION, "state file {} has version {}", file.display(), state.version);
        if state.frontend != frontend {
            tracing::warn!(old = %state.frontend, "state file belongs to another frontend; starting a new channel");
            return Ok(State::fresh(frontend));
        }
        Ok(state)
    }

    /// Writes the state file atomically (temporary file, fsync, rename).
    pub fn save(&self, file: &Path) -> anyhow::Result<()> {
        use std::io::Write as _;
        let mut tmp = file.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let json = serde_json::to_vec_pretty(self).context("encode the state")?;
        let mut f = std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
        f.write_all(&json).and_then(|()| f.sync_all()).with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, file).with_context(|| format!("rename {} to {}", tmp.display(), file.display()))
    }
}

// ---------------------------------------------------------------------------------------------
// The bridge
// ---------------------------------------------------------------------------------------------

/// Counters, logged at shutdown.
#[derive(Debug, Default)]
struct Counters {
    published: u64,
    malformed: u64,
    losses: u64,
    skipped: u64,
    reconnects: u64,
}

/// Why a stream session ended.
enum End {
    /// Shutdown was asked for.
    Shutdown,
    /// The stream ended or the channel was renewed; `progress` when it delivered something.
    Ended { progress: bool },
    /// Another client took the channel.
    Displaced,
}

/// Exponential backoff between `min` and `max`.
struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Backoff {
        Backoff { min, max, next: min }
    }
    fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
    fn reset(&mut self) {
        self.next = self.min;
    }
}

struct Bridge {
    settings: Settings,
    http: reqwest::Client,
    js: jetstream::Context,
    state: State,
    counters: Counters,
    /// Whether the subscriptions of a reused channel were checked against the frontend.
    reconciled: bool,
}

/// Runs the bridge until `shutdown`.
pub async fn run(mut settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    settings.validate()?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .tcp_keepalive(Duration::from_secs(30))
        .user_agent(concat!("htfaas-bridge-dcache-sse/", env!("CARGO_PKG_VERSION")));
    if let Some(ca) = &settings.ca_file {
        let pem = std::fs::read(ca).with_context(|| format!("read CA file {}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).with_context(|| format!("parse {}", ca.display()))?;
        anyhow::ensure!(!certs.is_empty(), "CA file {} holds no certificate", ca.display());
        builder = builder.tls_certs_merge(certs);
    }
    let http = builder.build().context("build the HTTP client")?;
    let nats = htfaas_functions::nats::connect_options("htfaas-bridge-dcache-sse", settings.nats_credential.as_ref())
        .retry_on_initial_connect()
        .connect(&settings.nats_url)
        .await
        .with_context(|| format!("connect to NATS at {}", settings.nats_url))?;
    let js = jetstream::new(nats);
    let state = State::load(&settings.state_file, &settings.frontend)?;
    tracing::info!(frontend = %settings.frontend, watch = ?settings.watch, recursive = settings.recursive,
        channel = state.channel.as_deref().unwrap_or("(new)"), resume = state.last_event_id.as_deref().unwrap_or(""),
        "dcache-sse bridge starting");
    let mut bridge = Bridge { settings, http, js, state, counters: Counters::default(), reconciled: false };
    bridge.run(&shutdown).await;
    if let Err(e) = bridge.state.save(&bridge.settings.state_file) {
        tracing::error!("failed to save the state at shutdown: {e:#}");
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), bridge.js.client().flush()).await;
    let c = &bridge.counters;
    tracing::info!(
        published = c.published,
        malformed = c.malformed,
        losses = c.losses,
        skipped = c.skipped,
        reconnects = c.reconnects,
        "dcache-sse bridge stopped"
    );
    Ok(())
}

impl Bridge {
    async fn run(&mut self, shutdown: &CancellationToken) {
        let mut backoff = Backoff::new(self.settings.backoff_min, self.settings.backoff_max);
        loop {
            let delay = match self.session(shutdown).await {
                Ok(End::Shutdown) => return,
                Ok(End::Ended { progress }) => {
                    if progress {
                        backoff.reset();
                    }
                    backoff.next()
                }
                Ok(End::Displaced) => {
                    tracing::error!(
                        channel = self.state.channel.as_deref().unwrap_or(""),
                        "another client reads this channel (COMPETING_CLIENT); backing off"
                    );
                    self.settings.backoff_max
                }
                Err(e) => {
                    tracing::warn!("dcache-sse stream failed: {e:#}");
                    backoff.next()
                }
            };
            if shutdown.is_cancelled() {
                return;
            }
            tracing::debug!(?delay, "reconnecting");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            self.counters.reconnects += 1;
        }
    }

    /// One connection: make sure the channel and watches exist, stream, handle events.
    async fn session(&mut self, shutdown: &CancellationToken) -> anyhow::Result<End> {
        if !self.ensure_channel().await? {
            return Ok(End::Ended { progress: true });
        }
        if self.state.pending_loss && !self.publish_channel_loss(shutdown).await? {
            return Ok(End::Shutdown);
        }
        let channel = self.state.channel.clone().context("no channel")?;
        let mut req = self.authed(self.http.get(&channel)).header("accept", "text/event-stream");
        if let Some(id) = &self.state.last_event_id {
            req = req.header("last-event-id", id);
        }
        let resp = tokio::select! {
            _ = shutdown.cancelled() => return Ok(End::Shutdown),
            r = tokio::time::timeout(REQUEST_TIMEOUT, req.send()) => {
                r.map_err(|_| anyhow::anyhow!("no answer within {REQUEST_TIMEOUT:?}"))?.context("GET the channel")?
            }
        };
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            self.channel_gone()?;
            return Ok(End::Ended { progress: true });
        }
        anyhow::ensure!(resp.status().is_success(), "GET the channel: {}", resp.status());
        tracing::info!(%channel, resume = self.state.last_event_id.as_deref().unwrap_or(""), "stream open");
        let mut stream = resp.bytes_stream();
        let mut parser = SseParser::default();
        let mut items = Vec::new();
        let mut progress = false;
        loop {
            let chunk = tokio::select! {
                _ = shutdown.cancelled() => return Ok(End::Shutdown),
                c = stream.next() => c,
            };
            let chunk = match chunk {
                None => {
                    tracing::info!("stream ended");
                    return Ok(End::Ended { progress });
                }
                Some(Err(e)) if progress => {
                    tracing::warn!("stream broke: {e}");
                    return Ok(End::Ended { progress });
                }
                Some(Err(e)) => return Err(e).context("read the stream"),
                Some(Ok(c)) => c,
            };
            parser.feed(&chunk, &mut items);
            for item in items.drain(..) {
                progress = true;
                if let Some(end) = self.handle(item, shutdown).await? {
                    return Ok(end);
                }
            }
        }
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let read = |f: &Path| {
            std::fs::read_to_string(f).map(|s| s.trim().to_owned()).unwrap_or_else(|e| {
                tracing::warn!("failed to read {}: {e}", f.display());
                String::new()
            })
        };
        match &self.settings.auth {
            Auth::Bearer { token_file } => req.bearer_auth(read(token_file)),
            Auth::Basic { user, secret_file } => req.basic_auth(user, Some(read(secret_file))),
        }
    }

    fn save(&self) -> anyhow::Result<()> {
        self.state.save(&self.settings.state_file)
    }

    /// Makes a channel when there is none, checks a reused one's watches once, subscribes the
    /// configured paths missing. `false` when the channel turned out to be gone.
    async fn ensure_channel(&mut self) -> anyhow::Result<bool> {
        if self.state.channel.is_none() {
            let url = format!("{}/events/channels", self.settings.frontend);
            let resp = self
                .authed(self.http.post(&url))
                .timeout(REQUEST_TIMEOUT)
                .send()
                .await
                .context("POST /events/channels")?;
            anyhow::ensure!(resp.status().is_success(), "POST /events/channels: {}", resp.status());
            let channel = location(&resp).context("POST /events/channels: no Location")?;
            tracing::info!(%channel, "channel made");
            self.state.channel = Some(channel);
            self.state.subscriptions.clear();
            self.state.last_event_id = None;
            self.reconciled = true;
            self.save()?;
        } else if !self.reconciled {
            if !self.reconcile().await? {
                return Ok(false);
            }
            self.reconciled = true;
        }
        let missing: Vec<String> = self
            .settings
            .watch
            .iter()
            .filter(|p| !self.state.subscriptions.values().any(|w| w == *p))
            .cloned()
            .collect();
        for path in missing {
            match self.subscribe(&path).await {
                Ok(Subscribed::Yes) => {}
                Ok(Subscribed::ChannelGone) => return Ok(false),
                // A watch root that does not exist (yet) is not fatal: the others run, and it is
                // tried again at the next reconnect.
                Ok(Subscribed::Refused(status)) => tracing::warn!(%path, %status, "frontend refused the watch"),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Matches the state's subscriptions with the channel's (after a restart): learns the path
    /// of unknown ones from their selector, forgets vanished ones, ends watches no longer
    /// configured. `false` when the channel is gone.
    async fn reconcile(&mut self) -> anyhow::Result<bool> {
        let Some(channel) = self.state.channel.clone() else { return Ok(true) };
        let resp = self
            .authed(self.http.get(format!("{channel}/subscriptions")))
            .header("accept", "application/json")
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .context("list the channel's subscriptions")?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            self.channel_gone()?;
            return Ok(false);
        }
        anyhow::ensure!(resp.status().is_success(), "list the channel's subscriptions: {}", resp.status());
        let listed: Vec<String> = resp.json().await.context("parse the subscription list")?;
        self.state.subscriptions.retain(|url, _| listed.contains(url));
        for url in listed {
            if !self.state.subscriptions.contains_key(&url) {
                #[derive(Deserialize)]
                struct Selector {
                    path: String,
                }
                let resp = self
                    .authed(self.http.get(&url))
                    .header("accept", "application/json")
                    .timeout(REQUEST_TIMEOUT)
                    .send()
                    .await
                    .context("GET a subscription")?;
                match resp.json::<Selector>().await {
                    Ok(s) => {
                        self.state.subscriptions.insert(url, s.path);
                    }
                    Err(e) => tracing::warn!(%url, "failed to read an unknown subscription's selector: {e}"),
                }
            }
        }
        let stale: Vec<String> =
            self.state.subscriptions.iter().filter(|(_, p)| !self.settings.covers(p)).map(|(u, _)| u.clone()).collect();
        for url in stale {
            tracing::info!(%url, "ending a watch no longer configured");
            self.unsubscribe(&url).await;
        }
        self.save()?;
        tracing::info!(watches = self.state.subscriptions.len(), "reused the channel");
        Ok(true)
    }

    async fn subscribe(&mut self, path: &str) -> anyhow::Result<Subscribed> {
        let channel = self.state.channel.clone().context("no channel")?;
        let body = serde_json::json!({"path": path, "flags": self.settings.subscribe_flags()});
        let resp = self
            .authed(self.http.post(format!("{channel}/subscriptions/inotify")))
            .json(&body)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .with_context(|| format!("subscribe {path}"))?;
        let status = resp.status();
        if status.is_success() {
            let url = location(&resp).with_context(|| format!("subscribe {path}: no Location"))?;
            tracing::info!(%path, subscription = %url, "watching");
            self.state.subscriptions.insert(url, path.to_owned());
            self.save()?;
            return Ok(Subscribed::Yes);
        }
        // dCache answers 404 both for a missing path and a missing channel: ask which.
        if status == reqwest::StatusCode::NOT_FOUND && !self.channel_exists(&channel).await? {
            self.channel_gone()?;
            return Ok(Subscribed::ChannelGone);
        }
        if status.is_server_error() || status == reqwest::StatusCode::UNAUTHORIZED {
            anyhow::bail!("subscribe {path}: {status}");
        }
        Ok(Subscribed::Refused(status))
    }

    async fn channel_exists(&self, channel: &str) -> anyhow::Result<bool> {
        let resp = self
            .authed(self.http.get(channel))
            .header("accept", "application/json")
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .context("GET the channel")?;
        Ok(resp.status() != reqwest::StatusCode::NOT_FOUND)
    }

    /// Ends a watch (best effort) and forgets it.
    async fn unsubscribe(&mut self, url: &str) {
        let r = self.authed(self.http.delete(url)).timeout(REQUEST_TIMEOUT).send().await;
        match r {
            Ok(resp) if resp.status().is_success() || resp.status() == reqwest::StatusCode::NOT_FOUND => {}
            Ok(resp) => tracing::warn!(%url, status = %resp.status(), "failed to end a watch"),
            Err(e) => tracing::warn!(%url, "failed to end a watch: {e}"),
        }
        self.state.subscriptions.remove(url);
    }

    /// The channel is gone (dCache collected it): a new one is made at the next session, and
    /// what happened in between is lost.
    fn channel_gone(&mut self) -> anyhow::Result<()> {
        tracing::warn!(
            channel = self.state.channel.as_deref().unwrap_or(""),
            "the channel is gone; making a new one (events in between are lost)"
        );
        self.state.channel = None;
        self.state.subscriptions.clear();
        self.state.last_event_id = None;
        self.state.pending_loss = true;
        self.save()
    }

    /// Publishes the loss markers of a lost channel, one per watch root. `false` on shutdown.
    async fn publish_channel_loss(&mut self, shutdown: &CancellationToken) -> anyhow::Result<bool> {
        if !self.publish_loss("EVENT_LOSS", "channel-lost", shutdown).await? {
            return Ok(false);
        }
        self.state.pending_loss = false;
        self.save()?;
        Ok(true)
    }

    /// Publishes one loss marker per watch root.
    async fn publish_loss(&mut self, msg_type: &str, why: &str, shutdown: &CancellationToken) -> anyhow::Result<bool> {
        let channel = self.state.channel.clone().context("no channel")?;
        let ch = channel_id(&channel).to_owned();
        let at = now_ms();
        self.counters.losses += 1;
        for (i, root) in self.settings.watch.clone().iter().enumerate() {
            tracing::warn!(path = %root, %why, "dCache events lost; publishing a loss marker");
            let ce = loss_marker(&channel, format!("{ch}/{why}-{at}-{i}"), msg_type, root);
            if !self.publish(&ce, shutdown).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Handles one SSE item; `Some` ends the session.
    async fn handle(&mut self, item: SseItem, shutdown: &CancellationToken) -> anyhow::Result<Option<End>> {
        let ev = match item {
            SseItem::Refused { id, reason } => {
                self.counters.malformed += 1;
                tracing::warn!(id = id.as_deref().unwrap_or(""), %reason, "skipping a malformed SSE event");
                self.done(id)?;
                return Ok(None);
            }
            SseItem::Event(ev) => ev,
        };
        let Some(data) = ev.data.as_deref() else {
            self.done(ev.id)?;
            return Ok(None);
        };
        let end = match ev.event.as_str() {
            "SYSTEM" => self.handle_system(data, shutdown).await?,
            "inotify" => {
                if !self.handle_inotify(data, ev.id.as_deref(), shutdown).await? {
                    return Ok(Some(End::Shutdown));
                }
                None
            }
            other => {
                tracing::debug!(event = %other, "skipping an event of another type");
                self.counters.skipped += 1;
                None
            }
        };
        self.done(ev.id)?;
        Ok(end)
    }

    /// Records `id` (when given) as the resume point.
    fn done(&mut self, id: Option<String>) -> anyhow::Result<()> {
        let Some(id) = id else { return Ok(()) };
        let id = (!id.is_empty()).then_some(id);
        if id != self.state.last_event_id {
            self.state.last_event_id = id;
            self.save()?;
        }
        Ok(())
    }

    async fn handle_system(&mut self, data: &str, shutdown: &CancellationToken) -> anyhow::Result<Option<End>> {
        #[derive(Deserialize)]
        struct System {
            #[serde(rename = "type")]
            ty: String,
            #[serde(default)]
            subscription: Option<String>,
        }
        // dCache wraps it like the others (`{"event":{"type":…}}`) or not, depending on the
        // version: accept both.
        let parsed = serde_json::from_str::<serde_json::Value>(data).ok().and_then(|v| {
            let inner = v.get("event").filter(|e| e.is_object()).cloned().unwrap_or_else(|| v.clone());
            let mut s: System = serde_json::from_value(inner).ok()?;
            if s.subscription.is_none() {
                s.subscription = v.get("subscription").and_then(|s| s.as_str()).map(str::to_owned);
            }
            Some(s)
        });
        let Some(sys) = parsed else {
            self.counters.malformed += 1;
            tracing::warn!("skipping a malformed SYSTEM event");
            return Ok(None);
        };
        match sys.ty.as_str() {
            "NEW_SUBSCRIPTION" => {
                tracing::debug!(subscription = sys.subscription.as_deref().unwrap_or(""), "subscribed")
            }
            "SUBSCRIPTION_CLOSED" => {
                if let Some(url) = sys.subscription
                    && let Some(path) = self.state.subscriptions.remove(&url)
                {
                    tracing::warn!(%path, "dCache closed a watch");
                    self.save()?;
                }
            }
            "EVENT_LOSS" => {
                if !self.publish_loss("EVENT_LOSS", "event-loss", shutdown).await? {
                    return Ok(Some(End::Shutdown));
                }
            }
            "COMPETING_CLIENT" => return Ok(Some(End::Displaced)),
            "SHUTDOWN" => tracing::info!("the frontend is shutting down"),
            other => tracing::debug!(r#type = %other, "unknown SYSTEM event"),
        }
        Ok(None)
    }

    /// Handles one inotify event; `false` on shutdown.
    async fn handle_inotify(
        &mut self,
        data: &str,
        sse_id: Option<&str>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<bool> {
        let parsed: InotifyData = match serde_json::from_str(data) {
            Ok(p) => p,
            Err(e) => {
                self.counters.malformed += 1;
                tracing::warn!(id = sse_id.unwrap_or(""), "skipping a malformed inotify event: {e}");
                return Ok(true);
            }
        };
        let Some(watched) = self.state.subscriptions.get(&parsed.subscription).cloned() else {
            self.counters.skipped += 1;
            tracing::warn!(subscription = %parsed.subscription, "skipping an event of an unknown subscription");
            return Ok(true);
        };
        let action = match map_inotify(&parsed.event, &watched) {
            Ok(a) => a,
            Err(e) => {
                self.counters.malformed += 1;
                tracing::warn!(id = sse_id.unwrap_or(""), "skipping a malformed inotify event: {e}");
                return Ok(true);
            }
        };
        let channel = self.state.channel.clone().context("no channel")?;
        let ch = channel_id(&channel).to_owned();
        let id = match sse_id {
            Some(id) if !id.is_empty() => format!("{ch}/{id}"),
            _ => format!("{ch}/noid-{}", now_ms()),
        };
        match action {
            Action::Publish(event) => {
                if !self.settings.wants(&event.msg_type) {
                    self.counters.skipped += 1;
                    return Ok(true);
                }
                let ce = cloud_event(&channel, id, ce_type(&event.msg_type), event);
                return self.publish(&ce, shutdown).await;
            }
            Action::Overflow => {
                self.counters.losses += 1;
                tracing::warn!(path = %watched, "dCache overflowed (IN_Q_OVERFLOW); publishing a loss marker");
                let ce = loss_marker(&channel, id, "IN_Q_OVERFLOW", &watched);
                return self.publish(&ce, shutdown).await;
            }
            Action::Watch { flag } => {
                if flag == "IN_IGNORED" {
                    self.state.subscriptions.remove(&parsed.subscription);
                    self.save()?;
                }
                if self.settings.watch.contains(&watched) {
                    tracing::warn!(path = %watched, %flag, "watch root event");
                } else {
                    tracing::info!(path = %watched, %flag, "watch event");
                }
            }
            Action::Directory { flag, path } => {
                self.counters.skipped += 1;
                if self.settings.recursive {
                    self.follow_directory(&flag, &path).await?;
                }
            }
        }
        Ok(true)
    }

    /// Recursion: watch a directory created or moved in, forget one moved away.
    async fn follow_directory(&mut self, flag: &str, path: &str) -> anyhow::Result<()> {
        match flag {
            "IN_CREATE" | "IN_MOVED_TO" if !self.state.subscriptions.values().any(|p| p == path) => {
                match self.subscribe(path).await {
                    Ok(Subscribed::Yes) => {}
                    Ok(Subscribed::ChannelGone) => anyhow::bail!("the channel is gone"),
                    Ok(Subscribed::Refused(status)) => {
                        tracing::warn!(%path, %status, "could not watch a new directory")
                    }
                    Err(e) => tracing::warn!(%path, "could not watch a new directory: {e:#}"),
                }
            }
            "IN_MOVED_FROM" => {
                let gone: Vec<String> = self
                    .state
                    .subscriptions
                    .iter()
                    .filter(|(_, p)| (*p == path || is_below(p, path)) && !self.settings.watch.contains(p))
                    .map(|(u, _)| u.clone())
                    .collect();
                for url in gone {
                    self.unsubscribe(&url).await;
                }
                self.save()?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Publishes until acked; retries with backoff, reading nothing else meanwhile. `false` on
    /// shutdown (the event is then not recorded, and is read again at the next start).
    async fn publish(&mut self, ce: &CloudEvent, shutdown: &CancellationToken) -> anyhow::Result<bool> {
        let payload = bytes::Bytes::from(serde_json::to_vec(ce).context("encode a CloudEvent")?);
        let subject = subject();
        let mut backoff = Backoff::new(self.settings.backoff_min, self.settings.backoff_max);
        loop {
            let msg = PublishMessage::build()
                .payload(payload.clone())
                .message_id(&ce.id)
                .header("content-type", "application/cloudevents+json");
            let attempt = async {
                let ack = self.js.send_publish(subject.clone(), msg).await.map_err(|e| e.to_string())?;
                ack.await.map_err(|e| e.to_string())
            };
            let result = tokio::select! {
                _ = shutdown.cancelled() => return Ok(false),
                r = tokio::time::timeout(PUBLISH_TIMEOUT, attempt) => r,
            };
            match result {
                Ok(Ok(ack)) => {
                    self.counters.published += 1;
                    tracing::debug!(id = %ce.id, r#type = %ce.ty, seq = ack.sequence, duplicate = ack.duplicate, "published");
                    return Ok(true);
                }
                Ok(Err(e)) => tracing::warn!(id = %ce.id, "failed to publish; retrying: {e}"),
                Err(_) => tracing::warn!(id = %ce.id, "no PubAck within {PUBLISH_TIMEOUT:?}; retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(false),
                _ = tokio::time::sleep(backoff.next()) => {}
            }
        }
    }
}

/// The outcome of a subscribe request.
enum Subscribed {
    Yes,
    ChannelGone,
    /// Refused for this path (403, 404 path, 400): not retried now.
    Refused(reqwest::StatusCode),
}

/// The response's `Location`, resolved against the request URL.
fn location(resp: &reqwest::Response) -> Option<String> {
    let loc = resp.headers().get(reqwest::header::LOCATION)?.to_str().ok()?;
    resp.url().join(loc).ok().map(|u| u.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: &[&[u8]]) -> Vec<SseItem> {
        let mut p = SseParser::new(64, 256);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out);
        }
        out
    }

    fn event(event: &str, data: Option<&str>, id: Option<&str>) -> SseItem {
        SseItem::Event(SseEvent { event: event.into(), data: data.map(Into::into), id: id.map(Into::into) })
    }

    #[test]
    fn bare_data_lines_count_toward_the_event_bound() {
        // Found by the `bridge_lines` fuzz target: each `data` line's joining newline counts.
        let mut p = SseParser::new(64, 16);
        let mut out = Vec::new();
        p.feed(&b"data\n".repeat(1000), &mut out);
        p.feed(b"\n", &mut out);
        assert_eq!(out, [SseItem::Refused { id: None, reason: "event too large" }]);
    }

    #[test]
    fn sse_multi_line_data_comments_and_defaults() {
        let out = parse(&[b": keepalive\n\nevent: inotify\nid: 7\ndata: a\ndata:b\ndata\n\ndata: x\n\n"]);
        assert_eq!(out, vec![event("inotify", Some("a\nb\n"), Some("7")), event("message", Some("x"), None)]);
    }

    #[test]
    fn sse_line_ends_crlf_cr_and_split_across_chunks() {
        let out = parse(&[b"\xEF\xBB\xBFevent: a\r", b"\ndata: 1\r\n\r", b"\nevent: b\rdata: 2\r\r"]);
        assert_eq!(out, vec![event("a", Some("1"), None), event("b", Some("2"), None)]);
        // Byte by byte gives the same.
        let all = b"event: a\r\ndata: 1\r\n\r\n";
        let chunks: Vec<&[u8]> = all.chunks(1).collect();
        assert_eq!(parse(&chunks), vec![event("a", Some("1"), None)]);
    }

    #[test]
    fn sse_id_without_data_moves_the_resume_point_only() {
        let out = parse(&[b"id: 41\n\nevent: x\n\n\n"]);
        assert_eq!(out, vec![event("message", None, Some("41"))]);
        let out = parse(&[b"id\n\n"]);
        assert_eq!(out, vec![event("message", None, Some(""))]);
    }

    #[test]
    fn sse_overlong_line_refuses_its_event_and_the_stream_goes_on() {
        let long = [b'x'; 100];
        let out = parse(&[b"id: 3\ndata: ", &long, &long, b"\n\nid: 4\ndata: ok\n\n"]);
        assert_eq!(
            out,
            vec![
                SseItem::Refused { id: Some("3".into()), reason: "line too long" },
                event("message", Some("ok"), Some("4"))
            ]
        );
        // Too large as a whole: many lines, each short.
        let mut big = Vec::new();
        for _ in 0..10 {
            big.extend_from_slice(b"data: 0123456789012345678901234567890123456789\n");
        }
        big.extend_from_slice(b"\ndata: next\n\n");
        assert_eq!(
            parse(&[&big]),
            vec![SseItem::Refused { id: None, reason: "event too large" }, event("message", Some("next"), None)]
        );
        // Not UTF-8.
        assert_eq!(parse(&[b"data: \xff\xfe\n\n"]), vec![SseItem::Refused { id: None, reason: "line is not UTF-8" }]);
    }

    #[test]
    fn sse_incomplete_event_is_not_dispatched() {
        assert!(parse(&[b"event: inotify\nid: 5\ndata: {\"ev"]).is_empty());
    }

    fn ev(json: &str) -> InotifyEvent {
        serde_json::from_str(json).expect("event json")
    }

    #[test]
    fn inotify_child_events_map_to_kinds() {
        let cases = [
            ("IN_CLOSE_WRITE", EventKind::Write),
            ("IN_MOVED_TO", EventKind::Write),
            ("IN_CREATE", EventKind::Create),
            ("IN_DELETE", EventKind::Remove),
            ("IN_MOVED_FROM", EventKind::Remove),
            ("IN_ATTRIB", EventKind::Other),
            ("IN_MODIFY", EventKind::Other),
        ];
        for (flag, kind) in cases {
            let json = format!(r#"{{"name":"f.dat","mask":["{flag}"],"cookie":"c1"}}"#);
            assert_eq!(
                map_inotify(&ev(&json), "/data/in").expect(flag),
                Action::Publish(BridgedEvent {
                    kind,
                    msg_type: flag.into(),
                    path: "/data/in/f.dat".into(),
                    size: None,
                    owner: None
                })
            );
        }
        let Action::Publish(e) = map_inotify(&ev(r#"{"name":"f","mask":["IN_CLOSE_WRITE"]}"#), "/").expect("root")
        else {
            panic!("not published")
        };
        assert_eq!(e.path, "/f");
    }

    #[test]
    fn inotify_directory_self_and_management_events() {
        assert_eq!(
            map_inotify(&ev(r#"{"name":"sub","mask":["IN_CREATE","IN_ISDIR"]}"#), "/d").expect("dir"),
            Action::Directory { flag: "IN_CREATE".into(), path: "/d/sub".into() }
        );
        assert_eq!(
            map_inotify(&ev(r#"{"name":"sub","mask":["IN_ISDIR","IN_MOVED_FROM"],"cookie":"9"}"#), "/d").expect("mv"),
            Action::Directory { flag: "IN_MOVED_FROM".into(), path: "/d/sub".into() }
        );
        for flag in ["IN_DELETE_SELF", "IN_MOVE_SELF", "IN_IGNORED", "IN_UNMOUNT"] {
            let json = format!(r#"{{"mask":["{flag}"]}}"#);
            assert_eq!(map_inotify(&ev(&json), "/d").expect(flag), Action::Watch { flag: flag.into() });
        }
        assert_eq!(map_inotify(&ev(r#"{"mask":["IN_Q_OVERFLOW"]}"#), "/d").expect("overflow"), Action::Overflow);
    }

    #[test]
    fn inotify_malformed_events_are_errors() {
        for json in [
            r#"{"mask":[]}"#,
            r#"{"mask":["IN_ISDIR"]}"#,
            r#"{"mask":["IN_CLOSE_WRITE"]}"#,
            r#"{"name":"","mask":["IN_CLOSE_WRITE"]}"#,
            r#"{"name":"..","mask":["IN_CLOSE_WRITE"]}"#,
            r#"{"name":"a/b","mask":["IN_CLOSE_WRITE"]}"#,
            // Found by the `bridge_lines` fuzz target: the gateway refuses such a path.
            r#"{"name":"a\\b","mask":["IN_CLOSE_WRITE"]}"#,
        ] {
            assert!(map_inotify(&ev(json), "/d").is_err(), "{json}");
        }
        assert!(serde_json::from_str::<InotifyData>(r#"{"event":{"name":"x"},"subscription":"s"}"#).is_err());
    }

    #[test]
    fn loss_marker_shape() {
        let ce = loss_marker("https://fe/api/v1/events/channels/CH", "CH/event-loss-1-0".into(), "EVENT_LOSS", "/d");
        assert_eq!(ce.ty, "org.htfaas.storage.dcache-sse.event-loss");
        assert_eq!(ce.source, "https://fe/api/v1/events/channels/CH");
        assert_eq!(ce.subject.as_deref(), Some("/d"));
        let data: BridgedEvent = serde_json::from_value(ce.data.expect("data")).expect("bridged");
        assert_eq!(
            data,
            BridgedEvent {
                kind: EventKind::Other,
                msg_type: "EVENT_LOSS".into(),
                path: "/d".into(),
                size: None,
                owner: None
            }
        );
        assert_eq!(ce_type("IN_CLOSE_WRITE"), "org.htfaas.storage.dcache-sse.IN_CLOSE_WRITE");
        assert_eq!(subject(), "storage.cloudevents.dcache-sse");
        assert_eq!(channel_id("https://fe/api/v1/events/channels/CH"), "CH");
    }

    #[test]
    fn paths_and_flags() {
        assert!(valid_watch_path("/") && valid_watch_path("/a/b"));
        assert!(
            !valid_watch_path("a")
                && !valid_watch_path("/a/")
                && !valid_watch_path("/a//b")
                && !valid_watch_path("/a/..")
        );
        assert!(is_below("/a/b", "/a") && is_below("/a", "/") && !is_below("/ab", "/a") && !is_below("/a", "/a"));
        let mut s = Settings::new(
            "http://fe/api/v1/",
            Auth::Bearer { token_file: "t".into() },
            vec!["/d".into()],
            "s".into(),
            "nats://x",
        );
        s.flags = vec!["IN_CLOSE_WRITE".into()];
        s.recursive = true;
        s.validate().expect("valid");
        assert_eq!(s.frontend, "http://fe/api/v1");
        assert_eq!(s.subscribe_flags(), ["IN_CLOSE_WRITE", "IN_CREATE", "IN_MOVED_TO", "IN_MOVED_FROM"]);
        assert!(s.wants("IN_CLOSE_WRITE") && !s.wants("IN_CREATE"));
        assert!(s.covers("/d/x/y") && !s.covers("/e"));
        s.flags = vec!["IN_BOGUS".into()];
        assert!(s.validate().is_err());
    }

    #[test]
    fn state_round_trips_and_ignores_another_frontend() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("state.json");
        let mut st = State::load(&file, "http://fe").expect("fresh");
        assert_eq!(st, State::fresh("http://fe"));
        st.channel = Some("http://fe/events/channels/C".into());
        st.subscriptions.insert("http://fe/events/channels/C/subscriptions/inotify/S".into(), "/d".into());
        st.last_event_id = Some("9".into());
        st.save(&file).expect("save");
        assert_eq!(State::load(&file, "http://fe").expect("load"), st);
        assert_eq!(State::load(&file, "http://other").expect("other"), State::fresh("http://other"));
        std::fs::write(&file, b"{not json").expect("write");
        assert!(State::load(&file, "http://fe").is_err());
    }
}
