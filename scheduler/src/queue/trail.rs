//! The audit trail's part of the store: the writer name of its records, what a record names
//! about a job ([`job_subject`]), refused submissions (bounded for unverified tokens) and signed
//! checkpoints.
//!
//! Must not know: HTTP or who reads the trail (the API serves it from the file).

use super::Queue;
use crate::error::QueueError;
use htfaas_functions::audit::{self, AuditDraft, AuditSigner, Checkpoint, CheckpointPolicy, Subject};
use htfaas_functions::store::row;
use rusqlite::{Connection, OptionalExtension as _, params};
use std::sync::Arc;

/// The writer of the audit trail kept in the store.
pub const AUDIT_WRITER: &str = "scheduler";

/// Most records of refusals with an unverified token per second, on average.
pub const UNVERIFIED_REFUSALS_PER_S: f64 = 20.0;
/// Most such records in a burst.
pub const UNVERIFIED_REFUSALS_BURST: f64 = 200.0;

/// A token bucket for the records of refusals whose token did not verify: anyone can send
/// those, so without a bound a flood of forged tokens would grow the trail (and its fsyncs)
/// without limit. What the bucket turns away is counted, and the next record says how many.
#[derive(Debug)]
pub(super) struct RefusalBudget {
    tokens: f64,
    last: std::time::Instant,
    suppressed: u64,
}

impl RefusalBudget {
    pub(super) fn new() -> RefusalBudget {
        RefusalBudget { tokens: UNVERIFIED_REFUSALS_BURST, last: std::time::Instant::now(), suppressed: 0 }
    }

    /// `Some(n)`: record this refusal, noting the `n` left unrecorded since the last one;
    /// `None`: do not (counted).
    pub(super) fn take(&mut self, now: std::time::Instant) -> Option<u64> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * UNVERIFIED_REFUSALS_PER_S).min(UNVERIFIED_REFUSALS_BURST);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed = self.suppressed.saturating_add(1);
            None
        }
    }
}

/// What the audit trail names for job `id`: the job, its token's `jti`, owner, function,
/// digest and event, and its input path, if any (the columns written from its request at submit);
/// `None` for an unknown job. A job whose request did not parse when schema 10 took these
/// from it names none of the request's members, and its records say so by their absence.
pub(super) fn job_subject(conn: &Connection, id: &str) -> rusqlite::Result<Option<Subject>> {
    type Row = (String, String, Option<String>, Option<String>, Option<String>, Option<String>);
    let row: Option<Row> = conn
        .prepare_cached(
            "SELECT owner, token_jti, function_name, function_digest, event_id, input_path FROM jobs WHERE id = ?1",
        )?
        .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))
        .optional()?;
    Ok(row.map(|(owner, jti, function, digest, event_id, path)| Subject {
        job: Some(id.to_owned()),
        owner: Some(owner),
        token_jti: Some(jti),
        function,
        digest,
        event_id,
        // A job without an input (a run on no file) has an empty input path: no path.
        paths: path.filter(|p| !p.is_empty()).into_iter().collect(),
    }))
}

/// The stored state of job `id`.
pub(super) fn subject_state(conn: &Connection, id: &str) -> rusqlite::Result<Option<String>> {
    row(conn, "SELECT state FROM jobs WHERE id = ?1", params![id], |r| r.get(0)).optional()
}

/// The path of an `http(s)` URL, percent-decoded (a storage URL's namespace path); the URL
/// itself when it has no path or does not decode to UTF-8.
pub fn url_path(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let Some(i) = rest.find('/') else { return url.to_owned() };
    let raw = rest[i..].split(['?', '#']).next().unwrap_or("");
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut k = 0;
    while k < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[k], bytes.get(k + 1).and_then(|b| hex(*b)), bytes.get(k + 2).and_then(|b| hex(*b))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                k += 3;
            }
            (b, _, _) => {
                out.push(b);
                k += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| url.to_owned())
}

/// A refused submission, for its `job.refused` record ([`Queue::record_refusals`]).
#[derive(Debug)]
pub struct Refusal {
    /// What is known of it: the verified token's `jti` and owner, the request's function and event.
    pub subject: Subject,
    /// The HTTP status answered.
    pub status: u16,
    /// The reason answered.
    pub reason: String,
    /// Facts beside (the token's issuer, an unverified token's claimed `jti`).
    pub detail: serde_json::Map<String, serde_json::Value>,
}

impl Queue {
    /// Records refused submissions (`job.refused` each, with the HTTP status answered and the
    /// reason) in one transaction of their own: a refusal changes nothing else in the store.
    /// Each [`Refusal`]'s subject holds what is known (the verified token's `jti` and owner,
    /// the request's function and event); its detail adds facts (an object). A refusal whose
    /// token did not verify (`subject.owner` unset) is recorded within a budget of
    /// [`UNVERIFIED_REFUSALS_PER_S`] (burst [`UNVERIFIED_REFUSALS_BURST`]); beyond it, it is
    /// counted instead, and the next such record carries `"unrecorded_before": n`. Returns
    /// how many records were written.
    pub async fn record_refusals(&self, refusals: Vec<Refusal>) -> Result<usize, QueueError> {
        let mut drafts = Vec::with_capacity(refusals.len());
        for r in refusals {
            let unrecorded_before = if r.subject.owner.is_none() {
                let mut budget = self.unverified_refusals.lock().map_err(|_| QueueError::Poisoned)?;
                match budget.take(std::time::Instant::now()) {
                    Some(n) => n,
                    None => continue,
                }
            } else {
                0
            };
            let mut draft = AuditDraft::job_refused(r.subject, r.status, &r.reason);
            for (k, v) in r.detail {
                draft = draft.with_detail(&k, v);
            }
            if unrecorded_before > 0 {
                draft = draft.with_detail("unrecorded_before", unrecorded_before.into());
            }
            drafts.push(draft);
        }
        if drafts.is_empty() {
            return Ok(0);
        }
        self.write(move |tx| {
            let n = drafts.len();
            for draft in drafts {
                audit::append_in(tx, draft)?;
            }
            Ok(n)
        })
        .await
    }

    /// Signs a checkpoint of the audit trail's head with `signer` when `policy` says one is
    /// due, or (`force`, at shutdown) whenever the head has none.
    pub async fn audit_checkpoint(
        &self,
        signer: Arc<AuditSigner>,
        policy: CheckpointPolicy,
        force: bool,
    ) -> Result<Option<Checkpoint>, QueueError> {
        self.call_writing(move |conn| Ok(audit::checkpoint_in(conn, &signer, policy, force)?)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_budget_lends_a_burst_then_its_rate_and_counts_the_rest() {
        let t0 = std::time::Instant::now();
        let mut b = RefusalBudget { tokens: UNVERIFIED_REFUSALS_BURST, last: t0, suppressed: 0 };
        let burst = UNVERIFIED_REFUSALS_BURST as usize;
        assert!((0..burst).all(|_| b.take(t0) == Some(0)));
        assert_eq!((b.take(t0), b.take(t0), b.suppressed), (None, None, 2));
        // Half a token's time later: still nothing; a full token's: one record, owning up to 3.
        let token = std::time::Duration::from_secs_f64(1.0 / UNVERIFIED_REFUSALS_PER_S);
        assert_eq!(b.take(t0 + token / 2), None);
        assert_eq!(b.take(t0 + token + token / 2), Some(3));
        assert_eq!(b.take(t0 + token + token / 2), None);
        // A long quiet refills to the burst, no more; a clock that goes back adds nothing.
        let later = t0 + token * 10_000;
        assert!((0..burst).all(|_| b.take(later) == Some(0) || b.suppressed == 0));
        assert_eq!(b.take(later), None);
        assert_eq!(b.take(t0), None);
    }
}
