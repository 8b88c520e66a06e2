//! The anonymous uids native sandboxes run as, each lent to one run (or one handler) at a
//! time and given back when its lease is dropped.
//!
//! Must not know: jobs, sandboxes, the network.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// The anonymous uids native jobs run as, each lent to one job at a time.
#[derive(Debug, Clone)]
pub struct UidPool(Arc<Mutex<BTreeSet<u32>>>);

impl UidPool {
    /// The pool of `base..base + count`.
    pub fn new(base: u32, count: u32) -> UidPool {
        UidPool(Arc::new(Mutex::new((base..base.saturating_add(count)).collect())))
    }

    /// The lowest free uid; `None` when every one is lent.
    pub fn lease(&self) -> Option<UidLease> {
        let uid = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop_first()?;
        Some(UidLease { uid, pool: self.0.clone() })
    }
}

/// A uid lent to one job; given back when dropped.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    pool: Arc<Mutex<BTreeSet<u32>>>,
}

impl UidLease {
    /// The uid (also the gid).
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).insert(self.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::UidPool;

    #[test]
    fn uids_are_lent_once_and_come_back() {
        let pool = UidPool::new(70_000, 2);
        let a = pool.lease().expect("first");
        let b = pool.lease().expect("second");
        assert_ne!(a.uid(), b.uid());
        assert!(pool.lease().is_none(), "all lent");
        drop(a);
        assert_eq!(pool.lease().expect("back").uid(), 70_000);
    }
}
