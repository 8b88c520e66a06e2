//! A native job's two steps of its own, between the input download and the output upload that
//! every job shares ([`crate::job`]): its image (from the EP's cache, a site directory, or
//! fetched from the job's `module_url`, its bytes checked against the digest the job names,
//! then unpacked entry by entry, [`crate::native::image`]), and its run in the sandbox
//! ([`crate::native::run`]) under a uid lent for the run, its usage read from its control group.
//!
//! The guest contract is the wasm one: argv is the manifest's `command`, then
//! `/input/<name>`, then `args`; the environment is exactly the manifest's `env` and secrets;
//! `/output` is where outputs go; a non-zero exit is a failure. A native guest also gets its
//! cores (cpu quota = `resources.cpus`), `resources.memory_mb` of memory (its `/tmp` counts),
//! and a `/tmp` of `resources.disk_mb` (1 GiB when the job names no disk).
//!
//! Stopped (the job's cancel: a revocation, hold or removal, the EP leaving) or near its run
//! time, a native run gets SIGTERM and then its vacate time ([`vacate_time`] of the function's
//! `vacate_s` and the run time) before its group is killed; an output past its bound kills at
//! once. What it did is in the outcome (the `Cancelled` reason, `TimeExceeded::vacate`) and in
//! the report's log.
//!
//! A **handler** function ([`run_handler`]) is served by a warm worker instead
//! ([`crate::native::worker`] says its contract; [`crate::native::handlers`] keeps them). A
//! stopped handler run is killed at once, worker and all: the SIGTERM would reach the worker,
//! which outlives the run and serves others, not the one request, and its contract (one answer
//! line per request) has no word for "left"; a cancelled run stores nothing anyway.
//!
//! Must not know: the attach protocol, slots.

use crate::native::host::{GpuLease, NativeHost};
use crate::native::image::ImageRoot;
use crate::native::uids::UidLease;
use crate::native::worker::{Request, Worker, WorkerSpec};
use crate::native::{End, NativeRun, Stop, Vacated, cgroup};
use crate::runtime::{CancelSignal, GuestJob, GuestRun, millis};
use crate::scratch::ScratchLimits;
use crate::transfer::{Transfer, download};
use htfaas_functions::manifest::vacate_time;
use htfaas_functions::proto::{FunctionRef, NativeCode, Outcome};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most processes and threads of one native job.
pub(crate) const MAX_PIDS: u64 = 1024;
/// The sandbox's `/tmp` when the job names no disk.
pub(crate) const DEFAULT_TMP_BYTES: u64 = 1 << 30;

/// Fetches `f`'s image from its `module_url` into `work_dir/images`, checks its bytes against
/// `f.digest` and unpacks it into the host's cache. Call with the digest's lock held, after the
/// cache missed. Fails as the job's outcome: [`Outcome::ModuleFailed`] (refused, not the
/// digest, unsafe entries), or [`Outcome::StorageUnavailable`] when the gateway stayed away.
pub(crate) async fn fetch_image(
    host: &Arc<NativeHost>,
    http: &reqwest::Client,
    work_dir: &Path,
    f: &FunctionRef,
    retries: &mut u32,
) -> Result<ImageRoot, Outcome> {
    let failed = |reason: String| Outcome::ModuleFailed { reason };
    let path = work_dir.join("images").join(format!(".tmp-download-{:016x}", rand::random::<u64>()));
    // Content-addressed and public like modules: no credential goes with the request.
    let from = Transfer { http, url: &f.module_url, macaroon: "", traceparent: None };
    let mut n = 0;
    let fetched = download(&from, &path, None, &mut n, retries, None).await;
    let sha256 = match fetched {
        Ok(sha256) => sha256,
        Err(e) => {
            let _ = tokio::fs::remove_file(&path).await;
            return Err(e.outcome(|reason| failed(format!("image: {reason}"))));
        }
    };
    if sha256 != f.digest.hex() {
        let _ = tokio::fs::remove_file(&path).await;
        return Err(failed(format!("image: its bytes hash to sha256:{sha256}, not to the job's {}", f.digest)));
    }
    let (host, digest, tar) = (host.clone(), f.digest.clone(), path.clone());
    let started = Instant::now();
    let unpacked = tokio::task::spawn_blocking(move || host.images.unpack(&digest, &tar)).await;
    let _ = tokio::fs::remove_file(&path).await;
    let root = unpacked.map_err(|e| failed(format!("image unpacking task failed: {e}")))?;
    let root = root.map_err(|e| failed(format!("image {}: {e}", f.digest.short())))?;
    tracing::info!(bytes = n, unpack_ms = millis(started.elapsed()), image = %f.digest.short(), "image unpacked");
    Ok(root)
}

/// Runs `job` natively in `root` as `code` says, in a control group named `group_name`,
/// stopping it when `stop` fires: with its vacate time when the job's `cancel` fired, at once
/// when the scratch watcher did (an output past its bound). Never fails: a sandbox that cannot
/// start is the outcome [`Outcome::ModuleFailed`], no free uid is a full pool
/// ([`GuestRun::no_free_slot`]).
pub(crate) async fn run(
    host: &NativeHost,
    group_name: &str,
    code: &NativeCode,
    root: &ImageRoot,
    job: &GuestJob,
    cancel: &CancelSignal,
    stop: &CancelSignal,
) -> GuestRun {
    let started = Instant::now();
    let ended = |outcome, no_free_slot| unrun(started, outcome, no_free_slot);
    let (uid, gpus) = match leases(host, job.resources.gpus) {
        Ok(leases) => leases,
        Err(why) => return ended(Outcome::ModuleFailed { reason: why }, true),
    };
    if job.checkpoint_dir.is_some() && !root.path().join("checkpoint").is_dir() {
        let reason = "the image has no /checkpoint mount point (unpacked before checkpoints: remove it from the cache)";
        return ended(Outcome::ModuleFailed { reason: reason.into() }, false);
    }
    if let Err(e) = prepare_dirs(&job.input_dir, &job.output_dir, job.checkpoint_dir.as_deref(), uid.uid()).await {
        return ended(Outcome::ModuleFailed { reason: format!("prepare the sandbox's directories: {e}") }, false);
    }
    // The wasm argv's first word is the function's name; a native one's is its command.
    let argv: Vec<String> = code.command.iter().chain(job.argv.iter().skip(1)).cloned().collect();
    let r = job.resources;
    let memory_bytes = r.memory_mb.saturating_mul(1 << 20);
    let devices = gpus.devices();
    let env: Vec<(String, String)> = job.env.iter().cloned().chain(gpus.env()).collect();
    let run = NativeRun {
        root: root.path(),
        input_dir: &job.input_dir,
        output_dir: &job.output_dir,
        checkpoint_dir: job.checkpoint_dir.as_deref(),
        argv: &argv,
        env: &env,
        uid: uid.uid(),
        tmp_bytes: if r.disk_mb > 0 { r.disk_mb.saturating_mul(1 << 20) } else { DEFAULT_TMP_BYTES },
        limits: cgroup::Limits { memory_bytes, pids: MAX_PIDS, cpus: r.cpus.max(1) },
        run_time: Duration::from_secs(r.runtime_s),
        vacate: Duration::from_secs(vacate_time(code.vacate_s, r.runtime_s)),
        devices: &devices,
    };
    let how = async {
        tokio::select! {
            biased;
            () = cancel.cancelled() => Stop::Vacate,
            () = stop.cancelled() => if cancel.is_cancelled() { Stop::Vacate } else { Stop::Kill },
        }
    };
    let ran = match crate::native::run(&host.bwrap, &host.backend, &host.stage, group_name, &run, how).await {
        Ok(ran) => ran,
        Err(e) => return ended(Outcome::ModuleFailed { reason: e.to_string() }, false),
    };
    drop((uid, gpus));
    let outcome = vacated(outcome_of(ran.end, memory_bytes, r.runtime_s, stop), ran.vacate, run.vacate);
    let notes = ran.vacate.map(|v| format!("SIGTERM sent ({} s vacate time): {v}", run.vacate.as_secs()));
    GuestRun {
        outcome,
        stdout: ran.stdout,
        stderr: ran.stderr,
        log_dropped: 0,
        notes: notes.into_iter().collect(),
        wall_ms: ran.wall_ms,
        cpu_ms: ran.usage.cpu_ms,
        peak_memory_bytes: ran.usage.peak_memory_bytes,
        instructions: None,
        no_free_slot: false,
    }
}

/// A run that ended as `outcome` before its command ran, `started` when it was asked for;
/// `no_free_slot` when a pool of the EP was full (not the job's fault).
fn unrun(started: Instant, outcome: Outcome, no_free_slot: bool) -> GuestRun {
    GuestRun { no_free_slot, ..GuestRun::unrun(outcome, millis(started.elapsed())) }
}

/// A uid and `gpus` GPUs lent for one sandbox; `Err` says which the EP has none of now (a
/// full pool: the job waits for a slot, [`GuestRun::no_free_slot`]).
fn leases(host: &NativeHost, gpus: u32) -> Result<(UidLease, GpuLease), String> {
    let uid = host.lease_uid().ok_or("every anonymous uid of the EP's native runtime is in use (native.uid_count)")?;
    let gpus = host.lease_gpus(gpus).ok_or_else(|| format!("fewer than {gpus} of the EP's GPUs are free"))?;
    Ok((uid, gpus))
}

/// The sandbox reads `/input` and writes `/output` as `uid`: the input directory and its file
/// readable by all (they are reached only through the job's private directory, which the
/// sandbox gets by descriptor), the output directory the uid's alone.
async fn prepare_dirs(input: &Path, output: &Path, checkpoint: Option<&Path>, uid: u32) -> std::io::Result<()> {
    let (input, output, checkpoint) = (input.to_owned(), output.to_owned(), checkpoint.map(Path::to_owned));
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&input, std::fs::Permissions::from_mode(0o755))?;
        for entry in std::fs::read_dir(&input)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644))?;
            }
        }
        std::os::unix::fs::chown(&output, Some(uid), Some(uid))?;
        if let Some(dir) = checkpoint {
            give_tree(&dir, uid)?;
        }
        std::fs::set_permissions(&output, std::fs::Permissions::from_mode(0o700))
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Hands the tree `dir` (a restored `/checkpoint`: directories and regular files the EP made,
/// nothing else) to `uid`, never following a link. Blocking.
fn give_tree(dir: &Path, uid: u32) -> std::io::Result<()> {
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        std::os::unix::fs::lchown(&d, Some(uid), Some(uid))?;
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                pending.push(entry.path());
            } else {
                std::os::unix::fs::lchown(entry.path(), Some(uid), Some(uid))?;
            }
        }
    }
    Ok(())
}

/// The outcome of a native run that ended as `end` (`memory_bytes` and `runtime_s` its limits,
/// `stop` its stop signal).
fn outcome_of(end: End, memory_bytes: u64, runtime_s: u64, stop: &CancelSignal) -> Outcome {
    match end {
        End::Exited(code) => Outcome::Exited { exit_code: code },
        End::Signalled(sig) => Outcome::Trapped { message: format!("killed by signal {sig}") },
        End::MemoryExceeded => Outcome::MemoryExceeded { limit_bytes: memory_bytes },
        End::TimeExceeded => Outcome::TimeExceeded { limit_s: runtime_s, vacate: None },
        End::Stopped => stop.outcome(),
        End::Broken(message) => Outcome::Trapped { message },
    }
}

/// `outcome` of a run sent SIGTERM (its vacate time `vacate`) that then did `what`: the words
/// join a `Cancelled` reason and fill `TimeExceeded::vacate`, so whoever reads the job sees
/// whether it left by itself or was killed.
fn vacated(outcome: Outcome, what: Option<Vacated>, vacate: Duration) -> Outcome {
    let Some(what) = what else { return outcome };
    match outcome {
        Outcome::Cancelled { reason } => Outcome::Cancelled { reason: format!("{reason}; {what}") },
        Outcome::TimeExceeded { limit_s, .. } => {
            let before = vacate.as_secs();
            Outcome::TimeExceeded { limit_s, vacate: Some(format!("SIGTERM {before} s before the limit; {what}")) }
        }
        other => other,
    }
}

/// The key a handler of `f` is kept under for `job` ([`crate::native::handlers`]): everything
/// its process was started with or bound to. The function's name names one owner for good
/// (the registry never gives a name to another), so a key is never shared between owners.
fn handler_key(f: &FunctionRef, code: &NativeCode, job: &GuestJob) -> String {
    let r = job.resources;
    let all = serde_json::json!({
        "function": f.name, "version": f.version, "image": f.digest.as_str(), "command": code.command,
        "env": job.env, "cpus": r.cpus, "memory_mb": r.memory_mb, "disk_mb": r.disk_mb,
    });
    htfaas_functions::digest::Digest::of(all.to_string().as_bytes()).hex().to_owned()
}

/// One run of a handler function: `job` is served by a warm worker of its key, or by one
/// started for it ([`crate::native::worker`]), whose `/output` is watched against `limits`
/// (an excess is the outcome [`Outcome::OutputExceeded`]); its outputs are then moved into
/// the job's output directory, and the worker kept for the next run when it answered (and
/// holds no GPU). Never fails, as [`run`].
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_handler(
    host: &NativeHost,
    f: &FunctionRef,
    code: &NativeCode,
    root: &ImageRoot,
    job: &GuestJob,
    limits: ScratchLimits,
    cancel: &CancelSignal,
    stop: &CancelSignal,
) -> GuestRun {
    use crate::native::handlers::retire;
    let started = Instant::now();
    let ended = |outcome, no_free_slot| unrun(started, outcome, no_free_slot);
    // argv is [function, /input/<name>, args…] (crate::job).
    let name = job.argv.get(1).and_then(|p| p.strip_prefix("/input/")).unwrap_or_default();
    let args = job.argv.get(2..).unwrap_or_default();
    let r = job.resources;
    let memory_bytes = r.memory_mb.saturating_mul(1 << 20);
    let key = handler_key(f, code, job);
    let (found, ticket, stale) = host.handlers.take(&key, &f.name, f.version);
    tokio::spawn(retire(stale));
    let mut gpus = None;
    let mut worker = match found {
        Some(worker) => worker,
        None => {
            let (uid, lease) = match leases(host, r.gpus) {
                Ok(leases) => leases,
                Err(why) => return ended(Outcome::ModuleFailed { reason: why }, true),
            };
            let devices = lease.devices();
            let env: Vec<(String, String)> = job.env.iter().cloned().chain(lease.env()).collect();
            let spec = WorkerSpec {
                root: root.path(),
                argv: &code.command,
                env: &env,
                tmp_bytes: if r.disk_mb > 0 { r.disk_mb.saturating_mul(1 << 20) } else { DEFAULT_TMP_BYTES },
                limits: cgroup::Limits { memory_bytes, pids: MAX_PIDS, cpus: r.cpus.max(1) },
                devices: &devices,
            };
            let id = format!("handler-{:016x}", rand::random::<u64>());
            let dir = host.handlers_dir.join(&id);
            match Worker::start(&host.bwrap, &host.backend, &host.stage, &id, dir, uid, &spec) {
                Ok(worker) => {
                    gpus = Some(lease);
                    worker
                }
                Err(e) => return ended(Outcome::ModuleFailed { reason: format!("handler: {e}") }, false),
            }
        }
    };
    let warm = worker.served() > 0;
    let req = Request { input: &job.input_dir.join(name), name, args, run_time: Duration::from_secs(r.runtime_s) };
    let watch = crate::scratch::watch_scratch(limits, worker.output_dir(), None, cancel, stop);
    let served = {
        let serve = worker.serve(&req, stop.cancelled());
        let (mut serve, mut watch) = (std::pin::pin!(serve), std::pin::pin!(watch));
        let mut exceeded = None;
        let served = loop {
            tokio::select! {
                served = &mut serve => break served,
                fired = &mut watch, if exceeded.is_none() => exceeded = Some(fired),
            }
        };
        served.map(|s| (s, exceeded.flatten()))
    };
    let (served, exceeded) = match served {
        Ok(served) => served,
        Err(e) => {
            tokio::spawn(retire(host.handlers.give_back(worker, ticket)));
            return ended(Outcome::ModuleFailed { reason: format!("stage the handler's input: {e}") }, false);
        }
    };
    let mut notes = vec![match warm {
        true => format!("served by a warm handler (its run {})", worker.served()),
        false => "served by a handler started for this run".to_owned(),
    }];
    let mut outcome = match &exceeded {
        Some(reason) => Outcome::OutputExceeded { reason: reason.clone() },
        None => outcome_of(served.end.clone(), memory_bytes, r.runtime_s, stop),
    };
    // A worker holding GPUs is not kept: idle, it would keep them from other jobs.
    let mut keep = served.healthy && r.gpus == 0 && exceeded.is_none();
    if exceeded.is_none()
        && let Err(e) = worker.take_outputs(&job.output_dir).await
    {
        notes.push(format!("moving the handler's outputs failed: {e}"));
        outcome = Outcome::OutputFailed { reason: format!("the handler's outputs: {e}") };
        keep = false;
    }
    let done = if keep { host.handlers.give_back(worker, ticket) } else { vec![worker] };
    tokio::spawn(retire(done));
    drop(gpus);
    GuestRun {
        outcome,
        stdout: served.stdout,
        stderr: served.stderr,
        log_dropped: 0,
        notes,
        wall_ms: served.wall_ms,
        cpu_ms: served.usage.cpu_ms,
        peak_memory_bytes: served.usage.peak_memory_bytes,
        instructions: None,
        no_free_slot: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a native guest did with its SIGTERM joins the outcome an admin reads.
    #[test]
    fn the_outcome_says_what_the_guest_did_with_its_sigterm() {
        let after = Duration::from_secs(2);
        let cancelled = Outcome::Cancelled { reason: "job removed".into() };
        let left = vacated(cancelled.clone(), Some(Vacated::Exited { code: 0, after }), after);
        assert_eq!(left.reason(), "cancelled: job removed; exited with status 0 2.0 s after SIGTERM");
        let killed = vacated(cancelled.clone(), Some(Vacated::Killed { after }), after);
        assert_eq!(
            killed.reason(),
            "cancelled: job removed; ignored SIGTERM for the 2.0 s vacate time; killed with its whole cgroup"
        );
        let time = Outcome::TimeExceeded { limit_s: 60, vacate: None };
        let timed = vacated(time.clone(), Some(Vacated::Exited { code: 3, after: Duration::from_millis(100) }), after);
        assert_eq!(
            timed.reason(),
            "wall-time limit of 60 s exceeded (SIGTERM 2 s before the limit; exited with status 3 0.1 s after SIGTERM)"
        );
        assert_eq!(vacated(cancelled.clone(), None, after), cancelled, "no SIGTERM sent: unchanged");
    }
}
