//! Schedules on the real stack: a function registered with `trigger.schedule` fires on its
//! tick, not on the uploads: at the first minute after its registration, once on each file
//! below its trigger's directory that the trigger is true for, through the firing table like
//! any event (recorded as `event.matched`). A schedule that does not parse is refused at
//! registration, naming the field.

use htfaas_functions::audit::{AuditFilter, AuditKind};
use htfaas_functions::proto::{AuditTrail, JobState};
use htfaas_tests::{grant_out, start_stack, wait_for};
use std::time::Duration;

/// A guest that ends at once, successfully, writing nothing.
const NOOP_WAT: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_function_fires_on_its_minute_once_per_file_and_not_on_uploads() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    grant_out(&client).await;
    let module = client.upload_module(wat::parse_str(NOOP_WAT).expect("wat")).await.expect("upload");
    let mut m = htfaas::stack::demo_manifest(module);
    m.name = "nightly".into();
    m.trigger.path = "/data/sched/**".into();
    m.outputs.dir = "/out/nightly/".into();
    m.trigger.schedule = Some("0 3 * *".into());
    let refused = client.register(&m).await.expect_err("a schedule of four fields");
    assert!(format!("{refused:#}").contains("trigger.schedule"), "{refused:#}");
    m.trigger.schedule = Some("* * * * *".into());
    let record = client.register(&m).await.expect("register");
    for name in ["a.dat", "b.dat"] {
        client.put_bytes(name.as_bytes().to_vec(), &format!("/data/sched/{name}")).await.expect("upload");
    }
    // Its first tick: the first whole minute after its registration.
    let tick_ms = (record.registered_at / 60 + 1) * 60 * 1000;
    let jobs = wait_for("the tick's two jobs", Duration::from_secs(150), || async {
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
}
