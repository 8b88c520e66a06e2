//! The dead-letter list, in the firing table's database: every firing that could
//! not become a job, and every job that ended failed, with the reason, the event and the
//! function version; its re-drives and its drop.
//!
//! - A firing refused for good (the scheduler, the storage's macaroons, the namespace check, a
//!   row that does not read back) enters the list in the transaction that refuses it
//!   ([`record_refused`], called where the refusal is written): a refused firing is pruned
//!   later, its entry is not.
//! - A failed job enters it from the scheduler's job-end notification
//!   ([`Firings::dead_letter_job`]): the function version and the event come from the firing
//!   that made the job, when the gateway made it.
//! - An event JetStream gave up delivering (`max_deliver`) enters it for each function it
//!   fires ([`Firings::dead_letter_event`]).
//!
//! Each entry has a unique key (`firing:<seq>`, `job:<id>`, `max_deliver:<stream seq>#<function>`):
//! a second notification or advisory of the same end adds nothing.
//!
//! A re-drive ([`Firings::redrive`]) inserts a new firing of the entry's function version on
//! its event, in one transaction with the re-drive's row and its audit record. The firing's
//! replay id is `redrive-<entry>.<n>`, so its firing key and the scheduler's dedupe key are
//! new for each re-drive number and the same for two calls with one number: re-drive `n` of an
//! entry makes one job, whoever asks and however often. Dropping ([`Firings::drop_dead_letter`])
//! keeps the entry with who dropped it and why, out of the list.
//!
//! A collecting function's firing (fan-in) runs on its group's files: its entry keeps the
//! group's member paths (`dead_letter_members`, by the entry's key), since the group itself is
//! pruned with the firings, and each re-drive's firing gets them (`redrive_members`), so the
//! re-driven job reads the same files as the first, not its one event's file alone.
//!
//! Stored format: the tables `dead_letters`, `dead_letter_redrives`, `dead_letter_members` and
//! `redrive_members` (v1 in their names' sense: created at open if missing, beside the migrated
//! schema), and an index of firings by job id.
//!
//! Must not know: NATS, HTTP, who may see an entry.

use super::{FiringError, Firings, Inserted, event_key};
use htfaas_functions::FunctionRecord;
use htfaas_functions::audit::{self, AuditDraft};
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::{
    DeadLetter, DeadLetterKind, Dropped, EventRef, JobNotification, JobState, Redrive, RedriveResponse,
};
use htfaas_functions::store::begin_immediate;
use htfaas_functions::store::{db_int, exec, from_db, row};
use rusqlite::{Connection, OptionalExtension as _, params};

const INSTALL: &str = "
CREATE TABLE IF NOT EXISTS dead_letters (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    key            TEXT NOT NULL UNIQUE,
    kind           TEXT NOT NULL,
    owner          TEXT NOT NULL,
    function       TEXT NOT NULL,
    version        INTEGER,
    digest         TEXT,
    reason         TEXT NOT NULL,
    event_ref      TEXT NOT NULL,
    event          TEXT,
    record         TEXT,
    job_id         TEXT,
    created_ms     INTEGER NOT NULL,
    dropped_by     TEXT,
    dropped_reason TEXT,
    dropped_ms     INTEGER
);
CREATE INDEX IF NOT EXISTS dead_letters_by_owner ON dead_letters (owner, created_ms) WHERE dropped_ms IS NULL;
CREATE TABLE IF NOT EXISTS dead_letter_redrives (
    entry  INTEGER NOT NULL,
    n      INTEGER NOT NULL,
    firing INTEGER NOT NULL,
    by     TEXT NOT NULL,
    at_ms  INTEGER NOT NULL,
    PRIMARY KEY (entry, n)
);
CREATE INDEX IF NOT EXISTS firings_by_job ON firings (job_id) WHERE job_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS dead_letter_members (
    key     TEXT PRIMARY KEY,
    members TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS redrive_members (
    firing  INTEGER PRIMARY KEY,
    members TEXT NOT NULL
);
";

/// The start of a re-drive's replay id (`redrive-<entry>.<n>`).
pub(super) const REDRIVE_PREFIX: &str = "redrive-";

/// Most entries one list answers.
pub const MAX_LIST: usize = 1000;

/// Creates the list's tables if missing (at open, after the migrations).
pub(super) fn install(conn: &Connection) -> Result<(), FiringError> {
    conn.execute_batch(INSTALL)?;
    Ok(())
}

/// Why a re-drive or a drop was not done.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    /// No such entry.
    #[error("no dead-letter entry {0}")]
    NotFound(u64),
    /// The entry's state does not allow it (dropped, not re-drivable, a re-drive number out of turn).
    #[error("{0}")]
    Conflict(String),
    /// The store.
    #[error(transparent)]
    Store(#[from] FiringError),
}

impl From<rusqlite::Error> for DlqError {
    fn from(e: rusqlite::Error) -> DlqError {
        DlqError::Store(FiringError::Sqlite(e))
    }
}

/// What an event refers to, as a job keeps it.
fn event_ref(event: &StorageEvent) -> EventRef {
    EventRef::new(format!("{}:{}", event.source.kind.as_str(), event.source.producer), &event.id, &event.path)
}

/// Records firing `seq`, refused for good for `reason`, in the dead-letter list, inside the
/// refusal's transaction.
pub(super) fn record_refused(tx: &Connection, seq: i64, reason: &str, now_ms: u64) -> Result<(), FiringError> {
    type Row = (String, String, String, i64, String, String);
    let found: Option<Row> = row(
        tx,
        "SELECT owner, function, digest, version, event, record FROM firings WHERE seq = ?1",
        params![seq],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
    )
    .optional()?;
    let Some((owner, function, digest, version, event, record)) = found else { return Ok(()) };
    let parsed: Option<StorageEvent> = serde_json::from_str(&event).ok();
    let reference = parsed.as_ref().map(event_ref).unwrap_or_else(|| EventRef::new("", "", ""));
    let owner = if owner.is_empty() {
        serde_json::from_str::<FunctionRecord>(&record).map(|r| r.manifest.owner).unwrap_or_default()
    } else {
        owner
    };
    exec(
        tx,
        "INSERT OR IGNORE INTO dead_letters (key, kind, owner, function, version, digest, reason, event_ref, \
         event, record, created_ms) VALUES (?1, 'refused', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            format!("firing:{seq}"),
            owner,
            function,
            version,
            digest,
            reason,
            serde_json::to_string(&reference)?,
            parsed.is_some().then_some(event),
            record,
            db_int(now_ms)
        ],
    )?;
    keep_members(tx, &format!("firing:{seq}"), seq)
}

/// Keeps the member paths of firing `seq`'s collecting group, if it has one, for the
/// dead-letter entry `key`.
fn keep_members(tx: &Connection, key: &str, seq: i64) -> Result<(), FiringError> {
    let group: Option<i64> =
        row(tx, "SELECT collect FROM firings WHERE seq = ?1", params![seq], |r| r.get(0)).optional()?.flatten();
    let Some(group) = group else { return Ok(()) };
    let members = super::groups::member_paths(tx, group)?;
    exec(
        tx,
        "INSERT OR IGNORE INTO dead_letter_members (key, members) VALUES (?1, ?2)",
        params![key, serde_json::to_string(&members)?],
    )?;
    Ok(())
}

/// The other files a re-drive's firing `seq` runs on (its entry's group's, but its own), if
/// any. Inside the caller's transaction.
pub(super) fn redrive_members(tx: &Connection, seq: i64) -> Result<Vec<String>, FiringError> {
    let stored: Option<String> =
        row(tx, "SELECT members FROM redrive_members WHERE firing = ?1", params![seq], |r| r.get(0)).optional()?;
    Ok(stored.and_then(|m| serde_json::from_str(&m).ok()).unwrap_or_default())
}

/// The columns an entry is read from, in [`entry`]'s order.
const COLUMNS: &str = "id, kind, owner, function, version, digest, reason, event_ref, job_id, created_ms, \
     dropped_by, dropped_reason, dropped_ms, (event IS NOT NULL AND record IS NOT NULL)";

fn entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<DeadLetter> {
    let kind: String = r.get(1)?;
    let version: Option<i64> = r.get(4)?;
    let event: String = r.get(7)?;
    let dropped_by: Option<String> = r.get(10)?;
    let dropped_ms: Option<i64> = r.get(12)?;
    Ok(DeadLetter {
        id: from_db(r.get::<_, i64>(0)?),
        kind: DeadLetterKind::parse(&kind).unwrap_or(DeadLetterKind::Refused),
        owner: r.get(2)?,
        function: r.get(3)?,
        version: version.and_then(|v| u32::try_from(v).ok()),
        digest: r.get(5)?,
        reason: r.get(6)?,
        event: serde_json::from_str(&event).unwrap_or_else(|_| EventRef::new("", "", "")),
        job_id: r.get(8)?,
        created_ms: from_db(r.get::<_, i64>(9)?),
        redrivable: r.get(13)?,
        redrives: Vec::new(),
        dropped: match (dropped_by, dropped_ms) {
            (Some(by), Some(at)) => {
                Some(Dropped { by, reason: r.get::<_, Option<String>>(11)?.unwrap_or_default(), at_ms: from_db(at) })
            }
            _ => None,
        },
    })
}

/// The re-drives of entry `id`, first first, each with its firing's state and job.
fn redrives(conn: &Connection, id: u64) -> rusqlite::Result<Vec<Redrive>> {
    let mut stmt = conn.prepare_cached(
        "SELECT r.n, r.by, r.at_ms, r.firing, COALESCE(f.state, 'unknown'), f.job_id \
         FROM dead_letter_redrives r LEFT JOIN firings f ON f.seq = r.firing WHERE r.entry = ?1 ORDER BY r.n",
    )?;
    stmt.query_map(params![db_int(id)], |r| {
        Ok(Redrive {
            n: r.get(0)?,
            by: r.get(1)?,
            at_ms: from_db(r.get::<_, i64>(2)?),
            firing: from_db(r.get::<_, i64>(3)?),
            state: r.get(4)?,
            job_id: r.get(5)?,
        })
    })?
    .collect()
}

fn read_entry(conn: &Connection, id: u64) -> rusqlite::Result<Option<DeadLetter>> {
    let found = row(conn, &format!("SELECT {COLUMNS} FROM dead_letters WHERE id = ?1"), params![db_int(id)], entry)
        .optional()?;
    match found {
        Some(mut e) => {
            e.redrives = redrives(conn, id)?;
            Ok(Some(e))
        }
        None => Ok(None),
    }
}

/// Which entries a list answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Only this owner's (a developer's list); `None`: everyone's (an admin's).
    pub owner: Option<String>,
    /// Only this function's.
    pub function: Option<String>,
    /// Only entries made at or after this time, Unix ms.
    pub since_ms: Option<u64>,
    /// Dropped entries too.
    pub dropped: bool,
    /// At most this many (newest first), at most [`MAX_LIST`].
    pub limit: usize,
}

impl Firings {
    /// Records job `n`'s failure in the dead-letter list (a notification of another end adds
    /// nothing). The function version and the event are the firing's that made the job, if the
    /// gateway made it; else the entry cannot be re-driven. Returns whether an entry was added.
    pub fn dead_letter_job(&self, n: &JobNotification, now_ms: u64) -> Result<bool, FiringError> {
        if n.state != JobState::Failed {
            return Ok(false);
        }
        self.with(|conn| {
            let tx = begin_immediate(conn)?;
            let firing: Option<(i64, String, String)> = row(
                &tx,
                "SELECT seq, event, record FROM firings WHERE job_id = ?1 ORDER BY seq DESC LIMIT 1",
                params![n.job_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
            let seq = firing.as_ref().map(|f| f.0);
            let (event, record) = firing.map(|(_, e, r)| (e, r)).unzip();
            let added = exec(
                &tx,
                "INSERT OR IGNORE INTO dead_letters (key, kind, owner, function, version, digest, reason, event_ref, \
                 event, record, job_id, created_ms) VALUES (?1, 'failed', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    format!("job:{}", n.job_id),
                    n.owner,
                    n.function,
                    n.version,
                    n.digest.as_ref().map(|d| d.as_str().to_owned()),
                    n.reason,
                    serde_json::to_string(&n.event)?,
                    event,
                    record,
                    n.job_id,
                    db_int(now_ms)
                ],
            )?;
            if let (Some(seq), true) = (seq, added > 0) {
                keep_members(&tx, &format!("job:{}", n.job_id), seq)?;
            }
            tx.commit()?;
            Ok(added > 0)
        })
    }

    /// Records `event` (stream sequence `stream_seq`), which JetStream gave up delivering, in
    /// the dead-letter list: one entry per function of `functions` (what it fires), or one of
    /// no owner when it fires none or could not be read (`reason` says). Returns how many
    /// entries were added.
    pub fn dead_letter_event(
        &self,
        stream_seq: u64,
        event: Option<&StorageEvent>,
        functions: &[FunctionRecord],
        reason: &str,
        now_ms: u64,
    ) -> Result<usize, FiringError> {
        self.with(|conn| {
            let tx = begin_immediate(conn)?;
            let reference = event.map(event_ref).unwrap_or_else(|| EventRef::new("", "", ""));
            let reference = serde_json::to_string(&reference)?;
            let event_json = event.map(serde_json::to_string).transpose()?;
            let mut added = 0;
            let insert = "INSERT OR IGNORE INTO dead_letters (key, kind, owner, function, version, digest, reason, \
                 event_ref, event, record, created_ms) VALUES (?1, 'max_deliver', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
            if functions.is_empty() {
                added += exec(
                    &tx,
                    insert,
                    params![
                        format!("max_deliver:{stream_seq}"),
                        "",
                        "",
                        None::<i64>,
                        None::<String>,
                        reason,
                        reference,
                        event_json,
                        None::<String>,
                        db_int(now_ms)
                    ],
                )?;
            }
            for f in functions {
                let m = &f.manifest;
                added += exec(
                    &tx,
                    insert,
                    params![
                        format!("max_deliver:{stream_seq}#{}", m.name),
                        m.owner,
                        m.name,
                        f.version,
                        m.module.as_str(),
                        reason,
                        reference,
                        event_json,
                        serde_json::to_string(f)?,
                        db_int(now_ms)
                    ],
                )?;
            }
            tx.commit()?;
            Ok(added)
        })
    }

    /// The entries `filter` selects, newest first, each with its re-drives.
    pub fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, FiringError> {
        self.with(|conn| {
            let limit = filter.limit.clamp(1, MAX_LIST);
            let sql = format!(
                "SELECT {COLUMNS} FROM dead_letters WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR function = ?2) \
                 AND created_ms >= ?3 AND (?4 OR dropped_ms IS NULL) ORDER BY id DESC LIMIT ?5"
            );
            let mut list: Vec<DeadLetter> = conn
                .prepare_cached(&sql)?
                .query_map(
                    params![
                        filter.owner,
                        filter.function,
                        db_int(filter.since_ms.unwrap_or(0)),
                        filter.dropped,
                        db_int(limit as u64)
                    ],
                    entry,
                )?
                .collect::<Result<_, _>>()?;
            for e in &mut list {
                e.redrives = redrives(conn, e.id)?;
            }
            Ok(list)
        })
    }

    /// Entry `id`, dropped or not.
    pub fn dead_letter(&self, id: u64) -> Result<Option<DeadLetter>, FiringError> {
        self.with(|conn| Ok(read_entry(conn, id)?))
    }

    /// Re-drive `n` of entry `id` (`None`: the next), asked by `by`: in one transaction, a new
    /// firing of the entry's function version on its event (replay id `redrive-<id>.<n>`), the
    /// re-drive's row and `record` (its audit record, with the actor). A re-drive number that
    /// exists answers it (`created: false`) and changes nothing; one past the next is refused.
    pub fn redrive(
        &self,
        id: u64,
        n: Option<u32>,
        by: &str,
        record: AuditDraft,
        now_ms: u64,
    ) -> Result<RedriveResponse, DlqError> {
        let (answer, inserted) = self.with(|conn| {
            let tx = begin_immediate(conn)?;
            let done = redrive_in(&tx, id, n, by, record, now_ms, self.window_ms);
            match done {
                Ok(done) => {
                    tx.commit()?;
                    Ok(Ok(done))
                }
                Err(e) => Ok(Err(e)),
            }
        })??;
        if let Some(inserted) = inserted {
            self.inserted(std::slice::from_ref(&inserted));
        }
        Ok(answer)
    }

    /// Drops entry `id` (by `by`, for `reason`) with `record`, its audit record, in one
    /// transaction; an entry dropped already is answered as it is.
    pub fn drop_dead_letter(
        &self,
        id: u64,
        by: &str,
        reason: &str,
        record: AuditDraft,
        now_ms: u64,
    ) -> Result<DeadLetter, DlqError> {
        self.with(|conn| {
            let tx = begin_immediate(conn)?;
            let Some(e) = read_entry(&tx, id)? else { return Ok(Err(DlqError::NotFound(id))) };
            if e.dropped.is_none() {
                exec(
                    &tx,
                    "UPDATE dead_letters SET dropped_by = ?2, dropped_reason = ?3, dropped_ms = ?4 WHERE id = ?1",
                    params![db_int(id), by, reason, db_int(now_ms)],
                )?;
                audit::append_in(&tx, record)?;
            }
            let e = read_entry(&tx, id)?;
            tx.commit()?;
            Ok(e.ok_or(DlqError::NotFound(id)))
        })?
    }
}

/// [`Firings::redrive`] inside `tx`; the firing's insert, when one was made.
fn redrive_in(
    tx: &Connection,
    id: u64,
    n: Option<u32>,
    by: &str,
    record: AuditDraft,
    now_ms: u64,
    window_ms: u64,
) -> Result<(RedriveResponse, Option<Inserted>), DlqError> {
    let Some(e) = read_entry(tx, id)? else { return Err(DlqError::NotFound(id)) };
    let done = e.redrives.len() as u32;
    let n = n.unwrap_or(done + 1);
    if n == 0 {
        return Err(DlqError::Conflict("re-drive numbers start at 1".into()));
    }
    if let Some(r) = e.redrives.iter().find(|r| r.n == n) {
        return Ok((RedriveResponse { id, redrive: r.clone(), created: false }, None));
    }
    if e.dropped.is_some() {
        return Err(DlqError::Conflict(format!("dead-letter entry {id} was dropped")));
    }
    if n != done + 1 {
        return Err(DlqError::Conflict(format!("entry {id} has {done} re-drives: the next is {}, not {n}", done + 1)));
    }
    let (event, function, members): (Option<String>, Option<String>, Option<String>) = row(
        tx,
        "SELECT d.event, d.record, m.members FROM dead_letters d LEFT JOIN dead_letter_members m ON m.key = d.key          WHERE d.id = ?1",
        params![db_int(id)],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let stored = (event, function);
    let (Some(event), Some(function)) = stored else {
        return Err(DlqError::Conflict(format!(
            "entry {id} cannot be re-driven: the gateway did not make its job, so it kept no function version and event"
        )));
    };
    let (event, function): (StorageEvent, FunctionRecord) =
        match (serde_json::from_str(&event), serde_json::from_str(&function)) {
            (Ok(e), Ok(f)) => (e, f),
            _ => {
                return Err(DlqError::Conflict(format!(
                    "entry {id} cannot be re-driven: its stored event does not read back"
                )));
            }
        };
    let replay = format!("{REDRIVE_PREFIX}{id}.{n}");
    let inserted =
        super::rows::insert_event(tx, &event, std::slice::from_ref(&function), Some(&replay), now_ms, window_ms)?;
    let key = event_key(&event, Some(&replay));
    let seq: Option<i64> = row(
        tx,
        "SELECT seq FROM firings WHERE event_key = ?1 AND function = ?2 AND digest = ?3",
        params![key, function.manifest.name, function.manifest.module.as_str()],
        |r| r.get(0),
    )
    .optional()?;
    let Some(seq) = seq else {
        return Err(DlqError::Conflict(format!(
            "entry {id} was not re-driven: the loop guard stops {} on this file",
            function.manifest.name
        )));
    };
    exec(
        tx,
        "INSERT INTO dead_letter_redrives (entry, n, firing, by, at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![db_int(id), n, seq, by, db_int(now_ms)],
    )?;
    // A group's firing runs again on the group's files.
    if let Some(mut paths) = members.and_then(|m| serde_json::from_str::<Vec<String>>(&m).ok()) {
        paths.retain(|p| *p != event.path);
        exec(
            tx,
            "INSERT OR REPLACE INTO redrive_members (firing, members) VALUES (?1, ?2)",
            params![seq, serde_json::to_string(&paths).map_err(FiringError::from)?],
        )?;
    }
    audit::append_in(tx, record).map_err(FiringError::from)?;
    let redrive = redrives(tx, id)?.into_iter().find(|r| r.n == n).ok_or(DlqError::NotFound(id))?;
    Ok((RedriveResponse { id, redrive, created: true }, Some(inserted)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{event, function};
    use htfaas_functions::proto::JobNotification;
    use std::path::Path;

    fn open(dir: &Path) -> Firings {
        Firings::open(&dir.join("firings.sqlite"), 3600, 16).expect("open")
    }

    fn draft(action: &str) -> AuditDraft {
        crate::audit::admin_action("alice", action, audit::Subject::default(), serde_json::Value::Null)
    }

    fn all(f: &Firings) -> Vec<DeadLetter> {
        f.dead_letters(&DeadLetterFilter { dropped: true, limit: MAX_LIST, ..Default::default() }).expect("list")
    }

    /// A refusal enters the list with its reason in its own transaction (kept when the
    /// refused firing is pruned); a re-drive with one number twice makes one firing, the next
    /// number another, one out of turn is refused; a drop keeps who and why.
    #[test]
    fn a_refusal_is_a_dead_letter_redriven_once_per_number_and_dropped_with_its_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let a = function("a", None, None);
        f.insert(&event("e1", "/data/x"), std::slice::from_ref(&a), None, 1_000).expect("insert");
        let claim = f.claim(2_000, 10).expect("claim");
        f.mark_refused(claim.ready[0].seq, "namespace refused", 2_000).expect("refuse");
        f.prune(1_000 + 3_600_000 + 1, 100).expect("prune the refused firing");
        let list = all(&f);
        assert_eq!(list.len(), 1, "{list:?}");
        let e = &list[0];
        assert_eq!((e.kind, e.owner.as_str(), e.function.as_str()), (DeadLetterKind::Refused, "alice", "a"));
        assert_eq!((e.version, e.reason.as_str(), e.event.path.as_str()), (Some(3), "namespace refused", "/data/x"));
        assert!(e.redrivable);

        let now = 5_000_000;
        let first = f.redrive(e.id, Some(1), "alice", draft("dlq.redrive"), now).expect("re-drive 1");
        let again = f.redrive(e.id, Some(1), "bob", draft("dlq.redrive"), now).expect("re-drive 1 again");
        assert!(first.created && !again.created);
        assert_eq!(first.redrive, again.redrive);
        assert_eq!(first.redrive.by, "alice");
        let e3 = f.redrive(e.id, Some(3), "alice", draft("dlq.redrive"), now).expect_err("out of turn");
        assert_eq!(e3.to_string(), format!("entry {} has 1 re-drives: the next is 2, not 3", e.id));
        let second = f.redrive(e.id, None, "alice", draft("dlq.redrive"), now).expect("re-drive 2");
        assert_eq!((second.redrive.n, second.created), (2, true));
        assert_ne!(second.redrive.firing, first.redrive.firing);
        // Two pending firings, each its own replay id (so its own scheduler dedupe key).
        let claim = f.claim(now, 10).expect("claim");
        let mut replays: Vec<_> = claim.ready.iter().map(|c| c.replay.clone().unwrap_or_default()).collect();
        replays.sort();
        assert_eq!(replays, [format!("redrive-{}.1", e.id), format!("redrive-{}.2", e.id)]);
        f.mark_submitted(claim.ready[0].seq, "job-9", now).expect("submitted");
        let shown = f.dead_letter(e.id).expect("show").expect("there");
        assert_eq!(shown.redrives.iter().filter(|r| r.job_id.as_deref() == Some("job-9")).count(), 1);

        let dropped = f.drop_dead_letter(e.id, "alice", "not needed", draft("dlq.drop"), now).expect("drop");
        let d = dropped.dropped.expect("dropped");
        assert_eq!((d.by.as_str(), d.reason.as_str()), ("alice", "not needed"));
        assert!(f.dead_letters(&DeadLetterFilter { limit: 10, ..Default::default() }).expect("list").is_empty());
        let e4 = f.redrive(e.id, None, "alice", draft("dlq.redrive"), now).expect_err("dropped");
        assert!(e4.to_string().contains("was dropped"), "{e4}");
        assert!(matches!(f.redrive(999, None, "alice", draft("x"), now), Err(DlqError::NotFound(999))));
    }

    /// A failed job enters once (a second notification adds nothing), with the function and the
    /// event of the firing that made it; another end adds nothing; filters select by owner,
    /// function and time; an undeliverable event enters once per function it fires.
    #[test]
    fn failed_jobs_and_undeliverable_events_enter_once_and_filters_select() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open(dir.path());
        let a = function("a", None, None);
        f.insert(&event("e1", "/data/x"), std::slice::from_ref(&a), None, 1_000).expect("insert");
        let claim = f.claim(2_000, 10).expect("claim");
        f.mark_submitted(claim.ready[0].seq, "job-1", 2_000).expect("submitted");
        let mut n = JobNotification {
            seq: 1,
            job_id: "job-1".into(),
            owner: "alice".into(),
            function: "a".into(),
            version: 3,
            digest: Some(a.manifest.module.clone()),
            state: JobState::Completed,
            reason: String::new(),
            hold_code: None,
            event: EventRef::new("dcache-billing:pool@d", "e1", "/data/x"),
            outputs: vec![],
            usage: None,
            attempts: 1,
            exit_code: Some(0),
            finished_at_ms: 3_000,
            checkpoint: None,
        };
        assert!(!f.dead_letter_job(&n, 3_000).expect("a completed job"));
        n.state = JobState::Failed;
        n.reason = "exited with 3".into();
        assert!(f.dead_letter_job(&n, 3_000).expect("a failed job"));
        assert!(!f.dead_letter_job(&n, 3_001).expect("told twice"));
        let unknown = JobNotification { job_id: "job-x".into(), owner: "bob".into(), ..n.clone() };
        assert!(f.dead_letter_job(&unknown, 4_000).expect("a job the gateway did not make"));

        let b = function("b", None, None);
        let ev = event("e2", "/data/y");
        let added = f.dead_letter_event(77, Some(&ev), &[a.clone(), b.clone()], "max_deliver", 5_000).expect("event");
        assert_eq!(added, 2);
        assert_eq!(f.dead_letter_event(77, Some(&ev), &[a, b], "max_deliver", 5_001).expect("again"), 0);

        let list = all(&f);
        assert_eq!(list.len(), 4, "{list:?}");
        let failed = list.iter().find(|e| e.job_id.as_deref() == Some("job-1")).expect("the failed job");
        assert!(failed.redrivable && failed.kind == DeadLetterKind::Failed, "{failed:?}");
        let foreign = list.iter().find(|e| e.job_id.as_deref() == Some("job-x")).expect("the other");
        assert!(!foreign.redrivable, "{foreign:?}");
        let e = f.redrive(foreign.id, None, "admin", draft("dlq.redrive"), 6_000).expect_err("not re-drivable");
        assert!(matches!(e, DlqError::Conflict(_)), "{e}");
        let select = |owner: Option<&str>, function: Option<&str>, since_ms: Option<u64>| {
            let filter = DeadLetterFilter {
                owner: owner.map(str::to_owned),
                function: function.map(str::to_owned),
                since_ms,
                dropped: false,
                limit: 100,
            };
            f.dead_letters(&filter).expect("list").len()
        };
        assert_eq!(select(Some("bob"), None, None), 1);
        assert_eq!(select(Some("alice"), None, None), 3);
        assert_eq!(select(None, Some("b"), None), 1);
        assert_eq!(select(None, None, Some(4_500)), 2);
        assert!(list.iter().filter(|e| e.kind == DeadLetterKind::MaxDeliver).all(|e| e.redrivable));
    }
}
