//! TLS on a component's listener (the scheduler's HTTPS and WSS, the gateway's HTTPS API), when
//! its config names `tls_cert_file` and `tls_key_file`.
//!
//! - [`server_config`]: reads the PEM certificate chain and private key into a rustls
//!   [`ServerConfig`] (ring, TLS 1.2 and 1.3, ALPN `http/1.1` only: the EP's attach is an
//!   HTTP/1.1 upgrade, and the axum build here serves HTTP/1 only).
//! - [`TlsListener`]: an [`axum::serve::Listener`] over a `TcpListener` that hands axum only
//!   connections whose handshake finished. Each handshake runs in its own task under
//!   [`HANDSHAKE_TIMEOUT`], so a client that opens TCP and never speaks TLS (or speaks plain
//!   HTTP) delays no one else; a failed or timed-out handshake is logged at debug and dropped.
//!   At most [`MAX_PENDING_HANDSHAKES`] run at once; past that, new connections wait in the
//!   kernel's backlog until one ends.
//!
//! Without TLS configured, none of this runs: the component serves its plain `TcpListener`.
//! Must not know: routes, credentials, or which component serves.

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client has, from TCP accept, to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most TLS handshakes in progress at once.
pub const MAX_PENDING_HANDSHAKES: usize = 1024;

/// Why a certificate and key cannot be served; each names the config field at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// `tls_cert_file` or `tls_key_file` could not be read.
    #[error("read {field} {}: {source}", path.display())]
    Read {
        /// The config field.
        field: &'static str,
        /// Its value.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The file is not PEM of the expected kind.
    #[error("parse {field} {}: {reason}", path.display())]
    Parse {
        /// The config field.
        field: &'static str,
        /// Its value.
        path: PathBuf,
        /// What the PEM parser said.
        reason: String,
    },
    /// `tls_cert_file` holds no certificate.
    #[error("tls_cert_file {} holds no PEM certificate", .0.display())]
    NoCertificate(PathBuf),
    /// `tls_key_file` holds no private key.
    #[error("tls_key_file {} holds no PEM private key", .0.display())]
    NoKey(PathBuf),
    /// Only one of the pair is set.
    #[error("tls_cert_file and tls_key_file must be set together")]
    Unpaired,
    /// rustls refused the pair (the key is not the certificate's, an unsupported key type).
    #[error("use tls_cert_file {} with tls_key_file {}: {source}", cert.display(), key.display())]
    Refused {
        /// `tls_cert_file`.
        cert: PathBuf,
        /// `tls_key_file`.
        key: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
}

/// The server configuration for a config's optional `tls_cert_file` and `tls_key_file`: none
/// when neither is set, an error when only one is.
pub fn optional_server_config(
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
) -> Result<Option<Arc<ServerConfig>>, TlsConfigError> {
    match (cert_file, key_file) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => server_config(cert, key).map(Some),
        _ => Err(TlsConfigError::Unpaired),
    }
}

/// The rustls server configuration for `cert_file` (PEM, leaf first, then any intermediates)
/// and `key_file` (PEM, PKCS#8, PKCS#1 or SEC1), with the ring provider. Fails if either file
/// cannot be read or holds nothing usable, or if the key does not belong to the certificate.
pub fn server_config(cert_file: &Path, key_file: &Path) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let read = |field, path: &Path| {
        std::fs::read(path).map_err(|source| TlsConfigError::Read { field, path: path.to_owned(), source })
    };
    let parse = |field, path: &Path, e: rustls::pki_types::pem::Error| TlsConfigError::Parse {
        field,
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let pem = read("tls_cert_file", cert_file)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| parse("tls_cert_file", cert_file, e))?;
    if chain.is_empty() {
        return Err(TlsConfigError::NoCertificate(cert_file.to_owned()));
    }
    let pem = read("tls_key_file", key_file)?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsConfigError::NoKey(key_file.to_owned()),
        e => parse("tls_key_file", key_file, e),
    })?;
    let refused = |source| TlsConfigError::Refused { cert: cert_file.to_owned(), key: key_file.to_owned(), source };
    let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(refused)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(refused)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A TCP listener that yields TLS streams, handshakes done concurrently (see the module docs).
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
    /// Handshakes in progress; each yields the stream, or `None` when it failed. Dropped (and
    /// so aborted) with the listener.
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("tcp", &self.tcp)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("pending_handshakes", &self.handshakes.len())
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    /// Serves TLS with `config` on `tcp`, handshakes limited to [`HANDSHAKE_TIMEOUT`].
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> TlsListener {
        TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(config),
            handshake_timeout: HANDSHAKE_TIMEOUT,
            handshakes: JoinSet::new(),
        }
    }

    /// Another handshake time limit (tests use a short one).
    pub fn with_handshake_timeout(mut self, limit: Duration) -> TlsListener {
        self.handshake_timeout = limit;
        self
    }

    fn start_handshake(&mut self, tcp: TcpStream, peer: SocketAddr) {
        // TCP_NODELAY, as for plain HTTP: no write waits for the peer's delayed ACK.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("failed to set TCP_NODELAY: {e}");
        }
        let acceptor = self.acceptor.clone();
        let limit = self.handshake_timeout;
        self.handshakes.spawn(async move {
            match tokio::time::timeout(limit, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => Some((tls, peer)),
                Ok(Err(e)) => {
                    tracing::debug!(%peer, "TLS handshake failed: {e}");
                    None
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake not finished within {limit:?}; dropped");
                    None
                }
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    /// Cancel-safe: both awaits (TCP accept, next finished handshake) are; handshakes keep
    /// running in their tasks between calls.
    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                accepted = self.tcp.accept(), if self.handshakes.len() < MAX_PENDING_HANDSHAKES => match accepted {
                    Ok((tcp, peer)) => self.start_handshake(tcp, peer),
                    Err(e) => accept_error(e).await,
                },
                Some(done) = self.handshakes.join_next() => match done {
                    Ok(Some(conn)) => return conn,
                    Ok(None) => {}
                    Err(e) => tracing::error!("TLS handshake task failed: {e}"),
                },
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// What axum's own TCP listener does with an accept error: a connection's own failure is
/// skipped; anything else (out of file descriptors, say) is logged and waited out for a second.
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset) {
        return;
    }
    tracing::error!("accept error: {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A CA-signed certificate for 127.0.0.1 in `dir`: (CA PEM, cert path, key path).
    fn certs(dir: &Path) -> (String, std::path::PathBuf, std::path::PathBuf) {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("CA cert");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("cert");
        let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_path, cert.pem()).expect("write cert");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        (ca_cert.pem(), cert_path, key_path)
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, cert, key) = certs(dir.path());
        assert!(server_config(&cert, &key).is_ok());
        let missing = dir.path().join("missing.pem");
        let err = |c: &Path, k: &Path| server_config(c, k).expect_err("fails").to_string();
        assert!(err(&missing, &key).starts_with("read tls_cert_file"), "{}", err(&missing, &key));
        assert!(err(&cert, &missing).starts_with("read tls_key_file"), "{}", err(&cert, &missing));
        // Each file holds the other's kind only.
        assert!(err(&key, &key).contains("holds no PEM certificate"), "{}", err(&key, &key));
        assert!(err(&cert, &cert).contains("holds no PEM private key"), "{}", err(&cert, &cert));
        // A key that is not the certificate's.
        let other = dir.path().join("other");
        std::fs::create_dir(&other).expect("mkdir");
        let (_, _, other_key) = certs(&other);
        let e = err(&cert, &other_key);
        assert!(e.starts_with("use tls_cert_file") && e.contains("key"), "{e}");
        // One of the pair alone; neither.
        assert!(matches!(optional_server_config(Some(&cert), None), Err(TlsConfigError::Unpaired)));
        assert!(matches!(optional_server_config(None, Some(&key)), Err(TlsConfigError::Unpaired)));
        assert!(matches!(optional_server_config(None, None), Ok(None)));
    }

    /// A client that never sends a ClientHello is dropped after the handshake limit, and does
    /// not hold up a client that handshakes meanwhile.
    #[tokio::test]
    async fn a_silent_client_is_dropped_after_the_limit_without_blocking_others() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca, cert, key) = certs(dir.path());
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let mut listener = TlsListener::new(tcp, server_config(&cert, &key).expect("config"))
            .with_handshake_timeout(Duration::from_secs(1));
        let server = tokio::spawn(async move {
            // Serve two streams: echo one byte on each.
            for _ in 0..2 {
                let (mut tls, _) = listener.accept().await;
                tokio::spawn(async move {
                    let mut b = [0u8; 1];
                    if tls.read_exact(&mut b).await.is_ok() {
                        let _ = tls.write_all(&b).await;
                    }
                });
            }
        });

        let started = std::time::Instant::now();
        let mut silent = TcpStream::connect(addr).await.expect("connect");

        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca.as_bytes()).expect("CA")).expect("add CA");
        let client = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let mut tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp))
            .await
            .expect("handshake in time")
            .expect("handshake");
        tls.write_all(b"x").await.expect("write");
        let mut b = [0u8; 1];
        tls.read_exact(&mut b).await.expect("echo");
        assert_eq!(&b, b"x");
        assert!(started.elapsed() < Duration::from_secs(1), "served before the silent client timed out");

        // The silent client is closed by the server once its second is up.
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0, "server sent bytes to a client that said nothing");
        assert!(started.elapsed() >= Duration::from_millis(900), "closed after {:?}", started.elapsed());
        server.abort();
    }
}
