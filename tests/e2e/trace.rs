//! Traces on the real stack: a CloudEvent's `traceparent` follows its event to the
//! gateway's span, the job record, the attempt's span on the EP, and `htfaas trace` rebuilds
//! the tree from a job id, the trace id or (for an event that brought none) the event id,
//! with the attempt's phases inside its wall time. A `traceparent` that does not parse is
//! ignored: the event gets the trace derived from its id. With `otlp_endpoint` set, the
//! scheduler exports each ended job's spans to an OTLP/HTTP collector (here the test's own, on
//! loopback) with the same ids.

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
    assert_eq!(job.event.producer_span, Some(sent.span_id_hex()), "the producer's span: the gateway span's parent");

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
        assert_eq!(job.event.producer_span, None, "no producer span to hang under");
        let view = client.trace(&job.event.id).await.expect("the trace by event id");
        assert_eq!(view.trace_id, derived.trace_id_hex());
        assert_eq!(view.event.as_ref().map(|(_, p)| p.as_str()), Some(path));
    }
    stack.stop().await.expect("stop");
}

/// A collector on loopback: every OTLP/HTTP JSON body POSTed to `/v1/traces`.
async fn collector(got: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>) -> String {
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let got = got.clone();
            async move {
                if let Ok(v) = serde_json::from_slice(&body) {
                    got.lock().expect("lock").push(v);
                }
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1/traces")
}

/// (name, span id, parent span id) of each exported span of `trace_id`.
fn exported(bodies: &[serde_json::Value], trace_id: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for body in bodies {
        for rs in body["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for span in ss["spans"].as_array().into_iter().flatten() {
                    if span["traceId"].as_str().is_some_and(|t| t.eq_ignore_ascii_case(trace_id)) {
                        let field = |k: &str| span[k].as_str().unwrap_or_default().to_ascii_lowercase();
                        out.push((field("name"), field("spanId"), field("parentSpanId")));
                    }
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_exports_each_ended_jobs_spans_over_otlp_with_the_hops_ids() {
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let endpoint = collector(got.clone()).await;
    let (_dir, stack) = htfaas_tests::start_stack_with(|o| {
        o.scheduler_settings.insert("otlp_endpoint".into(), serde_json::json!(endpoint));
    })
    .await;
    let client = stack.client().expect("client");
    client.put_bytes(b"traced".to_vec(), "/data/raw/o.dat").await.expect("put");
    htfaas_tests::events_settled(&client).await;
    let digest = htfaas_tests::upload_checksum(&client).await;
    client.register(&htfaas::stack::demo_manifest(digest)).await.expect("register");
    let subject = format!("{CLOUDEVENTS_SUBJECT_PREFIX}.daq");
    let body = serde_json::to_vec(&json!({"kind": "write"})).expect("json");
    client
        .publish_event_with_headers(&subject, &ce_headers("o-1", "/data/raw/o.dat", Some(SENT)), body)
        .await
        .expect("publish");
    let job = finished_job(&client, "/data/raw/o.dat").await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let spans = wait_for("the job's spans at the collector", LIMIT, || async {
        let spans = exported(&got.lock().expect("lock"), trace_id);
        spans.iter().any(|(n, _, _)| n == "run").then_some(spans)
    })
    .await;
    let gateway = TraceParent::parse(SENT).expect("sent").child(&format!("{GATEWAY_SPAN}checksum"));
    let by_name = |name: &str| spans.iter().find(|(n, _, _)| n == name).cloned().unwrap_or_default();
    let (queue, attempt, run) = (by_name("scheduler.queue"), by_name("ep.attempt"), by_name("run"));
    assert_eq!(by_name("gateway.fire").1, gateway.span_id_hex(), "{spans:?}");
    let producer = TraceParent::parse(SENT).expect("sent").span_id_hex();
    assert_eq!(by_name("gateway.fire").2, producer, "the gateway under the producer's span");
    assert_eq!(queue.1, gateway.queue_span(&job.id).span_id_hex());
    assert_eq!(queue.2, gateway.span_id_hex(), "the queue under the gateway");
    assert_eq!(attempt.1, gateway.attempt_span(&job.id, 1).span_id_hex());
    assert_eq!(attempt.2, queue.1, "the attempt under the queue");
    assert_eq!(run.2, attempt.1, "the run under the attempt");
    // The same ids `htfaas trace` draws.
    let view = client.trace(&job.id).await.expect("trace");
    let ids: Vec<String> = view.spans.iter().filter_map(|s| s.span_id.clone()).collect();
    assert!(spans.iter().all(|(_, id, _)| ids.contains(id)), "{spans:?} vs {ids:?}");
    stack.stop().await.expect("stop");
}

/// A chain is one trace: the checksum of an upload writes a file, which fires a second
/// function; that job's event names the first job's as its cause, and its trace id is the first
/// event's, its gateway span a child of the first job's gateway span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_fired_by_anothers_output_joins_the_first_events_trace() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    htfaas_tests::grant_out(&client).await;
    let checksum = htfaas_tests::upload_checksum(&client).await;
    client.register(&htfaas::stack::demo_manifest(checksum.clone())).await.expect("register");
    let mut second = htfaas::stack::demo_manifest(checksum);
    second.name = "second".into();
    second.trigger.path = "/data/checksums/**".into();
    second.outputs.dir = "/out/second/".into();
    client.register(&second).await.expect("register the second");

    client.put_bytes(b"chained".to_vec(), "/data/raw/chain.dat").await.expect("upload");
    let first = finished_job(&client, "/data/raw/chain.dat").await;
    let written = first.outputs.first().expect("the checksum's output").path.clone();
    let chained = finished_job(&client, &written).await;
    let cause = chained.event.caused_by.as_ref().expect("the chained event's cause");
    assert_eq!((cause.function.as_str(), cause.event_id.as_str()), ("checksum", first.event.id.as_str()));
    let (a, b) = (first.event.trace_parent().expect("trace"), chained.event.trace_parent().expect("trace"));
    assert_eq!(a.trace_id, b.trace_id, "one trace for the chain");
    assert_ne!(a.span_id_hex(), b.span_id_hex());
    assert_eq!(cause.trace.as_deref(), first.event.trace.as_deref(), "under the first job's gateway span");
}
