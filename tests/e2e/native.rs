//! Native functions on the real stack: an image pushed to the gateway, a function registered
//! with `runtime: native`, an upload that fires it, the EP fetching, checking and unpacking the
//! image and running the command in its sandbox (bubblewrap, seccomp, a control group), and
//! the job's output, record and usage. The EPs here run as root with bubblewrap installed
//! (`scripts/install-deps.sh`), so they offer the native runtime.
//!
//! - a busybox image (built here, no network): the guest contract (argv, environment,
//!   `/input`, `/output`), the uid it runs as, the job record naming image and command, and
//!   the CPU a 1-core job is held to;
//! - the Python + numpy image that the test command builds with `htfaas image build`
//!   (`HTFAAS_NUMPY_IMAGE`): what a new user does from README, through the `htfaas` command.

use htfaas::client::Client;
use htfaas::stack::demo_manifest;
use htfaas_functions::manifest::RuntimeKind;
use htfaas_functions::proto::{JobRecord, JobState};
use htfaas_functions::{Digest, FunctionManifest, Resources};
use htfaas_tests::{busybox_image, htfaas_binary, start_stack, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// A native manifest over the busybox image: `sh -c SCRIPT sh /input/NAME args…`.
pub(crate) fn busybox_function(
    image: Digest,
    name: &str,
    trigger: &str,
    outputs: &str,
    script: &str,
) -> FunctionManifest {
    let mut m = demo_manifest(image);
    m.name = name.into();
    m.runtime = RuntimeKind::Native;
    m.command = vec!["/bin/sh".into(), "-c".into(), script.into(), "sh".into()];
    m.trigger.path = format!("{trigger}/**");
    m.outputs.dir = outputs.into();
    m.resources = Resources::new(1, 256, 60);
    m
}

/// The job fired by `path`, once it ended.
pub(crate) async fn ended_job(client: &Client, path: &str) -> JobRecord {
    wait_for(&format!("the job on {path} to end"), LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        jobs.into_iter().find(|j| j.event.path == path && matches!(j.state, JobState::Completed | JobState::Failed))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_function_runs_on_an_upload_with_the_wasm_guest_contract() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let image = busybox_image(dir.path());
    let digest = client.push_image(&image, Some("busybox")).await.expect("push the image");
    assert_eq!(client.resolve_image("busybox").await.expect("by tag"), digest);
    // The same root pushed as a directory by the command: tarred the same way, the same image.
    let out = std::process::Command::new(htfaas_binary())
        .args(["image", "push", "--tag", "bbdir", "--dir"])
        .arg(dir.path())
        .arg(dir.path().join("busybox-root"))
        .env_remove("HTFAAS_API_TOKEN")
        .output()
        .expect("htfaas image push");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), digest.as_str(), "a directory pushes as its tar");

    let script = r#"set -e; n=$(basename "$1"); wc -c < "$1" > /output/$n.size; id -u > /output/$n.uid;
        echo "$@" > /output/$n.argv; env | sort > /output/$n.env; echo done >&2"#;
    let mut m = busybox_function(digest.clone(), "native-size", "/data/raw", "/data/sizes/", script);
    m.args = vec!["--flag".into()];
    m.env = vec![("MODE".into(), "fast".into())];
    client.register(&m).await.expect("register");
    client.put_bytes(vec![7u8; 1234], "/data/raw/a.dat").await.expect("put");

    let job = ended_job(&client, "/data/raw/a.dat").await;
    let log = client.job_log(&job.id).await.expect("log").log;
    assert_eq!(job.state, JobState::Completed, "{job:#?}\n{log}");
    let get = |p: &'static str| {
        let client = client.clone();
        async move { wait_for(p, LIMIT, || async { client.get_bytes(p).await.ok().flatten() }).await }
    };
    assert_eq!(get("/data/sizes/a.dat.size").await, b"1234\n");
    assert_eq!(String::from_utf8(get("/data/sizes/a.dat.argv").await).expect("utf-8"), "/input/a.dat --flag\n");
    let uid: u32 = String::from_utf8(get("/data/sizes/a.dat.uid").await).expect("utf-8").trim().parse().expect("uid");
    assert!(uid >= 900_000, "a per-job anonymous uid from the EP's pool, never root: {uid}");
    let env = String::from_utf8(get("/data/sizes/a.dat.env").await).expect("utf-8");
    let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    assert!(names.contains(&"MODE") && env.contains("MODE=fast\n"), "{env}");
    let shells_own = ["HOME", "MODE", "PATH", "PWD", "SHLVL", "OLDPWD", "_"];
    assert!(names.iter().all(|n| shells_own.contains(n)), "only the manifest's env and the shell's own: {env}");

    assert_eq!(job.digest, digest, "the job names the image it was fired with");
    assert_eq!(job.native.as_ref().map(|n| n.command.clone()), Some(m.command.clone()));
    let usage = job.usage.expect("usage");
    assert!(usage.peak_memory_bytes > 0, "memory from the job's cgroup: {usage:?}");
    assert!(log.contains("done"), "the guest's stderr is the job's log: {log}");
}

/// A 1-core job's two busy processes share one core (the cpu quota), and a 2-core job's run
/// side by side; each is charged the CPU its control group used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_cores_are_its_cpu_quota_and_it_is_charged_what_it_used() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = client.push_image(&busybox_image(dir.path()), None).await.expect("push");
    // Two processes, each a fixed amount of work; the job ends when both have.
    let script = r#"w() { i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; }; w & w & wait; echo ok > /output/$(basename "$1")"#;
    for cpus in [1, 2] {
        let mut m = busybox_function(
            digest.clone(),
            &format!("busy{cpus}"),
            &format!("/data/busy{cpus}"),
            &format!("/data/busy{cpus}-out/"),
            script,
        );
        m.resources = Resources::new(cpus, 256, 120);
        client.register(&m).await.expect("register");
    }
    let before = client.accounting().await.expect("accounts");
    let cpu_before: f64 = before.iter().map(|a| a.cpu_seconds).sum();
    client.put_bytes(b"x".to_vec(), "/data/busy1/a").await.expect("put");
    let one = ended_job(&client, "/data/busy1/a").await;
    client.put_bytes(b"x".to_vec(), "/data/busy2/a").await.expect("put");
    let two = ended_job(&client, "/data/busy2/a").await;
    for j in [&one, &two] {
        assert_eq!(j.state, JobState::Completed, "{j:#?}");
    }
    let (u1, u2) = (one.usage.expect("usage"), two.usage.expect("usage"));
    // The quota: one core's worth of CPU per wall second at most (the kernel's period is
    // 100 ms; a few ms of slack for the sandbox's own start).
    assert!(u1.cpu_ms <= u1.wall_ms + 100, "a 1-core job used more than one core: {u1:?}");
    assert!(u1.cpu_ms > 0 && u2.cpu_ms > 0, "{u1:?} {u2:?}");
    // Charged what the control groups measured.
    let after = wait_for("both jobs charged", LIMIT, || async {
        let accounts = client.accounting().await.ok()?;
        let jobs: u64 = accounts.iter().map(|a| a.jobs_completed).sum();
        (jobs >= 2).then_some(accounts)
    })
    .await;
    let cpu_after: f64 = after.iter().map(|a| a.cpu_seconds).sum();
    let charged_ms = ((cpu_after - cpu_before) * 1000.0).round() as u64;
    assert_eq!(charged_ms, u1.cpu_ms + u2.cpu_ms, "the account is charged the jobs' CPU: {after:?}");
}

/// What a new user does from README: build an image with numpy (on the base image the test
/// command built with `htfaas image build --packages python3-numpy`, adding the app), register
/// the Python function on it, upload a file and read the output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_numpy_function_from_readme_runs_on_an_upload() {
    let base = std::env::var_os("HTFAAS_NUMPY_IMAGE").map(std::path::PathBuf::from).expect(
        "HTFAAS_NUMPY_IMAGE: the numpy base image the test command builds (scripts/test.sh: htfaas image build)",
    );
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let app = dir.path().join("app");
    std::fs::create_dir_all(&app).expect("app dir");
    std::fs::write(app.join("calibrate.py"), CALIBRATE_PY).expect("write the app");
    let htfaas = |args: &[&str]| {
        let out = std::process::Command::new(htfaas_binary())
            .args(args)
            .arg("--dir")
            .arg(dir.path())
            .current_dir(dir.path())
            .env_remove("HTFAAS_API_TOKEN")
            .output()
            .expect("run htfaas");
        assert!(out.status.success(), "htfaas {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let built = htfaas(&[
        "image",
        "build",
        "--from",
        &base.display().to_string(),
        "--add",
        &format!("{}:/opt/app", app.display()),
        "--tag",
        "calib",
    ]);
    assert!(built.contains("pushed sha256:"), "{built}");
    htfaas(&[
        "fn",
        "register",
        "calibrate",
        "--image",
        "calib",
        "--command",
        "python3 /opt/app/calibrate.py",
        "--trigger",
        "/data/waves/**",
        "--outputs",
        "/data/calib/",
        "--memory-mb",
        "512",
    ]);
    let samples: Vec<f32> = (0..4096).map(|i| ((i % 64) as f32) * 0.5 - 3.0).collect();
    let bytes: Vec<u8> = samples.iter().flat_map(|v| v.to_le_bytes()).collect();
    client.put_bytes(bytes, "/data/waves/run1.f32").await.expect("put");
    let out = wait_for("the calibration", LIMIT, || async {
        client.get_bytes("/data/calib/run1.f32.json").await.ok().flatten()
    })
    .await;
    let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
    let mean = samples.iter().map(|&x| f64::from(x)).sum::<f64>() / samples.len() as f64;
    let max = samples.iter().copied().fold(f32::MIN, f32::max);
    assert_eq!(v["n"], 4096, "{v}");
    assert!((v["mean"].as_f64().expect("mean") - mean).abs() < 1e-6, "{v} vs {mean}");
    assert_eq!(v["max"].as_f64().expect("max"), f64::from(max), "{v}");
    assert!(v["numpy"].as_str().is_some_and(|s| s.starts_with('1')), "numpy's version: {v}");
    let job = ended_job(&client, "/data/waves/run1.f32").await;
    assert_eq!(job.state, JobState::Completed, "{job:#?}");
    assert!(job.native.is_some(), "{job:#?}");
}

/// The README's Python function: statistics of a float32 file with numpy.
const CALIBRATE_PY: &str = r#"import json, os, sys
import numpy as np

path = sys.argv[1]
a = np.fromfile(path, dtype="<f4")
out = {"n": int(a.size), "mean": float(a.astype(np.float64).mean()), "max": float(a.max()), "numpy": np.__version__}
with open(os.path.join("/output", os.path.basename(path) + ".json"), "w") as f:
    json.dump(out, f)
"#;

/// A developer's native function with no stack: `fn new --runtime native` makes the numpy
/// project, its app goes onto the numpy base image, and `fn run --image` runs it on the sample
/// in the EP's sandbox, printing its outputs and usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fn_new_native_and_fn_run_work_without_a_stack() {
    let base = std::env::var_os("HTFAAS_NUMPY_IMAGE").map(std::path::PathBuf::from).expect("HTFAAS_NUMPY_IMAGE");
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |args: &[&str], cwd: &std::path::Path| {
        let out = std::process::Command::new(htfaas_binary()).args(args).current_dir(cwd).output().expect("htfaas");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "htfaas {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    run(&["fn", "new", "stats", "--lang", "python", "--runtime", "native"], dir.path());
    let project = dir.path().join("stats");
    assert!(project.join("build-image.sh").is_file() && project.join("app/main.py").is_file());
    let base = base.display().to_string();
    run(&["image", "build", "--from", &base, "--add", "./app:/opt/app", "--no-push", "--out", "stats.tar"], &project);
    let printed = run(
        &["fn", "run", "--image", "stats.tar", "--command", "python3 /opt/app/main.py", "sample.f32", "--out", "out"],
        &project,
    );
    assert!(printed.contains("outcome  exited 0") && printed.contains("sample.f32: 1024 samples"), "{printed}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(project.join("out/sample.f32.json")).expect("output")).expect("JSON");
    assert_eq!(v["n"], 1024, "{v}");
    assert!((v["mean"].as_f64().expect("mean") - 7.75).abs() < 1e-9, "{v}");
}
