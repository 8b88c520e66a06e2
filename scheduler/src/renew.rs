//! Renewing a running job's macaroons: an EP's
//! [`EpMsg::Renew`](htfaas_functions::proto::EpMsg::Renew) becomes a request to
//! the gateway with the job's renewal grant, and its answer, attenuated as the assignment's
//! macaroons were, goes back as [`SchedulerMsg::Renewed`] (or [`SchedulerMsg::RenewRefused`]).
//!
//! Why the EP asks, and when: the scheduler hands out the macaroons the gateway obtained when the
//! event fired, untouched but for the caveats of [`crate::dispatch::restrict`]; dispatch stays a
//! local write, with no round trip to the gateway and the storage per job (dispatch rates of
//! thousands of jobs a second, and a gateway or storage outage does not stop jobs whose
//! macaroons are fresh). The EP, which uses the macaroons and sees their `before:` caveats,
//! asks only when they would expire before it is done with them: before its input fetch when the
//! job waited in the queue past them, and while the job runs past them ([`crate::ep_link`]).
//!
//! Checks, in order, each refusal answered with its reason and recorded (`macaroons.renewal`,
//! actor: the EP's name):
//! 1. the session holds the job (assigned here, not told to stop) and renews none of it already
//!    ([`crate::matching::EpTable::begin_renewal`]; a refusal here also counts as a bad frame of
//!    the session, so an EP cannot flood the trail);
//! 2. the store has the job running on this session ([`crate::queue::Queue::renewal_facts`]);
//! 3. the job's submit token (its `jti`, owner, issuer) is not revoked;
//! 4. the job is within its run time: now is before its dispatch + `runtime_s` (its request's,
//!    which submit bounded by the token's `runtime_s` and the job class's maximum) +
//!    [`crate::dispatch::MACAROON_GRACE_S`], the deadline its macaroons are cut to;
//! 5. the job has a renewal grant (the gateway gave one) and the scheduler knows the gateway
//!    ([`crate::Config::gateway_url`], called through [`crate::gateway_client`]);
//! 6. the gateway renews (its own checks: the grant, revocation, namespace, the storage); then
//!    the revocation is checked again, so one made during the round trip refuses the answer.
//!
//! The new macaroons get the same `before:` (the job's dispatch + run time + grace) and, when
//! the job asked for it, the same `ip:` binding to the EP's address as the assignment's. A job
//! without an input (a run on no file) asks for no input and gets the write macaroon alone: a
//! gateway answer with a read macaroon for it (or without one for a job with an input) is
//! refused ([`answer_fits`]).
//!
//! Must not know: SQL, the WebSocket, the EP's reasons for asking.

use crate::dispatch::{MACAROON_GRACE_S, restrict};
use crate::queue::RenewalFacts;
use crate::state::Shared;
use htfaas_functions::audit::{AuditDraft, Subject};
use htfaas_functions::proto::{RenewRequest, RenewResponse, SchedulerMsg};
use std::net::IpAddr;
use std::sync::Arc;

/// Checks 3 to 5 of the module docs on `facts` at `now_ms`, with the job's revocation reason
/// (if any) and whether a gateway is configured. `Err` is the refusal.
pub fn decide<'a>(
    facts: &'a RenewalFacts,
    now_ms: u64,
    revoked: Option<&str>,
    gateway: bool,
) -> Result<&'a str, String> {
    if let Some(reason) = revoked {
        return Err(format!("the job's token is revoked: {reason}"));
    }
    let deadline_ms =
        facts.started_at_ms.saturating_add(facts.runtime_s.saturating_add(MACAROON_GRACE_S).saturating_mul(1000));
    if now_ms >= deadline_ms {
        return Err(format!("the job is past its run time of {} s", facts.runtime_s));
    }
    let Some(grant) = &facts.request.renewal else {
        return Err("the job has no renewal grant".into());
    };
    if !gateway {
        return Err("this scheduler has no gateway_url to renew with".into());
    }
    Ok(&grant.0)
}

/// Answers one [`EpMsg::Renew`](htfaas_functions::proto::EpMsg::Renew) of session `ep_id`
/// for `job_id` (check 1 done: the session holds the job, as `name` at `ip`), then ends the
/// renewal in the EP table with the reply.
pub(crate) async fn renew(shared: Arc<Shared>, ep_id: String, name: String, ip: IpAddr, job_id: String) {
    let (reply, subject, refused) = match renewed(&shared, &ep_id, &name, ip, &job_id).await {
        Ok((subject, Fresh { input_macaroon, output_macaroon, checkpoint_macaroon, ref_macaroons })) => {
            tracing::info!(job.id = %job_id, "macaroons renewed");
            let renewed = SchedulerMsg::Renewed {
                job_id: job_id.clone(),
                input_macaroon,
                output_macaroon,
                checkpoint_macaroon,
                ref_macaroons,
            };
            (renewed, subject, None)
        }
        Err((subject, reason)) => {
            tracing::warn!(job.id = %job_id, "renewal refused: {reason}");
            (SchedulerMsg::RenewRefused { job_id: job_id.clone(), reason: reason.clone() }, subject, Some(reason))
        }
    };
    record(&shared, subject, &name, refused.as_deref()).await;
    shared.eps().end_renewal(&ep_id, &job_id, reply);
}

/// Records a renewal that check 1 refused (the session does not hold the job) and answers it.
pub(crate) async fn refuse(shared: Arc<Shared>, ep_id: String, name: String, job_id: String, reason: String) {
    let subject = Subject { job: Some(job_id.clone()), ..Subject::default() };
    record(&shared, subject, &name, Some(&reason)).await;
    shared.eps().send(&ep_id, SchedulerMsg::RenewRefused { job_id, reason });
}

async fn record(shared: &Shared, subject: Subject, ep: &str, refused: Option<&str>) {
    let draft = AuditDraft::macaroons_renewal(subject, ep, ep, refused, &[]);
    if let Err(e) = shared.queue.record_renewal(draft).await {
        tracing::error!("failed to record a renewal in the audit trail: {e}");
    }
}

/// The renewed macaroons, attenuated for the EP: the gateway's answer's shape.
type Fresh = RenewResponse;
type Renewed = Result<(Subject, Fresh), (Subject, String)>;

/// Whether the gateway's answer fits the job: a read macaroon exactly when the job has an
/// input, a checkpoint macaroon exactly when it has a checkpoint area, a read macaroon for each
/// of its `refs` reference files. `Err` is the refusal.
pub(crate) fn answer_fits(has_input: bool, has_area: bool, refs: usize, fresh: &RenewResponse) -> Result<(), String> {
    if fresh.ref_macaroons.len() != refs {
        return Err(format!(
            "the gateway answered {} macaroons for the job's {refs} reference files",
            fresh.ref_macaroons.len()
        ));
    }
    match (has_input, fresh.input_macaroon.is_some()) {
        (false, true) => return Err("the gateway answered a read macaroon for a job without an input".into()),
        (true, false) => return Err("the gateway answered no read macaroon for the job's input".into()),
        _ => {}
    }
    match (has_area, fresh.checkpoint_macaroon.is_some()) {
        (false, true) => Err("the gateway answered a checkpoint macaroon for a job without a checkpoint area".into()),
        (true, false) => Err("the gateway answered no checkpoint macaroon for the job's checkpoint area".into()),
        _ => Ok(()),
    }
}

/// Checks 2 to 6; the new macaroons, or the refusal, each with the job's audit subject.
async fn renewed(shared: &Shared, ep_id: &str, name: &str, ip: IpAddr, job_id: &str) -> Renewed {
    let bare = || Subject { job: Some(job_id.to_owned()), ..Subject::default() };
    let facts = match shared.queue.renewal_facts(job_id.to_owned(), ep_id.to_owned()).await {
        Ok(Ok(facts)) => facts,
        Ok(Err(why)) => return Err((bare(), why)),
        Err(e) => return Err((bare(), format!("the job store failed: {e}"))),
    };
    let subject = facts.subject.clone();
    let revoked = shared.queue.revoked_reason(&facts.credential);
    let now = crate::queue::now_ms();
    let grant = match decide(&facts, now, revoked.as_deref(), shared.gateway.is_some()) {
        Ok(grant) => grant.to_owned(),
        Err(why) => return Err((subject, why)),
    };
    let Some(gateway) = &shared.gateway else { return Err((subject, "no gateway".into())) };
    let r = &facts.request;
    let req = RenewRequest {
        job_id: job_id.to_owned(),
        ep: name.to_owned(),
        owner: facts.credential.owner.clone().unwrap_or_default(),
        token_jti: facts.credential.jti.clone(),
        digest: r.function.digest.clone(),
        input_url: r.input.as_ref().map(|i| i.url.clone()),
        output_url: r.output.url.clone(),
        checkpoint_url: r.checkpoint.as_ref().map(|c| c.url.clone()),
        ref_urls: r.refs.iter().map(|f| f.url.clone()).collect(),
    };
    let fresh = match gateway.renew(&grant, &req).await {
        Ok(fresh) => fresh,
        Err(why) => return Err((subject, why)),
    };
    if let Err(why) = answer_fits(r.input.is_some(), r.checkpoint.is_some(), r.refs.len(), &fresh) {
        return Err((subject, why));
    }
    // A revocation made while the gateway was asked refuses its answer.
    if let Some(reason) = shared.queue.revoked_reason(&facts.credential) {
        return Err((subject, format!("the job's token is revoked: {reason}")));
    }
    // Only its macaroons are read: the attempt (its trace span) does not matter here.
    let mut a = crate::queue::assignment(job_id.to_owned(), facts.request.clone(), 0);
    if let (Some(input), Some(read)) = (a.input.as_mut(), fresh.input_macaroon) {
        input.macaroon = read;
    }
    a.output.macaroon = fresh.output_macaroon;
    if let (Some(area), Some(m)) = (a.checkpoint.as_mut(), fresh.checkpoint_macaroon) {
        area.macaroon = m;
    }
    for (reference, m) in a.refs.iter_mut().zip(fresh.ref_macaroons) {
        reference.macaroon = m;
    }
    let bind = facts.request.bind_ep_address.then_some(ip);
    match restrict(a, facts.started_at_ms / 1000, bind) {
        Ok(a) => Ok((
            subject,
            Fresh {
                input_macaroon: a.input.map(|i| i.macaroon),
                output_macaroon: a.output.macaroon,
                checkpoint_macaroon: a.checkpoint.map(|c| c.macaroon),
                ref_macaroons: a.refs.into_iter().map(|r| r.macaroon).collect(),
            },
        )),
        Err(e) => Err((subject, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::revocation::Credential;
    use htfaas_functions::proto::RenewalGrant;

    fn facts(grant: bool) -> RenewalFacts {
        let mut request = crate::testing::request("k");
        request.renewal = grant.then(|| RenewalGrant("grant".into()));
        RenewalFacts {
            credential: Credential { jti: "j".into(), owner: Some("alice".into()), issuer: "gw".into() },
            started_at_ms: 1_000_000,
            runtime_s: 60,
            request,
            subject: Subject::default(),
        }
    }

    /// Checks 3 to 5, each refusing: a revoked token, a job past its run time (plus the
    /// macaroons' grace), a job without a grant, a scheduler without a gateway.
    #[test]
    fn a_renewal_is_refused_when_revoked_past_its_run_time_or_without_a_grant() {
        let f = facts(true);
        let within = f.started_at_ms + 60_000;
        assert_eq!(decide(&f, within, None, true), Ok("grant"));
        let e = decide(&f, within, Some("leaked"), true).expect_err("revoked");
        assert_eq!(e, "the job's token is revoked: leaked");
        let deadline = f.started_at_ms + (60 + MACAROON_GRACE_S) * 1000;
        assert_eq!(decide(&f, deadline - 1, None, true), Ok("grant"));
        let e = decide(&f, deadline, None, true).expect_err("past its run time");
        assert_eq!(e, "the job is past its run time of 60 s");
        let e = decide(&facts(false), within, None, true).expect_err("no grant");
        assert_eq!(e, "the job has no renewal grant");
        let e = decide(&f, within, None, false).expect_err("no gateway");
        assert!(e.contains("no gateway_url"), "{e}");
    }

    /// The gateway's answer is taken only when it fits the job: a job without an input gets no
    /// read macaroon (one answered for it is refused), a job with an input needs one.
    #[test]
    fn a_renewal_answer_with_a_read_macaroon_for_a_job_without_an_input_is_refused() {
        let answer = |read: Option<&str>| RenewResponse {
            input_macaroon: read.map(str::to_owned),
            output_macaroon: "w".into(),
            checkpoint_macaroon: None,
            ref_macaroons: Vec::new(),
        };
        assert_eq!(answer_fits(false, false, 0, &answer(None)), Ok(()));
        assert_eq!(answer_fits(true, false, 0, &answer(Some("r"))), Ok(()));
        let e = answer_fits(false, false, 0, &answer(Some("r"))).expect_err("a read macaroon for no input");
        assert!(e.contains("read macaroon for a job without an input"), "{e}");
        assert!(answer_fits(true, false, 0, &answer(None)).is_err(), "no read macaroon for an input");
        // And a checkpoint macaroon exactly for a job with a checkpoint area.
        let e = answer_fits(true, true, 0, &answer(Some("r"))).expect_err("no checkpoint macaroon");
        assert!(e.contains("no checkpoint macaroon"), "{e}");
        let with_area = RenewResponse { checkpoint_macaroon: Some("c".into()), ..answer(Some("r")) };
        assert_eq!(answer_fits(true, true, 0, &with_area), Ok(()));
        assert!(answer_fits(true, false, 0, &with_area).is_err(), "a checkpoint macaroon for a job without an area");
        // And a read macaroon for each reference file, no more, no fewer.
        let with_refs = RenewResponse { ref_macaroons: vec!["a".into(), "b".into()], ..answer(Some("r")) };
        assert_eq!(answer_fits(true, false, 2, &with_refs), Ok(()));
        let e = answer_fits(true, false, 3, &with_refs).expect_err("one missing");
        assert_eq!(e, "the gateway answered 2 macaroons for the job's 3 reference files");
        assert!(answer_fits(true, false, 1, &with_refs).is_err(), "one too many");
    }
}
