//! Errors of the job store: [`QueueError`], and whether SQLite said the disk is full.
//!
//! Must not know: HTTP (its answer to a client is [`crate::failure::ApiFailure`]).

/// Why an operation on the job store failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The submit token is revoked (by its `jti`, owner or issuer).
    #[error("token revoked: {reason}")]
    Revoked {
        /// The revocation's reason.
        reason: String,
    },
    /// The submit token has no use left.
    #[error("token already used ({uses} of {jobs} jobs)")]
    TokenUsed {
        /// Jobs already submitted with it.
        uses: u64,
        /// Jobs it allows.
        jobs: u32,
    },
    /// The owner already has as many idle (or held) jobs as the scheduler allows
    /// ([`crate::Config::max_idle_jobs_per_owner`]); transient.
    #[error("owner {owner} has {idle} idle jobs, the limit is {max}; try again later")]
    TooManyIdle {
        /// The token's subject.
        owner: String,
        /// Their idle and held jobs now.
        idle: u64,
        /// The limit.
        max: u64,
    },
    /// No job has this id.
    #[error("job {id:?} not found")]
    JobNotFound {
        /// The id asked for.
        id: String,
    },
    /// The job's state does not allow what was asked (an admin action); the message says why.
    #[error("{0}")]
    Conflict(String),
    /// A stored job could not be decoded.
    #[error("stored job {id} is corrupt: {reason}")]
    Corrupt {
        /// The job.
        id: String,
        /// What did not decode.
        reason: String,
    },
    /// The stored database is of a schema this build does not know.
    #[error("database schema version {found} is newer than this build's {supported}")]
    SchemaTooNew {
        /// What the file says.
        found: i64,
        /// What we write.
        supported: i64,
    },
    /// SQLite said no.
    #[error("database: {0}")]
    Sqlite(rusqlite::Error),
    /// The audit trail kept in the store could not be written or read.
    #[error("audit trail: {0}")]
    Audit(htfaas_functions::audit::AuditError),
    /// A JSON column could not be written.
    #[error("encoding: {0}")]
    Json(serde_json::Error),
    /// A previous holder of the connection panicked.
    #[error("database connection lock poisoned")]
    Poisoned,
    /// The database file could not be made private (0600), or the macaroon seal key not
    /// read or created.
    #[error("{0}")]
    Private(String),
    /// A stored macaroon could not be sealed or opened.
    #[error(transparent)]
    Seal(#[from] crate::seal::SealError),
    /// The batch of writes this write was part of could not be committed (nothing of it is
    /// stored); the message says why.
    #[error("database: the batch of writes was not committed: {0}")]
    Batch(String),
    /// The store's disk (or its file's size limit) is full (SQLite's `SQLITE_FULL`, which it
    /// also answers for `ENOSPC`): the write, and the rest of its batch when SQLite rolled the
    /// batch back, stored nothing; what was committed before is intact and reads still work.
    /// Transient: the same write passes once there is room again.
    #[error("the scheduler's disk is full: {0}")]
    DiskFull(String),
    /// The blocking task running the query died.
    #[error("database task failed: {0}")]
    Task(String),
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<rusqlite::Error> for QueueError {
    fn from(e: rusqlite::Error) -> QueueError {
        QueueError::Sqlite(e)
    }
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<htfaas_functions::audit::AuditError> for QueueError {
    fn from(e: htfaas_functions::audit::AuditError) -> QueueError {
        QueueError::Audit(e)
    }
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<serde_json::Error> for QueueError {
    fn from(e: serde_json::Error) -> QueueError {
        QueueError::Json(e)
    }
}

impl QueueError {
    /// Whether SQLite said the disk is full: `SQLITE_FULL`, from the store or its audit trail.
    pub fn is_disk_full(&self) -> bool {
        match self {
            QueueError::DiskFull(_) => true,
            QueueError::Sqlite(e) | QueueError::Audit(htfaas_functions::audit::AuditError::Db(e)) => is_disk_full(e),
            _ => false,
        }
    }

    /// `self`, as [`QueueError::DiskFull`] when [`QueueError::is_disk_full`].
    pub fn classified(self) -> QueueError {
        match self {
            QueueError::DiskFull(_) => self,
            e if e.is_disk_full() => QueueError::DiskFull(e.to_string()),
            e => e,
        }
    }
}

/// Whether `e` is SQLite's `SQLITE_FULL` ("database or disk is full").
pub fn is_disk_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}
