//! Exactly-once effect, rate and debounce, on the real stack: every event delivered
//! twice, in a shuffled order, with a gateway restart in the middle, starts exactly one job per
//! (event, function), and the copies are dropped by the gateway's firing table before any
//! macaroon is asked for; a rate-limited function's excess waits instead of being dropped; a
//! burst of writes to one path under a debounce window starts one job, for the last event.

use htfaas::stack::demo_manifest;
use htfaas_functions::FunctionManifest;
use htfaas_functions::manifest::{RateLimit, Trigger};
use htfaas_functions::proto::{EVENTS_STREAM, EVENTS_SUBJECT, JobRecord, StatsSnapshot};
use htfaas_tests::{start_stack, wait_for};
use std::collections::BTreeMap;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A guest that ends at once, successfully.
const NOOP_WAT: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

/// The demo manifest renamed to `name`, with `trigger`, writing to `/out/<name>/`.
fn function(module: &htfaas_functions::Digest, name: &str, trigger: Trigger) -> FunctionManifest {
    let mut m = demo_manifest(module.clone());
    m.name = name.into();
    m.trigger = trigger;
    m.outputs.dir = format!("/out/{name}/");
    m
}

/// A pool's successful dCache `transfer` write of `path` in the door session `session`, for
/// the file `pnfsid`: its event id is `dcache-billing:write:<pnfsid>/<session>`.
fn transfer_write(path: &str, pnfsid: &str, session: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "version": "1.0", "msgType": "transfer", "isWrite": "write", "isP2p": false,
        "status": {"code": 0, "msg": ""}, "cellName": "pool-a", "cellType": "pool", "cellDomain": "poolDomain",
        "session": format!("pool:pool-a@poolDomain:{session}"), "initiator": session,
        "transferPath": path, "billingPath": path, "pnfsid": pnfsid, "fileSize": 100,
    }))
    .expect("json")
}

fn event_id(pnfsid: &str, session: &str) -> String {
    format!("dcache-billing:write:{pnfsid}/{session}")
}

/// Fisher-Yates with a fixed xorshift64 seed: the same shuffle on every run.
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let j = usize::try_from(seed % (i as u64 + 1)).expect("fits");
        items.swap(i, j);
    }
}

/// Whether the gateway's consumer has nothing left to deliver or to be acked.
async fn consumer_drained(client: &htfaas::client::Client) -> bool {
    let Ok(nats) = client.nats().await else { return false };
    let js = async_nats::jetstream::new(nats);
    let Ok(stream) = js.get_stream(EVENTS_STREAM).await else { return false };
    let Ok(mut consumer) = stream.get_consumer::<async_nats::jetstream::consumer::pull::Config>("gateway").await else {
        return false;
    };
    consumer.info().await.is_ok_and(|i| i.num_pending == 0 && i.num_ack_pending == 0)
}

/// Jobs per (event id, function).
fn per_pair(jobs: &[JobRecord]) -> BTreeMap<(String, String), usize> {
    let mut pairs = BTreeMap::new();
    for j in jobs {
        *pairs.entry((j.event.id.clone(), j.function.clone())).or_default() += 1;
    }
    pairs
}

fn sum(a: &StatsSnapshot, b: &StatsSnapshot, f: impl Fn(&StatsSnapshot) -> u64) -> u64 {
    f(a) + f(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_twice_shuffled_across_a_gateway_restart_starts_one_job_per_event_and_function() {
    let (_dir, mut stack) = start_stack().await;
    let client = stack.client().expect("client");
    htfaas_tests::grant_out(&client).await;
    let noop = client.upload_module(wat::parse_str(NOOP_WAT).expect("wat")).await.expect("upload");
    // `all` fires on every event below, `both` only on those under /data/eo/both/.
    for m in [
        function(&noop, "all", Trigger::on_path("/data/eo/**")),
        function(&noop, "both", Trigger::on_rule(r#"path prefix "/data/eo/both/""#)),
    ] {
        client.register(&m).await.expect("register");
    }
    const N: usize = 24;
    let mut expected = BTreeMap::new();
    let mut messages = Vec::new();
    for i in 0..N {
        let dir = if i % 2 == 0 { "one" } else { "both" };
        let (path, pnfsid, session) =
            (format!("/data/eo/{dir}/f{i}.dat"), format!("0000EO{i:06}"), format!("door:webdav@d:{}", 1000 + i));
        let id = event_id(&pnfsid, &session);
        expected.insert((id.clone(), "all".to_owned()), 1);
        if dir == "both" {
            expected.insert((id, "both".to_owned()), 1);
        }
        let bytes = transfer_write(&path, &pnfsid, &session);
        messages.push(bytes.clone());
        messages.push(bytes);
    }
    shuffle(&mut messages, 0x5eed_0006);
    let (first, second) = messages.split_at(messages.len() / 2);
    for m in first {
        client.publish_event(EVENTS_SUBJECT, m.clone()).await.expect("publish");
    }
    // The first half read (firings committed, messages acked), the gateway restarts; what it
    // queued and had not yet submitted is dispatched by the next one.
    wait_for("the first half to be ingested", LIMIT, || async {
        let s = stack.gateway().stats.snapshot();
        (s.events_received >= first.len() as u64).then_some(())
    })
    .await;
    let before = stack.restart_gateway().await.expect("restart the gateway").stats.snapshot();
    for m in second {
        client.publish_event(EVENTS_SUBJECT, m.clone()).await.expect("publish");
    }
    let jobs = wait_for("every expected job, nothing left to deliver or dispatch", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        let done =
            jobs.len() >= expected.len() && stack.gateway().firings.pending() == 0 && consumer_drained(&client).await;
        done.then_some(jobs)
    })
    .await;
    // Nothing is left in flight (every message acked, every firing submitted, and a submit
    // answers only once the job is stored): a duplicate would be among these jobs now.
    assert_eq!(per_pair(&jobs), expected, "exactly one job per (event, function)");
    let after = client.stats().await.expect("stats");
    eprintln!("before the restart: {before:?}\nafter: {after:?}");
    // Each (event, function) was queued once, over both gateway processes, and submitted once.
    assert_eq!(sum(&before, &after, |s| s.firings_queued), expected.len() as u64);
    assert_eq!(sum(&before, &after, |s| s.jobs_submitted), expected.len() as u64);
    // Every copy was dropped on the firing table's key: none reached the storage (macaroons)
    // or the scheduler, which would have counted it in jobs_deduplicated beyond these.
    let dropped = sum(&before, &after, |s| s.firings_deduplicated);
    assert!(dropped >= expected.len() as u64, "each second copy of each firing: {dropped}");
    assert_eq!(sum(&before, &after, |s| s.jobs_deduplicated), dropped, "no copy reached the scheduler");
    assert!(sum(&before, &after, |s| s.events_duplicate) >= N as u64);
    assert_eq!((after.jobs_refused, after.transient_failures, after.firings_pending), (0, 0, 0), "{after:?}");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_delays_the_excess_and_a_debounce_runs_one_job_for_the_last_write() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    htfaas_tests::grant_out(&client).await;
    let noop = client.upload_module(wat::parse_str(NOOP_WAT).expect("wat")).await.expect("upload");
    let mut rated = function(&noop, "rated", Trigger::on_path("/data/rate/**"));
    rated.trigger.rate = Some(RateLimit { per_s: 2.0, burst: 1 });
    let mut debounced = function(&noop, "debounced", Trigger::on_path("/data/debounce/**"));
    debounced.trigger.debounce_s = Some(1);
    for m in [&rated, &debounced] {
        client.register(m).await.expect("register");
    }

    // Rate: 6 files at once; 2 per second with a burst of 1: all 6 run, over at least 2.5 s.
    for i in 0..6 {
        let m = transfer_write(&format!("/data/rate/f{i}"), &format!("0000RA{i:04}"), &format!("door:r:{i}"));
        client.publish_event(EVENTS_SUBJECT, m).await.expect("publish");
    }
    // Debounce: 5 writes to one file within 0.5 s: one job, for the last.
    let started = std::time::Instant::now();
    let mut last = String::new();
    for i in 0..5 {
        let session = format!("door:d:{i}");
        client
            .publish_event(EVENTS_SUBJECT, transfer_write("/data/debounce/one.dat", "0000DB0001", &session))
            .await
            .expect("publish");
        last = event_id("0000DB0001", &session);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() < Duration::from_millis(1000), "the writes came within the window");

    let jobs = wait_for("six rate-limited jobs and the debounced one", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        let rated = jobs.iter().filter(|j| j.function == "rated").count();
        let debounced = jobs.iter().filter(|j| j.function == "debounced").count();
        (rated >= 6 && debounced >= 1).then_some(jobs)
    })
    .await;
    let mut created: Vec<u64> = jobs.iter().filter(|j| j.function == "rated").map(|j| j.submitted_at_ms).collect();
    created.sort_unstable();
    let span = created.last().copied().unwrap_or(0) - created.first().copied().unwrap_or(0);
    assert!(span >= 2_000, "6 jobs at 2/s with a burst of 1 span 2.5 s, not {span} ms: {created:?}");
    // Nothing more comes: every firing is decided (none pending), four of them superseded, so
    // one debounced job, on the last write.
    wait_for("every firing decided", LIMIT, || async {
        let stats = client.stats().await.ok()?;
        (stats.firings_pending == 0 && stats.firings_superseded >= 4).then_some(())
    })
    .await;
    let jobs = client.jobs().await.expect("jobs");
    let debounced: Vec<&JobRecord> = jobs.iter().filter(|j| j.function == "debounced").collect();
    assert_eq!(debounced.len(), 1, "{debounced:#?}");
    assert_eq!(debounced[0].event.id, last);
    assert_eq!(jobs.iter().filter(|j| j.function == "rated").count(), 6, "none dropped, none twice");
    let stats = client.stats().await.expect("stats");
    assert_eq!(stats.firings_superseded, 4, "{stats:?}");
    assert_eq!(stats.firings_rate_delayed, 5, "{stats:?}");
    assert_eq!((stats.firings_queued, stats.jobs_submitted, stats.firings_pending), (11, 7, 0), "{stats:?}");
    stack.stop().await.expect("clean stop");
}
