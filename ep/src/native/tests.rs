//! The native runner against the real kernel: bubblewrap, this host's cgroups, a static busybox
//! image. They need root (to make control groups) and `bwrap`; the test command installs it.

use super::*;

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    input: PathBuf,
    output: PathBuf,
    backend: cgroup::Backend,
}

const UID: u32 = 61_001;

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = busybox_image(dir.path()).expect("bwrap and busybox-static are installed (scripts/install-deps.sh)");
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::create_dir(&input).expect("input dir");
    std::fs::write(input.join("x.dat"), "hello").expect("input");
    std::fs::create_dir(&output).expect("output dir");
    std::os::unix::fs::chown(&output, Some(UID), Some(UID)).expect("chown: the tests run as root");
    // The temp dir must be traversable by the guest's uid for the binds.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let backend = cgroup::Backend::detect(Path::new(cgroup::CGROUP_ROOT)).expect("a cgroup backend");
    Fixture { _dir: dir, root, input, output, backend }
}

fn limits() -> cgroup::Limits {
    cgroup::Limits { memory_bytes: 64 << 20, pids: 32, cpus: 1 }
}

async fn sh(f: &Fixture, name: &str, script: &str, limits: cgroup::Limits, run_time: Duration) -> Ran {
    sh_with(f, name, script, limits, run_time, &[]).await
}

async fn sh_with(
    f: &Fixture,
    name: &str,
    script: &str,
    limits: cgroup::Limits,
    run_time: Duration,
    devices: &[PathBuf],
) -> Ran {
    sh_stopped(f, name, script, limits, (run_time, Duration::ZERO), devices, std::future::pending()).await
}

/// `script` run under `limits` with (run time, vacate time), stopped when `stop` completes.
async fn sh_stopped(
    f: &Fixture,
    name: &str,
    script: &str,
    limits: cgroup::Limits,
    (run_time, vacate): (Duration, Duration),
    devices: &[PathBuf],
    stop: impl std::future::Future<Output = Stop>,
) -> Ran {
    let argv = vec!["/bin/sh".to_owned(), "-c".to_owned(), script.to_owned()];
    let env = vec![("MODE".to_owned(), "fast".to_owned())];
    let native = NativeRun {
        root: &f.root,
        input_dir: &f.input,
        output_dir: &f.output,
        checkpoint_dir: None,
        argv: &argv,
        env: &env,
        uid: UID,
        tmp_bytes: 1 << 20,
        limits,
        run_time,
        vacate,
        devices,
    };
    // Unique on the host: another test process (or a crashed one's leftover) uses other names.
    let name = format!("{name}-{}-{}", std::process::id(), rand::random::<u32>());
    make_stage(Path::new(STAGE)).expect("the stage (the tests run as root)");
    run(Path::new(BWRAP), &f.backend, Path::new(STAGE), &name, &native, stop).await.expect("the run starts")
}

/// Inside: the job's uid, no network but `lo`, only the manifest's environment, `/input`
/// read-only, `/` read-only, `/output` writable (its files the job's uid on the host).
#[tokio::test]
async fn a_native_guest_is_confined() {
    let f = fixture();
    let script = "id -u; ifconfig -a | grep -c '^[a-z]'; env | sort; cat /input/x.dat; \
                  (echo no > /input/y) 2>/dev/null || echo input-ro; (echo no > /etc-x) 2>/dev/null || echo root-ro; \
                  echo out > /output/o.txt; grep NoNewPrivs /proc/self/status";
    let ran = sh(&f, "confined", script, limits(), Duration::from_secs(20)).await;
    assert_eq!(ran.end, End::Exited(0), "{}", String::from_utf8_lossy(&ran.stderr));
    let out = String::from_utf8_lossy(&ran.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], UID.to_string());
    assert_eq!(lines[1], "1", "only lo: {out}");
    assert!(out.contains("MODE=fast") && !out.contains("HTFAAS"), "{out}");
    assert!(out.contains("hello") && out.contains("input-ro") && out.contains("root-ro"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(f.output.join("o.txt")).expect("the output");
    assert_eq!((meta.uid(), meta.gid()), (UID, UID));
}

/// A job's `/checkpoint` is its own directory, bound writable and read as it was left; a job
/// without one sees only the image's mount point there, empty and read-only.
#[tokio::test]
async fn a_checkpoint_directory_is_bound_writable_and_only_for_a_job_that_has_one() {
    let f = fixture();
    let ckpt = f.output.with_file_name("ckpt");
    std::fs::create_dir(&ckpt).expect("checkpoint dir");
    std::fs::write(ckpt.join("n"), "2\n").expect("a restored count");
    for p in [&ckpt, &ckpt.join("n")] {
        std::os::unix::fs::chown(p, Some(UID), Some(UID)).expect("chown: the tests run as root");
    }
    let script = "cat /checkpoint/n; echo 3 > /checkpoint/n.tmp && mv /checkpoint/n.tmp /checkpoint/n && echo kept";
    let argv = vec!["/bin/sh".to_owned(), "-c".to_owned(), script.to_owned()];
    let native = NativeRun {
        root: &f.root,
        input_dir: &f.input,
        output_dir: &f.output,
        checkpoint_dir: Some(&ckpt),
        argv: &argv,
        env: &[],
        uid: UID,
        tmp_bytes: 1 << 20,
        limits: limits(),
        run_time: Duration::from_secs(20),
        vacate: Duration::ZERO,
        devices: &[],
    };
    let name = format!("ckpt-{}-{}", std::process::id(), rand::random::<u32>());
    make_stage(Path::new(STAGE)).expect("the stage (the tests run as root)");
    let ran = run(Path::new(BWRAP), &f.backend, Path::new(STAGE), &name, &native, std::future::pending())
        .await
        .expect("the run starts");
    assert_eq!(ran.end, End::Exited(0), "{}", String::from_utf8_lossy(&ran.stderr));
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "2\nkept\n");
    assert_eq!(std::fs::read_to_string(ckpt.join("n")).expect("the count kept"), "3\n");

    let script = "ls -A /checkpoint | wc -l; (echo x > /checkpoint/y) 2>/dev/null || echo checkpoint-ro";
    let ran = sh(&f, "no-ckpt", script, limits(), Duration::from_secs(20)).await;
    let out = String::from_utf8_lossy(&ran.stdout);
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["0", "checkpoint-ro"], "{out}");
}

/// The guest and the sandbox's init run under the seccomp filter, with `no_new_privs`; what the
/// filter refuses fails inside with its `EPERM`: a user namespace (which `--disable-userns`
/// alone refuses with `ENOSPC`), another execution domain (which nothing else refuses), the
/// kernel log. No descriptor but the standard three reaches the guest: bwrap closed the
/// program's, and none the test process inherited passes (`ls` lists its own, and the
/// directory it reads, 3).
#[tokio::test]
async fn a_native_guest_runs_under_the_seccomp_filter() {
    let f = fixture();
    let script = "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; grep '^Seccomp:' /proc/1/status; \
                  unshare -U true || echo userns-refused; linux32 true || echo linux32-refused; \
                  dmesg >/dev/null || echo syslog-refused; echo fds $(busybox ls /proc/self/fd)";
    let ran = sh(&f, "seccomp", script, limits(), Duration::from_secs(20)).await;
    let (out, err) = (String::from_utf8_lossy(&ran.stdout), String::from_utf8_lossy(&ran.stderr));
    assert_eq!(ran.end, End::Exited(0), "{out} {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "NoNewPrivs:\t1",
            "Seccomp:\t2",
            "Seccomp:\t2",
            "userns-refused",
            "linux32-refused",
            "syslog-refused",
            "fds 0 1 2 3"
        ],
        "{err}"
    );
    let refusals = err.lines().filter(|l| l.contains("Operation not permitted")).count();
    assert_eq!(refusals, 3, "{err}");
}

/// Past its memory the guest is killed by the kernel: `MemoryExceeded`, and the peak is the
/// limit.
#[tokio::test]
async fn a_guest_past_its_memory_is_memory_exceeded() {
    let f = fixture();
    let script = "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}";
    let ran = sh(&f, "memory", script, limits(), Duration::from_secs(60)).await;
    assert_eq!(ran.end, End::MemoryExceeded, "{ran:?}");
    assert!(ran.usage.peak_memory_bytes <= 64 << 20, "{:?}", ran.usage);
}

/// Past its run time the whole group is killed; a daemon left behind (double fork, new
/// session) is gone once the run is over, whether it ran out of time or exited.
#[tokio::test]
async fn no_process_of_a_guest_outlives_its_run() {
    let f = fixture();
    let ran = sh(&f, "time", "sleep 3001", limits(), Duration::from_millis(500)).await;
    assert_eq!(ran.end, End::TimeExceeded);
    let ran = sh(&f, "daemon", "(setsid sleep 3002 &) ; echo left", limits(), Duration::from_secs(20)).await;
    assert_eq!(ran.end, End::Exited(0));
    let alive: Vec<String> = std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("sleep 3001") || c.contains("sleep 3002"))
        .collect();
    assert!(alive.is_empty(), "{alive:?}");
}

/// A fork bomb meets its pids limit: the guest's shell cannot fork past it and says so, and
/// every process it made is gone with the run.
#[tokio::test]
async fn a_fork_bomb_meets_its_pids_limit() {
    let f = fixture();
    let script = "i=0; while [ $i -lt 100 ]; do sleep 3003 & i=$((i+1)); done; echo all";
    let ran = sh(&f, "forks", script, limits(), Duration::from_secs(20)).await;
    let err = String::from_utf8_lossy(&ran.stderr);
    assert!(matches!(ran.end, End::Exited(c) if c != 0) && err.contains("can't fork"), "{ran:?} {err}");
    assert!(!String::from_utf8_lossy(&ran.stdout).contains("all"));
}

/// A job given one of two GPUs sees exactly that one's device node at its path, and nothing
/// else of the host's `/dev` (stand-in files here: real GPUs are not tested on this machine).
#[tokio::test]
async fn a_guest_sees_only_the_devices_it_was_given() {
    let f = fixture();
    let dev = f.root.parent().expect("the fixture's dir").join("fake-dev");
    std::fs::create_dir_all(&dev).expect("stand-in dir");
    let (gpu0, gpu1) = (dev.join("fakegpu0"), dev.join("fakegpu1"));
    std::fs::write(&gpu0, "gpu0").expect("stand-in 0");
    std::fs::write(&gpu1, "gpu1").expect("stand-in 1");
    let given = [gpu1.clone()];
    let script = format!(
        "cat {} > /output/seen; ls {} > /output/dir 2>&1; ls /dev > /output/dev",
        gpu1.display(),
        dev.display()
    );
    let ran = sh_with(&f, "gpu", &script, limits(), Duration::from_secs(10), &given).await;
    assert_eq!(ran.end, End::Exited(0), "{}", String::from_utf8_lossy(&ran.stderr));
    assert_eq!(std::fs::read_to_string(f.output.join("seen")).expect("seen"), "gpu1");
    let dir = std::fs::read_to_string(f.output.join("dir")).expect("dir");
    assert_eq!(dir.trim(), "fakegpu1", "only the given device, not its sibling: {dir}");
    let devs = std::fs::read_to_string(f.output.join("dev")).expect("dev");
    assert!(!devs.contains("sda") && !devs.contains("nvidia") && !devs.contains("kmsg"), "{devs}");
}

/// A stop once the guest wrote `/output/ready` (it then has its SIGTERM trap in place).
async fn once_ready(f: &Fixture) -> Stop {
    let ready = f.output.join("ready");
    while !ready.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Stop::Vacate
}

/// The processes on this host whose command line holds `marker`.
fn alive(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(marker))
        .collect()
}

/// A stopped guest that traps SIGTERM gets it, leaves by itself within its vacate time (its
/// trap writes a marker and exits 0), and the run says so.
#[tokio::test]
async fn a_stopped_guest_gets_sigterm_and_may_leave_by_itself() {
    let f = fixture();
    let script = "trap 'echo left > /output/left; exit 0' TERM; touch /output/ready; sleep 3010; echo slept";
    let times = (Duration::from_secs(120), Duration::from_secs(60));
    let ran = sh_stopped(&f, "vacate-exit", script, limits(), times, &[], once_ready(&f)).await;
    assert_eq!(ran.end, End::Stopped, "{}", String::from_utf8_lossy(&ran.stderr));
    assert!(matches!(ran.vacate, Some(Vacated::Exited { code: 0, .. })), "{:?}", ran.vacate);
    assert_eq!(std::fs::read_to_string(f.output.join("left")).expect("the trap's marker"), "left\n");
    assert!(!String::from_utf8_lossy(&ran.stdout).contains("slept"));
    assert!(ran.vacate.is_some_and(|v| v.to_string().starts_with("exited with status 0 ")), "{:?}", ran.vacate);
}

/// A stopped guest that ignores SIGTERM is killed with its whole group once its vacate time
/// has passed: the run says so, and no process of it (a detached daemon included) survives.
#[tokio::test]
async fn a_guest_ignoring_sigterm_is_killed_after_its_vacate_time() {
    let f = fixture();
    let script = "trap '' TERM; (setsid sleep 3011 &); touch /output/ready; sleep 3012";
    let vacate = Duration::from_secs(2);
    let ran =
        sh_stopped(&f, "vacate-kill", script, limits(), (Duration::from_secs(120), vacate), &[], once_ready(&f)).await;
    assert_eq!(ran.end, End::Stopped, "{}", String::from_utf8_lossy(&ran.stderr));
    let Some(Vacated::Killed { after }) = ran.vacate else { panic!("killed after its vacate time: {:?}", ran.vacate) };
    assert!(after >= vacate, "not before its vacate time: {after:?}");
    assert!(ran.vacate.is_some_and(|v| v.to_string().contains("killed with its whole cgroup")));
    let left: Vec<String> = ["sleep 3011", "sleep 3012"].iter().flat_map(|m| alive(m)).collect();
    assert_eq!(left, Vec::<String>::new());
}

/// Near its run time a guest gets SIGTERM the vacate time before it (counted inside the run
/// time): it leaves by itself, and the run still ended by its time.
#[tokio::test]
async fn a_guest_gets_sigterm_its_vacate_time_before_its_run_time() {
    let f = fixture();
    let script = "trap 'echo term > /output/left; exit 3' TERM; sleep 3013";
    let times = (Duration::from_secs(60), Duration::from_secs(50));
    let ran = sh_stopped(&f, "vacate-time", script, limits(), times, &[], std::future::pending()).await;
    assert_eq!(ran.end, End::TimeExceeded, "{}", String::from_utf8_lossy(&ran.stderr));
    assert!(matches!(ran.vacate, Some(Vacated::Exited { code: 3, .. })), "{:?}", ran.vacate);
    assert_eq!(std::fs::read_to_string(f.output.join("left")).expect("the trap's marker"), "term\n");
}
