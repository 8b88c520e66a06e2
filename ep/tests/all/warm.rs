//! Compile ahead at the EP, against the fake scheduler: a `Warm` message makes the
//! EP fetch and compile a module before any job needs it, so the first job loads it instead of
//! compiling it; a `Warm` naming a URL outside the EP's allowed origins is refused unfetched,
//! and one whose bytes do not hash to the digest is refused; both are counted
//! (`htfaas_ep_warm_refused_total`). The defence in depth behind the scheduler's own check
//! (SECURITY.md, "compile ahead").

use crate::fake::{Harness, WAIT};
use htfaas_functions::proto::{Outcome, SchedulerMsg};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A counter's value on a metrics page (the first sample whose name and labels start so).
fn value(page: &str, sample: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_messages_compile_ahead_and_foreign_urls_or_other_bytes_are_refused_and_counted() {
    let mut h = Harness::start_with(|c| c.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"))).await;
    let mut c = h.conn().await;
    c.hello_welcome().await;

    // Another host than the scheduler's (127.0.0.1): outside the EP's default allowed origins.
    let foreign = tokio::net::TcpListener::bind("127.0.0.2:0").await.expect("bind 127.0.0.2");
    let foreign_url = format!("http://{}", foreign.local_addr().expect("addr"));
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while foreign.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    let checksum = h.digest_of("checksum");
    c.send(&SchedulerMsg::Warm { digest: checksum.clone(), module_url: format!("{foreign_url}/modules/checksum") });
    // An allowed origin serving other bytes than the digest names.
    c.send(&SchedulerMsg::Warm { digest: checksum.clone(), module_url: format!("{}/modules/hostile", h.base) });
    let deadline = Instant::now() + WAIT;
    loop {
        let page = h.metrics_page().await;
        let refused = value(&page, "htfaas_ep_warm_refused_total{reason=\"origin\"}") == Some(1.0)
            && value(&page, "htfaas_ep_warm_refused_total{reason=\"digest\"}") == Some(1.0);
        if refused {
            assert_eq!(value(&page, "htfaas_ep_modules_warmed_total"), Some(0.0), "{page}");
            break;
        }
        assert!(Instant::now() < deadline, "the bad warms were not refused:\n{page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And the real one.
    c.send(&SchedulerMsg::Warm { digest: checksum.clone(), module_url: format!("{}/modules/checksum", h.base) });
    let page = loop {
        let page = h.metrics_page().await;
        if value(&page, "htfaas_ep_modules_warmed_total") == Some(1.0) {
            break page;
        }
        assert!(Instant::now() < deadline, "the module was not compiled ahead:\n{page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let compiled = value(&page, "htfaas_ep_modules_compiled_total").expect("compiled");
    let artifact = std::fs::read_dir(h.work.path().join("compiled"))
        .expect("the artifact cache")
        .any(|e| e.ok().and_then(|e| e.file_name().into_string().ok()).is_some_and(|n| n.starts_with(checksum.hex())));
    assert!(artifact, "the compiled module is on disk");

    // The first job of the module compiles nothing: it loads the artifact.
    c.send(&SchedulerMsg::Assign(h.job("first", "wiki.txt")));
    let report = c.finished().await;
    assert_eq!(report.outcome, Outcome::Exited { exit_code: 0 }, "{report:?}");
    let page = h.metrics_page().await;
    assert_eq!(value(&page, "htfaas_ep_modules_compiled_total"), Some(compiled), "{page}");
    assert_eq!(value(&page, "htfaas_ep_modules_loaded_from_disk_total"), Some(1.0), "{page}");
    // The foreign URL was never fetched (the EP has warmed and run a job since).
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "the EP called an origin it does not allow");
    h.stop().await;
}
