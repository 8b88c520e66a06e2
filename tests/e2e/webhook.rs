//! Failure webhooks on the real stack, to an HTTPS receiver of the test's own (its
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
    let (addr, ca) = serve_tls(dir, app, stop).await;
    (format!("https://{addr}/hook"), ca)
}

/// Serves `app` over HTTPS on 127.0.0.1 with a certificate of a CA made under `dir`, until
/// `stop`: its address and the CA file.
async fn serve_tls(
    dir: &std::path::Path,
    app: axum::Router,
    stop: CancellationToken,
) -> (std::net::SocketAddr, std::path::PathBuf) {
    let pki = htfaas::pki::make(dir, "webhook receiver", &["127.0.0.1".into()]).expect("a CA");
    let config = htfaas_functions::serve::tls::server_config(&pki.cert_file, &pki.key_file).expect("tls");
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = tcp.local_addr().expect("addr");
    let listener = htfaas_functions::serve::tls::TlsListener::new(tcp, config);
    tokio::spawn(htfaas_functions::serve::serve(listener, app, Default::default(), stop));
    (addr, pki.ca_file)
}

/// A stack whose gateway may call webhooks at the host and port of `url` (127.0.0.1, listed as
/// a host, so its loopback address is the site's word), trusting the CA `ca`.
async fn stack_calling(url: &str, ca: &std::path::Path) -> (tempfile::TempDir, htfaas::stack::Stack) {
    let url = reqwest::Url::parse(url).expect("receiver URL");
    let host = format!("{}:{}", url.host_str().expect("host"), url.port().expect("port"));
    start_stack_with(|o| {
        o.gateway_settings.insert("webhook_hosts".into(), serde_json::json!([host]));
        o.gateway_settings.insert("webhook_ca_file".into(), serde_json::json!(ca));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_is_posted_signed_to_its_webhook_again_after_a_503_and_a_completed_one_is_not() {
    let hook_dir = tempfile::tempdir().expect("tempdir");
    let got: Received = Arc::default();
    let stop = CancellationToken::new();
    let (url, ca) = receiver(hook_dir.path(), got.clone(), stop.clone()).await;
    let (_dir, stack) = stack_calling(&url, &ca).await;
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
    let metrics = wait_for("both deliveries counted", LIMIT, || async {
        let text = htfaas_tests::gateway_metrics(&info).await?;
        text.contains(r#"htfaas_gateway_webhook_deliveries_total{outcome="delivered"} 2"#).then_some(text)
    })
    .await;
    assert!(metrics.contains(r#"htfaas_gateway_webhook_deliveries_total{outcome="given_up"} 0"#), "{metrics}");
    stop.cancel();
    stack.stop().await.expect("stop");
}

/// Sets the flag to false when dropped: a handler cancelled (its connection dropped) is no
/// longer under way either.
struct Reset(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Reset {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A receiver whose `/slow` answers only once `/fast` was called (or after 30 s), and whose
/// `/fast` records whether a `/slow` was under way when it came. Returns its base URL, its CA
/// file, whether a `/slow` is under way, and the records.
async fn slow_and_fast(dir: &std::path::Path, stop: CancellationToken) -> Receiver {
    use std::sync::atomic::{AtomicBool, Ordering};
    let slow_under_way = Arc::new(AtomicBool::new(false));
    let fast_came = Arc::new(tokio::sync::Notify::new());
    let seen: Arc<Mutex<Vec<bool>>> = Arc::default();
    let (under_way, came) = (slow_under_way.clone(), fast_came.clone());
    let slow = axum::routing::post(move || {
        let (under_way, came) = (under_way.clone(), came.clone());
        async move {
            under_way.store(true, Ordering::SeqCst);
            let _reset = Reset(under_way.clone());
            let _ = tokio::time::timeout(Duration::from_secs(30), came.notified()).await;
            StatusCode::NO_CONTENT
        }
    });
    let (under_way, came, record) = (slow_under_way.clone(), fast_came.clone(), seen.clone());
    let fast = axum::routing::post(move || {
        let (under_way, came, record) = (under_way.clone(), came.clone(), record.clone());
        async move {
            record.lock().expect("lock").push(under_way.load(Ordering::SeqCst));
            came.notify_one();
            StatusCode::NO_CONTENT
        }
    });
    let app = axum::Router::new().route("/slow", slow).route("/fast", fast);
    let (addr, ca) = serve_tls(dir, app, stop).await;
    (format!("https://{addr}"), ca, slow_under_way, seen)
}

/// [`slow_and_fast`]'s base URL, CA file, `/slow` under way, and what `/fast` saw.
type Receiver = (String, std::path::PathBuf, Arc<std::sync::atomic::AtomicBool>, Arc<Mutex<Vec<bool>>>);

/// Deliveries go out side by side: while one receiver keeps a delivery waiting (up to the
/// gateway's 10 s timeout), another function's failure is delivered to another receiver. One at
/// a time, the second would come only after the first's timeout, when it is no longer under way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_receiver_holds_up_no_other_functions_delivery() {
    use std::sync::atomic::Ordering;
    let hook_dir = tempfile::tempdir().expect("tempdir");
    let stop = CancellationToken::new();
    let (base, ca, slow_under_way, seen) = slow_and_fast(hook_dir.path(), stop.clone()).await;
    let (_dir, stack) = stack_calling(&base, &ca).await;
    let client = stack.client().expect("client");
    let module = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("wasm")).await.expect("upload");
    let key = BTreeMap::from([(Webhook::DEFAULT_KEY_SECRET.to_owned(), KEY.to_owned())]);
    for name in ["slow", "fast"] {
        let m = htfaas_functions::FunctionManifest {
            name: format!("{name}hook"),
            args: vec!["exit".into(), "3".into()],
            trigger: htfaas_functions::manifest::Trigger::on_path(format!("/data/{name}/**")),
            webhook: Some(Webhook { url: format!("{base}/{name}"), key_secret: Webhook::DEFAULT_KEY_SECRET.into() }),
            ..htfaas::stack::demo_manifest(module.clone())
        };
        client.register(&m).await.expect("register");
        client.set_function_secrets(&m.name, &key).await.expect("the key");
    }
    // The slow receiver's delivery first, and under way...
    client.put_bytes(b"x".to_vec(), "/data/slow/a.dat").await.expect("upload");
    wait_for("the slow delivery under way", LIMIT, || async { slow_under_way.load(Ordering::SeqCst).then_some(()) })
        .await;
    // ... then the other function's failure: delivered while the first still waits.
    client.put_bytes(b"x".to_vec(), "/data/fast/a.dat").await.expect("upload");
    let seen = wait_for("the fast delivery", LIMIT, || async {
        let seen = seen.lock().expect("lock");
        (!seen.is_empty()).then(|| seen.clone())
    })
    .await;
    assert!(seen[0], "the slow delivery was still under way when the fast one came");
    stop.cancel();
    stack.stop().await.expect("stop");
}
