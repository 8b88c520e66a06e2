//! Lineage queries (feature `db`): which records an [`AuditFilter`] selects, from the indexed
//! columns of a log's tables ([`query`], [`query_in`], [`AuditLog::query`]).
//!
//! Must not know: appends and checkpoints, the verifier (which alone vouches for a record).

use super::AuditError;
use super::record::AuditRecord;
use super::store::{AuditLog, open_read_only};
use crate::store::db_int as to_db;
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What a query selects: every given condition holds (none given: every record). A record is
/// about a token, owner, function, event or file when it names it, or when it is about a job
/// (`subject.job`) one of whose records names it: every record of a job goes with the job. As a URL
/// query (`GET /v1/audit?job=…&since=…`), fields take the names `token`, `owner`, `file`,
/// `job`, `function`, `event`, `since`, `until`, `limit`; unknown names are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditFilter {
    /// Records about this token `jti`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Records about this owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Records naming this storage path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Records about this job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Records about this function (name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Records about this storage event.
    #[serde(rename = "event", skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// From this time on, Unix ms, inclusive.
    #[serde(rename = "since", skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// Before this time, Unix ms, exclusive.
    #[serde(rename = "until", skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// At most this many (the first, in `seq` order).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

impl AuditLog {
    /// The records `filter` selects, in seq order (from the indexed columns; [`fn@super::verify`] is what
    /// vouches for the records themselves).
    pub fn query(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, AuditError> {
        query_in(&self.conn(), filter)
    }
}

/// [`AuditLog::query`] on any database file that holds the audit tables, read-only (the CLI's
/// lineage queries; the scheduler's `GET /v1/audit` on its queue).
pub fn query(path: &Path, filter: &AuditFilter) -> Result<Vec<AuditRecord>, AuditError> {
    let conn = open_read_only(path)?;
    query_in(&conn, filter)
}

/// The `seq` of the first record at or after `time_ms` (one past the last record when there is
/// none), by bisection over the primary key: a record's time is never smaller than its
/// predecessor's ([`super::append_in`] repeats the last time when the clock steps back).
/// Gaps in `seq` (there are none in a trail this crate wrote) only move the answer within one.
fn first_seq_at(conn: &Connection, time_ms: u64) -> Result<i64, AuditError> {
    let (first, last): (Option<i64>, Option<i64>) =
        conn.query_row("SELECT MIN(seq), MAX(seq) FROM audit_records", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let (Some(mut lo), Some(last)) = (first, last) else { return Ok(1) };
    let t = to_db(time_ms);
    let mut at_or_after =
        conn.prepare_cached("SELECT seq, time_ms FROM audit_records WHERE seq >= ?1 ORDER BY seq LIMIT 1")?;
    // The answer lies in [lo, hi]; every record before lo is earlier than `time_ms`.
    let mut hi = last + 1;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let (seq, time): (i64, i64) = at_or_after.query_row([mid], |r| Ok((r.get(0)?, r.get(1)?)))?;
        if time >= t {
            hi = mid;
        } else {
            lo = seq + 1;
        }
    }
    Ok(lo)
}

/// [`query`] on an open connection.
pub fn query_in(conn: &Connection, filter: &AuditFilter) -> Result<Vec<AuditRecord>, AuditError> {
    let mut sql = String::from("SELECT json FROM audit_records WHERE 1 = 1");
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    // A record is about X when it names X, or when its job (or, for a record of no job, its
    // token) has a record that names X: later records of a job or token do not index again
    // what its first one indexed (`super::append_in`).
    let mut about = |sql: &mut String, column: &str, value: &Option<String>| {
        if let Some(v) = value {
            args.push(v.clone().into());
            let n = args.len();
            sql.push_str(&format!(
                " AND ({column} = ?{n} OR job IN \
                 (SELECT job FROM audit_records WHERE {column} = ?{n} AND job IS NOT NULL) \
                 OR (job IS NULL AND token_jti IN \
                 (SELECT token_jti FROM audit_records WHERE {column} = ?{n} AND job IS NULL AND token_jti IS NOT NULL)))"
            ));
        }
    };
    about(&mut sql, "token_jti", &filter.token);
    about(&mut sql, "owner", &filter.owner);
    about(&mut sql, "function", &filter.function);
    about(&mut sql, "event_id", &filter.event_id);
    if let Some(job) = &filter.job {
        args.push(job.clone().into());
        sql.push_str(&format!(" AND job = ?{}", args.len()));
    }
    if let Some(path) = &filter.file {
        args.push(path.clone().into());
        let n = args.len();
        sql.push_str(&format!(
            " AND (seq IN (SELECT seq FROM audit_record_paths WHERE path = ?{n}) OR job IN \
             (SELECT r.job FROM audit_record_paths p JOIN audit_records r ON r.seq = p.seq \
              WHERE p.path = ?{n} AND r.job IS NOT NULL) \
             OR (job IS NULL AND token_jti IN \
             (SELECT r.token_jti FROM audit_record_paths p JOIN audit_records r ON r.seq = p.seq \
              WHERE p.path = ?{n} AND r.job IS NULL AND r.token_jti IS NOT NULL)))"
        ));
    }
    // A time range is a range of `seq` (times never decrease along the chain), which the
    // primary key serves; the times are compared too, so that a trail whose times do go back
    // (written by hand) still yields only records inside the range.
    if let Some(t) = filter.since_ms {
        args.push(first_seq_at(conn, t)?.into());
        sql.push_str(&format!(" AND seq >= ?{}", args.len()));
        args.push(to_db(t).into());
        sql.push_str(&format!(" AND time_ms >= ?{}", args.len()));
    }
    if let Some(t) = filter.until_ms {
        args.push(first_seq_at(conn, t)?.into());
        sql.push_str(&format!(" AND seq < ?{}", args.len()));
        args.push(to_db(t).into());
        sql.push_str(&format!(" AND time_ms < ?{}", args.len()));
    }
    sql.push_str(" ORDER BY seq");
    if let Some(limit) = filter.limit {
        args.push(to_db(limit).into());
        sql.push_str(&format!(" LIMIT ?{}", args.len()));
    }
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(0))?;
    let mut out = Vec::new();
    for text in rows {
        let record: AuditRecord = serde_json::from_str(&text?).map_err(|e| AuditError::Corrupt(e.to_string()))?;
        // Records about an owner never include one that names another owner, whatever a job's
        // records say (an owner's own queries are scoped this way).
        if let Some(owner) = &filter.owner
            && record.subject.owner.as_ref().is_some_and(|o| o != owner)
        {
            continue;
        }
        out.push(record);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::params;

    /// A trail of records at chosen times (runs of equal times, a gap in `seq`), written
    /// directly: what bisection must agree with a scan on.
    fn trail(times: &[(i64, i64)]) -> Connection {
        let conn = Connection::open_in_memory().expect("open");
        super::super::install(&conn, "test").expect("install");
        for (seq, time) in times {
            let record = AuditRecord {
                format: super::super::RECORD_FORMAT,
                seq: *seq as u64,
                time_ms: *time as u64,
                writer: "test".into(),
                kind: super::super::AuditKind::JobAccepted,
                actor: None,
                subject: super::super::Subject::default(),
                detail: serde_json::Value::Null,
                prev_hash: String::new(),
                hash: String::new(),
            };
            let json = serde_json::to_string(&record).expect("json");
            conn.execute(
                "INSERT INTO audit_records (seq, time_ms, kind, hash, json) VALUES (?1, ?2, 'job.accepted', '', ?3)",
                params![seq, time, json],
            )
            .expect("insert");
        }
        conn
    }

    #[test]
    fn a_time_range_is_found_by_bisection_as_a_scan_finds_it() {
        let mut times = Vec::new();
        let mut t = 100;
        for seq in (1..=40).filter(|s| *s != 17) {
            if seq % 3 == 0 {
                t += 7;
            }
            times.push((seq, t));
        }
        let conn = trail(&times);
        for since in 95..=t + 2 {
            let scan = times.iter().find(|(_, time)| *time >= since).map_or(41, |(seq, _)| *seq);
            let found = first_seq_at(&conn, since as u64).expect("bisect");
            // With the gap, 17 and 18 are the same bound.
            assert!(found == scan || (scan == 18 && found == 17), "since {since}: {found} against {scan}");
        }
        assert_eq!(first_seq_at(&trail(&[]), 5).expect("empty"), 1);
        // Queries by time select exactly what the times say, at both ends.
        for (since, until) in [(100, 114), (107, 108), (95, 99), (113, 400)] {
            let f = AuditFilter { since_ms: Some(since), until_ms: Some(until), ..AuditFilter::default() };
            let got: Vec<u64> = query_in(&conn, &f).expect("query").iter().map(|r| r.seq).collect();
            let want: Vec<u64> = times
                .iter()
                .filter(|(_, time)| (since as i64..until as i64).contains(time))
                .map(|(seq, _)| *seq as u64)
                .collect();
            assert_eq!(got, want, "{since}..{until}");
        }
    }
}
