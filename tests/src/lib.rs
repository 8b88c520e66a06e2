//! Harness for the end-to-end tests: the example guests built once, a whole stack in a
//! temporary directory, and bounded waiting.

pub mod cdp;
#[cfg(test)]
mod tidy;

use std::future::Future;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Path of a guest module from `examples/`, building the examples workspace once per test
/// binary (`cargo build --release --target wasm32-wasip1 --target wasm32-wasip2`).
pub fn guest_wasm(name: &str) -> PathBuf {
    examples_built().join(format!("wasm32-wasip1/release/{name}.wasm"))
}

/// Path of the same guest built as a WASI preview 2 component.
pub fn guest_component(name: &str) -> PathBuf {
    examples_built().join(format!("wasm32-wasip2/release/{name}.wasm"))
}

/// Builds the Rust example guests for both WASI targets once; returns `examples/target`.
fn examples_built() -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let built = BUILT.get_or_init(|| {
        let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "--target", "wasm32-wasip1", "--target", "wasm32-wasip2", "--manifest-path"])
            .arg(examples.join("Cargo.toml"))
            .output()
            .map_err(|e| format!("run cargo: {e}"))?;
        if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).into_owned()) }
    });
    if let Err(e) = built {
        panic!(
            "building the example guests failed (are the wasm32-wasip1 and wasm32-wasip2 targets installed? \
             scripts/install-deps.sh):\n{e}"
        );
    }
    examples.join("target")
}

/// The `htfaas` binary, for what must run it as a process (a Slurm annex's batch job runs
/// `htfaas ep`): `HTFAAS_BIN` when set, else built once per test binary with these tests'
/// profile into their own target directory (`cargo build -p htfaas --bin htfaas --features
/// kafka`, as the test command builds it), so it is
/// never older than the code under test.
pub fn htfaas_binary() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        if let Some(bin) = std::env::var_os("HTFAAS_BIN") {
            let bin = PathBuf::from(bin);
            return if bin.is_file() { Ok(bin) } else { Err(format!("HTFAAS_BIN={} is no file", bin.display())) };
        }
        // …/target/debug/deps/e2e-<hash> → …/target
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let profile_dir = exe.parent().and_then(|d| d.parent()).ok_or("no target directory")?;
        let target = profile_dir.parent().ok_or("no target directory")?;
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo.args(["build", "-p", "htfaas", "--bin", "htfaas", "--features", "kafka", "--manifest-path"]);
        cargo.arg(root.join("Cargo.toml"));
        cargo.arg("--target-dir").arg(target);
        // What `cargo test` set for this test (CARGO_MANIFEST_DIR, CARGO_PKG_*, …) would reach
        // the build scripts (ring's reads CARGO_MANIFEST_DIR) and make cargo rebuild everything.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("CARGO_") && !matches!(key.as_ref(), "CARGO_HOME" | "CARGO_TARGET_DIR") {
                cargo.env_remove(key.as_ref());
            }
        }
        if profile_dir.ends_with("release") {
            cargo.arg("--release");
        }
        let out = cargo.output().map_err(|e| format!("run cargo: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(profile_dir.join("htfaas"))
    });
    match built {
        Ok(bin) => bin.clone(),
        Err(e) => panic!("building the htfaas binary failed:\n{e}"),
    }
}

/// A stack in a fresh temporary directory, deleted when the returned guard drops.
pub async fn start_stack() -> (tempfile::TempDir, htfaas::stack::Stack) {
    let dir = tempfile::tempdir().expect("create a temp dir");
    let stack = htfaas::stack::Stack::start(htfaas::stack::StackOptions::new(dir.path()))
        .await
        .expect("start the stack (nats-server installed? scripts/install-deps.sh)");
    (dir, stack)
}

/// A stack in a fresh temporary directory with options `adjust`ed from the defaults.
pub async fn start_stack_with(
    adjust: impl FnOnce(&mut htfaas::stack::StackOptions),
) -> (tempfile::TempDir, htfaas::stack::Stack) {
    let dir = tempfile::tempdir().expect("create a temp dir");
    let mut opts = htfaas::stack::StackOptions::new(dir.path());
    adjust(&mut opts);
    let stack = htfaas::stack::Stack::start(opts)
        .await
        .expect("start the stack (nats-server installed? scripts/install-deps.sh)");
    (dir, stack)
}

/// Grants `owner` what the stack's user has: read and write under `/data/` (namespaces: an owner
/// with no grant may run nothing), so that its token may run the stack's functions there.
pub async fn share_data(client: &htfaas::client::Client, owner: &str) {
    use htfaas_functions::namespace::Right;
    for right in [Right::Read, Right::Write] {
        client.grant(owner, right, "/data/").await.expect("grant /data/");
    }
}

/// Grants the stack's user (alice) writes under `/out/`, where the functions of some tests put
/// their outputs so that these fire nothing under `/data/`.
pub async fn grant_out(client: &htfaas::client::Client) {
    client.grant(htfaas::stack::USER, htfaas_functions::namespace::Right::Write, "/out/").await.expect("grant /out/");
}

/// Polls `check` every 20 ms until it yields `Some`, or panics after `limit` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A secret of the stack in `dir` (its `secrets.json`), e.g. `gateway_storage_secret`.
pub fn stack_secret(dir: &std::path::Path, key: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("secrets.json")).expect("secrets")).expect("json");
    v[key].as_str().expect("secret").to_owned()
}

/// Asks the storage at `storage` for a macaroon with `caveats` (dCache's macaroon request, as
/// `user` with `secret`), valid for an hour.
pub async fn request_macaroon(storage: &str, user: &str, secret: &str, caveats: &[&str]) -> reqwest::Response {
    htfaas_gateway::http_client()
        .expect("client")
        .post(format!("{storage}/"))
        .basic_auth(user, Some(secret))
        .header("Content-Type", "application/macaroon-request")
        .body(serde_json::json!({"caveats": caveats, "validity": "PT1H"}).to_string())
        .send()
        .await
        .expect("macaroon request")
}

/// Adler-32 of `bytes`, as lower-case hex (the reference for the checksum example).
pub fn adler32_hex(bytes: &[u8]) -> String {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in bytes {
        a = (a + u32::from(x)) % 65_521;
        b = (b + a) % 65_521;
    }
    format!("{:08x}", (b << 16) | a)
}

/// A guest that never ends on its own (until its wall-time cap or a cancel).
pub const SPIN_WAT: &str = r#"(module (memory (export "memory") 1) (func (export "_start") (loop br 0)))"#;

/// Waits until every event published so far that any of the gateway's ingest lanes reads has
/// been decided (`events_pending` 0: JetStream holds nothing unacked for any lane).
/// An event on a path subject no owner's lane reads (no function of an owner whose namespace
/// covers it) is never read, and so never fires a function registered later.
pub async fn events_settled(client: &htfaas::client::Client) {
    wait_for("the events published so far to be decided", Duration::from_secs(30), || async {
        (client.stats().await.ok()?.events_pending == 0).then_some(())
    })
    .await;
}

/// Registers `spin` (the [`SPIN_WAT`] guest, 1 core, 120 s cap), fired by `/data/spin/**`, and
/// puts `/data/spin/in.dat` in storage first without firing it, so that runs happen only when a
/// test asks (`run_function`). Returns nothing; panics on failure.
pub async fn register_spin(client: &htfaas::client::Client) {
    client.put_bytes(b"x".to_vec(), "/data/spin/in.dat").await.expect("put");
    events_settled(client).await;
    let spin = client.upload_module(wat::parse_str(SPIN_WAT).expect("wat")).await.expect("upload");
    let mut m = htfaas::stack::demo_manifest(spin);
    m.name = "spin".into();
    m.trigger.path = "/data/spin/**".into();
    m.outputs.dir = "/data/spin-out/".into();
    m.resources = htfaas_functions::Resources::new(1, 64, 120);
    client.register(&m).await.expect("register spin");
}

/// Uploads the example `checksum` module to the stack's registry and returns its digest.
pub async fn upload_checksum(client: &htfaas::client::Client) -> htfaas_functions::Digest {
    let wasm = std::fs::read(guest_wasm("checksum")).expect("read checksum.wasm");
    client.upload_module(wasm).await.expect("upload the checksum module")
}

/// Path of a C guest from `examples/c/` (`examples/c/build.sh`: clang for wasm32-wasi with
/// Debian's wasi-libc), built once per test binary, next to the Rust guests.
pub fn guest_wasm_c(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let built = BUILT.get_or_init(|| {
        let out = Command::new(examples.join("c/build.sh")).output().map_err(|e| format!("run build.sh: {e}"))?;
        if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).into_owned()) }
    });
    if let Err(e) = built {
        panic!("building the C example guests failed (clang, wasi-libc: scripts/install-deps.sh):\n{e}");
    }
    examples.join(format!("target/wasm32-wasip1/release/{name}.wasm"))
}

/// Runs the guest module at `wasm` once in the EP's runtime alone (no stack), with `input`
/// as `/input/<name>` and `args` after its path; returns the run and the files it left in
/// `/output`, by name. For what the stack does not return, such as a failed guest's stderr.
/// Blocks the calling thread for the run.
pub fn run_guest_alone(
    wasm: &std::path::Path,
    name: &str,
    input: &[u8],
    args: &[&str],
) -> (htfaas_ep::runtime::GuestRun, std::collections::BTreeMap<String, Vec<u8>>) {
    let dir = tempfile::tempdir().expect("create a temp dir");
    let (input_dir, output_dir) = (dir.path().join("input"), dir.path().join("output"));
    std::fs::create_dir_all(&input_dir).expect("mkdir input");
    std::fs::create_dir_all(&output_dir).expect("mkdir output");
    std::fs::write(input_dir.join(name), input).expect("write the input");
    let bytes = std::fs::read(wasm).expect("read the module");
    let rt = htfaas_ep::Runtime::new().expect("runtime");
    let guest = rt.load(&htfaas_functions::Digest::of(&bytes), &bytes).expect("load the module");
    let stem = wasm.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut argv = vec![stem, format!("/input/{name}")];
    argv.extend(args.iter().map(|a| a.to_string()));
    let job = htfaas_ep::runtime::GuestJob {
        argv,
        env: vec![],
        input_dir,
        output_dir: output_dir.clone(),
        checkpoint_dir: None,
        resources: htfaas_functions::Resources::new(1, 512, 60),
        log_limit_bytes: 64 * 1024,
    };
    // `run_job` blocks and drives its own runtime: a thread of its own, also from async tests.
    let run = std::thread::scope(|s| s.spawn(|| rt.run_job(&guest, &job)).join()).expect("the guest's thread");
    let outputs = std::fs::read_dir(&output_dir)
        .expect("list outputs")
        .map(|e| {
            let e = e.expect("dir entry");
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).expect("read an output"))
        })
        .collect();
    (run, outputs)
}

/// The test binary's target directory (`…/target`, from `…/target/debug/deps/e2e-<hash>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().and_then(|d| d.parent()).and_then(|d| d.parent()).expect("a target directory").to_owned()
}

/// The toolchains `htfaas fn build` would find for `project` ([`htfaas::devkit::Tools::from_env`]),
/// with componentize-py and componentize-js taken from `.tools/` (`scripts/install-deps.sh`)
/// when neither their variable nor `PATH` has them.
pub fn dev_tools(project: &std::path::Path) -> htfaas::devkit::Tools {
    let mut tools = htfaas::devkit::Tools::from_env(project);
    let tools_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools");
    if tools.componentize_py.is_none() {
        let venv = tools_dir.join("venv/bin/componentize-py");
        tools.componentize_py = venv.is_file().then_some(venv);
    }
    if tools.componentize_js.is_none() {
        let node = tools_dir.join("node/node_modules/.bin/componentize-js");
        tools.componentize_js = node.is_file().then_some(node);
    }
    tools
}

/// The Python or JavaScript project at `dir` (relative to the repository) built once per test
/// binary with `htfaas fn build`'s code, into `<target>/htfaas-tests-python/<name>.wasm`.
pub fn built_function(dir: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, path)) = built.iter().find(|(d, _)| d == dir) {
        return path.clone();
    }
    let project_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let project = htfaas::devkit::Project::detect(&project_dir).expect("a Python project");
    let out_dir = target_dir().join("htfaas-tests-python");
    std::fs::create_dir_all(&out_dir).expect("mkdir the Python guests' directory");
    let out = out_dir.join(format!("{}.wasm", project.name));
    htfaas::devkit::build(&project, Some(&out), &dev_tools(&project_dir))
        .unwrap_or_else(|e| panic!("building {dir} failed (scripts/install-deps.sh installs the toolchains): {e}"));
    built.push((dir.to_owned(), out.clone()));
    out
}

/// A counter or gauge's value in a Prometheus text page: the first sample named `name` whose
/// labels contain `labels` (e.g. `reason="origin"`; empty for none).
pub fn metric(page: &str, name: &str, labels: &str) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (key, value) = l.rsplit_once(' ')?;
        let (metric, rest) = key.split_once('{').map_or((key, ""), |(m, r)| (m, r));
        (metric == name && rest.contains(labels)).then(|| value.parse().ok()).flatten()
    })
}

/// The gateway's `/metrics` page of the stack described by `info` (admin token), or `None`
/// while it does not answer.
pub async fn gateway_metrics(info: &htfaas::client::StackInfo) -> Option<String> {
    htfaas_gateway::http_client()
        .ok()?
        .get(format!("{}/metrics", info.gateway_url))
        .bearer_auth(&info.admin_token)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()
}

/// A native image for tests, as a tar in `dir`: a static busybox (`/bin/sh` and its applets)
/// and the mount points the sandbox needs; built here from the host's busybox-static, with no
/// network (`scripts/install-deps.sh` installs it).
pub fn busybox_image(dir: &std::path::Path) -> PathBuf {
    let root = dir.join("busybox-root");
    for d in ["bin", "input", "output", "tmp", "proc", "dev", "etc"] {
        std::fs::create_dir_all(root.join(d)).expect("image directories");
    }
    std::fs::copy("/usr/bin/busybox", root.join("bin/busybox"))
        .expect("/usr/bin/busybox (busybox-static; scripts/install-deps.sh installs it)");
    for applet in BUSYBOX_APPLETS {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).expect("applet link");
    }
    let tar = dir.join("busybox.tar");
    let out = Command::new("tar")
        .args(["-cf"])
        .arg(&tar)
        .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
        .arg(&root)
        .arg(".")
        .output()
        .expect("run tar");
    assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
    tar
}

/// The busybox applets [`busybox_image`] links.
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh", "cat", "echo", "sleep", "id", "ls", "dd", "wc", "head", "basename", "seq", "yes", "grep", "nproc", "env",
    "ifconfig", "nc", "wget", "touch", "mkdir", "rm", "kill", "ps", "setsid", "chmod", "stat", "true", "false",
];

/// An API token for `sub` with `scope`, signed with the gateway key of the stack in `dir` (as
/// `htfaas token api` makes one).
pub fn api_token(dir: &std::path::Path, sub: &str, scope: htfaas_functions::token::Scope) -> String {
    use htfaas_functions::token::{ApiClaims, SigningKey};
    let key = SigningKey::load_or_create(&dir.join("gateway/submit.pem"), "gateway-1").expect("the gateway's key");
    key.sign(&ApiClaims::new("htfaas-gateway", sub, scope, 600)).expect("sign")
}

/// Runs the real `htfaas args…` with `home` as its config directory (its profiles) and working
/// directory, and no local stack or token from the environment to fall back on.
pub async fn htfaas_cli(home: &std::path::Path, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(htfaas_binary())
        .args(args)
        .current_dir(home)
        .env("HTFAAS_CONFIG_DIR", home.join("config"))
        .env_remove("HTFAAS_DIR")
        .env_remove("HTFAAS_API_TOKEN")
        .env_remove("HTFAAS_PROFILE")
        .output()
        .await
        .expect("run htfaas")
}
