//! Attacks on derived read macaroons, by whoever holds one (a job, its EP): the gateway asks the
//! built-in storage (dCache's caveat grammar) for one read macaroon per directory and narrows
//! it offline to each file. The holder tries the file beside its own, a file below, the listing
//! of the directory, and widening its macaroon back with more caveats of its own.

use htfaas_functions::macaroon::{attenuate, inspect};
use htfaas_tests::start_stack;

/// GET (or `method`) of `path` on the storage at `base` with `token`: the status.
async fn status(method: reqwest::Method, base: &str, path: &str, token: &str) -> u16 {
    let resp = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(token)
        .header("depth", "1")
        .body(if path.ends_with(".new") { "x" } else { "" })
        .send()
        .await
        .expect("request");
    resp.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_derived_read_macaroon_reads_exactly_its_file_and_cannot_be_widened_back() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let storage = stack.info().storage_url.clone();
    for (path, body) in [("/data/raw/a.dat", "a"), ("/data/raw/b.dat", "b"), ("/data/raw/sub/c.dat", "c")] {
        client.put_bytes(body.as_bytes().to_vec(), path).await.expect("upload");
    }
    let gateway = stack.gateway();
    let before = gateway.storage.counts();
    let a = gateway.storage.read_macaroon("/data/raw/a.dat").await.expect("a");
    let b = gateway.storage.read_macaroon("/data/raw/b.dat").await.expect("b");
    let after = gateway.storage.counts();
    assert_eq!(after.requested - before.requested, 1, "one base for the directory: {before:?} → {after:?}");
    assert_eq!(after.derived - before.derived, 2);
    let caveats = inspect(&a).expect("readable");
    assert_eq!(caveats.last().map(String::as_str), Some("path:/a.dat"), "narrowed to the file: {caveats:?}");
    assert_ne!(inspect(&b).expect("readable").last(), caveats.last());

    let get = reqwest::Method::GET;
    assert_eq!(status(get.clone(), &storage, "/data/raw/a.dat", &a).await, 200, "its own file");
    for beside in ["/data/raw/b.dat", "/data/raw/sub/c.dat", "/data/raw/"] {
        let s = status(get.clone(), &storage, beside, &a).await;
        assert!(matches!(s, 401 | 403 | 404), "{beside} with a's macaroon: {s}");
    }
    let propfind = reqwest::Method::from_bytes(b"PROPFIND").expect("method");
    let s = status(propfind, &storage, "/data/raw/", &a).await;
    assert!(matches!(s, 401 | 403), "listing the directory with a's macaroon: {s}");
    let s = status(reqwest::Method::PUT, &storage, "/data/raw/a.new", &a).await;
    assert!(matches!(s, 401 | 403), "writing with a read macaroon: {s}");

    // Widening back: a caveat only narrows. `path:/` chains to the same file, `..` is refused,
    // a larger activity set invalidates the macaroon.
    for (caveat, target, method) in [
        ("path:/", "/data/raw/b.dat", reqwest::Method::GET),
        ("path:/../b.dat", "/data/raw/b.dat", reqwest::Method::GET),
        ("path:/data/raw/b.dat", "/data/raw/b.dat", reqwest::Method::GET),
        ("activity:DOWNLOAD,UPLOAD,LIST", "/data/raw/a.new", reqwest::Method::PUT),
    ] {
        let widened = attenuate(&a, &[caveat]).expect("anyone may add a caveat");
        let s = status(method, &storage, target, &widened).await;
        assert!(matches!(s, 400 | 401 | 403 | 404), "{caveat} then {target}: {s}");
    }
    let narrowed_further = attenuate(&a, &["path:/"]).expect("add");
    assert_eq!(status(get, &storage, "/data/raw/a.dat", &narrowed_further).await, 200, "still its own file");
    stack.stop().await.expect("clean stop");
}
