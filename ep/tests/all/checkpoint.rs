//! Checkpoints through the EP: a guest that exits with its checkpoint code has `/checkpoint`
//! stored (`Checkpointed`, no outputs) and its next attempt resumes from it; a cancelled run's
//! `/checkpoint` is stored as it was; a checkpoint over its bound is not stored; a hostile
//! archive is refused before the guest runs; the checkpoint is deleted once the job is done.
//!
//! The guest is the example `hostile` in its `count N [every K]` mode (one count a second, kept
//! in `/checkpoint/n`); the storage is the fake's checkpoint area ([`Harness::with_checkpoint`]).

use crate::fake::{Harness, until};
use htfaas_functions::proto::{EpMsg, JobAssignment, Outcome, SchedulerMsg};
use sha2::{Digest as _, Sha256};
use std::io::Read as _;

const FILE: &str = "checkpoint.tar";

/// A `hostile` job `id` running `count` with `args`, keeping checkpoints.
fn counting(h: &Harness, id: &str, args: &[&str], exit_code: Option<i32>, max_bytes: u64) -> JobAssignment {
    let mut job = h.job_of(id, "hostile", "wiki.txt");
    job.args = std::iter::once("count").chain(args.iter().copied()).map(str::to_owned).collect();
    h.with_checkpoint(job, exit_code, max_bytes)
}

/// The stored checkpoint of job `id`.
fn stored(h: &Harness, id: &str) -> Option<axum::body::Bytes> {
    h.seen.lock().expect("lock").checkpoints.get(&format!("{id}/{FILE}")).cloned()
}

/// The count kept in a checkpoint archive (its file `n`).
/// An archive of an empty `/checkpoint`: two zero blocks.
fn empty_archive() -> axum::body::Bytes {
    axum::body::Bytes::from(vec![0u8; 1024])
}

fn count_in(tar: &[u8]) -> u64 {
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().expect("a tar") {
        let mut entry = entry.expect("an entry");
        if entry.path().expect("a path").to_str() == Some("n") {
            let mut text = String::new();
            entry.read_to_string(&mut text).expect("text");
            return text.trim().parse().expect("a count");
        }
    }
    panic!("no n in the checkpoint");
}

/// The requests the fake storage saw for checkpoint areas: (method, status).
fn requests(h: &Harness) -> Vec<(String, u16)> {
    h.seen.lock().expect("lock").checkpoint_requests.iter().map(|(m, _, s)| (m.clone(), *s)).collect()
}

fn req(method: &str, status: u16) -> (String, u16) {
    (method.to_owned(), status)
}

#[tokio::test]
async fn a_checkpoint_exit_is_stored_and_the_next_attempt_resumes_from_it_then_deletes_it() {
    let mut h = Harness::start_with(|c| c.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"))).await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(counting(&h, "count-1", &["4", "every", "2"], Some(85), 1 << 20)));
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Checkpointed { exit_code: 85 }, "log: {}", r.log);
    let first = r.checkpoint.expect("a checkpoint report");
    assert_eq!(first.restored, None, "the first attempt starts afresh");
    let saved = first.saved.expect("stored");
    let tar = stored(&h, "count-1").expect("the storage holds it");
    assert_eq!(saved.sha256, hex::encode(Sha256::digest(&tar)), "the sha256 of what the storage got");
    assert_eq!(saved.bytes, tar.len() as u64);
    assert_eq!(count_in(&tar), 2, "it counted to 2, then asked to be resumed");
    assert!(r.outputs.is_empty() && h.seen.lock().expect("lock").puts.is_empty(), "no outputs stored: {:?}", r.outputs);
    assert_eq!(r.usage.bytes_out, saved.bytes, "the checkpoint's bytes count out");
    assert_eq!(requests(&h), [req("GET", 404), req("PUT", 201)]);

    // The scheduler runs it again: it resumes at 2 and ends.
    c.send(&SchedulerMsg::Assign(counting(&h, "count-1", &["4", "every", "2"], Some(85), 1 << 20)));
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "log: {}", r.log);
    assert!(r.log.contains("starting at 2"), "{}", r.log);
    let second = r.checkpoint.expect("a checkpoint report");
    assert_eq!(second.restored.as_deref(), Some(saved.sha256.as_str()));
    assert_eq!(second.saved, None);
    assert_eq!(r.usage.bytes_in, 9 + saved.bytes, "the input's and the checkpoint's bytes count in");
    let counted = h.seen.lock().expect("lock").puts.get("counted").map(|p| p.2.clone()).expect("counted stored");
    assert_eq!(&counted[..], b"4\n");
    assert_eq!(
        requests(&h)[2..],
        [req("GET", 200), req("DELETE", 204), req("DELETE", 204)],
        "deleted once done, the checkpoint, then its area"
    );
    let last = h.seen.lock().expect("lock").checkpoint_requests.last().map(|r| r.1.clone());
    assert_eq!(last.as_deref(), Some("count-1/"), "the area's directory goes last");
    assert_eq!(stored(&h, "count-1"), None);

    let page = h.metrics_page().await;
    for line in [
        r#"htfaas_ep_checkpoints_total{event="restored"} 1"#,
        r#"htfaas_ep_checkpoints_total{event="saved"} 1"#,
        r#"htfaas_ep_runs_total{outcome="checkpointed"} 1"#,
    ] {
        assert!(page.contains(line), "{line} in:\n{page}");
    }
    h.stop().await;
}

#[tokio::test]
async fn a_cancelled_run_keeps_its_checkpoint_and_a_new_attempt_resumes_from_it() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(counting(&h, "count-stop", &["60"], None, 1 << 20)));
    let n = h.work.path().join("jobs/count-stop/checkpoint/n");
    until("the guest to keep a count", || n.exists()).await;
    c.send(&SchedulerMsg::Cancel { job_id: "count-stop".into(), reason: "held".into(), ends: false });
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Cancelled { reason: "held".into() }, "log: {}", r.log);
    let saved = r.checkpoint.and_then(|c| c.saved).expect("a stop stores the checkpoint");
    let tar = stored(&h, "count-stop").expect("the storage holds it");
    assert_eq!(saved.sha256, hex::encode(Sha256::digest(&tar)));
    let reached = count_in(&tar);
    assert!(reached >= 1, "the count the guest kept");
    assert!(!requests(&h).iter().any(|(m, _)| m == "DELETE"), "a cancel keeps it: {:?}", requests(&h));

    // A new attempt, on this EP or another, starts from there and ends one count later.
    let next = (reached + 1).to_string();
    c.send(&SchedulerMsg::Assign(counting(&h, "count-stop", &[&next], None, 1 << 20)));
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Exited { exit_code: 0 }, "log: {}", r.log);
    assert!(r.log.contains(&format!("starting at {reached}")), "{}", r.log);
    assert_eq!(r.checkpoint.and_then(|c| c.restored), Some(saved.sha256));
    assert_eq!(stored(&h, "count-stop"), None, "deleted once done");
    h.stop().await;
}

/// A cancel that says the job ends (the scheduler removed it) stores nothing and clears the
/// job's area: the checkpoint a former attempt left, then the area's directory.
#[tokio::test]
async fn a_removed_job_clears_its_checkpoint_area_instead_of_storing_it() {
    let mut h = Harness::start().await;
    h.seen.lock().expect("lock").checkpoints.insert("count-gone/checkpoint.tar".into(), empty_archive());
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(counting(&h, "count-gone", &["60"], None, 1 << 20)));
    let n = h.work.path().join("jobs/count-gone/checkpoint/n");
    until("the guest to keep a count", || n.exists()).await;
    c.send(&SchedulerMsg::Cancel { job_id: "count-gone".into(), reason: "removed by admin: x".into(), ends: true });
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Cancelled { reason: "removed by admin: x".into() }, "log: {}", r.log);
    assert_eq!(r.checkpoint.and_then(|c| c.saved), None, "nothing stored");
    assert_eq!(requests(&h), [req("GET", 200), req("DELETE", 204), req("DELETE", 204)]);
    assert_eq!(stored(&h, "count-gone"), None);
    h.stop().await;
}

/// An EP stopping on its own (its host's SIGTERM after a drain) stores a running job's
/// checkpoint and reports the job, so the scheduler resumes it elsewhere at once; a job without
/// a checkpoint is not reported (the scheduler runs it again once the session closes).
#[tokio::test]
async fn a_job_stopped_with_the_ep_is_reported_with_the_checkpoint_it_stored() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(counting(&h, "count-leave", &["600"], None, 1 << 20)));
    let n = h.work.path().join("jobs/count-leave/checkpoint/n");
    until("the guest to keep a count", || n.exists()).await;
    h.shutdown.cancel();
    assert_eq!(c.recv().await, EpMsg::Draining);
    h.stop_now.cancel();
    let r = c.finished().await;
    assert_eq!(r.outcome, Outcome::Cancelled { reason: "EP stopping".into() }, "log: {}", r.log);
    let saved = r.checkpoint.and_then(|c| c.saved).expect("stored as it stopped");
    let tar = stored(&h, "count-leave").expect("the storage holds it");
    assert_eq!(saved.sha256, hex::encode(Sha256::digest(&tar)));
    assert!(count_in(&tar) >= 1, "the count the guest kept");
    h.ended().await.expect("stopped cleanly");
}

#[tokio::test]
async fn a_checkpoint_over_its_bound_is_not_stored_and_fails_the_attempt() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    // Even an empty archive is 1024 bytes.
    c.send(&SchedulerMsg::Assign(counting(&h, "count-big", &["2", "every", "1"], Some(85), 1000)));
    let r = c.finished().await;
    let Outcome::OutputExceeded { reason } = &r.outcome else { panic!("want output_exceeded: {:?}", r.outcome) };
    assert!(reason.contains("over its bound of 1000 bytes"), "{reason}");
    let report = r.checkpoint.expect("a checkpoint report");
    assert_eq!(report.saved, None);
    assert!(report.not_saved.is_some_and(|why| why.contains("1000 bytes")));
    assert_eq!(stored(&h, "count-big"), None);
    assert!(!requests(&h).iter().any(|(m, _)| m == "PUT"), "nothing uploaded: {:?}", requests(&h));
    assert!(r.outputs.is_empty());
    h.stop().await;
}

#[tokio::test]
async fn a_hostile_checkpoint_is_refused_before_the_guest_runs() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    // `../escape`, written raw: the tar crate's own setters refuse such a name.
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..9].copy_from_slice(b"../escape");
    header.set_size(3);
    header.set_mode(0o644);
    header.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&header, &b"out"[..]).expect("append");
    let hostile = b.into_inner().expect("finish");
    h.seen.lock().expect("lock").checkpoints.insert(format!("count-evil/{FILE}"), hostile.into());
    c.send(&SchedulerMsg::Assign(counting(&h, "count-evil", &["1"], None, 1 << 20)));
    let r = c.finished().await;
    let Outcome::InputFailed { reason } = &r.outcome else { panic!("want input_failed: {:?}", r.outcome) };
    assert!(reason.contains("refused: a path with `..`"), "{reason}");
    assert_eq!(r.usage.cpu_ms, 0, "the guest never ran");
    assert!(!h.work.path().join("jobs/escape").exists() && !h.work.path().join("jobs/count-evil/escape").exists());
    h.stop().await;
}
