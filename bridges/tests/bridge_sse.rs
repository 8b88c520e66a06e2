//! `htfaas bridge dcache-sse` against a fake dCache frontend and a real nats-server: what is
//! published (type, path, kind, id), resuming with `Last-Event-ID` after a dropped connection
//! without duplicates, loss markers (SYSTEM `EVENT_LOSS`, a garbage-collected channel), a
//! restart from the state file reusing the channel, and emulated recursive watches.
//!
//! The fake speaks the frontend's REST + SSE protocol as dCache documents it (dcache.md §2.1):
//! channels with a replay buffer, inotify subscriptions filtered by their flags, one reader
//! per channel. Everything listens on 127.0.0.1 and stops when its test ends.

use async_nats::jetstream;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use htfaas_bridges::sse::{self, Auth, Settings};
use htfaas_functions::event::{BridgedEvent, CloudEvent, EventKind};
use htfaas_functions::nats_server::{NatsServer, find_binary};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "secret-token";
/// Longest wait for anything.
const WAIT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------
// The fake frontend
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Channel {
    /// sid → (path, flags).
    subs: BTreeMap<String, (String, Vec<String>)>,
    /// The replay buffer: (id, SSE text).
    events: Vec<(u64, String)>,
    next_id: u64,
    /// The one reader.
    client: Option<mpsc::UnboundedSender<Bytes>>,
}

#[derive(Default)]
struct Fake {
    base: String,
    next: u64,
    channels: BTreeMap<String, Channel>,
    /// The channel made last.
    current: Option<String>,
    channels_made: u32,
    subscribes: u32,
    /// `Last-Event-ID` of each stream GET, in order.
    gets: Vec<Option<String>>,
}

type Shared = Arc<Mutex<Fake>>;

fn authorized(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

fn created(location: String) -> Response {
    (StatusCode::CREATED, [("location", location)]).into_response()
}

async fn make_channel(State(fake): State<Shared>, headers: HeaderMap) -> Response {
    if !authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut f = fake.lock().expect("lock");
    f.next += 1;
    let id = format!("ch{}x", f.next);
    f.channels.insert(id.clone(), Channel { next_id: 1, ..Channel::default() });
    f.current = Some(id.clone());
    f.channels_made += 1;
    created(format!("{}/api/v1/events/channels/{id}", f.base))
}

async fn get_channel(State(fake): State<Shared>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    if !authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut f = fake.lock().expect("lock");
    let accept = headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    if !f.channels.contains_key(&id) {
        return StatusCode::NOT_FOUND.into_response();
    }
    if !accept.contains("text/event-stream") {
        return axum::Json(json!({"timeout": 300})).into_response();
    }
    f.gets.push(last.clone());
    let ch = f.channels.get_mut(&id).expect("channel");
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    let after: u64 = last.as_deref().and_then(|l| l.parse().ok()).unwrap_or(0);
    for (n, text) in &ch.events {
        if *n > after {
            let _ = tx.send(Bytes::from(text.clone()));
        }
    }
    if let Some(old) = ch.client.replace(tx) {
        let _ = old.send(Bytes::from("event: SYSTEM\ndata: {\"type\":\"COMPETING_CLIENT\"}\n\n"));
    }
    let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>)));
    ([("content-type", "text/event-stream")], Body::from_stream(body)).into_response()
}

async fn delete_channel(State(fake): State<Shared>, Path(id): Path<String>) -> StatusCode {
    match fake.lock().expect("lock").channels.remove(&id) {
        Some(_) => StatusCode::NO_CONTENT,
        None => StatusCode::NOT_FOUND,
    }
}

async fn list_subscriptions(State(fake): State<Shared>, Path(id): Path<String>) -> Response {
    let f = fake.lock().expect("lock");
    let Some(ch) = f.channels.get(&id) else { return StatusCode::NOT_FOUND.into_response() };
    let urls: Vec<String> = ch
        .subs
        .keys()
        .map(|sid| format!("{}/api/v1/events/channels/{id}/subscriptions/inotify/{sid}", f.base))
        .collect();
    axum::Json(urls).into_response()
}

async fn subscribe(
    State(fake): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    axum::Json(selector): axum::Json<Value>,
) -> Response {
    if !authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut f = fake.lock().expect("lock");
    f.next += 1;
    f.subscribes += 1;
    let sid = format!("sub{}", f.next);
    let base = f.base.clone();
    let Some(ch) = f.channels.get_mut(&id) else { return StatusCode::NOT_FOUND.into_response() };
    let path = selector["path"].as_str().unwrap_or_default().to_owned();
    let flags = selector["flags"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    ch.subs.insert(sid.clone(), (path, flags));
    let url = format!("{base}/api/v1/events/channels/{id}/subscriptions/inotify/{sid}");
    if let Some(c) = &ch.client {
        let text = format!("event: SYSTEM\ndata: {}\n\n", json!({"type": "NEW_SUBSCRIPTION", "subscription": url}));
        let _ = c.send(Bytes::from(text));
    }
    created(url)
}

async fn get_subscription(State(fake): State<Shared>, Path((id, sid)): Path<(String, String)>) -> Response {
    let f = fake.lock().expect("lock");
    match f.channels.get(&id).and_then(|c| c.subs.get(&sid)) {
        Some((path, flags)) => axum::Json(json!({"path": path, "flags": flags})).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn delete_subscription(State(fake): State<Shared>, Path((id, sid)): Path<(String, String)>) -> StatusCode {
    let mut f = fake.lock().expect("lock");
    match f.channels.get_mut(&id).and_then(|c| c.subs.remove(&sid)) {
        Some(_) => StatusCode::NO_CONTENT,
        None => StatusCode::NOT_FOUND,
    }
}

/// The fake frontend, stopped when dropped.
struct Frontend {
    fake: Shared,
    /// `http://127.0.0.1:<port>/api/v1`.
    url: String,
    stop: CancellationToken,
}

impl Drop for Frontend {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Frontend {
    async fn start() -> Frontend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let fake: Shared = Arc::new(Mutex::new(Fake { base: base.clone(), ..Fake::default() }));
        let app = Router::new()
            .route("/api/v1/events/channels", post(make_channel))
            .route("/api/v1/events/channels/{id}", get(get_channel).delete(delete_channel))
            .route("/api/v1/events/channels/{id}/subscriptions", get(list_subscriptions))
            .route("/api/v1/events/channels/{id}/subscriptions/inotify", post(subscribe))
            .route(
                "/api/v1/events/channels/{id}/subscriptions/inotify/{sid}",
                get(get_subscription).delete(delete_subscription),
            )
            .with_state(fake.clone());
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(s.cancelled_owned()).await });
        Frontend { fake, url: format!("{base}/api/v1"), stop }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Fake) -> T) -> T {
        f(&mut self.fake.lock().expect("lock"))
    }

    fn channel_url(&self) -> String {
        self.with(|f| format!("{}/api/v1/events/channels/{}", f.base, f.current.clone().expect("a channel")))
    }

    fn channel_id(&self) -> String {
        self.with(|f| f.current.clone().expect("a channel"))
    }

    /// Waits until a reader has made `n` stream GETs in all; their `Last-Event-ID`s.
    async fn wait_gets(&self, n: usize) -> Vec<Option<String>> {
        let gets = wait_for("stream GETs", || self.with(|f| (f.gets.len() >= n).then(|| f.gets.clone()))).await;
        assert_eq!(gets.len(), n, "more stream GETs than expected: {gets:?}");
        // The reader is attached once the GET is answered; give the handler a moment.
        tokio::time::sleep(Duration::from_millis(50)).await;
        gets
    }

    /// Waits until `path` is watched on the current channel; its subscription URL.
    async fn wait_watch(&self, path: &str) -> String {
        wait_for("a subscription", || {
            self.with(|f| {
                let id = f.current.clone()?;
                let sid = f.channels.get(&id)?.subs.iter().find(|(_, (p, _))| p == path)?.0.clone();
                Some(format!("{}/api/v1/events/channels/{id}/subscriptions/inotify/{sid}", f.base))
            })
        })
        .await
    }

    /// Emits an inotify event on the watch of `path`, as dCache would: only when the
    /// subscription's flags ask for it; given the next id, buffered, sent to the reader. With
    /// `cut`, the reader gets only the first half of it and is then disconnected. The id, or
    /// `None` when filtered out.
    fn inotify(&self, path: &str, event: Value, cut: bool) -> Option<u64> {
        self.with(|f| {
            let id = f.current.clone().expect("a channel");
            let base = f.base.clone();
            let ch = f.channels.get_mut(&id).expect("channel");
            let (sid, (_, flags)) = ch.subs.iter().find(|(_, (p, _))| p == path).expect("watched");
            let flag = event["mask"][0].as_str().expect("mask").to_owned();
            if !flags.contains(&flag) {
                return None;
            }
            let url = format!("{base}/api/v1/events/channels/{id}/subscriptions/inotify/{sid}");
            let data = json!({"event": event, "subscription": url});
            Some(push(ch, &format!("event: inotify\nid: {{id}}\ndata: {data}\n\n"), cut))
        })
    }

    /// Emits a raw SSE event with the next id (`{id}` in `text` is replaced by it).
    fn raw_with_id(&self, text: &str) -> u64 {
        self.with(|f| {
            let id = f.current.clone().expect("a channel");
            push(f.channels.get_mut(&id).expect("channel"), text, false)
        })
    }

    /// Sends a SYSTEM event (not buffered, no id) to the current reader.
    fn system(&self, json: Value) {
        self.with(|f| {
            let id = f.current.clone().expect("a channel");
            let ch = f.channels.get(&id).expect("channel");
            let text = format!("event: SYSTEM\ndata: {json}\n\n");
            ch.client.as_ref().expect("a reader").send(Bytes::from(text)).expect("send");
        });
    }

    /// dCache collected the channel: gone, reader disconnected.
    fn drop_channel(&self) {
        self.with(|f| {
            let id = f.current.clone().expect("a channel");
            f.channels.remove(&id);
        });
    }
}

fn push(ch: &mut Channel, text: &str, cut: bool) -> u64 {
    let n = ch.next_id;
    ch.next_id += 1;
    let text = text.replace("{id}", &n.to_string());
    ch.events.push((n, text.clone()));
    if cut {
        if let Some(c) = ch.client.take() {
            let _ = c.send(Bytes::from(text[..text.len() / 2].to_owned()));
        }
    } else if let Some(c) = &ch.client {
        let _ = c.send(Bytes::from(text));
    }
    n
}

async fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// nats-server
// ---------------------------------------------------------------------------------------------

/// A nats-server with JetStream (the one harness, `htfaas_functions::nats_server`), stopped
/// when dropped.
struct Nats {
    _server: NatsServer,
    url: String,
    _dir: tempfile::TempDir,
}

impl Nats {
    async fn start() -> (Nats, jetstream::stream::Stream) {
        let binary = find_binary().expect("nats-server not found (set HTFAAS_NATS_SERVER)");
        let dir = tempfile::tempdir().expect("tempdir");
        let server = NatsServer::start(&binary, dir.path(), 0).expect("start nats-server");
        let url = server.url();
        let nats = Nats { _server: server, url, _dir: dir };
        let deadline = Instant::now() + WAIT;
        let client = loop {
            if let Ok(c) = async_nats::connect(&nats.url).await {
                break c;
            }
            assert!(Instant::now() < deadline, "nats-server did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let js = jetstream::new(client);
        let stream = js
            .create_stream(jetstream::stream::Config {
                name: "CLOUDEVENTS_TEST".into(),
                subjects: vec!["storage.cloudevents.>".into()],
                storage: jetstream::stream::StorageType::Memory,
                ..Default::default()
            })
            .await
            .expect("create the stream");
        (nats, stream)
    }
}

/// One published message.
#[derive(Debug)]
struct Published {
    msg_id: String,
    content_type: String,
    ce: CloudEvent,
    data: BridgedEvent,
}

/// Waits until the stream holds exactly `n` messages (and no more arrive for a moment).
async fn wait_published(stream: &jetstream::stream::Stream, n: u64) -> Vec<Published> {
    let deadline = Instant::now() + WAIT;
    loop {
        let info = stream.get_info().await.expect("stream info");
        assert!(info.state.messages <= n, "{} messages published, expected {n}", info.state.messages);
        if info.state.messages == n {
            break;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {n} messages ({} so far)", info.state.messages);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let info = stream.get_info().await.expect("stream info");
    assert_eq!(info.state.messages, n, "more messages than expected");
    let mut out = Vec::new();
    for seq in 1..=n {
        let m = stream.get_raw_message(seq).await.expect("message");
        assert_eq!(m.subject.as_str(), "storage.cloudevents.dcache-sse");
        let header = |k: &str| m.headers.get(k).map(|v| v.as_str().to_owned()).unwrap_or_default();
        let ce: CloudEvent = serde_json::from_slice(&m.payload).expect("a CloudEvent");
        let data: BridgedEvent = serde_json::from_value(ce.data.clone().expect("data")).expect("BridgedEvent");
        out.push(Published { msg_id: header("Nats-Msg-Id"), content_type: header("content-type"), ce, data });
    }
    out
}

/// A bridge running in a task; stopped and joined (bounded) by [`Bridge::stop`].
struct Bridge {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Bridge {
    fn start(settings: Settings) -> Bridge {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(sse::run(settings, shutdown.clone()));
        Bridge { shutdown, task }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let r = tokio::time::timeout(WAIT, self.task).await.expect("the bridge stops").expect("join");
        r.expect("the bridge ends cleanly");
    }
}

fn settings(fe: &Frontend, nats: &Nats, dir: &std::path::Path, watch: &[&str]) -> Settings {
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("write token");
    let mut s = Settings::new(
        &fe.url,
        Auth::Bearer { token_file },
        watch.iter().map(|w| (*w).to_owned()).collect(),
        dir.join("state.json"),
        &nats.url,
    );
    s.backoff_min = Duration::from_millis(50);
    s.backoff_max = Duration::from_millis(300);
    s
}

fn state(dir: &std::path::Path) -> sse::State {
    serde_json::from_slice(&std::fs::read(dir.join("state.json")).expect("state file")).expect("state json")
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Publish, resume with `Last-Event-ID` without duplicates, EVENT_LOSS, restart from
/// the state file on the same channel, COMPETING_CLIENT.
#[tokio::test]
async fn dcache_sse_publishes_resumes_reports_loss_and_restarts_from_state() {
    let fe = Frontend::start().await;
    let (nats, stream) = Nats::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let s = settings(&fe, &nats, dir.path(), &["/data/incoming"]);
    let bridge = Bridge::start(s.clone());
    assert_eq!(fe.wait_gets(1).await, [None]);
    let watch = fe.wait_watch("/data/incoming").await;
    let channel = fe.channel_url();
    let ch = fe.channel_id();
    assert_eq!(
        fe.with(|f| f.channels[&ch].subs.values().next().expect("sub").1.clone()),
        ["IN_CLOSE_WRITE", "IN_MOVED_TO", "IN_CREATE", "IN_DELETE"]
    );

    // The upload sequence of dcache.md §2.4; dCache sends only what the watch asked for.
    let mut ids = Vec::new();
    for flag in ["IN_CREATE", "IN_OPEN", "IN_MODIFY", "IN_CLOSE_WRITE", "IN_ATTRIB"] {
        ids.extend(fe.inotify("/data/incoming", json!({"name": "run1.dat", "mask": [flag]}), false));
    }
    assert_eq!(ids, [1, 2]);
    // A malformed one (counted, skipped, its id passed) and a comment.
    assert_eq!(fe.raw_with_id(": keepalive\n\nevent: inotify\nid: {id}\ndata: {\"event\": nope\n\n"), 3);
    let got = wait_published(&stream, 2).await;
    let expect = [("IN_CREATE", EventKind::Create, 1), ("IN_CLOSE_WRITE", EventKind::Write, 2)];
    for (p, (flag, kind, id)) in got.iter().zip(expect) {
        assert_eq!(p.ce.specversion, "1.0");
        assert_eq!(p.ce.ty, format!("org.htfaas.storage.dcache-sse.{flag}"));
        assert_eq!(p.ce.source, channel);
        assert_eq!(p.ce.id, format!("{ch}/{id}"));
        assert_eq!(p.msg_id, p.ce.id);
        assert_eq!(p.content_type, "application/cloudevents+json");
        assert_eq!(p.ce.subject.as_deref(), Some("/data/incoming/run1.dat"));
        assert!(p.ce.time.is_some());
        assert_eq!(
            p.data,
            BridgedEvent {
                kind,
                msg_type: flag.into(),
                path: "/data/incoming/run1.dat".into(),
                size: None,
                owner: None
            }
        );
    }
    wait_for("the resume point 3", || (state(dir.path()).last_event_id.as_deref() == Some("3")).then_some(())).await;

    // The connection drops in the middle of event 4: the bridge resumes after 3, gets 4 once.
    let id = fe.inotify("/data/incoming", json!({"name": "run2.dat", "mask": ["IN_MOVED_TO"], "cookie": "c7"}), true);
    assert_eq!(id, Some(4));
    assert_eq!(fe.wait_gets(2).await[1].as_deref(), Some("3"));
    let got = wait_published(&stream, 3).await;
    assert_eq!(got[2].ce.id, format!("{ch}/4"));
    assert_eq!(got[2].data.kind, EventKind::Write);
    assert_eq!(got[2].data.path, "/data/incoming/run2.dat");

    // dCache's buffer moved past a resume point: a loss marker for the watched tree.
    fe.system(json!({"type": "EVENT_LOSS"}));
    let got = wait_published(&stream, 4).await;
    assert_eq!(got[3].ce.ty, "org.htfaas.storage.dcache-sse.event-loss");
    assert_eq!(
        got[3].data,
        BridgedEvent {
            kind: EventKind::Other,
            msg_type: "EVENT_LOSS".into(),
            path: "/data/incoming".into(),
            size: None,
            owner: None
        }
    );
    assert_eq!(got[3].msg_id, got[3].ce.id);

    // Restart: the state file names the channel, its watch and the resume point.
    bridge.stop().await;
    let st = state(dir.path());
    assert_eq!(st.channel.as_deref(), Some(channel.as_str()));
    assert_eq!(st.last_event_id.as_deref(), Some("4"));
    assert_eq!(st.subscriptions, BTreeMap::from([(watch.clone(), "/data/incoming".to_owned())]));
    assert_eq!(fe.inotify("/data/incoming", json!({"name": "run3.dat", "mask": ["IN_CLOSE_WRITE"]}), false), Some(5));
    let bridge = Bridge::start(s.clone());
    assert_eq!(fe.wait_gets(3).await[2].as_deref(), Some("4"));
    let got = wait_published(&stream, 5).await;
    assert_eq!(got[4].ce.id, format!("{ch}/5"));
    assert_eq!(got[4].ce.source, channel);
    assert_eq!(fe.with(|f| (f.channels_made, f.subscribes)), (1, 1), "the channel and its watch are reused");

    // Another reader takes the channel: the bridge backs off, then reads again from 5.
    fe.system(json!({"type": "COMPETING_CLIENT"}));
    assert_eq!(fe.wait_gets(4).await[3].as_deref(), Some("5"));
    bridge.stop().await;
    wait_published(&stream, 5).await;
}

/// A garbage-collected channel (404) is replaced and its loss reported.
#[tokio::test]
async fn dcache_sse_lost_channel_is_renewed_and_reported() {
    let fe = Frontend::start().await;
    let (nats, stream) = Nats::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let bridge = Bridge::start(settings(&fe, &nats, dir.path(), &["/a", "/b"]));
    fe.wait_gets(1).await;
    fe.wait_watch("/b").await;
    let old = fe.channel_id();
    fe.inotify("/a", json!({"name": "x", "mask": ["IN_CLOSE_WRITE"]}), false);
    wait_published(&stream, 1).await;

    fe.drop_channel();
    fe.wait_gets(2).await;
    let new = fe.channel_id();
    assert_ne!(new, old);
    assert_eq!(fe.with(|f| (f.channels_made, f.subscribes)), (2, 4));
    // One loss marker per watch root, from the new channel.
    let got = wait_published(&stream, 3).await;
    for (p, root) in got[1..].iter().zip(["/a", "/b"]) {
        assert_eq!(p.ce.ty, "org.htfaas.storage.dcache-sse.event-loss");
        assert_eq!((p.data.msg_type.as_str(), p.data.path.as_str()), ("EVENT_LOSS", root));
        assert!(p.ce.id.starts_with(&format!("{new}/")), "{}", p.ce.id);
    }
    assert_eq!(fe.with(|f| f.gets.clone()), [None, None]);
    fe.inotify("/b", json!({"name": "y", "mask": ["IN_DELETE"]}), false);
    let got = wait_published(&stream, 4).await;
    assert_eq!(got[3].ce.id, format!("{new}/1"));
    assert_eq!((got[3].data.kind, got[3].data.path.as_str()), (EventKind::Remove, "/b/y"));
    assert!(!state(dir.path()).pending_loss);
    bridge.stop().await;
}

/// `--recursive`: a new directory is watched too; one moved away is not any more. Directory
/// events themselves are not published.
#[tokio::test]
async fn dcache_sse_recursive_watch_follows_new_directories() {
    let fe = Frontend::start().await;
    let (nats, stream) = Nats::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = settings(&fe, &nats, dir.path(), &["/data"]);
    s.recursive = true;
    s.flags = vec!["IN_CLOSE_WRITE".into()];
    let bridge = Bridge::start(s);
    fe.wait_gets(1).await;
    fe.wait_watch("/data").await;

    fe.inotify("/data", json!({"name": "sub", "mask": ["IN_CREATE", "IN_ISDIR"]}), false);
    fe.wait_watch("/data/sub").await;
    // A file created (IN_CREATE asked for recursion only) is not published; a write is.
    fe.inotify("/data/sub", json!({"name": "f", "mask": ["IN_CREATE"]}), false);
    fe.inotify("/data/sub", json!({"name": "f", "mask": ["IN_CLOSE_WRITE"]}), false);
    let got = wait_published(&stream, 1).await;
    assert_eq!(got[0].data.path, "/data/sub/f");
    assert_eq!(got[0].ce.ty, "org.htfaas.storage.dcache-sse.IN_CLOSE_WRITE");

    fe.inotify("/data", json!({"name": "sub", "mask": ["IN_MOVED_FROM", "IN_ISDIR"], "cookie": "1"}), false);
    wait_for("the old watch to end", || {
        fe.with(|f| f.channels.values().all(|c| c.subs.values().all(|(p, _)| p != "/data/sub"))).then_some(())
    })
    .await;
    assert_eq!(state(dir.path()).subscriptions.len(), 1);
    bridge.stop().await;
    wait_published(&stream, 1).await;
}
