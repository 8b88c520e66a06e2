//! Checkpoint areas of jobs that ended away from an EP, cleared: a durable consumer
//! (`<consumer>-checkpoints`) of the scheduler's notifications of `failed` and `removed` jobs.
//! For each that names a checkpoint area ([`JobNotification::checkpoint`]), the gateway takes a
//! checkpoint macaroon for exactly that area from the storage, as it did when it made the job
//! ([`crate::jobs`]), and `DELETE`s the checkpoint file, then the area's directory.
//!
//! Why here: an EP deletes a checkpoint only when the job ends for good on it; a job removed
//! while idle or held, or cancelled on its EP (a hold and a removal look the same there), or
//! failed by the scheduler (no progress between checkpoints, a retry limit), would otherwise
//! leave its state in the site's checkpoint directory for ever. A `held` job keeps its area
//! (it may be released), and a `completed` one was cleared by its EP.
//!
//! Trusts no notification: the area must be one this gateway makes (`<checkpoint_dir><id>/`
//! on its storage, one segment below the checkpoint directory); anything else is refused
//! (logged, never retried). A 404 is a success (already gone); a storage that is away makes
//! the notification come again after a backoff, up to [`MAX_DELIVER`] tries; a directory that
//! holds something else stays (logged).
//!
//! Must not know: the dead-letter list, webhooks, the firing table, HTTP routes.

use crate::state::Shared;
use crate::storage_client::{StorageClient, StorageError, writer_of_run};
use async_nats::jetstream::{self, consumer::pull};
use futures_util::TryStreamExt as _;
use htfaas_functions::checkpoint::CHECKPOINT_FILE;
use htfaas_functions::proto::{JOBS_STREAM, JOBS_SUBJECT_PREFIX, JobNotification};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::dead_letters::Handled as Cleared;

/// Tries of one clearing before it is given up.
pub const MAX_DELIVER: i64 = 6;
/// Waits between tries (the last repeats).
const BACKOFF: [Duration; 3] = [Duration::from_secs(2), Duration::from_secs(20), Duration::from_secs(120)];
/// Clearings under way at once.
const MAX_CONCURRENT: usize = 4;

/// The durable consumer's name for the gateway's `consumer`.
pub fn consumer_name(consumer: &str) -> String {
    format!("{consumer}-checkpoints")
}

/// Clears the checkpoint areas of failed and removed jobs until `shutdown`; a gateway that
/// keeps no checkpoints has none to clear.
pub async fn run(js: jetstream::Context, consumer: String, shared: Arc<Shared>, shutdown: CancellationToken) {
    let Some(root) = shared.checkpoint_dir.clone() else { return };
    crate::dead_letters::retrying(&shutdown, "the checkpoint sweep", || feed(&js, &consumer, &shared, &root)).await;
}

async fn feed(js: &jetstream::Context, consumer: &str, shared: &Arc<Shared>, root: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let stream = js.get_stream(JOBS_STREAM).await.with_context(|| format!("look up the stream {JOBS_STREAM}"))?;
    let name = consumer_name(consumer);
    let config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some("htfaas gateway: checkpoint areas of failed and removed jobs cleared".into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(60),
        max_deliver: MAX_DELIVER,
        filter_subjects: ["failed", "removed"].map(|s| format!("{JOBS_SUBJECT_PREFIX}.*.*.{s}")).to_vec(),
        ..Default::default()
    };
    let consumer = stream.get_or_create_consumer(&name, config).await.with_context(|| format!("make {name}"))?;
    let messages = consumer.messages().await.context("pull notifications")?;
    messages
        .map_err(|e| anyhow::anyhow!("read a notification: {e}"))
        .try_for_each_concurrent(MAX_CONCURRENT, |message| async move {
            settle(&shared.storage, root, message).await;
            Ok(())
        })
        .await?;
    anyhow::bail!("the notifications' pull ended")
}

/// Clears one notification's area and tells JetStream what became of it.
async fn settle(storage: &StorageClient, root: &str, message: jetstream::Message) {
    let outcome = match serde_json::from_slice::<JobNotification>(&message.payload) {
        Ok(n) => clear(storage, root, &n).await,
        Err(e) => Cleared::Refused(format!("a notification that does not parse: {e}")),
    };
    crate::dead_letters::settle(&message, outcome, MAX_DELIVER, &BACKOFF, "checkpoint area clearing").await;
}

/// The storage path of the checkpoint area `url` when it is one this gateway makes: a
/// directory one segment below `root` on `storage`.
fn area_of(storage: &StorageClient, root: &str, url: &str) -> Option<String> {
    let path = storage.path_of(url)?;
    let id = path.strip_prefix(root)?.strip_suffix('/')?;
    (!matches!(id, "" | "." | "..") && !id.contains('/')).then_some(path)
}

/// Clears `n`'s checkpoint area, if it has one: the checkpoint file, then the directory.
async fn clear(storage: &StorageClient, root: &str, n: &JobNotification) -> Cleared {
    let Some(url) = &n.checkpoint else { return Cleared::Done };
    let Some(area) = area_of(storage, root, url) else {
        return Cleared::Refused(format!("job {}: {url} is not a checkpoint area of this gateway", n.job_id));
    };
    let failed = |what: &str, e: StorageError| {
        let why = format!("job {}: {what} {area}: {e}", n.job_id);
        if e.is_transient() { Cleared::Again(why) } else { Cleared::Refused(why) }
    };
    let macaroon = match storage.checkpoint_macaroon(&area, &writer_of_run(&n.owner, &n.function)).await {
        Ok(m) => m,
        Err(e) => return failed("a macaroon for", e),
    };
    let file = format!("{area}{CHECKPOINT_FILE}");
    for (what, path) in [("delete the checkpoint of", file.as_str()), ("delete", area.as_str())] {
        if let Err(e) = storage.delete(path, &macaroon).await {
            return failed(what, e);
        }
    }
    tracing::info!(job = %n.job_id, %area, state = %n.state.as_str(), "checkpoint area cleared");
    Cleared::Done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage_client::{StorageAuth, StorageKind};

    /// Only a directory one segment below the checkpoint directory, on this storage, is an
    /// area: a notification naming any other path (a job's output, the checkpoint directory
    /// itself, a nested or relative path, another host) is refused before the storage is asked.
    #[test]
    fn only_an_area_of_this_gateway_is_cleared() {
        let auth = StorageAuth::Basic { user: "u".into(), secret: "s".into() };
        let http = crate::clients::storage_http_client(None, None, None).expect("client");
        let storage = StorageClient::new(http, StorageKind::Dcache, "http://s:1", auth, "PT1H", "PT1H");
        let root = "/checkpoints/";
        assert_eq!(area_of(&storage, root, "http://s:1/checkpoints/abc/").as_deref(), Some("/checkpoints/abc/"));
        for url in [
            "http://s:1/checkpoints/",
            "http://s:1/checkpoints/abc",
            "http://s:1/checkpoints/a/b/",
            "http://s:1/data/out/",
            "http://s:1/checkpointsx/abc/",
            "http://other:1/checkpoints/abc/",
            "http://s:1/checkpoints/../data/",
            "http://s:1/checkpoints/../",
            "http://s:1/checkpoints/%2E%2E/",
        ] {
            assert_eq!(area_of(&storage, root, url), None, "{url}");
        }
    }
}
