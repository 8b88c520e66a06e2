//! The dispatcher: one task that turns idle jobs into Assign messages.
//!
//! Woken (a [`tokio::sync::Notify`] permit) on submit, attach, finish, detach, revocation, job
//! and EP action, and by a [`HOUSEKEEPING`] tick, which also ends retry backoffs, removes jobs
//! running past their run time ([`crate::queue::Queue::remove_overdue`], stopping them on their
//! EP), signs a checkpoint of the audit trail when its policy says one is due and, every
//! [`TICK`], prunes expired token-use counts. Each round reads, per pool of EPs
//! with room, each owner's oldest idle jobs (leaving out owners at their running limit; best
//! fair-share priority first), asks `crate::matching::select` where they go (fair share,
//! group quotas, running limits, drains and pauses), reserves the EPs' resources, marks the
//! jobs running in the store (one write per EP, which also opens each job's attempt record;
//! committed, with whatever else is being written, before it returns), and only then sends the
//! Assign. A send that fails (the EP just left) puts the job back to
//! idle; a job stopped by a revocation in between is not sent at all.
//!
//! Every Assign carries attenuated macaroons ([`restrict`]): the stored ones plus a
//! `before:` caveat at dispatch time + the job's `runtime_s` + [`MACAROON_GRACE_S`], so what an
//! EP holds stops working soon after the job must have ended. When the job's request has
//! `bind_ep_address` (the gateway sets it only for storages that know dCache's `ip:` caveat),
//! an `ip:<address>` caveat follows, the address being the EP's as this scheduler saw it at
//! attach: the macaroons then work only from there (a copy that leaks from the EP is of no use
//! from another address). The stored macaroons stay as they were (a requeued job gets a fresh deadline, and
//! the address of the EP it runs on next). A macaroon that cannot be attenuated fails its job
//! at once, unsent and not retried.
//!
//! Prefetch: an EP granted a prefetch window is assigned, once no job fits free
//! resources anywhere, up to that many more jobs, which it queues (`crate::matching`). Such a
//! job is marked running (its `started_at_ms`: the job record's dispatched stamp, where the
//! bench's `hop.submitted_to_dispatched` ends and `hop.dispatched_to_finished` begins) when it
//! is assigned, before its EP starts it: its wait in the EP's queue, at most the granted wait
//! ([`crate::policy::MAX_PREFETCH_WAIT_S`]), counts as dispatched, and comes out of the
//! macaroons' [`MACAROON_GRACE_S`] and the overdue check's grace, both counted from here.
//!
//! Cancel safety: the loop only waits (and so only observes shutdown) between rounds; a
//! round runs to the end, so no job is left reserved in memory but not sent.

use crate::matching::{Delivery, Match, select};
use crate::metrics::Waiting;
use crate::queue::now_ms;
use crate::state::Shared;
use htfaas_functions::macaroon::attenuate;
use htfaas_functions::proto::JobAssignment;
use htfaas_functions::token::{LEEWAY_S, now_s};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often token uses are pruned.
pub const TICK: Duration = Duration::from_secs(60);
/// How often the dispatcher runs without being woken (retry backoffs end, overdue jobs are
/// removed).
pub const HOUSEKEEPING: Duration = Duration::from_secs(1);
/// How long after its job's runtime an EP's macaroons stay valid, seconds (fetching the module
/// and input before the run, storing outputs after it, and a prefetched job's wait to start).
pub const MACAROON_GRACE_S: u64 = 60;

// A prefetched job's wait takes at most half of its macaroons' grace.
const _: () = assert!(2 * crate::policy::MAX_PREFETCH_WAIT_S <= MACAROON_GRACE_S);

/// Runs until `shutdown`.
pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    // Submitted jobs waiting for their first Assign, for the latency histogram (an empty
    // stand-in should another dispatcher already hold them).
    let mut waiting = shared.metrics.take_waiting().unwrap_or_else(Waiting::detached);
    let mut tick = tokio::time::interval(HOUSEKEEPING);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_prune = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = shared.wake.notified() => {}
            _ = tick.tick() => {
                remove_overdue(&shared).await;
                match shared.queue.audit_checkpoint(shared.audit_signer.clone(), shared.audit_policy, false).await {
                    Ok(Some(cp)) => tracing::debug!(seq = cp.seq, "audit trail checkpointed"),
                    Ok(None) => {}
                    Err(e) => tracing::warn!("failed to checkpoint the audit trail: {e}"),
                }
                if last_prune.elapsed() >= TICK {
                    last_prune = tokio::time::Instant::now();
                    waiting.prune();
                    match shared.queue.prune_token_uses(now_s().saturating_sub(LEEWAY_S + 60)).await {
                        Ok(0) => {}
                        Ok(n) => tracing::debug!(rows = n, "pruned use counts of expired tokens"),
                        Err(e) => tracing::warn!("failed to prune token uses: {e}"),
                    }
                }
            }
        }
        loop {
            match round(&shared, &mut waiting).await {
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

/// Removes jobs running past their run time and grace, and tells their EPs to stop them.
async fn remove_overdue(shared: &Shared) {
    let grace_ms = shared.policy.runtime_grace_s.saturating_mul(1000);
    match shared.queue.remove_overdue(now_ms(), grace_ms).await {
        Ok(removed) => {
            let mut eps = shared.eps();
            for (job_id, session) in removed {
                tracing::warn!(job.id = %job_id, "removed: ran past its run time");
                eps.cancel(&session, &job_id, "the job exceeded its run time", true);
            }
        }
        Err(e) => tracing::warn!("failed to remove overdue jobs: {e}"),
    }
}

/// One round; returns how many jobs were sent.
#[tracing::instrument(name = "scheduler.dispatch", skip_all, fields(sent = tracing::field::Empty))]
async fn round(shared: &Shared, waiting: &mut Waiting) -> anyhow::Result<usize> {
    waiting.absorb();
    let pools = shared.eps().pools_with_room();
    if pools.is_empty() {
        return Ok(0);
    }
    let max_running = shared.limits.max_running;
    let usage = shared.queue.owner_usage().await?;
    let now = now_ms();
    let (at_limit, functions_at_limit, policy, priority) = {
        let eps = shared.eps();
        let policy = shared.policy.round(&eps, &usage, max_running, now);
        let cores = eps.cores_per_owner();
        let priority: HashMap<String, f64> = policy
            .real_priority
            .keys()
            .map(|o| (o.clone(), policy.effective(o, cores.get(o.as_str()).copied().unwrap_or(0))))
            .collect();
        (eps.owners_at_limit(max_running), eps.functions_at_limit(), policy, priority)
    };
    let idle = shared.queue.idle_candidates(pools, at_limit, functions_at_limit, priority, now).await?;
    if idle.is_empty() {
        return Ok(0);
    }
    // Decide and reserve under one lock, so nothing else can take the same room.
    let mut per_ep: BTreeMap<String, (String, IpAddr, Vec<Match>)> = BTreeMap::new();
    {
        let mut eps = shared.eps();
        for m in select(&idle, &eps, &policy) {
            let Some((name, ip)) = eps.get(&m.ep_id).map(|e| (e.name.clone(), e.ip)) else {
                continue;
            };
            if eps.reserve(&m) {
                per_ep.entry(m.ep_id.clone()).or_insert_with(|| (name, ip, Vec::new())).2.push(m);
            }
        }
    }
    let mut sent = 0;
    for (ep_id, (name, ip, matches)) in per_ep {
        sent += assign(shared, &ep_id, name, ip, matches, waiting).await;
    }
    tracing::Span::current().record("sent", sent);
    Ok(sent)
}

/// Marks `matches` running on `ep_id` (at `ip`) and sends them; undoes what could not be sent.
#[tracing::instrument(name = "scheduler.assign", skip_all, fields(ep.id = %ep_id, ep.name = %name, jobs = matches.len()))]
async fn assign(
    shared: &Shared,
    ep_id: &str,
    name: String,
    ip: IpAddr,
    matches: Vec<Match>,
    waiting: &mut Waiting,
) -> usize {
    let ids: Vec<String> = matches.iter().map(|m| m.job_id.clone()).collect();
    let prepare = move |a, bind: bool| restrict(a, now_s(), bind.then_some(ip)).map_err(|e| e.to_string());
    let marked = match shared.queue.mark_running(ids.clone(), name, ep_id.to_owned(), prepare).await {
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
    let mut unsent = Vec::new();
    let mut sent = 0;
    {
        let mut eps = shared.eps();
        for id in &marked.skipped {
            eps.release(ep_id, id);
        }
        for a in marked.assigned {
            let job_id = a.job_id.clone();
            match eps.deliver(ep_id, a) {
                Delivery::Sent => {
                    tracing::info!(job.id = %job_id, "assigned");
                    waiting.dispatched(&job_id, &shared.metrics.dispatch_latency);
                    sent += 1;
                }
                Delivery::Cancelled => tracing::info!(job.id = %job_id, "stopped before it was sent"),
                Delivery::Gone => {
                    eps.release(ep_id, &job_id);
                    unsent.push(job_id);
                }
            }
        }
    }
    if !unsent.is_empty() {
        tracing::info!(jobs = unsent.len(), "EP left before its jobs were sent; back to idle");
        if let Err(e) = shared.queue.revert_to_idle(unsent, ep_id.to_owned()).await {
            tracing::error!("failed to put unsent jobs back to idle: {e}");
        }
    }
    if !marked.skipped.is_empty() {
        // Room freed by skipped jobs may fit others.
        shared.wake.notify_one();
    }
    sent
}

/// Why [`restrict`] could not make the assignment an EP may see; the job fails with this
/// reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestrictError {
    /// A stored macaroon could not take the caveats.
    #[error("macaroon could not be attenuated: {0}")]
    Attenuate(htfaas_functions::macaroon::CodecError),
}

/// The assignment as an EP may see it at `now_s`: both macaroons attenuated with
/// `before:<now + runtime_s + grace>` and, with `bind_to`, then `ip:<bind_to>` (canonical, so
/// an IPv4 EP seen over an IPv6 socket is named by its IPv4 address); a renewable job's
/// `renew_until` cut to the same instant. Err is the reason the job fails. Renewed macaroons
/// (`crate::renew`) go through this too, with the job's dispatch time as `now_s`,
/// so they end at the same deadline and carry the same binding.
pub fn restrict(mut a: JobAssignment, now_s: u64, bind_to: Option<IpAddr>) -> Result<JobAssignment, RestrictError> {
    let until = now_s.saturating_add(a.resources.runtime_s).saturating_add(MACAROON_GRACE_S);
    // A renewable job is renewable up to the same deadline.
    a.renew_until = a.renew_until.map(|u| u.min(until));
    let mut caveats = vec![format!("before:{}", utc_timestamp(until))];
    if let Some(ip) = bind_to {
        caveats.push(format!("ip:{}", ip.to_canonical()));
    }
    let caveats: Vec<&str> = caveats.iter().map(String::as_str).collect();
    let input = a.input.as_mut().map(|i| &mut i.macaroon);
    let checkpoint = a.checkpoint.as_mut().map(|c| &mut c.macaroon);
    let all = input.into_iter().chain([&mut a.output.macaroon]).chain(checkpoint);
    for m in all.chain(a.refs.iter_mut().map(|r| &mut r.macaroon)) {
        *m = attenuate(m, &caveats).map_err(RestrictError::Attenuate)?;
    }
    Ok(a)
}

/// Latest instant [`utc_timestamp`] writes: 9999-12-31T23:59:59Z.
const MAX_TIMESTAMP_S: u64 = 253_402_300_799;

/// `YYYY-MM-DDTHH:MM:SSZ` (UTC, second precision, as dCache's `before:` caveat wants) of Unix
/// seconds; instants past the year 9999 are written as its last second.
pub fn utc_timestamp(unix_s: u64) -> String {
    htfaas_functions::time::utc_timestamp(unix_s.min(MAX_TIMESTAMP_S))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_seconds() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_timestamp(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_timestamp(951_868_799), "2000-02-29T23:59:59Z");
        assert_eq!(utc_timestamp(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(utc_timestamp(4_102_444_800), "2100-01-01T00:00:00Z");
        assert_eq!(utc_timestamp(1_234_567_890), "2009-02-13T23:31:30Z");
        assert_eq!(utc_timestamp(u64::MAX), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn restrict_binds_both_macaroons_to_the_canonical_address_after_the_deadline() {
        use htfaas_functions::macaroon::inspect;
        let a = crate::queue::assignment("j".into(), crate::testing::request("k"), 1);
        let before = format!("before:{}", utc_timestamp(1000 + a.resources.runtime_s + MACAROON_GRACE_S));
        let caveats_of = |bind_to: Option<IpAddr>| {
            let out = restrict(a.clone(), 1000, bind_to).expect("attenuates");
            [out.input.expect("an input").macaroon, out.output.macaroon].map(|m| inspect(&m).expect("parses"))
        };
        for (bind_to, ip) in [
            (None, None),
            (Some("127.0.0.1"), Some("ip:127.0.0.1")),
            (Some("::ffff:10.1.2.3"), Some("ip:10.1.2.3")),
            (Some("2001:db8::7"), Some("ip:2001:db8::7")),
        ] {
            for (caveats, original) in caveats_of(bind_to.map(|b| b.parse().expect("address")))
                .iter()
                .zip([&a.input.as_ref().expect("an input").macaroon, &a.output.macaroon])
            {
                let original = inspect(original).expect("parses");
                let mut expected = original.clone();
                expected.push(before.clone());
                expected.extend(ip.map(str::to_owned));
                assert_eq!(*caveats, expected, "{bind_to:?}");
            }
        }
    }
}
