//! The gateway's integration tests, one binary: the admin proxies against a fake scheduler,
//! the dCache SSE bridge against a fake frontend and a real nats-server, the Kafka bridge's
//! offsets in a real nats-server's key-value bucket, the owners' ingest
//! lanes against a real nats-server, and the property tests of the exactly-once keys.

mod admin_proxy;
mod bridge_kafka_offsets;
mod bridge_sse;
mod lanes;
mod prop_dedupe;
