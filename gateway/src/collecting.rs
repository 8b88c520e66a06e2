//! The clock of collecting triggers' groups: every second, the groups whose quiet period is
//! over fire and those past their timeout expire
//! ([`Firings::sweep_groups`](crate::firing::Firings::sweep_groups), one transaction
//! per sweep). Groups completed by a count or a marker fire in the ingest's own transaction
//! and need no clock.
//!
//! Must not know: NATS (`async_nats`), HTTP (`axum`), the firing table's SQL (`rusqlite`), the
//! consumer loop.

use crate::firing::now_ms;
use crate::state::Shared;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the groups are looked at: a quiet period or a timeout ends within this.
const EVERY: Duration = Duration::from_secs(1);

/// Sweeps the groups every [`EVERY`] until `shutdown`. A failed sweep is logged and tried
/// again at the next one: nothing of it was written.
pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
        let table = shared.firings.clone();
        match tokio::task::spawn_blocking(move || table.sweep_groups(now_ms())).await {
            Ok(Ok(swept)) => {
                shared.stats.groups_quiet.fetch_add(swept.fired, Ordering::Relaxed);
                shared.stats.groups_expired.fetch_add(swept.expired, Ordering::Relaxed);
                if swept.fired + swept.expired > 0 {
                    tracing::info!(fired = swept.fired, expired = swept.expired, "collecting groups closed");
                }
            }
            Ok(Err(e)) => tracing::warn!("collecting groups: sweep failed, tried again: {e}"),
            Err(e) => tracing::error!("collecting groups: the sweep's task failed: {e}"),
        }
    }
}
