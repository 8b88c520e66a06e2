//! The job-end outbox: a row per job that ended — `completed`, `failed`, `held` or
//! `removed` — written in the very transaction that ended it, kept until the notification
//! publisher ([`crate::notify`]) has its JetStream PubAck, then deleted.
//!
//! The row is written by a trigger on the `jobs` table (`job_outbox_on_end_v2`), not by each
//! writer of a job's state: every path that ends a job (an EP's report, a failed dispatch, a
//! hold past the retry limit, an admin's hold or remove, a revocation) is covered, and a path
//! added later cannot forget it. The trigger copies what may still change from the job as it
//! ended (state, reason, outputs with their checksums, usage, attempts), so a later change of
//! the job (a release) does not change what is told. What never changes (the function, its
//! version and digest, the event) is read from the job's stored request when the entry is
//! read, and parsed there, outside the store's lock: the trigger runs in the writer's
//! transaction, where parsing each ended job's request was SQL JSON work on the one thread
//! every write waits for. (Entries the first trigger wrote carry those fields themselves.) The
//! table and trigger are installed at open beside the migrated schema (`CREATE … IF NOT
//! EXISTS`, their version in their names).
//!
//! Must not know: NATS, subjects, the publisher's retry policy.

use super::Queue;
use crate::error::QueueError;
use htfaas_functions::Digest;
use htfaas_functions::proto::{EventRef, JobNotification, JobState, OutputFile, Usage};
use htfaas_functions::store::{db_int, exec, from_db};
use rusqlite::{Connection, params};
use serde::Deserialize;

/// The outbox's table and the trigger that fills it.
const INSTALL: &str = "
CREATE TABLE IF NOT EXISTS job_outbox (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id         TEXT NOT NULL,
    owner          TEXT NOT NULL,
    state          TEXT NOT NULL,
    reason         TEXT NOT NULL,
    hold_code      INTEGER,
    function       TEXT,
    version        INTEGER,
    digest         TEXT,
    event          TEXT,
    outputs        TEXT,
    usage          TEXT,
    attempts       INTEGER NOT NULL,
    exit_code      INTEGER,
    finished_at_ms INTEGER NOT NULL
);
DROP TRIGGER IF EXISTS job_outbox_on_end;
CREATE TRIGGER IF NOT EXISTS job_outbox_on_end_v2 AFTER UPDATE OF state ON jobs
WHEN NEW.state IN ('completed', 'failed', 'held', 'removed') AND OLD.state IS NOT NEW.state
BEGIN
    INSERT INTO job_outbox (job_id, owner, state, reason, hold_code, outputs, usage, attempts, exit_code,
                            finished_at_ms)
    VALUES (NEW.id, NEW.owner, NEW.state, NEW.reason, NEW.hold_code, NEW.outputs, NEW.usage, NEW.attempts,
            NEW.exit_code, COALESCE(NEW.finished_at_ms, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)));
END;
";

/// Creates the outbox's table and trigger if missing (at open, after the migrations).
pub(super) fn install(conn: &Connection) -> Result<(), QueueError> {
    conn.execute_batch(INSTALL)?;
    Ok(())
}

/// An outbox entry as read, before its JSON is parsed (outside the store's lock).
struct Entry {
    seq: i64,
    job_id: String,
    owner: String,
    state: String,
    reason: String,
    function: Option<String>,
    version: Option<i64>,
    digest: Option<String>,
    event: Option<String>,
    outputs: Option<String>,
    usage: Option<String>,
    attempts: u32,
    exit_code: Option<i32>,
    finished_at_ms: i64,
    hold_code: Option<u32>,
    /// The job's stored request, read when the entry does not carry its event.
    request: Option<String>,
}

fn entry(row: &rusqlite::Row<'_>) -> rusqlite::Result<Entry> {
    Ok(Entry {
        seq: row.get(0)?,
        job_id: row.get(1)?,
        owner: row.get(2)?,
        state: row.get(3)?,
        reason: row.get(4)?,
        function: row.get(5)?,
        version: row.get(6)?,
        digest: row.get(7)?,
        event: row.get(8)?,
        outputs: row.get(9)?,
        usage: row.get(10)?,
        attempts: row.get(11)?,
        exit_code: row.get(12)?,
        finished_at_ms: row.get(13)?,
        hold_code: row.get(14)?,
        request: row.get(15)?,
    })
}

/// What a notification tells of a job's stored request (its other fields are skipped).
#[derive(Deserialize)]
struct Told {
    function: ToldFunction,
    event: EventRef,
    #[serde(default)]
    checkpoint: Option<ToldCheckpoint>,
}

#[derive(Deserialize)]
struct ToldCheckpoint {
    url: String,
}

#[derive(Deserialize)]
struct ToldFunction {
    name: String,
    version: u32,
    digest: Digest,
}

impl Entry {
    /// The entry as its notification. A stored field that does not parse (a request an older
    /// build wrote) is told as empty rather than keeping the entry, and all behind it, for ever.
    fn notification(self) -> JobNotification {
        let told = self.request.as_deref().and_then(|r| serde_json::from_str::<Told>(r).ok());
        let (function, version, digest, event, checkpoint) = match told {
            Some(t) => {
                (t.function.name, t.function.version, Some(t.function.digest), t.event, t.checkpoint.map(|c| c.url))
            }
            None => (
                self.function.unwrap_or_default(),
                self.version.and_then(|v| u32::try_from(v).ok()).unwrap_or(0),
                self.digest.and_then(|d| d.parse::<Digest>().ok()),
                self.event
                    .and_then(|e| serde_json::from_str::<EventRef>(&e).ok())
                    .unwrap_or_else(|| EventRef::new("", "", "")),
                None,
            ),
        };
        JobNotification {
            seq: from_db(self.seq),
            job_id: self.job_id,
            owner: self.owner,
            function,
            version,
            digest,
            state: JobState::parse(&self.state).unwrap_or(JobState::Failed),
            reason: self.reason,
            hold_code: self.hold_code,
            event,
            outputs: self.outputs.and_then(|o| serde_json::from_str::<Vec<OutputFile>>(&o).ok()).unwrap_or_default(),
            usage: self.usage.and_then(|u| serde_json::from_str::<Usage>(&u).ok()),
            attempts: self.attempts,
            exit_code: self.exit_code,
            finished_at_ms: from_db(self.finished_at_ms),
            checkpoint,
        }
    }
}

impl Queue {
    /// The oldest `limit` notifications not yet published, oldest first.
    pub async fn outbox(&self, limit: usize) -> Result<Vec<JobNotification>, QueueError> {
        let entries: Vec<Entry> = self
            .call(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT o.seq, o.job_id, o.owner, o.state, o.reason, o.function, o.version, o.digest, o.event, \
                     o.outputs, o.usage, o.attempts, o.exit_code, o.finished_at_ms, o.hold_code, \
                     CASE WHEN o.event IS NULL THEN r.request END \
                     FROM job_outbox o LEFT JOIN jobs j ON j.id = o.job_id LEFT JOIN job_requests r ON r.seq = j.seq \
                     ORDER BY o.seq LIMIT ?1",
                )?;
                let rows = stmt.query_map(params![db_int(limit as u64)], entry)?.collect::<Result<_, _>>()?;
                Ok(rows)
            })
            .await?;
        Ok(entries.into_iter().map(Entry::notification).collect())
    }

    /// Deletes the outbox's entries `seqs` (published: their PubAcks came). Returns how many.
    pub async fn outbox_done(&self, seqs: Vec<u64>) -> Result<usize, QueueError> {
        self.write(move |tx| {
            let mut n = 0;
            for seq in seqs {
                n += exec(tx, "DELETE FROM job_outbox WHERE seq = ?1", params![db_int(seq)])?;
            }
            Ok(n)
        })
        .await
    }

    /// How many notifications wait to be published.
    pub async fn outbox_len(&self) -> Result<u64, QueueError> {
        self.call(|conn| {
            let n: i64 = conn.query_row("SELECT COUNT(*) FROM job_outbox", [], |r| r.get(0))?;
            Ok(from_db(n))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use crate::queue::{Action, Loss, Queue};
    use crate::testing::{LOSS, new_job, ok};
    use htfaas_functions::proto::{JobReport, JobState, Outcome, OutputFile, Usage};

    fn report(id: &str, outcome: Outcome) -> JobReport {
        JobReport {
            input_sha256: None,
            job_id: id.into(),
            outcome,
            usage: Usage { wall_ms: 10, cpu_ms: 5, ..Usage::default() },
            outputs: vec![],
            log: String::new(),
            refs: Vec::new(),
            checkpoint: None,
        }
    }

    /// Every end of a job leaves one entry, in the transaction that ended it, with what the
    /// notification tells; what does not end a job leaves none; a delete takes only its own.
    #[tokio::test]
    async fn each_end_of_a_job_and_only_an_end_leaves_one_outbox_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let done = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        let failed = q.submit(new_job("k2", "t2", 1)).await.expect("submit").job_id;
        let removed = q.submit(new_job("k3", "t3", 1)).await.expect("submit").job_id;
        assert!(q.outbox(10).await.expect("outbox").is_empty(), "a submit ends nothing");
        q.mark_running(vec![done.clone(), failed.clone()], "ep1".into(), "s1".into(), ok).await.expect("mark");
        assert!(q.outbox(10).await.expect("outbox").is_empty(), "a dispatch ends nothing");
        let dir_of = |r: &htfaas_functions::proto::SubmitRequest| crate::queue::url_path(&r.output.url);
        let out_dir = dir_of(&crate::testing::request("k1"));
        let mut good = report(&done, Outcome::Exited { exit_code: 0 });
        good.outputs = vec![OutputFile { path: format!("{out_dir}a.out"), size: 3, sha256: "ba".repeat(32) }];
        q.finish("s1".into(), good, LOSS).await.expect("finish").expect("running");
        q.finish("s1".into(), report(&failed, Outcome::Exited { exit_code: 3 }), LOSS)
            .await
            .expect("finish")
            .expect("running");
        q.act(removed.clone(), Action::Remove, "not wanted".into()).await.expect("remove");

        let entries = q.outbox(10).await.expect("outbox");
        let got: Vec<(&str, JobState)> = entries.iter().map(|n| (n.job_id.as_str(), n.state)).collect();
        assert_eq!(
            got,
            vec![
                (done.as_str(), JobState::Completed),
                (failed.as_str(), JobState::Failed),
                (removed.as_str(), JobState::Removed)
            ]
        );
        let first = &entries[0];
        assert_eq!((first.owner.as_str(), first.function.as_str()), ("alice", "checksum"));
        assert_eq!(first.outputs.len(), 1, "{first:?}");
        assert_eq!(first.outputs[0].sha256, "ba".repeat(32));
        assert_eq!(first.usage.as_ref().map(|u| u.wall_ms), Some(10));
        assert_eq!(first.attempts, 1);
        assert!(first.digest.is_some() && !first.event.id.is_empty(), "{first:?}");
        assert_eq!(entries[1].exit_code, Some(3));
        assert!(entries[1].reason.contains('3'), "{:?}", entries[1].reason);
        assert_eq!(entries[2].reason, "removed by admin: not wanted");

        // Published: deleted, the others stay, and stay after the store opens again.
        let n = q.outbox_done(vec![entries[0].seq]).await.expect("done");
        assert_eq!(n, 1);
        drop(q);
        let q = Queue::open(&dir.path().join("q.db")).expect("reopen");
        let left: Vec<u64> = q.outbox(10).await.expect("outbox").iter().map(|n| n.seq).collect();
        assert_eq!(left, vec![entries[1].seq, entries[2].seq]);
        assert_eq!(q.outbox_len().await.expect("len"), 2);
    }

    /// An entry the first trigger wrote carries its function and event itself, and is told
    /// with them; one whose job's request does not parse is told with them empty.
    #[tokio::test]
    async fn entries_of_the_first_trigger_and_unparsable_requests_are_still_told() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let broken = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        q.act(broken.clone(), Action::Remove, "gone".into()).await.expect("remove");
        let digest = htfaas_functions::Digest::of(b"m").to_string();
        let event =
            serde_json::to_string(&htfaas_functions::proto::EventRef::new("dcache", "e1", "/data/x")).expect("json");
        let id = broken.clone();
        // The first trigger's entry (ended before the removal: read first), and the removed
        // job's request spoilt after its entry was written.
        q.call_writing(move |c| {
            c.execute(
                "INSERT INTO job_outbox (seq, job_id, owner, state, reason, function, version, digest, event, \
                 attempts, finished_at_ms) VALUES (0, 'old-job', 'bob', 'completed', '', 'calibrate', 7, ?1, ?2, 1, 5)",
                rusqlite::params![digest, event],
            )?;
            c.execute(
                "UPDATE job_requests SET request = '{not json' WHERE seq = (SELECT seq FROM jobs WHERE id = ?1)",
                rusqlite::params![id],
            )?;
            Ok(())
        })
        .await
        .expect("write");
        let entries = q.outbox(10).await.expect("outbox");
        assert_eq!(entries.len(), 2, "{entries:?}");
        let (old, new) = (&entries[0], &entries[1]);
        assert_eq!((old.job_id.as_str(), old.function.as_str(), old.version), ("old-job", "calibrate", 7));
        assert_eq!((old.event.id.as_str(), old.event.path.as_str()), ("e1", "/data/x"));
        assert!(old.digest.is_some());
        assert_eq!((new.job_id.as_str(), new.state, new.function.as_str()), (broken.as_str(), JobState::Removed, ""));
        assert!(new.event.id.is_empty() && new.digest.is_none(), "{new:?}");
    }

    /// A job held past the retry limit is told as held; its attempts before are not told.
    #[tokio::test]
    async fn a_job_held_past_its_retries_is_told_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        let loss = Loss::Ep { max_retries: 1, backoff_ms: 0 };
        for session in ["s1", "s2"] {
            q.mark_running(vec![id.clone()], "ep1".into(), session.into(), ok).await.expect("mark");
            q.lose_session(session.into(), loss, "gone".into()).await.expect("lose");
        }
        let entries = q.outbox(10).await.expect("outbox");
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].state, JobState::Held);
        assert!(entries[0].hold_code.is_some() && entries[0].reason.contains("gone"), "{:?}", entries[0]);
    }
}
