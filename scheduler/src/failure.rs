//! [`ApiFailure`], the one HTTP error answer, and how a store error becomes one.
//!
//! Every HTTP error body is an [`ApiError`] whose message names the check that failed.
//!
//! Must not know: the store's workings (it maps [`QueueError`]'s variants), handlers or routes.

use crate::error::QueueError;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use htfaas_functions::proto::ApiError;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_insufficient_storage_with_the_stores_message() {
        let full = QueueError::DiskFull("database or disk is full".into());
        let answer = ApiFailure::from(full);
        assert_eq!(answer.status, StatusCode::INSUFFICIENT_STORAGE);
        assert!(answer.message.starts_with("the scheduler's disk is full: "), "{}", answer.message);
    }
}
