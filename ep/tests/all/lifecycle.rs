//! An EP leaves by itself at the end of its lifetime, or after running nothing for its idle
//! time, the way an annex's EP gives its machine back (HTCondor `STARTD_NOCLAIM_SHUTDOWN`).

use htfaas_ep::Config;
use htfaas_functions::Resources;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// An EP whose scheduler never answers (a closed loopback port): it keeps re-dialling, idle.
async fn start(
    lifetime_s: Option<u64>,
    idle_shutdown_s: Option<u64>,
) -> (tokio::task::JoinHandle<anyhow::Result<()>>, CancellationToken, tempfile::TempDir) {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let work = tempfile::tempdir().expect("tempdir");
    let config = Config {
        name: "ep-lifecycle".into(),
        scheduler_url: format!("http://127.0.0.1:{closed}"),
        attach_token: "t".into(),
        slots: Resources { cpus: 1, memory_mb: 256, runtime_s: 60 },
        work_dir: work.path().to_owned(),
        log_limit_bytes: 1024,
        max_output_files: 1,
        max_output_bytes: 1,
        lifetime_s,
        idle_shutdown_s,
    };
    let settings = config.resolve().await.expect("resolves");
    let shutdown = CancellationToken::new();
    (tokio::spawn(htfaas_ep::run(settings, shutdown.clone())), shutdown, work)
}

#[tokio::test]
async fn an_idle_ep_leaves_after_its_idle_time() {
    let started = Instant::now();
    let (ep, _shutdown, _work) = start(None, Some(1)).await;
    tokio::time::timeout(Duration::from_secs(10), ep).await.expect("left by itself").expect("join").expect("ok");
    assert!(started.elapsed() >= Duration::from_secs(1), "left too early: {:?}", started.elapsed());
}

#[tokio::test]
async fn an_ep_leaves_at_the_end_of_its_lifetime() {
    let started = Instant::now();
    let (ep, _shutdown, _work) = start(Some(1), None).await;
    tokio::time::timeout(Duration::from_secs(10), ep).await.expect("left by itself").expect("join").expect("ok");
    assert!(started.elapsed() >= Duration::from_secs(1), "left too early: {:?}", started.elapsed());
}

#[tokio::test]
async fn without_either_an_ep_stays_until_told() {
    let (ep, shutdown, _work) = start(None, None).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!ep.is_finished(), "an EP without lifetime or idle limit left on its own");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), ep).await.expect("stops when told").expect("join").expect("ok");
}
