//! Bridges: small processes that read a storage system's own event channel and publish each
//! event as a CloudEvent on NATS JetStream (subject
//! `storage.cloudevents.<source>`, see [`htfaas_functions::proto::CLOUDEVENTS_SUBJECT_PREFIX`]),
//! where the gateway's ingest reads it like any other source.
//!
//! - [`xrootd`]: XRootD `ofs.notify` lines (`closew`, `create`, `rm`, `mv`, …), from the notify
//!   program's stdin or a FIFO: `htfaas bridge xrootd-notify`. Each event gets its CloudEvent id
//!   when its line is read and is published with that id as `Nats-Msg-Id` until JetStream
//!   acknowledges it (at least once from then on); xrootd itself drops events when its bounded
//!   notify queue is full, so a bridge that stops reading loses events upstream;
//! - [`sse`]: dCache's frontend storage events (SSE `inotify` channel), resuming with
//!   `Last-Event-ID` and reporting event loss: `htfaas bridge dcache-sse`.

pub mod sse;
pub mod xrootd;
