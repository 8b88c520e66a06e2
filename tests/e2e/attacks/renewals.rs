//! Attacks on the renewal of a running job's macaroons, by an EP: asking for the
//! macaroons of a job that runs on another EP (or of no job), and for those of a job whose
//! token was revoked. This test is the EP (attached with an annex token, so the annex's jobs
//! come here); the stack's own EP runs the other job. The stack's macaroons last a few seconds.

use crate::probe_ep::{Ws, attach_probe, next_msg};
use futures_util::SinkExt as _;
use htfaas::stack::demo_manifest;
use htfaas_functions::Resources;
use htfaas_functions::audit::{AuditFilter, AuditKind};
use htfaas_functions::macaroon::inspect;
use htfaas_functions::proto::{EpMsg, JobAssignment, JobState, RevocationTarget, SchedulerMsg};
use htfaas_tests::{guest_wasm, start_stack_with, wait_for};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

const LIMIT: Duration = Duration::from_secs(60);

/// Sends Renew for `job_id` and returns the answer to it (a Cancel on the way is skipped).
async fn renew(ws: &mut Ws, job_id: &str) -> SchedulerMsg {
    let ask = EpMsg::Renew { job_id: job_id.to_owned() };
    ws.send(Message::text(serde_json::to_string(&ask).expect("encode"))).await.expect("renew");
    loop {
        match next_msg(ws).await {
            SchedulerMsg::Cancel { .. } => continue,
            msg => return msg,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ep_gets_no_macaroons_for_a_job_it_does_not_run_nor_for_a_revoked_one() {
    let (dir, stack) = start_stack_with(crate::renew::short_validity).await;
    let client = stack.client().expect("client");
    // A long job on the stack's EP.
    let hostile = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("hostile.wasm")).await;
    let mut sleeper = demo_manifest(hostile.expect("upload hostile"));
    sleeper.name = "sleeper".into();
    sleeper.trigger.path = "/data/long/**".into();
    sleeper.outputs.dir = "/data/long-out/".into();
    sleeper.args = vec!["sleep".into(), "60".into()];
    sleeper.resources = Resources::new(1, 64, 120);
    client.register(&sleeper).await.expect("register the sleeper");
    // An annex function, whose jobs come to this test.
    let mut ws = attach_probe(&stack, dir.path(), "probe").await;

    // 1. Another EP's job: refused, and no macaroons.
    client.put_bytes(b"long".to_vec(), "/data/long/in.dat").await.expect("put");
    let theirs = wait_for("the sleeper running on the stack's EP", LIMIT, || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.function == "sleeper" && j.state == JobState::Running)
    })
    .await;
    for job_id in [theirs.id.as_str(), "no-such-job"] {
        match renew(&mut ws, job_id).await {
            SchedulerMsg::RenewRefused { job_id: refused, reason } => {
                assert_eq!(refused, job_id);
                assert!(reason.contains("not running on this EP"), "{reason}");
            }
            other => panic!("renewed another EP's job {job_id}: {other:?}"),
        }
    }

    // 2. Its own job: renewed, to the same deadline and bound to its address.
    client.put_bytes(b"probe".to_vec(), "/data/probe/in.dat").await.expect("put");
    let a: JobAssignment = match next_msg(&mut ws).await {
        SchedulerMsg::Assign(a) => a,
        other => panic!("expected an assign, got {other:?}"),
    };
    assert!(a.renew_until.is_some(), "the job is renewable: {:?}", a.renew_until);
    let deadline = inspect(&a.input.as_ref().expect("an input").macaroon)
        .expect("parses")
        .into_iter()
        .rfind(|c| c.starts_with("before:"));
    match renew(&mut ws, &a.job_id).await {
        SchedulerMsg::Renewed { job_id, input_macaroon, output_macaroon, .. } => {
            assert_eq!(job_id, a.job_id);
            let input_macaroon = input_macaroon.expect("a read macaroon for the job's input");
            for m in [&input_macaroon, &output_macaroon] {
                let caveats = inspect(m).expect("parses");
                let n = caveats.len();
                assert_eq!(caveats[n - 1], "ip:127.0.0.1", "{caveats:?}");
                assert_eq!(Some(&caveats[n - 2]), deadline.as_ref(), "{caveats:?}");
            }
        }
        other => panic!("own job not renewed: {other:?}"),
    }

    // 3. Revoked: its token is revoked; a renewal is refused, and no macaroons come.
    let owner_jobs = client.jobs().await.expect("jobs");
    let probe_job = owner_jobs.iter().find(|j| j.id == a.job_id).expect("the probe's job");
    let jti = probe_job.token_jti.clone();
    client.revoke(RevocationTarget::Jti(jti), "leaked").await.expect("revoke");
    match renew(&mut ws, &a.job_id).await {
        SchedulerMsg::RenewRefused { reason, .. } => {
            assert!(reason.contains("not running on this EP") || reason.contains("revoked"), "{reason}");
        }
        other => panic!("a revoked job was renewed: {other:?}"),
    }

    // Every refusal is in the scheduler's trail, with the EP that asked.
    let refused = wait_for("the refusals recorded", LIMIT, || async {
        let records = client.audit(&AuditFilter::default()).await.ok()?;
        let refused: Vec<_> = records
            .into_iter()
            .filter(|r| r.kind == AuditKind::MacaroonsRenewal && !r.detail["refused"].is_null())
            .collect();
        (refused.len() >= 3).then_some(refused)
    })
    .await;
    assert!(refused.iter().all(|r| r.actor.as_deref() == Some("probe-1")), "{refused:#?}");
    let _ = ws.close(None).await;
    stack.stop().await.expect("clean stop");
}
