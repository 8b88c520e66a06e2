//! Matching: the table of attached EPs and the one function, [`select`], that decides which
//! idle job goes to which EP.
//!
//! Policy today: oldest job first; a job goes to an EP whose free cpus and memory hold it,
//! whose `runtime_s` is at least the job's, and whose owner restriction (from its attach
//! token, never from the EP's own word) is absent or equal to the job's owner. Among those,
//! EPs dedicated to the owner come first, then the tightest fit (fewest free cpus left), so
//! large holes stay open for large jobs. Fair share, holds and retries will grow here.

use htfaas_functions::Resources;
use htfaas_functions::proto::SchedulerMsg;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tokio::sync::mpsc;

/// An idle job as matching sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleJob {
    /// Job id.
    pub id: String,
    /// Who it is accounted to.
    pub owner: String,
    /// What it asks for.
    pub resources: Resources,
}

/// One attached EP session.
#[derive(Debug)]
pub struct EpSlot {
    /// Session id (`Welcome.ep_id`); jobs running here carry it in the store.
    pub ep_id: String,
    /// The name the EP gave, for job records and logs.
    pub name: String,
    /// When set (from the attach token), only this owner's jobs run here.
    pub owner: Option<String>,
    /// What it offered in its Hello.
    pub total: Resources,
    /// Cores not reserved by running jobs.
    pub free_cpus: u32,
    /// Memory not reserved by running jobs, MiB.
    pub free_memory_mb: u64,
    /// Where to send messages for this EP. Unbounded, yet bounded in practice: every job
    /// reserves at least one core, so at most `total.cpus` Assigns are ever in flight.
    pub tx: mpsc::UnboundedSender<SchedulerMsg>,
    /// Jobs running here and what each reserved.
    pub running: HashMap<String, Resources>,
}

impl EpSlot {
    /// A new session with everything free.
    pub fn new(
        ep_id: String,
        name: String,
        owner: Option<String>,
        total: Resources,
        tx: mpsc::UnboundedSender<SchedulerMsg>,
    ) -> EpSlot {
        EpSlot {
            ep_id,
            name,
            owner,
            total,
            free_cpus: total.cpus,
            free_memory_mb: total.memory_mb,
            tx,
            running: HashMap::new(),
        }
    }

    /// Whether `job` may and can run here with `free` left.
    fn takes(&self, job: &IdleJob, free_cpus: u32, free_memory_mb: u64) -> bool {
        self.owner.as_ref().is_none_or(|o| *o == job.owner)
            && job.resources.cpus <= free_cpus
            && job.resources.memory_mb <= free_memory_mb
            && job.resources.runtime_s <= self.total.runtime_s
    }
}

/// The attached EPs, by session id.
#[derive(Debug, Default)]
pub struct EpTable {
    eps: BTreeMap<String, EpSlot>,
}

/// A decision of [`select`]: run `job_id` on `ep_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// The job.
    pub job_id: String,
    /// The EP session.
    pub ep_id: String,
    /// What the job reserves there.
    pub resources: Resources,
}

impl EpTable {
    /// Adds a session.
    pub fn insert(&mut self, ep: EpSlot) {
        self.eps.insert(ep.ep_id.clone(), ep);
    }

    /// Removes a session; its reservations go with it.
    pub fn remove(&mut self, ep_id: &str) -> Option<EpSlot> {
        self.eps.remove(ep_id)
    }

    /// The session, if attached.
    pub fn get(&self, ep_id: &str) -> Option<&EpSlot> {
        self.eps.get(ep_id)
    }

    /// How many sessions are attached.
    pub fn len(&self) -> usize {
        self.eps.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.eps.is_empty()
    }

    /// Whether some EP has a free core.
    pub fn has_room(&self) -> bool {
        self.eps.values().any(|e| e.free_cpus > 0 && e.free_memory_mb > 0)
    }

    /// The most free cpus and memory, and the longest runtime, over EPs with room: a job
    /// larger in any of them fits nowhere now, so it need not be read from the store.
    pub fn largest_room(&self) -> Option<Resources> {
        self.eps.values().filter(|e| e.free_cpus > 0 && e.free_memory_mb > 0).fold(None, |acc, e| {
            let r = acc.unwrap_or(Resources { cpus: 0, memory_mb: 0, runtime_s: 0 });
            Some(Resources {
                cpus: r.cpus.max(e.free_cpus),
                memory_mb: r.memory_mb.max(e.free_memory_mb),
                runtime_s: r.runtime_s.max(e.total.runtime_s),
            })
        })
    }

    /// Owners that restricted EPs with room are dedicated to.
    pub fn restricted_owners_with_room(&self) -> Vec<String> {
        let set: BTreeSet<&String> =
            self.eps.values().filter(|e| e.free_cpus > 0).filter_map(|e| e.owner.as_ref()).collect();
        set.into_iter().cloned().collect()
    }

    /// Reserves `m.resources` on its EP for its job. False if the EP is gone or too full.
    pub fn reserve(&mut self, m: &Match) -> bool {
        let Some(ep) = self.eps.get_mut(&m.ep_id) else {
            return false;
        };
        if m.resources.cpus > ep.free_cpus || m.resources.memory_mb > ep.free_memory_mb {
            return false;
        }
        ep.free_cpus -= m.resources.cpus;
        ep.free_memory_mb -= m.resources.memory_mb;
        ep.running.insert(m.job_id.clone(), m.resources);
        true
    }

    /// Frees what `job_id` reserved on `ep_id`. False if it held nothing there.
    pub fn release(&mut self, ep_id: &str, job_id: &str) -> bool {
        let Some(ep) = self.eps.get_mut(ep_id) else {
            return false;
        };
        let Some(r) = ep.running.remove(job_id) else {
            return false;
        };
        ep.free_cpus = (ep.free_cpus + r.cpus).min(ep.total.cpus);
        ep.free_memory_mb = (ep.free_memory_mb + r.memory_mb).min(ep.total.memory_mb);
        true
    }

    /// Whether `job_id` is running on `ep_id` as far as this table knows.
    pub fn is_running(&self, ep_id: &str, job_id: &str) -> bool {
        self.eps.get(ep_id).is_some_and(|e| e.running.contains_key(job_id))
    }
}

/// Decides where idle jobs go. `idle` is oldest first; the answer never gives an EP more than
/// its free cpus or memory. Pure: reserving is the caller's job.
pub fn select(idle: &[IdleJob], eps: &EpTable) -> Vec<Match> {
    let mut free: BTreeMap<&str, (u32, u64)> =
        eps.eps.values().map(|e| (e.ep_id.as_str(), (e.free_cpus, e.free_memory_mb))).collect();
    let mut out = Vec::new();
    for job in idle {
        if job.resources.cpus == 0 {
            // Validation refuses these; never let one through without reserving anything.
            continue;
        }
        let best = eps
            .eps
            .values()
            .filter_map(|e| {
                let (c, m) = free.get(e.ep_id.as_str()).copied()?;
                // `then`, not `then_some`: the subtractions are only sound once `takes` holds.
                e.takes(job, c, m).then(|| (e, c - job.resources.cpus, m - job.resources.memory_mb))
            })
            .min_by_key(|(e, c_left, m_left)| (e.owner.is_none(), *c_left, *m_left));
        if let Some((ep, c_left, m_left)) = best {
            free.insert(ep.ep_id.as_str(), (c_left, m_left));
            out.push(Match { job_id: job.id.clone(), ep_id: ep.ep_id.clone(), resources: job.resources });
        }
        if free.values().all(|(c, _)| *c == 0) {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(cpus: u32, memory_mb: u64, runtime_s: u64) -> Resources {
        Resources { cpus, memory_mb, runtime_s }
    }

    fn ep(id: &str, owner: Option<&str>, total: Resources) -> EpSlot {
        let (tx, _rx) = mpsc::unbounded_channel();
        EpSlot::new(id.into(), format!("name-{id}"), owner.map(str::to_owned), total, tx)
    }

    fn job(id: &str, owner: &str, r: Resources) -> IdleJob {
        IdleJob { id: id.into(), owner: owner.into(), resources: r }
    }

    #[test]
    fn never_exceeds_free_resources() {
        let mut t = EpTable::default();
        t.insert(ep("a", None, res(4, 1000, 100)));
        let idle: Vec<_> = (0..10).map(|i| job(&format!("j{i}"), "x", res(1, 300, 10))).collect();
        let m = select(&idle, &t);
        assert_eq!(m.len(), 3, "memory allows three");
        for x in &m {
            assert!(t.reserve(x));
        }
        assert_eq!(select(&idle[3..], &t), vec![]);
        assert!(t.release("a", "j0"));
        assert!(!t.release("a", "j0"));
        assert_eq!(select(&idle[3..], &t).len(), 1);
    }

    #[test]
    fn respects_runtime_and_owner_restriction() {
        let mut t = EpTable::default();
        t.insert(ep("a", Some("alice"), res(8, 8000, 100)));
        let idle = vec![
            job("long", "alice", res(1, 1, 101)),
            job("bob", "bob", res(1, 1, 1)),
            job("al", "alice", res(1, 1, 1)),
        ];
        let m = select(&idle, &t);
        assert_eq!(m.iter().map(|m| m.job_id.as_str()).collect::<Vec<_>>(), vec!["al"]);
    }

    #[test]
    fn prefers_dedicated_eps_then_tightest_fit() {
        let mut t = EpTable::default();
        t.insert(ep("big", None, res(16, 16000, 100)));
        t.insert(ep("small", None, res(2, 16000, 100)));
        t.insert(ep("alices", Some("alice"), res(16, 16000, 100)));
        let m = select(&[job("j1", "alice", res(1, 1, 1)), job("j2", "bob", res(1, 1, 1))], &t);
        assert_eq!(m[0].ep_id, "alices");
        assert_eq!(m[1].ep_id, "small");
    }
}
