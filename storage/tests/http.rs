//! In-process HTTP tests: the real server (`htfaas_storage::run`) on 127.0.0.1:0, driven with
//! reqwest (and raw TCP where reqwest would normalize the path for us).

use htfaas_functions::nats_server::{NatsServer, find_binary};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use htfaas_storage::{Config, run};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

const USERS: &str = r#"{"users":[
    {"name":"gateway","secret":"gw-secret","issue_macaroons":true,"paths":["/"]},
    {"name":"alice","secret":"alice-secret","issue_macaroons":false,"paths":["/data/"]},
    {"name":"carol","secret":"carol-secret","issue_macaroons":true,"paths":["/data/carol/"]}]}"#;

struct Server {
    addr: SocketAddr,
    base: String,
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Server {
    /// Where URL path `/data` lives: `data_dir/data`.
    fn data(&self) -> PathBuf {
        self.dir.path().join("ns/data")
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.handle)
            .await
            .expect("run() returns promptly after cancellation")
            .expect("task did not panic")
            .expect("run() returns Ok");
    }

    /// POST a macaroon request as `user`.
    async fn request_macaroon(&self, user: (&str, &str), path: &str, body: serde_json::Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .basic_auth(user.0, Some(user.1))
            .header("Content-Type", "application/macaroon-request")
            .body(body.to_string())
            .send()
            .await
            .expect("request sent")
    }

    async fn macaroon(&self, path: &str, caveats: &[&str], validity: &str) -> String {
        let r =
            self.request_macaroon(GATEWAY, path, serde_json::json!({"caveats": caveats, "validity": validity})).await;
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap_or_default());
        let v: serde_json::Value = r.json().await.expect("JSON");
        v["macaroon"].as_str().expect("macaroon string").to_owned()
    }

    /// An UPLOAD macaroon for the directory `path` issued for `writer` (the gateway's
    /// `X-Htfaas-Writer`).
    async fn writer_macaroon(&self, path: &str, writer: &str) -> String {
        let r = self
            .http
            .post(self.url(path))
            .basic_auth(GATEWAY.0, Some(GATEWAY.1))
            .header("Content-Type", "application/macaroon-request")
            .header("X-Htfaas-Writer", writer)
            .body(serde_json::json!({"caveats": ["activity:UPLOAD"], "validity": "PT1H"}).to_string())
            .send()
            .await
            .expect("request sent");
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap_or_default());
        let v: serde_json::Value = r.json().await.expect("JSON");
        v["macaroon"].as_str().expect("macaroon string").to_owned()
    }

    async fn get_bearer(&self, path: &str, m: &str) -> reqwest::Response {
        self.http.get(self.url(path)).bearer_auth(m).send().await.expect("sent")
    }

    async fn put_bearer(&self, path: &str, m: &str, body: &'static str) -> reqwest::Response {
        self.http.put(self.url(path)).bearer_auth(m).body(body).send().await.expect("sent")
    }
}

const GATEWAY: (&str, &str) = ("gateway", "gw-secret");
const ALICE: (&str, &str) = ("alice", "alice-secret");

fn client() -> reqwest::Client {
    // reqwest is built without a default crypto provider; install one (once per process).
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client builds")
}

fn config(dir: &Path, nats_url: Option<String>) -> Config {
    std::fs::write(dir.join("users.json"), USERS).expect("write users");
    Config {
        listen: "127.0.0.1:0".parse().expect("addr"),
        data_dir: dir.join("ns"),
        secret_file: dir.join("secret"),
        users_file: dir.join("users.json"),
        nats_url,
        nats_nkey_seed: None,
        events_stream_replicas: 1,
        public_url: None,
        tls_cert_file: None,
        tls_key_file: None,
        billing_path_subjects: true,
        cell_name: "htfaas-storage".into(),
        durability: Default::default(),
        // Short timeouts, so that the slow-client test ends soon.
        http: htfaas_functions::serve::Limits {
            header_read_timeout_s: 2,
            body_idle_timeout_s: 2,
            ..Default::default()
        },
    }
}

async fn start_with(dir: tempfile::TempDir, nats_url: Option<String>) -> Server {
    let settings = config(dir.path(), nats_url).resolve().await.expect("resolves");
    let addr = settings.local_addr();
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(run(settings, shutdown.clone()));
    Server { addr, base: format!("http://{addr}"), shutdown, handle, dir, http: client() }
}

async fn start() -> Server {
    start_with(tempfile::tempdir().expect("tempdir"), None).await
}

/// Sends a raw HTTP/1.1 request (so the path reaches the server exactly as written).
async fn raw_get(addr: SocketAddr, path: &str, user: (&str, &str)) -> (u16, String) {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", user.0, user.1));
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("status line");
    (status, text)
}

#[tokio::test]
async fn healthz_needs_no_auth() {
    let s = start().await;
    let r = s.http.get(s.url("/healthz")).send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::OK);
    s.stop().await;
}

#[tokio::test]
async fn basic_put_get_round_trip() {
    let s = start().await;
    let url = s.url("/data/a/b%20c.txt");
    let r = s.http.put(&url).basic_auth(ALICE.0, Some(ALICE.1)).body("hello").send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(std::fs::read(s.data().join("a/b c.txt")).expect("on disk"), b"hello");
    let r = s.http.get(&url).basic_auth(ALICE.0, Some(ALICE.1)).send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.bytes().await.expect("body"), "hello");
    // Overwrite by a Basic user within their paths.
    let r = s.http.put(&url).basic_auth(ALICE.0, Some(ALICE.1)).body("again").send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(std::fs::read(s.data().join("a/b c.txt")).expect("on disk"), b"again");
    // No temp files are left behind.
    let names: Vec<_> =
        std::fs::read_dir(s.data().join("a")).expect("dir").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");

    let r = s.http.get(&url).send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.headers().contains_key("www-authenticate"));
    let r = s.http.get(&url).basic_auth(ALICE.0, Some("wrong")).send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = s.http.get(s.url("/data/missing")).basic_auth(ALICE.0, Some(ALICE.1)).send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // Outside alice's paths, segment-aware.
    let r = s.http.put(s.url("/database/x")).basic_auth(ALICE.0, Some(ALICE.1)).body("x").send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = s.http.request(reqwest::Method::PATCH, &url).basic_auth(ALICE.0, Some(ALICE.1)).send().await;
    assert_eq!(r.expect("sent").status(), StatusCode::METHOD_NOT_ALLOWED);
    s.stop().await;
}

/// `DELETE` removes a file or an empty directory under a macaroon with `DELETE` for its
/// scope (a job's checkpoint area), or for a Basic user within their paths; a macaroon without
/// `DELETE`, one of another scope, a directory with entries, the root, and a path through a
/// symlink leading outside are refused and remove nothing; a link is removed, not its target.
#[tokio::test]
async fn delete_removes_a_file_or_an_empty_directory_within_its_scope_only() {
    let s = start().await;
    let area = s.macaroon("/data/ckpt/a/", &["activity:DOWNLOAD,UPLOAD,DELETE"], "PT1H").await;
    let other = s.macaroon("/data/ckpt/b/", &["activity:DOWNLOAD,UPLOAD,DELETE"], "PT1H").await;
    let upload = s.macaroon("/data/ckpt/a/", &["activity:UPLOAD"], "PT1H").await;
    assert_eq!(s.put_bearer("/data/ckpt/a/checkpoint.tar", &area, "A").await.status(), StatusCode::CREATED);
    assert_eq!(s.put_bearer("/data/ckpt/b/checkpoint.tar", &other, "B").await.status(), StatusCode::CREATED);
    let delete = |path: &str, m: &str| s.http.delete(s.url(path)).bearer_auth(m).send();
    // Another area's macaroon, and one without DELETE, remove nothing.
    assert_eq!(delete("/data/ckpt/a/checkpoint.tar", &other).await.expect("sent").status(), StatusCode::FORBIDDEN);
    assert_eq!(delete("/data/ckpt/a/checkpoint.tar", &upload).await.expect("sent").status(), StatusCode::FORBIDDEN);
    assert_eq!(delete("/data/ckpt/b/", &area).await.expect("sent").status(), StatusCode::FORBIDDEN);
    assert!(s.data().join("ckpt/a/checkpoint.tar").exists());
    // A directory with a file in it stays; then the file goes, then the empty directory.
    let r = delete("/data/ckpt/a/", &area).await.expect("sent");
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert!(r.text().await.unwrap_or_default().contains("not empty"));
    assert_eq!(delete("/data/ckpt/a/checkpoint.tar", &area).await.expect("sent").status(), StatusCode::NO_CONTENT);
    assert!(!s.data().join("ckpt/a/checkpoint.tar").exists());
    assert_eq!(delete("/data/ckpt/a/checkpoint.tar", &area).await.expect("sent").status(), StatusCode::NOT_FOUND);
    assert_eq!(delete("/data/ckpt/a/", &area).await.expect("sent").status(), StatusCode::NO_CONTENT);
    assert!(!s.data().join("ckpt/a").exists());
    assert_eq!(std::fs::read_to_string(s.data().join("ckpt/b/checkpoint.tar")).expect("kept"), "B");
    // A link is removed itself: its target stays. A link leading outside is not walked through.
    let outside = s.dir.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("keep"), "K").expect("keep");
    std::fs::create_dir_all(s.data().join("ln")).expect("ln");
    std::os::unix::fs::symlink(&outside, s.data().join("ln/out")).expect("symlink");
    std::os::unix::fs::symlink(s.data().join("ckpt/b/checkpoint.tar"), s.data().join("ln/b")).expect("symlink");
    let basic = |path: &str| s.http.delete(s.url(path)).basic_auth(ALICE.0, Some(ALICE.1)).send();
    assert_eq!(basic("/data/ln/out/keep").await.expect("sent").status(), StatusCode::FORBIDDEN);
    assert!(outside.join("keep").exists());
    assert_eq!(basic("/data/ln/b").await.expect("sent").status(), StatusCode::NO_CONTENT);
    assert!(s.data().join("ckpt/b/checkpoint.tar").exists(), "the link's target stays");
    // Outside alice's paths, and the root, are refused.
    assert_eq!(basic("/database").await.expect("sent").status(), StatusCode::FORBIDDEN);
    let root = s.http.delete(s.url("/")).basic_auth(GATEWAY.0, Some(GATEWAY.1)).send().await.expect("sent");
    assert_eq!(root.status(), StatusCode::FORBIDDEN);
    assert!(s.data().exists());
    s.stop().await;
}

#[tokio::test]
async fn large_upload_streams_through() {
    let s = start().await;
    let body: Vec<u8> = (0..5 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let r = s
        .http
        .put(s.url("/data/big.bin"))
        .basic_auth(ALICE.0, Some(ALICE.1))
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = s.http.get(s.url("/data/big.bin")).basic_auth(ALICE.0, Some(ALICE.1)).send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.bytes().await.expect("body").as_ref(), body.as_slice());
    s.stop().await;
}

/// Files at the size where uploads and downloads stop being read whole (64 KiB) and just past
/// it round-trip byte for byte, each way; an overwrite at that size leaves no temporary file.
#[tokio::test]
async fn files_either_side_of_the_whole_read_bound_round_trip() {
    let s = start().await;
    for (name, len) in [("at.bin", 64 * 1024), ("past.bin", 64 * 1024 + 1), ("empty.bin", 0)] {
        let body: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        let url = s.url(&format!("/data/bound/{name}"));
        for (round, status) in [(0u8, StatusCode::CREATED), (1, StatusCode::OK)] {
            let mut sent = body.clone();
            if let Some(first) = sent.first_mut() {
                *first = round;
            }
            let r = s.http.put(&url).basic_auth(ALICE.0, Some(ALICE.1)).body(sent.clone()).send().await.expect("sent");
            assert_eq!(r.status(), status, "{name}, round {round}");
            let r = s.http.get(&url).basic_auth(ALICE.0, Some(ALICE.1)).send().await.expect("sent");
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.content_length(), Some(len as u64), "{name}");
            assert_eq!(r.bytes().await.expect("body").as_ref(), sent.as_slice(), "{name}, round {round}");
        }
    }
    let names: Vec<_> =
        std::fs::read_dir(s.data().join("bound")).expect("dir").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(names.len(), 3, "no temporary file left: {names:?}");
    s.stop().await;
}

/// RFC 3230, as dCache's door answers it (and the EP's cache of reference files asks): a `GET`
/// or `HEAD` whose `Want-Digest` names `sha-256` gets `Digest: sha-256=<base64>` of the file,
/// small (read whole) or large (streamed) alike; one that does not ask, or asks only for an
/// algorithm not offered, gets no `Digest`.
#[tokio::test]
async fn want_digest_sha256_is_answered_on_get_and_head() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let s = start().await;
    std::fs::create_dir_all(s.data().join("refs")).expect("mkdir");
    for (name, len) in [("small.txt", 100usize), ("large.bin", 3 * 64 * 1024 + 7), ("empty", 0)] {
        let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        std::fs::write(s.data().join("refs").join(name), &body).expect("write");
        let path = format!("/data/refs/{name}");
        let m = s.macaroon(&path, &["activity:DOWNLOAD"], "PT1H").await;
        let expected =
            format!("sha-256={}", base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(&body)));
        for method in [reqwest::Method::GET, reqwest::Method::HEAD] {
            let asked = |want: Option<&str>| {
                let mut req = s.http.request(method.clone(), s.url(&path)).bearer_auth(&m);
                if let Some(w) = want {
                    req = req.header("Want-Digest", w);
                }
                req.send()
            };
            let r = asked(Some("sha-256")).await.expect("sent");
            assert_eq!(r.status(), StatusCode::OK, "{method} {name}");
            let digest = r.headers().get("digest").and_then(|v| v.to_str().ok()).map(str::to_owned);
            assert_eq!(digest.as_deref(), Some(expected.as_str()), "{method} {name}");
            let length = r.headers().get("content-length").and_then(|v| v.to_str().ok()).map(str::to_owned);
            assert_eq!(length, Some(len.to_string()), "{method} {name}: the file's length, HEAD too");
            let got = r.bytes().await.expect("body");
            let served: &[u8] = if method == reqwest::Method::GET { &body } else { &[] };
            assert_eq!(got.as_ref(), served, "{method} {name}: the body as without the digest");
            let r = asked(Some("ADLER32;q=1, SHA-256;q=0.5")).await.expect("sent");
            assert_eq!(r.headers().get("digest").and_then(|v| v.to_str().ok()), Some(expected.as_str()));
            for not_asked in [None, Some("adler32"), Some("sha-256;q=0")] {
                let r = asked(not_asked).await.expect("sent");
                assert_eq!(r.status(), StatusCode::OK);
                assert!(r.headers().get("digest").is_none(), "{method} {name} {not_asked:?}");
            }
        }
    }
    // Asking changes nothing of who may read: another file with this macaroon is still 403.
    let m = s.macaroon("/data/refs/small.txt", &["activity:DOWNLOAD"], "PT1H").await;
    let r = s.http.head(s.url("/data/refs/large.bin")).bearer_auth(&m).header("Want-Digest", "sha-256").send().await;
    let r = r.expect("sent");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.headers().get("digest").is_none());
    s.stop().await;
}

#[tokio::test]
async fn macaroon_request_needs_the_exact_content_type() {
    let s = start().await;
    for ct in [None, Some("application/json"), Some("application/macaroon-request; charset=utf-8")] {
        let mut req = s.http.post(s.url("/data/x")).basic_auth(GATEWAY.0, Some(GATEWAY.1)).body("{}");
        if let Some(ct) = ct {
            req = req.header("Content-Type", ct);
        }
        let r = req.send().await.expect("sent");
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct:?}");
        let text = r.text().await.expect("body");
        assert!(text.contains("application/macaroon-request"), "{text}");
    }
    s.stop().await;
}

#[tokio::test]
async fn macaroon_request_refuses_non_issuers_and_bad_bodies() {
    let s = start().await;
    let body = serde_json::json!({"caveats": ["activity:DOWNLOAD"], "validity": "PT1H"});
    assert_eq!(s.request_macaroon(ALICE, "/data/x", body.clone()).await.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        s.request_macaroon(("gateway", "nope"), "/data/x", body.clone()).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let r = s
        .http
        .post(s.url("/data/x"))
        .header("Content-Type", "application/macaroon-request")
        .body(body.to_string())
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // carol issues only within /data/carol.
    let carol = ("carol", "carol-secret");
    assert_eq!(s.request_macaroon(carol, "/data/carol/x", body.clone()).await.status(), StatusCode::OK);
    assert_eq!(s.request_macaroon(carol, "/data/x", body.clone()).await.status(), StatusCode::FORBIDDEN);
    assert_eq!(s.request_macaroon(carol, "/", body.clone()).await.status(), StatusCode::FORBIDDEN);

    let r = s.request_macaroon(GATEWAY, "/data/x", serde_json::json!({"validity": "two hours"})).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.expect("body").contains("Invalid ISO 8601 duration"));
    let r = s.request_macaroon(GATEWAY, "/data/x", serde_json::json!({"caveats": ["ip:127.0.0.300"]})).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = s.request_macaroon(GATEWAY, "/data/x", serde_json::json!({"caveats": ["root:/data"]})).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = s
        .request_macaroon(GATEWAY, "/data/x", serde_json::json!({"caveats": ["activity:DOWNLOAD", "activity:UPLOAD"]}))
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = s.request_macaroon(GATEWAY, "/data/x", serde_json::json!({"caveat": []})).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    s.stop().await;
}

#[tokio::test]
async fn download_macaroon() {
    let s = start().await;
    std::fs::create_dir_all(s.data().join("raw")).expect("mkdir");
    std::fs::write(s.data().join("raw/x"), "payload-x").expect("write");
    std::fs::write(s.data().join("raw/xy"), "payload-xy").expect("write");

    let r = s
        .request_macaroon(
            GATEWAY,
            "/data/raw/x",
            serde_json::json!({"caveats": ["activity:DOWNLOAD"], "validity": "PT2H"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let v: serde_json::Value = r.json().await.expect("JSON");
    let m = v["macaroon"].as_str().expect("macaroon").to_owned();
    assert!(!m.contains('='), "{m}");
    assert_eq!(v["uri"]["target"], s.url("/data/raw/x"));
    assert_eq!(v["uri"]["base"], s.url("/"));
    assert_eq!(v["uri"]["targetWithMacaroon"], format!("{}?authz={m}", s.url("/data/raw/x")));
    assert_eq!(v["uri"]["baseWithMacaroon"], format!("{}?authz={m}", s.url("/")));

    let r = s.get_bearer("/data/raw/x", &m).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.expect("body"), "payload-x");
    let with = v["uri"]["targetWithMacaroon"].as_str().expect("uri");
    let r = s.http.get(with).send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::OK, "?authz= works");
    // Another file, even a prefix sibling: 403.
    assert_eq!(s.get_bearer("/data/raw/xy", &m).await.status(), StatusCode::FORBIDDEN);
    // PUT with a DOWNLOAD macaroon: 403, file untouched.
    assert_eq!(s.put_bearer("/data/raw/x", &m, "evil").await.status(), StatusCode::FORBIDDEN);
    assert_eq!(std::fs::read_to_string(s.data().join("raw/x")).expect("read"), "payload-x");
    // Tampered: 401.
    let mut t = m.clone().into_bytes();
    let i = t.len() - 5;
    t[i] = if t[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(t).expect("ascii");
    assert_eq!(s.get_bearer("/data/raw/x", &tampered).await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(s.get_bearer("/data/raw/x", "not-a-macaroon").await.status(), StatusCode::UNAUTHORIZED);
    s.stop().await;
}

/// dCache's `ip:` caveat: the macaroon works only from the listed clients (all tests run on
/// 127.0.0.1, so one allowing only another address must be refused).
#[tokio::test]
async fn ip_caveat_binds_a_macaroon_to_its_client() {
    let s = start().await;
    std::fs::create_dir_all(s.data()).expect("mkdir");
    std::fs::write(s.data().join("f"), "x").expect("write");
    let here = s.macaroon("/data/f", &["activity:DOWNLOAD", "ip:127.0.0.0/8,::1"], "PT1H").await;
    assert_eq!(s.get_bearer("/data/f", &here).await.status(), StatusCode::OK);
    let elsewhere = s.macaroon("/data/f", &["activity:DOWNLOAD", "ip:192.0.2.0/24"], "PT1H").await;
    let r = s.get_bearer("/data/f", &elsewhere).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.expect("body").contains("client address 127.0.0.1"));
    // A holder's second ip: caveat narrows: both must hold.
    let narrowed = htfaas_storage::macaroons::attenuate(&here, &["ip:10.0.0.1"]).expect("attenuates");
    assert_eq!(s.get_bearer("/data/f", &narrowed).await.status(), StatusCode::FORBIDDEN);
    s.stop().await;
}

#[tokio::test]
async fn expired_macaroon_is_forbidden() {
    let s = start().await;
    std::fs::create_dir_all(s.data()).expect("mkdir");
    std::fs::write(s.data().join("f"), "x").expect("write");
    let m = s.macaroon("/data/f", &["activity:DOWNLOAD"], "PT1H").await;
    // A holder narrows `before:`: up to the allowed clock skew in the past it still passes
    // (the scheduler's clock, which cut it, may run a little ahead of ours); further, refused.
    use htfaas_storage::macaroons::{CLOCK_SKEW, attenuate, format_instant};
    let ago = |s: i64| {
        let at = time::OffsetDateTime::now_utc() - time::Duration::seconds(s);
        attenuate(&m, &[&format!("before:{}", format_instant(at))]).expect("attenuates")
    };
    assert_eq!(s.get_bearer("/data/f", &ago(CLOCK_SKEW.whole_seconds() - 3)).await.status(), StatusCode::OK);
    let r = s.get_bearer("/data/f", &ago(CLOCK_SKEW.whole_seconds() + 2)).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body = r.text().await.expect("body");
    assert!(body.contains("expired at") && body.contains("past the 5 s allowed clock skew"), "{body}");
    s.stop().await;
}

#[tokio::test]
async fn path_traversal_is_refused_and_nothing_outside_is_read() {
    let s = start().await;
    std::fs::write(s.dir.path().join("outside.txt"), "TOPSECRET").expect("write");
    std::fs::create_dir_all(s.data()).expect("mkdir");
    for p in [
        "/data/../etc/passwd",
        "/../outside.txt",
        "/data/../../outside.txt",
        "/%2e%2e/outside.txt",
        "/data/%2e%2e/%2E%2E/outside.txt",
        "/..%2foutside.txt",
        "/data/./x",
        "//outside.txt",
        "/data%5c..%5c..%5coutside.txt",
        "/data%00",
    ] {
        let (status, text) = raw_get(s.addr, p, GATEWAY).await;
        assert_eq!(status, 400, "{p}: {text}");
        assert!(!text.contains("TOPSECRET"), "{p}");
    }
    // A symlink inside data_dir that points outside is not followed, for reads or writes.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(s.dir.path().join("outside.txt"), s.data().join("link")).expect("symlink");
        std::os::unix::fs::symlink(s.dir.path(), s.data().join("dirlink")).expect("symlink");
        let (status, text) = raw_get(s.addr, "/data/link", GATEWAY).await;
        assert_eq!(status, 403, "{text}");
        assert!(!text.contains("TOPSECRET"));
        let (status, text) = raw_get(s.addr, "/data/dirlink/outside.txt", GATEWAY).await;
        assert_eq!(status, 403, "{text}");
        let r = s
            .http
            .put(s.url("/data/dirlink/new.txt"))
            .basic_auth(GATEWAY.0, Some(GATEWAY.1))
            .body("x")
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(!s.dir.path().join("new.txt").exists());
    }
    s.stop().await;
}

#[tokio::test]
async fn upload_macaroon_for_a_directory() {
    let s = start().await;
    let m = s.macaroon("/data/out/", &["activity:UPLOAD"], "PT1H").await;
    assert_eq!(s.put_bearer("/data/out/a", &m, "A").await.status(), StatusCode::CREATED);
    assert_eq!(std::fs::read_to_string(s.data().join("out/a")).expect("stored"), "A");
    assert_eq!(s.put_bearer("/data/out/sub/b", &m, "B").await.status(), StatusCode::CREATED);
    assert_eq!(s.put_bearer("/data/outside", &m, "X").await.status(), StatusCode::FORBIDDEN);
    assert!(!s.data().join("outside").exists());
    // A macaroon of the same writer and path scope rewrites what one of them wrote (a job's
    // rerun, a later run of the same function as the same principal), with UPLOAD alone.
    let run = s.writer_macaroon("/data/out/", "run:alice/sums").await;
    assert_eq!(s.put_bearer("/data/out/r", &run, "R").await.status(), StatusCode::CREATED);
    let again = s.writer_macaroon("/data/out/", "run:alice/sums").await;
    assert_eq!(s.put_bearer("/data/out/r", &again, "R1").await.status(), StatusCode::OK);
    assert_eq!(std::fs::read_to_string(s.data().join("out/r")).expect("rewritten"), "R1");
    // Any other overwrite needs DELETE as well (dCache's rule): another writer of the same scope
    // (a developer's file credential, another principal's runs), no writer, a narrower or a
    // wider scope, or a file a user wrote.
    for other in ["user:mallory", "run:bob/sums"] {
        let m = s.writer_macaroon("/data/out/", other).await;
        let refused = s.put_bearer("/data/out/r", &m, "forged").await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{other}");
        let text = refused.text().await.unwrap_or_default();
        assert!(text.contains("was not written by this macaroon's writer: replacing it needs DELETE"), "{text}");
    }
    assert_eq!(s.put_bearer("/data/out/r", &m, "no writer").await.status(), StatusCode::FORBIDDEN);
    assert_eq!(std::fs::read_to_string(s.data().join("out/r")).expect("kept"), "R1");
    let again = s.macaroon("/data/out/", &["activity:UPLOAD"], "PT1H").await;
    assert_eq!(s.put_bearer("/data/out/a", &again, "A1").await.status(), StatusCode::FORBIDDEN, "no writer rewrites");
    let narrower = s.writer_macaroon("/data/out/sub/", "run:alice/sums").await;
    let r2 = s.writer_macaroon("/data/out/", "run:alice/sums").await;
    assert_eq!(s.put_bearer("/data/out/sub/c", &r2, "C").await.status(), StatusCode::CREATED);
    assert_eq!(s.put_bearer("/data/out/sub/c", &narrower, "C2").await.status(), StatusCode::FORBIDDEN);
    let wider = s.writer_macaroon("/data/", "run:alice/sums").await;
    assert_eq!(s.put_bearer("/data/out/r", &wider, "R2").await.status(), StatusCode::FORBIDDEN);
    assert_eq!(std::fs::read_to_string(s.data().join("out/a")).expect("kept"), "A");
    let m2 = s.macaroon("/data/out/", &["activity:UPLOAD,DELETE"], "PT1H").await;
    assert_eq!(s.put_bearer("/data/out/a", &m2, "A2").await.status(), StatusCode::OK);
    assert_eq!(std::fs::read_to_string(s.data().join("out/a")).expect("replaced"), "A2");
    // GET needs DOWNLOAD.
    assert_eq!(s.get_bearer("/data/out/a", &m).await.status(), StatusCode::FORBIDDEN);
    // max-upload caps the size, declared or streamed.
    let capped = s.macaroon("/data/out/", &["activity:UPLOAD", "max-upload:10"], "PT1H").await;
    assert_eq!(s.put_bearer("/data/out/big", &capped, "01234567890").await.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(!s.data().join("out/big").exists());
    let stream =
        futures_util::stream::iter(["012345", "67890"].map(|c| Ok::<_, std::io::Error>(c.as_bytes().to_vec())));
    let r =
        s.http.put(s.url("/data/out/big")).bearer_auth(&capped).body(reqwest::Body::wrap_stream(stream)).send().await;
    // The server may answer 413 and close before the client finished sending.
    if let Ok(r) = r {
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
    assert!(!s.data().join("out/big").exists());
    let leftovers: Vec<_> = std::fs::read_dir(s.data().join("out"))
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".upload-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(s.put_bearer("/data/out/small", &capped, "0123456789").await.status(), StatusCode::CREATED);
    s.stop().await;
}

/// For `events backfill`: `PROPFIND` lists a directory as dCache's WebDAV door does, under
/// a LIST macaroon for the tree; a DOWNLOAD or UPLOAD macaroon, another tree, no credential and
/// `Depth: infinity` are refused; uploads in progress and symlinks are not listed.
#[tokio::test]
async fn propfind_lists_a_directory_under_a_list_macaroon_only() {
    let s = start().await;
    let w = s.macaroon("/data/tree/", &["activity:UPLOAD"], "PT1H").await;
    for (p, body) in [("/data/tree/a b.dat", "A"), ("/data/tree/sub/c.dat", "CC"), ("/data/other/x", "X")] {
        assert_eq!(
            s.put_bearer(p, &w, body).await.status(),
            if p.starts_with("/data/tree/") { StatusCode::CREATED } else { StatusCode::FORBIDDEN }
        );
    }
    std::fs::write(s.data().join("tree/.z.dat.upload-0123456789abcdef0123456789abcdef"), "partial").expect("tmp");
    std::os::unix::fs::symlink("/etc", s.data().join("tree/link")).expect("symlink");
    let propfind = |path: &str, m: &str, depth: &str| {
        s.http
            .request(reqwest::Method::from_bytes(b"PROPFIND").expect("method"), s.url(path))
            .bearer_auth(m.to_owned())
            .header("depth", depth)
            .send()
    };
    let list = s.macaroon("/data/tree/", &["activity:LIST"], "PT1H").await;
    let r = propfind("/data/tree/", &list, "1").await.expect("sent");
    assert_eq!(r.status().as_u16(), 207);
    let xml = r.text().await.expect("body");
    for expected in [
        "<d:href>/data/tree/</d:href>",
        "<d:href>/data/tree/a%20b.dat</d:href>",
        "<d:getcontentlength>1</d:getcontentlength>",
        "<d:href>/data/tree/sub/</d:href><d:propstat><d:prop><d:resourcetype><d:collection/>",
    ] {
        assert!(xml.contains(expected), "{expected} in {xml}");
    }
    assert!(!xml.contains("upload-") && !xml.contains("link"), "{xml}");
    let r = propfind("/data/tree/sub/", &list, "1").await.expect("sent");
    assert!(r.text().await.expect("body").contains("<d:href>/data/tree/sub/c.dat</d:href>"));
    let r = propfind("/data/tree/", &list, "0").await.expect("sent");
    assert!(!r.text().await.expect("body").contains("a%20b.dat"), "Depth 0 is the directory alone");
    // Refused: infinity, another tree, a macaroon for other activities, none at all.
    assert_eq!(propfind("/data/tree/", &list, "infinity").await.expect("sent").status(), StatusCode::FORBIDDEN);
    assert_eq!(propfind("/data/other/", &list, "1").await.expect("sent").status(), StatusCode::FORBIDDEN);
    let down = s.macaroon("/data/tree/", &["activity:DOWNLOAD"], "PT1H").await;
    assert_eq!(propfind("/data/tree/", &down, "1").await.expect("sent").status(), StatusCode::FORBIDDEN);
    assert_eq!(propfind("/data/tree/", &w, "1").await.expect("sent").status(), StatusCode::FORBIDDEN);
    let anonymous = s
        .http
        .request(reqwest::Method::from_bytes(b"PROPFIND").expect("method"), s.url("/data/tree/"))
        .send()
        .await
        .expect("sent");
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    // A file is no directory.
    assert_eq!(propfind("/data/tree/a%20b.dat", &list, "1").await.expect("sent").status(), StatusCode::NOT_FOUND);
    s.stop().await;
}

#[tokio::test]
async fn shutdown_token_stops_run() {
    let s = start().await;
    // An idle keep-alive connection must not keep the server up.
    assert_eq!(s.http.get(s.url("/healthz")).send().await.expect("sent").status(), StatusCode::OK);
    let addr = s.addr;
    s.stop().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "listener closed");
}

// ---- NATS: a real nats-server, when available ----

/// A nats-server with JetStream (the one harness, `htfaas_functions::nats_server`), stopped
/// when dropped.
struct Nats {
    server: NatsServer,
    url: String,
    _dir: tempfile::TempDir,
}

async fn start_nats() -> Option<Nats> {
    let Some(bin) = find_binary() else {
        assert!(std::env::var_os("CI").is_none(), "nats-server missing and CI is set");
        eprintln!("NOTICE: skipping NATS test: no nats-server (run scripts/install-deps.sh)");
        return None;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = NatsServer::start(&bin, dir.path(), 0).expect("nats-server starts");
    let url = server.url();
    Some(Nats { server, url, _dir: dir })
}

#[tokio::test]
async fn upload_publishes_a_transfer_message_then_503_when_nats_is_gone() {
    use async_nats::jetstream;
    use futures_util::StreamExt as _;
    use htfaas_functions::proto::{EVENTS_STREAM, EVENTS_SUBJECTS, TransferMessage};

    let Some(mut nats) = start_nats().await else { return };
    let s = start_with(tempfile::tempdir().expect("tempdir"), Some(nats.url.clone())).await;
    let m = s.macaroon("/data/out/", &["activity:UPLOAD"], "PT1H").await;
    assert_eq!(s.put_bearer("/data/out/r.dat", &m, "12345").await.status(), StatusCode::CREATED);
    let r = s.http.put(s.url("/data/a.txt")).basic_auth(ALICE.0, Some(ALICE.1)).body("abc").send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::CREATED);

    let client = async_nats::connect(&nats.url).await.expect("connect");
    let js = jetstream::new(client);
    let mut stream = js.get_stream(EVENTS_STREAM).await.expect("stream exists");
    let info = stream.info().await.expect("info");
    let subjects: Vec<String> = EVENTS_SUBJECTS.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(info.config.subjects, subjects, "the same subjects as the gateway makes it with");
    assert_eq!(info.state.messages, 2);
    let consumer = stream.create_consumer(jetstream::consumer::pull::Config::default()).await.expect("consumer");
    let mut msgs = consumer.fetch().max_messages(2).messages().await.expect("fetch");
    let (mut got, mut subjects) = (Vec::new(), Vec::new());
    while let Some(msg) = msgs.next().await {
        let msg = msg.expect("message");
        subjects.push(msg.subject.to_string());
        got.push(serde_json::from_slice::<TransferMessage>(&msg.payload).expect("TransferMessage JSON"));
    }
    assert_eq!(got.len(), 2);
    // Each on its file's path subject, which the gateway's owner lanes read.
    assert_eq!(subjects, ["storage.dcache.billing.path.data.out._", "storage.dcache.billing.path.data._"]);
    let first = &got[0];
    assert_eq!(first.msg_type.as_deref(), Some("transfer"));
    assert_eq!(first.is_write.as_deref(), Some("write"));
    assert_eq!(first.transfer_path.as_deref(), Some("/data/out/r.dat"));
    assert_eq!(first.file_size, Some(5));
    assert_eq!(first.status.as_ref().map(|s| s.code), Some(0));
    let subj = first.subject.clone().unwrap_or_default();
    assert!(subj[0].starts_with("MacaroonPrincipal["), "{subj:?}");
    assert_eq!(got[1].subject.as_ref().map(|s| s[0].clone()).as_deref(), Some("UserNamePrincipal[alice]"));

    // NATS gone: the file is kept, the answer is 503.
    nats.server.kill();
    let r = s.http.put(s.url("/data/b.txt")).basic_auth(ALICE.0, Some(ALICE.1)).body("b").send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.text().await.expect("body").contains("was stored"));
    assert_eq!(std::fs::read_to_string(s.data().join("b.txt")).expect("kept"), "b");
    s.stop().await;
}

/// Set in the child process of [`a_put_past_the_file_size_limit_is_507_and_leaves_nothing_behind`].
const FSIZE_CHILD: &str = "HTFAAS_STORAGE_TEST_FSIZE_CHILD";

/// A PUT the disk cannot hold. A full filesystem needs root to make; a file size
/// limit (`RLIMIT_FSIZE`, set by `ulimit -f` on a child process running this one test, with
/// `SIGXFSZ` ignored) makes writes past it fail with `EFBIG` through the same path as `ENOSPC`.
/// The answer is 507 naming the path and the cause, the temporary file is removed, nothing is
/// renamed into place and no billing message is published (NATS started before the limit).
#[tokio::test]
async fn a_put_past_the_file_size_limit_is_507_and_leaves_nothing_behind() {
    const NAME: &str = "a_put_past_the_file_size_limit_is_507_and_leaves_nothing_behind";
    if std::env::var_os(FSIZE_CHILD).is_none() {
        let exe = std::env::current_exe().expect("this test binary");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"trap '' XFSZ; ulimit -f 256 && exec "$0" "$@""#)
            .arg(exe)
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(FSIZE_CHILD, "1")
            .output()
            .expect("run the child");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the child failed:\n{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "the child ran the test:\n{stdout}\n{stderr}");
        return;
    }
    use futures_util::StreamExt as _;
    // NATS first, so that the limit is not its own.
    let Some(nats) = start_nats().await else { return };
    let s = start_with(tempfile::tempdir().expect("tempdir"), Some(nats.url.clone())).await;
    let put = |path: &str, body: Vec<u8>| s.http.put(s.url(path)).basic_auth(ALICE.0, Some(ALICE.1)).body(body).send();
    // Under the limit (at least 128 KiB): stored and announced.
    assert_eq!(put("/data/small.dat", vec![1; 1024]).await.expect("sent").status(), StatusCode::CREATED);
    let r = put("/data/big.dat", vec![2; 4 << 20]).await.expect("sent");
    assert_eq!(r.status(), StatusCode::INSUFFICIENT_STORAGE);
    let body = r.text().await.expect("body");
    assert!(body.contains("insufficient storage: /data/big.dat was not stored (File too large"), "{body}");
    let mut left: Vec<String> = std::fs::read_dir(s.data())
        .expect("data dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["small.dat"], "no big.dat, no temporary file");
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.expect("connect"));
    let mut stream = js.get_stream(htfaas_functions::proto::EVENTS_STREAM).await.expect("stream");
    assert_eq!(stream.info().await.expect("info").state.messages, 1, "only small.dat was announced");
    let consumer =
        stream.create_consumer(async_nats::jetstream::consumer::pull::Config::default()).await.expect("consumer");
    let mut msgs = consumer.fetch().max_messages(1).messages().await.expect("fetch");
    let msg = msgs.next().await.expect("one").expect("message");
    let m: htfaas_functions::proto::TransferMessage = serde_json::from_slice(&msg.payload).expect("transfer");
    assert_eq!(m.transfer_path.as_deref(), Some("/data/small.dat"));
    s.stop().await;
}

/// A client that sends part of a request head and holds it, or starts an upload
/// and then sends nothing, is cut off by the server (its header and body idle timeouts);
/// meanwhile another client's upload goes through.
#[tokio::test]
async fn slow_heads_and_stalled_uploads_are_cut_off() {
    let s = start().await;
    let mut slow_head = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    slow_head.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.expect("write");
    let mut stalled = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode("alice:alice-secret");
    let head = format!(
        "PUT /data/stalled.dat HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\nContent-Length: 1000\r\nConnection: close\r\n\r\npartial"
    );
    stalled.write_all(head.as_bytes()).await.expect("write");

    let r =
        s.http.put(s.url("/data/fine.dat")).basic_auth(ALICE.0, Some(ALICE.1)).body("fine").send().await.expect("sent");
    assert_eq!(r.status(), StatusCode::CREATED);

    // A bound only against a hang: each connection ends when its server's timeout does.
    let ends = async {
        let mut out = Vec::new();
        let _ = slow_head.read_to_end(&mut out).await;
        let head_answer = String::from_utf8_lossy(&out).into_owned();
        let mut out = Vec::new();
        let _ = stalled.read_to_end(&mut out).await;
        (head_answer, String::from_utf8_lossy(&out).into_owned())
    };
    let (head_answer, upload_answer) =
        tokio::time::timeout(Duration::from_secs(60), ends).await.expect("the server never cut the slow clients off");
    assert!(!head_answer.contains("200 OK"), "{head_answer}");
    assert!(
        upload_answer.starts_with("HTTP/1.1 400") && upload_answer.contains("request body sent nothing"),
        "{upload_answer}"
    );
    assert!(!s.data().join("stalled.dat").exists(), "nothing stored of the stalled upload");
    s.stop().await;
}
