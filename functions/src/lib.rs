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
//!   [`glob`]: the one glob dialect of trigger paths;
//! - [`digest`], `resources`, [`manifest`], [`namespace`], `registry` (feature `db`):
//!   functions as content-addressed wasm modules with versioned manifests, stored in SQLite
//!   plus a blob directory; [`on_failure`]: what a function asks for when a run fails (its
//!   retry policy, what becomes of its outputs, the quarantine directory);
//!   [`identity_map`]: the site's identity map (a verified OIDC identity → owner, accounting
//!   groups, grants);
//! - [`audit`]: the audit trail: record format, drafts and signed checkpoints; with feature
//!   `db`, one hash-chained, append-only log per writer (SQLite), lineage queries and the
//!   verifier that names the first tampered record; `audit_kinds`: the constructor of every
//!   record kind the gateway and the scheduler write;
//! - [`store`]: what the stores of the other crates share (private state files, durability;
//!   with feature `db`, SQLite's stepwise migration); [`time`]: wall-clock time and UTC dates;
//!   [`trace`]: the W3C `traceparent` of each event and hop; [`spans`]: a job's span tree from
//!   its records;
//! - [`macaroon`], [`metrics`]: the macaroon codec, the metrics encoding;
//! - `nats` (feature `nats`): NATS nkey credentials and the connect options every NATS client
//!   of htfaas is built from; `sources` (feature `nats`): storage events as their sources send
//!   them (dCache billing, CloudEvents with their NATS headers), one decision per message;
//! - `nats_server` (feature `nats-server`): a real nats-server as a child process, the one
//!   harness of the local stack, the benches and the tests;
//! - `serve` (feature `serve`): the HTTP listener loop of every server, with its header and
//!   body timeouts and connection cap.
//!
//! Nothing outside this crate derives `Serialize` for a wire type.
//!
//! Feature `db` (off by default) builds everything that needs SQLite (`rusqlite`): the
//! registry, the audit trail's store, queries and verifier, the stores' migration. Crates
//! without a database (the EP) leave it off.

pub mod audit;
mod audit_kinds;
pub mod checkpoint;
pub mod collect;
pub mod digest;
pub mod event;
pub mod glob;
pub mod identity_map;
pub mod macaroon;
pub mod manifest;
pub mod metrics;
pub mod namespace;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "nats-server")]
pub mod nats_server;
pub mod on_failure;
pub mod percent;
pub mod proto;
#[cfg(feature = "db")]
pub mod registry;
mod resources;
pub mod schedule;
pub mod seal;
#[cfg(feature = "serve")]
pub mod serve;
#[cfg(feature = "nats")]
pub mod sources;
pub mod spans;
pub mod store;
pub mod time;
pub mod token;
pub mod trace;
pub mod trigger;

pub use digest::Digest;
pub use manifest::{FunctionManifest, FunctionRecord, Trigger};
#[cfg(feature = "db")]
pub use registry::{Registry, RegistryError};
pub use resources::Resources;
