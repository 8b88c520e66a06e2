//! `htfaas fn register|list|show|versions|rollback|pin|disable|enable|delete|test`: functions,
//! their manifests, their versions and their triggers. Must not know: how reports and
//! functions are printed ([`super::output`]).

use super::args::{DirArg, client, parse_header, parse_time_arg};
use super::output;
use anyhow::Context as _;
use clap::Subcommand;
use htfaas_functions::manifest::{Outputs, RetryOn, RuntimeKind, Trigger};
use htfaas_functions::{FunctionManifest, Resources};
use std::path::PathBuf;

#[derive(Subcommand)]
// Parsed once per process: boxing `Register` would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum FnCommand {
    /// Register a function: upload its module (or name its image) and its manifest.
    #[command(group(clap::ArgGroup::new("fires").required(true).multiple(true).args(["trigger", "rule", "schedule"])))]
    #[command(group(clap::ArgGroup::new("code").required(true).args(["wasm", "image"])))]
    Register {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
        /// The wasm binary: a WASI preview 1 module or a preview 2 component.
        #[arg(long)]
        wasm: Option<PathBuf>,
        /// A native function: its image, by digest or tag (`htfaas image build|push`), run with
        /// --command in the EP's sandbox.
        #[arg(long, requires = "command")]
        image: Option<String>,
        /// With --image: the command run in the image, as words separated by spaces (e.g.
        /// 'python3 /opt/app/calibrate.py'), or a JSON array of words; the input's path
        /// (/input/NAME) and the --arg values follow.
        #[arg(long, requires = "image", value_parser = parse_command)]
        command: Option<Argv>,
        /// With --image: the command is a handler, a worker each EP keeps warm for this
        /// version and hands one run after another (a JSON request line on its stdin, its
        /// answer on descriptor 3; README, "The handler form"); no input path follows it.
        #[arg(long, requires = "image")]
        handler: bool,
        /// With --image: seconds between SIGTERM and SIGKILL when a run is stopped or reaches
        /// its run time (counted inside the run time); default 300, less for short run times.
        #[arg(long, requires = "image", value_name = "SECONDS")]
        vacate_s: Option<u64>,
        /// Keep checkpoints: the guest's `/checkpoint` is stored when it exits with this code
        /// (1-255; HTCondor's checkpoint_exit_code) or is stopped before its end, and restored
        /// for its next attempt on any EP.
        #[arg(long, value_name = "CODE")]
        checkpoint_exit_code: Option<i32>,
        /// Keep checkpoints of at most this many MiB (default 1024); with no exit code, a
        /// checkpoint is kept only when a run is stopped.
        #[arg(long, value_name = "MIB")]
        checkpoint_mb: Option<u64>,
        /// Trigger glob over the storage path, e.g. '/data/raw/**'. With --rule, both must hold.
        #[arg(long)]
        trigger: Option<String>,
        /// Trigger rule, e.g. 'path prefix "/data/raw/" and size > 1MB and not name suffix ".tmp"'
        /// (fires only on writes unless it names a kind or type). At least one of --trigger, --rule
        /// (or --schedule alone, to run on no file).
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
        /// Owner accounted for its runs (default: the stack's user; with a profile, its token's).
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
        /// An environment variable of its runs, KEY=VALUE (repeatable); part of the manifest,
        /// shown by the API.
        #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_header)]
        env: Vec<(String, String)>,
        /// A secret of its runs, KEY=@FILE (repeatable): the file's contents (trailing newline
        /// dropped) become KEY in their environment. Sealed at rest, shown nowhere but there, never
        /// logged; registering again with new files rotates them.
        #[arg(long = "secret", value_name = "KEY=@FILE", value_parser = parse_secret)]
        secrets: Vec<(String, PathBuf)>,
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
        /// Accounting group its runs are charged to (group quotas, pauses and grants apply);
        /// the owner needs a `group` grant for it (`htfaas ns grant OWNER group G`).
        #[arg(long)]
        group: Option<String>,
        /// Most output bytes one run may store (narrows the EPs' own bound, never widens it).
        #[arg(long)]
        max_output_bytes: Option<u64>,
        /// Most output files one run may store (narrows the EPs' own bound).
        #[arg(long)]
        max_output_files: Option<u64>,
        /// Instruction budget of one run, on EPs that meter fuel (narrows the EPs' own).
        #[arg(long)]
        instructions: Option<u64>,
        /// Run a failed job again up to N times (at most 10; the scheduler's `max_guest_retries`
        /// may allow fewer) when its outcome is one of --retry-on. Default: a guest failure is
        /// final (storage outages are retried by the scheduler all the same).
        #[arg(long, value_name = "N")]
        retries: Option<u32>,
        /// With --retries: the outcomes retried, comma-separated, of trap, time_exceeded,
        /// memory_exceeded, exit_nonzero, fuel_exhausted, storage_unavailable (default: all).
        #[arg(long, value_name = "KINDS", requires = "retries", value_delimiter = ',', value_parser = parse_retry_on)]
        retry_on: Vec<htfaas_functions::manifest::RetryOn>,
        /// With --retries: seconds before the first retry, doubled for each further one (default 10).
        #[arg(long, value_name = "S", requires = "retries")]
        retry_backoff: Option<u64>,
        /// What becomes of the outputs of a run that failed (non-zero exit, trap, a limit):
        /// `discard` (default), `quarantine` (stored under OUTPUTS.quarantine/JOB/, never firing
        /// a function) or `upload` (a non-zero exit's outputs stored as a success's).
        #[arg(long, value_name = "POLICY", value_parser = parse_on_failure)]
        on_failure: Option<htfaas_functions::manifest::FailedOutputs>,
        /// POST each failed job's notification to this https URL (its host must be one the
        /// site allows), signed with HMAC-SHA256 under the function's secret --webhook-key-secret
        /// (set it with --secret NAME=@file).
        #[arg(long, value_name = "URL")]
        webhook: Option<String>,
        /// With --webhook: the name of the function's secret that holds the signing key
        /// (default WEBHOOK_KEY; never given to the runs).
        #[arg(long, value_name = "NAME", requires = "webhook")]
        webhook_key_secret: Option<String>,
        /// Fire on a crontab schedule instead of on events, e.g. '0 3 * * *', in the site's time
        /// zone (the gateway's time_zone): each tick fires the function on every file below its
        /// --trigger or --rule directories that the trigger is true for (without either, once per
        /// tick on no file: it reads only its --ref inputs); ticks missed while the gateway was
        /// down fire once.
        #[arg(long, value_name = "CRON")]
        schedule: Option<String>,
        /// Collect the trigger's files into groups (by directory, or the level `key=` names) and
        /// fire once per complete group: `count=N`, `marker=NAME` or `quiet=SECONDS`, with
        /// optional `,key=/data/runs/*/` and `,timeout=SECONDS` (default a day). The run's input
        /// is the file that completed the group; its other files are under /input/ref/.
        #[arg(long, value_name = "RULE")]
        collect: Option<htfaas_functions::collect::Collect>,
        /// Most runs of the function at once; further jobs wait idle (never fail).
        #[arg(long, value_name = "N")]
        max_concurrent: Option<u32>,
        /// A reference input every run reads besides its input, in the owner's read namespace:
        /// a file, or a directory ending in '/' (every file below it); the run sees it under
        /// /input/ref/<path without the leading '/'> (repeatable).
        #[arg(long = "ref", value_name = "PATH")]
        refs: Vec<String>,
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
    /// List functions: the version of each that fires, its latest, whether it is enabled or pinned.
    List {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Every version of a function, oldest first, and which one fires.
    Versions {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Roll a function back: make an earlier version the one that fires (pinned until the next
    /// registration or `fn pin NAME latest`). Jobs already made keep the version they were
    /// fired with.
    Rollback {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
        /// The version to go to (default: the one before the version that fires now).
        #[arg(long)]
        to: Option<u32>,
    },
    /// Pin the version that fires (a number), or follow the latest again (`latest`).
    Pin {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
        /// A version number, or `latest`.
        version: String,
    },
    /// Disable a function: it fires nothing; its matching events are counted
    /// (`events_disabled`, `firings_disabled` in `htfaas events stats`).
    Disable {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
    },
    /// Enable a disabled function (events missed meanwhile: `htfaas events replay`).
    Enable {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
    },
    /// The names of a function's secrets (never their values).
    Secrets {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
    },
    /// Delete a function: it fires nothing and is listed nowhere; its versions stay in the
    /// audit trail and lineage, and its modules are kept.
    Delete {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
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
    /// Run a function on a file of your namespace now, with your own credential (the profile's
    /// token, or the stack's), and with --wait print how it ended and its outputs' paths.
    Invoke {
        #[command(flatten)]
        dir: DirArg,
        /// Function name.
        name: String,
        /// The input file's storage path; the function's trigger must be true for it.
        path: String,
        /// Wait for the job to end, at most this many seconds (at most 300; 60 when no value is
        /// given), and print its outcome and outputs; without it, print the job id.
        #[arg(long, value_name = "S", num_args = 0..=1, default_missing_value = "60")]
        wait: Option<u64>,
        /// Run on this annex (only when the function names none or the same).
        #[arg(long)]
        annex: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    // `fn new|build|run`: a developer's commands without a stack (`super::fn_dev`).
    #[command(flatten)]
    Dev(super::fn_dev::DevCommand),
}

/// `--secret KEY=@FILE`: a value on the command line would be in the shell's history and the
/// process list, so only a file is taken.
pub fn parse_secret(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once("=@") {
        Some((key, file)) if !key.is_empty() && !file.is_empty() => Ok((key.to_owned(), PathBuf::from(file))),
        _ => Err("give a secret as KEY=@FILE (a value is never taken on the command line)".into()),
    }
}

/// One kind of `--retry-on`.
pub fn parse_retry_on(s: &str) -> Result<htfaas_functions::manifest::RetryOn, String> {
    use htfaas_functions::manifest::RetryOn;
    RetryOn::parse(s.trim()).ok_or_else(|| {
        let kinds: Vec<&str> = RetryOn::ALL.iter().map(|k| k.as_str()).collect();
        format!("{s:?} is not one of {}", kinds.join(", "))
    })
}

/// `--on-failure discard|quarantine|upload`.
pub fn parse_on_failure(s: &str) -> Result<htfaas_functions::manifest::FailedOutputs, String> {
    htfaas_functions::manifest::FailedOutputs::parse(s)
        .ok_or_else(|| format!("{s:?} is not one of discard, quarantine, upload"))
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

/// A native command's words.
#[derive(Debug, Clone)]
pub struct Argv(Vec<String>);

/// A native command: a JSON array of words, or words separated by spaces.
fn parse_command(s: &str) -> Result<Argv, String> {
    let words: Vec<String> = if s.trim_start().starts_with('[') {
        serde_json::from_str(s).map_err(|e| format!("a JSON array of strings: {e}"))?
    } else {
        s.split_whitespace().map(str::to_owned).collect()
    };
    if words.is_empty() {
        return Err("an empty command".into());
    }
    Ok(Argv(words))
}

/// `htfaas fn …`.
pub async fn run(command: FnCommand) -> anyhow::Result<()> {
    match command {
        FnCommand::Register {
            dir,
            name,
            wasm,
            image,
            command,
            handler,
            vacate_s,
            checkpoint_exit_code,
            checkpoint_mb,
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
            env,
            secrets,
            annex,
            gpus,
            disk_mb,
            class,
            group,
            max_output_bytes,
            max_output_files,
            instructions,
            retries,
            retry_on,
            retry_backoff,
            on_failure,
            webhook,
            webhook_key_secret,
            max_concurrent,
            refs,
            schedule,
            collect,
            dry_run,
            since,
            until,
            limit,
            json,
        } => {
            let client = client(&dir)?;
            let (runtime, module) = match (wasm, image) {
                (Some(wasm), _) => {
                    let bytes = std::fs::read(&wasm).with_context(|| format!("read {}", wasm.display()))?;
                    (RuntimeKind::Wasm, client.upload_module(bytes).await?)
                }
                (None, Some(image)) => (RuntimeKind::Native, client.resolve_image(&image).await?),
                (None, None) => anyhow::bail!("--wasm or --image"),
            };
            // The default owner: the stack's user, or, with a profile, whom its token acts as.
            let owner = match owner {
                Some(owner) => owner,
                None if client.info().is_remote() => client.whoami().await?.name,
                None => client.info().user.clone(),
            };
            // The webhook's key is a secret of the function, set with the others, but never one
            // its runs get.
            let webhook = webhook.map(|url| htfaas_functions::manifest::Webhook {
                url,
                key_secret: webhook_key_secret
                    .unwrap_or_else(|| htfaas_functions::manifest::Webhook::DEFAULT_KEY_SECRET.to_owned()),
            });
            let key_secret = webhook.as_ref().map(|w| w.key_secret.clone());
            let manifest = FunctionManifest {
                runtime,
                command: command.map(|c| c.0).unwrap_or_default(),
                handler,
                name,
                owner,
                module,
                trigger: Trigger {
                    rule,
                    rate,
                    debounce_s,
                    schedule,
                    collect,
                    ..Trigger::on_path(trigger.unwrap_or_default())
                },
                resources: Resources { cpus, memory_mb, runtime_s, gpus, disk_mb },
                outputs: Outputs { dir: outputs, replace, on_failure: on_failure.unwrap_or_default() },
                args,
                env,
                annex,
                class,
                limits: htfaas_functions::proto::JobLimits { max_output_bytes, max_output_files, instructions },
                group,
                secrets: secrets.iter().map(|(k, _)| k.clone()).filter(|k| Some(k) != key_secret.as_ref()).collect(),
                retry: retries.map(|retries| htfaas_functions::manifest::RetryPolicy {
                    retries,
                    on: if retry_on.is_empty() { RetryOn::ALL.to_vec() } else { retry_on },
                    backoff_s: retry_backoff.unwrap_or(htfaas_functions::on_failure::DEFAULT_RETRY_BACKOFF_S),
                }),
                webhook,
                max_concurrent,
                inputs: htfaas_functions::manifest::Inputs { refs },
                vacate_s,
                checkpoint: (checkpoint_exit_code.is_some() || checkpoint_mb.is_some()).then(|| {
                    htfaas_functions::checkpoint::CheckpointPolicy {
                        exit_code: checkpoint_exit_code,
                        max_mb: checkpoint_mb.unwrap_or(htfaas_functions::checkpoint::DEFAULT_CHECKPOINT_MB),
                    }
                }),
            };
            // Read before anything is registered: a missing file changes nothing.
            let mut values = std::collections::BTreeMap::new();
            for (key, file) in &secrets {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("read the secret file {}", file.display()))?;
                values.insert(key.clone(), text.trim_end_matches(['\n', '\r']).to_owned());
            }
            if dry_run {
                let query = htfaas_functions::proto::RegisterQuery { dry_run, since, until, limit };
                let report = client.register_dry_run(&manifest, &query).await?;
                return output::dry_run(&manifest.name, &report, json);
            }
            let record = client.register(&manifest).await?;
            output::registered(&record);
            // Its runs wait for the values (a job is made only once every named secret has one).
            if !values.is_empty() {
                let names = client.set_function_secrets(&record.manifest.name, &values).await?;
                println!("secrets set: {}", names.join(", "));
            }
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
            let functions = client(&dir)?.function_statuses().await?;
            output::functions(&functions, json)
        }
        FnCommand::Versions { dir, name, json } => {
            let client = client(&dir)?;
            let status = client.function(&name).await?;
            let versions = client.function_versions(&name).await?;
            output::function_versions(&status, &versions, json)
        }
        FnCommand::Rollback { dir, name, to } => {
            let client = client(&dir)?;
            let to = match to {
                Some(v) => v,
                None => {
                    let live = client.function(&name).await?.record.version;
                    let versions = client.function_versions(&name).await?;
                    versions.iter().map(|r| r.version).filter(|v| *v < live).max().with_context(|| {
                        format!("{name} v{live} is its first version: there is nothing to roll back to")
                    })?
                }
            };
            output::function_changed("rolled back", &client.pin_function(&name, Some(to)).await?);
            Ok(())
        }
        FnCommand::Pin { dir, name, version } => {
            let version = match version.as_str() {
                "latest" => None,
                v => Some(v.parse::<u32>().map_err(|_| anyhow::anyhow!("{v:?}: a version number or `latest`"))?),
            };
            output::function_changed("pinned", &client(&dir)?.pin_function(&name, version).await?);
            Ok(())
        }
        FnCommand::Disable { dir, name } => {
            output::function_changed("disabled", &client(&dir)?.set_function_enabled(&name, false).await?);
            Ok(())
        }
        FnCommand::Enable { dir, name } => {
            output::function_changed("enabled", &client(&dir)?.set_function_enabled(&name, true).await?);
            Ok(())
        }
        FnCommand::Secrets { dir, name } => {
            for n in client(&dir)?.function_secret_names(&name).await? {
                println!("{n}");
            }
            Ok(())
        }
        FnCommand::Delete { dir, name } => {
            let record = client(&dir)?.delete_function(&name).await?;
            println!("deleted {} (v{} was live; its versions stay)", record.manifest.name, record.version);
            Ok(())
        }
        FnCommand::Invoke { dir, name, path, wait, annex, json } => {
            let request = htfaas_functions::proto::InvokeRequest { path, annex, wait_s: wait.unwrap_or(0) };
            let answer = client(&dir)?.invoke_function(&name, &request).await?;
            output::invoked(&answer, wait.is_some(), json)
        }
        FnCommand::Dev(command) => super::fn_dev::run(command).await,
    }
}
