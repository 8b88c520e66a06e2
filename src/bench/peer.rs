//! The peer of `htfaas bench`: Parsl's HighThroughputExecutor, installed from PyPI into
//! `.tools/venv-parsl` by `bench/peer/install.sh` and driven by `bench/peer/parsl_bench.py`
//! (see `bench/peer/README.md`), on the same machine with the same number of workers, after
//! the htfaas stack has stopped so that neither competes with the other.

use super::Figure;
use anyhow::{Context as _, bail};
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// The peer's numpy figures ([`super::native`]): the same function as a Parsl task, `n` warm
/// samples.
pub fn run_numpy(root: &Path, n: usize, emit: &mut dyn FnMut(Figure)) -> anyhow::Result<Vec<Figure>> {
    run_script(root, &["--numpy-only".into(), "--n-latency".into(), n.to_string()], emit)
}

/// Installs the peer (idempotent) and runs it; every JSON line it prints becomes a figure.
/// `n_latency` and `n_throughput` override the script's sample counts.
pub fn run(
    root: &Path,
    workers: u32,
    quick: bool,
    n_latency: Option<usize>,
    n_throughput: Option<usize>,
    emit: &mut dyn FnMut(Figure),
) -> anyhow::Result<Vec<Figure>> {
    let mut args = vec!["--workers".to_owned(), workers.to_string()];
    if quick {
        args.push("--quick".into());
    }
    if let Some(n) = n_latency {
        args.extend(["--n-latency".into(), n.to_string()]);
    }
    if let Some(n) = n_throughput {
        args.extend(["--n-throughput".into(), n.to_string()]);
    }
    run_script(root, &args, emit)
}

/// Installs the peer (idempotent) and runs its script with `args`.
fn run_script(root: &Path, args: &[String], emit: &mut dyn FnMut(Figure)) -> anyhow::Result<Vec<Figure>> {
    let install = root.join("bench/peer/install.sh");
    let out = Command::new("bash")
        .arg(&install)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("run {}", install.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", install.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let python =
        stdout.lines().last().map(str::trim).filter(|l| !l.is_empty()).context("install.sh printed no python")?;
    let script = root.join("bench/peer/parsl_bench.py");
    let mut cmd = Command::new(python);
    cmd.arg(&script).args(args);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("start {python} {}", script.display()))?;
    let stdout = child.stdout.take().context("the peer's stdout")?;
    let mut figures = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("read the peer's output")?;
        match serde_json::from_str::<Figure>(&line) {
            Ok(f) => {
                emit(f.clone());
                figures.push(f);
            }
            Err(_) => eprintln!("parsl: {line}"),
        }
    }
    let status = child.wait().context("wait for the peer")?;
    if !status.success() {
        bail!("the peer's bench failed ({status})");
    }
    Ok(figures)
}
