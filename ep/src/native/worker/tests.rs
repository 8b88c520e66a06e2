//! Handlers against the real kernel (bubblewrap, this host's cgroups, a static busybox image):
//! the contract, the ways a worker breaks it, and the pool's keeping and dropping. They need
//! root and `bwrap`, as the runner's tests.

use super::*;
use crate::native::cgroup::Limits;
use crate::native::handlers::{HandlerOptions, Handlers};
use crate::native::host::{HostOptions, NativeHost};

/// A handler in busybox sh: for each request it logs a line, copies the input to
/// `/output/copy`, lists `/input` into `/output/ls`, writes its pid and run count to
/// `/output/who`, and answers; a request whose args say `boom` exits 3, `hang` sleeps, `junk`
/// answers nonsense, `twice` answers twice, `fail` answers exit code 2, `spin` leaves a busy
/// loop running after it answered.
const HANDLER: &str = r#"n=0
while read -r line; do
  n=$((n+1))
  case "$line" in *boom*) exit 3;; esac
  case "$line" in *hang*) sleep 30;; esac
  case "$line" in *junk*) echo "not json" >&3; continue;; esac
  case "$line" in *twice*) printf '{"exit_code": 0}\n{"exit_code": 0}\n' >&3; continue;; esac
  case "$line" in *spin*) (while :; do :; done) & ;; esac
  echo "run $n: $line"
  cat /input/* > /output/copy
  ls /input > /output/ls
  echo "$$ $n" > /output/who
  case "$line" in *fail*) echo '{"exit_code": 2}' >&3; continue;; esac
  echo '{"exit_code": 0}' >&3
done"#;

struct Fixture {
    dir: tempfile::TempDir,
    root: PathBuf,
    host: NativeHost,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = super::super::busybox_image(dir.path()).expect("bwrap and busybox-static are installed");
    let host = NativeHost::start(HostOptions {
        bwrap: PathBuf::from(super::super::BWRAP),
        cache_dir: dir.path().join("images"),
        cache_bytes: 1 << 30,
        site_images: Vec::new(),
        stage: PathBuf::from(super::super::STAGE),
        uid_base: 62_000,
        uid_count: 64,
        gpus: Vec::new(),
        gpu_shared: Vec::new(),
        handlers_dir: dir.path().join("handlers"),
        handlers: HandlerOptions { idle_for: Duration::from_secs(60), max_idle: 2 },
    })
    .expect("the native runtime starts (the tests run as root)");
    Fixture { dir, root, host }
}

fn start(f: &Fixture) -> Worker {
    let argv = vec!["/bin/sh".to_owned(), "-c".to_owned(), HANDLER.to_owned()];
    let spec = WorkerSpec {
        root: &f.root,
        argv: &argv,
        env: &[],
        tmp_bytes: 1 << 20,
        limits: Limits { memory_bytes: 64 << 20, pids: 32, cpus: 1 },
        devices: &[],
    };
    let uid = f.host.lease_uid().expect("a free uid");
    let id = format!("handler-test-{}-{:08x}", std::process::id(), rand::random::<u32>());
    let h = &f.host;
    Worker::start(&h.bwrap, &h.backend, &h.stage, &id, h.handlers_dir.join(&id), uid, &spec).expect("the worker starts")
}

/// An input file named `name` holding `text`, in a directory of its own.
fn input(f: &Fixture, name: &str, text: &str) -> PathBuf {
    let d = f.dir.path().join(format!("in-{:08x}", rand::random::<u32>()));
    std::fs::create_dir(&d).expect("input dir");
    std::fs::write(d.join(name), text).expect("input");
    d.join(name)
}

async fn serve(w: &mut Worker, input: &Path, args: &[&str], run_time: Duration) -> Served {
    let name = input.file_name().and_then(|n| n.to_str()).expect("a name").to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let req = Request { input, name: &name, args: &args, run_time };
    w.serve(&req, std::future::pending()).await.expect("the input is staged")
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[tokio::test]
async fn one_process_serves_run_after_run_each_seeing_only_its_own_input() {
    let f = fixture();
    let mut w = start(&f);
    let first = serve(&mut w, &input(&f, "a.dat", "alpha"), &["x"], Duration::from_secs(20)).await;
    assert_eq!(first.end, End::Exited(0), "{:?}", String::from_utf8_lossy(&first.stderr));
    assert!(first.healthy);
    let log = String::from_utf8_lossy(&first.stdout);
    assert!(log.contains(r#"run 1: {"args":["x"],"input":"/input/a.dat","output":"/output"}"#), "{log}");
    let out1 = f.dir.path().join("out1");
    std::fs::create_dir(&out1).expect("out1");
    w.take_outputs(&out1).await.expect("outputs moved");
    assert_eq!(read(&out1, "copy"), "alpha");
    let (pid, n) = read(&out1, "who").trim().split_once(' ').map(|(p, n)| (p.to_owned(), n.to_owned())).expect("pid n");
    assert_eq!(n, "1");

    let second = serve(&mut w, &input(&f, "b.dat", "beta"), &[], Duration::from_secs(20)).await;
    assert_eq!(second.end, End::Exited(0));
    assert!(String::from_utf8_lossy(&second.stdout).contains("run 2:"), "the second run's log is its own");
    assert!(!String::from_utf8_lossy(&second.stdout).contains("run 1:"));
    let out2 = f.dir.path().join("out2");
    std::fs::create_dir(&out2).expect("out2");
    w.take_outputs(&out2).await.expect("outputs moved");
    assert_eq!(read(&out2, "who").trim(), format!("{pid} 2"), "the same process served it");
    assert_eq!(read(&out2, "copy"), "beta");
    assert_eq!(read(&out2, "ls").trim(), "b.dat", "/input holds only this run's file");
    assert_eq!(w.served(), 2);
    w.retire().await;
}

#[tokio::test]
async fn a_failing_answer_keeps_the_worker_but_nonsense_an_exit_or_the_run_time_end_it() {
    let f = fixture();
    let mut w = start(&f);
    let failed = serve(&mut w, &input(&f, "a.dat", "a"), &["fail"], Duration::from_secs(20)).await;
    assert_eq!(failed.end, End::Exited(2));
    assert!(failed.healthy, "a run that failed is the run's, not the worker's");

    let junk = serve(&mut w, &input(&f, "a.dat", "a"), &["junk"], Duration::from_secs(20)).await;
    assert!(matches!(&junk.end, End::Broken(why) if why.contains("not {\"exit_code\": N}")), "{:?}", junk.end);
    assert!(!junk.healthy);
    w.retire().await;

    let mut w = start(&f);
    let twice = serve(&mut w, &input(&f, "a.dat", "a"), &["twice"], Duration::from_secs(20)).await;
    assert!(matches!(&twice.end, End::Broken(why) if why.contains("more than one line")), "{:?}", twice.end);
    w.retire().await;

    let mut w = start(&f);
    let boom = serve(&mut w, &input(&f, "a.dat", "a"), &["boom"], Duration::from_secs(20)).await;
    assert_eq!(boom.end, End::Exited(3), "its exit status is the run's");
    assert!(!boom.healthy && !w.is_alive());
    w.retire().await;

    let mut w = start(&f);
    let hang = serve(&mut w, &input(&f, "a.dat", "a"), &["hang"], Duration::from_millis(300)).await;
    assert_eq!(hang.end, End::TimeExceeded);
    assert!(!hang.healthy);
    w.retire().await;
}

#[tokio::test]
async fn the_pool_keeps_a_worker_for_its_key_only_and_drops_older_versions_and_on_retire() {
    let f = fixture();
    let pool = Handlers::new(HandlerOptions { idle_for: Duration::from_secs(60), max_idle: 2 });
    let (none, ticket, stale) = pool.take("k1", "calib", 1);
    assert!(none.is_none() && stale.is_empty());
    let w = start(&f);
    let uid = w.uid();
    assert!(pool.give_back(w, ticket).is_empty());
    assert_eq!(pool.idle(), 1);

    let (other, _, _) = pool.take("k2", "calib", 1);
    assert!(other.is_none(), "another key (another env, image or owner's function) never gets it");
    let (same, busy_ticket, _) = pool.take("k1", "calib", 1);
    let busy = same.expect("the same key gets it back");
    assert_eq!(busy.uid(), uid);

    // While it serves, another run of the key starts a second worker, kept after.
    let (none, ticket, _) = pool.take("k1", "calib", 1);
    assert!(none.is_none(), "a serving worker is not handed out twice");
    assert!(pool.give_back(start(&f), ticket).is_empty());

    // A newer version: the older one's idle worker is dropped, and one of it serving then is
    // not kept.
    let (none, _, stale) = pool.take("k3", "calib", 2);
    assert!(none.is_none());
    assert_eq!(stale.len(), 1, "the idle worker of version 1 goes");
    crate::native::handlers::retire(stale).await;
    assert_eq!(pool.give_back(busy, busy_ticket).len(), 1, "version 1 is not kept once 2 ran");

    let w = start(&f);
    let (_, ticket, _) = pool.take("k3", "calib", 2);
    assert!(pool.give_back(w, ticket).is_empty());
    let retired = pool.retire_all();
    assert_eq!(retired.len(), 1);
    assert_eq!(pool.idle(), 0);
    crate::native::handlers::retire(retired).await;

    // Past idle_for, the sweep takes it out.
    let w = start(&f);
    let (_, ticket, _) = pool.take("k3", "calib", 2);
    assert!(pool.give_back(w, ticket).is_empty());
    assert!(pool.sweep(Instant::now()).is_empty());
    let expired = pool.sweep(Instant::now() + Duration::from_secs(61));
    assert_eq!(expired.len(), 1);
    crate::native::handlers::retire(expired).await;
}

#[tokio::test]
async fn a_retired_worker_leaves_no_process_and_no_directory() {
    let f = fixture();
    let mut w = start(&f);
    let ran = serve(&mut w, &input(&f, "a.dat", "a"), &[], Duration::from_secs(20)).await;
    assert_eq!(ran.end, End::Exited(0));
    let dir = w.output_dir();
    let pids = w.group.as_ref().expect("its group").pids();
    assert!(!pids.is_empty());
    w.retire().await;
    assert!(!dir.exists(), "its directories are removed");
    for pid in pids {
        // Gone, or dead and waiting for tokio's reaper (bwrap, the EP's own child).
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = state.rsplit_once(") ").map(|(_, rest)| rest.chars().next()).unwrap_or_default();
        assert!(matches!(state, None | Some('Z')), "process {pid} is gone, not {state:?}");
    }
}

/// The attack: a handler that answers, then burns CPU while idle (charged to no run). The pool
/// drops it at the next take instead of handing it out.
#[tokio::test]
async fn a_handler_busy_while_idle_is_dropped_not_reused() {
    let f = fixture();
    let pool = Handlers::new(HandlerOptions { idle_for: Duration::from_secs(60), max_idle: 2 });
    let mut w = start(&f);
    let ran = serve(&mut w, &input(&f, "a.dat", "a"), &["spin"], Duration::from_secs(20)).await;
    assert_eq!(ran.end, End::Exited(0));
    let (_, ticket, _) = pool.take("k", "spinner", 1);
    assert!(pool.give_back(w, ticket).is_empty(), "kept at first");
    // Waits for the very effect: the CPU it used since it went idle passes the bound.
    while pool.idle_cpu_ms("k").expect("still kept") <= crate::native::handlers::IDLE_CPU_MS {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (found, _, dropped) = pool.take("k", "spinner", 1);
    assert!(found.is_none(), "a busy idle worker is not handed out");
    assert_eq!(dropped.len(), 1, "it is dropped");
    crate::native::handlers::retire(dropped).await;
}
