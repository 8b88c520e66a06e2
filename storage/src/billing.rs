//! dCache billing: one `transfer` message per completed upload, published on JetStream.
//!
//! The message has the shape of dCache's `MoverInfoMessageSerializer` output for a pool write
//! (`shared/reference/dcache.md` §1.2–1.3), so the gateway cannot tell us from a dCache pool.
//! We are door and pool at once: `initiator` is the door transaction (`door:<cell>@<cell>Domain:<ms>`),
//! `session` the pool one (`pool:<cell>@<cell>Domain:<ms>-<n>`).
//!
//! Subject: by default the file's path subject (`storage.dcache.billing.path.<dir>._`,
//! [`path_subject`]), so the gateway reads each owner's events on a lane of its own and one
//! owner's flood does not delay another's event; with `billing_path_subjects =
//! false` (or a stream that lacks the path subjects), the plain [`EVENTS_SUBJECT`], as dCache.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::message::PublishMessage;
use htfaas_functions::proto::{EVENTS_SUBJECT, TransferMessage, TransferStatus, path_subject};
use time::OffsetDateTime;

/// How long we wait for the JetStream PubAck before answering 503.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for NATS to flush.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// One completed upload, as the PUT handler saw it.
#[derive(Debug, Clone)]
pub struct Upload {
    /// Clean namespace path.
    pub path: String,
    /// Bytes written.
    pub size: u64,
    /// From the first to the last body byte.
    pub elapsed: Duration,
    /// Billing subject (`UserNamePrincipal[..]`, `MacaroonPrincipal[..]`, `Origin[..]`).
    pub subject: Vec<String>,
    /// The client's address.
    pub client: SocketAddr,
    /// When the request arrived, Unix ms (the door transaction id).
    pub started_ms: i64,
}

/// Builds and publishes transfer messages.
#[derive(Debug)]
pub struct Billing {
    jetstream: Option<jetstream::Context>,
    cell: String,
    counter: AtomicU64,
    /// Publish on the file's path subject (else on [`EVENTS_SUBJECT`]).
    path_subjects: bool,
}

/// Publishing failed; the upload is stored regardless.
#[derive(Debug, thiserror::Error)]
#[error("could not publish the billing event: {0}")]
pub struct PublishError(String);

impl Billing {
    /// `jetstream` `None` disables publishing; `path_subjects` publishes each message on its
    /// file's path subject, else on [`EVENTS_SUBJECT`].
    pub fn new(jetstream: Option<jetstream::Context>, cell: String, path_subjects: bool) -> Billing {
        Billing { jetstream, cell, counter: AtomicU64::new(0), path_subjects }
    }

    /// The subject `msg` is published on: its path's subject ([`path_subject`] of its
    /// `transferPath`), or [`EVENTS_SUBJECT`] when path subjects are off or it has no path.
    pub fn subject(&self, msg: &TransferMessage) -> String {
        match (&msg.transfer_path, self.path_subjects) {
            (Some(path), true) => path_subject(path),
            _ => EVENTS_SUBJECT.to_owned(),
        }
    }

    /// Whether messages are published at all.
    pub fn enabled(&self) -> bool {
        self.jetstream.is_some()
    }

    /// The message for `upload`, dated `now`.
    pub fn message(&self, upload: &Upload, now: OffsetDateTime) -> TransferMessage {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let cell = &self.cell;
        let domain = format!("{cell}Domain");
        let now_ms = i64::try_from(now.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
        let secs = upload.elapsed.as_secs_f64();
        let transfer_ms = i64::try_from(upload.elapsed.as_millis()).unwrap_or(i64::MAX);
        TransferMessage {
            version: Some("1.0".into()),
            msg_type: Some("transfer".into()),
            date: Some(format_date(now)),
            queuing_time: Some(0),
            cell_name: Some(cell.clone()),
            cell_type: Some("pool".into()),
            cell_domain: Some(domain.clone()),
            status: Some(TransferStatus { code: 0, msg: String::new() }),
            session: Some(format!("pool:{cell}@{domain}:{now_ms}-{n}")),
            subject: Some(upload.subject.clone()),
            pnfsid: Some(new_pnfsid()),
            billing_path: Some(upload.path.clone()),
            transfer_path: Some(upload.path.clone()),
            file_size: Some(upload.size),
            storage_info: Some("htfaas:default@none".into()),
            transfer_size: Some(upload.size),
            transfer_time: Some(transfer_ms),
            is_write: Some("write".into()),
            protocol_info: Some(serde_json::json!({
                "protocol": "Http",
                "versionMajor": 1,
                "versionMinor": 1,
                "transferTag": "",
                "port": upload.client.port(),
                "host": upload.client.ip().to_string(),
            })),
            initiator: Some(format!("door:{cell}@{domain}:{}", upload.started_ms)),
            is_p2p: Some(false),
            mean_write_bandwidth: (secs > 0.0).then(|| upload.size as f64 / secs),
        }
    }

    /// Publishes `msg` on its subject ([`Billing::subject`]) and waits for the PubAck. No-op
    /// when disabled.
    #[tracing::instrument(name = "storage.publish", skip_all, fields(messaging.system = "nats",
        messaging.destination.name = tracing::field::Empty, pnfsid = msg.pnfsid.as_deref().unwrap_or("")))]
    pub async fn publish(&self, msg: &TransferMessage) -> Result<(), PublishError> {
        let Some(js) = &self.jetstream else { return Ok(()) };
        let subject = self.subject(msg);
        tracing::Span::current().record("messaging.destination.name", subject.as_str());
        let payload = serde_json::to_vec(msg).map_err(|e| PublishError(e.to_string()))?;
        let mut publish = PublishMessage::build().payload(payload.into());
        if let Some(id) = &msg.pnfsid {
            publish = publish.message_id(id);
        }
        let fut = async {
            let ack = js.send_publish(subject, publish).await.map_err(|e| PublishError(e.to_string()))?;
            ack.await.map_err(|e| PublishError(e.to_string()))
        };
        let ack = tokio::time::timeout(PUBLISH_TIMEOUT, fut)
            .await
            .map_err(|_| PublishError(format!("no PubAck within {PUBLISH_TIMEOUT:?}")))??;
        tracing::debug!(stream = %ack.stream, seq = ack.sequence, "billing event published");
        Ok(())
    }

    /// Flushes the NATS connection (shutdown); gives up after a few seconds when NATS is away.
    pub async fn flush(&self) {
        let Some(js) = &self.jetstream else { return };
        match tokio::time::timeout(FLUSH_TIMEOUT, js.client().flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("failed to flush NATS: {e}"),
            Err(_) => tracing::warn!("NATS flush did not finish within {FLUSH_TIMEOUT:?}; exiting anyway"),
        }
    }
}

/// ISO-8601 with offset and milliseconds, like dCache's `ISO_OFFSET_DATE_TIME` (in UTC).
fn format_date(now: OffsetDateTime) -> String {
    let ms = u64::try_from(now.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    htfaas_functions::time::utc_timestamp_ms_offset(ms)
}

/// 36 upper-case hex digits, fresh per upload.
fn new_pnfsid() -> String {
    hex::encode_upper(rand::random::<[u8; 18]>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_has_the_dcache_transfer_shape() {
        let b = Billing::new(None, "htfaas-storage".into(), true);
        let up = Upload {
            path: "/data/raw/a.h5".into(),
            size: 1000,
            elapsed: Duration::from_millis(250),
            subject: vec!["UserNamePrincipal[alice]".into(), "Origin[127.0.0.1]".into()],
            client: "127.0.0.1:51514".parse().expect("addr"),
            started_ms: 1_773_479_729_001,
        };
        let now = OffsetDateTime::from_unix_timestamp_nanos(1_773_479_730_123_000_000).expect("valid");
        let m = b.message(&up, now);
        let m2 = b.message(&up, now);
        let v = serde_json::to_value(&m).expect("serializes");
        assert_eq!(v["version"], "1.0");
        assert_eq!(v["msgType"], "transfer");
        assert_eq!(v["date"], "2026-03-14T09:15:30.123+00:00");
        assert_eq!(v["cellType"], "pool");
        assert_eq!(v["cellDomain"], "htfaas-storageDomain");
        assert_eq!(v["session"], "pool:htfaas-storage@htfaas-storageDomain:1773479730123-1");
        assert_eq!(m2.session.as_deref(), Some("pool:htfaas-storage@htfaas-storageDomain:1773479730123-2"));
        assert_eq!(v["initiator"], "door:htfaas-storage@htfaas-storageDomain:1773479729001");
        assert_eq!(v["status"], serde_json::json!({"code": 0, "msg": ""}));
        assert_eq!(v["isWrite"], "write");
        assert_eq!(v["isP2p"], false);
        assert_eq!(v["billingPath"], "/data/raw/a.h5");
        assert_eq!(v["transferPath"], "/data/raw/a.h5");
        assert_eq!(v["fileSize"], 1000);
        assert_eq!(v["transferSize"], 1000);
        assert_eq!(v["transferTime"], 250);
        assert_eq!(v["meanWriteBandwidth"], 4000.0);
        assert_eq!(v["storageInfo"], "htfaas:default@none");
        assert_eq!(v["protocolInfo"]["protocol"], "Http");
        assert_eq!(v["protocolInfo"]["port"], 51514);
        assert_eq!(v["protocolInfo"]["host"], "127.0.0.1");
        let pnfsid = m.pnfsid.expect("set");
        assert_eq!(pnfsid.len(), 36);
        assert!(pnfsid.chars().all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
        assert_ne!(Some(pnfsid), m2.pnfsid);
    }

    #[test]
    fn messages_go_on_their_paths_subject_unless_told_otherwise() {
        let m = TransferMessage { transfer_path: Some("/data/bob/run 1/in.dat".into()), ..Default::default() };
        let on = Billing::new(None, "c".into(), true);
        assert_eq!(on.subject(&m), "storage.dcache.billing.path.data.bob.run%201._");
        assert_eq!(on.subject(&TransferMessage::default()), EVENTS_SUBJECT);
        assert_eq!(Billing::new(None, "c".into(), false).subject(&m), EVENTS_SUBJECT);
    }
}
