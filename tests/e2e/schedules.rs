//! Schedules on the real stack: a function registered with `trigger.schedule` fires on its
//! tick, not on the uploads: at the first minute after its registration, once on each file
//! below its trigger's directory that the trigger is true for, through the firing table like
//! any event (recorded as `event.matched`). A schedule that does not parse is refused at
//! registration, naming the field. A schedule with neither a path nor a rule runs once per tick
//! on no file: its job reads only its reference inputs (a directory listed for the job), and
//! its output's lineage shows no input.

use htfaas_functions::audit::{AuditFilter, AuditKind};
use htfaas_functions::proto::{AuditTrail, JobState, LineageRelation};
use htfaas_tests::{grant_out, start_stack, upload_checksum, wait_for};
use sha2::Digest as _;
use std::time::Duration;

/// A guest that ends at once, successfully, writing nothing.
const NOOP_WAT: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;
/// How long a tick's effects may take on a loaded machine: the tick itself is up to a minute
/// away, then the job is queued, run and recorded.
const LIMIT: Duration = Duration::from_secs(300);
/// The directory the summary reads, and its files.
const LISTED: &str = "/data/listed/";
const LISTED_FILES: [(&str, &[u8]); 2] = [("x.dat", b"the first listed file"), ("y.dat", b"the second")];

/// The first tick of an every-minute schedule registered at `registered_at` (Unix s): the first
/// whole minute after it, Unix ms.
fn first_tick_ms(registered_at: u64) -> u64 {
    (registered_at / 60 + 1) * 60 * 1000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_function_fires_on_its_minute_once_per_file_and_not_on_uploads() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    grant_out(&client).await;
    let module = client.upload_module(wat::parse_str(NOOP_WAT).expect("wat")).await.expect("upload");
    let checksum = upload_checksum(&client).await;
    // The summary's reference directory is there before any tick can come.
    for (name, bytes) in LISTED_FILES {
        client.put_bytes(bytes.to_vec(), &format!("{LISTED}{name}")).await.expect("a listed file");
    }
    let mut m = htfaas::stack::demo_manifest(module);
    m.name = "nightly".into();
    m.trigger.path = "/data/sched/**".into();
    m.outputs.dir = "/out/nightly/".into();
    m.trigger.schedule = Some("0 3 * *".into());
    let refused = client.register(&m).await.expect_err("a schedule of four fields");
    assert!(format!("{refused:#}").contains("trigger.schedule"), "{refused:#}");
    m.trigger.schedule = Some("* * * * *".into());
    let record = client.register(&m).await.expect("register");
    // A summary on no file: every minute, reading the listed directory alone (the checksum
    // guest, given the first listed file's guest path).
    let mut summary = htfaas::stack::demo_manifest(checksum);
    summary.name = "summary".into();
    summary.trigger =
        htfaas_functions::Trigger { schedule: Some("* * * * *".into()), ..htfaas_functions::Trigger::on_path("") };
    summary.outputs.dir = "/data/summary/".into();
    summary.inputs.refs = vec![LISTED.into()];
    summary.args = vec![format!("/input/ref{LISTED}x.dat")];
    let summary_record = client.register(&summary).await.expect("register the summary");
    for name in ["a.dat", "b.dat"] {
        client.put_bytes(name.as_bytes().to_vec(), &format!("/data/sched/{name}")).await.expect("upload");
    }
    // Each one's first tick, from its own registration (the two may straddle a minute).
    let tick_ms = first_tick_ms(record.registered_at);
    let summary_tick_ms = first_tick_ms(summary_record.registered_at);
    let jobs = wait_for("the tick's two jobs", LIMIT, || async {
        let jobs: Vec<_> = client.jobs().await.ok()?.into_iter().filter(|j| j.function == "nightly").collect();
        (jobs.len() >= 2 && jobs.iter().all(|j| j.state.is_final())).then_some(jobs)
    })
    .await;
    let mut paths: Vec<&str> = jobs.iter().map(|j| j.event.path.as_str()).collect();
    paths.sort();
    assert_eq!(paths[..2], ["/data/sched/a.dat", "/data/sched/b.dat"], "{jobs:#?}");
    for j in &jobs {
        assert_eq!(j.state, JobState::Completed, "{j:#?}");
        assert!(j.submitted_at_ms >= tick_ms, "fired before its tick, by an upload: {j:#?}");
        assert!(j.event.source.starts_with("backfill:schedule:"), "a tick's listing, not an upload: {j:#?}");
    }
    // Once per file per tick: the first tick's firings are the two files, no more.
    let first: Vec<_> = jobs.iter().filter(|j| j.event.source == format!("backfill:schedule:{tick_ms}")).collect();
    assert_eq!(first.len(), 2, "{jobs:#?}");
    // Each firing is in the gateway's trail like an event's.
    let filter = AuditFilter { function: Some("nightly".into()), ..AuditFilter::default() };
    let records = client.audit_trail(AuditTrail::Gateway, &filter).await.expect("the gateway's trail");
    assert!(records.iter().any(|r| r.kind == AuditKind::EventMatched), "{records:#?}");

    // The summary: its first tick's one job, on no file, ended.
    let source = format!("backfill:schedule:{summary_tick_ms}");
    let job = wait_for("the summary's first tick's job, ended", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        jobs.into_iter().find(|j| j.function == "summary" && j.event.source == source && j.state.is_final())
    })
    .await;
    assert_eq!(job.state, JobState::Completed, "{job:#?}");
    assert_eq!(job.event.id, format!("backfill:schedule:summary:{summary_tick_ms}"), "{job:#?}");
    assert_eq!((job.event.path.as_str(), job.input.as_str()), ("", ""), "a run on no file: {job:#?}");
    assert!(job.submitted_at_ms >= summary_tick_ms, "{job:#?}");
    let of_tick = client.jobs().await.expect("jobs");
    let of_tick: Vec<_> = of_tick.iter().filter(|j| j.function == "summary" && j.event.source == source).collect();
    assert_eq!(of_tick.len(), 1, "once per tick: {of_tick:#?}");
    // It read the listed directory: its output is the checksum of the first listed file.
    let out = format!("{}x.dat.checksums.json", summary.outputs.dir);
    let got = wait_for("the summary's output", LIMIT, || async { client.get_bytes(&out).await.ok().flatten() }).await;
    let got = String::from_utf8(got).expect("UTF-8");
    let sha256 = |bytes: &[u8]| hex::encode(sha2::Sha256::digest(bytes));
    let (_, x) = LISTED_FILES[0];
    assert!(got.contains(&format!("\"sha256\":\"{}\"", sha256(x))), "{got}");
    assert!(got.contains(&format!("\"size\":{}", x.len())), "{got}");
    // Its lineage: the job that wrote it, with both trails' records, read no input and every
    // file of the listed directory.
    let step = wait_for("the summary's step, its records written", LIMIT, || async {
        let lineage = client.lineage(&out).await.ok()?;
        let step = lineage.steps.into_iter().find(|s| s.job == job.id && s.relation == LineageRelation::Wrote)?;
        let kinds: Vec<&AuditKind> = step.records.iter().map(|r| &r.kind).collect();
        let recorded = [AuditKind::JobAccepted, AuditKind::JobFinished, AuditKind::EventMatched]
            .iter()
            .all(|k| kinds.contains(&k));
        (recorded && step.refs.len() == LISTED_FILES.len()).then_some(step)
    })
    .await;
    assert_eq!(step.function.as_deref(), Some("summary"), "{step:#?}");
    assert_eq!(step.input, None, "a run on no file shows no input: {step:#?}");
    for (name, bytes) in LISTED_FILES {
        let path = format!("{LISTED}{name}");
        assert!(step.refs.iter().any(|r| r.path == path && r.sha256 == sha256(bytes)), "{path}: {step:#?}");
    }
    stack.stop().await.expect("clean stop");
}
