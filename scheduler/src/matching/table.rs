//! The table of attached EPs ([`EpTable`]): each session's slot ([`EpSlot`]: resources, owner
//! restriction and annex from its attach token, admin settings, running reservations), why an EP
//! does not take a job ([`EpSlot::refusal`]), pools with room, and what the rest of the scheduler
//! says to a session ([`ToEp`]).
//!
//! Prefetch: an EP granted `prefetch` jobs holds, besides the jobs its free resources
//! hold, up to that many more in a queue ([`EpSlot::queued`]), each fitting its total resources.
//! A queued job is assigned (in [`EpSlot::running`], counted for its owner and group like a
//! running one) but reserves no free resources; the table mirrors the EP's rule: a job starts
//! when nothing is queued before it and the free resources hold it, and on each release the
//! queue's head moves into the free resources while they hold it (the EP does the same, a
//! report earlier, so the EP is never overcommitted and the table never thinks it has more room
//! than the EP). A queue is refilled once at least half of it is free
//! ([`EpSlot::refill_room`]), so a deep one takes several jobs per dispatch round.
//!
//! Must not know: the store, fair share or group quotas (that is [`super::select`]), the
//! WebSocket (a session is an mpsc sender here).

use super::Match;
use crate::queue::{FunctionLimit, IdleJob, Pool, PoolRoom};
use crate::revocation::Credential;
use htfaas_functions::Resources;
use htfaas_functions::proto::{EpAdminState, EpInfo, JobAssignment, SchedulerMsg};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use tokio::sync::mpsc;

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

/// Free resources of an EP during one [`select`](super::select).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Free {
    pub(super) cpus: u32,
    pub(super) memory_mb: u64,
    pub(super) gpus: u32,
    pub(super) disk_mb: u64,
}

impl Free {
    pub(super) fn fits(&self, r: &Resources) -> bool {
        r.cpus <= self.cpus && r.memory_mb <= self.memory_mb && r.gpus <= self.gpus && r.disk_mb <= self.disk_mb
    }

    pub(super) fn minus(&self, r: &Resources) -> Free {
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
    /// reserves at least one core, so at most `total.cpus` + `prefetch` Assigns (and as many
    /// Cancels) are ever in flight, plus one Close.
    pub tx: mpsc::UnboundedSender<ToEp>,
    /// Jobs assigned here, running or queued: what each reserves, and whose it is.
    pub running: HashMap<String, Reservation>,
    /// Jobs of `running` queued on the EP (prefetched, not started as far as this table
    /// knows), oldest first: they hold no free resources yet.
    pub queued: VecDeque<String>,
    /// Most jobs it may hold queued (granted from its Hello; 0: no prefetch).
    pub prefetch: u32,
    /// It speaks the prefetch extension: array frames, `NotStarted`.
    pub extension: bool,
    /// Running jobs told to stop; their reservation stays until the EP reports.
    pub cancelled: HashSet<String>,
    /// Running jobs whose macaroons are being renewed: one renewal at a time each.
    pub renewing: HashSet<String>,
    /// Told to close: takes no more jobs.
    pub closing: bool,
    /// The EP said it is draining (`EpMsg::Draining`): takes no more jobs.
    pub self_draining: bool,
    /// What an admin set on it.
    pub admin: EpAdmin,
    /// Labels from its Hello (for admins; matching does not use them).
    pub labels: BTreeMap<String, String>,
    /// It runs native functions (its Hello offers the `native` runtime).
    pub native: bool,
    /// Images it holds, as far as the scheduler knows: those its Hello listed and those of the
    /// native jobs assigned to it since (it fetched them for those). A preference only.
    pub images: HashSet<String>,
    /// When its attach token expires, Unix ms, if it will not be renewed (the EP does not
    /// renew, the site does not, or a renewal was refused): the session ends then, so no job
    /// that would still run is placed here. `None`: renewed as it goes.
    pub token_ends_ms: Option<u64>,
    /// When its annex's EPs leave, Unix ms (the annex's end less its drain time), for an annex
    /// the scheduler keeps a record of; no job that would still run then is placed here.
    pub annex_leaves_ms: Option<u64>,
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
            queued: VecDeque::new(),
            prefetch: 0,
            extension: false,
            cancelled: HashSet::new(),
            renewing: HashSet::new(),
            closing: false,
            self_draining: false,
            admin: EpAdmin::default(),
            labels: BTreeMap::new(),
            native: false,
            images: HashSet::new(),
            token_ends_ms: None,
            annex_leaves_ms: None,
        }
    }

    pub(super) fn free(&self) -> Free {
        Free { cpus: self.free_cpus, memory_mb: self.free_memory_mb, gpus: self.free_gpus, disk_mb: self.free_disk_mb }
    }

    /// What a job assigned now may start in: the free resources, or nothing while jobs are
    /// queued (they start first).
    pub(super) fn startable(&self) -> Free {
        if self.queued.is_empty() { self.free() } else { Free { cpus: 0, memory_mb: 0, gpus: 0, disk_mb: 0 } }
    }

    /// How many more jobs it may hold queued.
    pub(super) fn prefetch_room(&self) -> u32 {
        self.prefetch.saturating_sub(u32::try_from(self.queued.len()).unwrap_or(u32::MAX))
    }

    /// How many jobs its queue is refilled by now: all its [`EpSlot::prefetch_room`] once at
    /// least half the queue is free (or nothing is queued), else none. A deep queue is so
    /// refilled in batches — one dispatch round, one store write and one frame for several jobs
    /// — instead of a job per finish, while half of it still waits on the EP. A queue of one or
    /// two is refilled at each free place, as before.
    pub(super) fn refill_room(&self) -> u32 {
        let room = self.prefetch_room();
        if self.queued.is_empty() || room.saturating_mul(2) >= self.prefetch { room } else { 0 }
    }

    /// Its total resources, as room for a queued job.
    pub(super) fn whole(&self) -> Free {
        Free {
            cpus: self.total.cpus,
            memory_mb: self.total.memory_mb,
            gpus: self.total.gpus,
            disk_mb: self.total.disk_mb,
        }
    }

    /// Moves queued jobs into the free resources, oldest first, while they fit (as the EP
    /// starts them).
    fn promote(&mut self) {
        while let Some(head) = self.queued.front() {
            let Some(r) = self.running.get(head).map(|r| r.resources) else {
                self.queued.pop_front();
                continue;
            };
            if !self.free().fits(&r) {
                break;
            }
            self.take(&r);
            self.queued.pop_front();
        }
    }

    fn take(&mut self, r: &Resources) {
        let left = self.free().minus(r);
        (self.free_cpus, self.free_memory_mb, self.free_gpus, self.free_disk_mb) =
            (left.cpus, left.memory_mb, left.gpus, left.disk_mb);
    }

    /// Whether `job_id` is queued here (assigned, not started as far as the table knows).
    pub fn is_queued(&self, job_id: &str) -> bool {
        self.queued.iter().any(|j| j == job_id)
    }

    /// Whether it takes jobs now at all.
    pub(super) fn accepting(&self) -> bool {
        !(self.closing || self.self_draining)
            && self.admin.state != EpAdminState::Disabled
            && !(self.admin.state == EpAdminState::Draining && self.admin.deadline_ms.is_none())
            && ((self.free_cpus > 0 && self.free_memory_mb > 0 && self.queued.is_empty()) || self.refill_room() > 0)
    }

    /// Why `job` may not or cannot run here with `free` left at `now_ms`; `None` if it can.
    pub(super) fn refusal_with(&self, job: &IdleJob, free: Free, now_ms: u64) -> Option<String> {
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
        if job.image.is_some() && !self.native {
            return Some("the job is native and the EP offers no native runtime (wasm only)".into());
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
        let ends_ms = now_ms.saturating_add(r.runtime_s.saturating_mul(1000));
        if let Some(t) = self.token_ends_ms.filter(|t| ends_ms > *t) {
            return Some(format!(
                "the job's run time of {} s would end after the EP's attach token expires ({} s from now; it is not renewed)",
                r.runtime_s,
                t.saturating_sub(now_ms) / 1000
            ));
        }
        if let Some(a) = self.annex_leaves_ms.filter(|a| ends_ms > *a) {
            return Some(format!(
                "the job's run time of {} s would end after the EP's annex ends ({} s from now)",
                r.runtime_s,
                a.saturating_sub(now_ms) / 1000
            ));
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

    /// The EP as an admin sees it (`running` holds its queued jobs too).
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
    /// Its function's limit of runs at once, if it has one.
    pub limit: Option<FunctionLimit>,
}

/// The attached EPs, by session id, and what admins set on EPs, by name.
#[derive(Debug, Default)]
pub struct EpTable {
    pub(super) eps: BTreeMap<String, EpSlot>,
    /// Admin settings by EP name; a session of that name gets them when it attaches.
    admin: BTreeMap<String, EpAdmin>,
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

    /// Sets when session `ep_id`'s attach token ends, if it will not be renewed
    /// ([`EpSlot::token_ends_ms`]); false if it is gone.
    pub fn set_token_end(&mut self, ep_id: &str, ends_ms: Option<u64>) -> bool {
        self.eps.get_mut(ep_id).map(|e| e.token_ends_ms = ends_ms).is_some()
    }

    /// Sets when the EPs of `annex` leave ([`EpSlot::annex_leaves_ms`]) and tells each
    /// `msg`; how many were told.
    pub fn set_annex_end(&mut self, annex: &str, leaves_ms: u64, msg: &SchedulerMsg) -> usize {
        self.eps
            .values_mut()
            .filter(|e| e.pool.annex.as_deref() == Some(annex))
            .map(|e| {
                e.annex_leaves_ms = Some(leaves_ms);
                e.tx.send(ToEp::Send(msg.clone())).is_ok()
            })
            .filter(|told| *told)
            .count()
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
        let mut pools: BTreeMap<&Pool, (Resources, u32, bool)> = BTreeMap::new();
        for e in self.eps.values().filter(|e| e.accepting()) {
            let (r, free, native) = pools.entry(&e.pool).or_insert((
                Resources { cpus: 0, memory_mb: 0, runtime_s: 0, gpus: 0, disk_mb: 0 },
                0,
                false,
            ));
            *native |= e.native;
            // With queue room, any job that fits the EP at all may be assigned there.
            let refill = e.refill_room();
            let (room, slots) = if refill > 0 {
                (e.whole(), e.startable().cpus.saturating_add(refill))
            } else {
                (e.startable(), e.startable().cpus)
            };
            r.cpus = r.cpus.max(room.cpus);
            r.memory_mb = r.memory_mb.max(room.memory_mb);
            r.runtime_s = r.runtime_s.max(e.total.runtime_s);
            r.gpus = r.gpus.max(room.gpus);
            r.disk_mb = r.disk_mb.max(room.disk_mb);
            *free = free.saturating_add(slots);
        }
        pools
            .into_iter()
            .map(|(p, (room, free_cpus, native))| PoolRoom { pool: p.clone(), room, free_cpus, native })
            .collect()
    }

    /// Reserves `m.resources` on its EP for its job: in its free resources when nothing is
    /// queued there and they hold it, else in its prefetch queue when that has room and the
    /// EP's total holds it. False if the EP is gone or too full, or still holds an earlier,
    /// stopped attempt of the same job (held, released, not yet reported).
    pub fn reserve(&mut self, m: &Match) -> bool {
        let Some(ep) = self.eps.get_mut(&m.ep_id) else {
            return false;
        };
        if ep.running.contains_key(&m.job_id) {
            return false;
        }
        if ep.startable().fits(&m.resources) {
            ep.take(&m.resources);
        } else if ep.prefetch_room() > 0 && ep.whole().fits(&m.resources) {
            ep.queued.push_back(m.job_id.clone());
        } else {
            return false;
        }
        if let Some(image) = &m.image {
            ep.images.insert(image.clone());
        }
        let reservation = Reservation {
            resources: m.resources,
            owner: m.owner.clone(),
            group: m.group.clone(),
            limit: m.limit.clone(),
        };
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
        if let Some(at) = ep.queued.iter().position(|j| j == job_id) {
            // Never started: it held no free resources.
            ep.queued.remove(at);
        } else {
            ep.free_cpus = (ep.free_cpus + r.cpus).min(ep.total.cpus);
            ep.free_memory_mb = (ep.free_memory_mb + r.memory_mb).min(ep.total.memory_mb);
            ep.free_gpus = (ep.free_gpus + r.gpus).min(ep.total.gpus);
            ep.free_disk_mb = (ep.free_disk_mb + r.disk_mb).min(ep.total.disk_mb);
        }
        ep.promote();
        true
    }

    /// Stops prefetching to `ep_id` for the rest of its session (it handed a job back
    /// unstarted outside a drain: its jobs outlast the prefetch wait, or it misbehaves). Its
    /// queued jobs stay until reported.
    pub fn stop_prefetch(&mut self, ep_id: &str) {
        if let Some(ep) = self.eps.get_mut(ep_id) {
            ep.prefetch = 0;
        }
    }

    /// The session's prefetch state: whether it is draining (it said so) and whether it still
    /// gets prefetched jobs. `None` if it is gone.
    pub fn prefetch_state(&self, ep_id: &str) -> Option<(bool, bool)> {
        self.eps.get(ep_id).map(|e| (e.self_draining, e.prefetch > 0))
    }

    /// How many jobs each owner has running (reserved) across all EPs.
    pub fn running_per_owner(&self) -> HashMap<&str, u64> {
        let mut n: HashMap<&str, u64> = HashMap::new();
        for r in self.eps.values().flat_map(|e| e.running.values()) {
            *n.entry(r.owner.as_str()).or_default() += 1;
        }
        n
    }

    /// Each function that limits its runs at once and has jobs assigned (running or queued)
    /// across all EPs: how many, and its limit (the lowest its assigned jobs carry).
    pub fn limited_functions(&self) -> BTreeMap<&str, (u64, u32)> {
        let mut limits: BTreeMap<&str, (u64, u32)> = BTreeMap::new();
        for l in self.eps.values().flat_map(|e| e.running.values()).filter_map(|r| r.limit.as_ref()) {
            let e = limits.entry(l.function.as_str()).or_insert((0, l.max_concurrent));
            e.0 += 1;
            e.1 = e.1.min(l.max_concurrent);
        }
        limits
    }

    /// Jobs assigned across all EPs of each function that limits its runs at once.
    pub fn running_per_function(&self) -> HashMap<&str, u64> {
        self.limited_functions().into_iter().map(|(f, (n, _))| (f, n)).collect()
    }

    /// Functions with at least as many jobs assigned as their limit: [`select`](super::select)
    /// starts none of theirs, so the store need not read them.
    pub fn functions_at_limit(&self) -> Vec<String> {
        let limited = self.limited_functions();
        limited.into_iter().filter(|(_, (n, max))| *n >= u64::from(*max)).map(|(f, _)| f.to_owned()).collect()
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

    /// Owners with at least `max_running` jobs running: [`select`](super::select) starts none of theirs, so
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

    /// Tells `ep_id` to stop `job_id` (if it holds it), which `ends` for good (removed: its
    /// checkpoint goes) or not (held: kept); the reservation stays until the EP reports or the
    /// session ends. False if the session does not hold the job.
    pub fn cancel(&mut self, ep_id: &str, job_id: &str, reason: &str, ends: bool) -> bool {
        let Some(ep) = self.eps.get_mut(ep_id).filter(|e| e.running.contains_key(job_id)) else {
            return false;
        };
        ep.cancelled.insert(job_id.to_owned());
        let msg = SchedulerMsg::Cancel { job_id: job_id.to_owned(), reason: reason.to_owned(), ends };
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

    /// Starts a renewal of `job_id`'s macaroons for session `ep_id`: its name and
    /// address when the session holds the job, has not been told to stop it, and renews none of
    /// it already; `Err` says why not. [`EpTable::end_renewal`] ends it.
    pub fn begin_renewal(&mut self, ep_id: &str, job_id: &str) -> Result<(String, IpAddr), String> {
        let ep = self
            .eps
            .get_mut(ep_id)
            .filter(|e| e.running.contains_key(job_id) && !e.cancelled.contains(job_id))
            .ok_or_else(|| format!("job {job_id} is not running on this EP"))?;
        if !ep.renewing.insert(job_id.to_owned()) {
            return Err(format!("a renewal of job {job_id} is already under way"));
        }
        Ok((ep.name.clone(), ep.ip))
    }

    /// Ends a renewal [`EpTable::begin_renewal`] started and sends `reply` to the session.
    /// False if the session is gone.
    pub fn end_renewal(&mut self, ep_id: &str, job_id: &str, reply: SchedulerMsg) -> bool {
        let Some(ep) = self.eps.get_mut(ep_id) else {
            return false;
        };
        ep.renewing.remove(job_id);
        ep.tx.send(ToEp::Send(reply)).is_ok()
    }

    /// Tells every session offering the native runtime to drop its idle handlers (native
    /// functions' warm workers) and keep none that serves now ([`SchedulerMsg::Retire`]);
    /// how many were told.
    pub fn retire_handlers(&self, reason: &str) -> usize {
        let msg = SchedulerMsg::Retire { reason: reason.to_owned() };
        self.eps.values().filter(|e| e.native && e.tx.send(ToEp::Send(msg.clone())).is_ok()).count()
    }

    /// Sends `msg` to session `ep_id`. False if it is gone.
    pub fn send(&self, ep_id: &str, msg: SchedulerMsg) -> bool {
        self.eps.get(ep_id).is_some_and(|e| e.tx.send(ToEp::Send(msg)).is_ok())
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
