//! The NATS connection a bridge publishes on: it starts while NATS is down and keeps
//! reconnecting, so a bridge goes on reading its source through a NATS outage.
//!
//! Must not know: what a bridge reads.

use anyhow::Context as _;
use std::time::Duration;

/// Connects a bridge to the NATS servers of `nats_url` (one, or a cluster's, comma-separated)
/// as `credential`, named `name`: it starts while NATS is down and keeps reconnecting (100 ms
/// doubling to 2 s), logging each connect and disconnect, so a bridge goes on reading its
/// source (up to its own buffer) through a NATS outage.
pub async fn connect_nats(
    name: &str,
    credential: Option<&htfaas_functions::nats::NatsCredential>,
    nats_url: &str,
) -> anyhow::Result<async_nats::Client> {
    htfaas_functions::nats::connect_options(name, credential)
        .retry_on_initial_connect()
        .reconnect_delay_callback(|attempts| {
            Duration::from_millis(100u64.saturating_mul(1 << attempts.min(5))).min(Duration::from_secs(2))
        })
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => tracing::info!("connected to NATS"),
                async_nats::Event::Disconnected => tracing::warn!("disconnected from NATS; reconnecting"),
                other => tracing::debug!("NATS: {other}"),
            }
        })
        .connect(htfaas_functions::nats::servers(nats_url)?)
        .await
        .with_context(|| format!("connect to NATS at {nats_url}"))
}
