//! Namespace paths: turning a request URI path into a clean absolute path, and the
//! segment-aware prefix and chaining rules that users' `paths` and macaroon `path:` caveats use.
//!
//! A clean path starts with `/`, has no empty, `.` or `..` segment, no NUL and no backslash,
//! and no trailing slash (except the root `/` itself). Everything here is pure string work;
//! mapping onto the disk is [`crate::fs`]'s job.

/// Why a request path was refused (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// A `%` not followed by two hex digits.
    #[error("bad percent-encoding in path")]
    BadEscape,
    /// The decoded bytes are not UTF-8.
    #[error("path is not UTF-8")]
    NotUtf8,
    /// Not absolute, or contains an empty, `.` or `..` segment, a NUL or a backslash.
    #[error("path {0:?} is not a clean absolute path (no '.', '..', empty segments, NUL or backslash)")]
    Unclean(String),
}

/// A clean absolute namespace path, as requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsPath {
    /// Clean path without trailing slash; `/` for the root.
    clean: String,
    /// Whether the request named it with a trailing slash (a directory).
    trailing_slash: bool,
}

impl NsPath {
    /// Percent-decodes a raw URI path and checks it (see the module doc).
    pub fn from_uri_path(raw: &str) -> Result<NsPath, PathError> {
        let bytes = percent_decode(raw)?;
        let decoded = String::from_utf8(bytes).map_err(|_| PathError::NotUtf8)?;
        NsPath::parse(&decoded)
    }

    /// Checks an already decoded path. A single trailing slash is allowed and remembered.
    pub fn parse(p: &str) -> Result<NsPath, PathError> {
        let unclean = || PathError::Unclean(p.to_owned());
        let Some(rest) = p.strip_prefix('/') else { return Err(unclean()) };
        if p.contains(['\0', '\\']) {
            return Err(unclean());
        }
        let (rest, trailing_slash) = match rest.strip_suffix('/') {
            Some(r) => (r, true),
            None => (rest, false),
        };
        if rest.is_empty() {
            return if trailing_slash {
                Err(unclean())
            } else {
                Ok(NsPath { clean: "/".into(), trailing_slash: true })
            };
        }
        if !rest.split('/').all(|s| !s.is_empty() && s != "." && s != "..") {
            return Err(unclean());
        }
        Ok(NsPath { clean: format!("/{rest}"), trailing_slash })
    }

    /// The clean path: no trailing slash, `/` for the root.
    pub fn as_str(&self) -> &str {
        &self.clean
    }

    /// Whether this is the namespace root.
    pub fn is_root(&self) -> bool {
        self.clean == "/"
    }

    /// Whether the request named a directory (trailing slash, or the root).
    pub fn is_dir(&self) -> bool {
        self.trailing_slash
    }

    /// The segments, root first; empty for `/`.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.clean.split('/').filter(|s| !s.is_empty())
    }
}

/// Segment-aware prefix test on clean paths: `/data/raw/x` and `/data/raw/x/y` are within
/// `/data/raw/x`; `/data/raw/xy` is not. Every path is within `/`.
pub fn is_within(path: &str, prefix: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some("") => true,
        Some(rest) => rest.starts_with('/'),
        None => false,
    }
}

/// dCache's relative chaining of `path:` caveats: `rel` is resolved *inside* `base`, even when
/// it starts with `/` (`/a` then `/b` means `/a/b`). Both must be clean; `rel` may lack the
/// leading slash and may have a trailing one.
pub fn chain(base: &str, rel: &str) -> Result<String, PathError> {
    let rel_abs = if rel.starts_with('/') { rel.to_owned() } else { format!("/{rel}") };
    let rel = NsPath::parse(&rel_abs)?;
    Ok(match (base, rel.as_str()) {
        (b, "/") => b.to_owned(),
        ("/", r) => r.to_owned(),
        (b, r) => format!("{b}{r}"),
    })
}

/// Decodes `%XX` escapes strictly ([`htfaas_functions::percent::decode_strict`]); anything else
/// passes through (`+` stays `+`).
pub fn percent_decode(s: &str) -> Result<Vec<u8>, PathError> {
    htfaas_functions::percent::decode_strict(s).map_err(|_| PathError::BadEscape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths_parse_and_unclean_ones_are_refused() {
        let p = NsPath::from_uri_path("/data/raw/x%20y").expect("clean");
        assert_eq!(p.as_str(), "/data/raw/x y");
        assert!(!p.is_dir());
        let d = NsPath::from_uri_path("/data/out/").expect("clean dir");
        assert_eq!(d.as_str(), "/data/out");
        assert!(d.is_dir());
        assert!(NsPath::parse("/").expect("root").is_root());
        for bad in [
            "/data/../etc/passwd",
            "/data/%2e%2e/etc/passwd",
            "/data/%2E%2E%2Fetc",
            "/data/./x",
            "/data//x",
            "//",
            "data/x",
            "/data/x%00",
            "/data\\x",
            "/data/%5cx",
            "/%",
            "/%zz",
            "/%ff",
        ] {
            assert!(NsPath::from_uri_path(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn within_is_segment_aware() {
        assert!(is_within("/data/raw/x", "/data/raw/x"));
        assert!(is_within("/data/raw/x/y", "/data/raw/x"));
        assert!(!is_within("/data/raw/xy", "/data/raw/x"));
        assert!(!is_within("/data/raw", "/data/raw/x"));
        assert!(is_within("/anything", "/"));
    }

    #[test]
    fn chaining_is_relative_like_dcache() {
        assert_eq!(chain("/", "/data").expect("ok"), "/data");
        assert_eq!(chain("/data", "/raw").expect("ok"), "/data/raw");
        assert_eq!(chain("/data", "raw/x/").expect("ok"), "/data/raw/x");
        assert_eq!(chain("/data", "/").expect("ok"), "/data");
        assert!(chain("/data", "/../etc").is_err());
    }

    #[test]
    fn percent_encoding_round_trips() {
        let p = "/data/a b/ü%";
        let enc = htfaas_functions::percent::path(p);
        assert_eq!(enc, "/data/a%20b/%C3%BC%25");
        assert_eq!(percent_decode(&enc).expect("valid"), p.as_bytes());
    }
}
