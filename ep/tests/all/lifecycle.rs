//! An EP leaves by itself at the end of its lifetime, or after running nothing for its idle
//! time, the way an annex's EP gives its machine back (HTCondor `STARTD_NOCLAIM_SHUTDOWN`); the
//! scheduler's `Lifetime` (an annex extended or deleted) replaces its own lifetime.

use crate::fake::Harness;
use htfaas_ep::Config;
use htfaas_functions::Resources;
use htfaas_functions::proto::{Outcome, SchedulerMsg};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The EP's timers run on tokio's clock, which these tests pause: an hour passes at once, and when
/// the EP leaves is read on the same clock.
#[tokio::test(start_paused = true)]
async fn an_idle_ep_leaves_after_its_idle_time() {
    let started = tokio::time::Instant::now();
    let (ep, _shutdown, _work) = start(None, Some(HOUR)).await;
    tokio::time::timeout(Duration::from_secs(2 * HOUR), ep).await.expect("left by itself").expect("join").expect("ok");
    assert_left_at(started.elapsed(), HOUR);
}

#[tokio::test(start_paused = true)]
async fn an_ep_leaves_at_the_end_of_its_lifetime() {
    let started = tokio::time::Instant::now();
    let (ep, _shutdown, _work) = start(Some(HOUR), None).await;
    tokio::time::timeout(Duration::from_secs(2 * HOUR), ep).await.expect("left by itself").expect("join").expect("ok");
    assert_left_at(started.elapsed(), HOUR);
}

#[tokio::test(start_paused = true)]
async fn without_either_an_ep_stays_until_told() {
    let (ep, shutdown, _work) = start(None, None).await;
    tokio::time::sleep(Duration::from_secs(24 * HOUR)).await;
    assert!(!ep.is_finished(), "an EP without lifetime or idle limit left on its own");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), ep).await.expect("stops when told").expect("join").expect("ok");
}

/// An EP whose scheduler never answers (a closed loopback port): it keeps re-dialling, idle.
async fn start(
    lifetime_s: Option<u64>,
    idle_shutdown_s: Option<u64>,
) -> (tokio::task::JoinHandle<anyhow::Result<()>>, CancellationToken, tempfile::TempDir) {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let work = tempfile::tempdir().expect("tempdir");
    let config = Config {
        slots: Resources::new(1, 256, 60),
        log_limit_bytes: 1024,
        max_output_files: 1,
        max_output_bytes: 1,
        lifetime_s,
        idle_shutdown_s,
        ..Config::for_test("ep-lifecycle", format!("http://127.0.0.1:{closed}"), "t", work.path())
    };
    let settings = config.resolve().await.expect("resolves");
    let shutdown = CancellationToken::new();
    (tokio::spawn(htfaas_ep::run(settings, shutdown.clone())), shutdown, work)
}

/// An hour, in seconds.
const HOUR: u64 = 3600;

/// The EP left at its limit: not before, and within the minute its checks take.
fn assert_left_at(left: Duration, limit_s: u64) {
    let limit = Duration::from_secs(limit_s);
    assert!(left >= limit && left < limit + Duration::from_secs(60), "left after {left:?}, limit {limit:?}");
}

#[tokio::test]
async fn a_running_job_holds_off_idle_shutdown() {
    // Idle limit 2 s (room for the attach before the job arrives), a job of 4 s: the EP stays
    // while it runs, past its idle time, reports it, then leaves 2 s later.
    let mut h = Harness::start_with(|c| c.idle_shutdown_s = Some(2)).await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(h.job_of("long", "sleep-4s", "wiki.txt")));
    // The report comes 4 s on, twice the idle time: the EP stayed while the job ran.
    let r = c.finished().await;
    let reported = Instant::now();
    assert!(!h.ep.is_finished(), "the EP left while a job ran");
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "log: {}", r.log);
    assert!(r.usage.wall_ms >= 4000, "{:?}", r.usage);
    h.ended().await.expect("left cleanly");
    let idle = reported.elapsed();
    assert!(idle >= Duration::from_millis(1800) && idle < Duration::from_secs(6), "left {idle:?} after the report");
}

#[tokio::test]
async fn the_schedulers_lifetime_replaces_the_eps_own_longer_or_shorter() {
    // Started with 2 s to live; the scheduler (an annex extended) says an hour: it stays past 2 s.
    let mut h = Harness::start_with(|c| c.lifetime_s = Some(2)).await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Lifetime { leave_in_ms: 3_600_000 });
    // A job of 4 s, twice its own lifetime: had it kept its own, it would say Draining first.
    c.send(&SchedulerMsg::Assign(h.job_of("long", "sleep-4s", "wiki.txt")));
    let first = c.recv().await;
    assert!(
        matches!(&first, htfaas_functions::proto::EpMsg::Finished(r) if r.outcome == Outcome::Exited { exit_code: 0 }),
        "the EP left at its own lifetime although the scheduler extended it: {first:?}"
    );
    assert!(!h.ep.is_finished(), "the EP left at its own lifetime although the scheduler extended it");
    // Then the annex is deleted: leave now. The running job finishes and is reported first.
    c.send(&SchedulerMsg::Assign(h.job_of("last", "sleep-2s", "wiki.txt")));
    c.send(&SchedulerMsg::Lifetime { leave_in_ms: 0 });
    let draining = c.recv().await;
    assert!(matches!(draining, htfaas_functions::proto::EpMsg::Draining), "{draining:?}");
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "log: {}", r.log);
    h.ended().await.expect("left cleanly");
}
