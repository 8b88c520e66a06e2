//! Matching: the table of attached EPs and the one function, [`select`], that decides which
//! idle job goes to which EP.
//!
//! Policy today: oldest job first; a job goes to an EP that accepts work (not closing), whose
//! free cpus and memory hold it, whose `runtime_s` is at least the job's, whose owner
//! restriction is absent or equal to the job's owner, and whose annex equals the job's (both
//! none, or the same name: an annex EP runs only its annex's jobs, and an annex job runs only
//! there). Owner and annex come from the EP's attach token, never from the EP's own word. Among
//! the EPs that qualify, those dedicated to the owner come first, then the tightest fit (fewest
//! free cpus left), so large holes stay open for large jobs. With a per-owner running limit
//! (HTCondor's per-owner caps; [`crate::Config::max_running_jobs_per_owner`]), a job whose owner
//! already has that many jobs running (counted from this table's reservations, so jobs told to
//! stop count until their EP reports) is passed over, and later jobs of other owners are still
//! placed in the same round: one owner's flood cannot block the others. Fair share and retries
//! will grow here.
//!
//! The table also carries what the rest of the scheduler says to a session ([`ToEp`]): the
//! dispatcher's Assigns, a revocation's Cancels, and the order to close.

use crate::revocation::Credential;
use htfaas_functions::Resources;
use htfaas_functions::proto::{JobAssignment, SchedulerMsg};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use tokio::sync::mpsc;

/// An idle job as matching sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleJob {
    /// Job id.
    pub id: String,
    /// Who it is accounted to.
    pub owner: String,
    /// The annex it must run on, if any.
    pub annex: Option<String>,
    /// What it asks for.
    pub resources: Resources,
}

/// What an EP session is told by the rest of the scheduler.
#[derive(Debug)]
// Lives for one send, like `SchedulerMsg` itself; boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum ToEp {
    /// Send this message.
    Send(SchedulerMsg),
    /// Close the WebSocket with this code and reason, and end the session.
    Close {
        /// WebSocket close code.
        code: u16,
        /// Close reason (cut to what a close frame holds).
        reason: String,
    },
}

/// EPs that may take the same jobs: same annex, same owner restriction.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pool {
    /// The EPs' annex (from their attach tokens).
    pub annex: Option<String>,
    /// The EPs' owner restriction (from their attach tokens).
    pub owner: Option<String>,
}

/// One attached EP session.
#[derive(Debug)]
pub struct EpSlot {
    /// Session id (`Welcome.ep_id`); jobs running here carry it in the store.
    pub ep_id: String,
    /// The name the EP gave, for job records and logs.
    pub name: String,
    /// The EP's address as this scheduler sees it (the attach connection's peer, canonical:
    /// an IPv4-mapped IPv6 address is IPv4), which a job's macaroons are bound to when the job
    /// asks for it.
    pub ip: IpAddr,
    /// Which jobs it may take: its attach token's annex and owner restriction.
    pub pool: Pool,
    /// Its attach token, as revocation sees it.
    pub credential: Credential,
    /// What it offered in its Hello.
    pub total: Resources,
    /// Cores not reserved by running jobs.
    pub free_cpus: u32,
    /// Memory not reserved by running jobs, MiB.
    pub free_memory_mb: u64,
    /// Where to send messages for this EP. Unbounded, yet bounded in practice: every job
    /// reserves at least one core, so at most `total.cpus` Assigns (and as many Cancels) are
    /// ever in flight, plus one Close.
    pub tx: mpsc::UnboundedSender<ToEp>,
    /// Jobs running here: what each reserved, and whose it is.
    pub running: HashMap<String, Reservation>,
    /// Running jobs told to stop; their reservation stays until the EP reports.
    pub cancelled: HashSet<String>,
    /// Told to close: takes no more jobs.
    pub closing: bool,
}

impl EpSlot {
    /// A new session with everything free.
    pub fn new(
        ep_id: String,
        name: String,
        ip: IpAddr,
        pool: Pool,
        credential: Credential,
        total: Resources,
        tx: mpsc::UnboundedSender<ToEp>,
    ) -> EpSlot {
        EpSlot {
            ep_id,
            name,
            ip: ip.to_canonical(),
            pool,
            credential,
            total,
            free_cpus: total.cpus,
            free_memory_mb: total.memory_mb,
            tx,
            running: HashMap::new(),
            cancelled: HashSet::new(),
            closing: false,
        }
    }

    /// Whether it takes jobs now at all.
    fn accepting(&self) -> bool {
        !self.closing && self.free_cpus > 0 && self.free_memory_mb > 0
    }

    /// Whether `job` may and can run here with `free` left.
    fn takes(&self, job: &IdleJob, free_cpus: u32, free_memory_mb: u64) -> bool {
        !self.closing
            && self.pool.owner.as_ref().is_none_or(|o| *o == job.owner)
            && self.pool.annex == job.annex
            && job.resources.cpus <= free_cpus
            && job.resources.memory_mb <= free_memory_mb
            && job.resources.runtime_s <= self.total.runtime_s
    }
}

/// What a running job holds on its EP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Cores, memory and runtime it reserved.
    pub resources: Resources,
    /// Its owner, for the per-owner running limit.
    pub owner: String,
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
    /// The job's owner.
    pub owner: String,
}

/// What became of an Assign handed to [`EpTable::deliver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Queued for the session.
    Sent,
    /// The job was stopped before it was sent (a revocation): not sent, reservation freed.
    Cancelled,
    /// The session is gone or its channel closed.
    Gone,
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

    /// Each pool with an EP that accepts work, with the most free cpus and memory and the
    /// longest runtime among its EPs: a job larger in any of them fits nowhere in that pool
    /// now, so it need not be read from the store.
    pub fn pools_with_room(&self) -> Vec<(Pool, Resources)> {
        let mut pools: BTreeMap<&Pool, Resources> = BTreeMap::new();
        for e in self.eps.values().filter(|e| e.accepting()) {
            let r = pools.entry(&e.pool).or_insert(Resources::new(0, 0, 0));
            r.cpus = r.cpus.max(e.free_cpus);
            r.memory_mb = r.memory_mb.max(e.free_memory_mb);
            r.runtime_s = r.runtime_s.max(e.total.runtime_s);
        }
        pools.into_iter().map(|(p, r)| (p.clone(), r)).collect()
    }

    /// Reserves `m.resources` on its EP for its job. False if the EP is gone or too full, or
    /// still holds an earlier, stopped attempt of the same job (held, released, not yet
    /// reported).
    pub fn reserve(&mut self, m: &Match) -> bool {
        let Some(ep) = self.eps.get_mut(&m.ep_id) else {
            return false;
        };
        if ep.running.contains_key(&m.job_id) {
            return false;
        }
        if m.resources.cpus > ep.free_cpus || m.resources.memory_mb > ep.free_memory_mb {
            return false;
        }
        ep.free_cpus -= m.resources.cpus;
        ep.free_memory_mb -= m.resources.memory_mb;
        ep.running.insert(m.job_id.clone(), Reservation { resources: m.resources, owner: m.owner.clone() });
        true
    }

    /// Frees what `job_id` reserved on `ep_id`. False if it held nothing there.
    pub fn release(&mut self, ep_id: &str, job_id: &str) -> bool {
        let Some(ep) = self.eps.get_mut(ep_id) else {
            return false;
        };
        ep.cancelled.remove(job_id);
        let Some(Reservation { resources: r, .. }) = ep.running.remove(job_id) else {
            return false;
        };
        ep.free_cpus = (ep.free_cpus + r.cpus).min(ep.total.cpus);
        ep.free_memory_mb = (ep.free_memory_mb + r.memory_mb).min(ep.total.memory_mb);
        true
    }

    /// How many jobs each owner has running (reserved) across all EPs.
    pub fn running_per_owner(&self) -> HashMap<&str, u64> {
        let mut n: HashMap<&str, u64> = HashMap::new();
        for r in self.eps.values().flat_map(|e| e.running.values()) {
            *n.entry(r.owner.as_str()).or_default() += 1;
        }
        n
    }

    /// Owners with at least `max_running` jobs running: [`select`] starts none of theirs, so
    /// their idle jobs need not be read. Empty without a limit.
    pub fn owners_at_limit(&self, max_running: Option<u64>) -> Vec<String> {
        let Some(max) = max_running else {
            return Vec::new();
        };
        self.running_per_owner().into_iter().filter(|(_, n)| *n >= max).map(|(o, _)| o.to_owned()).collect()
    }

    /// Whether `job_id` is running on `ep_id` as far as this table knows.
    pub fn is_running(&self, ep_id: &str, job_id: &str) -> bool {
        self.eps.get(ep_id).is_some_and(|e| e.running.contains_key(job_id))
    }

    /// Sends the Assign of a job reserved on `ep_id`, unless the job was stopped meanwhile
    /// (then its reservation is freed and nothing is sent).
    pub fn deliver(&mut self, ep_id: &str, a: JobAssignment) -> Delivery {
        let Some(ep) = self.eps.get_mut(ep_id) else {
            return Delivery::Gone;
        };
        if ep.cancelled.contains(&a.job_id) {
            self.release(ep_id, &a.job_id);
            return Delivery::Cancelled;
        }
        match ep.tx.send(ToEp::Send(SchedulerMsg::Assign(a))) {
            Ok(()) => Delivery::Sent,
            Err(_) => Delivery::Gone,
        }
    }

    /// Tells `ep_id` to stop `job_id` (if it holds it); the reservation stays until the EP
    /// reports or the session ends. False if the session does not hold the job.
    pub fn cancel(&mut self, ep_id: &str, job_id: &str, reason: &str) -> bool {
        let Some(ep) = self.eps.get_mut(ep_id).filter(|e| e.running.contains_key(job_id)) else {
            return false;
        };
        ep.cancelled.insert(job_id.to_owned());
        let msg = SchedulerMsg::Cancel { job_id: job_id.to_owned(), reason: reason.to_owned() };
        ep.tx.send(ToEp::Send(msg)).is_ok()
    }

    /// Marks every session whose attach token `named` picks as closing (it takes no more
    /// jobs) and returns their ids; [`EpTable::close`] then closes them.
    pub fn mark_closing(&mut self, named: impl Fn(&Credential) -> bool) -> Vec<String> {
        let mut out = Vec::new();
        for ep in self.eps.values_mut().filter(|e| named(&e.credential)) {
            ep.closing = true;
            out.push(ep.ep_id.clone());
        }
        out
    }

    /// Tells `ep_id` to close with `code` and `reason`. False if it is gone.
    pub fn close(&mut self, ep_id: &str, code: u16, reason: &str) -> bool {
        let Some(ep) = self.eps.get_mut(ep_id) else {
            return false;
        };
        ep.closing = true;
        ep.tx.send(ToEp::Close { code, reason: reason.to_owned() }).is_ok()
    }
}

/// Decides where idle jobs go. `idle` is oldest first; the answer never gives an EP more than
/// its free cpus or memory, nor an owner more than `max_running_per_owner` running jobs
/// (counting those already reserved in `eps`). Pure: reserving is the caller's job.
pub fn select(idle: &[IdleJob], eps: &EpTable, max_running_per_owner: Option<u64>) -> Vec<Match> {
    let mut free: BTreeMap<&str, (u32, u64)> =
        eps.eps.values().map(|e| (e.ep_id.as_str(), (e.free_cpus, e.free_memory_mb))).collect();
    let mut running = eps.running_per_owner();
    let mut out = Vec::new();
    for job in idle {
        if job.resources.cpus == 0 {
            // Validation refuses these; never let one through without reserving anything.
            continue;
        }
        if max_running_per_owner.is_some_and(|max| running.get(job.owner.as_str()).copied().unwrap_or(0) >= max) {
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
            .min_by_key(|(e, c_left, m_left)| (e.pool.owner.is_none(), *c_left, *m_left));
        if let Some((ep, c_left, m_left)) = best {
            free.insert(ep.ep_id.as_str(), (c_left, m_left));
            *running.entry(job.owner.as_str()).or_default() += 1;
            out.push(Match {
                job_id: job.id.clone(),
                ep_id: ep.ep_id.clone(),
                resources: job.resources,
                owner: job.owner.clone(),
            });
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

    const LOCALHOST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn res(cpus: u32, memory_mb: u64, runtime_s: u64) -> Resources {
        Resources::new(cpus, memory_mb, runtime_s)
    }

    fn ep(id: &str, owner: Option<&str>, total: Resources) -> EpSlot {
        annex_ep(id, owner, None, total)
    }

    fn annex_ep(id: &str, owner: Option<&str>, annex: Option<&str>, total: Resources) -> EpSlot {
        let (tx, _rx) = mpsc::unbounded_channel();
        let pool = Pool { annex: annex.map(str::to_owned), owner: owner.map(str::to_owned) };
        let credential = Credential { jti: format!("jti-{id}"), owner: pool.owner.clone(), issuer: "s".into() };
        EpSlot::new(id.into(), format!("name-{id}"), LOCALHOST, pool, credential, total, tx)
    }

    fn job(id: &str, owner: &str, r: Resources) -> IdleJob {
        IdleJob { id: id.into(), owner: owner.into(), annex: None, resources: r }
    }

    fn annex_job(id: &str, annex: &str) -> IdleJob {
        IdleJob { annex: Some(annex.into()), ..job(id, "alice", res(1, 1, 1)) }
    }

    fn placed(m: &[Match]) -> Vec<(&str, &str)> {
        m.iter().map(|m| (m.job_id.as_str(), m.ep_id.as_str())).collect()
    }

    #[test]
    fn annex_jobs_run_only_on_their_annex_and_annex_eps_only_run_them() {
        let mut t = EpTable::default();
        t.insert(ep("site", None, res(8, 8000, 100)));
        t.insert(annex_ep("other", None, Some("other"), res(8, 8000, 100)));
        let idle = [annex_job("a1", "gpu")];
        assert_eq!(select(&idle, &t, None), vec![], "no EP of annex gpu yet");
        t.insert(annex_ep("gpu-ep", None, Some("gpu"), res(8, 8000, 100)));
        assert_eq!(placed(&select(&idle, &t, None)), vec![("a1", "gpu-ep")]);

        let mut only_annex = EpTable::default();
        only_annex.insert(annex_ep("gpu-ep", None, Some("gpu"), res(8, 8000, 100)));
        assert_eq!(select(&[job("plain", "alice", res(1, 1, 1))], &only_annex, None), vec![]);

        // Both restrictions apply: an annex EP bound to alice takes neither bob's annex job
        // nor alice's plain one.
        let mut both = EpTable::default();
        both.insert(annex_ep("alices-gpu", Some("alice"), Some("gpu"), res(8, 8000, 100)));
        let bobs = IdleJob { owner: "bob".into(), ..annex_job("b1", "gpu") };
        let idle = [bobs, job("plain", "alice", res(1, 1, 1)), annex_job("a1", "gpu")];
        assert_eq!(placed(&select(&idle, &both, None)), vec![("a1", "alices-gpu")]);
        let pools: Vec<Pool> = both.pools_with_room().into_iter().map(|(p, _)| p).collect();
        assert_eq!(pools, vec![Pool { annex: Some("gpu".into()), owner: Some("alice".into()) }]);
    }

    #[test]
    fn an_eps_address_is_kept_canonical() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let pool = Pool { annex: None, owner: None };
        let credential = Credential { jti: "j".into(), owner: None, issuer: "s".into() };
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().expect("address");
        let ep = EpSlot::new("a".into(), "a".into(), mapped, pool, credential, res(1, 1, 1), tx);
        assert_eq!(ep.ip, IpAddr::V4(std::net::Ipv4Addr::new(10, 1, 2, 3)));
    }

    #[test]
    fn closing_eps_and_cancelled_jobs_get_nothing() {
        let mut t = EpTable::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let pool = Pool { annex: None, owner: None };
        let credential = Credential { jti: "j".into(), owner: None, issuer: "s".into() };
        t.insert(EpSlot::new("a".into(), "a".into(), LOCALHOST, pool, credential, res(4, 4000, 100), tx));
        let idle = [job("j1", "x", res(1, 1, 1)), job("j2", "x", res(1, 1, 1))];
        let m = select(&idle, &t, None);
        assert!(m.iter().all(|m| t.reserve(m)));
        // j1 is stopped before its Assign went out: it is not sent and its room comes back.
        assert!(t.cancel("a", "j1", "revoked"));
        assert!(matches!(rx.try_recv(), Ok(ToEp::Send(SchedulerMsg::Cancel { .. }))));
        let assignment = |id: &str| JobAssignment {
            job_id: id.into(),
            function: htfaas_functions::proto::FunctionRef {
                name: "f".into(),
                version: 1,
                digest: htfaas_functions::Digest::of(b"m"),
                module_url: "http://r/m".into(),
            },
            resources: res(1, 1, 1),
            input: htfaas_functions::proto::InputSpec {
                url: "http://s/a".into(),
                name: "a".into(),
                macaroon: "m".into(),
            },
            output: htfaas_functions::proto::OutputSpec { url: "http://s/o/".into(), macaroon: "m".into() },
            args: vec![],
            env: vec![],
        };
        assert_eq!(t.deliver("a", assignment("j1")), Delivery::Cancelled);
        assert!(!t.is_running("a", "j1"));
        assert_eq!(t.deliver("a", assignment("j2")), Delivery::Sent);
        assert_eq!(t.mark_closing(|c| c.jti == "j"), vec!["a".to_owned()]);
        assert_eq!(select(&[job("j3", "x", res(1, 1, 1))], &t, None), vec![]);
        assert!(t.pools_with_room().is_empty());
        assert_eq!(t.deliver("gone", assignment("j3")), Delivery::Gone);
    }

    #[test]
    fn never_exceeds_free_resources() {
        let mut t = EpTable::default();
        t.insert(ep("a", None, res(4, 1000, 100)));
        let idle: Vec<_> = (0..10).map(|i| job(&format!("j{i}"), "x", res(1, 300, 10))).collect();
        let m = select(&idle, &t, None);
        assert_eq!(m.len(), 3, "memory allows three");
        for x in &m {
            assert!(t.reserve(x));
        }
        assert_eq!(select(&idle[3..], &t, None), vec![]);
        assert!(t.release("a", "j0"));
        assert!(!t.release("a", "j0"));
        assert_eq!(select(&idle[3..], &t, None).len(), 1);
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
        let m = select(&idle, &t, None);
        assert_eq!(m.iter().map(|m| m.job_id.as_str()).collect::<Vec<_>>(), vec!["al"]);
    }

    #[test]
    fn the_running_limit_holds_back_one_owner_and_not_the_others() {
        let mut t = EpTable::default();
        t.insert(ep("a", None, res(4, 4000, 100)));
        let idle = [
            job("al1", "alice", res(1, 1, 1)),
            job("al2", "alice", res(1, 1, 1)),
            job("al3", "alice", res(1, 1, 1)),
            job("bob1", "bob", res(1, 1, 1)),
        ];
        assert_eq!(select(&idle, &t, None).len(), 4, "no limit: all four fit");
        let m = select(&idle, &t, Some(1));
        assert_eq!(placed(&m), vec![("al1", "a"), ("bob1", "a")]);
        assert!(m.iter().all(|m| t.reserve(m)));
        assert_eq!(t.owners_at_limit(Some(1)).len(), 2);
        assert!(t.owners_at_limit(None).is_empty());
        // Reserved jobs count: nothing more for either, though two cores are free.
        assert_eq!(select(&idle[1..3], &t, Some(1)), vec![]);
        assert_eq!(select(&idle[1..3], &t, Some(2)).len(), 1);
        // Alice's ends: her next one starts.
        assert!(t.release("a", "al1"));
        assert_eq!(t.owners_at_limit(Some(1)), vec!["bob".to_owned()]);
        assert_eq!(placed(&select(&idle[1..3], &t, Some(1))), vec![("al2", "a")]);
    }

    #[test]
    fn prefers_dedicated_eps_then_tightest_fit() {
        let mut t = EpTable::default();
        t.insert(ep("big", None, res(16, 16000, 100)));
        t.insert(ep("small", None, res(2, 16000, 100)));
        t.insert(ep("alices", Some("alice"), res(16, 16000, 100)));
        let m = select(&[job("j1", "alice", res(1, 1, 1)), job("j2", "bob", res(1, 1, 1))], &t, None);
        assert_eq!(m[0].ep_id, "alices");
        assert_eq!(m[1].ep_id, "small");
    }
}
