//! What admins ask of the pool beyond single job actions: EP drain, disable, enable and group
//! pauses (by EP name, kept in the store and applied to every session of that name, now and
//! when it attaches again), `condor_q -analyze` for one job, and fair-share priorities
//! (`condor_userprio`, with `-setfactor`).
//!
//! | verb | effect |
//! |---|---|
//! | drain | running jobs finish; a new job starts only if its run time ends before the deadline (`deadline_s` from now); none without a deadline. Nothing is killed |
//! | disable | no new job starts; running jobs go on |
//! | enable | back to taking jobs (paused groups stay paused) |
//! | pause | jobs of `group` do not start there (maintenance for one accounting group) |
//! | resume | they do again |

use crate::actions::validate_reason;
use crate::failure::ApiFailure;
use crate::matching::IdleJob;
use crate::queue::{EpAdminRow, now_ms};
use crate::state::Shared;
use htfaas_functions::audit::{AuditDraft, Subject};
use htfaas_functions::manifest::check_name;
use htfaas_functions::proto::{
    EpAction, EpAdminState, EpInfo, EpVerdict, JobAnalysis, JobState, OwnerPriority, PriorityReport,
};

/// Longest EP name (as in a Hello).
pub const MAX_EP_NAME_BYTES: usize = 128;
/// Longest drain deadline, seconds from now (a year).
pub const MAX_DEADLINE_S: u64 = 365 * 24 * 3600;

/// An admin's EP verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpVerb {
    /// See the module docs.
    Drain,
    /// See the module docs.
    Disable,
    /// See the module docs.
    Enable,
    /// See the module docs.
    Pause,
    /// See the module docs.
    Resume,
}

impl EpVerb {
    /// The action's name in the audit trail: `ep.drain`, `ep.disable`, ….
    pub fn action(self) -> &'static str {
        match self {
            EpVerb::Drain => "ep.drain",
            EpVerb::Disable => "ep.disable",
            EpVerb::Enable => "ep.enable",
            EpVerb::Pause => "ep.pause",
            EpVerb::Resume => "ep.resume",
        }
    }

    /// Parses the path segment.
    pub fn parse(s: &str) -> Option<EpVerb> {
        Some(match s {
            "drain" => EpVerb::Drain,
            "disable" => EpVerb::Disable,
            "enable" => EpVerb::Enable,
            "pause" => EpVerb::Pause,
            "resume" => EpVerb::Resume,
            _ => return None,
        })
    }
}

/// Applies `verb` to EP `name` as `actor`: validates, stores it (with its audit record),
/// applies it to the attached sessions, wakes the dispatcher, and returns the EP as it is now.
#[tracing::instrument(name = "scheduler.ep_action", skip_all, fields(ep.name = %name, verb = ?verb))]
pub(crate) async fn ep_action(
    shared: &Shared,
    name: String,
    verb: EpVerb,
    action: EpAction,
    actor: &str,
) -> Result<EpInfo, ApiFailure> {
    if name.is_empty() || name.len() > MAX_EP_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(ApiFailure::bad_request(format!("EP name must be 1-{MAX_EP_NAME_BYTES} printable characters")));
    }
    validate_reason(&action.reason).map_err(|e| ApiFailure::bad_request(e.to_string()))?;
    if action.deadline_s.is_some() && verb != EpVerb::Drain {
        return Err(ApiFailure::bad_request("deadline_s is only for drain"));
    }
    if action.group.is_some() != matches!(verb, EpVerb::Pause | EpVerb::Resume) {
        return Err(ApiFailure::bad_request("group is required for pause and resume, and only for them"));
    }
    if let Some(g) = &action.group {
        check_name(g).map_err(|e| ApiFailure::bad_request(format!("group {e}")))?;
    }
    let now = now_ms();
    let mut admin = shared.eps().admin_of(&name);
    match verb {
        EpVerb::Drain => {
            let s = action.deadline_s.unwrap_or(0);
            if s > MAX_DEADLINE_S {
                return Err(ApiFailure::bad_request(format!("deadline_s must be at most {MAX_DEADLINE_S}")));
            }
            admin.state = EpAdminState::Draining;
            admin.deadline_ms = action.deadline_s.map(|s| now.saturating_add(s.saturating_mul(1000)));
        }
        EpVerb::Disable => (admin.state, admin.deadline_ms) = (EpAdminState::Disabled, None),
        EpVerb::Enable => (admin.state, admin.deadline_ms) = (EpAdminState::Enabled, None),
        EpVerb::Pause => {
            admin.paused.insert(action.group.clone().unwrap_or_default());
        }
        EpVerb::Resume => {
            let group = action.group.clone().unwrap_or_default();
            if !admin.paused.remove(&group) {
                return Err(ApiFailure::conflict(format!("group {group} is not paused on EP {name}")));
            }
        }
    }
    let args = serde_json::json!({
        "ep": name, "reason": action.reason, "deadline_ms": admin.deadline_ms, "group": action.group,
    });
    let record = AuditDraft::admin_action(actor, verb.action(), Subject::default(), args);
    admin.reason = action.reason;
    let row = EpAdminRow {
        name: name.clone(),
        state: admin.state,
        deadline_ms: admin.deadline_ms,
        paused: admin.paused.iter().cloned().collect(),
        reason: admin.reason.clone(),
        at_ms: now,
    };
    shared.queue.set_ep_admin(row, record).await?;
    tracing::info!(state = ?admin.state, deadline_ms = ?admin.deadline_ms, paused = ?admin.paused, "EP admin state set");
    let info = {
        let mut eps = shared.eps();
        eps.set_admin(&name, admin);
        eps.infos().into_iter().find(|i| i.name == name)
    };
    shared.wake.notify_one();
    info.ok_or_else(|| ApiFailure::internal("EP action", &"the EP vanished from the table"))
}

/// Why job `id` is or is not running (see [`JobAnalysis`]).
pub(crate) async fn analyze(shared: &Shared, id: String) -> Result<JobAnalysis, ApiFailure> {
    let Some(job) = shared.queue.get(id.clone()).await? else {
        return Err(ApiFailure::not_found(format!("job {id:?} not found")));
    };
    let now = now_ms();
    let mut reasons = Vec::new();
    let mut verdicts = Vec::new();
    let summary = match job.state {
        JobState::Held => {
            format!("held (code {}): {}", job.hold_code.unwrap_or(0), job.reason)
        }
        JobState::Running => format!("running on EP {}", job.ep.as_deref().unwrap_or("?")),
        JobState::Completed | JobState::Failed | JobState::Removed => {
            let reason = if job.reason.is_empty() { String::new() } else { format!(": {}", job.reason) };
            format!("{}{reason}", job.state.as_str())
        }
        JobState::Idle => {
            let (lost, not_before) = shared.queue.retry_state(id.clone()).await?;
            if not_before > now {
                reasons.push(format!(
                    "it lost {lost} attempt(s) (its EP went away, or the storage was unavailable) and waits {} s \
                     more before it runs again",
                    (not_before - now).div_ceil(1000)
                ));
            }
            let usage = shared.queue.owner_usage().await?;
            let max_concurrent = shared.queue.max_concurrent(id.clone()).await?;
            let max_running = shared.limits.max_running;
            let idle = IdleJob {
                id: job.id.clone(),
                owner: job.owner.clone(),
                group: job.group.clone(),
                annex: job.annex.clone(),
                resources: job.resources,
                image: job.native.as_ref().map(|_| job.digest.as_str().to_owned()),
                limit: None,
            };
            let eps = shared.eps();
            let policy = shared.policy.round(&eps, &usage, max_running, now);
            if let Some(max) = max_running {
                let n = eps.running_per_owner().get(job.owner.as_str()).copied().unwrap_or(0);
                if n >= max {
                    reasons.push(format!("owner {} has {n} jobs running, the limit is {max}", job.owner));
                }
            }
            if let Some(max) = max_concurrent {
                let n = eps.running_per_function().get(job.function.as_str()).copied().unwrap_or(0);
                if n >= u64::from(max) {
                    reasons.push(format!(
                        "function {} has {n} runs assigned, its max_concurrent is {max}: the job waits for one to end",
                        job.function
                    ));
                }
            }
            if let Some((g, q)) = job.group.as_ref().and_then(|g| policy.quotas.get(g).map(|q| (g, q))) {
                let used = eps.cores_per_group().get(g.as_str()).copied().unwrap_or(0) as f64;
                let asked = f64::from(job.resources.cpus);
                if used + asked > q.cap + 1e-9 {
                    reasons.push(format!(
                        "accounting group {g} uses {used} cores; its quota is {:.2} and its cap {:.2}",
                        q.quota, q.cap
                    ));
                } else if used + asked > q.quota + 1e-9 {
                    reasons.push(format!(
                        "accounting group {g} is over its quota of {:.2} cores: it gets more only while the \
                         pool is otherwise idle (cap {:.2})",
                        q.quota, q.cap
                    ));
                }
            }
            for ep in eps.iter() {
                verdicts.push(EpVerdict { ep: ep.name.clone(), refusal: ep.refusal(&idle, now) });
            }
            let cores = eps.cores_per_owner();
            let mine = policy.effective(&job.owner, cores.get(job.owner.as_str()).copied().unwrap_or(0));
            drop(eps);
            if verdicts.is_empty() {
                "no EP is attached".to_owned()
            } else if verdicts.iter().all(|v| v.refusal.is_some()) {
                "no attached EP can run it now".to_owned()
            } else if reasons.is_empty() {
                format!(
                    "an EP can run it now; it starts in fair-share order (owner {}'s effective priority {mine:.2})",
                    job.owner
                )
            } else {
                "an EP could run it, but policy holds it back".to_owned()
            }
        }
    };
    Ok(JobAnalysis { job_id: job.id, state: job.state, summary, reasons, eps: verdicts })
}

/// What `condor_userprio` shows.
pub(crate) async fn priorities(shared: &Shared) -> Result<PriorityReport, ApiFailure> {
    let owners = shared.queue.owner_usage().await?;
    let groups = shared.queue.group_usage().await?;
    let eps = shared.eps();
    Ok(shared.policy.report(&eps, &owners, &groups, now_ms()))
}

/// `condor_userprio -setfactor`: sets `owner`'s priority factor, as `actor`, and returns their
/// standing.
pub(crate) async fn set_factor(
    shared: &Shared,
    owner: String,
    factor: f64,
    actor: &str,
) -> Result<OwnerPriority, ApiFailure> {
    use crate::policy::{MAX_FACTOR, MIN_FACTOR};
    if owner.is_empty() || owner.len() > 128 || owner.chars().any(char::is_control) {
        return Err(ApiFailure::bad_request("owner must be 1-128 printable characters"));
    }
    if !factor.is_finite() || !(MIN_FACTOR..=MAX_FACTOR).contains(&factor) {
        return Err(ApiFailure::bad_request(format!("factor must be a number within {MIN_FACTOR}..={MAX_FACTOR}")));
    }
    shared.queue.set_factor(owner.clone(), factor, actor.to_owned()).await?;
    tracing::info!(%owner, factor, "priority factor set");
    shared.wake.notify_one();
    let report = priorities(shared).await?;
    report
        .owners
        .into_iter()
        .find(|o| o.owner == owner)
        .ok_or_else(|| ApiFailure::internal("set factor", &"the owner has no account after all"))
}
