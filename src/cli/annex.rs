//! `htfaas annex create|list|show|extend|delete` (admin): EPs provisioned through a
//! batch system (`--slurm`) for an owner and a lifetime, attaching back with one token bound to
//! the annex and the owner. The work is [`htfaas::annex`]'s; this module reads the flags (and
//! `SLURM_CONF` from the environment) and prints through [`super::output`].
//!
//! Must not know: how the batch system is driven, how anything is printed.

use super::args::{DirArg, client, parse_duration_s};
use super::output;
use anyhow::{Context as _, bail};
use clap::Subcommand;
use htfaas::annex::provider::Provider;
use htfaas::annex::slurm::Slurm;
use htfaas_functions::proto::AnnexRequest;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the Slurm client finds its cluster.
#[derive(clap::Args, Clone)]
pub struct SlurmArgs {
    /// The cluster's slurm.conf, given to every Slurm command as SLURM_CONF. Default: the
    /// SLURM_CONF environment variable, else /etc/slurm/slurm.conf.
    #[arg(long, env = "SLURM_CONF", global = true)]
    pub slurm_conf: Option<PathBuf>,
}

impl SlurmArgs {
    fn slurm(&self) -> Slurm {
        Slurm::new(self.slurm_conf.clone().unwrap_or_else(|| PathBuf::from("/etc/slurm/slurm.conf")))
    }

    /// The provider to ask about batch jobs, when this machine has a Slurm configuration.
    fn optional(&self) -> Option<Arc<dyn Provider>> {
        let slurm = self.slurm();
        slurm.conf.exists().then(|| Arc::new(slurm) as Arc<dyn Provider>)
    }
}

/// The flags of `htfaas annex create`.
#[derive(clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    dir: DirArg,
    #[command(flatten)]
    slurm_args: SlurmArgs,
    /// The annex name (what functions ask for with `fn register --annex`).
    name: String,
    /// Provision through Slurm (`sbatch`); the only provider so far.
    #[arg(long, required = true)]
    slurm: bool,
    /// Whose annex: its EPs run this owner's jobs (asking for the annex) only. Default: the
    /// stack's user.
    #[arg(long)]
    owner: Option<String>,
    /// EPs (batch jobs).
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Cores per EP.
    #[arg(long, default_value_t = 1)]
    cpus: u32,
    /// Memory per batch job: MiB, or with M or G (e.g. 4G); the EP advertises a tenth less
    /// (at least 256 MiB less), kept for itself.
    #[arg(long, default_value = "2048", value_parser = parse_memory_mb)]
    memory: u64,
    /// How long the annex lives (e.g. 2h): the batch jobs' time limit.
    #[arg(long, value_parser = parse_duration_s)]
    lifetime: u64,
    /// An EP leaves (and its batch job ends) after running no job this long (e.g. 5m).
    #[arg(long, value_parser = parse_duration_s)]
    idle_shutdown: Option<u64>,
    /// Slurm partition. Default: the cluster's default.
    #[arg(long)]
    partition: Option<String>,
    /// Life of the annex's attach token (the annex cannot be extended past it). Default:
    /// the lifetime plus a day.
    #[arg(long, value_parser = parse_duration_s)]
    token_ttl: Option<u64>,
    /// The scheduler URL the batch nodes dial. Default: the stack's.
    #[arg(long)]
    scheduler_url: Option<String>,
    /// The htfaas binary on the batch nodes. Default: this one.
    #[arg(long)]
    htfaas: Option<PathBuf>,
    /// An origin jobs may read from and write to (`scheme://host[:port]`), as the nodes
    /// reach the storage and gateway; repeatable. Default: the scheduler's host.
    #[arg(long = "origin")]
    origins: Vec<String>,
    /// Extra CA certificates (PEM) on the nodes, for a scheduler or storage on TLS.
    #[arg(long)]
    tls_ca_file: Option<PathBuf>,
    /// Where each job writes its output (htfaas-annex-NAME-JOBID.out), made (0700) when it is
    /// missing: the batch system fails every launch into a directory that is not there.
    /// Default: here.
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Where on the nodes each EP makes its scratch directory (0700, removed when it
    /// exits). Default: the job's TMPDIR.
    #[arg(long)]
    scratch_dir: Option<PathBuf>,
    /// Print the record as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum AnnexCommand {
    /// Mint an attach token for the annex (refused unless the owner holds the annex right:
    /// `htfaas ns grant OWNER annex NAME`), submit COUNT batch jobs each running one
    /// `htfaas ep --annex NAME` with it (in the job's environment only), and return. Each job's
    /// time limit is the lifetime; an EP leaves when idle for --idle-shutdown, which ends its job.
    Create(Box<CreateArgs>),
    /// Every annex: its state, end, attached EPs and batch jobs (their states when Slurm can
    /// be asked from here).
    List {
        #[command(flatten)]
        dir: DirArg,
        #[command(flatten)]
        slurm_args: SlurmArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One annex in full: record, batch jobs with their states and time limits, attached EPs.
    Show {
        #[command(flatten)]
        dir: DirArg,
        #[command(flatten)]
        slurm_args: SlurmArgs,
        /// The annex.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The annex now ends --lifetime from now: its EPs are told at once, and each live batch
    /// job's time limit becomes its run time so far plus the lifetime. Adds no node.
    Extend {
        #[command(flatten)]
        dir: DirArg,
        #[command(flatten)]
        slurm_args: SlurmArgs,
        /// The annex.
        name: String,
        /// From now (e.g. 2h).
        #[arg(long, value_parser = parse_duration_s)]
        lifetime: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel its pending batch jobs, tell its EPs to leave (running jobs finish first), wait
    /// for them, cancel what is still running, then revoke its token: a leftover EP cannot
    /// attach again.
    Delete {
        #[command(flatten)]
        dir: DirArg,
        #[command(flatten)]
        slurm_args: SlurmArgs,
        /// The annex.
        name: String,
        /// How long to wait for the EPs to finish their jobs and leave before their batch jobs
        /// are cancelled. Default: the annex's drain window plus a minute.
        #[arg(long, value_parser = parse_duration_s)]
        drain_wait: Option<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `128`, `512M`, `4G` → MiB.
pub fn parse_memory_mb(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (number, factor) = match t.strip_suffix(['G', 'g']) {
        Some(n) => (n, 1024),
        None => (t.strip_suffix(['M', 'm']).unwrap_or(t), 1),
    };
    let n: u64 = number.parse().map_err(|_| format!("{s:?}: want MiB, or a number with M or G"))?;
    n.checked_mul(factor).filter(|&v| v > 0).ok_or_else(|| format!("{s:?}: out of range"))
}

/// `htfaas annex …`.
pub async fn run(command: AnnexCommand) -> anyhow::Result<()> {
    match command {
        AnnexCommand::Create(args) => {
            let CreateArgs {
                dir,
                slurm_args,
                name,
                slurm: _,
                owner,
                count,
                cpus,
                memory,
                lifetime,
                idle_shutdown,
                partition,
                token_ttl,
                scheduler_url,
                htfaas,
                origins,
                tls_ca_file,
                log_dir,
                scratch_dir,
                json,
            } = *args;
            let client = client(&dir)?;
            let info = client.info().clone();
            let provider: Arc<dyn Provider> = Arc::new(slurm_args.slurm());
            let request = AnnexRequest {
                name,
                owner: owner.unwrap_or(info.user),
                provider: provider.name().to_owned(),
                count,
                cpus,
                memory_mb: memory,
                lifetime_s: lifetime,
                idle_shutdown_s: idle_shutdown,
                partition,
                token_ttl_s: token_ttl,
            };
            request.check().map_err(anyhow::Error::msg)?;
            let htfaas = match htfaas {
                Some(p) => p,
                None => std::env::current_exe().context("find this htfaas binary (give --htfaas)")?,
            };
            let log_dir = match log_dir {
                Some(d) => log_directory(&d)?,
                None => std::env::current_dir().context("the current directory (give --log-dir)")?,
            };
            let placement = htfaas::annex::Placement {
                htfaas: std::path::absolute(&htfaas).context("--htfaas")?,
                scheduler_url: scheduler_url.unwrap_or(info.scheduler_url),
                allowed_origins: (!origins.is_empty()).then_some(origins),
                tls_ca_file,
                log_dir: Some(std::path::absolute(&log_dir).context("--log-dir")?),
                work_dir: None,
                scratch_dir,
            };
            // A bound function the annex cannot run is said before the EPs are asked for.
            let functions = client.functions().await.context("the registered functions")?;
            output::annex_shortfalls(&htfaas::annex::shortfalls(&request, &functions));
            let started = Instant::now();
            let created = htfaas::annex::create(&client, provider, &request, &placement).await?;
            output::annex_created(&created.annex, started.elapsed().as_millis() as u64, json)
        }
        AnnexCommand::List { dir, slurm_args, json } => {
            let list = htfaas::annex::views(&client(&dir)?, slurm_args.optional()).await?;
            output::annexes(&list, json)
        }
        AnnexCommand::Show { dir, slurm_args, name, json } => {
            let status = htfaas::annex::view(&client(&dir)?, slurm_args.optional(), &name).await?;
            output::annex(&status, json)
        }
        AnnexCommand::Extend { dir, slurm_args, name, lifetime, json } => {
            let provider: Arc<dyn Provider> = Arc::new(slurm_args.slurm());
            let (record, changed) =
                htfaas::annex::extend(&client(&dir)?, provider, &name, Duration::from_secs(lifetime)).await?;
            output::annex_extended(&record, &changed, json)
        }
        AnnexCommand::Delete { dir, slurm_args, name, drain_wait, json } => {
            let client = client(&dir)?;
            let provider: Arc<dyn Provider> = Arc::new(slurm_args.slurm());
            let wait = match drain_wait {
                Some(s) => s,
                None => client.annex(&name).await?.annex.drain_s + 60,
            };
            if wait == 0 {
                bail!("--drain-wait must be positive");
            }
            let deleted = htfaas::annex::delete(&client, provider, &name, Duration::from_secs(wait)).await?;
            output::annex_deleted(&deleted, json)
        }
    }
}

/// `dir` made ready for the annex's job logs: made (0700, with its parents) when missing;
/// refused when something else than a directory is there. A missing directory would not fail
/// `sbatch`, only every launch after it, on the nodes, where nobody reads why.
fn log_directory(dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("--log-dir {} is not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("make --log-dir {}", dir.display()))?;
        }
        Err(e) => return Err(e).with_context(|| format!("--log-dir {}", dir.display())),
    }
    Ok(dir.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory_mb("512"), Ok(512));
        assert_eq!(parse_memory_mb("512M"), Ok(512));
        assert_eq!(parse_memory_mb("4G"), Ok(4096));
        for bad in ["", "0", "4T", "-1", "1.5G"] {
            assert!(parse_memory_mb(bad).is_err(), "{bad:?}");
        }
    }

    /// A missing log directory is made (private), an existing one is kept, a file is refused.
    #[test]
    fn a_missing_log_directory_is_made_and_a_file_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("logs/annex");
        assert_eq!(log_directory(&dir).expect("made"), dir);
        let mode = std::fs::metadata(&dir).expect("there").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert_eq!(log_directory(&dir).expect("kept"), dir);
        let file = tmp.path().join("a-file");
        std::fs::write(&file, b"x").expect("write");
        let refused = log_directory(&file).expect_err("a file");
        assert!(refused.to_string().contains("is not a directory"), "{refused:#}");
    }
}
