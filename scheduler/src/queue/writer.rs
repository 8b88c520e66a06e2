//! The group-commit writer thread: every write of the store goes through it, batched
//! ([`MAX_BATCH`] at most), one transaction per batch, each write but the first in a savepoint
//! of its own (see the [module docs](super)).
//!
//! Must not know: what the writes do (jobs, accounts, revocations): it runs closures.

use super::Queue;
use crate::error::QueueError;
use htfaas_functions::store::{begin_immediate, exec};
use rusqlite::Connection;
use std::sync::{Arc, Mutex};

/// Most writes committed in one transaction: a batch's latency stays bounded under any load.
pub const MAX_BATCH: usize = 256;

/// Why a write got no answer: the writer thread is gone (the queue is being dropped).
const WRITER_GONE: &str = "the store's writer stopped";

/// The savepoint each write of a batch runs in: opened, then released or rolled back to.
const SAVEPOINT_OPEN: &str = "SAVEPOINT htfaas_write";
const SAVEPOINT_RELEASE: &str = "RELEASE htfaas_write";
const SAVEPOINT_ROLLBACK: &str = "ROLLBACK TO htfaas_write";

/// The one writer of the store: a thread that takes every write waiting in its channel (at
/// most [`MAX_BATCH`]), runs them in one transaction, each in a savepoint of its own (but the
/// first, whose savepoint would be the transaction itself: see [`commit_batch`]), commits
/// once (one fsync with [`Durability::Fsync`](htfaas_functions::store::Durability::Fsync)), and
/// then answers each caller. A write that arrives alone is run at once: the thread waits only when
/// nothing is waiting for it, never on a timer. Dropping the last handle closes the channel; the
/// thread answers what it has and ends, and the drop waits for it.
pub(super) struct Writer {
    /// Where writes wait; `None` only while dropping.
    sender: Option<std::sync::mpsc::Sender<Box<dyn PendingWrite>>>,
    /// The thread, joined on drop.
    thread: Option<std::thread::JoinHandle<()>>,
    /// Batches run so far, and the writes run in them, shared with the thread.
    pub(super) counts: Arc<WriteCounts>,
}

/// What the writer has done since it started (for the metrics and the bench).
#[derive(Debug, Default)]
pub struct WriteCounts {
    /// Batches run (committed or not): one transaction each.
    pub batches: std::sync::atomic::AtomicU64,
    /// Writes run in them.
    pub writes: std::sync::atomic::AtomicU64,
}

impl Writer {
    pub(super) fn start(conn: Arc<Mutex<Connection>>) -> Result<Writer, QueueError> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let counts = Arc::new(WriteCounts::default());
        let counted = counts.clone();
        let thread = std::thread::Builder::new()
            .name("queue-writer".into())
            .spawn(move || write_loop(&conn, &receiver, &counted))
            .map_err(|e| QueueError::Task(format!("start the store's writer: {e}")))?;
        Ok(Writer { sender: Some(sender), thread: Some(thread), counts })
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            // The thread ends once it has answered what it took; a panic there was answered
            // already (each write's panic is caught), so there is nothing left to report.
            let _ = thread.join();
        }
    }
}

/// How one write of a batch went ([`PendingWrite::run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ran {
    /// It succeeded; its savepoint is released.
    Ok,
    /// It failed (its savepoint is rolled back); `full`: with `SQLITE_FULL`.
    Failed {
        /// The disk was full.
        full: bool,
    },
}

/// Why a batch was not committed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BatchFailed {
    /// What failed.
    why: String,
    /// Because the disk was full: every write of the batch is answered
    /// [`QueueError::DiskFull`].
    full: bool,
}

impl BatchFailed {
    /// `what` failed with `e`.
    fn sqlite(what: &str, e: &rusqlite::Error) -> BatchFailed {
        BatchFailed { why: format!("{what}: {e}"), full: crate::error::is_disk_full(e) }
    }
}

/// A write waiting for the writer (see [`WriteRequest`]).
trait PendingWrite: Send {
    /// Runs the write on `tx` (inside its savepoint); how it went.
    fn run(&mut self, tx: &Connection) -> Ran;
    /// Answers the caller: with the write's own result when its batch committed (`Ok`), else
    /// with why the batch did not.
    fn answer(self: Box<Self>, batch: Result<(), &BatchFailed>);
}

/// A write and the caller waiting for its answer.
struct WriteRequest<T, F> {
    /// The write; taken when it runs.
    f: Option<F>,
    /// What it returned, held until the batch is committed.
    result: Option<Result<T, QueueError>>,
    reply: tokio::sync::oneshot::Sender<Result<T, QueueError>>,
}

impl<T, F> PendingWrite for WriteRequest<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, QueueError> + Send,
{
    fn run(&mut self, tx: &Connection) -> Ran {
        let Some(f) = self.f.take() else { return Ran::Failed { full: false } };
        // A panicking write fails alone, as it did when each write had a blocking task.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(tx)))
            .unwrap_or_else(|_| Err(QueueError::Task("a write to the store panicked".into())));
        let ran = match &result {
            Ok(_) => Ran::Ok,
            Err(e) => Ran::Failed { full: e.is_disk_full() },
        };
        self.result = Some(result);
        ran
    }

    fn answer(self: Box<Self>, batch: Result<(), &BatchFailed>) {
        let result = match (self.result, batch) {
            // Its own error stands: it was rolled back, whatever became of the batch.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (Some(Ok(_)) | None, Err(b)) if b.full => Err(QueueError::DiskFull(b.why.clone())),
            (Some(Ok(_)) | None, Err(b)) => Err(QueueError::Batch(b.why.clone())),
            (None, Ok(())) => Err(QueueError::Task("a write was answered without being run".into())),
        };
        // The caller may have gone (its future dropped); the write stands all the same.
        let _ = self.reply.send(result);
    }
}

/// The writer thread's loop: waits for a write only when none is pending, then commits
/// batches until the channel is closed and empty.
fn write_loop(
    conn: &Mutex<Connection>,
    receiver: &std::sync::mpsc::Receiver<Box<dyn PendingWrite>>,
    counts: &WriteCounts,
) {
    let mut pending: std::collections::VecDeque<Box<dyn PendingWrite>> = std::collections::VecDeque::new();
    loop {
        if pending.is_empty() {
            match receiver.recv() {
                Ok(w) => pending.push_back(w),
                Err(_) => return,
            }
        }
        while pending.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(w) => pending.push_back(w),
                Err(_) => break,
            }
        }
        // Counted before its answers, so that whoever has an answer sees its batch counted.
        counts.batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        commit_batch(conn, &mut pending, &counts.writes);
    }
}

/// Runs up to [`MAX_BATCH`] writes from the front of `pending` in one transaction, each in a
/// savepoint (released when it succeeds, rolled back to when it fails), commits, and answers
/// each one. The first write runs without a savepoint: the transaction holds nothing else
/// yet, so when it fails the transaction is rolled back and it is answered alone (the rest
/// wait for the next batch), as a savepoint would have done; a savepoint costs a copy of each
/// page the write touches (SQLite's statement journal), which in the throughput bench was 8 %
/// of the scheduler's CPU, most batches holding one write or two. Counts the writes it runs
/// in `writes`. If SQLite ends the transaction itself (an I/O error, a full disk), every write
/// run so far in it is answered with that failure ([`QueueError::DiskFull`] when the disk is
/// full), nothing of the batch is stored, and the rest stay pending for the next batch. The
/// thread goes on either way: a full disk refuses writes until there is room, it never stops
/// the writer.
fn commit_batch(
    conn: &Mutex<Connection>,
    pending: &mut std::collections::VecDeque<Box<dyn PendingWrite>>,
    writes: &std::sync::atomic::AtomicU64,
) {
    let Ok(guard) = conn.lock() else {
        let failed = BatchFailed { why: QueueError::Poisoned.to_string(), full: false };
        for w in pending.drain(..) {
            w.answer(Err(&failed));
        }
        return;
    };
    // `BEGIN` and `COMMIT` through the statement cache: rusqlite's `Transaction` parses them
    // each time, 2 % of the scheduler's CPU in the throughput bench.
    let tx = match begin_immediate(&guard) {
        Ok(tx) => tx,
        Err(e) => {
            // Only the first write is failed: the rest may succeed in the next batch, and a
            // store that keeps refusing still answers everyone, one batch at a time.
            if let Some(w) = pending.pop_front() {
                w.answer(Err(&BatchFailed::sqlite("begin a transaction", &e)));
            }
            return;
        }
    };
    let mut ran: Vec<Box<dyn PendingWrite>> = Vec::with_capacity(pending.len().min(MAX_BATCH));
    // The first write, in the transaction itself.
    if let Some(mut w) = pending.pop_front() {
        writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if w.run(&tx) != Ran::Ok {
            // Rolled back alone (or already by SQLite, on SQLITE_FULL); its own error answers it.
            drop(tx);
            drop(guard);
            w.answer(Ok(()));
            return;
        }
        ran.push(w);
    }
    let mut lost = None;
    while ran.len() < MAX_BATCH
        && let Some(mut w) = pending.pop_front()
    {
        if let Err(e) = exec(&tx, SAVEPOINT_OPEN, []) {
            pending.push_front(w);
            lost = Some(BatchFailed::sqlite("open a savepoint", &e));
            break;
        }
        writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let outcome = w.run(&tx);
        ran.push(w);
        let end = if outcome == Ran::Ok {
            exec(&tx, SAVEPOINT_RELEASE, [])
        } else {
            exec(&tx, SAVEPOINT_ROLLBACK, []).and_then(|_| exec(&tx, SAVEPOINT_RELEASE, []))
        };
        if tx.is_autocommit() {
            // SQLite rolled the whole transaction back after an error of the last write (as it
            // does on SQLITE_FULL): its savepoint is gone too, so `end` failed; say why.
            let full = outcome == Ran::Failed { full: true } || end.as_ref().is_err_and(crate::error::is_disk_full);
            let why = if full { "the disk is full" } else { "an error" };
            lost =
                Some(BatchFailed { why: format!("the transaction was rolled back by {why} in the same batch"), full });
            break;
        }
        if let Err(e) = end {
            lost = Some(BatchFailed::sqlite("end a savepoint", &e));
            break;
        }
    }
    let committed = match lost {
        Some(failed) => {
            drop(tx);
            Err(failed)
        }
        None => tx.commit().map_err(|e| BatchFailed::sqlite("commit", &e)),
    };
    drop(guard);
    if let Err(failed) = &committed {
        tracing::error!(
            writes = ran.len(),
            disk_full = failed.full,
            "failed to commit a batch of writes: {}",
            failed.why
        );
    }
    for w in ran {
        w.answer(committed.as_ref().map(|_| ()));
    }
}

impl Queue {
    /// Runs the write `f` on the writer thread, inside the transaction of a batch and a
    /// savepoint of its own, and answers once that batch is committed: `f`'s own error (its
    /// savepoint rolled back, the rest of the batch unaffected), or [`QueueError::Batch`] when
    /// the batch as a whole could not be committed. Cancelling the returned future does not
    /// cancel the write.
    pub(super) async fn write<T, F>(&self, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, QueueError> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let request: Box<dyn PendingWrite> = Box::new(WriteRequest { f: Some(f), result: None, reply });
        let sender = self.writer.sender.as_ref().ok_or_else(|| QueueError::Task(WRITER_GONE.into()))?;
        sender.send(request).map_err(|_| QueueError::Task(WRITER_GONE.into()))?;
        answer.await.map_err(|_| QueueError::Task(WRITER_GONE.into()))?.map_err(QueueError::classified)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{LOSS, new_job, ok};
    use htfaas_functions::audit::{self, AuditDraft, AuditSigner, Subject};
    use htfaas_functions::proto::{JobReport, JobState, Outcome, RevocationTarget, Usage};
    use htfaas_functions::store::Durability;
    use rusqlite::params;

    /// A write for [`commit_batch`] and the receiver of its answer.
    fn write_request<T, F>(f: F) -> (Box<dyn PendingWrite>, tokio::sync::oneshot::Receiver<Result<T, QueueError>>)
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, QueueError> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        (Box::new(WriteRequest { f: Some(f), result: None, reply }), answer)
    }

    fn audit_records(conn: &Connection) -> i64 {
        conn.query_row("SELECT COUNT(*) FROM audit_records", [], |r| r.get(0)).expect("count")
    }

    /// A write that uses token `jti` and records it in the trail; returns `jti`.
    fn note(jti: &'static str) -> impl FnOnce(&Connection) -> Result<&'static str, QueueError> + Send + 'static {
        move |tx: &Connection| -> Result<&'static str, QueueError> {
            tx.execute("INSERT INTO token_uses (jti, uses, exp) VALUES (?1, 1, 0)", params![jti])?;
            let subject = Subject { token_jti: Some(jti.into()), ..Subject::default() };
            audit::append_in(tx, AuditDraft::job_refused(subject, 400, "test"))?;
            Ok(jti)
        }
    }

    /// The token ids the store holds, sorted.
    async fn stored_jtis(q: &Queue) -> Vec<String> {
        q.call(|c| {
            let mut stmt = c.prepare("SELECT jti FROM token_uses ORDER BY jti")?;
            Ok(stmt.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?)
        })
        .await
        .expect("read")
    }

    /// The store's audit trail verifies (chained without a gap).
    fn assert_trail_verifies(q: &Queue) {
        let (signer, _) = AuditSigner::generate("k").expect("key");
        let report = audit::verify(q.path(), &signer.keys()).expect("verify");
        assert!(report.ok(), "{:?}", report.first_problem);
    }

    #[tokio::test]
    async fn a_batch_commits_every_write_but_the_failing_ones_which_leave_nothing_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let before = q.call(|c| Ok(audit_records(c))).await.expect("count");
        let mut pending = std::collections::VecDeque::new();
        let (w, first) = write_request(note("a"));
        pending.push_back(w);
        // Writes, and records, then refuses: all of it is rolled back.
        let (w, refused) = write_request(move |tx: &Connection| -> Result<(), QueueError> {
            note("b")(tx)?;
            Err(QueueError::Conflict("no".into()))
        });
        pending.push_back(w);
        // SQLite refuses it (a duplicate key) after it recorded.
        let (w, duplicate) = write_request(move |tx: &Connection| -> Result<(), QueueError> {
            let subject = Subject { token_jti: Some("dup".into()), ..Subject::default() };
            audit::append_in(tx, AuditDraft::job_refused(subject, 400, "test"))?;
            note("a")(tx).map(|_| ())
        });
        pending.push_back(w);
        let (w, panicked) = write_request(|_tx: &Connection| -> Result<(), QueueError> { panic!("a bug") });
        pending.push_back(w);
        let (w, last) = write_request(note("c"));
        pending.push_back(w);
        let writes = std::sync::atomic::AtomicU64::new(0);
        commit_batch(&q.conn, &mut pending, &writes);
        assert!(pending.is_empty());
        assert_eq!(writes.into_inner(), 5);

        assert_eq!(first.await.expect("answered").expect("committed"), "a");
        assert_eq!(refused.await.expect("answered").expect_err("refused").to_string(), "no");
        let e = duplicate.await.expect("answered").expect_err("duplicate");
        assert!(matches!(e, QueueError::Sqlite(_)), "{e}");
        let e = panicked.await.expect("answered").expect_err("panicked");
        assert_eq!(e.to_string(), "database task failed: a write to the store panicked");
        assert_eq!(last.await.expect("answered").expect("committed"), "c");

        let jtis = stored_jtis(&q).await;
        assert_eq!(jtis, vec!["a", "c"]);
        // Two records, one per committed write, chained without a gap.
        assert_eq!(q.call(|c| Ok(audit_records(c))).await.expect("count"), before + 2);
        assert_trail_verifies(&q);
    }

    #[tokio::test]
    #[expect(clippy::await_holding_lock, reason = "holding the writer's connection is the point: writes pile up")]
    async fn concurrent_submits_and_finishes_share_commits_and_keep_every_count_exact() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        q.block(RevocationTarget::Jti("revoked".into()), "leaked".into());
        // Hold the connection so that the writes pile up and are batched.
        let batches = q.write_batches();
        let guard = q.conn.lock().expect("lock");
        let mut submits = tokio::task::JoinSet::new();
        for i in 0..40 {
            let q = q.clone();
            submits.spawn(async move { (i, q.submit(new_job(&format!("k{i}"), &format!("t{i}"), 1)).await) });
        }
        // One token for one job, used twice in the same batch: exactly one use counts.
        for i in [100, 101] {
            let q = q.clone();
            submits.spawn(async move { (i, q.submit(new_job(&format!("k{i}"), "shared", 1)).await) });
        }
        let revoked = q.clone();
        submits.spawn(async move { (200, revoked.submit(new_job("k200", "revoked", 1)).await) });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        drop(guard);

        let (mut ids, mut used_up) = (Vec::new(), 0);
        while let Some(done) = submits.join_next().await {
            match done.expect("task") {
                (200, r) => assert_eq!(r.expect_err("revoked").to_string(), "token revoked: leaked"),
                (100 | 101, Err(QueueError::TokenUsed { uses: 1, jobs: 1 })) => used_up += 1,
                (_, r) => ids.push(r.expect("accepted").job_id),
            }
        }
        assert_eq!((ids.len(), used_up), (41, 1));
        // The writer took the first write, waited for the connection, then took the rest.
        let batches = q.write_batches() - batches;
        assert!((1..=3).contains(&batches), "43 writes in {batches} batches");
        let (jobs, shared_uses): (i64, i64) = q
            .call(|c| {
                let jobs = c.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0))?;
                Ok((jobs, c.query_row("SELECT uses FROM token_uses WHERE jti = 'shared'", [], |r| r.get(0))?))
            })
            .await
            .expect("counts");
        assert_eq!((jobs, shared_uses), (41, 1));

        q.mark_running(ids.clone(), "ep1".into(), "s1".into(), ok).await.expect("mark");
        let guard = q.conn.lock().expect("lock");
        let mut finishes = tokio::task::JoinSet::new();
        for id in ids.iter().cloned().chain(["unknown".to_owned()]) {
            let q = q.clone();
            let report = JobReport {
                input_sha256: None,
                job_id: id,
                outcome: Outcome::Exited { exit_code: 0 },
                usage: Usage { wall_ms: 1000, ..Usage::default() },
                outputs: vec![],
                log: String::new(),
                refs: Vec::new(),
                checkpoint: None,
            };
            finishes.spawn(async move { q.finish("s1".into(), report, LOSS).await });
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        drop(guard);
        let mut finished = 0;
        while let Some(done) = finishes.join_next().await {
            finished += usize::from(done.expect("task").expect("finish").is_some());
        }
        assert_eq!(finished, 41);
        let acc = q.accounts().await.expect("accounts");
        assert_eq!(acc[0].jobs_completed, 41);
        assert!((acc[0].core_seconds - 41.0).abs() < 1e-9);
        let (signer, _) = AuditSigner::generate("k").expect("key");
        let report = audit::verify(q.path(), &signer.keys()).expect("verify");
        assert!(report.ok(), "{:?}", report.first_problem);
        // 41 accepted, 41 dispatched, 41 finished.
        assert_eq!(report.records, 123);
    }

    /// The first write of a batch runs without a savepoint of its own: when it fails, its
    /// transaction is rolled back with nothing else in it, it is answered alone, and the writes
    /// behind it are committed in the next batch.
    #[tokio::test]
    async fn a_failing_first_write_is_rolled_back_alone_and_the_rest_commit_in_the_next_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        let before = q.call(|c| Ok(audit_records(c))).await.expect("count");
        let mut pending = std::collections::VecDeque::new();
        // Writes, and records, then refuses.
        let (w, refused) = write_request(move |tx: &Connection| -> Result<(), QueueError> {
            note("x")(tx)?;
            Err(QueueError::Conflict("no".into()))
        });
        pending.push_back(w);
        let (w, second) = write_request(note("a"));
        pending.push_back(w);
        let (w, third) = write_request(note("b"));
        pending.push_back(w);
        let writes = std::sync::atomic::AtomicU64::new(0);
        commit_batch(&q.conn, &mut pending, &writes);
        assert_eq!(pending.len(), 2, "the rest wait for the next batch");
        assert_eq!(refused.await.expect("answered").expect_err("refused").to_string(), "no");
        commit_batch(&q.conn, &mut pending, &writes);
        assert!(pending.is_empty());
        assert_eq!(
            (second.await.expect("answered").expect("ok"), third.await.expect("answered").expect("ok")),
            ("a", "b")
        );
        assert_eq!(writes.into_inner(), 3);
        let jtis = stored_jtis(&q).await;
        assert_eq!(jtis, vec!["a", "b"], "nothing of the refused write is left");
        assert_eq!(q.call(|c| Ok(audit_records(c))).await.expect("count"), before + 2);
        assert_trail_verifies(&q);
    }

    #[tokio::test]
    async fn a_lone_write_is_committed_without_waiting_for_others() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open_with(&dir.path().join("q.db"), Durability::Log).expect("open");
        // Nothing else is written meanwhile: a writer that waited for company (or for a
        // timer of any length worth having) would not answer these in time.
        let start = std::time::Instant::now();
        for i in 0..50 {
            let job = new_job(&format!("k{i}"), &format!("t{i}"), 1);
            let answer = tokio::time::timeout(std::time::Duration::from_secs(10), q.submit(job));
            assert!(answer.await.expect("answered in time").expect("submit").created);
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "took {:?}", start.elapsed());
    }

    #[tokio::test]
    async fn durability_sets_the_synchronous_pragma() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (durability, expected) in [(Durability::Fsync, 2), (Durability::Log, 1)] {
            let q =
                Queue::open_with(&dir.path().join(format!("{}.db", durability.as_str())), durability).expect("open");
            assert_eq!(q.durability(), durability);
            let level: i64 =
                q.call_writing(|c| Ok(c.query_row("PRAGMA synchronous", [], |r| r.get(0))?)).await.expect("pragma");
            assert_eq!(level, expected, "{durability:?}");
        }
        let q = Queue::open(&dir.path().join("default.db")).expect("open");
        assert_eq!(q.durability(), Durability::Fsync);
        let stable = q
            .call(|c| Ok(c.db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG)?))
            .await
            .expect("db_config");
        assert!(stable, "plans must not depend on bound values (no re-prepare per binding)");
        let stable = q
            .call_writing(|c| Ok(c.db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG)?))
            .await
            .expect("db_config");
        assert!(stable, "the writer's plans too");
        // The reading connection reads and refuses to write.
        let n: i64 = q.call(|c| Ok(c.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0))?)).await.expect("read");
        assert_eq!(n, 0);
        assert!(q.call(|c| Ok(c.execute("DELETE FROM jobs", [])?)).await.is_err(), "a write on the reading connection");
    }

    #[tokio::test]
    async fn dropping_the_queue_stops_its_writer_after_answering() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.db");
        let q = Queue::open(&path).expect("open");
        let id = q.submit(new_job("k1", "t1", 1)).await.expect("submit").job_id;
        let writer = Arc::downgrade(&q.writer);
        drop(q);
        assert!(writer.upgrade().is_none());
        let q = Queue::open(&path).expect("reopen");
        assert_eq!(q.get(id).await.expect("get").expect("kept").state, JobState::Idle);
    }

    #[tokio::test]
    async fn a_batch_that_fills_the_disk_answers_every_write_it_stored_nothing_of_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = Queue::open(&dir.path().join("q.db")).expect("open");
        q.call_writing(|c| Ok(c.execute_batch("CREATE TABLE fill (n INTEGER, b BLOB)")?)).await.expect("table");
        let pages = q.page_count().await.expect("pages");
        q.set_max_page_count(Some(pages)).await.expect("cap");
        let put = |n: i64, bytes: usize| {
            move |tx: &Connection| -> Result<i64, QueueError> {
                tx.execute("INSERT INTO fill (n, b) VALUES (?1, zeroblob(?2))", params![n, bytes as i64])?;
                Ok(n)
            }
        };
        let mut pending = std::collections::VecDeque::new();
        let mut answers = Vec::new();
        for (n, bytes) in [(1, 10), (2, 1 << 20), (3, 10)] {
            let (w, answer) = write_request(put(n, bytes));
            pending.push_back(w);
            answers.push((n, answer));
        }
        // SQLite rolls the whole transaction back on SQLITE_FULL: what ran before in the batch
        // is answered with the full disk too, and what had not run yet waits for the next one.
        for _ in 0..3 {
            if !pending.is_empty() {
                commit_batch(&q.conn, &mut pending, &std::sync::atomic::AtomicU64::new(0));
            }
        }
        assert!(pending.is_empty());
        let mut stored_expected = Vec::new();
        for (n, answer) in answers {
            match answer.await.expect("answered") {
                Ok(got) => stored_expected.push(got),
                Err(e) => assert!(e.is_disk_full(), "write {n}: {e}"),
            }
        }
        assert!(!stored_expected.contains(&2), "the megabyte cannot fit");
        let stored: Vec<i64> = q
            .call(|c| {
                let mut stmt = c.prepare("SELECT n FROM fill ORDER BY n")?;
                Ok(stmt.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?)
            })
            .await
            .expect("read");
        assert_eq!(stored, stored_expected, "exactly the writes answered Ok are stored");
        // The writer thread survived: once there is room, writes pass through it again.
        q.set_max_page_count(None).await.expect("uncap");
        assert!(q.submit(new_job("after", "t-after", 1)).await.expect("room again").created);
    }
}
