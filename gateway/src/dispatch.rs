//! The dispatcher: claims ready firings from the table ([`crate::firing`]), turns each into a
//! job ([`crate::jobs::prepare`]: namespace, macaroons), mints its submit token, records its
//! credentials and write macaroon's provenance ([`credentials`], in the table's audit
//! trail), submits it to the scheduler ([`crate::submit`]) and records what came of it; signs
//! the audit trail's checkpoints; prunes expired keys.
//!
//! [`dispatch`] holds the gateway ([`Shared`]) for as long as it runs; each firing's task
//! borrows only what submitting it uses ([`Dispatcher`]), the checkpoints only the table and
//! the audit key.
//!
//! Must not know: NATS (the events come through the table), HTTP routes.

use crate::audit::Auditing;
use crate::firing::{Claimed, FiringWriter, Firings, Outcome, Write, now_ms};
use crate::jobs::{JobContext, JobError, event_ref, prepare, scheduler_dedupe_key};
use crate::state::Shared;
use crate::stats::Stats;
use crate::submit::{Batcher, SubmitError, Submitter};
use htfaas_functions::audit::{AuditDraft, MacaroonFacts, Subject};
use htfaas_functions::proto::{Cause, SubmitRequest};
use htfaas_functions::token::SubmitClaims;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the dispatcher prunes expired firings.
const PRUNE_EVERY: Duration = Duration::from_secs(30);
/// Longest the dispatcher sleeps without looking at the table.
const TICK: Duration = Duration::from_secs(1);
/// Longest the dispatcher waits for its in-flight submissions at shutdown.
const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// The subject of a claimed firing's job, before the scheduler names it: event, function,
/// digest, owner, input path (and the token, once minted).
pub fn firing_subject(c: &Claimed, jti: Option<&str>) -> Subject {
    let m = &c.function.manifest;
    Subject {
        token_jti: jti.map(str::to_owned),
        owner: Some(m.owner.clone()),
        function: Some(m.name.clone()),
        digest: Some(m.module.as_str().to_owned()),
        event_id: Some(c.event.id.clone()),
        paths: vec![c.event.path.clone()],
        ..Subject::default()
    }
}

/// The `token.minted` and `macaroons.obtained` records of a claimed firing's job: the token's
/// claims (never the token) and its macaroons' identifiers and caveats (never the macaroons);
/// a macaroon whose identifier cannot be read is named by its role under `unreadable`. And the
/// write macaroon's identifier when it could be read (each macaroon parsed once).
pub(crate) fn credentials(
    c: &Claimed,
    claims: &SubmitClaims,
    request: &SubmitRequest,
) -> ([AuditDraft; 2], Option<String>) {
    let subject = firing_subject(c, Some(&claims.jti));
    let minted = AuditDraft::token_minted(claims, subject.clone())
        .with_detail("firing", c.seq.into())
        .with_detail("function_version", c.function.version.into())
        .with_detail("replay", json!(c.replay));
    let mut facts = Vec::new();
    let mut unreadable = Vec::new();
    let mut write_id = None;
    // A run on no file has no read macaroon.
    let read = request.input.as_ref().map(|i| ("read", &i.macaroon));
    for (role, bearer) in read.into_iter().chain([("write", &request.output.macaroon)]) {
        match MacaroonFacts::from_bearer(role, bearer) {
            Ok(f) => {
                if role == "write" {
                    write_id = Some(f.identifier.clone());
                }
                facts.push(f);
            }
            Err(e) => {
                tracing::warn!(role, "a macaroon's identifier could not be read for the audit trail: {e}");
                unreadable.push(role);
            }
        }
    }
    // The read macaroon reaches the input (already the subject's path), the write macaroon the
    // output directory.
    let reaches = [c.function.manifest.outputs.dir.as_str()];
    let mut obtained = AuditDraft::macaroons_obtained(subject, &facts, &reaches).with_detail("firing", c.seq.into());
    if !unreadable.is_empty() {
        obtained = obtained.with_detail("unreadable", json!(unreadable));
    }
    ([minted, obtained], write_id)
}

/// What submitting one claimed firing uses of the gateway (`fire_one`), borrowed by its task
/// ([`Dispatcher::of`]): what building its job reads, the submitter (its tokens) and the
/// batcher (its posts), the firing table and the group commit its provenance and outcome are
/// recorded through, the counters.
#[derive(Clone, Copy)]
pub struct Dispatcher<'a> {
    /// What building a job reads ([`prepare`]).
    pub jobs: JobContext<'a>,
    /// Mints submit tokens.
    pub submitter: &'a Submitter,
    /// Posts jobs to the scheduler in batches (one per dispatcher).
    pub batcher: &'a Batcher,
    /// The durable firing table.
    pub firings: &'a Firings,
    /// The group commit of the firings' writes (one per dispatcher).
    pub writer: &'a FiringWriter,
    /// Counters.
    pub stats: &'a Stats,
}

impl<'a> Dispatcher<'a> {
    /// The parts of `shared` the dispatcher's steps use, writing through `writer`, posting
    /// through `batcher`.
    pub fn of(shared: &'a Shared, writer: &'a FiringWriter, batcher: &'a Batcher) -> Dispatcher<'a> {
        Dispatcher {
            jobs: shared.jobs(),
            submitter: &shared.submitter,
            batcher,
            firings: &shared.firings,
            writer,
            stats: &shared.stats,
        }
    }
}

/// Dispatches firings until `shutdown`: claims the ready ones, submits each in a task of its
/// own (at most `max_in_flight` at once), prunes expired keys now and then. Cancel-safe at its
/// waits; at shutdown it lets the submissions in flight finish (up to a deadline) and
/// returns; any left `submitting` are pending again at the next start.
pub async fn dispatch(shared: Arc<Shared>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let firings = shared.firings.clone();
    // Dropped when this returns; its thread commits what is queued, then ends.
    let writer = FiringWriter::start(firings.clone())?;
    // Its task ends once the firings' tasks, holding its clones, have ended.
    let batcher = shared.submitter.batcher();
    let max = firings.max_in_flight();
    let mut tasks = tokio::task::JoinSet::new();
    let mut last_prune: Option<Instant> = None;
    let mut last_checkpoint = Instant::now();
    while !shutdown.is_cancelled() {
        let room = max.saturating_sub(tasks.len());
        let mut claimed_ok = true;
        if room > 0 {
            match firings.call(move |f| f.claim(now_ms(), room)).await {
                Ok(claim) => {
                    shared.stats.firings_rate_delayed.fetch_add(claim.rate_delayed, Ordering::Relaxed);
                    shared.stats.jobs_refused.fetch_add(claim.unreadable, Ordering::Relaxed);
                    for c in claim.ready {
                        let (shared, writer, batcher) = (shared.clone(), writer.clone(), batcher.clone());
                        tasks.spawn(async move { fire_one(Dispatcher::of(&shared, &writer, &batcher), c).await });
                    }
                }
                Err(e) => {
                    claimed_ok = false;
                    tracing::warn!("could not claim firings (will retry): {e}");
                }
            }
        }
        if last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
            last_prune = Some(Instant::now());
            match firings.call(|f| f.prune(now_ms(), crate::firing::PRUNE_BATCH)).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(firings = n, "pruned expired firings"),
                Err(e) => tracing::warn!("could not prune firings: {e}"),
            }
        }
        if last_checkpoint.elapsed() >= TICK {
            last_checkpoint = Instant::now();
            checkpoint(&firings, &shared.audit, false).await;
        }
        shared.stats.firings_pending.store(firings.pending(), Ordering::Relaxed);
        let mut wait = TICK;
        // Sleep until the next firing is due, unless the table failed (then a tick) or every
        // slot is taken (then a finished task wakes us).
        if claimed_ok
            && tasks.len() < max
            && let Ok(Some(due)) = firings.call(|f| f.next_due_ms()).await
        {
            wait = wait.min(Duration::from_millis(due.saturating_sub(now_ms())));
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = firings.wake.notified() => {}
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                if let Err(e) = done {
                    tracing::error!("a firing's task failed: {e}");
                }
            }
            _ = tokio::time::sleep(wait) => {}
        }
    }
    let drained = tokio::time::timeout(DRAIN_DEADLINE, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(left = tasks.len(), "firings still submitting at shutdown; they are pending again at start");
        tasks.abort_all();
    }
    // The trail's last records are signed before the gateway stops.
    checkpoint(&firings, &shared.audit, true).await;
    tracing::info!("dispatcher stopped");
    Ok(())
}

/// Signs a checkpoint of the audit trail when one is due (or, `force`, whenever its head has
/// none); a failure is logged (the next tick tries again).
async fn checkpoint(firings: &Firings, audit: &Auditing, force: bool) {
    let a = audit.clone();
    match firings.call(move |f| f.checkpoint(&a.signer, a.policy, force)).await {
        Ok(Some(cp)) => tracing::debug!(seq = cp.seq, "audit checkpoint signed"),
        Ok(None) => {}
        Err(e) => tracing::warn!("could not sign an audit checkpoint (will retry): {e}"),
    }
}

/// Records the job's write macaroon (its identifier, `write_id` when already read) with the job's cause (this
/// function appended to its event's chain), so an event about a file it writes is recognised,
/// together with the audit records of its credentials (`records`), through the group commit;
/// returns once committed. A macaroon whose identifier cannot be read is refused (the guard
/// could not work); a failed write is transient.
async fn record_provenance(
    writer: &FiringWriter,
    c: &Claimed,
    write_macaroon: &str,
    write_id: Option<String>,
    records: Vec<AuditDraft>,
) -> Result<(), JobError> {
    let macaroon = match write_id {
        Some(id) => id,
        // Its facts were not kept (unreadable, or refused as secret-looking): read it alone.
        None => htfaas_functions::macaroon::identifier(write_macaroon).map_err(|e| {
            JobError::Permanent(format!("the storage's write macaroon has no readable identifier: {e}"))
        })?,
    };
    let m = &c.function.manifest;
    let mut chain = c.cause.as_ref().map(|cause| cause.chain.clone()).unwrap_or_default();
    chain.push(m.name.clone());
    // What the job's outputs fire continues this firing's trace.
    let trace = Some(crate::jobs::gateway_span(&c.event, c.cause.as_ref(), &m.name).to_string());
    let cause =
        Cause { function: m.name.clone(), digest: m.module.clone(), event_id: c.event.id.clone(), chain, trace };
    writer
        .write(Write::Provenance { macaroon, cause, records })
        .await
        .map(|_| ())
        .map_err(|e| JobError::Transient(format!("record the write macaroon's provenance: {e}")))
}

/// Prepares and submits one claimed firing, and records what came of it, in the gateway's
/// span of the event's trace (its trace id on every log line).
async fn fire_one(d: Dispatcher<'_>, c: Claimed) {
    use tracing::Instrument as _;
    let span = crate::jobs::gateway_span(&c.event, c.cause.as_ref(), &c.function.manifest.name);
    let span = tracing::info_span!(
        "gateway.fire",
        trace_id = %span.trace_id_hex(),
        span_id = %span.span_id_hex(),
        function = %c.function.manifest.name,
    );
    fire_one_traced(d, c).instrument(span).await
}

async fn fire_one_traced(d: Dispatcher<'_>, c: Claimed) {
    let name = c.function.manifest.name.clone();
    let key = scheduler_dedupe_key(&c.event, &c.function, c.replay.as_deref());
    let event = event_ref(&c.event, c.cause.clone(), &name, c.created_ms);
    let outcome = match prepare(d.jobs, &c.function, crate::jobs::RunsAs::Owner, event, key, &c.members).await {
        // The token is minted, and recorded with the macaroons, before the submit.
        Ok(mut request) => {
            let m = &c.function.manifest;
            let minted = d.submitter.mint(&m.owner, m.group.as_deref(), &request).and_then(|(claims, token)| {
                // The job's renewal grant names its submit token.
                request.renewal = Some(d.submitter.grant(&m.owner, &claims.jti, &m.outputs.dir, &request)?);
                Ok((claims, token))
            });
            match minted {
                Err(e) => Err(JobError::Permanent(e.to_string())),
                Ok((claims, token)) => {
                    let (records, write_id) = credentials(&c, &claims, &request);
                    match record_provenance(d.writer, &c, &request.output.macaroon, write_id, records.to_vec()).await {
                        Err(e) => Err(e),
                        Ok(()) => match d.batcher.submit(&token, &request).await {
                            Ok(reply) => {
                                tracing::info!(job = %reply.job_id, jti = %claims.jti, created = reply.created, "job accepted");
                                Ok(reply)
                            }
                            Err(e @ (SubmitError::Unavailable(_) | SubmitError::Busy(_))) => {
                                Err(JobError::Transient(e.to_string()))
                            }
                            Err(e) => Err(JobError::Permanent(e.to_string())),
                        },
                    }
                }
            }
        }
        Err(e) => Err(e),
    };
    let seq = c.seq;
    let outcome = match outcome {
        Ok(reply) => {
            Stats::bump(if reply.created { &d.stats.jobs_submitted } else { &d.stats.jobs_deduplicated });
            Outcome::Submitted { job_id: reply.job_id }
        }
        Err(JobError::Transient(reason)) => {
            tracing::warn!(function = %name, seq, "transient failure, will retry: {reason}");
            Stats::bump(&d.stats.transient_failures);
            Outcome::RetryLater { reason }
        }
        Err(JobError::Permanent(reason)) => {
            tracing::error!(function = %name, path = %c.event.path, "job refused: {reason}");
            Stats::bump(&d.stats.jobs_refused);
            Outcome::Refused { reason }
        }
    };
    if let Err(e) = d.writer.write(Write::Outcome { seq, outcome }).await {
        // The row stays `submitting` until the next start re-submits it (the scheduler dedupes).
        tracing::error!(function = %name, seq, "could not record a firing's outcome: {e}");
    }
    d.stats.firings_pending.store(d.firings.pending(), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firing::{FiringState, backoff_ms};
    use crate::testing::{event, function};
    use std::path::Path;

    /// A stand-in on 127.0.0.1 answering every request with `status` and `body`.
    async fn answering(status: u16, body: serde_json::Value) -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let app = axum::Router::new().fallback(move || {
            let body = body.clone();
            async move { (axum::http::StatusCode::from_u16(status).expect("status"), axum::Json(body)) }
        });
        (url, tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") }))
    }

    /// A gateway whose storage and scheduler are at these URLs, its macaroon requests bounded
    /// by `storage_timeout`.
    async fn gateway(dir: &Path, storage: &str, scheduler: &str, storage_timeout: Duration) -> Arc<Shared> {
        let config: crate::config::Config = serde_json::from_value(serde_json::json!({
            "listen": "127.0.0.1:0", "nats_url": "nats://127.0.0.1:1",
            "registry_dir": dir.join("registry"), "storage_url": storage, "storage_user": "gateway",
            "scheduler_url": scheduler, "scheduler_admin_token": "s", "signing_key_file": dir.join("submit.pem"),
            "admin_token": "a",
            "namespaces": [{"principal": "alice", "right": "read", "value": "/data/"},
                {"principal": "alice", "right": "write", "value": "/out/"}],
        }))
        .expect("config");
        let mut settings = config.resolve().await.expect("resolve");
        let shared = Arc::get_mut(&mut settings.shared).expect("the only reference");
        let http = crate::clients::storage_http_client(None, None, None).expect("client");
        let auth = crate::storage_client::StorageAuth::Basic { user: "gateway".into(), secret: "s".into() };
        shared.storage = crate::storage_client::StorageClient::new(
            http,
            crate::storage_client::StorageKind::Dcache,
            storage,
            auth,
            "PT2H",
            "PT4H",
        )
        .with_timeout(storage_timeout);
        settings.shared()
    }

    /// A scheduler whose disk is full answers 507, and a storage that accepts the
    /// connection and then never answers costs a macaroon request its timeout; either way the
    /// firing stays pending with the reason and a backoff, is counted as a transient failure,
    /// and is neither refused nor dropped.
    #[tokio::test]
    async fn a_full_scheduler_disk_or_a_stalled_storage_leaves_the_firing_pending_with_backoff() {
        let key = htfaas_functions::macaroon::RootKey::derive(b"stand-in storage secret");
        let macaroon =
            htfaas_functions::macaroon::mint(&key, "stand-in", "mac-1", &["activity:UPLOAD".into()]).expect("mint");
        let (storage, storage_task) = answering(200, serde_json::json!({ "macaroon": macaroon })).await;
        let full = serde_json::json!({"error": "insufficient storage: the job queue's disk is full"});
        let (scheduler, scheduler_task) = answering(507, full).await;
        // Accepts connections and holds them without a byte of answer.
        let stalled = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let stalled_url = format!("http://{}", stalled.local_addr().expect("addr"));
        let stall_task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = stalled.accept().await {
                held.push(conn);
            }
        });

        for (case, storage_url, expect) in [
            (
                "scheduler disk full",
                storage.as_str(),
                "scheduler unavailable: 507 Insufficient Storage: insufficient storage",
            ),
            ("storage stalls", stalled_url.as_str(), "storage unavailable: no answer within 300ms"),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let shared = gateway(dir.path(), storage_url, &scheduler, Duration::from_millis(300)).await;
            let a = function("a", None, None);
            shared.firings.insert(&event("e1", "/data/x"), std::slice::from_ref(&a), None, now_ms()).expect("insert");
            let mut claim = shared.firings.claim(now_ms(), 10).expect("claim");
            let claimed = claim.ready.pop().expect("one ready");
            let before = now_ms();
            let writer = FiringWriter::start(shared.firings.clone()).expect("writer");
            let batcher = shared.submitter.batcher();
            fire_one(Dispatcher::of(&shared, &writer, &batcher), claimed).await;

            let rows = shared.firings.list(0, 10).expect("list");
            let row = &rows[0];
            assert_eq!((row.state, row.attempts), (FiringState::Pending, 1), "{case}: {row:?}");
            let reason = row.reason.as_deref().unwrap_or_default();
            assert!(reason.starts_with(expect), "{case}: {reason}");
            assert!(row.not_before_ms >= before + backoff_ms(1), "{case}: retried after a backoff");
            assert_eq!(shared.firings.pending(), 1, "{case}");
            let s = shared.stats.snapshot();
            assert_eq!((s.transient_failures, s.jobs_refused, s.jobs_submitted), (1, 0, 0), "{case}");
            // Not yet due again; due after the backoff.
            assert!(shared.firings.claim(before, 10).expect("claim").ready.is_empty(), "{case}");
            assert_eq!(shared.firings.claim(row.not_before_ms, 10).expect("claim").ready.len(), 1, "{case}");
        }
        for t in [storage_task, scheduler_task, stall_task] {
            t.abort();
        }
    }
}
