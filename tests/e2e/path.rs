//! The whole path: an upload fires the registered function, its output lands in storage, the
//! run is recorded and accounted; events that should not fire, don't. Every job here runs with
//! macaroons bound to its EP's address (the stack's gateway asks for it), and what an EP is
//! handed is checked from the EP's side of the link.

use crate::probe_ep::{attach_probe, next_msg};
use futures_util::SinkExt as _;
use htfaas::stack::demo_manifest;
use htfaas_functions::macaroon::{attenuate, inspect};
use htfaas_functions::proto::{
    EVENTS_SUBJECT, EpMsg, JobAssignment, JobReport, JobState, Outcome, SchedulerMsg, Usage,
};
use htfaas_tests::{adler32_hex, guest_wasm, start_stack, upload_checksum, wait_for};
use reqwest::StatusCode;
use sha2::Digest as _;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_runs_the_function_and_its_output_lands_in_storage() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let (output, elapsed) = htfaas::stack::demo(&client, &guest_wasm("checksum"), LIMIT).await.expect("demo path");
    println!("upload to output: {elapsed:?}");

    // The output is right for the bytes the demo uploaded.
    let out: serde_json::Value = serde_json::from_str(&output).expect("output is JSON");
    let name = out["file"].as_str().expect("file name").to_owned();
    let input = client.get_bytes(&format!("/data/raw/{name}")).await.expect("get").expect("input exists");
    assert_eq!(out["size"], input.len());
    assert_eq!(out["sha256"], hex::encode(sha2::Sha256::digest(&input)));
    assert_eq!(out["adler32"], adler32_hex(&input));

    // The run is recorded, with usage, and accounted to the function's owner. The output is
    // stored before the EP's report reaches the scheduler: wait for the job's end itself.
    let jobs = wait_for("the job's end recorded", LIMIT, || async {
        let jobs = client.jobs().await.expect("jobs");
        jobs.iter().all(|j| !matches!(j.state, JobState::Idle | JobState::Running)).then_some(jobs)
    })
    .await;
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    let job = &jobs[0];
    assert_eq!(job.state, JobState::Completed, "{job:#?}");
    // ... with macaroons bound to the EP (what it is handed then: the test below).
    assert!(stack.gateway().bind_macaroons_to_ep, "the stack binds every job's macaroons to its EP");
    assert_eq!(job.owner, "alice");
    assert_eq!(job.function, "checksum");
    assert_eq!(job.event.path, format!("/data/raw/{name}"));
    assert_eq!(job.exit_code, Some(0));
    let usage = job.usage.expect("usage recorded");
    assert_eq!(usage.bytes_in, input.len() as u64);
    assert_eq!(usage.bytes_out, output.len() as u64);
    assert!(usage.wall_ms >= usage.cpu_ms / 2, "{usage:?}");
    assert!(usage.peak_memory_bytes > 0, "{usage:?}");
    assert_eq!(job.outputs.len(), 1);
    assert_eq!(job.outputs[0].path, format!("/data/checksums/{name}.checksums.json"));
    assert_eq!(job.outputs[0].sha256, hex::encode(sha2::Sha256::digest(output.as_bytes())));

    let accounts = client.accounting().await.expect("accounting");
    let alice = accounts.iter().find(|a| a.owner == "alice").expect("alice has an account");
    assert_eq!(alice.jobs_completed, 1);
    assert_eq!(alice.jobs_failed, 0);
    assert!(alice.core_seconds > 0.0);
    assert_eq!(alice.bytes_in, input.len() as u64);

    // Writing the output fired nothing more (it is outside the trigger), and nothing was refused.
    let stats = client.stats().await.expect("stats");
    assert_eq!(stats.jobs_submitted, 1, "{stats:?}");
    assert_eq!(stats.events_malformed, 0, "{stats:?}");
    // Its billing message went on /data/checksums/'s path subject, which no lane reads (no
    // trigger is bounded there): never read, so not even unmatched.
    assert_eq!((stats.events_received, stats.events_pending), (1, 0), "{stats:?}");
    stack.stop().await.expect("clean stop");
}

/// Through the real gateway, scheduler and storage, with this test as the EP (attached with an
/// annex token, so the job comes here): the macaroons it is handed end with `ip:` naming the
/// address it attached from; from there they read the input and write an output; the same
/// macaroons narrowed to any other address are refused by the storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eps_macaroons_are_bound_to_the_address_it_attached_from() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let mut ws = attach_probe(&stack, dir.path(), "bound").await;

    client.put_bytes(b"bound input".to_vec(), "/data/bound/in.dat").await.expect("put");
    let a: JobAssignment = match next_msg(&mut ws).await {
        SchedulerMsg::Assign(a) => a,
        other => panic!("expected an assign, got {other:?}"),
    };
    for m in [&a.input.as_ref().expect("an input").macaroon, &a.output.macaroon] {
        let caveats = inspect(m).expect("parses");
        let n = caveats.len();
        assert!(n >= 2 && caveats[n - 2].starts_with("before:"), "{caveats:?}");
        assert_eq!(caveats[n - 1], "ip:127.0.0.1", "{caveats:?}");
    }

    let http = htfaas_gateway::http_client().expect("client");
    let get = |macaroon: String| http.get(&a.input.as_ref().expect("an input").url).bearer_auth(macaroon).send();
    let put = |macaroon: String, name: &str| {
        http.put(format!("{}{name}", a.output.url)).bearer_auth(macaroon).body(b"out".to_vec()).send()
    };
    // From here (127.0.0.1), as handed out.
    let r = get(a.input.as_ref().expect("an input").macaroon.clone()).await.expect("GET");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.bytes().await.expect("body").as_ref(), b"bound input");
    assert!(put(a.output.macaroon.clone(), "from-the-ep").await.expect("PUT").status().is_success());
    // Narrowed to another address (TEST-NET-1), as if used from elsewhere: refused, both ways.
    let elsewhere = |m: &str| attenuate(m, &["ip:192.0.2.1"]).expect("attenuates");
    let r = get(elsewhere(&a.input.as_ref().expect("an input").macaroon)).await.expect("GET");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.expect("body").contains("ip:"), "refused for its address");
    let r = put(elsewhere(&a.output.macaroon), "from-elsewhere").await.expect("PUT");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(client.get_bytes("/data/bound-out/from-elsewhere").await.expect("get"), None);
    assert_eq!(client.get_bytes("/data/bound-out/from-the-ep").await.expect("get").as_deref(), Some(&b"out"[..]));

    let report = EpMsg::Finished(JobReport {
        input_sha256: None,
        job_id: a.job_id.clone(),
        outcome: Outcome::Exited { exit_code: 0 },
        usage: Usage::default(),
        outputs: vec![],
        log: String::new(),
        refs: Vec::new(),
        checkpoint: None,
    });
    ws.send(Message::text(serde_json::to_string(&report).expect("encode"))).await.expect("report");
    wait_for("the bound job to complete", LIMIT, || async {
        let jobs = client.jobs().await.expect("jobs");
        jobs.into_iter().find(|j| j.id == a.job_id && j.state == JobState::Completed)
    })
    .await;
    ws.close(None).await.expect("close");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_and_malformed_events_start_nothing_and_do_not_block_the_next() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");

    // Garbage, a read, a pool-to-pool copy, and a write outside every trigger.
    let write = |path: &str| {
        serde_json::json!({"msgType":"transfer","isWrite":"write","isP2p":false,"status":{"code":0,"msg":""},
            "transferPath": path, "pnfsid":"0000AAAA", "session": format!("s-{path}")})
        .to_string()
        .into_bytes()
    };
    let mut read = serde_json::from_slice::<serde_json::Value>(&write("/data/raw/r.dat")).expect("json");
    read["isWrite"] = "read".into();
    let mut p2p = serde_json::from_slice::<serde_json::Value>(&write("/data/raw/p.dat")).expect("json");
    p2p["isP2p"] = true.into();
    for bytes in [
        b"{not json".to_vec(),
        b"\xff\xfe binary".to_vec(),
        serde_json::to_vec(&read).expect("json"),
        serde_json::to_vec(&p2p).expect("json"),
        write("/data/elsewhere/x.dat"),
    ] {
        client.publish_event(EVENTS_SUBJECT, bytes).await.expect("publish");
    }
    // Then a real upload into the trigger: it must still run.
    client.put_bytes(b"after the garbage".to_vec(), "/data/raw/after.dat").await.expect("put");
    let out = wait_for("the output of the upload after the garbage", LIMIT, || async {
        client.get_bytes("/data/checksums/after.dat.checksums.json").await.expect("get")
    })
    .await;
    assert!(String::from_utf8_lossy(&out).contains(&adler32_hex(b"after the garbage")));

    let stats = client.stats().await.expect("stats");
    assert_eq!(stats.events_malformed, 2, "{stats:?}");
    // The p2p copy is ignored; the read is a Read event, which no trigger fires on.
    assert_eq!(stats.events_ignored, 1, "{stats:?}");
    // Unmatched: the read and the write elsewhere (on the plain subject: the default lane reads
    // every one). The job's own output upload went on its path subject, which no lane reads.
    assert_eq!(stats.events_unmatched, 2, "{stats:?}");
    assert_eq!(stats.jobs_submitted, 1, "{stats:?}");
    let jobs = client.jobs().await.expect("jobs");
    assert_eq!(jobs.len(), 1, "only the upload ran: {jobs:#?}");
    assert_eq!(jobs[0].event.path, "/data/raw/after.dat");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_event_starts_one_job() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");
    client.put_bytes(b"twice".to_vec(), "/data/raw/twice.dat").await.expect("put");
    wait_for("first job", LIMIT, || async {
        client.jobs().await.expect("jobs").iter().any(|j| j.state == JobState::Completed).then_some(())
    })
    .await;
    // dCache duplicates messages: publish the same billing message again, byte for byte.
    let nats = stack.nats_client().await.expect("nats");
    let js = async_nats::jetstream::new(nats);
    let mut stream = js.get_stream(htfaas_functions::proto::EVENTS_STREAM).await.expect("stream");
    let last = stream.info().await.expect("info").state.last_sequence;
    let mut payload = None;
    for seq in 1..=last {
        let m = stream.get_raw_message(seq).await.expect("stored message");
        let v: serde_json::Value = serde_json::from_slice(&m.payload).expect("our storage writes JSON");
        if v["transferPath"] == "/data/raw/twice.dat" {
            payload = Some(m.payload);
        }
    }
    let payload = payload.expect("the upload's billing message is in the stream");
    client.publish_event(EVENTS_SUBJECT, payload.to_vec()).await.expect("republish");
    wait_for("the duplicate to be seen", LIMIT, || async {
        (client.stats().await.expect("stats").jobs_deduplicated == 1).then_some(())
    })
    .await;
    assert_eq!(client.jobs().await.expect("jobs").len(), 1);
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_functions_are_recorded_with_their_reason_and_the_ep_keeps_serving() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let register = |name: &'static str, wat: &'static str, runtime_s: u64| {
        let client = client.clone();
        async move {
            let wasm = wat::parse_str(wat).expect("valid wat");
            let mut m = demo_manifest(client.upload_module(wasm).await.expect("upload"));
            m.name = name.into();
            m.trigger.path = format!("/data/{name}/**");
            m.outputs.dir = format!("/data/{name}-out/");
            m.resources.runtime_s = runtime_s;
            client.register(&m).await.expect("register");
        }
    };
    register("trap", r#"(module (memory (export "memory") 1) (func (export "_start") unreachable))"#, 10).await;
    register("spin", r#"(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))"#, 1).await;
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");

    client.put_bytes(b"x".to_vec(), "/data/trap/x").await.expect("put");
    client.put_bytes(b"y".to_vec(), "/data/spin/y").await.expect("put");
    client.put_bytes(b"z".to_vec(), "/data/raw/z").await.expect("put");
    let jobs = wait_for("three finished jobs", LIMIT, || async {
        let jobs = client.jobs().await.expect("jobs");
        (jobs.len() == 3 && jobs.iter().all(|j| matches!(j.state, JobState::Completed | JobState::Failed)))
            .then_some(jobs)
    })
    .await;
    let by_function = |f: &str| jobs.iter().find(|j| j.function == f).expect("job of function");
    let trap = by_function("trap");
    assert_eq!(trap.state, JobState::Failed);
    assert!(trap.reason.contains("trapped"), "{trap:#?}");
    let spin = by_function("spin");
    assert_eq!(spin.state, JobState::Failed);
    assert!(spin.reason.contains("wall-time limit"), "{spin:#?}");
    assert!(spin.usage.expect("usage").wall_ms >= 1000, "{spin:#?}");
    assert_eq!(by_function("checksum").state, JobState::Completed);
    // Failed runs are still accounted: they used the machine.
    let alice = client.accounting().await.expect("accounting").into_iter().find(|a| a.owner == "alice").expect("alice");
    assert_eq!((alice.jobs_completed, alice.jobs_failed), (1, 2));
    // No output of the failed runs.
    assert_eq!(client.get_bytes("/data/trap-out/x").await.expect("get"), None);
    stack.stop().await.expect("clean stop");
}

/// Figures, not a pass/fail: `cargo test -p htfaas-tests --test e2e upload_to_output_latency -- --ignored --nocapture`
/// uploads small files one at a time through the whole stack and prints p50/p90/max of upload → output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run explicitly"]
async fn upload_to_output_latency() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");
    let n = 50;
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let started = std::time::Instant::now();
        client.put_bytes(format!("small file {i}").into_bytes(), &format!("/data/raw/f{i}.dat")).await.expect("put");
        let out = format!("/data/checksums/f{i}.dat.checksums.json");
        // Poll every 2 ms: the figure's resolution.
        while client.get_bytes(&out).await.expect("get").is_none() {
            assert!(started.elapsed() < LIMIT, "no output for f{i}");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        samples.push(started.elapsed());
    }
    let first = samples[0];
    samples.sort();
    let pct = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    println!(
        "upload->output, {n} small files, sequential: first {:.1} ms, p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        first.as_secs_f64() * 1e3,
        pct(50).as_secs_f64() * 1e3,
        pct(90).as_secs_f64() * 1e3,
        samples[n - 1].as_secs_f64() * 1e3
    );
    stack.stop().await.expect("clean stop");
}
