//! Durability: the scheduler, run as its own process, is killed with SIGKILL at random moments
//! while jobs are submitted and EPs run them; after each restart no accepted job is missing and
//! no job the store had recorded as completed is ever assigned again.
//!
//! The scheduler process is this very test binary run again with only
//! [`crash_child_scheduler`] selected and `HTFAAS_CRASH_CHILD_DIR` set: it starts a scheduler on
//! 127.0.0.1:0 over the store in that directory and writes its address to `addr` there.

use super::*;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

const CHILD_ENV: &str = "HTFAAS_CRASH_CHILD_DIR";
/// Kill-and-restart rounds.
const ROUNDS: usize = 6;

#[tokio::test]
#[ignore = "not a test on its own: the scheduler process that the crash test starts and kills"]
async fn crash_child_scheduler() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else { return };
    let dir = PathBuf::from(dir);
    let server = Server::start(&dir).await;
    let tmp = dir.join("addr.tmp");
    std::fs::write(&tmp, server.addr.to_string()).expect("write addr");
    std::fs::rename(&tmp, dir.join("addr")).expect("publish addr");
    // Runs until killed; bounded anyway, so a lost child cannot outlive the test run for long.
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// Starts the scheduler process on the store in `dir`; returns it and its address.
async fn spawn_scheduler(dir: &Path) -> (tokio::process::Child, SocketAddr) {
    let _ = std::fs::remove_file(dir.join("addr"));
    let child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["policy::crash::crash_child_scheduler", "--exact", "--ignored", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the scheduler process");
    let start = Instant::now();
    loop {
        if let Ok(addr) = std::fs::read_to_string(dir.join("addr")) {
            return (child, addr.parse().expect("address"));
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the scheduler process did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the test saw: jobs the scheduler accepted (2xx) and every Assign per job.
#[derive(Default)]
struct Seen {
    accepted: HashSet<String>,
    assigns: HashMap<String, u32>,
    /// Assigns of jobs the store had already recorded as completed.
    reruns: Vec<String>,
}

/// A client of the scheduler at `addr` (the same calls as [`Server`]'s, without owning it).
fn at(addr: SocketAddr) -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    Server { addr, shutdown: CancellationToken::new(), join: tokio::spawn(async { Ok(()) }), http }
}

/// Submits jobs one after another until the scheduler stops answering.
async fn submitter(server: Server, fx: Arc<Fixture>, seen: Arc<Mutex<Seen>>, first_key: usize) {
    for n in first_key.. {
        let token = fx.token("alice");
        let req = fx.request(&format!("crash-{n}"));
        let mut post = server.http.post(server.url("/v1/jobs")).bearer_auth(&token).json(&req);
        post = post.timeout(Duration::from_secs(5));
        let Ok(resp) = post.send().await else { return };
        if resp.status().is_success()
            && let Ok(r) = resp.json::<SubmitResponse>().await
        {
            seen.lock().expect("lock").accepted.insert(r.job_id);
        } else {
            return;
        }
    }
}

/// An EP that completes every job it is given at once, noting a rerun of a job in `completed`.
async fn ep(server: Server, fx: Arc<Fixture>, seen: Arc<Mutex<Seen>>, completed: Arc<HashSet<String>>) {
    let Ok(mut ws) = server.attach(Some(&fx.attach_token(None))).await else { return };
    if ws.send(Message::text(serde_json::to_string(&hello_msg("crash-ep", 8, None)).expect("json"))).await.is_err() {
        return;
    }
    while let Ok(Some(Ok(frame))) = tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
        let Message::Text(text) = frame else { continue };
        let Ok(SchedulerMsg::Assign(a)) = serde_json::from_str::<SchedulerMsg>(text.as_str()) else { continue };
        {
            let mut s = seen.lock().expect("lock");
            *s.assigns.entry(a.job_id.clone()).or_default() += 1;
            if completed.contains(&a.job_id) {
                s.reruns.push(a.job_id.clone());
            }
        }
        let done = report(&a.job_id, Outcome::Exited { exit_code: 0 }, Usage { wall_ms: 5, ..Usage::default() });
        if ws.send(Message::text(serde_json::to_string(&done).expect("json"))).await.is_err() {
            return;
        }
    }
}

/// Every job in the store, by id.
async fn stored(server: &Server) -> HashMap<String, JobState> {
    let (status, v) = server.get("/v1/jobs?limit=10000", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let jobs: Vec<JobRecord> = serde_json::from_value(v).expect("jobs");
    jobs.into_iter().map(|j| (j.id, j.state)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_at_any_moment_loses_no_job_and_reruns_no_completed_one() {
    let fx = Arc::new(Fixture::new());
    let dir = fx.path();
    let seen = Arc::new(Mutex::new(Seen::default()));
    // A fixed-seed LCG for the kill moments, printed so a failure can be replayed.
    let seed = now_s();
    let mut rng = seed;
    let mut next_delay = || {
        rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        Duration::from_millis(50 + (rng >> 33) % 400)
    };
    println!("kill-moment seed {seed}");
    let mut completed: Arc<HashSet<String>> = Arc::default();
    for round in 0..=ROUNDS {
        let (mut child, addr) = spawn_scheduler(&dir).await;
        let server = at(addr);
        // After the restart: every accepted job is still there; what is completed stays so.
        let jobs = stored(&server).await;
        {
            let s = seen.lock().expect("lock");
            let missing: Vec<&String> = s.accepted.iter().filter(|id| !jobs.contains_key(*id)).collect();
            assert!(missing.is_empty(), "round {round}: accepted jobs lost: {missing:?}");
        }
        let mut done: HashSet<String> = completed.as_ref().clone();
        done.extend(jobs.iter().filter(|(_, s)| **s == JobState::Completed).map(|(id, _)| id.clone()));
        for id in completed.iter() {
            assert_eq!(jobs.get(id), Some(&JobState::Completed), "round {round}: completed job {id} changed");
        }
        completed = Arc::new(done);
        let ep_task = tokio::spawn(ep(at(addr), fx.clone(), seen.clone(), completed.clone()));
        if round == ROUNDS {
            // The last run is not killed: everything accepted completes.
            let start = Instant::now();
            loop {
                let jobs = stored(&server).await;
                let accepted = seen.lock().expect("lock").accepted.clone();
                if accepted.iter().all(|id| jobs.get(id) == Some(&JobState::Completed)) {
                    break;
                }
                assert!(start.elapsed() < Duration::from_secs(60), "accepted jobs did not all complete");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            child.kill().await.expect("stop");
            ep_task.abort();
            break;
        }
        let submit_task = tokio::spawn(submitter(at(addr), fx.clone(), seen.clone(), round * 1_000_000));
        tokio::time::sleep(next_delay()).await;
        child.kill().await.expect("SIGKILL the scheduler");
        let _ = tokio::time::timeout(Duration::from_secs(10), submit_task).await;
        ep_task.abort();
    }
    let s = seen.lock().expect("lock");
    assert!(s.reruns.is_empty(), "jobs assigned again after the store recorded them completed: {:?}", s.reruns);
    let twice = s.assigns.values().filter(|n| **n > 1).count();
    println!(
        "{ROUNDS} kills: {} jobs accepted, all completed; {} assigned more than once (running at a kill), none after completion",
        s.accepted.len(),
        twice
    );
    assert!(s.accepted.len() > ROUNDS, "too few jobs to mean anything: {}", s.accepted.len());
}
