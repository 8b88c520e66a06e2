//! Failure webhooks: which may be called ([`Webhooks::check`]: `https`, a host and
//! port the site lists in `webhook_hosts`, no user part), where the call may land (every address
//! the host resolves to must be public, or in a network the site lists in
//! `webhook_private_networks`, or be the very address listed as a host: [`AddressPolicy`],
//! checked by the client's resolver at each connection, so a listed name that resolves to
//! loopback, link-local or a private range is refused), with which client (no redirect
//! followed), and the counts of what came of the deliveries ([`crate::webhook_feed`] delivers
//! them).
//!
//! Must not know: NATS, the notifications, `Shared`, routes.

use htfaas_functions::manifest::Webhook;
use ipnet::IpNet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// The hosts a webhook may name, the client that calls them, and what came of the calls.
#[derive(Debug)]
pub struct Webhooks {
    /// (host, port) pairs, lower-case, IPv6 without brackets.
    hosts: Vec<(String, u16)>,
    /// Where a receiver's addresses may lie.
    policy: Arc<AddressPolicy>,
    /// The client deliveries use (its resolver applies `policy`).
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
    /// The host and port are not ones the site lists.
    #[error("webhook.url: {0} is not a host and port this site allows (the gateway's webhook_hosts)")]
    Host(String),
    /// The host is an address in a range the site does not allow.
    #[error("webhook.url: {0}")]
    Address(String),
}

/// Why a `webhook_hosts` or `webhook_private_networks` entry is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadWebhookSetting(pub String);

/// Where a webhook receiver's addresses may lie: any public address; a loopback, link-local,
/// private, shared (CGNAT), unspecified, multicast or documentation one only when it is in
/// `networks` or is an address listed as a host.
#[derive(Debug, Default)]
pub struct AddressPolicy {
    networks: Vec<IpNet>,
    literals: Vec<IpAddr>,
}

impl AddressPolicy {
    /// Whether a receiver may be reached at `ip`; `Err` says why not.
    pub(crate) fn allows(&self, ip: IpAddr) -> Result<(), String> {
        let ip = ip.to_canonical();
        if !is_internal(ip) || self.literals.contains(&ip) || self.networks.iter().any(|n| n.contains(&ip)) {
            return Ok(());
        }
        Err(format!(
            "{ip} is a loopback, link-local or private address, which this site does not list \
             (the gateway's webhook_private_networks)"
        ))
    }
}

/// Whether `ip` is not a public unicast address.
fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 198 && (b == 18 || b == 19))
                || a >= 240
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first == 0x2001 && v6.segments()[1] == 0x0db8)
        }
    }
}

/// `host` or `host:port` (`[v6]:port`) as (lower-case host, port; 443 when none).
fn host_port(entry: &str) -> Result<(String, u16), BadWebhookSetting> {
    let bad = |why: &str| BadWebhookSetting(format!("webhook_hosts: {entry:?} {why}"));
    let url = reqwest::Url::parse(&format!("https://{entry}/")).map_err(|_| bad("is not a host or host:port"))?;
    if url.path() != "/" || !url.username().is_empty() || url.query().is_some() {
        return Err(bad("is not a host or host:port"));
    }
    let host = url.host_str().ok_or_else(|| bad("names no host"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    Ok((host, url.port().unwrap_or(443)))
}

impl Webhooks {
    /// Webhooks to `hosts` (`host` for port 443, or `host:port`; compared case-insensitively),
    /// whose receivers may lie in the internal `networks` (CIDRs) besides any public address,
    /// called with the client `client` builds around the resolver that enforces it.
    pub fn new(
        hosts: &[String],
        networks: &[String],
        client: reqwest::ClientBuilder,
    ) -> Result<Webhooks, BadWebhookSetting> {
        let hosts = hosts.iter().map(|h| host_port(h)).collect::<Result<Vec<_>, _>>()?;
        let networks = networks
            .iter()
            .map(|n| {
                n.parse::<IpNet>().or_else(|_| n.parse::<IpAddr>().map(IpNet::from)).map_err(|_| {
                    BadWebhookSetting(format!("webhook_private_networks: {n:?} is not an address or CIDR network"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let literals = hosts.iter().filter_map(|(h, _)| h.parse::<IpAddr>().ok()).map(|ip| ip.to_canonical()).collect();
        let policy = Arc::new(AddressPolicy { networks, literals });
        let http = client
            .dns_resolver(Arc::new(Resolver(policy.clone())))
            .build()
            .map_err(|e| BadWebhookSetting(format!("build the webhook client: {e}")))?;
        Ok(Webhooks { hosts, policy, http, delivered: AtomicU64::new(0), failed: AtomicU64::new(0) })
    }

    /// Whether `webhook` may be called: an `https` URL, no user part, its host and port listed,
    /// and an address for a host only where the site allows it (a name's addresses are checked
    /// when it is resolved, at each delivery).
    pub fn check(&self, webhook: &Webhook) -> Result<reqwest::Url, WebhookRefused> {
        let url = reqwest::Url::parse(&webhook.url).map_err(|e| WebhookRefused::Url(e.to_string()))?;
        if url.scheme() != "https" || !url.username().is_empty() || url.password().is_some() {
            return Err(WebhookRefused::Url(format!("{:?} is not https://host/… without a user part", webhook.url)));
        }
        let host = url.host_str().ok_or_else(|| WebhookRefused::Url("no host".into()))?.to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = url.port_or_known_default().unwrap_or(443);
        if !self.hosts.iter().any(|(h, p)| *h == host && *p == port) {
            return Err(WebhookRefused::Host(if port == 443 { host } else { format!("{host}:{port}") }));
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            self.policy.allows(ip).map_err(WebhookRefused::Address)?;
        }
        Ok(url)
    }
}

/// A receiver's name resolved to an address the site does not allow ([`AddressPolicy`]): the
/// resolver's error, found again in a failed request's chain by [`refused_address`].
#[derive(Debug, thiserror::Error)]
#[error("webhook host {host} resolves to {why}")]
pub struct AddressRefused {
    host: String,
    why: String,
}

/// The [`AddressRefused`] behind a failed webhook request, if that is why it failed (a refusal
/// of the site's policy, not worth another try).
pub fn refused_address<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a AddressRefused> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(refused) = c.downcast_ref::<AddressRefused>() {
            return Some(refused);
        }
        cause = c.source();
    }
    None
}

/// The webhook client's resolver: the system's, then every address checked against the policy
/// (one refused address refuses the name: a receiver does not get to pick which one is used).
struct Resolver(Arc<AddressPolicy>);

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for a in &addrs {
                if let Err(why) = policy.allows(a.ip()) {
                    return Err(Box::new(AddressRefused { host, why }) as Box<dyn std::error::Error + Send + Sync>);
                }
            }
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(url: &str) -> Webhook {
        Webhook { url: url.into(), key_secret: Webhook::DEFAULT_KEY_SECRET.into() }
    }

    fn webhooks(hosts: &[&str], networks: &[&str]) -> Webhooks {
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let networks: Vec<String> = networks.iter().map(|n| (*n).to_owned()).collect();
        Webhooks::new(&hosts, &networks, reqwest::Client::builder()).expect("valid")
    }

    #[test]
    fn only_https_urls_to_listed_hosts_and_ports_pass() {
        let w = webhooks(&["Hooks.Example.org", "hooks.example.org:8443", "127.0.0.1:9"], &[]);
        assert!(w.check(&hook("https://hooks.example.org/htfaas?x=1")).is_ok());
        assert!(w.check(&hook("https://HOOKS.example.org:8443/")).is_ok());
        assert!(w.check(&hook("https://hooks.example.org:443/")).is_ok());
        assert!(w.check(&hook("https://127.0.0.1:9/h")).is_ok(), "an address listed as a host is the site's word");
        for (url, why) in [
            ("http://hooks.example.org/", "not https"),
            ("https://evil.example.org/", "not listed"),
            ("https://hooks.example.org:22/", "a port not listed"),
            ("https://127.0.0.1:10/h", "another port of a listed address"),
            ("https://hooks.example.org.evil.example/", "a suffix is another host"),
            ("https://hooks.example.org@169.254.169.254/", "a user part hiding the host"),
            ("https://user:pw@hooks.example.org/", "a user part"),
            ("https://localhost/", "not listed"),
            ("https://[::1]/", "not listed"),
            ("not a url", "not a URL"),
        ] {
            assert!(w.check(&hook(url)).is_err(), "{url}: {why}");
        }
        let none = webhooks(&[], &[]);
        assert!(matches!(none.check(&hook("https://hooks.example.org/")), Err(WebhookRefused::Host(_))));
        assert!(Webhooks::new(&["a/b".into()], &[], reqwest::Client::builder()).is_err());
        assert!(Webhooks::new(&[], &["10.0.0.0/33".into()], reqwest::Client::builder()).is_err());
    }

    #[test]
    fn internal_addresses_pass_only_where_the_site_lists_them() {
        let policy = AddressPolicy { networks: vec!["10.1.0.0/16".parse().expect("net")], literals: vec![] };
        for ip in ["8.8.8.8", "2606:4700::1111", "10.1.2.3"] {
            assert!(policy.allows(ip.parse().expect("ip")).is_ok(), "{ip}");
        }
        for ip in [
            "127.0.0.1",
            "10.2.0.1",
            "192.168.1.1",
            "172.16.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
        ] {
            let e = policy.allows(ip.parse().expect("ip")).expect_err(ip);
            assert!(e.contains("webhook_private_networks"), "{e}");
        }
    }

    /// A listed name that resolves to loopback is refused at the connection, by the resolver.
    #[tokio::test]
    async fn a_listed_name_resolving_to_loopback_is_not_called() {
        let w = webhooks(&["localhost"], &[]);
        let url = w.check(&hook("https://localhost/h")).expect("listed");
        let e = w.http.post(url).send().await.expect_err("refused");
        let refused = refused_address(&e).expect("the policy's refusal in the chain").to_string();
        assert!(refused.contains("resolves to 127.0.0.1") && refused.contains("webhook_private_networks"), "{refused}");
    }
}
