//! The verifier (feature `db`): walks a trail's stored texts, recomputes every hash, checks
//! every link and checkpoint signature, and names the first record that was altered, removed,
//! reordered, inserted or cut off ([`verify`], [`VerifyReport`]).
//!
//! Must not know: the indexed columns (it never trusts them), appends, the wire types.

use super::record::{AuditRecord, content_hash};
use super::sign::{AuditKeys, Checkpoint};
use super::store::open_read_only;
use super::{AuditError, GENESIS_HASH, RECORD_FORMAT};
use crate::store::{db_int as to_db, from_db};
use rusqlite::Connection;
use rusqlite::types::ValueRef;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// What is wrong with a trail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// The record's contents do not match its hash, it does not parse, or it was rewritten with
    /// recomputed hashes (caught by the next record's link or a signed checkpoint).
    Altered,
    /// Records are missing from the middle of the chain.
    Removed,
    /// The record stored at this seq belongs later in the chain.
    Reordered,
    /// A record that is not part of the chain was put into it.
    Inserted,
    /// Records at the end were removed: a signed checkpoint names a record that is gone.
    Truncated,
    /// A checkpoint does not parse, names an unknown key, or its signature does not verify.
    BadCheckpoint,
}

/// The first problem of a trail, in chain order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// The seq it is at: the first record (or checkpoint) affected.
    pub seq: u64,
    /// What kind of problem.
    pub what: ProblemKind,
    /// One sentence naming it, e.g. "record 42 was altered: its hash does not match its contents".
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The answer of [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Rows in the records table.
    pub records: u64,
    /// Rows in the checkpoints table.
    pub checkpoints: u64,
    /// The last seq of the chain as far as it was read (all of it when there is no problem).
    pub last_seq: u64,
    /// The last seq covered by a valid checkpoint; records after it are protected by the
    /// chain only (removing them or rewriting them all is not detectable until a later
    /// checkpoint exists).
    pub last_checkpoint_seq: Option<u64>,
    /// `None`: the trail is intact.
    pub first_problem: Option<Problem>,
}

impl VerifyReport {
    /// Whether no problem was found.
    pub fn ok(&self) -> bool {
        self.first_problem.is_none()
    }
}

/// What verification needs of one stored record.
struct Facts {
    seq: u64,
    writer: String,
    prev_hash: String,
    stored_hash: String,
    computed_hash: String,
}

/// Parses a stored record's text and recomputes its hash, or says why it cannot.
fn facts_of(text: Option<&str>) -> Result<Facts, String> {
    let text = text.ok_or("its stored JSON is not text")?;
    let mut value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let obj = value.as_object_mut().ok_or("not a JSON object")?;
    let stored_hash = match obj.remove("hash") {
        Some(Value::String(h)) => h,
        _ => return Err("no hash".into()),
    };
    let computed_hash = content_hash(&value);
    if let Some(obj) = value.as_object_mut() {
        obj.insert("hash".into(), Value::String(stored_hash.clone()));
    }
    let record: AuditRecord = serde_json::from_value(value).map_err(|e| format!("not a record: {e}"))?;
    if record.format != RECORD_FORMAT {
        return Err(format!("unknown record format {}", record.format));
    }
    Ok(Facts { seq: record.seq, writer: record.writer, prev_hash: record.prev_hash, stored_hash, computed_hash })
}

fn text_of<'a>(v: ValueRef<'a>) -> Option<&'a str> {
    match v {
        ValueRef::Text(t) => std::str::from_utf8(t).ok(),
        _ => None,
    }
}

/// The previous record of the chain walk.
struct Link {
    /// Its `seq` column.
    row: i64,
    /// Its own seq.
    seq: u64,
    /// Its (recomputed, verified) hash.
    hash: String,
}

fn problem(seq: u64, what: ProblemKind, message: String) -> Problem {
    Problem { seq, what, message }
}

/// Checks the whole trail at `path`: every record's hash, seq contiguity and links, every
/// checkpoint's signature (under `keys`, by `kid`) and that it names the record it says; reads
/// only the stored JSON texts. Returns the first problem in chain order; an `Err` only when the
/// file cannot be read as an audit log at all.
pub fn verify(path: &Path, keys: &AuditKeys) -> Result<VerifyReport, AuditError> {
    let conn = open_read_only(path)?;
    // One snapshot for all reads, even while the writer appends.
    let tx = conn.unchecked_transaction()?;
    let records: i64 = tx.query_row("SELECT COUNT(*) FROM audit_records", [], |r| r.get(0))?;
    let checkpoints: i64 = tx.query_row("SELECT COUNT(*) FROM audit_checkpoints", [], |r| r.get(0))?;

    // Checkpoints first: the valid ones are compared with the chain as it is walked.
    let mut good: BTreeMap<u64, Checkpoint> = BTreeMap::new();
    let mut bad_checkpoint: Option<Problem> = None;
    {
        let mut stmt = tx.prepare("SELECT seq, json FROM audit_checkpoints ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let at = from_db(row.get::<_, i64>(0)?);
            let parsed = text_of(row.get_ref(1)?)
                .ok_or_else(|| "its stored JSON is not text".to_owned())
                .and_then(|t| serde_json::from_str::<Checkpoint>(t).map_err(|e| format!("it does not parse: {e}")))
                .and_then(|cp| {
                    if cp.seq != at {
                        return Err(format!("it is stored as seq {at} but names record {}", cp.seq));
                    }
                    cp.check_signature(keys).map(|()| cp).map_err(|e| e.to_string())
                });
            match parsed {
                Ok(cp) => {
                    good.insert(cp.seq, cp);
                }
                Err(why) => {
                    bad_checkpoint = Some(problem(
                        at,
                        ProblemKind::BadCheckpoint,
                        format!("the checkpoint at record {at} is invalid: {why}"),
                    ));
                    break;
                }
            }
        }
    }
    // Only checkpoints before the first bad one count.
    let (chain_problem, last_seq, last_checkpoint_seq) = walk_chain(&tx, &good)?;
    let first_problem = match (chain_problem, bad_checkpoint) {
        (Some(c), Some(b)) => Some(if b.seq < c.seq { b } else { c }),
        (c, b) => c.or(b),
    };
    Ok(VerifyReport {
        records: from_db(records),
        checkpoints: from_db(checkpoints),
        last_seq,
        last_checkpoint_seq,
        first_problem,
    })
}

/// Walks the records in `seq` column order; returns the first problem, the last seq read and
/// the last checkpoint that matched.
fn walk_chain(
    tx: &Connection,
    checkpoints: &BTreeMap<u64, Checkpoint>,
) -> Result<(Option<Problem>, u64, Option<u64>), AuditError> {
    use ProblemKind::*;
    let mut stmt = tx.prepare("SELECT seq, json FROM audit_records ORDER BY seq")?;
    let mut rows = stmt.query([])?;
    let mut prev: Option<Link> = None;
    let mut last_cp: Option<u64> = None;
    while let Some(row) = rows.next()? {
        let row_seq: i64 = row.get(0)?;
        let expected_seq = prev.as_ref().map_or(1, |p| p.seq + 1);
        let expected_prev = prev.as_ref().map_or(GENESIS_HASH, |p| p.hash.as_str());
        // Where to point when the record's own seq cannot be trusted.
        let at = u64::try_from(row_seq).ok().filter(|s| *s >= 1).unwrap_or(expected_seq);
        let last = prev.as_ref().map_or(0, |p| p.seq);
        let facts = match facts_of(text_of(row.get_ref(1)?)) {
            Ok(f) => f,
            Err(why) => {
                let msg = format!("record {at} was altered: it is not a valid audit record ({why})");
                return Ok((Some(problem(at, Altered, msg)), last, last_cp));
            }
        };
        if facts.computed_hash != facts.stored_hash {
            let msg = format!("record {at} was altered: its hash does not match its contents");
            return Ok((Some(problem(at, Altered, msg)), last, last_cp));
        }
        if facts.prev_hash != expected_prev {
            let p = classify_break(tx, row_seq, &facts, prev.as_ref(), expected_seq, last_cp)?;
            return Ok((Some(p), last, last_cp));
        }
        if facts.seq != expected_seq {
            let msg = format!(
                "record {expected_seq} was altered: the record stored there follows record {last} but says it is \
                 record {} (its hash was recomputed)",
                facts.seq
            );
            return Ok((Some(problem(expected_seq, Altered, msg)), last, last_cp));
        }
        if row_seq != to_db(expected_seq) {
            let msg = format!("record {expected_seq} was altered: it is stored as seq {row_seq}");
            return Ok((Some(problem(expected_seq, Altered, msg)), last, last_cp));
        }
        if let Some(cp) = checkpoints.get(&facts.seq) {
            if cp.writer != facts.writer {
                let msg = format!(
                    "the checkpoint at record {} is invalid: it names writer {:?}, the record {:?}",
                    facts.seq, cp.writer, facts.writer
                );
                return Ok((Some(problem(facts.seq, BadCheckpoint, msg)), last, last_cp));
            }
            if cp.hash != facts.computed_hash {
                let from = last_cp.map_or(1, |s| s + 1);
                let msg = format!(
                    "record {} was altered: it does not match the signed checkpoint at record {} (records {from} to {} \
                     were rewritten with recomputed hashes)",
                    facts.seq, facts.seq, facts.seq
                );
                return Ok((Some(problem(facts.seq, Altered, msg)), last, last_cp));
            }
            last_cp = Some(facts.seq);
        }
        prev = Some(Link { row: row_seq, seq: facts.seq, hash: facts.computed_hash });
    }
    let last = prev.as_ref().map_or(0, |p| p.seq);
    if let Some((cp_seq, _)) = checkpoints.range(last + 1..).next() {
        let msg = format!(
            "records from {} on were removed: the signed checkpoint at record {cp_seq} names a record that is not in \
             the log",
            last + 1
        );
        return Ok((Some(problem(last + 1, Truncated, msg)), last, last_cp));
    }
    Ok((None, last, last_cp))
}

/// Names what broke the link from the record stored at `row_seq` to the previous one.
fn classify_break(
    tx: &Connection,
    row_seq: i64,
    facts: &Facts,
    prev: Option<&Link>,
    expected_seq: u64,
    last_checkpoint: Option<u64>,
) -> Result<Problem, AuditError> {
    use ProblemKind::*;
    let s = facts.seq;
    if let Some(p) = prev
        && facts.computed_hash == p.hash
    {
        let at = u64::try_from(row_seq).unwrap_or(expected_seq);
        let msg = format!("record {at} was inserted: it is a copy of record {}", p.seq);
        return Ok(problem(at, Inserted, msg));
    }
    match find_by_hash(tx, &facts.prev_hash)? {
        Some((found_row, found_seq)) if found_row > row_seq => {
            let msg = format!(
                "records were reordered at seq {expected_seq}: the record stored there is record {s}, which follows \
                 record {found_seq}, stored later (as seq {found_row})"
            );
            Ok(problem(expected_seq, Reordered, msg))
        }
        Some((found_row, found_seq)) if prev.is_some_and(|p| found_row < p.row) => {
            let first: Option<i64> =
                tx.query_row("SELECT MIN(seq) FROM audit_records WHERE seq > ?1", [found_row], |r| r.get(0))?;
            let first = first.and_then(|f| u64::try_from(f).ok()).unwrap_or(expected_seq);
            let msg = format!(
                "record {first} was inserted: record {s} (stored as seq {row_seq}) follows record {found_seq}, which \
                 is stored before it (as seq {found_row})"
            );
            Ok(problem(first, Inserted, msg))
        }
        _ if s > expected_seq => {
            let msg = if s - 1 > expected_seq {
                format!(
                    "records {expected_seq} to {} were removed: record {s} follows a record that is not in the log",
                    s - 1
                )
            } else {
                format!("record {expected_seq} was removed: record {s} follows a record that is not in the log")
            };
            Ok(problem(expected_seq, Removed, msg))
        }
        _ if s == expected_seq && expected_seq > 1 && last_checkpoint == Some(expected_seq - 1) => {
            let msg = format!(
                "record {s} was altered: it does not follow record {}, which a signed checkpoint vouches for",
                s - 1
            );
            Ok(problem(s, Altered, msg))
        }
        _ if s == expected_seq && expected_seq > 1 => {
            // Either record s-1 was rewritten (hash recomputed) or record s's link was: name the
            // earlier one.
            let before = expected_seq - 1;
            let msg = format!(
                "record {before} was altered (its hash recomputed), or record {s} was: record {s} follows a \
                 different record {before}"
            );
            Ok(problem(before, Altered, msg))
        }
        _ if expected_seq == 1 => {
            let msg = "record 1 was altered: it does not start the chain (its previous hash is not the genesis hash)";
            Ok(problem(1, Altered, msg.to_owned()))
        }
        _ => {
            let msg = format!(
                "record {expected_seq} was altered: the record stored there (record {s}) does not follow record {}",
                expected_seq - 1
            );
            Ok(problem(expected_seq, Altered, msg))
        }
    }
}

/// The `(seq column, seq)` of the first intact record whose hash is `hash`.
fn find_by_hash(tx: &Connection, hash: &str) -> Result<Option<(i64, u64)>, AuditError> {
    let mut stmt = tx.prepare("SELECT seq, json FROM audit_records ORDER BY seq")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        if let Ok(f) = facts_of(text_of(row.get_ref(1)?))
            && f.computed_hash == f.stored_hash
            && f.computed_hash == hash
        {
            return Ok(Some((row.get(0)?, f.seq)));
        }
    }
    Ok(None)
}
