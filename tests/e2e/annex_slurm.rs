//! Annexes on a real Slurm: `htfaas annex create --slurm` against a private one-node
//! cluster on loopback ([`crate::slurm_support`]) and the real stack. A function fired by an
//! upload runs on the EP Slurm started; the EP leaves when idle and its Slurm job ends; the
//! annex is extended (Slurm's time limit and the record) and deleted (no Slurm job left, its
//! token refused at attach). The attach token appears in no process's arguments and in no file
//! the EP writes. An owner without the annex right gets no token and no Slurm job.
//!
//! The CLI commands run as the `htfaas` binary (`show`, `extend`, `delete`, and a refused
//! `create`); the accepted `create` runs through the library the CLI calls
//! ([`htfaas::annex::create`]), so that the test holds the token and can try it after the
//! delete. Skipped with a notice without Slurm or root, unless `CI` is set.
//!
//! Measured and printed (`MEASURE annex …`): `annex create` → EP attached, → the first job
//! done; upload → output on the annex EP; the last job → the Slurm job's end.

use crate::slurm_support::{Cluster, slurm_available};
use htfaas::annex::provider::{BatchState, Provider};
use htfaas::annex::{Placement, create};
use htfaas::stack::demo_manifest;
use htfaas_functions::proto::{AnnexRequest, JobRecord, JobState};
use htfaas_tests::{htfaas_binary, start_stack, upload_checksum, wait_for};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const ANNEX: &str = "alice-slurm";

async fn job_for(client: &htfaas::client::Client, path: &str) -> Option<JobRecord> {
    client.jobs().await.ok()?.into_iter().find(|j| j.event.path == path)
}

/// Runs `htfaas annex ARGS --dir DIR` with the cluster's `SLURM_CONF`; (success, stdout, stderr).
fn cli(dir: &Path, cluster: &Cluster, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(htfaas_binary())
        .arg("annex")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .env("SLURM_CONF", cluster.conf())
        .env_remove("HTFAAS_API_TOKEN")
        .output()
        .expect("run htfaas annex");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every process's command line now, each as one string.
fn command_lines() -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(bytes) = std::fs::read(entry.path().join("cmdline")) {
            out.push(String::from_utf8_lossy(&bytes).replace('\0', " "));
        }
    }
    out
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_fired_by_an_upload_runs_on_a_slurm_annex_ep_that_leaves_when_idle() {
    if !slurm_available("the Slurm annex test") {
        return;
    }
    let cluster = Cluster::start();
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let binary = htfaas_binary();
    let logs = tempfile::tempdir().expect("log dir");

    // Alice's function asks for her annex; the grant lets her register it and create the annex.
    client.grant("alice", htfaas_functions::namespace::Right::Annex, ANNEX).await.expect("grant");
    let mut m = demo_manifest(upload_checksum(&client).await);
    m.name = "on-slurm".into();
    m.trigger.path = "/data/slurm/**".into();
    m.outputs.dir = "/data/slurm-out/".into();
    m.annex = Some(ANNEX.into());
    client.register(&m).await.expect("register the annex function");

    // An upload before the annex exists: its job waits for the annex (it runs nowhere else).
    client.put_bytes(b"first".to_vec(), "/data/slurm/first.dat").await.expect("put");
    let queued =
        wait_for("the first job to be queued", Duration::from_secs(20), || job_for(&client, "/data/slurm/first.dat"))
            .await;
    assert_eq!((queued.state, queued.annex.as_deref()), (JobState::Idle, Some(ANNEX)));

    // htfaas annex create --slurm --count 1 --cpus 1 --memory 1G --lifetime 5m --idle-shutdown 20s
    let provider = Arc::new(cluster.provider());
    let request = AnnexRequest {
        name: ANNEX.into(),
        owner: "alice".into(),
        provider: "slurm".into(),
        count: 1,
        cpus: 1,
        memory_mb: 1024,
        lifetime_s: 300,
        idle_shutdown_s: Some(20),
        partition: None,
        token_ttl_s: None,
    };
    let placement = Placement {
        htfaas: binary.clone(),
        scheduler_url: stack.info().scheduler_url.clone(),
        allowed_origins: None,
        tls_ca_file: None,
        log_dir: Some(logs.path().to_owned()),
        work_dir: Some(cluster.dir.clone()),
        scratch_dir: Some(cluster.scratch()),
    };
    let t_create = Instant::now();
    let created = create(&client, provider.clone(), &request, &placement).await.expect("annex create");
    let create_returned = t_create.elapsed();
    let token = created.attach_token.clone();
    let jobs = created.annex.jobs.clone();
    assert_eq!(jobs.len(), 1, "one Slurm job: {jobs:?}");
    let slurm_job = jobs[0].clone();
    let ep_name = format!("{ANNEX}-{slurm_job}");

    let view = wait_for("the Slurm-started EP to attach", Duration::from_secs(60), || async {
        client.annex(ANNEX).await.ok().filter(|v| !v.eps.is_empty())
    })
    .await;
    let attached = t_create.elapsed();
    let ep = &view.eps[0];
    assert_eq!(ep.name, ep_name);
    assert_eq!((ep.annex.as_deref(), ep.owner.as_deref()), (Some(ANNEX), Some("alice")), "from its token");
    assert_eq!(ep.labels.get("annex.job"), Some(&slurm_job));

    // The token is in no process's arguments and in no file of the job's scratch.
    let lines = command_lines();
    assert!(lines.iter().any(|l| l.contains(" ep --config ") && l.contains(ANNEX)), "the EP runs: {lines:?}");
    assert!(!lines.iter().any(|l| l.contains(&token)), "the attach token is in a command line");
    let scratch = files_under(&cluster.scratch());
    assert!(scratch.iter().any(|f| f.ends_with("ep.json")), "the EP's config is in its scratch: {scratch:?}");
    for f in &scratch {
        let text = std::fs::read(f).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&text).contains(&token), "the token is in {}", f.display());
    }
    for d in std::fs::read_dir(cluster.scratch()).expect("scratch").flatten() {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = d.metadata().expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{} is {mode:o}", d.path().display());
    }

    // The queued job runs there.
    let first = wait_for("the first job to complete", Duration::from_secs(60), || async {
        job_for(&client, "/data/slurm/first.dat").await.filter(|j| j.state == JobState::Completed)
    })
    .await;
    let first_done = t_create.elapsed();
    assert_eq!((first.ep.as_deref(), first.annex.as_deref()), (Some(ep_name.as_str()), Some(ANNEX)));
    let attempt = client.job_history(&first.id).await.expect("history").into_iter().next().expect("an attempt");
    let first_started_ms = attempt.started_at_ms.saturating_sub(created.annex.created_ms);

    // Upload → output on the warm annex EP (its idle shutdown is 20 s; the job is dispatched in
    // milliseconds).
    let t_upload = Instant::now();
    client.put_bytes(b"second".to_vec(), "/data/slurm/second.dat").await.expect("put");
    wait_for("the second output", Duration::from_secs(60), || async {
        client.get_bytes("/data/slurm-out/second.dat.checksums.json").await.ok().flatten()
    })
    .await;
    let upload_to_output = t_upload.elapsed();
    let last_done = Instant::now();
    let second = job_for(&client, "/data/slurm/second.dat").await.expect("second job");
    assert_eq!((second.ep.as_deref(), second.annex.as_deref()), (Some(ep_name.as_str()), Some(ANNEX)));

    // `htfaas annex extend`: the record and Slurm's time limit move; no job is added.
    let (ok, out, err) = cli(dir.path(), &cluster, &["extend", ANNEX, "--lifetime", "10m"]);
    assert!(ok, "annex extend: {out}{err}");
    let p = provider.clone();
    let js = jobs.clone();
    let states = tokio::task::spawn_blocking(move || p.states(&js)).await.expect("join").expect("squeue");
    let limit = states[&slurm_job].time_limit_s.expect("a time limit");
    assert!(limit >= 600, "the time limit is {limit} s after the extension");
    assert_eq!(client.annex(ANNEX).await.expect("view").annex.jobs, jobs, "no job added");

    // Idle for 20 s, the EP leaves and its Slurm job ends.
    let ended = wait_for("the Slurm job to end after the idle shutdown", Duration::from_secs(120), || {
        let (p, js) = (provider.clone(), jobs.clone());
        async move {
            let states = tokio::task::spawn_blocking(move || p.states(&js)).await.ok()?.ok()?;
            let job = states.into_values().next()?;
            (!job.state.is_live()).then_some(job.state)
        }
    })
    .await;
    let idle_to_end = last_done.elapsed();
    assert_eq!(ended, BatchState::Done("COMPLETED".into()), "the job ended by itself, not cancelled or timed out");
    let (ok, out, err) = cli(dir.path(), &cluster, &["show", ANNEX, "--json"]);
    assert!(ok, "annex show: {err}");
    let shown: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(shown["eps"], serde_json::json!([]), "{shown}");
    assert_eq!(shown["batch_jobs"][&slurm_job]["state"]["state"], "done", "{shown}");
    let log =
        std::fs::read_to_string(logs.path().join(format!("htfaas-annex-{ANNEX}-{slurm_job}.out"))).expect("job log");
    assert!(log.contains("idle too long; leaving"), "{log}");
    assert!(!log.contains(&token), "the token is in the job's log");

    // `htfaas annex delete`: no Slurm job is left, and the token no longer attaches.
    let (ok, out, err) = cli(dir.path(), &cluster, &["delete", ANNEX]);
    assert!(ok, "annex delete: {out}{err}");
    assert!(cluster.live_jobs().is_empty(), "Slurm jobs left: {:?}", cluster.live_jobs());
    assert!(client.annexes().await.expect("list").is_empty());
    let eps = CancellationToken::new();
    let leftover =
        crate::annex::start_ep(dir.path(), &stack.info().scheduler_url, "leftover", token, Some(ANNEX), &eps).await;
    let refused = tokio::time::timeout(Duration::from_secs(20), leftover)
        .await
        .expect("the leftover EP gives up")
        .expect("join")
        .expect_err("a deleted annex's token is refused");
    assert!(format!("{refused:#}").contains("revoked"), "{refused:#}");

    eprintln!(
        "MEASURE annex (Slurm 22.05, 1 EP): create returned {} ms; create → EP attached {} ms; annex recorded → \
         first (queued) job started on it {} ms, done (seen) {} ms; upload → output on the annex EP {} ms; last job \
         → Slurm job ended {} ms (idle shutdown 20 s)",
        create_returned.as_millis(),
        attached.as_millis(),
        first_started_ms,
        first_done.as_millis(),
        upload_to_output.as_millis(),
        idle_to_end.as_millis()
    );
    eps.cancel();
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_without_the_annex_right_gets_no_token_and_no_slurm_job() {
    if !slurm_available("the Slurm annex refusal test") {
        return;
    }
    let cluster = Cluster::start();
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    // bob holds no annex right (alice holds this one: it is not bob's).
    client.grant("alice", htfaas_functions::namespace::Right::Annex, "bob-slurm").await.expect("grant");
    let (ok, out, err) = cli(
        dir.path(),
        &cluster,
        &["create", "bob-slurm", "--slurm", "--owner", "bob", "--lifetime", "5m", "--log-dir", "/nonexistent"],
    );
    assert!(!ok, "created: {out}");
    assert!(err.contains("403") && err.contains("bob may not use annex \"bob-slurm\""), "{err}");
    assert!(cluster.live_jobs().is_empty(), "a Slurm job was submitted: {:?}", cluster.live_jobs());
    assert!(client.annexes().await.expect("list").is_empty(), "no annex is recorded");
    stack.stop().await.expect("clean stop");
}
