//! The TLS trust of the attach link: the system's roots plus the config's `tls_ca_file`,
//! verified as reqwest verifies (rustls-platform-verifier), with ring.
//!
//! Bottom of the EP: must not know about the attach protocol or jobs.

use anyhow::{Context as _, anyhow, bail};
use rustls::ClientConfig;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use std::path::Path;
use std::sync::Arc;

/// Reads `path`, a PEM file of one or more CA certificates (`tls_ca_file`), checking that each
/// is usable as a trust anchor. Errors name the file and what is wrong with it.
pub(crate) fn read_ca_file(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("parse {}: {e}", path.display()))?;
    if certs.is_empty() {
        bail!("{} holds no PEM certificate", path.display());
    }
    let mut roots = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        roots
            .add(cert.clone())
            .map_err(|e| anyhow!("{}: certificate {} is not a usable CA certificate: {e}", path.display(), i + 1))?;
    }
    Ok(certs)
}

/// The rustls client configuration of a `wss://` attach link: the system's roots plus
/// `extra_roots`, verified as reqwest verifies (rustls-platform-verifier), with ring.
pub(crate) fn attach_tls_config(extra_roots: &[CertificateDer<'static>]) -> anyhow::Result<Arc<ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra_roots.iter().cloned(), provider.clone())
            .context("load trusted CA certificates")?;
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        // Not a way around verification: this is how a verifier other than the default
        // WebPKI one is plugged in.
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(Arc::new(config))
}
