//! Job building: what a firing (or a manual run) becomes before it is submitted: the
//! function's namespace checked ([`confine`]), a read macaroon for the input file and a write
//! macaroon for the output directory from the storage, the scheduler's dedupe key, the event
//! the job keeps, the function's retry policy and what becomes of a failed run's outputs
//! ([`prepare`]). Shared by the dispatcher (`crate::dispatch`) and the API's
//! runs. A run on no file (an event with an empty path: a schedule's tick) is built only for a
//! function scheduled on no file ([`htfaas_functions::Trigger::on_no_file`]), without an input
//! and its read macaroon; any other function's is refused.
//!
//! Must not know: NATS, HTTP routes, the firing table or [`crate::state::Shared`] (it takes the
//! parts it uses, [`JobContext`]).

use crate::namespaces::Namespaces;
use crate::storage_client::{StorageClient, StorageError};
use htfaas_functions::FunctionRecord;
use htfaas_functions::checkpoint::CheckpointSpec;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::manifest::RuntimeKind;
use htfaas_functions::namespace::Namespace;
use htfaas_functions::proto::{
    Cause, EventRef, FunctionRef, InputSpec, MAX_REFERENCE_FILES, NativeCode, OutputSpec, ReferenceInput, SubmitRequest,
};

/// What building a job reads: the namespaces, the storage, where EPs fetch modules, whether
/// macaroons are bound to the EP.
#[derive(Clone, Copy)]
pub struct JobContext<'a> {
    /// Namespace grants ([`crate::namespaces`]).
    pub namespaces: &'a Namespaces,
    /// The registry, for the function's sealed secrets.
    pub registry: &'a htfaas_functions::Registry,
    /// Opens them (`crate::secrets`).
    pub secrets: &'a crate::secrets::Secrets,
    /// Talks to the storage.
    pub storage: &'a StorageClient,
    /// Base URL of the API as EPs see it (module downloads).
    pub public_url: &'a str,
    /// Whether jobs ask the scheduler to bind their macaroons to their EP's address.
    pub bind_macaroons_to_ep: bool,
    /// Where jobs keep their checkpoints; none: no function may ask for them.
    pub checkpoint_dir: Option<&'a str>,
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
/// and the `traceparent` of the gateway's span for `function` on it.
pub fn event_ref(event: &StorageEvent, cause: Option<Cause>, function: &str, seen_at_ms: u64) -> EventRef {
    EventRef {
        trace: Some(gateway_span(event, cause.as_ref(), function).to_string()),
        caused_by: cause,
        seen_at_ms: Some(seen_at_ms),
        producer_span: event
            .traceparent
            .as_deref()
            .and_then(|t| htfaas_functions::trace::TraceParent::parse(t).ok())
            .map(|t| t.span_id_hex()),
        ..EventRef::new(format!("{}:{}", event.source.kind.as_str(), event.source.producer), &event.id, &event.path)
    }
}

/// The gateway's span for firing `function` on `event`: a child of the event's trace, or, for
/// an event about a job's output (`cause`), of that job's own gateway span, so that a chain of
/// functions is one trace from the first upload on.
pub fn gateway_span(
    event: &StorageEvent,
    cause: Option<&Cause>,
    function: &str,
) -> htfaas_functions::trace::TraceParent {
    let chained =
        cause.and_then(|c| c.trace.as_deref()).and_then(|t| htfaas_functions::trace::TraceParent::parse(t).ok());
    chained.unwrap_or_else(|| event.trace()).child(&format!("{}{function}", htfaas_functions::trace::GATEWAY_SPAN))
}

/// Who a job acts as: the function's owner (a firing, a replay, a back-fill, the owner's own
/// manual run or re-run), or another principal that ran the owner's function with its own
/// submit token (a bearer's manual run, and a re-run of such a run's output). The job's
/// namespace, accounting and write macaroon are its principal's; a bearer's job never gets the
/// owner's secrets (a function that has some is refused to other bearers: it could not run
/// without them, and its log and outputs are the bearer's to read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunsAs<'a> {
    /// The function's owner, in its manifest's accounting group.
    Owner,
    /// Another principal, in an accounting group it holds a `group` grant for.
    Bearer {
        /// The bearer's subject.
        name: &'a str,
        /// The accounting group of its token, if any.
        group: Option<&'a str>,
    },
}

impl<'a> RunsAs<'a> {
    /// `name` (in `group`) running `m`: the owner when it is the owner in the manifest's group.
    pub fn of(m: &htfaas_functions::FunctionManifest, name: &'a str, group: Option<&'a str>) -> RunsAs<'a> {
        if name == m.owner && group == m.group.as_deref() { RunsAs::Owner } else { RunsAs::Bearer { name, group } }
    }

    /// The principal's name.
    pub fn name(self, m: &'a htfaas_functions::FunctionManifest) -> &'a str {
        match self {
            RunsAs::Owner => &m.owner,
            RunsAs::Bearer { name, .. } => name,
        }
    }
}

/// Checks, when a run becomes a job, that `who` may still read `path` (none for a run on no
/// file) and the function's reference inputs, write the function's
/// output directory and use its annex in the namespace `ns` (a grant may have been revoked since
/// the registration, and a replay or manual run names paths of its own); returns whether its
/// write macaroon may replace files (the manifest asks and the namespace allows). A refusal is
/// permanent and names the principal.
pub fn confine(ns: &Namespace, who: &str, function: &FunctionRecord, path: Option<&str>) -> Result<bool, JobError> {
    let m = &function.manifest;
    if let Some(path) = path
        && !ns.may_read(path)
    {
        return Err(JobError::Permanent(format!("{path} is outside the read namespace of {who}")));
    }
    if let Some(r) = m.inputs.refs.iter().find(|r| !ns.may_read(r)) {
        return Err(JobError::Permanent(format!("reference input {r} is outside the read namespace of {who}")));
    }
    if !ns.may_write(&m.outputs.dir) {
        return Err(JobError::Permanent(format!(
            "the output directory {} is outside the write namespace of {who}",
            m.outputs.dir
        )));
    }
    if let Some(annex) = &m.annex
        && !ns.may_use_annex(annex)
    {
        return Err(JobError::Permanent(format!("{who} may not use annex {annex:?}")));
    }
    Ok(m.outputs.replace && ns.may_replace(&m.outputs.dir))
}

/// The namespace checks of a job of `function` on `path` (none: on no file) acting as `runs_as`: the owner's
/// namespace always (the function is confined to it), and a bearer's own too; the write
/// macaroon replaces only where both allow it.
pub fn confine_run(
    namespaces: &Namespaces,
    function: &FunctionRecord,
    runs_as: RunsAs<'_>,
    path: Option<&str>,
) -> Result<bool, JobError> {
    let m = &function.manifest;
    // A group revoked since the registration refuses the run, as a revoked path does.
    let ns = namespaces.for_manifest(m).map_err(|e| JobError::Permanent(e.to_string()))?;
    let replace = confine(&ns, &m.owner, function, path)?;
    match runs_as {
        RunsAs::Owner => Ok(replace),
        RunsAs::Bearer { name, group } => {
            let own = namespaces.for_principal(name, group).map_err(|e| JobError::Permanent(e.to_string()))?;
            Ok(confine(&own, name, function, path)? && replace)
        }
    }
}

/// Whether the unfinished `job` may still do what it was made to do, as its principal's
/// namespace stands now ([`confine_run`]: read its input, write the function's output
/// directory, use its annex, charge its group), its function version read from `registry`.
/// `Err` says why not. Blocks on the registry: async callers use `spawn_blocking`.
pub fn still_allowed(
    namespaces: &Namespaces,
    registry: &htfaas_functions::Registry,
    job: &htfaas_functions::proto::JobRecord,
) -> Result<(), String> {
    let versions = registry.versions(&job.function).unwrap_or_default();
    let function = versions.iter().find(|f| f.version == job.version && f.manifest.module == job.digest);
    allowed_for(namespaces, function, job)
}

/// [`still_allowed`] against `function`, the job's version if still registered: a job whose
/// version is gone is let be (there is nothing to check it against).
fn allowed_for(
    namespaces: &Namespaces,
    function: Option<&FunctionRecord>,
    job: &htfaas_functions::proto::JobRecord,
) -> Result<(), String> {
    let Some(function) = function else { return Ok(()) };
    let runs_as = RunsAs::of(&function.manifest, &job.owner, job.group.as_deref());
    match confine_run(namespaces, function, runs_as, input_path(&job.event.path)) {
        Ok(_) => Ok(()),
        Err(JobError::Permanent(why) | JobError::Transient(why)) => Err(why),
    }
}

/// The input file of an event's `path`: none when it names no file (a run on no file).
pub(crate) fn input_path(path: &str) -> Option<&str> {
    (!path.is_empty()).then_some(path)
}

/// Why a bearer other than the owner may not run `m`: it runs with its owner's secrets.
pub fn bearer_secrets_refusal(m: &htfaas_functions::FunctionManifest, bearer: &str) -> String {
    format!(
        "function {} runs with secrets of its owner {} ({}): only {} runs it by hand, not {bearer}",
        m.name,
        m.owner,
        m.secrets.join(", "),
        m.owner
    )
}

/// What a job of `function` runs, and where an EP fetches it from this gateway (`public_url`):
/// its wasm module, or its image and command.
pub fn function_ref(public_url: &str, function: &FunctionRecord) -> FunctionRef {
    let m = &function.manifest;
    let (store, native) = match m.runtime {
        RuntimeKind::Wasm => ("modules", None),
        RuntimeKind::Native => {
            ("images", Some(NativeCode { command: m.command.clone(), handler: m.handler, vacate_s: m.vacate_s }))
        }
    };
    FunctionRef {
        name: m.name.clone(),
        version: function.version,
        digest: m.module.clone(),
        module_url: format!("{public_url}/v1/{store}/{}", m.module),
        native,
    }
}

/// Builds the job for `function` on the file `event.path` acting as `runs_as`
/// ([`confine_run`], [`RunsAs`]): a read macaroon for exactly that file and a write macaroon for
/// exactly the function's output directory, issued for the run's writer, from the storage. An
/// empty `event.path` is a run on no file: no input, no read macaroon, and only a function
/// scheduled on no file may have one (refused for good otherwise). A collecting function's
/// group `members` (its other files) are read as reference inputs, each checked against the
/// namespaces as the input is.
/// The job asks the scheduler to bind both to its EP's address when the gateway is configured
/// to ([`JobContext::bind_macaroons_to_ep`], only ever true for the dCache dialect).
pub async fn prepare(
    cx: JobContext<'_>,
    function: &FunctionRecord,
    runs_as: RunsAs<'_>,
    event: EventRef,
    dedupe_key: String,
    members: &[String],
) -> Result<SubmitRequest, JobError> {
    let m = &function.manifest;
    let path = input_path(&event.path);
    if path.is_none() && !m.trigger.on_no_file() {
        return Err(JobError::Permanent(format!(
            "a run on no file: function {} runs only on a file (only a schedule with neither a path nor a rule \
             runs on none)",
            m.name
        )));
    }
    let replace = confine_run(cx.namespaces, function, runs_as, path)?;
    for member in members {
        confine_run(cx.namespaces, function, runs_as, Some(member))?;
    }
    // A secret not set yet holds the firing back (it is tried again); one that does not open
    // (another key, an altered row) is refused for good. Values are never in the error. A
    // bearer's job gets none: the owner's secrets are the owner's runs'.
    let secrets = match runs_as {
        RunsAs::Owner => cx.secrets.for_job(cx.registry, m).map_err(|e| match e {
            crate::secrets::SecretError::Missing { .. } | crate::secrets::SecretError::Registry(_) => {
                JobError::Transient(e.to_string())
            }
            e => JobError::Permanent(e.to_string()),
        })?,
        RunsAs::Bearer { name, .. } if !m.secrets.is_empty() => {
            return Err(JobError::Permanent(bearer_secrets_refusal(m, name)));
        }
        RunsAs::Bearer { .. } => Default::default(),
    };
    let writer = crate::storage_client::writer_of_run(runs_as.name(m), &m.name);
    let storage_err = |e: StorageError| storage_failure(e.to_string(), &e);
    // Both requests at once: they are independent, and each is a round trip to the storage.
    let (read, write, checkpoint) = tokio::join!(
        cx.storage.read_macaroon_of(path),
        cx.storage.write_macaroon(&m.outputs.dir, replace, &writer),
        checkpoint_area(cx, m, &writer)
    );
    let (read, write) = (read.map_err(storage_err)?, write.map_err(storage_err)?);
    let checkpoint = checkpoint?;
    let refs = references(cx.storage, &m.inputs.refs, members).await?;
    let input = path.zip(read).map(|(path, macaroon)| InputSpec {
        sha256: None,
        url: cx.storage.url_of(path),
        name: path.rsplit('/').next().unwrap_or_default().to_owned(),
        macaroon,
    });
    Ok(SubmitRequest {
        function: function_ref(cx.public_url, function),
        resources: m.resources,
        input,
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
        max_concurrent: m.max_concurrent,
        refs,
        checkpoint,
    })
}

/// `reason`, a failure of the storage `e`, as a job's error: transient when the storage may
/// answer later, permanent when it refused.
fn storage_failure(reason: String, e: &StorageError) -> JobError {
    if e.is_transient() { JobError::Transient(reason) } else { JobError::Permanent(reason) }
}

/// The reference files of a job: each file of `refs` (a directory's files, listed now) and
/// each of `members`, with a read macaroon for exactly that file, at most
/// [`MAX_REFERENCE_FILES`] in all. The namespace check is the caller's ([`confine`]); a
/// directory with more files is refused, as a job that would silently read only some of its
/// constants would be wrong.
async fn references(
    storage: &StorageClient,
    refs: &[String],
    members: &[String],
) -> Result<Vec<ReferenceInput>, JobError> {
    let mut files = Vec::new();
    for r in refs {
        if !r.ends_with('/') {
            files.push(r.clone());
            continue;
        }
        let room = MAX_REFERENCE_FILES.saturating_sub(files.len());
        let listing = crate::listing::list_tree(storage, r, room).await.map_err(|e| match e {
            crate::listing::ListError::Storage(e) => storage_failure(format!("list reference {r}: {e}"), &e),
            e => JobError::Permanent(e.to_string()),
        })?;
        if listing.truncated {
            return Err(JobError::Permanent(format!(
                "the reference inputs hold more than {MAX_REFERENCE_FILES} files (at {r})"
            )));
        }
        files.extend(listing.files.into_iter().map(|f| f.path));
    }
    files.extend(members.iter().cloned());
    // A file named alone and under a directory reference (or a member too) is read once.
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(f.clone()));
    if files.len() > MAX_REFERENCE_FILES {
        return Err(JobError::Permanent(format!(
            "the reference inputs and group members hold {} files, more than {MAX_REFERENCE_FILES}",
            files.len()
        )));
    }
    read_each(storage, files).await
}

/// The job's own checkpoint area, for a function that asks for checkpoints: a new directory
/// `<checkpoint_dir><random id>/` and a macaroon issued for the run's `writer` to read, write
/// and replace files in exactly it, so no other job's area is reachable with it. Refused for
/// good when this gateway keeps no checkpoints.
async fn checkpoint_area(
    cx: JobContext<'_>,
    m: &htfaas_functions::FunctionManifest,
    writer: &str,
) -> Result<Option<CheckpointSpec>, JobError> {
    let Some(policy) = m.checkpoint else { return Ok(None) };
    let Some(root) = cx.checkpoint_dir else {
        return Err(JobError::Permanent(format!(
            "function {} asks for checkpoints and this gateway keeps none (it has no checkpoint_dir)",
            m.name
        )));
    };
    let dir = format!("{root}{}/", uuid::Uuid::new_v4());
    let macaroon =
        cx.storage.checkpoint_macaroon(&dir, writer).await.map_err(|e| storage_failure(e.to_string(), &e))?;
    Ok(Some(CheckpointSpec {
        url: cx.storage.url_of(&dir),
        macaroon,
        max_bytes: policy.max_bytes(),
        exit_code: policy.exit_code,
    }))
}

/// How many read macaroons one job asks for at once.
const READS_AT_ONCE: usize = 8;

/// A read macaroon for exactly each of `files`, a few asked at once, in their order.
async fn read_each(storage: &StorageClient, files: Vec<String>) -> Result<Vec<ReferenceInput>, JobError> {
    use futures_util::{StreamExt as _, TryStreamExt as _};
    futures_util::stream::iter(files)
        .map(|path| async move {
            let macaroon = storage
                .read_macaroon(&path)
                .await
                .map_err(|e| storage_failure(format!("reference {path}: {e}"), &e))?;
            let rel = path.trim_start_matches('/').to_owned();
            Ok::<_, JobError>(ReferenceInput { url: storage.url_of(&path), path: rel, macaroon, sha256: None })
        })
        .buffered(READS_AT_ONCE)
        .try_collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::namespace::Right;

    fn grant(principal: &str, right: Right, value: &str) -> htfaas_functions::namespace::Grant {
        htfaas_functions::namespace::Grant { principal: principal.into(), right, value: value.into() }
    }

    /// A bearer's run needs the bearer's own namespace as well as the owner's (a token's group
    /// widening it only with a group grant); the owner's run needs the owner's alone. A job made
    /// before a grant was taken back is no longer allowed, naming the principal and the path.
    #[test]
    fn a_run_is_confined_to_its_principals_namespace_as_it_stands() {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = htfaas_functions::Registry::open(dir.path()).expect("registry");
        let configured = vec![
            grant("alice", Right::Read, "/data/"),
            grant("alice", Right::Write, "/out/"),
            grant("bob", Right::Write, "/out/"),
            grant("group:atlas", Right::Read, "/data/"),
        ];
        let namespaces = Namespaces::load(configured, &registry).expect("namespaces");
        let f = crate::testing::function("f", None, None);
        let m = &f.manifest;
        assert_eq!(RunsAs::of(m, "alice", None), RunsAs::Owner);
        assert!(confine_run(&namespaces, &f, RunsAs::Owner, Some("/data/x")).is_ok());
        let bob = RunsAs::of(m, "bob", None);
        assert_eq!(bob, RunsAs::Bearer { name: "bob", group: None });
        let Err(JobError::Permanent(why)) = confine_run(&namespaces, &f, bob, Some("/data/x")) else {
            panic!("bob read")
        };
        assert_eq!(why, "/data/x is outside the read namespace of bob");
        // The group's read grant counts for bob only with his group grant.
        let grouped = RunsAs::Bearer { name: "bob", group: Some("atlas") };
        let Err(JobError::Permanent(why)) = confine_run(&namespaces, &f, grouped, Some("/data/x")) else {
            panic!("claim")
        };
        assert!(why.contains("bob may not charge runs to the accounting group \"atlas\""), "{why}");
        registry.grant(&grant("bob", Right::Group, "atlas")).expect("grant");
        namespaces.reload(&registry).expect("reload");
        assert!(confine_run(&namespaces, &f, grouped, Some("/data/x")).is_ok());

        // A job of bob's, made while allowed, is no longer once the group grant goes.
        let job: htfaas_functions::proto::JobRecord = serde_json::from_value(serde_json::json!({
            "id": "j", "owner": "bob", "group": "atlas", "function": "f", "version": 3,
            "digest": m.module, "state": "held", "reason": "", "input": "http://s/data/x",
            "event": {"source": "submit", "id": "e", "path": "/data/x"}, "token_jti": "t",
            "resources": m.resources, "ep": null, "submitted_at_ms": 0, "started_at_ms": null,
            "finished_at_ms": null, "exit_code": null, "usage": null, "outputs": []
        }))
        .expect("a job record");
        assert_eq!(allowed_for(&namespaces, Some(&f), &job), Ok(()));
        registry.revoke_grant(&grant("bob", Right::Group, "atlas")).expect("revoke");
        namespaces.reload(&registry).expect("reload");
        let why = allowed_for(&namespaces, Some(&f), &job).expect_err("revoked");
        assert!(why.contains("no group grant"), "{why}");
        assert_eq!(allowed_for(&namespaces, None, &job), Ok(()), "no version: nothing to check against");
    }

    /// A run on no file (an event naming no path) is refused for good for a function that runs
    /// on files, before the storage is asked for anything; a function scheduled on no file goes
    /// on to the storage (here away: a transient failure, tried again later).
    #[tokio::test]
    async fn a_run_on_no_file_is_only_a_schedule_on_no_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = htfaas_functions::Registry::open(dir.path()).expect("registry");
        let grants = vec![grant("alice", Right::Read, "/data/"), grant("alice", Right::Write, "/out/")];
        let namespaces = Namespaces::load(grants, &registry).expect("namespaces");
        let secrets = crate::secrets::Secrets::new(htfaas_functions::seal::Sealer::from_key(&[9u8; 32]));
        let auth = crate::storage_client::StorageAuth::Basic { user: "u".into(), secret: "s".into() };
        let kind = crate::storage_client::StorageKind::Dcache;
        let storage = StorageClient::new(reqwest::Client::new(), kind, "http://127.0.0.1:9", auth, "PT2H", "PT4H");
        let cx = JobContext {
            namespaces: &namespaces,
            registry: &registry,
            secrets: &secrets,
            storage: &storage,
            public_url: "http://gw",
            bind_macaroons_to_ep: false,
            checkpoint_dir: None,
        };
        let no_file = EventRef::new("backfill:schedule:1", "backfill:schedule:f:1", "");
        let on_files = crate::testing::function("f", None, None);
        let refused = prepare(cx, &on_files, RunsAs::Owner, no_file.clone(), "k".into(), &[]).await;
        let Err(JobError::Permanent(why)) = refused else { panic!("a run on no file of a function on files") };
        assert!(why.contains("a run on no file: function f runs only on a file"), "{why}");
        let mut nightly = crate::testing::function("nightly", None, None);
        nightly.manifest.trigger =
            htfaas_functions::Trigger { schedule: Some("0 3 * * *".into()), ..htfaas_functions::Trigger::on_path("") };
        let storage_away = prepare(cx, &nightly, RunsAs::Owner, no_file, "k".into(), &[]).await;
        assert!(matches!(storage_away, Err(JobError::Transient(_))), "{storage_away:?}");
    }
}
