//! Function manifests: what a developer registers (trigger, resources, outputs), and the
//! versioned record the registry keeps for it.

use crate::digest::Digest;
pub use crate::on_failure::{FailedOutputs, RetryOn, RetryPolicy};
/// What one run may use; defined in `crate::resources`, named here as it always was.
pub use crate::resources::Resources;
pub use crate::resources::{DEFAULT_VACATE_S, MAX_VACATE_S, vacate_time};
use crate::trigger::{Rule, RuleError};
use serde::{Deserialize, Serialize};

/// Largest request a manifest may make; a site's real limits come with the scheduler policy.
pub const MAX_CPUS: u32 = 64;
/// Largest memory request, in MiB.
pub const MAX_MEMORY_MB: u64 = 256 * 1024;
/// Longest run time, in seconds (one week).
pub const MAX_RUNTIME_S: u64 = 7 * 24 * 3600;
/// Most GPUs one run may ask for.
pub const MAX_GPUS: u32 = 64;
/// Largest scratch-disk request, in MiB (16 TiB).
pub const MAX_DISK_MB: u64 = 16 * 1024 * 1024;

/// What a developer registers. Stored as JSON (schema version 1, see [`FunctionRecord`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionManifest {
    /// Function name: `[a-z0-9][a-z0-9_-]{0,62}`.
    pub name: String,
    /// Who is accounted for every run of this function.
    pub owner: String,
    /// The function's code by content digest, uploaded first: its wasm module, or for
    /// `runtime: native` its image (a root filesystem tar; `"image"` is accepted as the key).
    #[serde(alias = "image")]
    pub module: Digest,
    /// Which runtime runs it: `wasm` (default) or `native` (`command` in the image, in a
    /// sandbox of namespaces, seccomp and a control group).
    #[serde(default, skip_serializing_if = "RuntimeKind::is_wasm")]
    pub runtime: RuntimeKind,
    /// For `runtime: native`: the command (argv) run in the image; the input file's guest path
    /// and `args` follow it, as for wasm. Empty for wasm.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// For `runtime: native`: `command` is a **handler**, a worker started once and then given
    /// one run after another (a request line on its stdin, its answer on descriptor 3), kept
    /// warm per function version on each EP; its argv is `command` and `args` alone. False: the
    /// command is started for each run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handler: bool,
    /// Which storage events fire this function.
    pub trigger: Trigger,
    /// What one run may use.
    #[serde(default)]
    pub resources: Resources,
    /// Where the run's output files go.
    pub outputs: Outputs,
    /// Arguments passed to the module after the input file's guest path.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment of the module: exactly these variables, nothing else.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// When set, runs go only to EPs whose attach token names this annex (the owner's own
    /// capacity, as HTCondor's `TargetAnnexName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annex: Option<String>,
    /// The job class its runs belong to (a site's `lite`, `short`, `long`, ...), which bounds
    /// their run time; none takes the scheduler's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Per-run ceilings narrower than the EPs' own: output bytes and files, and an instruction
    /// budget where EPs meter fuel. The EP enforces the lower of its setting and this; nothing
    /// here widens what an EP allows. Default: none (the EP's own).
    #[serde(default, skip_serializing_if = "crate::resources::JobLimits::is_unset")]
    pub limits: crate::resources::JobLimits,
    /// The accounting group its runs are charged to (within the owner): they take part in the
    /// group's quota, oversubscription and pauses, and reach what `group:<name>` is granted.
    /// The owner needs a `group` grant for it. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Names of the secrets its runs get in their environment (values set apart, sealed:
    /// `PUT /v1/functions/{name}/secrets`, `fn register --secret K=@file`); a run waits until
    /// every one has a value. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Whether a failed run runs again ([`RetryPolicy`]): how many times, after which
    /// outcomes, with which backoff. Default: none — storage outages are retried by the
    /// scheduler's site-wide rule, guest failures (non-zero exit, trap, limits) are not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Where the end of each failed job is POSTed, signed ([`Webhook`]). Default:
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<Webhook>,
    /// Most runs of this function at once, over every version and runner (the scheduler counts
    /// what it has assigned to EPs); further jobs wait idle, they do not fail. At least 1, at
    /// most [`MAX_CONCURRENT`]. Default: none (the site's per-owner limit alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// Read-only inputs every run gets besides the file that fired it ([`Inputs`]): reference
    /// data such as calibration constants. Default: none.
    #[serde(default, skip_serializing_if = "Inputs::is_empty")]
    pub inputs: Inputs,
    /// For `runtime: native`: seconds between the SIGTERM a stopped run gets (a cancel, a
    /// removal, an EP leaving) and the SIGKILL of its whole control group; a run reaching its
    /// run time gets the SIGTERM this long before it ([`vacate_time`]: counted inside the run
    /// time). At most [`MAX_VACATE_S`] and below `resources.runtime_s`; 0 kills at once.
    /// Default: none ([`DEFAULT_VACATE_S`], less for short run times). Refused for wasm: a
    /// wasm guest has no signals to catch, it is interrupted at its deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vacate_s: Option<u64>,
    /// Checkpoints ([`crate::checkpoint`]): the guest keeps its state in `/checkpoint`, which
    /// is stored when it exits with `exit_code` or is stopped before its end, and restored for
    /// its next attempt on any EP. Default: none (every attempt starts afresh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::checkpoint::CheckpointPolicy>,
}

/// Most runs at once a manifest may allow ([`FunctionManifest::max_concurrent`]).
pub const MAX_CONCURRENT: u32 = 1_000_000;
/// Most reference inputs one manifest may name.
pub const MAX_REFERENCE_INPUTS: usize = 16;

/// The extra read-only inputs of a function's runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inputs {
    /// Reference files (`/data/calib/pedestals-v3.h5`) or directories, ending in `/`
    /// (`/data/calib/run-conditions/`: every file below it), in the owner's read namespace.
    /// Each run reads them under `/input/ref/`, by their path below the storage root.
    #[serde(default, rename = "ref", skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<String>,
}

impl Inputs {
    /// Whether it names nothing (the manifest then carries no `inputs`).
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }
}

/// Which runtime runs a function's code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// A WebAssembly module under the EP's wasmtime (µs starts).
    #[default]
    Wasm,
    /// A command in an image, confined by the EP's native sandbox.
    Native,
}

impl RuntimeKind {
    /// Whether this is the default, `wasm`.
    pub fn is_wasm(&self) -> bool {
        *self == RuntimeKind::Wasm
    }

    /// Its name in manifests and EP hellos.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Wasm => "wasm",
            RuntimeKind::Native => "native",
        }
    }
}

/// Most words of a native command.
pub const MAX_COMMAND_WORDS: usize = 64;

/// A function's failure webhook: the gateway POSTs each of its failed jobs' notification
/// (`proto::JobNotification`, JSON) to `url`, signed with HMAC-SHA256 under the function's
/// secret named `key_secret` (`proto::webhook_signature`). The key is never in a run's
/// environment: it is not one of `secrets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    /// `https://…` only; its host must be one the site allows (the gateway's `webhook_hosts`).
    pub url: String,
    /// The name of the function's secret that holds the signing key. Default: `WEBHOOK_KEY`.
    #[serde(default = "Webhook::default_key_secret")]
    pub key_secret: String,
}

impl Webhook {
    /// The secret's name when the manifest does not say.
    pub const DEFAULT_KEY_SECRET: &'static str = "WEBHOOK_KEY";

    fn default_key_secret() -> String {
        Webhook::DEFAULT_KEY_SECRET.to_owned()
    }

    /// Checks what can be checked without the site: an `https://` URL of at most 2048 bytes
    /// with a host and no user part, no whitespace or control characters; a key name that is a
    /// valid secret name and not one the runs get.
    fn validate(&self, m: &FunctionManifest) -> Result<(), ManifestError> {
        let url = &self.url;
        let Some(rest) = url.strip_prefix("https://") else {
            return Err(bad("webhook.url", "must be an https:// URL"));
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if url.len() > 2048 || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("webhook.url", "at most 2048 bytes, without spaces or control characters"));
        }
        if authority.is_empty() || authority.contains('@') {
            return Err(bad("webhook.url", "must name a host, without a user part"));
        }
        if !is_env_name(&self.key_secret) || self.key_secret.len() > 128 {
            return Err(bad("webhook.key_secret", "must be a secret name (1-128 bytes, no '=' or NUL)"));
        }
        if m.secrets.contains(&self.key_secret) || m.env.iter().any(|(k, _)| *k == self.key_secret) {
            return Err(bad("webhook.key_secret", "must not be one of secrets or env: the runs never get the key"));
        }
        Ok(())
    }
}

/// Whether `name` may name an environment variable (or a secret): 1-128 bytes, no `=`, NUL or
/// control character.
pub fn is_env_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 128 && !name.contains('=') && !name.chars().any(char::is_control)
}

/// Checks a name of the `[a-z0-9][a-z0-9_-]{0,62}` form (function and annex names).
pub fn check_name(name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok { Ok(()) } else { Err(NameError(name.to_owned())) }
}

/// A name [`check_name`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} must match [a-z0-9][a-z0-9_-]{{0,62}}")]
pub struct NameError(pub String);

/// The message, for callers whose errors are strings.
impl From<NameError> for String {
    fn from(e: NameError) -> String {
        e.to_string()
    }
}

/// Most events per second a [`RateLimit`] may allow.
pub const MAX_RATE_PER_S: f64 = 100_000.0;
/// Longest debounce window, seconds (one day).
pub const MAX_DEBOUNCE_S: u64 = 86_400;

/// When a function fires: a path glob, a rule ([`crate::trigger`]), or both (then both must
/// hold). With neither, the manifest is refused, unless it has a schedule: it then runs once per
/// tick on no file ([`Trigger::on_no_file`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trigger {
    /// Glob over the event's storage path: `*` stays within one path segment, `**` spans
    /// segments, e.g. `/data/raw/**`. Empty (or absent): no path glob, the rule decides alone.
    /// Kept a string rather than an option so that stored manifests (`{"path": "…"}`) read as
    /// they always did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// A trigger rule, e.g. `path prefix "/data/raw/" and size > 1MB and not name suffix ".tmp"`
    /// (see [`crate::trigger`] for the language). A rule that mentions neither `kind` nor
    /// `type` fires only on writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// At most this many jobs started per second by this trigger. Per rule: the excess waits,
    /// it is not dropped. Enforced by the gateway's firing dispatcher (a token bucket per
    /// function; a firing without a token is given the time its token will be there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateLimit>,
    /// Debounce window, seconds (at most [`MAX_DEBOUNCE_S`]): many writes to one path within the
    /// window start one job. Per rule; the excess waits, it is not dropped. Enforced by the
    /// gateway's firing dispatcher: a firing waits this long, and a later one for the same path
    /// that arrives meanwhile replaces it, so a burst starts one job, on its last event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce_s: Option<u64>,
    /// A crontab schedule (`0 3 * * *`, [`crate::schedule`]) in the site's time zone (the
    /// gateway's `time_zone`): the function then fires on its ticks, not on events. Each tick
    /// fires it once on every file below its path glob's or rule's directories that the trigger
    /// is true for (as a back-fill lists them); ticks missed while the gateway was down fire
    /// once, the latest. With neither a path glob nor a rule, each tick runs it once on no file
    /// (a nightly summary reading only its `inputs.ref`). Default: none (events fire it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Collect the trigger's files into groups and fire once per complete group
    /// ([`crate::collect::Collect`]): the run's input is the file that completed it, the
    /// group's other files its reference inputs. Default: none (each event fires).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collect: Option<crate::collect::Collect>,
}

/// A token bucket over the jobs one trigger starts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained jobs per second: more than 0, at most [`MAX_RATE_PER_S`].
    pub per_s: f64,
    /// Jobs that may start at once after a quiet spell: at least 1.
    pub burst: u32,
}

// Bit-wise, so that equality is an equivalence (NaN equals itself) and manifests stay `Eq`.
impl PartialEq for RateLimit {
    fn eq(&self, other: &Self) -> bool {
        self.per_s.to_bits() == other.per_s.to_bits() && self.burst == other.burst
    }
}
impl Eq for RateLimit {}

impl Trigger {
    /// A trigger on a path glob alone.
    pub fn on_path(glob: impl Into<String>) -> Trigger {
        Trigger { path: glob.into(), rule: None, rate: None, debounce_s: None, schedule: None, collect: None }
    }

    /// A trigger on a rule alone.
    pub fn on_rule(rule: impl Into<String>) -> Trigger {
        Trigger {
            path: String::new(),
            rule: Some(rule.into()),
            rate: None,
            debounce_s: None,
            schedule: None,
            collect: None,
        }
    }

    /// Whether it runs on no file: a schedule with neither a path glob nor a rule. Each tick
    /// then runs the function once, without an input; no storage event ever fires it.
    pub fn on_no_file(&self) -> bool {
        self.schedule.is_some() && self.path.is_empty() && self.rule.is_none()
    }

    /// The one rule this trigger means: its path glob and its rule, and-ed when both are given.
    /// An error names what is wrong (a bad glob at column 1, or the rule's own column); a
    /// trigger on no file ([`Trigger::on_no_file`]) has no rule.
    pub fn compile(&self) -> Result<Rule, RuleError> {
        let path = (!self.path.is_empty()).then(|| Rule::path_glob(&self.path)).transpose()?;
        let rule = self.rule.as_deref().map(Rule::parse).transpose()?;
        match (path, rule) {
            (Some(p), Some(r)) => Ok(p.and(r)),
            (Some(one), None) | (None, Some(one)) => Ok(one),
            (None, None) => Err(RuleError { column: 1, message: "the trigger has neither a path nor a rule".into() }),
        }
    }

    /// Checks the trigger; the error names the field.
    fn validate(&self) -> Result<(), ManifestError> {
        if self.path.is_empty() && self.rule.is_none() && self.schedule.is_none() {
            return Err(bad("trigger", "needs a path glob, a rule, or both (or a schedule, to run on no file)"));
        }
        if !self.path.is_empty() {
            crate::glob::compile_glob(&self.path).map_err(|e| bad("trigger.path", e.to_string()))?;
        }
        if let Some(rule) = &self.rule {
            Rule::parse(rule).map_err(|e| bad("trigger.rule", e.to_string()))?;
        }
        if let Some(r) = &self.rate
            && !(r.per_s > 0.0 && r.per_s <= MAX_RATE_PER_S && r.burst >= 1)
        {
            return Err(bad("trigger.rate", format!("per_s must be in (0, {MAX_RATE_PER_S}] and burst at least 1")));
        }
        if self.debounce_s.is_some_and(|d| d > MAX_DEBOUNCE_S) {
            return Err(bad("trigger.debounce_s", format!("must be 0..={MAX_DEBOUNCE_S}")));
        }
        if let Some(schedule) = &self.schedule {
            crate::schedule::Cron::parse(schedule).map_err(|e| bad("trigger.schedule", e.to_string()))?;
            if self.debounce_s.is_some() {
                return Err(bad(
                    "trigger.schedule",
                    "a scheduled function fires on ticks: debounce_s has no events to join",
                ));
            }
        }
        if let Some(collect) = &self.collect {
            collect.validate().map_err(|e| bad("trigger.collect", e.to_string()))?;
            if self.schedule.is_some() || self.debounce_s.is_some() {
                return Err(bad(
                    "trigger.collect",
                    "a collecting trigger fires once per group: it takes no schedule and no debounce_s",
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Trigger {
    /// The path glob as it is, the rule as it is, or both as one rule, and its schedule;
    /// padded as asked.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match (self.path.is_empty(), &self.rule) {
            (false, None) => self.path.clone(),
            (true, Some(rule)) => rule.clone(),
            (false, Some(rule)) => format!("path glob {} and ({rule})", crate::trigger::quote(&self.path)),
            (true, None) if self.schedule.is_some() => "no file".into(),
            (true, None) => "(none)".into(),
        };
        let what = match &self.schedule {
            Some(s) => format!("{what} at each tick of {}", crate::trigger::quote(s)),
            None => what,
        };
        match &self.collect {
            Some(c) => f.pad(&format!("{what}, collected ({c})")),
            None => f.pad(&what),
        }
    }
}

/// Where a run writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outputs {
    /// Storage directory for output files, absolute, ending in `/`, e.g. `/data/checksums/`.
    pub dir: String,
    /// Whether runs may replace files that already exist in `dir` (the write macaroon then
    /// allows `DELETE` besides `UPLOAD`); the owner's namespace must grant `replace` there.
    /// Without it a run creates new files only (and may rewrite what a run of this function
    /// wrote: see the storage). Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replace: bool,
    /// What becomes of the outputs of a run that did not succeed ([`FailedOutputs`]):
    /// `discard` (the default), `quarantine` (under `<dir>.quarantine/<job id>/`, never firing
    /// a function) or `upload` (a non-zero exit's outputs stored as a success's).
    #[serde(default, skip_serializing_if = "FailedOutputs::is_default")]
    pub on_failure: FailedOutputs,
}

impl Outputs {
    /// Outputs into `dir`, no replacing, failed runs' outputs discarded.
    pub fn into_dir(dir: impl Into<String>) -> Outputs {
        Outputs { dir: dir.into(), replace: false, on_failure: FailedOutputs::Discard }
    }
}

/// A registered function version. Immutable once stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionRecord {
    /// Stored format version; 1 today.
    pub schema: u32,
    /// 1 for the first registration of a name, then +1 for each new manifest.
    pub version: u32,
    /// When it was registered (Unix seconds).
    pub registered_at: u64,
    /// What was registered.
    pub manifest: FunctionManifest,
}

/// Why a manifest was refused, naming the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid manifest: {field}: {reason}")]
pub struct ManifestError {
    /// The offending field, e.g. `trigger.path`.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn bad(field: &'static str, reason: impl Into<String>) -> ManifestError {
    ManifestError { field, reason: reason.into() }
}

/// Whether `p` is an absolute storage path without `.`/`..`/empty segments, NULs or backslashes.
pub fn is_clean_abs_path(p: &str) -> bool {
    let Some(rest) = p.strip_prefix('/') else { return false };
    if rest.is_empty() {
        return true;
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    !p.contains(['\0', '\\']) && rest.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
}

impl FunctionManifest {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ManifestError> {
        check_name(&self.name).map_err(|e| bad("name", e))?;
        if let Some(annex) = &self.annex {
            check_name(annex).map_err(|e| bad("annex", e))?;
        }
        if self.owner.is_empty() || self.owner.len() > 128 || self.owner.chars().any(|c| c.is_control()) {
            return Err(bad("owner", "must be 1-128 printable characters"));
        }
        self.trigger.validate()?;
        let l = &self.limits;
        for (field, value) in [
            ("limits.max_output_bytes", l.max_output_bytes),
            ("limits.max_output_files", l.max_output_files),
            ("limits.instructions", l.instructions),
        ] {
            if value == Some(0) {
                return Err(bad(field, "must be at least 1 (leave it out for the EP's own bound)"));
            }
        }
        let r = &self.resources;
        if r.cpus == 0 || r.cpus > MAX_CPUS {
            return Err(bad("resources.cpus", format!("must be 1..={MAX_CPUS}")));
        }
        if r.memory_mb == 0 || r.memory_mb > MAX_MEMORY_MB {
            return Err(bad("resources.memory_mb", format!("must be 1..={MAX_MEMORY_MB}")));
        }
        if r.runtime_s > MAX_RUNTIME_S {
            return Err(bad(
                "resources.runtime_s",
                format!("must be 0..={MAX_RUNTIME_S} (0: the job class's default)"),
            ));
        }
        if r.gpus > MAX_GPUS {
            return Err(bad("resources.gpus", format!("must be 0..={MAX_GPUS}")));
        }
        if r.disk_mb > MAX_DISK_MB {
            return Err(bad("resources.disk_mb", format!("must be 0..={MAX_DISK_MB}")));
        }
        if self.secrets.len() > 64
            || self
                .secrets
                .iter()
                .enumerate()
                .any(|(i, k)| !is_env_name(k) || self.secrets[..i].contains(k) || self.env.iter().any(|(e, _)| e == k))
        {
            return Err(bad(
                "secrets",
                "at most 64 distinct names, each non-empty without '=' or NUL and not also in env",
            ));
        }
        if let Some(group) = &self.group {
            check_name(group).map_err(|e| bad("group", e))?;
        }
        if let Some(class) = &self.class {
            check_name(class).map_err(|e| bad("class", e))?;
        }
        if !self.outputs.dir.ends_with('/') || !is_clean_abs_path(&self.outputs.dir) || self.outputs.dir == "/" {
            return Err(bad("outputs.dir", "must be an absolute directory below / ending in '/', without . or .."));
        }
        if let Some(retry) = &self.retry {
            retry.check().map_err(|e| bad(e.field, e.reason))?;
        }
        if let Some(webhook) = &self.webhook {
            webhook.validate(self)?;
        }
        if self.max_concurrent.is_some_and(|n| n == 0 || n > MAX_CONCURRENT) {
            return Err(bad(
                "max_concurrent",
                format!("must be 1..={MAX_CONCURRENT} (leave it out for no limit): 0 would never run a job"),
            ));
        }
        let refs = &self.inputs.refs;
        if refs.len() > MAX_REFERENCE_INPUTS
            || refs.iter().enumerate().any(|(i, r)| !is_clean_abs_path(r) || r == "/" || refs[..i].contains(r))
        {
            return Err(bad(
                "inputs.ref",
                format!(
                    "at most {MAX_REFERENCE_INPUTS} distinct clean absolute paths below / (a directory ends in '/')"
                ),
            ));
        }
        match self.runtime {
            RuntimeKind::Wasm if !self.command.is_empty() => {
                return Err(bad("command", "only a native function has a command (runtime: native)"));
            }
            RuntimeKind::Native if self.command.is_empty() => {
                return Err(bad("command", "a native function needs its command (argv in the image)"));
            }
            RuntimeKind::Wasm if self.handler => {
                return Err(bad("handler", "only a native function has the handler form (runtime: native)"));
            }
            RuntimeKind::Wasm if self.vacate_s.is_some() => {
                return Err(bad("vacate_s", "only a native function has a vacate time (a wasm guest gets no SIGTERM)"));
            }
            RuntimeKind::Native if self.handler && self.trigger.on_no_file() => {
                return Err(bad(
                    "handler",
                    "a handler serves one file per run: it cannot be scheduled on no file (give trigger.schedule \
                     a path glob or a rule, or drop handler)",
                ));
            }
            _ => {}
        }
        if let Some(c) = &self.checkpoint {
            c.check().map_err(|(field, reason)| bad(field, reason))?;
            if self.handler {
                return Err(bad("checkpoint", "a handler's warm worker serves many runs: it keeps no checkpoint"));
            }
        }
        if let Some(v) = self.vacate_s
            && (v > MAX_VACATE_S || (r.runtime_s > 0 && v >= r.runtime_s))
        {
            return Err(bad(
                "vacate_s",
                format!("must be 0..={MAX_VACATE_S} and below resources.runtime_s (it is counted inside the run time)"),
            ));
        }
        if self.command.len() > MAX_COMMAND_WORDS
            || self.command.iter().any(|a| a.len() > 4096 || a.contains('\0'))
            || self.command.first().is_some_and(String::is_empty)
        {
            return Err(bad(
                "command",
                format!("at most {MAX_COMMAND_WORDS} words of at most 4096 bytes, no NUL, the first not empty"),
            ));
        }
        if self.args.len() > 64 || self.args.iter().any(|a| a.len() > 4096 || a.contains('\0')) {
            return Err(bad("args", "at most 64 arguments of at most 4096 bytes, no NUL"));
        }
        if self.env.len() > 64
            || self.env.iter().any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
        {
            return Err(bad("env", "at most 64 variables; names non-empty without '=' or NUL"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
