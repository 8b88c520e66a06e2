//! What htfaas's SQLite stores share: the stepwise `PRAGMA user_version` migration each store
//! (the scheduler's job queue, the gateway's firing table) runs when it opens its file, and the
//! conversions of times and counts to SQLite integers, and the modes of state files: a
//! directory 0700, a database (with its `-wal` and `-shm`) 0600 ([`prepare_private_db`]); with
//! `db`, the statement-cached transaction every hot write runs in ([`CachedTx`]) and the thread
//! that checkpoints a store's WAL off its writer ([`Checkpointer`]).

#[cfg(feature = "db")]
use rusqlite::{Connection, TransactionBehavior};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What "written" means before a component acknowledges work (a submit, an EP's report, an
/// upload, a batch of events): the same choice for every store of a deployment.
///
/// - [`Durability::Fsync`] (the default): an fsync is behind every acknowledgement, so the work
///   survives a power cut. SQLite runs WAL with `synchronous=FULL`; the storage fsyncs each
///   upload and its directory. Group commit (one fsync per batch) keeps this fast under load.
/// - [`Durability::Log`]: the work is in the component's log (written, not fsynced) before it
///   acknowledges, so it survives SIGKILL of any process but not a power cut: what JetStream's
///   default (`sync_interval: 2m`) promises. SQLite runs WAL with `synchronous=NORMAL`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// fsync before every acknowledgement.
    #[default]
    Fsync,
    /// Written to the log before every acknowledgement; fsynced by the OS later.
    Log,
}

impl Durability {
    /// The SQLite `synchronous` pragma for a WAL database.
    pub fn sqlite_synchronous(self) -> &'static str {
        match self {
            Durability::Fsync => "FULL",
            Durability::Log => "NORMAL",
        }
    }

    /// Whether files must be fsynced before they are acknowledged.
    pub fn fsync_files(self) -> bool {
        self == Durability::Fsync
    }

    /// The lower-case name (`fsync`, `log`).
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Fsync => "fsync",
            Durability::Log => "log",
        }
    }
}

/// A name that is not a [`Durability`] (what was given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown durability {0:?}: use fsync or log")]
pub struct UnknownDurability(pub String);

impl std::str::FromStr for Durability {
    type Err = UnknownDurability;
    fn from_str(s: &str) -> Result<Durability, UnknownDurability> {
        match s {
            "fsync" => Ok(Durability::Fsync),
            "log" => Ok(Durability::Log),
            other => Err(UnknownDurability(other.to_owned())),
        }
    }
}

/// Creates `dir` and its missing parents with mode 0700 (a state directory: only the
/// component's user may list or enter it). An existing directory is left as it is: it may be
/// shared with something else (the working directory, say); [`make_private`] tightens one.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Writes `bytes` to `path` (created or truncated) readable by its owner only: a key, a token, a
/// secret. The file is opened without following a symbolic link (`O_NOFOLLOW`: a link planted
/// at `path` is an error, never a way to write elsewhere), must be a regular file, and is set
/// to 0600 through the open descriptor before anything is written (an existing file that
/// others could read is tightened first).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::other(format!(
                    "{} is a symbolic link: refusing to write a secret through it",
                    path.display()
                ))
            } else {
                e
            }
        })?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other(format!("{} is not a regular file", path.display())));
    }
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.set_len(0)?;
    f.write_all(bytes)
}

/// Sets `path`'s mode to 0700 for a directory, 0600 for anything else.
pub fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = if std::fs::metadata(path)?.is_dir() { 0o700 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Makes the SQLite database at `path` readable by its owner only, before it is opened:
/// creates it empty with mode 0600 if it is missing (SQLite gives its `-wal` and `-shm` files
/// the database file's mode, whatever the umask), and tightens an existing one and its `-wal`
/// and `-shm` to 0600 (a database made by an older build; a file it may not change is
/// logged and left). The directory is made with [`create_private_dir`] if missing.
pub fn prepare_private_db(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_private_dir(dir)?;
    }
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = Path::new(&file);
        match make_private(file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(file = %file.display(), "failed to make the database private: {e}"),
        }
    }
    Ok(())
}

#[cfg(feature = "db")]
/// One row of `sql` through the connection's statement cache.
pub fn row<T, P: rusqlite::Params, F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>>(
    conn: &Connection,
    sql: &str,
    params: P,
    f: F,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(params, f)
}

#[cfg(feature = "db")]
/// Runs `sql` through the connection's statement cache: the stores' hot writes run thousands
/// of times a second, and parsing their SQL each time was a tenth of the scheduler's CPU.
pub fn exec<P: rusqlite::Params>(conn: &Connection, sql: &str, params: P) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

#[cfg(feature = "db")]
/// An `IMMEDIATE` transaction whose `BEGIN`, `COMMIT` and `ROLLBACK` go through the
/// connection's statement cache ([`begin_immediate`]). rusqlite's `Transaction` parses its
/// `BEGIN …`/`COMMIT` with `execute_batch` each time, which was 3 % of the gateway's CPU.
/// Derefs to the connection; rolled back when dropped without [`CachedTx::commit`].
pub struct CachedTx<'c> {
    conn: &'c Connection,
    open: bool,
}

#[cfg(feature = "db")]
/// Begins an `IMMEDIATE` transaction on `conn` (which must not be in one) through its statement
/// cache.
pub fn begin_immediate(conn: &Connection) -> rusqlite::Result<CachedTx<'_>> {
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    Ok(CachedTx { conn, open: true })
}

#[cfg(feature = "db")]
impl CachedTx<'_> {
    /// Commits. On an error the transaction is rolled back (when SQLite left it open).
    pub fn commit(mut self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.open = false;
        Ok(())
    }
}

#[cfg(feature = "db")]
impl std::ops::Deref for CachedTx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

#[cfg(feature = "db")]
impl Drop for CachedTx<'_> {
    fn drop(&mut self) {
        // A failed COMMIT may have ended the transaction already (SQLite rolls back on some
        // errors): then there is nothing to roll back, and the error says so.
        if self.open && !self.conn.is_autocommit() {
            let rolled_back = self.conn.prepare_cached("ROLLBACK").and_then(|mut s| s.execute([]));
            if let Err(e) = rolled_back {
                tracing::error!("could not roll back a transaction: {e}");
            }
        }
    }
}

/// How often a [`Checkpointer`] copies a store's committed WAL pages into its database file.
pub const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// WAL pages after which a store's writer checkpoints by itself, when its [`Checkpointer`] has
/// not kept up (a reader held old pages, or the checkpointer got no CPU): SQLite's default is
/// 1,000 pages; this bounds the WAL at about 32 MiB of 4 KiB pages.
pub const WRITER_CHECKPOINT_PAGES: u32 = 8_000;

#[cfg(feature = "db")]
/// Copies a WAL store's committed pages into its database file on a thread of its own, so that
/// the store's one writer does not: with SQLite's automatic checkpoint, the commit that crossed
/// 1,000 WAL pages copied them all (and, with `synchronous=FULL`, fsynced the database file)
/// while every write behind it waited. It runs `PRAGMA wal_checkpoint(PASSIVE)` every
/// [`CHECKPOINT_EVERY`] on a connection of its own: a passive checkpoint waits for no reader
/// or writer, and copies only pages no reader may still need, so it never blocks a write. The
/// writer keeps its own checkpoint as a backstop ([`writer_checkpoints_as_backstop`]).
/// Dropping it stops the thread and waits for it.
pub struct Checkpointer {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(feature = "db")]
impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointer").finish_non_exhaustive()
    }
}

#[cfg(feature = "db")]
impl Checkpointer {
    /// Starts checkpointing the WAL store at `path` (already open in WAL mode) with the
    /// `synchronous` setting its writer uses (which says what a checkpoint fsyncs), on a thread
    /// named `name`.
    pub fn start(path: &Path, synchronous: &str, name: &str) -> Result<Checkpointer, CheckpointerError> {
        let conn = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .and_then(|conn| conn.pragma_update(None, "synchronous", synchronous).map(|()| conn))
        .map_err(CheckpointerError::Open)?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let store = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_EVERY) {
                    if let Err(e) = checkpoint_passive(&conn) {
                        tracing::warn!(store, "could not checkpoint the WAL: {e}");
                    }
                }
            })
            .map_err(CheckpointerError::Thread)?;
        Ok(Checkpointer { stop: Some(stop), thread: Some(thread) })
    }
}

#[cfg(feature = "db")]
/// Why a [`Checkpointer`] could not start (the cause shown, not returned).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointerError {
    /// Its connection to the store did not open.
    #[error("open the store for checkpoints: {0}")]
    Open(rusqlite::Error),
    /// Its thread did not start.
    #[error("start the checkpoint thread: {0}")]
    Thread(std::io::Error),
}

#[cfg(feature = "db")]
impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the checkpoint thread panicked");
        }
    }
}

#[cfg(feature = "db")]
/// One passive checkpoint of `conn`'s database: returns the WAL's frames and how many of them
/// are now in the database file.
fn checkpoint_passive(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(1)?, r.get(2)?)))
}

#[cfg(feature = "db")]
/// Sets the writer connection `conn` of a store with a [`Checkpointer`] to checkpoint by itself
/// only past [`WRITER_CHECKPOINT_PAGES`].
pub fn writer_checkpoints_as_backstop(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)
}

#[cfg(feature = "db")]
/// Brings `conn` up to version `migrations.len()` in one IMMEDIATE transaction: `migrations[v]`
/// takes a file from version `v` to `v + 1`, so a new file (version 0) runs them all. A file
/// written by a newer build (a version above `migrations.len()`) is left untouched and answered
/// `Ok(Err(found))`, for the caller to refuse with its own error. `store` names it in logs.
pub fn migrate(conn: &mut Connection, migrations: &[&str], store: &str) -> rusqlite::Result<Result<(), i64>> {
    let supported = i64::try_from(migrations.len()).unwrap_or(i64::MAX);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > supported {
        return Ok(Err(found));
    }
    for (version, step) in migrations.iter().enumerate().skip(usize::try_from(found).unwrap_or(0)) {
        tx.execute_batch(step)?;
        tracing::info!(store, from = version, to = version + 1, "store migrated");
    }
    tx.pragma_update(None, "user_version", supported)?;
    tx.commit()?;
    Ok(Ok(()))
}

/// Unix milliseconds now (defined in [`crate::time`], named here as it always was).
pub use crate::time::now_ms;

/// A `u64` as an SQLite integer (signed): everything stored fits; anything larger is capped.
pub fn db_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// An SQLite integer as a `u64`: a negative one (never written) reads as 0.
pub fn from_db(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

#[cfg(all(test, feature = "db"))]
mod tests {
    use super::*;

    const STEPS: [&str; 2] = ["CREATE TABLE a (x INTEGER);", "ALTER TABLE a ADD COLUMN y INTEGER;"];

    /// The writer of a store with a [`Checkpointer`] leaves its commits in the WAL (its own
    /// checkpoint is only a backstop), and the checkpointer's thread copies them into the
    /// database file; a read still sees every row, and dropping the checkpointer stops it.
    #[test]
    fn the_checkpointer_copies_the_writers_commits_into_the_database_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.db");
        let conn = Connection::open(&path).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL").expect("wal");
        writer_checkpoints_as_backstop(&conn).expect("backstop");
        conn.execute_batch("CREATE TABLE t (b BLOB)").expect("table");
        // About 1,100 pages over 50 commits: past SQLite's own 1,000-page checkpoint, below
        // the backstop.
        for _ in 0..50 {
            let tx = begin_immediate(&conn).expect("begin");
            for _ in 0..20 {
                exec(&tx, "INSERT INTO t (b) VALUES (zeroblob(4000))", []).expect("insert");
            }
            tx.commit().expect("commit");
        }
        let db_bytes = || std::fs::metadata(&path).expect("stat").len();
        assert!(db_bytes() < 100_000, "the writer checkpointed by itself: {} bytes", db_bytes());
        let checkpointer = Checkpointer::start(&path, "FULL", "test-checkpoint").expect("start");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while db_bytes() < 4_000_000 {
            assert!(std::time::Instant::now() < deadline, "no checkpoint: {} bytes", db_bytes());
            std::thread::sleep(CHECKPOINT_EVERY);
        }
        drop(checkpointer);
        let rows: i64 = conn.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0)).expect("count");
        assert_eq!(rows, 1000);
    }

    fn version(conn: &Connection) -> i64 {
        conn.query_row("PRAGMA user_version", [], |r| r.get(0)).expect("version")
    }

    /// A private file is never written through a symbolic link planted at its path, and an
    /// existing file others could read is 0600 once written.
    #[test]
    fn a_private_file_follows_no_link_and_ends_0600() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("profile.json");
        std::fs::write(&path, "old").expect("a 0644 file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_private(&path, b"token").expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"token");
        assert_eq!(std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777, 0o600);
        let victim = dir.path().join("elsewhere");
        std::fs::write(&victim, "untouched").expect("victim");
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&victim, &link).expect("symlink");
        let e = write_private(&link, b"token").expect_err("through a link");
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        assert_eq!(std::fs::read(&victim).expect("read"), b"untouched");
    }

    /// A cached transaction commits what it did, rolls back what it did not commit
    /// (dropped), and its statements are parsed once (the cache holds them).
    #[test]
    fn a_cached_transaction_commits_or_rolls_back() {
        let conn = Connection::open_in_memory().expect("open");
        conn.execute_batch("CREATE TABLE a (x INTEGER)").expect("create");
        let count = |conn: &Connection| conn.query_row("SELECT COUNT(*) FROM a", [], |r| r.get::<_, i64>(0));
        for round in 0..3 {
            let tx = begin_immediate(&conn).expect("begin");
            exec(&tx, "INSERT INTO a (x) VALUES (?1)", [round]).expect("insert");
            assert!(!tx.is_autocommit(), "inside the transaction");
            tx.commit().expect("commit");
            assert!(conn.is_autocommit(), "committed");
            let tx = begin_immediate(&conn).expect("begin");
            exec(&tx, "INSERT INTO a (x) VALUES (?1)", [100 + round]).expect("insert");
            drop(tx);
            assert!(conn.is_autocommit(), "rolled back");
        }
        assert_eq!(count(&conn).expect("count"), 3);
        // A BEGIN inside a transaction is refused, and leaves the outer one alone.
        let tx = begin_immediate(&conn).expect("begin");
        assert!(begin_immediate(&tx).is_err());
        tx.commit().expect("commit");
    }

    #[test]
    fn a_new_file_runs_every_step_an_old_one_the_rest_a_newer_one_is_refused() {
        let mut conn = Connection::open_in_memory().expect("open");
        migrate(&mut conn, &STEPS[..1], "t").expect("sqlite").expect("migrated");
        assert_eq!(version(&conn), 1);
        conn.execute("INSERT INTO a (x) VALUES (7)", []).expect("row");
        migrate(&mut conn, &STEPS, "t").expect("sqlite").expect("migrated");
        assert_eq!(version(&conn), 2);
        let (x, y): (i64, Option<i64>) =
            conn.query_row("SELECT x, y FROM a", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("row");
        assert_eq!((x, y), (7, None), "the row was kept, the new column added");
        migrate(&mut conn, &STEPS, "t").expect("sqlite").expect("nothing to do");
        assert_eq!(migrate(&mut conn, &STEPS[..1], "t").expect("sqlite"), Err(2), "written by a newer build");
        assert_eq!(version(&conn), 2, "left untouched");
    }

    #[test]
    fn a_database_and_its_wal_are_private_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state/new.sqlite");
        prepare_private_db(&path).expect("prepare");
        let conn = Connection::open(&path).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL").expect("wal");
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);").expect("write");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&dir.path().join("state")), 0o700);
        for f in ["new.sqlite", "new.sqlite-wal", "new.sqlite-shm"] {
            assert_eq!(mode(&dir.path().join("state").join(f)), 0o600, "{f}");
        }
        // One made by an older build, world-readable, is tightened.
        let old = dir.path().join("old.sqlite");
        Connection::open(&old).expect("create").execute_batch("CREATE TABLE t (x)").expect("table");
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        prepare_private_db(&old).expect("prepare");
        assert_eq!(mode(&old), 0o600);
    }

    #[test]
    fn a_failing_step_changes_nothing() {
        let mut conn = Connection::open_in_memory().expect("open");
        migrate(&mut conn, &STEPS[..1], "t").expect("sqlite").expect("migrated");
        assert!(migrate(&mut conn, &[STEPS[0], "ALTER TABLE nope ADD COLUMN z;"], "t").is_err());
        assert_eq!(version(&conn), 1);
    }
}
