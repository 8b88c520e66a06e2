//! The storage client's tests: macaroon requests in both dialects, derived read macaroons,
//! timeouts against a storage that stalls.

use super::*;
use serde_json::json;

/// A storage that accepts the connection and never answers (or stops halfway
/// through its answer) costs a macaroon request its timeout, then counts as unavailable,
/// which the dispatcher retries with backoff ([`StorageError::is_transient`]); no request
/// hangs. The stand-in listens on 127.0.0.1 only.
#[tokio::test]
async fn a_storage_that_accepts_and_never_answers_times_out_as_unavailable() {
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    // Keeps every connection open without a byte of answer, except the second, which gets
    // its headers and half a body.
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        for n in 0.. {
            let Ok((mut conn, _)) = listener.accept().await else { break };
            if n == 1 {
                // The answer starts once the request is there.
                let mut request = [0u8; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut conn, &mut request).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"mac";
                let _ = conn.write_all(head.as_bytes()).await;
            }
            held.push(conn);
        }
    });
    let http = crate::clients::storage_http_client(None, None, None).expect("client");
    let auth = StorageAuth::Basic { user: "gateway".into(), secret: "s".into() };
    let timeout = std::time::Duration::from_millis(300);
    let client = StorageClient::new(http, StorageKind::Dcache, &base, auth, "PT2H", "PT4H").with_timeout(timeout);
    assert_eq!(MACAROON_TIMEOUT, std::time::Duration::from_secs(10), "the default bound");
    for access in ["read: no answer", "write: half an answer"] {
        let started = std::time::Instant::now();
        let result = if access.starts_with("read") {
            client.read_macaroon("/data/f").await
        } else {
            client.write_macaroon("/out/", false, "run:alice/f").await
        };
        let elapsed = started.elapsed();
        let e = result.expect_err(access);
        assert!(e.is_transient(), "{access}: {e}");
        assert!(e.to_string().starts_with("storage unavailable: no answer within 300ms"), "{access}: {e}");
        assert!(elapsed >= timeout && elapsed < timeout * 10, "{access}: {elapsed:?}");
    }
    server.abort();
}

/// A stand-in storage on 127.0.0.1 that mints real V1 macaroons with the caveats asked for
/// and a `before:` two hours on, counting requests; its key, to authenticate what it minted.
async fn minting_storage() -> (String, htfaas_functions::macaroon::RootKey, std::sync::Arc<AtomicU64>) {
    use axum::routing::post;
    let key = htfaas_functions::macaroon::RootKey::raw([7; 32]);
    let asked = std::sync::Arc::new(AtomicU64::new(0));
    let (k, n) = (key.clone(), asked.clone());
    // XRootD puts the URL's path in the macaroon; dCache takes it from the body.
    let app = axum::Router::new().fallback(post(move |uri: axum::http::Uri, body: String| {
        let (k, n) = (k.clone(), n.clone());
        async move {
            n.fetch_add(1, Ordering::Relaxed);
            let req: serde_json::Value = serde_json::from_str(&body).expect("json");
            let mut caveats: Vec<String> = req["caveats"]
                .as_array()
                .expect("caveats")
                .iter()
                .map(|c| c.as_str().expect("str").to_owned())
                .collect();
            if !caveats.iter().any(|c| c.starts_with("path:")) {
                caveats.push(format!("path:{}", uri.path()));
            }
            caveats.push(format!(
                "before:{}",
                htfaas_functions::time::utc_timestamp(htfaas_functions::time::now_s() + 7200)
            ));
            let token = htfaas_functions::macaroon::mint(&k, "here", "id-1", &caveats).expect("mint");
            axum::Json(json!({ "macaroon": token }))
        }
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (base, key, asked)
}

/// One request per directory: each file's read macaroon is the directory's base with one
/// more `path:` caveat (relative for dCache, absolute for XRootD), under the storage's own
/// HMAC chain; the base itself is never returned.
#[tokio::test]
async fn read_macaroons_are_derived_from_one_base_per_directory() {
    let (base, key, asked) = minting_storage().await;
    for (kind, suffix) in [(StorageKind::Dcache, "/x.dat"), (StorageKind::Xrootd, "/data/raw/x.dat")] {
        asked.store(0, Ordering::Relaxed);
        let http = crate::clients::storage_http_client(None, None, None).expect("client");
        let auth = StorageAuth::Basic { user: "gateway".into(), secret: "s".into() };
        let client = StorageClient::new(http, kind, &base, auth, "PT2H", "PT4H");
        let x = client.read_macaroon("/data/raw/x.dat").await.expect("x");
        let y = client.read_macaroon("/data/raw/y.dat").await.expect("y");
        let other = client.read_macaroon("/data/cal/z.dat").await.expect("z");
        assert_eq!(asked.load(Ordering::Relaxed), 2, "{kind:?}: one base per directory");
        assert_eq!(client.counts(), MacaroonCounts { requested: 2, derived: 3 });
        let caveats = |t: &str| htfaas_functions::macaroon::authenticate(t, &key).expect("the storage's chain").caveats;
        let (cx, cy) = (caveats(&x), caveats(&y));
        assert_eq!(cx.last().map(String::as_str), Some(format!("path:{suffix}").as_str()), "{kind:?}: {cx:?}");
        assert!(cy.last().is_some_and(|c| c.ends_with("/y.dat")), "{cy:?}");
        assert_eq!(cx[..cx.len() - 1], cy[..cy.len() - 1], "{kind:?}: the same base");
        assert!(cx.iter().any(|c| c == "path:/data/raw/"), "{kind:?}: the base is on the directory: {cx:?}");
        assert!(caveats(&other).iter().any(|c| c == "path:/data/cal/"), "{kind:?}");
    }
    // No base where a path names no file or holds a line break: asked for as it is.
    let http = crate::clients::storage_http_client(None, None, None).expect("client");
    let auth = StorageAuth::Basic { user: "gateway".into(), secret: "s".into() };
    let client = StorageClient::new(http, StorageKind::Dcache, &base, auth, "PT2H", "PT4H");
    for odd in ["/data/raw/", "/data/raw/a\nb", "relative.dat"] {
        client.read_macaroon(odd).await.expect("asked for");
    }
    assert_eq!(client.counts(), MacaroonCounts { requested: 3, derived: 0 });
}

#[test]
fn a_base_serves_for_the_first_quarter_of_its_life() {
    let base = Base { token: String::new(), obtained_s: 1000, before_s: 1000 + 7200 };
    assert!(base.fresh(1000) && base.fresh(1000 + 1799));
    assert!(!base.fresh(1000 + 1800) && !base.fresh(1000 + 7200) && !base.fresh(999));
    assert_eq!(directory_of("/x.dat"), Some("/"));
    assert_eq!(directory_of("/data/raw/x.dat"), Some("/data/raw/"));
    assert_eq!((directory_of("/data/"), directory_of("x"), directory_of("/a\0b")), (None, None, None));
}

#[test]
fn paths_are_encoded_but_slashes_kept() {
    assert_eq!(htfaas_functions::percent::path("/data/raw/a b#?.dat"), "/data/raw/a%20b%23%3F.dat");
    assert_eq!(htfaas_functions::percent::path("/data/é"), "/data/%C3%A9");
}

#[test]
fn dcache_requests_post_to_the_root_with_a_path_caveat() {
    let r = macaroon_request(StorageKind::Dcache, "https://door:2880/", Access::Read, "/data/in/a b.dat", "PT2H");
    assert_eq!(r.url, "https://door:2880/");
    assert_eq!(r.body, json!({"caveats": ["activity:DOWNLOAD", "path:/data/in/a b.dat"], "validity": "PT2H"}));
    let w = macaroon_request(StorageKind::Dcache, "https://door:2880", Access::Write, "/data/out", "PT4H");
    assert_eq!(w.url, "https://door:2880/");
    assert_eq!(w.body, json!({"caveats": ["activity:UPLOAD", "path:/data/out"], "validity": "PT4H"}));
    let w = macaroon_request(StorageKind::Dcache, "https://door:2880", Access::Replace, "/data/out", "PT4H");
    assert_eq!(w.body, json!({"caveats": ["activity:UPLOAD,DELETE", "path:/data/out"], "validity": "PT4H"}));
}

#[test]
fn xrootd_requests_post_to_the_target_with_activity_only() {
    let r = macaroon_request(StorageKind::Xrootd, "https://127.0.0.1:1094", Access::Read, "/store/in/a b.dat", "PT2H");
    assert_eq!(r.url, "https://127.0.0.1:1094/store/in/a%20b.dat");
    assert_eq!(r.body, json!({"caveats": ["activity:DOWNLOAD"], "validity": "PT2H"}));
    // A directory always with a trailing slash: 5.5.x matches path caveats as string prefixes.
    for dir in ["/store/out", "/store/out/"] {
        let w = macaroon_request(StorageKind::Xrootd, "https://127.0.0.1:1094/", Access::Write, dir, "PT4H");
        assert_eq!(w.url, "https://127.0.0.1:1094/store/out/");
        assert_eq!(w.body, json!({"caveats": ["activity:UPLOAD"], "validity": "PT4H"}));
    }
}

#[test]
fn xrootd_validity_is_pt_with_h_m_s_only() {
    for ok in ["PT2H", "PT4H", "PT90M", "PT1H30M", "PT10S", "PT1H2M3S"] {
        assert!(is_xrootd_validity(ok), "{ok}");
    }
    for bad in ["P1D", "PT", "PT2", "PTH", "2h", "PT1.5H", "P1DT2H", "PT2h", ""] {
        assert!(!is_xrootd_validity(bad), "{bad}");
    }
}

/// A V1 macaroon as XRootD 5.5.3 issued it (shared/reference/xrootd-and-nats.md §2.2).
const XRD_TOKEN: &str = "MDAxN2xvY2F0aW9uIHJlYWxwYXJ0cwowMDM0aWRlbnRpZmllciBmMjQ3ZmYxMy0yZjc0LTQ3ZGYtODQzOC1mNjQxYjQ5Nzc2ZTkKMDAxN2NpZCBuYW1lOmZhYXNhZG1pbgowMDM0Y2lkIGFjdGl2aXR5OlJFQURfTUVUQURBVEEsVVBMT0FELERPV05MT0FELExJU1QKMDAxZmNpZCBhY3Rpdml0eTpET1dOTE9BRCxMSVNUCjAwMjFjaWQgcGF0aDovc3RvcmUvaW4vaGVsbG8udHh0CjAwMjRjaWQgYmVmb3JlOjIwMjYtMTEtMjJUMDA6MzU6MTVaCjAwMmZzaWduYXR1cmUguExAmW4kpls5BbwwgT7XOPIyE8MEsTlyP1gXnRBkfNAK";

#[test]
fn v1_caveats_of_an_xrootd_macaroon() {
    assert_eq!(
        v1_caveats(XRD_TOKEN).expect("parses"),
        [
            "name:faasadmin",
            "activity:READ_METADATA,UPLOAD,DOWNLOAD,LIST",
            "activity:DOWNLOAD,LIST",
            "path:/store/in/hello.txt",
            "before:2026-11-22T00:35:15Z"
        ]
    );
    assert!(check_activities(XRD_TOKEN, "DOWNLOAD").is_ok());
    assert!(check_activities(XRD_TOKEN, "UPLOAD").is_err());
    assert!(v1_caveats("not a macaroon!").is_err());
    assert!(v1_caveats("MDA").is_err());
}
