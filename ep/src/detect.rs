//! What the host offers, read once at start: cores, memory, free disk of the work directory,
//! GPUs, and a few facts worth a label.
//!
//! Each reading takes a root path (`/` on a real host, a tempdir in tests), so that tests run
//! on fake trees: `<root>/proc/meminfo`, `<root>/proc/self/cgroup`, `<root>/sys/fs/cgroup/…`,
//! `<root>/dev/nvidia0`.
//!
//! - cores: [`std::thread::available_parallelism`], lowered to a cgroup CPU quota
//!   (v2 `cpu.max`, v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`), rounded up;
//! - memory: `MemTotal` of `/proc/meminfo`, lowered to a cgroup memory limit (v2 `memory.max`,
//!   v1 `memory.limit_in_bytes`);
//! - disk: the space an unprivileged user may still fill on the work directory's filesystem
//!   (`statvfs`: `f_bavail × f_frsize`);
//! - GPUs: the NVIDIA device nodes `/dev/nvidia<N>` (not `nvidiactl`, `nvidia-uvm`, …); when
//!   `nvidia-smi` is on `PATH` and answers within [`NVIDIA_SMI_TIMEOUT`], its model names become
//!   the `gpu.model` label. Nothing else counts as a GPU: `/dev/dri/renderD*` is any render
//!   node (integrated Intel, virtio, AMD alike) and proves no compute GPU, so AMD or other GPUs
//!   are offered only when the config's `slots.gpus` says so.
//!
//! For a cgroup v2 limit, every cgroup from the root down to the process's own (`0::/path` in
//! `/proc/self/cgroup`) is read and the lowest limit wins; inside a container with its own
//! cgroup namespace that path is `/`, and the files at `/sys/fs/cgroup` are the container's.
//!
//! Nothing here fails: a reading that cannot be made is `None` (or 0 GPUs), and [`Detected::fill`]
//! says which config field to set instead.

use anyhow::Context as _;
use htfaas_functions::Resources;
use htfaas_functions::proto::MAX_LABEL_BYTES;
use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// `slots.gpus` meaning "detect" (a config that leaves `gpus` out); an explicit 0 is none.
pub const DETECT_GPUS: u32 = u32::MAX;
/// `slots.disk_mb` meaning "detect" (a config that leaves `disk_mb` out); an explicit 0 is none.
pub const DETECT_DISK_MB: u64 = u64::MAX;

/// How long `nvidia-smi` may take before it is killed and ignored.
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(5);
/// Memory kept for the EP itself and the host, MiB: at least this…
pub const MEMORY_RESERVE_MIN_MB: u64 = 512;
/// …or this share of the memory detected (percent), whichever is larger; never more than half.
pub const MEMORY_RESERVE_PERCENT: u64 = 10;
/// Free disk left unoffered, MiB: at least this…
pub const DISK_RESERVE_MIN_MB: u64 = 1024;
/// …or this share of the free space (percent), whichever is larger; never more than half.
pub const DISK_RESERVE_PERCENT: u64 = 5;
/// Largest values the scheduler accepts in a Hello (its `MAX_EP_*`); detection never offers
/// more, so that a huge shared filesystem does not get the EP refused.
const MAX_CPUS: u32 = 65_536;
const MAX_MEMORY_MB: u64 = 64 * 1024 * 1024;
const MAX_GPUS: u32 = 1024;
const MAX_DISK_MB: u64 = 1024 * 1024 * 1024;

/// What was found on the host.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Detected {
    /// Cores this process may use; `None` when unknown.
    pub cpus: Option<u32>,
    /// Memory this process may use, MiB (before the reserve); `None` when unknown.
    pub memory_mb: Option<u64>,
    /// Free space of the work directory's filesystem, MiB (before the reserve).
    pub disk_free_mb: Option<u64>,
    /// NVIDIA GPU device nodes.
    pub gpus: u32,
    /// GPU model names from `nvidia-smi`, one per GPU; empty when it is absent or silent.
    pub gpu_models: Vec<String>,
    /// `std::env::consts::ARCH`, e.g. `x86_64`.
    pub arch: String,
    /// `std::env::consts::OS`, e.g. `linux`.
    pub os: String,
}

/// Reads the real host: root `/`, `nvidia-smi` from `PATH`. Blocking (up to
/// [`NVIDIA_SMI_TIMEOUT`] for `nvidia-smi`).
pub fn detect(work_dir: &Path) -> Detected {
    let host_cpus = std::thread::available_parallelism().ok().and_then(|n| u32::try_from(n.get()).ok());
    let nvidia_smi = find_on_path("nvidia-smi");
    detect_in(Path::new("/"), work_dir, host_cpus, nvidia_smi.as_deref())
}

/// Reads the tree under `root`, with `host_cpus` as the cores before any cgroup quota and
/// `nvidia_smi` as the program asked for GPU models (none: not asked).
pub fn detect_in(root: &Path, work_dir: &Path, host_cpus: Option<u32>, nvidia_smi: Option<&Path>) -> Detected {
    let cpus = match (host_cpus, cgroup_cpu_limit(root)) {
        (Some(h), Some(q)) => Some(h.min(q)),
        (h, q) => h.or(q),
    };
    let gpu_models = nvidia_smi.and_then(|p| gpu_models(p, NVIDIA_SMI_TIMEOUT)).unwrap_or_default();
    Detected {
        cpus,
        memory_mb: memory_mb_in(root),
        disk_free_mb: disk_free_mb(work_dir).ok(),
        gpus: nvidia_devices_in(root),
        gpu_models,
        arch: std::env::consts::ARCH.to_owned(),
        os: std::env::consts::OS.to_owned(),
    }
}

impl Detected {
    /// `slots` with each 0 among `cpus`, `memory_mb`, `disk_mb` and `gpus` replaced by what was
    /// detected: memory less [`MEMORY_RESERVE_MIN_MB`]/[`MEMORY_RESERVE_PERCENT`], disk less
    /// [`DISK_RESERVE_MIN_MB`]/[`DISK_RESERVE_PERCENT`]. Values given are kept as they are.
    /// Fails when cores or memory are asked for and could not be detected (the scheduler needs
    /// both); disk that cannot be read is offered as 0 (no job asking for disk comes here).
    pub fn fill(&self, slots: Resources) -> anyhow::Result<Resources> {
        // Disk and GPUs may really be none: only the `DETECT_*` markers ask for detection.
        let mut out = slots;
        if out.cpus == 0 {
            let cpus = self.cpus.filter(|&c| c > 0).context("slots.cpus: cannot detect the cores; set it")?;
            out.cpus = cpus.min(MAX_CPUS);
        }
        if out.memory_mb == 0 {
            let total = self.memory_mb.filter(|&m| m > 1).context("slots.memory_mb: cannot detect memory; set it")?;
            out.memory_mb = after_reserve(total, MEMORY_RESERVE_MIN_MB, MEMORY_RESERVE_PERCENT).min(MAX_MEMORY_MB);
        }
        if out.disk_mb == DETECT_DISK_MB {
            let free = self.disk_free_mb.unwrap_or(0);
            out.disk_mb = after_reserve(free, DISK_RESERVE_MIN_MB, DISK_RESERVE_PERCENT).min(MAX_DISK_MB);
        }
        if out.gpus == DETECT_GPUS {
            out.gpus = self.gpus.min(MAX_GPUS);
        }
        Ok(out)
    }

    /// Facts worth a label: `arch`, `os`, and `gpu.model` (the distinct model names, joined by
    /// `,`) when `nvidia-smi` named any. Values are cut to 128 bytes.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([("arch".to_owned(), self.arch.clone()), ("os".to_owned(), self.os.clone())]);
        let mut models: Vec<&str> = Vec::new();
        for m in &self.gpu_models {
            if !models.contains(&m.as_str()) {
                models.push(m);
            }
        }
        if !models.is_empty() {
            labels.insert("gpu.model".to_owned(), models.join(","));
        }
        labels.retain(|_, v| !v.is_empty());
        for v in labels.values_mut() {
            *v = printable_prefix(v, MAX_LABEL_BYTES);
        }
        labels
    }
}

/// `total` less `max(min_mb, total × percent / 100)`, the reserve never more than half.
fn after_reserve(total: u64, min_mb: u64, percent: u64) -> u64 {
    let reserve = min_mb.max(total / 100 * percent).min(total / 2);
    total - reserve
}

/// `s` without control characters, at most `max` bytes, cut at a character boundary.
fn printable_prefix(s: &str, max: usize) -> String {
    let mut out = String::new();
    for c in s.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(c);
    }
    out
}

/// The cgroup directories whose limits apply to this process, outermost first: the cgroup
/// root, then each cgroup down the v2 path in `<root>/proc/self/cgroup`.
fn cgroup_v2_dirs(root: &Path) -> Vec<PathBuf> {
    let base = root.join("sys/fs/cgroup");
    let mut dirs = vec![base.clone()];
    let Ok(text) = std::fs::read_to_string(root.join("proc/self/cgroup")) else {
        return dirs;
    };
    let Some(path) = text.lines().find_map(|l| l.strip_prefix("0::")) else {
        return dirs;
    };
    let mut dir = base;
    // Only plain names: a path from the kernel, but `..` must not leave the tree.
    for c in Path::new(path.trim()).components() {
        if let Component::Normal(name) = c {
            dir.push(name);
            dirs.push(dir.clone());
        }
    }
    dirs
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// The lowest cgroup CPU quota, in cores rounded up; `None` when unlimited or unknown.
pub fn cgroup_cpu_limit(root: &Path) -> Option<u32> {
    let mut limits = Vec::new();
    for dir in cgroup_v2_dirs(root) {
        // `max 100000` (unlimited) or `<quota> <period>`, microseconds.
        if let Some(text) = read_trimmed(&dir.join("cpu.max")) {
            let mut parts = text.split_whitespace();
            if let (Some(q), Some(p)) = (parts.next(), parts.next())
                && let (Ok(q), Ok(p)) = (q.parse::<u64>(), p.parse::<u64>())
            {
                limits.push((q, p));
            }
        }
    }
    let v1 = root.join("sys/fs/cgroup/cpu");
    if let (Some(q), Some(p)) =
        (read_trimmed(&v1.join("cpu.cfs_quota_us")), read_trimmed(&v1.join("cpu.cfs_period_us")))
        && let (Ok(q), Ok(p)) = (q.parse::<i64>(), p.parse::<u64>())
        && let Ok(q) = u64::try_from(q)
    {
        limits.push((q, p));
    }
    limits
        .into_iter()
        .filter(|&(q, p)| q > 0 && p > 0)
        .map(|(q, p)| u32::try_from(q.div_ceil(p)).unwrap_or(u32::MAX))
        .min()
}

/// Memory this process may use, MiB: `MemTotal` lowered to the lowest cgroup limit.
pub fn memory_mb_in(root: &Path) -> Option<u64> {
    let total_kb = std::fs::read_to_string(root.join("proc/meminfo")).ok().and_then(|text| {
        text.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    });
    let mut limit: Option<u64> = None;
    let mut lower = |bytes: u64| limit = Some(limit.map_or(bytes, |l| l.min(bytes)));
    for dir in cgroup_v2_dirs(root) {
        // `max` (unlimited) or bytes.
        if let Some(Ok(bytes)) = read_trimmed(&dir.join("memory.max")).map(|t| t.parse::<u64>()) {
            lower(bytes);
        }
    }
    // v1 says "unlimited" with a huge number, which MemTotal then undercuts.
    if let Some(Ok(bytes)) = read_trimmed(&root.join("sys/fs/cgroup/memory/memory.limit_in_bytes")).map(|t| t.parse()) {
        lower(bytes);
    }
    let limit_mb = limit.map(|b| b >> 20);
    match (total_kb.map(|kb| kb >> 10), limit_mb) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

/// Free space an unprivileged user may still fill on the filesystem of `path` (or of its
/// nearest existing ancestor), MiB.
pub fn disk_free_mb(path: &Path) -> std::io::Result<u64> {
    let mut p = path;
    while !p.exists() {
        p = p.parent().ok_or_else(|| std::io::Error::other(format!("{} has no existing ancestor", path.display())))?;
    }
    let p = if p.as_os_str().is_empty() { Path::new(".") } else { p };
    statvfs_free_bytes(p).map(|b| b >> 20)
}

/// `statvfs(path)`: `f_bavail × f_frsize`.
#[allow(unsafe_code)]
#[allow(clippy::unnecessary_cast)] // the field types differ between platforms
fn statvfs_free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other(format!("{} holds a NUL byte", path.display())))?;
    // SAFETY: `c_path` is a NUL-terminated string alive for the call; `st` is a writable
    // `statvfs` owned here, zeroed (a valid value of this plain C struct) and filled by the call;
    // it is read only after the call reported success.
    let st = unsafe {
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        if libc::statvfs(c_path.as_ptr(), st.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        st.assume_init()
    };
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// NVIDIA GPU device nodes in `<root>/dev`: `nvidia` followed by digits only.
pub fn nvidia_devices_in(root: &Path) -> u32 {
    let Ok(entries) = std::fs::read_dir(root.join("dev")) else {
        return 0;
    };
    let n = entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("nvidia").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Runs `program --query-gpu=name --format=csv,noheader` and returns one model name per line;
/// `None` when it fails, exits non-zero, or takes longer than `timeout` (it is then killed).
pub fn gpu_models(program: &Path, timeout: Duration) -> Option<Vec<String>> {
    let mut child = std::process::Command::new(program)
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mut stdout = child.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    // The pipe is read beside the wait, so that a chatty child cannot block on a full pipe.
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = (&mut stdout).take(64 * 1024).read_to_end(&mut out);
        let _ = tx.send(out);
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) | Err(_) => {
                tracing::warn!(program = %program.display(), ?timeout, "nvidia-smi did not answer in time; ignored");
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    let out = rx.recv_timeout(Duration::from_secs(1)).ok()?;
    if !status.success() {
        tracing::warn!(program = %program.display(), %status, "nvidia-smi failed; no GPU models");
        return None;
    }
    let text = String::from_utf8_lossy(&out);
    Some(text.lines().map(str::trim).filter(|l| !l.is_empty()).take(MAX_GPUS as usize).map(str::to_owned).collect())
}

/// The first executable file named `name` in the directories of `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_take_the_larger_share_but_never_more_than_half() {
        assert_eq!(after_reserve(65536, 512, 10), 65536 - 6550);
        assert_eq!(after_reserve(2048, 512, 10), 1536);
        assert_eq!(after_reserve(600, 512, 10), 300);
        assert_eq!(after_reserve(0, 1024, 5), 0);
        assert_eq!(after_reserve(1, 1024, 5), 1);
    }

    #[test]
    fn labels_are_cut_and_printable() {
        assert_eq!(printable_prefix("a\nb", 10), "ab");
        assert_eq!(printable_prefix("ééé", 5), "éé");
    }
}
