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

/// What a query selects: every given condition holds (none given: every record). As a URL
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
    /// The records `filter` selects, in seq order (from the indexed columns; [`super::verify`] is what
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

/// [`query`] on an open connection.
pub fn query_in(conn: &Connection, filter: &AuditFilter) -> Result<Vec<AuditRecord>, AuditError> {
    let mut sql = String::from("SELECT json FROM audit_records WHERE 1 = 1");
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    let mut text = |sql: &mut String, column: &str, value: &Option<String>| {
        if let Some(v) = value {
            args.push(v.clone().into());
            sql.push_str(&format!(" AND {column} = ?{}", args.len()));
        }
    };
    text(&mut sql, "token_jti", &filter.token);
    text(&mut sql, "owner", &filter.owner);
    text(&mut sql, "job", &filter.job);
    text(&mut sql, "function", &filter.function);
    text(&mut sql, "event_id", &filter.event_id);
    if let Some(path) = &filter.file {
        args.push(path.clone().into());
        sql.push_str(&format!(" AND seq IN (SELECT seq FROM audit_record_paths WHERE path = ?{})", args.len()));
    }
    if let Some(t) = filter.since_ms {
        args.push(to_db(t).into());
        sql.push_str(&format!(" AND time_ms >= ?{}", args.len()));
    }
    if let Some(t) = filter.until_ms {
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
    rows.map(|text| serde_json::from_str(&text?).map_err(|e| AuditError::Corrupt(e.to_string()))).collect()
}
