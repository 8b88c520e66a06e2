//! The one error answer of the gateway's HTTP API: a status and an
//! [`htfaas_functions::proto::ApiError`] body ([`HttpError`]), and how a registry error maps
//! to one.
//!
//! Must not know: routes, handlers, credentials (their checks return it, it does not check).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use htfaas_functions::RegistryError;
use htfaas_functions::proto::ApiError;

/// An error answer: status plus [`ApiError`] body.
#[derive(Debug)]
pub struct HttpError(pub(crate) StatusCode, pub(crate) String);

impl HttpError {
    /// An answer of `status` saying `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> HttpError {
        HttpError(status, message.into())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        (self.0, Json(ApiError { error: self.1 })).into_response()
    }
}

impl From<RegistryError> for HttpError {
    fn from(e: RegistryError) -> Self {
        let status = match &e {
            RegistryError::Manifest(_)
            | RegistryError::NotWasm(_)
            | RegistryError::NotImage(_)
            | RegistryError::UnknownModule(_) => StatusCode::BAD_REQUEST,
            RegistryError::InUse(_) => StatusCode::CONFLICT,
            RegistryError::Grant(_) => StatusCode::BAD_REQUEST,
            RegistryError::NotFound(_) | RegistryError::NoSuchVersion(..) => StatusCode::NOT_FOUND,
            RegistryError::QuotaExceeded(_) | RegistryError::NotOwner(..) | RegistryError::IdentityTaken(_) => {
                StatusCode::FORBIDDEN
            }
            RegistryError::Db(_) | RegistryError::Io(_) | RegistryError::Corrupt(_) => {
                tracing::error!("registry failure: {e}");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        HttpError(status, e.to_string())
    }
}
