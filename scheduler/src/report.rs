//! Accounting reports over the job records: per owner, group or function, per period
//! (`GET /v1/accounting/report`, [`report`]).
//!
//! A job counts once, in the period in which it reached its final state (`completed`, `failed`
//! or `removed`: its `finished_at_ms`), with the usage its EP reported (none for a job removed
//! before it ran). Every figure is a sum over those jobs (the largest, for peak memory), so a
//! report equals what the job records (`GET /v1/jobs`) add up to, and the rows of a split
//! report add up to the unsplit one. Times and counts are summed as integers (milliseconds,
//! bytes) and turned into hours once, at the end.
//!
//! One streaming pass over the index `jobs_final_by_time` (schema 10) ([`crate::queue`]), which
//! holds everything read here, on a read-only connection of its own: a report over 100k jobs
//! does not hold up the queue, and never reads the jobs' requests or logs.

use htfaas_functions::proto::{AccountingBy, AccountingQuery, AccountingReport, AccountingRow, JobState, Usage};
use htfaas_functions::store::{db_int, from_db};
use rusqlite::{Connection, OpenFlags, OptionalExtension as _, params};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

/// Most periods a split report may span (from its first job, or `since_ms`, to `until_ms`).
pub const MAX_PERIODS: u64 = 10_000;
/// Most rows a report may have (keys × periods with jobs).
pub const MAX_ROWS: usize = 100_000;
/// The group key of jobs without an accounting group.
pub const NO_GROUP: &str = "(none)";

/// A job's function name (`NULL` for a job whose stored request did not parse when schema 10
/// took it from there): a column of `jobs_final_by_time`, so that the index alone answers.
const FUNCTION_NAME: &str = "function_name";

/// How long a report waits for a writer holding the file (WAL readers rarely wait).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The query itself is wrong (400).
    #[error("{0}")]
    BadQuery(String),
    /// The store could not be read.
    #[error("read the job store: {0}")]
    Db(rusqlite::Error),
    /// A job's stored usage does not decode.
    #[error("job {id}: stored usage does not decode: {reason}")]
    Corrupt {
        /// The job.
        id: String,
        /// The decoder's complaint.
        reason: String,
    },
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<rusqlite::Error> for ReportError {
    fn from(e: rusqlite::Error) -> ReportError {
        ReportError::Db(e)
    }
}

/// The report `query` asks for, read from the job store at `path` (read-only); `now_ms` is the
/// default end of the range.
pub fn report(path: &Path, query: &AccountingQuery, now_ms: u64) -> Result<AccountingReport, ReportError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    report_in(&conn, query, now_ms)
}

/// [`report`] on an open connection to the job store.
pub fn report_in(conn: &Connection, query: &AccountingQuery, now_ms: u64) -> Result<AccountingReport, ReportError> {
    let since_ms = query.since_ms.unwrap_or(0);
    let until_ms = query.until_ms.unwrap_or(now_ms);
    if since_ms > until_ms {
        return Err(ReportError::BadQuery(format!("since_ms {since_ms} is after until_ms {until_ms}")));
    }
    let period_ms = match query.period_s {
        None => None,
        Some(0) => return Err(ReportError::BadQuery("period_s must be at least 1".into())),
        Some(s) => Some(s.checked_mul(1000).ok_or_else(|| ReportError::BadQuery(format!("period_s {s}: too long")))?),
    };
    let (since, until) = (db_int(since_ms), db_int(until_ms));
    if let Some(p) = period_ms {
        // From the first job in range when no start was given: `--period 1h` alone is fine on
        // a young store.
        let first: Option<i64> = conn
            .query_row(
                "SELECT MIN(finished_at_ms) FROM jobs INDEXED BY jobs_final_by_time \
                 WHERE state IN ('completed', 'failed', 'removed') AND finished_at_ms >= ?1 AND finished_at_ms < ?2",
                params![since, until],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        let start = if query.since_ms.is_some() { since_ms } else { first.map_or(until_ms, from_db) };
        let periods = spanned_periods(start, until_ms, p);
        if periods > MAX_PERIODS {
            return Err(ReportError::BadQuery(format!(
                "{periods} periods of {} s from {start} to {until_ms} (Unix ms); at most {MAX_PERIODS}: \
                 narrow the range or lengthen the period",
                p / 1000
            )));
        }
    }
    let key = match query.by {
        AccountingBy::Owner => "owner",
        AccountingBy::Group => "grp",
        AccountingBy::Function => FUNCTION_NAME,
    };
    let mut stmt = conn.prepare(&select_sql(key))?;
    let mut rows = stmt.query(params![since, until])?;
    let mut sums: HashMap<String, BTreeMap<u64, Sums>> = HashMap::new();
    let mut count = 0usize;
    while let Some(r) = rows.next()? {
        let key: &str = match text(r, 0)? {
            Some(k) => k,
            None if query.by == AccountingBy::Group => NO_GROUP,
            None => "(unknown)",
        };
        let state = match text(r, 1)?.unwrap_or_default() {
            "completed" => FinalState::Completed,
            "failed" => FinalState::Failed,
            _ => FinalState::Removed,
        };
        let finished = from_db(r.get(2)?);
        let period = period_ms.map_or(since_ms, |p| finished - finished % p);
        let cpus: u32 = r.get(3)?;
        let usage: Option<Usage> = match text(r, 4)? {
            None => None,
            Some(text) => Some(serde_json::from_str(text).map_err(|e| {
                let seq: i64 = r.get(5).unwrap_or_default();
                ReportError::Corrupt { id: job_id(conn, seq), reason: e.to_string() }
            })?),
        };
        let periods = match sums.get_mut(key) {
            Some(p) => p,
            None => sums.entry(key.to_owned()).or_default(),
        };
        let s = match periods.get_mut(&period) {
            Some(s) => s,
            None => {
                count += 1;
                if count > MAX_ROWS {
                    return Err(ReportError::BadQuery(format!(
                        "more than {MAX_ROWS} rows: narrow the range or lengthen the period"
                    )));
                }
                periods.entry(period).or_default()
            }
        };
        s.add(state, cpus, usage.as_ref());
    }
    let mut keys: Vec<(String, BTreeMap<u64, Sums>)> = sums.into_iter().collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    let rows = keys
        .into_iter()
        .flat_map(|(key, periods)| periods.into_iter().map(move |(start, s)| s.row(key.clone(), start)))
        .collect();
    Ok(AccountingReport { since_ms, until_ms, by: query.by, period_s: query.period_s, rows })
}

/// The one query of a report, over key column `key`: every column it reads is in the index
/// (the rowid `seq` too), and the `state IN` term is the index's own condition. Without
/// `INDEXED BY` the planner, lacking statistics, might take another index and read the rows.
fn select_sql(key: &str) -> String {
    format!(
        "SELECT {key}, state, finished_at_ms, cpus, usage, seq FROM jobs INDEXED BY jobs_final_by_time \
         WHERE state IN ('completed', 'failed', 'removed') AND finished_at_ms >= ?1 AND finished_at_ms < ?2"
    )
}

/// How many periods of `period_ms`, aligned to the Unix epoch, `[start, until)` touches.
fn spanned_periods(start: u64, until: u64, period_ms: u64) -> u64 {
    if until <= start {
        return 0;
    }
    (until - 1) / period_ms - start / period_ms + 1
}

/// Column `i` of `r` as text, without a copy; `None` for `NULL`.
fn text<'r>(r: &'r rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Option<&'r str>> {
    r.get_ref(i)?
        .as_str_or_null()
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e)))
}

/// The id of the job with rowid `seq`, for an error message.
fn job_id(conn: &Connection, seq: i64) -> String {
    conn.query_row("SELECT id FROM jobs WHERE seq = ?1", [seq], |r| r.get(0)).unwrap_or_else(|_| format!("#{seq}"))
}

#[derive(Debug, Clone, Copy)]
enum FinalState {
    Completed,
    Failed,
    Removed,
}

/// One row's sums, exact: milliseconds and bytes as integers.
#[derive(Debug, Default)]
struct Sums {
    /// Jobs completed, failed, removed.
    jobs: [u64; 3],
    core_ms: u128,
    wall_ms: u128,
    cpu_ms: u128,
    peak_memory_bytes: u64,
    bytes_read: u64,
    bytes_written: u64,
    instructions: Option<u64>,
}

impl Sums {
    fn add(&mut self, state: FinalState, cpus: u32, usage: Option<&Usage>) {
        self.jobs[state as usize] += 1;
        let Some(u) = usage else { return };
        self.core_ms += u128::from(cpus) * u128::from(u.wall_ms);
        self.wall_ms += u128::from(u.wall_ms);
        self.cpu_ms += u128::from(u.cpu_ms);
        self.peak_memory_bytes = self.peak_memory_bytes.max(u.peak_memory_bytes);
        self.bytes_read = self.bytes_read.saturating_add(u.bytes_in);
        self.bytes_written = self.bytes_written.saturating_add(u.bytes_out);
        if let Some(i) = u.instructions {
            self.instructions = Some(self.instructions.unwrap_or(0).saturating_add(i));
        }
    }

    fn row(self, key: String, period_start_ms: u64) -> AccountingRow {
        const MS_PER_HOUR: f64 = 3_600_000.0;
        let states = [JobState::Completed, JobState::Failed, JobState::Removed];
        AccountingRow {
            key,
            period_start_ms,
            jobs: states
                .iter()
                .zip(self.jobs)
                .filter(|(_, n)| *n > 0)
                .map(|(state, n)| (state.as_str().to_owned(), n))
                .collect(),
            core_hours: self.core_ms as f64 / MS_PER_HOUR,
            wall_hours: self.wall_ms as f64 / MS_PER_HOUR,
            cpu_hours: self.cpu_ms as f64 / MS_PER_HOUR,
            peak_memory_bytes: self.peak_memory_bytes,
            bytes_read: self.bytes_read,
            bytes_written: self.bytes_written,
            instructions: self.instructions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actions::Action;
    use crate::queue::{NewJob, Queue};
    use htfaas_functions::proto::{JobAssignment, JobReport, Outcome};

    const HOUR: u64 = 3_600_000;
    /// 2026-01-01T00:00:00Z, a whole day.
    const T0: u64 = 1_767_225_600_000;

    /// One job of a test: who, which function, which group, how it ends, when, what it used.
    struct Spec {
        owner: &'static str,
        function: &'static str,
        group: Option<&'static str>,
        cpus: u32,
        /// `None`: removed before it ran.
        outcome: Option<Outcome>,
        finished_at_ms: u64,
        usage: Usage,
    }

    fn usage(wall_ms: u64, bytes_in: u64, instructions: Option<u64>) -> Usage {
        Usage {
            wall_ms,
            cpu_ms: wall_ms / 2,
            peak_memory_bytes: wall_ms * 10,
            bytes_in,
            bytes_out: 7,
            instructions,
            phases: Default::default(),
        }
    }

    fn spec(owner: &'static str, function: &'static str, finished_at_ms: u64, wall_ms: u64) -> Spec {
        Spec {
            owner,
            function,
            group: None,
            cpus: 1,
            outcome: Some(Outcome::Exited { exit_code: 0 }),
            finished_at_ms,
            usage: usage(wall_ms, 100, None),
        }
    }

    fn ok(a: JobAssignment, _bind: bool) -> Result<JobAssignment, String> {
        Ok(a)
    }

    /// A real queue with the jobs of `specs`, run through submit, dispatch and the EP's report
    /// (or an admin's remove), then given their end times.
    async fn queue_with(specs: &[Spec]) -> (tempfile::TempDir, Queue) {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let mut ends = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let mut request = crate::testing::request(&format!("k{i}"));
            request.function.name = s.function.into();
            request.resources.cpus = s.cpus;
            let job = NewJob {
                request,
                owner: s.owner.into(),
                jti: format!("t{i}"),
                issuer: "gw".into(),
                group: s.group.map(str::to_owned),
                jobs: 1,
                exp: u64::MAX,
                max_idle: None,
                class: None,
                hold: None,
            };
            let id = q.submit(job).await.expect("submit").job_id;
            match &s.outcome {
                Some(outcome) => {
                    q.mark_running(vec![id.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");
                    let report = JobReport {
                        input_sha256: None,
                        job_id: id.clone(),
                        outcome: outcome.clone(),
                        usage: s.usage,
                        outputs: vec![],
                        log: String::new(),
                        refs: Vec::new(),
                        checkpoint: None,
                    };
                    q.finish("s1".into(), report, crate::queue::Loss::Shutdown)
                        .await
                        .expect("finish")
                        .expect("was running");
                }
                None => {
                    q.act(id.clone(), Action::Remove, "not wanted".into()).await.expect("remove");
                }
            }
            ends.push((id, s.finished_at_ms));
        }
        let conn = Connection::open(q.path()).expect("second connection");
        for (id, at) in ends {
            conn.execute("UPDATE jobs SET finished_at_ms = ?2 WHERE id = ?1", params![id, db_int(at)]).expect("end");
        }
        (dir, q)
    }

    fn query(by: AccountingBy, since_ms: Option<u64>, until_ms: Option<u64>, period_s: Option<u64>) -> AccountingQuery {
        AccountingQuery { since_ms, until_ms, by, period_s }
    }

    fn run(q: &Queue, query: &AccountingQuery) -> Result<AccountingReport, ReportError> {
        report(q.path(), query, T0 + 100 * HOUR)
    }

    fn keys(r: &AccountingReport) -> Vec<(&str, u64)> {
        r.rows.iter().map(|row| (row.key.as_str(), row.period_start_ms)).collect()
    }

    fn jobs(row: &AccountingRow) -> Vec<(&str, u64)> {
        row.jobs.iter().map(|(s, n)| (s.as_str(), *n)).collect()
    }

    #[tokio::test]
    async fn rows_sum_the_jobs_of_each_key_and_count_them_by_final_state() {
        let mut failed = spec("bob", "convert", T0 + 2 * HOUR, 500);
        failed.outcome = Some(Outcome::Exited { exit_code: 3 });
        failed.group = Some("physics");
        failed.cpus = 4;
        let mut removed = spec("bob", "checksum", T0 + 3 * HOUR, 0);
        removed.outcome = None;
        let mut grouped = spec("alice", "checksum", T0 + HOUR, 2000);
        grouped.group = Some("physics");
        let specs = [spec("alice", "checksum", T0, 1000), grouped, failed, removed];
        let (_dir, q) = queue_with(&specs).await;

        let by_owner = run(&q, &query(AccountingBy::Owner, None, None, None)).expect("report");
        assert_eq!((by_owner.since_ms, by_owner.until_ms), (0, T0 + 100 * HOUR));
        assert_eq!(keys(&by_owner), [("alice", 0), ("bob", 0)]);
        let alice = &by_owner.rows[0];
        assert_eq!(jobs(alice), [("completed", 2)]);
        assert!((alice.core_hours - 3000.0 / HOUR as f64).abs() < 1e-15, "{alice:?}");
        assert!((alice.wall_hours - 3000.0 / HOUR as f64).abs() < 1e-15, "{alice:?}");
        assert!((alice.cpu_hours - 1500.0 / HOUR as f64).abs() < 1e-15, "{alice:?}");
        assert_eq!((alice.peak_memory_bytes, alice.bytes_read, alice.bytes_written), (20_000, 200, 14));
        let bob = &by_owner.rows[1];
        assert_eq!(jobs(bob), [("failed", 1), ("removed", 1)]);
        assert!((bob.core_hours - 4.0 * 500.0 / HOUR as f64).abs() < 1e-15, "cpus × wall: {bob:?}");
        assert!((bob.wall_hours - 500.0 / HOUR as f64).abs() < 1e-15, "{bob:?}");
        assert_eq!((bob.bytes_read, bob.bytes_written), (100, 7), "the removed job used nothing");

        let by_group = run(&q, &query(AccountingBy::Group, None, None, None)).expect("report");
        assert_eq!(keys(&by_group), [(NO_GROUP, 0), ("physics", 0)]);
        assert_eq!(jobs(&by_group.rows[0]), [("completed", 1), ("removed", 1)]);
        assert_eq!(jobs(&by_group.rows[1]), [("completed", 1), ("failed", 1)]);

        let by_function = run(&q, &query(AccountingBy::Function, None, None, None)).expect("report");
        assert_eq!(keys(&by_function), [("checksum", 0), ("convert", 0)]);
        assert_eq!(jobs(&by_function.rows[0]), [("completed", 2), ("removed", 1)]);
        assert_eq!(by_function.rows[1].peak_memory_bytes, 5000);
    }

    #[tokio::test]
    async fn periods_split_the_rows_and_add_up_to_the_whole() {
        let specs = [
            spec("alice", "checksum", T0 + 10, 1000),
            spec("alice", "checksum", T0 + HOUR - 1, 2000),
            spec("alice", "checksum", T0 + HOUR, 4000),
            spec("bob", "checksum", T0 + 5 * HOUR + 7, 8000),
        ];
        let (_dir, q) = queue_with(&specs).await;
        let hourly = run(&q, &query(AccountingBy::Owner, None, None, Some(3600))).expect("report");
        assert_eq!(hourly.period_s, Some(3600));
        assert_eq!(
            keys(&hourly),
            [("alice", T0), ("alice", T0 + HOUR), ("bob", T0 + 5 * HOUR)],
            "empty hours left out"
        );
        assert_eq!(jobs(&hourly.rows[0]), [("completed", 2)]);
        assert_eq!(hourly.rows[0].bytes_read, 200);
        let whole = run(&q, &query(AccountingBy::Owner, None, None, None)).expect("report");
        let alice_hours: f64 = hourly.rows[..2].iter().map(|r| r.wall_hours).sum();
        assert!((alice_hours - whole.rows[0].wall_hours).abs() < 1e-15);
        assert_eq!(whole.rows[0].peak_memory_bytes, hourly.rows[1].peak_memory_bytes, "the largest of the periods");
        // Daily: everything in one day.
        let daily = run(&q, &query(AccountingBy::Owner, None, None, Some(86_400))).expect("report");
        assert_eq!(keys(&daily), [("alice", T0), ("bob", T0)]);
    }

    #[tokio::test]
    async fn since_is_inclusive_until_exclusive_and_an_empty_range_has_no_rows() {
        let specs = [
            spec("alice", "checksum", T0, 1000),
            spec("alice", "checksum", T0 + HOUR, 2000),
            spec("alice", "checksum", T0 + 2 * HOUR, 4000),
        ];
        let (_dir, q) = queue_with(&specs).await;
        let wall = |since, until| {
            let r = run(&q, &query(AccountingBy::Owner, since, until, None)).expect("report");
            r.rows.iter().map(|row| (row.wall_hours * HOUR as f64).round() as u64).sum::<u64>()
        };
        assert_eq!(wall(Some(T0), Some(T0 + 2 * HOUR)), 3000);
        assert_eq!(wall(Some(T0 + 1), None), 6000);
        assert_eq!(wall(None, Some(T0 + HOUR)), 1000);
        assert_eq!(wall(Some(T0 + HOUR), Some(T0 + HOUR + 1)), 2000);
        let empty = run(&q, &query(AccountingBy::Owner, Some(T0 + 3 * HOUR), Some(T0 + 4 * HOUR), Some(60)));
        let empty = empty.expect("report");
        assert!(empty.rows.is_empty(), "{empty:?}");
        assert_eq!((empty.since_ms, empty.until_ms), (T0 + 3 * HOUR, T0 + 4 * HOUR));
        let same = run(&q, &query(AccountingBy::Owner, Some(T0), Some(T0), None)).expect("report");
        assert!(same.rows.is_empty());
        // Running and idle jobs do not count yet.
        let mut idle = crate::testing::request("idle");
        idle.function.name = "checksum".into();
        let job = NewJob {
            request: idle,
            owner: "carol".into(),
            jti: "ti".into(),
            issuer: "gw".into(),
            group: None,
            jobs: 1,
            exp: u64::MAX,
            max_idle: None,
            class: None,
            hold: None,
        };
        q.submit(job).await.expect("submit");
        let all = run(&q, &query(AccountingBy::Owner, None, None, None)).expect("report");
        assert_eq!(keys(&all), [("alice", 0)]);
    }

    #[tokio::test]
    async fn instructions_are_absent_unless_some_job_metered_them() {
        let mut metered = spec("bob", "checksum", T0, 1000);
        metered.usage.instructions = Some(1_000_000);
        let mut metered_too = spec("bob", "checksum", T0 + 1, 1000);
        metered_too.usage.instructions = Some(234);
        let specs = [spec("alice", "checksum", T0, 1000), metered, metered_too, spec("bob", "checksum", T0 + 2, 10)];
        let (_dir, q) = queue_with(&specs).await;
        let r = run(&q, &query(AccountingBy::Owner, None, None, None)).expect("report");
        assert_eq!(r.rows[0].instructions, None, "alice's EP did not meter");
        assert_eq!(r.rows[1].instructions, Some(1_000_234));
        let json = serde_json::to_value(&r).expect("json");
        assert!(json["rows"][0].get("instructions").is_none(), "{json}");
    }

    #[tokio::test]
    async fn bad_queries_are_refused_with_what_is_wrong() {
        let (_dir, q) = queue_with(&[spec("alice", "checksum", T0, 1000)]).await;
        let err = |q2: AccountingQuery| match run(&q, &q2) {
            Err(ReportError::BadQuery(m)) => m,
            other => panic!("not refused: {other:?}"),
        };
        assert_eq!(err(query(AccountingBy::Owner, None, None, Some(0))), "period_s must be at least 1");
        assert_eq!(err(query(AccountingBy::Owner, Some(5), Some(4), None)), "since_ms 5 is after until_ms 4");
        assert!(err(query(AccountingBy::Owner, None, None, Some(u64::MAX))).contains("too long"));
        let many = err(query(AccountingBy::Owner, Some(0), None, Some(1)));
        assert!(many.contains("at most 10000"), "{many}");
        // Without since, the periods are counted from the first job: 100 hours is fine.
        assert!(run(&q, &query(AccountingBy::Owner, None, None, Some(3600))).is_ok());
        assert_eq!(spanned_periods(0, 1, 10), 1);
        assert_eq!(spanned_periods(9, 11, 10), 2);
        assert_eq!(spanned_periods(10, 20, 10), 1);
        assert_eq!(spanned_periods(10, 10, 10), 0);
    }

    #[tokio::test]
    async fn a_corrupt_usage_names_its_job() {
        let (_dir, q) = queue_with(&[spec("alice", "checksum", T0, 1000)]).await;
        let conn = Connection::open(q.path()).expect("open");
        conn.execute("UPDATE jobs SET usage = '{\"wall_ms\": \"x\"}'", []).expect("corrupt");
        let id: String = conn.query_row("SELECT id FROM jobs", [], |r| r.get(0)).expect("id");
        let e = run(&q, &query(AccountingBy::Owner, None, None, None)).expect_err("corrupt");
        assert!(matches!(&e, ReportError::Corrupt { id: i, .. } if *i == id), "{e}");
    }

    /// The plan reads only the index; the time of a report over 100k jobs (run with
    /// `cargo test -p htfaas-scheduler --release report::tests::time_100k -- --ignored --nocapture`).
    #[tokio::test]
    #[ignore = "a measurement"]
    async fn time_100k() {
        let (_dir, q) = queue_with(&[spec("alice", "checksum", T0, 1000)]).await;
        let mut conn = Connection::open(q.path()).expect("open");
        let tx = conn.transaction().expect("tx");
        {
            let (owner, grp, usage, function): (String, Option<String>, String, String) = tx
                .query_row("SELECT owner, grp, usage, function_name FROM jobs", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .expect("template");
            let mut insert = tx
                .prepare(
                    "INSERT INTO jobs (id, owner, dedupe_key, state, token_jti, cpus, memory_mb, runtime_s, \
                     submitted_at_ms, finished_at_ms, usage, grp, log, function_name) \
                     VALUES (?1, ?2, ?1, ?3, ?1, 1, 64, 60, 0, ?4, ?5, ?6, ?7, ?8)",
                )
                .expect("prepare");
            let log = "x".repeat(2000);
            for i in 0..100_000u64 {
                let state = ["completed", "failed", "removed"][(i % 3) as usize];
                let owner = format!("{owner}{}", i % 100);
                let at = db_int(T0 + i * 1000);
                insert.execute(params![format!("j{i}"), owner, state, at, usage, grp, log, function]).expect("insert");
            }
        }
        tx.commit().expect("commit");
        for key in ["owner", "grp", FUNCTION_NAME] {
            let plan: String = conn
                .query_row(&format!("EXPLAIN QUERY PLAN {}", select_sql(key)), params![0, 1], |r| r.get(3))
                .expect("plan");
            eprintln!("plan by {key}: {plan}");
            assert!(plan.contains("COVERING INDEX jobs_final_by_time"), "{plan}");
        }
        for by in [AccountingBy::Owner, AccountingBy::Group, AccountingBy::Function] {
            for period_s in [None, Some(3600)] {
                let started = std::time::Instant::now();
                let r = run(&q, &query(by, None, None, period_s)).expect("report");
                let n: u64 = r.rows.iter().flat_map(|row| row.jobs.values()).sum();
                assert_eq!(n, 100_001);
                eprintln!("{by:?} {period_s:?}: {} rows in {:?}", r.rows.len(), started.elapsed());
            }
        }
    }
}
