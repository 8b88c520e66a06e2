//! Annexes over [`Shared`] (HTCondor's `condor_annex`): minting an annex's attach
//! token and keeping its record ([`crate::annex_store`]), recording the batch jobs started for
//! it, extending it, draining and deleting it, and telling its EPs when they must leave.
//!
//! - create: the request is checked again ([`AnnexRequest::check`]; the gateway checked it and
//!   the owner's annex right first), a name in use is 409, then one attach token is minted with
//!   this scheduler's attach key, bound to the annex and the owner (so its EPs run that owner's
//!   jobs of that annex only: [`crate::matching`]), and the record is on disk before the token
//!   is answered. The token itself is never kept.
//! - jobs: the provider's job ids are added to the record (so `htfaas annex list` shows them
//!   from any machine).
//! - extend: the annex now ends `lifetime_s` from now (longer or shorter), never past its token's
//!   expiry (409); every attached EP of the annex gets [`SchedulerMsg::Lifetime`] at once.
//! - drain: the annex is `draining`; its EPs are told to leave now (they finish their running
//!   jobs, take no new one, and exit, which ends their batch jobs).
//! - delete: its token is revoked ([`crate::revoke::revoke`]: recorded and audited, every session
//!   still attached with it closed, any later attach refused), then the record is removed.
//!
//! An EP of an annex with a record is sent the annex's end right after its `Welcome`
//! ([`on_attach`]), so one that was away during an extension, or attached after a restart,
//! learns it too. EPs are matched to an annex by the annex their token names.
//!
//! Must not know: HTTP routing, batch systems (the provider is a recorded name).

use crate::annex_store::AnnexStoreError;
use crate::failure::ApiFailure;
use crate::queue::now_ms;
use crate::state::Shared;
use htfaas_functions::manifest::check_name;
use htfaas_functions::proto::{
    AnnexCreated, AnnexDeleted, AnnexJobs, AnnexRecord, AnnexRequest, AnnexState, AnnexView, EpInfo, MAX_ANNEX_JOBS,
    MAX_ANNEX_LIFETIME_S, RevocationTarget, RevokeRequest, SchedulerMsg, check_annex_job_id,
};

impl From<AnnexStoreError> for ApiFailure {
    fn from(e: AnnexStoreError) -> ApiFailure {
        ApiFailure::internal("store the annex records", &e)
    }
}

fn checked_name(name: &str) -> Result<(), ApiFailure> {
    check_name(name).map_err(|e| ApiFailure::bad_request(format!("annex {e}")))
}

fn missing(name: &str) -> ApiFailure {
    ApiFailure::not_found(format!("no annex {name:?}"))
}

/// Mints annex `req.name`'s attach token and keeps its record (see the module docs).
#[tracing::instrument(name = "scheduler.annex_create", skip_all, fields(annex = %req.name, owner = %req.owner))]
pub(crate) async fn create(shared: &Shared, req: AnnexRequest) -> Result<AnnexCreated, ApiFailure> {
    req.check().map_err(|e| ApiFailure::bad_request(e.to_string()))?;
    let now = now_ms();
    let ttl_s = req.token_ttl();
    let created = shared
        .annexes
        .change(&req.name, |existing| {
            if existing.is_some() {
                return Err(ApiFailure::conflict(format!(
                    "annex {:?} exists; delete it first (htfaas annex delete {})",
                    req.name, req.name
                )));
            }
            let token = crate::attach::mint_attach_token(
                &shared.attach_key,
                &shared.name,
                &req.owner,
                Some(req.owner.clone()),
                Some(req.name.clone()),
                ttl_s,
            )
            .map_err(|e| ApiFailure::internal("mint the annex's attach token", &e))?;
            let jti = jti_of(&token).ok_or_else(|| ApiFailure::internal("mint", &"the token has no jti"))?;
            let record = AnnexRecord {
                name: req.name.clone(),
                owner: req.owner.clone(),
                provider: req.provider.clone(),
                count: req.count,
                cpus: req.cpus,
                memory_mb: req.memory_mb,
                idle_shutdown_s: req.idle_shutdown_s,
                partition: req.partition.clone(),
                created_ms: now,
                ends_ms: now.saturating_add(req.lifetime_s.saturating_mul(1000)),
                drain_s: req.drain_s(),
                token_jti: jti,
                token_exp_ms: now.saturating_add(ttl_s.saturating_mul(1000)),
                state: AnnexState::Active,
                jobs: Vec::new(),
            };
            Ok((Some(record.clone()), AnnexCreated { annex: record, attach_token: token }))
        })
        .await?;
    tracing::info!(jti = %created.annex.token_jti, ends_ms = created.annex.ends_ms, "annex created");
    Ok(created)
}

/// The `jti` of a token this scheduler just minted (read back from its payload).
fn jti_of(token: &str) -> Option<String> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?;
    let claims: htfaas_functions::token::AttachClaims = serde_json::from_slice(&bytes).ok()?;
    Some(claims.jti)
}

/// Adds the provider's job ids to annex `name`'s record.
pub(crate) async fn add_jobs(shared: &Shared, name: String, jobs: AnnexJobs) -> Result<AnnexRecord, ApiFailure> {
    checked_name(&name)?;
    for id in &jobs.jobs {
        check_annex_job_id(id).map_err(|e| ApiFailure::bad_request(e.to_string()))?;
    }
    shared
        .annexes
        .change(&name, |r| {
            let mut r = r.ok_or_else(|| missing(&name))?;
            for id in jobs.jobs {
                if !r.jobs.contains(&id) {
                    r.jobs.push(id);
                }
            }
            if r.jobs.len() > MAX_ANNEX_JOBS {
                return Err(ApiFailure::bad_request(format!("an annex keeps at most {MAX_ANNEX_JOBS} job ids")));
            }
            Ok((Some(r.clone()), r))
        })
        .await
}

/// Annex `name` now ends `lifetime_s` from now; its EPs are told.
#[tracing::instrument(name = "scheduler.annex_extend", skip_all, fields(annex = %name, lifetime_s))]
pub(crate) async fn extend(shared: &Shared, name: String, lifetime_s: u64) -> Result<AnnexRecord, ApiFailure> {
    checked_name(&name)?;
    if lifetime_s == 0 || lifetime_s > MAX_ANNEX_LIFETIME_S {
        return Err(ApiFailure::bad_request(format!("lifetime_s: must be 1..={MAX_ANNEX_LIFETIME_S}")));
    }
    let now = now_ms();
    let record = shared
        .annexes
        .change(&name, |r| {
            let mut r = r.ok_or_else(|| missing(&name))?;
            if r.state == AnnexState::Draining {
                return Err(ApiFailure::conflict(format!("annex {name:?} is being deleted")));
            }
            let ends = now.saturating_add(lifetime_s.saturating_mul(1000));
            if ends > r.token_exp_ms {
                return Err(ApiFailure::conflict(format!(
                    "annex {name:?} cannot outlive its attach token, which expires in {} s; create a new annex",
                    r.token_exp_ms.saturating_sub(now) / 1000
                )));
            }
            r.ends_ms = ends;
            Ok((Some(r.clone()), r))
        })
        .await?;
    let told = tell(shared, &record);
    tracing::info!(ends_ms = record.ends_ms, eps_told = told, "annex extended");
    Ok(record)
}

/// Annex `name` is being deleted: its EPs leave now (after their running jobs).
#[tracing::instrument(name = "scheduler.annex_drain", skip_all, fields(annex = %name))]
pub(crate) async fn drain(shared: &Shared, name: String) -> Result<AnnexView, ApiFailure> {
    checked_name(&name)?;
    let record = shared
        .annexes
        .change(&name, |r| {
            let mut r = r.ok_or_else(|| missing(&name))?;
            r.state = AnnexState::Draining;
            Ok::<_, ApiFailure>((Some(r.clone()), r))
        })
        .await?;
    let told = tell(shared, &record);
    tracing::info!(eps_told = told, "annex draining");
    Ok(view_of(shared, record))
}

/// Revokes annex `name`'s token (as `actor`) and removes its record.
#[tracing::instrument(name = "scheduler.annex_delete", skip_all, fields(annex = %name))]
pub(crate) async fn delete(shared: &Shared, name: String, actor: &str) -> Result<AnnexDeleted, ApiFailure> {
    checked_name(&name)?;
    let record = shared.annexes.get(&name).ok_or_else(|| missing(&name))?;
    let req = RevokeRequest {
        target: RevocationTarget::Jti(record.token_jti.clone()),
        reason: format!("annex {name} deleted"),
    };
    let revocation = crate::revoke::revoke(shared, req, actor).await?;
    let removed = shared.annexes.change(&name, |r| Ok::<_, ApiFailure>((None, r))).await?.unwrap_or(record);
    tracing::info!(closed = revocation.closed_eps.len(), "annex deleted; its token is revoked");
    Ok(AnnexDeleted { annex: removed, revocation })
}

/// Annex `name` with its attached EPs.
pub(crate) fn view(shared: &Shared, name: &str) -> Result<AnnexView, ApiFailure> {
    checked_name(name)?;
    let record = shared.annexes.get(name).ok_or_else(|| missing(name))?;
    Ok(view_of(shared, record))
}

/// Every annex with its attached EPs.
pub(crate) fn views(shared: &Shared) -> Vec<AnnexView> {
    let eps = shared.eps().infos();
    shared.annexes.list().into_iter().map(|annex| AnnexView { eps: eps_of(&eps, &annex.name), annex }).collect()
}

fn view_of(shared: &Shared, annex: AnnexRecord) -> AnnexView {
    let eps = shared.eps().infos();
    AnnexView { eps: eps_of(&eps, &annex.name), annex }
}

fn eps_of(eps: &[EpInfo], annex: &str) -> Vec<EpInfo> {
    eps.iter().filter(|e| e.session.is_some() && e.annex.as_deref() == Some(annex)).cloned().collect()
}

/// What a new session of `annex` learns of it, when the scheduler keeps a record of it.
pub(crate) struct OnAttach {
    /// What it is told after its `Welcome`: when to leave.
    pub(crate) lifetime: SchedulerMsg,
    /// When its EPs leave, Unix ms: no job that would still run then is placed on them.
    pub(crate) leaves_ms: u64,
    /// The annex's end, Unix ms: no attach token of it is renewed past it.
    pub(crate) ends_ms: u64,
}

/// What a new session of `annex` learns of it: `None` when the scheduler keeps no record of it.
pub(crate) fn on_attach(shared: &Shared, annex: Option<&str>) -> Option<OnAttach> {
    let record = shared.annexes.get(annex?)?;
    let now = now_ms();
    let leave_in_ms = record.leave_in_ms(now);
    Some(OnAttach {
        lifetime: SchedulerMsg::Lifetime { leave_in_ms },
        leaves_ms: now.saturating_add(leave_in_ms),
        ends_ms: record.ends_ms,
    })
}

/// The end of `annex`, Unix ms, when the scheduler keeps a record of it (read anew at each
/// attach-token renewal: an annex extended since lets its tokens live longer).
pub(crate) fn ends_ms(shared: &Shared, annex: Option<&str>) -> Option<u64> {
    Some(shared.annexes.get(annex?)?.ends_ms)
}

/// Sends the annex's end to every attached EP of it, and places by it from now on; how many
/// were told.
fn tell(shared: &Shared, record: &AnnexRecord) -> usize {
    let now = now_ms();
    let leave_in_ms = record.leave_in_ms(now);
    let msg = SchedulerMsg::Lifetime { leave_in_ms };
    shared.eps().set_annex_end(&record.name, now.saturating_add(leave_in_ms), &msg)
}
