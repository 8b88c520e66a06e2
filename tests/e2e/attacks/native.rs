//! Native guests against their EP, through the whole path (push an image → register →
//! upload → gateway → scheduler → EP's sandbox): a guest reaching for the host (a listener on
//! its loopback, its files, writes outside `/output`, a setuid binary), a guest past its limits
//! (a fork bomb, memory, `/tmp`, `/output`, run time, a daemon left behind), hostile images
//! (an entry outside the root, bytes that are not the digest), a native job with no EP to
//! run it, and one owner's function hoping for another's warm handler. Each ends with its own outcome, nothing of the host is touched, and the EP runs the
//! next job as if nothing happened.

use crate::handlers::{handler_function, who};
use crate::native::{busybox_function, ended_job};
use htfaas::client::Client;
use htfaas_functions::namespace::Right;
use htfaas_functions::proto::JobState;
use htfaas_functions::{Digest, Resources};
use htfaas_tests::{busybox_image, start_stack, start_stack_with, wait_for};
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// Registers `script` as `name` on `image`, fired under `/data/<name>/`, writing to
/// `/data/<name>-out/`, with `resources`, and fires it once; the ended job.
async fn fire(
    client: &Client,
    image: &Digest,
    name: &str,
    script: &str,
    resources: Resources,
    adjust: impl FnOnce(&mut htfaas_functions::FunctionManifest),
) -> htfaas_functions::proto::JobRecord {
    let mut m = busybox_function(image.clone(), name, &format!("/data/{name}"), &format!("/data/{name}-out/"), script);
    m.resources = resources;
    adjust(&mut m);
    client.register(&m).await.expect("register");
    let path = format!("/data/{name}/x.dat");
    client.put_bytes(b"input".to_vec(), &path).await.expect("put");
    ended_job(client, &path).await
}

/// Every host process whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) {
                found.push(format!("{}: {cmd}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// Reaching for the host: its loopback (a listener of this test), its files (the gateway's
/// signing key, /etc/shadow), writes outside `/output`, and a setuid-root binary in the image.
/// None works; the guest runs under seccomp with no_new_privs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_guest_cannot_reach_the_host() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    // An image with a setuid-root busybox beside the plain one, from the busybox image's root.
    busybox_image(dir.path());
    let root = dir.path().join("busybox-root");
    std::fs::copy(root.join("bin/busybox"), root.join("bin/suid")).expect("copy");
    let tar = dir.path().join("suid.tar");
    let out = std::process::Command::new("tar")
        .args(["-cf"])
        .arg(&tar)
        .args(["--owner=0", "--group=0", "--numeric-owner", "--mode=u+s", "-C"])
        .arg(&root)
        .arg(".")
        .output()
        .expect("tar");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let digest = client.push_image(&tar, None).await.expect("push");

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener on the host's loopback");
    let port = listener.local_addr().expect("addr").port();
    let key = dir.path().join("gateway/submit.pem");
    assert!(key.is_file(), "the gateway's signing key is at {}", key.display());
    let script = format!(
        r#"o=/output/report; : > $o
        if nc -w 2 127.0.0.1 {port} </dev/null 2>/dev/null; then echo loopback:reached >> $o; else echo loopback:refused >> $o; fi
        for f in {key} /etc/shadow /proc/1/root/etc/shadow; do if cat "$f" >/dev/null 2>&1; then echo "read:$f" >> $o; else echo "unreadable:$f" >> $o; fi; done
        for f in /etc/x /input/x /x /usr/x; do if touch "$f" 2>/dev/null; then echo "wrote:$f" >> $o; else echo "readonly:$f" >> $o; fi; done
        echo "suid-mode:$(stat -c %a /bin/suid)" >> $o
        echo "suid-uid:$(/bin/suid id -u)" >> $o
        grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status | tr -d '\t ' >> $o
        echo "ifaces:$(ifconfig -a | grep -c '^[a-z]')" >> $o"#,
        key = key.display()
    );
    let job = fire(&client, &digest, "reach", &script, Resources::new(1, 256, 30), |_| {}).await;
    assert_eq!(job.state, JobState::Completed, "{job:#?}");
    let report = client.get_bytes("/data/reach-out/report").await.expect("get").expect("the report");
    let report = String::from_utf8(report).expect("utf-8");
    let lines: Vec<&str> = report.lines().collect();
    assert!(lines.contains(&"loopback:refused"), "{report}");
    for f in [key.display().to_string(), "/etc/shadow".into(), "/proc/1/root/etc/shadow".into()] {
        assert!(lines.contains(&format!("unreadable:{f}").as_str()), "{f}: {report}");
    }
    for f in ["/etc/x", "/input/x", "/x", "/usr/x"] {
        assert!(lines.contains(&format!("readonly:{f}").as_str()), "{f}: {report}");
    }
    assert!(lines.contains(&"suid-mode:755"), "the setuid bit is stripped at unpacking: {report}");
    assert!(!lines.contains(&"suid-uid:0"), "{report}");
    assert!(lines.contains(&"Seccomp:2") && lines.contains(&"NoNewPrivs:1"), "{report}");
    assert!(lines.contains(&"ifaces:1"), "no network but lo: {report}");
    listener.set_nonblocking(true).expect("nonblocking");
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "no connection from the sandbox reached the host's loopback"
    );
}

/// Past its limits: a fork bomb and a sleep run into the run time, an allocation into the
/// memory limit (`memory_exceeded`), `/tmp` and `/output` into their sizes, and a daemon left
/// behind in a new session is gone with its job. The EP runs a plain job afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_guest_is_held_to_its_limits() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = client.push_image(&busybox_image(dir.path()), None).await.expect("push");

    let bomb = fire(&client, &digest, "bomb", "b() { b | b & }; b; sleep 100", Resources::new(1, 256, 3), |_| {}).await;
    assert_eq!(bomb.state, JobState::Failed, "{bomb:#?}");
    assert!(bomb.reason.contains("time") || bomb.exit_code.is_some_and(|c| c != 0), "{bomb:#?}");

    let sleeper = fire(&client, &digest, "sleeper", "sleep 1000", Resources::new(1, 64, 2), |_| {}).await;
    assert_eq!(sleeper.state, JobState::Failed);
    assert!(sleeper.reason.contains("time"), "{sleeper:#?}");

    let hog = "dd if=/dev/zero of=/dev/null bs=300M count=1";
    let hog = fire(&client, &digest, "hog", hog, Resources::new(1, 64, 30), |_| {}).await;
    assert_eq!(hog.state, JobState::Failed, "{hog:#?}");
    assert!(hog.reason.contains("memory"), "{hog:#?}");

    let tmp = "dd if=/dev/zero of=/tmp/fill bs=1M count=64";
    let tmp =
        fire(&client, &digest, "tmpfill", tmp, Resources { disk_mb: 8, ..Resources::new(1, 256, 30) }, |_| {}).await;
    assert_eq!(tmp.state, JobState::Failed, "{tmp:#?}");
    assert_eq!(tmp.exit_code, Some(1), "dd finds /tmp full: {tmp:#?}");
    let log = client.job_log(&tmp.id).await.expect("log").log;
    assert!(log.contains("No space left"), "{log}");

    let out = "dd if=/dev/zero of=/output/fill bs=1M count=8";
    let out = fire(&client, &digest, "outfill", out, Resources::new(1, 256, 30), |m| {
        m.limits.max_output_bytes = Some(1 << 20)
    })
    .await;
    assert_eq!(out.state, JobState::Failed, "{out:#?}");
    assert!(out.reason.contains("output"), "{out:#?}");
    assert!(client.get_bytes("/data/outfill-out/fill").await.expect("get").is_none(), "nothing stored");

    let marker = "987654";
    let daemon = format!("setsid sh -c 'exec sleep {marker}' </dev/null >/dev/null 2>&1 & echo ok > /output/ok");
    let daemon = fire(&client, &digest, "daemon", &daemon, Resources::new(1, 64, 30), |_| {}).await;
    assert_eq!(daemon.state, JobState::Completed, "{daemon:#?}");
    assert_eq!(processes_with(&format!("sleep {marker}")), Vec::<String>::new(), "the daemon died with its job");

    let fine = fire(&client, &digest, "fine", "echo fine > /output/fine", Resources::new(1, 64, 30), |_| {}).await;
    assert_eq!(fine.state, JobState::Completed, "the EP runs on: {fine:#?}");
}

/// A hand-made ustar of `entries` (name, type flag, data, link name): what `tar` refuses to
/// write (`../` names) is the attack.
fn ustar(entries: &[(&str, u8, &[u8], &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, data, link) in entries {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000755");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = *kind;
        h[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// Hostile images: an entry climbing out of the root, a symlink out of it with a file
/// written through it, and an image whose stored bytes no longer match its digest. Each job
/// fails at its image (`module_failed`, naming why) and nothing is written outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_images_are_refused_at_the_ep() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let escape = ustar(&[("bin/", b'5', b"", ""), ("../../../../../../tmp/htfaas-escaped", b'0', b"owned", "")]);
    let through = ustar(&[("etc", b'2', b"", "/tmp"), ("etc/htfaas-through", b'0', b"owned", "")]);
    for (name, tar, why) in [("escape", escape, ".."), ("through", through, "etc")] {
        let file = dir.path().join(format!("{name}.tar"));
        std::fs::write(&file, tar).expect("write");
        let digest = client.push_image(&file, None).await.expect("the gateway stores any tar; EPs check entries");
        let job = fire(&client, &digest, name, "true", Resources::new(1, 64, 30), |_| {}).await;
        assert_eq!(job.state, JobState::Failed, "{job:#?}");
        assert!(job.reason.contains("image") && job.reason.contains(why), "{name}: {}", job.reason);
    }
    assert!(!Path::new("/tmp/htfaas-escaped").exists() && !Path::new("/tmp/htfaas-through").exists());

    // The stored bytes changed under the digest: the EP refuses them.
    let tar = busybox_image(dir.path());
    let digest = client.push_image(&tar, None).await.expect("push");
    let stored = walk(dir.path()).into_iter().find(|p| p.ends_with(format!("{}.tar", digest.hex()))).expect("stored");
    let mut bytes = std::fs::read(&stored).expect("read");
    bytes.extend_from_slice(&[0u8; 512]);
    std::fs::write(&stored, bytes).expect("tamper");
    let job = fire(&client, &digest, "tampered", "true", Resources::new(1, 64, 30), |_| {}).await;
    assert_eq!(job.state, JobState::Failed, "{job:#?}");
    assert!(job.reason.contains("not to the job's"), "{}", job.reason);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

/// A native job and an EP that offers wasm only: the job waits, never sent there, and
/// `jobs analyze` says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_job_never_goes_to_an_ep_without_native() {
    let (dir, stack) = start_stack_with(|o| {
        o.ep_settings.insert("native".into(), serde_json::json!({ "enabled": false }));
    })
    .await;
    let client = stack.client().expect("client");
    let digest = client.push_image(&busybox_image(dir.path()), None).await.expect("push");
    let m = busybox_function(digest, "stranded", "/data/stranded", "/data/stranded-out/", "true");
    client.register(&m).await.expect("register");
    client.put_bytes(b"x".to_vec(), "/data/stranded/x").await.expect("put");
    let job = wait_for("the job", LIMIT, || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.event.path == "/data/stranded/x")
    })
    .await;
    let analysis = wait_for("the analysis naming the runtime", LIMIT, || async {
        let a = client.job_analyze(&job.id).await.ok()?;
        a.eps.iter().any(|e| e.refusal.as_deref().is_some_and(|r| r.contains("no native runtime"))).then_some(a)
    })
    .await;
    assert_eq!(analysis.state, JobState::Idle, "{analysis:#?}");
    let job = client.job(&job.id).await.expect("job");
    assert_eq!(job.state, JobState::Idle, "never sent to the wasm-only EP: {job:#?}");
}

/// The attack: one owner's function hopes to be served by another's warm worker (same image,
/// same command, same environment) and so read what the other's runs left in `/tmp`. Each
/// function gets a worker of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_is_never_shared_between_functions_of_two_owners() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let image = client.push_image(&busybox_image(dir.path()), None).await.expect("push");
    let owner = stack.info().user.clone();
    client.register(&handler_function(image.clone(), "alices", &owner, "same")).await.expect("register");
    for right in [Right::Read, Right::Write] {
        for dir in ["/data/mallorys/", "/data/mallorys-out/"] {
            client.grant("mallory", right, dir).await.expect("grant");
        }
    }
    client.register(&handler_function(image.clone(), "mallorys", "mallory", "same")).await.expect("register");
    let (alice_pid, _, _) = who(&client, "alices", "a.dat").await;
    let (alice_pid2, run, _) = who(&client, "alices", "b.dat").await;
    assert_eq!((alice_pid2, run), (alice_pid.clone(), 2), "alice's worker is warm");
    let (mallory_pid, mallory_run, _) = who(&client, "mallorys", "a.dat").await;
    assert_ne!(mallory_pid, alice_pid, "mallory's function got a worker of its own");
    assert_eq!(mallory_run, 1);
}
