//! Annexes (after HTCondor's `condor_annex`): `htfaas annex create|list|show|extend|
//! delete`, through the gateway's API (which checks the owner's annex right; the scheduler mints
//! the token and keeps the record) and a batch system ([`provider::Provider`]; Slurm first,
//! [`slurm`]).
//!
//! - [`create`]: the annex's token is minted and its record kept (refused unless the owner holds
//!   the annex right), then `count` batch jobs are submitted, each running [`script`]'s job script
//!   (one `htfaas ep --annex NAME`), the token in the jobs' environment only; their ids are
//!   recorded with the annex. The batch system's time limit is the lifetime: the resources
//!   stop even if nothing else does. A submission that fails leaves nothing behind: the jobs
//!   already started are cancelled and the annex deleted (its token revoked).
//! - [`views`]/[`view`]: the annex's record and attached EPs (from the scheduler, so from any
//!   machine with the admin token) with its batch jobs' states (from the batch system, when
//!   this machine can reach it).
//! - [`extend`]: the scheduler moves the annex's end (and tells its EPs, which replace their
//!   lifetime with it), then every live batch job's time limit becomes its run time so far
//!   plus the new lifetime. No job is added.
//! - [`delete`]: pending batch jobs are cancelled (no new EP), the EPs told to leave now (they
//!   finish their running jobs, then exit, which ends their batch jobs), then whatever is still
//!   live is cancelled, and last the annex's token is revoked, so that a leftover EP cannot
//!   attach again.
//!
//! Must not know: the stack, the command line, how anything is printed.

pub mod provider;
pub mod script;
pub mod slurm;

use crate::client::Client;
use anyhow::{Context as _, bail};
use htfaas_functions::proto::{AnnexCreated, AnnexDeleted, AnnexRecord, AnnexRequest, AnnexView};
use provider::{BatchJob, Launch, Provider};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often [`delete`] looks whether the annex's EPs and jobs are gone.
const POLL: Duration = Duration::from_millis(250);
/// How long [`delete`] waits for cancelled batch jobs to end.
const CANCEL_WAIT: Duration = Duration::from_secs(120);

/// Where and how an annex's EPs run, beyond the [`AnnexRequest`].
#[derive(Debug, Clone)]
pub struct Placement {
    /// The `htfaas` binary on the batch nodes (absolute).
    pub htfaas: PathBuf,
    /// The scheduler URL EPs dial (as the batch nodes reach it).
    pub scheduler_url: String,
    /// Origins jobs may use (the storage and gateway as the nodes reach them); none: the EP's
    /// default (the scheduler's host).
    pub allowed_origins: Option<Vec<String>>,
    /// Extra CA certificates on the nodes.
    pub tls_ca_file: Option<PathBuf>,
    /// Where the jobs' output goes.
    pub log_dir: Option<PathBuf>,
    /// The jobs' working directory.
    pub work_dir: Option<PathBuf>,
    /// Where on the nodes EPs make their scratch directories; none: the job's `TMPDIR`.
    pub scratch_dir: Option<PathBuf>,
}

/// Memory an EP advertises of its batch job's `memory_mb`: the rest is the EP's own (its
/// runtime, buffers): a tenth, at least 256 MiB, at most half.
pub fn advertised_memory_mb(memory_mb: u64) -> u64 {
    let own = (memory_mb / 10).clamp(256.min(memory_mb / 2), (memory_mb / 2).max(1));
    memory_mb.saturating_sub(own).max(1)
}

/// What each of `functions` bound to the annex `request` asks for that the annex's EPs will not
/// offer (cores, memory as the EP advertises it, run time within the lifetime), one sentence
/// per function: such a function's jobs would wait while the annex's EPs go idle and leave.
pub fn shortfalls(request: &AnnexRequest, functions: &[htfaas_functions::FunctionRecord]) -> Vec<String> {
    let memory = advertised_memory_mb(request.memory_mb);
    let runtime = request.lifetime_s.min(htfaas_functions::manifest::MAX_RUNTIME_S);
    functions
        .iter()
        .map(|f| &f.manifest)
        .filter(|m| m.annex.as_deref() == Some(request.name.as_str()) && m.owner == request.owner)
        .filter_map(|m| {
            let r = &m.resources;
            let mut short = Vec::new();
            if r.cpus > request.cpus {
                short.push(format!("{} cores (the EPs offer {})", r.cpus, request.cpus));
            }
            if r.memory_mb > memory {
                short.push(format!("{} MiB (the EPs offer {memory} of their {})", r.memory_mb, request.memory_mb));
            }
            if r.runtime_s > runtime {
                short.push(format!("{} s of run time (the annex lives {runtime} s)", r.runtime_s));
            }
            (!short.is_empty()).then(|| {
                format!(
                    "function {} asks {}: its jobs would wait on this annex while its EPs go idle and leave",
                    m.name,
                    short.join(", ")
                )
            })
        })
        .collect()
}

/// Creates annex `request.name` (see the module docs); the record with its jobs, and the token.
pub async fn create(
    client: &Client,
    provider: Arc<dyn Provider>,
    request: &AnnexRequest,
    placement: &Placement,
) -> anyhow::Result<AnnexCreated> {
    if request.provider != provider.name() {
        bail!("the request names provider {:?}, this is {:?}", request.provider, provider.name());
    }
    let created = client.annex_create(request).await?;
    let record = &created.annex;
    let spec = script::EpSpec {
        annex: record.name.clone(),
        htfaas: placement.htfaas.clone(),
        scheduler_url: placement.scheduler_url.clone(),
        cpus: record.cpus,
        memory_mb: advertised_memory_mb(record.memory_mb),
        runtime_s: request.lifetime_s.min(htfaas_functions::manifest::MAX_RUNTIME_S),
        lifetime_s: request.lifetime_s.saturating_sub(record.drain_s).max(1),
        idle_shutdown_s: record.idle_shutdown_s,
        drain_s: record.drain_s,
        allowed_origins: placement.allowed_origins.clone(),
        tls_ca_file: placement.tls_ca_file.clone(),
        provider: provider.name().to_owned(),
        job_id_var: provider.job_id_var().to_owned(),
        scratch_dir: placement.scratch_dir.clone(),
    };
    let launch = match script::job_script(&spec) {
        Ok(script) => Launch {
            annex: record.name.clone(),
            count: record.count,
            cpus: record.cpus,
            memory_mb: record.memory_mb,
            time_limit: Duration::from_secs(request.lifetime_s),
            partition: record.partition.clone(),
            script,
            log_dir: placement.log_dir.clone(),
            work_dir: placement.work_dir.clone(),
        },
        Err(e) => {
            undo(client, &provider, &record.name, &[]).await;
            bail!("write the job script: {e}");
        }
    };
    let token = created.attach_token.clone();
    let submitter = provider.clone();
    let submitted =
        tokio::task::spawn_blocking(move || submitter.submit(&launch, &[(script::TOKEN_ENV, token.as_str())]))
            .await
            .context("submit task")?;
    let jobs = match submitted {
        Ok(jobs) => jobs,
        Err(provider::ProviderError::Partial { started, source }) => {
            undo(client, &provider, &record.name, &started).await;
            return Err(anyhow::Error::new(*source)
                .context(format!("submit the annex's jobs ({} started, now cancelled)", started.len())));
        }
        Err(e) => {
            undo(client, &provider, &record.name, &[]).await;
            return Err(anyhow::Error::new(e).context("submit the annex's jobs"));
        }
    };
    let annex = client.annex_jobs(&record.name, jobs).await.context("record the annex's jobs")?;
    Ok(AnnexCreated { annex, attach_token: created.attach_token })
}

/// After a failed creation: cancels `started` and deletes the annex (its token revoked).
async fn undo(client: &Client, provider: &Arc<dyn Provider>, name: &str, started: &[String]) {
    if !started.is_empty() {
        let (p, jobs) = (provider.clone(), started.to_vec());
        match tokio::task::spawn_blocking(move || p.cancel(&jobs)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!("failed to cancel the jobs of the failed annex {name}: {e}"),
            Err(e) => tracing::error!("failed to cancel the jobs of the failed annex {name}: {e}"),
        }
    }
    if let Err(e) = client.annex_delete(name).await {
        tracing::error!("failed to delete the failed annex {name}: {e:#}");
    }
}

/// An annex with its batch jobs as the batch system sees them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AnnexStatus {
    /// The record and its attached EPs (the scheduler's).
    #[serde(flatten)]
    pub view: AnnexView,
    /// Its batch jobs, by id: none when the batch system could not be asked.
    pub batch_jobs: Option<BTreeMap<String, BatchJob>>,
    /// Why the batch system could not be asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_error: Option<String>,
}

/// The batch jobs of `record` from `provider` (when there is one for its provider).
async fn batch_of(
    record: &AnnexRecord,
    provider: Option<Arc<dyn Provider>>,
) -> (Option<BTreeMap<String, BatchJob>>, Option<String>) {
    let Some(p) = provider.filter(|p| p.name() == record.provider) else {
        return (None, Some(format!("no {} client configured here", record.provider)));
    };
    let jobs = record.jobs.clone();
    match tokio::task::spawn_blocking(move || p.states(&jobs)).await {
        Ok(Ok(states)) => (Some(states), None),
        Ok(Err(e)) => (None, Some(e.to_string())),
        Err(e) => (None, Some(e.to_string())),
    }
}

/// Every annex, with its batch jobs' states where `provider` can tell them.
pub async fn views(client: &Client, provider: Option<Arc<dyn Provider>>) -> anyhow::Result<Vec<AnnexStatus>> {
    let mut out = Vec::new();
    for view in client.annexes().await? {
        let (batch_jobs, batch_error) = batch_of(&view.annex, provider.clone()).await;
        out.push(AnnexStatus { view, batch_jobs, batch_error });
    }
    Ok(out)
}

/// One annex, with its batch jobs' states where `provider` can tell them.
pub async fn view(client: &Client, provider: Option<Arc<dyn Provider>>, name: &str) -> anyhow::Result<AnnexStatus> {
    let view = client.annex(name).await?;
    let (batch_jobs, batch_error) = batch_of(&view.annex, provider).await;
    Ok(AnnexStatus { view, batch_jobs, batch_error })
}

/// Moves annex `name`'s end to `lifetime` from now (see the module docs); the record and the
/// batch jobs whose time limit changed.
pub async fn extend(
    client: &Client,
    provider: Arc<dyn Provider>,
    name: &str,
    lifetime: Duration,
) -> anyhow::Result<(AnnexRecord, Vec<String>)> {
    let current = client.annex(name).await?.annex;
    if current.provider != provider.name() {
        bail!("annex {name} runs on {}, not {}", current.provider, provider.name());
    }
    let record = client.annex_extend(name, lifetime.as_secs()).await?;
    let jobs = record.jobs.clone();
    let changed = tokio::task::spawn_blocking(move || provider.extend(&jobs, lifetime))
        .await
        .context("extend task")?
        .context("extend the annex's batch jobs")?;
    Ok((record, changed))
}

/// What [`delete`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Deleted {
    /// The scheduler's answer (the record and the token's revocation).
    pub deleted: AnnexDeleted,
    /// EPs still attached when the drain wait ended (0 when all left).
    pub eps_left_attached: usize,
    /// Batch jobs cancelled after the drain (those still live).
    pub cancelled: Vec<String>,
}

/// Deletes annex `name` (see the module docs), waiting up to `drain_wait` for its EPs to leave.
pub async fn delete(
    client: &Client,
    provider: Arc<dyn Provider>,
    name: &str,
    drain_wait: Duration,
) -> anyhow::Result<Deleted> {
    let record = client.annex(name).await?.annex;
    if record.provider != provider.name() {
        bail!("annex {name} runs on {}, not {}", record.provider, provider.name());
    }
    let states = blocking(&provider, record.jobs.clone(), |p, jobs| p.states(&jobs)).await?;
    let pending: Vec<String> =
        states.values().filter(|j| matches!(j.state, provider::BatchState::Pending(_))).map(|j| j.id.clone()).collect();
    if !pending.is_empty() {
        blocking(&provider, pending, |p, jobs| p.cancel(&jobs)).await?;
    }
    client.annex_drain(name).await?;
    let deadline = Instant::now() + drain_wait;
    let mut attached = client.annex(name).await?.eps.len();
    while attached > 0 && Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
        attached = client.annex(name).await?.eps.len();
    }
    if attached > 0 {
        tracing::warn!(eps = attached, "the annex's EPs did not all leave in time; cancelling their jobs");
    }
    let live: Vec<String> = blocking(&provider, record.jobs.clone(), |p, jobs| p.states(&jobs))
        .await?
        .into_values()
        .filter(|j| j.state.is_live())
        .map(|j| j.id)
        .collect();
    if !live.is_empty() {
        blocking(&provider, live.clone(), |p, jobs| p.cancel(&jobs)).await?;
    }
    let deadline = Instant::now() + CANCEL_WAIT;
    loop {
        let states = blocking(&provider, record.jobs.clone(), |p, jobs| p.states(&jobs)).await?;
        let still: Vec<&String> = states.values().filter(|j| j.state.is_live()).map(|j| &j.id).collect();
        if still.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            bail!("batch jobs {still:?} still live {CANCEL_WAIT:?} after their cancel; the annex is kept");
        }
        tokio::time::sleep(POLL).await;
    }
    let deleted = client.annex_delete(name).await?;
    Ok(Deleted { deleted, eps_left_attached: attached, cancelled: live })
}

/// Runs `f(provider, jobs)` off the async threads.
async fn blocking<T: Send + 'static>(
    provider: &Arc<dyn Provider>,
    jobs: Vec<String>,
    f: impl FnOnce(&dyn Provider, Vec<String>) -> Result<T, provider::ProviderError> + Send + 'static,
) -> anyhow::Result<T> {
    let p = provider.clone();
    Ok(tokio::task::spawn_blocking(move || f(p.as_ref(), jobs)).await.context("batch system task")??)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ep_keeps_some_of_its_jobs_memory_for_itself() {
        assert_eq!(advertised_memory_mb(8192), 8192 - 819);
        assert_eq!(advertised_memory_mb(1024), 1024 - 256);
        assert_eq!(advertised_memory_mb(400), 200);
        assert_eq!(advertised_memory_mb(1), 1);
    }

    /// A function bound to the annex that asks more cores, memory or run time than its EPs
    /// offer is named with each shortfall; one that fits, another owner's and one bound to
    /// another annex are not.
    #[test]
    fn a_bound_function_asking_more_than_the_annex_offers_is_named() {
        let request = AnnexRequest {
            name: "night".into(),
            owner: "alice".into(),
            provider: "slurm".into(),
            count: 2,
            cpus: 4,
            memory_mb: 8192,
            lifetime_s: 3600,
            idle_shutdown_s: None,
            partition: None,
            token_ttl_s: None,
        };
        let function = |name: &str, owner: &str, annex: &str, cpus: u32, memory_mb: u64, runtime_s: u64| {
            let mut m = crate::stack::demo_manifest(htfaas_functions::Digest::of(name.as_bytes()));
            m.name = name.into();
            m.owner = owner.into();
            m.annex = Some(annex.into());
            m.resources = htfaas_functions::Resources::new(cpus, memory_mb, runtime_s);
            htfaas_functions::FunctionRecord { schema: 1, version: 1, registered_at: 0, manifest: m }
        };
        let functions = [
            function("fits", "alice", "night", 4, 7000, 3000),
            function("big", "alice", "night", 8, 8192, 7200),
            function("bobs", "bob", "night", 64, 1, 1),
            function("elsewhere", "alice", "day", 64, 1, 1),
        ];
        let short = shortfalls(&request, &functions);
        assert_eq!(short.len(), 1, "{short:?}");
        assert!(short[0].starts_with("function big asks 8 cores (the EPs offer 4), 8192 MiB"), "{short:?}");
        assert!(short[0].contains("7200 s of run time (the annex lives 3600 s)"), "{short:?}");
    }
}
