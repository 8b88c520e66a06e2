//! `htfaas ep`: run an execution point (`--config`, through [`super::serve`]), or list the
//! stack's EPs and drain, disable, enable, pause or resume one (admin). Must not know: how EPs are
//! printed ([`super::output`]).

use super::args::{DirArg, client, parse_duration_s};
use super::{output, serve};
use clap::Subcommand;
use std::path::PathBuf;

// The flags of `htfaas ep`: running one, or (with a subcommand) managing them.
#[derive(clap::Args)]
pub struct EpArgs {
    /// Manage the stack's EPs instead of running one.
    #[command(subcommand)]
    pub action: Option<EpCommand>,
    /// The EP's config file.
    #[arg(long, required = true)]
    pub config: Option<PathBuf>,
    /// Leave (drain, then exit) this long after start, e.g. 1h.
    #[arg(long, value_parser = parse_duration_s)]
    pub lifetime: Option<u64>,
    /// Leave after running no job for this long, e.g. 5m.
    #[arg(long, value_parser = parse_duration_s)]
    pub idle_shutdown: Option<u64>,
    /// The annex this EP joins; must be the one its attach token names.
    #[arg(long)]
    pub annex: Option<String>,
    /// On SIGTERM the EP drains: it tells the scheduler, takes no new job, and waits this
    /// long for running jobs to finish and be reported, then cancels what still runs and
    /// exits. SIGINT (Ctrl-C) or a second SIGTERM stops at once: running jobs are
    /// cancelled and run again elsewhere. Give a service manager at least this long
    /// (systemd `TimeoutStopSec`, Kubernetes `terminationGracePeriodSeconds`).
    #[arg(long, default_value = "1h", value_parser = parse_duration_s)]
    pub drain_timeout: u64,
}

#[derive(Subcommand)]
pub enum EpCommand {
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

/// `htfaas ep …`.
pub async fn run(args: EpArgs) -> anyhow::Result<()> {
    match args {
        EpArgs { action: Some(action), .. } => ep_command(action).await,
        EpArgs { action: None, config, lifetime, idle_shutdown, annex, drain_timeout } => {
            serve::ep(config, lifetime, idle_shutdown, annex, drain_timeout).await
        }
    }
}

/// `htfaas ep list|drain|disable|enable|pause|resume`.
async fn ep_command(command: EpCommand) -> anyhow::Result<()> {
    use htfaas_functions::proto::EpAction;
    let action = |reason: String| EpAction { reason, deadline_s: None, group: None };
    let (dir, name, verb, body) = match command {
        EpCommand::List { dir, json } => {
            let eps = client(&dir)?.eps().await?;
            return output::eps(&eps, json);
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
    output::ep(&ep);
    Ok(())
}
