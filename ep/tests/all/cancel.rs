//! `SchedulerMsg::Cancel` through the EP: a running guest is stopped long before its wall-time
//! cap, a transfer in progress is aborted, nothing is uploaded after the cancel, the report is
//! `Cancelled` with the reason and the usage so far, and the EP serves on. A guest in a long
//! sleep is stopped by its cancel or at its cap like any other.

use crate::fake::{Harness, SLOW_FIRST_CHUNK, until};
use htfaas_functions::proto::{JobReport, Outcome, SchedulerMsg};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn cancel(job_id: &str, reason: &str) -> SchedulerMsg {
    SchedulerMsg::Cancel { job_id: job_id.into(), reason: reason.into(), ends: true }
}

#[tokio::test]
async fn cancel_stops_a_running_guest_long_before_its_cap_and_the_ep_serves_on() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    // A guest that wrote an output and spins (cap 30 s), and a neighbour sleeping 2 s.
    c.send(&SchedulerMsg::Assign(h.job_of("spin-1", "spin-writer", "wiki.txt")));
    c.send(&SchedulerMsg::Assign(h.job_of("sleep-1", "sleep-2s", "wiki.txt")));
    let partial = h.output_dir("spin-1").join("partial.txt");
    until("the spinning guest to write its output", || partial.exists()).await;
    // Let it spin a while, so that the usage so far has CPU time to show.
    tokio::time::sleep(Duration::from_millis(300)).await;

    c.send(&cancel("no-such-job", "never assigned here")); // ignored
    let sent = Instant::now();
    c.send(&cancel("spin-1", "owner removed the job"));
    let r = c.finished().await;
    let took = sent.elapsed();
    assert_eq!(r.job_id, "spin-1");
    assert_eq!(r.outcome, Outcome::Cancelled { reason: "owner removed the job".into() }, "log: {}", r.log);
    assert!(took < Duration::from_secs(2), "cancel took {took:?} (cap 30 s)");
    assert!(r.usage.cpu_ms >= 20, "usage so far: {:?}", r.usage);
    assert_eq!(r.usage.peak_memory_bytes, 65536, "{:?}", r.usage);
    assert_eq!(r.usage.bytes_in, 9);
    assert!(r.outputs.is_empty() && r.usage.bytes_out == 0, "{r:?}");
    assert!(h.seen.lock().expect("lock").puts.is_empty(), "an output was uploaded after the cancel");

    // The neighbour was not touched, and the EP takes new work.
    let r = c.finished().await;
    assert_eq!((r.job_id.as_str(), &r.outcome), ("sleep-1", &Outcome::Exited { exit_code: 0 }), "{}", r.log);
    c.send(&SchedulerMsg::Assign(h.job("after", "wiki.txt")));
    let r = c.finished().await;
    assert_eq!((r.job_id.as_str(), &r.outcome), ("after", &Outcome::Exited { exit_code: 0 }), "{}", r.log);
    assert!(!r.outputs.is_empty());

    // A cancel for a job already reported is ignored too.
    c.send(&cancel("spin-1", "again"));
    c.send(&SchedulerMsg::Assign(h.job("after-2", "wiki.txt")));
    assert_eq!(c.finished().await.job_id, "after-2");
    h.stop().await;
}

#[tokio::test]
async fn cancel_during_the_input_download_aborts_it() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(h.job_of("slow-in", "checksum", "slow/big.dat")));
    until("the input download to start", || h.seen.lock().expect("lock").slow_gets == 1).await;
    // Until the first chunk is read: it sits in the EP's write buffer, where nothing outside
    // shows it, and the report must count it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    c.send(&cancel("slow-in", "input deleted"));
    let r = c.finished().await;
    assert!(sent.elapsed() < Duration::from_secs(2), "took {:?}", sent.elapsed());
    assert_eq!(r.outcome, Outcome::Cancelled { reason: "input deleted".into() }, "log: {}", r.log);
    assert!(r.usage.bytes_in >= SLOW_FIRST_CHUNK as u64, "bytes read so far: {:?}", r.usage);
    assert_eq!(r.usage.cpu_ms, 0, "the guest never ran");
    until("the download's connection to close", || h.slow_dropped.load(Ordering::SeqCst)).await;
    assert!(h.seen.lock().expect("lock").puts.is_empty());
    h.stop().await;
}

#[tokio::test]
async fn cancel_during_the_output_upload_aborts_it() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    let mut job = h.job("slow-out", "wiki.txt");
    job.output.url = format!("{}/storage/hang-out/", h.base);
    c.send(&SchedulerMsg::Assign(job));
    until("the output upload to start", || h.seen.lock().expect("lock").hang_puts == 1).await;
    let sent = Instant::now();
    c.send(&cancel("slow-out", "owner over quota"));
    let r = c.finished().await;
    assert!(sent.elapsed() < Duration::from_secs(2), "took {:?}", sent.elapsed());
    assert_eq!(r.outcome, Outcome::Cancelled { reason: "owner over quota".into() }, "log: {}", r.log);
    assert!(r.outputs.is_empty(), "an output whose PUT never completed is not reported: {:?}", r.outputs);
    assert!(r.log.contains("cancelled while storing outputs"), "{}", r.log);
    assert!(r.usage.peak_memory_bytes > 0 && r.usage.bytes_in == 9, "the run's usage is kept: {:?}", r.usage);
    h.stop().await;
}

#[tokio::test]
async fn several_jobs_cancelled_at_once_each_report_their_own_reason() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    for id in ["a", "b"] {
        c.send(&SchedulerMsg::Assign(h.job_of(id, "spin-writer", "wiki.txt")));
    }
    for id in ["a", "b"] {
        let partial = h.output_dir(id).join("partial.txt");
        until("both guests to run", || partial.exists()).await;
    }
    c.send(&cancel("a", "reason a"));
    c.send(&cancel("b", "reason b"));
    let mut reports: HashMap<String, JobReport> = HashMap::new();
    for _ in 0..2 {
        let r = c.finished().await;
        reports.insert(r.job_id.clone(), r);
    }
    assert_eq!(reports["a"].outcome, Outcome::Cancelled { reason: "reason a".into() });
    assert_eq!(reports["b"].outcome, Outcome::Cancelled { reason: "reason b".into() });
    h.stop().await;
}

#[tokio::test]
async fn a_guest_in_a_long_sleep_is_stopped_by_its_cancel_or_at_its_cap() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(h.job_of("sleeper", "sleep-60s", "wiki.txt")));
    let mut capped = h.job_of("capped", "sleep-60s", "wiki.txt");
    capped.resources.runtime_s = 1;
    let assigned = Instant::now();
    c.send(&SchedulerMsg::Assign(capped));
    // Into its sleep (nothing outside shows when a guest enters a host call), so that the cancel
    // finds it there.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = Instant::now();
    c.send(&cancel("sleeper", "too slow"));
    let mut reports: HashMap<String, (JobReport, Duration)> = HashMap::new();
    for _ in 0..2 {
        let r = c.finished().await;
        let at = if r.job_id == "sleeper" { sent.elapsed() } else { assigned.elapsed() };
        reports.insert(r.job_id.clone(), (r, at));
    }
    let (r, took) = &reports["sleeper"];
    assert_eq!(r.outcome, Outcome::Cancelled { reason: "too slow".into() }, "log: {}", r.log);
    assert!(r.log.contains("guest was in a host call when the job was cancelled"), "{}", r.log);
    assert!(!r.log.contains("did not stop"), "its thread was left behind: {}", r.log);
    assert!(*took < Duration::from_secs(5), "reported {took:?} after the cancel");
    let (r, took) = &reports["capped"];
    assert_eq!(r.outcome, Outcome::TimeExceeded { limit_s: 1, vacate: None }, "log: {}", r.log);
    assert!(!r.log.contains("did not stop"), "its thread was left behind: {}", r.log);
    assert!(*took < Duration::from_secs(6), "reported {took:?} after the assignment (cap 1 s)");

    // The EP serves on.
    c.send(&SchedulerMsg::Assign(h.job("after", "wiki.txt")));
    assert_eq!(c.finished().await.outcome, Outcome::Exited { exit_code: 0 });
    h.stop().await;
}
