//! Checkpoints on the real stack, with the `hostile` guest's `count N [every K]` (one step a
//! second, its count kept in `/checkpoint/n`): a job drained off one EP mid-way resumes on
//! another from its checkpoint and ends with the output of an uninterrupted run, sooner than
//! from scratch; a guest that exits with its checkpoint code is resumed until done, each
//! attempt charged and named in the trail; and one that exits so without progress fails.

use htfaas::stack::{demo_manifest, mint_ep_token};
use htfaas_functions::audit::{AuditFilter, AuditKind};
use htfaas_functions::checkpoint::CheckpointPolicy;
use htfaas_functions::manifest::FunctionManifest;
use htfaas_functions::proto::{AuditTrail, EpAction, JobRecord, JobState};
use htfaas_functions::{Resources, time::now_ms};
use htfaas_tests::{guest_wasm, start_stack, wait_for};
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(240);
/// The guest's checkpoint exit code in these tests.
const CODE: i32 = 85;

async fn counter(client: &htfaas::client::Client, name: &str, args: &[&str]) -> FunctionManifest {
    let hostile = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("hostile.wasm")).await;
    let mut m = demo_manifest(hostile.expect("upload hostile"));
    m.name = name.into();
    m.trigger.path = format!("/data/{name}/**");
    m.outputs.dir = format!("/data/{name}-out/");
    m.args = args.iter().map(|a| (*a).to_owned()).collect();
    m.resources = Resources::new(1, 64, 600);
    m.checkpoint = Some(CheckpointPolicy { exit_code: Some(CODE), max_mb: 1 });
    m
}

async fn job_for(client: &htfaas::client::Client, path: &str) -> Option<JobRecord> {
    client.jobs().await.ok()?.into_iter().find(|j| j.event.path == path)
}

async fn ended(client: &htfaas::client::Client, path: &str) -> JobRecord {
    wait_for("the job to end", LIMIT, || async {
        job_for(client, path)
            .await
            .filter(|j| matches!(j.state, JobState::Completed | JobState::Failed | JobState::Removed))
    })
    .await
}

/// An EP of alice's, stopped (not drained) when `stop` is cancelled: its running jobs are
/// interrupted at once.
async fn start_ep(
    dir: &Path,
    scheduler_url: &str,
    name: &str,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let token = mint_ep_token(dir, Some("alice".into()), None, 3600).expect("mint");
    let config = htfaas_ep::Config {
        slots: Resources::new(2, 2048, 600),
        ..htfaas_ep::Config::for_test(name, scheduler_url, token, dir.join(format!("ep-{name}")))
    };
    let settings = config.resolve().await.expect("resolve EP settings");
    tokio::spawn(htfaas_ep::run_with(settings, CancellationToken::new(), stop.clone()))
}

async fn disable_site_ep(client: &htfaas::client::Client) {
    let off = EpAction { reason: "jobs run on the test's EPs".into(), deadline_s: None, group: None };
    client.ep_action("ep-local-1", "disable", &off).await.expect("disable the site EP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_stopped_on_one_ep_resumes_on_another_from_its_checkpoint_with_the_same_output_sooner() {
    // Two minutes from scratch.
    const STEPS: u64 = 120;
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    disable_site_ep(&client).await;
    let steps = STEPS.to_string();
    client.register(&counter(&client, "count", &["count", &steps]).await).await.expect("register");
    let scheduler = stack.info().scheduler_url.clone();
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let ep_a = start_ep(dir.path(), &scheduler, "ep-a", &stop_a).await;
    client.put_bytes(b"go".to_vec(), "/data/count/in.dat").await.expect("put");

    // A third of the way on EP A, the EP stops: the guest is interrupted, its checkpoint kept.
    let running = wait_for("the job running on EP A", LIMIT, || async {
        job_for(&client, "/data/count/in.dat").await.filter(|j| j.state == JobState::Running)
    })
    .await;
    assert_eq!(running.ep.as_deref(), Some("ep-a"));
    let started = running.started_at_ms.expect("started");
    wait_for("a third of its steps", LIMIT, || async { (now_ms() > started + STEPS * 1000 / 3).then_some(()) }).await;
    stop_a.cancel();
    ep_a.await.expect("join").expect("EP A stops cleanly");
    let ep_b = start_ep(dir.path(), &scheduler, "ep-b", &stop_b).await;

    let done = ended(&client, "/data/count/in.dat").await;
    assert_eq!(done.state, JobState::Completed, "{done:#?}");
    assert_eq!(done.ep.as_deref(), Some("ep-b"));
    let counted = client.get_bytes("/data/count-out/counted").await.expect("get").expect("the output");
    assert_eq!(counted, format!("{STEPS}\n").into_bytes(), "the output of an uninterrupted run");
    let history = client.job_history(&done.id).await.expect("history");
    let last = history.last().expect("attempts");
    assert_eq!((history.len(), last.outcome.as_str()), (2, "completed"), "{history:#?}");
    assert_eq!(history[0].outcome, "vacated", "stopped with its checkpoint stored: no retry used");
    let wall_ms = last.usage.expect("usage").wall_ms;
    println!(
        "resumed on ep-b in {wall_ms} ms; {STEPS} steps of a second take at least {} ms from scratch",
        STEPS * 1000
    );
    assert!(wall_ms < STEPS * 1000, "resumed, not from scratch: {wall_ms} ms for {STEPS} steps of a second");
    // Its record names the checkpoint it started from.
    let filter = AuditFilter { job: Some(done.id.clone()), ..AuditFilter::default() };
    let trail = client.audit_trail(AuditTrail::Scheduler, &filter).await.expect("trail");
    let finished = trail.iter().rfind(|r| r.kind == AuditKind::JobFinished).expect("job.finished");
    assert!(finished.detail["checkpoint"]["restored"].is_string(), "{:#}", finished.detail);

    stop_b.cancel();
    ep_b.await.expect("join").expect("EP B stops cleanly");
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_exiting_with_its_checkpoint_code_is_resumed_until_done_and_without_progress_fails() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    client.register(&counter(&client, "steps", &["count", "6", "every", "2"]).await).await.expect("register");
    client.register(&counter(&client, "stuck", &["exit", "85"]).await).await.expect("register");
    client.put_bytes(b"go".to_vec(), "/data/steps/in.dat").await.expect("put");
    client.put_bytes(b"go".to_vec(), "/data/stuck/in.dat").await.expect("put");

    let done = ended(&client, "/data/steps/in.dat").await;
    assert_eq!(done.state, JobState::Completed, "{done:#?}");
    assert_eq!(client.get_bytes("/data/steps-out/counted").await.expect("get"), Some(b"6\n".to_vec()));
    let history = client.job_history(&done.id).await.expect("history");
    let outcomes: Vec<&str> = history.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(outcomes, ["checkpointed", "checkpointed", "completed"], "{history:#?}");
    assert!(history.iter().all(|a| a.usage.is_some_and(|u| u.wall_ms > 0)), "each attempt charged: {history:#?}");
    // The trail names each resumed attempt and what it stored.
    let filter = AuditFilter { job: Some(done.id.clone()), ..AuditFilter::default() };
    let trail = client.audit_trail(AuditTrail::Scheduler, &filter).await.expect("trail");
    let resumed: Vec<_> = trail.iter().filter(|r| r.detail["then"] == "resume").collect();
    assert_eq!(resumed.len(), 2, "{trail:#?}");
    for (r, attempt) in resumed.iter().zip([1, 2]) {
        assert_eq!(r.detail["attempt"], attempt, "{:#}", r.detail);
        assert!(r.detail["checkpoint"]["saved"]["sha256"].is_string(), "{:#}", r.detail);
    }

    // Exiting with the code again and again, storing the same (empty) state: it fails.
    let stuck = ended(&client, "/data/stuck/in.dat").await;
    assert_eq!(stuck.state, JobState::Failed, "{stuck:#?}");
    assert!(stuck.reason.contains("without storing a new checkpoint"), "{}", stuck.reason);
    stack.stop().await.expect("clean stop");
}

/// The checkpoint areas under the stack's storage, with whether each holds a checkpoint.
fn areas(dir: &Path) -> Vec<(String, bool)> {
    let root = dir.join("storage/data/checkpoints");
    let Ok(entries) = std::fs::read_dir(root) else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path().join("checkpoint.tar").exists()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_ends_away_from_its_ep_leaves_no_checkpoint_area_behind() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    client.register(&counter(&client, "stuck", &["exit", "85"]).await).await.expect("register");
    client.register(&counter(&client, "parked", &["count", "600"]).await).await.expect("register");

    // Failed by the scheduler (no progress between checkpoint exits) after its EP stored one:
    // the gateway, told the job failed, clears its area.
    client.put_bytes(b"go".to_vec(), "/data/stuck/in.dat").await.expect("put");
    let stuck = ended(&client, "/data/stuck/in.dat").await;
    assert_eq!(stuck.state, JobState::Failed, "{stuck:#?}");
    wait_for("the failed job's area cleared", LIMIT, || async { areas(dir.path()).is_empty().then_some(()) }).await;

    // Held while it runs: its EP stores the checkpoint (the job may be released). Removed while
    // held, no EP has it: the gateway clears the area.
    client.put_bytes(b"go".to_vec(), "/data/parked/in.dat").await.expect("put");
    let running = wait_for("the job running", LIMIT, || async {
        job_for(&client, "/data/parked/in.dat").await.filter(|j| j.state == JobState::Running)
    })
    .await;
    client.job_action(&running.id, "hold", "for the test").await.expect("hold");
    let kept = wait_for("the held job's checkpoint stored", LIMIT, || async {
        let a = areas(dir.path());
        (a.len() == 1 && a[0].1).then_some(a)
    })
    .await;
    client.job_action(&running.id, "remove", "not wanted").await.expect("remove");
    wait_for("the removed job's area cleared", LIMIT, || async { areas(dir.path()).is_empty().then_some(()) }).await;
    println!("cleared {kept:?}");
    stack.stop().await.expect("clean stop");
}
