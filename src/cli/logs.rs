//! The local stack's logs: `htfaas up` writes each component's log lines to a file of its own
//! under `<dir>/logs/` (storage, scheduler, gateway, ep; everything else of the process in
//! `stack.log`; nats-server's own in `<dir>/nats/nats-server.log`), so its terminal shows only
//! what started, where, `ready` and the demo's result; `htfaas logs [COMPONENT] [-f]` shows
//! them; `htfaas up -v` prints them to the terminal instead. Must not know: the components.

use super::args::DirArg;
use anyhow::{Context as _, bail};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Each component's log, and the module-path prefix of its lines.
const COMPONENTS: [(&str, &str); 4] = [
    ("storage", "htfaas_storage"),
    ("scheduler", "htfaas_scheduler"),
    ("gateway", "htfaas_gateway"),
    ("ep", "htfaas_ep"),
];
/// Every log `htfaas logs` knows, in the order it shows them.
const NAMES: [&str; 6] = ["storage", "scheduler", "gateway", "ep", "nats", "stack"];

/// The default filter of every log.
pub fn env_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,async_nats=warn,wasmtime=warn,cranelift=warn"))
}

/// Log lines to stderr (every command but a quiet `htfaas up`).
pub fn init_stderr() {
    tracing_subscriber::fmt()
        .with_env_filter(env_filter())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Where `name`'s log is kept in the stack directory `dir`.
pub fn log_path(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    match name {
        "nats" => Ok(dir.join("nats/nats-server.log")),
        n if NAMES.contains(&n) => Ok(dir.join("logs").join(format!("{n}.log"))),
        n => bail!("no log {n:?}: one of {}", NAMES.join(", ")),
    }
}

/// Log lines to one file per component under `<dir>/logs/` (appended; the directory 0700).
pub fn init_files(dir: &Path) -> anyhow::Result<()> {
    let logs = dir.join("logs");
    htfaas_functions::store::create_private_dir(&logs).with_context(|| format!("create {}", logs.display()))?;
    let open = |name: &str| -> anyhow::Result<std::sync::Mutex<std::fs::File>> {
        let path = log_path(dir, name)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        Ok(std::sync::Mutex::new(file))
    };
    type Boxed = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;
    let mut layers: Vec<Boxed> = Vec::new();
    for (name, prefix) in COMPONENTS {
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(open(name)?)
            .with_filter(tracing_subscriber::filter::filter_fn(move |m| m.target().starts_with(prefix)));
        layers.push(Box::new(layer));
    }
    let rest = tracing_subscriber::fmt::layer().with_ansi(false).with_writer(open("stack")?).with_filter(
        tracing_subscriber::filter::filter_fn(|m| !COMPONENTS.iter().any(|(_, p)| m.target().starts_with(p))),
    );
    layers.push(Box::new(rest));
    tracing_subscriber::registry().with(layers).with(env_filter()).try_init().context("set up the logs")?;
    Ok(())
}

/// The arguments of `htfaas logs`.
#[derive(clap::Args)]
pub struct LogsArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// One log: storage, scheduler, gateway, ep, nats or stack (default: all, one after another).
    pub component: Option<String>,
    /// Keep printing what is appended (Ctrl-C ends).
    #[arg(short, long)]
    pub follow: bool,
}

/// `htfaas logs [COMPONENT] [-f]`.
pub async fn run(args: LogsArgs) -> anyhow::Result<()> {
    let names: Vec<&str> = match &args.component {
        Some(c) => {
            log_path(&args.dir.dir, c)?;
            vec![c.as_str()]
        }
        None => NAMES.to_vec(),
    };
    let mut out = std::io::stdout().lock();
    let mut offsets = Vec::new();
    for name in &names {
        let path = log_path(&args.dir.dir, name)?;
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && args.component.is_none() => {
                offsets.push((*name, path, 0));
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("open {} (has `htfaas up` run here?)", path.display())),
        };
        if names.len() > 1 {
            writeln!(out, "==> {name} ({}) <==", path.display())?;
        }
        let n = std::io::copy(&mut file, &mut out)?;
        offsets.push((*name, path, n));
    }
    if !args.follow {
        return Ok(());
    }
    drop(out);
    loop {
        for (name, path, offset) in offsets.iter_mut() {
            let Ok(mut file) = std::fs::File::open(&*path) else { continue };
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            // A log made anew (a fresh stack directory) is read from its start.
            if len < *offset {
                *offset = 0;
            }
            if len == *offset {
                continue;
            }
            file.seek(std::io::SeekFrom::Start(*offset))?;
            let mut new = Vec::new();
            file.read_to_end(&mut new)?;
            *offset += new.len() as u64;
            let mut out = std::io::stdout().lock();
            if names.len() > 1 {
                for line in String::from_utf8_lossy(&new).lines() {
                    writeln!(out, "{name}: {line}")?;
                }
            } else {
                out.write_all(&new)?;
            }
            out.flush()?;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
