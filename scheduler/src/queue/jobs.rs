//! Jobs as submitted and acted on: [`Queue::submit`] (revocation, dedupe key, token uses, the
//! idle limit), an admin's [`Action`] ([`Queue::act_by`]), the overdue removal, and reading
//! job records, their attempts and logs back.
//!
//! Must not know: HTTP, EP sessions or matching (a job's run on an EP is [`super::runs`]).

use super::Queue;
use super::schema::{JOB_WITH_REQUEST, LIVE, trace_id_of};
use super::trail::{job_subject, url_path};
use crate::error::QueueError;
use crate::revocation::Credential;
use crate::seal::SealRequest as _;
use htfaas_functions::Resources;
use htfaas_functions::audit::{self, AuditDraft, Subject};
use htfaas_functions::proto::{Attempt, HOLD_CODE_BY_ADMIN, JobRecord, JobState, OutputFile, SubmitRequest, Usage};
use htfaas_functions::store::{db_int, exec, from_db, now_ms, row};
use rusqlite::{Connection, OptionalExtension as _, params};

/// What an admin does to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Keep it, but do not run it (stop it if it runs).
    Hold,
    /// Let a held job run again.
    Release,
    /// Take it out of the queue for good (stop it if it runs).
    Remove,
}

impl Action {
    /// The verb as a past participle, for messages ("only held jobs can be released").
    pub fn done(self) -> &'static str {
        match self {
            Action::Hold => "held",
            Action::Release => "released",
            Action::Remove => "removed",
        }
    }
}

/// Longest EP log kept per job, bytes.
pub const MAX_LOG_BYTES: usize = 64 * 1024;

const RECORD_COLUMNS: &str = "id, owner, state, reason, token_jti, request, cpus, memory_mb, runtime_s, ep, \
     submitted_at_ms, started_at_ms, finished_at_ms, exit_code, usage, outputs, token_issuer, grp, annex, hold_code, \
     class, attempts, gpus, disk_mb";

/// A job to insert: the verified request and what the token says about it.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// The validated request.
    pub request: SubmitRequest,
    /// The token's subject: who is accounted.
    pub owner: String,
    /// The token's id, whose uses are counted.
    pub jti: String,
    /// The token's issuer, kept for revocation.
    pub issuer: String,
    /// The token's accounting group, if any.
    pub group: Option<String>,
    /// How many jobs the token allows.
    pub jobs: u32,
    /// The token's expiry, so that its use count can be pruned after it.
    pub exp: u64,
    /// Most idle (or held) jobs the owner may have; a new job past it is refused
    /// ([`QueueError::TooManyIdle`]). `None`: unlimited.
    pub max_idle: Option<u64>,
    /// The job class the scheduler resolved for it, if classes are configured.
    pub class: Option<String>,
    /// When set, the job is accepted held with this code and reason (a hold requirement).
    pub hold: Option<(u32, String)>,
}

/// Answer to [`Queue::submit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The new job's id, or the one that already had the dedupe key.
    pub job_id: String,
    /// False when the dedupe key already named a job.
    pub created: bool,
}

/// What [`Queue::act_by`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acted {
    /// The job as it is now.
    pub record: JobRecord,
    /// The EP session it was running on, when it is to be stopped there.
    pub stop: Option<String>,
}

/// The log cut to [`MAX_LOG_BYTES`] at a character boundary.
pub(super) fn bounded_log(mut log: String) -> String {
    if log.len() > MAX_LOG_BYTES {
        let mut cut = MAX_LOG_BYTES;
        while !log.is_char_boundary(cut) {
            cut -= 1;
        }
        log.truncate(cut);
    }
    log
}

/// Jobs submitted so far with the token `jti`.
fn token_uses(conn: &Connection, jti: &str) -> rusqlite::Result<u64> {
    let uses: Option<i64> =
        row(conn, "SELECT uses FROM token_uses WHERE jti = ?1", params![jti], |r| r.get(0)).optional()?;
    Ok(uses.map(from_db).unwrap_or(0))
}

/// A `jobs` row before its JSON columns are decoded.
struct RawRecord {
    id: String,
    owner: String,
    state: String,
    reason: String,
    token_jti: String,
    request: String,
    resources: Resources,
    ep: Option<String>,
    submitted_at_ms: i64,
    started_at_ms: Option<i64>,
    finished_at_ms: Option<i64>,
    exit_code: Option<i32>,
    usage: Option<String>,
    outputs: Option<String>,
    token_issuer: String,
    group: Option<String>,
    annex: Option<String>,
    hold_code: Option<u32>,
    class: Option<String>,
    attempts: u32,
}

fn raw_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRecord> {
    Ok(RawRecord {
        id: r.get(0)?,
        owner: r.get(1)?,
        state: r.get(2)?,
        reason: r.get(3)?,
        token_jti: r.get(4)?,
        request: r.get(5)?,
        resources: Resources {
            cpus: r.get(6)?,
            memory_mb: from_db(r.get(7)?),
            runtime_s: from_db(r.get(8)?),
            gpus: r.get(22)?,
            disk_mb: from_db(r.get(23)?),
        },
        ep: r.get(9)?,
        submitted_at_ms: r.get(10)?,
        started_at_ms: r.get(11)?,
        finished_at_ms: r.get(12)?,
        exit_code: r.get(13)?,
        usage: r.get(14)?,
        outputs: r.get(15)?,
        token_issuer: r.get(16)?,
        group: r.get(17)?,
        annex: r.get(18)?,
        hold_code: r.get(19)?,
        class: r.get(20)?,
        attempts: r.get(21)?,
    })
}

impl RawRecord {
    fn decode(self) -> Result<JobRecord, QueueError> {
        let corrupt = |what: &str, e: &dyn std::fmt::Display| QueueError::Corrupt {
            id: self.id.clone(),
            reason: format!("{what}: {e}"),
        };
        let state = JobState::parse(&self.state).ok_or_else(|| corrupt("state", &format_args!("{:?}", self.state)))?;
        let request: SubmitRequest = serde_json::from_str(&self.request).map_err(|e| corrupt("request", &e))?;
        let usage: Option<Usage> =
            self.usage.as_deref().map(serde_json::from_str).transpose().map_err(|e| corrupt("usage", &e))?;
        let outputs: Vec<OutputFile> = self
            .outputs
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| corrupt("outputs", &e))?
            .unwrap_or_default();
        Ok(JobRecord {
            id: self.id,
            owner: self.owner,
            function: request.function.name,
            version: request.function.version,
            digest: request.function.digest,
            native: request.function.native,
            state,
            reason: self.reason,
            // Empty for a job without an input (a run on no file).
            input: request.input.map(|i| i.url).unwrap_or_default(),
            event: request.event,
            token_jti: self.token_jti,
            token_issuer: self.token_issuer,
            group: self.group,
            annex: self.annex,
            class: self.class,
            attempts: self.attempts,
            hold_code: self.hold_code,
            resources: self.resources,
            ep: self.ep,
            submitted_at_ms: from_db(self.submitted_at_ms),
            started_at_ms: self.started_at_ms.map(from_db),
            finished_at_ms: self.finished_at_ms.map(from_db),
            exit_code: self.exit_code,
            usage,
            outputs,
        })
    }
}

/// The ended jobs of a window, in the order they ended (then by id), after a cursor: a seek in
/// the index of ended jobs by time, never a scan of the table.
pub(super) fn ended_sql() -> String {
    format!(
        "SELECT {RECORD_COLUMNS} FROM jobs INDEXED BY jobs_final_by_time JOIN job_requests USING (seq) \
         WHERE state IN ('completed', 'failed', 'removed') AND finished_at_ms >= ?1 AND finished_at_ms < ?2 \
         AND (?3 IS NULL OR finished_at_ms > ?1 OR id > ?3) ORDER BY finished_at_ms, id LIMIT ?4"
    )
}

/// How many jobs of an owner wait (idle or held): counted in the small index of live jobs by
/// owner, which the [`LIVE`] term lets SQLite use.
pub(super) fn waiting_of_owner_sql() -> String {
    format!("SELECT COUNT(*) FROM jobs WHERE owner = ?1 AND {LIVE} AND state IN ('idle', 'held')")
}

/// The unfinished jobs, optionally of one owner, group and function, oldest first. Without
/// `INDEXED BY` the planner, lacking statistics, walks the whole table in `seq` order.
pub(super) fn unfinished_sql() -> String {
    format!(
        "SELECT {RECORD_COLUMNS} FROM jobs INDEXED BY jobs_live_by_owner JOIN job_requests USING (seq) WHERE {LIVE} \
         AND (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR grp = ?2) \
         AND (?3 IS NULL OR function_name = ?3) ORDER BY seq LIMIT ?4"
    )
}

/// Whether an owner's function has a job on an input path.
pub(super) const FIRED_PATH: &str =
    "SELECT 1 FROM jobs WHERE owner = ?1 AND function_name = ?2 AND input_path = ?3 LIMIT 1";

/// The jobs of one trace, oldest first.
pub(super) fn of_trace_sql() -> String {
    format!("SELECT {RECORD_COLUMNS} FROM {JOB_WITH_REQUEST} WHERE trace_id = ?1 ORDER BY seq LIMIT ?2")
}

/// The running jobs past their run time plus a grace (`?2`) at `?1`.
pub(super) const OVERDUE: &str = "SELECT id, ep_session, runtime_s, class FROM jobs WHERE state = 'running' \
     AND ep_session IS NOT NULL AND started_at_ms + runtime_s * 1000 + ?2 < ?1";

/// Decides one submitted job on the writer's transaction `tx` (see [`Queue::submit`]); `stored`
/// is its request sealed for `job_id`. Every refusal comes before the job's first write.
fn insert_job(
    tx: &rusqlite::Connection,
    revoked: &std::sync::RwLock<crate::revocation::Revoked>,
    job: NewJob,
    job_id: String,
    stored: String,
) -> Result<Submitted, QueueError> {
    // Checked on the writer, which runs every write in turn: a revocation made meanwhile
    // either is seen here or is written after this job, and removes it.
    let credential = Credential { jti: job.jti.clone(), owner: Some(job.owner.clone()), issuer: job.issuer.clone() };
    let reason = revoked.read().unwrap_or_else(|p| p.into_inner()).reason_for(&credential).map(str::to_owned);
    if let Some(reason) = reason {
        return Err(QueueError::Revoked { reason });
    }
    let existing: Option<String> = row(
        tx,
        "SELECT id FROM jobs WHERE owner = ?1 AND dedupe_key = ?2",
        params![job.owner, job.request.dedupe_key],
        |r| r.get(0),
    )
    .optional()?;
    if let Some(job_id) = existing {
        return Ok(Submitted { job_id, created: false });
    }
    let uses = token_uses(tx, &job.jti)?;
    if uses >= u64::from(job.jobs) {
        return Err(QueueError::TokenUsed { uses, jobs: job.jobs });
    }
    if let Some(max) = job.max_idle {
        // Under the connection lock, like the use count: concurrent submits see each
        // other's inserts, so the owner never exceeds the limit.
        let idle: i64 = row(tx, &waiting_of_owner_sql(), params![job.owner], |r| r.get(0))?;
        let idle = from_db(idle);
        if idle >= max {
            return Err(QueueError::TooManyIdle { owner: job.owner, idle, max });
        }
    }
    exec(
        tx,
        "INSERT INTO token_uses (jti, uses, exp) VALUES (?1, ?2, ?3) \
         ON CONFLICT (jti) DO UPDATE SET uses = excluded.uses",
        params![job.jti, db_int(uses + 1), db_int(job.exp)],
    )?;
    let r = job.request.resources;
    let (state, hold_code, reason) = match &job.hold {
        Some((code, reason)) => ("held", Some(*code), reason.as_str()),
        None => ("idle", None, ""),
    };
    exec(
        tx,
        "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, cpus, memory_mb, \
         runtime_s, submitted_at_ms, token_issuer, grp, annex, class, gpus, disk_mb, hold_code, reason, \
         sealed_for_job, image, function_name, function_digest, event_id, input_path, trace_id, max_concurrent) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, 1, ?18, ?19, ?20, ?21, \
         ?22, ?23, ?24)",
        params![
            job_id,
            job.owner,
            job.request.dedupe_key,
            state,
            job.jti,
            r.cpus,
            db_int(r.memory_mb),
            db_int(r.runtime_s),
            db_int(now_ms()),
            job.issuer,
            job.group,
            job.request.annex,
            job.class,
            r.gpus,
            db_int(r.disk_mb),
            hold_code,
            reason,
            job.request.function.native.as_ref().map(|_| job.request.function.digest.as_str()),
            job.request.function.name,
            job.request.function.digest.as_str(),
            job.request.event.id,
            job.request.event.path,
            job.request.event.trace.as_deref().map(trace_id_of),
            job.request.max_concurrent,
        ],
    )?;
    exec(tx, "INSERT INTO job_requests (seq, request) VALUES (?1, ?2)", params![tx.last_insert_rowid(), stored])?;
    let req = &job.request;
    let subject = Subject {
        job: Some(job_id.clone()),
        token_jti: Some(job.jti.clone()),
        owner: Some(job.owner.clone()),
        function: Some(req.function.name.clone()),
        digest: Some(req.function.digest.as_str().to_owned()),
        event_id: Some(req.event.id.clone()),
        paths: vec![req.event.path.clone()],
    };
    let accepted = AuditDraft::job_accepted(subject.clone(), &r, job.group.as_deref())
        .with_detail("token_issuer", job.issuer.clone().into())
        .with_detail("function_version", req.function.version.into())
        .with_detail(
            "event",
            serde_json::json!({
                "source": req.event.source, "id": req.event.id, "path": req.event.path,
                "caused_by": req.event.caused_by,
            }),
        )
        // Null for a job without an input: its lineage shows none.
        .with_detail(
            "input",
            match &req.input {
                Some(input) => serde_json::json!({ "path": req.event.path, "url": input.url }),
                None => serde_json::Value::Null,
            },
        )
        .with_detail("output", serde_json::json!({ "dir": url_path(&req.output.url), "url": req.output.url }))
        .with_detail("class", serde_json::json!(job.class))
        .with_detail("annex", serde_json::json!(req.annex))
        .with_detail("dedupe_key", req.dedupe_key.clone().into());
    audit::append_in(tx, accepted)?;
    if let Some((code, reason)) = &job.hold {
        audit::append_in(tx, AuditDraft::job_held(subject, reason, Some(i64::from(*code))))?;
    }
    Ok(Submitted { job_id, created: true })
}

impl Queue {
    /// In one transaction: refuses a revoked token, returns the job that already has
    /// `(owner, dedupe_key)`, or refuses a used-up token, or refuses when the owner already has
    /// `max_idle` idle or held jobs (counting no use), or counts a use of the token and inserts
    /// the job as idle. A refusal changes nothing: every check comes before the first write.
    pub async fn submit(&self, job: NewJob) -> Result<Submitted, QueueError> {
        let mut answers = self.submit_many(vec![job]).await?;
        answers.pop().unwrap_or_else(|| Err(QueueError::Task("a submission was not answered".into())))
    }

    /// Several jobs in one write, each decided as [`Queue::submit`] decides one, in order (a
    /// job sees the ones before it: two with one dedupe key make one job, a token allowing one
    /// job submits only the first). Each job's refusal (revoked, token used up, the idle limit,
    /// a request that cannot be sealed) is its own answer and changes nothing, since every
    /// check comes before the job's first write; any other failure (the store's) fails the
    /// whole batch, and nothing of it is stored.
    pub async fn submit_many(&self, jobs: Vec<NewJob>) -> Result<Vec<Result<Submitted, QueueError>>, QueueError> {
        let revoked = self.revoked.clone();
        // What the file keeps: each request with its macaroons sealed for its job (the id is
        // chosen here, so the sealing stays off the writer; a dedupe hit discards both).
        let mut sealed = Vec::with_capacity(jobs.len());
        for job in jobs {
            // Time-ordered (UUIDv7: 74 random bits after the milliseconds), so that the indexes
            // keyed by job id (the job's, its attempts', its audit records') grow at one end.
            let job_id = uuid::Uuid::now_v7().to_string();
            let stored = self
                .sealer
                .seal_request(&job_id, &job.request)
                .map_err(QueueError::from)
                .and_then(|r| serde_json::to_string(&r).map_err(QueueError::from));
            sealed.push(stored.map(|stored| (job, job_id, stored)));
        }
        self.write(move |tx| {
            let mut answers = Vec::with_capacity(sealed.len());
            for item in sealed {
                let answer = match item {
                    Err(e) => Err(e),
                    Ok((job, job_id, stored)) => match insert_job(tx, &revoked, job, job_id, stored) {
                        Err(
                            e @ (QueueError::Revoked { .. }
                            | QueueError::TokenUsed { .. }
                            | QueueError::TooManyIdle { .. }),
                        ) => Err(e),
                        Err(e) => return Err(e),
                        Ok(done) => Ok(done),
                    },
                };
                answers.push(answer);
            }
            Ok(answers)
        })
        .await
    }

    /// How many jobs the token `jti` has submitted (for preflight; changes nothing).
    pub async fn uses(&self, jti: String) -> Result<u64, QueueError> {
        self.call(move |conn| Ok(token_uses(conn, &jti)?)).await
    }

    /// [`Queue::act_by`] by the actor `admin`, for the tests.
    #[cfg(test)]
    pub(crate) async fn act(&self, id: String, action: Action, reason: String) -> Result<Acted, QueueError> {
        self.act_by(id, action, reason, "admin".into()).await
    }

    /// In one transaction: applies an admin's `action` to job `id` (see [`Action`] for what each
    /// does to which state), by `actor` (recorded in the audit trail), and returns the updated
    /// record, with the EP session to stop it on when it was running.
    /// [`QueueError::JobNotFound`] for an unknown id, [`QueueError::Conflict`] when the job's
    /// state does not allow the action.
    pub async fn act_by(&self, id: String, action: Action, reason: String, actor: String) -> Result<Acted, QueueError> {
        self.write(move |tx| {
            let row: Option<(String, Option<String>)> =
                row(tx, "SELECT state, ep_session FROM jobs WHERE id = ?1", params![id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let Some((stored, session)) = row else {
                return Err(QueueError::JobNotFound { id });
            };
            let state = JobState::parse(&stored)
                .ok_or_else(|| QueueError::Corrupt { id: id.clone(), reason: format!("state: {stored:?}") })?;
            let conflict = |only: &str| {
                QueueError::Conflict(format!(
                    "job {id} is {}; only {only} jobs can be {}",
                    state.as_str(),
                    action.done()
                ))
            };
            match (action, state) {
                (Action::Hold, JobState::Idle | JobState::Running) => {
                    exec(
                        tx,
                        "UPDATE jobs SET state = 'held', reason = ?2, hold_code = ?3 WHERE id = ?1",
                        params![id, reason, HOLD_CODE_BY_ADMIN],
                    )?;
                }
                (Action::Hold, JobState::Held) => {
                    return Err(QueueError::Conflict(format!("job {id} is already held")));
                }
                (Action::Hold, _) => return Err(conflict("idle or running")),
                (Action::Release, JobState::Held) => {
                    // A fresh start: what the stopped attempt left is forgotten (it was charged
                    // if it reported while held).
                    exec(
                        tx,
                        "UPDATE jobs SET state = 'idle', reason = '', hold_code = NULL, ep = NULL, \
                         ep_session = NULL, started_at_ms = NULL, finished_at_ms = NULL, exit_code = NULL, \
                         usage = NULL, outputs = NULL, log = NULL, lost = 0, not_before_ms = 0 WHERE id = ?1",
                        params![id],
                    )?;
                }
                (Action::Release, _) => return Err(conflict("held")),
                (Action::Remove, JobState::Idle | JobState::Running | JobState::Held) => {
                    exec(
                        tx,
                        "UPDATE jobs SET state = 'removed', reason = ?2, hold_code = NULL, finished_at_ms = ?3 \
                         WHERE id = ?1",
                        params![id, format!("removed by admin: {reason}"), db_int(now_ms())],
                    )?;
                }
                (Action::Remove, _) => return Err(conflict("idle, running or held")),
            }
            let record = tx
                .query_row(
                    &format!("SELECT {RECORD_COLUMNS} FROM {JOB_WITH_REQUEST} WHERE id = ?1"),
                    params![id],
                    raw_record,
                )?
                .decode()?;
            let subject = job_subject(tx, &id)?.unwrap_or_default();
            let draft = match action {
                Action::Hold => AuditDraft::job_held(subject, &reason, Some(i64::from(HOLD_CODE_BY_ADMIN)))
                    .with_detail("state", state.as_str().into()),
                Action::Release => AuditDraft::job_released(subject, &reason),
                Action::Remove => AuditDraft::job_removed(subject, &record.reason, state.as_str()),
            };
            audit::append_in(tx, draft.with_actor(actor))?;
            let stop = if state == JobState::Running && action != Action::Release { session } else { None };
            Ok(Acted { record, stop })
        })
        .await
    }

    /// The newest `limit` jobs, newest first.
    pub async fn list(&self, limit: usize) -> Result<Vec<JobRecord>, QueueError> {
        self.call(move |conn| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {RECORD_COLUMNS} FROM {JOB_WITH_REQUEST} ORDER BY seq DESC LIMIT ?1"
            ))?;
            let rows = stmt.query_map(params![limit], raw_record)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row?.decode()?);
            }
            Ok(out)
        })
        .await
    }

    /// The jobs that ended (completed, failed, removed) at `since_ms` ≤ end < `until_ms`, in
    /// the order they ended, then by id; with `after`, only those after that job of the
    /// same end time (the next page). At most `limit`: the accounting export's pages.
    pub async fn list_ended(
        &self,
        since_ms: u64,
        until_ms: u64,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<JobRecord>, QueueError> {
        self.call(move |conn| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut stmt = conn.prepare_cached(&ended_sql())?;
            let rows = stmt.query_map(params![db_int(since_ms), db_int(until_ms), after, limit], raw_record)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row?.decode()?);
            }
            Ok(out)
        })
        .await
    }

    /// The unfinished (idle, held, running) jobs of `owner`, charged to `group`, or of the
    /// function `function` (each filter that is given), oldest first, at most `limit`: what a
    /// revoked namespace grant sweeps (the gateway checks each against what its principal may
    /// still do).
    pub async fn list_unfinished(
        &self,
        owner: Option<String>,
        group: Option<String>,
        function: Option<String>,
        limit: usize,
    ) -> Result<Vec<JobRecord>, QueueError> {
        self.call(move |conn| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut stmt = conn.prepare_cached(&unfinished_sql())?;
            let rows = stmt.query_map(params![owner, group, function, limit], raw_record)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row?.decode()?);
            }
            Ok(out)
        })
        .await
    }

    /// Which of `paths` has a job of `function` of `owner`, whatever its state (for
    /// `events backfill`), in the order given.
    pub async fn fired_paths(
        &self,
        owner: String,
        function: String,
        paths: Vec<String>,
    ) -> Result<Vec<String>, QueueError> {
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(FIRED_PATH)?;
            let mut out = Vec::new();
            for p in paths {
                if stmt.exists(params![owner, function, p])? {
                    out.push(p);
                }
            }
            Ok(out)
        })
        .await
    }

    /// The jobs of the event trace `trace_id` (32 lower-case hex digits), oldest first, at
    /// most `limit` (`htfaas trace`).
    pub async fn list_by_trace(&self, trace_id: String, limit: usize) -> Result<Vec<JobRecord>, QueueError> {
        self.call(move |conn| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut stmt = conn.prepare_cached(&of_trace_sql())?;
            let rows = stmt.query_map(params![trace_id, limit], raw_record)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row?.decode()?);
            }
            Ok(out)
        })
        .await
    }

    /// One job.
    pub async fn get(&self, id: String) -> Result<Option<JobRecord>, QueueError> {
        self.call(move |conn| {
            let raw = conn
                .query_row(
                    &format!("SELECT {RECORD_COLUMNS} FROM {JOB_WITH_REQUEST} WHERE id = ?1"),
                    params![id],
                    raw_record,
                )
                .optional()?;
            raw.map(RawRecord::decode).transpose()
        })
        .await
    }

    /// Every run attempt of job `id`, first first; [`QueueError::JobNotFound`] for an unknown job.
    pub async fn history(&self, id: String) -> Result<Vec<Attempt>, QueueError> {
        self.call(move |conn| {
            let known: Option<i64> =
                row(conn, "SELECT seq FROM jobs WHERE id = ?1", params![id], |r| r.get(0)).optional()?;
            if known.is_none() {
                return Err(QueueError::JobNotFound { id });
            }
            let mut stmt = conn.prepare_cached(
                "SELECT n, ep, started_at_ms, ended_at_ms, outcome, reason, usage FROM attempts \
                 WHERE job_id = ?1 ORDER BY n",
            )?;
            let rows = stmt.query_map(params![id], |r| {
                Ok((
                    r.get::<_, u32>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, Option<String>>(6)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (n, ep, started, ended, outcome, reason, usage) = row?;
                let usage = usage
                    .as_deref()
                    .map(serde_json::from_str)
                    .transpose()
                    .map_err(|e| QueueError::Corrupt { id: id.clone(), reason: format!("attempt {n} usage: {e}") })?;
                out.push(Attempt {
                    n,
                    ep,
                    started_at_ms: from_db(started),
                    ended_at_ms: ended.map(from_db),
                    outcome,
                    reason,
                    usage,
                });
            }
            Ok(out)
        })
        .await
    }

    /// In one transaction: every running job started more than its run time plus `grace_ms`
    /// before `now_ms` becomes `removed` with a reason naming its run time (and class); returns
    /// `(job id, EP session)` of each, to be stopped there.
    pub async fn remove_overdue(&self, now_ms: u64, grace_ms: u64) -> Result<Vec<(String, String)>, QueueError> {
        self.write(move |tx| {
            let overdue: Vec<(String, String, u64, Option<String>)> = {
                let mut stmt = tx.prepare_cached(OVERDUE)?;
                stmt.query_map(params![db_int(now_ms), db_int(grace_ms)], |r| {
                    Ok((r.get(0)?, r.get(1)?, from_db(r.get(2)?), r.get(3)?))
                })?
                .collect::<Result<_, _>>()?
            };
            let mut out = Vec::new();
            for (id, session, runtime_s, class) in overdue {
                let class = class.map(|c| format!(" (job class {c})")).unwrap_or_default();
                let reason = format!("job exceeded its run time of {runtime_s} s{class}");
                exec(
                    tx,
                    "UPDATE jobs SET state = 'removed', reason = ?2, finished_at_ms = ?3 WHERE id = ?1",
                    params![id, reason, db_int(now_ms)],
                )?;
                if let Some(subject) = job_subject(tx, &id)? {
                    audit::append_in(tx, AuditDraft::job_removed(subject, &reason, "running"))?;
                }
                out.push((id, session));
            }
            Ok(out)
        })
        .await
    }

    /// The log of job `id`'s last reported run (empty before one); `None` for an unknown job.
    pub async fn log(&self, id: String) -> Result<Option<String>, QueueError> {
        self.call(move |conn| {
            let log: Option<Option<String>> =
                row(conn, "SELECT log FROM jobs WHERE id = ?1", params![id], |r| r.get(0)).optional()?;
            Ok(log.map(Option::unwrap_or_default))
        })
        .await
    }

    /// How many attempts job `id` lost (its EP gone, or the storage unavailable), and until
    /// when it waits before running again (Unix ms; 0 when it does not wait).
    pub async fn retry_state(&self, id: String) -> Result<(u32, u64), QueueError> {
        self.call(move |conn| {
            let row: Option<(u32, i64)> =
                row(conn, "SELECT lost, not_before_ms FROM jobs WHERE id = ?1", params![id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let (lost, at) = row.ok_or(QueueError::JobNotFound { id })?;
            Ok((lost, from_db(at)))
        })
        .await
    }

    /// Job `id`'s function's limit of runs at once, as it was submitted (none: no limit).
    pub async fn max_concurrent(&self, id: String) -> Result<Option<u32>, QueueError> {
        self.call(move |conn| {
            let max =
                row(conn, "SELECT max_concurrent FROM jobs WHERE id = ?1", params![id], |r| r.get(0)).optional()?;
            max.ok_or(QueueError::JobNotFound { id })
        })
        .await
    }

    /// Forgets use counts of tokens that expired before `before_s` (they no longer verify).
    pub async fn prune_token_uses(&self, before_s: u64) -> Result<usize, QueueError> {
        self.write(move |tx| Ok(exec(tx, "DELETE FROM token_uses WHERE exp < ?1", params![db_int(before_s)])?)).await
    }
}
