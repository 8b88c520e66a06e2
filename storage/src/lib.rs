//! htfaas's built-in, small **dCache-compatible storage endpoint**.
//!
//! It serves a directory over HTTP the way a dCache WebDAV door does for the few operations
//! htfaas needs, so the rest of htfaas cannot tell it from dCache:
//!
//! - `GET`/`PUT` of files, authorized by HTTP Basic users (`auth`) or by dCache macaroons
//!   ([`macaroons`]) presented as `Authorization: Bearer` or `?authz=`;
//! - `POST` with `Content-Type: application/macaroon-request` issues macaroons (dCache protocol);
//! - every completed upload is published as a dCache billing `transfer` message (`billing`)
//!   on NATS JetStream before the `PUT` is answered.
//!
//! Entry points: [`Config::resolve`] → [`Settings`] → [`run`]. Code map: `paths` (request
//! paths, prefix and chaining rules), `fs` (the namespace on disk; never leaves `data_dir`),
//! `routes` (one file per operation), `error` (status mapping).
//!
//! Invariants: `macaroons` is the only module that touches the `macaroon` crate; no request
//! reads or writes outside `data_dir`; a `PUT` is answered only after its file is durable and,
//! with NATS configured, its event acknowledged (else 503, after at most a few seconds); a
//! `PUT` the disk cannot hold answers 507 and leaves neither a file nor an event behind.

mod auth;
mod billing;
mod config;
mod error;
mod fs;
pub mod macaroons;
mod paths;
mod routes;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

pub use config::{Config, Settings};

/// How long in-flight requests may run after shutdown is requested.
const EXIT_DEADLINE: Duration = Duration::from_secs(8);

/// Serves until `shutdown` is cancelled, then stops accepting, lets in-flight requests finish
/// (at most `EXIT_DEADLINE`) and flushes NATS.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let Settings {
        listener,
        local_addr,
        data_dir,
        key,
        users,
        jetstream,
        public_url,
        cell_name,
        billing_path_subjects,
        durability,
        http,
        tls,
    } = settings;
    let state = Arc::new(routes::AppState {
        data_dir,
        key,
        users,
        billing: billing::Billing::new(jetstream, cell_name.clone(), billing_path_subjects),
        public_url,
        cell_name,
        durability,
    });
    // A killed predecessor's half-written uploads are no files: removed in the background (only
    // those older than this start, so none of this process's own).
    let (root, started) = (state.data_dir.clone(), std::time::SystemTime::now());
    tokio::task::spawn_blocking(move || {
        let removed = fs::remove_stale_uploads(&root, started);
        if removed > 0 {
            tracing::info!(removed, "removed uploads a previous process left unfinished");
        }
    });
    let app = routes::router(state.clone());
    // Slow heads, stalled uploads and connection floods: `http`'s limits; HTTPS when configured.
    let serve = htfaas_functions::serve::serve_tcp(listener, tls, app, http, shutdown.clone());
    let mut server = tokio::spawn(serve);
    tracing::info!(%local_addr, "storage serving");
    let deadline = async {
        shutdown.cancelled().await;
        tracing::info!("storage shutting down: no new connections; draining in-flight requests");
        tokio::time::sleep(EXIT_DEADLINE).await;
    };
    tokio::select! {
        joined = &mut server => joined.context("storage server task")?.context("serve HTTP")?,
        () = deadline => {
            tracing::warn!("requests still running after {EXIT_DEADLINE:?}; exiting anyway");
            server.abort();
        }
    }
    state.billing.flush().await;
    tracing::info!("storage stopped");
    Ok(())
}
