//! Slow and greedy clients against every HTTP listener of the real stack: hundreds
//! of connections that send part of a request head and hold it (slowloris) are cut off by the
//! listeners' header timeout, while an EP still attaches, an upload still fires and its job
//! still runs. The listeners' limits (`functions::serve::Limits`, each config's `http`) are
//! tested one by one in `functions/src/serve/`. Last, what TLS keeps from an untrusted or plain-text peer.

use htfaas::stack::{demo_manifest, mint_ep_token};
use htfaas_functions::proto::JobState;
use htfaas_tests::{start_stack_with, upload_checksum, wait_for};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Slow connections held against the scheduler and against the storage each.
const SLOW: usize = 300;
/// Against the gateway and the EP's metrics listener each.
const SLOW_SMALL: usize = 50;

/// Opens `n` connections to `addr`, each sending an unfinished request head.
async fn hold_slow(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = TcpStream::connect(addr).await.expect("connect");
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.expect("write a partial head");
        held.push(c);
    }
    held
}

fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").trim_end_matches('/').parse().expect("a loopback address")
}

/// Reads until the server closes `c`; `true` when it closed without answering a request.
async fn closed_by_server(mut c: TcpStream) -> bool {
    let mut out = Vec::new();
    // A reset counts as closed too.
    let _ = c.read_to_end(&mut out).await;
    !String::from_utf8_lossy(&out).contains(" 200 ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_are_cut_off_while_an_ep_attaches_and_an_upload_runs() {
    let limits = htfaas_functions::serve::Limits { header_read_timeout_s: 3, ..Default::default() };
    let (dir, stack) = start_stack_with(|o| o.http = limits).await;
    let client = stack.client().expect("client");
    let info = stack.info().clone();
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");

    let mut slow = hold_slow(addr_of(&info.scheduler_url), SLOW).await;
    slow.extend(hold_slow(addr_of(&info.storage_url), SLOW).await);
    slow.extend(hold_slow(addr_of(&info.gateway_url), SLOW_SMALL).await);
    let metrics = stack.ep_metrics_url().expect("the EP's metrics listener");
    slow.extend(hold_slow(addr_of(metrics.trim_end_matches("/metrics")), SLOW_SMALL).await);

    // While they hold: another EP attaches, and an upload fires a job that runs.
    let eps = CancellationToken::new();
    let token = mint_ep_token(dir.path(), None, None, 600).expect("mint an attach token");
    let ep = crate::annex::start_ep(dir.path(), &info.scheduler_url, "ep-under-flood", token, None, &eps).await;
    wait_for("the second EP to attach", Duration::from_secs(30), || async {
        client.eps().await.ok()?.iter().any(|e| e.name == "ep-under-flood" && e.session.is_some()).then_some(())
    })
    .await;
    client.put_bytes(b"under flood".to_vec(), "/data/raw/flood.dat").await.expect("upload under the flood");
    wait_for("the upload's job to complete", Duration::from_secs(60), || async {
        client
            .jobs()
            .await
            .ok()?
            .into_iter()
            .find(|j| j.event.path == "/data/raw/flood.dat" && j.state == JobState::Completed)
    })
    .await;

    // Every slow connection is closed by its server, unanswered (a bound only against a hang).
    let total = slow.len();
    let closed = tokio::time::timeout(Duration::from_secs(120), async {
        let ends = slow.into_iter().map(|c| tokio::spawn(closed_by_server(c)));
        let mut n = 0;
        for e in ends {
            n += usize::from(e.await.expect("join"));
        }
        n
    })
    .await
    .expect("the servers never closed the slow connections");
    assert_eq!(closed, total, "every slow connection closed unanswered");

    eps.cancel();
    ep.await.expect("join the EP").expect("the EP ran");
    stack.stop().await.expect("stop");
}

/// API tokens travel only to a gateway whose certificate the client's CA signed, and never in
/// plain text to a TLS listener: a client without the stack's CA refuses the real gateway; a
/// client with it refuses an impostor (another CA's certificate) before sending a request, so
/// the impostor sees none; a plain-HTTP request carrying the admin token to the gateway's TLS
/// port gets no HTTP answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_tokens_go_only_to_a_gateway_the_client_trusts_and_never_in_plain_text() {
    let (_dir, stack) = start_stack_with(|o| o.tls = true).await;
    let info = stack.info().clone();
    stack.client().expect("client").stats().await.expect("the stack's own client trusts its CA");

    // Without the stack's CA: refused at the handshake.
    let untrusting =
        htfaas::client::Client::new(htfaas::client::StackInfo { ca_file: None, ..info.clone() }).expect("client");
    let err = format!("{:#}", untrusting.stats().await.expect_err("an unknown CA is refused"));
    assert!(err.to_lowercase().contains("certificate"), "{err}");

    // An impostor with a certificate for the same address from another CA.
    let other = tempfile::tempdir().expect("tempdir");
    let pki = htfaas::pki::make(other.path(), "impostor CA", &["127.0.0.1".into()]).expect("impostor PKI");
    let tls = htfaas_functions::serve::tls::server_config(&pki.cert_file, &pki.key_file).expect("impostor TLS");
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = seen.clone();
    let app = axum::Router::new().fallback(move || {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { "{}" }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let impostor_url = format!("https://{}", listener.local_addr().expect("addr"));
    let stop = CancellationToken::new();
    let impostor =
        tokio::spawn(htfaas_functions::serve::serve_tcp(listener, Some(tls), app, Default::default(), stop.clone()));
    let fooled = htfaas::client::Client::new(htfaas::client::StackInfo { gateway_url: impostor_url, ..info.clone() })
        .expect("client");
    let err = format!("{:#}", fooled.stats().await.expect_err("the impostor is refused"));
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0, "a request (and its token) reached the impostor");
    stop.cancel();
    impostor.await.expect("join").expect("impostor served");

    // Plain HTTP with the admin token, to the gateway's TLS port: no HTTP answer.
    let addr: SocketAddr = info.gateway_url.trim_start_matches("https://").parse().expect("address");
    let mut c = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET /v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n", info.admin_token);
    c.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), c.read_to_end(&mut answer)).await;
    assert!(!answer.starts_with(b"HTTP/"), "{:?}", String::from_utf8_lossy(&answer));
    stack.stop().await.expect("stop");
}
