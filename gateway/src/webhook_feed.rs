//! Failure webhooks' deliveries: a durable consumer (`<consumer>-webhook`) of the
//! scheduler's notifications of failed jobs; for each whose function version names a
//! [`Webhook`](htfaas_functions::manifest::Webhook), a POST of the notification (as published)
//! to its URL, signed with the function's key ([`webhook_signature`]: `x-htfaas-signature`,
//! `x-htfaas-timestamp`, `x-htfaas-delivery`).
//!
//! The URL is checked again at each delivery ([`crate::webhooks::Webhooks::check`]: the site's
//! list may have shrunk since the registration). A receiver answering 2xx acks the
//! notification; 429, 5xx and connection trouble make it come again after a backoff, up to
//! [`MAX_DELIVER`] tries; any other answer, a missing key or a host no longer allowed ends it
//! (logged, never retried forever). Deliveries are at least once: the
//! `x-htfaas-delivery` header lets a receiver drop a repeat. Up to [`MAX_CONCURRENT`] are under
//! way at once, so a receiver that takes its time holds up no other.
//!
//! Must not know: the dead-letter list, the firing table, HTTP routes.

use crate::state::Shared;
use async_nats::jetstream::{self, consumer::pull};
use futures_util::TryStreamExt as _;
use htfaas_functions::proto::{
    JOBS_STREAM, JOBS_SUBJECT_PREFIX, JobNotification, WEBHOOK_DELIVERY_HEADER, WEBHOOK_SIGNATURE_HEADER,
    WEBHOOK_TIMESTAMP_HEADER, webhook_signature,
};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::dead_letters::Handled as Delivery;

/// Tries of one delivery before it is given up.
pub const MAX_DELIVER: i64 = 6;
/// Waits between tries (the last repeats).
const BACKOFF: [Duration; 3] = [Duration::from_secs(1), Duration::from_secs(10), Duration::from_secs(60)];
/// How long one POST may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Deliveries under way at once.
pub const MAX_CONCURRENT: usize = 16;

/// The durable consumer's name for the gateway's `consumer`.
pub fn consumer_name(consumer: &str) -> String {
    format!("{consumer}-webhook")
}

/// Delivers failed jobs' notifications to their functions' webhooks until `shutdown`.
pub async fn run(js: jetstream::Context, consumer: String, shared: Arc<Shared>, shutdown: CancellationToken) {
    crate::dead_letters::retrying(&shutdown, "the webhook feed", || feed(&js, &consumer, &shared)).await;
}

async fn feed(js: &jetstream::Context, consumer: &str, shared: &Arc<Shared>) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let stream = js.get_stream(JOBS_STREAM).await.with_context(|| format!("look up the stream {JOBS_STREAM}"))?;
    let name = consumer_name(consumer);
    let config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some("htfaas gateway: failed jobs to their functions' webhooks".into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: TIMEOUT * 3,
        max_deliver: MAX_DELIVER,
        filter_subject: format!("{JOBS_SUBJECT_PREFIX}.*.*.failed"),
        ..Default::default()
    };
    let consumer = stream.get_or_create_consumer(&name, config).await.with_context(|| format!("make {name}"))?;
    let messages = consumer.messages().await.context("pull notifications")?;
    // At most MAX_CONCURRENT at once: a receiver slow up to the timeout holds up no other.
    messages
        .map_err(|e| anyhow::anyhow!("read a notification: {e}"))
        .try_for_each_concurrent(MAX_CONCURRENT, |message| async move {
            settle(shared, message).await;
            Ok(())
        })
        .await?;
    anyhow::bail!("the notifications' pull ended")
}

/// Delivers one notification and tells JetStream what became of it.
async fn settle(shared: &Shared, message: jetstream::Message) {
    let outcome = match serde_json::from_slice::<JobNotification>(&message.payload) {
        Ok(n) => deliver(shared, &n, &message.payload).await,
        Err(e) => Delivery::Refused(format!("a notification that does not parse: {e}")),
    };
    if crate::dead_letters::settle(&message, outcome, MAX_DELIVER, &BACKOFF, "webhook delivery").await {
        shared.webhooks.failed.fetch_add(1, Ordering::Relaxed);
    }
}

/// POSTs `body` (the notification `n` as published) to its function version's webhook.
async fn deliver(shared: &Shared, n: &JobNotification, body: &[u8]) -> Delivery {
    let versions = match shared.registry.versions(&n.function) {
        Ok(v) => v,
        Err(e) => return Delivery::Again(format!("read the function {}: {e}", n.function)),
    };
    let Some(record) = versions.into_iter().find(|r| r.version == n.version && r.manifest.owner == n.owner) else {
        return Delivery::Done;
    };
    let Some(webhook) = record.manifest.webhook else { return Delivery::Done };
    let url = match shared.webhooks.check(&webhook) {
        Ok(url) => url,
        Err(e) => return Delivery::Refused(e.to_string()),
    };
    let key =
        match shared.secrets.webhook_key(&shared.registry, &record.manifest.owner, &n.function, &webhook.key_secret) {
            Ok(Some(key)) => key,
            Ok(None) => return Delivery::Refused(format!("the function's secret {} has no value", webhook.key_secret)),
            Err(e) => return Delivery::Refused(format!("open the key {}: {e}", webhook.key_secret)),
        };
    let now = htfaas_functions::time::now_ms() / 1000;
    let sent = shared
        .webhooks
        .http
        .post(url)
        .timeout(TIMEOUT)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(WEBHOOK_TIMESTAMP_HEADER, now.to_string())
        .header(WEBHOOK_SIGNATURE_HEADER, webhook_signature(key.as_bytes(), now, body))
        .header(WEBHOOK_DELIVERY_HEADER, n.msg_id())
        .body(body.to_vec())
        .send()
        .await;
    match sent {
        Ok(resp) if resp.status().is_success() => {
            shared.webhooks.delivered.fetch_add(1, Ordering::Relaxed);
            tracing::info!(job = %n.job_id, function = %n.function, "failure webhook delivered");
            Delivery::Done
        }
        Ok(resp) if resp.status().as_u16() == 429 || resp.status().is_server_error() => {
            Delivery::Again(format!("the receiver answered {}", resp.status()))
        }
        Ok(resp) => Delivery::Refused(format!("the receiver answered {}", resp.status())),
        Err(e) => match crate::webhooks::refused_address(&e) {
            // The host resolved to an address the site does not allow: no try will change that.
            Some(refused) => Delivery::Refused(refused.to_string()),
            None => Delivery::Again(format!("POST: {e}")),
        },
    }
}
