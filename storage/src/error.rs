//! The one error type of request handling: each variant is an HTTP status, its message the
//! body (`{"error": "…"}`, the [`ApiError`] shape every htfaas API uses).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use htfaas_functions::proto::ApiError;

use crate::macaroons::VerifyError;
use crate::paths::PathError;

/// A refused or failed request. The message names the check that failed and never contains
/// a credential.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// 400: malformed request (path, body, caveats).
    #[error("{0}")]
    BadRequest(String),
    /// 401: no credential, or one that is not valid.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: a valid credential that does not allow this request.
    #[error("{0}")]
    Forbidden(String),
    /// 404: no such file.
    #[error("{0}")]
    NotFound(String),
    /// 405: method not served.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 409: the namespace is in the way (a file where a directory is needed, or the reverse).
    #[error("{0}")]
    Conflict(String),
    /// 413: upload larger than `max-upload:` or request body too large.
    #[error("{0}")]
    TooLarge(String),
    /// 415: wrong `Content-Type` for a macaroon request.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 503: the file is stored but the billing event could not be published.
    #[error("{0}")]
    Unavailable(String),
    /// 507: the disk is full (`ENOSPC`), a quota is exhausted (`EDQUOT`) or the file exceeds
    /// the largest file this storage may write (`EFBIG`): nothing was stored.
    #[error("{0}")]
    InsufficientStorage(String),
    /// 500: I/O or other failure on our side (details are logged, not sent).
    #[error("internal error: {0}")]
    Internal(String),
}

impl HttpError {
    /// The status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            HttpError::BadRequest(_) => StatusCode::BAD_REQUEST,
            HttpError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            HttpError::Forbidden(_) => StatusCode::FORBIDDEN,
            HttpError::NotFound(_) => StatusCode::NOT_FOUND,
            HttpError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            HttpError::Conflict(_) => StatusCode::CONFLICT,
            HttpError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            HttpError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            HttpError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            HttpError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            HttpError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// Whether `e` says the storage has no room: disk full (`ENOSPC`), quota exhausted (`EDQUOT`),
/// file size limit reached (`EFBIG`, e.g. `RLIMIT_FSIZE`).
pub fn is_out_of_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG))
}

/// The answer to an I/O failure while `what` (a verb phrase: "write the upload file") for the
/// namespace path `path`: [`HttpError::InsufficientStorage`] (507) with a message the client can
/// act on when the storage has no room ([`is_out_of_space`]), else [`HttpError::Internal`] (500,
/// details only in the log).
pub fn io_error(what: &str, path: &str, e: &std::io::Error) -> HttpError {
    if is_out_of_space(e) {
        tracing::error!(path, "out of space: failed to {what}: {e}");
        return HttpError::InsufficientStorage(format!(
            "insufficient storage: {path} was not stored ({e}); nothing was kept, retry later"
        ));
    }
    tracing::error!(path, "failed to {what}: {e}");
    HttpError::Internal(what.to_owned())
}

impl From<PathError> for HttpError {
    fn from(e: PathError) -> Self {
        HttpError::BadRequest(e.to_string())
    }
}

impl From<VerifyError> for HttpError {
    fn from(e: VerifyError) -> Self {
        match e {
            VerifyError::Invalid(_) => HttpError::Unauthorized(e.to_string()),
            VerifyError::Denied(_) => HttpError::Forbidden(e.to_string()),
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(http.response.status_code = status.as_u16(), "{self}");
        } else {
            tracing::debug!(http.response.status_code = status.as_u16(), "{self}");
        }
        let mut resp = (status, axum::Json(ApiError { error: self.to_string() })).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"htfaas-storage\", Bearer realm=\"htfaas-storage\""),
            );
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full disk, an exhausted quota or a file size limit answers 507 with a message
    /// naming the path and the cause; any other I/O failure stays a 500 that says nothing more.
    #[test]
    fn out_of_space_is_507_with_a_clear_message_and_other_io_errors_are_500() {
        for (errno, cause) in [
            (libc::ENOSPC, "No space left on device"),
            (libc::EDQUOT, "Disk quota exceeded"),
            (libc::EFBIG, "File too large"),
        ] {
            let e = io_error("write the upload file", "/data/a.dat", &std::io::Error::from_raw_os_error(errno));
            assert_eq!(e.status(), StatusCode::INSUFFICIENT_STORAGE, "{errno}");
            assert_eq!(
                e.to_string(),
                format!(
                    "insufficient storage: /data/a.dat was not stored ({cause} (os error {errno})); \
                     nothing was kept, retry later"
                )
            );
        }
        for e in [std::io::Error::from_raw_os_error(libc::EIO), std::io::Error::other("no errno")] {
            let e = io_error("write the upload file", "/data/a.dat", &e);
            assert_eq!(
                (e.status(), e.to_string()),
                (StatusCode::INTERNAL_SERVER_ERROR, "internal error: write the upload file".into())
            );
        }
    }
}
