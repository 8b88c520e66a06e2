//! What one run may use: [`Resources`] (cores, memory, run time, GPUs, disk: what a manifest
//! asks for, a submit token allows and an EP enforces), [`JobLimits`] (per-job ceilings that
//! narrow an EP's own settings) and a native run's vacate time ([`vacate_time`]: how long it
//! has between SIGTERM and SIGKILL).
//!
//! Must not know: manifests, tokens, the wire messages that carry these, any policy.

use serde::{Deserialize, Serialize};

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

/// Per-job ceilings a function may ask for, each narrowing the EP's own setting of the same
/// name: the EP enforces the lower of the two, so nothing here can widen what an EP allows.
/// Every field is optional (absent: the EP's setting alone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobLimits {
    /// Most output bytes stored (the EP's `max_output_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Most output files and directories (the EP's `max_output_files`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_files: Option<u64>,
    /// Instruction budget (the EP's `fuel`); applies only on an EP that meters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<u64>,
}

impl JobLimits {
    /// Whether no limit is set (the wire then carries no `limits`).
    pub fn is_unset(&self) -> bool {
        *self == JobLimits::default()
    }
}

/// A native run's vacate time when its function names none, seconds: HTCondor's habit, and
/// what sites such as DESY give a batch job to leave after SIGTERM.
pub const DEFAULT_VACATE_S: u64 = 300;
/// Longest vacate time a function may ask for, seconds. It bounds how long a stopping EP
/// waits for its native jobs to leave, so it stays well below a site's drain.
pub const MAX_VACATE_S: u64 = 1800;

/// The vacate time, seconds, of a native run of `runtime_s` seconds whose function asks for
/// `vacate_s`: the time between the SIGTERM a stop (or the run time's approach) sends and
/// the SIGKILL of its whole group. It is counted inside the run time, so it is always shorter
/// than it (0 for a run time of 1 s or less: killed at once, as a wasm guest is interrupted).
/// Asked for: that, at most [`MAX_VACATE_S`]. Not asked for: [`DEFAULT_VACATE_S`], or a
/// quarter of the run time when that is shorter, so a short run is not told to leave early in
/// its life. An EP computes this itself, whatever the manifest's validation let through.
pub fn vacate_time(vacate_s: Option<u64>, runtime_s: u64) -> u64 {
    let asked = match vacate_s {
        Some(v) => v.min(MAX_VACATE_S),
        None => DEFAULT_VACATE_S.min(runtime_s / 4),
    };
    asked.min(runtime_s.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vacate_time_stays_inside_the_run_time_and_defaults_to_five_minutes() {
        assert_eq!(vacate_time(None, 3600), DEFAULT_VACATE_S);
        assert_eq!(vacate_time(None, 60), 15, "a quarter of a short run time");
        assert_eq!(vacate_time(Some(2), 60), 2);
        assert_eq!(vacate_time(Some(0), 60), 0, "0: killed at once");
        assert_eq!(vacate_time(Some(100), 60), 59, "always shorter than the run time");
        assert_eq!(vacate_time(Some(u64::MAX), MAX_VACATE_S * 10), MAX_VACATE_S);
        assert_eq!(vacate_time(Some(5), 1), 0);
        assert_eq!(vacate_time(None, 0), 0);
    }
}
