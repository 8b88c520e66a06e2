// Long because it holds the one job-selection function and the EP slot model it reads; kept whole until issue 19 splits it along its layers.
//! Matching: the table of attached EPs and the one function, [`select`], that decides which
//! idle job goes to which EP.
//!
//! Where a job may run: an EP that accepts work (not closing, not disabled by an admin, not
//! draining past what the job's run time allows, the job's accounting group not paused there),
//! whose free cpus, memory, GPUs and disk hold it (partitionable: an EP runs as many jobs at
//! once as its resources allow), whose `runtime_s` is at least the job's, whose owner
//! restriction is absent or equal to the job's owner, and whose annex equals the job's (both
//! none, or the same name: an annex EP runs only its annex's jobs, and an annex job runs only
//! there). Owner and annex come from the EP's attach token, never from the EP's own word.
//! [`EpSlot::refusal`] says why an EP does not take a job; `htfaas jobs analyze` shows it. Among
//! the EPs that qualify, those dedicated to the owner come first, then the tightest fit (fewest
//! free cpus left), so large holes stay open for large jobs.
//!
//! Which job gets a free slot: fair share, as HTCondor's negotiator does it. Each owner has a
//! real priority, 0.5 + their decayed usage in cores (core-seconds × ln 2 / half-life: an owner
//! who keeps `c` cores busy tends to 0.5 + `c`), and a priority factor; the next slot goes to
//! the owner with the lowest `factor × (real priority + cores they have in use now)`, counting
//! the cores given out in this very round, so that owners with equal standing take turns and
//! one owner's flood cannot starve the others. Within an owner, oldest first. An owner at the
//! per-owner running limit ([`crate::Config::max_running_jobs_per_owner`]) gets nothing more.
//!
//! Accounting groups with quotas ([`GroupQuota`]): a group's running jobs hold at most its
//! quota in cores, except that when every job that could start within its group's quota has
//! been placed and slots are still free (the pool is otherwise idle), groups may go up to their
//! cap (quota × oversubscription factor). Jobs without a group, or of a group without a quota,
//! are not limited by quota.
//!
//! The table also carries what the rest of the scheduler says to a session ([`ToEp`]): the
//! dispatcher's Assigns, a revocation's Cancels, and the order to close.

use crate::revocation::Credential;
use htfaas_functions::Resources;
use htfaas_functions::proto::{EpAdminState, EpInfo, JobAssignment, SchedulerMsg};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use tokio::sync::mpsc;

pub use crate::queue::{IdleJob, Pool, PoolRoom};

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

/// What an admin set on an EP (by name; it outlives sessions).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpAdmin {
    /// Enabled, draining or disabled.
    pub state: EpAdminState,
    /// Drain deadline, Unix ms: a job starts only if its run time ends before it.
    pub deadline_ms: Option<u64>,
    /// Accounting groups whose jobs it does not start.
    pub paused: BTreeSet<String>,
    /// Why it was last changed.
    pub reason: String,
}

/// Free resources of an EP during one [`select`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Free {
    cpus: u32,
    memory_mb: u64,
    gpus: u32,
    disk_mb: u64,
}

impl Free {
    fn fits(&self, r: &Resources) -> bool {
        r.cpus <= self.cpus && r.memory_mb <= self.memory_mb && r.gpus <= self.gpus && r.disk_mb <= self.disk_mb
    }

    fn minus(&self, r: &Resources) -> Free {
        Free {
            cpus: self.cpus.saturating_sub(r.cpus),
            memory_mb: self.memory_mb.saturating_sub(r.memory_mb),
            gpus: self.gpus.saturating_sub(r.gpus),
            disk_mb: self.disk_mb.saturating_sub(r.disk_mb),
        }
    }
}

/// One attached EP session.
#[derive(Debug)]
pub struct EpSlot {
    /// Session id (`Welcome.ep_id`); jobs running here carry it in the store.
    pub ep_id: String,
    /// The name the EP gave, for job records, logs and admin actions.
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
    /// GPUs not reserved by running jobs.
    pub free_gpus: u32,
    /// Disk not reserved by running jobs, MiB.
    pub free_disk_mb: u64,
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
    /// The EP said it is draining (`EpMsg::Draining`): takes no more jobs.
    pub self_draining: bool,
    /// What an admin set on it.
    pub admin: EpAdmin,
    /// Labels from its Hello (for admins; matching does not use them).
    pub labels: BTreeMap<String, String>,
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
            free_gpus: total.gpus,
            free_disk_mb: total.disk_mb,
            tx,
            running: HashMap::new(),
            cancelled: HashSet::new(),
            closing: false,
            self_draining: false,
            admin: EpAdmin::default(),
            labels: BTreeMap::new(),
        }
    }

    fn free(&self) -> Free {
        Free { cpus: self.free_cpus, memory_mb: self.free_memory_mb, gpus: self.free_gpus, disk_mb: self.free_disk_mb }
    }

    /// Whether it takes jobs now at all.
    fn accepting(&self) -> bool {
        !(self.closing || self.self_draining)
            && self.admin.state != EpAdminState::Disabled
            && !(self.admin.state == EpAdminState::Draining && self.admin.deadline_ms.is_none())
            && self.free_cpus > 0
            && self.free_memory_mb > 0
    }

    /// Why `job` may not or cannot run here with `free` left at `now_ms`; `None` if it can.
    fn refusal_with(&self, job: &IdleJob, free: Free, now_ms: u64) -> Option<String> {
        let r = &job.resources;
        if self.closing {
            return Some("the EP is closing".into());
        }
        if self.self_draining {
            return Some("the EP is draining (it said so: shutting down)".into());
        }
        if let Some(o) = self.pool.owner.as_ref().filter(|o| **o != job.owner) {
            return Some(format!("the EP runs only {o}'s jobs"));
        }
        if self.pool.annex != job.annex {
            let name = |a: &Option<String>| a.as_deref().map_or_else(|| "none".to_owned(), |a| format!("{a:?}"));
            return Some(format!(
                "annex mismatch: the EP's annex is {}, the job's {}",
                name(&self.pool.annex),
                name(&job.annex)
            ));
        }
        match self.admin.state {
            EpAdminState::Enabled => {}
            EpAdminState::Disabled => return Some(format!("the EP is disabled: {}", self.admin.reason)),
            EpAdminState::Draining => match self.admin.deadline_ms {
                None => return Some(format!("the EP is draining: {}", self.admin.reason)),
                Some(d) if now_ms.saturating_add(r.runtime_s.saturating_mul(1000)) > d => {
                    return Some(format!(
                        "the EP is draining and the job's run time of {} s would end after the deadline ({} s from now)",
                        r.runtime_s,
                        d.saturating_sub(now_ms) / 1000
                    ));
                }
                Some(_) => {}
            },
        }
        if let Some(g) = job.group.as_ref().filter(|g| self.admin.paused.contains(*g)) {
            return Some(format!("accounting group {g} is paused on the EP"));
        }
        if r.runtime_s > self.total.runtime_s {
            return Some(format!(
                "run time {} s is longer than the EP takes ({} s)",
                r.runtime_s, self.total.runtime_s
            ));
        }
        for (what, asked, total, free) in [
            ("cpus", u64::from(r.cpus), u64::from(self.total.cpus), u64::from(free.cpus)),
            ("memory_mb", r.memory_mb, self.total.memory_mb, free.memory_mb),
            ("gpus", u64::from(r.gpus), u64::from(self.total.gpus), u64::from(free.gpus)),
            ("disk_mb", r.disk_mb, self.total.disk_mb, free.disk_mb),
        ] {
            if asked > total {
                return Some(format!("not enough {what}: the EP has {total} in all, the job asks {asked}"));
            }
            if asked > free {
                return Some(format!("not enough free {what} now: {free} free, the job asks {asked}"));
            }
        }
        None
    }

    /// Why `job` would not start here now; `None` if it would.
    pub fn refusal(&self, job: &IdleJob, now_ms: u64) -> Option<String> {
        self.refusal_with(job, self.free(), now_ms)
    }

    /// The EP as an admin sees it.
    pub fn info(&self) -> EpInfo {
        let mut running: Vec<String> = self.running.keys().cloned().collect();
        running.sort();
        EpInfo {
            name: self.name.clone(),
            session: Some(self.ep_id.clone()),
            address: Some(self.ip.to_string()),
            annex: self.pool.annex.clone(),
            owner: self.pool.owner.clone(),
            total: self.total,
            free: Resources {
                cpus: self.free_cpus,
                memory_mb: self.free_memory_mb,
                runtime_s: self.total.runtime_s,
                gpus: self.free_gpus,
                disk_mb: self.free_disk_mb,
            },
            running,
            state: if self.self_draining { EpAdminState::Draining } else { self.admin.state },
            drain_deadline_ms: self.admin.deadline_ms,
            paused_groups: self.admin.paused.iter().cloned().collect(),
            reason: self.admin.reason.clone(),
            labels: self.labels.clone(),
        }
    }
}

/// What a running job holds on its EP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Cores, memory, GPUs, disk and runtime it reserved.
    pub resources: Resources,
    /// Its owner, for fair share and the per-owner running limit.
    pub owner: String,
    /// Its accounting group, for quotas.
    pub group: Option<String>,
}

/// The attached EPs, by session id, and what admins set on EPs, by name.
#[derive(Debug, Default)]
pub struct EpTable {
    eps: BTreeMap<String, EpSlot>,
    /// Admin settings by EP name; a session of that name gets them when it attaches.
    admin: BTreeMap<String, EpAdmin>,
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
    /// The job's accounting group.
    pub group: Option<String>,
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

/// A group's quota for one round, in cores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupQuota {
    /// Cores it may hold while others want them.
    pub quota: f64,
    /// Cores it may hold when the pool is otherwise idle (quota × oversubscription).
    pub cap: f64,
}

/// What [`select`] weighs besides the jobs and EPs.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Each owner's real priority (0.5 + decayed usage in cores); absent: 0.5.
    pub real_priority: HashMap<String, f64>,
    /// Each owner's priority factor; absent: 1.
    pub factor: HashMap<String, f64>,
    /// Most running jobs per owner.
    pub max_running: Option<u64>,
    /// Quotas of the groups that have one.
    pub quotas: HashMap<String, GroupQuota>,
    /// Now, Unix ms (drain deadlines).
    pub now_ms: u64,
}

impl Policy {
    /// An owner's effective priority with `cores` in use: lower goes first.
    pub fn effective(&self, owner: &str, cores: u64) -> f64 {
        let real = self.real_priority.get(owner).copied().unwrap_or(0.5);
        let factor = self.factor.get(owner).copied().unwrap_or(1.0);
        factor * (real + cores as f64)
    }
}

impl EpTable {
    /// Adds a session, with the admin settings of its name.
    pub fn insert(&mut self, mut ep: EpSlot) {
        if let Some(admin) = self.admin.get(&ep.name) {
            ep.admin = admin.clone();
        }
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

    /// Marks session `ep_id` as draining at its own request; false if it is gone.
    pub fn set_draining(&mut self, ep_id: &str) -> bool {
        self.eps.get_mut(ep_id).map(|e| e.self_draining = true).is_some()
    }

    /// Every session.
    pub fn iter(&self) -> impl Iterator<Item = &EpSlot> {
        self.eps.values()
    }

    /// Sets the admin settings of EP `name`: now for every session of that name, and for
    /// sessions that attach later.
    pub fn set_admin(&mut self, name: &str, admin: EpAdmin) {
        for ep in self.eps.values_mut().filter(|e| e.name == name) {
            ep.admin = admin.clone();
        }
        self.admin.insert(name.to_owned(), admin);
    }

    /// The admin settings of EP `name` (default when none were set).
    pub fn admin_of(&self, name: &str) -> EpAdmin {
        self.admin.get(name).cloned().unwrap_or_default()
    }

    /// Every EP as an admin sees it: the attached sessions, then names with admin settings
    /// and no session.
    pub fn infos(&self) -> Vec<EpInfo> {
        let mut out: Vec<EpInfo> = self.eps.values().map(EpSlot::info).collect();
        for (name, a) in &self.admin {
            if !self.eps.values().any(|e| e.name == *name) {
                let none = Resources { cpus: 0, memory_mb: 0, runtime_s: 0, gpus: 0, disk_mb: 0 };
                out.push(EpInfo {
                    name: name.clone(),
                    session: None,
                    address: None,
                    annex: None,
                    owner: None,
                    total: none,
                    free: none,
                    running: Vec::new(),
                    state: a.state,
                    drain_deadline_ms: a.deadline_ms,
                    paused_groups: a.paused.iter().cloned().collect(),
                    reason: a.reason.clone(),
                    labels: BTreeMap::new(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.session.cmp(&b.session)));
        out
    }

    /// How many sessions are attached.
    pub fn len(&self) -> usize {
        self.eps.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.eps.is_empty()
    }

    /// Total cores of every attached EP (what a group's share of the pool is a share of).
    pub fn total_cpus(&self) -> u64 {
        self.eps.values().map(|e| u64::from(e.total.cpus)).sum()
    }

    /// Each pool with an EP that accepts work, with its room (see [`PoolRoom`]).
    pub fn pools_with_room(&self) -> Vec<PoolRoom> {
        let mut pools: BTreeMap<&Pool, (Resources, u32)> = BTreeMap::new();
        for e in self.eps.values().filter(|e| e.accepting()) {
            let (r, free) = pools
                .entry(&e.pool)
                .or_insert((Resources { cpus: 0, memory_mb: 0, runtime_s: 0, gpus: 0, disk_mb: 0 }, 0));
            r.cpus = r.cpus.max(e.free_cpus);
            r.memory_mb = r.memory_mb.max(e.free_memory_mb);
            r.runtime_s = r.runtime_s.max(e.total.runtime_s);
            r.gpus = r.gpus.max(e.free_gpus);
            r.disk_mb = r.disk_mb.max(e.free_disk_mb);
            *free = free.saturating_add(e.free_cpus);
        }
        pools.into_iter().map(|(p, (room, free_cpus))| PoolRoom { pool: p.clone(), room, free_cpus }).collect()
    }

    /// Reserves `m.resources` on its EP for its job. False if the EP is gone or too full, or
    /// still holds an earlier, stopped attempt of the same job (held, released, not yet
    /// reported).
    pub fn reserve(&mut self, m: &Match) -> bool {
        let Some(ep) = self.eps.get_mut(&m.ep_id) else {
            return false;
        };
        if ep.running.contains_key(&m.job_id) || !ep.free().fits(&m.resources) {
            return false;
        }
        let left = ep.free().minus(&m.resources);
        (ep.free_cpus, ep.free_memory_mb, ep.free_gpus, ep.free_disk_mb) =
            (left.cpus, left.memory_mb, left.gpus, left.disk_mb);
        let reservation = Reservation { resources: m.resources, owner: m.owner.clone(), group: m.group.clone() };
        ep.running.insert(m.job_id.clone(), reservation);
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
        ep.free_gpus = (ep.free_gpus + r.gpus).min(ep.total.gpus);
        ep.free_disk_mb = (ep.free_disk_mb + r.disk_mb).min(ep.total.disk_mb);
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

    /// Cores each owner has reserved across all EPs.
    pub fn cores_per_owner(&self) -> HashMap<&str, u64> {
        let mut n: HashMap<&str, u64> = HashMap::new();
        for r in self.eps.values().flat_map(|e| e.running.values()) {
            *n.entry(r.owner.as_str()).or_default() += u64::from(r.resources.cpus);
        }
        n
    }

    /// Cores each accounting group has reserved across all EPs.
    pub fn cores_per_group(&self) -> HashMap<&str, u64> {
        let mut n: HashMap<&str, u64> = HashMap::new();
        for r in self.eps.values().flat_map(|e| e.running.values()) {
            if let Some(g) = &r.group {
                *n.entry(g.as_str()).or_default() += u64::from(r.resources.cpus);
            }
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

/// Decides where idle jobs go, by fair share (see the module docs). `idle` holds each owner's
/// jobs oldest first (owners may be interleaved); the answer never gives an EP more than its
/// free resources, an owner more than `policy.max_running` running jobs, or a group more than
/// its quota, or its cap once no job within quota can be placed (all counting what is already
/// reserved in `eps`). Pure: reserving is the caller's job.
pub fn select(idle: &[IdleJob], eps: &EpTable, policy: &Policy) -> Vec<Match> {
    let mut free: BTreeMap<&str, Free> = eps.eps.values().map(|e| (e.ep_id.as_str(), e.free())).collect();
    let mut running = eps.running_per_owner();
    let mut cores: HashMap<&str, u64> = eps.cores_per_owner();
    let mut group_cores: HashMap<&str, u64> = eps.cores_per_group();
    // Each owner's jobs, oldest first, with whether each is still waiting.
    let mut queues: BTreeMap<&str, Vec<&IdleJob>> = BTreeMap::new();
    for job in idle.iter().filter(|j| j.resources.cpus > 0) {
        // Jobs asking for no core are refused at submit; never let one through without
        // reserving anything.
        queues.entry(job.owner.as_str()).or_default().push(job);
    }
    let mut placed: HashSet<&str> = HashSet::new();
    let mut out = Vec::new();
    for surplus in [false, true] {
        let mut done: HashSet<&str> = HashSet::new();
        loop {
            if free.values().all(|f| f.cpus == 0) {
                return out;
            }
            // The owner furthest below their share among those who may still get something.
            let next = queues
                .keys()
                .copied()
                .filter(|o| !done.contains(o))
                .filter(|o| policy.max_running.is_none_or(|max| running.get(o).copied().unwrap_or(0) < max))
                .min_by(|a, b| {
                    let ka = policy.effective(a, cores.get(a).copied().unwrap_or(0));
                    let kb = policy.effective(b, cores.get(b).copied().unwrap_or(0));
                    ka.total_cmp(&kb).then_with(|| a.cmp(b))
                });
            let Some(owner) = next else { break };
            let mut chosen = None;
            for job in queues.get(owner).into_iter().flatten().filter(|j| !placed.contains(j.id.as_str())) {
                if let Some(q) = job.group.as_ref().and_then(|g| policy.quotas.get(g)) {
                    let used = group_cores.get(job.group.as_deref().unwrap_or_default()).copied().unwrap_or(0);
                    let limit = if surplus { q.cap } else { q.quota };
                    if (used + u64::from(job.resources.cpus)) as f64 > limit + 1e-9 {
                        continue;
                    }
                }
                let best = eps
                    .eps
                    .values()
                    .filter_map(|e| {
                        let f = free.get(e.ep_id.as_str()).copied()?;
                        e.refusal_with(job, f, policy.now_ms).is_none().then(|| (e, f.minus(&job.resources)))
                    })
                    .min_by_key(|(e, left)| (e.pool.owner.is_none(), left.cpus, left.memory_mb));
                if let Some((ep, left)) = best {
                    chosen = Some((job, ep, left));
                    break;
                }
            }
            let Some((job, ep, left)) = chosen else {
                done.insert(owner);
                continue;
            };
            free.insert(ep.ep_id.as_str(), left);
            placed.insert(job.id.as_str());
            *running.entry(owner).or_default() += 1;
            *cores.entry(owner).or_default() += u64::from(job.resources.cpus);
            if let Some(g) = &job.group {
                *group_cores.entry(g.as_str()).or_default() += u64::from(job.resources.cpus);
            }
            out.push(Match {
                job_id: job.id.clone(),
                ep_id: ep.ep_id.clone(),
                resources: job.resources,
                owner: job.owner.clone(),
                group: job.group.clone(),
            });
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
        IdleJob { id: id.into(), owner: owner.into(), group: None, annex: None, resources: r }
    }

    fn annex_job(id: &str, annex: &str) -> IdleJob {
        IdleJob { annex: Some(annex.into()), ..job(id, "alice", res(1, 1, 1)) }
    }

    fn limit(max_running: u64) -> Policy {
        Policy { max_running: Some(max_running), ..Policy::default() }
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
        assert_eq!(select(&idle, &t, &Policy::default()), vec![], "no EP of annex gpu yet");
        t.insert(annex_ep("gpu-ep", None, Some("gpu"), res(8, 8000, 100)));
        assert_eq!(placed(&select(&idle, &t, &Policy::default())), vec![("a1", "gpu-ep")]);

        let mut only_annex = EpTable::default();
        only_annex.insert(annex_ep("gpu-ep", None, Some("gpu"), res(8, 8000, 100)));
        assert_eq!(select(&[job("plain", "alice", res(1, 1, 1))], &only_annex, &Policy::default()), vec![]);

        // Both restrictions apply: an annex EP bound to alice takes neither bob's annex job
        // nor alice's plain one.
        let mut both = EpTable::default();
        both.insert(annex_ep("alices-gpu", Some("alice"), Some("gpu"), res(8, 8000, 100)));
        let bobs = IdleJob { owner: "bob".into(), ..annex_job("b1", "gpu") };
        let idle = [bobs, job("plain", "alice", res(1, 1, 1)), annex_job("a1", "gpu")];
        assert_eq!(placed(&select(&idle, &both, &Policy::default())), vec![("a1", "alices-gpu")]);
        let pools: Vec<Pool> = both.pools_with_room().into_iter().map(|r| r.pool).collect();
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
        let m = select(&idle, &t, &Policy::default());
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
            limits: Default::default(),
        };
        assert_eq!(t.deliver("a", assignment("j1")), Delivery::Cancelled);
        assert!(!t.is_running("a", "j1"));
        assert_eq!(t.deliver("a", assignment("j2")), Delivery::Sent);
        assert_eq!(t.mark_closing(|c| c.jti == "j"), vec!["a".to_owned()]);
        assert_eq!(select(&[job("j3", "x", res(1, 1, 1))], &t, &Policy::default()), vec![]);
        assert!(t.pools_with_room().is_empty());
        assert_eq!(t.deliver("gone", assignment("j3")), Delivery::Gone);
    }

    #[test]
    fn never_exceeds_free_resources() {
        let mut t = EpTable::default();
        t.insert(ep("a", None, res(4, 1000, 100)));
        let idle: Vec<_> = (0..10).map(|i| job(&format!("j{i}"), "x", res(1, 300, 10))).collect();
        let m = select(&idle, &t, &Policy::default());
        assert_eq!(m.len(), 3, "memory allows three");
        for x in &m {
            assert!(t.reserve(x));
        }
        assert_eq!(select(&idle[3..], &t, &Policy::default()), vec![]);
        assert!(t.release("a", "j0"));
        assert!(!t.release("a", "j0"));
        assert_eq!(select(&idle[3..], &t, &Policy::default()).len(), 1);
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
        let m = select(&idle, &t, &Policy::default());
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
        assert_eq!(select(&idle, &t, &Policy::default()).len(), 4, "no limit: all four fit");
        let m = select(&idle, &t, &limit(1));
        assert_eq!(placed(&m), vec![("al1", "a"), ("bob1", "a")]);
        assert!(m.iter().all(|m| t.reserve(m)));
        assert_eq!(t.owners_at_limit(Some(1)).len(), 2);
        assert!(t.owners_at_limit(None).is_empty());
        // Reserved jobs count: nothing more for either, though two cores are free.
        assert_eq!(select(&idle[1..3], &t, &limit(1)), vec![]);
        assert_eq!(select(&idle[1..3], &t, &limit(2)).len(), 1);
        // Alice's ends: her next one starts.
        assert!(t.release("a", "al1"));
        assert_eq!(t.owners_at_limit(Some(1)), vec!["bob".to_owned()]);
        assert_eq!(placed(&select(&idle[1..3], &t, &limit(1))), vec![("al2", "a")]);
    }

    #[test]
    fn prefers_dedicated_eps_then_tightest_fit() {
        let mut t = EpTable::default();
        t.insert(ep("big", None, res(16, 16000, 100)));
        t.insert(ep("small", None, res(2, 16000, 100)));
        t.insert(ep("alices", Some("alice"), res(16, 16000, 100)));
        let m = select(&[job("j1", "alice", res(1, 1, 1)), job("j2", "bob", res(1, 1, 1))], &t, &Policy::default());
        assert_eq!(m[0].ep_id, "alices");
        assert_eq!(m[1].ep_id, "small");
    }
}
