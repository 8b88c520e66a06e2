//! The EP's side of prefetch: assigned jobs beyond its free resources wait in a local
//! queue and start as its resources free; a queued job cancelled never starts; one that waits
//! past the granted wait, and every queued job at a drain, is handed back unstarted.

use crate::fake::{Harness, until};
use htfaas_functions::Resources;
use htfaas_functions::proto::{EpMsg, Outcome, Prefetch, SchedulerMsg};

/// An EP of one core, so that a second one-core job waits in its queue.
async fn one_core() -> Harness {
    Harness::start_with(|c| c.slots = Resources::new(1, 512, 60)).await
}

fn cancel(id: &str) -> SchedulerMsg {
    SchedulerMsg::Cancel { job_id: id.into(), reason: "stop".into(), ends: false }
}

#[tokio::test]
async fn the_hello_asks_for_twice_as_many_jobs_as_cores_by_default() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    let hello = c.hello_welcome().await;
    assert_eq!(hello.slots.cpus, 2);
    assert_eq!(hello.prefetch, Some(4));
    h.stop().await;
}

/// A queued job cancelled by the scheduler is answered `Cancelled` with nothing used, and
/// never starts (its input is never fetched); the running job is untouched.
#[tokio::test]
async fn a_cancelled_queued_job_never_starts() {
    let mut h = one_core().await;
    let mut c = h.conn().await;
    c.hello_welcome_prefetch(Prefetch { jobs: 1, wait_ms: 60_000 }).await;
    c.send(&SchedulerMsg::Assign(h.job_of("long", "sleep-60s", "wiki.txt")));
    let seen = h.seen.clone();
    until("the first job fetched its input", || seen.lock().expect("lock").input_auth.len() == 1).await;
    c.send(&SchedulerMsg::Assign(h.job("queued", "wiki.txt")));
    c.send(&cancel("queued"));
    let r = c.finished().await;
    assert_eq!(r.job_id, "queued");
    assert_eq!(r.outcome, Outcome::Cancelled { reason: "stop".into() });
    assert_eq!((r.usage.bytes_in, r.usage.cpu_ms, r.outputs.len()), (0, 0, 0));
    assert_eq!(h.seen.lock().expect("lock").input_auth.len(), 1, "the queued job fetched nothing");
    c.send(&cancel("long"));
    let r = c.finished().await;
    assert_eq!((r.job_id.as_str(), matches!(r.outcome, Outcome::Cancelled { .. })), ("long", true));
    h.stop().await;
}

/// The queued job starts the moment the running one ends (here: is cancelled), and runs to
/// the end.
#[tokio::test]
async fn a_queued_job_starts_when_the_running_one_ends() {
    let mut h = one_core().await;
    let mut c = h.conn().await;
    c.hello_welcome_prefetch(Prefetch { jobs: 1, wait_ms: 60_000 }).await;
    c.send(&SchedulerMsg::Assign(h.job_of("long", "sleep-60s", "wiki.txt")));
    c.send(&SchedulerMsg::Assign(h.job("next", "wiki.txt")));
    let seen = h.seen.clone();
    until("the first job fetched its input", || !seen.lock().expect("lock").input_auth.is_empty()).await;
    c.send(&cancel("long"));
    let first = c.finished().await;
    assert_eq!(first.job_id, "long", "the queued job waited for the core");
    let next = c.finished().await;
    assert_eq!(next.job_id, "next");
    assert_eq!(next.outcome, Outcome::Exited { exit_code: 0 }, "{}", next.log);
    h.stop().await;
}

/// A queued job that cannot start within the granted wait is handed back unstarted.
#[tokio::test]
async fn a_queued_job_past_its_wait_is_handed_back_unstarted() {
    let mut h = one_core().await;
    let mut c = h.conn().await;
    c.hello_welcome_prefetch(Prefetch { jobs: 1, wait_ms: 200 }).await;
    c.send(&SchedulerMsg::Assign(h.job_of("long", "sleep-60s", "wiki.txt")));
    c.send(&SchedulerMsg::Assign(h.job("late", "wiki.txt")));
    match c.recv().await {
        EpMsg::NotStarted { job_id, reason } => {
            assert_eq!(job_id, "late");
            assert!(reason.contains("prefetch wait"), "{reason}");
        }
        other => panic!("want not_started, got {other:?}"),
    }
    let seen = h.seen.clone();
    until("the running job fetched its input", || !seen.lock().expect("lock").input_auth.is_empty()).await;
    c.send(&cancel("long"));
    assert_eq!(c.finished().await.job_id, "long");
    assert_eq!(h.seen.lock().expect("lock").input_auth.len(), 1, "only the running job fetched its input");
    h.stop().await;
}

/// A drain hands the queued jobs back at once (after `Draining`), lets the running one finish,
/// then the EP leaves.
#[tokio::test]
async fn a_drain_hands_back_the_queued_jobs() {
    let mut h = one_core().await;
    let mut c = h.conn().await;
    c.hello_welcome_prefetch(Prefetch { jobs: 2, wait_ms: 60_000 }).await;
    c.send(&SchedulerMsg::Assign(h.job_of("long", "sleep-60s", "wiki.txt")));
    c.send(&SchedulerMsg::Assign(h.job("q1", "wiki.txt")));
    c.send(&SchedulerMsg::Assign(h.job("q2", "wiki.txt")));
    let seen = h.seen.clone();
    until("the first job fetched its input", || !seen.lock().expect("lock").input_auth.is_empty()).await;
    h.shutdown.cancel();
    assert!(matches!(c.recv().await, EpMsg::Draining));
    for want in ["q1", "q2"] {
        match c.recv().await {
            EpMsg::NotStarted { job_id, reason } => {
                assert_eq!((job_id.as_str(), reason.as_str()), (want, "EP draining"))
            }
            other => panic!("want not_started, got {other:?}"),
        }
    }
    c.send(&cancel("long"));
    assert_eq!(c.finished().await.job_id, "long");
    assert!(c.recv_or_closed().await.is_none(), "drained: the EP leaves");
    h.ended().await.expect("EP stops cleanly");
}
