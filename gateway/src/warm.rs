//! Compile ahead: the gateway tells the scheduler which modules registered
//! functions use (`POST /v1/modules/warm`, [`crate::submit::Submitter::warm`]), so that EPs
//! compile a new version before its first event rather than on its path. Said for a function
//! when it is registered ([`announce`]), and for every registered function when the gateway
//! starts and every [`REPEAT`] after ([`run`]), so a scheduler that restarted (its warm list is
//! kept in memory) learns them again; the scheduler tells EPs only of modules new to its list.
//!
//! A failure is logged and left to the next round: a module not warmed is compiled by its first
//! job, as before. Must not know: routes, the firing table, how EPs compile.

use crate::state::Shared;
use htfaas_functions::FunctionRecord;
use htfaas_functions::proto::WarmRequest;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often every registered function's module is said again.
pub const REPEAT: Duration = Duration::from_secs(600);

fn request(shared: &Shared, record: &FunctionRecord) -> WarmRequest {
    let digest = record.manifest.module.clone();
    WarmRequest { module_url: format!("{}/v1/modules/{digest}", shared.public_url), digest }
}

async fn tell(shared: &Shared, record: &FunctionRecord) {
    // A native function's image is not compiled; its first job on an EP fetches and unpacks it.
    if !record.manifest.runtime.is_wasm() {
        return;
    }
    let req = request(shared, record);
    match shared.submitter.warm(&record.manifest.owner, &req).await {
        Ok(r) => tracing::debug!(function = %record.manifest.name, digest = %req.digest.short(), eps = r.eps,
            new = r.new, "module announced to the scheduler for compiling ahead"),
        Err(e) => tracing::warn!(function = %record.manifest.name, digest = %req.digest.short(),
            "failed to announce the module for compiling ahead (its first job compiles it): {e}"),
    }
}

/// Announces `record`'s module in the background (the registration is not held up).
pub fn announce(shared: &Arc<Shared>, record: &FunctionRecord) {
    let (shared, record) = (shared.clone(), record.clone());
    tokio::spawn(async move { tell(&shared, &record).await });
}

/// Announces every registered function's module now and every [`REPEAT`], until `shutdown`.
pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(REPEAT);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let s = shared.clone();
        let records = match tokio::task::spawn_blocking(move || s.registry.list()).await {
            Ok(Ok(records)) => records,
            Ok(Err(e)) => {
                tracing::warn!("failed to list the functions to announce for compiling ahead: {e}");
                continue;
            }
            Err(e) => {
                tracing::warn!("the registry listing task failed: {e}");
                continue;
            }
        };
        for record in &records {
            if shutdown.is_cancelled() {
                return;
            }
            tell(&shared, record).await;
        }
    }
}
