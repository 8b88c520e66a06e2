//! Traces (issue 23) on the real stack: a CloudEvent's `traceparent` follows its event to the
//! gateway's span, the job record, the attempt's span on the EP, and `htfaas trace` rebuilds
//! the tree from a job id, the trace id or (for an event that brought none) the event id,
//! with the attempt's phases inside its wall time. A `traceparent` that does not parse is
//! ignored: the event gets the trace derived from its id.

use htfaas_functions::proto::{CLOUDEVENTS_SUBJECT_PREFIX, JobRecord, JobState};
use htfaas_functions::trace::{GATEWAY_SPAN, TraceParent};
use htfaas_tests::{guest_wasm, start_stack, wait_for};
use serde_json::json;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);
const SENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The headers of a binary-mode CloudEvent `id` about `path`, with `traceparent` when given.
fn ce_headers(id: &str, path: &str, traceparent: Option<&str>) -> Vec<(String, String)> {
    let mut h: Vec<(String, String)> = [
        ("ce-specversion", "1.0"),
        ("ce-id", id),
        ("ce-source", "//lab.example/daq"),
        ("ce-type", "org.example.daq.closed"),
        ("ce-subject", path),
        ("content-type", "application/json"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if let Some(t) = traceparent {
        h.push(("ce-traceparent".into(), t.into()));
    }
    h
}

async fn finished_job(client: &htfaas::client::Client, path: &str) -> JobRecord {
    wait_for(&format!("the job of {path} completed"), LIMIT, || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.event.path == path && j.state == JobState::Completed)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_traceparent_reaches_every_hop_and_trace_rebuilds_the_tree_with_the_runs_phases() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    // The inputs exist before the function does: only the published events fire it.
    for name in ["a.dat", "b.dat", "c.dat"] {
        client.put_bytes(b"traced".to_vec(), &format!("/data/raw/{name}")).await.expect("put");
    }
    htfaas_tests::events_settled(&client).await;
    let module = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("wasm")).await.expect("upload");
    // A run of a second: its `run` phase is long enough to be seen whatever the machine does.
    let manifest = htfaas_functions::FunctionManifest {
        name: "sleeper".into(),
        args: vec!["sleep".into(), "1".into()],
        ..htfaas::stack::demo_manifest(module)
    };
    client.register(&manifest).await.expect("register");
    let subject = format!("{CLOUDEVENTS_SUBJECT_PREFIX}.daq");
    let body = serde_json::to_vec(&json!({"kind": "write"})).expect("json");
    for (id, path, tp) in [
        ("t-a", "/data/raw/a.dat", Some(SENT)),
        ("t-b", "/data/raw/b.dat", None),
        ("t-c", "/data/raw/c.dat", Some("00-NOT-A-TRACE-01")),
    ] {
        client.publish_event_with_headers(&subject, &ce_headers(id, path, tp), body.clone()).await.expect("publish");
    }

    // The producer's trace: the job's event carries the gateway's span under it.
    let sent = TraceParent::parse(SENT).expect("the spec's example");
    let job = finished_job(&client, "/data/raw/a.dat").await;
    let gateway = sent.child(&format!("{GATEWAY_SPAN}sleeper"));
    assert_eq!(job.event.trace.as_deref(), Some(gateway.to_string().as_str()));
    assert!(job.event.seen_at_ms.is_some_and(|s| s <= job.submitted_at_ms), "{:?}", job.event);

    for what in [job.id.as_str(), "4bf92f3577b34da6a3ce929d0e0e4736"] {
        let view = client.trace(what).await.expect("the trace");
        assert_eq!(view.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        let names: Vec<&str> = view.spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(&names[..3], ["gateway.fire", "scheduler.queue", "ep.attempt"], "{view:?}");
        assert_eq!(view.spans[0].span_id, Some(gateway.span_id_hex()));
        assert_eq!(view.spans[2].span_id, Some(gateway.attempt_span(&job.id, 1).span_id_hex()));
        let attempt = view.spans[2].ms().expect("the attempt ended");
        let run = view.spans.iter().find(|s| s.name == "run").expect("the run phase").ms().expect("ended");
        assert!((1_000..=attempt).contains(&run), "run {run} ms of an attempt of {attempt} ms: {view:?}");
        let phases: u64 = view.spans.iter().filter(|s| s.depth == 3 && s.name != "report").filter_map(|s| s.ms()).sum();
        assert!(phases <= attempt, "the phases ({phases} ms) fit in the attempt ({attempt} ms)");
    }
    // The attempt's phases are in its history too.
    let history = client.job_history(&job.id).await.expect("history");
    assert!(history[0].usage.is_some_and(|u| u.phases.run_ms >= 1_000), "{history:?}");

    // No traceparent, or one that does not parse: the trace derived from the event's id, found
    // from the event id alone.
    for path in ["/data/raw/b.dat", "/data/raw/c.dat"] {
        let job = finished_job(&client, path).await;
        let derived = TraceParent::for_event(&job.event.id);
        assert_eq!(job.event.trace_parent().map(|t| t.trace_id), Some(derived.trace_id), "{:?}", job.event);
        let view = client.trace(&job.event.id).await.expect("the trace by event id");
        assert_eq!(view.trace_id, derived.trace_id_hex());
        assert_eq!(view.event.as_ref().map(|(_, p)| p.as_str()), Some(path));
    }
    stack.stop().await.expect("stop");
}
