//! Configuration: [`Config`] as read from a file, resolved once into ready [`Settings`]
//! (listener bound, store open, keys loaded, TLS certificate and key read when configured).
//!
//! Per-owner limits, as HTCondor's schedd has them (`MAX_JOBS_PER_OWNER`,
//! `MAX_RUNNING_SCHEDULER_JOBS_PER_OWNER`), so that a single owner's flood cannot disturb the
//! scheduler for everyone: [`Config::max_idle_jobs_per_owner`] refuses a new submission (429)
//! while the owner already has that many idle or held jobs, and
//! [`Config::max_running_jobs_per_owner`] keeps matching from starting more of one owner's jobs
//! while other owners' jobs are still dispatched. Both default to none (unlimited).

use crate::annex_store::AnnexStore;
use crate::notify::NotifySettings;
use crate::policy::{GroupConfig, JobClass, PolicyConfig, SitePolicy};
use crate::queue::Queue;
use crate::requirements::RequirementConfig;
use crate::trust::UrlTrust;
use anyhow::Context as _;
use htfaas_functions::audit::{AuditSigner, CheckpointPolicy};
use htfaas_functions::store::Durability;
use htfaas_functions::token::{ATTACH_AUDIENCE, SUBMIT_AUDIENCE, SigningKey, Verifier};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Key id of the scheduler's attach-token key.
pub const ATTACH_KID: &str = "attach-1";
/// Key id of the scheduler's audit-checkpoint key.
pub const AUDIT_KID: &str = "scheduler-audit-1";
/// File name of the audit key beside the store when [`Config::audit_key_file`] is not set.
pub const DEFAULT_AUDIT_KEY_FILE: &str = "audit-key.pem";
/// File name of the annexes' records in the directory of `db_path` when `annex_file` is not set.
pub const DEFAULT_ANNEX_FILE: &str = "annexes.json";
/// Shortest admin token accepted, bytes.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;

/// Scheduler configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// HTTP address (submit, attach, admin). Tests use `127.0.0.1:0`. Default: `127.0.0.1:8090`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// SQLite file of the job queue (WAL; see `durability`). Default: `scheduler.sqlite`.
    #[serde(default = "default_db_path")]
    pub db_path: PathBuf,
    /// What the job queue waits for before it answers a write (a submit, a dispatch, an EP's
    /// report, an admin action): `fsync` (SQLite `synchronous=FULL`: the write survives a power
    /// cut; writes that arrive together share one commit and one fsync) or `log`
    /// (`synchronous=NORMAL`: written to the WAL, fsynced at its checkpoints; survives the
    /// scheduler's crash, not the machine's). Default: `fsync`.
    #[serde(default)]
    pub durability: Durability,
    /// Issuer of attach tokens (their `iss`). Default: `htfaas-scheduler`.
    #[serde(default = "default_name")]
    pub name: String,
    /// Ed25519 PKCS#8 PEM key that signs attach tokens (kid `attach-1`); created (mode 0600)
    /// if absent. Default: `attach-key.pem`.
    #[serde(default = "default_attach_key_file")]
    pub attach_key_file: PathBuf,
    /// Issuers whose submit tokens are accepted. No default; empty means no one can submit.
    pub submit_issuers: Vec<TrustedIssuer>,
    /// Bearer token of the admin endpoints (`GET /v1/jobs`, `GET /v1/accounting`); at least
    /// 16 bytes. No default.
    pub admin_token: String,
    /// TLS certificate chain, PEM (leaf first, then intermediates). With `tls_key_file`, the
    /// listener serves HTTPS and WSS only (clients use `https://`, EPs dial `wss://`); both or
    /// neither. Default: none (plain HTTP).
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of `tls_cert_file`, PEM (PKCS#8, PKCS#1 or SEC1). Default: none.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// Most idle (or held) jobs one owner may have queued: a new submission past it is refused
    /// with 429 and counts no token use (a dedupe hit is still answered). At least 1. Default:
    /// none (unlimited).
    #[serde(default)]
    pub max_idle_jobs_per_owner: Option<u64>,
    /// Most jobs of one owner running at once: matching starts no more of theirs, and still
    /// dispatches other owners' jobs. At least 1. Default: none (unlimited).
    #[serde(default)]
    pub max_running_jobs_per_owner: Option<u64>,
    /// Half-life of each owner's decayed usage for fair share, seconds. Default: 86400.
    #[serde(default = "default_half_life_s")]
    pub usage_half_life_s: u64,
    /// Accounting groups with quotas, by name (a job's group comes from its submit token).
    /// Default: none.
    #[serde(default)]
    pub groups: BTreeMap<String, GroupConfig>,
    /// Job classes, each bounding run time. Default: none (only the manifest maximum applies).
    #[serde(default)]
    pub job_classes: Vec<JobClass>,
    /// Class of a job that names none; required when `job_classes` is set.
    #[serde(default)]
    pub default_job_class: Option<String>,
    /// A job violating one of these is refused at submit with its message. Default: none.
    #[serde(default)]
    pub submit_requirements: Vec<RequirementConfig>,
    /// A job violating one of these is accepted held with its message. Default: none.
    #[serde(default)]
    pub hold_requirements: Vec<RequirementConfig>,
    /// An EP session silent this long (EPs ping every 15 s) is over and its jobs run again
    /// elsewhere, seconds. Default: 60.
    #[serde(default = "default_lease_s")]
    pub lease_s: u64,
    /// How many times a job may lose an attempt (its EP went away or fell silent, or the
    /// storage was unavailable to it) and still run again; then it is held. Default: 3.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Backoff before a job that lost an attempt runs again, seconds, doubled for each further
    /// loss (at most an hour). Default: 10.
    #[serde(default = "default_retry_backoff_s")]
    pub retry_backoff_s: u64,
    /// Most times a job runs again after its guest failed, whatever its function's retry
    /// policy (`retry.retries` in the manifest, itself at most 10) asks for; 0 retries no
    /// guest failure. Default: 3.
    #[serde(default = "default_max_guest_retries")]
    pub max_guest_retries: u32,
    /// How long past its run time a job may still be running before the scheduler removes it,
    /// seconds. Default: 60.
    #[serde(default = "default_runtime_grace_s")]
    pub runtime_grace_s: u64,
    /// Most jobs assigned to one EP beyond its free resources (prefetch): an EP asks
    /// for a number in its Hello (by default its cpus) and gets at most this many; each must
    /// start on the EP within 10 s (or half `runtime_grace_s`), else the EP hands it back. 0
    /// turns prefetch off. Default: 16.
    #[serde(default = "default_max_prefetch")]
    pub max_prefetch: u32,
    /// Whether an attached EP that asks renews its attach token over its session (the same
    /// credential, a later expiry; never past its annex's end, never once revoked), so that a
    /// job longer than the token's lifetime is not lost when the token expires under it. Off:
    /// a session ends at its token's expiry and no job is placed on an EP that would outlast
    /// it. Default: true.
    #[serde(default = "default_renew_attach")]
    pub renew_attach: bool,
    /// Ed25519 PKCS#8 PEM key that signs the audit trail's checkpoints (kid
    /// `scheduler-audit-1`); created (mode 0600) if absent. The trail itself lives in the store
    /// (`db_path`), written in the same transactions as the decisions it records. Default:
    /// `audit-key.pem` in the directory of `db_path`.
    #[serde(default)]
    pub audit_key_file: Option<PathBuf>,
    /// The audit trail's head is signed once this many records have no checkpoint. Default: 1000.
    #[serde(default = "default_audit_checkpoint_records")]
    pub audit_checkpoint_records: u64,
    /// ... or once the last checkpoint is this old (checked every second), seconds. Default: 60.
    #[serde(default = "default_audit_checkpoint_s")]
    pub audit_checkpoint_s: u64,
    /// The storages jobs read their input from and write their outputs to, each as
    /// `scheme://host[:port]` (the gateway's `storage_url`): a submitted job whose `input.url`
    /// or `output.url` lies elsewhere is refused (403), so that no submitter can point an EP
    /// at an internal address or at a server of its own ([`crate::trust`]). No default: the
    /// scheduler refuses to start without one.
    #[serde(default)]
    pub storage_origins: Vec<String>,
    /// The base URLs EPs fetch modules from (the gateway's public URL): a job's
    /// `function.module_url` must be exactly `<store>/v1/modules/<its digest>` for one of them,
    /// else it is refused (403). No default: the scheduler refuses to start without one.
    #[serde(default)]
    pub module_stores: Vec<String>,
    /// The gateway's base URL, for renewing running jobs' macaroons
    /// (`crate::renew`): `POST <gateway_url>/v1/renewals` with each job's renewal grant (only
    /// ever sent there). Default: none, and then no job's macaroons are renewed (jobs run with
    /// what the gateway obtained when their event fired).
    #[serde(default)]
    pub gateway_url: Option<String>,
    /// Extra trusted root certificate(s) for the gateway's TLS, PEM, in addition to the
    /// system's. Default: none.
    #[serde(default)]
    pub gateway_ca_file: Option<PathBuf>,
    /// An OpenTelemetry collector's OTLP/HTTP traces URL (e.g.
    /// `http://127.0.0.1:4318/v1/traces`): each ended job's spans are exported there
    /// (`crate::otlp`). Default: none (nothing exported).
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// The listener's header and body idle timeouts and connection cap, TLS or not. Default:
    /// see [`htfaas_functions::serve::Limits`].
    #[serde(default)]
    pub http: htfaas_functions::serve::Limits,
    /// The key that seals the macaroons stored with each job ([`crate::seal`]): 32 random
    /// bytes in hex, created (0600) if missing. Keep it apart from the database (another
    /// volume, outside the database's backups): a copy of the database alone then holds no
    /// usable macaroon. Default: `<db_path>.seal.key`.
    #[serde(default)]
    pub seal_key_file: Option<PathBuf>,
    /// The annexes' records (`crate::annex_store`): a JSON file, 0600, rewritten
    /// on every change. Default: `annexes.json` in the directory of `db_path`.
    #[serde(default)]
    pub annex_file: Option<PathBuf>,
    /// NATS server(s) with JetStream to publish job-end notifications on (one URL,
    /// or a cluster's separated by commas): each job that ends (completed, failed, held,
    /// removed) is told on `htfaas.jobs.<owner>.<function>.<state>` in the stream
    /// `HTFAAS_JOBS` (`crate::notify`). Default: none (no notifications; the outbox still
    /// keeps them, and they are published once a URL is set).
    #[serde(default)]
    pub nats_url: Option<String>,
    /// The scheduler's NATS credential: an nkey user seed (`SU…`), a secret. It needs to
    /// publish on `htfaas.jobs.>`, the JetStream API of the stream `HTFAAS_JOBS` (info, create)
    /// and its inbox (`_INBOX.<its public key>.>`). Default: none (a server without
    /// authorization).
    #[serde(default)]
    pub nats_nkey_seed: Option<htfaas_functions::nats::NatsCredential>,
    /// Replicas of the notification stream when the scheduler creates it. Default: 1.
    #[serde(default = "default_jobs_stream_replicas")]
    pub jobs_stream_replicas: usize,
}

fn default_jobs_stream_replicas() -> usize {
    1
}

fn default_audit_checkpoint_records() -> u64 {
    CheckpointPolicy::default().every_records
}
fn default_audit_checkpoint_s() -> u64 {
    CheckpointPolicy::default().every_ms / 1000
}

fn default_half_life_s() -> u64 {
    crate::policy::DEFAULT_HALF_LIFE_S
}
fn default_lease_s() -> u64 {
    crate::policy::DEFAULT_LEASE_S
}
fn default_max_retries() -> u32 {
    crate::policy::DEFAULT_MAX_RETRIES
}
fn default_retry_backoff_s() -> u64 {
    crate::policy::DEFAULT_RETRY_BACKOFF_S
}
fn default_max_guest_retries() -> u32 {
    crate::queue::DEFAULT_MAX_GUEST_RETRIES
}
fn default_renew_attach() -> bool {
    true
}
fn default_max_prefetch() -> u32 {
    crate::policy::DEFAULT_MAX_PREFETCH
}
fn default_runtime_grace_s() -> u64 {
    crate::policy::DEFAULT_RUNTIME_GRACE_S
}

/// Per-owner limits, resolved from [`Config`]; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OwnerLimits {
    /// [`Config::max_idle_jobs_per_owner`].
    pub max_idle: Option<u64>,
    /// [`Config::max_running_jobs_per_owner`].
    pub max_running: Option<u64>,
}

/// An issuer of submit tokens and where its public keys are.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedIssuer {
    /// The tokens' `iss`. No default.
    pub issuer: String,
    /// JWKS document with its public keys. No default.
    pub jwks_file: PathBuf,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8090))
}
fn default_db_path() -> PathBuf {
    PathBuf::from("scheduler.sqlite")
}
fn default_name() -> String {
    "htfaas-scheduler".into()
}
fn default_attach_key_file() -> PathBuf {
    PathBuf::from("attach-key.pem")
}

/// Everything [`crate::run`] needs, ready to use.
pub struct Settings {
    pub(crate) listener: tokio::net::TcpListener,
    pub(crate) local_addr: SocketAddr,
    pub(crate) queue: Queue,
    pub(crate) name: String,
    pub(crate) attach_key: SigningKey,
    pub(crate) attach_verifier: Verifier,
    pub(crate) submit_verifiers: HashMap<String, Verifier>,
    pub(crate) admin_token: String,
    /// Set when the listener serves TLS ([`Config::tls_cert_file`]).
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    /// Per-owner idle and running limits.
    pub(crate) limits: OwnerLimits,
    /// Fair share, groups, classes, requirements, leases and retries.
    pub(crate) policy: SitePolicy,
    /// The storages and module stores a job's URLs must name.
    pub(crate) trust: UrlTrust,
    /// Signs the audit trail's checkpoints.
    pub(crate) audit_signer: Arc<AuditSigner>,
    /// When it signs.
    pub(crate) audit_policy: CheckpointPolicy,
    /// The listener's limits ([`Config::http`]).
    pub(crate) http: htfaas_functions::serve::Limits,
    /// The annexes' records ([`Config::annex_file`]).
    pub(crate) annexes: AnnexStore,
    /// Where job-end notifications go ([`Config::nats_url`]); none: they wait in the outbox.
    pub(crate) notify: Option<NotifySettings>,
    /// Where running jobs' macaroons are renewed ([`Config::gateway_url`]).
    pub(crate) gateway: Option<crate::gateway_client::Gateway>,
    /// Where ended jobs' spans are exported ([`Config::otlp_endpoint`]).
    pub(crate) otlp: Option<crate::otlp::Otlp>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("local_addr", &self.local_addr)
            .field("name", &self.name)
            .field("attach_key", &self.attach_key)
            .field("submit_issuers", &self.submit_verifiers.keys().collect::<Vec<_>>())
            .field("tls", &self.tls.is_some())
            .field("limits", &self.limits)
            .field("policy", &self.policy)
            .field("trust", &self.trust)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The address the listener is bound to (the real port when configured with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The base URL clients reach the listener at: `https://addr` with TLS, `http://addr`
    /// without (an EP turns it into `wss://…` or `ws://…`).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr)
    }

    /// Whether the listener serves TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Test hook: a handle on the store the server will run on (the same connection and
    /// writer), e.g. to fill its "disk" with [`Queue::set_max_page_count`].
    #[doc(hidden)]
    pub fn queue(&self) -> Queue {
        self.queue.clone()
    }

    /// The issuer name of attach tokens.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key that signs attach tokens, for [`crate::mint_attach_token`].
    pub fn attach_key(&self) -> &SigningKey {
        &self.attach_key
    }

    /// The public audit key, as a JWKS (what `audit verify --keys` reads).
    pub fn audit_jwks(&self) -> jsonwebtoken::jwk::JwkSet {
        self.audit_signer.jwks()
    }
}

impl Config {
    /// A configuration with every default, trusting `submit_issuers` and with `admin_token`
    /// (for code that builds one; a file names what it changes).
    pub fn new(admin_token: String, submit_issuers: Vec<TrustedIssuer>) -> Config {
        Config {
            listen: default_listen(),
            db_path: default_db_path(),
            durability: Durability::default(),
            name: default_name(),
            attach_key_file: default_attach_key_file(),
            submit_issuers,
            admin_token,
            tls_cert_file: None,
            tls_key_file: None,
            max_idle_jobs_per_owner: None,
            max_running_jobs_per_owner: None,
            usage_half_life_s: default_half_life_s(),
            groups: BTreeMap::new(),
            job_classes: Vec::new(),
            default_job_class: None,
            submit_requirements: Vec::new(),
            hold_requirements: Vec::new(),
            lease_s: default_lease_s(),
            max_retries: default_max_retries(),
            retry_backoff_s: default_retry_backoff_s(),
            max_guest_retries: default_max_guest_retries(),
            runtime_grace_s: default_runtime_grace_s(),
            max_prefetch: default_max_prefetch(),
            renew_attach: default_renew_attach(),
            audit_key_file: None,
            audit_checkpoint_records: default_audit_checkpoint_records(),
            audit_checkpoint_s: default_audit_checkpoint_s(),
            storage_origins: Vec::new(),
            module_stores: Vec::new(),
            gateway_url: None,
            gateway_ca_file: None,
            otlp_endpoint: None,
            http: Default::default(),
            seal_key_file: None,
            annex_file: None,
            nats_url: None,
            nats_nkey_seed: None,
            jobs_stream_replicas: default_jobs_stream_replicas(),
        }
    }

    /// Checks the configuration, reads the TLS certificate and key (if set), loads (or
    /// creates) the attach key, reads the issuers' key sets, opens the store and binds the
    /// listener.
    pub async fn resolve(self) -> anyhow::Result<Settings> {
        self.resolve_with(None).await
    }

    /// [`Config::resolve`], serving on `listener` (already bound) instead of binding `listen`:
    /// for a caller that must know the scheduler's address before its configuration is
    /// complete (the local stack, whose gateway and scheduler each name the other).
    pub async fn resolve_on(self, listener: tokio::net::TcpListener) -> anyhow::Result<Settings> {
        self.resolve_with(Some(listener)).await
    }

    async fn resolve_with(self, listener: Option<tokio::net::TcpListener>) -> anyhow::Result<Settings> {
        anyhow::ensure!(!self.name.is_empty(), "name must not be empty");
        anyhow::ensure!(
            self.admin_token.len() >= MIN_ADMIN_TOKEN_BYTES,
            "admin_token must be at least {MIN_ADMIN_TOKEN_BYTES} bytes"
        );
        for (key, v) in [
            ("max_idle_jobs_per_owner", self.max_idle_jobs_per_owner),
            ("max_running_jobs_per_owner", self.max_running_jobs_per_owner),
        ] {
            anyhow::ensure!(v != Some(0), "{key} must be at least 1 (leave it out for no limit)");
        }
        let limits =
            OwnerLimits { max_idle: self.max_idle_jobs_per_owner, max_running: self.max_running_jobs_per_owner };
        let policy = PolicyConfig {
            usage_half_life_s: self.usage_half_life_s,
            groups: self.groups,
            job_classes: self.job_classes,
            default_job_class: self.default_job_class,
            submit_requirements: self.submit_requirements,
            hold_requirements: self.hold_requirements,
            lease_s: self.lease_s,
            max_retries: self.max_retries,
            retry_backoff_s: self.retry_backoff_s,
            max_guest_retries: self.max_guest_retries,
            runtime_grace_s: self.runtime_grace_s,
            max_prefetch: self.max_prefetch,
            renew_attach: self.renew_attach,
        }
        .resolve()?;
        let trust = UrlTrust::new(&self.storage_origins, &self.module_stores)?;
        let gateway = match &self.gateway_url {
            None => None,
            Some(url) => {
                Some(crate::gateway_client::Gateway::new(gateway_client(self.gateway_ca_file.as_deref())?, url))
            }
        };
        let otlp = match &self.otlp_endpoint {
            None => None,
            Some(url) => Some(crate::otlp::Otlp::new(url, gateway_client(None)?)?),
        };
        self.http.check()?;
        anyhow::ensure!(self.jobs_stream_replicas >= 1, "jobs_stream_replicas must be at least 1");
        let notify = match &self.nats_url {
            Some(url) => Some(NotifySettings {
                servers: htfaas_functions::nats::servers(url)?,
                credential: self.nats_nkey_seed.clone(),
                replicas: self.jobs_stream_replicas,
            }),
            None => {
                tracing::info!("no nats_url: job-end notifications wait in the store's outbox");
                None
            }
        };
        let tls = htfaas_functions::serve::tls::optional_server_config(
            self.tls_cert_file.as_deref(),
            self.tls_key_file.as_deref(),
        )?;
        let attach_key = SigningKey::load_or_create(&self.attach_key_file, ATTACH_KID)
            .with_context(|| format!("load attach key {}", self.attach_key_file.display()))?;
        anyhow::ensure!(self.audit_checkpoint_records >= 1, "audit_checkpoint_records must be at least 1");
        let audit_key_file = self.audit_key_file.clone().unwrap_or_else(|| {
            let dir = self.db_path.parent().filter(|d| !d.as_os_str().is_empty());
            dir.map_or_else(|| PathBuf::from(DEFAULT_AUDIT_KEY_FILE), |d| d.join(DEFAULT_AUDIT_KEY_FILE))
        });
        let audit_signer = AuditSigner::load_or_create(&audit_key_file, AUDIT_KID)
            .with_context(|| format!("load audit key {}", audit_key_file.display()))?;
        let audit_policy = CheckpointPolicy {
            every_records: self.audit_checkpoint_records,
            every_ms: self.audit_checkpoint_s.saturating_mul(1000),
        };
        let attach_verifier = Verifier::new(&self.name, ATTACH_AUDIENCE, &attach_key.jwks())
            .context("build the attach-token verifier")?;
        let mut submit_verifiers = HashMap::new();
        for t in &self.submit_issuers {
            let v = Verifier::from_jwks_file(&t.issuer, SUBMIT_AUDIENCE, &t.jwks_file)
                .with_context(|| format!("load the keys of submit issuer {:?}", t.issuer))?;
            anyhow::ensure!(
                submit_verifiers.insert(t.issuer.clone(), v).is_none(),
                "issuer {:?} listed twice",
                t.issuer
            );
        }
        if submit_verifiers.is_empty() {
            tracing::warn!("no submit issuer is trusted: every submit will be refused");
        }
        let annex_file = self.annex_file.clone().unwrap_or_else(|| {
            let dir = self.db_path.parent().filter(|d| !d.as_os_str().is_empty());
            dir.map_or_else(|| PathBuf::from(DEFAULT_ANNEX_FILE), |d| d.join(DEFAULT_ANNEX_FILE))
        });
        let annexes = AnnexStore::open(&annex_file).context("read the annexes' records")?;
        let (db_path, durability) = (self.db_path.clone(), self.durability);
        let seal_key_file = self.seal_key_file.clone().unwrap_or_else(|| crate::seal::default_key_file(&self.db_path));
        let mut queue = tokio::task::spawn_blocking(move || Queue::open_sealed(&db_path, durability, &seal_key_file))
            .await
            .context("open the job store")?
            .with_context(|| format!("open the job store {}", self.db_path.display()))?;
        queue.set_half_life(policy.half_life_s);
        queue.set_max_guest_retries(policy.max_guest_retries);
        let listener = match listener {
            Some(l) => l,
            None => {
                tokio::net::TcpListener::bind(self.listen).await.with_context(|| format!("bind {}", self.listen))?
            }
        };
        let local_addr = listener.local_addr().context("read the bound address")?;
        Ok(Settings {
            listener,
            local_addr,
            queue,
            name: self.name,
            attach_key,
            attach_verifier,
            submit_verifiers,
            admin_token: self.admin_token,
            tls,
            limits,
            policy,
            trust,
            audit_signer: Arc::new(audit_signer),
            audit_policy,
            http: self.http,
            annexes,
            notify,
            gateway,
            otlp,
        })
    }
}

/// The HTTP client renewals call the gateway with: the system's roots, plus those in `ca_file`.
fn gateway_client(ca_file: Option<&std::path::Path>) -> anyhow::Result<reqwest::Client> {
    // Installing twice is harmless: a second install reports the first one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder().connect_timeout(std::time::Duration::from_secs(5));
    if let Some(ca_file) = ca_file {
        let pem = std::fs::read(ca_file).with_context(|| format!("read gateway_ca_file {}", ca_file.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("parse gateway_ca_file {}", ca_file.display()))?;
        anyhow::ensure!(!certs.is_empty(), "gateway_ca_file {} holds no certificate", ca_file.display());
        builder = builder.tls_certs_merge(certs);
    }
    builder.build().context("build the gateway HTTP client")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused_and_defaults_apply() {
        let c: Config =
            serde_json::from_str(r#"{"submit_issuers": [], "admin_token": "0123456789abcdef"}"#).expect("parses");
        assert_eq!(c.name, "htfaas-scheduler");
        assert_eq!(c.listen, default_listen());
        assert_eq!(c.durability, Durability::Fsync);
        assert!(serde_json::from_str::<Config>(r#"{"submit_issuers": [], "admin_token": "x", "lisen": "1"}"#).is_err());
        assert_eq!((c.tls_cert_file, c.tls_key_file), (None, None));
        assert_eq!((c.max_idle_jobs_per_owner, c.max_running_jobs_per_owner), (None, None));
        let c: Config = serde_json::from_str(
            r#"{"submit_issuers": [], "admin_token": "0123456789abcdef",
                "max_idle_jobs_per_owner": 1000, "max_running_jobs_per_owner": 200}"#,
        )
        .expect("parses");
        assert_eq!((c.max_idle_jobs_per_owner, c.max_running_jobs_per_owner), (Some(1000), Some(200)));
    }

    #[tokio::test]
    async fn owner_limits_of_zero_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (idle, running, key) in
            [(Some(0), None, "max_idle_jobs_per_owner"), (None, Some(0), "max_running_jobs_per_owner")]
        {
            let mut c = config(dir.path());
            (c.max_idle_jobs_per_owner, c.max_running_jobs_per_owner) = (idle, running);
            let e = c.resolve().await.expect_err("zero limit");
            assert_eq!(e.to_string(), format!("{key} must be at least 1 (leave it out for no limit)"));
        }
        let mut c = config(dir.path());
        (c.max_idle_jobs_per_owner, c.max_running_jobs_per_owner) = (Some(5), Some(2));
        let s = c.resolve().await.expect("resolves");
        assert_eq!(s.limits, OwnerLimits { max_idle: Some(5), max_running: Some(2) });
    }

    fn config(dir: &std::path::Path) -> Config {
        Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            db_path: dir.join("q.sqlite"),
            name: "s".into(),
            attach_key_file: dir.join("attach.pem"),
            submit_issuers: vec![],
            admin_token: "0123456789abcdef".into(),
            tls_cert_file: None,
            tls_key_file: None,
            max_idle_jobs_per_owner: None,
            max_running_jobs_per_owner: None,
            storage_origins: vec!["http://storage.invalid".into()],
            module_stores: vec!["http://registry.invalid".into()],
            ..Config::new(String::new(), Vec::new())
        }
    }

    /// Without the site's storages and module stores the scheduler does not start
    /// (it would otherwise have to refuse every job, or trust every URL).
    #[tokio::test]
    async fn a_scheduler_without_storage_origins_or_module_stores_refuses_to_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Config { storage_origins: vec![], ..config(dir.path()) };
        let e = c.resolve().await.expect_err("no storage");
        assert!(e.to_string().starts_with("storage_origins is empty: list the scheme://host:port"), "{e}");
        let c = Config { module_stores: vec![], ..config(dir.path()) };
        let e = c.resolve().await.expect_err("no module store");
        assert!(e.to_string().starts_with("module_stores is empty: list the base URL"), "{e}");
        let c = Config { storage_origins: vec!["http://storage.invalid/data".into()], ..config(dir.path()) };
        let e = c.resolve().await.expect_err("a path");
        assert_eq!(
            e.to_string(),
            "storage_origins: \"http://storage.invalid/data\" must be scheme://host[:port] without a path"
        );
    }

    #[tokio::test]
    async fn tls_files_go_together() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (cert, key) in [(Some("c.pem"), None), (None, Some("k.pem"))] {
            let c = Config {
                tls_cert_file: cert.map(|c| dir.path().join(c)),
                tls_key_file: key.map(|k| dir.path().join(k)),
                ..config(dir.path())
            };
            let e = c.resolve().await.expect_err("one TLS file alone");
            assert_eq!(e.to_string(), "tls_cert_file and tls_key_file must be set together");
        }
    }
}
