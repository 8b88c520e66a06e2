//! A job's runs: marking jobs running on an EP session, putting them back, losing a session
//! ([`Loss`]) and taking an EP's report ([`Queue::finish`], doubted first). What matching reads
//! first is `super::idle`.
//!
//! Must not know: the EP table, the matching policy or the WebSocket: sessions are ids here.

use super::Queue;
use super::accounts::charge_owner;
use super::jobs::bounded_log;
use super::resume::{Resume, checkpoint_resume};
use super::retry::{Failing, Retry, guest_retry, retries_storage_outages};
use super::trail::{job_subject, url_path};
use crate::doubt::{Observed, Violation, doubt};
use crate::error::QueueError;
use crate::seal::SealRequest as _;
use htfaas_functions::audit::{self, AuditDraft, Subject};
use htfaas_functions::manifest::{FailedOutputs, RetryPolicy};
use htfaas_functions::proto::{
    HOLD_CODE_RETRIES, HOLD_CODE_STORAGE, JobAssignment, JobReport, JobState, Outcome, SubmitRequest, Usage,
};
use htfaas_functions::store::{db_int, exec, from_db, now_ms, row};
use rusqlite::{Connection, OptionalExtension as _, params};
use std::collections::HashMap;

/// How the loss of an EP session treats its running jobs ([`Queue::lose_session`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// The EP went away or fell silent past its lease: each job counts a loss, and runs again
    /// after a backoff (`backoff_ms` × 2^(losses − 1), at most [`MAX_BACKOFF_MS`]) or, past
    /// `max_retries` losses, is held with [`HOLD_CODE_RETRIES`].
    Ep {
        /// Losses a job may have and still run again.
        max_retries: u32,
        /// Backoff before the first retry, ms.
        backoff_ms: u64,
    },
    /// The scheduler is shutting down: the jobs go back to idle, no loss counted.
    Shutdown,
}

/// Longest retry backoff, ms (one hour).
pub const MAX_BACKOFF_MS: u64 = 3_600_000;

/// What [`Queue::lose_session`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lost {
    /// Jobs idle again.
    pub requeued: Vec<String>,
    /// Jobs held for losing their EP too often.
    pub held: Vec<String>,
}

/// Result of [`Queue::mark_running`].
#[derive(Debug, Default)]
pub struct Marked {
    /// Jobs now running on the EP, with what to send it.
    pub assigned: Vec<JobAssignment>,
    /// Jobs that were no longer idle, or that failed at once (their stored request did not
    /// decode, or `prepare` refused it).
    pub skipped: Vec<String>,
}

/// What [`Queue::finish`] recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The job's owner, now charged.
    pub owner: String,
    /// Its final state.
    pub state: JobState,
}

/// A running job whose EP reported, as [`Queue::finish`] read it.
struct Reported<'a> {
    owner: &'a str,
    group: Option<&'a str>,
    cpus: u32,
    /// Losses before this attempt.
    lost: u32,
    /// The EP's name.
    ep: &'a str,
    ep_session: &'a str,
}

/// [`Queue::finish`] for a running job whose EP reported [`Outcome::StorageUnavailable`]: the
/// attempt ends `storage-unavailable` with its usage, which is charged (no job counted), and
/// [`requeue_or_hold`] decides what follows; the EP's report (`job.finished`, with the state
/// that follows) and a hold (`job.held`) are recorded. Returns the job's new state.
fn storage_unavailable(
    tx: &Connection,
    job: &Reported<'_>,
    report: JobReport,
    subject: Subject,
    loss: Loss,
    half_life_s: f64,
) -> Result<JobState, QueueError> {
    let now = now_ms();
    let reason = report.outcome.reason();
    let u = report.usage;
    exec(
        tx,
        "UPDATE attempts SET outcome = 'storage-unavailable', reason = ?3, usage = ?4, ended_at_ms = ?5 \
         WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
        params![report.job_id, job.ep_session, reason, serde_json::to_string(&u)?, db_int(now)],
    )?;
    let hold = |times: u32, max: u32| {
        let why = format!("{reason} (on {}; lost {times} attempts, the retry limit is {max})", job.ep);
        (HOLD_CODE_STORAGE, why)
    };
    let after = requeue_or_hold(tx, &report.job_id, job.lost, loss, now, hold)?;
    exec(tx, "UPDATE jobs SET log = ?2 WHERE id = ?1", params![report.job_id, bounded_log(report.log)])?;
    let core_s = charge_owner(tx, job.owner, job.group, job.cpus, JobState::Idle, &u, now, half_life_s)?;
    let (state, then) = match &after {
        AfterLoss::Requeued => (JobState::Idle, "requeued"),
        AfterLoss::Held { .. } => (JobState::Held, "held"),
    };
    let input = subject.paths.first().filter(|_| u.bytes_in > 0).cloned();
    let input = input.as_deref().map(|path| (path, u.bytes_in, report.input_sha256.as_deref()));
    let finished =
        AuditDraft::job_finished(subject.clone(), job.ep, input, &report.outputs, &report.refs, &report.outcome, &u)
            .with_detail("state", state.as_str().into())
            .with_detail("then", then.into())
            .with_detail("core_ms", serde_json::json!((core_s * 1000.0).round().max(0.0) as u64));
    audit::append_in(tx, finished)?;
    if let AfterLoss::Held { code, reason } = after {
        audit::append_in(tx, AuditDraft::job_held(subject, &reason, Some(i64::from(code))))?;
    }
    Ok(state)
}

/// Longest reason of an EP's own (a return's) kept with an attempt, characters.
const MAX_EP_REASON_CHARS: usize = 1024;

/// [`Queue::finish`] for a running job its EP turned away unrun ([`Outcome::Cancelled`] the
/// scheduler did not ask for: e.g. an Assign that crossed the EP's `Draining`). Not the job's
/// fault, but not free either, or an EP could bounce a job for ever: the attempt ends
/// `returned`, nothing is charged, and it counts as lost ([`requeue_or_hold`]: idle again after
/// the backoff, held past the retry limit). Returns the job's new state.
fn returned(
    tx: &Connection,
    job: &Reported<'_>,
    attempt: u32,
    report: &JobReport,
    subject: Subject,
    loss: Loss,
) -> Result<JobState, QueueError> {
    let now = now_ms();
    let said = match &report.outcome {
        Outcome::Cancelled { reason } => reason.chars().take(MAX_EP_REASON_CHARS).collect(),
        other => other.reason(),
    };
    let why = format!("the EP returned it: {said}");
    exec(
        tx,
        "UPDATE attempts SET outcome = 'returned', reason = ?3, ended_at_ms = ?4 \
         WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
        params![report.job_id, job.ep_session, why, db_int(now)],
    )?;
    let hold = |times: u32, max: u32| {
        let reason =
            format!("lost or returned by its EP {times} times (last: {}: {why}); the retry limit is {max}", job.ep);
        (HOLD_CODE_RETRIES, reason)
    };
    let after = requeue_or_hold(tx, &report.job_id, job.lost, loss, now, hold)?;
    let (state, then) = match &after {
        AfterLoss::Requeued => (JobState::Idle, "requeued"),
        AfterLoss::Held { .. } => (JobState::Held, "held"),
    };
    let record = AuditDraft::job_finished(subject.clone(), job.ep, None, &[], &[], &report.outcome, &report.usage)
        .with_detail("state", state.as_str().into())
        .with_detail("returned", true.into())
        .with_detail("then", then.into())
        .with_detail("attempt", attempt.into());
    audit::append_in(tx, record)?;
    if let AfterLoss::Held { code, reason } = after {
        audit::append_in(tx, AuditDraft::job_held(subject, &reason, Some(i64::from(code))))?;
    }
    Ok(state)
}

/// [`Queue::finish`] for a report that breaks the protocol ([`Violation`]): nothing of it is
/// believed — no outcome, no output (so nothing enters the lineage), no usage (nothing is
/// charged). The attempt ends `refused` with the violation as its reason and is recorded as
/// `attempt.lost` (detail `violation`); a running job counts the loss ([`requeue_or_hold`]); a
/// job stopped meanwhile keeps its state, and no later report of the attempt counts. Returns
/// the job's state.
#[allow(clippy::too_many_arguments)]
fn refuse_report(
    tx: &Connection,
    job: &Reported<'_>,
    stored: &str,
    attempt: u32,
    report: &JobReport,
    subject: Subject,
    violation: &Violation,
    loss: Loss,
) -> Result<JobState, QueueError> {
    let now = now_ms();
    let why = format!("protocol violation: {violation}");
    tracing::warn!(job.id = %report.job_id, ep = %job.ep, "refusing the EP's report: {why}");
    exec(
        tx,
        "UPDATE attempts SET outcome = 'refused', reason = ?3, ended_at_ms = ?4 \
         WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
        params![report.job_id, job.ep_session, why, db_int(now)],
    )?;
    let (state, then, held) = if stored == "running" {
        let hold = |times: u32, max: u32| {
            let reason = format!(
                "lost its EP or had its report refused {times} times (last: {}: {why}); the retry limit is {max}",
                job.ep
            );
            (HOLD_CODE_RETRIES, reason)
        };
        match requeue_or_hold(tx, &report.job_id, job.lost, loss, now, hold)? {
            AfterLoss::Requeued => (JobState::Idle, "requeued", None),
            AfterLoss::Held { code, reason } => (JobState::Held, "held", Some((code, reason))),
        }
    } else {
        // Stopped while running (held or removed): it keeps its state; a usage of nothing marks
        // the attempt as reported, so no later report of it is charged.
        let nothing = serde_json::to_string(&Usage::default())?;
        exec(tx, "UPDATE jobs SET usage = ?2 WHERE id = ?1", params![report.job_id, nothing])?;
        (JobState::parse(stored).unwrap_or(JobState::Removed), "kept", None)
    };
    let record = AuditDraft::attempt_lost(subject.clone(), job.ep, job.ep_session, attempt, &why, then)
        .with_detail("violation", true.into())
        .with_detail("outputs_reported", report.outputs.len().into());
    audit::append_in(tx, record)?;
    if let Some((code, reason)) = held {
        audit::append_in(tx, AuditDraft::job_held(subject, &reason, Some(i64::from(code))))?;
    }
    Ok(state)
}

/// What became of a running job that lost its attempt ([`requeue_or_hold`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum AfterLoss {
    /// Idle again (after its backoff, with [`Loss::Ep`]).
    Requeued,
    /// Held, past the retry limit.
    Held {
        /// The hold code.
        code: u32,
        /// The hold reason.
        reason: String,
    },
}

/// The one rule for a running job `id` whose attempt was lost, whatever lost it (its EP went
/// away or fell silent, or the storage was unavailable to it): with [`Loss::Shutdown`] it goes
/// back to idle, no loss counted; with [`Loss::Ep`] it counts a loss (it had `lost` before) and
/// goes back to idle after `backoff_ms` × 2^lost (at most [`MAX_BACKOFF_MS`]), or, when it
/// already had `max_retries` losses, is held with what `hold(losses, max_retries)` says (code,
/// reason). Its session is cleared either way, so no later report of the attempt counts.
fn requeue_or_hold(
    tx: &Connection,
    id: &str,
    lost: u32,
    loss: Loss,
    now: u64,
    hold: impl FnOnce(u32, u32) -> (u32, String),
) -> rusqlite::Result<AfterLoss> {
    match loss {
        Loss::Shutdown => {
            exec(
                tx,
                "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL WHERE id = ?1",
                params![id],
            )?;
            Ok(AfterLoss::Requeued)
        }
        Loss::Ep { max_retries, .. } if lost >= max_retries => {
            let (code, reason) = hold(lost.saturating_add(1), max_retries);
            exec(
                tx,
                "UPDATE jobs SET state = 'held', reason = ?2, hold_code = ?3, lost = lost + 1, \
                 ep_session = NULL WHERE id = ?1",
                params![id, reason, code],
            )?;
            Ok(AfterLoss::Held { code, reason })
        }
        Loss::Ep { backoff_ms, .. } => {
            let delay = backoff_ms.saturating_mul(1u64 << lost.min(32)).min(MAX_BACKOFF_MS);
            exec(
                tx,
                "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL, \
                 lost = lost + 1, not_before_ms = ?2 WHERE id = ?1",
                params![id, db_int(now.saturating_add(delay))],
            )?;
            Ok(AfterLoss::Requeued)
        }
    }
}

/// What an EP is sent for attempt `attempt` of a job: no owner, no token.
pub(crate) fn assignment(job_id: String, r: SubmitRequest, attempt: u32) -> JobAssignment {
    JobAssignment {
        traceparent: r.event.trace_parent().map(|t| t.attempt_span(&job_id, attempt).to_string()),
        job_id,
        function: r.function,
        resources: r.resources,
        input: r.input,
        output: r.output,
        args: r.args,
        env: r.env,
        secrets: r.secrets,
        limits: r.limits,
        // Renewable when the gateway granted it; [`crate::dispatch::restrict`] cuts this to the
        // job's deadline.
        renew_until: r.renewal.is_some().then_some(u64::MAX),
        refs: r.refs,
        checkpoint: r.checkpoint,
    }
}

/// What a job's end reads of its stored request: where its outputs go, what becomes of them
/// after a failure, and its retry policy. The other members (the macaroons above all) are
/// skipped, not decoded: this runs on the writer's thread, for every report.
#[derive(serde::Deserialize)]
struct Ending {
    output: EndingOutput,
    #[serde(default)]
    resources: EndingResources,
    #[serde(default)]
    retry: Option<RetryPolicy>,
    #[serde(default)]
    refs: Vec<EndingRef>,
}

/// See [`Ending`]: a reference input's guest path alone.
#[derive(serde::Deserialize)]
struct EndingRef {
    path: String,
}

/// See [`Ending`]: the run time alone.
#[derive(serde::Deserialize, Default)]
struct EndingResources {
    #[serde(default)]
    runtime_s: u64,
}

/// See [`Ending`].
#[derive(serde::Deserialize)]
struct EndingOutput {
    url: String,
    #[serde(default)]
    on_failure: FailedOutputs,
}

/// The jobs running in an EP session (in the small index of running jobs by session).
pub(super) const RUNNING_IN_SESSION: &str = "SELECT id, lost, ep FROM jobs WHERE state = 'running' AND ep_session = ?1";

impl Queue {
    /// In one transaction: marks each job that is still idle as running on EP session
    /// `ep_session` (named `ep_name`), and returns what to send for it, as `prepare` made it
    /// from the stored assignment and the request's `bind_ep_address`. A job whose stored
    /// request does not decode, or that `prepare` refuses (with the reason to record), fails
    /// at once: it is neither sent nor retried.
    pub async fn mark_running<F>(
        &self,
        job_ids: Vec<String>,
        ep_name: String,
        ep_session: String,
        prepare: F,
    ) -> Result<Marked, QueueError>
    where
        F: Fn(JobAssignment, bool) -> Result<JobAssignment, String> + Send + 'static,
    {
        let sealer = self.sealer.clone();
        self.write(move |tx| {
            let mut marked = Marked::default();
            let started = db_int(now_ms());
            for id in job_ids {
                let row: Option<(String, String, String, u32)> = tx
                    .prepare_cached(
                        "SELECT request, owner, token_jti, attempts FROM jobs JOIN job_requests USING (seq) \
                         WHERE id = ?1 AND state = 'idle'",
                    )?
                    .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .optional()?;
                let Some((request, owner, jti, attempts)) = row else {
                    marked.skipped.push(id);
                    continue;
                };
                let mut subject =
                    Subject { job: Some(id.clone()), token_jti: Some(jti), owner: Some(owner), ..Subject::default() };
                let parsed = serde_json::from_str::<SubmitRequest>(&request)
                    .map_err(|e| format!("stored request is corrupt: {e}"))
                    .and_then(|r| sealer.open_request(&id, r).map_err(|e| e.to_string()));
                if let Ok(r) = &parsed {
                    subject.function = Some(r.function.name.clone());
                    subject.digest = Some(r.function.digest.as_str().to_owned());
                    subject.event_id = Some(r.event.id.clone());
                    subject.paths = vec![r.event.path.clone()];
                }
                let prepared = parsed.and_then(|r| {
                    let bind = r.bind_ep_address;
                    prepare(assignment(id.clone(), r, attempts.saturating_add(1)), bind)
                });
                match prepared {
                    Ok(a) => {
                        exec(
                            tx,
                            "UPDATE jobs SET state = 'running', ep = ?2, ep_session = ?3, started_at_ms = ?4, \
                             attempts = attempts + 1, not_before_ms = 0 WHERE id = ?1 AND state = 'idle'",
                            params![id, ep_name, ep_session, started],
                        )?;
                        exec(
                            tx,
                            "INSERT OR REPLACE INTO attempts (job_id, n, ep, ep_session, started_at_ms, outcome) \
                             SELECT id, attempts, ?2, ?3, ?4, 'running' FROM jobs WHERE id = ?1",
                            params![id, ep_name, ep_session, started],
                        )?;
                        let attempt = attempts.saturating_add(1);
                        audit::append_in(tx, AuditDraft::job_dispatched(subject, &ep_name, &ep_session, attempt))?;
                        marked.assigned.push(a);
                    }
                    Err(reason) => {
                        tracing::error!(job.id = %id, "failing the job: {reason}");
                        exec(
                            tx,
                            "UPDATE jobs SET state = 'failed', reason = ?2, finished_at_ms = ?3 WHERE id = ?1",
                            params![id, reason, started],
                        )?;
                        let detail = serde_json::json!({ "state": "failed", "reason": reason, "outcome": null });
                        audit::append_in(tx, AuditDraft::new(audit::AuditKind::JobFinished, subject, detail))?;
                        marked.skipped.push(id);
                    }
                }
            }
            Ok(marked)
        })
        .await
    }

    /// Puts jobs that are running on `ep_session` back to idle (an Assign that could not be
    /// sent). Returns how many changed.
    pub async fn revert_to_idle(&self, job_ids: Vec<String>, ep_session: String) -> Result<usize, QueueError> {
        self.write(move |tx| {
            let mut n = 0;
            for id in job_ids {
                let attempt = running_attempt(tx, &id, &ep_session)?;
                // Never sent: the attempt did not happen.
                exec(
                    tx,
                    "DELETE FROM attempts WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
                    params![id, ep_session],
                )?;
                let changed = exec(
                    tx,
                    "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL, \
                     attempts = MAX(attempts - 1, 0) WHERE id = ?1 AND state = 'running' AND ep_session = ?2",
                    params![id, ep_session],
                )?;
                if let (1, Some((n, ep)), Some(subject)) = (changed, attempt, job_subject(tx, &id)?) {
                    let why = "the Assign could not be sent: the EP left";
                    audit::append_in(tx, AuditDraft::attempt_lost(subject, &ep, &ep_session, n, why, "requeued"))?;
                }
                n += changed;
            }
            Ok(n)
        })
        .await
    }

    /// In one transaction: every job running on `ep_session` loses it, as `loss` says (see
    /// [`Loss`]); its attempt ends `lost` (or `interrupted` at shutdown) with `why`. Jobs held or
    /// removed while running there keep their state; their attempt ends the same way.
    pub async fn lose_session(&self, ep_session: String, loss: Loss, why: String) -> Result<Lost, QueueError> {
        self.write(move |tx| {
            let now = now_ms();
            let outcome = match loss {
                Loss::Ep { .. } => "lost",
                Loss::Shutdown => "interrupted",
            };
            let ended: Vec<(String, u32, String)> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT job_id, n, ep FROM attempts WHERE ep_session = ?1 AND ended_at_ms IS NULL ORDER BY job_id",
                )?;
                stmt.query_map(params![ep_session], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<_, _>>()?
            };
            exec(
                tx,
                "UPDATE attempts SET outcome = ?2, reason = ?3, ended_at_ms = ?4 \
                 WHERE ep_session = ?1 AND ended_at_ms IS NULL",
                params![ep_session, outcome, why, db_int(now)],
            )?;
            let running: Vec<(String, u32, Option<String>)> = {
                let mut stmt = tx.prepare_cached(RUNNING_IN_SESSION)?;
                stmt.query_map(params![ep_session], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<_, _>>()?
            };
            let mut out = Lost::default();
            let mut held_reasons = HashMap::new();
            for (id, lost, ep) in running {
                let ep = ep.as_deref().unwrap_or("?");
                let hold = |times: u32, max: u32| {
                    let reason = format!("lost its EP {times} times (last: {ep}: {why}); the retry limit is {max}");
                    (HOLD_CODE_RETRIES, reason)
                };
                match requeue_or_hold(tx, &id, lost, loss, now, hold)? {
                    AfterLoss::Requeued => out.requeued.push(id),
                    AfterLoss::Held { reason, .. } => {
                        held_reasons.insert(id.clone(), reason);
                        out.held.push(id);
                    }
                }
            }
            for (id, n, ep) in ended {
                let Some(subject) = job_subject(tx, &id)? else { continue };
                let then = match (held_reasons.get(&id), out.requeued.contains(&id), loss) {
                    (Some(_), _, _) => "held",
                    (None, true, Loss::Shutdown) => "interrupted",
                    (None, true, _) => "requeued",
                    (None, false, _) => "kept",
                };
                audit::append_in(tx, AuditDraft::attempt_lost(subject.clone(), &ep, &ep_session, n, &why, then))?;
                if let Some(reason) = held_reasons.get(&id) {
                    let code = Some(i64::from(HOLD_CODE_RETRIES));
                    audit::append_in(tx, AuditDraft::job_held(subject, reason, code))?;
                }
            }
            Ok(out)
        })
        .await
    }

    /// In one transaction: if the report's job is running on `ep_session`, records its end and
    /// charges its owner. If it was removed or held while running there (a revocation, an
    /// admin's remove or hold) and is reported for the first time, records and charges its
    /// usage but keeps its state and reason.
    /// `None` otherwise (unknown, finished, requeued meanwhile, reported twice).
    ///
    /// A running job reported [`Outcome::StorageUnavailable`] lost its attempt through no fault
    /// of its own: its attempt ends `storage-unavailable`, its usage is charged (it held the
    /// slot) without counting it completed or failed, and `loss` decides what follows, exactly
    /// as for a job whose EP went away ([`Queue::lose_session`]): idle again after the backoff,
    /// or held past the retry limit, with [`HOLD_CODE_STORAGE`] and a reason naming the
    /// storage failure. A job whose retry policy leaves out `storage_unavailable` fails at once
    /// instead.
    ///
    /// A running job whose guest failed with an outcome its retry policy lists, with retries
    /// left (the policy's, at most [`Queue::set_max_guest_retries`]), runs again after the
    /// policy's backoff: its attempt ends `failed`, charged, no job counted (`super::retry`).
    /// Past its retries it fails, its reason saying how many attempts it had.
    pub async fn finish(
        &self,
        ep_session: String,
        report: JobReport,
        loss: Loss,
    ) -> Result<Option<Finished>, QueueError> {
        let mut answers = self.finish_many(ep_session, vec![report], loss).await?;
        Ok(answers.pop().flatten())
    }

    /// [`Queue::finish`] for several reports of one EP session in one write, in order: each
    /// answered as `finish` would answer it alone. A failure of the store fails them all, and
    /// nothing of them is recorded (the caller tries them again).
    pub async fn finish_many(
        &self,
        ep_session: String,
        reports: Vec<JobReport>,
        loss: Loss,
    ) -> Result<Vec<Option<Finished>>, QueueError> {
        let (half_life_s, max_guest_retries) = (self.half_life_s, self.max_guest_retries);
        self.write(move |tx| {
            reports
                .into_iter()
                .map(|report| finish_in(tx, &ep_session, report, loss, half_life_s, max_guest_retries))
                .collect()
        })
        .await
    }
}

/// Records one report of a job run on `ep_session`, on the writer's transaction `tx` (see
/// [`Queue::finish`]).
fn finish_in(
    tx: &Connection,
    ep_session: &str,
    mut report: JobReport,
    loss: Loss,
    self_half_life: f64,
    max_guest_retries: u32,
) -> Result<Option<Finished>, QueueError> {
    // owner, cpus, state, group, EP name, losses so far, attempts, started, memory, request.
    type Row = (String, u32, String, Option<String>, Option<String>, u32, u32, Option<i64>, i64, String);
    let row: Option<Row> = row(
        tx,
        "SELECT owner, cpus, state, grp, ep, lost, attempts, started_at_ms, memory_mb, request \
             FROM jobs JOIN job_requests USING (seq) WHERE id = ?1 AND ep_session = ?2 \
             AND (state = 'running' OR (state IN ('removed', 'held') AND usage IS NULL))",
        params![report.job_id, ep_session],
        |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
                r.get(9)?,
            ))
        },
    )
    .optional()?;
    let Some((owner, cpus, stored, group, ep, lost, attempt, started, memory_mb, request)) = row else {
        return Ok(None);
    };
    let ep = ep.unwrap_or_else(|| ep_session.to_owned());
    let subject = job_subject(tx, &report.job_id)?.unwrap_or_default();
    let job = Reported { owner: &owner, group: group.as_deref(), cpus, lost, ep: &ep, ep_session };
    // The EP's word is doubted before anything of it is recorded (crate::doubt).
    let request = serde_json::from_str::<Ending>(&request).ok();
    let output_dir = request.as_ref().map_or_else(|| "/nonexistent/".into(), |r| url_path(&r.output.url));
    let policy = request.as_ref().and_then(|r| r.retry.as_ref());
    let seen = Observed {
        started_at_ms: started.map(from_db),
        now_ms: now_ms(),
        cpus,
        memory_mb: from_db(memory_mb),
        output_dir,
        on_failure: request.as_ref().map(|r| r.output.on_failure).unwrap_or_default(),
        refs: request.as_ref().map(|r| r.refs.iter().map(|f| f.path.clone()).collect()).unwrap_or_default(),
    };
    let clamped = match doubt(&mut report, &seen) {
        Ok(clamped) => clamped,
        Err(violation) => {
            let state = refuse_report(tx, &job, &stored, attempt, &report, subject, &violation, loss)?;
            return Ok(Some(Finished { owner, state }));
        }
    };
    let failing = Failing { owner: &owner, group: group.as_deref(), cpus, ep: &ep, ep_session, attempt };
    if let (true, Outcome::Cancelled { .. }) = (stored == "running", &report.outcome) {
        // Stopped by its EP on its own (leaving): with a new checkpoint stored, a vacate that
        // resumes at once; else a return.
        if report.checkpoint.as_ref().is_some_and(htfaas_functions::checkpoint::CheckpointReport::progressed) {
            let runtime_s = request.as_ref().map_or(0, |r| r.resources.runtime_s);
            if checkpoint_resume(tx, &failing, &mut report, runtime_s, &subject, self_half_life)? == Resume::Again {
                return Ok(Some(Finished { owner, state: JobState::Idle }));
            }
        }
        let state = returned(tx, &job, attempt, &report, subject, loss)?;
        return Ok(Some(Finished { owner, state }));
    }
    if stored == "running" && report.outcome.is_transient() && retries_storage_outages(policy) {
        let state = storage_unavailable(tx, &job, report, subject, loss, self_half_life)?;
        return Ok(Some(Finished { owner, state }));
    }
    // A guest that asked to be resumed runs again from its checkpoint; one that made no
    // progress is a non-zero exit. A guest failure its retry policy lists runs again while
    // retries are left.
    let mut final_note = None;
    if stored == "running" && matches!(report.outcome, Outcome::Checkpointed { .. }) {
        let runtime_s = request.as_ref().map_or(0, |r| r.resources.runtime_s);
        match checkpoint_resume(tx, &failing, &mut report, runtime_s, &subject, self_half_life)? {
            Resume::Again => return Ok(Some(Finished { owner, state: JobState::Idle })),
            Resume::AsExit { note } => final_note = Some(note),
        }
    }
    if stored == "running" && !report.outcome.is_success() {
        match guest_retry(tx, &failing, policy, &report, &subject, max_guest_retries, self_half_life)? {
            Retry::Again => return Ok(Some(Finished { owner, state: JobState::Idle })),
            Retry::Final { note } => final_note = note.or(final_note),
        }
    }
    let state = match (stored.as_str(), report.outcome.is_success()) {
        ("removed", _) => JobState::Removed,
        ("held", _) => JobState::Held,
        (_, true) => JobState::Completed,
        (_, false) => JobState::Failed,
    };
    let exit_code = match report.outcome {
        Outcome::Exited { exit_code } => Some(exit_code),
        _ => None,
    };
    // A removed or held job keeps the reason and end time its removal or hold gave it.
    let (reason, finished_at) = match state {
        JobState::Removed | JobState::Held => (None, None),
        _ => (Some(report.outcome.reason() + final_note.as_deref().unwrap_or("")), Some(db_int(now_ms()))),
    };
    let u = report.usage;
    exec(
        tx,
        "UPDATE jobs SET state = ?2, reason = COALESCE(?3, reason), exit_code = ?4, usage = ?5, \
         outputs = ?6, log = ?7, finished_at_ms = COALESCE(?8, finished_at_ms) WHERE id = ?1",
        params![
            report.job_id,
            state.as_str(),
            reason,
            exit_code,
            serde_json::to_string(&u)?,
            serde_json::to_string(&report.outputs)?,
            bounded_log(report.log),
            finished_at,
        ],
    )?;
    let now = now_ms();
    let outcome = match state {
        JobState::Completed => "completed",
        JobState::Failed => "failed",
        _ => "stopped",
    };
    let attempt_reason = if state == JobState::Completed { String::new() } else { report.outcome.reason() };
    exec(
        tx,
        "UPDATE attempts SET outcome = ?3, reason = ?4, usage = ?5, ended_at_ms = ?6 \
         WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
        params![report.job_id, ep_session, outcome, attempt_reason, serde_json::to_string(&u)?, db_int(now)],
    )?;
    let core_s = charge_owner(tx, &owner, group.as_deref(), cpus, state, &u, now, self_half_life)?;
    // What the EP did, in one record: the input it read, the outputs it stored, how it ended.
    let ran = matches!(
        report.outcome,
        Outcome::Exited { .. }
            | Outcome::Trapped { .. }
            | Outcome::MemoryExceeded { .. }
            | Outcome::TimeExceeded { .. }
            | Outcome::OutputFailed { .. }
    );
    let input = subject.paths.first().filter(|_| ran || u.bytes_in > 0).cloned();
    let input = input.as_deref().map(|path| (path, u.bytes_in, report.input_sha256.as_deref()));
    let mut finished =
        AuditDraft::job_finished(subject, &ep, input, &report.outputs, &report.refs, &report.outcome, &u)
            .with_detail("state", state.as_str().into())
            .with_detail("exit_code", serde_json::json!(exit_code))
            .with_detail("core_ms", serde_json::json!((core_s * 1000.0).round().max(0.0) as u64));
    if !clamped.is_empty() {
        // What the EP claimed, beside what was charged.
        finished = finished.with_detail("clamped", clamped.to_json());
    }
    if let Some(c) = &report.checkpoint {
        finished = finished.with_detail("checkpoint", super::resume::checkpoint_detail(c));
    }
    audit::append_in(tx, finished)?;
    Ok(Some(Finished { owner, state }))
}

/// The attempt number and EP name of `job_id` while it runs on `ep_session`; `None` when it
/// does not (it ended, or runs on another session).
pub(super) fn running_attempt(
    tx: &Connection,
    job_id: &str,
    ep_session: &str,
) -> Result<Option<(u32, String)>, rusqlite::Error> {
    row(
        tx,
        "SELECT attempts, COALESCE(ep, '') FROM jobs WHERE id = ?1 AND state = 'running' AND ep_session = ?2",
        params![job_id, ep_session],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
}
