//! The bridge's committed Kafka offsets, in a JetStream key-value bucket
//! ([`htfaas_functions::proto::KAFKA_OFFSETS_BUCKET`]): one key per consumer name, topic and
//! partition, `<consumer>.<topic>.<partition>`, holding [`Committed`] (versioned JSON).
//!
//! Every write is a compare-and-set on the revision this bridge last read or wrote. A commit
//! that finds the key changed since, to a value other than its own, fails
//! ([`OffsetError::Fenced`]: another bridge with the same consumer name reads this partition)
//! and that bridge stops with an error instead of racing the other; so the committed offset only
//! ever moves by the writer of its latest revision. A commit that finds exactly its own value
//! is taken as done: its acknowledgement was lost (NATS went away after storing it), or another
//! bridge in lockstep committed the same offset (harmless: both published the same records
//! under the same ids).
//!
//! Must not know: Kafka, records, subjects.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The stored format's version.
const VERSION: u32 = 1;

/// What a partition's key holds: the next offset to read, i.e. every record before it was
/// acknowledged by JetStream (or skipped as malformed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    /// Format version, [`VERSION`].
    pub version: u32,
    /// The next offset to read.
    pub next_offset: i64,
}

/// Why the offsets could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum OffsetError {
    /// Another writer changed the key since this bridge last did: another bridge with the same
    /// consumer name reads this partition.
    #[error(
        "the committed offset of {key} was changed by someone else (another bridge with the same consumer name?): \
         found {found:?}, expected revision {expected}"
    )]
    Fenced {
        /// The key.
        key: String,
        /// What the key holds now.
        found: Option<i64>,
        /// The revision this bridge expected.
        expected: u64,
    },
    /// The key holds something this bridge cannot read.
    #[error("the committed offset of {key} is unreadable: {why}")]
    Corrupt {
        /// The key.
        key: String,
        /// The parse error.
        why: String,
    },
    /// NATS or JetStream failed (down, timed out, no permission): retried by the caller.
    #[error("the offsets bucket: {0}")]
    Nats(String),
}

impl OffsetError {
    /// Whether retrying later may succeed (NATS trouble), as opposed to a conflict or a corrupt
    /// key, which a retry cannot fix.
    pub fn is_transient(&self) -> bool {
        matches!(self, OffsetError::Nats(_))
    }
}

/// The key of `consumer`'s offset of `topic`'s `partition`. `consumer` is `[A-Za-z0-9_-]+`
/// (checked by the settings) and Kafka topic names are `[A-Za-z0-9._-]+`, so with the partition
/// last, no two (consumer, topic, partition) share a key.
pub fn key(consumer: &str, topic: &str, partition: i32) -> String {
    format!("{consumer}.{topic}.{partition}")
}

/// Opens the bucket, making it (history 1, file storage, `replicas`) when it does not exist.
pub async fn open_bucket(js: &jetstream::Context, bucket: &str, replicas: usize) -> Result<kv::Store, OffsetError> {
    if let Ok(store) = js.get_key_value(bucket).await {
        return Ok(store);
    }
    js.create_key_value(kv::Config {
        bucket: bucket.to_owned(),
        description: "htfaas bridge dcache-kafka: committed Kafka offsets".into(),
        history: 1,
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| OffsetError::Nats(format!("create the bucket {bucket}: {e}")))
}

/// One partition's committed offset and the revision it was read or written at.
#[derive(Debug)]
pub struct PartitionOffset {
    store: kv::Store,
    key: String,
    /// The revision of the key as this bridge last saw it; 0: the key did not exist.
    revision: u64,
    /// What it holds, if anything.
    next: Option<i64>,
}

impl PartitionOffset {
    /// Reads the key.
    pub async fn load(store: kv::Store, key: String) -> Result<PartitionOffset, OffsetError> {
        let (revision, next) = read(&store, &key).await?;
        Ok(PartitionOffset { store, key, revision, next })
    }

    /// The committed next offset, if any was ever committed.
    pub fn next(&self) -> Option<i64> {
        self.next
    }

    /// Stores `next` as the committed next offset, if this bridge still owns the key.
    pub async fn commit(&mut self, next: i64) -> Result<(), OffsetError> {
        let value =
            Bytes::from(serde_json::to_vec(&Committed { version: VERSION, next_offset: next }).unwrap_or_default());
        let written = if self.revision == 0 {
            self.store.create(&self.key, value).await.map_err(|e| match e.kind() {
                kv::CreateErrorKind::AlreadyExists => None,
                _ => Some(OffsetError::Nats(format!("create {}: {e}", self.key))),
            })
        } else {
            self.store.update(&self.key, value, self.revision).await.map_err(|e| match e.kind() {
                kv::UpdateErrorKind::WrongLastRevision => None,
                _ => Some(OffsetError::Nats(format!("update {}: {e}", self.key))),
            })
        };
        match written {
            Ok(revision) => {
                self.revision = revision;
                self.next = Some(next);
                Ok(())
            }
            Err(Some(e)) => Err(e),
            // Someone wrote the key since: this bridge's own earlier attempt (its ack was
            // lost) if it holds exactly `next`, else another writer.
            Err(None) => {
                let (revision, found) = read(&self.store, &self.key).await?;
                if found == Some(next) {
                    self.revision = revision;
                    self.next = found;
                    Ok(())
                } else {
                    Err(OffsetError::Fenced { key: self.key.clone(), found, expected: self.revision })
                }
            }
        }
    }
}

async fn read(store: &kv::Store, key: &str) -> Result<(u64, Option<i64>), OffsetError> {
    let entry = store.entry(key).await.map_err(|e| OffsetError::Nats(format!("read {key}: {e}")))?;
    match entry {
        Some(e) if e.operation == kv::Operation::Put => {
            let c: Committed = serde_json::from_slice(&e.value)
                .map_err(|why| OffsetError::Corrupt { key: key.to_owned(), why: why.to_string() })?;
            if c.version != VERSION || c.next_offset < 0 {
                return Err(OffsetError::Corrupt {
                    key: key.to_owned(),
                    why: format!("version {} offset {}", c.version, c.next_offset),
                });
            }
            Ok((e.revision, Some(c.next_offset)))
        }
        // Deleted or purged: as if never written, but the next write must follow the marker.
        Some(e) => Ok((e.revision, None)),
        None => Ok((0, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_the_stored_format() {
        assert_eq!(key("htfaas", "billing", 3), "htfaas.billing.3");
        assert_eq!(key("site-a", "dcache.billing", 0), "site-a.dcache.billing.0");
        let c = Committed { version: VERSION, next_offset: 42 };
        assert_eq!(serde_json::to_string(&c).expect("json"), r#"{"version":1,"next_offset":42}"#);
    }
}
