//! `htfaas audit`: the audit trails' records, a file's lineage, `audit verify|head|keys`, and
//! `audit rerun` (re-derive a file).
//! Must not know: how records, lineages and reports are printed ([`super::output`]).

use super::args::{DirArg, client, parse_time_arg};
use super::output;
use anyhow::Context as _;
use clap::Subcommand;
use std::path::PathBuf;

// The flags of `htfaas audit`.
#[derive(clap::Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// Check the trail instead.
    #[command(subcommand)]
    pub action: Option<AuditCommand>,
    /// Records about this job.
    #[arg(long)]
    pub job: Option<String>,
    /// Records about this submit or attach token (its jti).
    #[arg(long, value_name = "JTI")]
    pub token: Option<String>,
    /// Records about this owner.
    #[arg(long)]
    pub owner: Option<String>,
    /// Records naming this storage path (a job's input, reference file or output); alone: the
    /// file's lineage.
    #[arg(long, value_name = "PATH")]
    pub file: Option<String>,
    /// Records about this function (name).
    #[arg(long)]
    pub function: Option<String>,
    /// Records about this storage event (its id).
    #[arg(long, value_name = "ID")]
    pub event: Option<String>,
    /// From this time on: RFC 3339, Unix seconds, or before now (-2h).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
    pub since: Option<String>,
    /// Before this time.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
    pub until: Option<String>,
    /// At most this many records, the first in seq order (default 1000).
    #[arg(long)]
    pub limit: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum AuditCommand {
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
    /// Re-derive files: run the function version that wrote each again, on the same
    /// input bytes (by the sha256 its run recorded; nothing runs if the input changed), into a
    /// scratch directory beside its outputs, and compare the output's sha256. Exits non-zero
    /// unless every file came out identical.
    Rerun {
        /// The file to re-derive.
        #[arg(long, value_name = "PATH", required_unless_present = "all", conflicts_with = "all")]
        file: Option<String>,
        /// Sample the outputs of jobs completed since --since instead (one per job, spread
        /// evenly over them, at most --sample).
        #[arg(long, requires = "since")]
        all: bool,
        /// With --all: from this time on: RFC 3339, Unix seconds, or before now (-2h).
        #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
        since: Option<String>,
        /// With --all: at most this many files.
        #[arg(long, default_value_t = 10)]
        sample: usize,
        /// Longest wait for each re-run to end, seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the JWKS of both audit keys, the scheduler's and the gateway's (for `audit verify
    /// --file … --keys …` of either trail); keep a copy where the trails' hosts cannot change it.
    Keys,
}

/// `htfaas audit …`.
pub async fn run(args: AuditArgs) -> anyhow::Result<()> {
    match args {
        AuditArgs { dir, action: Some(AuditCommand::Rerun { file, all: _, since, sample, timeout, json }), .. } => {
            let c = client(&dir)?;
            let files = match (file, since) {
                (Some(file), _) => vec![file],
                (None, Some(since)) => {
                    let since = htfaas_gateway::replay::parse_time(&since, htfaas_gateway::replay::now_ms())
                        .map_err(anyhow::Error::msg)?;
                    c.recent_outputs(since, sample).await?
                }
                (None, None) => anyhow::bail!("--file PATH, or --all --since T"),
            };
            anyhow::ensure!(!files.is_empty(), "no completed job's output to re-derive since then");
            // Submitted together, then waited for: the runs overlap.
            let mut reruns = Vec::with_capacity(files.len());
            for f in &files {
                reruns.push(c.rerun(f).await.with_context(|| format!("re-derive {f}"))?);
            }
            let timeout = std::time::Duration::from_secs(timeout);
            let mut checked = Vec::with_capacity(reruns.len());
            for r in reruns {
                let (verdict, _) = c.rerun_verdict(&r, timeout).await?;
                checked.push((r, verdict));
            }
            output::reruns(&checked, json)
        }
        AuditArgs { dir, action: Some(AuditCommand::Keys), .. } => output::json(&client(&dir)?.audit_keys().await?),
        AuditArgs { action: Some(AuditCommand::Head { file }), .. } => {
            match htfaas_functions::audit::anchor::head(&file).with_context(|| format!("read {}", file.display()))? {
                Some(head) => output::head(&head),
                None => anyhow::bail!("{} holds no audit record yet", file.display()),
            }
            Ok(())
        }
        AuditArgs { dir, action: Some(AuditCommand::Verify { file, keys, head, json }), .. } => match (file, keys) {
            (Some(file), Some(keys)) => {
                let head = head.map(|h| h.parse::<htfaas_functions::audit::anchor::Head>()).transpose()?;
                output::verify(&htfaas::client::verify_trail_file_with_head(&file, &keys, head.as_ref())?, json)
            }
            (None, None) => {
                let c = client(&dir)?;
                let reports = [("scheduler", c.audit_verify().await?), ("gateway", c.audit_verify_gateway().await?)];
                output::verify_reports(&reports, json)
            }
            _ => anyhow::bail!("--file and --keys go together"),
        },
        AuditArgs { dir, action: None, job, token, owner, file, function, event, since, until, limit, json } => {
            let now = htfaas_gateway::replay::now_ms();
            let time = |t: Option<String>| {
                t.map(|t| htfaas_gateway::replay::parse_time(&t, now).map_err(anyhow::Error::msg)).transpose()
            };
            let only_file = file.is_some()
                && [&job, &token, &owner, &function, &event, &since, &until].iter().all(|f| f.is_none())
                && limit.is_none();
            if let (true, Some(path)) = (only_file, &file) {
                let lineage = client(&dir)?.lineage(path).await?;
                return output::lineage(&lineage, json);
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
            output::audit_records(&records, json)
        }
    }
}
