//! Native handler functions on the real stack: one warm worker per function version on the EP
//! serves run after run (its process id and run count say so), a new version starts a fresh
//! one, and a revocation ends every warm one. That two functions never share one is an attack
//! (`attacks::native`).

use crate::native::{busybox_function, ended_job};
use htfaas::client::Client;
use htfaas_functions::proto::{JobState, RevocationTarget};
use htfaas_functions::{Digest, FunctionManifest};
use htfaas_tests::{busybox_image, start_stack, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// A handler in busybox sh: per request it writes `<worker> <run> <marker>` to
/// `/output/<input name>.who` (the marker: what `/tmp/mark` held, which the first run of a
/// worker writes from `$MARK`; the worker: a random id it draws at start, as every sandbox's
/// process ids are its own), and answers 0.
const HANDLER: &str = r#"n=0
w=$(cat /proc/sys/kernel/random/uuid)
while read -r line; do
  n=$((n+1))
  [ -f /tmp/mark ] || echo "$MARK" > /tmp/mark
  f=$(ls /input)
  echo "$w $n $(cat /tmp/mark)" > "/output/$f.who"
  echo "served $f"
  echo '{"exit_code": 0}' >&3
done"#;

pub(crate) fn handler_function(image: Digest, name: &str, owner: &str, mark: &str) -> FunctionManifest {
    let mut m = busybox_function(image, name, &format!("/data/{name}"), &format!("/data/{name}-out/"), HANDLER);
    m.owner = owner.into();
    // The handler form: argv is the command alone.
    m.command.truncate(3);
    m.handler = true;
    m.env = vec![("MARK".into(), mark.into())];
    m
}

/// `(worker, run, marker)` of the run on `/data/<function>/<file>`, once its output is there.
pub(crate) async fn who(client: &Client, function: &str, file: &str) -> (String, u32, String) {
    let path = format!("/data/{function}/{file}");
    client.put_bytes(file.as_bytes().to_vec(), &path).await.expect("put");
    let job = ended_job(client, &path).await;
    let log = client.job_log(&job.id).await.map(|l| l.log).unwrap_or_default();
    assert_eq!(job.state, JobState::Completed, "{job:#?}\n{log}");
    assert!(log.contains(&format!("served {file}")), "the run's log is its own: {log}");
    let out = format!("/data/{function}-out/{file}.who");
    let text = wait_for(&out, LIMIT, || async { client.get_bytes(&out).await.ok().flatten() }).await;
    let text = String::from_utf8(text).expect("utf-8");
    let mut words = text.split_whitespace();
    let mut next = || words.next().unwrap_or_else(|| panic!("`worker run marker`: {text:?}")).to_owned();
    let (worker, run, mark) = (next(), next(), next());
    (worker, run.parse().expect("run"), mark)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_serves_its_version_warm_until_a_new_version_or_a_revocation() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let image = client.push_image(&busybox_image(dir.path()), None).await.expect("push");
    let owner = stack.info().user.clone();
    client.register(&handler_function(image.clone(), "warm", &owner, "v1")).await.expect("register");

    let (pid, run, mark) = who(&client, "warm", "a.dat").await;
    assert_eq!((run, mark.as_str()), (1, "v1"), "a worker started for the first run");
    let (pid2, run2, _) = who(&client, "warm", "b.dat").await;
    assert_eq!((pid2, run2), (pid.clone(), 2), "the same worker served the second run, warm");

    // A new version (its environment changed): a fresh worker, with the new environment.
    client.register(&handler_function(image.clone(), "warm", &owner, "v2")).await.expect("register v2");
    let (pid3, run3, mark3) = who(&client, "warm", "c.dat").await;
    assert_eq!((run3, mark3.as_str()), (1, "v2"), "version 2 never runs in version 1's worker");
    assert_ne!(pid3, pid);

    // Any revocation ends every warm worker: the next run starts a fresh one.
    client.revoke(RevocationTarget::Jti("no-such-token".into()), "drill").await.expect("revoke");
    let (_, run4, _) = who(&client, "warm", "d.dat").await;
    assert_eq!(run4, 1, "no handler outlives a revocation");
}

/// The developer's way to the handler form: `fn new --runtime native` (whose `main.py` also
/// serves, `--serve`), its app on the numpy base image the test command built, tried with
/// `fn run --handler`, registered with `--handler`; two uploads, two correct outputs, the
/// second served warm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_numpy_template_registered_as_a_handler_serves_uploads_warm() {
    let base = std::env::var_os("HTFAAS_NUMPY_IMAGE").map(std::path::PathBuf::from).expect("HTFAAS_NUMPY_IMAGE");
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let htfaas = |args: &[&str], cwd: &std::path::Path| {
        let out = std::process::Command::new(htfaas_tests::htfaas_binary())
            .args(args)
            .arg("--dir")
            .arg(dir.path())
            .current_dir(cwd)
            .env_remove("HTFAAS_API_TOKEN")
            .output()
            .expect("run htfaas");
        assert!(out.status.success(), "htfaas {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let new = std::process::Command::new(htfaas_tests::htfaas_binary())
        .args(["fn", "new", "stats", "--lang", "python", "--runtime", "native"])
        .current_dir(dir.path())
        .output()
        .expect("fn new");
    assert!(new.status.success(), "{}", String::from_utf8_lossy(&new.stderr));
    let project = dir.path().join("stats");
    let base = base.display().to_string();
    htfaas(
        &["image", "build", "--from", &base, "--add", "./app:/opt/app", "--tag", "stats", "--out", "stats.tar"],
        &project,
    );
    // Tried locally first, in the handler form, without the stack.
    let command = "python3 /opt/app/main.py --serve";
    let local = ["fn", "run", "--image", "stats.tar", "--command", command, "--handler", "sample.f32", "--out", "out"];
    let out = std::process::Command::new(htfaas_tests::htfaas_binary())
        .args(local)
        .current_dir(&project)
        .output()
        .expect("fn run");
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "fn run: {printed}{}", String::from_utf8_lossy(&out.stderr));
    assert!(printed.contains("outcome  exited 0") && printed.contains("sample.f32: 1024 samples"), "{printed}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(project.join("out/sample.f32.json")).expect("output")).expect("JSON");
    assert_eq!(v["n"], 1024, "{v}");
    htfaas(
        &[
            "fn",
            "register",
            "stats",
            "--image",
            "stats",
            "--command",
            "python3 /opt/app/main.py --serve",
            "--handler",
            "--trigger",
            "/data/waves/**",
            "--outputs",
            "/data/stats/",
            "--memory-mb",
            "512",
        ],
        &project,
    );
    for (i, name) in ["one.f32", "two.f32"].into_iter().enumerate() {
        let samples: Vec<f32> = (0..256).map(|k| (k + i) as f32).collect();
        let bytes: Vec<u8> = samples.iter().flat_map(|v| v.to_le_bytes()).collect();
        let path = format!("/data/waves/{name}");
        client.put_bytes(bytes, &path).await.expect("put");
        let job = ended_job(&client, &path).await;
        let log = client.job_log(&job.id).await.map(|l| l.log).unwrap_or_default();
        assert_eq!(job.state, JobState::Completed, "{job:#?}\n{log}");
        assert!(log.contains(&format!("/input/{name}: 256 samples")), "{log}");
        let warm = log.contains("served by a warm handler");
        assert_eq!(warm, i == 1, "the first run starts the worker, the second is served warm: {log}");
        let out = format!("/data/stats/{name}.json");
        let out = wait_for(&out, LIMIT, || async { client.get_bytes(&out).await.ok().flatten() }).await;
        let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
        assert_eq!(v["n"], 256, "{v}");
        let mean = 127.5 + i as f64;
        assert!((v["mean"].as_f64().expect("mean") - mean).abs() < 1e-9, "{v}");
    }
}
