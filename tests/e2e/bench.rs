//! `htfaas bench`'s own measurement path, small: a stack started by the bench, 10 events one
//! at a time through the checksum function, then a short throughput run of the no-op. The
//! figures must be the ones the bench promises (names, counts, units), consistent with each
//! other (a function starts before its output is stored), and every published event must have
//! completed (the run drains, nothing lost).

use htfaas::bench::{Figure, e2e};
use htfaas_functions::store::Durability;
use htfaas_tests::guest_wasm;
use std::time::Duration;

fn get<'a>(figures: &'a [Figure], metric: &str) -> &'a Figure {
    figures.iter().find(|f| f.metric == metric).unwrap_or_else(|| panic!("no {metric} in {figures:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bench_measures_latency_and_throughput_on_a_real_stack() {
    let wasm = guest_wasm("checksum");
    let modules = e2e::Modules::load(wasm.parent().expect("dir")).expect("modules");
    let mut bench = e2e::Bench::start(&modules, 2, Durability::Log, None).await.expect("start");
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
    let depth = get(&figures, "throughput_noop.queue.scheduler_idle_max");
    assert!(depth.n >= 2, "sampled through the window: {depth:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_fsync_stack_starts_and_a_bench_of_an_unknown_function_is_refused() {
    let wasm = guest_wasm("checksum");
    let modules = e2e::Modules::load(wasm.parent().expect("dir")).expect("modules");
    let mut bench = e2e::Bench::start(&modules, 1, Durability::Fsync, None).await.expect("start");
    let e = e2e::throughput(&mut bench, "nope", 10, "", Duration::ZERO, Duration::from_secs(1), &mut |_| {})
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("no bench function nope"), "{e:#}");
    assert_eq!(bench.durability(), Durability::Fsync);
    bench.stop().await.expect("stop");
}
