//! What a running gateway shares ([`Shared`]), and how a [`Config`] becomes one
//! ([`Config::resolve`] → [`Settings`]): the listener bound, the registry and the firing table
//! opened, the keys loaded, the clients built.
//!
//! Must not know: HTTP routes, the JetStream consumer's loop or the dispatcher's (it builds
//! what they share, nothing runs here).

use crate::clients::{scheduler_http_client, storage_http_client};
use crate::config::Config;
use crate::http_error::HttpError;
use crate::{audit, auth, firing, metrics, namespaces, stats, storage_client, submit, triggers};
use anyhow::Context as _;
use htfaas_functions::Registry;
use htfaas_functions::sources;
use htfaas_functions::token::SigningKey;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A resolved gateway: listener bound, registry open, key loaded, clients built.
pub struct Settings {
    pub(crate) listener: tokio::net::TcpListener,
    pub(crate) shared: Arc<Shared>,
    pub(crate) nats_url: String,
    pub(crate) nats_credential: Option<htfaas_functions::nats::NatsCredential>,
    pub(crate) consumer: String,
    pub(crate) max_deliver: i64,
    /// Replicas of the events stream ([`crate::config::Config::events_stream_replicas`]).
    pub(crate) events_stream_replicas: usize,
    /// The API listener's limits ([`Config::http`]).
    pub(crate) http: htfaas_functions::serve::Limits,
    /// Set when the API serves HTTPS ([`Config::tls_cert_file`]).
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
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
    /// Seals and opens the functions' secrets (`crate::secrets`).
    pub secrets: crate::secrets::Secrets,
    /// Talks to the storage.
    pub storage: storage_client::StorageClient,
    /// Mints tokens and submits to the scheduler.
    pub submitter: submit::Submitter,
    /// Counters.
    pub stats: stats::Stats,
    /// The counters sampled over the last hour (`GET /v1/stats/history`).
    pub history: stats::History,
    /// Counters of `/metrics` that `stats` does not hold (refused bearer tokens).
    pub metrics: metrics::Metrics,
    /// The durable firing table: events queued to become jobs, exactly once (and the audit
    /// trail, in the same file).
    pub firings: firing::Firings,
    /// Signs the audit trail's checkpoints.
    pub audit: audit::Auditing,
    /// Admin bearer token of this API (the bootstrap admin credential; API tokens are the
    /// others, see [`crate::api`]).
    pub admin_token: String,
    /// Verifies API tokens ([`htfaas_functions::token::ApiClaims`]): the submit-token key, the
    /// gateway's issuer, [`htfaas_functions::token::API_AUDIENCE`].
    pub api_verifier: htfaas_functions::token::Verifier,
    /// The scheduler's revocations, as API-token checks read them (refreshed every few seconds).
    pub api_revocations: auth::RevocationCache,
    /// Scheduler admin token (proxy).
    pub scheduler_admin_token: String,
    /// Base URL of this API as EPs see it.
    pub public_url: String,
    /// Whether jobs ask the scheduler to bind their macaroons to their EP's address (only ever
    /// true with a storage that speaks the dCache dialect).
    pub bind_macaroons_to_ep: bool,
    /// Where jobs keep their checkpoints ([`crate::Config::checkpoint_dir`]).
    pub checkpoint_dir: Option<String>,
    /// HTTP client.
    pub http: reqwest::Client,
    /// Which sources and types become events; read once per message, replaced whole
    /// ([`Shared::sources`], [`Shared::set_sources`]).
    pub(crate) source_policy: sources::PolicyCell,
    /// Which paths each events subject may speak for ([`Config::source_paths`]).
    pub source_paths: Arc<sources::binding::Bindings>,
    /// Failure webhooks: the hosts allowed and their client.
    pub webhooks: crate::webhooks::Webhooks,
    /// The site's OIDC callers ([`crate::identities`]); `None` without `oidc_issuers`.
    pub identities: Option<crate::identities::Identities>,
    /// The site's time zone, which schedules are read in ([`Config::time_zone`]), and its name.
    pub time_zone: (jiff::tz::TimeZone, String),
}

impl Shared {
    /// The site's source policy now.
    pub fn sources(&self) -> Arc<sources::SourcePolicy> {
        self.source_policy.current()
    }

    /// What building a job reads ([`crate::jobs::prepare`]).
    pub fn jobs(&self) -> crate::jobs::JobContext<'_> {
        crate::jobs::JobContext {
            namespaces: &self.namespaces,
            registry: &self.registry,
            secrets: &self.secrets,
            storage: &self.storage,
            public_url: &self.public_url,
            bind_macaroons_to_ep: self.bind_macaroons_to_ep,
            checkpoint_dir: self.checkpoint_dir.as_deref(),
        }
    }

    /// The caller of a route open to either scope (`auth::require_caller`): 401 without a
    /// credential that verifies.
    /// An OIDC bearer counts once the API's `authenticate` layer resolved it.
    pub fn require_caller(&self, headers: &axum::http::HeaderMap) -> Result<auth::Caller, HttpError> {
        if let Some(who) = self.oidc_caller(headers) {
            return Ok(who.caller);
        }
        auth::require_caller(&self.admin_token, &self.api_verifier, headers)
    }

    /// The OIDC caller of `headers`, when its bearer was resolved to one
    /// ([`crate::identities`]).
    pub fn oidc_caller(&self, headers: &axum::http::HeaderMap) -> Option<crate::identities::OidcCaller> {
        self.identities.as_ref()?.cached(auth::bearer(headers)?)
    }

    /// Checks that the caller has the admin scope (`auth::require_admin`): 401 without a
    /// valid credential, 403 with a developer's (an OIDC caller is one).
    pub fn require_admin(&self, headers: &axum::http::HeaderMap) -> Result<(), HttpError> {
        if let Some(who) = self.oidc_caller(headers) {
            return Err(HttpError(
                axum::http::StatusCode::FORBIDDEN,
                format!(
                    "this route needs scope admin; {:?} signed in through OIDC has scope developer",
                    who.caller.name
                ),
            ));
        }
        auth::require_admin(&self.admin_token, &self.api_verifier, headers)
    }

    /// The scheduler's admin API: its base URL, the client, the admin token.
    pub fn scheduler(&self) -> auth::Scheduler<'_> {
        auth::Scheduler {
            http: &self.http,
            url: self.submitter.scheduler_url(),
            admin_token: &self.scheduler_admin_token,
        }
    }

    /// The scheduler's base URL.
    pub(crate) fn submitter_base(&self) -> String {
        self.submitter.scheduler_url().to_owned()
    }

    /// Replaces the source policy for the messages that follow (tests; an admin route later).
    pub fn set_sources(&self, policy: sources::SourcePolicy) -> Result<(), sources::PolicyInvalid> {
        self.source_policy.replace(policy)
    }
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
        if let Some(dir) = &self.checkpoint_dir {
            anyhow::ensure!(
                htfaas_functions::manifest::is_clean_abs_path(dir) && dir.ends_with('/') && dir != "/",
                "checkpoint_dir must be an absolute directory ending in '/', not '/': {dir:?}"
            );
            anyhow::ensure!(
                self.storage_kind == storage_client::StorageKind::Dcache,
                "checkpoint_dir needs a storage whose macaroons may replace a file (storage_kind dcache)"
            );
        }
        self.sources.validate()?;
        self.http.check()?;
        let tls = htfaas_functions::serve::tls::optional_server_config(
            self.tls_cert_file.as_deref(),
            self.tls_key_file.as_deref(),
        )?;
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
        let scheme = if tls.is_some() { "https" } else { "http" };
        let public_url = self.public_url.clone().unwrap_or_else(|| format!("{scheme}://{addr}"));
        let namespaces =
            namespaces::Namespaces::load(self.namespaces, &registry).context("load the namespace grants")?;
        if namespaces.is_empty() {
            tracing::warn!(
                "no namespace grants: every registration and firing is refused until an admin grants one \
                 (`htfaas ns grant`, or `namespaces` in the gateway's configuration)"
            );
        }
        let identities = match (self.oidc_issuers.is_empty(), &self.identity_map) {
            (true, None) => None,
            (true, Some(_)) => anyhow::bail!("identity_map is set and oidc_issuers is empty: no token would be mapped"),
            (false, None) => anyhow::bail!(
                "oidc_issuers needs an identity_map: without one, no identity of those issuers could act as anyone"
            ),
            (false, Some(path)) => {
                let oidc = crate::oidc::Oidc::new(self.oidc_issuers, crate::clients::http_client()?)?;
                let ids = crate::identities::Identities::load(oidc, path)?;
                namespaces.set_live_rules(Some(ids.live_rules()));
                namespaces.reload(&registry).context("load the identity map's grants")?;
                Some(ids)
            }
        };
        let source_paths = sources::binding::Bindings::new(self.source_paths)?;
        if source_paths.is_open() {
            tracing::warn!(
                "no source_paths: every publisher on the events subjects speaks for every path; bind each \
                 subject to the paths of its storage where several sources publish"
            );
        }
        let secrets_key_file = self.secrets_key_file.clone().unwrap_or_else(|| state_dir.join("secrets.key"));
        let secrets = crate::secrets::Secrets::new(
            htfaas_functions::seal::Sealer::load_or_create(&secrets_key_file).context("the secrets key")?,
        );
        let time_zone = htfaas_functions::schedule::time_zone(&self.time_zone).map_err(anyhow::Error::msg)?;
        let shared = Shared {
            time_zone: (time_zone, self.time_zone.clone()),
            identities,
            source_paths: Arc::new(source_paths),
            secrets,
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
            history: stats::History::default(),
            metrics: metrics::Metrics::default(),
            firings,
            audit,
            admin_token: self.admin_token,
            api_verifier,
            api_revocations: auth::RevocationCache::default(),
            scheduler_admin_token: self.scheduler_admin_token,
            public_url: public_url.trim_end_matches('/').to_owned(),
            bind_macaroons_to_ep: self.bind_macaroons_to_ep && self.storage_kind == storage_client::StorageKind::Dcache,
            checkpoint_dir: self.checkpoint_dir,
            http,
            registry,
            module_quota: self.module_quota,
            source_policy: sources::PolicyCell::new(self.sources),
            webhooks: crate::webhooks::Webhooks::new(
                &self.webhook_hosts,
                &self.webhook_private_networks,
                crate::clients::webhook_http_client(self.webhook_ca_file.as_deref())?,
            )?,
        };
        shared.triggers.reload(&shared.registry).context("load triggers")?;
        Ok(Settings {
            listener,
            shared: Arc::new(shared),
            nats_url: self.nats_url,
            nats_credential: self.nats_nkey_seed,
            consumer: self.consumer,
            max_deliver: self.max_deliver,
            events_stream_replicas: self.events_stream_replicas,
            http: self.http,
            tls,
        })
    }
}

impl Settings {
    /// The API's bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// Whether the API serves HTTPS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The API's base URL at its bound address (`http://` or `https://`).
    pub fn url(&self) -> String {
        format!("{}://{}", if self.tls() { "https" } else { "http" }, self.local_addr())
    }

    /// State shared by the API and the ingest loop (tests read counters from it).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::*;

    fn config(dir: &Path, storage_kind: storage_client::StorageKind, bind_macaroons_to_ep: bool) -> Config {
        Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            public_url: None,
            tls_cert_file: None,
            tls_key_file: None,
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
            webhook_hosts: Vec::new(),
            time_zone: "UTC".into(),
            webhook_private_networks: Vec::new(),
            webhook_ca_file: None,
            scheduler_admin_token: "a".into(),
            signing_key_file: dir.join("submit.pem"),
            jwks_file: None,
            issuer: default_issuer(),
            admin_token: "b".into(),
            read_validity: default_read_validity(),
            write_validity: default_write_validity(),
            token_ttl_s: default_token_ttl_s(),
            max_deliver: default_max_deliver(),
            events_stream_replicas: crate::config::default_events_stream_replicas(),
            bind_macaroons_to_ep,
            checkpoint_dir: None,
            sources: Default::default(),
            state_dir: None,
            dedupe_window_s: default_dedupe_window_s(),
            max_in_flight: default_max_in_flight(),
            audit_key_file: None,
            audit_checkpoint_records: default_audit_checkpoint_records(),
            audit_checkpoint_s: default_audit_checkpoint_s(),
            namespaces: vec![],
            oidc_issuers: vec![],
            identity_map: None,
            durability: Default::default(),
            http: Default::default(),
            module_quota: Default::default(),
            secrets_key_file: None,
        }
    }

    /// A certificate without its key (or the reverse) is a clear error at start, never a
    /// silent fall back to plain HTTP.
    #[tokio::test]
    async fn tls_needs_both_the_certificate_and_its_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (cert, key) in [(Some(dir.path().join("cert.pem")), None), (None, Some(dir.path().join("key.pem")))] {
            let mut c = config(dir.path(), storage_client::StorageKind::Dcache, false);
            (c.tls_cert_file, c.tls_key_file) = (cert, key);
            match c.resolve().await {
                Ok(_) => panic!("a gateway with half a TLS pair started"),
                Err(e) => assert!(format!("{e:#}").contains("must be set together"), "{e:#}"),
            }
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
                .set_sources(sources::SourcePolicy { dcache_msg_types: vec!["nope".into()], cloudevents: true })
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
