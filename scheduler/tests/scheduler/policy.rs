//! The site policy on a real scheduler with EPs over WebSocket: fair share and priority
//! factors, group quotas and oversubscription, job classes, submit and hold requirements,
//! partitionable GPUs, leases and retries, run-time removal, EP drain, disable and group pause,
//! run history and `analyze`.

use super::*;
use htfaas_functions::proto::{
    Attempt, EpAction, EpAdminState, EpInfo, EpVerdict, HOLD_CODE_POLICY, HOLD_CODE_RETRIES, JobAnalysis,
    PriorityReport,
};
use htfaas_scheduler::policy::{GroupConfig, JobClass};
use htfaas_scheduler::requirements::RequirementConfig;

/// Durability: the scheduler killed at random moments.
#[path = "crash.rs"]
mod crash;

/// Submits `request` for `owner` (in `group`) with a fresh single-use token; returns the job id.
pub(super) async fn submit_as(
    server: &Server,
    fx: &Fixture,
    owner: &str,
    group: Option<&str>,
    request: &SubmitRequest,
) -> String {
    let token = token_for(fx, owner, group);
    server.submit(&token, request).await.job_id
}

fn token_for(fx: &Fixture, owner: &str, group: Option<&str>) -> String {
    let claims = SubmitClaims { group: group.map(str::to_owned), ..fx.claims(owner) };
    fx.gw.sign(&claims).expect("sign")
}

/// Attaches an EP named `name` offering `slots`; returns the socket and its session id.
pub(super) async fn attach_ep(server: &Server, fx: &Fixture, name: &str, slots: Resources) -> (Ws, String) {
    let mut ws = server.attach(Some(&fx.attach_token(None))).await.expect("attach");
    send(
        &mut ws,
        &EpMsg::Hello(Hello {
            name: name.into(),
            slots,
            protocol: 1,
            annex: None,
            labels: Default::default(),
            prefetch: None,
            runtimes: vec![htfaas_functions::manifest::RuntimeKind::Wasm],
            images: Vec::new(),
            renews_attach: false,
        }),
    )
    .await;
    let welcome = next_json(&mut ws).await;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    (ws, welcome["ep_id"].as_str().expect("ep_id").to_owned())
}

pub(super) async fn finish_ok(ws: &mut Ws, job_id: &str, wall_ms: u64) {
    let usage = Usage { wall_ms, cpu_ms: wall_ms, ..Usage::default() };
    send(ws, &report(job_id, Outcome::Exited { exit_code: 0 }, usage)).await;
}

pub(super) async fn admin_get<T: serde::de::DeserializeOwned>(server: &Server, path: &str) -> T {
    let (status, v) = server.get(path, Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{path}: {v}");
    serde_json::from_value(v).expect("answer type")
}

async fn ep_action(server: &Server, name: &str, verb: &str, action: EpAction) -> (StatusCode, Value) {
    let body = serde_json::to_value(action).expect("json");
    server.post(&format!("/v1/eps/{name}/{verb}"), Some(ADMIN), Some(&body)).await
}

fn because(reason: &str) -> EpAction {
    EpAction { reason: reason.into(), deadline_s: None, group: None }
}

#[tokio::test]
async fn a_flooding_owner_does_not_starve_another_and_factors_weigh_in() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    // Alice floods first; Bob's one job comes last.
    let token = fx.gw.sign(&SubmitClaims { jobs: 300, ..fx.claims("alice") }).expect("sign");
    for i in 0..300 {
        server.submit(&token, &fx.request(&format!("a{i}"))).await;
    }
    let bobs = submit_as(&server, &fx, "bob", None, &fx.request("b0")).await;
    // One EP with room for two 2-core jobs: the first round gives one to each owner.
    let (mut ws, _) = attach_ep(&server, &fx, "ep-1", Resources::new(4, 4096, 3600)).await;
    let first = [expect_assign(&mut ws, "alice").await, expect_assign(&mut ws, "alice").await];
    assert!(first.contains(&bobs), "bob's job was not among the first two: {first:?}");
    server.stop().await;

    // With equal usage and Alice's factor at 1000, Bob goes first although he queued last and
    // Alice's name sorts first.
    let fx = Fixture::new();
    let (server, queue) = Server::start_with_queue(&fx.path(), |_| {}).await;
    let body = serde_json::json!({ "factor": 1000.0 });
    let (status, v) = server.post("/v1/accounting/alice/factor", Some(ADMIN), Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["factor"], 1000.0);
    assert_eq!(v["effective_priority"], 500.0, "0.5 × 1000 without usage: {v}");
    let (status, v) =
        server.post("/v1/accounting/alice/factor", Some(ADMIN), Some(&serde_json::json!({"factor": 0.5}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(error_of(&v), "factor must be a number within 1..=1000000000");
    let alices = submit_as(&server, &fx, "alice", None, &fx.request("a")).await;
    let bobs = submit_as(&server, &fx, "bob", None, &fx.request("b")).await;
    let (mut ws, _) = attach_ep(&server, &fx, "ep-1", Resources::new(2, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut ws, "bob").await, bobs);
    // Hours of usage, reported at once: the scheduler charges no more than it saw run.
    queue.backdate_start(bobs.clone(), 3_600_000).await.expect("backdate");
    finish_ok(&mut ws, &bobs, 3_600_000).await;
    assert_eq!(expect_assign(&mut ws, "alice").await, alices);
    queue.backdate_start(alices.clone(), 1_800_000).await.expect("backdate");
    finish_ok(&mut ws, &alices, 1_800_000).await;
    server.wait_for_state(&alices, JobState::Completed).await;

    // condor_userprio: usage is charged in core-hours, and decays from there.
    let report: PriorityReport = admin_get(&server, "/v1/priorities").await;
    assert_eq!(report.half_life_s, 86_400);
    let bob = report.owners.iter().find(|o| o.owner == "bob").expect("bob");
    let alice = report.owners.iter().find(|o| o.owner == "alice").expect("alice");
    assert!((bob.accumulated_core_hours - 2.0).abs() < 1e-9, "{bob:?}");
    assert!((alice.accumulated_core_hours - 1.0).abs() < 1e-9, "{alice:?}");
    assert!(bob.decayed_core_hours > 1.99 && bob.decayed_core_hours <= 2.0, "{bob:?}");
    // Real priority: 0.5 + usage in cores (core-seconds × ln 2 / half-life).
    let expected = 0.5 + 7200.0 * std::f64::consts::LN_2 / 86_400.0;
    assert!((bob.real_priority - expected).abs() < 1e-3, "{bob:?}");
    assert!((alice.effective_priority - alice.real_priority * 1000.0).abs() < 1e-6, "{alice:?}");
    assert_eq!(report.owners[0].owner, "bob", "best first");
    server.stop().await;
}

#[tokio::test]
async fn a_group_keeps_to_its_quota_while_others_want_cores_and_oversubscribes_an_idle_pool() {
    let fx = Fixture::new();
    let server = Server::start_configured(&fx.path(), |c| {
        let cms = GroupConfig { quota_cores: Some(2), quota_share: None, oversubscribe: 2.0 };
        c.groups.insert("cms".into(), cms);
    })
    .await;
    let cms: Vec<String> = {
        let mut ids = Vec::new();
        for i in 0..3 {
            ids.push(submit_as(&server, &fx, "alice", Some("cms"), &fx.request(&format!("c{i}"))).await);
        }
        ids
    };
    // Queued after the cms jobs, by the same owner, outside any group.
    let bobs = submit_as(&server, &fx, "alice", None, &fx.request("b")).await;
    // 4 cores, 2-core jobs: within quota, one cms job and the plain one; cms gets no surplus
    // while another job wants the pool, though it is older.
    let (mut ws, _) = attach_ep(&server, &fx, "ep-1", Resources::new(4, 4096, 3600)).await;
    let mut got = vec![expect_assign(&mut ws, "alice").await, expect_assign(&mut ws, "alice").await];
    got.sort();
    let mut want = vec![cms[0].clone(), bobs.clone()];
    want.sort();
    assert_eq!(got, want);
    let analysis: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{}/analyze", cms[1])).await;
    assert_eq!(analysis.state, JobState::Idle);
    assert!(analysis.reasons.iter().any(|r| r.contains("over its quota of 2.00 cores")), "{analysis:?}");
    // The plain job ends: the pool is otherwise idle, so cms may go to its cap (2 × 2 cores).
    finish_ok(&mut ws, &bobs, 1000).await;
    assert_eq!(expect_assign(&mut ws, "alice").await, cms[1]);
    expect_silence(&mut ws, Duration::from_millis(300)).await;
    let analysis: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{}/analyze", cms[2])).await;
    assert!(analysis.reasons.iter().any(|r| r.contains("its quota is 2.00 and its cap 4.00")), "{analysis:?}");
    let report: PriorityReport = admin_get(&server, "/v1/priorities").await;
    let g = report.groups.iter().find(|g| g.group == "cms").expect("cms");
    assert_eq!((g.quota_cores, g.cap_cores, g.cores_in_use), (Some(2.0), Some(4.0), 4));
    server.stop().await;
}

#[tokio::test]
async fn classes_and_requirements_refuse_with_their_message_and_unauthorized_gpus_are_held() {
    let fx = Fixture::new();
    let server = Server::start_configured(&fx.path(), |c| {
        c.job_classes = vec![
            JobClass { name: "lite".into(), default_runtime_s: None, max_runtime_s: 30 },
            JobClass { name: "short".into(), default_runtime_s: Some(240), max_runtime_s: 300 },
        ];
        c.default_job_class = Some("short".into());
        c.submit_requirements = vec![RequirementConfig {
            name: "SmallMemory".into(),
            requirement: "RequestMemory <= 512".into(),
            message: "jobs here may ask for at most 512 MiB".into(),
        }];
        c.hold_requirements = vec![RequirementConfig {
            name: "GpuGroup".into(),
            requirement: "RequestGPUs == 0 || AcctGroup == \"gpu\"".into(),
            message: "Unauthorized GPU request".into(),
        }];
    })
    .await;
    let token = fx.token("alice");
    let refused = |req: SubmitRequest| {
        let (server, token) = (&server, &token);
        async move {
            let (status, v) = server.submit_raw(Some(token), &req).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
            error_of(&v).to_owned()
        }
    };
    let mut lite = fx.request("k");
    (lite.class, lite.resources.runtime_s) = (Some("lite".into()), 60);
    assert_eq!(refused(lite).await, "run time 60 s exceeds the maximum of job class lite (30 s)");
    let mut unknown = fx.request("k");
    unknown.class = Some("long".into());
    assert_eq!(refused(unknown).await, "unknown job class \"long\" (known: lite, short)");
    let mut big = fx.request("k");
    big.resources.memory_mb = 1024;
    assert_eq!(refused(big).await, "jobs here may ask for at most 512 MiB");
    // None of that used the token; the default class applies to a job that names none.
    let ok = server.submit(&token, &fx.request("k")).await.job_id;
    let job = server.job(&ok).await;
    assert_eq!((job.state, job.class.as_deref()), (JobState::Idle, Some("short")));
    // A job asking for no run time (0) gets its class's default: 240 s for short, and for lite
    // (none configured) the smaller of an hour and its maximum.
    let mut none = fx.request("d1");
    none.resources.runtime_s = 0;
    let short = submit_as(&server, &fx, "alice", None, &none).await;
    assert_eq!(server.job(&short).await.resources.runtime_s, 240);
    let mut none_lite = fx.request("d2");
    (none_lite.resources.runtime_s, none_lite.class) = (0, Some("lite".into()));
    let lite = submit_as(&server, &fx, "alice", None, &none_lite).await;
    assert_eq!(server.job(&lite).await.resources.runtime_s, 30);
    // The filled-in run time must fit the token too.
    let tight = fx.gw.sign(&SubmitClaims { runtime_s: 100, ..fx.claims("alice") }).expect("sign");
    let mut none = fx.request("d3");
    none.resources.runtime_s = 0;
    let (status, v) = server.submit_raw(Some(&tight), &none).await;
    assert_eq!((status, error_of(&v)), (StatusCode::FORBIDDEN, "runtime_s 240 exceeds the token's limit of 100"));

    // A GPU outside the gpu group: accepted, held with the configured reason.
    let mut gpu = fx.request("g1");
    gpu.resources.gpus = 1;
    let held = submit_as(&server, &fx, "alice", None, &gpu).await;
    let job = server.job(&held).await;
    assert_eq!(
        (job.state, job.hold_code, job.reason.as_str()),
        (JobState::Held, Some(HOLD_CODE_POLICY), "Unauthorized GPU request")
    );
    let mut gpu2 = fx.request("g2");
    gpu2.resources.gpus = 1;
    let allowed = submit_as(&server, &fx, "alice", Some("gpu"), &gpu2).await;
    assert_eq!(server.job(&allowed).await.state, JobState::Idle);
    server.stop().await;
}

#[tokio::test]
async fn gpus_are_partitioned_and_a_job_runs_only_where_they_are_free() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let gpu_job = |key: &str| {
        let mut r = fx.request(key);
        r.resources.gpus = 1;
        r
    };
    let g1 = submit_as(&server, &fx, "alice", None, &gpu_job("g1")).await;
    let g2 = submit_as(&server, &fx, "alice", None, &gpu_job("g2")).await;
    let plain = submit_as(&server, &fx, "alice", None, &fx.request("p")).await;
    // A CPU-only EP takes only the plain job; analyze says why not the GPU ones.
    let (mut cpu, _) = attach_ep(&server, &fx, "cpu-ep", Resources::new(8, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut cpu, "alice").await, plain);
    expect_silence(&mut cpu, Duration::from_millis(300)).await;
    let a: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{g1}/analyze")).await;
    assert_eq!(a.summary, "no attached EP can run it now");
    assert_eq!(
        a.eps,
        vec![EpVerdict {
            ep: "cpu-ep".into(),
            refusal: Some("not enough gpus: the EP has 0 in all, the job asks 1".into())
        }]
    );
    // One GPU, eight cores: one GPU job at a time.
    let slots = Resources { gpus: 1, ..Resources::new(8, 4096, 3600) };
    let (mut gpu, _) = attach_ep(&server, &fx, "gpu-ep", slots).await;
    let first = expect_assign(&mut gpu, "alice").await;
    assert_eq!(first, g1);
    expect_silence(&mut gpu, Duration::from_millis(300)).await;
    let a: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{g2}/analyze")).await;
    let on_gpu = a.eps.iter().find(|v| v.ep == "gpu-ep").expect("verdict");
    assert_eq!(on_gpu.refusal.as_deref(), Some("not enough free gpus now: 0 free, the job asks 1"));
    let eps: Vec<EpInfo> = admin_get(&server, "/v1/eps").await;
    let info = eps.iter().find(|e| e.name == "gpu-ep").expect("listed");
    assert_eq!((info.total.gpus, info.free.gpus, info.free.cpus), (1, 0, 6));
    finish_ok(&mut gpu, &first, 100).await;
    assert_eq!(expect_assign(&mut gpu, "alice").await, g2);
    server.stop().await;
}

#[tokio::test]
async fn a_silent_ep_loses_its_job_at_lease_end_and_past_the_retry_limit_the_job_is_held() {
    let fx = Fixture::new();
    let server = Server::start_configured(&fx.path(), |c| {
        c.lease_s = 1;
        c.max_retries = 1;
    })
    .await;
    let id = submit_as(&server, &fx, "alice", None, &fx.request("k")).await;
    // The first EP takes the job and falls silent: its lease ends, the job runs elsewhere.
    let (mut first, _) = attach_ep(&server, &fx, "ep-a", Resources::new(2, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut first, "alice").await, id);
    let (code, reason) = expect_close(&mut first).await;
    assert_eq!((code, reason.as_str()), (1001, "lease expired"));
    server.wait_for_state(&id, JobState::Idle).await;
    let (mut second, _) = attach_ep(&server, &fx, "ep-b", Resources::new(2, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut second, "alice").await, id);
    // A late report from the first attempt's EP is not heard (its session is over); the second
    // EP falls silent too: past the retry limit, the job is held with the reason.
    expect_close(&mut second).await;
    let job = server.wait_for_state(&id, JobState::Held).await;
    assert_eq!(job.hold_code, Some(HOLD_CODE_RETRIES));
    assert!(job.reason.starts_with("lost its EP 2 times (last: ep-b: the EP was silent for 1 s"), "{}", job.reason);
    assert!(job.reason.ends_with("the retry limit is 1"), "{}", job.reason);
    assert_eq!(job.attempts, 2);
    let history: Vec<Attempt> = admin_get(&server, &format!("/v1/jobs/{id}/history")).await;
    let summary: Vec<(u32, &str, &str)> = history.iter().map(|a| (a.n, a.ep.as_str(), a.outcome.as_str())).collect();
    assert_eq!(summary, vec![(1, "ep-a", "lost"), (2, "ep-b", "lost")]);
    assert!(history.iter().all(|a| a.ended_at_ms.is_some() && a.reason.contains("lease expired")));
    // Released, it gets a fresh retry budget and runs.
    server.act(&id, "release", "network fixed").await;
    let (mut third, _) = attach_ep(&server, &fx, "ep-c", Resources::new(2, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut third, "alice").await, id);
    finish_ok(&mut third, &id, 10).await;
    server.wait_for_state(&id, JobState::Completed).await;
    let history: Vec<Attempt> = admin_get(&server, &format!("/v1/jobs/{id}/history")).await;
    assert_eq!(history.len(), 3);
    assert_eq!((history[2].outcome.as_str(), history[2].usage.as_ref().map(|u| u.wall_ms)), ("completed", Some(10)));
    let (status, _) = server.get("/v1/jobs/nope/history", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    server.stop().await;
}

#[tokio::test]
async fn a_lost_job_waits_out_its_backoff_before_it_runs_again() {
    let fx = Fixture::new();
    let server = Server::start_configured(&fx.path(), |c| c.retry_backoff_s = 2).await;
    let id = submit_as(&server, &fx, "alice", None, &fx.request("k")).await;
    let (mut a, _) = attach_ep(&server, &fx, "ep-a", Resources::new(2, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut a, "alice").await, id);
    a.close(None).await.expect("close");
    server.wait_for_state(&id, JobState::Idle).await;
    let (mut b, _) = attach_ep(&server, &fx, "ep-b", Resources::new(2, 4096, 3600)).await;
    let analysis: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{id}/analyze")).await;
    assert!(analysis.reasons.iter().any(|r| r.starts_with("it lost 1 attempt(s) (its EP went away, or the storage was unavailable) and waits")), "{analysis:?}");
    let lost_at = Instant::now();
    expect_silence(&mut b, Duration::from_millis(1200)).await;
    assert_eq!(expect_assign(&mut b, "alice").await, id);
    assert!(lost_at.elapsed() >= Duration::from_millis(1200));
    server.stop().await;
}

#[tokio::test]
async fn a_job_still_running_past_its_run_time_is_removed_with_the_reason() {
    let fx = Fixture::new();
    let server = Server::start_configured(&fx.path(), |c| {
        c.runtime_grace_s = 0;
        c.job_classes = vec![JobClass { name: "lite".into(), default_runtime_s: None, max_runtime_s: 60 }];
        c.default_job_class = Some("lite".into());
    })
    .await;
    let mut req = fx.request("k");
    req.resources.runtime_s = 1;
    let id = submit_as(&server, &fx, "alice", None, &req).await;
    let (mut ws, ep_id) = attach_ep(&server, &fx, "ep-a", Resources::new(2, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut ws, "alice").await, id);
    // The EP never reports: the scheduler removes the job and tells the EP to stop it.
    assert_eq!(next_json(&mut ws).await, ending_cancel_msg(&id, "the job exceeded its run time"));
    let job = server.job(&id).await;
    assert_eq!(
        (job.state, job.reason.as_str()),
        (JobState::Removed, "job exceeded its run time of 1 s (job class lite)")
    );
    // Its stop report is still charged, once.
    send(
        &mut ws,
        &report(&id, Outcome::Cancelled { reason: "stopped".into() }, Usage { wall_ms: 1500, ..Usage::default() }),
    )
    .await;
    let _ = ep_id;
    let start = Instant::now();
    loop {
        let history: Vec<Attempt> = admin_get(&server, &format!("/v1/jobs/{id}/history")).await;
        if history[0].outcome == "stopped" {
            assert_eq!(history.len(), 1);
            break;
        }
        assert!(start.elapsed() < WAIT, "{history:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn drain_disable_and_group_pause_decide_what_an_ep_starts_and_outlive_its_session() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    // Settings made before the EP attaches apply when it does.
    let (status, v) = ep_action(&server, "ep-a", "disable", because("new kernel")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let info: EpInfo = serde_json::from_value(v).expect("EpInfo");
    assert_eq!((info.state, info.session), (EpAdminState::Disabled, None));
    let j1 = submit_as(&server, &fx, "alice", None, &fx.request("j1")).await;
    let (mut ws, _) = attach_ep(&server, &fx, "ep-a", Resources::new(4, 4096, 3600)).await;
    expect_silence(&mut ws, Duration::from_millis(300)).await;
    let a: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{j1}/analyze")).await;
    assert_eq!(a.eps[0].refusal.as_deref(), Some("the EP is disabled: new kernel"));

    // Draining with a deadline too close for the job's 60 s run time: still nothing; with
    // one far enough, it starts.
    let drain = |s: u64| EpAction { reason: "reboot at noon".into(), deadline_s: Some(s), group: None };
    let (status, v) = ep_action(&server, "ep-a", "drain", drain(30)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    expect_silence(&mut ws, Duration::from_millis(300)).await;
    let a: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{j1}/analyze")).await;
    let refusal = a.eps[0].refusal.as_deref().unwrap_or_default();
    assert!(
        refusal.starts_with("the EP is draining and the job's run time of 60 s would end after the deadline"),
        "{refusal}"
    );
    ep_action(&server, "ep-a", "drain", drain(3600)).await;
    assert_eq!(expect_assign(&mut ws, "alice").await, j1);

    // Pausing cms keeps cms jobs off it; others run; resuming lets cms in.
    ep_action(&server, "ep-a", "enable", because("back")).await;
    let pause = || EpAction { reason: "cms maintenance".into(), deadline_s: None, group: Some("cms".into()) };
    let (status, v) = ep_action(&server, "ep-a", "pause", pause()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["paused_groups"], serde_json::json!(["cms"]));
    let c1 = submit_as(&server, &fx, "alice", Some("cms"), &fx.request("c1")).await;
    let plain = submit_as(&server, &fx, "bob", None, &fx.request("p1")).await;
    assert_eq!(expect_assign(&mut ws, "bob").await, plain);
    expect_silence(&mut ws, Duration::from_millis(300)).await;
    let a: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{c1}/analyze")).await;
    assert_eq!(a.eps[0].refusal.as_deref(), Some("accounting group cms is paused on the EP"));
    finish_ok(&mut ws, &j1, 10).await;
    finish_ok(&mut ws, &plain, 10).await;
    let (status, v) = ep_action(&server, "ep-a", "resume", pause()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(expect_assign(&mut ws, "alice").await, c1);
    let (status, v) = ep_action(&server, "ep-a", "resume", pause()).await;
    assert_eq!((status, error_of(&v)), (StatusCode::CONFLICT, "group cms is not paused on EP ep-a"));

    // Refusals: bad verb, missing group, stray deadline, no admin token.
    let (status, _) = ep_action(&server, "ep-a", "reboot", because("x")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, v) = ep_action(&server, "ep-a", "pause", because("x")).await;
    assert_eq!(
        (status, error_of(&v)),
        (StatusCode::BAD_REQUEST, "group is required for pause and resume, and only for them")
    );
    let stray = EpAction { deadline_s: Some(5), ..because("x") };
    let (status, v) = ep_action(&server, "ep-a", "disable", stray).await;
    assert_eq!((status, error_of(&v)), (StatusCode::BAD_REQUEST, "deadline_s is only for drain"));
    let body = serde_json::to_value(because("x")).expect("json");
    let (status, _) = server.post("/v1/eps/ep-a/disable", Some("wrong-admin-token-xxxx"), Some(&body)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Disabled again, the setting survives a restart of the scheduler.
    ep_action(&server, "ep-a", "disable", because("decommission")).await;
    drop(ws);
    server.stop().await;
    let server = Server::start(&fx.path()).await;
    let eps: Vec<EpInfo> = admin_get(&server, "/v1/eps").await;
    assert_eq!(eps.len(), 1);
    assert_eq!(
        (eps[0].state, eps[0].reason.as_str(), eps[0].session.as_deref()),
        (EpAdminState::Disabled, "decommission", None)
    );
    server.stop().await;
}

#[tokio::test]
async fn analyze_names_the_job_and_says_when_no_ep_is_there() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let id = submit_as(&server, &fx, "alice", None, &fx.request("k")).await;
    let a: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{id}/analyze")).await;
    assert_eq!((a.state, a.summary.as_str(), a.eps.len()), (JobState::Idle, "no EP is attached", 0));
    // Without job classes, a job asking for no run time gets an hour.
    let mut none = fx.request("none");
    none.resources.runtime_s = 0;
    let token = fx.gw.sign(&SubmitClaims { runtime_s: 3600, ..fx.claims("alice") }).expect("sign");
    let default = server.submit(&token, &none).await.job_id;
    assert_eq!(server.job(&default).await.resources.runtime_s, 3600);
    let held = server.act(&id, "hold", "check input").await;
    assert_eq!(held.state, JobState::Held);
    let a: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{id}/analyze")).await;
    assert_eq!(a.summary, "held (code 1): check input");
    let (status, _) = server.get("/v1/jobs/nope/analyze", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = server.get(&format!("/v1/jobs/{id}/analyze"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    server.stop().await;
}

#[tokio::test]
async fn an_ep_that_says_it_is_draining_gets_no_new_job_and_finishes_its_own() {
    let fx = Fixture::new();
    let server = Server::start(&fx.path()).await;
    let first = submit_as(&server, &fx, "alice", None, &fx.request("a")).await;
    let (mut ws, _) = attach_ep(&server, &fx, "ep-a", Resources::new(4, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut ws, "alice").await, first);
    send(&mut ws, &EpMsg::Draining).await;
    let second = submit_as(&server, &fx, "alice", None, &fx.request("b")).await;
    expect_silence(&mut ws, Duration::from_millis(300)).await;
    let a: JobAnalysis = admin_get(&server, &format!("/v1/jobs/{second}/analyze")).await;
    assert_eq!(a.eps[0].refusal.as_deref(), Some("the EP is draining (it said so: shutting down)"));
    let eps: Vec<EpInfo> = admin_get(&server, "/v1/eps").await;
    assert_eq!(eps[0].state, EpAdminState::Draining);
    // An Assign that crossed its Draining is returned unrun: the job is idle again, uncharged,
    // and its attempt says so.
    let (mut other, _) = attach_ep(&server, &fx, "ep-b", Resources::new(2, 4096, 3600)).await;
    assert_eq!(expect_assign(&mut other, "alice").await, second);
    send(&mut other, &EpMsg::Draining).await;
    send(&mut other, &report(&second, Outcome::Cancelled { reason: "EP draining".into() }, Usage::default())).await;
    server.wait_for_state(&second, JobState::Idle).await;
    let history: Vec<Attempt> = admin_get(&server, &format!("/v1/jobs/{second}/history")).await;
    assert_eq!(
        (history[0].outcome.as_str(), history[0].reason.as_str()),
        ("returned", "the EP returned it: EP draining")
    );
    // Its running job still reports and is recorded.
    finish_ok(&mut ws, &first, 10).await;
    server.wait_for_state(&first, JobState::Completed).await;
    expect_silence(&mut ws, Duration::from_millis(200)).await;
    server.stop().await;
}
