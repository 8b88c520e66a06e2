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
//!   `htfaas bridge dcache-kafka` (with the crate's `kafka` feature: librdkafka, a C build).
//!
//! A crate of its own, so the gateway (the event path and its API) builds without librdkafka.
//! [`nats`]: the connection every bridge publishes on. The events are decided and routed with
//! the gateway's own decoders ([`htfaas_functions::sources`]).
//!
//! Must not know: the gateway, the scheduler, the EP.

#[cfg(feature = "kafka")]
pub mod kafka;
pub mod nats;
pub mod sse;
pub mod xrootd;
