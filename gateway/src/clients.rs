//! The HTTP clients of the gateway: the one for the scheduler (and every other outgoing
//! call) and the storage's (extra roots, an x509 identity).
//!
//! Must not know: what is sent with them (no scheduler or storage protocol here).

use anyhow::Context as _;
use std::path::Path;
use std::time::Duration;

/// Builds the one HTTP client every outgoing call of this process uses.
pub fn http_client() -> anyhow::Result<reqwest::Client> {
    scheduler_http_client(None)
}

/// [`http_client`], also trusting the CA certificate(s) in `ca_file` (the scheduler's).
pub fn scheduler_http_client(ca_file: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    http_client_trusting(ca_file, "scheduler_ca_file")
}

/// [`http_client`], also trusting the CA certificate(s) in `ca_file`, which errors call `what`
/// (the config field or option it came from).
pub fn http_client_trusting(ca_file: Option<&Path>, what: &str) -> anyhow::Result<reqwest::Client> {
    // Installing twice is harmless: a second install reports the first one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).timeout(Duration::from_secs(30));
    trust(builder, ca_file, what)?.build().context("build the HTTP client")
}

/// The client of failure webhooks: [`http_client_trusting`] `ca_file`, and no
/// redirect followed (a receiver cannot send the POST on to a host the site did not allow).
pub fn webhook_http_client(ca_file: Option<&Path>) -> anyhow::Result<reqwest::ClientBuilder> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none());
    trust(builder, ca_file, "webhook_ca_file")
}

/// Adds the PEM certificates of `ca_file` (the config field `what`) as trusted roots.
fn trust(
    builder: reqwest::ClientBuilder,
    ca_file: Option<&Path>,
    what: &str,
) -> anyhow::Result<reqwest::ClientBuilder> {
    let Some(ca_file) = ca_file else { return Ok(builder) };
    let pem = std::fs::read(ca_file).with_context(|| format!("read {what} {}", ca_file.display()))?;
    let certs =
        reqwest::Certificate::from_pem_bundle(&pem).with_context(|| format!("parse {what} {}", ca_file.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{what} {} holds no certificate", ca_file.display());
    Ok(builder.tls_certs_merge(certs))
}

/// Builds the HTTP client the gateway asks the storage for macaroons with: like
/// [`http_client`], plus an extra trusted root (`ca_file`) and an x509 identity
/// (`client_cert` + `client_key`), each PEM.
pub fn storage_http_client(
    ca_file: Option<&Path>,
    client_cert: Option<&Path>,
    client_key: Option<&Path>,
) -> anyhow::Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Title-case header names on HTTP/1: XRootD 5.5's XrdHttp looks header names up
    // case-sensitively, and its macaroon handler wants exactly `Content-Type`.
    let builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .http1_title_case_headers();
    let mut builder = trust(builder, ca_file, "storage_ca_file")?;
    match (client_cert, client_key) {
        (None, None) => {}
        (Some(cert), Some(key)) => {
            let mut pem =
                std::fs::read(cert).with_context(|| format!("read storage_client_cert {}", cert.display()))?;
            pem.push(b'\n');
            pem.extend(std::fs::read(key).with_context(|| format!("read storage_client_key {}", key.display()))?);
            let identity = reqwest::Identity::from_pem(&pem).with_context(|| {
                format!("load the storage client identity from {} and {}", cert.display(), key.display())
            })?;
            builder = builder.identity(identity);
        }
        _ => anyhow::bail!("storage_client_cert and storage_client_key must be set together"),
    }
    builder.build().context("build the storage HTTP client")
}
