//! `htfaas ns grant|revoke|list`: the namespaces' grants (admin). Must not know: how grants are
//! printed ([`super::output`]).

use super::args::{DirArg, client};
use super::output;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum NsCommand {
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
pub struct GrantArgs {
    /// An owner, or group:NAME for an accounting group.
    pub principal: String,
    /// read (trigger on and read), write (new outputs), replace (replace outputs), annex, or group (charge runs to an accounting group).
    #[arg(value_parser = parse_right)]
    pub right: htfaas_functions::namespace::Right,
    /// A directory ending in '/' (read, write, replace), an annex name or an accounting group name.
    pub value: String,
}

pub fn parse_right(s: &str) -> Result<htfaas_functions::namespace::Right, String> {
    htfaas_functions::namespace::Right::parse(s)
        .ok_or_else(|| format!("{s:?} is not read, write, replace, annex or group"))
}

/// `htfaas ns …`.
pub async fn run(command: NsCommand) -> anyhow::Result<()> {
    match command {
        NsCommand::Grant { dir, grant: g } => {
            let entry = client(&dir)?.grant(&g.principal, g.right, &g.value).await?;
            output::granted(&entry);
            Ok(())
        }
        NsCommand::Revoke { dir, grant: g } => {
            let entry = client(&dir)?.revoke_grant(&g.principal, g.right, &g.value).await?;
            output::revoked_grant(&entry);
            Ok(())
        }
        NsCommand::List { dir, json } => {
            let grants = client(&dir)?.namespaces().await?;
            output::grants(&grants, json)
        }
    }
}
