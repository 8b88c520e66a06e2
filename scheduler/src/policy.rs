//! Site policy: what an admin configures about who runs what, resolved once from
//! [`crate::Config`] into a [`SitePolicy`] that the submit path, the dispatcher, EP sessions and
//! the admin API consult.
//!
//! - **Fair share** (HTCondor's user priorities): usage decays with a half-life
//!   ([`SitePolicy::half_life_s`], default one day); [`SitePolicy::round`] turns the stored usage
//!   into each owner's real priority for `crate::matching::select`; priority factors are set per
//!   owner by an admin (`condor_userprio -setfactor`).
//! - **Accounting groups** ([`GroupConfig`]): a quota in cores or as a share of the attached
//!   pool, and an oversubscription factor for when the pool is otherwise idle (DESY: 1.33).
//! - **Job classes** ([`JobClass`]): a class bounds a job's run time; a job names one (its
//!   function's manifest) or gets the default class; a job asking for more than its class allows
//!   is refused at submit. The scheduler removes a job still running past its run time (plus
//!   [`SitePolicy::runtime_grace_s`]) with a reason.
//! - **Requirements** ([`crate::requirements`]): a job violating a submit requirement is
//!   refused with its message; one violating a hold requirement is accepted held (code
//!   [`HOLD_CODE_POLICY`]) with its message as the reason ("Unauthorized GPU request").
//! - **Leases and retries**: an EP session silent for [`SitePolicy::lease_s`] is over; each of
//!   its jobs runs again after a backoff, up to [`SitePolicy::max_retries`] times, then is held.
//!   A job whose EP reports the storage unavailable loses its attempt under the same rule.
//!   A job whose guest failed runs again only as its function's retry policy asks,
//!   at most [`SitePolicy::max_guest_retries`] times.
//! - **Prefetch**: an EP that asks for it is assigned up to
//!   [`SitePolicy::max_prefetch`] jobs beyond its free resources ([`SitePolicy::prefetch`]),
//!   each of which must start within [`MAX_PREFETCH_WAIT_S`] (at most half the run-time grace).

use crate::matching::{EpTable, GroupQuota, Policy};
use crate::queue::{Loss, UsageRow, decay};
use crate::requirements::{JobAd, Requirement, RequirementConfig, RequirementError, first_violated, parse_all};
use htfaas_functions::manifest::{MAX_RUNTIME_S, NameError, check_name};
use htfaas_functions::proto::{
    GroupPriority, HOLD_CODE_POLICY, OwnerPriority, Prefetch, PriorityReport, SubmitRequest,
};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// Most jobs the scheduler prefetches to one EP by default ([`SitePolicy::max_prefetch`]).
pub const DEFAULT_MAX_PREFETCH: u32 = 16;
/// Longest a prefetched job may wait on its EP before it starts, seconds (less if half the
/// run-time grace is less): its macaroons' grace (`dispatch::MACAROON_GRACE_S`, 60 s) and the
/// overdue check both count from its dispatch, so the wait comes out of them.
pub const MAX_PREFETCH_WAIT_S: u64 = 10;

/// Run time of a job that asks for none (0) where no job class says otherwise, seconds.
pub const DEFAULT_RUNTIME_S: u64 = 3600;
/// Default half-life of decayed usage, seconds (one day).
pub const DEFAULT_HALF_LIFE_S: u64 = 86_400;
/// Default EP lease, seconds: a session silent this long is over (EPs ping every 15 s).
pub const DEFAULT_LEASE_S: u64 = 60;
/// Default number of times a job may lose its EP and still run again.
pub const DEFAULT_MAX_RETRIES: u32 = 3;
/// Default backoff before the first retry, seconds (doubled for each further loss).
pub const DEFAULT_RETRY_BACKOFF_S: u64 = 10;
/// Default time a job may run past its run time before the scheduler removes it, seconds.
pub const DEFAULT_RUNTIME_GRACE_S: u64 = 60;
/// Smallest priority factor (HTCondor's minimum is 1 too).
pub const MIN_FACTOR: f64 = 1.0;
/// Largest priority factor.
pub const MAX_FACTOR: f64 = 1e9;

/// An accounting group's quota, as configured. Exactly one of `quota_cores` and `quota_share`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// Quota in cores.
    #[serde(default)]
    pub quota_cores: Option<u32>,
    /// Quota as a share of the attached pool's cores, 0..=1.
    #[serde(default)]
    pub quota_share: Option<f64>,
    /// How far past its quota the group may go when the pool is otherwise idle: 1 (never) to 10.
    /// Default: 1.
    #[serde(default = "one")]
    pub oversubscribe: f64,
}

fn one() -> f64 {
    1.0
}

/// A job class, as configured (DESY: `lite`, `short`, `long`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobClass {
    /// Its name, `[a-z0-9][a-z0-9_-]{0,62}`.
    pub name: String,
    /// Run time of a job of this class that asks for none (run time 0), seconds. Default: the
    /// smaller of [`DEFAULT_RUNTIME_S`] and `max_runtime_s`.
    #[serde(default)]
    pub default_runtime_s: Option<u64>,
    /// Longest run time a job of this class may ask for, seconds.
    pub max_runtime_s: u64,
}

impl JobClass {
    /// The run time a job of this class gets when it asks for none.
    pub fn default_runtime_s(&self) -> u64 {
        self.default_runtime_s.unwrap_or(DEFAULT_RUNTIME_S.min(self.max_runtime_s))
    }
}

/// The resolved site policy.
#[derive(Debug, Clone)]
pub struct SitePolicy {
    /// Half-life of decayed usage, seconds.
    pub half_life_s: u64,
    /// Accounting groups with quotas, by name.
    pub groups: BTreeMap<String, GroupConfig>,
    /// Job classes, by name.
    pub classes: BTreeMap<String, JobClass>,
    /// The class of a job that names none; `None` when no classes are configured.
    pub default_class: Option<String>,
    /// Submit requirements: a job violating one is refused with its message.
    pub submit_requirements: Vec<Requirement>,
    /// Hold requirements: a job violating one is accepted held with its message.
    pub hold_requirements: Vec<Requirement>,
    /// EP lease, seconds.
    pub lease_s: u64,
    /// Lost attempts (its EP gone, or the storage unavailable) a job may have and still run
    /// again.
    pub max_retries: u32,
    /// Backoff before the first retry, seconds.
    pub retry_backoff_s: u64,
    /// Most retries after guest failures a function's retry policy gets.
    pub max_guest_retries: u32,
    /// Time a job may run past its run time before it is removed, seconds.
    pub runtime_grace_s: u64,
    /// Most jobs assigned to one EP beyond its free resources (its asked prefetch is capped to
    /// this); 0 turns prefetch off.
    pub max_prefetch: u32,
    /// Attached EPs that ask renew their attach tokens over their sessions.
    pub renew_attach: bool,
}

impl Default for SitePolicy {
    fn default() -> Self {
        SitePolicy {
            half_life_s: DEFAULT_HALF_LIFE_S,
            groups: BTreeMap::new(),
            classes: BTreeMap::new(),
            default_class: None,
            submit_requirements: Vec::new(),
            hold_requirements: Vec::new(),
            lease_s: DEFAULT_LEASE_S,
            max_retries: DEFAULT_MAX_RETRIES,
            retry_backoff_s: DEFAULT_RETRY_BACKOFF_S,
            max_guest_retries: crate::queue::DEFAULT_MAX_GUEST_RETRIES,
            runtime_grace_s: DEFAULT_RUNTIME_GRACE_S,
            max_prefetch: DEFAULT_MAX_PREFETCH,
            renew_attach: true,
        }
    }
}

/// What [`SitePolicy::admit`] decided for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The job's class.
    pub class: Option<String>,
    /// When set, the job is accepted held with this code and reason.
    pub hold: Option<(u32, String)>,
}

/// The policy parts of [`crate::Config`], as read from the file.
#[derive(Debug, Clone, Default)]
pub struct PolicyConfig {
    /// See [`crate::Config::usage_half_life_s`].
    pub usage_half_life_s: u64,
    /// See [`crate::Config::groups`].
    pub groups: BTreeMap<String, GroupConfig>,
    /// See [`crate::Config::job_classes`].
    pub job_classes: Vec<JobClass>,
    /// See [`crate::Config::default_job_class`].
    pub default_job_class: Option<String>,
    /// See [`crate::Config::submit_requirements`].
    pub submit_requirements: Vec<RequirementConfig>,
    /// See [`crate::Config::hold_requirements`].
    pub hold_requirements: Vec<RequirementConfig>,
    /// See [`crate::Config::lease_s`].
    pub lease_s: u64,
    /// See [`crate::Config::max_retries`].
    pub max_retries: u32,
    /// See [`crate::Config::retry_backoff_s`].
    pub retry_backoff_s: u64,
    /// See [`crate::Config::max_guest_retries`].
    pub max_guest_retries: u32,
    /// See [`crate::Config::runtime_grace_s`].
    pub runtime_grace_s: u64,
    /// See [`crate::Config::max_prefetch`].
    pub max_prefetch: u32,
    /// See [`crate::Config::renew_attach`].
    pub renew_attach: bool,
}

/// Why a [`PolicyConfig`] does not resolve; the message names the bad key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// `usage_half_life_s` is 0.
    #[error("usage_half_life_s must be at least 1")]
    HalfLife,
    /// `lease_s` is 0.
    #[error("lease_s must be at least 1")]
    Lease,
    /// `max_guest_retries` is over what a manifest may ask for.
    #[error("max_guest_retries must be 0..={}", htfaas_functions::on_failure::MAX_RETRIES)]
    GuestRetries,
    /// A group's name is not a name.
    #[error("groups: {0}")]
    GroupName(NameError),
    /// A group's `quota_share` is outside 0..=1 (the group).
    #[error("groups.{0}.quota_share must be within 0..=1")]
    QuotaShare(String),
    /// A group gives both or neither of `quota_cores` and `quota_share` (the group).
    #[error("groups.{0}: give exactly one of quota_cores and quota_share")]
    Quota(String),
    /// A group's `oversubscribe` is outside 1..=10 (the group).
    #[error("groups.{0}.oversubscribe must be within 1..=10")]
    Oversubscribe(String),
    /// A job class's name is not a name.
    #[error("job_classes: {0}")]
    ClassName(NameError),
    /// A job class's `max_runtime_s` is 0 or over [`MAX_RUNTIME_S`] (the class).
    #[error("job_classes.{0}.max_runtime_s must be 1..={MAX_RUNTIME_S}")]
    ClassMaxRuntime(String),
    /// A job class's `default_runtime_s` is 0 or over its `max_runtime_s` (the class).
    #[error("job_classes.{0}.default_runtime_s must be 1..=max_runtime_s")]
    ClassDefaultRuntime(String),
    /// Two job classes have the same name.
    #[error("job class {0:?} listed twice")]
    ClassTwice(String),
    /// `default_job_class` names no job class.
    #[error("default_job_class {0:?} is not one of job_classes")]
    UnknownDefaultClass(String),
    /// There are job classes but no `default_job_class`.
    #[error("default_job_class must be set when job_classes are")]
    NoDefaultClass,
    /// A submit requirement is refused.
    #[error("submit_requirements: {0}")]
    SubmitRequirement(RequirementError),
    /// A hold requirement is refused.
    #[error("hold_requirements: {0}")]
    HoldRequirement(RequirementError),
}

/// Why [`SitePolicy::admit`] refuses a request (403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The request names a job class the site does not have.
    #[error("unknown job class {class:?} (known: {})", known.join(", "))]
    UnknownClass {
        /// The class asked for.
        class: String,
        /// The site's classes.
        known: Vec<String>,
    },
    /// The request asks for more run time than its class allows.
    #[error("run time {runtime_s} s exceeds the maximum of job class {class} ({max_runtime_s} s)")]
    RuntimeOverClass {
        /// The run time asked for, seconds.
        runtime_s: u64,
        /// The job's class.
        class: String,
        /// The class's maximum, seconds.
        max_runtime_s: u64,
    },
    /// The request violates a submit requirement: its message.
    #[error("{0}")]
    Requirement(String),
}

impl PolicyConfig {
    /// Checks everything; the error names the bad key.
    pub fn resolve(self) -> Result<SitePolicy, PolicyError> {
        if self.usage_half_life_s == 0 {
            return Err(PolicyError::HalfLife);
        }
        if self.lease_s == 0 {
            return Err(PolicyError::Lease);
        }
        if self.max_guest_retries > htfaas_functions::on_failure::MAX_RETRIES {
            return Err(PolicyError::GuestRetries);
        }
        for (name, g) in &self.groups {
            check_name(name).map_err(PolicyError::GroupName)?;
            match (g.quota_cores, g.quota_share) {
                (Some(_), None) => {}
                (None, Some(s)) if (0.0..=1.0).contains(&s) => {}
                (None, Some(_)) => return Err(PolicyError::QuotaShare(name.clone())),
                _ => return Err(PolicyError::Quota(name.clone())),
            }
            if !(1.0..=10.0).contains(&g.oversubscribe) {
                return Err(PolicyError::Oversubscribe(name.clone()));
            }
        }
        let mut classes = BTreeMap::new();
        for c in self.job_classes {
            check_name(&c.name).map_err(PolicyError::ClassName)?;
            if c.max_runtime_s == 0 || c.max_runtime_s > MAX_RUNTIME_S {
                return Err(PolicyError::ClassMaxRuntime(c.name));
            }
            if c.default_runtime_s.is_some_and(|d| d == 0 || d > c.max_runtime_s) {
                return Err(PolicyError::ClassDefaultRuntime(c.name));
            }
            let name = c.name.clone();
            if classes.insert(name.clone(), c).is_some() {
                return Err(PolicyError::ClassTwice(name));
            }
        }
        match (&self.default_job_class, classes.is_empty()) {
            (Some(d), _) if !classes.contains_key(d) => {
                return Err(PolicyError::UnknownDefaultClass(d.clone()));
            }
            (None, false) => return Err(PolicyError::NoDefaultClass),
            _ => {}
        }
        Ok(SitePolicy {
            half_life_s: self.usage_half_life_s,
            groups: self.groups,
            classes,
            default_class: self.default_job_class,
            submit_requirements: parse_all(&self.submit_requirements).map_err(PolicyError::SubmitRequirement)?,
            hold_requirements: parse_all(&self.hold_requirements).map_err(PolicyError::HoldRequirement)?,
            lease_s: self.lease_s,
            max_retries: self.max_retries,
            retry_backoff_s: self.retry_backoff_s,
            max_guest_retries: self.max_guest_retries,
            runtime_grace_s: self.runtime_grace_s,
            max_prefetch: self.max_prefetch,
            renew_attach: self.renew_attach,
        })
    }
}

impl SitePolicy {
    /// What an EP asking for `asked` prefetched jobs is granted: at most
    /// [`SitePolicy::max_prefetch`], each to start within [`MAX_PREFETCH_WAIT_S`] or half the
    /// run-time grace, whichever is less; none when that leaves no time to wait.
    pub fn prefetch(&self, asked: u32) -> Prefetch {
        let wait_ms = MAX_PREFETCH_WAIT_S.min(self.runtime_grace_s / 2).saturating_mul(1000);
        let jobs = if wait_ms == 0 { 0 } else { asked.min(self.max_prefetch) };
        Prefetch { jobs, wait_ms }
    }

    /// Decides a request's class, fills in the class's default run time when the request asks
    /// for none (0; [`DEFAULT_RUNTIME_S`] without classes), refuses it (Err: the message, a 403)
    /// when it asks for more run time than its class allows or violates a submit requirement,
    /// and says whether it is to be held by a hold requirement.
    pub fn admit(&self, owner: &str, group: Option<&str>, r: &mut SubmitRequest) -> Result<Admission, AdmitError> {
        let class = match (&r.class, &self.default_class) {
            (_, None) => None,
            (Some(c), Some(_)) => {
                let Some(class) = self.classes.get(c) else {
                    let known = self.classes.keys().cloned().collect();
                    return Err(AdmitError::UnknownClass { class: c.clone(), known });
                };
                Some(class)
            }
            (None, Some(d)) => self.classes.get(d),
        };
        if r.resources.runtime_s == 0 {
            r.resources.runtime_s = class.map_or(DEFAULT_RUNTIME_S, JobClass::default_runtime_s);
        }
        if let Some(c) = class.filter(|c| r.resources.runtime_s > c.max_runtime_s) {
            return Err(AdmitError::RuntimeOverClass {
                runtime_s: r.resources.runtime_s,
                class: c.name.clone(),
                max_runtime_s: c.max_runtime_s,
            });
        }
        let ad = JobAd {
            owner: owner.to_owned(),
            group: group.map(str::to_owned),
            function: r.function.name.clone(),
            class: class.map(|c| c.name.clone()),
            annex: r.annex.clone(),
            cpus: r.resources.cpus,
            memory_mb: r.resources.memory_mb,
            runtime_s: r.resources.runtime_s,
            gpus: r.resources.gpus,
            disk_mb: r.resources.disk_mb,
        };
        if let Some(req) = first_violated(&self.submit_requirements, &ad) {
            return Err(AdmitError::Requirement(req.message().to_owned()));
        }
        let hold = first_violated(&self.hold_requirements, &ad).map(|req| (HOLD_CODE_POLICY, req.message().to_owned()));
        Ok(Admission { class: class.map(|c| c.name.clone()), hold })
    }

    /// How a lost attempt (its EP gone, or the storage unavailable) treats its job.
    pub fn loss(&self) -> Loss {
        Loss::Ep { max_retries: self.max_retries, backoff_ms: self.retry_backoff_s.saturating_mul(1000) }
    }

    /// Real priority of `decayed` core-seconds: 0.5 + usage in cores.
    pub fn real_priority(&self, decayed: f64) -> f64 {
        0.5 + decayed * std::f64::consts::LN_2 / self.half_life_s as f64
    }

    /// Each configured group's quota and cap in cores, for a pool of `pool_cores`.
    pub fn quotas(&self, pool_cores: u64) -> HashMap<String, GroupQuota> {
        self.groups
            .iter()
            .map(|(name, g)| {
                let quota = match (g.quota_cores, g.quota_share) {
                    (Some(c), _) => f64::from(c),
                    (None, Some(s)) => s * pool_cores as f64,
                    (None, None) => f64::INFINITY,
                };
                (name.clone(), GroupQuota { quota, cap: quota * g.oversubscribe })
            })
            .collect()
    }

    /// What `crate::matching::select` weighs this round.
    pub fn round(&self, eps: &EpTable, owners: &[UsageRow], max_running: Option<u64>, now_ms: u64) -> Policy {
        let half = self.half_life_s as f64;
        Policy {
            real_priority: owners
                .iter()
                .map(|u| (u.name.clone(), self.real_priority(decay(u.decayed, u.at_ms, now_ms, half))))
                .collect(),
            factor: owners.iter().map(|u| (u.name.clone(), u.factor)).collect(),
            max_running,
            quotas: self.quotas(eps.total_cpus()),
            now_ms,
        }
    }

    /// What `condor_userprio` shows, from the stored usage and what is reserved now.
    pub fn report(&self, eps: &EpTable, owners: &[UsageRow], groups: &[UsageRow], now_ms: u64) -> PriorityReport {
        let half = self.half_life_s as f64;
        let owner_cores = eps.cores_per_owner();
        let group_cores = eps.cores_per_group();
        let mut rows: BTreeMap<String, OwnerPriority> = BTreeMap::new();
        for u in owners {
            let decayed = decay(u.decayed, u.at_ms, now_ms, half);
            let real = self.real_priority(decayed);
            rows.insert(
                u.name.clone(),
                OwnerPriority {
                    owner: u.name.clone(),
                    effective_priority: real * u.factor,
                    real_priority: real,
                    factor: u.factor,
                    cores_in_use: owner_cores.get(u.name.as_str()).copied().unwrap_or(0),
                    decayed_core_hours: decayed / 3600.0,
                    accumulated_core_hours: u.core_seconds / 3600.0,
                },
            );
        }
        // Owners running their first jobs have no account yet.
        for (o, c) in &owner_cores {
            rows.entry((*o).to_owned()).or_insert_with(|| OwnerPriority {
                owner: (*o).to_owned(),
                effective_priority: 0.5,
                real_priority: 0.5,
                factor: 1.0,
                cores_in_use: *c,
                decayed_core_hours: 0.0,
                accumulated_core_hours: 0.0,
            });
        }
        let mut owners: Vec<OwnerPriority> = rows.into_values().collect();
        owners
            .sort_by(|a, b| a.effective_priority.total_cmp(&b.effective_priority).then_with(|| a.owner.cmp(&b.owner)));
        let quotas = self.quotas(eps.total_cpus());
        let mut gs: BTreeMap<String, GroupPriority> = BTreeMap::new();
        let names = self.groups.keys().cloned().chain(groups.iter().map(|g| g.name.clone()));
        for name in names.chain(group_cores.keys().map(|g| (*g).to_owned())) {
            let usage = groups.iter().find(|g| g.name == name);
            let q = quotas.get(&name);
            gs.entry(name.clone()).or_insert_with(|| GroupPriority {
                group: name.clone(),
                quota_cores: q.map(|q| q.quota),
                cap_cores: q.map(|q| q.cap),
                cores_in_use: group_cores.get(name.as_str()).copied().unwrap_or(0),
                decayed_core_hours: usage.map_or(0.0, |u| decay(u.decayed, u.at_ms, now_ms, half) / 3600.0),
                accumulated_core_hours: usage.map_or(0.0, |u| u.core_seconds / 3600.0),
            });
        }
        PriorityReport { half_life_s: self.half_life_s, owners, groups: gs.into_values().collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PolicyConfig {
        PolicyConfig {
            usage_half_life_s: DEFAULT_HALF_LIFE_S,
            lease_s: DEFAULT_LEASE_S,
            max_retries: DEFAULT_MAX_RETRIES,
            retry_backoff_s: DEFAULT_RETRY_BACKOFF_S,
            runtime_grace_s: DEFAULT_RUNTIME_GRACE_S,
            max_prefetch: DEFAULT_MAX_PREFETCH,
            renew_attach: true,
            ..PolicyConfig::default()
        }
    }

    #[test]
    fn bad_policies_are_refused_naming_the_key() {
        let group = |cores: Option<u32>, share: Option<f64>, over: f64| {
            let mut c = config();
            c.groups.insert("cms".into(), GroupConfig { quota_cores: cores, quota_share: share, oversubscribe: over });
            c
        };
        let cases = [
            (group(Some(4), Some(0.5), 1.0), "groups.cms: give exactly one of quota_cores and quota_share"),
            (group(None, None, 1.0), "groups.cms: give exactly one of quota_cores and quota_share"),
            (group(None, Some(1.5), 1.0), "groups.cms.quota_share must be within 0..=1"),
            (group(Some(4), None, 0.5), "groups.cms.oversubscribe must be within 1..=10"),
            (PolicyConfig { usage_half_life_s: 0, ..config() }, "usage_half_life_s must be at least 1"),
            (PolicyConfig { lease_s: 0, ..config() }, "lease_s must be at least 1"),
            (
                PolicyConfig {
                    job_classes: vec![JobClass { name: "short".into(), default_runtime_s: None, max_runtime_s: 10 }],
                    ..config()
                },
                "default_job_class must be set when job_classes are",
            ),
            (
                PolicyConfig {
                    job_classes: vec![JobClass {
                        name: "short".into(),
                        default_runtime_s: Some(11),
                        max_runtime_s: 10,
                    }],
                    default_job_class: Some("short".into()),
                    ..config()
                },
                "job_classes.short.default_runtime_s must be 1..=max_runtime_s",
            ),
            (
                PolicyConfig { default_job_class: Some("long".into()), ..config() },
                "default_job_class \"long\" is not one of job_classes",
            ),
        ];
        for (c, message) in cases {
            assert_eq!(c.resolve().map(|_| ()).map_err(|e| e.to_string()), Err(message.to_owned()));
        }
    }

    #[test]
    fn quotas_turn_shares_into_cores_and_caps_oversubscribe() {
        let mut c = config();
        c.groups.insert("lite".into(), GroupConfig { quota_cores: None, quota_share: Some(0.25), oversubscribe: 3.0 });
        c.groups.insert("cms".into(), GroupConfig { quota_cores: Some(4), quota_share: None, oversubscribe: 1.33 });
        let p = c.resolve().expect("valid");
        let q = p.quotas(16);
        assert_eq!(q["lite"], GroupQuota { quota: 4.0, cap: 12.0 });
        assert!((q["cms"].cap - 5.32).abs() < 1e-9);
    }

    #[test]
    fn real_priority_tends_to_the_cores_kept_busy() {
        let p = config().resolve().expect("valid");
        // Two cores busy for many half-lives: decayed usage converges to 2 × h / ln 2.
        let h = p.half_life_s as f64;
        let steady = 2.0 * h / std::f64::consts::LN_2;
        assert!((p.real_priority(steady) - 2.5).abs() < 1e-9);
        assert_eq!(p.real_priority(0.0), 0.5);
        // A day later, half of it is left.
        assert!((decay(steady, 0, p.half_life_s * 1000, h) - steady / 2.0).abs() < 1e-6);
    }
}
