//! The gateway's ingest rate: how many storage events per second become durable firings.
//!
//! `cargo bench -p htfaas-gateway --bench ingest` prints one JSON line per figure,
//! `{"bench":"ingest","case":..,"events":N,"firings":F,"seconds":..,"events_per_s":..}`:
//!
//! - `in_process_single`: decide (dCache billing JSON → event) + match (two functions'
//!   triggers, both true) + the durable insert into the firing table, one transaction (one
//!   fsync; WAL, `synchronous=FULL`) per event ([`Firings::insert`]), called directly, no NATS;
//!   N = 20,000. What the ingest did before group commit.
//! - `in_process_batched`: the same, the firings of [`BATCH_MAX`] events per transaction
//!   ([`Firings::insert_batch`], group commit), as the ingest loop does under load.
//! - `jetstream`: the sustained rate from JetStream publish to durable firing through the real
//!   durable consumer and ingest loop ([`htfaas_gateway::ingest::run`]: batch, decide, match,
//!   one transaction per batch, double-ack each), against a real nats-server, the publisher
//!   running at the same time; from the first publish to the last firing committed; N = 20,000.
//!   Also `publish_only_per_s` (how fast the publisher alone got its acks: an upper bound the
//!   consumer cannot beat) and `mean_batch` (messages per batch the loop made).
//! - `jetstream_lone`: an idle gateway, one event at a time: the median and worst time from
//!   publish to its firing committed, over 50 events (`ms_median`, `ms_max`). Batching must
//!   not make a lone event wait.
//!
//! The firing tables live in the system's temporary directory: its disk's fsync cost is most
//! of the per-event figure. The nats-server comes from the one harness,
//! `htfaas_functions::nats_server` (`$HTFAAS_NATS_SERVER`, else `.tools/venv/bin/`, else
//! `PATH`); the `jetstream` cases are skipped, with a message, when none is found. Without `--bench` (as `cargo test --benches`
//! runs it) every case runs with a few events and nothing is timed. No criterion on purpose
//! (build time).

use htfaas_functions::manifest::{Outputs, Resources, Trigger};
use htfaas_functions::nats_server::{NatsServer, find_binary};
use htfaas_functions::proto::EVENTS_SUBJECT;
use htfaas_functions::sources::{self, Decision, SourcePolicy};
use htfaas_functions::{FunctionManifest, Registry};
use htfaas_gateway::firing::{Firings, NewFirings, now_ms};
use htfaas_gateway::ingest::BATCH_MAX;
use htfaas_gateway::triggers::TriggerCache;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Longest the `jetstream` case waits for its events.
const DEADLINE: Duration = Duration::from_secs(600);

fn main() -> anyhow::Result<()> {
    let timed = std::env::args().any(|a| a == "--bench");
    let n = if timed { 20_000 } else { 50 };
    in_process(n, false, timed)?;
    in_process(n, true, timed)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    rt.block_on(jetstream(n, timed))
}

/// A successful dCache `transfer` write, its own file and session.
fn billing(i: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "version": "1.0", "msgType": "transfer", "isWrite": "write", "isP2p": false,
        "status": {"code": 0, "msg": ""}, "cellName": "pool-a", "cellType": "pool", "cellDomain": "poolDomain",
        "session": format!("pool:pool-a@poolDomain:{i}"), "initiator": format!("door:webdav@d:{i}"),
        "transferPath": format!("/data/raw/run{}/f{i}.h5", i % 100), "pnfsid": format!("0000{i:032X}"),
        "fileSize": 1_000_000 + i, "storageInfo": "exp:raw@osm",
    }))
    .expect("json")
}

/// A registry with two functions that both fire on every [`billing`] event.
fn registry(dir: &Path) -> anyhow::Result<Registry> {
    let registry = Registry::open(dir)?;
    let module = registry.put_module(b"\0asm\x01\0\0\0")?;
    for (name, trigger) in [
        ("checksum", Trigger::on_path("/data/raw/**")),
        ("hdf5", Trigger::on_rule(r#"path suffix ".h5" and size > 1kB"#)),
    ] {
        registry.register(FunctionManifest {
            runtime: Default::default(),
            command: Vec::new(),
            handler: false,
            retry: None,
            name: name.into(),
            owner: "alice".into(),
            module: module.clone(),
            trigger,
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
        })?;
    }
    Ok(registry)
}

fn report(case: &str, events: usize, firings: u64, seconds: f64, extra: &str) {
    let rate = events as f64 / seconds;
    println!(
        r#"{{"bench":"ingest","case":"{case}","events":{events},"firings":{firings},"seconds":{seconds:.3},"events_per_s":{rate:.0}{extra}}}"#
    );
}

/// Decide + match + insert, one transaction per event or per [`BATCH_MAX`] events.
fn in_process(n: usize, batched: bool, timed: bool) -> anyhow::Result<()> {
    let case = if batched { "in_process_batched" } else { "in_process_single" };
    let dir = tempfile::tempdir()?;
    let registry = registry(&dir.path().join("registry"))?;
    let triggers = TriggerCache::default();
    triggers.reload(&registry)?;
    let firings = Firings::open(&dir.path().join("firings.sqlite"), 7 * 86_400, 16)?;
    let policy = SourcePolicy::default();
    let messages: Vec<Vec<u8>> = (0..n).map(billing).collect();
    let started = Instant::now();
    let mut queued = 0;
    for (c, chunk) in messages.chunks(if batched { BATCH_MAX } else { 1 }).enumerate() {
        let mut batch = Vec::with_capacity(chunk.len());
        for (j, m) in chunk.iter().enumerate() {
            let i = c * chunk.len() + j;
            let Decision::Fire(e) = sources::decide(EVENTS_SUBJECT, None, m, &format!("nats-seq-{i}"), &policy)? else {
                anyhow::bail!("message {i} is no event");
            };
            let functions = triggers.matching(&e);
            anyhow::ensure!(functions.len() == 2, "both functions match");
            batch.push(NewFirings { event: *e, functions, replay: None });
        }
        queued += if batched {
            firings.insert_batch(&batch, now_ms())?.iter().map(|d| d.queued).sum::<u64>()
        } else {
            batch
                .iter()
                .map(|b| firings.insert(&b.event, &b.functions, None, now_ms()).map(|d| d.queued))
                .sum::<Result<u64, _>>()?
        };
    }
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(queued == 2 * n as u64, "{case}: queued {queued}");
    if timed {
        report(case, n, queued, seconds, "");
    } else {
        println!("{case}: ok (smoke; run `cargo bench` to time)");
    }
    Ok(())
}

async fn jetstream(n: usize, timed: bool) -> anyhow::Result<()> {
    let Some(binary) = find_binary() else {
        eprintln!("jetstream: skipped, no nats-server (set HTFAAS_NATS_SERVER)");
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let nats = NatsServer::start(&binary, &dir.path().join("nats"), 0)?;
    // A gateway resolved as usual (its storage and scheduler are never called: no dispatcher).
    registry(&dir.path().join("gateway/registry"))?;
    let config: htfaas_gateway::Config = serde_json::from_value(serde_json::json!({
        "listen": "127.0.0.1:0", "nats_url": nats.url(), "registry_dir": dir.path().join("gateway/registry"),
        "storage_url": "http://127.0.0.1:1", "storage_user": "gateway", "storage_secret": "s",
        "scheduler_url": "http://127.0.0.1:1", "scheduler_admin_token": "t",
        "signing_key_file": dir.path().join("gateway/submit.pem"), "admin_token": "a",
    }))?;
    let shared = config.resolve().await?.shared();
    let consumer = htfaas_gateway::ingest::connect(&nats.url(), "gateway", 20).await?;
    let shutdown = CancellationToken::new();
    let ingest = tokio::spawn(htfaas_gateway::ingest::run(consumer, shared.clone(), shutdown.clone()));

    let messages: Vec<Vec<u8>> = (0..n).map(billing).collect();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await?);
    let started = Instant::now();
    let publisher = tokio::spawn(async move {
        // Acks awaited in windows, as a storage publishing steadily would.
        let mut acks = Vec::with_capacity(256);
        for m in messages {
            acks.push(js.publish(EVENTS_SUBJECT, m.into()).await?);
            if acks.len() == 256 {
                for a in acks.drain(..) {
                    a.await?;
                }
            }
        }
        for a in acks {
            a.await?;
        }
        anyhow::Ok(started.elapsed())
    });
    let want = 2 * n as u64;
    while shared.stats.firings_queued.load(Ordering::Relaxed) < want {
        anyhow::ensure!(
            started.elapsed() < DEADLINE,
            "only {} firings after {DEADLINE:?}",
            shared.stats.firings_queued.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let published = publisher.await??.as_secs_f64();
    let s = shared.stats.snapshot();
    anyhow::ensure!(s.firings_queued == want && s.firings_deduplicated == 0, "{s:?}");
    anyhow::ensure!(s.ingest_batches > 0 && s.events_received == n as u64, "{s:?}");
    if timed {
        let mean_batch = s.events_received as f64 / s.ingest_batches as f64;
        let extra = format!(r#","publish_only_per_s":{:.0},"mean_batch":{mean_batch:.1}"#, n as f64 / published);
        report("jetstream", n, s.firings_queued, seconds, &extra);
    } else {
        println!("jetstream: ok (smoke; run `cargo bench` to time)");
    }

    // One event at a time on the now idle gateway: each waits for nothing but its own commit.
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await?);
    let lone = if timed { 50 } else { 3 };
    let mut took = Vec::with_capacity(lone);
    for i in n..n + lone {
        let before = shared.stats.firings_queued.load(Ordering::Relaxed);
        let at = Instant::now();
        js.publish(EVENTS_SUBJECT, billing(i).into()).await?.await?;
        while shared.stats.firings_queued.load(Ordering::Relaxed) < before + 2 {
            anyhow::ensure!(at.elapsed() < Duration::from_secs(30), "lone event {i} not fired");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        took.push(at.elapsed().as_secs_f64() * 1000.0);
    }
    shutdown.cancel();
    ingest.await??;
    took.sort_by(f64::total_cmp);
    if timed {
        let (median, max) = (took[took.len() / 2], took[took.len() - 1]);
        let extra = format!(r#","ms_median":{median:.2},"ms_max":{max:.2}"#);
        report("jetstream_lone", lone, 2 * lone as u64, took.iter().sum::<f64>() / 1000.0, &extra);
    } else {
        println!("jetstream_lone: ok (smoke; run `cargo bench` to time)");
    }
    drop(nats);
    Ok(())
}
