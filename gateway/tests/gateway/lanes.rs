//! Fair ingest: the owners' lanes on a real nats-server and a real gateway
//! (`htfaas_gateway::run`; the storage and the scheduler are unreachable, so every firing stays
//! pending in the firing table, whose `seq` is the order firings were committed in).
//!
//! - A backlog of one owner does not delay another's event: alice's 2,000 events and then
//!   bob's one wait in the stream while the gateway is down; once it is back, bob's firing is
//!   committed before alice's backlog is drained (ordering, not timing), and every event fires
//!   exactly once. The lanes are durable: the restart resumes them.
//! - An event under a directory both owners may read fires each owner's function once.
//! - A publisher that routes an event to a directory's lane that is not its path's (the attack)
//!   fires nothing: counted malformed and acked.

use async_nats::jetstream;
use htfaas_functions::FunctionManifest;
use htfaas_functions::manifest::{Outputs, Resources, Trigger};
use htfaas_functions::nats_server::{NatsServer, find_binary};
use htfaas_functions::proto::{EVENTS_STREAM, path_subject};
use htfaas_gateway::Shared;
use htfaas_gateway::firing::Firing;
use htfaas_gateway::lanes::consumer_name;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const BACKLOG: u64 = 2_000;
const WAIT: Duration = Duration::from_secs(120);

/// A gateway whose namespaces give alice `/data/alice/`, bob `/data/bob/`, both
/// `/data/shared/`.
fn config(dir: &Path, nats_url: &str) -> htfaas_gateway::Config {
    let grants: Vec<serde_json::Value> = [
        ("alice", "read", "/data/alice/"),
        ("alice", "write", "/data/alice/out/"),
        ("alice", "read", "/data/shared/"),
        ("bob", "read", "/data/bob/"),
        ("bob", "write", "/data/bob/out/"),
        ("bob", "read", "/data/shared/"),
    ]
    .into_iter()
    .map(|(p, r, v)| serde_json::json!({"principal": p, "right": r, "value": v}))
    .collect();
    serde_json::from_value(serde_json::json!({
        "listen": "127.0.0.1:0", "nats_url": nats_url,
        "registry_dir": dir.join("registry"), "storage_url": "http://127.0.0.1:1",
        "storage_user": "gateway", "scheduler_url": "http://127.0.0.1:1",
        "scheduler_admin_token": "s", "signing_key_file": dir.join("submit.pem"), "admin_token": "a",
        "namespaces": grants,
    }))
    .expect("config")
}

fn manifest(name: &str, owner: &str, module: &htfaas_functions::Digest, glob: &str) -> FunctionManifest {
    FunctionManifest {
        runtime: Default::default(),
        command: Vec::new(),
        handler: false,
        retry: None,
        name: name.into(),
        owner: owner.into(),
        module: module.clone(),
        trigger: Trigger::on_path(glob),
        resources: Resources::default(),
        outputs: Outputs::into_dir(format!("/data/{owner}/out/")),
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
    }
}

/// A running gateway: its state, its stop and its task.
struct Gateway {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Gateway {
    async fn start(dir: &Path, nats_url: &str, register: bool) -> Gateway {
        let settings = config(dir, nats_url).resolve().await.expect("resolve");
        let shared = settings.shared();
        if register {
            let module = shared.registry.put_module(b"\0asm\x01\0\0\0").expect("module");
            for m in [
                manifest("a-own", "alice", &module, "/data/alice/**"),
                manifest("a-shared", "alice", &module, "/data/shared/**"),
                manifest("b-own", "bob", &module, "/data/bob/**"),
                manifest("b-shared", "bob", &module, "/data/shared/**"),
            ] {
                shared.registry.register(m).expect("register");
            }
            shared.triggers.reload(&shared.registry).expect("reload");
        }
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(htfaas_gateway::run(settings, shutdown.clone()));
        Gateway { shared, shutdown, task }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("join").expect("the gateway ran");
    }
}

fn transfer(path: &str, n: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "msgType": "transfer", "isWrite": "write", "isP2p": false, "status": {"code": 0, "msg": ""},
        "cellName": "pool-a", "cellDomain": "poolDomain", "transferPath": path,
        "pnfsid": format!("0000{n:032X}"), "session": format!("s-{n}"), "fileSize": 10,
    }))
    .expect("json")
}

async fn until<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owners_backlog_does_not_delay_anothers_event_and_each_fires_once() {
    let binary = find_binary().expect("nats-server not found (set HTFAAS_NATS_SERVER)");
    let nats_dir = tempfile::tempdir().expect("tempdir");
    let server = NatsServer::start(&binary, nats_dir.path(), 0).expect("start nats-server");
    let url = server.url();
    let dir = tempfile::tempdir().expect("tempdir");

    // First start: the lanes are made (a new lane reads only what is published after it).
    let gateway = Gateway::start(dir.path(), &url, true).await;
    let js = jetstream::new(until("nats", async || async_nats::connect(&url).await.ok()).await);
    let lanes = [consumer_name("gateway", "alice"), consumer_name("gateway", "bob")];
    let stream = until("the events stream", async || js.get_stream(EVENTS_STREAM).await.ok()).await;
    for lane in &lanes {
        let info = until("the lanes", async || stream.consumer_info(lane).await.ok()).await;
        assert_eq!(info.config.deliver_policy, jetstream::consumer::DeliverPolicy::New, "{lane}");
    }
    let alice_filters = stream.consumer_info(&lanes[0]).await.expect("alice's lane").config.filter_subjects.clone();
    assert_eq!(
        alice_filters,
        ["storage.dcache.billing.path.data.alice.>", "storage.dcache.billing.path.data.shared.>"],
        "alice's lane reads her namespace's directories"
    );
    until("the lanes counted", async || (gateway.shared.stats.ingest_lanes.load(Ordering::Relaxed) == 2).then_some(()))
        .await;
    gateway.stop().await;

    // While the gateway is down: alice's backlog, then bob's one event, one event under the
    // shared directory, and one lying about its directory.
    let mut acks = Vec::new();
    for n in 0..BACKLOG {
        let path = format!("/data/alice/f{}.dat", n % 7);
        acks.push(js.publish(path_subject(&path), transfer(&path, n).into()).await.expect("publish"));
    }
    for ack in acks {
        ack.await.expect("stored");
    }
    let publish = async |subject: String, body: Vec<u8>| {
        js.publish(subject, body.into()).await.expect("publish").await.expect("stored");
    };
    publish(path_subject("/data/bob/in.dat"), transfer("/data/bob/in.dat", 1_000_001)).await;
    publish(path_subject("/data/shared/both.dat"), transfer("/data/shared/both.dat", 1_000_002)).await;
    // The attack: bob's directory's subject, a payload naming a file of the shared directory.
    publish(path_subject("/data/bob/in.dat"), transfer("/data/shared/lie.dat", 1_000_003)).await;
    let pending = stream.consumer_info(&lanes[0]).await.expect("alice's lane").num_pending;
    assert_eq!(pending, BACKLOG + 1, "alice's backlog and the shared event wait in her lane");
    assert_eq!(stream.consumer_info(&lanes[1]).await.expect("bob's lane").num_pending, 3);

    // Back: the durable lanes resume.
    let gateway = Gateway::start(dir.path(), &url, false).await;
    let expected = BACKLOG as usize + 3;
    let firings: Vec<Firing> = until("every firing", async || {
        let all = gateway.shared.firings.list(0, 10_000).expect("list");
        (all.len() >= expected && gateway.shared.stats.events_malformed.load(Ordering::Relaxed) >= 1).then_some(all)
    })
    .await;
    // Until both lanes have nothing left to deliver or to ack: every event is decided, so a
    // second firing of anything would show here.
    for lane in &lanes {
        until("the lane drained", async || {
            let info = stream.consumer_info(lane).await.ok()?;
            (info.num_pending == 0 && info.num_ack_pending == 0).then_some(())
        })
        .await;
    }
    let firings = {
        let again = gateway.shared.firings.list(0, 10_000).expect("list");
        assert_eq!(again.len(), firings.len(), "no firing after the last expected one");
        again
    };
    assert_eq!(firings.len(), expected, "one firing per (event, function)");
    let mut per_function: BTreeMap<&str, Vec<&Firing>> = BTreeMap::new();
    for f in &firings {
        per_function.entry(f.function.as_str()).or_default().push(f);
    }
    let count = |name: &str| per_function.get(name).map_or(0, Vec::len);
    assert_eq!(count("a-own"), BACKLOG as usize);
    assert_eq!((count("b-own"), count("a-shared"), count("b-shared")), (1, 1, 1), "the shared event fires each once");
    let mut keys: Vec<&str> = firings.iter().map(|f| f.event_key.as_str()).collect();
    keys.sort_unstable();
    let before = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), before - 1, "distinct events, but the shared one (two functions)");
    assert!(firings.iter().all(|f| !f.event_key.contains("1000003") && !f.event_key.contains("F4243")));

    // The order they were committed in: bob's before alice's backlog was drained.
    let bob = per_function["b-own"][0].seq;
    let alice_after = per_function["a-own"].iter().filter(|f| f.seq > bob).count();
    assert!(
        alice_after > 0,
        "bob's firing was committed after all of alice's {BACKLOG}: his lane waited behind her backlog"
    );
    eprintln!("bob's firing committed with {alice_after} of alice's {BACKLOG} still to come");

    let s = gateway.shared.stats.snapshot();
    assert_eq!(s.events_malformed, 1, "the event on another directory's subject: {s:?}");
    gateway.stop().await;
    drop(server);
}
