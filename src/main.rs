// Long because it holds every subcommand's parsing and dispatch (split: src/cli/ per command group, one output module); kept whole until issue 19 splits it along its layers.
//! `htfaas`: one binary, one subcommand per role.
//!
//! `up` runs the whole local stack; `storage`, `scheduler`, `gateway` and `ep` run one
//! component from a JSON config file; `put`, `get`, `fn`, `jobs`, `ep list|drain|…`,
//! `accounting`, `events` and `audit` talk to a stack started with `up` (found through `--dir`
//! or `HTFAAS_DIR`); `audit verify --file F --keys K` checks a copied trail without one.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use htfaas::client::{Client, StackInfo};
use htfaas::stack::{Stack, StackOptions};
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::store::Durability;
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
    // Global: where a command has subcommands (`jobs hold`, `accounting set-factor`), it may
    // also be given after them.
    #[arg(long, env = "HTFAAS_DIR", default_value = ".htfaas", global = true)]
    dir: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark the whole path on a fresh local stack against the peer (Parsl's
    /// HighThroughputExecutor) on this machine; one JSON line per figure (see BENCHMARKS.md).
    Bench {
        /// Fewer events, 3 s windows, a shorter peer run, no component benches: under a minute.
        #[arg(long)]
        quick: bool,
        /// Skip the peer (and the ratios).
        #[arg(long)]
        no_peer: bool,
        /// Skip the run with an fsync behind every acknowledgement.
        #[arg(long)]
        no_fsync: bool,
        /// Also gather the components' own benches (`cargo bench`; the default without --quick).
        #[arg(long, conflicts_with = "no_components")]
        components: bool,
        /// Skip the components' own benches.
        #[arg(long)]
        no_components: bool,
        /// EP cores and Parsl workers.
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// Latency samples, htfaas and peer (default 1000; --quick 150).
        #[arg(long)]
        events: Option<usize>,
        /// Throughput window in seconds (default 60; --quick 3).
        #[arg(long)]
        window_s: Option<u64>,
        /// nats-server binary (default: $HTFAAS_NATS_SERVER, .tools/venv/bin, PATH, /usr/sbin).
        #[arg(long)]
        nats_server: Option<PathBuf>,
    },
    /// The crash harness: the stack as five processes under a stream of events, each process
    /// killed (SIGKILL) at a random moment and started again; then checks that every event ran
    /// each function exactly once, every output is right, accounting equals the job records
    /// and both audit trails verify. Prints the counts and each kill's recovery time; fails
    /// unless every check holds.
    CrashTest {
        /// Events in the stream.
        #[arg(long, default_value_t = 10_000)]
        events: u64,
        /// Events published per second.
        #[arg(long, default_value_t = 40)]
        rate: u32,
        /// Rounds of kills (each kills every component once).
        #[arg(long, default_value_t = 1)]
        rounds: u32,
        /// Seed of the kill order, moments and down times (default: the clock).
        #[arg(long)]
        seed: Option<u64>,
        /// fsync behind every acknowledgement, instead of JetStream's own `log` durability.
        #[arg(long)]
        fsync: bool,
        /// EP cores.
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// Keep the state in this directory (default: a temporary one, kept only on failure).
        #[arg(long)]
        keep: Option<PathBuf>,
        /// nats-server binary (default: $HTFAAS_NATS_SERVER, .tools/venv/bin, PATH, /usr/sbin).
        #[arg(long)]
        nats_server: Option<PathBuf>,
    },
    /// One owner publishes a flood of events at once, then another owner one event: prints how
    /// long that event waited (and how many of the flood's jobs started ahead of it), the HTTP
    /// API's latency and each process's memory under the flood.
    Overload {
        /// Events in the flood.
        #[arg(long, default_value_t = 100_000)]
        events: u64,
        /// EP cores.
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// Seconds to go on measuring after the other owner's job ended.
        #[arg(long, default_value_t = 20)]
        after_s: u64,
        /// Keep the state in this directory.
        #[arg(long)]
        keep: Option<PathBuf>,
        /// nats-server binary (default: $HTFAAS_NATS_SERVER, .tools/venv/bin, PATH, /usr/sbin).
        #[arg(long)]
        nats_server: Option<PathBuf>,
    },
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
    /// Run an execution point from a JSON config (see htfaas_ep::Config); or, with a
    /// subcommand, list the stack's EPs or drain, disable, enable, pause or resume one (admin).
    // Running an EP (`ep --config F`) keeps its shape: the flags below conflict with the
    // subcommands, and `--config` is required only when no subcommand is given.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Ep {
        /// Manage the stack's EPs instead of running one.
        #[command(subcommand)]
        action: Option<EpCommand>,
        /// The EP's config file.
        #[arg(long, required = true)]
        config: Option<PathBuf>,
        /// Leave (drain, then exit) this long after start, e.g. 1h.
        #[arg(long, value_parser = parse_duration_s)]
        lifetime: Option<u64>,
        /// Leave after running no job for this long, e.g. 5m.
        #[arg(long, value_parser = parse_duration_s)]
        idle_shutdown: Option<u64>,
        /// The annex this EP joins; must be the one its attach token names.
        #[arg(long)]
        annex: Option<String>,
        /// On SIGTERM the EP drains: it tells the scheduler, takes no new job, and waits this
        /// long for running jobs to finish and be reported, then cancels what still runs and
        /// exits. SIGINT (Ctrl-C) or a second SIGTERM stops at once: running jobs are
        /// cancelled and run again elsewhere. Give a service manager at least this long
        /// (systemd `TimeoutStopSec`, Kubernetes `terminationGracePeriodSeconds`).
        #[arg(long, default_value = "1h", value_parser = parse_duration_s)]
        drain_timeout: u64,
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
    /// Namespaces (admin): where each owner (or group:NAME) may trigger on and read files,
    /// write and replace outputs, and which annexes its jobs may ask for; grant, revoke, list.
    Ns {
        #[command(subcommand)]
        command: NsCommand,
    },
    /// List jobs, newest first; or show one's history or analysis; or hold, release or remove one.
    Jobs {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long, global = true)]
        json: bool,
        /// Act on one job instead of listing.
        #[command(subcommand)]
        action: Option<JobsCommand>,
    },
    /// Fair-share priorities of owners and groups (`condor_userprio`); usage per owner with
    /// --usage; a report per owner, group or function (and period) with --by; or set an
    /// owner's priority factor.
    Accounting {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long, global = true)]
        json: bool,
        /// Print jobs, core-hours and bytes per owner (`GET /v1/accounting`) instead.
        #[arg(long, conflicts_with = "by")]
        usage: bool,
        /// Report jobs by final state, core-, wall- and CPU-hours, peak memory, bytes read and
        /// written, and instructions (where metered) per owner, group or function, summed from
        /// the job records: each job counts when it reached its final state.
        #[arg(long, value_parser = parse_accounting_by)]
        by: Option<htfaas_functions::proto::AccountingBy>,
        /// With --by: from this time on: RFC 3339, Unix seconds, or before now (-2h).
        #[arg(long, requires = "by", allow_hyphen_values = true, value_parser = parse_time_arg)]
        since: Option<String>,
        /// With --by: before this time (default: now).
        #[arg(long, requires = "by", allow_hyphen_values = true, value_parser = parse_time_arg)]
        until: Option<String>,
        /// With --by: one row per key and period of this length (e.g. 1h, 1d), aligned to the
        /// Unix epoch; periods without jobs are left out.
        #[arg(long, requires = "by", value_parser = parse_duration_s)]
        period: Option<u64>,
        /// With --by: print CSV (a header row, then one line per row) instead of a table.
        #[arg(long, requires = "by", conflicts_with = "json")]
        csv: bool,
        /// Change instead of listing.
        #[command(subcommand)]
        action: Option<AccountingCommand>,
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
    /// Bridge a storage system's own event channel to CloudEvents on NATS.
    Bridge {
        #[command(subcommand)]
        command: BridgeCommand,
    },
    /// The audit trails (the gateway's and the scheduler's): the records every given condition
    /// selects, one line each (trail, seq, time, kind, actor, subject), in time order; `--file`
    /// alone prints the file's lineage (the jobs that wrote and read it, back to the first
    /// upload: event, rule, function@digest, token, macaroons, job, outputs); or `audit verify`.
    #[command(args_conflicts_with_subcommands = true)]
    Audit {
        #[command(flatten)]
        dir: DirArg,
        /// Check the trail instead.
        #[command(subcommand)]
        action: Option<AuditCommand>,
        /// Records about this job.
        #[arg(long)]
        job: Option<String>,
        /// Records about this submit or attach token (its jti).
        #[arg(long, value_name = "JTI")]
        token: Option<String>,
        /// Records about this owner.
        #[arg(long)]
        owner: Option<String>,
        /// Records naming this storage path (a job's input or output); alone: the file's lineage.
        #[arg(long, value_name = "PATH")]
        file: Option<String>,
        /// Records about this function (name).
        #[arg(long)]
        function: Option<String>,
        /// Records about this storage event (its id).
        #[arg(long, value_name = "ID")]
        event: Option<String>,
        /// From this time on: RFC 3339, Unix seconds, or before now (-2h).
        #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
        since: Option<String>,
        /// Before this time.
        #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
        until: Option<String>,
        /// At most this many records, the first in seq order (default 1000).
        #[arg(long)]
        limit: Option<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Check both whole trails, the scheduler's and the gateway's (every record's hash and link,
    /// every signed checkpoint); print the records and checkpoints counted and the first
    /// problem; exit non-zero on a problem.
    Verify {
        /// Verify this copy of a trail offline instead (a SQLite file with the audit tables:
        /// a copy of the scheduler's `jobs.sqlite` or of the gateway's `firings.sqlite`); no
        /// running stack needed.
        #[arg(long, value_name = "DB", requires = "keys")]
        file: Option<PathBuf>,
        /// With --file: JWKS file of the audit key (as `GET /v1/audit/keys` answers it).
        #[arg(long, value_name = "JWKS", requires = "file")]
        keys: Option<PathBuf>,
        /// With --file: a head recorded elsewhere earlier (`audit head`); the trail must still
        /// reach that record with that hash, so a tail cut off with its checkpoints is refused.
        #[arg(long = "expect-head", value_name = "SEQ:HASH", requires = "file")]
        head: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a trail's head (its last record) as SEQ:HASH, to record where the trail's host
    /// cannot change it, for `audit verify --file … --expect-head SEQ:HASH` later.
    Head {
        /// The trail's database (the scheduler's `jobs.sqlite`, the gateway's `firings.sqlite`, or a copy).
        #[arg(long, value_name = "DB")]
        file: PathBuf,
    },
    /// Print the JWKS of both audit keys, the scheduler's and the gateway's (for `audit verify
    /// --file … --keys …` of either trail); keep a copy where the trails' hosts cannot change it.
    Keys,
}

/// One audit record as a line: seq, time, kind, actor, subject and the kind's main facts.
fn audit_line(r: &htfaas_functions::audit::AuditRecord) -> String {
    let s = &r.subject;
    let mut parts = Vec::new();
    for (key, value) in [
        ("job", &s.job),
        ("token", &s.token_jti),
        ("owner", &s.owner),
        ("function", &s.function),
        ("event", &s.event_id),
    ] {
        if let Some(v) = value {
            parts.push(format!("{key}={v}"));
        }
    }
    if !s.paths.is_empty() {
        parts.push(format!("paths={}", s.paths.join(",")));
    }
    let d = &r.detail;
    let text = |key: &str| d.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let note = match r.kind.as_str() {
        "job.dispatched" => Some(format!("ep={} attempt={}", d["ep"].as_str().unwrap_or("?"), d["attempt"])),
        "job.finished" => {
            let outputs = d["outputs"].as_array().filter(|o| !o.is_empty()).map(|o| {
                let files: Vec<String> =
                    o.iter().map(|f| format!("{}({} B)", f["path"].as_str().unwrap_or("?"), f["size"])).collect();
                format!(" outputs={}", files.join(","))
            });
            let read = d["input"]["bytes"].as_u64().map(|b| format!(" read={b} B"));
            Some(format!(
                "state={}{}{} {}",
                text("state").unwrap_or_else(|| "?".into()),
                read.unwrap_or_default(),
                outputs.unwrap_or_default(),
                text("reason").unwrap_or_default()
            ))
        }
        "job.refused" => Some(format!("status={} {}", d["status"], text("reason").unwrap_or_default())),
        "attempt.lost" => Some(format!("{}: {}", text("then").unwrap_or_default(), text("why").unwrap_or_default())),
        "admin.action" => {
            Some(format!("{} {}", text("action").unwrap_or_default(), text("reason").unwrap_or_default()))
        }
        _ => text("reason"),
    };
    if let Some(note) = note.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()) {
        parts.push(format!("-- {note}"));
    }
    let line = format!(
        "{:>6} {} {:<15} {:<10} {}",
        r.seq,
        fmt_unix_ms(r.time_ms),
        r.kind.as_str(),
        r.actor.as_deref().unwrap_or("-"),
        parts.join(" ")
    );
    line.trim_end().to_owned()
}

/// [`audit_line`] after the record's trail (`gateway`, `scheduler`), with the main facts of the
/// gateway's kinds.
fn trail_line(r: &htfaas_functions::audit::AuditRecord) -> String {
    let d = &r.detail;
    let note = match r.kind.as_str() {
        "event.matched" => {
            let fired: Vec<String> = d["functions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| format!("{}({})", f["name"].as_str().unwrap_or("?"), f["firing"].as_str().unwrap_or("?")))
                .collect();
            let cause = d["caused_by"]["function"].as_str().map(|f| format!(" caused_by={f}")).unwrap_or_default();
            Some(format!("fired={}{cause}", fired.join(",")))
        }
        "token.minted" => Some(format!(
            "jobs={} cpus={} memory_mb={} runtime_s={} exp={}",
            d["jobs"], d["cpus"], d["memory_mb"], d["runtime_s"], d["exp"]
        )),
        "macaroons.obtained" => {
            let ids: Vec<String> = d["macaroons"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| format!("{}={}", m["role"].as_str().unwrap_or("?"), m["identifier"].as_str().unwrap_or("?")))
                .collect();
            Some(ids.join(" "))
        }
        _ => None,
    };
    let line = audit_line(r);
    match note {
        Some(n) if r.writer == "gateway" => format!("{:<9} {line} -- {n}", r.writer),
        _ => format!("{:<9} {line}", r.writer),
    }
}

/// A lineage as a readable chain: each job that wrote (or read) the file, why it ran (event,
/// rule, function@digest, token, macaroons) and what it did, then the step before it.
fn lineage_text(l: &htfaas_functions::proto::Lineage) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "lineage of {}", l.file);
    if l.steps.is_empty() {
        let _ = writeln!(out, "  no job wrote or read it (an upload no function ran on, or not a known file)");
    }
    let none = || "?".to_owned();
    for s in &l.steps {
        let indent = "  ".repeat(s.depth as usize + 1);
        let verb = match s.relation {
            htfaas_functions::proto::LineageRelation::Wrote => "written by",
            htfaas_functions::proto::LineageRelation::Read => "read by",
        };
        let record = |kind: &str| s.records.iter().find(|r| r.kind.as_str() == kind);
        let _ =
            writeln!(out, "{indent}{} {verb} job {} (owner {})", s.file, s.job, s.owner.clone().unwrap_or_else(none));
        let matched = record("event.matched");
        let source = matched.map(|r| {
            let e = &r.detail["event"];
            format!(" from {} {}", e["source"].as_str().unwrap_or("?"), e["producer"].as_str().unwrap_or("?"))
        });
        let _ = writeln!(
            out,
            "{indent}  event     {} on {}{}",
            s.event_id.clone().unwrap_or_else(none),
            s.input.clone().unwrap_or_else(none),
            source.unwrap_or_default()
        );
        if let Some(c) = &s.caused_by {
            let _ = writeln!(
                out,
                "{indent}  caused by function {}'s job on event {} (chain {})",
                c.function,
                c.event_id,
                c.chain.join(" → ")
            );
        }
        let _ = writeln!(out, "{indent}  rule      {}", s.rule.clone().unwrap_or_else(none));
        let version = s.function_version.map(|v| format!(" v{v}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "{indent}  function  {}@{}{version}",
            s.function.clone().unwrap_or_else(none),
            s.digest.clone().unwrap_or_else(none)
        );
        let limits = record("token.minted").map(|r| {
            let d = &r.detail;
            format!(" (jobs {}, cpus {}, memory {} MB, expires {})", d["jobs"], d["cpus"], d["memory_mb"], d["exp"])
        });
        let _ = writeln!(
            out,
            "{indent}  token     {}{}",
            s.token_jti.clone().unwrap_or_else(none),
            limits.unwrap_or_default()
        );
        if !s.macaroons.is_empty() {
            let _ = writeln!(out, "{indent}  macaroons {}", s.macaroons.join(", "));
        }
        if let Some(d) = record("job.dispatched") {
            let _ = writeln!(
                out,
                "{indent}  ran on    {} (attempt {})",
                d.detail["ep"].as_str().unwrap_or("?"),
                d.detail["attempt"]
            );
        }
        if let Some(f) = record("job.finished") {
            let state = f.detail["state"].as_str().unwrap_or("?");
            let line = format!("{indent}  finished  {state} {}", f.detail["reason"].as_str().unwrap_or_default());
            let _ = writeln!(out, "{}", line.trim_end());
        }
        if !s.outputs.is_empty() {
            let _ = writeln!(out, "{indent}  outputs   {}", s.outputs.join(", "));
        }
    }
    if l.truncated {
        let _ = writeln!(out, "  … (more steps back: the depth or step limit was reached)");
    }
    out
}

/// A verify report as lines, and an error naming the first problem if there is one.
fn print_verify(report: &htfaas_functions::audit::VerifyReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        println!(
            "{} records, {} checkpoints; chain read to record {}",
            report.records, report.checkpoints, report.last_seq
        );
        match report.last_checkpoint_seq {
            Some(k) => println!(
                "last valid signed checkpoint at record {k}; {} later record(s) protected by the chain only",
                report.last_seq.saturating_sub(k)
            ),
            None => println!("no valid signed checkpoint: every record is protected by the chain only"),
        }
    }
    match &report.first_problem {
        None => {
            if !json {
                println!("ok: no problem found");
            }
            Ok(())
        }
        Some(p) => anyhow::bail!("the audit trail has a problem at record {}: {}", p.seq, p.message),
    }
}

#[derive(Subcommand)]
enum BridgeCommand {
    /// Read XRootD `ofs.notify` lines and publish them as CloudEvents on
    /// `storage.cloudevents.xrootd-notify` (JetStream; the gateway creates the stream).
    ///
    /// Program mode: `ofs.notify closew create rm mv |/usr/bin/htfaas bridge xrootd-notify --nats URL`;
    /// FIFO mode: `ofs.notify closew create rm mv >PATH` and `--fifo PATH`. Recommended with
    /// `ofs.notifymsg closew $TID closew $LFN $FSIZE` (the size of written files).
    XrootdNotify {
        /// NATS server URL, e.g. nats://127.0.0.1:4222.
        #[arg(long = "nats")]
        nats: String,
        /// File holding the bridge's NATS nkey user seed (`SU…`); the server lets it publish
        /// on `storage.cloudevents.xrootd-notify` only. Default: connect without a credential.
        #[arg(long)]
        nats_nkey_seed_file: Option<PathBuf>,
        /// Read the FIFO of `ofs.notify … >PATH` (created by xrootd) instead of stdin.
        #[arg(long)]
        fifo: Option<PathBuf>,
        /// Put this in front of every XRootD path (LFN) to make the site's storage path.
        #[arg(long, default_value = "")]
        path_prefix: String,
        /// The XRootD host named in the events' source (xrootd://HOST). Default: this host's name.
        #[arg(long)]
        source_host: Option<String>,
    },
    /// Follow a dCache frontend's SSE storage events (inotify) and publish them as CloudEvents on
    /// `storage.cloudevents.dcache-sse` (JetStream; the gateway creates the stream).
    ///
    /// Resumes with `Last-Event-ID` from its state file, which also keeps the channel and its
    /// watches across restarts; lost events (EVENT_LOSS, IN_Q_OVERFLOW, a lost channel) are
    /// published as `org.htfaas.storage.dcache-sse.event-loss` markers.
    DcacheSse {
        /// Frontend REST base URL, e.g. https://dcache.example.org:3880/api/v1.
        #[arg(long)]
        frontend: String,
        /// Absolute path to watch (repeatable). Watches are not recursive unless --recursive.
        #[arg(long = "watch", required = true)]
        watch: Vec<String>,
        /// inotify flags, comma-separated. Default: IN_CLOSE_WRITE,IN_MOVED_TO,IN_CREATE,IN_DELETE.
        #[arg(long, value_delimiter = ',')]
        flags: Vec<String>,
        /// Also watch directories created or moved in below the watched paths.
        #[arg(long)]
        recursive: bool,
        /// File holding a bearer token (OIDC or macaroon); re-read at each request.
        #[arg(long, required_unless_present = "user", conflicts_with = "user")]
        token_file: Option<PathBuf>,
        /// dCache user for HTTP Basic (with --secret-file).
        #[arg(long, requires = "secret_file")]
        user: Option<String>,
        /// File holding the password of --user.
        #[arg(long, requires = "user")]
        secret_file: Option<PathBuf>,
        /// Extra trusted CA certificate(s), PEM.
        #[arg(long)]
        ca: Option<PathBuf>,
        /// State file (channel, watches, last published event id).
        #[arg(long)]
        state: PathBuf,
        /// NATS server URL.
        #[arg(long = "nats", default_value = "nats://127.0.0.1:4222")]
        nats: String,
        /// File holding the bridge's NATS nkey user seed (`SU…`); the server lets it publish
        /// on `storage.cloudevents.dcache-sse` only. Default: connect without a credential.
        #[arg(long)]
        nats_nkey_seed_file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
// Parsed once per process: boxing `Register` would buy nothing.
#[allow(clippy::large_enum_variant)]
enum FnCommand {
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
}

#[derive(Subcommand)]
enum NsCommand {
    /// Grant one right, e.g. `htfaas ns grant alice read /data/alice/` (audited).
    Grant {
        #[command(flatten)]
        dir: DirArg,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Take one right back (audited); the configuration's own grants are changed there.
    Revoke {
        #[command(flatten)]
        dir: DirArg,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// List the grants in force and where each comes from.
    List {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct GrantArgs {
    /// An owner, or group:NAME for an accounting group.
    principal: String,
    /// read (trigger on and read), write (new outputs), replace (replace outputs) or annex.
    #[arg(value_parser = parse_right)]
    right: htfaas_functions::namespace::Right,
    /// A directory ending in '/' (read, write, replace) or an annex name.
    value: String,
}

fn parse_right(s: &str) -> Result<htfaas_functions::namespace::Right, String> {
    htfaas_functions::namespace::Right::parse(s).ok_or_else(|| format!("{s:?} is not read, write, replace or annex"))
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
    /// The guest's stdout and stderr of a job's last reported run.
    Log {
        /// Job id.
        id: String,
    },
    /// A job's run attempts: where, when, how each ended.
    History {
        /// Job id.
        id: String,
    },
    /// Why a job runs or does not, and what each EP thinks of it (`condor_q -analyze`).
    Analyze {
        /// Job id.
        id: String,
    },
}

#[derive(Subcommand)]
enum EpCommand {
    /// List attached EPs and EPs with an admin setting.
    List {
        #[command(flatten)]
        dir: DirArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Let running jobs finish and start only jobs that end before the deadline (none without one).
    Drain {
        #[command(flatten)]
        dir: DirArg,
        /// EP name.
        name: String,
        /// Start new jobs only if their run time ends within this (e.g. 30m, 2h).
        #[arg(long, value_parser = parse_duration_s)]
        deadline: Option<u64>,
        /// Why; recorded.
        #[arg(long)]
        reason: String,
    },
    /// Start no new job there; running jobs go on.
    Disable {
        #[command(flatten)]
        dir: DirArg,
        /// EP name.
        name: String,
        /// Why; recorded.
        #[arg(long)]
        reason: String,
    },
    /// Take jobs again (ends a drain or a disable).
    Enable {
        #[command(flatten)]
        dir: DirArg,
        /// EP name.
        name: String,
        /// Why; recorded.
        #[arg(long)]
        reason: String,
    },
    /// Start no new job of an accounting group there.
    Pause {
        #[command(flatten)]
        dir: DirArg,
        /// EP name.
        name: String,
        /// The accounting group.
        #[arg(long)]
        group: String,
        /// Why; recorded.
        #[arg(long)]
        reason: String,
    },
    /// Start jobs of a paused accounting group there again.
    Resume {
        #[command(flatten)]
        dir: DirArg,
        /// EP name.
        name: String,
        /// The accounting group.
        #[arg(long)]
        group: String,
        /// Why; recorded.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand)]
enum AccountingCommand {
    /// Set an owner's priority factor (≥ 1; higher gets less), as `condor_userprio -setfactor`.
    SetFactor {
        /// The owner.
        owner: String,
        /// The new factor.
        #[arg(value_parser = parse_factor)]
        factor: f64,
    },
}

/// `owner`, `group` or `function`.
fn parse_accounting_by(s: &str) -> Result<htfaas_functions::proto::AccountingBy, String> {
    use htfaas_functions::proto::AccountingBy;
    match s {
        "owner" => Ok(AccountingBy::Owner),
        "group" => Ok(AccountingBy::Group),
        "function" => Ok(AccountingBy::Function),
        _ => Err(format!("{s:?}: want owner, group or function")),
    }
}

/// A finite number: JSON has no NaN or infinity. Its range is the scheduler's rule.
fn parse_factor(s: &str) -> Result<f64, String> {
    s.parse::<f64>().ok().filter(|f| f.is_finite()).ok_or_else(|| format!("{s:?}: want a number"))
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
    /// An API token for the gateway's HTTP API, signed with the local stack's gateway key;
    /// printed on stdout. `developer`: the owner's own functions, jobs, accounting and audit
    /// records; `admin`: every route. Revocable by its `jti`, its owner or the issuer.
    Api {
        #[command(flatten)]
        dir: DirArg,
        /// The owner the token acts as (its `sub`).
        #[arg(long)]
        owner: String,
        /// `developer` or `admin`.
        #[arg(long)]
        scope: htfaas_functions::token::Scope,
        /// Lifetime of the token (e.g. 1h, 30d).
        #[arg(long, default_value = "30d", value_parser = parse_duration_s)]
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
    /// Publish a raw event (JSON file) through JetStream: a dCache billing message on the
    /// default subject, or a CloudEvent on `storage.cloudevents.<producer>` (structured: the file
    /// is the event; binary: `--header ce-specversion=1.0 --header ce-id=… …`, the file is data).
    Publish {
        #[command(flatten)]
        dir: DirArg,
        /// The event file.
        file: PathBuf,
        /// Subject.
        #[arg(long, default_value = htfaas_functions::proto::EVENTS_SUBJECT)]
        subject: String,
        /// A NATS header NAME=VALUE, e.g. `ce-type=org.example.closed` (repeatable).
        #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
        headers: Vec<(String, String)>,
    },
    /// Run functions again over recorded events (admin), or with --dry-run list the (event,
    /// function) pairs that would fire. A replay's jobs have dedupe keys of their own: it runs
    /// again what already ran, once per replay id.
    Replay {
        #[command(flatten)]
        dir: DirArg,
        /// First recording time read: RFC 3339 (2026-11-22T10:00:00Z), Unix seconds, or before
        /// now (-2h, -30m, -7d).
        #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
        since: String,
        /// Last recording time read (default: the last event recorded).
        #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
        until: Option<String>,
        /// Only this function (default: every registered function).
        #[arg(long)]
        function: Option<String>,
        /// List the pairs that would fire; start nothing.
        #[arg(long)]
        dry_run: bool,
        /// Most recorded messages read (default 10000, at most 100000).
        #[arg(long)]
        limit: Option<u64>,
        /// Continue or retry the replay with this id (what it already started is not started
        /// again). Default: a fresh id.
        #[arg(long, conflicts_with = "dry_run")]
        replay_id: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Checks a time for `--since`/`--until` (the gateway resolves it): RFC 3339, Unix seconds or
/// `-<n><s|m|h|d>`.
fn parse_time_arg(s: &str) -> Result<String, String> {
    htfaas_gateway::replay::parse_time(s, htfaas_gateway::replay::now_ms()).map(|_| s.trim().to_owned())
}

/// One (event, function) pair of a replay report, as a line.
fn pair_line(p: &htfaas_functions::proto::Pair) -> String {
    let fired = match p.fired {
        None => "",
        Some(true) => " fired",
        Some(false) => " FAILED",
    };
    format!(
        "{:>8} {} {}@{} {} {} {} {}{fired}",
        p.seq, p.recorded, p.function, p.version, p.kind, p.msg_type, p.path, p.event_id
    )
}

/// The counts of a replay report, and why it stopped early if it did.
fn report_summary(r: &htfaas_functions::proto::Report) -> String {
    let mut line = format!(
        "scanned {} since {} (events {}, ignored {}, not enabled {}, malformed {}); {} pairs {}",
        r.scanned,
        r.since,
        r.parsed,
        r.ignored,
        r.not_enabled,
        r.malformed,
        r.matched,
        if r.dry_run { "would fire" } else { "matched" }
    );
    if let Some(id) = &r.replay_id {
        line.push_str(&format!("; replay {id}: fired {}, failures {}", r.fired, r.failures));
    }
    if r.pairs_truncated {
        line.push_str(&format!("; only the first {} pairs listed", r.pairs.len()));
    }
    if let Some(why) = &r.stopped {
        line.push_str(&format!("\nstopped early at {why}"));
        if let Some(since) = &r.resume_since {
            line.push_str(&format!("; continue with --since {since}"));
            if let Some(id) = &r.replay_id {
                line.push_str(&format!(" --replay-id {id}"));
            }
        }
    }
    line
}

/// `NAME=VALUE` → a NATS header (`htfaas events publish --header`).
fn parse_header(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_owned(), value.to_owned())),
        _ => Err(format!("{s:?}: want NAME=VALUE")),
    }
}

/// `--rate RATE[/BURST]`: runs per second, burst 1 unless given.
fn parse_rate(s: &str) -> Result<htfaas_functions::manifest::RateLimit, String> {
    let (per_s, burst) = s.split_once('/').unwrap_or((s, "1"));
    let per_s: f64 = per_s.trim().parse().map_err(|e| format!("{s:?}: rate: {e}"))?;
    let burst: u32 = burst.trim().parse().map_err(|e| format!("{s:?}: burst: {e}"))?;
    if !(per_s.is_finite() && per_s > 0.0) || burst == 0 {
        return Err(format!("{s:?}: the rate must be above 0 and the burst at least 1"));
    }
    Ok(htfaas_functions::manifest::RateLimit { per_s, burst })
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

/// `htfaas ep`'s signals: the first SIGTERM cancels the first token (drain: finish running
/// jobs, take no new one); SIGINT, or a second SIGTERM, cancels the second (stop now).
fn on_ep_signals() -> (CancellationToken, CancellationToken) {
    let (drain, stop) = (CancellationToken::new(), CancellationToken::new());
    let (d, s) = (drain.clone(), stop.clone());
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                None
            }
        };
        let mut int = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::error!("cannot listen for SIGINT: {e}");
                None
            }
        };
        loop {
            tokio::select! {
                Some(()) = async { term.as_mut()?.recv().await } => {
                    if d.is_cancelled() {
                        tracing::info!("second SIGTERM: stopping now");
                        break;
                    }
                    tracing::info!("SIGTERM: draining (SIGINT or another SIGTERM stops now)");
                    d.cancel();
                }
                Some(()) = async { int.as_mut()?.recv().await } => {
                    tracing::info!("SIGINT: stopping now");
                    break;
                }
                else => return,
            }
        }
        s.cancel();
    });
    (drain, stop)
}

/// The stack's client: with the stack's admin token, or with the API token in
/// `HTFAAS_API_TOKEN` (from `htfaas token api`) when it is set.
fn client(dir: &DirArg) -> anyhow::Result<Client> {
    let client = Client::new(StackInfo::load(&dir.dir)?)?;
    Ok(match std::env::var(API_TOKEN_ENV) {
        Ok(token) if !token.trim().is_empty() => client.with_token(token.trim()),
        _ => client,
    })
}

/// The environment variable `htfaas` takes an API token from.
const API_TOKEN_ENV: &str = "HTFAAS_API_TOKEN";

/// Unix ms as UTC, e.g. `2025-03-01T12:00:00.250Z`.
fn fmt_unix_ms(ms: u64) -> String {
    let (days, ms_of_day) = (ms / 86_400_000, ms % 86_400_000);
    let (year, month, day) = htfaas_scheduler::dispatch::civil_from_days(days);
    let (h, m, s, milli) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

fn ep_header() -> String {
    format!(
        "{:<20} {:<18} {:<44} {:>7} {:<24} {:<16} {:<12} {:<12} LABELS",
        "NAME", "STATE", "SLOTS(FREE/TOTAL)", "RUNNING", "DEADLINE", "PAUSED", "ANNEX", "OWNER"
    )
}

/// One EP as a row under [`ep_header`].
fn ep_line(ep: &htfaas_functions::proto::EpInfo) -> String {
    use htfaas_functions::proto::EpAdminState;
    let state = match ep.state {
        EpAdminState::Enabled => "enabled",
        EpAdminState::Draining => "draining",
        EpAdminState::Disabled => "disabled",
    };
    let state = if ep.session.is_some() { state.to_owned() } else { format!("{state},detached") };
    let slots = format!(
        "{}/{}cpu {}/{}MiB {}/{}gpu {}/{}GiB",
        ep.free.cpus,
        ep.total.cpus,
        ep.free.memory_mb,
        ep.total.memory_mb,
        ep.free.gpus,
        ep.total.gpus,
        ep.free.disk_mb / 1024,
        ep.total.disk_mb / 1024
    );
    let labels = if ep.labels.is_empty() {
        "-".to_owned()
    } else {
        ep.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
    };
    let deadline = ep.drain_deadline_ms.map_or_else(|| "-".to_owned(), fmt_unix_ms);
    let paused = if ep.paused_groups.is_empty() { "-".to_owned() } else { ep.paused_groups.join(",") };
    format!(
        "{:<20} {:<18} {:<44} {:>7} {:<24} {:<16} {:<12} {:<12} {}",
        ep.name,
        state,
        slots,
        ep.running.len(),
        deadline,
        paused,
        ep.annex.as_deref().unwrap_or("-"),
        ep.owner.as_deref().unwrap_or("-"),
        labels
    )
}

fn owner_header() -> String {
    format!(
        "{:<16} {:>14} {:>10} {:>8} {:>12} {:>14} {:>14}",
        "OWNER", "EFFECTIVE-PRIO", "REAL-PRIO", "FACTOR", "CORES-IN-USE", "DECAYED-CORE-H", "TOTAL-CORE-H"
    )
}

/// One owner as a row under [`owner_header`].
fn owner_line(o: &htfaas_functions::proto::OwnerPriority) -> String {
    format!(
        "{:<16} {:>14.2} {:>10.2} {:>8.2} {:>12} {:>14.3} {:>14.3}",
        o.owner,
        o.effective_priority,
        o.real_priority,
        o.factor,
        o.cores_in_use,
        o.decayed_core_hours,
        o.accumulated_core_hours
    )
}

/// `htfaas jobs history ID`.
async fn job_history(dir: &DirArg, id: &str, json: bool) -> anyhow::Result<()> {
    let attempts = client(dir)?.job_history(id).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&attempts)?);
    } else {
        println!("{:>3} {:<20} {:<24} {:<24} {:<11} REASON", "N", "EP", "STARTED", "ENDED", "OUTCOME");
        for a in attempts {
            let ended = a.ended_at_ms.map_or_else(|| "-".to_owned(), fmt_unix_ms);
            let line = format!(
                "{:>3} {:<20} {:<24} {:<24} {:<11} {}",
                a.n,
                a.ep,
                fmt_unix_ms(a.started_at_ms),
                ended,
                a.outcome,
                a.reason
            );
            println!("{}", line.trim_end());
        }
    }
    Ok(())
}

/// `htfaas jobs analyze ID`.
async fn job_analyze(dir: &DirArg, id: &str, json: bool) -> anyhow::Result<()> {
    let analysis = client(dir)?.job_analyze(id).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&analysis)?);
    } else {
        println!("{}", analysis.summary);
        for reason in &analysis.reasons {
            println!("  - {reason}");
        }
        for v in &analysis.eps {
            match &v.refusal {
                None => println!("{}: would run here", v.ep),
                Some(refusal) => println!("{}: {refusal}", v.ep),
            }
        }
    }
    Ok(())
}

/// `htfaas ep list|drain|disable|enable|pause|resume`.
async fn ep_command(command: EpCommand) -> anyhow::Result<()> {
    use htfaas_functions::proto::EpAction;
    let action = |reason: String| EpAction { reason, deadline_s: None, group: None };
    let (dir, name, verb, body) = match command {
        EpCommand::List { dir, json } => {
            let eps = client(&dir)?.eps().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&eps)?);
            } else {
                println!("{}", ep_header());
                for ep in &eps {
                    println!("{}", ep_line(ep));
                }
            }
            return Ok(());
        }
        EpCommand::Drain { dir, name, deadline, reason } => {
            (dir, name, "drain", EpAction { deadline_s: deadline, ..action(reason) })
        }
        EpCommand::Disable { dir, name, reason } => (dir, name, "disable", action(reason)),
        EpCommand::Enable { dir, name, reason } => (dir, name, "enable", action(reason)),
        EpCommand::Pause { dir, name, group, reason } => {
            (dir, name, "pause", EpAction { group: Some(group), ..action(reason) })
        }
        EpCommand::Resume { dir, name, group, reason } => {
            (dir, name, "resume", EpAction { group: Some(group), ..action(reason) })
        }
    };
    let ep = client(&dir)?.ep_action(&name, verb, &body).await?;
    println!("{}", ep_line(&ep));
    Ok(())
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
        Command::Bench {
            quick,
            no_peer,
            no_fsync,
            components,
            no_components,
            workers,
            events,
            window_s,
            nats_server,
        } => {
            let mut opts = htfaas::bench::BenchOptions::new(env!("CARGO_MANIFEST_DIR"), quick);
            opts.peer = !no_peer;
            opts.fsync = !no_fsync;
            opts.components = (components || !quick) && !no_components;
            opts.workers = workers;
            opts.events = events;
            opts.window = window_s.map(std::time::Duration::from_secs);
            opts.nats_binary = nats_server;
            let started = std::time::Instant::now();
            let figures = htfaas::bench::run(&opts, &mut |f| {
                if let Ok(line) = serde_json::to_string(f) {
                    println!("{line}");
                }
            })
            .await?;
            eprintln!("bench: {} figures in {:.1} s", figures.len(), started.elapsed().as_secs_f64());
            Ok(())
        }
        Command::CrashTest { events, rate, rounds, seed, fsync, workers, keep, nats_server } => {
            let exe = std::env::current_exe().context("find this binary")?;
            let wasm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/target/wasm32-wasip1/release");
            let mut opts = htfaas::crash::CrashOptions::new(exe, wasm);
            opts.events = events;
            opts.rate = rate;
            opts.rounds = rounds;
            opts.seed = seed.unwrap_or(opts.seed);
            opts.durability = if fsync { Durability::Fsync } else { Durability::Log };
            opts.workers = workers;
            opts.dir = keep;
            opts.nats_binary = nats_server;
            let report = htfaas::crash::run(opts).await?;
            println!("{report}");
            anyhow::ensure!(report.passed(), "the crash harness found a problem (above)");
            Ok(())
        }
        Command::Overload { events, workers, after_s, keep, nats_server } => {
            let report = htfaas::overload::run(htfaas::overload::OverloadOptions {
                htfaas: std::env::current_exe().context("find this binary")?,
                nats_binary: nats_server,
                wasm_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/target/wasm32-wasip1/release"),
                flood: events,
                workers,
                after: Duration::from_secs(after_s),
                dir: keep,
            })
            .await?;
            println!("{report}");
            Ok(())
        }
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
            println!(
                "console {}/console  (admin token: \"admin_token\" in {})",
                stack.info().gateway_url,
                dir.dir.join("stack.json").display()
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
        Command::Ep { action: Some(action), .. } => ep_command(action).await,
        Command::Ep { action: None, config, lifetime, idle_shutdown, annex, drain_timeout } => {
            let config = config.context("--config is required to run an EP")?;
            let mut config = read_config::<htfaas_ep::Config>(&config)?;
            config.annex = annex.or(config.annex);
            config.lifetime_s = lifetime.or(config.lifetime_s);
            config.idle_shutdown_s = idle_shutdown.or(config.idle_shutdown_s);
            let mut settings = config.resolve().await?;
            settings.drain_timeout = Duration::from_secs(drain_timeout);
            let (drain, stop) = on_ep_signals();
            htfaas_ep::run_with(settings, drain, stop).await
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
                },
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
                if json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                    return Ok(());
                }
                println!("manifest of {} is valid; not registered (dry run)", manifest.name);
                for p in &report.pairs {
                    println!("{}", pair_line(p));
                }
                println!("{}", report_summary(&report));
                return Ok(());
            }
            let record = client.register(&manifest).await?;
            println!("registered {} v{} {}", record.manifest.name, record.version, record.manifest.module);
            Ok(())
        }
        Command::Fn { command: FnCommand::Test { dir, name, event, seq, subject, headers, json } } => {
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
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
                return Ok(());
            }
            match &report.event {
                Some(e) => println!("parsed: {} {} {} (id {})", e.kind.as_str(), e.msg_type, e.path, e.id),
                None => println!("parsed: {}: {}", report.outcome, report.reason.as_deref().unwrap_or("")),
            }
            println!("trigger of {} v{}: {}", report.function, report.version, report.trigger);
            for part in &report.parts {
                println!("  {} {}: {}", part.part, part.text, part.verdict);
            }
            if report.own_output {
                println!("  the file is in the function's own output directory: never fires");
            }
            let verdict = report.verdict.as_deref().unwrap_or("no event");
            println!("verdict: {verdict} ({})", if report.fires { "fires" } else { "does not fire" });
            Ok(())
        }
        Command::Ns { command: NsCommand::Grant { dir, grant: g } } => {
            let entry = client(&dir)?.grant(&g.principal, g.right, &g.value).await?;
            println!("granted {}", entry.grant);
            Ok(())
        }
        Command::Ns { command: NsCommand::Revoke { dir, grant: g } } => {
            let entry = client(&dir)?.revoke_grant(&g.principal, g.right, &g.value).await?;
            println!("revoked {}", entry.grant);
            Ok(())
        }
        Command::Ns { command: NsCommand::List { dir, json } } => {
            let grants = client(&dir)?.namespaces().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&grants)?);
            } else {
                println!("{:<20} {:<8} {:<7} VALUE", "PRINCIPAL", "RIGHT", "SOURCE");
                for e in grants {
                    let source = match e.source {
                        htfaas_functions::namespace::GrantSource::Config => "config",
                        htfaas_functions::namespace::GrantSource::Admin => "admin",
                    };
                    println!("{:<20} {:<8} {:<7} {}", e.grant.principal, e.grant.right, source, e.grant.value);
                }
            }
            Ok(())
        }
        Command::Fn { command: FnCommand::List { dir, json } } => {
            let functions = client(&dir)?.functions().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&functions)?);
            } else {
                // The trigger last: a rule can be long.
                println!("{:<20} {:>4} {:<24} {:<16} TRIGGER", "NAME", "VER", "OUTPUTS", "MODULE");
                for f in functions {
                    let m = &f.manifest;
                    println!(
                        "{:<20} {:>4} {:<24} {:<16} {}",
                        m.name,
                        f.version,
                        m.outputs.dir,
                        m.module.short(),
                        m.trigger
                    );
                }
            }
            Ok(())
        }
        Command::Jobs { dir, json, action: Some(action) } => {
            let (verb, id, reason) = match action {
                JobsCommand::History { id } => return job_history(&dir, &id, json).await,
                JobsCommand::Log { id } => {
                    let log = client(&dir)?.job_log(&id).await?;
                    if json {
                        println!("{}", serde_json::to_string_pretty(&log)?);
                    } else {
                        print!("{}", log.log);
                    }
                    return Ok(());
                }
                JobsCommand::Analyze { id } => return job_analyze(&dir, &id, json).await,
                JobsCommand::Hold { id, reason } => ("hold", id, reason),
                JobsCommand::Release { id, reason } => ("release", id, reason),
                JobsCommand::Rm { id, reason } => ("remove", id, reason),
            };
            let job = client(&dir)?.job_action(&id, verb, &reason).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&job)?);
            } else {
                println!("job {} is {}: {}", job.id, job.state.as_str(), job.reason);
            }
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
        Command::Accounting { dir, json, action: Some(AccountingCommand::SetFactor { owner, factor }), .. } => {
            let standing = client(&dir)?.set_factor(&owner, factor).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&standing)?);
            } else {
                println!("{}", owner_line(&standing));
            }
            Ok(())
        }
        Command::Accounting { dir, json, csv, by: Some(by), since, until, period, action: None, .. } => {
            let now = htfaas_gateway::replay::now_ms();
            let time = |t: Option<String>| {
                t.map(|t| htfaas_gateway::replay::parse_time(&t, now).map_err(anyhow::Error::msg)).transpose()
            };
            let query = htfaas_functions::proto::AccountingQuery {
                since_ms: time(since)?,
                until_ms: time(until)?,
                by,
                period_s: period,
            };
            let report = client(&dir)?.accounting_report(&query).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else if csv {
                print!("{}", htfaas::client::report_csv(&report));
            } else {
                print!("{}", htfaas::client::report_table(&report));
            }
            Ok(())
        }
        Command::Accounting { dir, json, usage: false, action: None, .. } => {
            let report = client(&dir)?.priorities().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{}", owner_header());
                for o in &report.owners {
                    println!("{}", owner_line(o));
                }
                if !report.groups.is_empty() {
                    println!();
                    println!(
                        "{:<16} {:>8} {:>8} {:>12} {:>14} {:>14}",
                        "GROUP", "QUOTA", "CAP", "CORES-IN-USE", "DECAYED-CORE-H", "TOTAL-CORE-H"
                    );
                    let cores = |c: Option<f64>| c.map_or_else(|| "-".to_owned(), |c| format!("{c:.1}"));
                    for g in &report.groups {
                        println!(
                            "{:<16} {:>8} {:>8} {:>12} {:>14.3} {:>14.3}",
                            g.group,
                            cores(g.quota_cores),
                            cores(g.cap_cores),
                            g.cores_in_use,
                            g.decayed_core_hours,
                            g.accumulated_core_hours
                        );
                    }
                }
            }
            Ok(())
        }
        Command::Accounting { dir, json, usage: true, action: None, .. } => {
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
        Command::Token { command: TokenCommand::Api { dir, owner, scope, ttl } } => {
            let key =
                htfaas_functions::token::SigningKey::load_or_create(&dir.dir.join("gateway/submit.pem"), "gateway-1")
                    .context("load the gateway's key (run `htfaas up` once to create it)")?;
            let claims = htfaas_functions::token::ApiClaims::new("htfaas-gateway", &owner, scope, ttl);
            println!("{}", key.sign(&claims)?);
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
        Command::Bridge {
            command: BridgeCommand::XrootdNotify { nats, nats_nkey_seed_file, fifo, path_prefix, source_host },
        } => {
            use htfaas_gateway::bridge::xrootd::{Input, Settings, run};
            let mut settings = Settings::new(nats, fifo.map_or(Input::Stdin, Input::Fifo));
            settings.nats_credential = nats_seed(nats_nkey_seed_file.as_deref())?;
            settings.path_prefix = path_prefix;
            if let Some(host) = source_host {
                settings.source_host = host;
            }
            run(settings, on_signals()).await.map(|_| ())
        }
        Command::Bridge {
            command:
                BridgeCommand::DcacheSse {
                    frontend,
                    watch,
                    flags,
                    recursive,
                    token_file,
                    user,
                    secret_file,
                    ca,
                    state,
                    nats,
                    nats_nkey_seed_file,
                },
        } => {
            use htfaas_gateway::bridge::sse;
            let auth = match (token_file, user, secret_file) {
                (Some(token_file), None, None) => sse::Auth::Bearer { token_file },
                (None, Some(user), Some(secret_file)) => sse::Auth::Basic { user, secret_file },
                _ => anyhow::bail!("give either --token-file or --user with --secret-file"),
            };
            let mut settings = sse::Settings::new(&frontend, auth, watch, state, &nats);
            if !flags.is_empty() {
                settings.flags = flags;
            }
            settings.recursive = recursive;
            settings.ca_file = ca;
            settings.nats_credential = nats_seed(nats_nkey_seed_file.as_deref())?;
            sse::run(settings, on_signals()).await
        }
        Command::Audit { dir, action: Some(AuditCommand::Keys), .. } => {
            println!("{}", serde_json::to_string_pretty(&client(&dir)?.audit_keys().await?)?);
            Ok(())
        }
        Command::Audit { action: Some(AuditCommand::Head { file }), .. } => {
            match htfaas_functions::audit::anchor::head(&file).with_context(|| format!("read {}", file.display()))? {
                Some(head) => println!("{head}"),
                None => anyhow::bail!("{} holds no audit record yet", file.display()),
            }
            Ok(())
        }
        Command::Audit { dir, action: Some(AuditCommand::Verify { file, keys, head, json }), .. } => match (file, keys)
        {
            (Some(file), Some(keys)) => {
                let head = head.map(|h| h.parse::<htfaas_functions::audit::anchor::Head>()).transpose()?;
                print_verify(&htfaas::client::verify_trail_file_with_head(&file, &keys, head.as_ref())?, json)
            }
            (None, None) => {
                let c = client(&dir)?;
                let reports = [("scheduler", c.audit_verify().await?), ("gateway", c.audit_verify_gateway().await?)];
                if json {
                    let map: serde_json::Map<String, serde_json::Value> = reports
                        .iter()
                        .map(|(t, r)| Ok(((*t).to_owned(), serde_json::to_value(r)?)))
                        .collect::<anyhow::Result<_>>()?;
                    println!("{}", serde_json::to_string_pretty(&map)?);
                }
                let mut failed = Vec::new();
                for (trail, report) in &reports {
                    if !json {
                        println!("{trail} trail:");
                    }
                    if let Err(e) = print_verify(report, json) {
                        failed.push(format!("{trail}: {e:#}"));
                    }
                }
                anyhow::ensure!(failed.is_empty(), "{}", failed.join("; "));
                Ok(())
            }
            _ => anyhow::bail!("--file and --keys go together"),
        },
        Command::Audit { dir, action: None, job, token, owner, file, function, event, since, until, limit, json } => {
            let now = htfaas_gateway::replay::now_ms();
            let time = |t: Option<String>| {
                t.map(|t| htfaas_gateway::replay::parse_time(&t, now).map_err(anyhow::Error::msg)).transpose()
            };
            let only_file = file.is_some()
                && [&job, &token, &owner, &function, &event, &since, &until].iter().all(|f| f.is_none())
                && limit.is_none();
            if let (true, Some(path)) = (only_file, &file) {
                let lineage = client(&dir)?.lineage(path).await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&lineage)?);
                } else {
                    print!("{}", lineage_text(&lineage));
                }
                return Ok(());
            }
            let filter = htfaas_functions::audit::AuditFilter {
                token,
                owner,
                file,
                job,
                function,
                event_id: event,
                since_ms: time(since)?,
                until_ms: time(until)?,
                limit,
            };
            let records = client(&dir)?.audit_both(&filter).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&records)?);
            } else {
                for r in &records {
                    println!("{}", trail_line(r));
                }
            }
            Ok(())
        }
        Command::Events { command: EventsCommand::Publish { dir, file, subject, headers } } => {
            let bytes = std::fs::read(&file).with_context(|| format!("read {}", file.display()))?;
            let seq = client(&dir)?.publish_event_with_headers(&subject, &headers, bytes).await?;
            println!("published to {subject} (stream sequence {seq})");
            Ok(())
        }
        Command::Events {
            command: EventsCommand::Replay { dir, since, until, function, dry_run, limit, replay_id, json },
        } => {
            use htfaas_functions::proto::{ReplayRequest, TimeArg};
            let request = ReplayRequest {
                since: TimeArg::Text(since),
                until: until.map(TimeArg::Text),
                function,
                dry_run,
                limit,
                replay_id,
            };
            let report = client(&dir)?.replay(&request).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
                return Ok(());
            }
            // A replay's pairs are in --json; its lines are the counts.
            if report.dry_run {
                for p in &report.pairs {
                    println!("{}", pair_line(p));
                }
            }
            println!("{}", report_summary(&report));
            Ok(())
        }
    }
}

/// The NATS credential whose seed `file` holds, if one is given.
fn nats_seed(file: Option<&std::path::Path>) -> anyhow::Result<Option<htfaas_functions::nats::NatsCredential>> {
    Ok(file.map(htfaas_functions::nats::NatsCredential::from_seed_file).transpose()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("htfaas").chain(args.iter().copied()))
    }

    #[test]
    fn a_lineage_reads_back_from_the_output_to_the_upload() {
        let record = |seq: u64, writer: &str, kind: &str, detail: serde_json::Value| {
            serde_json::from_value::<htfaas_functions::audit::AuditRecord>(serde_json::json!({
                "format": 1, "seq": seq, "time_ms": 1_700_000_000_000u64 + seq, "writer": writer, "kind": kind,
                "actor": null, "subject": {}, "detail": detail, "prev_hash": "00", "hash": "11",
            }))
            .expect("a record")
        };
        let step = |depth: u32, file: &str, job: &str, function: &str, input: &str, caused_by| {
            htfaas_functions::proto::LineageStep {
                depth,
                file: file.into(),
                relation: htfaas_functions::proto::LineageRelation::Wrote,
                job: job.into(),
                function: Some(function.into()),
                function_version: Some(2),
                digest: Some(format!("sha256:{function}")),
                owner: Some("alice".into()),
                token_jti: Some(format!("jti-{job}")),
                event_id: Some(format!("ev-{job}")),
                rule: Some(format!("path glob \"{input}\"")),
                caused_by,
                input: Some(input.into()),
                outputs: vec![file.into()],
                macaroons: vec![format!("rd-{job}"), format!("wr-{job}")],
                records: vec![
                    record(
                        1,
                        "gateway",
                        "event.matched",
                        serde_json::json!({"event": {"source": "dcache", "producer": "pool1@d"}}),
                    ),
                    record(
                        2,
                        "gateway",
                        "token.minted",
                        serde_json::json!({"jobs": 1, "cpus": 1, "memory_mb": 2048, "exp": 99}),
                    ),
                    record(3, "scheduler", "job.dispatched", serde_json::json!({"ep": "ep-1", "attempt": 1})),
                    record(4, "scheduler", "job.finished", serde_json::json!({"state": "completed", "reason": ""})),
                ],
            }
        };
        let cause = htfaas_functions::proto::Cause {
            function: "a".into(),
            digest: htfaas_functions::Digest::of(b"a"),
            event_id: "ev-j1".into(),
            chain: vec!["a".into()],
        };
        let lineage = htfaas_functions::proto::Lineage {
            file: "/out/b/x.sum".into(),
            steps: vec![
                step(0, "/out/b/x.sum", "j2", "b", "/out/a/x.sum", Some(cause)),
                step(1, "/out/a/x.sum", "j1", "a", "/data/x", None),
            ],
            truncated: true,
        };
        let text = lineage_text(&lineage);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "lineage of /out/b/x.sum");
        assert_eq!(lines[1], "  /out/b/x.sum written by job j2 (owner alice)", "{text}");
        for expected in [
            "    event     ev-j2 on /out/a/x.sum from dcache pool1@d",
            "    caused by function a's job on event ev-j1 (chain a)",
            "    function  b@sha256:b v2",
            "    token     jti-j2 (jobs 1, cpus 1, memory 2048 MB, expires 99)",
            "    macaroons rd-j2, wr-j2",
            "    ran on    ep-1 (attempt 1)",
            "    finished  completed",
            "    /out/a/x.sum written by job j1 (owner alice)",
            "      event     ev-j1 on /data/x from dcache pool1@d",
            "      rule      path glob \"/data/x\"",
        ] {
            assert!(lines.contains(&expected), "{expected:?} missing from\n{text}");
        }
        assert!(text.find("job j2").expect("j2") < text.find("job j1").expect("j1"), "newest step first");
        assert!(lines.last().expect("a line").contains("more steps back"), "{text}");
    }

    #[test]
    fn rates_parse_with_an_optional_burst() {
        let r = parse_rate("0.5/4").expect("rate");
        assert_eq!((r.per_s, r.burst), (0.5, 4));
        let r = parse_rate("2").expect("rate");
        assert_eq!((r.per_s, r.burst), (2.0, 1));
        for bad in ["0", "-1", "x", "1/0", "1/x", "inf", "NaN"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        let cli = parse(&[
            "fn",
            "register",
            "f",
            "--wasm",
            "f.wasm",
            "--rule",
            "size > 1",
            "--outputs",
            "/o/",
            "--rate",
            "3/2",
            "--debounce-s",
            "5",
        ])
        .expect("parses");
        let Command::Fn { command: FnCommand::Register { rate, debounce_s, .. } } = cli.command else {
            panic!("register")
        };
        assert_eq!((rate.map(|r| (r.per_s, r.burst)), debounce_s), (Some((3.0, 2)), Some(5)));
    }

    #[test]
    fn ep_with_config_still_runs_an_ep() {
        let cli = parse(&["ep", "--config", "f", "--lifetime", "1h"]).expect("parses");
        let Command::Ep { action: None, config, lifetime, .. } = cli.command else { panic!("not an EP run") };
        assert_eq!(config.as_deref(), Some(Path::new("f")));
        assert_eq!(lifetime, Some(3600));
        // Without a subcommand --config is required, as before; and it does not mix with one.
        let e = parse(&["ep"]).err().expect("refused");
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert!(parse(&["ep", "--config", "f", "drain", "n", "--reason", "r"]).is_err());
    }

    #[test]
    fn ep_actions_parse_with_their_options() {
        let cli = parse(&["ep", "drain", "n", "--reason", "r", "--deadline", "2h"]).expect("parses");
        let Command::Ep { action: Some(EpCommand::Drain { name, deadline, reason, .. }), config: None, .. } =
            cli.command
        else {
            panic!("not a drain")
        };
        assert_eq!((name.as_str(), deadline, reason.as_str()), ("n", Some(7200), "r"));
        let cli = parse(&["ep", "pause", "n", "--group", "g", "--reason", "r", "--dir", "d"]).expect("parses");
        let Command::Ep { action: Some(EpCommand::Pause { dir, group, .. }), .. } = cli.command else {
            panic!("not a pause")
        };
        assert_eq!((dir.dir.as_path(), group.as_str()), (Path::new("d"), "g"));
        assert!(parse(&["ep", "pause", "n", "--reason", "r"]).is_err(), "pause needs --group");
        assert!(parse(&["ep", "disable", "n"]).is_err(), "actions need --reason");
        assert!(parse(&["ep", "list", "--json"]).is_ok());
    }

    #[test]
    fn jobs_and_accounting_subcommands_take_dir_and_json_on_either_side() {
        for args in
            [&["jobs", "history", "j1", "--json", "--dir", "d"][..], &["jobs", "--dir", "d", "--json", "analyze", "j1"]]
        {
            let cli = parse(args).expect("parses");
            let Command::Jobs {
                dir,
                json: true,
                action: Some(JobsCommand::History { id } | JobsCommand::Analyze { id }),
            } = cli.command
            else {
                panic!("{args:?}")
            };
            assert_eq!((dir.dir.as_path(), id.as_str()), (Path::new("d"), "j1"));
        }
        let cli = parse(&["accounting", "set-factor", "alice", "2.5", "--dir", "d"]).expect("parses");
        let Command::Accounting { dir, action: Some(AccountingCommand::SetFactor { owner, factor }), .. } = cli.command
        else {
            panic!("not set-factor")
        };
        assert_eq!((dir.dir.as_path(), owner.as_str(), factor), (Path::new("d"), "alice", 2.5));
        assert!(parse(&["accounting", "set-factor", "alice", "NaN"]).is_err());
        let cli = parse(&["accounting", "--usage", "--json"]).expect("parses");
        assert!(matches!(cli.command, Command::Accounting { usage: true, json: true, action: None, .. }));
    }

    #[test]
    fn accounting_reports_take_a_key_a_range_a_period_and_a_format() {
        use htfaas_functions::proto::AccountingBy;
        let cli = parse(&["accounting", "--by", "group", "--since", "-2h", "--until", "1795341600", "--period", "1d"])
            .expect("parses");
        let Command::Accounting { by: Some(by), since, until, period, csv: false, json: false, action: None, .. } =
            cli.command
        else {
            panic!("not a report")
        };
        assert_eq!(by, AccountingBy::Group);
        assert_eq!((since.as_deref(), until.as_deref(), period), (Some("-2h"), Some("1795341600"), Some(86_400)));
        let cli = parse(&["accounting", "--by", "function", "--csv", "--dir", "d"]).expect("parses");
        assert!(matches!(cli.command, Command::Accounting { by: Some(AccountingBy::Function), csv: true, .. }));
        assert!(parse(&["accounting", "--by", "site"]).is_err(), "unknown key");
        assert!(parse(&["accounting", "--since", "-2h"]).is_err(), "--since needs --by");
        assert!(parse(&["accounting", "--by", "owner", "--csv", "--json"]).is_err(), "one format");
        assert!(parse(&["accounting", "--by", "owner", "--usage"]).is_err());
        assert!(parse(&["accounting", "--by", "owner", "--period", "0"]).is_err(), "a period of 0");
        assert!(parse(&["accounting", "--by", "owner", "--since", "yesterday"]).is_err());
    }

    #[test]
    fn ep_drain_timeout_defaults_to_an_hour() {
        let cli = parse(&["ep", "--config", "f"]).expect("parses");
        let Command::Ep { drain_timeout, .. } = cli.command else { panic!("not an EP run") };
        assert_eq!(drain_timeout, 3600);
        let cli = parse(&["ep", "--config", "f", "--drain-timeout", "8h"]).expect("parses");
        let Command::Ep { drain_timeout, .. } = cli.command else { panic!("not an EP run") };
        assert_eq!(drain_timeout, 8 * 3600);
    }

    #[test]
    fn ep_lines_show_disk_and_labels() {
        use htfaas_functions::proto::{EpAdminState, EpInfo};
        let total = Resources { cpus: 8, memory_mb: 30000, runtime_s: 3600, gpus: 2, disk_mb: 102400 };
        let free = Resources { cpus: 6, memory_mb: 28000, runtime_s: 3600, gpus: 1, disk_mb: 51200 };
        let ep = EpInfo {
            name: "ep-1".into(),
            session: Some("s1".into()),
            address: None,
            annex: None,
            owner: None,
            total,
            free,
            running: vec!["j1".into(), "j2".into()],
            state: EpAdminState::Draining,
            drain_deadline_ms: None,
            paused_groups: vec![],
            reason: String::new(),
            labels: [("arch".to_owned(), "x86_64".to_owned()), ("site".to_owned(), "desy".to_owned())].into(),
        };
        let line = ep_line(&ep);
        assert!(line.starts_with("ep-1 "), "{line}");
        assert!(line.contains("draining"), "{line}");
        assert!(line.contains("6/8cpu 28000/30000MiB 1/2gpu 50/100GiB"), "{line}");
        assert!(line.ends_with(" arch=x86_64,site=desy"), "{line}");
        let bare = EpInfo { labels: Default::default(), ..ep };
        assert!(ep_line(&bare).ends_with(" -"));
        assert!(ep_header().ends_with("OWNER        LABELS"));
    }

    #[test]
    fn events_replay_and_fn_test_parse_with_their_options() {
        let cli = parse(&["events", "replay", "--since", "-2h", "--function", "a", "--dry-run", "--limit", "5"])
            .expect("parses");
        let Command::Events {
            command: EventsCommand::Replay { since, until: None, function, dry_run: true, limit: Some(5), .. },
        } = cli.command
        else {
            panic!("not a dry-run replay")
        };
        assert_eq!((since.as_str(), function.as_deref()), ("-2h", Some("a")));
        assert!(parse(&["events", "replay", "--since", "2026-11-22T10:00:00Z", "--until", "1795345200"]).is_ok());
        assert!(parse(&["events", "replay"]).is_err(), "--since is required");
        assert!(parse(&["events", "replay", "--since", "yesterday"]).is_err(), "times are checked");
        assert!(parse(&["events", "replay", "--since", "-1h", "--dry-run", "--replay-id", "x"]).is_err());

        let cli =
            parse(&["fn", "test", "a", "--event", "e.json", "--header", "ce-id=1", "--subject", "s"]).expect("parses");
        let Command::Fn { command: FnCommand::Test { name, event: Some(_), seq: None, headers, .. } } = cli.command
        else {
            panic!("not a test")
        };
        assert_eq!((name.as_str(), headers), ("a", vec![("ce-id".to_owned(), "1".to_owned())]));
        assert!(parse(&["fn", "test", "a", "--seq", "7"]).is_ok());
        assert!(parse(&["fn", "test", "a"]).is_err(), "an event or a seq");
        assert!(parse(&["fn", "test", "a", "--seq", "7", "--event", "e"]).is_err());

        let register = ["fn", "register", "b", "--wasm", "m.wasm", "--trigger", "/data/**", "--outputs", "/o/"];
        let cli =
            parse(&[&register[..], &["--dry-run", "--since", "-1d", "--rule", "size > 1"]].concat()).expect("parses");
        let Command::Fn { command: FnCommand::Register { dry_run: true, since, rule, .. } } = cli.command else {
            panic!("not a dry-run registration")
        };
        assert_eq!((since.as_deref(), rule.as_deref()), (Some("-1d"), Some("size > 1")));
        assert!(parse(&[&register[..], &["--since", "-1d"]].concat()).is_err(), "--since needs --dry-run");
    }

    #[test]
    fn replay_reports_print_one_line_per_pair_and_the_counts() {
        use htfaas_functions::proto::{Pair, Report};
        let pair = Pair {
            seq: 12,
            recorded: "2026-11-22T10:00:00.000Z".into(),
            event_id: "dcache-billing:write:0000BEEF/s".into(),
            path: "/data/raw/a.h5".into(),
            kind: "write".into(),
            msg_type: "transfer".into(),
            time: None,
            function: "a".into(),
            version: 2,
            fired: None,
        };
        assert_eq!(
            pair_line(&pair),
            "      12 2026-11-22T10:00:00.000Z a@2 write transfer /data/raw/a.h5 dcache-billing:write:0000BEEF/s"
        );
        let report = Report {
            dry_run: false,
            replay_id: Some("r1".into()),
            since: "2026-11-22T08:00:00.000Z".into(),
            scanned: 5,
            parsed: 4,
            malformed: 1,
            matched: 3,
            fired: 3,
            stopped: Some("the limit of 5 messages".into()),
            resume_since: Some("2026-11-22T09:00:00.000Z".into()),
            ..Report::default()
        };
        assert_eq!(
            report_summary(&report),
            "scanned 5 since 2026-11-22T08:00:00.000Z (events 4, ignored 0, not enabled 0, malformed 1); 3 pairs \
             matched; replay r1: fired 3, failures 0\nstopped early at the limit of 5 messages; continue with \
             --since 2026-11-22T09:00:00.000Z --replay-id r1"
        );
    }

    #[test]
    fn audit_parses_filters_and_verify_with_its_options() {
        let cli = parse(&["audit", "--job", "j1", "--file", "/a", "--since", "-2h", "--limit", "5", "--json"])
            .expect("parses");
        let Command::Audit { action: None, job, file, since, limit: Some(5), json: true, .. } = cli.command else {
            panic!("not an audit query")
        };
        assert_eq!((job.as_deref(), file.as_deref(), since.as_deref()), (Some("j1"), Some("/a"), Some("-2h")));
        let cli =
            parse(&["audit", "verify", "--file", "copy.sqlite", "--keys", "k.json", "--dir", "d"]).expect("parses");
        let Command::Audit {
            dir,
            action: Some(AuditCommand::Verify { file: Some(_), keys: Some(_), head: None, json: false }),
            ..
        } = cli.command
        else {
            panic!("not an offline verify")
        };
        assert_eq!(dir.dir.as_path(), Path::new("d"));
        assert!(parse(&["audit", "verify", "--json"]).is_ok());
        assert!(parse(&["audit", "verify", "--file", "copy.sqlite"]).is_err(), "--file needs --keys");
        assert!(parse(&["audit", "verify", "--expect-head", "3:ab"]).is_err(), "--expect-head needs --file");
        assert!(parse(&["audit", "head", "--file", "copy.sqlite"]).is_ok());
        assert!(parse(&["audit", "--job", "j", "verify"]).is_err(), "filters do not go with verify");
        assert!(parse(&["audit", "--since", "yesterday"]).is_err(), "times are checked");
    }

    #[test]
    fn audit_records_print_as_one_line() {
        use htfaas_functions::audit::{AuditKind, AuditRecord, Subject};
        let r = AuditRecord {
            format: 1,
            seq: 7,
            time_ms: 1_740_830_400_250,
            writer: "scheduler".into(),
            kind: AuditKind::JobDispatched,
            actor: None,
            subject: Subject {
                job: Some("j1".into()),
                owner: Some("alice".into()),
                paths: vec!["/data/raw/a.dat".into()],
                ..Subject::default()
            },
            detail: serde_json::json!({"ep": "ep-1", "session": "s", "attempt": 2}),
            prev_hash: String::new(),
            hash: String::new(),
        };
        assert_eq!(
            audit_line(&r),
            "     7 2025-03-01T12:00:00.250Z job.dispatched  -          job=j1 owner=alice paths=/data/raw/a.dat -- \
             ep=ep-1 attempt=2"
        );
    }

    #[test]
    fn unix_ms_is_formatted_as_utc() {
        assert_eq!(fmt_unix_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(fmt_unix_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(fmt_unix_ms(1_740_830_400_250), "2025-03-01T12:00:00.250Z");
    }
}
