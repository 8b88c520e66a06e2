//! The provider interface: whoever starts an annex's EPs as batch jobs ([`Provider`]). Slurm is
//! the first real one ([`super::slurm`]); an HTCondor pool (`condor_submit` of the same script)
//! or Kubernetes (a Job per EP, the token in a Secret) would be others.
//!
//! A provider is told what to start ([`Launch`]: the job script, the resources, the time limit)
//! and the secret environment the jobs get (the attach token), which it must pass in the jobs'
//! environment only — never in an argument (visible in `ps`) or a file others may read. It
//! answers job ids, which htfaas records with the annex and later asks it about.
//!
//! Must not know: htfaas's HTTP API, the scheduler, what the script does.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// What the batch jobs of one annex are.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The annex (for the job's name).
    pub annex: String,
    /// Jobs to start, one EP each.
    pub count: u32,
    /// Cores per job.
    pub cpus: u32,
    /// Memory per job, MiB.
    pub memory_mb: u64,
    /// Each job's time limit: the batch system ends it then, whatever it does.
    pub time_limit: Duration,
    /// The batch system's partition (queue); none: its default.
    pub partition: Option<String>,
    /// The job script (bash), the same for every job; it holds no secret.
    pub script: String,
    /// Where each job's standard output and error go (one file per job, named after the annex
    /// and the job id); none: nowhere.
    pub log_dir: Option<PathBuf>,
    /// The job's working directory; none: the provider's default.
    pub work_dir: Option<PathBuf>,
}

/// Where a batch job is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "detail")]
pub enum BatchState {
    /// Waiting to start (the provider's reason, when it gives one).
    Pending(String),
    /// Running.
    Running,
    /// Ending: its processes are being stopped.
    Ending,
    /// Over, in the provider's words (`COMPLETED`, `CANCELLED`, `TIMEOUT`, `FAILED`, …).
    Done(String),
    /// The provider no longer knows it (ended and forgotten).
    Gone,
    /// A state this code does not know, as the provider named it.
    Other(String),
}

impl BatchState {
    /// Whether the job still holds (or waits for) resources.
    pub fn is_live(&self) -> bool {
        matches!(self, BatchState::Pending(_) | BatchState::Running | BatchState::Ending | BatchState::Other(_))
    }
}

/// One batch job as the provider sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BatchJob {
    /// Its id.
    pub id: String,
    /// Where it is.
    pub state: BatchState,
    /// How long it has run.
    pub elapsed_s: Option<u64>,
    /// Its time limit now.
    pub time_limit_s: Option<u64>,
}

/// Why a provider could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// A command could not be run at all.
    #[error("run {command}: {source}")]
    Spawn {
        /// The command.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// A command ran and refused.
    #[error("{command} failed ({status}): {stderr}")]
    Refused {
        /// The command.
        command: String,
        /// Its exit status.
        status: String,
        /// What it said (trimmed, bounded).
        stderr: String,
    },
    /// A command's answer was not what it should be.
    #[error("{command}: unexpected output: {detail}")]
    Output {
        /// The command.
        command: String,
        /// What was wrong.
        detail: String,
    },
    /// Some jobs were started before a submission failed: they are named, so that they can be
    /// recorded and removed.
    #[error("started {} job(s) ({}) before: {source}", started.len(), started.join(", "))]
    Partial {
        /// The jobs that were started.
        started: Vec<String>,
        /// Why the next one was not.
        source: Box<ProviderError>,
    },
}

/// Who starts, reports on, extends and stops an annex's batch jobs. Blocking (each call runs
/// the batch system's commands); callers run it off the async threads.
pub trait Provider: Send + Sync {
    /// Its name, as recorded with the annex (`slurm`).
    fn name(&self) -> &'static str;

    /// The environment variable that holds a running job's id (what the script names its EP
    /// after), e.g. `SLURM_JOB_ID`.
    fn job_id_var(&self) -> &'static str;

    /// Starts `launch.count` jobs running `launch.script`, each with `secret_env` in its
    /// environment (and nowhere else); their ids, in order. When some were started before one
    /// failed: [`ProviderError::Partial`].
    fn submit(&self, launch: &Launch, secret_env: &[(&str, &str)]) -> Result<Vec<String>, ProviderError>;

    /// Where each of `jobs` is; a job the provider does not know is [`BatchState::Gone`].
    fn states(&self, jobs: &[String]) -> Result<BTreeMap<String, BatchJob>, ProviderError>;

    /// Gives each live job of `jobs` until `lifetime` from now to run (its time limit becomes its
    /// run time so far plus `lifetime`), adding no job; the ids changed.
    fn extend(&self, jobs: &[String], lifetime: Duration) -> Result<Vec<String>, ProviderError>;

    /// Stops `jobs` (those still live).
    fn cancel(&self, jobs: &[String]) -> Result<(), ProviderError>;
}
