//! One native job's control group: its limits (memory, pids, cpu quota), its usage (CPU time,
//! peak memory, whether the kernel's OOM killer struck), and the end of every process in it:
//! asked (SIGTERM, [`Group::term_all`]) and then forced (SIGKILL, [`Group::kill_all`]).
//!
//! Two backends, chosen once at EP start ([`Backend::detect`]): cgroup v2 where the host is pure
//! v2 (`cgroup.controllers` at `/sys/fs/cgroup`), the v1 controllers `memory`, `pids`, `cpu`,
//! `cpuacct` where it is hybrid or v1 (as on the development machines). Neither: no native
//! slots. A job's group is `<root>/htfaas/<job>` under each controller (v1) or under the
//! unified root (v2); it is removed once empty.
//!
//! Must not know: bubblewrap, jobs, the network.

use std::io;
use std::path::{Path, PathBuf};

/// Where the cgroup file systems are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The v1 controllers a native job needs.
const V1_CONTROLLERS: [&str; 4] = ["memory", "pids", "cpu", "cpuacct"];
/// The cpu period a quota is expressed in, µs.
const CPU_PERIOD_US: u64 = 100_000;

/// Which cgroup interface this host offers native jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The unified hierarchy; the jobs' parent (with `+memory +pids +cpu` delegated).
    V2(PathBuf),
    /// One directory per v1 controller: the jobs' parent under each of `V1_CONTROLLERS`.
    V1(Vec<PathBuf>),
}

/// A job's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory, bytes (swap included where the kernel accounts it).
    pub memory_bytes: u64,
    /// Processes and threads.
    pub pids: u64,
    /// Cores: the quota is `cpus` periods per period.
    pub cpus: u32,
}

/// What a job's group used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of every process, user and system, ms.
    pub cpu_ms: u64,
    /// Peak memory, bytes.
    pub peak_memory_bytes: u64,
    /// Whether the OOM killer killed a process of the group.
    pub oom_killed: bool,
}

impl Backend {
    /// The backend this host offers under `root` (normally [`CGROUP_ROOT`]), with the jobs'
    /// parent group `htfaas` made; `Err` says why neither works.
    pub fn detect(root: &Path) -> io::Result<Backend> {
        if root.join("cgroup.controllers").is_file() {
            let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))?;
            for needed in ["memory", "pids", "cpu"] {
                if !controllers.split_whitespace().any(|c| c == needed) {
                    return Err(io::Error::other(format!("cgroup v2 without the {needed} controller")));
                }
            }
            let parent = root.join("htfaas");
            std::fs::create_dir_all(&parent)?;
            std::fs::write(root.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
            std::fs::write(parent.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
            return Ok(Backend::V2(parent));
        }
        let mut parents = Vec::new();
        for c in V1_CONTROLLERS {
            let dir = root.join(c);
            if !dir.join("cgroup.procs").is_file() {
                return Err(io::Error::other(format!(
                    "no cgroup v2 and no v1 {c} controller under {}",
                    root.display()
                )));
            }
            let parent = dir.join("htfaas");
            std::fs::create_dir_all(&parent)?;
            parents.push(parent);
        }
        Ok(Backend::V1(parents))
    }

    /// A name for logs: `cgroup v2` or `cgroup v1 (memory, pids, cpu, cpuacct)`.
    pub fn describe(&self) -> String {
        match self {
            Backend::V2(_) => "cgroup v2".into(),
            Backend::V1(_) => format!("cgroup v1 ({})", V1_CONTROLLERS.join(", ")),
        }
    }

    /// Makes job `name`'s group with `limits`.
    pub fn create(&self, name: &str, limits: Limits) -> io::Result<Group> {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(io::Error::other(format!("{name:?} is not a cgroup name")));
        }
        let quota = u64::from(limits.cpus.max(1)) * CPU_PERIOD_US;
        match self {
            Backend::V2(parent) => {
                let dir = parent.join(name);
                std::fs::create_dir(&dir)?;
                let group = Group { dirs: vec![dir.clone()], v2: true };
                std::fs::write(dir.join("memory.max"), limits.memory_bytes.to_string())?;
                // No swap: the memory limit is the whole limit.
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                std::fs::write(dir.join("pids.max"), limits.pids.to_string())?;
                std::fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}"))?;
                Ok(group)
            }
            Backend::V1(parents) => {
                let dirs: Vec<PathBuf> = parents.iter().map(|p| p.join(name)).collect();
                for d in &dirs {
                    std::fs::create_dir(d)?;
                }
                let group = Group { dirs: dirs.clone(), v2: false };
                let [memory, pids, cpu, _cpuacct] = dirs.as_slice() else {
                    return Err(io::Error::other("four v1 controllers expected"));
                };
                std::fs::write(memory.join("memory.limit_in_bytes"), limits.memory_bytes.to_string())?;
                // With swap accounting, the same limit for memory and swap together.
                let _ = std::fs::write(memory.join("memory.memsw.limit_in_bytes"), limits.memory_bytes.to_string());
                std::fs::write(pids.join("pids.max"), limits.pids.to_string())?;
                std::fs::write(cpu.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
                std::fs::write(cpu.join("cpu.cfs_quota_us"), quota.to_string())?;
                Ok(group)
            }
        }
    }
}

/// One job's group. Dropping it kills what is left in it and removes it.
#[derive(Debug)]
pub struct Group {
    /// The group's directory per controller (one for v2).
    dirs: Vec<PathBuf>,
    v2: bool,
}

impl Group {
    /// The `cgroup.procs` files a process joins (write its pid to each), in order. For a child
    /// between fork and exec: open them first, write in `pre_exec`.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// The processes in the group now.
    pub fn pids(&self) -> Vec<i32> {
        let Some(first) = self.dirs.first() else { return Vec::new() };
        std::fs::read_to_string(first.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kills every process in the group (double-forked daemons in new sessions included) and
    /// waits, briefly, until it is empty.
    pub fn kill_all(&self) {
        if self.v2
            && let Some(dir) = self.dirs.first()
            && std::fs::write(dir.join("cgroup.kill"), "1").is_ok()
        {
            self.wait_empty();
            return;
        }
        // v1 (or a v2 kernel without cgroup.kill): SIGKILL each pid until none is left; a fork
        // between the read and the kill is caught by the next round.
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                signal(pid, libc::SIGKILL);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Sends SIGTERM to every process in the group but `spare`, and returns how many it
    /// reached: the request to leave that starts a job's vacate time. `spare` is the sandbox's
    /// outer bubblewrap, which would die of it and take the whole sandbox with it (it asks the
    /// kernel to kill its child with it); the sandbox's own init, pid 1 of its namespace,
    /// ignores a signal it has no handler for, so the command and what it started get it. One
    /// round over `cgroup.procs` (cgroup v2 has no file that sends any signal but SIGKILL): a
    /// process forked after the read misses it, and [`Group::kill_all`] at the end of the
    /// vacate time ends it like any other.
    pub fn term_all(&self, spare: Option<i32>) -> usize {
        let pids: Vec<i32> = self.pids().into_iter().filter(|p| Some(*p) != spare && *p > 0).collect();
        for pid in &pids {
            signal(*pid, libc::SIGTERM);
        }
        pids.len()
    }

    fn wait_empty(&self) {
        for _ in 0..200 {
            if self.pids().is_empty() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Starts the peak memory anew, so that [`Group::usage`] gives the peak since now (one run
    /// of a handler that served others before). v1 only: a v2 kernel resets `memory.peak` just
    /// for the descriptor that wrote it, so there the peak stays the group's since its start.
    pub fn reset_peak(&self) {
        if !self.v2
            && let Some(memory) = self.dirs.first()
        {
            let _ = std::fs::write(memory.join("memory.max_usage_in_bytes"), "0");
        }
    }

    /// What the group used so far.
    pub fn usage(&self) -> Usage {
        let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        let field = |text: &str, key: &str| {
            text.lines().find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        if self.v2 {
            let Some(dir) = self.dirs.first() else { return Usage::default() };
            let cpu = read(dir, "cpu.stat");
            let events = read(dir, "memory.events");
            return Usage {
                cpu_ms: field(&cpu, "usage_usec ") / 1000,
                peak_memory_bytes: read(dir, "memory.peak").trim().parse().unwrap_or(0),
                oom_killed: field(&events, "oom_kill ") > 0,
            };
        }
        let (Some(memory), Some(cpuacct)) = (self.dirs.first(), self.dirs.get(3)) else { return Usage::default() };
        let oom = read(memory, "memory.oom_control");
        Usage {
            cpu_ms: read(cpuacct, "cpuacct.usage").trim().parse::<u64>().unwrap_or(0) / 1_000_000,
            peak_memory_bytes: read(memory, "memory.max_usage_in_bytes").trim().parse().unwrap_or(0),
            oom_killed: field(&oom, "oom_kill ") > 0,
        }
    }
}

/// `sig` to `pid` (a pid read from a group's own list, never 0 or negative: those would name
/// process groups).
#[allow(unsafe_code)]
fn signal(pid: i32, sig: libc::c_int) {
    if pid <= 0 {
        return;
    }
    // SAFETY: kill(2) on one positive pid; no memory is involved.
    unsafe {
        libc::kill(pid, sig);
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill_all();
        for d in &self.dirs {
            if let Err(e) = std::fs::remove_dir(d)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(group = %d.display(), "cannot remove a job's cgroup: {e}");
            }
        }
    }
}
