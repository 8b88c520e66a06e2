//! The registry of functions, and what every htfaas component shares.
//!
//! This crate is the one owner of the types that cross a process boundary:
//! - [`proto`]: the wire messages between gateway, scheduler and execution points (EPs),
//!   and the names of the NATS stream and subject that carry storage events;
//! - [`token`]: the claims of submit tokens and attach tokens (JWT, EdDSA), minting and
//!   verification;
//! - [`event`]: storage events normalized from every source, which trigger rules read;
//! - [`trigger`]: the trigger rule language (path globs, prefixes and suffixes, message type,
//!   storage class, size, owner, with `and`, `or`, `not`), parsed once, evaluated per event;
//! - [`digest`], [`manifest`], [`registry`]: functions as content-addressed wasm modules with
//!   versioned manifests, stored in SQLite plus a blob directory;
//! - [`audit`]: the audit trail: one hash-chained, append-only log per writer (SQLite), signed
//!   checkpoints, lineage queries and the verifier that names the first tampered record;
//! - [`store`]: what the SQLite stores of the other crates share (stepwise migration).
//! - `nats` (feature `nats`): NATS nkey credentials and the connect options every NATS client
//!   of htfaas is built from;
//! - `serve` (feature `serve`): the HTTP listener loop of every server, with its header and
//!   body timeouts and connection cap.
//!
//! Nothing outside this crate derives `Serialize` for a wire type.

pub mod audit;
pub mod digest;
pub mod event;
pub mod macaroon;
pub mod manifest;
pub mod metrics;
pub mod namespace;
#[cfg(feature = "nats")]
pub mod nats;
pub mod proto;
pub mod registry;
#[cfg(feature = "serve")]
pub mod serve;
pub mod store;
pub mod token;
pub mod trigger;

pub use digest::Digest;
pub use manifest::{FunctionManifest, FunctionRecord, Resources, Trigger};
pub use registry::{Registry, RegistryError};
