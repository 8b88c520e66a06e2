//! Durable firings: (event, function) pairs waiting to become jobs, and the dispatcher that
//! turns them into jobs (`crate::dispatch`).
//!
//! # Exactly once
//!
//! The ingest loop does not submit jobs itself: for each event it inserts one *firing* per
//! matching function into a SQLite table (WAL; `synchronous=FULL`, or `NORMAL` with
//! [`Durability::Log`](htfaas_functions::store::Durability::Log)), and acks the JetStream
//! message only once the transaction holding them is committed. That transaction is a *group
//! commit* ([`Firings::insert_batch`]): the firings of every event of one batch of messages
//! (what the consumer had at hand, see [`crate::ingest`]), one fsync for all, each event
//! treated as it would be alone and in arrival order — its key checked against the table and
//! the batch's earlier events (two copies in one batch make one firing), its debounce
//! superseding earlier pending firings (of the batch too), its cause looked up for the loop
//! guard. It is all or nothing: when it fails no firing of the batch is written and no
//! message of it is acked; they come again. The table's key is
//! `(event_key, function, digest)`: the event's identity ([`StorageEvent::id`], e.g. for dCache
//! `dcache-billing:write:<pnfsid>/<door session>`), the function's name and its module digest.
//! A second copy of the event (a JetStream redelivery, a duplicate message from the storage, a
//! redelivery after a gateway restart) finds the key taken and is dropped there, before any
//! macaroon is asked for. A replay (`fire_all(.., Some(id))`) uses the event key
//! `replay:<id>#<event id>`, so it runs again on purpose, once per replay.
//!
//! Keys are kept for `dedupe_window_s` after the firing was made (default 7 days: the events
//! stream's `max_age`, so every redelivery the stream can still make falls inside the window),
//! then pruned in bounded batches. Only finished firings are pruned: a firing still pending is
//! kept whatever its age. Behind this table the scheduler still dedupes on
//! `<event id>#<function>@<digest>` (forever), so a firing re-submitted after a crash, or an
//! event seen again after its window, still starts no second job.
//!
//! # States
//!
//! `pending` (waits until `not_before_ms`) → `submitting` (claimed by the dispatcher: macaroons
//! and submit in flight) → `submitted` (with the scheduler's job id) | `refused` (with the
//! reason; for good) | `pending` again (a transient failure: storage or scheduler unreachable
//! or answering 5xx — 507 from a scheduler whose disk is full among them — or 429, or a
//! macaroon request unanswered within [`crate::storage_client::MACAROON_TIMEOUT`]; retried
//! after an exponential backoff of 0.5 s × 2^(attempts − 1), at most
//! [`MAX_BACKOFF_MS`]). `pending` → `superseded` (debounce, below; with the superseding
//! firing's `seq`). A gateway that stops with firings `submitting` puts them back to `pending`
//! when it opens the table again: they are submitted again, and the scheduler's dedupe key keeps
//! that to one job.
//!
//! # Rate and debounce
//!
//! - `trigger.rate` (`per_s`, `burst`): a token bucket per function, in the dispatcher's memory.
//!   A firing that finds no token is not dropped: it is given the time its token will be there
//!   (`not_before_ms`, the token reserved for it) and waits. The buckets start full when the
//!   gateway starts.
//! - `trigger.debounce_s` = D: a firing waits D seconds before it may run. A new firing for the
//!   same function and path that arrives while one is still pending supersedes it (the older is
//!   marked `superseded` and never runs), and itself waits D from its arrival. A burst of writes
//!   to one file thus starts one job, on the last event to arrive, D after the burst ends. A
//!   firing already `submitting` is not superseded: the next one waits its own D and runs too.
//!
//! # Loop guard
//!
//! Before a job is submitted, the identifier of the write macaroon obtained for it is recorded
//! in `provenance` with the job's [`Cause`]: its function, digest, event, and the chain of
//! functions that led to it (its own event's chain, then itself). The storage names the
//! macaroon that authorized an upload in the billing `subject` (`MacaroonPrincipal[<id>]`,
//! [`StorageEvent::macaroon`]), so the event of a file a job wrote finds that cause when its
//! firings are inserted: no function of the chain fires on it (nor anything once the chain is
//! [`MAX_CHAIN`] long), every other matching function does, and its firing (and so its job's
//! `EventRef::caused_by`) records the cause. Sources that do not name the macaroon (XRootD,
//! SSE, CloudEvents) still have the older rule in the ingest: a function never fires on a file
//! in its own output directory. Provenance is kept as long as firing keys.
//!
//! # Audit trail
//!
//! The gateway's audit trail ([`crate::audit`]) lives in this database, in its own `audit_*`
//! tables, installed at open. Each decision here is recorded in the decision's transaction:
//! an event's firings with its `event.matched` record ([`Firings::insert_batch`]), a job's
//! write-macaroon provenance with its `token.minted` and `macaroons.obtained` records
//! ([`Write::Provenance`]), a firing refused for good with its `job.refused`
//! ([`Outcome::Refused`]). The dispatcher signs a checkpoint of the trail when one is due
//! (checked every second) and at shutdown.
//!
//! # Concurrency
//!
//! One connection behind a mutex, used from `spawn_blocking` and the writer thread. A thread of
//! its own copies committed WAL pages into the file
//! ([`htfaas_functions::store::Checkpointer`]), so no commit holds the lock for a checkpoint. The
//! dispatcher claims ready firings (`pending`, `not_before_ms` ≤ now; in turn by owner, then by
//! function within an owner, each function's oldest first) up to `max_in_flight`, runs each as
//! its own task (so one slow storage answer does not hold back the others) and is woken by
//! every insert, every finished task and a periodic tick. The tasks' writes (provenance before
//! the submit, the outcome after it) go through one group commit ([`FiringWriter`]): many
//! firings' writes in one transaction, each in a savepoint of its own, each task answered once
//! its write is committed.
//!
//! Every transaction begins and ends through the statement cache
//! ([`htfaas_functions::store::begin_immediate`]), as every hot statement runs.
//!
//! This module is the table: [`Firings`] (`table`), its schema and migrations (`schema`), the
//! rate buckets (`bucket`), the dispatcher's batched writes and their group commit (`writer`),
//! the dead-letter list beside it (`dlq`: refusals entered in their own transaction,
//! failed jobs and undeliverable events, re-drives and drops). Must not know: NATS, HTTP, the storage or the scheduler (the
//! dispatcher, `crate::dispatch`, turns claimed firings into jobs).

mod bucket;
mod dlq;
mod groups;
mod insert;
mod rows;
mod schema;
mod table;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_groups;
mod waiting;
mod writer;

pub use bucket::TokenBucket;
pub use dlq::{DeadLetterFilter, DlqError, MAX_LIST};
pub use groups::{OpenGroup, Swept};
pub use schema::SCHEMA_VERSION;
pub use table::Firings;
pub use writer::{FiringWriter, OUTCOME_LINGER, Outcome, WRITE_BATCH, Write, Written};

use htfaas_functions::FunctionRecord;
use htfaas_functions::audit::AuditError;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::Cause;

pub use htfaas_functions::store::now_ms;

/// Longest chain of functions (`A` writes what fires `B`, …) the loop guard lets grow; an event
/// whose cause's chain is this long fires nothing more.
pub const MAX_CHAIN: usize = 16;

/// Longest wait between two attempts of a firing that failed transiently.
pub const MAX_BACKOFF_MS: u64 = 60_000;
/// First retry delay after a transient failure.
const BASE_BACKOFF_MS: u64 = 500;
/// Most finished firings deleted per prune.
pub const PRUNE_BATCH: usize = 10_000;
/// Most rows one claim looks at (rate-delayed ones included).
const CLAIM_SCAN: usize = 1_000;

/// Why the firing table failed.
#[derive(Debug, thiserror::Error)]
pub enum FiringError {
    /// SQLite.
    #[error("firing store: {0}")]
    Sqlite(rusqlite::Error),
    /// A record or event that could not be encoded.
    #[error("firing store: encode: {0}")]
    Encode(serde_json::Error),
    /// The file was written by a newer gateway.
    #[error("firing store: schema version {found} is newer than this gateway's {supported}")]
    SchemaTooNew {
        /// Version in the file.
        found: i64,
        /// Version this build writes.
        supported: i64,
    },
    /// The blocking task failed or the lock was poisoned.
    #[error("firing store: {0}")]
    Task(String),
    /// The audit trail kept in the same file.
    #[error("firing store: audit trail: {0}")]
    Audit(AuditError),
    /// The file could not be made private (created 0600, or tightened to it).
    #[error("firing store: {0}: {1}")]
    Io(String, std::io::Error),
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<rusqlite::Error> for FiringError {
    fn from(e: rusqlite::Error) -> FiringError {
        FiringError::Sqlite(e)
    }
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<serde_json::Error> for FiringError {
    fn from(e: serde_json::Error) -> FiringError {
        FiringError::Encode(e)
    }
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<AuditError> for FiringError {
    fn from(e: AuditError) -> FiringError {
        FiringError::Audit(e)
    }
}

impl FiringError {
    /// Whether the write failed because the disk (or the database's size limit) is full
    /// (`SQLITE_FULL`): the batch was rolled back and may go through once there is room.
    pub fn is_disk_full(&self) -> bool {
        let sqlite = match self {
            FiringError::Sqlite(e) | FiringError::Audit(AuditError::Db(e)) => e,
            _ => return false,
        };
        sqlite.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
    }
}

/// Where a firing is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FiringState {
    /// Waits for `not_before_ms` and the dispatcher.
    Pending,
    /// Claimed by the dispatcher: macaroons and submit in flight.
    Submitting,
    /// The scheduler holds its job.
    Submitted,
    /// Refused for good (storage or scheduler said no).
    Refused,
    /// A later firing for the same function and path replaced it (debounce).
    Superseded,
}

impl FiringState {
    fn as_str(self) -> &'static str {
        match self {
            FiringState::Pending => "pending",
            FiringState::Submitting => "submitting",
            FiringState::Submitted => "submitted",
            FiringState::Refused => "refused",
            FiringState::Superseded => "superseded",
        }
    }

    fn parse(s: &str) -> Option<FiringState> {
        Some(match s {
            "pending" => FiringState::Pending,
            "submitting" => FiringState::Submitting,
            "submitted" => FiringState::Submitted,
            "refused" => FiringState::Refused,
            "superseded" => FiringState::Superseded,
            _ => return None,
        })
    }
}

/// One firing as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    /// Row id: arrival order.
    pub seq: i64,
    /// The event's identity (`replay:<id>#<event id>` for a replay's firings).
    pub event_key: String,
    /// The function's name.
    pub function: String,
    /// Its module digest.
    pub digest: String,
    /// The replay this firing belongs to, if any.
    pub replay: Option<String>,
    /// Where it is.
    pub state: FiringState,
    /// The scheduler's job id, once submitted.
    pub job_id: Option<String>,
    /// Why it was refused, or the last transient failure.
    pub reason: Option<String>,
    /// The firing that superseded it (debounce).
    pub superseded_by: Option<i64>,
    /// Not dispatched before this time (Unix ms).
    pub not_before_ms: u64,
    /// Submit attempts so far.
    pub attempts: u32,
    /// When it was made (Unix ms).
    pub created_ms: u64,
    /// When its key may be forgotten (Unix ms).
    pub expires_ms: u64,
}

/// A firing claimed for dispatch: what the job is made from.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// Row id.
    pub seq: i64,
    /// The function version that matched.
    pub function: FunctionRecord,
    /// The event.
    pub event: StorageEvent,
    /// The replay, if any.
    pub replay: Option<String>,
    /// The job whose output the event is about, if one is (the loop guard's provenance).
    pub cause: Option<Cause>,
    /// When the gateway stored the firing (Unix ms): the event's arrival, for the job's wait
    /// in the gateway.
    pub created_ms: u64,
    /// A collecting function's firing: the paths of its group's other files, which the job
    /// reads beside its input (sorted). Empty otherwise.
    pub members: Vec<String>,
}

/// What inserting one event's firings did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Inserted {
    /// New firings.
    pub queued: u64,
    /// Firings whose key was already there (dropped).
    pub deduplicated: u64,
    /// Older pending firings superseded by the new ones (debounce).
    pub superseded: u64,
    /// Functions not fired because the event is about a file written by a job of theirs, or of
    /// a function up the same chain (the loop guard).
    pub loop_guarded: u64,
    /// Collecting functions whose group the file joined, waiting for more.
    pub collected: u64,
    /// Collecting functions whose group kept the file out (another writer's).
    pub not_collected: u64,
}

impl Inserted {
    /// Counts what became of one function on the event.
    pub fn count(&mut self, fired: &crate::audit::Fired) {
        use crate::audit::Fired;
        match fired {
            Fired::Queued | Fired::Completed(_) | Fired::Ungrouped => self.queued += 1,
            Fired::Duplicate => self.deduplicated += 1,
            Fired::LoopGuarded => self.loop_guarded += 1,
            Fired::Collected(_) => self.collected += 1,
            Fired::OtherWriter(_) => self.not_collected += 1,
        }
    }
}

/// One event's firings to insert, as one element of a [`Firings::insert_batch`].
#[derive(Debug, Clone)]
pub struct NewFirings {
    /// The event.
    pub event: StorageEvent,
    /// The functions it fires (matched, before the loop guard).
    pub functions: Vec<FunctionRecord>,
    /// The replay run, for a replay's firings (keys of their own).
    pub replay: Option<String>,
}

/// What one claim did.
#[derive(Debug, Default)]
pub struct Claim {
    /// Firings now `submitting`, to dispatch.
    pub ready: Vec<Claimed>,
    /// Firings that found no rate token and were given a later time.
    pub rate_delayed: u64,
    /// Rows that could not be read back (refused).
    pub unreadable: u64,
}

/// Retry delay after the `attempts`-th transient failure.
pub fn backoff_ms(attempts: u32) -> u64 {
    BASE_BACKOFF_MS.saturating_mul(1u64 << attempts.saturating_sub(1).min(20)).min(MAX_BACKOFF_MS)
}

/// The event key of `event` (and of `replay`, when it is one).
pub fn event_key(event: &StorageEvent, replay: Option<&str>) -> String {
    match replay {
        // The replay first: an event id is `<source kind>:…`, so no id reads as a replay's key.
        Some(r) => format!("replay:{r}#{}", event.id),
        None => event.id.clone(),
    }
}
