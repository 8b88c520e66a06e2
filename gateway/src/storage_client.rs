//! Asks the storage for macaroons with the dCache macaroon-request protocol.
//!
//! `POST <door>/` with `Content-Type: application/macaroon-request` (exactly; dCache compares
//! the header verbatim) and a JSON body `{"caveats":["activity:…","path:…"],"validity":"PT2H"}`,
//! authenticated as the gateway. We post to `/` so that the `path:` caveat in the body is the
//! absolute path (a URL path would chain with it, `shared/reference/dcache.md` §3.3).
//! The reply's `macaroon` is a bearer credential: it is passed on, never logged.

use base64::Engine as _;
use serde::Deserialize;

/// Exact media type of a macaroon request.
pub const MACAROON_REQUEST: &str = "application/macaroon-request";

/// Why no macaroon was obtained.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The storage could not be reached or failed (5xx): try again later.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The storage refused the request (4xx): retrying will not help.
    #[error("storage refused the macaroon request ({status}): {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Start of the response body.
        body: String,
    },
}

impl StorageError {
    /// Whether a later retry may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StorageError::Unavailable(_))
    }
}

#[derive(Deserialize)]
struct MacaroonReply {
    macaroon: String,
}

/// Client of one storage door.
pub struct StorageClient {
    http: reqwest::Client,
    base: String,
    authorization: String,
    read_validity: String,
    write_validity: String,
}

impl StorageClient {
    /// A client for the door at `base` (no trailing `/`), authenticating as `user`.
    pub fn new(
        http: reqwest::Client,
        base: &str,
        user: &str,
        secret: &str,
        read_validity: &str,
        write_validity: &str,
    ) -> StorageClient {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{secret}"));
        StorageClient {
            http,
            base: base.trim_end_matches('/').to_owned(),
            authorization: format!("Basic {basic}"),
            read_validity: read_validity.to_owned(),
            write_validity: write_validity.to_owned(),
        }
    }

    /// Full URL of a storage path.
    pub fn url_of(&self, path: &str) -> String {
        format!("{}{}", self.base, encode_path(path))
    }

    /// A macaroon that may only download exactly `path`.
    pub async fn read_macaroon(&self, path: &str) -> Result<String, StorageError> {
        self.request(&["activity:DOWNLOAD".into(), format!("path:{path}")], &self.read_validity).await
    }

    /// A macaroon that may only create (and replace) files within directory `dir`.
    pub async fn write_macaroon(&self, dir: &str) -> Result<String, StorageError> {
        self.request(&["activity:UPLOAD,DELETE".into(), format!("path:{dir}")], &self.write_validity).await
    }

    #[tracing::instrument(name = "gateway.request_macaroon", skip_all, fields(caveats = ?caveats))]
    async fn request(&self, caveats: &[String], validity: &str) -> Result<String, StorageError> {
        let body = serde_json::json!({ "caveats": caveats, "validity": validity });
        let resp = self
            .http
            .post(format!("{}/", self.base))
            .header(reqwest::header::CONTENT_TYPE, MACAROON_REQUEST)
            .header(reqwest::header::AUTHORIZATION, &self.authorization)
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| StorageError::Unavailable(e.to_string()))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| StorageError::Unavailable(e.to_string()))?;
        if status.is_server_error() {
            return Err(StorageError::Unavailable(format!("{status}: {}", snippet(&text))));
        }
        if !status.is_success() {
            return Err(StorageError::Refused { status: status.as_u16(), body: snippet(&text) });
        }
        let reply: MacaroonReply = serde_json::from_str(&text)
            .map_err(|e| StorageError::Refused { status: status.as_u16(), body: format!("bad reply: {e}") })?;
        Ok(reply.macaroon)
    }
}

/// At most 200 characters of a body, for messages.
pub fn snippet(text: &str) -> String {
    text.chars().take(200).collect()
}

/// Percent-encodes a storage path, keeping `/` and RFC 3986 unreserved characters.
pub fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_encoded_but_slashes_kept() {
        assert_eq!(encode_path("/data/raw/a b#?.dat"), "/data/raw/a%20b%23%3F.dat");
        assert_eq!(encode_path("/data/é"), "/data/%C3%A9");
    }
}
