//! Matching: the table of attached EPs and the one function, [`select`], that decides which
//! idle job goes to which EP.
//!
//! Where a job may run: an EP that accepts work (not closing, not disabled by an admin, not
//! draining past what the job's run time allows, the job's accounting group not paused there),
//! whose free cpus, memory, GPUs and disk hold it (partitionable: an EP runs as many jobs at
//! once as its resources allow), whose `runtime_s` is at least the job's, whose owner
//! restriction is absent or equal to the job's owner, and whose annex equals the job's (both
//! none, or the same name: an annex EP runs only its annex's jobs, and an annex job runs only
//! there), and that runs native code if the job is native. Owner and annex come from the EP's
//! attach token, never from the EP's own word (whether it runs native code is its word: an EP
//! that says so falsely only fails the native jobs it is given).
//! [`EpSlot::refusal`] says why an EP does not take a job; `htfaas jobs analyze` shows it. Among
//! the EPs that qualify, those dedicated to the owner come first, then for a native job those
//! that hold its image (no fetch, no unpacking), then the tightest fit (fewest free cpus left),
//! so large holes stay open for large jobs.
//!
//! Which job gets a free slot: fair share, as HTCondor's negotiator does it. Each owner has a
//! real priority, 0.5 + their decayed usage in cores (core-seconds × ln 2 / half-life: an owner
//! who keeps `c` cores busy tends to 0.5 + `c`), and a priority factor; the next slot goes to
//! the owner with the lowest `factor × (real priority + cores they have in use now)`, counting
//! the cores given out in this very round, so that owners with equal standing take turns and
//! one owner's flood cannot starve the others. Within an owner, oldest first. An owner at the
//! per-owner running limit ([`crate::Config::max_running_jobs_per_owner`]) gets nothing more,
//! and a function with as many jobs assigned as its `max_concurrent` starts no other: its
//! further jobs wait idle, behind no other job.
//!
//! Accounting groups with quotas ([`GroupQuota`]): a group's running jobs hold at most its
//! quota in cores, except that when every job that could start within its group's quota has
//! been placed and slots are still free (the pool is otherwise idle), groups may go up to their
//! cap (quota × oversubscription factor). Jobs without a group, or of a group without a quota,
//! are not limited by quota.
//!
//! The table also carries what the rest of the scheduler says to a session ([`ToEp`]): the
//! dispatcher's Assigns, a revocation's Cancels, and the order to close.
//!
//! In files: `table.rs` holds the EP table ([`EpTable`], [`EpSlot`], [`ToEp`]); this file the
//! policy a round is run with ([`Policy`], [`GroupQuota`]) and [`select`].
//!
//! Must not know: the store's SQL, HTTP, the WebSocket, or what sessions and the dispatcher do
//! with a [`Match`].

use htfaas_functions::Resources;
use std::collections::{BTreeMap, HashMap, HashSet};
use table::Free;

mod table;

pub use crate::queue::{FunctionLimit, IdleJob, Pool};
pub use table::{Delivery, EpAdmin, EpSlot, EpTable, ToEp};

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
    /// A native job's image (the EP fetches it for the job, and holds it after).
    pub image: Option<String>,
    /// Its function's limit of runs at once, if it has one.
    pub limit: Option<FunctionLimit>,
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

/// Decides where idle jobs go, by fair share (see the module docs). `idle` holds each owner's
/// jobs oldest first (owners may be interleaved); the answer never gives an EP more than its
/// free resources (none while jobs are queued there) plus, once no job fits free resources
/// anywhere, as many jobs as its prefetch queue has room for, each within its total; never an
/// owner more than `policy.max_running` assigned jobs, or a group more than its quota, or its
/// cap once no job within quota can be placed (all counting what is already reserved in `eps`,
/// queued jobs included). Pure: reserving is the caller's job.
pub fn select(idle: &[IdleJob], eps: &EpTable, policy: &Policy) -> Vec<Match> {
    let mut free: BTreeMap<&str, Free> = eps.eps.values().map(|e| (e.ep_id.as_str(), e.startable())).collect();
    // Prefetch room left per EP, used by the last pass only.
    let mut queue_room: BTreeMap<&str, u32> = eps.eps.values().map(|e| (e.ep_id.as_str(), e.refill_room())).collect();
    let mut running = eps.running_per_owner();
    let mut cores: HashMap<&str, u64> = eps.cores_per_owner();
    let mut group_cores: HashMap<&str, u64> = eps.cores_per_group();
    let mut per_function = eps.running_per_function();
    // Each owner's jobs, oldest first, with whether each is still waiting.
    let mut queues: BTreeMap<&str, Vec<&IdleJob>> = BTreeMap::new();
    for job in idle.iter().filter(|j| j.resources.cpus > 0) {
        // Jobs asking for no core are refused at submit; never let one through without
        // reserving anything.
        queues.entry(job.owner.as_str()).or_default().push(job);
    }
    let mut placed: HashSet<&str> = HashSet::new();
    let mut out = Vec::new();
    for (surplus, prefetch) in [(false, false), (true, false), (false, true)] {
        if prefetch {
            // The last pass fills prefetch queues: room is the EP's whole, one job at a time.
            free = eps
                .eps
                .values()
                .map(|e| {
                    let room = queue_room.get(e.ep_id.as_str()).copied().unwrap_or(0);
                    let f = if room > 0 { e.whole() } else { Free { cpus: 0, memory_mb: 0, gpus: 0, disk_mb: 0 } };
                    (e.ep_id.as_str(), f)
                })
                .collect();
        }
        let mut done: HashSet<&str> = HashSet::new();
        loop {
            if free.values().all(|f| f.cpus == 0) {
                break;
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
                if let Some(l) = &job.limit
                    && per_function.get(l.function.as_str()).copied().unwrap_or(0) >= u64::from(l.max_concurrent)
                {
                    continue;
                }
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
                    // Dedicated EPs first, then (native jobs) those holding the image, then the
                    // tightest fit.
                    .min_by_key(|(e, left)| {
                        let cold = job.image.as_ref().is_some_and(|i| !e.images.contains(i));
                        (e.pool.owner.is_none(), cold, left.cpus, left.memory_mb)
                    });
                if let Some((ep, left)) = best {
                    chosen = Some((job, ep, left));
                    break;
                }
            }
            let Some((job, ep, left)) = chosen else {
                done.insert(owner);
                continue;
            };
            if prefetch {
                let room = queue_room.entry(ep.ep_id.as_str()).or_default();
                *room = room.saturating_sub(1);
                if *room == 0 {
                    free.insert(ep.ep_id.as_str(), Free { cpus: 0, memory_mb: 0, gpus: 0, disk_mb: 0 });
                }
            } else {
                free.insert(ep.ep_id.as_str(), left);
            }
            placed.insert(job.id.as_str());
            *running.entry(owner).or_default() += 1;
            *cores.entry(owner).or_default() += u64::from(job.resources.cpus);
            if let Some(g) = &job.group {
                *group_cores.entry(g.as_str()).or_default() += u64::from(job.resources.cpus);
            }
            if let Some(l) = &job.limit {
                *per_function.entry(l.function.as_str()).or_default() += 1;
            }
            out.push(Match {
                job_id: job.id.clone(),
                ep_id: ep.ep_id.clone(),
                resources: job.resources,
                owner: job.owner.clone(),
                group: job.group.clone(),
                image: job.image.clone(),
                limit: job.limit.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::revocation::Credential;
    use htfaas_functions::proto::{JobAssignment, SchedulerMsg};
    use std::net::IpAddr;
    use tokio::sync::mpsc;

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
        IdleJob { id: id.into(), owner: owner.into(), group: None, annex: None, resources: r, image: None, limit: None }
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
    fn no_job_is_placed_on_an_ep_it_would_outlast_by_its_token_or_its_annex() {
        let now = 1_000_000;
        let mut e = ep("e", None, res(8, 8000, 3600));
        let j = job("j", "alice", res(1, 1, 600));
        assert_eq!(e.refusal(&j, now), None, "renewed as it goes, no annex on record");
        e.token_ends_ms = Some(now + 599_000);
        let why = e.refusal(&j, now).expect("the token ends first");
        assert_eq!(
            why,
            "the job's run time of 600 s would end after the EP's attach token expires (599 s from now; it is not renewed)"
        );
        e.token_ends_ms = Some(now + 600_000);
        assert_eq!(e.refusal(&j, now), None, "ends just in time");
        e.annex_leaves_ms = Some(now + 300_000);
        let why = e.refusal(&j, now).expect("the annex ends first");
        assert_eq!(why, "the job's run time of 600 s would end after the EP's annex ends (300 s from now)");
        assert_eq!(e.refusal(&job("short", "alice", res(1, 1, 300)), now), None);
    }

    /// Free resources first, then the prefetch queue; a queued job holds no free
    /// resources, moves into them when they free (oldest first), and a later job never jumps
    /// the queue even where it would fit.
    #[test]
    fn a_prefetch_queue_fills_after_free_resources_and_moves_up_in_order() {
        let mut t = EpTable::default();
        let mut e = ep("e", None, res(2, 1000, 100));
        e.prefetch = 2;
        t.insert(e);
        let idle: Vec<IdleJob> = (0..5).map(|i| job(&format!("j{i}"), "alice", res(1, 100, 10))).collect();
        let m = select(&idle, &t, &Policy::default());
        assert_eq!(placed(&m), vec![("j0", "e"), ("j1", "e"), ("j2", "e"), ("j3", "e")], "2 free + 2 queued");
        for x in &m {
            assert!(t.reserve(x), "{x:?}");
        }
        let e = t.get("e").expect("ep");
        assert_eq!((e.free_cpus, e.queued.iter().map(String::as_str).collect::<Vec<_>>()), (0, vec!["j2", "j3"]));
        assert!(t.pools_with_room().is_empty(), "full: free and queue");
        assert_eq!(t.running_per_owner().get("alice"), Some(&4), "queued jobs count for their owner");
        assert!(t.release("e", "j0"));
        let e = t.get("e").expect("ep");
        assert_eq!((e.free_cpus, e.queued.iter().map(String::as_str).collect::<Vec<_>>()), (0, vec!["j3"]));
        assert!(t.is_running("e", "j2") && e.is_queued("j3") && !e.is_queued("j2"));
        // A queued job released (cancelled, handed back) frees no resources it never held.
        assert!(t.release("e", "j3"));
        assert_eq!(t.get("e").map(|e| (e.free_cpus, e.queued.len())), Some((0, 0)));
        // A two-core job waits in the queue; a one-core job behind it waits too.
        let big = job("big", "alice", res(2, 100, 10));
        let m = select(&[big, job("small", "alice", res(1, 100, 10))], &t, &Policy::default());
        assert_eq!(placed(&m), vec![("big", "e"), ("small", "e")]);
        for x in &m {
            assert!(t.reserve(x));
        }
        assert!(t.release("e", "j1"));
        assert_eq!(t.get("e").map(|e| (e.free_cpus, e.queued.len())), Some((1, 2)), "big does not fit 1 core");
        assert!(t.release("e", "j2"));
        assert_eq!(t.get("e").map(|e| (e.free_cpus, e.queued.len())), Some((0, 1)), "big started, small waits");
        assert!(t.release("e", "big"));
        assert_eq!(t.get("e").map(|e| (e.free_cpus, e.queued.len())), Some((1, 0)));
    }

    /// A deep queue is refilled once half of it is free, several jobs at once; until then the
    /// EP takes nothing (and is no pool with room), though its queue has a free place.
    #[test]
    fn a_deep_prefetch_queue_is_refilled_in_batches_once_half_is_free() {
        let mut t = EpTable::default();
        let mut e = ep("e", None, res(1, 1000, 100));
        e.prefetch = 4;
        t.insert(e);
        let idle: Vec<IdleJob> = (0..12).map(|i| job(&format!("j{i}"), "alice", res(1, 100, 10))).collect();
        let take = |t: &mut EpTable, from: usize| {
            let m = select(&idle[from..], t, &Policy::default());
            for x in &m {
                assert!(t.reserve(x), "{x:?}");
            }
            m.len()
        };
        assert_eq!(take(&mut t, 0), 5, "1 free + 4 queued");
        // One finishes: the head starts, one place of four is free: not refilled yet.
        assert!(t.release("e", "j0"));
        assert_eq!(t.get("e").map(|e| (e.queued.len(), e.prefetch_room(), e.refill_room())), Some((3, 1, 0)));
        assert!(t.pools_with_room().is_empty(), "no round for a single free place");
        assert_eq!(take(&mut t, 5), 0);
        // A second finishes: half the queue is free, and both places are filled in one round.
        assert!(t.release("e", "j1"));
        assert_eq!(t.get("e").map(EpSlot::refill_room), Some(2));
        assert_eq!(t.pools_with_room().len(), 1);
        assert_eq!(take(&mut t, 5), 2, "two jobs in one round");
        assert_eq!(t.get("e").map(|e| e.queued.len()), Some(4));
        // A queue of two is refilled at each free place, as before.
        let mut t = EpTable::default();
        let mut e = ep("e", None, res(1, 1000, 100));
        e.prefetch = 2;
        t.insert(e);
        assert_eq!(take(&mut t, 0), 3);
        assert!(t.release("e", "j0"));
        assert_eq!(take(&mut t, 3), 1, "one free place of two is half");
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
        assert!(t.cancel("a", "j1", "revoked", true));
        assert!(matches!(rx.try_recv(), Ok(ToEp::Send(SchedulerMsg::Cancel { .. }))));
        let assignment = |id: &str| JobAssignment {
            job_id: id.into(),
            function: htfaas_functions::proto::FunctionRef {
                name: "f".into(),
                version: 1,
                digest: htfaas_functions::Digest::of(b"m"),
                module_url: "http://r/m".into(),
                native: None,
            },
            resources: res(1, 1, 1),
            input: Some(htfaas_functions::proto::InputSpec::new("http://s/a", "a", "m")),
            output: htfaas_functions::proto::OutputSpec {
                url: "http://s/o/".into(),
                macaroon: "m".into(),
                on_failure: Default::default(),
            },
            args: vec![],
            env: vec![],
            limits: Default::default(),
            secrets: Default::default(),
            renew_until: None,
            traceparent: None,
            refs: Vec::new(),
            checkpoint: None,
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

    /// A function's `max_concurrent` counts its assigned jobs across EPs and versions: at the
    /// limit, none of its jobs starts, another function's of the same owner does; one ending
    /// lets the next start.
    #[test]
    fn max_concurrent_holds_back_one_function_and_not_the_owners_others() {
        let mut t = EpTable::default();
        t.insert(ep("a", None, res(2, 4000, 100)));
        t.insert(ep("b", None, res(2, 4000, 100)));
        let limited = |id: &str| IdleJob {
            limit: Some(FunctionLimit { function: "slow".into(), max_concurrent: 2 }),
            ..job(id, "alice", res(1, 1, 1))
        };
        let idle = [limited("s1"), limited("s2"), limited("s3"), job("other", "alice", res(1, 1, 1))];
        let m = select(&idle, &t, &Policy::default());
        let ids: Vec<&str> = m.iter().map(|m| m.job_id.as_str()).collect();
        assert_eq!(ids, ["s1", "s2", "other"], "two of slow, though four cores are free");
        assert!(m.iter().all(|m| t.reserve(m)));
        assert_eq!(t.running_per_function().get("slow"), Some(&2));
        assert_eq!(t.functions_at_limit(), vec!["slow".to_owned()]);
        assert_eq!(select(&idle[2..3], &t, &Policy::default()), vec![], "at the limit");
        let s1 = m.iter().find(|m| m.job_id == "s1").expect("s1");
        assert!(t.release(&s1.ep_id, "s1"));
        assert!(t.functions_at_limit().is_empty());
        assert_eq!(select(&idle[2..3], &t, &Policy::default()).len(), 1, "s3 starts once s1 ended");
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

    /// A native job goes only to an EP that runs native code, first to one holding its image
    /// (which it holds from then on); a wasm-only EP says why it refuses it.
    #[test]
    fn native_jobs_go_to_native_eps_that_hold_their_image_first() {
        let mut t = EpTable::default();
        t.insert(ep("wasm-only", None, res(8, 8000, 100)));
        let native = IdleJob { image: Some("sha256:img".into()), ..job("n1", "alice", res(1, 1, 1)) };
        assert_eq!(select(std::slice::from_ref(&native), &t, &Policy::default()), vec![]);
        let why = t.eps["wasm-only"].refusal(&native, 0).expect("refused");
        assert!(why.contains("no native runtime"), "{why}");
        let mut cold = ep("cold", None, res(2, 8000, 100));
        cold.native = true;
        let mut warm = ep("warm", None, res(8, 8000, 100));
        warm.native = true;
        warm.images.insert("sha256:img".into());
        t.insert(cold);
        t.insert(warm);
        let m = select(std::slice::from_ref(&native), &t, &Policy::default());
        assert_eq!(placed(&m), vec![("n1", "warm")], "the EP with the image, though a looser fit");
        // Without the image anywhere, the tightest native fit; it holds the image once assigned.
        let other = IdleJob { image: Some("sha256:other".into()), ..job("n2", "alice", res(1, 1, 1)) };
        let m = select(std::slice::from_ref(&other), &t, &Policy::default());
        assert_eq!(placed(&m), vec![("n2", "cold")]);
        assert!(t.reserve(&m[0]));
        assert!(t.eps["cold"].images.contains("sha256:other"));
        // A wasm job still goes anywhere.
        assert_eq!(select(&[job("w", "bob", res(8, 1, 1))], &t, &Policy::default()).len(), 1);
    }
}
