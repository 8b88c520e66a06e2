//! The Kafka bridge's committed offsets against a real nats-server's key-value bucket: a commit
//! is a compare-and-set, so a second writer of the same key is fenced off, and a commit whose
//! acknowledgement was lost is recognised on its retry.

use async_nats::jetstream;
use htfaas_functions::nats_server::{NatsServer, find_binary};
use htfaas_functions::proto::KAFKA_OFFSETS_BUCKET;
use htfaas_gateway::bridge::kafka::{OffsetError, PartitionOffset, offset_key, open_bucket};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_of_a_partitions_offset_is_fenced_and_a_repeated_commit_is_recognised() {
    let binary = find_binary().expect("nats-server not found (set HTFAAS_NATS_SERVER)");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = tokio::task::block_in_place(|| NatsServer::start(&binary, dir.path(), 0)).expect("start nats-server");
    let js = jetstream::new(async_nats::connect(server.url()).await.expect("connect"));
    let bucket = open_bucket(&js, KAFKA_OFFSETS_BUCKET, 1).await.expect("make the bucket");
    // Opening again finds it.
    let again = open_bucket(&js, KAFKA_OFFSETS_BUCKET, 1).await.expect("open the bucket");
    let key = offset_key("htfaas", "billing", 0);

    let mut a = PartitionOffset::load(bucket.clone(), key.clone()).await.expect("load");
    let mut b = PartitionOffset::load(again, key.clone()).await.expect("load");
    assert_eq!((a.next(), b.next()), (None, None), "never committed");
    a.commit(0).await.expect("the first commit creates the key");
    a.commit(5).await.expect("then updates it");
    // b last saw no key: its commit of another offset finds a's value and is refused.
    match b.commit(3).await {
        Err(OffsetError::Fenced { key: k, found, expected }) => {
            assert_eq!((k.as_str(), found, expected), (key.as_str(), Some(5), 0));
        }
        other => panic!("not fenced: {other:?}"),
    }
    // The same offset as the key holds is taken as its own earlier write (a lost ack).
    b.commit(5).await.expect("its own value");
    assert_eq!(b.next(), Some(5));
    // Now a is the stale one.
    b.commit(9).await.expect("b moves on");
    let e = a.commit(6).await.expect_err("a is fenced");
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("changed by someone else"), "{e}");
    // A reload sees the last commit.
    let fresh = PartitionOffset::load(bucket, key).await.expect("reload");
    assert_eq!(fresh.next(), Some(9));
}
