//! `htfaas bench`'s own measurement path, small: a stack started by the bench, 10 events one
//! at a time through the checksum function, then a short throughput run of the no-op. The
//! figures must be the ones the bench promises (names, counts, units), consistent with each
//! other (a function starts before its output is stored), and every published event must have
//! completed (the run drains, nothing lost). An integration test of the root package, like the
//! crash harness's: the bench runs each component as a process of the `htfaas` binary
//! (`CARGO_BIN_EXE_htfaas`). The test command builds the example guests first.

use htfaas::bench::{Figure, e2e};
use htfaas_functions::store::Durability;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The example guests built for wasm32-wasip1 (by the test command, before the tests).
fn wasm_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/target/wasm32-wasip1/release")
}

/// The `htfaas` binary whose subcommands run the components.
fn htfaas() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_htfaas"))
}

fn get<'a>(figures: &'a [Figure], metric: &str) -> &'a Figure {
    figures.iter().find(|f| f.metric == metric).unwrap_or_else(|| panic!("no {metric} in {figures:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bench_measures_latency_and_throughput_on_a_real_stack() {
    let modules = e2e::Modules::load(&wasm_dir()).expect("modules");
    let mut bench = e2e::Bench::start(&modules, htfaas(), &[2], Durability::Log, None).await.expect("start");
    let mut figures = Vec::new();
    let lat = e2e::latency(&mut bench, 10, 2, 1024, "", &mut |f| figures.push(f)).await.expect("latency");
    let rate =
        e2e::throughput(&mut bench, "noop", 1024, "", Duration::from_millis(500), Duration::from_secs(2), &mut |f| {
            figures.push(f)
        })
        .await
        .expect("throughput");
    bench.stop().await.expect("stop");

    let out = get(&figures, "event_to_output_p50");
    assert_eq!(out.n, 10);
    assert_eq!(out.unit, "ms");
    assert_eq!(out.extra["durability"], "log");
    assert_eq!(out.value, lat.p50_ms);
    assert!(lat.p50_ms > 0.0 && lat.p50_ms <= lat.p99_ms, "{lat:?}");
    let start = get(&figures, "event_to_start_p50");
    assert_eq!(start.n, 10, "every guest stamped its start");
    assert!(
        start.value > 0.0 && start.value < out.value,
        "a function starts before its output is stored: {figures:#?}"
    );
    assert!(get(&figures, "hop.event_to_submitted_p50").value >= 0.0);

    let tp = get(&figures, "throughput_noop");
    assert_eq!(tp.value, rate);
    assert!(rate > 0.0, "{tp:?}");
    assert!(tp.n > 0);
    assert!(tp.extra["published"].as_u64().expect("published") >= tp.n, "{tp:?}");
    // CPU per event, per process, and their sum over the htfaas processes.
    let cpu = |who: &str| get(&figures, &format!("throughput_noop.cpu_ms_per_event.{who}")).value;
    let parts: f64 = e2e::HTFAAS_PROCESSES.iter().map(|p| cpu(p)).sum();
    assert!((cpu("htfaas") - parts).abs() < 1e-9, "htfaas is the sum of {:?}: {figures:#?}", e2e::HTFAAS_PROCESSES);
    assert!(cpu("scheduler") > 0.0 && cpu("gateway") > 0.0 && cpu("ep") > 0.0, "{figures:#?}");
    get(&figures, "throughput_noop.cpu_ms_per_event.nats_server");
    get(&figures, "throughput_noop.cpu_ms_per_event.publisher");
    // Context switches per event, per process, summed the same way.
    let switches = |who: &str| get(&figures, &format!("throughput_noop.switches_per_event.{who}")).value;
    let parts: f64 = e2e::HTFAAS_PROCESSES.iter().map(|p| switches(p)).sum();
    assert!((switches("htfaas") - parts).abs() < 1e-9, "{figures:#?}");
    assert!(switches("ep") > 0.0 && switches("scheduler") > 0.0, "every job is handed between threads: {figures:#?}");
    let depth = get(&figures, "throughput_noop.queue.scheduler_idle_max");
    assert!(depth.n >= 2, "sampled through the window: {depth:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_fsync_stack_starts_and_a_bench_of_an_unknown_function_is_refused() {
    let modules = e2e::Modules::load(&wasm_dir()).expect("modules");
    let mut bench = e2e::Bench::start(&modules, htfaas(), &[1, 1], Durability::Fsync, None).await.expect("start");
    let e = e2e::throughput(&mut bench, "nope", 10, "", Duration::ZERO, Duration::from_secs(1), &mut |_| {})
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("no bench function nope"), "{e:#}");
    assert_eq!(bench.durability(), Durability::Fsync);
    bench.stop().await.expect("stop");
}

/// `htfaas bench` stopped by SIGTERM while its stack runs stops that stack: no component it
/// started outlives it, and it says it was interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signalled_bench_stops_the_stack_it_started() {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = tokio::process::Command::new(htfaas())
        .args(["bench", "--quick", "--no-peer", "--no-fsync", "--no-components", "--no-scaling", "--no-native"])
        .args(["--no-end-costs", "--flood", "0", "--window-s", "30"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the bench");
    let pid = child.id().expect("pid");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    // The stack is up and measuring once the no-op window starts.
    while let Some(line) = lines.next_line().await.expect("read stderr") {
        if line.contains("throughput_noop: window of") {
            break;
        }
    }
    let children = |pid: u32| -> Vec<u32> {
        let out = std::process::Command::new("pgrep").args(["-P", &pid.to_string()]).output().expect("pgrep");
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse().ok()).collect()
    };
    let started = children(pid);
    assert!(started.len() >= 5, "nats-server, storage, scheduler, gateway, ep: {started:?}");
    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill");
    assert!(status.success());
    let mut said = String::new();
    while let Some(line) = lines.next_line().await.expect("read stderr") {
        said.push_str(&line);
        said.push('\n');
    }
    let exit = child.wait().await.expect("wait");
    assert!(!exit.success(), "an interrupted bench fails: {said}");
    assert!(said.contains("interrupted"), "{said}");
    for p in started {
        // Reaped by the bench before it exited, or at least dead (not a zombie we would see as
        // alive: a killed child of an exited parent is reaped by init).
        let alive = std::fs::read_to_string(format!("/proc/{p}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')));
        assert!(!alive, "component {p} outlived the bench: {said}");
    }
}
