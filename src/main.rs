//! `htfaas`: one binary, one subcommand per role.
//!
//! `up` runs the whole local stack; `storage`, `scheduler`, `gateway` and `ep` run one
//! component from a JSON config file; `put`, `get`, `fn`, `jobs`, `ep list|drain|…`,
//! `accounting`, `events`, `annex` and `audit` talk to a stack started with `up` (found through `--dir`
//! or `HTFAAS_DIR`); `audit verify --file F --keys K` checks a copied trail without one.
//!
//! This file is the command line and the dispatch: each command group's arguments and what it
//! does are in `cli/` (one module per group), everything printed in `cli::output`.

mod cli;

/// Every role's allocator: mimalloc (also behind `malloc`, for the bundled SQLite). A job's
/// path allocates and frees many small buffers across threads (frames, JSON, SQL rows), where
/// glibc's allocator cost a tenth of each process's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use cli::{
    accounting, annex, args, audit, bridge, dlq, ep, events, files, fn_cmd, harness, image, jobs, login, logs, map, ns,
    serve, submit, token, trace, up,
};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "htfaas", version, about = "Event-driven functions on a high-throughput-computing backend")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// Parsed once per process: boxing `Fn` (its `register` has many flags) would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Benchmark the whole path on a fresh local stack against the peer (Parsl's
    /// HighThroughputExecutor) on this machine; one JSON line per figure (see BENCHMARKS.md).
    Bench(harness::BenchArgs),
    /// The crash harness: the stack as five processes under a stream of events, each process
    /// killed (SIGKILL) at a random moment and started again; then checks that every event ran
    /// each function exactly once, every output is right, accounting equals the job records
    /// and both audit trails verify. Prints the counts and each kill's recovery time; fails
    /// unless every check holds. `--long`: one job of minutes through a scheduler restart, an
    /// EP link cut, attach-token renewals and a move to another EP from its checkpoint.
    CrashTest(harness::CrashTestArgs),
    /// The multi-host harness: a site of network namespaces (a 3-node NATS cluster with the
    /// events stream at 3 replicas, the storage, the scheduler and gateway, EPs attached over
    /// TLS) under a stream of events while a NATS node dies, an EP host's link is cut and the
    /// service host restarts; then the crash harness's checks, and the `ip:`-bound macaroons'
    /// documented failure behind a NAT. Needs root.
    ClusterTest(harness::ClusterTestArgs),
    /// One owner publishes a flood of events at once, then another owner one event: prints how
    /// long that event waited (and how many of the flood's jobs started ahead of it), the HTTP
    /// API's latency and each process's memory under the flood.
    Overload(harness::OverloadArgs),
    /// Run the local stack in the foreground (nats-server, storage, scheduler, gateway, one EP).
    Up(up::UpArgs),
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
    // Running an EP (`ep --config F`) keeps its shape: the flags of `ep::EpArgs` conflict with
    // its subcommands, and `--config` is required only when no subcommand is given.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Ep(ep::EpArgs),
    /// Save a remote site as a profile: its gateway's URL, an API token, its CA (checked first);
    /// every command then works against it with `--profile` (or alone, as `default`).
    Login(login::LoginArgs),
    /// The local stack's logs (each component's file under <dir>/logs), or one component's;
    /// -f follows them.
    Logs(logs::LogsArgs),
    /// Who the credential acts as (owner and scope), and where.
    Whoami {
        #[command(flatten)]
        dir: args::DirArg,
    },
    /// Upload a local file to storage: as the stack's user, or, with a profile, through a
    /// credential the gateway gives for the file's directory in the caller's write namespace.
    Put(files::PutArgs),
    /// Write a storage file to stdout (with a profile: a credential for that file in the
    /// caller's read namespace).
    Get(files::GetArgs),
    /// Manage functions.
    Fn {
        #[command(subcommand)]
        command: fn_cmd::FnCommand,
    },
    /// Native functions' images: build (mmdebstrap), push, list, show, delete.
    Image {
        #[command(subcommand)]
        command: image::ImageCommand,
    },
    /// Namespaces (admin): where each owner (or group:NAME) may trigger on and read files,
    /// write and replace outputs, and which annexes its jobs may ask for; grant, revoke, list.
    Ns {
        #[command(subcommand)]
        command: ns::NsCommand,
    },
    /// The site's identity map (the gateway's `identity_map`): `map test` shows which rule an
    /// identity (token claims, or a token's) matches and the owner, groups and grants it gives;
    /// `map identities` and `map unbind` (admin) list and free the owners bound to identities.
    Map {
        #[command(subcommand)]
        command: map::MapCommand,
    },
    /// List jobs, newest first; or show one's history or analysis; or hold, release or remove one.
    Jobs(jobs::JobsArgs),
    /// The dead-letter list: firings that could not become jobs and jobs that failed; list,
    /// show, re-drive or drop entries.
    Dlq(dlq::DlqArgs),
    /// One event's trace: each job's hops (gateway, queue, attempts on EPs) and each attempt's
    /// phases, from a job id, an event id or a trace id.
    Trace(trace::TraceArgs),
    /// Fair-share priorities of owners and groups (`condor_userprio`); usage per owner with
    /// --usage; a report per owner, group or function (and period) with --by; or set an
    /// owner's priority factor.
    Accounting(accounting::AccountingArgs),
    /// Annexes (admin): EPs provisioned through Slurm for an owner and a lifetime, attaching
    /// back with a token bound to the annex and the owner (after HTCondor's `condor_annex`);
    /// create, list, show, extend, delete.
    Annex {
        #[command(subcommand)]
        command: annex::AnnexCommand,
    },
    /// Mint tokens with the local stack's keys (admin).
    Token {
        #[command(subcommand)]
        command: token::TokenCommand,
    },
    /// Run a registered function on a storage file with a submit token (exits non-zero with the
    /// reason when refused).
    Submit(submit::SubmitArgs),
    /// Storage events.
    Events {
        #[command(subcommand)]
        command: events::EventsCommand,
    },
    /// Bridge a storage system's own event channel to NATS (XRootD notify, dCache SSE, dCache Kafka).
    Bridge {
        #[command(subcommand)]
        command: bridge::BridgeCommand,
    },
    /// The audit trails (the gateway's and the scheduler's): the records every given condition
    /// selects, one line each (trail, seq, time, kind, actor, subject), in time order; `--file`
    /// alone prints the file's lineage (the jobs that wrote and read it, back to the first
    /// upload: event, rule, function@digest, token, macaroons, job, outputs); or `audit verify`.
    #[command(args_conflicts_with_subcommands = true)]
    Audit(audit::AuditArgs),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // A quiet `htfaas up` writes each component's log to a file; everything else logs to stderr.
    match &cli.command {
        Command::Up(up) if !up.verbose => {
            if let Err(e) = logs::init_files(&up.dir.dir) {
                eprintln!("error: {e:#}");
                return std::process::ExitCode::FAILURE;
            }
        }
        _ => logs::init_stderr(),
    }
    match execute(cli.command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The reason and its causes on one line; no backtrace, even with RUST_BACKTRACE set.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs a component as a task on a runtime worker rather than in `block_on` on the main thread.
/// There, every wake-up of its own future (an EP's link reading a frame, a job's end coming back
/// to it) would be a hand-off from the worker that saw it to the main thread and back; on a
/// worker, a task it wakes mostly runs where it was woken.
async fn on_worker(run: impl Future<Output = anyhow::Result<()>> + Send + 'static) -> anyhow::Result<()> {
    match tokio::spawn(run).await {
        Ok(outcome) => outcome,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(anyhow::anyhow!("the component's task ended early: {e}")),
    }
}

async fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Bench(args) => harness::bench(args).await,
        Command::CrashTest(args) => harness::crash_test(args).await,
        Command::ClusterTest(args) => harness::cluster_test(args).await,
        Command::Overload(args) => harness::overload(args).await,
        Command::Up(args) => up::run(args).await,
        Command::Storage { config } => on_worker(async move { serve::storage(&config).await }).await,
        Command::Scheduler { config } => on_worker(async move { serve::scheduler(&config).await }).await,
        Command::Gateway { config } => on_worker(async move { serve::gateway(&config).await }).await,
        Command::Ep(args) => on_worker(ep::run(args)).await,
        Command::Login(args) => login::login(args).await,
        Command::Logs(args) => logs::run(args).await,
        Command::Whoami { dir } => login::whoami(dir).await,
        Command::Put(args) => files::put(args).await,
        Command::Get(args) => files::get(args).await,
        Command::Fn { command } => fn_cmd::run(command).await,
        Command::Image { command } => image::run(command).await,
        Command::Ns { command } => ns::run(command).await,
        Command::Map { command } => map::run(command).await,
        Command::Jobs(args) => jobs::run(args).await,
        Command::Dlq(args) => dlq::run(args).await,
        Command::Trace(args) => trace::run(args).await,
        Command::Accounting(args) => accounting::run(args).await,
        Command::Annex { command } => annex::run(command).await,
        Command::Token { command } => token::run(command).await,
        Command::Submit(args) => submit::run(args).await,
        Command::Events { command } => events::run(command).await,
        Command::Bridge { command } => bridge::run(command).await,
        Command::Audit(args) => audit::run(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::accounting::{AccountingArgs, AccountingCommand};
    use crate::cli::audit::{AuditArgs, AuditCommand};
    use crate::cli::ep::{EpArgs, EpCommand};
    use crate::cli::events::EventsCommand;
    use crate::cli::fn_cmd::{FnCommand, parse_rate};
    use crate::cli::jobs::{JobsArgs, JobsCommand};
    use std::path::Path;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("htfaas").chain(args.iter().copied()))
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
        let Command::Ep(EpArgs { action: None, config, lifetime, .. }) = cli.command else { panic!("not an EP run") };
        assert_eq!(config.as_deref(), Some(Path::new("f")));
        assert_eq!(lifetime, Some(3600));
        // Without a subcommand --config is required, as before; and it does not mix with one.
        let e = parse(&["ep"]).err().expect("refused");
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert!(parse(&["ep", "--config", "f", "drain", "n", "--reason", "r"]).is_err());
    }

    #[test]
    fn crash_test_long_takes_its_steps_and_not_the_streams_flags() {
        let cli = parse(&["crash-test", "--long", "--steps", "120"]).expect("parses");
        let Command::CrashTest(args) = cli.command else { panic!("not crash-test") };
        assert_eq!((args.long, args.steps), (true, Some(120)));
        assert!(parse(&["crash-test", "--steps", "120"]).is_err(), "--steps is for --long");
        assert!(parse(&["crash-test", "--long", "--events", "10"]).is_err(), "no stream with --long");
        assert!(parse(&["crash-test", "--events", "10"]).is_ok());
    }

    #[test]
    fn ep_actions_parse_with_their_options() {
        let cli = parse(&["ep", "drain", "n", "--reason", "r", "--deadline", "2h"]).expect("parses");
        let Command::Ep(EpArgs { action: Some(EpCommand::Drain { name, deadline, reason, .. }), config: None, .. }) =
            cli.command
        else {
            panic!("not a drain")
        };
        assert_eq!((name.as_str(), deadline, reason.as_str()), ("n", Some(7200), "r"));
        let cli = parse(&["ep", "pause", "n", "--group", "g", "--reason", "r", "--dir", "d"]).expect("parses");
        let Command::Ep(EpArgs { action: Some(EpCommand::Pause { dir, group, .. }), .. }) = cli.command else {
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
            let Command::Jobs(JobsArgs {
                dir,
                json: true,
                action: Some(JobsCommand::History { id } | JobsCommand::Analyze { id }),
            }) = cli.command
            else {
                panic!("{args:?}")
            };
            assert_eq!((dir.dir.as_path(), id.as_str()), (Path::new("d"), "j1"));
        }
        let cli = parse(&["accounting", "set-factor", "alice", "2.5", "--dir", "d"]).expect("parses");
        let Command::Accounting(AccountingArgs {
            dir,
            action: Some(AccountingCommand::SetFactor { owner, factor }),
            ..
        }) = cli.command
        else {
            panic!("not set-factor")
        };
        assert_eq!((dir.dir.as_path(), owner.as_str(), factor), (Path::new("d"), "alice", 2.5));
        assert!(parse(&["accounting", "set-factor", "alice", "NaN"]).is_err());
        let cli = parse(&["accounting", "--usage", "--json"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Accounting(AccountingArgs { usage: true, json: true, action: None, .. })
        ));
    }

    #[test]
    fn accounting_reports_take_a_key_a_range_a_period_and_a_format() {
        use htfaas_functions::proto::AccountingBy;
        let cli = parse(&["accounting", "--by", "group", "--since", "-2h", "--until", "1795341600", "--period", "1d"])
            .expect("parses");
        let Command::Accounting(AccountingArgs {
            by: Some(by),
            since,
            until,
            period,
            csv: false,
            json: false,
            action: None,
            ..
        }) = cli.command
        else {
            panic!("not a report")
        };
        assert_eq!(by, AccountingBy::Group);
        assert_eq!((since.as_deref(), until.as_deref(), period), (Some("-2h"), Some("1795341600"), Some(86_400)));
        let cli = parse(&["accounting", "--by", "function", "--csv", "--dir", "d"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Accounting(AccountingArgs { by: Some(AccountingBy::Function), csv: true, .. })
        ));
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
        let Command::Ep(EpArgs { drain_timeout, .. }) = cli.command else { panic!("not an EP run") };
        assert_eq!(drain_timeout, 3600);
        let cli = parse(&["ep", "--config", "f", "--drain-timeout", "8h"]).expect("parses");
        let Command::Ep(EpArgs { drain_timeout, .. }) = cli.command else { panic!("not an EP run") };
        assert_eq!(drain_timeout, 8 * 3600);
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
    fn audit_parses_filters_and_verify_with_its_options() {
        let cli = parse(&["audit", "--job", "j1", "--file", "/a", "--since", "-2h", "--limit", "5", "--json"])
            .expect("parses");
        let Command::Audit(AuditArgs { action: None, job, file, since, limit: Some(5), json: true, .. }) = cli.command
        else {
            panic!("not an audit query")
        };
        assert_eq!((job.as_deref(), file.as_deref(), since.as_deref()), (Some("j1"), Some("/a"), Some("-2h")));
        let cli =
            parse(&["audit", "verify", "--file", "copy.sqlite", "--keys", "k.json", "--dir", "d"]).expect("parses");
        let Command::Audit(AuditArgs {
            dir,
            action: Some(AuditCommand::Verify { file: Some(_), keys: Some(_), head: None, json: false }),
            ..
        }) = cli.command
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
}
