//! A real Slurm for the annex tests (Debian 12's `slurmctld slurmd slurm-client munge`): a
//! private one-node cluster on loopback in a fresh temporary directory, started by
//! `scripts/slurm/slurm-cluster.sh start DIR` and stopped (jobs cancelled, daemons stopped by
//! pid, leftover job processes killed) when dropped, also when a test panics.
//!
//! Needs root (the script runs the daemons as root, as `SlurmUser`). Without Slurm installed,
//! or without root, the tests are skipped with a notice naming the reason, unless `CI` is set
//! (then they fail): `scripts/install-deps.sh` installs Slurm with apt when it can.

use htfaas::annex::slurm::Slurm;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// A running private cluster.
pub struct Cluster {
    /// Its directory: `slurm.conf`, the munge socket, state, logs, `tmp/` (jobs' scratch).
    pub dir: PathBuf,
    /// Removed after the cluster is stopped (fields drop after `Drop::drop`).
    _tmp: tempfile::TempDir,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/slurm/slurm-cluster.sh")
}

impl Cluster {
    /// Starts the cluster; panics with the script's words when it does not come up.
    pub fn start() -> Cluster {
        let tmp = tempfile::tempdir().expect("temp dir");
        // munged wants every directory above its socket world-executable (tempdir gives 0700).
        set_mode(tmp.path(), 0o755);
        let dir = tmp.path().join("slurm");
        let started = Instant::now();
        let out = Command::new("bash").arg(script()).arg("start").arg(&dir).output().expect("run slurm-cluster.sh");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the Slurm cluster did not start: {stderr}");
        eprintln!("slurm: cluster at {} up after {:?}", dir.display(), started.elapsed());
        Cluster { dir, _tmp: tmp }
    }

    /// `slurm.conf`, what every Slurm command is given as `SLURM_CONF`.
    pub fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// The cluster as an annex provider.
    pub fn provider(&self) -> Slurm {
        Slurm::new(self.conf())
    }

    /// A directory jobs may write to (1777), removed with the cluster.
    pub fn scratch(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// The ids of the jobs Slurm holds that are not over (pending, running, completing).
    pub fn live_jobs(&self) -> Vec<String> {
        let out = Command::new("squeue")
            .env("SLURM_CONF", self.conf())
            .args(["-h", "-o", "%i|%T"])
            .output()
            .expect("run squeue");
        assert!(out.status.success(), "squeue: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('|'))
            .filter(|(_, state)| matches!(*state, "PENDING" | "RUNNING" | "COMPLETING" | "CONFIGURING" | "SUSPENDED"))
            .map(|(id, _)| id.to_owned())
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = Command::new("bash").arg(script()).arg("stop").arg(&self.dir).output();
        if let Ok(out) = out
            && !out.status.success()
        {
            eprintln!("slurm-cluster.sh stop: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Whether a Slurm test can run: the Slurm daemons and clients and munge on PATH, and root.
/// Panics under CI when not; else prints a notice naming `test` and the reason, and the caller
/// skips.
pub fn slurm_available(test: &str) -> bool {
    let missing: Vec<&str> = ["sbatch", "squeue", "scontrol", "scancel", "slurmctld", "slurmd", "munged"]
        .into_iter()
        .filter(|c| {
            !Command::new("sh").args(["-c", &format!("command -v {c}")]).output().is_ok_and(|o| o.status.success())
        })
        .collect();
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let reason = if !missing.is_empty() {
        format!(
            "Slurm is not installed (missing {}; scripts/install-deps.sh installs slurmctld slurmd slurm-client munge \
             with apt, as root)",
            missing.join(", ")
        )
    } else if !root {
        "the private Slurm cluster runs its daemons as root, and this is not root".to_owned()
    } else {
        return true;
    };
    assert!(std::env::var_os("CI").is_none(), "{reason}, but CI is set: the Slurm annex test must run");
    eprintln!("NOTICE: skipping {test}: {reason}");
    false
}
