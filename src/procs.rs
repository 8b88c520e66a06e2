//! The local stack as five processes: nats-server and `htfaas storage|scheduler|gateway|ep`,
//! each started from a JSON config that [`crate::stack::Layout`] writes, on 127.0.0.1 ports
//! picked at start and kept across restarts. What the crash harness ([`crate::crash`]) kills
//! and starts again, and what the overload run ([`crate::overload`]) measures (a process's
//! resident memory is its own).
//!
//! Each component's output is appended to `logs/<name>.log` under the stack directory.
//!
//! The first EP ([`Component::Ep`]) may dial the scheduler through a [`Relay`]
//! ([`ProcOptions::ep_relay`]), so that a harness can cut that link alone, and may hold an
//! attach token shorter than its jobs ([`ProcOptions::ep_attach_ttl_s`]), so that it renews it
//! over its session. Must not know: what a harness does with them.

use crate::client::Client;
use crate::nats::{NatsServer, free_port};
use crate::relay::Relay;
use crate::stack::Layout;
use anyhow::{Context as _, bail};
use htfaas_functions::Resources;
use htfaas_functions::store::Durability;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// How long a (re)started component may take to answer.
const READY_LIMIT: Duration = Duration::from_secs(60);

/// A component process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// nats-server (JetStream).
    Nats,
    /// `htfaas storage`.
    Storage,
    /// `htfaas scheduler`.
    Scheduler,
    /// `htfaas gateway`.
    Gateway,
    /// `htfaas ep`.
    Ep,
}

impl Component {
    /// All of them.
    pub const ALL: [Component; 5] =
        [Component::Nats, Component::Storage, Component::Scheduler, Component::Gateway, Component::Ep];

    /// Its name, also its `htfaas` subcommand (but for NATS).
    pub fn name(self) -> &'static str {
        match self {
            Component::Nats => "nats-server",
            Component::Storage => "storage",
            Component::Scheduler => "scheduler",
            Component::Gateway => "gateway",
            Component::Ep => "ep",
        }
    }
}

/// How to start the processes.
#[derive(Debug, Clone)]
pub struct ProcOptions {
    /// The `htfaas` binary whose subcommands run the components.
    pub htfaas: PathBuf,
    /// nats-server; default [`crate::nats::find_binary`].
    pub nats_binary: Option<PathBuf>,
    /// The stack directory.
    pub dir: PathBuf,
    /// The stack's durability.
    pub durability: Durability,
    /// EP cores.
    pub workers: u32,
    /// Keys set in the scheduler's config over [`Layout::scheduler`]'s.
    pub scheduler_overrides: serde_json::Map<String, serde_json::Value>,
    /// The first EP dials the scheduler through a [`Relay`] ([`ProcStack::ep_link`]) instead
    /// of directly. Default (`false`): directly.
    pub ep_relay: bool,
    /// The life of the first EP's attach token, seconds (minted at start; the EP renews it
    /// over its session when the scheduler renews). Default (`None`): the site token's 30 days.
    pub ep_attach_ttl_s: Option<u64>,
    /// Each component process's tokio workers (tokio's `TOKIO_WORKER_THREADS` in its
    /// environment). Default (`None`): whatever this process's environment says, else tokio's
    /// one per core.
    pub async_threads: Option<usize>,
}

/// The name the first EP ([`Component::Ep`]) says in its Hello.
pub const EP_NAME: &str = "ep-proc-1";

/// An EP of [`ProcStack::start_extra_ep`].
#[derive(Debug, Clone)]
pub struct ExtraEp {
    /// Its process id.
    pub pid: u32,
    /// The name it says in its Hello, `ep-proc-<n>`.
    pub name: String,
    /// Its work directory (its jobs' directories are under `jobs/`).
    pub work_dir: PathBuf,
}

/// The running processes.
pub struct ProcStack {
    layout: Layout,
    exe: PathBuf,
    dir: PathBuf,
    nats: NatsServer,
    children: HashMap<Component, Child>,
    storage: SocketAddr,
    scheduler: SocketAddr,
    gateway: SocketAddr,
    ep_metrics: SocketAddr,
    /// The first EP's link to the scheduler, when [`ProcOptions::ep_relay`].
    ep_link: Option<Relay>,
    /// EPs started by [`ProcStack::start_extra_ep`]: not restarted or killed by the harnesses,
    /// stopped by [`ProcStack::stop_all`] first.
    extra_eps: Vec<Child>,
    async_threads: Option<usize>,
    http: reqwest::Client,
}

impl ProcStack {
    /// Writes the configs and starts every component, each once it answers.
    pub async fn start(opts: &ProcOptions) -> anyhow::Result<ProcStack> {
        let dir = &opts.dir;
        for sub in ["config", "logs"] {
            std::fs::create_dir_all(dir.join(sub)).with_context(|| format!("create {}/{sub}", dir.display()))?;
        }
        let layout = Layout::prepare(dir, opts.durability)?;
        let nats_binary =
            opts.nats_binary.clone().or_else(crate::nats::find_binary).context("nats-server not found")?;
        let users = layout.nats_users()?;
        let nats = tokio::task::block_in_place(|| {
            NatsServer::start_authorized(&nats_binary, &dir.join("nats"), 0, opts.durability, Some(users))
        })?;
        let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let mut procs = ProcStack {
            layout,
            exe: opts.htfaas.clone(),
            async_threads: opts.async_threads,
            dir: dir.clone(),
            nats,
            children: HashMap::new(),
            storage: addr(free_port()?),
            scheduler: addr(free_port()?),
            gateway: addr(free_port()?),
            ep_metrics: addr(free_port()?),
            ep_link: None,
            extra_eps: Vec::new(),
            http: htfaas_gateway::http_client()?,
        };
        let (nats_url, storage_url, scheduler_url) = (procs.nats.url(), procs.storage_url(), procs.scheduler_url());
        let layout = &procs.layout;
        let mut scheduler = layout.scheduler(procs.scheduler, &nats_url, &storage_url, &procs.gateway_url());
        if let Some(map) = scheduler.as_object_mut() {
            map.extend(opts.scheduler_overrides.clone());
        }
        let slots = Resources::new(opts.workers, 4096, 3600);
        let ep_link = if opts.ep_relay {
            Some(Relay::start(procs.scheduler).await.context("start the EP's relay")?)
        } else {
            None
        };
        let ep_scheduler_url =
            ep_link.as_ref().map_or_else(|| scheduler_url.clone(), |r| format!("http://{}", r.addr()));
        let mut ep = layout.ep(EP_NAME, &ep_scheduler_url, slots, Some(procs.ep_metrics))?;
        if let Some(ttl_s) = opts.ep_attach_ttl_s {
            ep["attach_token"] = crate::stack::mint_ep_token(dir, None, None, ttl_s)?.into();
        }
        let configs = [
            (Component::Storage, layout.storage(procs.storage, &nats_url)),
            (Component::Scheduler, scheduler),
            (Component::Gateway, layout.gateway(procs.gateway, &nats_url, &storage_url, &scheduler_url)),
            (Component::Ep, ep),
        ];
        procs.ep_link = ep_link;
        for (c, json) in configs {
            std::fs::write(procs.config_path(c), serde_json::to_vec_pretty(&json)?)?;
        }
        for c in [Component::Storage, Component::Scheduler, Component::Gateway, Component::Ep] {
            procs.start_one(c).await?;
        }
        Ok(procs)
    }

    /// The layout (secrets, configs).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// A NATS client as the site's operator, which may publish on every events subject
    /// ([`crate::nats::Role::Operator`]).
    pub async fn nats_client(&self) -> anyhow::Result<async_nats::Client> {
        let operator = self.layout.nats_credential("operator")?;
        htfaas_functions::nats::connect_options("htfaas-operator", Some(&operator))
            .retry_on_initial_connect()
            .connect(self.nats.url())
            .await
            .context("connect to NATS as the operator")
    }

    /// The scheduler's base URL.
    pub fn scheduler_url(&self) -> String {
        format!("http://{}", self.scheduler)
    }

    /// The storage's base URL.
    pub fn storage_url(&self) -> String {
        format!("http://{}", self.storage)
    }

    /// The gateway's base URL.
    pub fn gateway_url(&self) -> String {
        format!("http://{}", self.gateway)
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn nats_url(&self) -> String {
        self.nats.url()
    }

    /// A CLI client of the stack (the gateway's admin).
    pub fn client(&self) -> anyhow::Result<Client> {
        Client::new(self.layout.info(self.gateway_url(), self.scheduler_url(), self.storage_url(), self.nats_url()))
    }

    /// The first EP's link to the scheduler, to cut and mend, when [`ProcOptions::ep_relay`].
    pub fn ep_link(&self) -> Option<&Relay> {
        self.ep_link.as_ref()
    }

    /// The first EP's work directory (its jobs' directories are under `jobs/`).
    pub fn ep_work_dir(&self) -> PathBuf {
        self.dir.join("ep")
    }

    /// The process id of `c`, while it runs.
    pub fn pid(&self, c: Component) -> Option<u32> {
        match c {
            Component::Nats => Some(self.nats.pid()),
            _ => self.children.get(&c).and_then(Child::id),
        }
    }

    /// Starts one more EP with `cores` slots (its own work directory, config and log, named
    /// `ep-proc-<n>`), attached directly with a site token, and waits until it answers. For
    /// runs that compare EP shapes (`htfaas bench`'s scaling) and a job's move to another EP
    /// (the long-job harness); the harnesses' [`Component::Ep`] stays the first.
    pub async fn start_extra_ep(&mut self, cores: u32) -> anyhow::Result<ExtraEp> {
        let n = self.extra_eps.len() + 2;
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let slots = Resources::new(cores, 4096, 3600);
        let name = format!("ep-proc-{n}");
        let work_dir = self.dir.join(format!("ep-{n}"));
        let mut json = self.layout.ep(&name, &self.scheduler_url(), slots, Some(metrics))?;
        if let Some(map) = json.as_object_mut() {
            map.insert("work_dir".into(), work_dir.to_string_lossy().into());
        }
        let config = self.dir.join(format!("config/ep-{n}.json"));
        std::fs::write(&config, serde_json::to_vec_pretty(&json)?)?;
        let log_path = self.dir.join(format!("logs/ep-{n}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let mut cmd = Command::new(&self.exe);
        self.set_threads(&mut cmd);
        let mut child = cmd
            .arg("ep")
            .arg("--config")
            .arg(&config)
            .args(["--drain-timeout", "5s"])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {} ep", self.exe.display()))?;
        let pid = child.id().context("the extra EP has no process id")?;
        let url = format!("http://{metrics}/metrics");
        let deadline = Instant::now() + READY_LIMIT;
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("EP {n} exited during start-up ({status}); see {}", log_path.display());
            }
            if let Ok(r) = self.http.get(&url).timeout(Duration::from_secs(2)).send().await
                && r.status().is_success()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("EP {n} did not answer within {READY_LIMIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.extra_eps.push(child);
        Ok(ExtraEp { pid, name, work_dir })
    }

    /// The process ids of the EPs of [`ProcStack::start_extra_ep`].
    pub fn extra_ep_pids(&self) -> Vec<u32> {
        self.extra_eps.iter().filter_map(Child::id).collect()
    }

    /// [`ProcOptions::async_threads`] into a component's environment.
    fn set_threads(&self, cmd: &mut Command) {
        if let Some(n) = self.async_threads {
            cmd.env("TOKIO_WORKER_THREADS", n.to_string());
        }
    }

    fn config_path(&self, c: Component) -> PathBuf {
        self.dir.join(format!("config/{}.json", c.name()))
    }

    /// Starts `c`'s process (not NATS) with its output appended to `logs/<name>.log`.
    fn spawn(&mut self, c: Component) -> anyhow::Result<()> {
        let log_path = self.dir.join(format!("logs/{}.log", c.name()));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let mut cmd = Command::new(&self.exe);
        self.set_threads(&mut cmd);
        cmd.arg(c.name()).arg("--config").arg(self.config_path(c));
        if c == Component::Ep {
            // The final stop: finish what runs within 5 s.
            cmd.args(["--drain-timeout", "5s"]);
        }
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {} {}", self.exe.display(), c.name()))?;
        self.children.insert(c, child);
        Ok(())
    }

    /// Kills `c` with SIGKILL and reaps it.
    pub async fn kill(&mut self, c: Component) -> anyhow::Result<()> {
        if c == Component::Nats {
            tokio::task::block_in_place(|| self.nats.kill());
            return Ok(());
        }
        let mut child = self.children.remove(&c).with_context(|| format!("{} is not running", c.name()))?;
        child.start_kill().with_context(|| format!("kill {}", c.name()))?;
        child.wait().await?;
        Ok(())
    }

    /// Stops `c` as its service manager would: SIGTERM (an EP drains: it takes no new job,
    /// waits its drain timeout of 5 s for running ones, then stops them and leaves), and waits
    /// until it exited (SIGKILL after 20 s). Not for NATS (see [`ProcStack::kill`]).
    pub async fn stop_one(&mut self, c: Component) -> anyhow::Result<()> {
        if c == Component::Nats {
            bail!("nats-server is stopped only with the stack");
        }
        let mut child = self.children.remove(&c).with_context(|| format!("{} is not running", c.name()))?;
        stop_child(&mut child, c.name()).await;
        Ok(())
    }

    /// Starts `c` (again) and waits until it answers.
    pub async fn start_one(&mut self, c: Component) -> anyhow::Result<()> {
        match c {
            Component::Nats => tokio::task::block_in_place(|| self.nats.restart())?,
            _ => self.spawn(c)?,
        }
        self.wait_ready(c).await
    }

    /// Until `c` answers: `/healthz` of the HTTP components, the EP's metrics (its listener is
    /// up once it has resolved its config), NATS' own greeting (in [`NatsServer::restart`]).
    async fn wait_ready(&mut self, c: Component) -> anyhow::Result<()> {
        let url = match c {
            Component::Nats => return Ok(()),
            Component::Storage => format!("{}/healthz", self.storage_url()),
            Component::Scheduler => format!("{}/healthz", self.scheduler_url()),
            Component::Gateway => format!("{}/healthz", self.gateway_url()),
            Component::Ep => format!("http://{}/metrics", self.ep_metrics),
        };
        let deadline = Instant::now() + READY_LIMIT;
        loop {
            if let Some(child) = self.children.get_mut(&c)
                && let Some(status) = child.try_wait()?
            {
                bail!("{} exited during start-up ({status}); see {}/logs", c.name(), self.dir.display());
            }
            if let Ok(r) = self.http.get(&url).timeout(Duration::from_secs(2)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} did not answer within {READY_LIMIT:?}", c.name());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Until the EP has a job running (its `htfaas_ep_jobs_running` gauge), at most `limit`.
    pub async fn wait_busy(&self, limit: Duration) {
        let url = format!("http://{}/metrics", self.ep_metrics);
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(r) = self.http.get(&url).timeout(Duration::from_secs(1)).send().await
                && let Ok(text) = r.text().await
                && gauge(&text, "htfaas_ep_jobs_running").is_some_and(|v| v > 0.0)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The scheduler's jobs by state (its `/metrics`).
    pub async fn job_states(&self) -> anyhow::Result<HashMap<String, u64>> {
        let text = self
            .http
            .get(format!("{}/metrics", self.scheduler_url()))
            .bearer_auth(self.layout.scheduler_admin_token())
            .timeout(Duration::from_secs(5))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(crate::traffic::parse_job_states(&text))
    }

    /// SIGTERM to every process, SIGKILL after 20 s; NATS last.
    pub async fn stop_all(&mut self) {
        for mut child in std::mem::take(&mut self.extra_eps) {
            stop_child(&mut child, "an extra EP").await;
        }
        for c in [Component::Ep, Component::Gateway, Component::Scheduler, Component::Storage] {
            let Some(mut child) = self.children.remove(&c) else { continue };
            stop_child(&mut child, c.name()).await;
        }
        tokio::task::block_in_place(|| self.nats.stop());
    }
}

/// SIGTERM to `child`, SIGKILL after 20 s.
async fn stop_child(child: &mut Child, name: &str) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
    }
    if tokio::time::timeout(Duration::from_secs(20), child.wait()).await.is_err() {
        tracing::warn!("{name} did not stop within 20 s; killing it");
        let _ = child.kill().await;
    }
}

/// The value of an unlabelled metric `name` in a Prometheus text.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_are_read_by_their_whole_name() {
        let text = "# HELP htfaas_ep_jobs_running Jobs.\nhtfaas_ep_jobs_running_x 7\nhtfaas_ep_jobs_running 2\n";
        assert_eq!(gauge(text, "htfaas_ep_jobs_running"), Some(2.0));
        assert_eq!(gauge(text, "htfaas_ep_jobs"), None);
    }
}
