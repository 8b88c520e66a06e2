//! `htfaas dlq`: the dead-letter list: list, show, re-drive or drop entries.
//! Must not know: how entries are printed ([`super::output`]).

use super::args::{DirArg, client};
use super::output;
use clap::Subcommand;

// The flags of `htfaas dlq`.
#[derive(clap::Args)]
pub struct DlqArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do (default: list).
    #[command(subcommand)]
    pub action: Option<DlqCommand>,
}

#[derive(Subcommand)]
pub enum DlqCommand {
    /// Entries, newest first: firings that could not become jobs and jobs that failed.
    List {
        /// Only this function's.
        #[arg(long)]
        function: Option<String>,
        /// Only entries since (RFC 3339, Unix seconds, or a span before now like `-2h`).
        #[arg(long)]
        since: Option<String>,
        /// Dropped entries too.
        #[arg(long)]
        dropped: bool,
    },
    /// One entry with its re-drives.
    Show {
        /// Entry number.
        id: u64,
    },
    /// Run the entry's function version on its event again (once per re-drive number).
    Redrive {
        /// Entry number.
        id: u64,
        /// The re-drive's number (default: the entry's re-drives + 1); repeating it starts
        /// nothing more.
        #[arg(long)]
        n: Option<u32>,
    },
    /// Drop the entry from the list (who and why are recorded).
    Drop {
        /// Entry number.
        id: u64,
        /// Why.
        #[arg(long)]
        reason: String,
    },
}

/// `htfaas dlq …`.
pub async fn run(args: DlqArgs) -> anyhow::Result<()> {
    let DlqArgs { dir, json, action } = args;
    let client = client(&dir)?;
    match action.unwrap_or(DlqCommand::List { function: None, since: None, dropped: false }) {
        DlqCommand::List { function, since, dropped } => {
            let list = client.dead_letters(function.as_deref(), since.as_deref(), dropped).await?;
            output::dead_letters(&list, json)
        }
        DlqCommand::Show { id } => output::dead_letter(&client.dead_letter(id).await?, json),
        DlqCommand::Redrive { id, n } => output::redriven(&client.redrive(id, n).await?, json),
        DlqCommand::Drop { id, reason } => output::dead_letter(&client.drop_dead_letter(id, &reason).await?, json),
    }
}
