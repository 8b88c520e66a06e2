//! Errors: [`QueueError`] from the job store, and [`ApiFailure`], the one HTTP error answer.
//!
//! Every HTTP error body is an [`ApiError`] whose message names the check that failed.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use htfaas_functions::proto::ApiError;

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
    Sqlite(#[from] rusqlite::Error),
    /// The audit trail kept in the store could not be written or read.
    #[error("audit trail: {0}")]
    Audit(#[from] htfaas_functions::audit::AuditError),
    /// A JSON column could not be written.
    #[error("encoding: {0}")]
    Json(#[from] serde_json::Error),
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

/// An HTTP error answer: a status and an [`ApiError`] body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    /// HTTP status.
    pub status: StatusCode,
    /// Message naming the failed check.
    pub message: String,
}

impl ApiFailure {
    /// 400: the request is malformed or invalid.
    pub fn bad_request(message: impl Into<String>) -> ApiFailure {
        ApiFailure { status: StatusCode::BAD_REQUEST, message: message.into() }
    }

    /// 401: no credential, or one that does not verify.
    pub fn unauthorized(message: impl Into<String>) -> ApiFailure {
        ApiFailure { status: StatusCode::UNAUTHORIZED, message: message.into() }
    }

    /// 403: the credential verifies but does not allow this.
    pub fn forbidden(message: impl Into<String>) -> ApiFailure {
        ApiFailure { status: StatusCode::FORBIDDEN, message: message.into() }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> ApiFailure {
        ApiFailure { status: StatusCode::NOT_FOUND, message: message.into() }
    }

    /// 409: the target's state does not allow this.
    pub fn conflict(message: impl Into<String>) -> ApiFailure {
        ApiFailure { status: StatusCode::CONFLICT, message: message.into() }
    }

    /// 429: a limit is reached for now; the same request may pass later.
    pub fn too_many_requests(message: impl Into<String>) -> ApiFailure {
        ApiFailure { status: StatusCode::TOO_MANY_REQUESTS, message: message.into() }
    }

    /// 507: the scheduler's disk is full; nothing was stored, the same request may pass later.
    /// Logged here, where it is handled: it needs an operator.
    pub fn insufficient_storage(message: impl Into<String>) -> ApiFailure {
        let message = message.into();
        tracing::error!("refused a write: {message}");
        ApiFailure { status: StatusCode::INSUFFICIENT_STORAGE, message }
    }

    /// 500; the cause is logged here, where it is handled, and not shown to the client.
    pub fn internal(what: &str, e: &dyn std::fmt::Display) -> ApiFailure {
        tracing::error!("failed to {what}: {e}");
        ApiFailure { status: StatusCode::INTERNAL_SERVER_ERROR, message: format!("internal error: could not {what}") }
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

impl From<QueueError> for ApiFailure {
    fn from(e: QueueError) -> ApiFailure {
        match e {
            QueueError::TokenUsed { .. } => ApiFailure::unauthorized(e.to_string()),
            QueueError::Revoked { .. } => ApiFailure::forbidden(e.to_string()),
            QueueError::TooManyIdle { .. } => ApiFailure::too_many_requests(e.to_string()),
            QueueError::JobNotFound { .. } => ApiFailure::not_found(e.to_string()),
            QueueError::Conflict(message) => ApiFailure::conflict(message),
            QueueError::DiskFull(_) => ApiFailure::insufficient_storage(e.to_string()),
            other => ApiFailure::internal("access the job store", &other),
        }
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        (self.status, Json(ApiError { error: self.message })).into_response()
    }
}
