//! A function's retry policy at the end of a run: [`Queue::finish`](super::Queue::finish) asks
//! [`guest_retry`] whether a failed run that its EP reported runs again, and if so records the
//! attempt as failed, charges it, and puts the job back to idle after its backoff.
//!
//! The rule: a run whose outcome the job's [`RetryPolicy`] lists ([`Outcome::retry_kind`]),
//! with retries left, runs again; the retries allowed are the policy's, capped by the site's
//! `max_guest_retries`; retries used are the job's attempts that ended `failed` (only a retried
//! attempt ends so while the job lives on). Storage outages are not counted here: they are
//! lost attempts ([`super::runs`]), retried by the site's rule when the policy lists them (or
//! names no policy).
//!
//! Must not know: the EP table, sessions beyond their id, HTTP.

use super::accounts::charge_owner;
use super::jobs::bounded_log;
use crate::error::QueueError;
use htfaas_functions::audit::{self, AuditDraft, Subject};
use htfaas_functions::manifest::{RetryOn, RetryPolicy};
use htfaas_functions::proto::{JobReport, JobState, Outcome};
use htfaas_functions::store::{db_int, exec, now_ms, row};
use rusqlite::{Connection, params};

/// What the site allows at most, whatever a function asks for: retries after guest failures.
/// Default of the scheduler's `max_guest_retries`.
pub const DEFAULT_MAX_GUEST_RETRIES: u32 = 3;

/// The running job [`guest_retry`] decides for.
pub(super) struct Failing<'a> {
    /// Its owner, charged.
    pub owner: &'a str,
    /// Its accounting group, charged too.
    pub group: Option<&'a str>,
    /// Its cpus, for the charge.
    pub cpus: u32,
    /// The EP that ran it.
    pub ep: &'a str,
    /// That EP's session.
    pub ep_session: &'a str,
    /// This attempt's number.
    pub attempt: u32,
}

/// What [`guest_retry`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Retry {
    /// The job runs again: the attempt was recorded and charged, the job is idle until its
    /// backoff ends.
    Again,
    /// It does not: the report ends the job as before. `note` (when the policy listed the
    /// outcome but no retry was left) is added to its reason, saying how many attempts it had.
    Final {
        /// E.g. ` (after 3 attempts; its retry policy allows 2 retries)`.
        note: Option<String>,
    },
}

/// How a running job goes back to idle ([`back_to_idle`]).
pub(super) struct Again<'a> {
    /// The attempt's outcome (`failed`, `checkpointed`).
    pub outcome: &'a str,
    /// What follows, for the `job.finished` record (`retry`, `resume`).
    pub then: &'a str,
    /// The guest's exit status, kept on the job.
    pub exit_code: Option<i32>,
    /// How long from now before it may run again.
    pub delay_ms: u64,
}

/// Ends `job`'s running attempt as `again.outcome` with `report`'s reason and usage, puts the
/// job back to idle (runnable `again.delay_ms` from now), keeping its exit code and log, and
/// charges the usage (no job counted). Returns the attempt's `job.finished` record with what
/// every such record says (its input and outputs, state `idle`, `then`, the attempt, the exit
/// status, the core time charged), for the caller to add its own details and append. A job
/// that runs again after its guest failed ([`guest_retry`]) or asked to be resumed
/// ([`super::resume`]).
pub(super) fn back_to_idle(
    tx: &Connection,
    job: &Failing<'_>,
    report: &JobReport,
    subject: &Subject,
    again: Again<'_>,
    half_life_s: f64,
) -> Result<AuditDraft, QueueError> {
    let Again { outcome, then, exit_code, delay_ms } = again;
    let now = now_ms();
    let u = report.usage;
    exec(
        tx,
        "UPDATE attempts SET outcome = ?3, reason = ?4, usage = ?5, ended_at_ms = ?6 \
         WHERE job_id = ?1 AND ep_session = ?2 AND ended_at_ms IS NULL",
        params![
            report.job_id,
            job.ep_session,
            outcome,
            report.outcome.reason(),
            serde_json::to_string(&u)?,
            db_int(now)
        ],
    )?;
    exec(
        tx,
        "UPDATE jobs SET state = 'idle', ep = NULL, ep_session = NULL, started_at_ms = NULL, exit_code = ?2, \
         log = ?3, not_before_ms = ?4 WHERE id = ?1",
        params![report.job_id, exit_code, bounded_log(report.log.clone()), db_int(now.saturating_add(delay_ms))],
    )?;
    let core_s = charge_owner(tx, job.owner, job.group, job.cpus, JobState::Idle, &u, now, half_life_s)?;
    let input = subject.paths.first().cloned();
    let input = input.as_deref().map(|path| (path, u.bytes_in, report.input_sha256.as_deref()));
    let record =
        AuditDraft::job_finished(subject.clone(), job.ep, input, &report.outputs, &report.refs, &report.outcome, &u)
            .with_detail("state", JobState::Idle.as_str().into())
            .with_detail("then", then.into())
            .with_detail("attempt", job.attempt.into())
            .with_detail("exit_code", serde_json::json!(exit_code))
            .with_detail("core_ms", serde_json::json!((core_s * 1000.0).round().max(0.0) as u64));
    Ok(record)
}

/// Whether a storage outage ([`Outcome::StorageUnavailable`]) of a job submitted with retry
/// policy `policy` is retried by the site's rule for lost attempts: yes without a policy, and
/// with one that lists `storage_unavailable`; otherwise the outage fails the job at once.
pub(super) fn retries_storage_outages(policy: Option<&RetryPolicy>) -> bool {
    policy.is_none_or(|p| p.retries_on(RetryOn::StorageUnavailable))
}

/// For a running job whose EP reported `report` (neither a success nor a storage outage):
/// when the job's `policy` lists the outcome and retries are left (at most
/// `max_guest_retries`), ends the attempt `failed` with its reason and usage, charges the
/// usage (no job counted), records the report (`job.finished`, with the outputs the attempt
/// stored, `then: "retry"`), and puts the job back to idle after the policy's backoff.
pub(super) fn guest_retry(
    tx: &Connection,
    job: &Failing<'_>,
    policy: Option<&RetryPolicy>,
    report: &JobReport,
    subject: &Subject,
    max_guest_retries: u32,
    half_life_s: f64,
) -> Result<Retry, QueueError> {
    let Some(policy) = policy else { return Ok(Retry::Final { note: None }) };
    let listed = report.outcome.retry_kind().is_some_and(|k| k != RetryOn::StorageUnavailable && policy.retries_on(k));
    if !listed {
        return Ok(Retry::Final { note: None });
    }
    let allowed = policy.retries.min(max_guest_retries);
    let used: u32 = row(
        tx,
        "SELECT COUNT(*) FROM attempts WHERE job_id = ?1 AND outcome = 'failed'",
        params![report.job_id],
        |r| r.get(0),
    )?;
    if used >= allowed {
        let attempts = used + 1;
        let note = if allowed < policy.retries {
            format!(
                " (after {attempts} attempts; the site allows {allowed} of the {} retries its policy asks for)",
                policy.retries
            )
        } else {
            format!(" (after {attempts} attempts; its retry policy allows {allowed} retries)")
        };
        return Ok(Retry::Final { note: Some(note) });
    }
    let n = used + 1;
    let delay = policy.backoff_ms(n);
    let reason = report.outcome.reason();
    let exit_code = match report.outcome {
        Outcome::Exited { exit_code } => Some(exit_code),
        _ => None,
    };
    let again = Again { outcome: "failed", then: "retry", exit_code, delay_ms: delay };
    let record = back_to_idle(tx, job, report, subject, again, half_life_s)?
        .with_detail("retry", n.into())
        .with_detail("retries", allowed.into())
        .with_detail("backoff_ms", delay.into());
    audit::append_in(tx, record)?;
    tracing::info!(job.id = %report.job_id, retry = n, of = allowed, backoff_ms = delay, "{reason}: runs again");
    Ok(Retry::Again)
}
