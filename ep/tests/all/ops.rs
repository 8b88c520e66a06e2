//! Operating an EP: what it detects and advertises (cores, memory, disk, GPUs, labels) on fake
//! `/proc`, `/sys` and `/dev` trees, how `slots` left open are filled, label checks, and
//! leaving: a drain tells the scheduler first, answers late assignments `Cancelled`, lets the
//! running job finish and report, then exits; a stop cancels without reporting.

use crate::fake::{Harness, until};
use htfaas_ep::Config;
use htfaas_ep::detect::{self, DETECT_DISK_MB, DETECT_GPUS, Detected};
use htfaas_functions::Resources;
use htfaas_functions::proto::{EpMsg, Outcome, SchedulerMsg};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Writes `files` (path relative to `root`, content) into `root`.
fn tree(root: &Path, files: &[(&str, &str)]) {
    for (path, content) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, content).expect("write");
    }
}

const MEMINFO_64G: &str = "MemTotal:       65536000 kB\nMemFree:         1000000 kB\n";

/// A host of 64 GiB and (as the caller says) 16 cores, whose process sits in cgroup
/// `/job.slice/ep` with 2.5 cores and 4 GiB; two NVIDIA GPUs beside their control nodes and a
/// render node.
fn limited_host(root: &Path) {
    tree(
        root,
        &[
            ("proc/meminfo", MEMINFO_64G),
            ("proc/self/cgroup", "0::/job.slice/ep\n"),
            ("sys/fs/cgroup/cpu.max", "max 100000\n"),
            ("sys/fs/cgroup/memory.max", "max\n"),
            ("sys/fs/cgroup/job.slice/cpu.max", "250000 100000\n"),
            ("sys/fs/cgroup/job.slice/ep/memory.max", "4294967296\n"),
            ("dev/nvidia0", ""),
            ("dev/nvidia1", ""),
            ("dev/nvidiactl", ""),
            ("dev/nvidia-uvm", ""),
            ("dev/dri/renderD128", ""),
        ],
    );
}

#[test]
fn cgroup_limits_lower_than_the_host_win_and_nvidia_nodes_count() {
    let root = tempfile::tempdir().expect("tempdir");
    limited_host(root.path());
    let d = detect::detect_in(root.path(), root.path(), Some(16), None);
    assert_eq!(d.cpus, Some(3), "2.5 cores round up");
    assert_eq!(d.memory_mb, Some(4096));
    assert_eq!(d.gpus, 2, "nvidia0 and nvidia1; not nvidiactl, nvidia-uvm or renderD128");
    assert!(d.gpu_models.is_empty());
    assert!(d.disk_free_mb.is_some_and(|mb| mb > 0), "{d:?}");
    // A host smaller than the quota keeps its own count.
    assert_eq!(detect::detect_in(root.path(), root.path(), Some(2), None).cpus, Some(2));
}

#[test]
fn without_limits_the_host_counts_and_no_gpu_is_claimed() {
    let root = tempfile::tempdir().expect("tempdir");
    tree(
        root.path(),
        &[
            ("proc/meminfo", MEMINFO_64G),
            ("proc/self/cgroup", "0::/\n"),
            ("sys/fs/cgroup/cpu.max", "max 100000\n"),
            ("sys/fs/cgroup/memory.max", "max\n"),
            // An AMD or Intel render node is not a GPU claim; nor are NVIDIA's control nodes.
            ("dev/dri/renderD128", ""),
            ("dev/kfd", ""),
            ("dev/nvidiactl", ""),
            ("dev/nvidia-modeset", ""),
        ],
    );
    let d = detect::detect_in(root.path(), root.path(), Some(16), None);
    assert_eq!((d.cpus, d.memory_mb, d.gpus), (Some(16), Some(64000), 0));

    // cgroup v1: unlimited is -1 (cpu) and a huge number (memory).
    let v1 = tempfile::tempdir().expect("tempdir");
    tree(
        v1.path(),
        &[
            ("proc/meminfo", MEMINFO_64G),
            ("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"),
            ("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
        ],
    );
    let d = detect::detect_in(v1.path(), v1.path(), Some(8), None);
    assert_eq!((d.cpus, d.memory_mb), (Some(8), Some(64000)));
    // … and limited: 4 cores, 1 GiB.
    tree(
        v1.path(),
        &[
            ("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "400000\n"),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "1073741824\n"),
        ],
    );
    let d = detect::detect_in(v1.path(), v1.path(), Some(8), None);
    assert_eq!((d.cpus, d.memory_mb), (Some(4), Some(1024)));

    // Nothing readable: unknown, not zero.
    let empty = tempfile::tempdir().expect("tempdir");
    let d = detect::detect_in(empty.path(), empty.path(), None, None);
    assert_eq!((d.cpus, d.memory_mb, d.gpus), (None, None, 0));
}

/// An executable shell script `name` in `dir` with `body`.
fn script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[test]
fn nvidia_smi_names_models_and_is_ignored_when_it_fails_or_hangs() {
    let root = tempfile::tempdir().expect("tempdir");
    limited_host(root.path());
    let smi = script(
        root.path(),
        "nvidia-smi",
        r#"[ "$1 $2" = "--query-gpu=name --format=csv,noheader" ] || exit 9
echo "NVIDIA A100-SXM4-40GB"
echo "NVIDIA A100-SXM4-40GB""#,
    );
    let d = detect::detect_in(root.path(), root.path(), Some(16), Some(&smi));
    assert_eq!(d.gpu_models, ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"]);
    let labels = d.labels();
    assert_eq!(labels.get("gpu.model").map(String::as_str), Some("NVIDIA A100-SXM4-40GB"));
    assert_eq!(labels.get("arch").map(String::as_str), Some(std::env::consts::ARCH));
    assert_eq!(labels.get("os").map(String::as_str), Some(std::env::consts::OS));

    let failing = script(root.path(), "smi-fails", "echo 'NVIDIA-SMI has failed' ; exit 6");
    assert_eq!(detect::gpu_models(&failing, Duration::from_secs(5)), None);
    let hanging = script(root.path(), "smi-hangs", "exec sleep 30");
    let started = Instant::now();
    assert_eq!(detect::gpu_models(&hanging, Duration::from_millis(300)), None);
    assert!(started.elapsed() < Duration::from_secs(3), "waited {:?}", started.elapsed());
    assert_eq!(detect::gpu_models(&root.path().join("absent"), Duration::from_secs(1)), None);
    let d = detect::detect_in(root.path(), root.path(), Some(16), Some(&failing));
    assert!(d.gpu_models.is_empty() && !d.labels().contains_key("gpu.model"));
}

/// A config (as the tests' EP) with `slots` and `labels`, its work dir in `work`.
fn config(work: &Path, slots: Resources, labels: BTreeMap<String, String>) -> Config {
    Config {
        slots,
        labels,
        log_limit_bytes: 1024,
        max_output_files: 1,
        max_output_bytes: 1,
        ..Config::for_test("ep-ops", "http://127.0.0.1:1", "t", work)
    }
}

fn fake_detected() -> Detected {
    Detected {
        cpus: Some(3),
        memory_mb: Some(4096),
        disk_free_mb: Some(100 * 1024),
        gpus: 2,
        gpu_models: vec!["NVIDIA A100-SXM4-40GB".into(); 2],
        arch: "x86_64".into(),
        os: "linux".into(),
    }
}

#[tokio::test]
async fn slots_left_at_zero_are_detected_less_the_reserve_and_given_ones_kept() {
    let work = tempfile::tempdir().expect("tempdir");
    let open = Resources { cpus: 0, memory_mb: 0, runtime_s: 60, gpus: DETECT_GPUS, disk_mb: DETECT_DISK_MB };
    let s = config(work.path(), open, BTreeMap::new()).resolve_with(fake_detected()).await.expect("resolves");
    // Memory: 4096 less max(512, 10 %); disk: 100 GiB less max(1 GiB, 5 %).
    assert_eq!(s.slots, Resources { cpus: 3, memory_mb: 3584, runtime_s: 60, gpus: 2, disk_mb: 97280 });

    let given = Resources { cpus: 16, memory_mb: 1000, runtime_s: 60, gpus: 1, disk_mb: 10 };
    let s = config(work.path(), given, BTreeMap::new()).resolve_with(fake_detected()).await.expect("resolves");
    assert_eq!(s.slots, given);
    // GPUs and disk given as 0 are none: detected GPUs can be kept from jobs.
    let none = Resources { gpus: 0, disk_mb: 0, ..open };
    let s = config(work.path(), none, BTreeMap::new()).resolve_with(fake_detected()).await.expect("resolves");
    assert_eq!((s.slots.cpus, s.slots.gpus, s.slots.disk_mb), (3, 0, 0));

    // Cores or memory asked for but not detectable: the error names the field.
    let unknown = Detected { cpus: None, memory_mb: None, ..fake_detected() };
    let e = config(work.path(), open, BTreeMap::new()).resolve_with(unknown.clone()).await.expect_err("no cpus");
    assert_eq!(format!("{e:#}"), "slots.cpus: cannot detect the cores; set it");
    let cpus_given = Resources { cpus: 1, ..open };
    let e = config(work.path(), cpus_given, BTreeMap::new()).resolve_with(unknown).await.expect_err("no memory");
    assert_eq!(format!("{e:#}"), "slots.memory_mb: cannot detect memory; set it");

    // The real host resolves with everything detected.
    let s = config(work.path(), open, BTreeMap::new()).resolve().await.expect("resolves on this host");
    assert!(s.slots.cpus >= 1 && s.slots.memory_mb >= 1, "{:?}", s.slots);
}

#[test]
fn slots_fields_left_out_of_the_config_file_mean_detect() {
    let parse = |slots: &str| {
        let json = format!(r#"{{"name":"e","scheduler_url":"http://h:1","attach_token":"t","work_dir":"/w"{slots}}}"#);
        serde_json::from_str::<Config>(&json).map(|c| c.slots)
    };
    let detect_all = Resources { cpus: 0, memory_mb: 0, runtime_s: 3600, gpus: DETECT_GPUS, disk_mb: DETECT_DISK_MB };
    assert_eq!(parse("").expect("no slots"), detect_all);
    assert_eq!(parse(r#","slots":{}"#).expect("empty slots"), detect_all);
    assert_eq!(parse(r#","slots":{"cpus":4}"#).expect("cpus only"), Resources { cpus: 4, ..detect_all });
    assert_eq!(
        parse(r#","slots":{"cpus":2,"memory_mb":4096,"runtime_s":60,"gpus":1,"disk_mb":5}"#).expect("all"),
        Resources { cpus: 2, memory_mb: 4096, runtime_s: 60, gpus: 1, disk_mb: 5 }
    );
    assert_eq!(parse(r#","slots":{"gpus":0}"#).expect("no GPUs"), Resources { gpus: 0, ..detect_all });
    assert!(parse(r#","slots":{"cpu":4}"#).is_err(), "a typo in slots is refused");

    // The sample config keeps its cores, memory and run time; disk and GPUs are detected.
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/config/ep.json");
    let c: Config = serde_json::from_slice(&std::fs::read(sample).expect("read ep.json")).expect("parses");
    assert_eq!(
        c.slots,
        Resources { cpus: 2, memory_mb: 4096, runtime_s: 3600, gpus: DETECT_GPUS, disk_mb: DETECT_DISK_MB }
    );
}

#[tokio::test]
async fn labels_are_checked_as_the_scheduler_does_and_detected_ones_fill_in() {
    let work = tempfile::tempdir().expect("tempdir");
    let slots = Resources::new(1, 256, 60);
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let long = "x".repeat(129);
    let cases: Vec<(BTreeMap<String, String>, String)> = vec![
        ((0..33).map(|i| (format!("k{i}"), "v".to_owned())).collect(), "labels: 33 given, at most 32".to_owned()),
        (labels(&[("", "v")]), "labels: a key is empty".to_owned()),
        (labels(&[(long.as_str(), "v")]), format!("labels: key {:?}… is 129 bytes, at most 128", "x".repeat(32))),
        (labels(&[("site\n", "v")]), r#"labels: key "site\n" holds a control character"#.to_owned()),
        (labels(&[("rack", long.as_str())]), r#"labels: "rack": value is 129 bytes, at most 128"#.to_owned()),
        (labels(&[("rack", "a\tb")]), r#"labels: "rack": value holds a control character"#.to_owned()),
    ];
    for (bad, want) in cases {
        let e = config(work.path(), slots, bad).resolve_with(fake_detected()).await.expect_err(&want);
        assert_eq!(format!("{e:#}"), want);
    }

    // Given labels win over detected ones with the same key; the rest are added.
    let s = config(work.path(), slots, labels(&[("site", "desy"), ("arch", "amd64")]))
        .resolve_with(fake_detected())
        .await
        .expect("resolves");
    assert_eq!(
        s.labels,
        labels(&[("arch", "amd64"), ("gpu.model", "NVIDIA A100-SXM4-40GB"), ("os", "linux"), ("site", "desy")])
    );
    // 32 given: nothing added, nothing refused.
    let full: BTreeMap<String, String> = (0..32).map(|i| (format!("k{i:02}"), "v".to_owned())).collect();
    let s = config(work.path(), slots, full.clone()).resolve_with(fake_detected()).await.expect("resolves");
    assert_eq!(s.labels, full);
}

#[tokio::test]
async fn drain_says_draining_first_refuses_late_work_and_exits_after_the_last_report() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    let hello = c.hello_welcome().await;
    assert!(hello.labels.contains_key("arch") && hello.labels.contains_key("os"), "{:?}", hello.labels);
    assert_eq!((hello.slots.gpus, hello.slots.disk_mb), (0, 0), "given as 0: none: {:?}", hello.slots);
    c.send(&SchedulerMsg::Assign(h.job_of("long", "sleep-4s", "wiki.txt")));
    let jobs = h.work.path().join("jobs").join("long");
    until("the job to start", || jobs.exists()).await;

    h.shutdown.cancel();
    assert_eq!(c.recv().await, EpMsg::Draining, "draining comes first");
    // An assignment that crossed the Draining message: answered at once, never run.
    let modules_before = h.seen.lock().expect("lock").module_gets;
    c.send(&SchedulerMsg::Assign(h.job("late", "wiki.txt")));
    let r = c.finished().await;
    assert_eq!(r.job_id, "late");
    assert_eq!(r.outcome, Outcome::Cancelled { reason: "EP draining".into() });
    assert_eq!(h.seen.lock().expect("lock").module_gets, modules_before, "the late job was fetched");
    assert!(!h.ep.is_finished(), "the EP left with a job running");

    // The running job finishes and is reported; then the EP closes and returns.
    let r = c.finished().await;
    assert_eq!((r.job_id.as_str(), &r.outcome), ("long", &Outcome::Exited { exit_code: 0 }), "log: {}", r.log);
    assert!(r.usage.wall_ms >= 4000, "{:?}", r.usage);
    assert_eq!(c.recv_or_closed().await, None, "nothing after the last report");
    h.ended().await.expect("drained cleanly");
}

#[tokio::test]
async fn a_drain_survives_a_reconnect_and_says_draining_on_the_new_session() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(h.job_of("long", "sleep-2s", "wiki.txt")));
    let jobs = h.work.path().join("jobs").join("long");
    until("the job to start", || jobs.exists()).await;
    h.shutdown.cancel();
    assert_eq!(c.recv().await, EpMsg::Draining);
    c.drop_socket();

    let mut c2 = h.conn().await;
    c2.hello_welcome().await;
    assert_eq!(c2.recv().await, EpMsg::Draining, "a new session is told before anything else");
    let r = c2.finished().await;
    assert_eq!((r.job_id.as_str(), &r.outcome), ("long", &Outcome::Exited { exit_code: 0 }), "log: {}", r.log);
    h.ended().await.expect("drained cleanly");
}

#[tokio::test]
async fn a_stop_during_a_drain_cancels_the_running_job_without_reporting_it() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    // A job spinning forever.
    c.send(&SchedulerMsg::Assign(h.job_of("spin", "spin-writer", "wiki.txt")));
    let partial = h.output_dir("spin").join("partial.txt");
    until("the spinning guest to write its output", || partial.exists()).await;
    h.shutdown.cancel();
    assert_eq!(c.recv().await, EpMsg::Draining);
    // A round trip after the drain began: the EP still serves its link, so it has not left.
    c.send(&SchedulerMsg::Assign(h.job("late", "wiki.txt")));
    assert_eq!(c.finished().await.outcome, Outcome::Cancelled { reason: "EP draining".into() });
    assert!(!h.ep.is_finished(), "a drain waits for the spinning job");

    let stopped = Instant::now();
    h.stop_now.cancel();
    // The cancelled job is not reported (the scheduler runs it again once the session closes).
    assert_eq!(c.recv_or_closed().await, None, "the session closes without a report");
    let seen = h.seen.clone();
    h.ended().await.expect("stopped cleanly");
    assert!(stopped.elapsed() < Duration::from_secs(5), "stop took {:?}", stopped.elapsed());
    assert!(seen.lock().expect("lock").puts.is_empty(), "an output was uploaded after the stop");
}

#[tokio::test]
async fn a_stop_alone_also_says_draining_then_closes() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(h.job_of("spin", "spin-writer", "wiki.txt")));
    let partial = h.output_dir("spin").join("partial.txt");
    until("the spinning guest to write its output", || partial.exists()).await;
    h.stop_now.cancel();
    assert_eq!(c.recv().await, EpMsg::Draining);
    assert_eq!(c.recv_or_closed().await, None, "the session closes without a report");
    h.ended().await.expect("stopped cleanly");
}
