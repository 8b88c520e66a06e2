//! `htfaas bridge dcache-sse`: dCache frontend storage events (SSE) to CloudEvents on NATS.
//! (Being written.)

/// How the bridge runs.
#[derive(Debug, Clone)]
pub struct Settings {}

/// Runs the bridge until `shutdown`.
pub async fn run(_settings: Settings, _shutdown: tokio_util::sync::CancellationToken) -> anyhow::Result<()> {
    anyhow::bail!("not written yet")
}
