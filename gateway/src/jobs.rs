//! Job building: what a firing (or a manual run) becomes before it is submitted: the
//! function's namespace checked ([`confine`]), a read macaroon for the input file and a write
//! macaroon for the output directory from the storage, the scheduler's dedupe key, the event
//! the job keeps, the function's retry policy and what becomes of a failed run's outputs
//! ([`prepare`]). Shared by the dispatcher ([`crate::dispatch`]) and the API's
//! runs.
//!
//! Must not know: NATS, HTTP routes, the firing table or [`crate::state::Shared`] (it takes the
//! parts it uses, [`JobContext`]).

use crate::namespaces::Namespaces;
use crate::storage_client::{StorageClient, StorageError};
use htfaas_functions::FunctionRecord;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::namespace::Namespace;
use htfaas_functions::proto::{Cause, EventRef, FunctionRef, InputSpec, OutputSpec, SubmitRequest};

/// What building a job reads: the namespaces, the storage, where EPs fetch modules, whether
/// macaroons are bound to the EP.
#[derive(Clone, Copy)]
pub struct JobContext<'a> {
    /// Namespace grants ([`crate::namespaces`]).
    pub namespaces: &'a Namespaces,
    /// The registry, for the function's sealed secrets.
    pub registry: &'a htfaas_functions::Registry,
    /// Opens them ([`crate::secrets`]).
    pub secrets: &'a crate::secrets::Secrets,
    /// Talks to the storage.
    pub storage: &'a StorageClient,
    /// Base URL of the API as EPs see it (module downloads).
    pub public_url: &'a str,
    /// Whether jobs ask the scheduler to bind their macaroons to their EP's address.
    pub bind_macaroons_to_ep: bool,
}

/// Why a job could not be prepared or submitted.
#[derive(Debug)]
pub enum JobError {
    /// Storage or scheduler unreachable: retry later.
    Transient(String),
    /// Refused for good.
    Permanent(String),
}

impl std::fmt::Debug for JobContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobContext")
            .field("public_url", &self.public_url)
            .field("bind_macaroons_to_ep", &self.bind_macaroons_to_ep)
            .finish_non_exhaustive()
    }
}

/// The key the scheduler dedupes a job on (per owner, forever):
/// `<event id>#<function>@<digest>`, with `#replay:<id>` for a replay's jobs.
pub fn scheduler_dedupe_key(event: &StorageEvent, function: &FunctionRecord, replay: Option<&str>) -> String {
    let mut key = format!("{}#{}@{}", event.id, function.manifest.name, function.manifest.module);
    if let Some(replay) = replay {
        key.push_str("#replay:");
        key.push_str(replay);
    }
    key
}

/// What a job keeps of its event: the source kind and producer (`dcache-billing:pool-a-1@pool-aDomain`,
/// `xrootd-notify:xrootd://host:1094`), the occurrence's id and the path, the job that
/// wrote the file when one did (`cause`, from the firing), when the gateway took the event in,
/// and the `traceparent` of the gateway's span for `function` on it (issue 23).
pub fn event_ref(event: &StorageEvent, cause: Option<Cause>, function: &str, seen_at_ms: u64) -> EventRef {
    EventRef {
        caused_by: cause,
        trace: Some(gateway_span(event, function).to_string()),
        seen_at_ms: Some(seen_at_ms),
        producer_span: event
            .traceparent
            .as_deref()
            .and_then(|t| htfaas_functions::trace::TraceParent::parse(t).ok())
            .map(|t| t.span_id_hex()),
        ..EventRef::new(format!("{}:{}", event.source.kind.as_str(), event.source.producer), &event.id, &event.path)
    }
}

/// The gateway's span for firing `function` on `event`: a child of the event's trace.
pub fn gateway_span(event: &StorageEvent, function: &str) -> htfaas_functions::trace::TraceParent {
    event.trace().child(&format!("{}{function}", htfaas_functions::trace::GATEWAY_SPAN))
}

/// Checks, when a firing becomes a job, that the function's owner may still read `path` and
/// write its output directory (a grant may have been revoked since the registration, and a
/// replay or manual run names paths of its own), and may use its annex; returns whether its
/// write macaroon may replace files (the manifest asks and the namespace allows). A refusal is
/// permanent and names the namespace.
pub fn confine(ns: &Namespace, function: &FunctionRecord, path: &str) -> Result<bool, JobError> {
    let m = &function.manifest;
    if !ns.may_read(path) {
        return Err(JobError::Permanent(format!("{path} is outside the read namespace of {}", m.owner)));
    }
    if !ns.may_write(&m.outputs.dir) {
        return Err(JobError::Permanent(format!(
            "the output directory {} is outside the write namespace of {}",
            m.outputs.dir, m.owner
        )));
    }
    if let Some(annex) = &m.annex
        && !ns.may_use_annex(annex)
    {
        return Err(JobError::Permanent(format!("{} may not use annex {annex:?}", m.owner)));
    }
    Ok(m.outputs.replace && ns.may_replace(&m.outputs.dir))
}

/// Builds the job for `function` on the file `event.path`: a read macaroon for exactly that
/// file and a write macaroon for exactly the function's output directory, from the storage.
/// The job asks the scheduler to bind both to its EP's address when the gateway is configured
/// to ([`JobContext::bind_macaroons_to_ep`], only ever true for the dCache dialect).
pub async fn prepare(
    cx: JobContext<'_>,
    function: &FunctionRecord,
    event: EventRef,
    dedupe_key: String,
) -> Result<SubmitRequest, JobError> {
    let m = &function.manifest;
    // A group revoked since the registration refuses the run, as a revoked path does.
    let ns = cx.namespaces.for_manifest(m).map_err(|e| JobError::Permanent(e.to_string()))?;
    let replace = confine(&ns, function, &event.path)?;
    // A secret not set yet holds the firing back (it is tried again); one that does not open
    // (another key, an altered row) is refused for good. Values are never in the error.
    let secrets = cx.secrets.for_job(cx.registry, m).map_err(|e| match e {
        crate::secrets::SecretError::Missing { .. } | crate::secrets::SecretError::Registry(_) => {
            JobError::Transient(e.to_string())
        }
        e => JobError::Permanent(e.to_string()),
    })?;
    let storage_err = |e: StorageError| {
        if e.is_transient() { JobError::Transient(e.to_string()) } else { JobError::Permanent(e.to_string()) }
    };
    // Both requests at once: they are independent, and each is a round trip to the storage.
    let (read, write) =
        tokio::join!(cx.storage.read_macaroon(&event.path), cx.storage.write_macaroon(&m.outputs.dir, replace));
    let (read, write) = (read.map_err(storage_err)?, write.map_err(storage_err)?);
    let name = event.path.rsplit('/').next().unwrap_or_default().to_owned();
    Ok(SubmitRequest {
        function: FunctionRef {
            name: m.name.clone(),
            version: function.version,
            digest: m.module.clone(),
            module_url: format!("{}/v1/modules/{}", cx.public_url, m.module),
        },
        resources: m.resources,
        input: InputSpec { sha256: None, url: cx.storage.url_of(&event.path), name, macaroon: read },
        output: OutputSpec {
            url: cx.storage.url_of(&m.outputs.dir),
            macaroon: write,
            on_failure: m.outputs.on_failure,
        },
        args: m.args.clone(),
        env: m.env.clone(),
        event,
        dedupe_key,
        annex: m.annex.clone(),
        bind_ep_address: cx.bind_macaroons_to_ep,
        class: m.class.clone(),
        limits: m.limits,
        secrets,
        // Set once the submit token is minted ([`crate::submit::Submitter::grant`]).
        renewal: None,
        retry: m.retry.clone(),
    })
}
