//! `htfaas bench`'s native guests, measured on this host (root, bubblewrap, cgroups):
//!
//! - **sandbox start**: `/bin/true` in a busybox image through the EP's whole native runner
//!   (control group made and removed, bubblewrap, seccomp), against a plain spawn of it;
//! - **event → output of a Python + numpy function** on the stack (in process): the first event
//!   (cold: the EP fetches, checks and unpacks the image) and the next ones (warm: the image is
//!   there; Python and numpy start per run), and the same function in the handler form (the
//!   first event starts its worker, the next are served warm), against the same code as a
//!   Parsl HTEX task (whose workers keep numpy imported) in the same run;
//! - **a compute-bound numpy loop** in the sandbox (1 core) against the same interpreter and
//!   library run with `chroot` outside it (one BLAS thread each), by its CPU time (the ratio) and
//!   its wall time (which also counts the neighbours of this VM);
//! - **a 2-core job's speed-up**: two busy processes given 1 core, then 2.
//!
//! Must not know: the CLI.

use super::Figure;
use crate::client::Client;
use anyhow::{Context as _, bail};
use htfaas_ep::native::{self, NativeRun, cgroup};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the native bench needs.
#[derive(Debug, Clone)]
pub struct NativeOptions {
    /// The numpy base image (`scripts/test.sh` builds it into `.tools/images/`).
    pub numpy_image: PathBuf,
    /// Warm events (and Parsl tasks).
    pub events: usize,
    /// The workspace root (`bench/peer/`).
    pub root: PathBuf,
    /// nats-server binary.
    pub nats_binary: Option<PathBuf>,
    /// Run the peer.
    pub peer: bool,
}

/// The Python function of the numpy figures: statistics of a float32 file.
pub const NUMPY_APP: &str = r#"import json, os, sys
import numpy as np

path = sys.argv[1]
a = np.fromfile(path, dtype="<f4")
out = {"n": int(a.size), "mean": float(a.astype(np.float64).mean()), "std": float(a.std())}
with open(os.path.join("/output", os.path.basename(path) + ".json"), "w") as f:
    json.dump(out, f)
"#;

/// The same function in the handler form: one process, numpy imported once, serving request
/// after request (stdin in, descriptor 3 out).
pub const NUMPY_HANDLER_APP: &str = r#"import json, os, sys
import numpy as np

answers = os.fdopen(3, "w", buffering=1)
for line in sys.stdin:
    req = json.loads(line)
    path = req["input"]
    a = np.fromfile(path, dtype="<f4")
    out = {"n": int(a.size), "mean": float(a.astype(np.float64).mean()), "std": float(a.std())}
    with open(os.path.join(req["output"], os.path.basename(path) + ".json"), "w") as f:
        json.dump(out, f)
    answers.write('{"exit_code": 0}\n')
"#;

/// Every native figure, emitted as measured.
pub async fn run(opts: &NativeOptions, emit: &mut dyn FnMut(Figure)) -> anyhow::Result<()> {
    let work = tempfile::tempdir().context("a temporary directory")?;
    let backend = cgroup::Backend::detect(Path::new(cgroup::CGROUP_ROOT))
        .context("control groups (the native bench runs as root on a host with cgroups)")?;
    native::make_stage(Path::new(native::STAGE)).context("the sandbox's stage (root)")?;
    let busybox = busybox_root(work.path())?;
    sandbox_start(&backend, &busybox, work.path(), emit).await?;
    two_cores(&backend, &busybox, work.path(), emit).await?;
    let numpy_root = unpack(&opts.numpy_image, work.path()).await?;
    compute(&backend, &numpy_root, work.path(), emit).await?;
    numpy_events(opts, work.path(), emit).await?;
    if opts.peer {
        let (root, n) = (opts.root.clone(), opts.events);
        let got = tokio::task::spawn_blocking(move || {
            let mut got = Vec::new();
            super::peer::run_numpy(&root, n, &mut |f| got.push(f)).map(|_| got)
        })
        .await
        .map_err(|e| anyhow::anyhow!("the peer's task: {e}"))??;
        for f in got {
            emit(f);
        }
    }
    Ok(())
}

/// A static busybox root with the sandbox's mount points.
fn busybox_root(dir: &Path) -> anyhow::Result<PathBuf> {
    let root = dir.join("busybox");
    for d in ["bin", "input", "output", "tmp", "proc", "dev"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    std::fs::copy("/usr/bin/busybox", root.join("bin/busybox")).context("/usr/bin/busybox (busybox-static)")?;
    for applet in ["sh", "true"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet))?;
    }
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))?;
    Ok(root)
}

/// One native run of `argv` in `root` with `cpus` cores; the run and its stdout.
async fn native_run(
    backend: &cgroup::Backend,
    root: &Path,
    work: &Path,
    argv: &[&str],
    env: &[(&str, &str)],
    cpus: u32,
) -> anyhow::Result<native::Ran> {
    let (input, output) = (work.join("in"), work.join("out"));
    for d in [&input, &output] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d)?;
    }
    std::os::unix::fs::chown(&output, Some(UID), Some(UID))?;
    let argv: Vec<String> = argv.iter().map(|s| (*s).to_owned()).collect();
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let run = NativeRun {
        root,
        input_dir: &input,
        output_dir: &output,
        checkpoint_dir: None,
        argv: &argv,
        env: &env,
        uid: UID,
        tmp_bytes: 64 << 20,
        limits: cgroup::Limits { memory_bytes: 1 << 30, pids: 64, cpus },
        run_time: Duration::from_secs(300),
        vacate: Duration::ZERO,
        devices: &[],
    };
    let name = format!("bench-{}-{}", std::process::id(), rand::random::<u32>());
    let ran = native::run(
        Path::new(native::BWRAP),
        backend,
        Path::new(native::STAGE),
        &name,
        &run,
        std::future::pending::<native::Stop>(),
    )
    .await?;
    if ran.end != native::End::Exited(0) {
        bail!("{argv:?} ended {:?}: {}", ran.end, String::from_utf8_lossy(&ran.stderr));
    }
    Ok(ran)
}

/// The uid the bench's sandboxes run as.
const UID: u32 = 899_999;

async fn sandbox_start(
    backend: &cgroup::Backend,
    busybox: &Path,
    work: &Path,
    emit: &mut dyn FnMut(Figure),
) -> anyhow::Result<()> {
    const N: usize = 30;
    let mut sandboxed = Vec::with_capacity(N);
    let mut plain = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        native_run(backend, busybox, work, &["/bin/true"], &[], 1).await?;
        sandboxed.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let status = tokio::process::Command::new(busybox.join("bin/busybox")).arg("true").status().await?;
        plain.push(t.elapsed().as_secs_f64() * 1e3);
        if !status.success() {
            bail!("busybox true failed");
        }
    }
    let p50 = crate::traffic::percentile(&mut sandboxed, 0.5);
    let p90 = crate::traffic::percentile(&mut sandboxed, 0.9);
    let direct = crate::traffic::percentile(&mut plain, 0.5);
    emit(
        Figure::new("htfaas", "native.sandbox_start_p50", p50, "ms", N as u64)
            .with("p90", p90)
            .with("spawn_p50_ms", direct),
    );
    Ok(())
}

async fn two_cores(
    backend: &cgroup::Backend,
    busybox: &Path,
    work: &Path,
    emit: &mut dyn FnMut(Figure),
) -> anyhow::Result<()> {
    let script = "w() { i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; }; w & w & wait";
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        for (cpus, into) in [(1, &mut one), (2, &mut two)] {
            let ran = native_run(backend, busybox, work, &["/bin/sh", "-c", script], &[], cpus).await?;
            into.push((ran.wall_ms, ran.usage.cpu_ms));
        }
    }
    let best = |v: &[(u64, u64)]| v.iter().copied().min_by_key(|(w, _)| *w).unwrap_or((0, 0));
    let ((w1, c1), (w2, c2)) = (best(&one), best(&two));
    let speedup = if w2 > 0 { w1 as f64 / w2 as f64 } else { 0.0 };
    emit(
        Figure::new("htfaas", "native.two_core_speedup", (speedup * 1000.0).round() / 1000.0, "ratio", 3)
            .with("wall_ms_1core", w1)
            .with("cpu_ms_1core", c1)
            .with("wall_ms_2cores", w2)
            .with("cpu_ms_2cores", c2),
    );
    Ok(())
}

/// The image at `tar` unpacked by the EP's own cache into `work/images`.
async fn unpack(tar: &Path, work: &Path) -> anyhow::Result<PathBuf> {
    let (tar, dir) = (tar.to_owned(), work.join("images"));
    let root = tokio::task::spawn_blocking(move || -> anyhow::Result<PathBuf> {
        let (digest, _) = crate::devkit::digest_of_file(&tar)?;
        let cache = htfaas_ep::native::image::ImageCache::open(dir, u64::MAX, Vec::new())?;
        let root = cache.unpack(&digest, &tar)?;
        Ok(root.path().to_owned())
    })
    .await??;
    Ok(root)
}

async fn compute(
    backend: &cgroup::Backend,
    root: &Path,
    work: &Path,
    emit: &mut dyn FnMut(Figure),
) -> anyhow::Result<()> {
    // CPU time of the loop (what the sandbox could cost: the filter, the namespaces) and its
    // wall time (which also counts this VM's neighbours and the cpu quota's throttling).
    let code = "import time, numpy as np\n\
                a = np.random.default_rng(1).random((300, 300))\n\
                t, c = time.perf_counter(), time.process_time()\n\
                for _ in range(200): a = (a @ a) / 300.0\n\
                print(time.process_time() - c, time.perf_counter() - t)";
    let env = [("OPENBLAS_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")];
    let seconds = |out: &[u8]| -> anyhow::Result<(f64, f64)> {
        let text = String::from_utf8_lossy(out);
        let mut it = text.split_whitespace().map(str::parse::<f64>);
        match (it.next(), it.next()) {
            (Some(Ok(cpu)), Some(Ok(wall))) => Ok((cpu, wall)),
            _ => bail!("the loop printed {text:?}"),
        }
    };
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let ran = native_run(backend, root, work, &["/usr/bin/python3", "-c", code], &env, 1).await?;
        inside.push(seconds(&ran.stdout)?);
        let out = tokio::process::Command::new("/usr/sbin/chroot")
            .arg(root)
            .args(["/usr/bin/python3", "-c", code])
            .env_clear()
            .envs(env)
            .output()
            .await?;
        if !out.status.success() {
            bail!("chroot python3: {}", String::from_utf8_lossy(&out.stderr));
        }
        outside.push(seconds(&out.stdout)?);
    }
    let best = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| v.iter().map(f).fold(f64::INFINITY, f64::min);
    let (ic, iw, oc, ow) =
        (best(&inside, |x| x.0), best(&inside, |x| x.1), best(&outside, |x| x.0), best(&outside, |x| x.1));
    emit(Figure::new("htfaas", "native.numpy_compute_in_sandbox_s", ic, "s", 5).with("wall_s", iw));
    emit(Figure::new("htfaas", "native.numpy_compute_outside_s", oc, "s", 5).with("wall_s", ow));
    let ratio = (ic / oc * 1000.0).round() / 1000.0;
    let wall = (iw / ow * 1000.0).round() / 1000.0;
    let f = Figure::new("ratio", "native.numpy_compute_sandbox_vs_outside", ratio, "ratio", 5).with("wall_ratio", wall);
    emit(super::judged(f, 1.05, true));
    Ok(())
}

async fn numpy_events(opts: &NativeOptions, work: &Path, emit: &mut dyn FnMut(Figure)) -> anyhow::Result<()> {
    let dir = work.join("stack");
    let mut so = crate::stack::StackOptions::new(&dir);
    so.nats_binary = opts.nats_binary.clone();
    let stack = crate::stack::Stack::start(so).await?;
    let result = async {
        let client = stack.client()?;
        let app = work.join("app");
        std::fs::create_dir_all(&app)?;
        std::fs::write(app.join("stats.py"), NUMPY_APP)?;
        std::fs::write(app.join("stats_handler.py"), NUMPY_HANDLER_APP)?;
        let spec = crate::devkit::ImageSpec {
            suite: String::new(),
            packages: Vec::new(),
            add: vec![(app, "/opt/app".into())],
            mirror: None,
            from: Some(opts.numpy_image.clone()),
        };
        let out = work.join("stats.tar");
        let built =
            tokio::task::spawn_blocking(move || crate::devkit::build_image(&spec, &out, Path::new("mmdebstrap")))
                .await??;
        let digest = client.push_image(&built.file, None).await?;
        let mut m = crate::stack::demo_manifest(digest);
        m.name = "stats".into();
        m.runtime = htfaas_functions::manifest::RuntimeKind::Native;
        m.command = vec!["python3".into(), "/opt/app/stats.py".into()];
        m.trigger.path = "/data/np/**".into();
        m.outputs.dir = "/data/np-out/".into();
        m.resources = htfaas_functions::Resources::new(1, 1024, 60);
        client.register(&m).await?;
        let mut h = m.clone();
        h.name = "stats-handler".into();
        h.command = vec!["python3".into(), "/opt/app/stats_handler.py".into()];
        h.handler = true;
        h.trigger.path = "/data/nph/**".into();
        h.outputs.dir = "/data/nph-out/".into();
        client.register(&h).await?;
        let data: Vec<u8> = (0..(1 << 18)).flat_map(|i: u32| (i as f32).to_le_bytes()).collect();
        let cold = event_to_output(&client, "np", &data, 0).await?;
        emit(Figure::new("htfaas", "native.numpy_event_to_output_cold", cold, "ms", 1).with("image_bytes", built.size));
        let mut warm = Vec::with_capacity(opts.events);
        for i in 1..=opts.events {
            warm.push(event_to_output(&client, "np", &data, i).await?);
        }
        let n = warm.len() as u64;
        let p50 = crate::traffic::percentile(&mut warm, 0.5);
        let p99 = crate::traffic::percentile(&mut warm, 0.99);
        let figure = Figure::new("htfaas", "native.numpy_event_to_output_p50", p50, "ms", n).with("p99", p99);
        emit(with_job_medians(&client, "/data/np/", figure).await?);
        // The handler form: the first event starts the worker (the image is unpacked by now).
        let first = event_to_output(&client, "nph", &data, 0).await?;
        emit(Figure::new("htfaas", "native.numpy_handler_event_to_output_first", first, "ms", 1));
        let mut warm = Vec::with_capacity(opts.events);
        for i in 1..=opts.events {
            warm.push(event_to_output(&client, "nph", &data, i).await?);
        }
        let p50 = crate::traffic::percentile(&mut warm, 0.5);
        let p99 = crate::traffic::percentile(&mut warm, 0.99);
        let figure = Figure::new("htfaas", "native.numpy_handler_event_to_output_p50", p50, "ms", n).with("p99", p99);
        emit(with_job_medians(&client, "/data/nph/", figure).await?);
        anyhow::Ok(())
    }
    .await;
    let stopped = stack.stop().await;
    result?;
    stopped
}

/// `figure` with the medians, over the jobs on files under `prefix`, of what the EP measured of
/// each: the run's CPU time (its control group's) and the job's phases, ms.
async fn with_job_medians(client: &Client, prefix: &str, figure: Figure) -> anyhow::Result<Figure> {
    let jobs = client.jobs().await?;
    let usages: Vec<_> = jobs.iter().filter(|j| j.event.path.starts_with(prefix)).filter_map(|j| j.usage).collect();
    let median = |f: &dyn Fn(&htfaas_functions::proto::Usage) -> u64| {
        let mut v: Vec<f64> = usages.iter().map(|u| f(u) as f64).collect();
        crate::traffic::percentile(&mut v, 0.5)
    };
    Ok(figure
        .with("job_cpu_ms_p50", median(&|u| u.cpu_ms))
        .with("job_wall_ms_p50", median(&|u| u.wall_ms))
        .with("job_input_ms_p50", median(&|u| u.phases.input_ms))
        .with("job_run_ms_p50", median(&|u| u.phases.run_ms))
        .with("job_output_ms_p50", median(&|u| u.phases.output_ms)))
}

/// Uploads `data` as event `i` under `/data/<dir>/` and waits for its output: ms.
async fn event_to_output(client: &Client, dir: &str, data: &[u8], i: usize) -> anyhow::Result<f64> {
    let (path, out) = (format!("/data/{dir}/e{i}.f32"), format!("/data/{dir}-out/e{i}.f32.json"));
    let t = Instant::now();
    client.put_bytes(data.to_vec(), &path).await?;
    loop {
        if client.get_bytes(&out).await?.is_some() {
            return Ok(t.elapsed().as_secs_f64() * 1e3);
        }
        if t.elapsed() > Duration::from_secs(120) {
            bail!("no output for {path} in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
