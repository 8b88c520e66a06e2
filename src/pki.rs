//! A private certificate authority for a stack or a test site: one CA and one server
//! certificate for the hosts named, as PEM files under `<dir>/pki/`. The local stack with
//! `tls` and the multi-host harness use it; a real site brings certificates from its own CA.
//!
//! Must not know: which component serves with the certificate, or how a stack is laid out
//! beyond its `pki/` directory.

use anyhow::Context as _;
use std::path::{Path, PathBuf};

/// The files of a [`make`]: the CA's certificate (what clients trust) and the server's
/// certificate chain and key (what `tls_cert_file` and `tls_key_file` name).
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA's certificate, PEM.
    pub ca_file: PathBuf,
    /// The server certificate, PEM, valid for every host given to [`make`].
    pub cert_file: PathBuf,
    /// Its private key, PEM, mode 0600.
    pub key_file: PathBuf,
}

/// Where [`make`] writes under `dir`.
pub fn paths(dir: &Path) -> Pki {
    let pki = dir.join("pki");
    Pki { ca_file: pki.join("ca.pem"), cert_file: pki.join("server-cert.pem"), key_file: pki.join("server-key.pem") }
}

/// A new CA named `name` and a certificate it signed for `hosts` (IP addresses or DNS names),
/// under `dir/pki/` (made 0700), replacing what was there.
pub fn make(dir: &Path, name: &str, hosts: &[String]) -> anyhow::Result<Pki> {
    let files = paths(dir);
    let pki = dir.join("pki");
    htfaas_functions::store::create_private_dir(&pki).with_context(|| format!("create {}", pki.display()))?;
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, name);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(hosts.to_vec())?.signed_by(&key, &issuer)?;
    std::fs::write(&files.ca_file, ca_cert.pem()).with_context(|| format!("write {}", files.ca_file.display()))?;
    std::fs::write(&files.cert_file, cert.pem()).with_context(|| format!("write {}", files.cert_file.display()))?;
    htfaas_functions::store::write_private(&files.key_file, key.serialize_pem().as_bytes())
        .with_context(|| format!("write {}", files.key_file.display()))?;
    Ok(files)
}
