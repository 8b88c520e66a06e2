//! Failure webhooks (issue 23): which may be called ([`Webhooks::check`]: `https`, a host the
//! site lists in `webhook_hosts`, no user part), with which client (no redirect followed), and
//! the counts of what came of the deliveries ([`crate::webhook_feed`] delivers them).
//!
//! Must not know: NATS, the notifications, `Shared`, routes.

use htfaas_functions::manifest::Webhook;
use std::sync::atomic::AtomicU64;

/// The hosts a webhook may name, the client that calls them, and what came of the calls.
#[derive(Debug)]
pub struct Webhooks {
    hosts: Vec<String>,
    /// The client deliveries use.
    pub http: reqwest::Client,
    /// Deliveries a receiver took (2xx).
    pub delivered: AtomicU64,
    /// Deliveries given up (refused, no key, host no longer allowed, tries exhausted).
    pub failed: AtomicU64,
}

/// Why a webhook is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookRefused {
    /// Not a URL, or not `https`.
    #[error("webhook.url must be an https URL with a host: {0}")]
    Url(String),
    /// The host is not one the site lists.
    #[error("webhook.url: the host {0:?} is not one this site allows (the gateway's webhook_hosts)")]
    Host(String),
}

impl Webhooks {
    /// Webhooks to `hosts` (compared case-insensitively), called with `http`.
    pub fn new(hosts: Vec<String>, http: reqwest::Client) -> Webhooks {
        let hosts = hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect();
        Webhooks { hosts, http, delivered: AtomicU64::new(0), failed: AtomicU64::new(0) }
    }

    /// Whether `webhook` may be called: an `https` URL, no user part, its host listed.
    pub fn check(&self, webhook: &Webhook) -> Result<reqwest::Url, WebhookRefused> {
        let url = reqwest::Url::parse(&webhook.url).map_err(|e| WebhookRefused::Url(e.to_string()))?;
        if url.scheme() != "https" || !url.username().is_empty() || url.password().is_some() {
            return Err(WebhookRefused::Url(format!("{:?} is not https://host/… without a user part", webhook.url)));
        }
        let host = url.host_str().ok_or_else(|| WebhookRefused::Url("no host".into()))?.to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        if !self.hosts.contains(&host) {
            return Err(WebhookRefused::Host(host));
        }
        Ok(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(url: &str) -> Webhook {
        Webhook { url: url.into(), key_secret: Webhook::DEFAULT_KEY_SECRET.into() }
    }

    #[test]
    fn only_https_urls_to_listed_hosts_pass() {
        let w = Webhooks::new(vec!["Hooks.Example.org".into(), "127.0.0.1".into()], reqwest::Client::new());
        assert!(w.check(&hook("https://hooks.example.org/htfaas?x=1")).is_ok());
        assert!(w.check(&hook("https://HOOKS.example.org:8443/")).is_ok());
        assert!(w.check(&hook("https://127.0.0.1:9/h")).is_ok());
        for (url, why) in [
            ("http://hooks.example.org/", "not https"),
            ("https://evil.example.org/", "not listed"),
            ("https://hooks.example.org.evil.example/", "a suffix is another host"),
            ("https://hooks.example.org@169.254.169.254/", "a user part hiding the host"),
            ("https://user:pw@hooks.example.org/", "a user part"),
            ("https://localhost/", "not listed"),
            ("https://[::1]/", "not listed"),
            ("not a url", "not a URL"),
        ] {
            assert!(w.check(&hook(url)).is_err(), "{url}: {why}");
        }
        let none = Webhooks::new(Vec::new(), reqwest::Client::new());
        assert!(matches!(none.check(&hook("https://hooks.example.org/")), Err(WebhookRefused::Host(_))));
    }
}
