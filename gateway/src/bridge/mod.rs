//! Bridges: small processes that read a storage system's own event channel and publish each
//! event on NATS JetStream, where the gateway's ingest reads it like any other source: as a
//! CloudEvent (subject `storage.cloudevents.<source>`, see
//! [`htfaas_functions::proto::CLOUDEVENTS_SUBJECT_PREFIX`]), or, dCache's billing messages, as
//! they are.
//!
//! - [`xrootd`]: XRootD `ofs.notify` lines (`closew`, `create`, `rm`, `mv`, …), from the notify
//!   program's stdin or a FIFO: `htfaas bridge xrootd-notify`. Each event gets its CloudEvent id
//!   when its line is read and is published with that id as `Nats-Msg-Id` until JetStream
//!   acknowledges it (at least once from then on); xrootd itself drops events when its bounded
//!   notify queue is full, so a bridge that stops reading loses events upstream;
//! - [`sse`]: dCache's frontend storage events (SSE `inotify` channel), resuming with
//!   `Last-Event-ID` and reporting event loss: `htfaas bridge dcache-sse`;
//! - [`kafka`]: dCache's billing messages from its Kafka topic, published unchanged as billing
//!   messages (not CloudEvents: on the file's path subject, `storage.dcache.billing.path.…`, or
//!   on `storage.dcache.billing`), offsets committed to JetStream after the PubAck:
//!   `htfaas bridge dcache-kafka`.

pub mod kafka;
pub mod sse;
pub mod xrootd;

use anyhow::Context as _;
use std::time::{Duration, SystemTime};

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

/// UTC time as RFC 3339 with exactly three fraction digits, e.g. `2026-11-21T22:35:15.900Z`:
/// the CloudEvents `time` the bridges stamp (fixed width, so it also sorts as text).
pub fn rfc3339(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::rfc3339;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn rfc3339_times() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_millis(1_795_300_515_630)), "2026-11-21T22:35:15.630Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_millis(951_782_400_123)), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_millis(1_709_251_200_123)), "2024-03-01T00:00:00.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_300_515)), "2026-11-21T22:35:15.000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(4_107_542_399)), "2100-02-28T23:59:59.000Z");
    }
}
