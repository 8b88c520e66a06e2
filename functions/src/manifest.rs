//! Function manifests: what a developer registers (trigger, resources, outputs), and the
//! versioned record the registry keeps for it.

use crate::Digest;
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
    /// The wasm module, by content digest; upload the bytes first.
    pub module: Digest,
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
}

/// Checks a name of the `[a-z0-9][a-z0-9_-]{0,62}` form (function and annex names).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok { Ok(()) } else { Err(format!("{name:?} must match [a-z0-9][a-z0-9_-]{{0,62}}")) }
}

/// When a function fires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trigger {
    /// Glob over the event's `transferPath`: `*` stays within one path segment, `**` spans
    /// segments, e.g. `/data/raw/**`.
    pub path: String,
}

/// Resources of one run: what the submit token allows and what the EP enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Cores. Default: 1.
    #[serde(default = "default_cpus")]
    pub cpus: u32,
    /// Memory cap in MiB. Default: 2048.
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
    /// Wall-time cap in seconds. Default: 3600. In a manifest (and so in a submit request) 0
    /// asks for the default run time of the job's class, which the scheduler fills in.
    #[serde(default = "default_runtime_s")]
    pub runtime_s: u64,
    /// GPUs. Default: 0. Whether an owner may have them is the scheduler's site policy, not
    /// the submit token's.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub gpus: u32,
    /// Scratch disk in MiB. Default: 0 (none asked; the EP's own bound applies).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub disk_mb: u64,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

fn default_cpus() -> u32 {
    1
}
fn default_memory_mb() -> u64 {
    2048
}
fn default_runtime_s() -> u64 {
    3600
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus: default_cpus(),
            memory_mb: default_memory_mb(),
            runtime_s: default_runtime_s(),
            gpus: 0,
            disk_mb: 0,
        }
    }
}

impl Resources {
    /// Cores, memory and run time as given; no GPUs, no disk.
    pub fn new(cpus: u32, memory_mb: u64, runtime_s: u64) -> Resources {
        Resources { cpus, memory_mb, runtime_s, gpus: 0, disk_mb: 0 }
    }

    /// Whether `self` fits within `limit` in cores, memory and run time (what a submit token
    /// limits; GPUs and disk are site policy).
    pub fn fits_within(&self, limit: &Resources) -> bool {
        self.cpus <= limit.cpus && self.memory_mb <= limit.memory_mb && self.runtime_s <= limit.runtime_s
    }
}

/// Where a run writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outputs {
    /// Storage directory for output files, absolute, ending in `/`, e.g. `/data/checksums/`.
    pub dir: String,
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
        crate::proto::compile_glob(&self.trigger.path).map_err(|e| bad("trigger.path", e))?;
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
        if let Some(class) = &self.class {
            check_name(class).map_err(|e| bad("class", e))?;
        }
        if !self.outputs.dir.ends_with('/') || !is_clean_abs_path(&self.outputs.dir) || self.outputs.dir == "/" {
            return Err(bad("outputs.dir", "must be an absolute directory below / ending in '/', without . or .."));
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
mod tests {
    use super::*;

    fn manifest() -> FunctionManifest {
        FunctionManifest {
            name: "checksum".into(),
            owner: "alice".into(),
            module: Digest::of(b"m"),
            trigger: Trigger { path: "/data/raw/**".into() },
            resources: Resources::default(),
            outputs: Outputs { dir: "/data/checksums/".into() },
            args: vec![],
            env: vec![],
            annex: None,
            class: None,
        }
    }

    #[test]
    fn a_good_manifest_validates() {
        assert_eq!(manifest().validate(), Ok(()));
    }

    #[test]
    fn bad_fields_are_named() {
        type Mutation = Box<dyn Fn(&mut FunctionManifest)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("name", Box::new(|m| m.name = "Bad Name".into())),
            ("trigger.path", Box::new(|m| m.trigger.path = "data/raw/**".into())),
            ("trigger.path", Box::new(|m| m.trigger.path = "/data/[raw".into())),
            ("resources.cpus", Box::new(|m| m.resources.cpus = 0)),
            ("resources.gpus", Box::new(|m| m.resources.gpus = MAX_GPUS + 1)),
            ("resources.disk_mb", Box::new(|m| m.resources.disk_mb = MAX_DISK_MB + 1)),
            ("class", Box::new(|m| m.class = Some("Lite!".into()))),
            ("outputs.dir", Box::new(|m| m.outputs.dir = "/data/../etc/".into())),
            ("outputs.dir", Box::new(|m| m.outputs.dir = "/data/out".into())),
            ("env", Box::new(|m| m.env = vec![("A=B".into(), "c".into())])),
        ];
        for (field, mutate) in cases {
            let mut m = manifest();
            mutate(&mut m);
            assert_eq!(m.validate().map_err(|e| e.field), Err(field));
        }
    }

    #[test]
    fn clean_paths() {
        for ok in ["/", "/a", "/a/b/", "/a/b.c"] {
            assert!(is_clean_abs_path(ok), "{ok}");
        }
        for bad in ["", "a", "/a//b", "/a/../b", "/./a", "/a\\b", "/a/\0"] {
            assert!(!is_clean_abs_path(bad), "{bad}");
        }
    }
}
