//! `POST /<path>` with `Content-Type: application/macaroon-request`: issue a macaroon, as
//! dCache's WebDAV door does.
//!
//! - The `Content-Type` must be exactly `application/macaroon-request` (no parameters), else 415.
//! - The caller must be a Basic user with `issue_macaroons` (401 otherwise; 403 without the
//!   flag). Unlike dCache, a macaroon cannot authenticate a macaroon request.
//! - Body (optional, JSON): `{"caveats":["activity:DOWNLOAD","path:/x"],"validity":"PT2H"}`.
//!   Allowed caveats: `activity:`, `path:`, `before:`, `max-upload:` (others 400). `validity`
//!   is an ISO-8601 duration (`PT2H`, `P1DT12H`); default 1 day, capped at 7 days.
//! - Header `X-Htfaas-Writer` (optional, an htfaas extension a dCache door ignores): who the
//!   macaroon is for (`run:<principal>/<function>`, `user:<name>`), put as the `id:` caveat right
//!   after `iid:` ([`macaroons::IssueRequest::writer`]); it decides which later macaroons may
//!   rewrite a file written under this one.
//! - A non-root URL path becomes the first `path:` caveat, and body `path:` caveats chain
//!   *relative* to it (`POST /data` + `path:/raw` allows `/data/raw`), as in dCache.
//! - The resulting path must lie within the issuer's `paths` (403 otherwise).
//! - Unlike dCache, plain HTTP is accepted: run behind TLS or on a trusted network.
//!
//! Answer 200: `{"macaroon":"…","uri":{"target","targetWithMacaroon","base","baseWithMacaroon"}}`.

use axum::body::Body;
use axum::http::{Request, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::AppState;
use crate::auth::{self, Credential};
use crate::error::HttpError;
use crate::macaroons::{self, IssueRequest};
use crate::paths::NsPath;

/// The one media type dCache and XRootD accept.
pub const CONTENT_TYPE: &str = "application/macaroon-request";
/// The header naming who a macaroon is for.
pub const WRITER_HEADER: &str = "x-htfaas-writer";
const MAX_BODY: usize = 64 * 1024;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestBody {
    #[serde(default)]
    caveats: Vec<String>,
    #[serde(default)]
    validity: Option<String>,
}

#[tracing::instrument(name = "storage.macaroon_request", skip_all,
    fields(path = req.uri().path(), user = tracing::field::Empty, macaroon.id = tracing::field::Empty))]
pub(super) async fn handle(state: &AppState, req: Request<Body>) -> Result<Response, HttpError> {
    let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    if ct != Some(CONTENT_TYPE) {
        return Err(HttpError::UnsupportedMediaType(format!(
            "POST is only for macaroon requests and needs Content-Type: {CONTENT_TYPE} exactly (got {})",
            ct.map_or_else(|| "none".to_owned(), |c| format!("{c:?}"))
        )));
    }
    let path = NsPath::from_uri_path(req.uri().path())?;
    let writer = match req.headers().get(WRITER_HEADER) {
        None => None,
        Some(v) => Some(
            v.to_str().map_err(|_| HttpError::BadRequest(format!("{WRITER_HEADER} must be visible ASCII")))?.to_owned(),
        ),
    };
    let user = match auth::credential(req.headers(), req.uri().query())? {
        None => return Err(HttpError::Unauthorized("macaroon requests need HTTP Basic authentication".into())),
        Some(Credential::Macaroon(_)) => {
            return Err(HttpError::Unauthorized(
                "macaroon requests need HTTP Basic authentication, not a macaroon".into(),
            ));
        }
        Some(Credential::Basic { user, secret }) => auth::basic_user(&state.users, &user, &secret)?,
    };
    tracing::Span::current().record("user", user.name.as_str());
    if !user.issue_macaroons {
        return Err(HttpError::Forbidden(format!("user {} may not issue macaroons", user.name)));
    }

    let bytes = axum::body::to_bytes(req.into_body(), MAX_BODY)
        .await
        .map_err(|_| HttpError::TooLarge(format!("macaroon request body over {MAX_BODY} bytes")))?;
    let body: RequestBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        RequestBody::default()
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| HttpError::BadRequest(format!("Invalid macaroon request body: {e}")))?
    };
    let validity = match body.validity.as_deref() {
        None => None,
        Some(v) => Some(
            macaroons::parse_duration(v)
                .ok_or_else(|| HttpError::BadRequest(format!("Invalid ISO 8601 duration: {v:?}")))?,
        ),
    };
    let issue_req = IssueRequest { url_path: Some(path.as_str().to_owned()), caveats: body.caveats, validity, writer };
    let issued = macaroons::issue(&state.key, &state.cell_name, &issue_req, time::OffsetDateTime::now_utc())
        .map_err(|e| HttpError::BadRequest(e.to_string()))?;
    if !user.may_access(&issued.restrictions.path) {
        return Err(HttpError::Forbidden(format!(
            "user {} may not issue macaroons for {}",
            user.name, issued.restrictions.path
        )));
    }
    tracing::Span::current().record("macaroon.id", issued.identifier.as_str());
    tracing::info!(
        user = %user.name,
        macaroon.id = %issued.identifier,
        path = %issued.restrictions.path,
        activities = ?issued.restrictions.activities,
        "issued macaroon"
    );

    let base = format!("{}/", state.public_url);
    let mut target = format!("{}{}", state.public_url, htfaas_functions::percent::path(path.as_str()));
    if path.is_dir() && !path.is_root() {
        target.push('/');
    }
    let m = &issued.token;
    Ok(axum::Json(serde_json::json!({
        "macaroon": m,
        "uri": {
            "target": target,
            "targetWithMacaroon": format!("{target}?authz={m}"),
            "base": base,
            "baseWithMacaroon": format!("{base}?authz={m}"),
        }
    }))
    .into_response())
}
