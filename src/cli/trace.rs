//! `htfaas trace JOB|EVENT|TRACE-ID`: one event's span tree from the components'
//! records. Must not know: how spans are rebuilt ([`htfaas::client`]), how they are printed
//! ([`super::output`]).

use super::args::{DirArg, client};
use super::output;

// The flags of `htfaas trace`.
#[derive(clap::Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// A job id, an event id (`dcache-billing:write:…`) or a trace id (32 hex digits).
    pub what: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `htfaas trace …`.
pub async fn run(args: TraceArgs) -> anyhow::Result<()> {
    let view = client(&args.dir)?.trace(&args.what).await?;
    output::trace(&view, args.json)
}
