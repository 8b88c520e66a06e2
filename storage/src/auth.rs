//! Who is asking and what they may do: HTTP Basic users from the users file, and macaroons
//! presented as `Authorization: Bearer <m>` or `?authz=<m>`.
//!
//! Users file (JSON):
//! ```json
//! {"users":[{"name":"gateway","secret":"…","issue_macaroons":true,"paths":["/"]},
//!           {"name":"alice","secret":"…","issue_macaroons":false,"paths":["/data/"]}]}
//! ```
//! `paths` are segment-aware prefixes (`/data/` allows `/data` and below, not `/database`)
//! within which the user may read and write directly (overwrite included), and for which an
//! issuer may issue macaroons. Secrets are compared in constant time (SHA-256 of both sides,
//! so not even the length leaks).

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context as _;
use axum::http::{HeaderMap, header};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::error::HttpError;
use crate::macaroons::{self, Access, Activity, RootKey};
use crate::paths::{self, NsPath};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UsersFile {
    users: Vec<UserEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserEntry {
    name: String,
    secret: String,
    #[serde(default)]
    issue_macaroons: bool,
    #[serde(default)]
    paths: Vec<String>,
}

/// One Basic-auth user.
#[derive(Debug, Clone)]
pub struct User {
    /// Login name.
    pub name: String,
    /// SHA-256 of the secret; the secret itself is not kept.
    secret_sha256: [u8; 32],
    /// May `POST` macaroon requests.
    pub issue_macaroons: bool,
    /// Clean prefixes (no trailing slash) the user may access.
    pub paths: Vec<String>,
}

impl User {
    /// Whether `path` lies within one of the user's prefixes.
    pub fn may_access(&self, path: &str) -> bool {
        self.paths.iter().any(|p| paths::is_within(path, p))
    }
}

/// The users file, loaded.
#[derive(Debug, Clone, Default)]
pub struct Users(HashMap<String, User>);

impl Users {
    /// Loads and checks the users file: names unique and without `:`, secrets non-empty, paths clean.
    pub fn load(path: &Path) -> anyhow::Result<Users> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read users_file {}", path.display()))?;
        Users::parse(&text).with_context(|| format!("users_file {}", path.display()))
    }

    /// Parses the JSON text of a users file.
    pub fn parse(text: &str) -> anyhow::Result<Users> {
        let file: UsersFile = serde_json::from_str(text).context("parse JSON")?;
        let mut users = HashMap::new();
        for u in file.users {
            if u.name.is_empty() || u.name.contains(':') || u.name.chars().any(char::is_control) {
                anyhow::bail!("user name {:?} must be non-empty, without ':' or control characters", u.name);
            }
            if u.secret.is_empty() {
                anyhow::bail!("user {:?} has an empty secret", u.name);
            }
            let mut clean = Vec::new();
            for p in &u.paths {
                let parsed = NsPath::parse(p).with_context(|| format!("user {:?} path {p:?}", u.name))?;
                clean.push(parsed.as_str().to_owned());
            }
            let user = User {
                name: u.name.clone(),
                secret_sha256: Sha256::digest(u.secret.as_bytes()).into(),
                issue_macaroons: u.issue_macaroons,
                paths: clean,
            };
            if users.insert(u.name.clone(), user).is_some() {
                anyhow::bail!("user {:?} appears twice", u.name);
            }
        }
        Ok(Users(users))
    }

    /// The user if `secret` is theirs.
    pub fn authenticate(&self, name: &str, secret: &str) -> Option<&User> {
        let given: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let user = self.0.get(name);
        // Compare even for unknown names, against a value no secret hashes to in practice.
        let expected = user.map_or([0u8; 32], |u| u.secret_sha256);
        htfaas_functions::token::constant_time_eq(&given, &expected).then_some(user).flatten()
    }
}

/// A credential as presented, not yet checked.
#[derive(Clone)]
pub enum Credential {
    /// HTTP Basic.
    Basic {
        /// User name.
        user: String,
        /// Secret.
        secret: String,
    },
    /// A macaroon (bearer header or `authz` query parameter).
    Macaroon(String),
}

/// Reads the credential of a request: `Authorization: Bearer`, then `?authz=`, then Basic.
/// `Ok(None)` when there is none.
pub fn credential(headers: &HeaderMap, query: Option<&str>) -> Result<Option<Credential>, HttpError> {
    let auth = match headers.get(header::AUTHORIZATION) {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| HttpError::Unauthorized("Authorization header is not ASCII".into()))?),
    };
    if let Some(a) = auth
        && let Some(token) = strip_scheme(a, "Bearer")
    {
        return Ok(Some(Credential::Macaroon(token.trim().to_owned())));
    }
    if let Some(token) = query.and_then(authz_param) {
        let token = token?;
        let token = token.strip_prefix("Bearer ").unwrap_or(&token).trim().to_owned();
        return Ok(Some(Credential::Macaroon(token)));
    }
    if let Some(a) = auth {
        let Some(b64) = strip_scheme(a, "Basic") else {
            return Err(HttpError::Unauthorized("unsupported Authorization scheme (use Basic or Bearer)".into()));
        };
        let raw = STANDARD
            .decode(b64.trim())
            .map_err(|_| HttpError::Unauthorized("Basic credentials are not base64".into()))?;
        let text =
            String::from_utf8(raw).map_err(|_| HttpError::Unauthorized("Basic credentials are not UTF-8".into()))?;
        let (user, secret) =
            text.split_once(':').ok_or_else(|| HttpError::Unauthorized("Basic credentials lack ':'".into()))?;
        return Ok(Some(Credential::Basic { user: user.to_owned(), secret: secret.to_owned() }));
    }
    Ok(None)
}

fn strip_scheme<'a>(value: &'a str, scheme: &str) -> Option<&'a str> {
    let (s, rest) = value.split_once(' ')?;
    s.eq_ignore_ascii_case(scheme).then_some(rest)
}

/// The percent-decoded value of the first `authz` query parameter.
fn authz_param(query: &str) -> Option<Result<String, HttpError>> {
    let value = query.split('&').find_map(|kv| kv.strip_prefix("authz="))?;
    Some(
        paths::percent_decode(value)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| HttpError::Unauthorized("authz parameter is not valid percent-encoded UTF-8".into())),
    )
}

/// Who was let in, for logs and the billing `subject`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A Basic user.
    User(String),
    /// A macaroon holder, by macaroon identifier.
    Macaroon(String),
}

impl Principal {
    /// dCache's `Principal.toString()` form.
    pub fn billing_subject(&self) -> String {
        match self {
            Principal::User(n) => format!("UserNamePrincipal[{n}]"),
            Principal::Macaroon(id) => format!("MacaroonPrincipal[{id}]"),
        }
    }
}

/// What an authorized request may do beyond being let in.
#[derive(Debug, Clone)]
pub struct Authorized {
    /// Who.
    pub principal: Principal,
    /// Upload cap from `max-upload:` caveats.
    pub max_upload: Option<u64>,
    /// A macaroon's writer and path scope (its issuer's `id:` and its `path:` caveats folded,
    /// [`writer_identity`]): what a file written under it records, and what may rewrite that
    /// file without `DELETE`. None for a Basic user and for a macaroon issued for no writer.
    pub writer: Option<String>,
}

/// Checks `cred` for `activities` on `path`. Basic users need the path within their `paths`
/// (any activity); macaroons are checked by [`macaroons::verify`].
pub fn authorize(
    users: &Users,
    key: &RootKey,
    cred: Option<&Credential>,
    path: &NsPath,
    activities: &[Activity],
    client: std::net::IpAddr,
) -> Result<Authorized, HttpError> {
    match cred {
        None => Err(HttpError::Unauthorized("credentials required (Basic, Bearer macaroon or ?authz=)".into())),
        Some(Credential::Basic { user, secret }) => {
            let u = basic_user(users, user, secret)?;
            if !u.may_access(path.as_str()) {
                return Err(HttpError::Forbidden(format!("user {} may not access {}", u.name, path.as_str())));
            }
            Ok(Authorized { principal: Principal::User(u.name.clone()), max_upload: None, writer: None })
        }
        Some(Credential::Macaroon(token)) => {
            let now = time::OffsetDateTime::now_utc();
            let grant =
                macaroons::verify(token, key, &Access { path: path.as_str(), activities, now, client: Some(client) })?;
            let writer = grant.restrictions.writer.as_deref().map(|w| writer_identity(w, &grant.restrictions.path));
            Ok(Authorized {
                principal: Principal::Macaroon(grant.identifier),
                max_upload: grant.restrictions.max_upload,
                writer,
            })
        }
    }
}

/// What a file written under a macaroon records of it: its issuer's writer and its path scope,
/// one per line. Equal scopes of different writers (a function's write macaroon and a
/// developer's file credential for the same directory) are different identities.
pub fn writer_identity(writer: &str, scope: &str) -> String {
    format!("{writer}\n{scope}")
}

/// The Basic user, or 401.
pub fn basic_user<'a>(users: &'a Users, user: &str, secret: &str) -> Result<&'a User, HttpError> {
    users.authenticate(user, secret).ok_or_else(|| HttpError::Unauthorized("wrong user name or secret".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const USERS: &str = r#"{"users":[
        {"name":"gateway","secret":"g-secret","issue_macaroons":true,"paths":["/"]},
        {"name":"alice","secret":"a-secret","issue_macaroons":false,"paths":["/data/"]}]}"#;

    #[test]
    fn users_load_and_authenticate() {
        let users = Users::parse(USERS).expect("parses");
        assert!(users.authenticate("alice", "a-secret").is_some());
        assert!(users.authenticate("alice", "a-secre").is_none());
        assert!(users.authenticate("alice", "g-secret").is_none());
        assert!(users.authenticate("bob", "").is_none());
        let alice = users.authenticate("alice", "a-secret").expect("alice");
        assert!(alice.may_access("/data") && alice.may_access("/data/x/y"));
        assert!(!alice.may_access("/database") && !alice.may_access("/"));
    }

    #[test]
    fn bad_users_files_are_refused() {
        for bad in [
            r#"{"users":[{"name":"a","secret":"","paths":[]}]}"#,
            r#"{"users":[{"name":"a:b","secret":"x","paths":[]}]}"#,
            r#"{"users":[{"name":"a","secret":"x","paths":["/data/../etc"]}]}"#,
            r#"{"users":[{"name":"a","secret":"x"},{"name":"a","secret":"y"}]}"#,
            r#"{"users":[{"name":"a","secret":"x","admin":true}]}"#,
        ] {
            assert!(Users::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credentials_are_read_in_order() {
        let mut h = HeaderMap::new();
        assert!(credential(&h, None).expect("ok").is_none());
        assert!(matches!(credential(&h, Some("a=1&authz=TOK%3D")), Ok(Some(Credential::Macaroon(t))) if t == "TOK="));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic YWxpY2U6YS1zZWNyZXQ="));
        assert!(
            matches!(credential(&h, None), Ok(Some(Credential::Basic { user, secret })) if user == "alice" && secret == "a-secret")
        );
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer  MDAx "));
        assert!(matches!(credential(&h, Some("authz=other")), Ok(Some(Credential::Macaroon(t))) if t == "MDAx"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Digest x"));
        assert!(matches!(credential(&h, None), Err(HttpError::Unauthorized(_))));
    }
}
