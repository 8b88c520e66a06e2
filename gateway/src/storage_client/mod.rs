//! Asks the storage for macaroons, in the dialect of a dCache door or of an XRootD server, and
//! for directory listings.
//!
//! Both take `POST` with `Content-Type: application/macaroon-request` (exactly; dCache compares
//! the header verbatim) and a JSON body `{"caveats":[…],"validity":"PT2H"}`, and answer with
//! JSON holding `macaroon`. They differ in where the path goes (`shared/reference/dcache.md`
//! §3.3, §4):
//!
//! - **dCache** ([`StorageKind::Dcache`]): `POST <door>/` with caveats `activity:…` and
//!   `path:<absolute path>`. We post to `/` so that the `path:` caveat is the absolute path (a
//!   URL path would chain with it). The gateway authenticates with HTTP Basic.
//! - **XRootD** ([`StorageKind::Xrootd`], XrdMacaroons): `POST` to the target's own URL: the
//!   file for a read macaroon, the directory **with a trailing slash** for a write macaroon
//!   (XRootD before 5.9.1 matches the path caveat as a plain string prefix, so `/out` would also
//!   open `/outside`). The request may carry only `activity:` caveats; `validity` must be
//!   `PT…` with H, M, S units only. The reply is `{"macaroon","expires_in"}`. The gateway
//!   authenticates with an x509 client certificate (the reqwest client carries it): XRootD
//!   derives the token's rights from what the *requester* may do, so an anonymous requester gets
//!   a token that grants nothing. [`StorageClient`] therefore checks the activities of an XRootD
//!   macaroon and refuses one that cannot do what was asked.
//!
//! The reply's `macaroon` is a bearer credential: it is passed on, never logged.
//!
//! **Read macaroons are derived, not requested, per file** ([`StorageClient::read_macaroon`]).
//! The client asks the storage once for a read macaroon on the file's directory (a *base*,
//! kept for the first quarter of its lifetime) and narrows it offline to exactly the file by
//! adding a first-party `path:` caveat, which needs no key: in dCache's grammar relative to the
//! base's path (`path:/x.dat` after `path:/data/raw/`), in XRootD's absolute (every `path:`
//! caveat must hold). A caveat only ever narrows, so nothing added later widens it back; a base
//! never leaves this client. Write macaroons are still requested per job: the storage names the
//! write macaroon that authorized an upload in its billing record (its identifier), and the
//! gateway's loop guard and each chained firing's cause are keyed by that name, one per job.
//!
//! It also lists a directory with WebDAV `PROPFIND` under a `LIST` macaroon ([`StorageClient::propfind`]),
//! as both dCache's WebDAV door and XrdHttp answer it.

use base64::Engine as _;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The header a macaroon request names its writer in (the built-in storage's
/// `X-Htfaas-Writer`).
pub const WRITER_HEADER: &str = "x-htfaas-writer";

/// The writer of a run of `function` acting as `principal` (its owner, or the bearer who ran it
/// by hand): what its write macaroon is issued for, so its outputs are rewritten only by runs of
/// the same function as the same principal.
pub fn writer_of_run(principal: &str, function: &str) -> String {
    format!("run:{principal}/{function}")
}

/// The writer of a developer's file credential.
pub fn writer_of_user(name: &str) -> String {
    format!("user:{name}")
}

/// Exact media type of a macaroon request.
pub const MACAROON_REQUEST: &str = "application/macaroon-request";
/// How long one macaroon request may take, connection included, before it counts as the
/// storage being unavailable ([`StorageError::Unavailable`]: the firing is retried with
/// backoff). A storage that accepts the connection and then stalls must not hold a dispatch
/// slot for ever; a healthy one answers in milliseconds.
pub const MACAROON_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Which macaroon-request dialect the storage speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageKind {
    /// A dCache WebDAV door, or the built-in storage (`htfaas storage`).
    #[default]
    Dcache,
    /// An XRootD server with XrdHttp and XrdMacaroons.
    Xrootd,
}

/// What a macaroon is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Download exactly one file.
    Read,
    /// Create files within one directory (dCache: `UPLOAD` only, so no existing file is
    /// replaced).
    Write,
    /// Create and replace files within one directory (dCache: `UPLOAD,DELETE`): only for a
    /// function whose manifest asks for it and whose owner's namespace grants `replace` there.
    Replace,
    /// List one directory tree (`LIST`): `events backfill`, never handed to a job.
    List,
    /// Read, create and replace files within one directory (dCache: `DOWNLOAD,UPLOAD,DELETE`):
    /// a job's own checkpoint area.
    Checkpoint,
}

/// How the gateway authenticates to the storage when it asks for macaroons.
#[derive(Clone)]
pub enum StorageAuth {
    /// HTTP Basic with a user and secret.
    Basic {
        /// User name.
        user: String,
        /// Secret.
        secret: String,
    },
    /// An x509 client certificate, carried by the HTTP client itself (no header).
    ClientCert,
}

impl std::fmt::Debug for StorageAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageAuth::Basic { user, .. } => f.debug_struct("Basic").field("user", user).finish_non_exhaustive(),
            StorageAuth::ClientCert => f.write_str("ClientCert"),
        }
    }
}

/// Why no macaroon was obtained.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The storage could not be reached or failed (5xx): try again later.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The storage refused the request (4xx): retrying will not help.
    #[error("storage refused the request ({status}): {body}")]
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
    /// XRootD only: seconds until expiry (capped by the server's `macaroons.maxduration`).
    #[serde(default)]
    expires_in: Option<u64>,
}

/// One macaroon request, as sent: where to, and the JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct MacaroonRequest {
    /// Full URL to POST to.
    pub url: String,
    /// JSON body (`caveats`, `validity`).
    pub body: serde_json::Value,
}

/// The macaroon request for `access` to `path` on the storage at `base` (no trailing `/`).
///
/// `path` is absolute: the file for [`Access::Read`], the directory for [`Access::Write`].
pub fn macaroon_request(kind: StorageKind, base: &str, access: Access, path: &str, validity: &str) -> MacaroonRequest {
    let base = base.trim_end_matches('/');
    let (url, caveats): (String, Vec<String>) = match kind {
        StorageKind::Dcache => {
            let activity = match access {
                Access::Read => "activity:DOWNLOAD",
                Access::Write => "activity:UPLOAD",
                Access::Replace => "activity:UPLOAD,DELETE",
                Access::List => "activity:LIST",
                Access::Checkpoint => "activity:DOWNLOAD,UPLOAD,DELETE",
            };
            (format!("{base}/"), vec![activity.into(), format!("path:{path}")])
        }
        StorageKind::Xrootd => {
            let target = match access {
                Access::Read => path.to_owned(),
                Access::Write | Access::Replace | Access::List | Access::Checkpoint if path.ends_with('/') => {
                    path.to_owned()
                }
                Access::Write | Access::Replace | Access::List | Access::Checkpoint => format!("{path}/"),
            };
            (format!("{base}{}", htfaas_functions::percent::path(&target)), vec![xrootd_activity(access).into()])
        }
    };
    MacaroonRequest { url, body: serde_json::json!({ "caveats": caveats, "validity": validity }) }
}

/// The activity caveat an XRootD macaroon is requested with. UPLOAD is what XrdMacaroons
/// requires to create a file (an XrdHttp PUT of a new file: 200); replacing an existing file
/// would need MANAGE, which in turn needs delete rights for the gateway, which it does not get:
/// so [`Access::Replace`] is `UPLOAD` too there (new files only).
fn xrootd_activity(access: Access) -> &'static str {
    match access {
        Access::Read => "activity:DOWNLOAD",
        Access::Write | Access::Replace | Access::Checkpoint => "activity:UPLOAD",
        Access::List => "activity:LIST",
    }
}

/// Whether `validity` is a duration XRootD accepts: `PT` followed by numbers with `H`, `M` or
/// `S` units (no days, no fractions), e.g. `PT2H`, `PT1H30M`.
pub fn is_xrootd_validity(validity: &str) -> bool {
    let Some(rest) = validity.strip_prefix("PT") else { return false };
    if rest.is_empty() {
        return false;
    }
    let mut digits = 0;
    for c in rest.chars() {
        match c {
            '0'..='9' => digits += 1,
            'H' | 'M' | 'S' if digits > 0 => digits = 0,
            _ => return false,
        }
    }
    digits == 0
}

/// Most read bases kept, one per directory; past it, the stale ones are dropped, then all.
const MAX_BASES: usize = 4096;

/// A read macaroon on one directory, kept to derive its files' read macaroons from.
#[derive(Clone)]
struct Base {
    token: String,
    /// When it was obtained and when it expires (its earliest `before:`), Unix seconds.
    obtained_s: u64,
    before_s: u64,
}

impl Base {
    /// Whether to derive from it at `now_s`: more than three quarters of its lifetime are left,
    /// so that a macaroon derived from it lives nearly as long as one asked for.
    fn fresh(&self, now_s: u64) -> bool {
        let life = self.before_s.saturating_sub(self.obtained_s);
        now_s >= self.obtained_s && self.before_s.saturating_sub(now_s) > life - life / 4
    }
}

/// How many macaroons a [`StorageClient`] asked the storage for, and how many it derived.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MacaroonCounts {
    /// Requests to the storage (bases, write and list macaroons, and reads it could not derive).
    pub requested: u64,
    /// Read macaroons derived offline from a base.
    pub derived: u64,
}

/// Client of one storage door.
pub struct StorageClient {
    http: reqwest::Client,
    kind: StorageKind,
    base: String,
    authorization: Option<String>,
    read_validity: String,
    write_validity: String,
    /// Bound on each request ([`MACAROON_TIMEOUT`]).
    timeout: std::time::Duration,
    /// Read bases by directory (ending in `/`).
    bases: std::sync::Mutex<HashMap<String, Base>>,
    requested: AtomicU64,
    derived: AtomicU64,
}

impl StorageClient {
    /// A client for the storage at `base` (no trailing `/`) speaking `kind`, authenticating with
    /// `auth`. For [`StorageAuth::ClientCert`], `http` must carry the identity.
    pub fn new(
        http: reqwest::Client,
        kind: StorageKind,
        base: &str,
        auth: StorageAuth,
        read_validity: &str,
        write_validity: &str,
    ) -> StorageClient {
        let authorization = match auth {
            StorageAuth::Basic { user, secret } => {
                Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{secret}"))))
            }
            StorageAuth::ClientCert => None,
        };
        StorageClient {
            http,
            kind,
            base: base.trim_end_matches('/').to_owned(),
            authorization,
            read_validity: read_validity.to_owned(),
            write_validity: write_validity.to_owned(),
            timeout: MACAROON_TIMEOUT,
            bases: std::sync::Mutex::default(),
            requested: AtomicU64::new(0),
            derived: AtomicU64::new(0),
        }
    }

    /// The same client with each request bounded by `timeout` instead of [`MACAROON_TIMEOUT`].
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> StorageClient {
        self.timeout = timeout;
        self
    }

    /// The dialect this client speaks.
    pub fn kind(&self) -> StorageKind {
        self.kind
    }

    /// Full URL of a storage path.
    pub fn url_of(&self, path: &str) -> String {
        format!("{}{}", self.base, htfaas_functions::percent::path(path))
    }

    /// The storage path of `url`, a URL [`StorageClient::url_of`] wrote; `None` for any other.
    pub fn path_of(&self, url: &str) -> Option<String> {
        htfaas_functions::percent::decode_utf8(url.strip_prefix(&self.base)?).filter(|p| p.starts_with('/'))
    }

    /// [`StorageClient::read_macaroon`] of `path` when there is one: a run on no file reads
    /// nothing.
    pub async fn read_macaroon_of(&self, path: Option<&str>) -> Result<Option<String>, StorageError> {
        match path {
            Some(path) => self.read_macaroon(path).await.map(Some),
            None => Ok(None),
        }
    }

    /// A macaroon that may only download exactly `path`: derived offline from a base on its
    /// directory (asked for when none is fresh), or asked for itself where no base serves (a
    /// path without a directory or with a line break, a base without a `before:` to keep it by,
    /// a base the codec cannot read).
    pub async fn read_macaroon(&self, path: &str) -> Result<String, StorageError> {
        let Some(dir) = directory_of(path) else { return self.request(Access::Read, path, None).await };
        let now = htfaas_functions::time::now_s();
        let kept = self.bases.lock().unwrap_or_else(|p| p.into_inner()).get(dir).filter(|b| b.fresh(now)).cloned();
        let base = match kept {
            Some(base) => base,
            None => {
                let token = self.request(Access::Read, dir, None).await?;
                let Some(before_s) = earliest_before(&token) else {
                    return self.request(Access::Read, path, None).await;
                };
                let base = Base { token, obtained_s: now, before_s };
                self.keep(dir, base.clone(), now);
                base
            }
        };
        match derive_read(self.kind, &base.token, dir, path) {
            Ok(token) => {
                self.derived.fetch_add(1, Ordering::Relaxed);
                Ok(token)
            }
            Err(e) => {
                tracing::warn!(%dir, "cannot narrow the storage's read macaroon ({e}); asking for the file's");
                self.request(Access::Read, path, None).await
            }
        }
    }

    /// Keeps `base` for `dir`, dropping stale bases (then all) when [`MAX_BASES`] are kept.
    fn keep(&self, dir: &str, base: Base, now_s: u64) {
        let mut bases = self.bases.lock().unwrap_or_else(|p| p.into_inner());
        if bases.len() >= MAX_BASES {
            bases.retain(|_, b| b.fresh(now_s));
            if bases.len() >= MAX_BASES {
                bases.clear();
            }
        }
        bases.insert(dir.to_owned(), base);
    }

    /// Macaroons asked for and derived so far.
    pub fn counts(&self) -> MacaroonCounts {
        MacaroonCounts {
            requested: self.requested.load(Ordering::Relaxed),
            derived: self.derived.load(Ordering::Relaxed),
        }
    }

    /// A macaroon that may only create files within directory `dir`, and with `replace` also
    /// replace existing ones (dCache; XRootD: new files only either way), issued for `writer`
    /// ([`writer_of_run`], [`writer_of_user`]): the built-in storage lets a macaroon rewrite
    /// without `DELETE` only what a macaroon of the same writer and directory wrote (header
    /// [`WRITER_HEADER`], which a dCache door ignores: there replacing always needs `DELETE`).
    pub async fn write_macaroon(&self, dir: &str, replace: bool, writer: &str) -> Result<String, StorageError> {
        self.request(if replace { Access::Replace } else { Access::Write }, dir, Some(writer)).await
    }

    /// A macaroon that may read, create and replace files in directory `dir` only: a job's own
    /// checkpoint area.
    pub async fn checkpoint_macaroon(&self, dir: &str, writer: &str) -> Result<String, StorageError> {
        self.request(Access::Checkpoint, dir, Some(writer)).await
    }

    /// A macaroon that may only list the tree under directory `dir` (`events
    /// backfill`; the gateway keeps it).
    pub async fn list_macaroon(&self, dir: &str) -> Result<String, StorageError> {
        self.request(Access::List, dir, None).await
    }

    /// The `PROPFIND` (WebDAV, `Depth: 1`) answer of directory `dir` (ending in `/`), with the
    /// bearer `macaroon`: the multistatus XML ([`crate::listing`] reads it), at most
    /// `max_bytes` of it.
    pub async fn propfind(&self, dir: &str, macaroon: &str, max_bytes: usize) -> Result<String, StorageError> {
        let method = reqwest::Method::from_bytes(b"PROPFIND").map_err(|e| StorageError::Unavailable(e.to_string()))?;
        let body = "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<d:propfind xmlns:d=\"DAV:\"><d:prop>\
                    <d:resourcetype/><d:getcontentlength/><d:getlastmodified/></d:prop></d:propfind>";
        let resp = self
            .http
            .request(method, self.url_of(dir))
            .timeout(self.timeout)
            .bearer_auth(macaroon)
            .header("depth", "1")
            .header(reqwest::header::CONTENT_TYPE, "application/xml")
            .body(body)
            .send()
            .await
            .map_err(|e| StorageError::Unavailable(error_chain(&e)))?;
        let status = resp.status();
        if resp.content_length().is_some_and(|n| n > max_bytes as u64) {
            return Err(StorageError::Refused {
                status: status.as_u16(),
                body: format!("a listing over {max_bytes} bytes"),
            });
        }
        let text = resp.text().await.map_err(|e| StorageError::Unavailable(error_chain(&e)))?;
        if status.is_server_error() {
            return Err(StorageError::Unavailable(format!("{status}: {}", snippet(&text))));
        }
        if status.as_u16() != 207 {
            return Err(StorageError::Refused { status: status.as_u16(), body: snippet(&text) });
        }
        if text.len() > max_bytes {
            return Err(StorageError::Refused {
                status: status.as_u16(),
                body: format!("a listing over {max_bytes} bytes"),
            });
        }
        Ok(text)
    }

    /// `DELETE`s the file or empty directory `path` with the bearer `macaroon`: `Ok(true)` when
    /// it was removed, `Ok(false)` when nothing was there (404).
    pub async fn delete(&self, path: &str, macaroon: &str) -> Result<bool, StorageError> {
        let sent = self.http.delete(self.url_of(path)).timeout(self.timeout).bearer_auth(macaroon).send().await;
        let resp = sent.map_err(|e| StorageError::Unavailable(error_chain(&e)))?;
        match resp.status() {
            s if s.is_success() => Ok(true),
            s if s.as_u16() == 404 => Ok(false),
            s if s.is_server_error() => Err(StorageError::Unavailable(s.to_string())),
            s => {
                Err(StorageError::Refused { status: s.as_u16(), body: snippet(&resp.text().await.unwrap_or_default()) })
            }
        }
    }

    #[tracing::instrument(name = "gateway.request_macaroon", skip_all, fields(kind = ?self.kind, access = ?access, path = %path))]
    async fn request(&self, access: Access, path: &str, writer: Option<&str>) -> Result<String, StorageError> {
        let validity = match access {
            Access::Read | Access::List => &self.read_validity,
            Access::Write | Access::Replace | Access::Checkpoint => &self.write_validity,
        };
        let req = macaroon_request(self.kind, &self.base, access, path, validity);
        self.requested.fetch_add(1, Ordering::Relaxed);
        let mut post = self
            .http
            .post(&req.url)
            .timeout(self.timeout)
            .header(reqwest::header::CONTENT_TYPE, MACAROON_REQUEST)
            .body(req.body.to_string());
        if let Some(authorization) = &self.authorization {
            post = post.header(reqwest::header::AUTHORIZATION, authorization);
        }
        if let Some(writer) = writer.filter(|_| self.kind == StorageKind::Dcache) {
            post = post.header(WRITER_HEADER, writer);
        }
        let unavailable = |e: reqwest::Error| {
            if e.is_timeout() {
                StorageError::Unavailable(format!("no answer within {:?}: {}", self.timeout, error_chain(&e)))
            } else {
                StorageError::Unavailable(error_chain(&e))
            }
        };
        let resp = post.send().await.map_err(unavailable)?;
        let status = resp.status();
        let text = resp.text().await.map_err(unavailable)?;
        if status.is_server_error() {
            return Err(StorageError::Unavailable(format!("{status}: {}", snippet(&text))));
        }
        if !status.is_success() {
            return Err(StorageError::Refused { status: status.as_u16(), body: snippet(&text) });
        }
        let reply: MacaroonReply = serde_json::from_str(&text)
            .map_err(|e| StorageError::Refused { status: status.as_u16(), body: format!("bad reply: {e}") })?;
        if self.kind == StorageKind::Xrootd {
            let wanted = &xrootd_activity(access)["activity:".len()..];
            if let Err(why) = check_activities(&reply.macaroon, wanted) {
                return Err(StorageError::Refused {
                    status: status.as_u16(),
                    body: format!(
                        "the storage issued a macaroon that cannot {wanted} ({why}); is the gateway \
                         authenticated (client certificate, gridmap, authdb)?"
                    ),
                });
            }
        }
        tracing::debug!(expires_in = ?reply.expires_in, "macaroon issued");
        Ok(reply.macaroon)
    }
}

/// An error with its sources, for messages (reqwest hides the TLS cause in the chain).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// First-party caveats (`cid`) of a V1 macaroon (libmacaroons serialization, base64url or
/// standard base64, padded or not): packets of 4 hex digits of length, then `key value\n`.
pub fn v1_caveats(token: &str) -> Result<Vec<String>, V1Unreadable> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let config = GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let normalized: String = token
        .trim()
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    let raw = GeneralPurpose::new(&base64::alphabet::URL_SAFE, config)
        .decode(normalized)
        .map_err(|e| V1Unreadable(format!("not base64: {e}")))?;
    let mut caveats = Vec::new();
    let mut rest = raw.as_slice();
    while !rest.is_empty() {
        let len = rest
            .get(..4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| usize::from_str_radix(h, 16).ok())
            .ok_or_else(|| V1Unreadable("bad packet header".into()))?;
        let packet = rest.get(4..len).filter(|_| len > 4).ok_or_else(|| V1Unreadable("truncated packet".into()))?;
        rest = &rest[len..];
        let packet = packet.strip_suffix(b"\n").unwrap_or(packet);
        if let Some(cid) = packet.strip_prefix(b"cid ") {
            caveats.push(String::from_utf8_lossy(cid).into_owned());
        }
    }
    Ok(caveats)
}

/// Why [`v1_caveats`] could not read a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("V1 macaroon unreadable: {0}")]
pub struct V1Unreadable(String);

/// Checks that every `activity:` caveat of `token` allows `wanted` (XRootD caveats are
/// conjunctive). XRootD puts the requester's own rights in the first one.
fn check_activities(token: &str, wanted: &str) -> Result<(), String> {
    let caveats = v1_caveats(token).map_err(|e| e.to_string())?;
    let mut seen = false;
    for list in caveats.iter().filter_map(|c| c.strip_prefix("activity:")) {
        seen = true;
        if !list.split(',').any(|a| a == wanted) {
            return Err(format!("it carries activity:{list}"));
        }
    }
    if seen { Ok(()) } else { Err("it carries no activity caveat".into()) }
}

/// The directory of the file `path`, ending in `/` (`/data/raw/` of `/data/raw/x.dat`); `None`
/// for a path that is not absolute, names a directory, or holds a line break or NUL (a caveat
/// is one line: such a path is left to the storage to refuse).
fn directory_of(path: &str) -> Option<&str> {
    if !path.starts_with('/') || path.contains(['\n', '\r', '\0']) {
        return None;
    }
    let slash = path.rfind('/')?;
    (slash + 1 < path.len()).then(|| &path[..=slash])
}

/// The earliest `before:` of a V1 macaroon, Unix seconds; `None` if it has none (or is not V1).
fn earliest_before(token: &str) -> Option<u64> {
    let caveats = v1_caveats(token).ok()?;
    caveats
        .iter()
        .filter_map(|c| c.strip_prefix("before:"))
        .filter_map(htfaas_functions::time::parse_utc_timestamp)
        .min()
}

/// `base` (read on directory `dir`, ending in `/`) narrowed to exactly the file `path` in it:
/// dCache chains a `path:` relative to the one before, XRootD wants every `path:` to hold.
fn derive_read(
    kind: StorageKind,
    base: &str,
    dir: &str,
    path: &str,
) -> Result<String, htfaas_functions::macaroon::CodecError> {
    let caveat = match kind {
        StorageKind::Dcache => format!("path:{}", &path[dir.len() - 1..]),
        StorageKind::Xrootd => format!("path:{path}"),
    };
    htfaas_functions::macaroon::attenuate(base, &[&caveat])
}

/// At most 200 characters of a body, for messages.
pub fn snippet(text: &str) -> String {
    text.chars().take(200).collect()
}

#[cfg(test)]
mod tests;
