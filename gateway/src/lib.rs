//! The gateway: where storage events become jobs, and the HTTP API of htfaas.
//!
//! - [`ingest`] reads storage events (dCache billing messages, CloudEvents from htfaas's
//!   bridges and other producers) from a durable JetStream consumer, normalizes those the site
//!   enabled ([`event`], [`event::SourcePolicy`]), finds the functions whose trigger matches
//!   ([`triggers`]) and queues one durable firing per function ([`firing`]: exactly once per
//!   (event, function, digest)); it acks the message once the firings are on disk.
//! - [`firing::dispatch`] turns firings into jobs, within each trigger's rate and debounce:
//!   obtains a read and a write macaroon from the storage ([`storage_client`]), mints a
//!   single-use submit token and submits the job to the scheduler ([`submit`]).
//! - [`api`] serves the registry (modules and functions) and proxies job and accounting queries
//!   to the scheduler.
//!
//! Invariants: the gateway never runs wasm and never talks to an EP; it never logs a macaroon or
//! a token, only their ids.

pub mod api;
pub mod audit;
pub mod bridge;
pub mod console;
pub mod event;
pub mod firing;
pub mod ingest;
pub mod metrics;
pub mod namespaces;
pub mod openapi;
pub mod replay;
pub mod stats;
pub mod storage_client;
pub mod submit;
pub mod triggers;

use anyhow::Context as _;
use axum::serve::ListenerExt as _;
use htfaas_functions::Registry;
use htfaas_functions::token::SigningKey;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Gateway configuration (a TOML/JSON file or the `htfaas up` defaults).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// HTTP API address. Tests use `127.0.0.1:0`.
    pub listen: SocketAddr,
    /// URL under which EPs reach this API (module downloads). Default: `http://<bound address>`.
    #[serde(default)]
    pub public_url: Option<String>,
    /// NATS server with JetStream, e.g. `nats://127.0.0.1:14222`.
    pub nats_url: String,
    /// The gateway's NATS credential: an nkey user seed (`SU…`), a secret. It needs the
    /// JetStream API (`$JS.API.>`), acks (`$JS.ACK.>`) and its inbox
    /// (`_INBOX.<its public key>.>`); it publishes no event. Default: none (a server without
    /// authorization).
    #[serde(default)]
    pub nats_nkey_seed: Option<htfaas_functions::nats::NatsCredential>,
    /// Which storage paths each events subject may speak for, tried in order, the first
    /// matching subject pattern deciding, e.g. `[{"subject": "storage.dcache.billing", "paths":
    /// ["/data/"]}, {"subject": "storage.cloudevents.xrootd-notify", "paths": ["/store/"]}]`.
    /// An event outside its subject's paths, or on a subject no rule names, is refused,
    /// counted (`events_out_of_bounds`) and acked. Default: none, and then every subject speaks
    /// for every path (one trusted storage; logged at start). See [`event::binding`].
    #[serde(default)]
    pub source_paths: Option<Vec<event::binding::SourcePaths>>,
    /// Durable consumer name on the events stream. Default: `gateway`.
    #[serde(default = "default_consumer")]
    pub consumer: String,
    /// Directory of the function registry (SQLite + modules).
    pub registry_dir: PathBuf,
    /// Storage base URL (dCache WebDAV door, XRootD HTTPS endpoint or the built-in storage),
    /// without trailing `/`.
    pub storage_url: String,
    /// Which macaroon-request dialect the storage speaks: `"dcache"` (also the built-in
    /// storage) or `"xrootd"` (XrdMacaroons; validities must then be `PT…` with H/M/S units).
    /// Default: `dcache`.
    #[serde(default)]
    pub storage_kind: storage_client::StorageKind,
    /// User the gateway authenticates as when asking the storage for macaroons (HTTP Basic).
    /// Unused, and may be empty, when a client certificate is configured.
    #[serde(default)]
    pub storage_user: String,
    /// That user's secret (HTTP Basic). Unused, and may be empty, with a client certificate.
    #[serde(default)]
    pub storage_secret: String,
    /// Extra trusted root certificate(s) for the storage's TLS, PEM (e.g. a site or test CA),
    /// in addition to the system's. Default: none.
    #[serde(default)]
    pub storage_ca_file: Option<PathBuf>,
    /// x509 client certificate (PEM, may include the chain) the gateway authenticates to the
    /// storage with, instead of HTTP Basic; needs `storage_client_key`. XRootD requires this.
    /// Default: none.
    #[serde(default)]
    pub storage_client_cert: Option<PathBuf>,
    /// Private key of `storage_client_cert`, PEM (PKCS#8, PKCS#1 or SEC1). Default: none.
    #[serde(default)]
    pub storage_client_key: Option<PathBuf>,
    /// Scheduler base URL (`https://…` when the scheduler serves TLS).
    pub scheduler_url: String,
    /// Extra trusted root certificate(s) for the scheduler's TLS, PEM, in addition to the
    /// system's. Default: none.
    #[serde(default)]
    pub scheduler_ca_file: Option<PathBuf>,
    /// Admin token of the scheduler, for proxying job and accounting queries.
    pub scheduler_admin_token: String,
    /// Ed25519 PKCS#8 PEM key that signs submit tokens; created if absent.
    pub signing_key_file: PathBuf,
    /// Where the public half is written as JWKS for the scheduler to trust. Default: beside the key.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// `iss` of submit tokens. Default: `htfaas-gateway`.
    #[serde(default = "default_issuer")]
    pub issuer: String,
    /// Bearer token for this API's admin routes.
    pub admin_token: String,
    /// Validity of read macaroons, ISO-8601. Default: `PT2H`.
    #[serde(default = "default_read_validity")]
    pub read_validity: String,
    /// Validity of write macaroons, ISO-8601. Default: `PT4H`.
    #[serde(default = "default_write_validity")]
    pub write_validity: String,
    /// Lifetime of a submit token, seconds: it is used at once. Default: 300.
    #[serde(default = "default_token_ttl_s")]
    pub token_ttl_s: u64,
    /// Deliveries of one event before JetStream gives up on it. Default: 20.
    #[serde(default = "default_max_deliver")]
    pub max_deliver: i64,
    /// Bind each job's macaroons to the EP that runs it: the scheduler adds `ip:<the EP's
    /// address as it sees it>` at dispatch (`SubmitRequest::bind_ep_address`). Only with
    /// `storage_kind: dcache` (dCache, the built-in storage); refused with `xrootd`, which fails
    /// any caveat it does not know. Set it only where EPs reach the storage from the address
    /// they reach the scheduler from (no NAT or proxy between them that differs). Default: false.
    #[serde(default)]
    pub bind_macaroons_to_ep: bool,
    /// Which event sources and types become events, e.g.
    /// `{"dcache_msg_types": ["transfer", "request", "remove"], "cloudevents": true}`; an
    /// unknown type name is refused at start. Default: dCache `transfer` messages and every
    /// CloudEvent (see [`event::SourcePolicy`]).
    #[serde(default)]
    pub sources: event::SourcePolicy,
    /// Directory of the gateway's own state: the durable firing table `firings.sqlite`
    /// ([`firing`]: events queued to become jobs, and the keys that make each (event,
    /// function) start one job). Default: the parent of `registry_dir` (the stack's `gateway/`).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// How long a firing's key (event id, function, digest) is kept after the firing was made,
    /// seconds: a copy of the event within it starts nothing. Default: 604800 (7 days), the
    /// events stream's `max_age`, so every redelivery the stream can still make falls inside the
    /// window. Past it, the scheduler's own dedupe key (kept forever) still refuses a second job.
    #[serde(default = "default_dedupe_window_s")]
    pub dedupe_window_s: u64,
    /// Most firings being prepared (macaroons) and submitted at once, so that one slow answer
    /// does not hold back the others. Default: 16.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Ed25519 PKCS#8 PEM key that signs the gateway audit trail's checkpoints (kid
    /// `gateway-audit-1`); created (mode 0600) if absent. The trail itself lives in the firing
    /// table's file, written in the same transactions as the decisions it records
    /// ([`audit`]). Default: `gateway-audit-key.pem` in the state directory.
    #[serde(default)]
    pub audit_key_file: Option<PathBuf>,
    /// The audit trail's head is signed once this many records have no checkpoint. Default: 1000.
    #[serde(default = "default_audit_checkpoint_records")]
    pub audit_checkpoint_records: u64,
    /// ... or once the last checkpoint is this old (checked every second), seconds. Default: 60.
    #[serde(default = "default_audit_checkpoint_s")]
    pub audit_checkpoint_s: u64,
    /// The site's namespace grants: which storage paths each owner (or `group:<name>`) may
    /// trigger on and read, where it may write (and replace) outputs, which annexes it may ask
    /// for, e.g. `[{"principal": "alice", "right": "read", "value": "/data/alice/"}]`. An owner
    /// with no grant may do nothing; admins add grants at run time (`htfaas ns grant`, kept in
    /// the registry), but only this list takes its own grants back. Default: none.
    #[serde(default)]
    pub namespaces: Vec<htfaas_functions::namespace::Grant>,
    /// Whether the firing table fsyncs each commit (`fsync`, the default: WAL with
    /// `synchronous=FULL`) or only writes it to its log (`log`: `synchronous=NORMAL`, survives a
    /// crash of the process, not of the machine). Either way a batch of events is one commit.
    #[serde(default)]
    pub durability: htfaas_functions::store::Durability,
    /// The API listener's header and body idle timeouts and connection cap. Default: see
    /// [`htfaas_functions::serve::Limits`].
    #[serde(default)]
    pub http: htfaas_functions::serve::Limits,
    /// How many distinct modules, and how many bytes of them, each owner may upload
    /// (`PUT /v1/modules` with a developer token; an admin's uploads count against none).
    /// Default: 100 modules, 1 GiB.
    #[serde(default)]
    pub module_quota: htfaas_functions::registry::ModuleQuota,
}

/// Default of [`Config::audit_checkpoint_records`].
pub fn default_audit_checkpoint_records() -> u64 {
    htfaas_functions::audit::CheckpointPolicy::default().every_records
}
/// Default of [`Config::audit_checkpoint_s`].
pub fn default_audit_checkpoint_s() -> u64 {
    htfaas_functions::audit::CheckpointPolicy::default().every_ms / 1000
}

fn default_consumer() -> String {
    "gateway".into()
}
fn default_issuer() -> String {
    "htfaas-gateway".into()
}
fn default_read_validity() -> String {
    "PT2H".into()
}
fn default_write_validity() -> String {
    "PT4H".into()
}
fn default_token_ttl_s() -> u64 {
    300
}
fn default_max_deliver() -> i64 {
    20
}
fn default_dedupe_window_s() -> u64 {
    htfaas_functions::proto::EVENTS_MAX_AGE_S
}
fn default_max_in_flight() -> usize {
    16
}

/// A resolved gateway: listener bound, registry open, key loaded, clients built.
pub struct Settings {
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    nats_url: String,
    nats_credential: Option<htfaas_functions::nats::NatsCredential>,
    consumer: String,
    max_deliver: i64,
    /// The API listener's limits ([`Config::http`]).
    http: htfaas_functions::serve::Limits,
}

/// What the ingest loop and the API share.
pub struct Shared {
    /// The function registry.
    pub registry: Registry,
    /// How many modules (and bytes of them) each owner may upload ([`Config::module_quota`]).
    pub module_quota: htfaas_functions::registry::ModuleQuota,
    /// Compiled triggers, rebuilt when the registry changes.
    pub triggers: triggers::TriggerCache,
    /// Namespace grants: who may trigger on, read and write where ([`namespaces`]).
    pub namespaces: namespaces::Namespaces,
    /// Talks to the storage.
    pub storage: storage_client::StorageClient,
    /// Mints tokens and submits to the scheduler.
    pub submitter: submit::Submitter,
    /// Counters.
    pub stats: stats::Stats,
    /// Counters of `/metrics` that `stats` does not hold (refused bearer tokens).
    pub metrics: metrics::Metrics,
    /// The durable firing table: events queued to become jobs, exactly once (and the audit
    /// trail, in the same file).
    pub firings: firing::Firings,
    /// Signs the audit trail's checkpoints.
    pub audit: audit::Auditing,
    /// Admin bearer token of this API (the bootstrap admin credential; API tokens are the
    /// others, see [`api`]).
    pub admin_token: String,
    /// Verifies API tokens ([`htfaas_functions::token::ApiClaims`]): the submit-token key, the
    /// gateway's issuer, [`htfaas_functions::token::API_AUDIENCE`].
    pub api_verifier: htfaas_functions::token::Verifier,
    /// The scheduler's revocations, as API-token checks read them (refreshed every few seconds).
    pub api_revocations: api::RevocationCache,
    /// Scheduler admin token (proxy).
    pub scheduler_admin_token: String,
    /// Base URL of this API as EPs see it.
    pub public_url: String,
    /// Whether jobs ask the scheduler to bind their macaroons to their EP's address (only ever
    /// true with a storage that speaks the dCache dialect).
    pub bind_macaroons_to_ep: bool,
    /// HTTP client.
    pub http: reqwest::Client,
    /// Which sources and types become events; read once per message, replaced whole.
    sources: std::sync::RwLock<Arc<event::SourcePolicy>>,
    /// Which paths each events subject may speak for ([`Config::source_paths`]).
    pub source_paths: Arc<event::binding::Bindings>,
}

impl Shared {
    /// The site's source policy now.
    pub fn sources(&self) -> Arc<event::SourcePolicy> {
        self.sources.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the source policy for the messages that follow (tests; an admin route later).
    pub fn set_sources(&self, policy: event::SourcePolicy) -> Result<(), String> {
        policy.validate()?;
        *self.sources.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
        Ok(())
    }
}

/// Builds the one HTTP client every outgoing call of this process uses.
pub fn http_client() -> anyhow::Result<reqwest::Client> {
    scheduler_http_client(None)
}

/// [`http_client`], also trusting the CA certificate(s) in `ca_file` (the scheduler's).
pub fn scheduler_http_client(ca_file: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    // Installing twice is harmless: a second install reports the first one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).timeout(Duration::from_secs(30));
    trust(builder, ca_file, "scheduler_ca_file")?.build().context("build the HTTP client")
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

impl Config {
    /// Binds the listener, opens the registry, loads or creates the signing key and publishes
    /// its JWKS.
    pub async fn resolve(self) -> anyhow::Result<Settings> {
        anyhow::ensure!(
            !(self.bind_macaroons_to_ep && self.storage_kind == storage_client::StorageKind::Xrootd),
            "bind_macaroons_to_ep needs a storage that knows dCache's ip: caveat; \
             storage_kind xrootd refuses every macaroon carrying one"
        );
        self.sources.validate().map_err(anyhow::Error::msg)?;
        self.http.check()?;
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .with_context(|| format!("bind the gateway API on {}", self.listen))?;
        let addr = listener.local_addr().context("read the bound address")?;
        let registry = Registry::open(&self.registry_dir)
            .with_context(|| format!("open the registry in {}", self.registry_dir.display()))?;
        let key = SigningKey::load_or_create(&self.signing_key_file, "gateway-1")
            .context("load the submit-token signing key")?;
        let jwks_file = self.jwks_file.clone().unwrap_or_else(|| self.signing_key_file.with_extension("jwks.json"));
        htfaas_functions::token::write_jwks(&jwks_file, &key.jwks())
            .with_context(|| format!("write {}", jwks_file.display()))?;
        let http = scheduler_http_client(self.scheduler_ca_file.as_deref())?;
        let api_verifier =
            htfaas_functions::token::Verifier::new(&self.issuer, htfaas_functions::token::API_AUDIENCE, &key.jwks())
                .context("build the API-token verifier")?;
        for v in [&self.read_validity, &self.write_validity] {
            anyhow::ensure!(v.starts_with('P') && v.len() > 2, "validity {v:?} is not an ISO-8601 duration");
            if self.storage_kind == storage_client::StorageKind::Xrootd {
                anyhow::ensure!(
                    storage_client::is_xrootd_validity(v),
                    "validity {v:?}: XRootD takes only PT… with H, M, S units (e.g. PT2H)"
                );
            }
        }
        let storage_http = storage_http_client(
            self.storage_ca_file.as_deref(),
            self.storage_client_cert.as_deref(),
            self.storage_client_key.as_deref(),
        )?;
        let storage_auth = if self.storage_client_cert.is_some() {
            storage_client::StorageAuth::ClientCert
        } else {
            anyhow::ensure!(
                !self.storage_user.is_empty(),
                "storage_user is empty and no storage_client_cert is set: the gateway cannot authenticate to the storage"
            );
            storage_client::StorageAuth::Basic { user: self.storage_user.clone(), secret: self.storage_secret.clone() }
        };
        anyhow::ensure!(self.max_in_flight >= 1, "max_in_flight must be at least 1");
        if self.dedupe_window_s < htfaas_functions::proto::EVENTS_MAX_AGE_S {
            tracing::warn!(
                dedupe_window_s = self.dedupe_window_s,
                "dedupe_window_s is shorter than the events stream's max age: a late redelivery \
                 is dropped only by the scheduler's dedupe key, after its macaroons were asked for"
            );
        }
        let state_dir = self
            .state_dir
            .clone()
            .unwrap_or_else(|| self.registry_dir.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(".")));
        let state_dir = if state_dir.as_os_str().is_empty() { PathBuf::from(".") } else { state_dir };
        htfaas_functions::store::create_private_dir(&state_dir)
            .with_context(|| format!("create {}", state_dir.display()))?;
        let firings_file = state_dir.join("firings.sqlite");
        let firings =
            firing::Firings::open_with(&firings_file, self.dedupe_window_s, self.max_in_flight, self.durability)
                .with_context(|| format!("open the firing table {}", firings_file.display()))?;
        anyhow::ensure!(self.audit_checkpoint_records >= 1, "audit_checkpoint_records must be at least 1");
        let audit_key_file =
            self.audit_key_file.clone().unwrap_or_else(|| state_dir.join(audit::DEFAULT_AUDIT_KEY_FILE));
        let audit_signer = htfaas_functions::audit::AuditSigner::load_or_create(&audit_key_file, audit::AUDIT_KID)
            .with_context(|| format!("load the audit key {}", audit_key_file.display()))?;
        let audit = audit::Auditing {
            signer: Arc::new(audit_signer),
            policy: htfaas_functions::audit::CheckpointPolicy {
                every_records: self.audit_checkpoint_records,
                every_ms: self.audit_checkpoint_s.saturating_mul(1000),
            },
        };
        let public_url = self.public_url.clone().unwrap_or_else(|| format!("http://{addr}"));
        let namespaces =
            namespaces::Namespaces::load(self.namespaces, &registry).context("load the namespace grants")?;
        if namespaces.is_empty() {
            tracing::warn!(
                "no namespace grants: every registration and firing is refused until an admin grants one \
                 (`htfaas ns grant`, or `namespaces` in the gateway's configuration)"
            );
        }
        let source_paths = event::binding::Bindings::new(self.source_paths)?;
        if source_paths.is_open() {
            tracing::warn!(
                "no source_paths: every publisher on the events subjects speaks for every path; bind each \
                 subject to the paths of its storage where several sources publish"
            );
        }
        let shared = Shared {
            source_paths: Arc::new(source_paths),
            triggers: triggers::TriggerCache::default(),
            namespaces,
            storage: storage_client::StorageClient::new(
                storage_http,
                self.storage_kind,
                &self.storage_url,
                storage_auth,
                &self.read_validity,
                &self.write_validity,
            ),
            submitter: submit::Submitter::new(http.clone(), &self.scheduler_url, key, &self.issuer, self.token_ttl_s)
                .context("build the submit-token verifier")?,
            stats: stats::Stats::default(),
            metrics: metrics::Metrics::default(),
            firings,
            audit,
            admin_token: self.admin_token,
            api_verifier,
            api_revocations: api::RevocationCache::default(),
            scheduler_admin_token: self.scheduler_admin_token,
            public_url: public_url.trim_end_matches('/').to_owned(),
            bind_macaroons_to_ep: self.bind_macaroons_to_ep && self.storage_kind == storage_client::StorageKind::Dcache,
            http,
            registry,
            module_quota: self.module_quota,
            sources: std::sync::RwLock::new(Arc::new(self.sources)),
        };
        shared.triggers.reload(&shared.registry).context("load triggers")?;
        Ok(Settings {
            listener,
            shared: Arc::new(shared),
            nats_url: self.nats_url,
            nats_credential: self.nats_nkey_seed,
            consumer: self.consumer,
            max_deliver: self.max_deliver,
            http: self.http,
        })
    }
}

impl Settings {
    /// The API's bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// State shared by the API and the ingest loop (tests read counters from it).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

/// Runs the gateway until `shutdown` is cancelled: the ingest loop, the firing dispatcher
/// ([`firing::dispatch`]) and the API.
///
/// Shutdown order: stop taking events (the in-flight batch finishes: its firings are committed
/// and its messages acked, or they are left for redelivery), stop the API, let the submissions in flight
/// finish (pending firings stay in the table for the next start), return.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let Settings { listener, shared, nats_url, nats_credential, consumer, max_deliver, http } = settings;
    let credential = nats_credential.as_ref();
    let consumer = ingest::connect_with(&nats_url, credential, &consumer, max_deliver, Some(shared.clone())).await?;
    tracing::info!(addr = %listener.local_addr()?, nats = %nats_url, pending = shared.firings.pending(), "gateway ready");
    let ingest = tokio::spawn(ingest::run(consumer, shared.clone(), shutdown.child_token()));
    let dispatch = tokio::spawn(firing::dispatch(shared.clone(), shutdown.child_token()));
    // Replays, dry runs and `fn test --seq` read the recorded events on a connection of their own.
    let events = replay::Events::connect(&nats_url, credential).await?;
    let app = api::router(shared.clone())
        .layer(axum::middleware::from_fn_with_state(shared, metrics::count_refusals))
        .layer(axum::Extension(events));
    // TCP_NODELAY: without it a response whose headers and body go out in two writes waits
    // for the client's delayed ACK (40 ms on Linux) before the body leaves.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("failed to set TCP_NODELAY: {e}");
        }
    });
    // Slow heads, stalled bodies and connection floods: `http`'s limits.
    let served =
        htfaas_functions::serve::serve(listener, app, http, shutdown.clone()).await.context("serve the gateway API");
    shutdown.cancel();
    let ingested = ingest.await.context("join the ingest loop")?;
    let dispatched = dispatch.await.context("join the firing dispatcher")?;
    tracing::info!("gateway stopped");
    served?;
    ingested?;
    dispatched
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path, storage_kind: storage_client::StorageKind, bind_macaroons_to_ep: bool) -> Config {
        Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            public_url: None,
            nats_url: "nats://127.0.0.1:1".into(),
            nats_nkey_seed: None,
            source_paths: None,
            consumer: default_consumer(),
            registry_dir: dir.join("registry"),
            storage_url: "https://127.0.0.1:1".into(),
            storage_kind,
            storage_user: "gateway".into(),
            storage_secret: "s".into(),
            storage_ca_file: None,
            storage_client_cert: None,
            storage_client_key: None,
            scheduler_url: "http://127.0.0.1:1".into(),
            scheduler_ca_file: None,
            scheduler_admin_token: "a".into(),
            signing_key_file: dir.join("submit.pem"),
            jwks_file: None,
            issuer: default_issuer(),
            admin_token: "b".into(),
            read_validity: default_read_validity(),
            write_validity: default_write_validity(),
            token_ttl_s: default_token_ttl_s(),
            max_deliver: default_max_deliver(),
            bind_macaroons_to_ep,
            sources: Default::default(),
            state_dir: None,
            dedupe_window_s: default_dedupe_window_s(),
            max_in_flight: default_max_in_flight(),
            audit_key_file: None,
            audit_checkpoint_records: default_audit_checkpoint_records(),
            audit_checkpoint_s: default_audit_checkpoint_s(),
            namespaces: vec![],
            durability: Default::default(),
            http: Default::default(),
            module_quota: Default::default(),
        }
    }

    #[tokio::test]
    async fn binding_macaroons_to_eps_is_refused_for_xrootd_and_resolved_for_dcache() {
        use storage_client::StorageKind::{Dcache, Xrootd};
        let dir = tempfile::tempdir().expect("tempdir");
        let Err(e) = config(dir.path(), Xrootd, true).resolve().await else {
            panic!("bind_macaroons_to_ep with xrootd resolved");
        };
        let e = format!("{e:#}");
        assert!(e.starts_with("bind_macaroons_to_ep needs a storage that knows dCache's ip: caveat"), "{e}");
        assert!(!dir.path().join("submit.pem").exists(), "refused before anything was made");
        for (kind, bind) in [(Dcache, true), (Dcache, false), (Xrootd, false)] {
            let shared = config(dir.path(), kind, bind).resolve().await.expect("resolves").shared();
            assert_eq!(shared.bind_macaroons_to_ep, bind, "{kind:?}");
        }
        // Absent from a config file, it is off.
        let json = serde_json::json!({"listen": "127.0.0.1:0", "nats_url": "n", "registry_dir": "r",
            "storage_url": "s", "scheduler_url": "u", "scheduler_admin_token": "t", "signing_key_file": "k",
            "admin_token": "a"});
        assert!(!serde_json::from_value::<Config>(json).expect("parses").bind_macaroons_to_ep);
    }

    #[tokio::test]
    async fn an_unknown_event_type_in_sources_is_refused_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = config(dir.path(), storage_client::StorageKind::Dcache, false);
        c.sources.dcache_msg_types = vec!["transfer".into(), "upload".into()];
        let Err(e) = c.resolve().await else { panic!("an unknown msgType resolved") };
        assert!(
            format!("{e:#}").starts_with("sources.dcache_msg_types: \"upload\" is not a dCache billing type"),
            "{e:#}"
        );
        let json = serde_json::json!({"listen": "127.0.0.1:0", "nats_url": "n", "registry_dir": dir.path().join("r"),
            "storage_url": "s", "storage_user": "g", "scheduler_url": "u", "scheduler_admin_token": "t",
            "signing_key_file": dir.path().join("k"), "admin_token": "a",
            "sources": {"dcache_msg_types": ["transfer", "request"]}});
        let c: Config = serde_json::from_value(json).expect("parses");
        let shared = c.resolve().await.expect("resolves").shared();
        assert_eq!(shared.sources().dcache_msg_types, ["transfer", "request"]);
        assert!(shared.sources().cloudevents, "default");
        assert!(
            shared
                .set_sources(event::SourcePolicy { dcache_msg_types: vec!["nope".into()], cloudevents: true })
                .is_err()
        );
    }

    #[tokio::test]
    async fn the_firing_table_defaults_to_beside_the_registry_keeping_keys_as_long_as_the_stream() {
        let dir = tempfile::tempdir().expect("tempdir");
        let json = serde_json::json!({"listen": "127.0.0.1:0", "nats_url": "n", "registry_dir": "r",
            "storage_url": "s", "scheduler_url": "u", "scheduler_admin_token": "t", "signing_key_file": "k",
            "admin_token": "a"});
        let c: Config = serde_json::from_value(json).expect("parses");
        assert_eq!((c.state_dir.as_deref(), c.dedupe_window_s, c.max_in_flight), (None, 7 * 24 * 3600, 16));
        let c = config(dir.path(), storage_client::StorageKind::Dcache, false);
        let _settings = c.clone().resolve().await.expect("resolves");
        assert!(dir.path().join("firings.sqlite").exists(), "beside registry/");
        let elsewhere = dir.path().join("state");
        let moved = Config { state_dir: Some(elsewhere.clone()), ..c.clone() };
        let _settings = moved.resolve().await.expect("resolves");
        assert!(elsewhere.join("firings.sqlite").exists());
        let Err(e) = Config { max_in_flight: 0, ..c }.resolve().await else { panic!("max_in_flight 0 resolved") };
        assert_eq!(format!("{e:#}"), "max_in_flight must be at least 1");
    }

    #[tokio::test]
    async fn a_scheduler_ca_file_that_is_missing_or_holds_no_certificate_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "no certificate here\n").expect("write");
        for (file, expect) in
            [(dir.path().join("missing.pem"), "read scheduler_ca_file"), (not_pem, "holds no certificate")]
        {
            let mut c = config(dir.path(), storage_client::StorageKind::Dcache, false);
            c.scheduler_ca_file = Some(file);
            let Err(e) = c.resolve().await else { panic!("a bad scheduler_ca_file resolved") };
            assert!(format!("{e:#}").contains(expect), "{e:#}");
        }
    }
}
