//! `htfaas accounting`: fair-share priorities, usage per owner, reports per owner, group or
//! function, and an owner's priority factor. Must not know: how they are printed
//! ([`super::output`]).

use super::args::{DirArg, client, parse_duration_s, parse_time_arg};
use super::output;
use clap::Subcommand;

// The flags of `htfaas accounting`.
#[derive(clap::Args)]
pub struct AccountingArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// Print jobs, core-hours and bytes per owner (`GET /v1/accounting`) instead.
    #[arg(long, conflicts_with = "by")]
    pub usage: bool,
    /// Report jobs by final state, core-, wall- and CPU-hours, peak memory, bytes read and
    /// written, and instructions (where metered) per owner, group or function, summed from
    /// the job records: each job counts when it reached its final state.
    #[arg(long, value_parser = parse_accounting_by)]
    pub by: Option<htfaas_functions::proto::AccountingBy>,
    /// With --by: from this time on: RFC 3339, Unix seconds, or before now (-2h).
    #[arg(long, requires = "by", allow_hyphen_values = true, value_parser = parse_time_arg)]
    pub since: Option<String>,
    /// With --by: before this time (default: now).
    #[arg(long, requires = "by", allow_hyphen_values = true, value_parser = parse_time_arg)]
    pub until: Option<String>,
    /// With --by: one row per key and period of this length (e.g. 1h, 1d), aligned to the
    /// Unix epoch; periods without jobs are left out.
    #[arg(long, requires = "by", value_parser = parse_duration_s)]
    pub period: Option<u64>,
    /// With --by: print CSV (a header row, then one line per row) instead of a table.
    #[arg(long, requires = "by", conflicts_with = "json")]
    pub csv: bool,
    /// Change instead of listing.
    #[command(subcommand)]
    pub action: Option<AccountingCommand>,
}

#[derive(Subcommand)]
pub enum AccountingCommand {
    /// One record per job that ended in a window, in the terms a site's accounting reads:
    /// HTCondor's job ClassAd attributes (Owner, AcctGroup, QDate, RemoteWallClockTime, …), as
    /// `condor_history -l` text, CSV or JSON (admin).
    Export {
        /// `condor-history`, `csv` or `json`.
        #[arg(long, default_value = "condor-history", value_parser = parse_export_format)]
        format: output::export::ExportFormat,
        /// Jobs that ended from this time on: RFC 3339, Unix seconds, or before now (-24h).
        /// Default: every job.
        #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
        since: Option<String>,
        /// Before this time (default: now).
        #[arg(long, allow_hyphen_values = true, value_parser = parse_time_arg)]
        until: Option<String>,
    },
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
pub fn parse_accounting_by(s: &str) -> Result<htfaas_functions::proto::AccountingBy, String> {
    use htfaas_functions::proto::AccountingBy;
    match s {
        "owner" => Ok(AccountingBy::Owner),
        "group" => Ok(AccountingBy::Group),
        "function" => Ok(AccountingBy::Function),
        _ => Err(format!("{s:?}: want owner, group or function")),
    }
}

/// `condor-history`, `csv` or `json`.
pub fn parse_export_format(s: &str) -> Result<output::export::ExportFormat, String> {
    output::export::ExportFormat::parse(s).ok_or_else(|| format!("{s:?}: want condor-history, csv or json"))
}

/// A finite number: JSON has no NaN or infinity. Its range is the scheduler's rule.
pub fn parse_factor(s: &str) -> Result<f64, String> {
    s.parse::<f64>().ok().filter(|f| f.is_finite()).ok_or_else(|| format!("{s:?}: want a number"))
}

/// A `--since`/`--until` argument as Unix ms (`now` for relative ones), if given.
fn time_ms(t: Option<String>, now: u64) -> anyhow::Result<Option<u64>> {
    t.map(|t| htfaas_gateway::replay::parse_time(&t, now).map_err(anyhow::Error::msg)).transpose()
}

/// `htfaas accounting …`.
pub async fn run(args: AccountingArgs) -> anyhow::Result<()> {
    match args {
        AccountingArgs { dir, json, action: Some(AccountingCommand::SetFactor { owner, factor }), .. } => {
            let standing = client(&dir)?.set_factor(&owner, factor).await?;
            output::owner_standing(&standing, json)
        }
        AccountingArgs { dir, action: Some(AccountingCommand::Export { format, since, until }), .. } => {
            let now = htfaas_gateway::replay::now_ms();
            let (since, until) = (time_ms(since, now)?.unwrap_or(0), time_ms(until, now)?.unwrap_or(now));
            let jobs = client(&dir)?.jobs_ended(since, until).await?;
            print!("{}", output::export::render(&jobs, format));
            Ok(())
        }
        AccountingArgs { dir, json, csv, by: Some(by), since, until, period, action: None, .. } => {
            let now = htfaas_gateway::replay::now_ms();
            let query = htfaas_functions::proto::AccountingQuery {
                since_ms: time_ms(since, now)?,
                until_ms: time_ms(until, now)?,
                by,
                period_s: period,
            };
            let report = client(&dir)?.accounting_report(&query).await?;
            output::accounting_report(&report, json, csv)
        }
        AccountingArgs { dir, json, usage: false, action: None, .. } => {
            let report = client(&dir)?.priorities().await?;
            output::priorities(&report, json)
        }
        AccountingArgs { dir, json, usage: true, action: None, .. } => {
            let accounts = client(&dir)?.accounting().await?;
            output::usage(&accounts, json)
        }
    }
}
