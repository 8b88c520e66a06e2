//! The local stack in one process: a real nats-server (child process), the built-in storage,
//! the scheduler, the gateway and one EP, each started through its library `run`.
//!
//! State lives under one directory (default `.htfaas`):
//! `secrets.json` (admin tokens, storage secrets; 0600), `stack.json` (URLs for the CLI),
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
}

impl StackOptions {
    /// Defaults for `dir`: one EP with 2 cores, 4 GiB, jobs up to 1 h; every acknowledgement fsynced.
    pub fn new(dir: impl Into<PathBuf>) -> StackOptions {
        StackOptions {
            dir: dir.into(),
            nats_binary: None,
            ep_slots: Resources::new(2, 4096, 3600),
            durability: Durability::default(),
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
}

fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

fn load_or_create_secrets(dir: &Path) -> anyhow::Result<Secrets> {
    let path = dir.join("secrets.json");
    if let Ok(text) = std::fs::read(&path) {
        return serde_json::from_slice(&text).with_context(|| format!("parse {}", path.display()));
    }
    let s = Secrets {
        admin_token: random_hex(),
        scheduler_admin_token: random_hex(),
        gateway_storage_secret: random_hex(),
        user_secret: random_hex(),
    };
    write_private(&path, &serde_json::to_vec_pretty(&s)?)?;
    Ok(s)
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("write {}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
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
}

/// One stack directory's layout and secrets, and every component's configuration as the JSON
/// its config file holds (`htfaas <component> --config`): the one source for the in-process
/// [`Stack`] and for the crash harness ([`crate::crash`]), which runs each component as a
/// process of its own.
pub struct Layout {
    dir: PathBuf,
    secrets: Secrets,
    durability: Durability,
}

impl Layout {
    /// Makes the directories, and the secrets, the storage's users file, the gateway's submit
    /// key (with its JWKS for the scheduler) and the scheduler's attach key if they are not
    /// there yet.
    pub fn prepare(dir: &Path, durability: Durability) -> anyhow::Result<Layout> {
        for sub in ["nats", "storage/data", "scheduler", "gateway", "ep"] {
            std::fs::create_dir_all(dir.join(sub)).with_context(|| format!("create {}/{sub}", dir.display()))?;
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
        Ok(Layout { dir: dir.to_owned(), secrets, durability })
    }

    /// The stack directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The scheduler's admin token.
    pub fn scheduler_admin_token(&self) -> &str {
        &self.secrets.scheduler_admin_token
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
            "cell_name": "htfaas-storage",
            "durability": self.durability.as_str(),
        })
    }

    /// The scheduler ([`htfaas_scheduler::Config`]); it trusts the gateway's submit-token key.
    pub fn scheduler(&self, listen: SocketAddr) -> serde_json::Value {
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
            // The firing table and the audit key go beside the registry (`gateway/`).
            "dedupe_window_s": htfaas_functions::proto::EVENTS_MAX_AGE_S,
            "max_in_flight": 16,
            "durability": self.durability.as_str(),
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
        let attach_key = SigningKey::load_or_create(&self.path("scheduler/attach.pem"), "attach-1")?;
        let attach_token =
            htfaas_scheduler::mint_attach_token(&attach_key, SCHEDULER_NAME, "site", None, None, 30 * 24 * 3600)?;
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
        let layout = Layout::prepare(&opts.dir, opts.durability)?;
        let dir = &opts.dir;
        let binary = opts.nats_binary.clone().or_else(crate::nats::find_binary).context(
            "nats-server not found: run scripts/install-deps.sh, or set HTFAAS_NATS_SERVER to a nats-server binary",
        )?;
        let nats =
            tokio::task::block_in_place(|| NatsServer::start_with(&binary, &dir.join("nats"), 0, opts.durability))?;
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        let any_port: SocketAddr = "127.0.0.1:0".parse()?;

        let storage = config::<htfaas_storage::Config>("storage", layout.storage(any_port, &nats.url()))?
            .resolve()
            .await
            .context("start the storage")?;
        let storage_url = format!("http://{}", storage.local_addr());
        tasks.push(("storage", tokio::spawn(htfaas_storage::run(storage, shutdown.child_token()))));

        let scheduler = config::<htfaas_scheduler::Config>("scheduler", layout.scheduler(any_port))?
            .resolve()
            .await
            .context("start the scheduler")?;
        let scheduler_url = scheduler.url();
        tasks.push(("scheduler", tokio::spawn(htfaas_scheduler::run(scheduler, shutdown.child_token()))));

        let gateway_config: htfaas_gateway::Config =
            config("gateway", layout.gateway(any_port, &nats.url(), &storage_url, &scheduler_url))?;
        let gateway = gateway_config.clone().resolve().await.context("start the gateway")?;
        let gateway_url = format!("http://{}", gateway.local_addr());
        let gateway_config = htfaas_gateway::Config { listen: gateway.local_addr(), ..gateway_config };
        let gateway_shared = gateway.shared();
        let gateway_shutdown = shutdown.child_token();
        tasks.push(("gateway", tokio::spawn(htfaas_gateway::run(gateway, gateway_shutdown.clone()))));

        let ep = layout.ep("ep-local-1", &scheduler_url, opts.ep_slots, Some(any_port))?;
        let ep = config::<htfaas_ep::Config>("EP", ep)?.resolve().await.context("start the EP")?;
        let ep_metrics = ep.metrics_addr();
        tasks.push(("ep", tokio::spawn(htfaas_ep::run(ep, shutdown.child_token()))));

        let info = layout.info(gateway_url, scheduler_url, storage_url, nats.url());
        info.save(dir)?;
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
        };
        stack.wait_ready(Duration::from_secs(20)).await?;
        Ok(stack)
    }

    async fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let http = htfaas_gateway::http_client()?;
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
        tokio::task::block_in_place(|| self.nats.kill());
        tokio::time::sleep(down).await;
        tokio::task::block_in_place(|| self.nats.restart())
    }

    /// The nats-server's process id.
    pub fn nats_pid(&self) -> u32 {
        self.nats.pid()
    }

    /// NATS URL.
    pub fn nats_url(&self) -> String {
        self.nats.url()
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
        name: "checksum".into(),
        owner: USER.into(),
        module,
        trigger: Trigger::on_path("/data/raw/**"),
        resources: Resources::new(1, 256, 60),
        outputs: Outputs { dir: "/data/checksums/".into() },
        args: vec![],
        env: vec![],
        annex: None,
        class: None,
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
