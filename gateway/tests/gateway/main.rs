//! The gateway's integration tests, one binary: the admin proxies against a fake scheduler,
//! the dCache SSE bridge against a fake frontend and a real nats-server, the owners' ingest
//! lanes against a real nats-server, and the property tests of the exactly-once keys.

mod admin_proxy;
mod lanes;
mod prop_dedupe;
