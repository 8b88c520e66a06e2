//! The local stack in one process: a real nats-server (child process), the built-in storage,
//! the scheduler, the gateway and one EP, each started through its library `run`.
//!
//! State lives under one directory (default `.htfaas`):
//! `secrets.json` (admin tokens, storage secrets, NATS nkey seeds; 0600), `stack.json` (URLs for the CLI),
//! `nats/`, `storage/{data,secret,users.json}`, `scheduler/{jobs.sqlite,attach.pem}`,
//! `gateway/{registry/,submit.pem,submit.jwks.json}`, `ep/`.
//!
//! Start order follows the data path (NATS, storage, scheduler, gateway, EP); shutdown cancels
//! one token and joins every component, then stops NATS. Every job's macaroons are bound to
//! the address of the EP that runs it (the gateway's `bind_macaroons_to_ep`; all on loopback).

use crate::client::{Client, StackInfo};
use crate::nats::NatsServer;
use anyhow::Context as _;
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::store::Durability;
use htfaas_functions::token::SigningKey;
use htfaas_functions::{FunctionManifest, Resources};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How to start the stack.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// State directory.
    pub dir: PathBuf,
    /// nats-server binary; default [`crate::nats::find_binary`].
    pub nats_binary: Option<PathBuf>,
    /// Resources the EP offers.
    pub ep_slots: Resources,
    /// What every component (JetStream included) has done with work before it acknowledges
    /// it: fsynced (the default) or written to its log.
    pub durability: Durability,
    /// Storage origins (`scheme://host:port`) the scheduler trusts besides the stack's own
    /// storage, e.g. a second site's XRootD in a test. Default: none.
    pub trusted_storage: Vec<String>,
    /// Every HTTP listener's header and body timeouts and connection cap.
    pub http: htfaas_functions::serve::Limits,
    /// Whether the storage, scheduler and gateway serve HTTPS (and the scheduler WSS), with a
    /// certificate for 127.0.0.1 from a CA of the stack's own (`pki/`, [`crate::pki`]); every
    /// client of the stack trusts that CA. Default: false (plain HTTP on loopback).
    pub tls: bool,
    /// Validities of the read and write macaroons the gateway asks for (ISO-8601, e.g. `PT5S`
    /// in a test of their renewal). Default: `PT2H` and `PT4H`.
    pub macaroon_validity: (String, String),
    /// Further settings of the gateway's configuration, by field (tests: e.g. `webhook_hosts`).
    pub gateway_settings: serde_json::Map<String, serde_json::Value>,
    /// Further settings of the scheduler's configuration, by field (tests: e.g. `otlp_endpoint`).
    pub scheduler_settings: serde_json::Map<String, serde_json::Value>,
    /// Further settings of the EP's configuration, by field (tests: e.g. `native`).
    pub ep_settings: serde_json::Map<String, serde_json::Value>,
}

impl StackOptions {
    /// Defaults for `dir`: one EP with 2 cores, 4 GiB, jobs up to 1 h; every acknowledgement fsynced.
    pub fn new(dir: impl Into<PathBuf>) -> StackOptions {
        StackOptions {
            dir: dir.into(),
            nats_binary: None,
            ep_slots: Resources::new(2, 4096, 3600),
            durability: Durability::default(),
            trusted_storage: Vec::new(),
            http: Default::default(),
            tls: false,
            macaroon_validity: ("PT2H".into(), "PT4H".into()),
            gateway_settings: serde_json::Map::new(),
            scheduler_settings: serde_json::Map::new(),
            ep_settings: serde_json::Map::new(),
        }
    }
}

/// Secrets of one stack directory, made once.
#[derive(Serialize, Deserialize)]
struct Secrets {
    admin_token: String,
    scheduler_admin_token: String,
    gateway_storage_secret: String,
    user_secret: String,
    /// NATS nkey user seeds by credential name ([`NATS_CREDENTIALS`]); a missing one is made
    /// when the directory is next prepared.
    #[serde(default)]
    nats_seeds: std::collections::BTreeMap<String, String>,
}

/// The local stack's NATS credentials: each name, and the role whose permissions the server
/// gives it ([`crate::nats::stack_user`]).
pub const NATS_CREDENTIALS: [&str; 7] =
    ["storage", "gateway", "scheduler", "operator", "bridge-xrootd-notify", "bridge-dcache-sse", "bridge-dcache-kafka"];

/// The role of the NATS credential `name` ([`NATS_CREDENTIALS`]).
fn nats_role(name: &str) -> Option<crate::nats::Role> {
    use crate::nats::Role;
    Some(match name {
        "storage" => Role::Storage,
        "gateway" => Role::Gateway,
        "scheduler" => Role::Scheduler,
        "operator" => Role::Operator,
        "bridge-dcache-kafka" => Role::KafkaBridge,
        _ => Role::Bridge(name.strip_prefix("bridge-")?.to_owned()),
    })
}

fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

fn load_or_create_secrets(dir: &Path) -> anyhow::Result<Secrets> {
    let path = dir.join("secrets.json");
    let mut s = if let Ok(text) = std::fs::read(&path) {
        serde_json::from_slice(&text).with_context(|| format!("parse {}", path.display()))?
    } else {
        Secrets {
            admin_token: random_hex(),
            scheduler_admin_token: random_hex(),
            gateway_storage_secret: random_hex(),
            user_secret: random_hex(),
            nats_seeds: Default::default(),
        }
    };
    let missing: Vec<&str> = NATS_CREDENTIALS.into_iter().filter(|n| !s.nats_seeds.contains_key(*n)).collect();
    for name in &missing {
        let seed = htfaas_functions::nats::NatsCredential::generate().seed().to_owned();
        s.nats_seeds.insert((*name).to_owned(), seed);
    }
    if !missing.is_empty() || !path.exists() {
        write_private(&path, &serde_json::to_vec_pretty(&s)?)?;
    }
    Ok(s)
}

pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    htfaas_functions::store::write_private(path, bytes).with_context(|| format!("write {}", path.display()))
}

/// The storage user the CLI acts as.
pub const USER: &str = "alice";

/// A running stack.
pub struct Stack {
    info: StackInfo,
    /// The scheduler's admin token (for its `/metrics` and admin API).
    scheduler_admin_token: String,
    shutdown: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<anyhow::Result<()>>)>,
    gateway: std::sync::Arc<htfaas_gateway::Shared>,
    /// How the gateway was configured (on its bound address), to start it again.
    gateway_config: htfaas_gateway::Config,
    /// Stops the gateway alone ([`Stack::restart_gateway`]); a child of `shutdown`.
    gateway_shutdown: CancellationToken,
    /// Where the EP serves its Prometheus metrics (loopback, no token).
    ep_metrics: Option<std::net::SocketAddr>,
    nats: NatsServer,
    /// The NATS credentials of [`NATS_CREDENTIALS`], by name.
    nats_credentials: std::collections::BTreeMap<&'static str, htfaas_functions::nats::NatsCredential>,
}

/// One stack directory's layout and secrets, and every component's configuration as the JSON
/// its config file holds (`htfaas <component> --config`): the one source for the in-process
/// [`Stack`] and for the crash harness ([`crate::crash`]), which runs each component as a
/// process of its own.
pub struct Layout {
    dir: PathBuf,
    secrets: Secrets,
    durability: Durability,
    /// Every HTTP listener's limits ([`Layout::with_http`]; default the components' own).
    http: htfaas_functions::serve::Limits,
}

impl Layout {
    /// Makes the directories, and the secrets, the storage's users file, the gateway's submit
    /// key (with its JWKS for the scheduler) and the scheduler's attach key if they are not
    /// there yet.
    pub fn prepare(dir: &Path, durability: Durability) -> anyhow::Result<Layout> {
        // Every directory of the stack 0700, made so or tightened (a directory an older build
        // made 0755): keys, tokens, databases and jobs' files are the stack user's alone.
        for sub in ["", "nats", "storage", "storage/data", "scheduler", "gateway", "ep"] {
            let d = dir.join(sub);
            htfaas_functions::store::create_private_dir(&d)
                .and_then(|()| htfaas_functions::store::make_private(&d))
                .with_context(|| format!("create {} (mode 0700)", d.display()))?;
        }
        let secrets = load_or_create_secrets(dir)?;
        let users = serde_json::json!({"users": [
            {"name": "gateway", "secret": secrets.gateway_storage_secret, "issue_macaroons": true, "paths": ["/"]},
            {"name": USER, "secret": secrets.user_secret, "issue_macaroons": false, "paths": ["/data/"]},
        ]});
        write_private(&dir.join("storage/users.json"), &serde_json::to_vec_pretty(&users)?)?;
        let gateway_key = SigningKey::load_or_create(&dir.join("gateway/submit.pem"), "gateway-1")?;
        htfaas_functions::token::write_jwks(&dir.join("gateway/submit.jwks.json"), &gateway_key.jwks())?;
        SigningKey::load_or_create(&dir.join("scheduler/attach.pem"), "attach-1")?;
        Ok(Layout { dir: dir.to_owned(), secrets, durability, http: Default::default() })
    }

    /// The same layout with `http` as every HTTP listener's limits.
    pub fn with_http(self, http: htfaas_functions::serve::Limits) -> Layout {
        Layout { http, ..self }
    }

    /// The stack directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The scheduler's admin token.
    pub fn scheduler_admin_token(&self) -> &str {
        &self.secrets.scheduler_admin_token
    }

    /// The NATS credential `name` ([`NATS_CREDENTIALS`]), e.g. `bridge-xrootd-notify` for a
    /// bridge run against this stack.
    pub fn nats_credential(&self, name: &str) -> anyhow::Result<htfaas_functions::nats::NatsCredential> {
        let seed = self.secrets.nats_seeds.get(name).with_context(|| format!("no NATS credential {name:?}"))?;
        htfaas_functions::nats::NatsCredential::from_seed(seed).with_context(|| format!("the NATS seed of {name}"))
    }

    /// The seed of the NATS credential `name`, for a component's configuration.
    fn nats_seed(&self, name: &str) -> Option<&str> {
        self.secrets.nats_seeds.get(name).map(String::as_str)
    }

    /// Writes the secrets a site's config files name with `{"secret_file": …}`
    /// (`examples/site/`, read by `htfaas <component> --config`) under `<dir>/secrets/` (0700,
    /// each file 0600): the storage's, gateway's and scheduler's NATS seeds (`storage.nkey`,
    /// `gateway.nkey`, `scheduler.nkey`),
    /// the gateway's storage password (`gateway-storage-secret`), both admin tokens
    /// (`scheduler-admin-token`, `gateway-admin-token`) and an attach token for each EP of
    /// `eps` (`<ep>.attach-token`).
    pub fn write_secret_files(&self, eps: &[&str]) -> anyhow::Result<()> {
        let dir = self.path("secrets");
        htfaas_functions::store::create_private_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
        let seed = |name: &str| self.nats_seed(name).map(str::to_owned).with_context(|| format!("no NATS seed {name}"));
        let mut files = vec![
            ("storage.nkey".to_owned(), seed("storage")?),
            ("gateway.nkey".to_owned(), seed("gateway")?),
            ("scheduler.nkey".to_owned(), seed("scheduler")?),
            ("gateway-storage-secret".to_owned(), self.secrets.gateway_storage_secret.clone()),
            ("scheduler-admin-token".to_owned(), self.secrets.scheduler_admin_token.clone()),
            ("gateway-admin-token".to_owned(), self.secrets.admin_token.clone()),
        ];
        for ep in eps {
            files.push((format!("{ep}.attach-token"), self.site_attach_token()?));
        }
        for (name, secret) in files {
            write_private(&dir.join(name), format!("{secret}\n").as_bytes())?;
        }
        Ok(())
    }

    /// An attach token for the site's pool (30 days), minted with the scheduler's key.
    fn site_attach_token(&self) -> anyhow::Result<String> {
        let attach_key = SigningKey::load_or_create(&self.path("scheduler/attach.pem"), "attach-1")?;
        Ok(htfaas_scheduler::mint_attach_token(&attach_key, SCHEDULER_NAME, "site", None, None, 30 * 24 * 3600)?)
    }

    /// The stack's nats-server users: every credential of [`NATS_CREDENTIALS`] with its role's
    /// permissions; nothing else may connect.
    pub fn nats_users(&self) -> anyhow::Result<Vec<crate::nats::NatsUser>> {
        NATS_CREDENTIALS
            .into_iter()
            .map(|name| {
                let role = nats_role(name).with_context(|| format!("no role for the NATS credential {name}"))?;
                Ok(crate::nats::stack_user(&role, &self.nats_credential(name)?))
            })
            .collect()
    }

    /// URLs and credentials of a stack at these addresses.
    pub fn info(&self, gateway_url: String, scheduler_url: String, storage_url: String, nats_url: String) -> StackInfo {
        StackInfo {
            gateway_url,
            scheduler_url,
            storage_url,
            nats_url,
            admin_token: self.secrets.admin_token.clone(),
            user: USER.into(),
            user_secret: self.secrets.user_secret.clone(),
            nats_nkey_seed: self.nats_seed("operator").map(str::to_owned),
            ca_file: None,
            oidc_token: None,
        }
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.join(sub)
    }

    /// The built-in storage ([`htfaas_storage::Config`]).
    pub fn storage(&self, listen: SocketAddr, nats_url: &str) -> serde_json::Value {
        serde_json::json!({
            "listen": listen,
            "data_dir": self.path("storage/data"),
            "secret_file": self.path("storage/secret"),
            "users_file": self.path("storage/users.json"),
            "nats_url": nats_url,
            "nats_nkey_seed": self.nats_seed("storage"),
            "cell_name": "htfaas-storage",
            "durability": self.durability.as_str(),
            "http": self.http,
        })
    }

    /// The scheduler ([`htfaas_scheduler::Config`]); it trusts the gateway's submit-token key,
    /// jobs' input and output only on the storage at `storage_url` and modules only from the
    /// gateway at `gateway_url`, and publishes job-end notifications on the NATS at `nats_url`.
    pub fn scheduler(
        &self,
        listen: SocketAddr,
        nats_url: &str,
        storage_url: &str,
        gateway_url: &str,
    ) -> serde_json::Value {
        serde_json::json!({
            "listen": listen,
            "db_path": self.path("scheduler/jobs.sqlite"),
            "name": SCHEDULER_NAME,
            "attach_key_file": self.path("scheduler/attach.pem"),
            "submit_issuers": [{"issuer": "htfaas-gateway", "jwks_file": self.path("gateway/submit.jwks.json")}],
            "admin_token": self.secrets.scheduler_admin_token,
            // A local stack: a job whose EP left runs again after a second, not ten.
            "retry_backoff_s": 1,
            "durability": self.durability.as_str(),
            "http": self.http,
            "storage_origins": [storage_url],
            "module_stores": [gateway_url],
            "nats_url": nats_url,
            "nats_nkey_seed": self.nats_seed("scheduler"),
            // Running jobs' macaroons are renewed there.
            "gateway_url": gateway_url,
        })
    }

    /// The gateway ([`htfaas_gateway::Config`]).
    pub fn gateway(
        &self,
        listen: SocketAddr,
        nats_url: &str,
        storage_url: &str,
        scheduler_url: &str,
    ) -> serde_json::Value {
        serde_json::json!({
            "listen": listen,
            "nats_url": nats_url,
            "nats_nkey_seed": self.nats_seed("gateway"),
            // The built-in storage serves the stack's namespace, /data/ (its users' paths and
            // the grants below); a bridge or another producer speaks for nothing outside it.
            // A subject not named here speaks for nothing at all.
            "source_paths": [
                {"subject": htfaas_functions::proto::EVENTS_SUBJECT, "paths": ["/data/"]},
                {"subject": format!("{}.>", htfaas_functions::proto::CLOUDEVENTS_SUBJECT_PREFIX), "paths": ["/data/"]},
            ],
            "consumer": "gateway",
            "registry_dir": self.path("gateway/registry"),
            "storage_url": storage_url,
            "storage_kind": "dcache",
            "storage_user": "gateway",
            "storage_secret": self.secrets.gateway_storage_secret,
            "scheduler_url": scheduler_url,
            "scheduler_admin_token": self.secrets.scheduler_admin_token,
            "signing_key_file": self.path("gateway/submit.pem"),
            "jwks_file": self.path("gateway/submit.jwks.json"),
            "issuer": "htfaas-gateway",
            "admin_token": self.secrets.admin_token,
            "read_validity": "PT2H",
            "write_validity": "PT4H",
            "token_ttl_s": 300,
            "max_deliver": 20,
            // The built-in storage knows `ip:`, and the EP reaches it and the scheduler from
            // 127.0.0.1: every job's macaroons work only from its EP.
            "bind_macaroons_to_ep": true,
            // Outside /data/: a job's checkpoint is reached only with its own macaroon.
            "checkpoint_dir": "/checkpoints/",
            // The firing table and the audit key go beside the registry (`gateway/`).
            "dedupe_window_s": htfaas_functions::proto::EVENTS_MAX_AGE_S,
            "max_in_flight": 16,
            // The stack's user owns /data/: its functions fire on, read and write there. Any
            // other owner gets nothing until an admin grants it (`htfaas ns grant`).
            "namespaces": [
                {"principal": USER, "right": "read", "value": "/data/"},
                {"principal": USER, "right": "write", "value": "/data/"},
            ],
            "durability": self.durability.as_str(),
            "http": self.http,
        })
    }

    /// An EP named `name` with `slots`, attached with a site token (30 days) minted by the
    /// scheduler's key; its metrics on `metrics_listen` (loopback: they carry no token).
    pub fn ep(
        &self,
        name: &str,
        scheduler_url: &str,
        slots: Resources,
        metrics_listen: Option<SocketAddr>,
    ) -> anyhow::Result<serde_json::Value> {
        let attach_token = self.site_attach_token()?;
        Ok(serde_json::json!({
            "name": name,
            "scheduler_url": scheduler_url,
            "attach_token": attach_token,
            "slots": slots,
            "work_dir": self.path("ep"),
            "log_limit_bytes": 64 * 1024,
            "max_output_files": 64,
            "max_output_bytes": 16u64 << 30,
            "metrics_listen": metrics_listen,
            // No `allowed_origins`: the EP's default, any port of the scheduler's host
            // (127.0.0.1), is where this stack serves modules (the gateway) and files (the
            // storage, and a test's second storage).
        }))
    }
}

/// The local stack's scheduler name (the audience of its attach tokens).
const SCHEDULER_NAME: &str = "htfaas-scheduler";

/// A component's config from its JSON, as its `--config` file would be read.
fn config<T: serde::de::DeserializeOwned>(name: &str, json: serde_json::Value) -> anyhow::Result<T> {
    serde_json::from_value(json).with_context(|| format!("the {name} configuration"))
}

impl Stack {
    /// Starts every component and returns once each one answers.
    pub async fn start(opts: StackOptions) -> anyhow::Result<Stack> {
        let layout = Layout::prepare(&opts.dir, opts.durability)?.with_http(opts.http);
        let dir = &opts.dir;
        let binary = opts.nats_binary.clone().or_else(crate::nats::find_binary).context(
            "nats-server not found: run scripts/install-deps.sh, or set HTFAAS_NATS_SERVER to a nats-server binary",
        )?;
        let users = layout.nats_users()?;
        let nats = tokio::task::block_in_place(|| {
            NatsServer::start_authorized(&binary, &dir.join("nats"), 0, opts.durability, Some(users))
        })?;
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        let any_port: SocketAddr = "127.0.0.1:0".parse()?;
        let pki =
            if opts.tls { Some(crate::pki::make(dir, "htfaas local stack CA", &["127.0.0.1".into()])?) } else { None };
        let scheme = if opts.tls { "https" } else { "http" };
        // The server side: each listener's certificate and key; the client side: the CA.
        let serve_tls = |mut json: serde_json::Value| {
            if let Some(pki) = &pki {
                json["tls_cert_file"] = serde_json::json!(pki.cert_file);
                json["tls_key_file"] = serde_json::json!(pki.key_file);
            }
            json
        };

        let storage = config::<htfaas_storage::Config>("storage", serve_tls(layout.storage(any_port, &nats.url())))?
            .resolve()
            .await
            .context("start the storage")?;
        let storage_url = format!("{scheme}://{}", storage.local_addr());
        tasks.push(("storage", tokio::spawn(htfaas_storage::run(storage, shutdown.child_token()))));

        // The scheduler trusts the gateway's module URLs and the gateway submits to the
        // scheduler: the scheduler's listener is bound first, its configuration completed once
        // the gateway's address is known.
        let scheduler_listener = tokio::net::TcpListener::bind(any_port).await.context("bind the scheduler")?;
        let scheduler_addr = scheduler_listener.local_addr().context("the scheduler's address")?;
        let scheduler_url = format!("{scheme}://{scheduler_addr}");

        let mut gateway_json = serve_tls(layout.gateway(any_port, &nats.url(), &storage_url, &scheduler_url));
        if let Some(pki) = &pki {
            gateway_json["scheduler_ca_file"] = serde_json::json!(pki.ca_file);
            gateway_json["storage_ca_file"] = serde_json::json!(pki.ca_file);
        }
        gateway_json["read_validity"] = serde_json::json!(opts.macaroon_validity.0);
        gateway_json["write_validity"] = serde_json::json!(opts.macaroon_validity.1);
        for (field, value) in &opts.gateway_settings {
            gateway_json[field] = value.clone();
        }
        let gateway_config: htfaas_gateway::Config = config("gateway", gateway_json)?;
        let gateway = gateway_config.clone().resolve().await.context("start the gateway")?;
        let gateway_url = gateway.url();

        let mut scheduler_json = serve_tls(layout.scheduler(scheduler_addr, &nats.url(), &storage_url, &gateway_url));
        if let Some(pki) = &pki {
            scheduler_json["gateway_ca_file"] = serde_json::json!(pki.ca_file);
        }
        for (field, value) in &opts.scheduler_settings {
            scheduler_json[field] = value.clone();
        }
        if let Some(origins) = scheduler_json["storage_origins"].as_array_mut() {
            origins.extend(opts.trusted_storage.iter().map(|o| serde_json::Value::from(o.as_str())));
        }
        let scheduler = config::<htfaas_scheduler::Config>("scheduler", scheduler_json)?
            .resolve_on(scheduler_listener)
            .await
            .context("start the scheduler")?;
        tasks.push(("scheduler", tokio::spawn(htfaas_scheduler::run(scheduler, shutdown.child_token()))));
        let gateway_config = htfaas_gateway::Config { listen: gateway.local_addr(), ..gateway_config };
        let gateway_shared = gateway.shared();
        let gateway_shutdown = shutdown.child_token();
        tasks.push(("gateway", tokio::spawn(htfaas_gateway::run(gateway, gateway_shutdown.clone()))));

        let mut ep = layout.ep("ep-local-1", &scheduler_url, opts.ep_slots, Some(any_port))?;
        if let Some(pki) = &pki {
            ep["tls_ca_file"] = serde_json::json!(pki.ca_file);
        }
        for (field, value) in &opts.ep_settings {
            ep[field] = value.clone();
        }
        let ep = config::<htfaas_ep::Config>("EP", ep)?.resolve().await.context("start the EP")?;
        let ep_metrics = ep.metrics_addr();
        tasks.push(("ep", tokio::spawn(htfaas_ep::run(ep, shutdown.child_token()))));

        let info = StackInfo {
            ca_file: pki.map(|p| p.ca_file),
            ..layout.info(gateway_url, scheduler_url, storage_url, nats.url())
        };
        info.save(dir)?;
        let nats_credentials = NATS_CREDENTIALS
            .into_iter()
            .map(|name| Ok((name, layout.nats_credential(name)?)))
            .collect::<anyhow::Result<_>>()?;
        let stack = Stack {
            info,
            scheduler_admin_token: layout.secrets.scheduler_admin_token,
            shutdown,
            tasks,
            gateway: gateway_shared,
            gateway_config,
            gateway_shutdown,
            ep_metrics,
            nats,
            nats_credentials,
        };
        stack.wait_ready(Duration::from_secs(20)).await?;
        Ok(stack)
    }

    async fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let http = htfaas_gateway::http_client_trusting(self.info.ca_file.as_deref(), "the stack's CA")?;
        let deadline = Instant::now() + limit;
        for base in [&self.info.storage_url, &self.info.scheduler_url, &self.info.gateway_url] {
            loop {
                if let Some((name, _)) = self.tasks.iter().find(|(_, t)| t.is_finished()) {
                    anyhow::bail!("{name} stopped during start-up");
                }
                match http.get(format!("{base}/healthz")).send().await {
                    Ok(r) if r.status().is_success() => break,
                    _ if Instant::now() > deadline => anyhow::bail!("{base} did not answer within {limit:?}"),
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }
        Ok(())
    }

    /// URLs and credentials.
    pub fn info(&self) -> &StackInfo {
        &self.info
    }

    /// The scheduler's admin token.
    pub fn scheduler_admin_token(&self) -> &str {
        &self.scheduler_admin_token
    }

    /// A CLI client of this stack.
    pub fn client(&self) -> anyhow::Result<Client> {
        Client::new(self.info.clone())
    }

    /// The EP's metrics URL (`http://127.0.0.1:<port>/metrics`; no token).
    pub fn ep_metrics_url(&self) -> Option<String> {
        self.ep_metrics.map(|a| format!("http://{a}/metrics"))
    }

    /// The gateway's shared state (counters).
    pub fn gateway(&self) -> &htfaas_gateway::Shared {
        &self.gateway
    }

    /// Stops the gateway alone (its in-flight event and submissions finish) and starts it
    /// again on the same address with the same state directory, as after a crash-free restart
    /// of that one process; its counters start again from zero. For tests of what survives a
    /// gateway restart (the firing table, the durable consumer). Returns the stopped
    /// gateway's shared state, whose counters are final.
    pub async fn restart_gateway(&mut self) -> anyhow::Result<std::sync::Arc<htfaas_gateway::Shared>> {
        self.gateway_shutdown.cancel();
        let at = self.tasks.iter().position(|(name, _)| *name == "gateway").context("the gateway is not running")?;
        let (_, task) = self.tasks.remove(at);
        tokio::time::timeout(Duration::from_secs(15), task)
            .await
            .context("the gateway did not stop within 15 s")?
            .context("the gateway's task")?
            .context("the gateway failed")?;
        let gateway = self.gateway_config.clone().resolve().await.context("start the gateway again")?;
        let stopped = std::mem::replace(&mut self.gateway, gateway.shared());
        self.gateway_shutdown = self.shutdown.child_token();
        self.tasks.push(("gateway", tokio::spawn(htfaas_gateway::run(gateway, self.gateway_shutdown.clone()))));
        self.wait_ready(Duration::from_secs(20)).await?;
        Ok(stopped)
    }

    /// Kills nats-server with SIGKILL, waits `down`, and starts it again on the same port with
    /// the same JetStream store: every client sees its connection drop and must reconnect.
    pub async fn kill_and_restart_nats(&mut self, down: Duration) -> anyhow::Result<()> {
        self.kill_nats();
        tokio::time::sleep(down).await;
        self.restart_nats()
    }

    /// Kills nats-server with SIGKILL ([`Stack::restart_nats`] brings it back).
    pub fn kill_nats(&mut self) {
        tokio::task::block_in_place(|| self.nats.kill());
    }

    /// Starts the killed nats-server again on the same port with the same JetStream store.
    pub fn restart_nats(&mut self) -> anyhow::Result<()> {
        Ok(tokio::task::block_in_place(|| self.nats.restart())?)
    }

    /// The nats-server's process id.
    pub fn nats_pid(&self) -> u32 {
        self.nats.pid()
    }

    /// NATS URL.
    pub fn nats_url(&self) -> String {
        self.nats.url()
    }

    /// The NATS credential `name` of [`NATS_CREDENTIALS`] (e.g. `bridge-xrootd-notify` for a
    /// bridge run against this stack).
    pub fn nats_credential(&self, name: &str) -> Option<&htfaas_functions::nats::NatsCredential> {
        self.nats_credentials.get(name)
    }

    /// A NATS client as the site's operator: it may publish on every events subject and read
    /// the events stream and its consumers ([`crate::nats::Role::Operator`]).
    pub async fn nats_client(&self) -> anyhow::Result<async_nats::Client> {
        htfaas_functions::nats::connect_options("htfaas-operator", self.nats_credential("operator"))
            .connect(self.nats.url())
            .await
            .context("connect to NATS as the operator")
    }

    /// Resolves when any component stops on its own (an error), naming it.
    pub async fn any_stopped(&mut self) -> (&'static str, anyhow::Result<()>) {
        let futures = self.tasks.iter_mut().map(|(name, t)| {
            let name = *name;
            Box::pin(async move {
                let r = t.await.map_err(anyhow::Error::from).and_then(|r| r);
                (name, r)
            })
        });
        futures_util::future::select_all(futures).await.0
    }

    /// Stops every component (in-flight work drains), then NATS. Errors of components are
    /// reported, the first one returned.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let mut first_err = None;
        for (name, task) in self.tasks.drain(..) {
            match tokio::time::timeout(Duration::from_secs(15), task).await {
                Ok(Ok(Ok(()))) => tracing::info!("{name} stopped"),
                Ok(Ok(Err(e))) => {
                    tracing::error!("{name} failed: {e:#}");
                    first_err.get_or_insert(e.context(name));
                }
                Ok(Err(e)) => {
                    first_err.get_or_insert(anyhow::anyhow!("{name} panicked: {e}"));
                }
                Err(_) => tracing::warn!("{name} did not stop within 15 s"),
            }
        }
        tokio::task::block_in_place(|| self.nats.stop());
        first_err.map_or(Ok(()), Err)
    }
}

/// What `htfaas up --demo` registers: `checksum`, fired by `/data/raw/**`, writing to
/// `/data/checksums/`.
pub fn demo_manifest(module: htfaas_functions::Digest) -> FunctionManifest {
    FunctionManifest {
        runtime: Default::default(),
        command: Vec::new(),
        handler: false,
        retry: None,
        name: "checksum".into(),
        owner: USER.into(),
        module,
        trigger: Trigger::on_path("/data/raw/**"),
        resources: Resources::new(1, 256, 60),
        outputs: Outputs::into_dir("/data/checksums/"),
        args: vec![],
        env: vec![],
        annex: None,
        class: None,
        limits: Default::default(),
        group: None,
        secrets: Default::default(),
        webhook: None,
        max_concurrent: None,
        inputs: Default::default(),
        vacate_s: None,
        checkpoint: None,
    }
}

/// Default location of the built example module.
pub fn default_demo_wasm() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/target/wasm32-wasip1/release/checksum.wasm")
}

/// Registers the example, uploads a sample file, waits for its output and returns
/// (output text, time from upload to output).
pub async fn demo(client: &Client, wasm: &Path, timeout: Duration) -> anyhow::Result<(String, Duration)> {
    let bytes = std::fs::read(wasm).with_context(|| {
        format!(
            "read {} (build it: cargo build --release --target wasm32-wasip1 --manifest-path examples/Cargo.toml)",
            wasm.display()
        )
    })?;
    let digest = client.upload_module(bytes).await?;
    let record = client.register(&demo_manifest(digest)).await?;
    println!("registered function {} v{} ({})", record.manifest.name, record.version, record.manifest.module);
    let name = format!("sample-{}.dat", htfaas_functions::token::now_s());
    let sample: Vec<u8> = (0..1_048_576u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let input = format!("/data/raw/{name}");
    let output = format!("/data/checksums/{name}.checksums.json");
    let started = Instant::now();
    client.put_bytes(sample, &input).await?;
    println!("uploaded {input} (1 MiB)");
    loop {
        if let Some(bytes) = client.get_bytes(&output).await? {
            let elapsed = started.elapsed();
            return Ok((String::from_utf8_lossy(&bytes).into_owned(), elapsed));
        }
        if started.elapsed() > timeout {
            anyhow::bail!("no output at {output} after {timeout:?}; see `htfaas jobs`");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What `htfaas token submit` allows its bearer.
#[derive(Debug, Clone)]
pub struct SubmitGrant {
    /// Accounted owner (`sub`).
    pub owner: String,
    /// Jobs it may submit.
    pub jobs: u32,
    /// Largest job.
    pub limits: Resources,
    /// Only this function, if set.
    pub function: Option<htfaas_functions::Digest>,
    /// Accounting group its jobs are charged to, if set.
    pub group: Option<String>,
    /// Lifetime, seconds.
    pub ttl_s: u64,
}

/// Mints a submit token with the local stack's gateway key (`<dir>/gateway/submit.pem`), as an
/// admin does for a person or a service.
pub fn mint_submit_token(dir: &Path, grant: &SubmitGrant) -> anyhow::Result<String> {
    let key = SigningKey::load_or_create(&dir.join("gateway/submit.pem"), "gateway-1")
        .context("load the gateway's submit key (run `htfaas up` once to create it)")?;
    let now = htfaas_functions::token::now_s();
    let claims = htfaas_functions::token::SubmitClaims {
        iss: "htfaas-gateway".into(),
        sub: grant.owner.clone(),
        aud: htfaas_functions::token::SUBMIT_AUDIENCE.into(),
        exp: now + grant.ttl_s,
        iat: now,
        jti: htfaas_functions::token::new_jti(),
        jobs: grant.jobs,
        cpus: grant.limits.cpus,
        memory_mb: grant.limits.memory_mb,
        runtime_s: grant.limits.runtime_s,
        function: grant.function.clone(),
        group: grant.group.clone(),
    };
    Ok(key.sign(&claims)?)
}

/// Mints an attach token with the local stack's scheduler key: for a site EP (`owner: None`),
/// one that runs only `owner`'s jobs, or one that runs only jobs asking for `annex`.
pub fn mint_ep_token(dir: &Path, owner: Option<String>, annex: Option<String>, ttl_s: u64) -> anyhow::Result<String> {
    if let Some(a) = &annex {
        htfaas_functions::manifest::check_name(a).map_err(|e| anyhow::anyhow!("annex name {e}"))?;
    }
    let key = SigningKey::load_or_create(&dir.join("scheduler/attach.pem"), "attach-1")
        .context("load the scheduler's attach key (run `htfaas up` once to create it)")?;
    let sub = owner.clone().unwrap_or_else(|| "site".into());
    Ok(htfaas_scheduler::mint_attach_token(&key, "htfaas-scheduler", &sub, owner, annex, ttl_s)?)
}
