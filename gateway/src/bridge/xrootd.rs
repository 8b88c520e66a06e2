//! `htfaas bridge xrootd-notify`: XRootD `ofs.notify` lines to CloudEvents on NATS.
//! (Being written.)

/// How the bridge runs.
#[derive(Debug, Clone)]
pub struct Settings {}

/// Runs the bridge until `shutdown` or the end of its input.
pub async fn run(_settings: Settings, _shutdown: tokio_util::sync::CancellationToken) -> anyhow::Result<()> {
    anyhow::bail!("not written yet")
}
