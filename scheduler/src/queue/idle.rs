//! The read model matching reads: for each pool of attached EPs with room, each owner's oldest
//! idle jobs that fit it ([`Queue::idle_candidates`], with [`IdleJob`], [`Pool`] and
//! [`PoolRoom`]).
//!
//! Must not know: the EP table, the matching policy or the WebSocket: pools are values here.

use super::Queue;
use crate::error::QueueError;
use htfaas_functions::Resources;
use htfaas_functions::store::{db_int, from_db};
use rusqlite::params;
use std::collections::{HashMap, HashSet};

/// Most idle jobs read per round (per pool of EPs with room).
pub const BATCH: usize = 256;

/// An idle job as matching sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleJob {
    /// Job id.
    pub id: String,
    /// Who it is accounted to.
    pub owner: String,
    /// Its accounting group, if any.
    pub group: Option<String>,
    /// The annex it must run on, if any.
    pub annex: Option<String>,
    /// What it asks for.
    pub resources: Resources,
    /// A native job's image digest (`None`: a wasm job).
    pub image: Option<String>,
    /// Its function's name and most runs at once ([`htfaas_functions::FunctionManifest::max_concurrent`]),
    /// when it has a limit.
    pub limit: Option<FunctionLimit>,
}

/// A function's limit of runs at once, as its jobs carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionLimit {
    /// The function's name (a name is one owner's: the registry claims it for its owner).
    pub function: String,
    /// Most of its jobs assigned to EPs at once.
    pub max_concurrent: u32,
}

/// EPs that may take the same jobs: same annex, same owner restriction.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pool {
    /// The EPs' annex (from their attach tokens).
    pub annex: Option<String>,
    /// The EPs' owner restriction (from their attach tokens).
    pub owner: Option<String>,
}

/// A pool with room, as `EpTable::pools_with_room` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRoom {
    /// The pool.
    pub pool: Pool,
    /// The most free cpus, memory, GPUs and disk, and the longest run time, of any one of its
    /// EPs: a job larger in any of them fits nowhere in the pool now.
    pub room: Resources,
    /// Free cores over all its EPs: no more jobs than this can start.
    pub free_cpus: u32,
    /// Whether any of its EPs runs native jobs (else native jobs are not read).
    pub native: bool,
}

/// Most free cores, over all pools, for which [`Queue::idle_candidates`] reads on the
/// dispatcher's own thread: at most 16 rows per owner, so that a site with hundreds of owners
/// waiting keeps the read short on an async thread.
const INLINE_FREE_CPUS: u64 = 16;

/// Most owners whose idle jobs are read per pool and round (the best by priority).
pub const MAX_OWNERS_PER_POOL: usize = 512;
/// Most distinct owners the skip-scan reads per pool and round.
pub const MAX_OWNERS_SCANNED: u64 = 100_000;

impl Queue {
    /// For each pool of attached EPs with room (an annex, or none, and an owner restriction, or
    /// none), each owner's oldest idle jobs that pool may take and that fit within its room
    /// (at most `min(BATCH, the pool's free cores)` per owner, as no more could start), oldest
    /// first, without duplicates. Reading per owner is what lets fair share work: one owner's
    /// flood of a million jobs fills only that owner's share of the batch, and every other
    /// owner's oldest jobs are read in the same round. The owners with idle jobs are found by
    /// skip-scanning the `(annex, owner, seq)` index (one seek per owner, whatever the queue's
    /// length); at most [`MAX_OWNERS_PER_POOL`] of them per pool, best `priority` first (lower
    /// is better; an owner without an entry counts as 0). Jobs of `skip_owners` (at their running
    /// limit), jobs of `skip_functions` (at their `max_concurrent`) and jobs in retry backoff
    /// (until `not_before_ms`) are not read, so that they hold no other job back.
    /// `crate::matching::select` makes the final decision.
    pub async fn idle_candidates(
        &self,
        pools: Vec<PoolRoom>,
        skip_owners: Vec<String>,
        skip_functions: Vec<String>,
        priority: HashMap<String, f64>,
        now_ms: u64,
    ) -> Result<Vec<IdleJob>, QueueError> {
        // A refill of a few free cores reads a few rows per owner: read on this thread when
        // the reading connection is free ([`Queue::call_now`]); a wide read goes off it.
        let small = pools.iter().map(|p| u64::from(p.free_cpus)).sum::<u64>() <= INLINE_FREE_CPUS;
        let read = move |conn: &mut rusqlite::Connection| {
            let skip: HashSet<String> = skip_owners.into_iter().collect();
            // As a JSON array for `json_each`: one statement, whatever the number.
            let skip_functions = serde_json::to_string(&skip_functions)?;
            let mut seen = std::collections::BTreeMap::new();
            let mut owners_stmt = conn.prepare_cached(
                "WITH RECURSIVE o(owner) AS ( \
                   SELECT (SELECT owner FROM jobs WHERE state = 'idle' AND annex IS ?1 ORDER BY owner LIMIT 1) \
                   UNION ALL \
                   SELECT (SELECT owner FROM jobs WHERE state = 'idle' AND annex IS ?1 AND owner > o.owner \
                           ORDER BY owner LIMIT 1) FROM o WHERE o.owner IS NOT NULL) \
                 SELECT owner FROM o WHERE owner IS NOT NULL LIMIT ?2",
            )?;
            let mut jobs_stmt = conn.prepare_cached(
                "SELECT seq, id, owner, annex, cpus, memory_mb, runtime_s, grp, gpus, disk_mb, image, function_name, \
                 max_concurrent FROM jobs \
                 WHERE state = 'idle' AND annex IS ?1 AND owner = ?2 \
                 AND cpus <= ?3 AND memory_mb <= ?4 AND runtime_s <= ?5 AND gpus <= ?6 AND disk_mb <= ?7 \
                 AND not_before_ms <= ?8 AND (image IS NULL OR ?10) \
                 AND (max_concurrent IS NULL OR function_name NOT IN (SELECT value FROM json_each(?11))) \
                 ORDER BY seq LIMIT ?9",
            )?;
            for PoolRoom { pool, room, free_cpus, native } in &pools {
                let mut owners: Vec<String> = match &pool.owner {
                    Some(o) => vec![o.clone()],
                    None => owners_stmt
                        .query_map(params![pool.annex, db_int(MAX_OWNERS_SCANNED)], |r| r.get(0))?
                        .collect::<Result<_, _>>()?,
                };
                owners.retain(|o| !skip.contains(o));
                let key = |o: &String| priority.get(o).copied().unwrap_or(0.0);
                owners.sort_by(|a, b| key(a).total_cmp(&key(b)).then_with(|| a.cmp(b)));
                owners.truncate(MAX_OWNERS_PER_POOL);
                let per_owner = i64::from((*free_cpus).min(u32::try_from(BATCH).unwrap_or(u32::MAX)));
                for owner in &owners {
                    let rows = jobs_stmt.query_map(
                        params![
                            pool.annex,
                            owner,
                            room.cpus,
                            db_int(room.memory_mb),
                            db_int(room.runtime_s),
                            room.gpus,
                            db_int(room.disk_mb),
                            db_int(now_ms),
                            per_owner,
                            native,
                            skip_functions
                        ],
                        |r| {
                            Ok((
                                r.get::<_, i64>(0)?,
                                IdleJob {
                                    id: r.get(1)?,
                                    owner: r.get(2)?,
                                    annex: r.get(3)?,
                                    group: r.get(7)?,
                                    image: r.get(10)?,
                                    limit: match (r.get::<_, Option<String>>(11)?, r.get::<_, Option<u32>>(12)?) {
                                        (Some(function), Some(max_concurrent)) => {
                                            Some(FunctionLimit { function, max_concurrent })
                                        }
                                        _ => None,
                                    },
                                    resources: Resources {
                                        cpus: r.get(4)?,
                                        memory_mb: from_db(r.get(5)?),
                                        runtime_s: from_db(r.get(6)?),
                                        gpus: r.get(8)?,
                                        disk_mb: from_db(r.get(9)?),
                                    },
                                },
                            ))
                        },
                    )?;
                    for row in rows {
                        let (seq, job) = row?;
                        seen.insert(seq, job);
                    }
                }
            }
            Ok(seen.into_values().collect())
        };
        if small { self.call_now(read).await } else { self.call(read).await }
    }
}
