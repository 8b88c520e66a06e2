//! The dispatcher: one task that turns idle jobs into Assign messages.
//!
//! Woken (a [`tokio::sync::Notify`] permit) on submit, attach and finish, and on a slow tick
//! that also prunes expired token-use counts. Each round reads a bounded batch of idle jobs,
//! asks [`crate::matching::select`] where they go, reserves the EPs' resources, marks the jobs
//! running in the store (one transaction per EP), and only then sends the Assign. A send that
//! fails (the EP just left) puts the job back to idle.
//!
//! Cancel safety: the loop only waits (and so only observes shutdown) between rounds; a
//! round runs to the end, so no job is left reserved in memory but not sent.

use crate::Shared;
use crate::matching::{Match, select};
use htfaas_functions::proto::SchedulerMsg;
use htfaas_functions::token::{LEEWAY_S, now_s};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Most idle jobs read per round (per owner with a dedicated EP, plus once overall).
pub const BATCH: usize = 256;
/// How often the dispatcher runs without being woken (and prunes token uses).
pub const TICK: Duration = Duration::from_secs(60);

/// Runs until `shutdown`.
pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = shared.wake.notified() => {}
            _ = tick.tick() => {
                match shared.queue.prune_token_uses(now_s().saturating_sub(LEEWAY_S + 60)).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(rows = n, "pruned use counts of expired tokens"),
                    Err(e) => tracing::warn!("failed to prune token uses: {e}"),
                }
            }
        }
        loop {
            match round(&shared).await {
                Ok(0) => break,
                Ok(_) if shutdown.is_cancelled() => break,
                Ok(_) => continue,
                Err(e) => {
                    tracing::error!("failed to dispatch: {e:#}");
                    break;
                }
            }
        }
    }
    tracing::info!("dispatcher stopped");
}

/// One round; returns how many jobs were sent.
#[tracing::instrument(name = "scheduler.dispatch", skip_all, fields(sent = tracing::field::Empty))]
async fn round(shared: &Shared) -> anyhow::Result<usize> {
    let (room, owners) = {
        let eps = shared.eps();
        let Some(room) = eps.largest_room() else { return Ok(0) };
        (room, eps.restricted_owners_with_room())
    };
    let idle = shared.queue.idle_candidates(owners, room, BATCH).await?;
    if idle.is_empty() {
        return Ok(0);
    }
    // Decide and reserve under one lock, so nothing else can take the same room.
    let mut per_ep: BTreeMap<String, (String, Vec<Match>)> = BTreeMap::new();
    {
        let mut eps = shared.eps();
        for m in select(&idle, &eps) {
            let Some(name) = eps.get(&m.ep_id).map(|e| e.name.clone()) else {
                continue;
            };
            if eps.reserve(&m) {
                per_ep.entry(m.ep_id.clone()).or_insert_with(|| (name, Vec::new())).1.push(m);
            }
        }
    }
    let mut sent = 0;
    for (ep_id, (name, matches)) in per_ep {
        sent += assign(shared, &ep_id, name, matches).await;
    }
    tracing::Span::current().record("sent", sent);
    Ok(sent)
}

/// Marks `matches` running on `ep_id` and sends them; undoes what could not be sent.
#[tracing::instrument(name = "scheduler.assign", skip_all, fields(ep.id = %ep_id, ep.name = %name, jobs = matches.len()))]
async fn assign(shared: &Shared, ep_id: &str, name: String, matches: Vec<Match>) -> usize {
    let ids: Vec<String> = matches.iter().map(|m| m.job_id.clone()).collect();
    let marked = match shared.queue.mark_running(ids.clone(), name, ep_id.to_owned()).await {
        Ok(m) => m,
        Err(e) => {
            tracing::error!("failed to mark jobs running: {e}");
            let mut eps = shared.eps();
            for id in &ids {
                eps.release(ep_id, id);
            }
            return 0;
        }
    };
    let tx = shared.eps().get(ep_id).map(|e| e.tx.clone());
    let mut unsent = Vec::new();
    let mut sent = 0;
    for a in marked.assigned {
        let job_id = a.job_id.clone();
        match &tx {
            Some(tx) if tx.send(SchedulerMsg::Assign(a)).is_ok() => {
                tracing::info!(job.id = %job_id, "assigned");
                sent += 1;
            }
            _ => unsent.push(job_id),
        }
    }
    {
        let mut eps = shared.eps();
        for id in marked.skipped.iter().chain(&unsent) {
            eps.release(ep_id, id);
        }
    }
    if !unsent.is_empty() {
        tracing::info!(jobs = unsent.len(), "EP left before its jobs were sent; back to idle");
        if let Err(e) = shared.queue.revert_to_idle(unsent, ep_id.to_owned()).await {
            tracing::error!("failed to put unsent jobs back to idle: {e}");
        }
    }
    sent
}
