//! The constructor of every record kind the gateway and the scheduler write
//! ([`AuditDraft::token_minted`], [`AuditDraft::job_finished`], …): each turns the facts of a
//! decision (claims, wire types) into a draft, and documents what goes into its `detail`.
//!
//! Above both [`crate::audit`] (which knows no wire type) and [`crate::proto`] (which carries
//! audit records): must not know SQLite, the chain or the verifier.

use crate::audit::{AuditDraft, AuditKind, MacaroonFacts, Subject};
use crate::identity_map::{Identity, Mapped};
use crate::proto::{Outcome, OutputFile, ReferenceRead, Revocation, RevocationTarget, Usage};
use crate::resources::Resources;
use crate::token::{AttachClaims, SubmitClaims};
use serde_json::{Map, Value};

fn opt(s: &Option<String>) -> Value {
    s.as_ref().map_or(Value::Null, |s| Value::String(s.clone()))
}

impl AuditDraft {
    /// `token.minted` for a submit token, from its claims (the signed token is never seen).
    /// Subject: `jti`, owner (`sub`), digest (the `function` claim). Detail: `{type: "submit",
    /// iss, aud, iat, exp, jobs, cpus, memory_mb, runtime_s, group}`. `subject` adds what the
    /// caller knows (event id, function name).
    pub fn token_minted(claims: &SubmitClaims, subject: Subject) -> AuditDraft {
        let subject = Subject {
            token_jti: Some(claims.jti.clone()),
            owner: Some(claims.sub.clone()),
            digest: claims.function.as_ref().map(|d| d.as_str().to_owned()).or(subject.digest.clone()),
            ..subject
        };
        let detail = serde_json::json!({
            "type": "submit", "iss": claims.iss, "aud": claims.aud, "iat": claims.iat, "exp": claims.exp,
            "jobs": claims.jobs, "cpus": claims.cpus, "memory_mb": claims.memory_mb,
            "runtime_s": claims.runtime_s, "group": opt(&claims.group),
        });
        AuditDraft::new(AuditKind::TokenMinted, subject, detail)
    }

    /// `token.minted` for an attach token. Subject: `jti`, owner (the EP's `owner` claim).
    /// Detail: `{type: "attach", iss, sub, aud, iat, exp, annex}`.
    pub fn attach_token_minted(claims: &AttachClaims) -> AuditDraft {
        let subject =
            Subject { token_jti: Some(claims.jti.clone()), owner: claims.owner.clone(), ..Subject::default() };
        let detail = serde_json::json!({
            "type": "attach", "iss": claims.iss, "sub": claims.sub, "aud": claims.aud,
            "iat": claims.iat, "exp": claims.exp, "annex": opt(&claims.annex),
        });
        AuditDraft::new(AuditKind::TokenMinted, subject, detail)
    }

    /// `macaroons.obtained`. Subject: as the caller knows it (event, function, owner, token,
    /// input path), plus `reaches`: the paths the macaroons reach, as the storage that issued
    /// them reads their caveats. A `path:` caveat alone does not say that: dCache reads a
    /// later one relative to the one before (a directory's base, then `path:/a.dat`), XRootD
    /// each one whole, so only the caller, which knows the storage, can resolve them. Detail:
    /// `{macaroons: [{role, identifier, caveats}]}`; see [`MacaroonFacts::from_bearer`].
    pub fn macaroons_obtained(mut subject: Subject, macaroons: &[MacaroonFacts], reaches: &[&str]) -> AuditDraft {
        for path in reaches {
            if !subject.paths.iter().any(|p| p == path) {
                subject.paths.push((*path).to_owned());
            }
        }
        AuditDraft::new(AuditKind::MacaroonsObtained, subject, serde_json::json!({ "macaroons": macaroons }))
    }

    /// `job.accepted`. Subject: job, token, owner, function, digest, event, input path.
    /// Detail: `{resources, group}`.
    pub fn job_accepted(subject: Subject, resources: &Resources, group: Option<&str>) -> AuditDraft {
        let detail = serde_json::json!({ "resources": resources, "group": group });
        AuditDraft::new(AuditKind::JobAccepted, subject, detail)
    }

    /// `job.refused`. Subject: as known (token, owner, function, event). Detail: `{status,
    /// reason}` (the HTTP status answered and the refusal's message).
    pub fn job_refused(subject: Subject, status: u16, reason: &str) -> AuditDraft {
        AuditDraft::new(AuditKind::JobRefused, subject, serde_json::json!({ "status": status, "reason": reason }))
    }

    /// `job.held`. Subject: the job (and what else is known). Detail: `{reason, hold_code}`.
    /// An admin's hold adds [`AuditDraft::with_actor`].
    pub fn job_held(subject: Subject, reason: &str, hold_code: Option<i64>) -> AuditDraft {
        AuditDraft::new(AuditKind::JobHeld, subject, serde_json::json!({ "reason": reason, "hold_code": hold_code }))
    }

    /// `job.released`, by an admin (add [`AuditDraft::with_actor`]). Subject: the job. Detail:
    /// `{reason}`.
    pub fn job_released(subject: Subject, reason: &str) -> AuditDraft {
        AuditDraft::new(AuditKind::JobReleased, subject, serde_json::json!({ "reason": reason }))
    }

    /// `job.removed`. Subject: the job. Detail: `{reason, state}` (the reason recorded with the
    /// job, and the state it was removed from). An admin's or a revocation's adds
    /// [`AuditDraft::with_actor`].
    pub fn job_removed(subject: Subject, reason: &str, from_state: &str) -> AuditDraft {
        let detail = serde_json::json!({ "reason": reason, "state": from_state });
        AuditDraft::new(AuditKind::JobRemoved, subject, detail)
    }

    /// `attempt.lost`: attempt `attempt` of the job, on EP `ep` (session `session`), ended
    /// without a report because `why`; `then` says what became of the job (`requeued`, `held`,
    /// `interrupted`, `kept`). Subject: the job.
    pub fn attempt_lost(subject: Subject, ep: &str, session: &str, attempt: u32, why: &str, then: &str) -> AuditDraft {
        let detail = serde_json::json!({ "ep": ep, "session": session, "attempt": attempt, "why": why, "then": then });
        AuditDraft::new(AuditKind::AttemptLost, subject, detail)
    }

    /// `job.dispatched`. Subject: the job. Detail: `{ep, session, attempt}`.
    pub fn job_dispatched(subject: Subject, ep: &str, session: &str, attempt: u32) -> AuditDraft {
        let detail = serde_json::json!({ "ep": ep, "session": session, "attempt": attempt });
        AuditDraft::new(AuditKind::JobDispatched, subject, detail)
    }

    /// `job.finished`, as the EP `ep` reported it: one record for what the run did. Subject: the
    /// job (whose paths hold its input), every output path and every reference file read, so a
    /// query by any of these files finds it. Detail: `{outcome, reason, usage, input: {path,
    /// bytes, sha256} | null, outputs: [{path, size, sha256}], refs?: [{path, bytes, sha256}]}`
    /// (the input's `sha256` as the EP read it, null when it did not read it whole; `refs` only
    /// when the job read reference files). The guest's log is not recorded.
    pub fn job_finished(
        mut subject: Subject,
        ep: &str,
        input: Option<(&str, u64, Option<&str>)>,
        outputs: &[OutputFile],
        refs: &[ReferenceRead],
        outcome: &Outcome,
        usage: &Usage,
    ) -> AuditDraft {
        // Each reference file by its storage path: the trail finds the runs that read it.
        let refs: Vec<Value> = refs
            .iter()
            .map(|r| serde_json::json!({ "path": format!("/{}", r.path), "bytes": r.size, "sha256": r.sha256 }))
            .collect();
        let read = refs.iter().filter_map(|r| r["path"].as_str());
        for path in outputs.iter().map(|o| o.path.as_str()).chain(read) {
            if !subject.paths.iter().any(|p| p == path) {
                subject.paths.push(path.to_owned());
            }
        }
        let input =
            input.map(|(path, bytes, sha256)| serde_json::json!({ "path": path, "bytes": bytes, "sha256": sha256 }));
        let mut detail = serde_json::json!({
            "outcome": outcome, "reason": outcome.reason(), "usage": usage, "input": input, "outputs": outputs,
        });
        if !refs.is_empty() {
            detail["refs"] = Value::Array(refs);
        }
        AuditDraft::new(AuditKind::JobFinished, subject, detail).with_actor(ep)
    }

    /// `macaroons.renewal`, by `actor` (the scheduler records the EP that asked, the
    /// gateway `scheduler`): the job's macaroons were renewed (`refused` null) or not (`refused`:
    /// why). Subject: the job (with what else is known: owner, token, function, paths). Detail:
    /// `{ep, refused, macaroons}`: the EP that asked, and, on the gateway, each new macaroon's
    /// identifier and caveats ([`MacaroonFacts::from_bearer`]; the scheduler passes none).
    pub fn macaroons_renewal(
        subject: Subject,
        actor: &str,
        ep: &str,
        refused: Option<&str>,
        macaroons: &[MacaroonFacts],
    ) -> AuditDraft {
        let detail = serde_json::json!({ "ep": ep, "refused": refused, "macaroons": macaroons });
        AuditDraft::new(AuditKind::MacaroonsRenewal, subject, detail).with_actor(actor)
    }

    /// `identity.mapped`: `identity` became owner `mapped.owner` (or its rule, groups or grants
    /// changed). Subject: the owner, the token's `jti` if it has one. Detail: `{issuer, sub,
    /// rule, groups, grants, first}` (`first`: the identity claimed the owner name now).
    pub fn identity_mapped(identity: &Identity, mapped: &Mapped, jti: Option<&str>, first: bool) -> AuditDraft {
        let subject =
            Subject { owner: Some(mapped.owner.clone()), token_jti: jti.map(str::to_owned), ..Subject::default() };
        let grants: Vec<String> = mapped.grants.iter().map(|g| format!("{} {}", g.right, g.value)).collect();
        let detail = serde_json::json!({
            "issuer": identity.issuer, "sub": identity.sub, "rule": mapped.rule,
            "groups": mapped.groups, "grants": grants, "first": first,
        });
        AuditDraft::new(AuditKind::IdentityMapped, subject, detail).with_actor(format!("oidc:{}", identity.sub))
    }

    /// `identity.refused`: a verified `identity` was not let in. Subject: the owner it would
    /// have become, if a rule got that far; the token's `jti`. Detail: `{issuer, sub, groups,
    /// reason}`.
    pub fn identity_refused(identity: &Identity, owner: Option<&str>, jti: Option<&str>, reason: &str) -> AuditDraft {
        let subject =
            Subject { owner: owner.map(str::to_owned), token_jti: jti.map(str::to_owned), ..Subject::default() };
        let detail = serde_json::json!({
            "issuer": identity.issuer, "sub": identity.sub, "groups": identity.groups, "reason": reason,
        });
        AuditDraft::new(AuditKind::IdentityRefused, subject, detail).with_actor(format!("oidc:{}", identity.sub))
    }

    /// `token.revoked`: actor `by`. Subject: the `jti` or owner named. Detail: the
    /// [`Revocation`] (target, reason, jobs removed and stopped, EP sessions closed).
    pub fn token_revoked(revocation: &Revocation) -> AuditDraft {
        let mut subject = Subject::default();
        match &revocation.target {
            RevocationTarget::Jti(jti) => subject.token_jti = Some(jti.clone()),
            RevocationTarget::Owner(owner) => subject.owner = Some(owner.clone()),
            RevocationTarget::Issuer(_) => {}
        }
        let detail = serde_json::to_value(revocation).unwrap_or(Value::Null);
        AuditDraft::new(AuditKind::TokenRevoked, subject, detail).with_actor(revocation.by.clone())
    }

    /// `admin.action`: `actor` did `action` (`hold`, `release`, `remove`, `drain`, `register`,
    /// …) to `subject`. Detail: `{action}` merged with `args` (an object; anything else is kept
    /// under `args`).
    pub fn admin_action(actor: &str, action: &str, subject: Subject, args: Value) -> AuditDraft {
        let mut detail = Map::new();
        match args {
            Value::Object(map) => detail.extend(map),
            Value::Null => {}
            other => {
                detail.insert("args".into(), other);
            }
        }
        detail.insert("action".into(), Value::String(action.to_owned()));
        AuditDraft::new(AuditKind::AdminAction, subject, Value::Object(detail)).with_actor(actor)
    }
}
