//! `htfaas jobs`: list jobs, or one job's log, history or analysis, or hold, release or remove
//! it. Must not know: how jobs are printed ([`super::output`]).

use super::args::{DirArg, client};
use super::output;
use clap::Subcommand;

// The flags of `htfaas jobs`.
#[derive(clap::Args)]
pub struct JobsArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// Act on one job instead of listing.
    #[command(subcommand)]
    pub action: Option<JobsCommand>,
}

#[derive(Subcommand)]
pub enum JobsCommand {
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

/// `htfaas jobs …`.
pub async fn run(args: JobsArgs) -> anyhow::Result<()> {
    match args {
        JobsArgs { dir, json, action: Some(action) } => {
            let (verb, id, reason) = match action {
                JobsCommand::History { id } => return job_history(&dir, &id, json).await,
                JobsCommand::Log { id } => {
                    let log = client(&dir)?.job_log(&id).await?;
                    return output::job_log(&log, json);
                }
                JobsCommand::Analyze { id } => return job_analyze(&dir, &id, json).await,
                JobsCommand::Hold { id, reason } => ("hold", id, reason),
                JobsCommand::Release { id, reason } => ("release", id, reason),
                JobsCommand::Rm { id, reason } => ("remove", id, reason),
            };
            let job = client(&dir)?.job_action(&id, verb, &reason).await?;
            output::job(&job, json)
        }
        JobsArgs { dir, json, action: None } => {
            let jobs = client(&dir)?.jobs().await?;
            output::jobs(&jobs, json)
        }
    }
}

/// `htfaas jobs history ID`.
async fn job_history(dir: &DirArg, id: &str, json: bool) -> anyhow::Result<()> {
    let attempts = client(dir)?.job_history(id).await?;
    output::job_history(&attempts, json)
}

/// `htfaas jobs analyze ID`.
async fn job_analyze(dir: &DirArg, id: &str, json: bool) -> anyhow::Result<()> {
    let analysis = client(dir)?.job_analyze(id).await?;
    output::job_analysis(&analysis, json)
}
