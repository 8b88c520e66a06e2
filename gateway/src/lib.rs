//! The gateway: where storage events become jobs, and the HTTP API of htfaas.
//!
//! - [`ingest`] reads storage events (dCache billing messages, CloudEvents from htfaas's
//!   bridges and other producers) from durable JetStream consumers (the default lane, and one
//!   lane per owner with a function: [`lanes`]), normalizes those the site
//!   enabled ([`htfaas_functions::sources`], [`htfaas_functions::sources::SourcePolicy`]), finds the functions whose trigger matches
//!   ([`triggers`]) and queues one durable firing per function ([`firing`]: exactly once per
//!   (event, function, digest)); it acks the message once the firings are on disk.
//! - `dispatch` turns firings into jobs, within each trigger's rate and debounce: builds each
//!   job ([`jobs`]: namespace check, a read and a write macaroon from the storage,
//!   [`storage_client`]), mints a single-use submit token and submits the job to the scheduler
//!   (`submit`).
//! - [`api`] serves the registry (modules and functions) and proxies job and accounting queries
//!   to the scheduler; its credentials are checked by `auth`, its errors are
//!   `http_error::HttpError`.
//! - `dead_letters` feeds failed jobs (the scheduler's job-end notifications) into the
//!   dead-letter list kept beside the firing table ([`firing`]), where refused
//!   firings enter in their refusal's transaction; [`api`] lists, shows, re-drives and drops.
//!   `checkpoint_sweep` clears the checkpoint areas of jobs that failed or were removed away
//!   from an EP, from the same notifications.
//! - `warm` tells the scheduler which modules registered functions use, for EPs to compile
//!   ahead of their first event.
//! - `config` is the configuration file; `state` resolves it into what all of the above
//!   share ([`Shared`]), with the HTTP clients of `clients`.
//!
//! - [`oidc`] verifies the site's OIDC tokens; [`identities`] maps them to owners with the
//!   site's identity map and binds each owner to its identity.
//!
//! Layers, bottom up (a module imports only from its own layer or below): the leaves (`stats`,
//! `triggers`, `storage_client`, `clients`, `http_error`, `oidc`, ...; events are decoded by
//! [`htfaas_functions::sources`], and the bridges are the crate `htfaas-bridges`),
//! records and grants (`audit`, `namespaces`, `submit`, `auth`, `config`, `secrets`), the firing table
//! (`firing`) and job building (`jobs`), `state` and `identities`, then the steps that take it (`ingest`,
//! `dispatch`, `replay`, `checkpoint_sweep`), and `api` on top; nothing imports `api`.
//!
//! Invariants: the gateway never runs wasm and never talks to an EP; it never logs a macaroon, a
//! token or a function secret, only their ids or names.

pub mod api;
pub mod audit;
mod auth;
mod backfill;
mod checkpoint_sweep;
mod clients;
mod collecting;
mod config;
mod console;
mod dead_letters;
mod dispatch;
pub mod firing;
mod http_error;
pub mod identities;
pub mod ingest;
pub mod jobs;
pub mod lanes;
pub mod listing;
mod metrics;
pub mod namespaces;
pub mod oidc;
pub mod openapi;
pub mod replay;
mod schedules;
mod secrets;
mod state;
mod stats;
pub mod storage_client;
mod submit;
#[cfg(test)]
mod testing;
pub mod triggers;
mod warm;
mod webhook_feed;
mod webhooks;

pub use clients::{http_client, http_client_trusting, scheduler_http_client, storage_http_client};
pub use config::{Config, default_audit_checkpoint_records, default_audit_checkpoint_s};
pub use state::{Settings, Shared};

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

/// Samples the counters into [`Shared::history`] every [`stats::HISTORY_INTERVAL`] until
/// `shutdown`.
async fn sample_stats(shared: std::sync::Arc<Shared>, shutdown: CancellationToken) {
    let mut every = tokio::time::interval(stats::HISTORY_INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => shared.history.record(htfaas_functions::time::now_ms(), &shared.stats.snapshot()),
        }
    }
}

/// Runs the gateway until `shutdown` is cancelled: the ingest loop, the firing dispatcher
/// (`dispatch`) and the API.
///
/// Shutdown order: stop taking events (the in-flight batch finishes: its firings are committed
/// and its messages acked, or they are left for redelivery), stop the API, let the submissions in flight
/// finish (pending firings stay in the table for the next start), return.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let Settings {
        listener,
        shared,
        nats_url,
        nats_credential,
        consumer,
        max_deliver,
        events_stream_replicas,
        http,
        tls,
    } = settings;
    let credential = nats_credential.as_ref();
    let (default_lane, stream) = ingest::connect_with(
        &nats_url,
        credential,
        &consumer,
        max_deliver,
        events_stream_replicas,
        Some(shared.clone()),
    )
    .await?;
    let lanes = lanes::Lanes::start(stream, &consumer, max_deliver, shared.clone(), shutdown.child_token()).await?;
    tracing::info!(addr = %listener.local_addr()?, tls = tls.is_some(), nats = %nats_url, pending = shared.firings.pending(), "gateway ready");
    let ingest = tokio::spawn(ingest::run(default_lane, shared.clone(), shutdown.child_token()));
    let dispatch = tokio::spawn(dispatch::dispatch(shared.clone(), shutdown.child_token()));
    // Scheduled functions fire on their ticks.
    let schedules = tokio::spawn(schedules::run(shared.clone(), shutdown.child_token()));
    // Collecting triggers' groups fire after their quiet period, or expire.
    let collecting = tokio::spawn(collecting::run(shared.clone(), shutdown.child_token()));
    // EPs compile registered functions' modules ahead of their first event.
    let warm = tokio::spawn(warm::run(shared.clone(), shutdown.child_token()));
    // The identity map, reloaded when its file changes (with OIDC issuers only).
    let map_watch = {
        let shared = shared.clone();
        let stop = shutdown.child_token();
        tokio::spawn(async move {
            if let Some(ids) = &shared.identities {
                identities::watch(ids, &shared.registry, &shared.namespaces, stop).await;
            }
        })
    };
    // The counters' history, for the console's event-flow chart.
    let sampler = tokio::spawn(sample_stats(shared.clone(), shutdown.child_token()));
    // Failed jobs into the dead-letter list, from the scheduler's notifications, on a
    // connection of their own.
    let dlq_client = htfaas_functions::nats::connect_options("htfaas-gateway-dlq", credential)
        .retry_on_initial_connect()
        .connect(htfaas_functions::nats::servers(&nats_url)?)
        .await
        .context("connect to NATS for the dead-letter feed")?;
    let dead_letters = tokio::spawn(dead_letters::run(
        async_nats::jetstream::new(dlq_client.clone()),
        consumer.clone(),
        shared.clone(),
        shutdown.child_token(),
    ));
    // Failed jobs to their functions' webhooks, on the same connection.
    let webhooks = tokio::spawn(webhook_feed::run(
        async_nats::jetstream::new(dlq_client.clone()),
        consumer.clone(),
        shared.clone(),
        shutdown.child_token(),
    ));
    // Failed and removed jobs' checkpoint areas cleared, on the same connection.
    let checkpoints = tokio::spawn(checkpoint_sweep::run(
        async_nats::jetstream::new(dlq_client),
        consumer.clone(),
        shared.clone(),
        shutdown.child_token(),
    ));
    // Replays, dry runs and `fn test --seq` read the recorded events on a connection of their own.
    let events = replay::Events::connect(&nats_url, credential).await?;
    let app = api::router(shared.clone())
        .layer(axum::middleware::from_fn_with_state(shared, api::metrics::count_refusals))
        .layer(axum::Extension(events))
        .layer(axum::Extension(lanes.clone()));
    // Slow heads, stalled bodies and connection floods: `http`'s limits; HTTPS when configured.
    let served = htfaas_functions::serve::serve_tcp(listener, tls, app, http, shutdown.clone())
        .await
        .context("serve the gateway API");
    shutdown.cancel();
    let ingested = ingest.await.context("join the ingest loop")?;
    lanes.stop().await;
    let dispatched = dispatch.await.context("join the firing dispatcher")?;
    let _ = warm.await;
    let _ = schedules.await;
    let _ = collecting.await;
    let _ = sampler.await;
    let _ = map_watch.await;
    let _ = dead_letters.await;
    let _ = webhooks.await;
    let _ = checkpoints.await;
    tracing::info!("gateway stopped");
    served?;
    ingested?;
    dispatched
}
