//! `htfaas fn register|list|test`: functions, their manifests and their triggers. Must not know:
//! how reports and functions are printed ([`super::output`]).

use super::args::{DirArg, client, parse_header, parse_time_arg};
use super::output;
use anyhow::Context as _;
use clap::Subcommand;
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::{FunctionManifest, Resources};
use std::path::PathBuf;

#[derive(Subcommand)]
// Parsed once per process: boxing `Register` would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum FnCommand {
    /// Register a function: upload its module and its manifest.
    #[command(group(clap::ArgGroup::new("fires").required(true).multiple(true).args(["trigger", "rule"])))]
    Register {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
        /// The wasm binary: a WASI preview 1 module or a preview 2 component.
        #[arg(long)]
        wasm: PathBuf,
        /// Trigger glob over the storage path, e.g. '/data/raw/**'. With --rule, both must hold.
        #[arg(long)]
        trigger: Option<String>,
        /// Trigger rule, e.g. 'path prefix "/data/raw/" and size > 1MB and not name suffix ".tmp"'
        /// (fires only on writes unless it names a kind or type). At least one of --trigger, --rule.
        #[arg(long)]
        rule: Option<String>,
        /// Most runs started per second, as RATE or RATE/BURST (e.g. 2 or 0.5/4); the excess
        /// waits, nothing is dropped.
        #[arg(long, value_parser = parse_rate)]
        rate: Option<htfaas_functions::manifest::RateLimit>,
        /// Many writes to one path within this many seconds start one job, on the last one.
        #[arg(long)]
        debounce_s: Option<u64>,
        /// Output directory in storage, ending in '/'.
        #[arg(long)]
        outputs: String,
        /// Runs may replace files that already exist in the output directory (the owner's
        /// namespace must grant `replace` there); without it they only create new files.
        #[arg(long)]
        replace: bool,
        /// Owner accounted for its runs (default: the stack's user).
        #[arg(long)]
        owner: Option<String>,
        /// Cores per run.
        #[arg(long, default_value_t = 1)]
        cpus: u32,
        /// Memory cap per run, MiB.
        #[arg(long, default_value_t = 2048)]
        memory_mb: u64,
        /// Wall-time cap per run, seconds (0: the default of its job class, set by the scheduler).
        #[arg(long, default_value_t = 0)]
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
        /// Most output bytes one run may store (narrows the EPs' own bound, never widens it).
        #[arg(long)]
        max_output_bytes: Option<u64>,
        /// Most output files one run may store (narrows the EPs' own bound).
        #[arg(long)]
        max_output_files: Option<u64>,
        /// Instruction budget of one run, on EPs that meter fuel (narrows the EPs' own).
        #[arg(long)]
        instructions: Option<u64>,
        /// Check the manifest and list the recorded events its trigger would fire on; register
        /// nothing (the module is uploaded: it is content-addressed).
        #[arg(long)]
        dry_run: bool,
        /// With --dry-run: first recording time read (RFC 3339, Unix seconds or -2h; default: a
        /// day ago).
        #[arg(long, requires = "dry_run", allow_hyphen_values = true, value_parser = parse_time_arg)]
        since: Option<String>,
        /// With --dry-run: last recording time read (default: the last event recorded).
        #[arg(long, requires = "dry_run", allow_hyphen_values = true, value_parser = parse_time_arg)]
        until: Option<String>,
        /// With --dry-run: most recorded messages read.
        #[arg(long, requires = "dry_run")]
        limit: Option<u64>,
        /// With --dry-run: print the report as JSON.
        #[arg(long, requires = "dry_run")]
        json: bool,
    },
    /// List functions.
    List {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show how one event parses and whether the function's trigger is true, false or undefined
    /// on it (and each part: path glob, rule).
    #[command(group(clap::ArgGroup::new("message").required(true).args(["event", "seq"])))]
    Test {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
        /// The event, a JSON file (a dCache billing message, or a CloudEvent with --subject).
        #[arg(long)]
        event: Option<PathBuf>,
        /// Instead of --event: the recorded message with this stream sequence.
        #[arg(long, conflicts_with_all = ["subject", "headers"])]
        seq: Option<u64>,
        /// Subject the event comes on (default: the dCache billing subject).
        #[arg(long)]
        subject: Option<String>,
        /// A NATS header NAME=VALUE, e.g. `ce-type=org.example.closed` (repeatable).
        #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
        headers: Vec<(String, String)>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    // issue 22: `fn new|build|run`, a developer's commands without a stack (`super::fn_dev`).
    #[command(flatten)]
    Dev(super::fn_dev::DevCommand),
}

/// `--rate RATE[/BURST]`: runs per second, burst 1 unless given.
pub fn parse_rate(s: &str) -> Result<htfaas_functions::manifest::RateLimit, String> {
    let (per_s, burst) = s.split_once('/').unwrap_or((s, "1"));
    let per_s: f64 = per_s.trim().parse().map_err(|e| format!("{s:?}: rate: {e}"))?;
    let burst: u32 = burst.trim().parse().map_err(|e| format!("{s:?}: burst: {e}"))?;
    if !(per_s.is_finite() && per_s > 0.0) || burst == 0 {
        return Err(format!("{s:?}: the rate must be above 0 and the burst at least 1"));
    }
    Ok(htfaas_functions::manifest::RateLimit { per_s, burst })
}

/// `htfaas fn …`.
pub async fn run(command: FnCommand) -> anyhow::Result<()> {
    match command {
        FnCommand::Register {
            dir,
            name,
            wasm,
            trigger,
            rule,
            rate,
            debounce_s,
            outputs,
            replace,
            owner,
            cpus,
            memory_mb,
            runtime_s,
            args,
            annex,
            gpus,
            disk_mb,
            class,
            max_output_bytes,
            max_output_files,
            instructions,
            dry_run,
            since,
            until,
            limit,
            json,
        } => {
            let client = client(&dir)?;
            let bytes = std::fs::read(&wasm).with_context(|| format!("read {}", wasm.display()))?;
            let module = client.upload_module(bytes).await?;
            let manifest = FunctionManifest {
                name,
                owner: owner.unwrap_or_else(|| client.info().user.clone()),
                module,
                trigger: Trigger { rule, rate, debounce_s, ..Trigger::on_path(trigger.unwrap_or_default()) },
                resources: Resources { cpus, memory_mb, runtime_s, gpus, disk_mb },
                outputs: Outputs { dir: outputs, replace },
                args,
                env: vec![],
                annex,
                class,
                limits: htfaas_functions::proto::JobLimits { max_output_bytes, max_output_files, instructions },
            };
            if dry_run {
                let query = htfaas_functions::proto::RegisterQuery { dry_run, since, until, limit };
                let report = client.register_dry_run(&manifest, &query).await?;
                return output::dry_run(&manifest.name, &report, json);
            }
            let record = client.register(&manifest).await?;
            output::registered(&record);
            Ok(())
        }
        FnCommand::Test { dir, name, event, seq, subject, headers, json } => {
            let event = match event {
                Some(file) => {
                    let bytes = std::fs::read(&file).with_context(|| format!("read {}", file.display()))?;
                    Some(serde_json::from_slice(&bytes).with_context(|| format!("{} is not JSON", file.display()))?)
                }
                None => None,
            };
            let request =
                htfaas_functions::proto::TestRequest { subject, headers: headers.into_iter().collect(), event, seq };
            let report = client(&dir)?.test_function(&name, &request).await?;
            output::fn_test(&report, json)
        }
        FnCommand::List { dir, json } => {
            let functions = client(&dir)?.functions().await?;
            output::functions(&functions, json)
        }
        FnCommand::Dev(command) => super::fn_dev::run(command).await,
    }
}
