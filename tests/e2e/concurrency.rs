//! Limits per function on the real stack: a function with `max_concurrent: 2` never has three
//! runs at once under a burst, though its EP has room for six (the rest wait idle, none fails);
//! `jobs analyze` says why a waiting job waits, `/metrics` shows the function at its limit; a
//! `max_concurrent` of 0 is refused at registration.

use htfaas_functions::proto::JobState;
use htfaas_functions::{FunctionManifest, Resources};
use htfaas_tests::{grant_out, stack_secret, start_stack_with, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);
const BURST: usize = 8;

/// A guest that sleeps `ms` milliseconds in one `poll_oneoff` (relative monotonic clock), then
/// exits 0: long enough that runs started together overlap.
fn sleep_wat(ms: u64) -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const {ns}))
    (if (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)) (then unreachable))))"#,
        ns = ms * 1_000_000
    )
}

/// The most intervals `[start, end)` that overlap at one instant.
fn most_at_once(mut spans: Vec<(u64, u64)>) -> usize {
    let mut edges: Vec<(u64, i32)> = spans.drain(..).flat_map(|(s, e)| [(s, 1), (e, -1)]).collect();
    // An end before a start at the same instant: a run that ended as another started is not
    // at once with it.
    edges.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

#[test]
fn most_at_once_counts_overlaps_only() {
    assert_eq!(most_at_once(vec![(0, 10), (10, 20)]), 1);
    assert_eq!(most_at_once(vec![(0, 10), (5, 20), (6, 7)]), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_with_max_concurrent_2_never_runs_3_at_once_under_a_burst() {
    let (dir, stack) = start_stack_with(|o| o.ep_slots = Resources::new(6, 4096, 3600)).await;
    let client = stack.client().expect("client");
    let http = htfaas_gateway::http_client().expect("http");
    let scheduler_metrics = format!("{}/metrics", stack.info().scheduler_url);
    let scheduler_token = stack_secret(dir.path(), "scheduler_admin_token");
    grant_out(&client).await;
    let module = client.upload_module(wat::parse_str(sleep_wat(1500)).expect("wat")).await.expect("upload");
    let mut m: FunctionManifest = htfaas::stack::demo_manifest(module);
    m.name = "slow".into();
    m.outputs.dir = "/out/slow/".into();
    m.max_concurrent = Some(0);
    let refused = client.register(&m).await.expect_err("max_concurrent 0");
    assert!(format!("{refused:#}").contains("max_concurrent"), "{refused:#}");
    m.max_concurrent = Some(2);
    client.register(&m).await.expect("register");

    for i in 0..BURST {
        client.put_bytes(vec![b'x'; 16], &format!("/data/raw/{i}.dat")).await.expect("upload");
    }
    // While the burst runs: a waiting job says why, and the metrics show the function at its limit.
    let waiting = wait_for("a job that waits for the limit", LIMIT, || async {
        let idle = client.jobs().await.ok()?.into_iter().find(|j| j.function == "slow" && j.state == JobState::Idle)?;
        let analysis = client.job_analyze(&idle.id).await.ok()?;
        analysis.reasons.iter().any(|r| r.contains("max_concurrent is 2")).then_some(analysis)
    })
    .await;
    assert!(waiting.reasons.iter().any(|r| r.contains("function slow has 2 runs assigned")), "{waiting:#?}");
    let page = wait_for("the function at its limit on /metrics", LIMIT, || async {
        let resp = http.get(&scheduler_metrics).bearer_auth(&scheduler_token).send().await.ok()?;
        let page = resp.text().await.ok()?;
        (htfaas_tests::metric(&page, "htfaas_scheduler_function_runs", "function=\"slow\"") == Some(2.0))
            .then_some(page)
    })
    .await;
    assert_eq!(htfaas_tests::metric(&page, "htfaas_scheduler_function_max_concurrent", "function=\"slow\""), Some(2.0));

    let jobs = wait_for("every job of the burst to end", LIMIT, || async {
        let jobs: Vec<_> = client.jobs().await.ok()?.into_iter().filter(|j| j.function == "slow").collect();
        (jobs.len() == BURST && jobs.iter().all(|j| j.state.is_final())).then_some(jobs)
    })
    .await;
    assert!(jobs.iter().all(|j| j.state == JobState::Completed), "none fails: {jobs:#?}");
    // Each attempt's span as the scheduler recorded it, from its assignment to its report.
    let mut spans = Vec::new();
    for j in &jobs {
        for a in client.job_history(&j.id).await.expect("history") {
            spans.push((a.started_at_ms, a.ended_at_ms.expect("ended")));
        }
    }
    assert_eq!(most_at_once(spans), 2, "at most 2 at once, and the limit reached");
}
