//! The gateway's admin proxies to the scheduler: what reaches the scheduler (path, token, body)
//! and what is refused before it (admin token, path segments, verbs, bodies).
//!
//! A fake scheduler on `127.0.0.1:0` records every request and answers with a canned body.

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use htfaas_gateway::{Config, api};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "gateway-admin";
const SCHEDULER_ADMIN: &str = "scheduler-admin";

/// One request as the fake scheduler saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    /// Raw path, still percent-encoded.
    path: String,
    auth: String,
    body: Value,
}

type Log = Arc<Mutex<Vec<Seen>>>;

async fn fake_scheduler(
    State(log): State<Log>,
    req: Request,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let bytes = axum::body::to_bytes(req.into_body(), 1 << 20).await.unwrap_or_else(|_| Bytes::new());
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    log.lock().expect("log lock").push(Seen { method, path: path.clone(), auth, body });
    let json = [("content-type", "application/json")];
    if path.starts_with("/v1/jobs/unknown") {
        return (StatusCode::NOT_FOUND, json, json!({"error": "job unknown not found"}).to_string());
    }
    (StatusCode::OK, json, json!({"echo": path}).to_string())
}

struct Harness {
    base: String,
    log: Log,
    http: reqwest::Client,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Harness {
    async fn start() -> Harness {
        let shutdown = CancellationToken::new();
        let log: Log = Arc::default();
        let sched = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind scheduler");
        let sched_addr = sched.local_addr().expect("addr");
        let app = axum::Router::new().fallback(fake_scheduler).with_state(log.clone());
        let s = shutdown.clone();
        tokio::spawn(async move { axum::serve(sched, app).with_graceful_shutdown(s.cancelled_owned()).await });

        let dir = tempfile::tempdir().expect("tempdir");
        let config: Config = serde_json::from_value(json!({
            "listen": "127.0.0.1:0",
            "nats_url": "nats://127.0.0.1:1",
            "registry_dir": dir.path().join("registry"),
            "storage_url": "http://127.0.0.1:1",
            "storage_user": "gateway",
            "scheduler_url": format!("http://{sched_addr}"),
            "scheduler_admin_token": SCHEDULER_ADMIN,
            "signing_key_file": dir.path().join("submit.pem"),
            "admin_token": ADMIN,
        }))
        .expect("config");
        let settings = config.resolve().await.expect("resolve");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind gateway");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let app = api::router(settings.shared());
        let s = shutdown.clone();
        tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(s.cancelled_owned()).await });
        Harness { base, log, http: reqwest::Client::new(), shutdown, _dir: dir }
    }

    /// Sends as admin; returns status and JSON body.
    async fn send(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(ADMIN);
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b.to_owned());
        }
        let resp = req.send().await.expect("send");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.log.lock().expect("log lock"))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

#[tokio::test]
async fn admin_views_and_actions_reach_the_scheduler_with_its_token() {
    let h = Harness::start().await;
    let cases: [(&str, &str, Option<&str>, &str); 9] = [
        ("GET", "/v1/jobs/j-1/history", None, "/v1/jobs/j-1/history"),
        ("GET", "/v1/jobs/j-1/log", None, "/v1/jobs/j-1/log"),
        ("GET", "/v1/jobs/j-1/analyze", None, "/v1/jobs/j-1/analyze"),
        ("POST", "/v1/jobs/j-1/hold", Some(r#"{"reason":"r"}"#), "/v1/jobs/j-1/hold"),
        ("GET", "/v1/eps", None, "/v1/eps"),
        ("POST", "/v1/eps/ep-1/drain", Some(r#"{"reason":"r","deadline_s":7200}"#), "/v1/eps/ep-1/drain"),
        ("POST", "/v1/eps/ep%20one/pause", Some(r#"{"reason":"r","group":"g"}"#), "/v1/eps/ep%20one/pause"),
        ("GET", "/v1/priorities", None, "/v1/priorities"),
        ("POST", "/v1/accounting/alice%40lab/factor", Some(r#"{"factor":2.5}"#), "/v1/accounting/alice%40lab/factor"),
    ];
    for (method, path, body, forwarded) in cases {
        let (status, answer) = h.send(method, path, body).await;
        assert_eq!(status, 200, "{method} {path}: {answer}");
        assert_eq!(answer, json!({"echo": forwarded}), "{method} {path}");
        let seen = h.take();
        assert_eq!(seen.len(), 1, "{method} {path}: {seen:?}");
        assert_eq!(seen[0].method, method);
        assert_eq!(seen[0].path, forwarded);
        assert_eq!(seen[0].auth, format!("Bearer {SCHEDULER_ADMIN}"));
        let expected = body.map(|b| serde_json::from_str(b).expect("json")).unwrap_or(Value::Null);
        assert_eq!(seen[0].body, expected, "{method} {path}");
    }
    // The scheduler's refusal is relayed as it is.
    let (status, answer) = h.send("GET", "/v1/jobs/unknown/history", None).await;
    assert_eq!((status, answer), (404, json!({"error": "job unknown not found"})));
}

#[tokio::test]
async fn bad_requests_are_refused_before_the_scheduler() {
    let h = Harness::start().await;
    let drain = Some(r#"{"reason":"r"}"#);
    let cases: [(&str, &str, Option<&str>, u16, &str); 8] = [
        ("GET", "/v1/jobs/j-1/hold", None, 404, r#"no job view "hold" (history, analyze, log)"#),
        ("GET", "/v1/jobs/j_1/history", None, 400, r#"bad job id "j_1": want [A-Za-z0-9-]"#),
        ("POST", "/v1/eps/ep-1/reboot", drain, 404, r#"no EP action "reboot" (drain, disable, enable, pause, resume)"#),
        ("POST", "/v1/eps/a%2Fb/drain", drain, 400, r#"bad EP name "a/b": want 1 to 128 printable characters"#),
        ("POST", "/v1/eps/a%0Ab/drain", drain, 400, r#"bad EP name "a\nb""#),
        ("POST", "/v1/eps/ep-1/drain", Some(r#"{"reason":"r","deadline":1}"#), 400, "invalid EP action: unknown field"),
        (
            "POST",
            "/v1/accounting/alice/factor",
            Some(r#"{"factor":"high"}"#),
            400,
            "invalid factor request: invalid type",
        ),
        ("POST", "/v1/accounting/a%2Fb/factor", Some(r#"{"factor":2}"#), 400, r#"bad owner "a/b""#),
    ];
    for (method, path, body, status, error) in cases {
        let (got, answer) = h.send(method, path, body).await;
        let message = answer["error"].as_str().unwrap_or_default();
        assert_eq!(got, status, "{method} {path}: {answer}");
        assert!(message.starts_with(error), "{method} {path}: {message}");
    }
    let long = "e".repeat(129);
    let (got, _) = h.send("POST", &format!("/v1/eps/{long}/drain"), drain).await;
    assert_eq!(got, 400);
    assert!(h.take().is_empty(), "nothing reached the scheduler");

    // Without the admin token: 401, whatever else is wrong.
    for (method, path) in [("GET", "/v1/eps"), ("POST", "/v1/eps/a%2Fb/reboot"), ("GET", "/v1/jobs/j_1/analyze")] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let resp = h.http.request(method, format!("{}{path}", h.base)).send().await.expect("send");
        assert_eq!(resp.status().as_u16(), 401, "{path}");
    }
    assert!(h.take().is_empty(), "nothing reached the scheduler");
}
