//! Where an EP may connect for a job: the origins of its config ([`crate::config::Config::allowed_origins`]).
//!
//! An assignment names three URLs (the module, the input, the output directory), and whoever
//! can submit a job chooses them: without a check, an EP would GET and PUT wherever a
//! submitter points it, from inside the site's network (a metadata service, an internal API),
//! with the bytes fed to a guest that can write them out again. So every URL of an assignment
//! is checked before anything is fetched, and every redirect the HTTP client would follow is
//! checked the same way (a storage door allowed here cannot bounce the EP elsewhere).
//!
//! A rule is an origin, `scheme://host[:port]` (the scheme's default port when left out), or
//! `scheme://host:*` for any port of that host and scheme. Hosts compare after the URL
//! parser's normalisation (lower case, IDNA, IPv4 in any of its spellings), so
//! `http://0x7f.1:8080` is `http://127.0.0.1:8080`. URLs with a user name or password are
//! refused whatever their origin.
//!
//! Without a list in the config, the EP allows the scheduler's host, any port, over http or
//! https ([`Origins::scheduler_host`]).
//!
//! Knows URLs and nothing of jobs, macaroons or HTTP.

use reqwest::Url;

/// One allowed origin.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    /// `http` or `https`; `None`: either.
    scheme: Option<String>,
    /// Normalised host (as [`Url::host_str`] gives it).
    host: String,
    /// `None`: any port.
    port: Option<u16>,
}

/// The origins an EP may reach for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origins {
    rules: Vec<Rule>,
}

/// An entry of `allowed_origins` that is not an origin.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("allowed_origins: {entry:?} is not an origin (want http(s)://host[:port|:*], nothing after): {why}")]
pub struct OriginError {
    entry: String,
    why: String,
}

/// Why [`Origins::check`] refused a URL: it names what the URL is for and, at most, its
/// origin (never its path or query, which may carry a credential).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginRefused {
    /// The URL is at an origin the EP was not told to trust (or is not http(s), or carries
    /// credentials).
    #[error("{what} {origin} is not among the EP's allowed origins; nothing fetched")]
    NotAllowed {
        /// What the assignment calls the URL.
        what: String,
        /// The URL's origin, `scheme://host:port`.
        origin: String,
    },
    /// The text does not parse as a URL.
    #[error("{what} is not a URL ({why}); nothing fetched")]
    NotUrl {
        /// What the assignment calls the URL.
        what: String,
        /// What the URL parser said.
        why: String,
    },
}

impl Origins {
    /// The rules of `entries` (`scheme://host[:port]` or `scheme://host:*`). An empty list
    /// allows nothing (every job fails); a list is what the operator wrote, so it is not widened.
    pub fn parse(entries: &[String]) -> Result<Origins, OriginError> {
        let rules = entries.iter().map(|e| parse_rule(e)).collect::<Result<Vec<_>, _>>()?;
        Ok(Origins { rules })
    }

    /// The default: any port of `scheduler_url`'s host, over http or https.
    pub fn scheduler_host(scheduler_url: &str) -> Result<Origins, OriginError> {
        let bad = |why: &str| OriginError { entry: scheduler_url.to_owned(), why: why.to_owned() };
        let url = Url::parse(scheduler_url).map_err(|e| bad(&e.to_string()))?;
        let host = url.host_str().ok_or_else(|| bad("no host"))?;
        Ok(Origins { rules: vec![Rule { scheme: None, host: host.to_owned(), port: None }] })
    }

    /// Whether `url` is http(s), has no credentials in it, and is at an allowed origin.
    pub fn allows(&self, url: &Url) -> bool {
        if !matches!(url.scheme(), "http" | "https") || !url.username().is_empty() || url.password().is_some() {
            return false;
        }
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return false;
        };
        self.rules.iter().any(|r| {
            r.host == host && r.scheme.as_deref().is_none_or(|s| s == url.scheme()) && r.port.is_none_or(|p| p == port)
        })
    }

    /// `Ok` when `url` (what the assignment calls `what`) may be reached; the refusal names
    /// `what` and the URL's origin (never its path or query, which may carry a credential).
    pub fn check(&self, what: &str, url: &str) -> Result<(), OriginRefused> {
        match Url::parse(url) {
            Ok(u) if self.allows(&u) => Ok(()),
            Ok(u) => Err(OriginRefused::NotAllowed { what: what.to_owned(), origin: origin_of(&u) }),
            Err(e) => Err(OriginRefused::NotUrl { what: what.to_owned(), why: e.to_string() }),
        }
    }

    /// The rules, as `allowed_origins` would spell them (for the start-up log).
    pub fn describe(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|r| {
                let scheme = r.scheme.as_deref().unwrap_or("http(s)");
                let port = r.port.map_or_else(|| "*".to_owned(), |p| p.to_string());
                format!("{scheme}://{}:{port}", r.host)
            })
            .collect()
    }
}

/// Most redirects followed in one transfer (reqwest's own default).
const MAX_REDIRECTS: usize = 10;

/// The HTTP client's redirect policy: follow at most [`MAX_REDIRECTS`], each only to an allowed
/// origin; a redirect elsewhere fails the request, naming the target's origin.
pub(crate) fn redirect_policy(origins: std::sync::Arc<Origins>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else if origins.allows(attempt.url()) {
            attempt.follow()
        } else {
            let to = origin_of(attempt.url());
            attempt.error(format!("redirect to {to}, which is not among the EP's allowed origins"))
        }
    })
}

/// `scheme://host:port` of `url`, for messages.
pub(crate) fn origin_of(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port_or_known_default() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    }
}

fn parse_rule(entry: &str) -> Result<Rule, OriginError> {
    let bad = |why: &str| OriginError { entry: entry.to_owned(), why: why.to_owned() };
    let (scheme, rest) = entry.split_once("://").ok_or_else(|| bad("no scheme"))?;
    if !matches!(scheme, "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#', '@']) {
        return Err(bad("only scheme, host and port"));
    }
    // `host:*`: any port. Parsed with a placeholder port so the host is normalised as in URLs.
    let (any_port, authority) = match rest.strip_suffix(":*") {
        Some(host) => (true, format!("{host}:1")),
        None => (false, rest.to_owned()),
    };
    let url = Url::parse(&format!("{scheme}://{authority}/")).map_err(|e| bad(&e.to_string()))?;
    let host = url.host_str().filter(|h| !h.is_empty()).ok_or_else(|| bad("no host"))?;
    let port = if any_port { None } else { url.port_or_known_default() };
    Ok(Rule { scheme: Some(scheme.to_owned()), host: host.to_owned(), port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).expect("url")
    }

    #[test]
    fn origins_match_scheme_host_and_port_after_normalisation() {
        let o = Origins::parse(&[
            "https://dcache.example.org".into(),
            "http://127.0.0.1:8080/".into(),
            "https://pool.example.org:*".into(),
        ])
        .expect("parses");
        assert!(o.allows(&url("https://dcache.example.org/data/a?authz=x")));
        assert!(o.allows(&url("https://DCACHE.example.org:443/data/a")));
        assert!(!o.allows(&url("http://dcache.example.org/data/a")), "another scheme");
        assert!(!o.allows(&url("https://dcache.example.org:2880/data/a")), "another port");
        assert!(o.allows(&url("http://0x7f.1:8080/x")), "IPv4 spelled in hex is 127.0.0.1");
        assert!(o.allows(&url("http://2130706433:8080/x")), "IPv4 as one number is 127.0.0.1");
        assert!(!o.allows(&url("http://127.0.0.1:8081/x")));
        assert!(o.allows(&url("https://pool.example.org:20001/x")));
        assert!(!o.allows(&url("http://pool.example.org:20001/x")));
        assert!(!o.allows(&url("https://evil.example.org/x")));
        assert!(!o.allows(&url("https://dcache.example.org.evil.example/x")));
        assert!(!o.allows(&url("https://user:pw@dcache.example.org/x")), "credentials in the URL");
        assert!(!o.allows(&url("file:///etc/passwd")));
    }

    #[test]
    fn the_default_is_the_scheduler_host_on_any_port() {
        let o = Origins::scheduler_host("http://127.0.0.1:8081").expect("default");
        assert!(o.allows(&url("http://127.0.0.1:9000/v1/modules/x")));
        assert!(o.allows(&url("https://127.0.0.1/x")));
        assert!(!o.allows(&url("http://169.254.169.254/latest/meta-data/")));
        assert!(!o.allows(&url("http://localhost:9000/x")), "a host is compared as written, not resolved");
        assert_eq!(o.describe(), ["http(s)://127.0.0.1:*"]);
    }

    #[test]
    fn refusals_name_what_and_the_origin_only() {
        let o = Origins::parse(&["http://s:1".into()]).expect("parses");
        assert_eq!(o.check("input", "http://s:1/a"), Ok(()));
        assert_eq!(
            o.check("input", "http://169.254.169.254/latest?authz=SECRET").expect_err("refused").to_string(),
            "input http://169.254.169.254:80 is not among the EP's allowed origins; nothing fetched"
        );
        assert_eq!(
            o.check("module", "not a url").expect_err("refused").to_string(),
            "module is not a URL (relative URL without a base); nothing fetched"
        );
    }

    #[test]
    fn bad_entries_are_refused_with_their_text() {
        for bad in ["dcache.example.org", "ftp://x", "http://x/path", "http://u@x", "http://", "http://x:99999"] {
            let e = Origins::parse(&[bad.into()]).expect_err(bad);
            assert!(e.to_string().starts_with(&format!("allowed_origins: {bad:?} is not an origin")), "{e}");
        }
    }
}
