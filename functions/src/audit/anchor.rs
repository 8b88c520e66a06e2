//! Anchoring a trail to a head recorded elsewhere: the one thing the trail cannot show on its
//! own is that its end was cut off together with the checkpoints after the cut (every record
//! and checkpoint left is still valid). A [`Head`] — a record's `seq` and `hash`, written as
//! `SEQ:HASH` by `htfaas audit head` — copied somewhere the trail's host cannot rewrite (another
//! machine's log, a ticket, a transparency log) catches that: [`verify_with_head`] refuses a
//! trail that ends before the head, or whose record at the head's `seq` has another hash.
//!
//! This module knows nothing of where heads are kept or how they are shipped; it reads the
//! trail read-only, as [`fn@super::verify`] does.

use super::{AuditError, AuditKeys, Problem, ProblemKind, VerifyReport, open_read_only, verify};
use rusqlite::OptionalExtension as _;
use std::path::Path;

/// A record of the trail as recorded elsewhere: its `seq` and `hash` (`SEQ:HASH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The record's seq (1-based).
    pub seq: u64,
    /// Its hash: 64 lower-case hex digits.
    pub hash: String,
}

/// A `SEQ:HASH` that is not one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("expected head {0:?} is not SEQ:HASH (a record number from 1, a colon, the record's 64 hex-digit hash)")]
pub struct HeadError(pub String);

impl std::str::FromStr for Head {
    type Err = HeadError;
    fn from_str(s: &str) -> Result<Head, HeadError> {
        let bad = || HeadError(s.to_owned());
        let (seq, hash) = s.trim().split_once(':').ok_or_else(bad)?;
        let seq: u64 = seq.parse().map_err(|_| bad())?;
        let hash = hash.to_ascii_lowercase();
        if seq == 0 || hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        Ok(Head { seq, hash })
    }
}

impl std::fmt::Display for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.seq, self.hash)
    }
}

/// The trail's last record at `path` as a [`Head`] (what to record elsewhere); `None` for an
/// empty trail. Verify the trail before trusting it.
pub fn head(path: &Path) -> Result<Option<Head>, AuditError> {
    let conn = open_read_only(path)?;
    let row: Option<(i64, String)> = conn
        .query_row("SELECT seq, json FROM audit_records ORDER BY seq DESC LIMIT 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    row.map(|(seq, json)| {
        let seq = u64::try_from(seq).map_err(|_| AuditError::Corrupt(format!("record seq {seq}")))?;
        Ok(Head { seq, hash: stored_hash(&json, seq)? })
    })
    .transpose()
}

/// [`fn@verify`], then the anchor: the trail must reach `expected.seq`, and its record there must
/// have `expected.hash`. A trail cut before the head is [`ProblemKind::Truncated`]; another
/// record at the head's seq is [`ProblemKind::Altered`]. A problem [`fn@verify`] finds comes first.
pub fn verify_with_head(path: &Path, keys: &AuditKeys, expected: &Head) -> Result<VerifyReport, AuditError> {
    let mut report = verify(path, keys)?;
    if report.first_problem.is_some() {
        return Ok(report);
    }
    if expected.seq > report.last_seq {
        report.first_problem = Some(Problem {
            seq: report.last_seq + 1,
            what: ProblemKind::Truncated,
            message: format!(
                "the trail ends at record {} but the head recorded elsewhere is record {}: records from {} on \
                 were removed from its end",
                report.last_seq,
                expected.seq,
                report.last_seq + 1
            ),
        });
        return Ok(report);
    }
    let conn = open_read_only(path)?;
    let seq = i64::try_from(expected.seq).map_err(|_| AuditError::Corrupt(format!("record seq {}", expected.seq)))?;
    let json: String = conn.query_row("SELECT json FROM audit_records WHERE seq = ?1", [seq], |r| r.get(0))?;
    let found = stored_hash(&json, expected.seq)?;
    if found != expected.hash {
        report.first_problem = Some(Problem {
            seq: expected.seq,
            what: ProblemKind::Altered,
            message: format!(
                "record {} does not match the head recorded elsewhere (hash {}…, expected {}…): the trail was \
                 rewritten from there on",
                expected.seq,
                &found[..found.len().min(12)],
                &expected.hash[..12]
            ),
        });
    }
    Ok(report)
}

fn stored_hash(json: &str, seq: u64) -> Result<String, AuditError> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| AuditError::Corrupt(format!("record {seq}: {e}")))?;
    v.get("hash")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| AuditError::Corrupt(format!("record {seq} has no hash")))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{sample, tampered};
    use super::*;

    #[test]
    fn a_tail_cut_with_its_checkpoints_passes_verify_but_not_the_recorded_head() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, keys) = sample(dir.path(), 25, 10);
        let recorded = head(&path).expect("head").expect("a record");
        assert_eq!(recorded.seq, 25);
        assert_eq!(recorded.to_string().parse::<Head>(), Ok(recorded.clone()));
        assert!(verify_with_head(&path, &keys, &recorded).expect("verify").ok(), "the intact trail passes");
        let older = Head { seq: 12, hash: head_at(&path, 12) };
        assert!(verify_with_head(&path, &keys, &older).expect("verify").ok(), "an older head is in the chain");

        // Records 16..25 and the checkpoint at 20 removed: verify alone finds nothing.
        let cut = tampered(&path, "cut", |c| {
            c.execute("DELETE FROM audit_records WHERE seq > 15", []).expect("delete records");
            c.execute("DELETE FROM audit_checkpoints WHERE seq > 15", []).expect("delete checkpoints");
        });
        assert!(verify(&cut, &keys).expect("verify").ok(), "the attack verify alone cannot see");
        let report = verify_with_head(&cut, &keys, &recorded).expect("verify");
        let p = report.first_problem.expect("refused");
        assert_eq!((p.seq, p.what), (16, ProblemKind::Truncated));
        assert_eq!(
            p.message,
            "the trail ends at record 15 but the head recorded elsewhere is record 25: records from 16 on were \
             removed from its end"
        );

        // A head that is not the trail's record at that seq: rewritten.
        let other = Head { seq: 12, hash: "0".repeat(64) };
        let p = verify_with_head(&path, &keys, &other).expect("verify").first_problem.expect("refused");
        assert_eq!((p.seq, p.what), (12, ProblemKind::Altered));
        assert!(p.message.starts_with("record 12 does not match the head recorded elsewhere"), "{}", p.message);
    }

    #[test]
    fn a_malformed_head_is_refused() {
        for bad in ["", "12", "x:ab", "0:".to_owned().as_str(), "3:abc", &format!("3:{}", "g".repeat(64))] {
            assert!(bad.parse::<Head>().is_err(), "{bad:?}");
        }
        assert_eq!(
            "3:abc".parse::<Head>().map_err(|e| e.to_string()),
            Err("expected head \"3:abc\" is not SEQ:HASH (a record number from 1, a colon, the record's 64 \
                 hex-digit hash)"
                .into())
        );
    }

    fn head_at(path: &Path, seq: i64) -> String {
        let conn = open_read_only(path).expect("open");
        let json: String =
            conn.query_row("SELECT json FROM audit_records WHERE seq = ?1", [seq], |r| r.get(0)).expect("row");
        stored_hash(&json, 12).expect("hash")
    }
}
