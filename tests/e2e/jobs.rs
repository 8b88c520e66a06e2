//! An admin holds, releases and removes jobs, as with `condor_hold`, `condor_release` and
//! `condor_rm`: a held running job is stopped on its EP and waits; released, it runs again;
//! removed, it is gone and its EP is free.

use htfaas::stack::{SubmitGrant, mint_submit_token};
use htfaas_functions::Resources;
use htfaas_functions::proto::{HOLD_CODE_BY_ADMIN, JobRecord, JobState};
use htfaas_tests::{register_spin, start_stack, wait_for};
use std::time::Duration;

async fn state_of(client: &htfaas::client::Client, id: &str, want: JobState) -> Option<JobRecord> {
    client.jobs().await.ok()?.into_iter().find(|j| j.id == id && j.state == want)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_holds_releases_and_removes_a_running_job() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    register_spin(&client).await;
    let grant = SubmitGrant {
        owner: "bob".into(),
        jobs: 1,
        limits: Resources::new(1, 64, 120),
        function: None,
        group: None,
        ttl_s: 600,
    };
    htfaas_tests::share_data(&client, "bob").await;
    let token = mint_submit_token(dir.path(), &grant).expect("mint");
    let id = client.run_function(&token, "spin", "/data/spin/in.dat").await.expect("submit").job_id;
    let wait = Duration::from_secs(20);
    wait_for("the job to run", wait, || state_of(&client, &id, JobState::Running)).await;

    // Hold: stopped on the EP, kept with the reason, not run again while held.
    let held = client.job_action(&id, "hold", "calibration constants are wrong").await.expect("hold");
    assert_eq!((held.state, held.hold_code), (JobState::Held, Some(HOLD_CODE_BY_ADMIN)));
    assert!(held.reason.contains("calibration constants are wrong"), "{held:?}");
    let err = client.job_action(&id, "hold", "again").await.expect_err("already held");
    assert!(format!("{err:#}").contains("409"), "{err:#}");
    // The EP's report of the stopped run (its reservation freed with it) is where a held job
    // could wrongly go back to the queue: after it, the EP is free and the job still held.
    wait_for("the EP's report of the stopped run", wait, || async {
        let eps = client.eps().await.ok()?;
        eps.iter().all(|e| !e.running.contains(&id)).then_some(())
    })
    .await;
    let still = client.jobs().await.expect("jobs").into_iter().find(|j| j.id == id).expect("job");
    assert_eq!(still.state, JobState::Held, "a free EP must not take a held job");

    // Release: it runs again.
    let released = client.job_action(&id, "release", "fixed").await.expect("release");
    assert_eq!(released.hold_code, None);
    wait_for("the released job to run", wait, || state_of(&client, &id, JobState::Running)).await;

    // Remove: stopped and gone for good; removing again is refused.
    let removed = client.job_action(&id, "remove", "not needed").await.expect("remove");
    assert_eq!(removed.state, JobState::Removed);
    assert!(removed.reason.contains("not needed"), "{removed:?}");
    let err = client.job_action(&id, "remove", "again").await.expect_err("already removed");
    assert!(format!("{err:#}").contains("409"), "{err:#}");
    let err = client.job_action("no-such-job", "hold", "x").await.expect_err("unknown");
    assert!(format!("{err:#}").contains("404"), "{err:#}");
    stack.stop().await.expect("clean stop");
}
