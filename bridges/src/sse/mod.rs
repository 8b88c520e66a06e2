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
//!
//! Here: the settings and the paths' rules; the SSE parser is `parse`, the inotify mapping to
//! CloudEvents `inotify`, the resume state file `state`, the bridge's loop `bridge`. Must not
//! know: the gateway (it only publishes on NATS).

use anyhow::Context as _;
use std::path::PathBuf;
use std::time::Duration;

mod bridge;
mod inotify;
mod parse;
mod state;

pub use bridge::*;
pub use inotify::*;
pub use parse::*;
pub use state::*;

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

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::event::{BridgedEvent, EventKind};

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
