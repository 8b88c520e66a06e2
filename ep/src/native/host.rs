//! The EP's native runtime as a whole, set up once at start: the bubblewrap binary, the cgroup
//! backend, the image cache, the idle handlers, and the pool of anonymous uids native jobs run as.
//!
//! Native jobs need the EP to run as root: it makes control groups and hands each job a uid of
//! its own (never 0, never the EP's). An EP that is not root, has no bubblewrap, or finds no
//! cgroup backend offers wasm only and says why at start ([`NativeHost::start`]).
//!
//! Must not know: jobs, the link, the network.

use super::cgroup::{self, Backend};
use super::handlers::{HandlerOptions, Handlers};
use super::image::ImageCache;
use super::uids::{UidLease, UidPool};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How the EP's native runtime is set up.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// The bubblewrap binary.
    pub bwrap: PathBuf,
    /// Where unpacked images are cached.
    pub cache_dir: PathBuf,
    /// Most bytes of unpacked images kept (least recently used ones go first).
    pub cache_bytes: u64,
    /// Site directories of unpacked images (`<dir>/<hex digest>/`), read-only, trusted as the
    /// site's.
    pub site_images: Vec<PathBuf>,
    /// The stage directory ([`super::STAGE`]).
    pub stage: PathBuf,
    /// The first anonymous uid (and gid) of native jobs.
    pub uid_base: u32,
    /// How many there are: the most native jobs at once.
    pub uid_count: u32,
    /// The GPUs' device nodes, one per GPU (e.g. `/dev/nvidia0`), given to jobs one by one.
    pub gpus: Vec<PathBuf>,
    /// Device nodes every GPU job gets besides its GPUs (e.g. `/dev/nvidiactl`, `/dev/nvidia-uvm`).
    pub gpu_shared: Vec<PathBuf>,
    /// Where handlers' directories are made (emptied at start).
    pub handlers_dir: PathBuf,
    /// How long and how many idle handlers are kept.
    pub handlers: HandlerOptions,
}

/// Why an EP offers no native runtime.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Something the runtime needs is missing; the message says what.
    #[error("{0}")]
    Unavailable(String),
}

/// The EP's native runtime.
#[derive(Debug)]
pub struct NativeHost {
    /// The bubblewrap binary.
    pub bwrap: PathBuf,
    /// The cgroup backend.
    pub backend: Backend,
    /// Where a job's directories are bound for bwrap ([`super::STAGE`]).
    pub stage: PathBuf,
    /// Unpacked images.
    pub images: ImageCache,
    /// Idle handlers ([`super::worker`]).
    pub handlers: Handlers,
    /// Where handlers' directories are made.
    pub handlers_dir: PathBuf,
    uids: UidPool,
    gpus: GpuPool,
}

/// The EP's GPUs, each lent to one job at a time.
#[derive(Debug, Clone)]
pub struct GpuPool {
    devices: Arc<Vec<PathBuf>>,
    shared: Arc<Vec<PathBuf>>,
    free: Arc<Mutex<BTreeSet<usize>>>,
}

/// GPUs lent to one job; given back when dropped.
#[derive(Debug)]
pub struct GpuLease {
    indices: Vec<usize>,
    pool: GpuPool,
}

impl GpuPool {
    /// The pool of `devices` (GPU `i` is `devices[i]`), each job also given `shared`.
    pub fn new(devices: Vec<PathBuf>, shared: Vec<PathBuf>) -> GpuPool {
        let free = (0..devices.len()).collect();
        GpuPool { devices: Arc::new(devices), shared: Arc::new(shared), free: Arc::new(Mutex::new(free)) }
    }

    /// `n` free GPUs (the lowest), or `None` when fewer are free; no GPU for `n` = 0.
    pub fn lease(&self, n: u32) -> Option<GpuLease> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let n = usize::try_from(n).ok()?;
        if free.len() < n {
            return None;
        }
        let indices: Vec<usize> = (0..n).filter_map(|_| free.pop_first()).collect();
        Some(GpuLease { indices, pool: self.clone() })
    }
}

impl GpuLease {
    /// The device nodes the job gets: its GPUs, then the shared ones (none without a GPU).
    pub fn devices(&self) -> Vec<PathBuf> {
        if self.indices.is_empty() {
            return Vec::new();
        }
        let own = self.indices.iter().filter_map(|i| self.pool.devices.get(*i).cloned());
        own.chain(self.pool.shared.iter().cloned()).collect()
    }

    /// The environment that names them to CUDA and NVIDIA's libraries: the GPUs' indices on
    /// this EP (`CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES`); none without a GPU.
    pub fn env(&self) -> Vec<(String, String)> {
        if self.indices.is_empty() {
            return Vec::new();
        }
        let list = self.indices.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        vec![("CUDA_VISIBLE_DEVICES".into(), list.clone()), ("NVIDIA_VISIBLE_DEVICES".into(), list)]
    }
}

impl Drop for GpuLease {
    fn drop(&mut self) {
        self.pool.free.lock().unwrap_or_else(|p| p.into_inner()).extend(self.indices.drain(..));
    }
}

impl NativeHost {
    /// Sets the runtime up, or says why this host cannot run native jobs.
    pub fn start(o: HostOptions) -> Result<NativeHost, HostError> {
        use std::os::unix::fs::MetadataExt as _;
        let unavailable = |why: String| HostError::Unavailable(why);
        let me =
            std::fs::metadata("/proc/self").map(|m| m.uid()).map_err(|e| unavailable(format!("/proc/self: {e}")))?;
        if me != 0 {
            return Err(unavailable(format!(
                "the EP runs as uid {me}, not root: native jobs need it to make control groups and give each job \
                 a uid of its own"
            )));
        }
        if !is_executable(&o.bwrap) {
            return Err(unavailable(format!("no bubblewrap at {} (install bubblewrap)", o.bwrap.display())));
        }
        if o.uid_base == 0 || o.uid_count == 0 || o.uid_base.checked_add(o.uid_count).is_none() {
            return Err(unavailable("native.uid_base must be above 0 and uid_count at least 1".into()));
        }
        if (o.uid_base..o.uid_base + o.uid_count).contains(&me) {
            return Err(unavailable(format!("native jobs' uids must not include the EP's own ({me})")));
        }
        let backend =
            Backend::detect(Path::new(cgroup::CGROUP_ROOT)).map_err(|e| unavailable(format!("control groups: {e}")))?;
        super::make_stage(&o.stage).map_err(|e| unavailable(format!("stage {}: {e}", o.stage.display())))?;
        let images = ImageCache::open(o.cache_dir.clone(), o.cache_bytes, o.site_images.clone())
            .map_err(|e| unavailable(format!("image cache at {}: {e}", o.cache_dir.display())))?;
        if o.gpus.len() + o.gpu_shared.len() > super::MAX_DEVICES {
            return Err(unavailable(format!("at most {} GPU devices in all", super::MAX_DEVICES)));
        }
        if let Some(d) = o.gpus.iter().chain(&o.gpu_shared).find(|d| !d.is_absolute() || !d.exists()) {
            return Err(unavailable(format!("GPU device {} is no absolute path that exists", d.display())));
        }
        // Handlers of an EP before this one are gone: their directories are left-overs. The
        // directory is the EP's alone (0700), as its whole work directory is.
        let _ = std::fs::remove_dir_all(&o.handlers_dir);
        std::fs::create_dir_all(&o.handlers_dir)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&o.handlers_dir, std::fs::Permissions::from_mode(0o700))
            })
            .map_err(|e| unavailable(format!("handlers' directory {}: {e}", o.handlers_dir.display())))?;
        let uids = UidPool::new(o.uid_base, o.uid_count);
        let gpus = GpuPool::new(o.gpus, o.gpu_shared);
        let handlers = Handlers::new(o.handlers);
        Ok(NativeHost {
            bwrap: o.bwrap,
            backend,
            stage: o.stage,
            images,
            handlers,
            handlers_dir: o.handlers_dir,
            uids,
            gpus,
        })
    }

    /// `n` free GPUs for one job (none for 0); `None` when fewer are free.
    pub fn lease_gpus(&self, n: u32) -> Option<GpuLease> {
        self.gpus.lease(n)
    }

    /// A free uid for one job; `None` when every one is lent (more native jobs at once than
    /// `uid_count`).
    pub fn lease_uid(&self) -> Option<UidLease> {
        self.uids.lease()
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_are_lent_whole_named_to_cuda_and_come_back() {
        let (a, b) = (PathBuf::from("/dev/nvidia0"), PathBuf::from("/dev/nvidia1"));
        let ctl = PathBuf::from("/dev/nvidiactl");
        let pool = GpuPool::new(vec![a.clone(), b.clone()], vec![ctl.clone()]);
        let none = pool.lease(0).expect("no GPU is always there");
        assert!(none.devices().is_empty() && none.env().is_empty(), "no device, no variable without a GPU");
        let one = pool.lease(1).expect("one");
        assert_eq!(one.devices(), vec![a.clone(), ctl.clone()]);
        assert_eq!(one.env()[0], ("CUDA_VISIBLE_DEVICES".to_owned(), "0".to_owned()));
        assert!(pool.lease(2).is_none(), "only one is free");
        let two = pool.lease(1).expect("the other");
        assert_eq!(two.devices(), vec![b, ctl]);
        assert_eq!(two.env()[1], ("NVIDIA_VISIBLE_DEVICES".to_owned(), "1".to_owned()));
        drop(one);
        assert_eq!(pool.lease(1).expect("back").devices()[0], a);
    }
}
