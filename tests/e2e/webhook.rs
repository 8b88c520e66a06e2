//! Failure webhooks (issue 23) on the real stack, to an HTTPS receiver of the test's own (its
//! own CA, on loopback): a failed job's notification is POSTed signed with the function's key,
//! tried again after the receiver's 503, and a completed job posts nothing. The key is a
//! secret of the function that its runs never get.

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use htfaas_functions::manifest::Webhook;
use htfaas_functions::proto::{
    JobNotification, JobState, WEBHOOK_DELIVERY_HEADER, WEBHOOK_SIGNATURE_HEADER, WEBHOOK_TIMESTAMP_HEADER,
    verify_webhook,
};
use htfaas_tests::{guest_wasm, start_stack_with, wait_for};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(60);
const KEY: &str = "a key only the developer and the gateway know";

/// What the receiver was sent: (headers, body) per request.
type Received = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

/// An HTTPS receiver on 127.0.0.1 with a certificate of a CA made under `dir`: it answers 503
/// to its first request and 204 to the others. Returns its URL and its CA file.
async fn receiver(dir: &std::path::Path, got: Received, stop: CancellationToken) -> (String, std::path::PathBuf) {
    let pki = htfaas::pki::make(dir, "webhook receiver", &["127.0.0.1".into()]).expect("a CA");
    let config = htfaas_functions::serve::tls::server_config(&pki.cert_file, &pki.key_file).expect("tls");
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = tcp.local_addr().expect("addr");
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let got = got.clone();
            async move {
                let mut got = got.lock().expect("lock");
                got.push((headers, body));
                if got.len() == 1 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::NO_CONTENT }
            }
        }),
    );
    let listener = htfaas_functions::serve::tls::TlsListener::new(tcp, config);
    tokio::spawn(htfaas_functions::serve::serve(listener, app, Default::default(), stop));
    (format!("https://{addr}/hook"), pki.ca_file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_is_posted_signed_to_its_webhook_again_after_a_503_and_a_completed_one_is_not() {
    let hook_dir = tempfile::tempdir().expect("tempdir");
    let got: Received = Arc::default();
    let stop = CancellationToken::new();
    let (url, ca) = receiver(hook_dir.path(), got.clone(), stop.clone()).await;
    let (_dir, stack) = start_stack_with(|o| {
        o.gateway_settings.insert("webhook_hosts".into(), serde_json::json!(["127.0.0.1"]));
        o.gateway_settings.insert("webhook_ca_file".into(), serde_json::json!(ca));
    })
    .await;
    let client = stack.client().expect("client");
    let module = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("wasm")).await.expect("upload");
    // `exit N` fails with N for an input named `fail…`: here every run exits with its arg.
    let manifest = |name: &str, code: &str| htfaas_functions::FunctionManifest {
        name: name.into(),
        args: vec!["exit".into(), code.into()],
        webhook: Some(Webhook { url: url.clone(), key_secret: Webhook::DEFAULT_KEY_SECRET.into() }),
        ..htfaas::stack::demo_manifest(module.clone())
    };
    let key = BTreeMap::from([(Webhook::DEFAULT_KEY_SECRET.to_owned(), KEY.to_owned())]);
    for (name, code) in [("fails", "3"), ("passes", "0")] {
        client.register(&manifest(name, code)).await.expect("register");
        client.set_function_secrets(name, &key).await.expect("the key");
    }
    client.put_bytes(b"x".to_vec(), "/data/raw/w.dat").await.expect("upload");

    // Two requests: the 503 and the try after it, the same delivery, each signed.
    let requests = wait_for("the webhook's second try", LIMIT, || async {
        let got = got.lock().expect("lock");
        (got.len() >= 2).then(|| got.clone())
    })
    .await;
    let mut deliveries = Vec::new();
    for (headers, body) in &requests {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let ts: u64 = header(WEBHOOK_TIMESTAMP_HEADER).parse().expect("a timestamp");
        let now = htfaas_functions::time::now_ms() / 1000;
        assert!(now.abs_diff(ts) < 300, "a fresh timestamp: {ts} at {now}");
        assert!(verify_webhook(KEY.as_bytes(), ts, body, &header(WEBHOOK_SIGNATURE_HEADER)), "signed with the key");
        assert!(!verify_webhook(b"another key", ts, body, &header(WEBHOOK_SIGNATURE_HEADER)));
        let n: JobNotification = serde_json::from_slice(body).expect("a JobNotification");
        assert_eq!(
            (n.function.as_str(), n.state, n.event.path.as_str()),
            ("fails", JobState::Failed, "/data/raw/w.dat")
        );
        deliveries.push(header(WEBHOOK_DELIVERY_HEADER));
        let job = client.job(&n.job_id).await.expect("the job");
        assert_eq!(job.state, JobState::Failed);
    }
    assert_eq!(deliveries[0], deliveries[1], "one delivery, tried twice");

    // The completed job of `passes` posted nothing: once it is completed, and a further
    // failure's delivery has come (so the feed has read past it), the receiver still holds
    // only `fails` notifications.
    wait_for("passes completed", LIMIT, || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.function == "passes" && j.state == JobState::Completed)
    })
    .await;
    client.put_bytes(b"y".to_vec(), "/data/raw/w2.dat").await.expect("upload");
    let all = wait_for("the second failure's delivery", LIMIT, || async {
        let got = got.lock().expect("lock");
        let paths: Vec<String> = got
            .iter()
            .filter_map(|(_, b)| serde_json::from_slice::<JobNotification>(b).ok())
            .map(|n| format!("{}:{}", n.function, n.event.path))
            .collect();
        paths.contains(&"fails:/data/raw/w2.dat".to_owned()).then_some(paths)
    })
    .await;
    assert!(all.iter().all(|p| p.starts_with("fails:")), "only failed jobs are posted: {all:?}");

    // Both deliveries counted on the gateway's /metrics (the 503 was tried again, not given up).
    let info = stack.info().clone();
    let http = htfaas_gateway::http_client().expect("http");
    let metrics = wait_for("both deliveries counted", LIMIT, || async {
        let text = http
            .get(format!("{}/metrics", info.gateway_url))
            .bearer_auth(&info.admin_token)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.contains(r#"htfaas_gateway_webhook_deliveries_total{outcome="delivered"} 2"#).then_some(text)
    })
    .await;
    assert!(metrics.contains(r#"htfaas_gateway_webhook_deliveries_total{outcome="given_up"} 0"#), "{metrics}");
    stop.cancel();
    stack.stop().await.expect("stop");
}
