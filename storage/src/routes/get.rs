//! `GET /<path>`: stream a file. Needs a DOWNLOAD macaroon or a Basic user within their paths.
//! A `HEAD` is answered the same, without the body.
//!
//! Digests (RFC 3230), as dCache's WebDAV door gives them: a request whose `Want-Digest` names
//! `sha-256` is answered with `Digest: sha-256=<base64>`, the sha256 of the file served,
//! computed by streaming it the first time it is asked for and then kept beside a large file
//! ([`crate::fs::SHA256_XATTR`]), as dCache keeps a file's checksum: an EP that asks for a
//! reference file's digest on every job no longer costs a read of the whole file each time.
//! Other algorithms are not offered, so a request asking only for them gets no `Digest`.

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::response::Response;
use tokio_util::io::ReaderStream;

use super::AppState;
use crate::error::HttpError;
use crate::macaroons::Activity;

/// Files of at most this many bytes are read whole in the call that opens them and sent from
/// memory; larger ones are streamed.
const SMALL_READ: u64 = 64 * 1024;

/// The request header asking for digests, and the answer's header (RFC 3230).
const WANT_DIGEST: &str = "want-digest";
const DIGEST: &str = "digest";

#[tracing::instrument(name = "storage.get", skip_all, fields(path = req.uri().path(), principal = tracing::field::Empty))]
pub(super) async fn handle(
    state: &AppState,
    client: std::net::SocketAddr,
    req: Request<Body>,
) -> Result<Response, HttpError> {
    let (path, _) = super::authorized(state, client, &req, Activity::Download)?;
    if path.is_dir() {
        return Err(HttpError::NotFound(format!("{} is a directory; list it with PROPFIND", path.as_str())));
    }
    let want_sha256 = wants_sha256(req.headers());
    let (opened, sha256) = crate::fs::read(&state.data_dir, &path, SMALL_READ, want_sha256).await?;
    let (body, len) = match opened {
        crate::fs::Opened::Whole(bytes) => {
            let len = bytes.len() as u64;
            (Body::from(bytes), len)
        }
        crate::fs::Opened::File(file, len) => (Body::from_stream(ReaderStream::new(file)), len),
    };
    let body = if req.method() == axum::http::Method::HEAD { Body::empty() } else { body };
    let mut answer = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, len);
    if let Some(sha256) = sha256 {
        use base64::Engine as _;
        answer = answer.header(DIGEST, format!("sha-256={}", base64::engine::general_purpose::STANDARD.encode(sha256)));
    }
    answer.body(body).map_err(|e| HttpError::Internal(format!("build response: {e}")))
}

/// Whether `Want-Digest` (any number of them, each a list of `algorithm[;q=value]`) names
/// `sha-256` with a weight above 0. Names are compared without case; a value that is not text
/// names nothing.
fn wants_sha256(headers: &HeaderMap) -> bool {
    headers.get_all(WANT_DIGEST).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|item| {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or_default().trim();
        let refused = parts.any(|p| {
            p.trim().split_once('=').is_some_and(|(k, q)| {
                k.trim().eq_ignore_ascii_case("q") && q.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
            })
        });
        name.eq_ignore_ascii_case("sha-256") && !refused
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(values: &[&str]) -> bool {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(WANT_DIGEST, v.parse().expect("header value"));
        }
        wants_sha256(&h)
    }

    #[test]
    fn want_digest_names_sha256_in_any_case_list_or_weight_but_zero() {
        assert!(asking(&["sha-256"]));
        assert!(asking(&["SHA-256"]));
        assert!(asking(&["adler32;q=1, SHA-256;q=0.3"]));
        assert!(asking(&["md5", "sha-256"]), "in a second header");
        assert!(!asking(&[]));
        assert!(!asking(&["adler32"]), "XRootD's: not offered");
        assert!(!asking(&["sha-256;q=0"]), "refused by its weight");
        assert!(!asking(&["sha-2566", "sha"]));
    }
}
