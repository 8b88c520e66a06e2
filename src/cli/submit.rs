//! `htfaas submit`: run a registered function on a storage file with a submit token. Must not
//! know: how the answer is printed ([`super::output`]).

use super::args::{DirArg, client};
use super::output;
use anyhow::Context as _;
use std::path::PathBuf;

// The arguments of `htfaas submit`.
#[derive(clap::Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// File holding the submit token.
    #[arg(long)]
    pub token: PathBuf,
    /// Function name.
    pub function: String,
    /// Storage path of the input file.
    pub storage_path: String,
    /// Run on this annex (only EPs attached with a token for it run the job).
    #[arg(long)]
    pub annex: Option<String>,
}

/// `htfaas submit`.
pub async fn run(args: SubmitArgs) -> anyhow::Result<()> {
    let SubmitArgs { dir, token, function, storage_path, annex } = args;
    let token = std::fs::read_to_string(&token).with_context(|| format!("read {}", token.display()))?;
    let reply = client(&dir)?.run_function_on(&token, &function, &storage_path, annex.as_deref()).await?;
    output::submitted(&reply);
    Ok(())
}
