//! `htfaas`: one binary, one subcommand per role.
//!
//! `up` runs the whole local stack; `storage`, `scheduler`, `gateway` and `ep` run one
//! component from a JSON config file; `put`, `get`, `fn`, `jobs`, `accounting` and `events`
//! talk to a stack started with `up` (found through `--dir` or `HTFAAS_DIR`).

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use htfaas::client::{Client, StackInfo};
use htfaas::stack::{Stack, StackOptions};
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::{FunctionManifest, Resources};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "htfaas", version, about = "Event-driven functions on a high-throughput-computing backend")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct DirArg {
    /// State directory of the local stack.
    #[arg(long, env = "HTFAAS_DIR", default_value = ".htfaas")]
    dir: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Run the local stack in the foreground (nats-server, storage, scheduler, gateway, one EP).
    Up {
        #[command(flatten)]
        dir: DirArg,
        /// Also register the example `checksum` function, upload a sample file and print its output.
        #[arg(long)]
        demo: bool,
        /// The example module for --demo.
        #[arg(long)]
        demo_wasm: Option<PathBuf>,
        /// nats-server binary (default: $HTFAAS_NATS_SERVER, .tools/venv/bin, PATH, /usr/sbin).
        #[arg(long)]
        nats_server: Option<PathBuf>,
    },
    /// Run the built-in storage from a JSON config (see htfaas_storage::Config).
    Storage {
        #[arg(long)]
        config: PathBuf,
    },
    /// Run the scheduler from a JSON config (see htfaas_scheduler::Config).
    Scheduler {
        #[arg(long)]
        config: PathBuf,
    },
    /// Run the gateway from a JSON config (see htfaas_gateway::Config).
    Gateway {
        #[arg(long)]
        config: PathBuf,
    },
    /// Run an execution point from a JSON config (see htfaas_ep::Config).
    Ep {
        #[arg(long)]
        config: PathBuf,
        /// Leave (drain, then exit) this long after start, e.g. 1h.
        #[arg(long, value_parser = parse_duration_s)]
        lifetime: Option<u64>,
        /// Leave after running no job for this long, e.g. 5m.
        #[arg(long, value_parser = parse_duration_s)]
        idle_shutdown: Option<u64>,
        /// The annex this EP joins; must be the one its attach token names.
        #[arg(long)]
        annex: Option<String>,
    },
    /// Upload a local file to storage as the stack's user.
    Put {
        #[command(flatten)]
        dir: DirArg,
        /// Local file.
        local: PathBuf,
        /// Storage path, e.g. /data/raw/run1.dat.
        storage_path: String,
    },
    /// Write a storage file to stdout.
    Get {
        #[command(flatten)]
        dir: DirArg,
        /// Storage path.
        storage_path: String,
    },
    /// Manage functions.
    Fn {
        #[command(subcommand)]
        command: FnCommand,
    },
    /// List jobs, newest first; or hold, release or remove one.
    Jobs {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Act on one job instead of listing.
        #[command(subcommand)]
        action: Option<JobsCommand>,
    },
    /// Usage per owner.
    Accounting {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Mint tokens with the local stack's keys (admin).
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Run a registered function on a storage file with a submit token (exits non-zero with the
    /// reason when refused).
    Submit {
        #[command(flatten)]
        dir: DirArg,
        /// File holding the submit token.
        #[arg(long)]
        token: PathBuf,
        /// Function name.
        function: String,
        /// Storage path of the input file.
        storage_path: String,
        /// Run on this annex (only EPs attached with a token for it run the job).
        #[arg(long)]
        annex: Option<String>,
    },
    /// Storage events.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
}

#[derive(Subcommand)]
enum FnCommand {
    /// Register a function: upload its module and its manifest.
    Register {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
        /// The wasm module (WASI preview 1).
        #[arg(long)]
        wasm: PathBuf,
        /// Trigger glob over the storage path, e.g. '/data/raw/**'.
        #[arg(long)]
        trigger: String,
        /// Output directory in storage, ending in '/'.
        #[arg(long)]
        outputs: String,
        /// Owner accounted for its runs (default: the stack's user).
        #[arg(long)]
        owner: Option<String>,
        /// Cores per run.
        #[arg(long, default_value_t = 1)]
        cpus: u32,
        /// Memory cap per run, MiB.
        #[arg(long, default_value_t = 2048)]
        memory_mb: u64,
        /// Wall-time cap per run, seconds.
        #[arg(long, default_value_t = 3600)]
        runtime_s: u64,
        /// Extra argument after the input path (repeatable).
        #[arg(long = "arg")]
        args: Vec<String>,
        /// Run only on EPs attached with an attach token for this annex.
        #[arg(long)]
        annex: Option<String>,
        /// GPUs per run (the scheduler's site policy decides who may have them).
        #[arg(long, default_value_t = 0)]
        gpus: u32,
        /// Scratch disk per run, MiB.
        #[arg(long, default_value_t = 0)]
        disk_mb: u64,
        /// Job class of its runs (e.g. lite, short, long; default: the scheduler's default class).
        #[arg(long)]
        class: Option<String>,
    },
    /// List functions.
    List {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum JobsCommand {
    /// Keep a job from running (a running one is stopped) until it is released.
    Hold {
        /// Job id.
        id: String,
        /// Why; shown as the job's hold reason.
        #[arg(long)]
        reason: String,
    },
    /// Let a held job run again.
    Release {
        /// Job id.
        id: String,
        /// Why.
        #[arg(long)]
        reason: String,
    },
    /// Remove a job (a running one is stopped).
    Rm {
        /// Job id.
        id: String,
        /// Why; recorded with the job.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// A submit token for a person or a service; printed on stdout.
    Submit {
        #[command(flatten)]
        dir: DirArg,
        /// Owner accounted for the jobs.
        #[arg(long)]
        owner: String,
        /// Jobs it may submit.
        #[arg(long, default_value_t = 1)]
        jobs: u32,
        /// Most cores per job.
        #[arg(long, default_value_t = 1)]
        cpus: u32,
        /// Most memory per job, MiB.
        #[arg(long, default_value_t = 2048)]
        memory_mb: u64,
        /// Longest run time per job (e.g. 90s, 30m, 2h).
        #[arg(long, default_value = "1h", value_parser = parse_duration_s)]
        runtime: u64,
        /// Only this function digest.
        #[arg(long)]
        function: Option<htfaas_functions::Digest>,
        /// Charge its jobs to this accounting group.
        #[arg(long)]
        group: Option<String>,
        /// Lifetime of the token (e.g. 15m, 1h, 7d).
        #[arg(long, default_value = "1h", value_parser = parse_duration_s)]
        ttl: u64,
    },
    /// Revoke tokens at once, everywhere: by token id, by owner or by issuer. Queued jobs of
    /// the tokens are removed, running ones stopped, EPs attached with them disconnected.
    Revoke {
        #[command(flatten)]
        dir: DirArg,
        /// One token, submit or attach, by its `jti`.
        #[arg(long, group = "target")]
        jti: Option<String>,
        /// Every token of this owner.
        #[arg(long, group = "target")]
        owner: Option<String>,
        /// Every token this issuer signed.
        #[arg(long, group = "target")]
        issuer: Option<String>,
        /// Why; recorded with every job it removes or stops.
        #[arg(long)]
        reason: String,
    },
    /// List recorded revocations.
    Revocations {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// An attach token for an EP; printed on stdout.
    Ep {
        #[command(flatten)]
        dir: DirArg,
        /// Run only this owner's jobs (default: a site EP that may run any job).
        #[arg(long)]
        owner: Option<String>,
        /// Run only jobs that ask for this annex (and be the only place they run).
        #[arg(long)]
        annex: Option<String>,
        /// Lifetime of the token (e.g. 1h, 30d).
        #[arg(long, default_value = "1d", value_parser = parse_duration_s)]
        ttl: u64,
    },
}

/// `90`, `90s`, `30m`, `2h`, `7d` → seconds.
fn parse_duration_s(s: &str) -> Result<u64, String> {
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = number.parse().map_err(|_| format!("{s:?}: want a number with s, m, h or d"))?;
    let factor = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (s, m, h, d)")),
    };
    n.checked_mul(factor).filter(|&v| v > 0).ok_or_else(|| format!("{s:?}: out of range"))
}

#[derive(Subcommand)]
enum EventsCommand {
    /// Publish a raw event (JSON file) through JetStream.
    Publish {
        #[command(flatten)]
        dir: DirArg,
        /// The event file.
        file: PathBuf,
        /// Subject.
        #[arg(long, default_value = htfaas_functions::proto::EVENTS_SUBJECT)]
        subject: String,
    },
}

fn read_config<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parse {}", path.display()))
}

/// Cancels the token on the first SIGINT or SIGTERM.
fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("signal received; shutting down");
        t.cancel();
    });
    token
}

fn client(dir: &DirArg) -> anyhow::Result<Client> {
    Client::new(StackInfo::load(&dir.dir)?)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,async_nats=warn,wasmtime=warn,cranelift=warn")
        }))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match execute(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The reason and its causes on one line; no backtrace, even with RUST_BACKTRACE set.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Up { dir, demo, demo_wasm, nats_server } => {
            let mut opts = StackOptions::new(&dir.dir);
            opts.nats_binary = nats_server;
            let shutdown = on_signals();
            let mut stack = Stack::start(opts).await?;
            println!("ready");
            println!(
                "gateway {}  scheduler {}  storage {}  nats {}",
                stack.info().gateway_url,
                stack.info().scheduler_url,
                stack.info().storage_url,
                stack.info().nats_url
            );
            if demo {
                let wasm = demo_wasm.unwrap_or_else(htfaas::stack::default_demo_wasm);
                let client = stack.client()?;
                match htfaas::stack::demo(&client, &wasm, Duration::from_secs(60)).await {
                    Ok((output, elapsed)) => {
                        println!("output after {:.1} ms:", elapsed.as_secs_f64() * 1e3);
                        print!("{output}");
                    }
                    Err(e) => {
                        eprintln!("demo failed: {e:#}");
                        stack.stop().await?;
                        std::process::exit(1);
                    }
                }
            }
            println!("running; Ctrl-C stops");
            tokio::select! {
                _ = shutdown.cancelled() => {}
                (name, result) = stack.any_stopped() => {
                    eprintln!("{name} stopped unexpectedly: {:?}", result.err());
                }
            }
            stack.stop().await
        }
        Command::Storage { config } => {
            let settings = read_config::<htfaas_storage::Config>(&config)?.resolve().await?;
            htfaas_storage::run(settings, on_signals()).await
        }
        Command::Scheduler { config } => {
            let settings = read_config::<htfaas_scheduler::Config>(&config)?.resolve().await?;
            htfaas_scheduler::run(settings, on_signals()).await
        }
        Command::Gateway { config } => {
            let settings = read_config::<htfaas_gateway::Config>(&config)?.resolve().await?;
            htfaas_gateway::run(settings, on_signals()).await
        }
        Command::Ep { config, lifetime, idle_shutdown, annex } => {
            let mut config = read_config::<htfaas_ep::Config>(&config)?;
            config.annex = annex.or(config.annex);
            config.lifetime_s = lifetime.or(config.lifetime_s);
            config.idle_shutdown_s = idle_shutdown.or(config.idle_shutdown_s);
            let settings = config.resolve().await?;
            htfaas_ep::run(settings, on_signals()).await
        }
        Command::Put { dir, local, storage_path } => client(&dir)?.put_file(&local, &storage_path).await,
        Command::Get { dir, storage_path } => client(&dir)?.get_to(&storage_path, &mut tokio::io::stdout()).await,
        Command::Fn {
            command:
                FnCommand::Register {
                    dir,
                    name,
                    wasm,
                    trigger,
                    outputs,
                    owner,
                    cpus,
                    memory_mb,
                    runtime_s,
                    args,
                    annex,
                    gpus,
                    disk_mb,
                    class,
                },
        } => {
            let client = client(&dir)?;
            let bytes = std::fs::read(&wasm).with_context(|| format!("read {}", wasm.display()))?;
            let module = client.upload_module(bytes).await?;
            let manifest = FunctionManifest {
                name,
                owner: owner.unwrap_or_else(|| client.info().user.clone()),
                module,
                trigger: Trigger { path: trigger },
                resources: Resources { cpus, memory_mb, runtime_s, gpus, disk_mb },
                outputs: Outputs { dir: outputs },
                args,
                env: vec![],
                annex,
                class,
            };
            let record = client.register(&manifest).await?;
            println!("registered {} v{} {}", record.manifest.name, record.version, record.manifest.module);
            Ok(())
        }
        Command::Fn { command: FnCommand::List { dir, json } } => {
            let functions = client(&dir)?.functions().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&functions)?);
            } else {
                println!("{:<20} {:>4} {:<24} {:<24} MODULE", "NAME", "VER", "TRIGGER", "OUTPUTS");
                for f in functions {
                    let m = &f.manifest;
                    println!(
                        "{:<20} {:>4} {:<24} {:<24} {}",
                        m.name,
                        f.version,
                        m.trigger.path,
                        m.outputs.dir,
                        m.module.short()
                    );
                }
            }
            Ok(())
        }
        Command::Jobs { dir, json: _, action: Some(action) } => {
            let (verb, id, reason) = match action {
                JobsCommand::Hold { id, reason } => ("hold", id, reason),
                JobsCommand::Release { id, reason } => ("release", id, reason),
                JobsCommand::Rm { id, reason } => ("remove", id, reason),
            };
            let job = client(&dir)?.job_action(&id, verb, &reason).await?;
            println!("job {} is {}: {}", job.id, job.state.as_str(), job.reason);
            Ok(())
        }
        Command::Jobs { dir, json, action: None } => {
            let jobs = client(&dir)?.jobs().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&jobs)?);
            } else {
                println!(
                    "{:<36} {:<10} {:<12} {:<10} {:>8} INPUT / REASON",
                    "ID", "OWNER", "FUNCTION", "STATE", "WALL_MS"
                );
                for j in jobs {
                    let wall = j.usage.map(|u| u.wall_ms.to_string()).unwrap_or_default();
                    let detail = if j.reason.is_empty() { j.event.path.clone() } else { j.reason.clone() };
                    println!(
                        "{:<36} {:<10} {:<12} {:<10} {:>8} {}",
                        j.id,
                        j.owner,
                        j.function,
                        j.state.as_str(),
                        wall,
                        detail
                    );
                }
            }
            Ok(())
        }
        Command::Accounting { dir, json } => {
            let accounts = client(&dir)?.accounting().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&accounts)?);
            } else {
                println!(
                    "{:<16} {:>9} {:>6} {:>12} {:>10} {:>12} {:>12}",
                    "OWNER", "COMPLETED", "FAILED", "CORE_HOURS", "CPU_S", "BYTES_IN", "BYTES_OUT"
                );
                for a in accounts {
                    println!(
                        "{:<16} {:>9} {:>6} {:>12.6} {:>10.3} {:>12} {:>12}",
                        a.owner,
                        a.jobs_completed,
                        a.jobs_failed,
                        a.core_seconds / 3600.0,
                        a.cpu_seconds,
                        a.bytes_in,
                        a.bytes_out
                    );
                }
            }
            Ok(())
        }
        Command::Token {
            command: TokenCommand::Submit { dir, owner, jobs, cpus, memory_mb, runtime, function, group, ttl },
        } => {
            let grant = htfaas::stack::SubmitGrant {
                owner,
                jobs,
                limits: Resources::new(cpus, memory_mb, runtime),
                function,
                group,
                ttl_s: ttl,
            };
            println!("{}", htfaas::stack::mint_submit_token(&dir.dir, &grant)?);
            Ok(())
        }
        Command::Token { command: TokenCommand::Ep { dir, owner, annex, ttl } } => {
            println!("{}", htfaas::stack::mint_ep_token(&dir.dir, owner, annex, ttl)?);
            Ok(())
        }
        Command::Token { command: TokenCommand::Revoke { dir, jti, owner, issuer, reason } } => {
            use htfaas_functions::proto::RevocationTarget;
            let target = match (jti, owner, issuer) {
                (Some(j), None, None) => RevocationTarget::Jti(j),
                (None, Some(o), None) => RevocationTarget::Owner(o),
                (None, None, Some(i)) => RevocationTarget::Issuer(i),
                _ => anyhow::bail!("name exactly one of --jti, --owner, --issuer"),
            };
            let r = client(&dir)?.revoke(target, &reason).await?;
            println!(
                "revoked {:?}: {} queued job(s) removed, {} running job(s) stopped, {} EP session(s) closed",
                r.target,
                r.removed_jobs.len(),
                r.stopped_jobs.len(),
                r.closed_eps.len()
            );
            Ok(())
        }
        Command::Token { command: TokenCommand::Revocations { dir, json } } => {
            let list = client(&dir)?.revocations().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<8} {:<40} {:<24} REASON", "KIND", "VALUE", "AT");
                for r in list {
                    let (kind, value) = match &r.target {
                        htfaas_functions::proto::RevocationTarget::Jti(v) => ("jti", v),
                        htfaas_functions::proto::RevocationTarget::Owner(v) => ("owner", v),
                        htfaas_functions::proto::RevocationTarget::Issuer(v) => ("issuer", v),
                    };
                    println!("{kind:<8} {value:<40} {:<24} {}", r.at_ms, r.reason);
                }
            }
            Ok(())
        }
        Command::Submit { dir, token, function, storage_path, annex } => {
            let token = std::fs::read_to_string(&token).with_context(|| format!("read {}", token.display()))?;
            let reply = client(&dir)?.run_function_on(&token, &function, &storage_path, annex.as_deref()).await?;
            println!("job {} submitted", reply.job_id);
            Ok(())
        }
        Command::Events { command: EventsCommand::Publish { dir, file, subject } } => {
            let bytes = std::fs::read(&file).with_context(|| format!("read {}", file.display()))?;
            let seq = client(&dir)?.publish_event(&subject, bytes).await?;
            println!("published to {subject} (stream sequence {seq})");
            Ok(())
        }
    }
}
