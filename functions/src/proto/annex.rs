//! Annexes (after HTCondor's `condor_annex`): EPs an owner asks a batch system for, for
//! a lifetime, that attach back with one attach token bound to the annex and the owner. The
//! scheduler keeps one [`AnnexRecord`] per annex (the token's `jti`, when the annex ends, the
//! batch jobs it was given); the gateway's API is the front door (`/v1/annexes`, admin), which
//! checks the owner's annex right before the scheduler mints anything.
//!
//! | route (gateway, proxied to the scheduler) | body | answer |
//! |---|---|---|
//! | `POST /v1/annexes` | [`AnnexRequest`] | 201 [`AnnexCreated`] (the token, once) |
//! | `GET /v1/annexes` | — | every [`AnnexView`] |
//! | `GET /v1/annexes/{name}` | — | its [`AnnexView`] |
//! | `POST /v1/annexes/{name}/jobs` | [`AnnexJobs`] | the [`AnnexRecord`] with the jobs added |
//! | `POST /v1/annexes/{name}/extend` | [`AnnexExtend`] | the [`AnnexRecord`], its EPs told |
//! | `POST /v1/annexes/{name}/drain` | — | the [`AnnexView`]: its EPs told to leave now |
//! | `POST /v1/annexes/{name}/delete` | — | [`AnnexDeleted`]: its token revoked, the record gone |
//!
//! Must not know: how a batch system is asked (the provider is a name here), how records are
//! stored, the attach conversation (its [`super::SchedulerMsg::Lifetime`] carries the end).

use super::EpInfo;
use crate::manifest::{MAX_CPUS, MAX_MEMORY_MB, check_name};
use serde::{Deserialize, Serialize};

/// Most batch jobs (EPs) one annex asks for at once.
pub const MAX_ANNEX_COUNT: u32 = 1000;
/// Most batch job ids one annex record keeps (creation and later additions together).
pub const MAX_ANNEX_JOBS: usize = 10_000;
/// Longest batch job id kept, bytes.
pub const MAX_ANNEX_JOB_ID_BYTES: usize = 64;
/// Shortest annex lifetime, seconds (a batch system's time limit is in whole minutes).
pub const MIN_ANNEX_LIFETIME_S: u64 = 60;
/// Longest annex lifetime, seconds (30 days).
pub const MAX_ANNEX_LIFETIME_S: u64 = 30 * 24 * 3600;
/// Longest life of an annex's attach token, seconds (90 days, HTCondor's annex token).
pub const MAX_ANNEX_TOKEN_TTL_S: u64 = 90 * 24 * 3600;

/// `POST /v1/annexes` (admin): mint an attach token for annex `name`, bound to `owner`, and
/// keep the annex's record. The gateway refuses (403) unless `owner` holds the annex right
/// for `name` in its namespace; the scheduler refuses (409) a name already in use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnnexRequest {
    /// The annex: `[a-z0-9][a-z0-9_-]{0,62}`, the name functions ask for (`annex` in a
    /// manifest).
    pub name: String,
    /// Whose annex it is: its EPs run this owner's jobs only.
    pub owner: String,
    /// Who provides the EPs (`slurm`); recorded, so that `list`, `extend` and `delete` know
    /// whom to ask.
    pub provider: String,
    /// EPs (batch jobs) asked for.
    pub count: u32,
    /// Cores of each EP.
    pub cpus: u32,
    /// Memory of each EP's batch job, MiB.
    pub memory_mb: u64,
    /// How long the annex lives from now, seconds: its EPs leave by then, and each batch job's
    /// time limit is this, so the resources stop even if nothing else does.
    pub lifetime_s: u64,
    /// An EP leaves after running no job for this long, seconds. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_shutdown_s: Option<u64>,
    /// The batch system's partition (queue). Default: its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Life of the attach token, seconds: the annex cannot be extended past it. Default: the
    /// lifetime plus a day; at least the lifetime, at most [`MAX_ANNEX_TOKEN_TTL_S`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ttl_s: Option<u64>,
}

/// Longest owner name, characters (as elsewhere in the scheduler's admin API).
pub const MAX_ANNEX_OWNER_CHARS: usize = 128;

impl AnnexRequest {
    /// Checks every field (the gateway before the namespace check, the scheduler again before
    /// it mints): the name and provider are names ([`check_name`]), the owner 1–128 printable
    /// characters, 1–[`MAX_ANNEX_COUNT`] EPs of 1–[`MAX_CPUS`] cores and 1–[`MAX_MEMORY_MB`]
    /// MiB, a lifetime within [`MIN_ANNEX_LIFETIME_S`]..=[`MAX_ANNEX_LIFETIME_S`], an idle
    /// shutdown within 1..=lifetime, a partition like a job id, and a token life within
    /// lifetime..=[`MAX_ANNEX_TOKEN_TTL_S`]. The message names the field.
    pub fn check(&self) -> Result<(), AnnexInvalid> {
        check_name(&self.name).map_err(|e| AnnexInvalid(format!("name: annex {e}")))?;
        let owner_chars = self.owner.chars().count();
        if owner_chars == 0 || owner_chars > MAX_ANNEX_OWNER_CHARS || self.owner.chars().any(char::is_control) {
            return Err(AnnexInvalid(format!("owner: want 1-{MAX_ANNEX_OWNER_CHARS} printable characters")));
        }
        check_name(&self.provider).map_err(|e| AnnexInvalid(format!("provider: {e}")))?;
        if self.count == 0 || self.count > MAX_ANNEX_COUNT {
            return Err(AnnexInvalid(format!("count: must be 1..={MAX_ANNEX_COUNT}")));
        }
        if self.cpus == 0 || self.cpus > MAX_CPUS {
            return Err(AnnexInvalid(format!("cpus: must be 1..={MAX_CPUS}")));
        }
        if self.memory_mb == 0 || self.memory_mb > MAX_MEMORY_MB {
            return Err(AnnexInvalid(format!("memory_mb: must be 1..={MAX_MEMORY_MB}")));
        }
        if !(MIN_ANNEX_LIFETIME_S..=MAX_ANNEX_LIFETIME_S).contains(&self.lifetime_s) {
            return Err(AnnexInvalid(format!("lifetime_s: must be {MIN_ANNEX_LIFETIME_S}..={MAX_ANNEX_LIFETIME_S}")));
        }
        if let Some(idle) = self.idle_shutdown_s
            && (idle == 0 || idle > self.lifetime_s)
        {
            return Err(AnnexInvalid("idle_shutdown_s: must be 1..=lifetime_s".into()));
        }
        if let Some(p) = &self.partition {
            check_annex_job_id(p)
                .map_err(|e| AnnexInvalid(format!("partition: {}", e.0.replacen("job id", "name", 1))))?;
        }
        if let Some(ttl) = self.token_ttl_s
            && !(self.lifetime_s..=MAX_ANNEX_TOKEN_TTL_S).contains(&ttl)
        {
            return Err(AnnexInvalid(format!("token_ttl_s: must be lifetime_s..={MAX_ANNEX_TOKEN_TTL_S}")));
        }
        Ok(())
    }

    /// The attach token's life: [`AnnexRequest::token_ttl_s`], or the lifetime plus a day
    /// (capped at [`MAX_ANNEX_TOKEN_TTL_S`]).
    pub fn token_ttl(&self) -> u64 {
        self.token_ttl_s.unwrap_or_else(|| self.lifetime_s.saturating_add(24 * 3600).min(MAX_ANNEX_TOKEN_TTL_S))
    }

    /// How long before the annex's end its EPs leave (drain), seconds: a tenth of the
    /// lifetime, within 30 s..=10 min.
    pub fn drain_s(&self) -> u64 {
        (self.lifetime_s / 10).clamp(30, 600)
    }
}

/// Where an annex is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnnexState {
    /// Its EPs take jobs until it ends.
    #[default]
    Active,
    /// Being deleted: its EPs were told to leave now (they finish their running jobs first).
    Draining,
}

/// An annex as the scheduler keeps it. Holds no credential: the token is named by its `jti`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnexRecord {
    /// The annex.
    pub name: String,
    /// Whose it is (its token's `owner`).
    pub owner: String,
    /// Who provides its EPs (`slurm`).
    pub provider: String,
    /// EPs asked for at creation.
    pub count: u32,
    /// Cores of each EP.
    pub cpus: u32,
    /// Memory of each EP's batch job, MiB.
    pub memory_mb: u64,
    /// Idle shutdown of its EPs, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_shutdown_s: Option<u64>,
    /// The batch system's partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Created, Unix ms.
    pub created_ms: u64,
    /// When the annex ends, Unix ms: set at creation (now + lifetime) and by each extension
    /// (now + the new lifetime); its EPs start leaving [`AnnexRecord::drain_s`] before.
    pub ends_ms: u64,
    /// How long before [`AnnexRecord::ends_ms`] its EPs leave (they drain: running jobs
    /// finish, no new one starts), seconds.
    pub drain_s: u64,
    /// Its attach token's `jti` (revoked when the annex is deleted).
    pub token_jti: String,
    /// When its attach token expires, Unix ms: the annex cannot be extended past it.
    pub token_exp_ms: u64,
    /// Where it is in its life.
    pub state: AnnexState,
    /// The batch jobs (ids as the provider names them) started for it.
    #[serde(default)]
    pub jobs: Vec<String>,
}

impl AnnexRecord {
    /// Milliseconds from `now_ms` until its EPs should leave (0: now).
    pub fn leave_in_ms(&self, now_ms: u64) -> u64 {
        if self.state == AnnexState::Draining {
            return 0;
        }
        self.ends_ms.saturating_sub(self.drain_s.saturating_mul(1000)).saturating_sub(now_ms)
    }
}

/// Answer to `POST /v1/annexes`: the record and the attach token its EPs dial in with. The
/// token is shown this once (the scheduler keeps its `jti` only): hand it to the batch jobs
/// through a channel only their owner reads (`htfaas annex create` passes it in the job's
/// environment, never in an argument or a file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnexCreated {
    /// The annex.
    pub annex: AnnexRecord,
    /// The attach token (JWT) bound to the annex and its owner.
    pub attach_token: String,
}

/// `POST /v1/annexes/{name}/jobs` (admin): the batch jobs started for the annex, recorded so
/// that `htfaas annex list` shows them from any machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnnexJobs {
    /// Job ids, 1–[`MAX_ANNEX_JOB_ID_BYTES`] bytes of `[A-Za-z0-9._-]` each.
    pub jobs: Vec<String>,
}

/// `POST /v1/annexes/{name}/extend` (admin): the annex now ends `lifetime_s` from now (longer
/// or shorter); its attached EPs are told at once, later ones when they attach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnnexExtend {
    /// Seconds from now.
    pub lifetime_s: u64,
}

/// An annex with the EPs attached with its name now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnexView {
    /// The record.
    pub annex: AnnexRecord,
    /// Its attached EPs (their attach token names the annex).
    pub eps: Vec<EpInfo>,
}

/// Answer to `POST /v1/annexes/{name}/delete`: the record as it was, and the revocation of its
/// token (which closed the sessions still attached with it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnexDeleted {
    /// The record, as it was last.
    pub annex: AnnexRecord,
    /// The revocation of its attach token.
    pub revocation: super::Revocation,
}

/// Why a job id is refused: empty, longer than [`MAX_ANNEX_JOB_ID_BYTES`], or a character
/// outside `[A-Za-z0-9._-]` (what Slurm's, HTCondor's and Kubernetes' ids are made of).
pub fn check_annex_job_id(id: &str) -> Result<(), AnnexInvalid> {
    if id.is_empty() || id.len() > MAX_ANNEX_JOB_ID_BYTES {
        return Err(AnnexInvalid(format!("job id {id:?}: want 1-{MAX_ANNEX_JOB_ID_BYTES} bytes")));
    }
    if !id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err(AnnexInvalid(format!("job id {id:?}: want [A-Za-z0-9._-]")));
    }
    Ok(())
}

/// Why an annex request ([`AnnexRequest::check`]) or a batch system's job id
/// ([`check_annex_job_id`]) is refused; the message names the field and what it wants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AnnexInvalid(String);

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AnnexRecord {
        AnnexRecord {
            name: "a".into(),
            owner: "alice".into(),
            provider: "slurm".into(),
            count: 1,
            cpus: 1,
            memory_mb: 512,
            idle_shutdown_s: None,
            partition: None,
            created_ms: 0,
            ends_ms: 100_000,
            drain_s: 30,
            token_jti: "j".into(),
            token_exp_ms: 200_000,
            state: AnnexState::Active,
            jobs: vec![],
        }
    }

    #[test]
    fn an_annex_ep_leaves_its_drain_window_before_the_end_and_at_once_when_draining() {
        let mut r = record();
        assert_eq!(r.leave_in_ms(0), 70_000);
        assert_eq!(r.leave_in_ms(69_000), 1_000);
        assert_eq!(r.leave_in_ms(99_000), 0);
        r.state = AnnexState::Draining;
        assert_eq!(r.leave_in_ms(0), 0);
    }

    #[test]
    fn job_ids_are_plain() {
        for ok in ["1", "123_4", "cluster.17", "a-b"] {
            assert!(check_annex_job_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1 2", "1;rm", "x/y", &"9".repeat(65)] {
            assert!(check_annex_job_id(bad).is_err(), "{bad}");
        }
    }

    fn request() -> AnnexRequest {
        serde_json::from_str(r#"{"name":"bob-gpu","owner":"bob","provider":"slurm","count":2,"cpus":4,"memory_mb":8192,"lifetime_s":3600}"#)
            .expect("parses")
    }

    #[test]
    fn requests_are_checked_field_by_field() {
        assert_eq!(request().check(), Ok(()));
        assert_eq!(request().token_ttl(), 3600 + 86400);
        assert_eq!(request().drain_s(), 360);
        type Spoil = fn(&mut AnnexRequest);
        let bad: [(&str, Spoil); 10] = [
            ("name", |r| r.name = "Bob GPU".into()),
            ("owner", |r| r.owner = String::new()),
            ("provider", |r| r.provider = "../x".into()),
            ("count", |r| r.count = 0),
            ("cpus", |r| r.cpus = MAX_CPUS + 1),
            ("memory_mb", |r| r.memory_mb = 0),
            ("lifetime_s", |r| r.lifetime_s = 59),
            ("idle_shutdown_s", |r| r.idle_shutdown_s = Some(3601)),
            ("partition", |r| r.partition = Some("a b".into())),
            ("token_ttl_s", |r| r.token_ttl_s = Some(60)),
        ];
        for (field, spoil) in bad {
            let mut r = request();
            spoil(&mut r);
            let e = r.check().expect_err(field);
            assert!(e.to_string().starts_with(&format!("{field}:")), "{field}: {e}");
        }
    }

    #[test]
    fn requests_refuse_unknown_fields() {
        let ok = r#"{"name":"a","owner":"o","provider":"slurm","count":1,"cpus":1,"memory_mb":1,"lifetime_s":60}"#;
        let r: AnnexRequest = serde_json::from_str(ok).expect("parses");
        assert_eq!((r.idle_shutdown_s, r.partition, r.token_ttl_s), (None, None, None));
        let typo = ok.replace("\"count\"", "\"cuont\"");
        assert!(serde_json::from_str::<AnnexRequest>(&typo).is_err());
    }
}
