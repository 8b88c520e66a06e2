//! Which URLs a submitted job may name. The scheduler trusts no URL it is handed: a
//! job's input and output must lie under one of the site's storage origins
//! ([`crate::Config::storage_origins`]), and its module must be exactly a module store's
//! `<store>/v1/modules/<the job's digest>` ([`crate::Config::module_stores`]). Without this the
//! holder of a plain submit token could post a job straight to `POST /v1/jobs` whose EP fetches
//! an internal address (SSRF from the EP's network) and uploads to a server of the submitter's
//! choice.
//!
//! Every URL is parsed with the `url` crate, the parser the EP's HTTP client (reqwest) uses, and
//! compared by scheme, host and port (the port made explicit). Its path must already be what
//! the parser makes of it (nothing resolved away: no `.` or `..` segment, no backslash), and
//! must hold no encoded `/`, `\`, `.` or NUL and no empty segment, so what is checked here is
//! what the EP requests and what the storage sees. User info, a query and a fragment are
//! refused.
//!
//! Pure: knows no HTTP server, store, EP or token.

use htfaas_functions::Digest;
use htfaas_functions::proto::SubmitRequest;
use std::fmt;
use url::Url;

/// A scheme, host and port (the scheme's default made explicit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    scheme: String,
    host: url::Host<String>,
    port: u16,
}

impl Origin {
    fn of(u: &Url) -> Option<Origin> {
        Some(Origin { scheme: u.scheme().to_owned(), host: u.host()?.to_owned(), port: u.port_or_known_default()? })
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

/// A module store: its origin and the path its `/v1/modules/…` hangs under (empty, or
/// `/prefix` without a trailing `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ModuleStore {
    origin: Origin,
    prefix: String,
}

impl fmt::Display for ModuleStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.origin, self.prefix)
    }
}

/// A configured origin or module store that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustConfigError {
    /// No storage origin: every job would be refused (or, worse, every URL accepted).
    #[error(
        "storage_origins is empty: list the scheme://host:port of each storage jobs read and write \
         (the gateway's storage_url), or the scheduler would refuse every job"
    )]
    NoStorage,
    /// No module store.
    #[error(
        "module_stores is empty: list the base URL modules are fetched from (the gateway's public URL; \
         modules are at <url>/v1/modules/<digest>), or the scheduler would refuse every job"
    )]
    NoModuleStore,
    /// An entry is not a usable URL.
    #[error("{key}: {value:?} {why}")]
    Bad {
        /// `storage_origins` or `module_stores`.
        key: &'static str,
        /// The entry.
        value: String,
        /// What is wrong with it.
        why: String,
    },
}

/// Why a job's URL is refused; the message names the field, the URL and what is trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefusal {
    /// Not an http(s) URL this check can reason about, or with parts it refuses.
    #[error("{field} {url:?} is refused: {why}")]
    Malformed {
        /// The request's field (`input.url`, `output.url`, `function.module_url`).
        field: &'static str,
        /// The URL (never holds a credential: user info is refused, not shown, see below).
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// A storage URL outside every trusted storage origin.
    #[error("{field} {url:?} is not on a storage this scheduler trusts ({trusted})")]
    UntrustedStorage {
        /// The request's field.
        field: &'static str,
        /// The URL.
        url: String,
        /// The trusted origins, comma-separated.
        trusted: String,
    },
    /// An `event.path` that is not the file `input.url` names: the lineage and audit trails
    /// record the event's path, so a job may not claim another file's event.
    #[error("event.path {path:?} is not the file input.url {url:?} names")]
    EventPath {
        /// The claimed path.
        path: String,
        /// The input URL.
        url: String,
    },
    /// A job without an input whose event names a path: the lineage and audit trails would
    /// show a run on no file as a run on that file (a job lying about having no input).
    #[error("event.path {path:?} names a file, but the job has no input: a run on no file names no path")]
    NoInputPath {
        /// The claimed path.
        path: String,
    },
    /// A reference input whose guest path is not the storage path its URL names (without the
    /// leading `/`): the lineage records the path, so a reference may not pose as another file.
    #[error("refs: path {path:?} is not the file {url:?} names")]
    RefPath {
        /// The claimed path.
        path: String,
        /// The reference's URL.
        url: String,
    },
    /// A module URL that is not the module store's URL for the job's digest.
    #[error("function.module_url {url:?} is not the module store's URL for the job's digest: expected {expected}")]
    UntrustedModule {
        /// The URL.
        url: String,
        /// What it must be (each store's URL for the digest, comma-separated).
        expected: String,
    },
}

/// The URLs this scheduler lets a job name.
#[derive(Debug, Clone)]
pub struct UrlTrust {
    storages: Vec<Origin>,
    module_stores: Vec<ModuleStore>,
}

/// The URL shown in a refusal: cut to 256 characters, and without user info (which may hold a
/// password) when the URL parses.
fn shown(raw: &str) -> String {
    let mut s = match Url::parse(raw) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => raw.to_owned(),
    };
    if let Some((i, _)) = s.char_indices().nth(256) {
        s.truncate(i);
        s.push('…');
    }
    s
}

/// `raw` parsed, if it is an http(s) URL with a host, no user info, query or fragment, and a
/// clean path that the parser left as it was.
fn parse_clean(raw: &str) -> Result<Url, String> {
    let u = Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err("only http and https URLs are allowed".into());
    }
    if u.host().is_none() {
        return Err("it names no host".into());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("user info (user:password@) is not allowed".into());
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err("a query or a fragment is not allowed".into());
    }
    // The path as written: after the authority, up to the end (no query or fragment is left).
    let after_scheme = raw.split_once("://").map_or("", |(_, rest)| rest);
    let written = after_scheme.find(['/', '\\']).map_or("", |i| &after_scheme[i..]);
    let parsed = u.path();
    if !written.is_empty() && written != parsed {
        return Err(format!(
            "its path {written:?} is not in canonical form (it reads as {parsed:?}): no '.' or '..' segment, \
             no backslash, no character that needs escaping"
        ));
    }
    let lower = parsed.to_ascii_lowercase();
    if ["%2f", "%5c", "%2e", "%00"].iter().any(|e| lower.contains(e)) {
        return Err("its path holds an encoded '/', '\\', '.' or NUL".into());
    }
    let segments: Vec<&str> = parsed.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, s) in segments.iter().enumerate() {
        if matches!(*s, "." | "..") || (s.is_empty() && i != last) {
            return Err("its path holds an empty, '.' or '..' segment".into());
        }
    }
    Ok(u)
}

/// Whether the (checked) storage URL `url` names the clean absolute file `path`: its decoded
/// path ends with `path` (a storage's base path may come before it; however a client encoded
/// the URL, `%3D` or `=`, the file is the same).
fn names_file(url: &str, path: &str) -> bool {
    if !htfaas_functions::manifest::is_clean_abs_path(path) || path.ends_with('/') {
        return false;
    }
    let Ok(u) = Url::parse(url) else { return false };
    htfaas_functions::percent::decode_utf8(u.path()).is_some_and(|decoded| decoded.ends_with(path))
}

impl UrlTrust {
    /// From the configured storage origins (`scheme://host[:port]`, no path) and module stores
    /// (base URLs, optionally with a path). Neither may be empty.
    pub fn new(storage_origins: &[String], module_stores: &[String]) -> Result<UrlTrust, TrustConfigError> {
        let bad = |key, value: &str, why: String| TrustConfigError::Bad { key, value: value.to_owned(), why };
        if storage_origins.is_empty() {
            return Err(TrustConfigError::NoStorage);
        }
        if module_stores.is_empty() {
            return Err(TrustConfigError::NoModuleStore);
        }
        let mut storages = Vec::new();
        for s in storage_origins {
            let u = parse_clean(s).map_err(|why| bad("storage_origins", s, why))?;
            if u.path() != "/" {
                return Err(bad("storage_origins", s, "must be scheme://host[:port] without a path".into()));
            }
            let origin = Origin::of(&u).ok_or_else(|| bad("storage_origins", s, "names no host or port".into()))?;
            if !storages.contains(&origin) {
                storages.push(origin);
            }
        }
        let mut stores = Vec::new();
        for s in module_stores {
            let u = parse_clean(s).map_err(|why| bad("module_stores", s, why))?;
            let origin = Origin::of(&u).ok_or_else(|| bad("module_stores", s, "names no host or port".into()))?;
            let store = ModuleStore { origin, prefix: u.path().trim_end_matches('/').to_owned() };
            if !stores.contains(&store) {
                stores.push(store);
            }
        }
        Ok(UrlTrust { storages, module_stores: stores })
    }

    /// The trusted storage origins, as shown in refusals.
    fn storages_shown(&self) -> String {
        self.storages.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    }

    /// A storage URL of field `field`: under a trusted storage origin, with a clean path.
    fn check_storage(&self, field: &'static str, raw: &str) -> Result<(), UrlRefusal> {
        let u = parse_clean(raw).map_err(|why| UrlRefusal::Malformed { field, url: shown(raw), why })?;
        match Origin::of(&u) {
            Some(o) if self.storages.contains(&o) => Ok(()),
            _ => Err(UrlRefusal::UntrustedStorage { field, url: shown(raw), trusted: self.storages_shown() }),
        }
    }

    /// A module URL: exactly a module store's URL for `digest` (a job's, and a warm request's).
    pub fn check_module(&self, digest: &Digest, module: &str) -> Result<(), UrlRefusal> {
        self.check_code("modules", digest, module)
    }

    /// A module or image URL: exactly a module store's URL for `digest` under `/v1/<store>/`.
    fn check_code(&self, store: &str, digest: &Digest, module: &str) -> Result<(), UrlRefusal> {
        let u = parse_clean(module).map_err(|why| UrlRefusal::Malformed {
            field: "function.module_url",
            url: shown(module),
            why,
        })?;
        let tail = format!("/v1/{store}/{digest}");
        let origin = Origin::of(&u);
        let at_store = self.module_stores.iter().any(|s| {
            Some(&s.origin) == origin.as_ref() && u.path().strip_prefix(s.prefix.as_str()) == Some(tail.as_str())
        });
        if !at_store {
            let expected = self.module_stores.iter().map(|s| format!("{s}{tail}")).collect::<Vec<_>>().join(" or ");
            return Err(UrlRefusal::UntrustedModule { url: shown(module), expected });
        }
        Ok(())
    }

    /// Every URL of `req` (see the module docs).
    pub fn check(&self, req: &SubmitRequest) -> Result<(), UrlRefusal> {
        let store = if req.function.native.is_some() { "images" } else { "modules" };
        self.check_code(store, &req.function.digest, &req.function.module_url)?;
        match &req.input {
            Some(input) => self.check_storage("input.url", &input.url)?,
            // A run on no file names no file: its event may not claim one.
            None if !req.event.path.is_empty() => {
                return Err(UrlRefusal::NoInputPath { path: shown(&req.event.path) });
            }
            None => {}
        }
        self.check_storage("output.url", &req.output.url)?;
        if let Some(input) = &req.input
            && !names_file(&input.url, &req.event.path)
        {
            return Err(UrlRefusal::EventPath { path: shown(&req.event.path), url: shown(&input.url) });
        }
        for r in &req.refs {
            self.check_storage("refs.url", &r.url)?;
            // The guest path is the file's own storage path: a reference cannot pose as another.
            if !names_file(&r.url, &format!("/{}", r.path)) {
                return Err(UrlRefusal::RefPath { path: shown(&r.path), url: shown(&r.url) });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trust() -> UrlTrust {
        UrlTrust::new(&["http://storage.example:2880".into()], &["https://gw.example/htfaas/".into()]).expect("trust")
    }

    fn storage(url: &str) -> Result<(), UrlRefusal> {
        trust().check_storage("input.url", url)
    }

    #[test]
    fn storage_urls_must_be_on_a_trusted_origin() {
        assert_eq!(storage("http://storage.example:2880/data/raw/a.dat"), Ok(()));
        assert_eq!(storage("http://STORAGE.example:2880/data/out/"), Ok(()), "hosts compare case-insensitively");
        for bad in [
            "http://storage.example/data/a",       // another port (80)
            "https://storage.example:2880/data/a", // another scheme
            "http://127.0.0.1:2880/data/a",        // another host
            "http://storage.example.evil:2880/a",  // a suffix is another host
            "http://169.254.169.254/latest/meta-data/",
        ] {
            let e = storage(bad).expect_err(bad);
            assert!(matches!(e, UrlRefusal::UntrustedStorage { .. }), "{bad}: {e}");
        }
        assert_eq!(
            storage("http://10.0.0.5:8080/admin").expect_err("internal").to_string(),
            "input.url \"http://10.0.0.5:8080/admin\" is not on a storage this scheduler trusts \
             (http://storage.example:2880)"
        );
    }

    #[test]
    fn the_event_path_is_the_file_the_input_url_names() {
        let url = "http://storage.example:2880/base/data/raw/a%20b.dat";
        assert!(names_file(url, "/data/raw/a b.dat"));
        assert!(names_file(url, "/base/data/raw/a b.dat"));
        // The gateway encodes every byte but unreserved ones; the parser leaves `=` alone.
        let markup = "/data/raw/<img src=x onerror=window.__xss=1>.dat";
        assert!(names_file("http://s:1/data/raw/%3Cimg%20src%3Dx%20onerror%3Dwindow.__xss%3D1%3E.dat", markup));
        assert!(names_file("http://s:1/data/raw/%3Cimg%20src=x%20onerror=window.__xss=1%3E.dat", markup));
        for other in ["/data/raw/a.dat", "/data/alice/secret.txt", "/data/raw/../raw/a b.dat", "/data/raw/", "data"] {
            assert!(!names_file(url, other), "{other}");
        }
    }

    #[test]
    fn storage_paths_must_be_clean_and_urls_plain() {
        for bad in [
            "http://storage.example:2880/data/../etc/passwd",
            "http://storage.example:2880/data/./a",
            "http://storage.example:2880/data/%2e%2e/a",
            "http://storage.example:2880/data/%2E%2e/a",
            "http://storage.example:2880/data%2fa",
            "http://storage.example:2880/data%5Ca",
            "http://storage.example:2880/data\\..\\a",
            "http://storage.example:2880/data//a",
            "http://storage.example:2880/a%00b",
            "http://user:secret@storage.example:2880/a",
            "http://storage.example:2880/a?x=1",
            "http://storage.example:2880/a#f",
            "ftp://storage.example:2880/a",
            "file:///etc/passwd",
            "http://storage.example:2880/a b",
            "not a url",
        ] {
            let e = storage(bad).expect_err(bad);
            assert!(matches!(e, UrlRefusal::Malformed { field: "input.url", .. }), "{bad}: {e}");
            assert!(!e.to_string().contains("secret"), "a password is never shown: {e}");
        }
    }

    #[test]
    fn the_module_url_must_be_the_stores_url_for_the_digest() {
        let mut req = crate::testing::request("k");
        req.input.as_mut().expect("an input").url = "http://storage.example:2880/data/raw/a".into();
        req.output.url = "http://storage.example:2880/data/out/".into();
        let good = format!("https://gw.example/htfaas/v1/modules/{}", req.function.digest);
        req.function.module_url = good.clone();
        assert_eq!(trust().check(&req), Ok(()));
        let other = htfaas_functions::Digest::of(b"another module");
        for bad in [
            format!("https://gw.example/htfaas/v1/modules/{other}"),
            format!("https://gw.example/v1/modules/{}", req.function.digest),
            format!("http://gw.example/htfaas/v1/modules/{}", req.function.digest),
            format!("https://evil.example/htfaas/v1/modules/{}", req.function.digest),
            "http://10.0.0.1/m.wasm".into(),
        ] {
            req.function.module_url = bad.clone();
            let e = trust().check(&req).expect_err(&bad);
            assert!(matches!(e, UrlRefusal::UntrustedModule { .. }), "{bad}: {e}");
        }
        req.function.module_url = "http://10.0.0.1/m.wasm".into();
        assert_eq!(
            trust().check(&req).expect_err("foreign").to_string(),
            format!(
                "function.module_url \"http://10.0.0.1/m.wasm\" is not the module store's URL for the job's \
                 digest: expected https://gw.example:443/htfaas/v1/modules/{}",
                req.function.digest
            )
        );
        req.function.module_url = good;
        req.output.url = "http://internal:9000/upload/".into();
        assert!(matches!(trust().check(&req), Err(UrlRefusal::UntrustedStorage { field: "output.url", .. })));
    }

    /// A job without an input (a run on no file) names no path: one whose event claims a file
    /// is refused, as its trails would show it reading that file.
    #[test]
    fn a_job_without_an_input_names_no_path() {
        let mut req = crate::testing::request("k");
        req.output.url = "http://storage.example:2880/data/out/".into();
        req.function.module_url = format!("https://gw.example/htfaas/v1/modules/{}", req.function.digest);
        req.input = None;
        req.event.path = String::new();
        assert_eq!(trust().check(&req), Ok(()));
        for lie in ["/data/alice/secret.txt", "/data/raw/a", "/"] {
            req.event.path = lie.into();
            let e = trust().check(&req).expect_err(lie);
            assert_eq!(e, UrlRefusal::NoInputPath { path: lie.into() });
            assert!(e.to_string().contains("names a file, but the job has no input"), "{e}");
        }
    }

    #[test]
    fn configured_origins_are_checked() {
        let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(UrlTrust::new(&[], &s(&["http://gw"])).expect_err("empty"), TrustConfigError::NoStorage);
        assert_eq!(UrlTrust::new(&s(&["http://st"]), &[]).expect_err("empty"), TrustConfigError::NoModuleStore);
        let e = UrlTrust::new(&s(&["http://st/data"]), &s(&["http://gw"])).expect_err("a path");
        assert_eq!(e.to_string(), "storage_origins: \"http://st/data\" must be scheme://host[:port] without a path");
        assert!(UrlTrust::new(&s(&["st:80"]), &s(&["http://gw"])).is_err());
        assert!(UrlTrust::new(&s(&["http://st/"]), &s(&["http://gw/a/../b"])).is_err());
    }
}
