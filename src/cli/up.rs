//! `htfaas up`: the whole local stack in the foreground ([`htfaas::stack`]), with the demo.
//! Must not know: how its lines are printed ([`super::output`]).

use super::args::DirArg;
use super::output;
use super::signals::on_signals;
use htfaas::stack::{Stack, StackOptions};
use std::path::PathBuf;
use std::time::Duration;

// The flags of `htfaas up`.
#[derive(clap::Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// Also register the example `checksum` function, upload a sample file and print its output.
    #[arg(long)]
    pub demo: bool,
    /// The example module for --demo.
    #[arg(long)]
    pub demo_wasm: Option<PathBuf>,
    /// nats-server binary (default: $HTFAAS_NATS_SERVER, .tools/venv/bin, PATH, /usr/sbin).
    #[arg(long)]
    pub nats_server: Option<PathBuf>,
    /// Print every component's log lines here too, instead of only into <dir>/logs/.
    #[arg(short, long)]
    pub verbose: bool,
}

/// `htfaas up`.
pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let UpArgs { dir, demo, demo_wasm, nats_server, verbose } = args;
    let mut opts = StackOptions::new(&dir.dir);
    opts.nats_binary = nats_server;
    let shutdown = on_signals();
    let mut stack = Stack::start(opts).await?;
    output::stack_ready(stack.info(), &dir.dir);
    if !verbose {
        output::logs_at(&dir.dir.join("logs"));
    }
    if demo {
        let wasm = demo_wasm.unwrap_or_else(htfaas::stack::default_demo_wasm);
        let client = stack.client()?;
        match htfaas::stack::demo(&client, &wasm, Duration::from_secs(60)).await {
            Ok((text, elapsed)) => output::demo_output(&text, elapsed),
            Err(e) => {
                output::demo_failed(&e);
                stack.stop().await?;
                std::process::exit(1);
            }
        }
    }
    output::running();
    tokio::select! {
        _ = shutdown.cancelled() => {}
        (name, result) = stack.any_stopped() => {
            output::stopped_unexpectedly(name, result);
        }
    }
    stack.stop().await
}
