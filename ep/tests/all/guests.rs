//! An EP survives its guests: a guest sleeping far past its deadline is stopped and
//! gives its pool slot back; a full pool returns the job to the scheduler instead of failing
//! it; open descriptors and compile time are bounded; a job's own, narrower limits hold; and
//! nothing is fetched from, or stored to, an origin the EP does not trust.

use crate::common::{JobDir, component_bytes, digest, guest_bytes, resources};
use crate::fake::{Harness, until};
use htfaas_ep::runtime::{CancelSignal, Guest, ModuleError, Runtime, RuntimeOptions};
use htfaas_functions::proto::{JobAssignment, JobLimits, JobReport, Outcome, SchedulerMsg};
use std::collections::HashMap;
use std::time::Duration;

/// A job of the hostile guest (`module`: `hostile` or `hostile-p2`) with `args`.
fn hostile(h: &Harness, id: &str, module: &str, args: &[&str]) -> JobAssignment {
    let mut job = h.job_of(id, module, "wiki.txt");
    job.args = args.iter().map(|a| a.to_string()).collect();
    job
}

/// Waits for one report per id in `ids`, in any order.
async fn reports(c: &mut crate::fake::Conn, ids: &[String]) -> HashMap<String, JobReport> {
    let mut got = HashMap::new();
    while got.len() < ids.len() {
        let r = c.finished().await;
        assert!(ids.contains(&r.job_id), "unexpected report {r:?}");
        got.insert(r.job_id.clone(), r);
    }
    got
}

/// A regression test: a WASI sleep used to block its thread, which the EP abandoned at
/// the deadline with its pool slot still taken, so after `cpus + 16` such guests every job on
/// the EP failed. Waves of `cpus + 2` guests each sleeping a day under a 1 s cap, more in all
/// than the pool has slots; then a normal job runs on the same EP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_sleeping_far_past_their_deadline_give_their_slots_back() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    let hello = c.hello_welcome().await;
    let cpus = hello.slots.cpus as usize;
    let pool = cpus + 16;
    let wave = cpus + 2;
    let mut sent = 0;
    while sent <= pool {
        let ids: Vec<String> = (sent..sent + wave).map(|i| format!("sleeper-{i}")).collect();
        for id in &ids {
            let mut job = hostile(&h, id, "hostile", &["sleep", "86400"]);
            job.resources.runtime_s = 1;
            c.send(&SchedulerMsg::Assign(job));
        }
        for (id, r) in reports(&mut c, &ids).await {
            assert_eq!(r.outcome, Outcome::TimeExceeded { limit_s: 1, vacate: None }, "{id}: {}", r.log);
            assert!(!r.log.contains("did not stop"), "{id}: its thread was left behind: {}", r.log);
        }
        sent += wave;
    }
    c.send(&SchedulerMsg::Assign(h.job("after", "wiki.txt")));
    let r = c.finished().await;
    assert_eq!((r.job_id.as_str(), &r.outcome), ("after", &Outcome::Exited { exit_code: 0 }), "{}", r.log);
    assert!(!r.outputs.is_empty());
    h.stop().await;
}

/// Loads the hostile guest in `rt`, as a module or a component.
fn hostile_guest(rt: &Runtime, component: bool) -> Guest {
    let bytes = if component { component_bytes("hostile") } else { guest_bytes("hostile") };
    rt.load(&digest(&bytes), &bytes).expect("loads")
}

/// With a pool of one slot: a sleeping guest holds it (a second run finds no free slot, and says
/// so), a cancel stops the sleep, and the slot serves the next run. A component (which takes
/// several core instances, so a bigger pool) is stopped in its sleep the same way.
#[test]
fn a_cancel_stops_a_sleep_and_frees_the_only_slot() {
    for component in [false, true] {
        let max_instances = if component { 64 } else { 1 };
        let rt = Runtime::with_options(RuntimeOptions { max_instances, ..RuntimeOptions::default() }).expect("rt");
        let guest = hostile_guest(&rt, component);
        let sleeping = JobDir::new("in.txt", b"x");
        let job = sleeping.guest_job(&["hostile", "sleep", "86400"], &[], resources(16, 3600));
        let cancel = CancelSignal::new();
        std::thread::scope(|s| {
            let stop = cancel.clone();
            let (rt, guest) = (&rt, &guest);
            let sleeper = s.spawn(move || rt.run_job_with_cancel(guest, &job, &stop));
            // Wait for the very effect: the guest is about to sleep (it holds its slot).
            let marker = sleeping.output.join("sleeping");
            while !marker.exists() {
                if sleeper.is_finished() {
                    panic!("the sleeper ended early: {:?}", sleeper.join().map(|r| (r.outcome, r.notes)));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if !component {
                let other = JobDir::new("in.txt", b"x");
                let run = rt.run_job(guest, &other.guest_job(&["hostile", "ok"], &[], resources(16, 10)));
                assert!(run.no_free_slot, "{:?}", run.outcome);
                let Outcome::ModuleFailed { reason } = &run.outcome else { panic!("{:?}", run.outcome) };
                assert!(reason.starts_with("no free instance slot on this EP"), "{reason}");
            }
            cancel.cancel("stop sleeping");
            let run = sleeper.join().expect("sleeper thread");
            assert_eq!(
                run.outcome,
                Outcome::Cancelled { reason: "stop sleeping".into() },
                "{component}: {:?}",
                run.notes
            );
        });
        let after = JobDir::new("in.txt", b"x");
        let run = rt.run_job(&guest, &after.guest_job(&["hostile", "ok"], &[], resources(16, 10)));
        assert_eq!(run.outcome, Outcome::Exited { exit_code: 0 }, "component {component}: {:?}", run.notes);
        assert!(!run.no_free_slot);
    }
}

/// A job that finds every pool slot taken is returned to the scheduler (a `Cancelled` it did not
/// ask for, which it queues again, nothing charged), not failed; once slots free up, jobs run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_finding_the_pool_full_is_returned_not_failed() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    let hello = c.hello_welcome().await;
    let pool = hello.slots.cpus as usize + 16;
    let ids: Vec<String> = (0..pool).map(|i| format!("holder-{i}")).collect();
    for id in &ids {
        c.send(&SchedulerMsg::Assign(hostile(&h, id, "hostile", &["sleep", "86400"])));
    }
    for id in &ids {
        let marker = h.output_dir(id).join("sleeping");
        until("every slot to be taken by a sleeping guest", || marker.exists()).await;
    }
    c.send(&SchedulerMsg::Assign(h.job("no-room", "wiki.txt")));
    let r = c.finished().await;
    assert_eq!(r.job_id, "no-room");
    let Outcome::Cancelled { reason } = &r.outcome else { panic!("want returned, got {:?}: {}", r.outcome, r.log) };
    assert!(
        reason.starts_with(
            "returned by the EP, not run: no free instance slot on this EP (every slot of its pool is taken"
        ),
        "{reason}"
    );
    assert!(reason.ends_with("; the scheduler runs it again"), "{reason}");
    assert_eq!(r.usage.cpu_ms, 0);
    for id in &ids {
        c.send(&SchedulerMsg::Cancel { job_id: id.clone(), reason: "make room".into(), ends: false });
    }
    for (id, r) in reports(&mut c, &ids).await {
        assert_eq!(r.outcome, Outcome::Cancelled { reason: "make room".into() }, "{id}: {}", r.log);
    }
    c.send(&SchedulerMsg::Assign(h.job("room-again", "wiki.txt")));
    assert_eq!(c.finished().await.outcome, Outcome::Exited { exit_code: 0 });
    h.stop().await;
}

/// A guest opening files without end traps at the EP's limit of open WASI resources, with a
/// reason that says so; a guest under the limit is not bothered. Both guest kinds.
#[test]
fn open_descriptors_are_bounded_per_job() {
    let rt =
        Runtime::with_options(RuntimeOptions { max_open_resources: 64, ..RuntimeOptions::default() }).expect("runtime");
    for component in [false, true] {
        let guest = hostile_guest(&rt, component);
        let dir = JobDir::new("in.txt", b"x");
        let run =
            rt.run_job(&guest, &dir.guest_job(&["hostile", "/input/in.txt", "fds", "100000"], &[], resources(64, 30)));
        let want = "too many open files: the guest held 64 WASI resources at once (open files and directories, \
                    streams, pollables), the EP's limit per job";
        assert_eq!(run.outcome, Outcome::Trapped { message: want.into() }, "component {component}: {:?}", run.notes);
        let run =
            rt.run_job(&guest, &dir.guest_job(&["hostile", "/input/in.txt", "fds", "32"], &[], resources(64, 30)));
        assert_eq!(run.outcome, Outcome::Exited { exit_code: 0 }, "component {component}: {:?}", run.notes);
        assert_eq!(String::from_utf8_lossy(&run.stdout), "32 files open\n");
    }
}

/// A module whose compile passes the limit is refused with a reason naming it, and remembered:
/// a second load is refused without compiling again. (A 1 ms limit: no real module compiles
/// that fast; the example guest takes tens of ms.)
#[test]
fn a_module_compiling_past_the_limit_is_refused_and_not_compiled_again() {
    let rt = Runtime::with_options(RuntimeOptions {
        compile_timeout: Some(Duration::from_millis(1)),
        ..RuntimeOptions::default()
    })
    .expect("runtime");
    let bytes = guest_bytes("checksum");
    let e = rt.load(&digest(&bytes), &bytes).err().expect("refused");
    assert!(matches!(e, ModuleError::CompileTimeout { .. }), "{e:?}");
    assert_eq!(e.to_string(), "compile: took longer than 0.001 s, the EP's compile time limit; module refused");
    let again = rt.load(&digest(&bytes), &bytes).err().expect("refused again");
    assert_eq!(again.to_string(), e.to_string());
    assert_eq!(rt.compiled_count(), 0);
    assert!(rt.cached(&digest(&bytes)).is_none());
}

/// The limits an assignment carries narrow the EP's: fewer output files and bytes, the scratch
/// its `disk_mb` asked for, and a smaller instruction budget where the EP meters.
#[tokio::test]
async fn a_jobs_own_narrower_limits_are_enforced() {
    let mut h = Harness::start_with(|c| c.fuel = Some(1_000_000_000_000)).await;
    let mut c = h.conn().await;
    c.hello_welcome().await;

    let mut files = hostile(&h, "files", "hostile", &["files", "5"]);
    files.limits = JobLimits { max_output_files: Some(2), ..JobLimits::default() };
    let mut bytes = hostile(&h, "bytes", "hostile", &["write", "1"]);
    bytes.limits = JobLimits { max_output_bytes: Some(1000), ..JobLimits::default() };
    let mut disk = hostile(&h, "disk", "hostile-p2", &["write", "4"]);
    disk.resources.disk_mb = 1;
    let mut fuel = hostile(&h, "fuel", "hostile", &["spin"]);
    fuel.limits = JobLimits { instructions: Some(100_000), ..JobLimits::default() };
    let wider = {
        let mut j = hostile(&h, "wider", "hostile", &["files", "3"]);
        j.limits =
            JobLimits { max_output_files: Some(1_000_000), max_output_bytes: Some(u64::MAX), instructions: None };
        j
    };
    let ids: Vec<String> = ["files", "bytes", "disk", "fuel", "wider"].map(String::from).to_vec();
    for job in [files, bytes, disk, fuel, wider] {
        c.send(&SchedulerMsg::Assign(job));
    }
    let got = reports(&mut c, &ids).await;
    let exceeded = |id: &str| match &got[id].outcome {
        Outcome::OutputExceeded { reason } => reason.clone(),
        other => panic!("{id}: want output_exceeded, got {other:?}: {}", got[id].log),
    };
    assert!(exceeded("files").contains("past the output file limit of 2"), "{}", exceeded("files"));
    assert!(exceeded("bytes").contains("more than the output byte limit of 1000"), "{}", exceeded("bytes"));
    assert!(exceeded("disk").ends_with("more than the scratch limit of 1048576 bytes"), "{}", exceeded("disk"));
    assert_eq!(got["fuel"].outcome, Outcome::FuelExhausted { limit: 100_000 }, "{}", got["fuel"].log);
    assert_eq!(got["wider"].outcome, Outcome::Exited { exit_code: 0 }, "{}", got["wider"].log);
    assert_eq!(got["wider"].outputs.len(), 3);
    assert!(h.seen.lock().expect("lock").puts.keys().all(|k| k.starts_with("f0")), "only `wider` stored outputs");
    h.stop().await;
}

/// Job directories are emptied and reused: what a job leaves in its scratch (here outputs it
/// was refused for passing its file limit) never reaches the next job, which is handed the
/// very directory (the EP keeps spares last in, first out).
#[tokio::test]
async fn a_reused_job_directory_holds_nothing_of_the_job_before() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    let mut leaver = hostile(&h, "leaver", "hostile", &["files", "5"]);
    leaver.limits = JobLimits { max_output_files: Some(2), ..JobLimits::default() };
    c.send(&SchedulerMsg::Assign(leaver));
    let got = reports(&mut c, &["leaver".to_owned()]).await;
    assert!(matches!(got["leaver"].outcome, Outcome::OutputExceeded { .. }), "{:?}", got["leaver"].outcome);
    for round in 0..3 {
        let id = format!("next{round}");
        c.send(&SchedulerMsg::Assign(hostile(&h, &id, "hostile", &["files", "1"])));
        let got = reports(&mut c, std::slice::from_ref(&id)).await;
        assert_eq!(got[&id].outcome, Outcome::Exited { exit_code: 0 }, "{}", got[&id].log);
        let paths: Vec<&str> = got[&id].outputs.iter().map(|o| o.path.as_str()).collect();
        assert!(paths.len() == 1 && paths[0].ends_with("/f000000.txt"), "only its own output: {paths:?}");
    }
    h.stop().await;
}

/// URLs outside the EP's origins (by default: the scheduler's host) fail the job before anything
/// is fetched, with a reason naming the URL's origin; a redirect elsewhere fails the transfer.
#[tokio::test]
async fn urls_outside_the_allowed_origins_are_refused_before_any_fetch() {
    let mut h = Harness::start().await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    let module_gets = h.seen.lock().expect("lock").module_gets;

    let mut module = h.job("module", "wiki.txt");
    module.function.module_url = "http://169.254.169.254/latest/meta-data/?authz=SECRET".into();
    let mut input = h.job("input", "wiki.txt");
    input.input.as_mut().expect("an input").url = "http://10.0.0.1:8080/internal/admin".into();
    let mut output = h.job("output", "wiki.txt");
    output.output.url = "https://attacker.example/drop/".into();
    let redirect = h.job_of("redirect", "checksum", "redirect/wiki.txt");
    let ids: Vec<String> = ["module", "input", "output", "redirect"].map(String::from).to_vec();
    for job in [module, input, output, redirect] {
        c.send(&SchedulerMsg::Assign(job));
    }
    let got = reports(&mut c, &ids).await;
    assert_eq!(
        got["module"].outcome,
        Outcome::ModuleFailed {
            reason: "module_url http://169.254.169.254:80 is not among the EP's allowed origins; nothing fetched"
                .into()
        }
    );
    assert_eq!(
        got["input"].outcome,
        Outcome::InputFailed {
            reason: "input url http://10.0.0.1:8080 is not among the EP's allowed origins; nothing fetched".into()
        }
    );
    assert_eq!(
        got["output"].outcome,
        Outcome::OutputFailed {
            reason: "output url https://attacker.example:443 is not among the EP's allowed origins; nothing fetched"
                .into()
        }
    );
    let Outcome::InputFailed { reason } = &got["redirect"].outcome else { panic!("{:?}", got["redirect"]) };
    assert!(reason.contains("redirect to http://127.0.0.2:9, which is not among the EP's allowed origins"), "{reason}");
    for id in ["module", "input", "output"] {
        assert_eq!(got[id].usage.bytes_in, 0, "{id}");
    }
    let (gets, puts) = {
        let seen = h.seen.lock().expect("lock");
        (seen.module_gets, seen.puts.len())
    };
    assert_eq!(gets, module_gets + 1, "only the redirect job fetched its module");
    assert_eq!(puts, 0);
    h.stop().await;
}

/// An explicit `allowed_origins` replaces the default: the fake server's own host is then refused.
#[tokio::test]
async fn an_explicit_origin_list_replaces_the_default() {
    let mut h = Harness::start_with(|c| c.allowed_origins = Some(vec!["https://storage.example".into()])).await;
    let mut c = h.conn().await;
    c.hello_welcome().await;
    c.send(&SchedulerMsg::Assign(h.job("j", "wiki.txt")));
    let r = c.finished().await;
    let Outcome::ModuleFailed { reason } = &r.outcome else { panic!("{:?}", r.outcome) };
    assert!(reason.starts_with("module_url http://127.0.0.1:"), "{reason}");
    assert_eq!(h.seen.lock().expect("lock").module_gets, 0);
    h.stop().await;
}
