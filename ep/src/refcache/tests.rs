//! The cache alone (hit, miss, the bound, off, files found at start), then a job's reference
//! files fetched through it from the real built-in storage (its `Want-Digest` answer), pinned
//! or not.

use super::*;
use crate::counters::Metrics;
use crate::origins::Origins;
use crate::refs::{Sources, fetch};
use htfaas_functions::proto::{Outcome, ReferenceInput};
use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Writes `bytes` at `dir/name` (as a download does) and returns the path and its sha256.
fn downloaded(dir: &Path, name: &str, bytes: &[u8]) -> (PathBuf, String) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(&path, bytes).expect("write");
    (path, sha256_hex(bytes))
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

#[test]
fn a_miss_links_nothing_then_the_kept_file_is_linked_read_only() {
    let work = tempfile::tempdir().expect("tempdir");
    let cache = RefCache::open(work.path().join("refs"), 1 << 20).expect("open").expect("on");
    assert_eq!(mode(&work.path().join("refs")), 0o700, "the EP's own");
    let (file, sha) = downloaded(&work.path().join("job1"), "ref/gains.txt", b"2 0 0\n");
    let dest = work.path().join("job2/ref/gains.txt");
    std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
    assert_eq!(cache.link(&sha, &dest).expect("link"), None, "a miss");
    assert!(!dest.exists(), "nothing linked");

    assert!(cache.keep(&sha, &file).expect("keep"));
    let stored = work.path().join("refs").join(&sha);
    assert_eq!(std::fs::metadata(&stored).expect("stat").ino(), std::fs::metadata(&file).expect("stat").ino());
    assert_eq!(mode(&stored), 0o444, "never written again");
    assert_eq!(cache.bytes(), 6);

    // A hit: linked, its place's earlier name unlinked (not written through).
    let elsewhere = work.path().join("elsewhere");
    std::fs::write(&elsewhere, b"another file").expect("write");
    std::fs::hard_link(&elsewhere, &dest).expect("an old name at the place");
    assert_eq!(cache.link(&sha, &dest).expect("link"), Some(6), "a hit");
    assert_eq!(std::fs::read(&dest).expect("read"), b"2 0 0\n");
    assert_eq!(std::fs::metadata(&dest).expect("stat").ino(), std::fs::metadata(&stored).expect("stat").ino());
    assert_eq!(std::fs::read(&elsewhere).expect("read"), b"another file", "the old name's file untouched");

    // The same content kept again changes nothing; a name that is no sha256 is not kept.
    let (again, _) = downloaded(&work.path().join("job3"), "ref/gains.txt", b"2 0 0\n");
    assert!(cache.keep(&sha, &again).expect("keep"));
    assert_eq!(cache.bytes(), 6);
    assert!(!cache.keep("../../etc/passwd", &again).expect("keep"), "no such name");
    assert_eq!(cache.link("../../etc/passwd", &dest).expect("link"), None);
    assert_eq!(std::fs::read_dir(work.path().join("refs")).expect("list").count(), 1, "one file, no leftovers");
}

#[test]
fn the_least_recently_used_go_at_the_bound_and_a_file_larger_than_it_is_not_kept() {
    let work = tempfile::tempdir().expect("tempdir");
    let cache = RefCache::open(work.path().join("refs"), 30).expect("open").expect("on");
    let job = work.path().join("job");
    let keep = |name: &str, body: &[u8]| {
        let (file, sha) = downloaded(&job, name, body);
        assert!(cache.keep(&sha, &file).expect("keep"), "{name}");
        sha
    };
    let a = keep("a", b"aaaaaaaaaa");
    let b = keep("b", b"bbbbbbbbbb");
    let c = keep("c", b"cccccccccc");
    assert_eq!(cache.bytes(), 30, "at the bound, all kept");
    assert!(cache.link(&a, &job.join("a-again")).expect("link").is_some(), "a is used again");
    let d = keep("d", b"dddddddddd");
    assert_eq!(cache.bytes(), 30);
    let held = |sha: &str| work.path().join("refs").join(sha).exists();
    assert!(!held(&b), "b, the least recently used, went");
    assert!(held(&a) && held(&c) && held(&d));
    assert_eq!(cache.link(&b, &job.join("b-again")).expect("link"), None);
    assert_eq!(std::fs::read(job.join("b")).expect("read"), b"bbbbbbbbbb", "the job's name for it stays whole");

    let (big, sha) = downloaded(&job, "big", &[7u8; 31]);
    assert!(!cache.keep(&sha, &big).expect("keep"), "larger than the whole cache");
    assert!(!held(&sha) && held(&a), "nothing evicted for it");

    // After a restart the order is the files' modification times (a hit sets it).
    let at = |sha: &str, secs: u64| {
        let f = std::fs::File::open(work.path().join("refs").join(sha)).expect("open");
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)).expect("set mtime");
    };
    at(&a, 3_000);
    at(&c, 1_000);
    at(&d, 2_000);
    drop(cache);
    let cache = RefCache::open(work.path().join("refs"), 20).expect("reopen").expect("on");
    assert_eq!(cache.bytes(), 20);
    assert!(!held(&c) && held(&a) && held(&d), "the oldest by mtime went");
}

#[test]
fn zero_mib_turns_the_cache_off() {
    let work = tempfile::tempdir().expect("tempdir");
    assert!(RefCache::open(work.path().join("refs"), 0).expect("open").is_none());
    assert!(!work.path().join("refs").exists(), "not even made");
}

#[test]
fn a_file_found_at_start_is_served_only_once_it_hashes_to_its_name() {
    let work = tempfile::tempdir().expect("tempdir");
    let refs = work.path().join("refs");
    let job = work.path().join("job");
    let cache = RefCache::open(refs.clone(), 1 << 20).expect("open").expect("on");
    let (good, good_sha) = downloaded(&job, "good", b"good constants");
    let (bad, bad_sha) = downloaded(&job, "bad", b"bad constants");
    assert!(cache.keep(&good_sha, &good).expect("keep") && cache.keep(&bad_sha, &bad).expect("keep"));
    drop(cache);
    // While the EP is down: one file changed, a leftover link, a stray directory.
    std::fs::remove_file(refs.join(&bad_sha)).expect("rm");
    std::fs::write(refs.join(&bad_sha), b"changed").expect("write");
    std::fs::write(refs.join(format!("{TMP_PREFIX}0123456789abcdef")), b"half in").expect("write");
    std::fs::create_dir(refs.join("stray")).expect("mkdir");
    let cache = RefCache::open(refs.clone(), 1 << 20).expect("reopen").expect("on");
    let mut names: Vec<_> = std::fs::read_dir(&refs).expect("list").map(|e| e.expect("entry").file_name()).collect();
    names.sort();
    let mut expected = vec![std::ffi::OsString::from(&good_sha), std::ffi::OsString::from(&bad_sha)];
    expected.sort();
    assert_eq!(names, expected, "leftovers removed");
    assert_eq!(cache.link(&bad_sha, &job.join("bad-again")).expect("link"), None, "does not hash to its name");
    assert!(!refs.join(&bad_sha).exists(), "and removed");
    assert_eq!(cache.link(&good_sha, &job.join("good-again")).expect("link"), Some(14));
    assert_eq!(cache.bytes(), 14);
}

/// The built-in storage on 127.0.0.1:0 with one user that may ask for macaroons; its base URL
/// and data directory (URL path `/data/…` is `<data dir>/data/…`).
async fn storage(root: &Path, shutdown: tokio_util::sync::CancellationToken) -> (String, PathBuf) {
    let users = root.join("users.json");
    std::fs::write(&users, r#"{"users":[{"name":"gw","secret":"s","issue_macaroons":true,"paths":["/"]}]}"#)
        .expect("users");
    let config = htfaas_storage::Config {
        listen: "127.0.0.1:0".parse().expect("addr"),
        data_dir: root.join("ns"),
        secret_file: root.join("secret"),
        users_file: users,
        nats_url: None,
        nats_nkey_seed: None,
        events_stream_replicas: 1,
        public_url: None,
        tls_cert_file: None,
        tls_key_file: None,
        billing_path_subjects: true,
        cell_name: "htfaas-storage".into(),
        durability: Default::default(),
        http: Default::default(),
    };
    let settings = config.resolve().await.expect("storage resolves");
    let base = format!("http://{}", settings.local_addr());
    tokio::spawn(htfaas_storage::run(settings, shutdown));
    (base, root.join("ns"))
}

/// A read macaroon for exactly `path`, as the gateway gets one.
async fn read_macaroon(http: &reqwest::Client, base: &str, path: &str) -> String {
    let resp = http
        .post(format!("{base}{path}"))
        .basic_auth("gw", Some("s"))
        .header("Content-Type", "application/macaroon-request")
        .body(r#"{"caveats":["activity:DOWNLOAD"],"validity":"PT1H"}"#)
        .send()
        .await
        .expect("macaroon request");
    assert!(resp.status().is_success(), "macaroon request: {}", resp.status());
    let v: serde_json::Value = resp.json().await.expect("macaroon JSON");
    v["macaroon"].as_str().expect("macaroon").to_owned()
}

/// A job's reference files through the cache, against the real storage: the first job
/// downloads and keeps, the second is linked from the cache; once the file changed, the next
/// job reads the new bytes; a re-run pinned to the old bytes is refused though the cache still
/// holds them, and one pinned to the new bytes is served from the cache.
#[tokio::test]
async fn a_jobs_references_come_from_the_cache_by_the_storages_digest_and_a_wrong_pin_is_refused() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root = tempfile::tempdir().expect("tempdir");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (base, data) = storage(root.path(), shutdown.clone()).await;
    let on_disk = data.join("data/calib/gains.txt");
    std::fs::create_dir_all(on_disk.parent().expect("parent")).expect("mkdir");
    let (v1, v2) = (b"2 0 0\n1.5 0 0\n".as_slice(), b"9 0 0\n9 0 0\n".as_slice());
    std::fs::write(&on_disk, v1).expect("constants");

    let http = reqwest::Client::new();
    let origins = Origins::parse(&["http://127.0.0.1:*".to_owned()]).expect("origins");
    let cache = Arc::new(RefCache::open(root.path().join("ep/refs"), 1 << 20).expect("open").expect("on"));
    let metrics = Metrics::default();
    let sources = Sources { http: &http, origins: &origins, cache: Some(&cache), metrics: &metrics, traceparent: None };
    let reference = ReferenceInput {
        url: format!("{base}/data/calib/gains.txt"),
        path: "data/calib/gains.txt".into(),
        macaroon: read_macaroon(&http, &base, "/data/calib/gains.txt").await,
        sha256: None,
    };
    let run = |job: &str, r: ReferenceInput| {
        let input = root.path().join("ep/jobs").join(job).join("input");
        let sources = &sources;
        async move {
            let (mut bytes_in, mut retries) = (0, 0);
            let read = fetch(sources, &[r], &input, None, &mut bytes_in, &mut retries).await;
            (read, input.join("ref/data/calib/gains.txt"), bytes_in)
        }
    };

    let (read, first, bytes_in) = run("j1", reference.clone()).await;
    let read = read.expect("first job");
    assert_eq!((read[0].sha256.as_str(), read[0].size, bytes_in), (sha256_hex(v1).as_str(), v1.len() as u64, 14));
    assert_eq!(metrics.reference_files(), (0, 1), "downloaded");
    let kept = root.path().join("ep/refs").join(sha256_hex(v1));
    assert_eq!(std::fs::metadata(&kept).expect("kept").ino(), std::fs::metadata(&first).expect("stat").ino());

    let (read, second, bytes_in) = run("j2", reference.clone()).await;
    assert_eq!(read.expect("second job")[0].sha256, sha256_hex(v1));
    assert_eq!(metrics.reference_files(), (1, 1), "from the cache");
    assert_eq!(bytes_in, v1.len() as u64, "counted as read all the same");
    assert_eq!(std::fs::metadata(&second).expect("stat").ino(), std::fs::metadata(&kept).expect("stat").ino());

    // The file changed: the storage names other bytes, so they are downloaded.
    std::fs::write(&on_disk, v2).expect("new constants");
    let (read, third, _) = run("j3", reference.clone()).await;
    assert_eq!(read.expect("third job")[0].sha256, sha256_hex(v2));
    assert_eq!(std::fs::read(&third).expect("read"), v2, "the new bytes");
    assert_eq!(metrics.reference_files(), (1, 2));
    assert_eq!(std::fs::read(&second).expect("read"), v1, "the earlier job's file untouched");

    // A re-run pinned to the old bytes: refused, though the cache holds them.
    let pinned_old = ReferenceInput { sha256: Some(sha256_hex(v1).to_uppercase()), ..reference.clone() };
    let (read, _, _) = run("j4", pinned_old).await;
    match read {
        Err(Outcome::InputFailed { reason }) => {
            assert!(reason.contains("reference /data/calib/gains.txt") && reason.contains(&sha256_hex(v2)), "{reason}")
        }
        other => panic!("expected the other bytes refused, got {other:?}"),
    }
    // Pinned to the bytes the storage holds: served from the cache.
    let pinned_new = ReferenceInput { sha256: Some(sha256_hex(v2)), ..reference.clone() };
    let (read, _, _) = run("j5", pinned_new).await;
    assert_eq!(read.expect("pinned to what the storage holds")[0].sha256, sha256_hex(v2));
    assert_eq!(metrics.reference_files(), (2, 3));

    // Without a cache, every job downloads (no digest is asked for).
    let uncached = Sources { cache: None, ..sources };
    let (mut bytes_in, mut retries) = (0, 0);
    let input = root.path().join("ep/jobs/j6/input");
    fetch(&uncached, &[reference], &input, None, &mut bytes_in, &mut retries).await.expect("without a cache");
    assert_eq!(metrics.reference_files(), (2, 4));
    shutdown.cancel();
}
