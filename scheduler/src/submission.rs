//! One submission's checks before the store, shared by `POST /v1/jobs` (one job, its token in
//! `Authorization`) and `POST /v1/jobs/batch` (each job with its own token): the token
//! (signature, `kid`, issuer, audience, expiry), revocation, the request (validity), its URLs
//! ([`crate::trust`]), the site policy and the token's limits, in that order. What passes is a
//! [`NewJob`] for the store, which checks revocation again, the dedupe key, the token's uses
//! and the idle limit in the transaction that writes it. On the way it gathers what a
//! refusal's audit record says ([`Known`]).
//!
//! Must not know: HTTP routing (`axum`), the store's SQL (`rusqlite`).

use crate::failure::ApiFailure;
use crate::metrics::{Reason, Token};
use crate::queue::NewJob;
use crate::revocation::Credential;
use crate::state::Shared;
use crate::validate::{bounded, validate};
use base64::Engine as _;
use htfaas_functions::audit::Subject;
use htfaas_functions::proto::SubmitRequest;
use htfaas_functions::token::SubmitClaims;

/// Longest claimed `jti` of an unverified token kept in a refusal's record, characters.
const MAX_UNVERIFIED_JTI_CHARS: usize = 128;

/// What a refused submission's audit record names: the verified token's `jti` and owner, the
/// request's function and event once it parsed, and details (the token's issuer, or an
/// unverified token's claimed `jti`). Never the token.
#[derive(Debug, Default)]
pub(crate) struct Known {
    /// The record's subject.
    pub(crate) subject: Subject,
    /// Its details.
    pub(crate) detail: serde_json::Map<String, serde_json::Value>,
}

/// A string claim read without verifying (only to pick the verifier, or to name a refused
/// token in its record).
pub(crate) fn unverified_claim(token: &str, name: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?;
    let claims: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes).ok()?;
    claims.get(name)?.as_str().map(str::to_owned)
}

/// Verifies a submit token (`None`: none was given) with the verifier of the issuer it
/// claims; counts each refusal by its reason.
pub(crate) fn verify_token(shared: &Shared, token: Option<&str>) -> Result<SubmitClaims, ApiFailure> {
    let refused = |reason| shared.metrics.refused(Token::Submit, reason);
    let token = token
        .ok_or_else(|| ApiFailure::unauthorized("missing bearer submit token"))
        .inspect_err(|_| refused(Reason::Missing))?;
    let iss = unverified_claim(token, "iss")
        .ok_or_else(|| ApiFailure::unauthorized("malformed token: no issuer"))
        .inspect_err(|_| refused(Reason::Malformed))?;
    let verifier = shared
        .submit_verifiers
        .get(&iss)
        .ok_or_else(|| ApiFailure::unauthorized(format!("untrusted issuer {iss:?}")))
        .inspect_err(|_| refused(Reason::UntrustedIssuer))?;
    verifier.verify::<SubmitClaims>(token).map_err(|e| {
        refused(Reason::of(&e));
        ApiFailure::unauthorized(format!("submit token refused: {e}"))
    })
}

/// A verified submit token that is not revoked (what preflight and warm check).
pub(crate) fn authorize(shared: &Shared, token: Option<&str>) -> Result<SubmitClaims, ApiFailure> {
    let claims = verify_token(shared, token)?;
    revoked(shared, &claims)?;
    Ok(claims)
}

/// 403 when the token, its owner or its issuer is revoked.
fn revoked(shared: &Shared, claims: &SubmitClaims) -> Result<(), ApiFailure> {
    match shared.queue.revoked_reason(&Credential::of_submit(claims)) {
        Some(reason) => {
            shared.metrics.refused(Token::Submit, Reason::Revoked);
            Err(crate::error::QueueError::Revoked { reason }.into())
        }
        None => Ok(()),
    }
}

/// The request against the token's limits (403).
pub(crate) fn check_limits(req: &SubmitRequest, c: &SubmitClaims) -> Result<(), ApiFailure> {
    let r = &req.resources;
    if r.cpus > c.cpus {
        return Err(ApiFailure::forbidden(format!("cpus {} exceeds the token's limit of {}", r.cpus, c.cpus)));
    }
    if r.memory_mb > c.memory_mb {
        return Err(ApiFailure::forbidden(format!(
            "memory_mb {} exceeds the token's limit of {}",
            r.memory_mb, c.memory_mb
        )));
    }
    if r.runtime_s > c.runtime_s {
        return Err(ApiFailure::forbidden(format!(
            "runtime_s {} exceeds the token's limit of {}",
            r.runtime_s, c.runtime_s
        )));
    }
    if let Some(d) = &c.function
        && *d != req.function.bound_digest()
    {
        let what = if req.function.native.is_some() { "function image and command" } else { "function digest" };
        return Err(ApiFailure::forbidden(format!("{what} {} is not the token's {}", req.function.bound_digest(), d)));
    }
    Ok(())
}

/// Checks one submission, `token` (`None`: none given) for the request `parse` yields (called
/// only once the token passed, so that an unauthenticated caller learns nothing of how its
/// body reads), and fills `known` for a refusal's record. The job for the store, or the answer.
pub(crate) fn check(
    shared: &Shared,
    token: Option<&str>,
    parse: impl FnOnce() -> Result<SubmitRequest, ApiFailure>,
    known: &mut Known,
) -> Result<NewJob, ApiFailure> {
    let claims = match verify_token(shared, token) {
        Ok(c) => c,
        Err(e) => {
            let jti = token.and_then(|t| unverified_claim(t, "jti"));
            if let Some(jti) = jti.filter(|j| !j.chars().any(char::is_control)) {
                let jti: String = jti.chars().take(MAX_UNVERIFIED_JTI_CHARS).collect();
                known.detail.insert("unverified_jti".into(), jti.into());
            }
            tracing::info!("refused: {}", e.message);
            return Err(e);
        }
    };
    (known.subject.token_jti, known.subject.owner) = (Some(claims.jti.clone()), Some(claims.sub.clone()));
    known.detail.insert("token_issuer".into(), claims.iss.clone().into());
    revoked(shared, &claims).inspect_err(|e| tracing::info!("refused: {}", e.message))?;
    let span = tracing::Span::current();
    span.record("owner", claims.sub.as_str());
    span.record("token.jti", claims.jti.as_str());
    let mut req = parse()?;
    if bounded(&req.function.name) && bounded(&req.event.id) && bounded(&req.event.path) {
        known.subject.function = Some(req.function.name.clone());
        known.subject.digest = Some(req.function.digest.as_str().to_owned());
        known.subject.event_id = Some(req.event.id.clone());
        known.subject.paths = vec![req.event.path.clone()];
    }
    if let Some(t) = req.event.trace_parent() {
        span.record("trace_id", tracing::field::display(t.trace_id_hex()));
    }
    validate(&req).map_err(|e| ApiFailure::bad_request(e.to_string()))?;
    // No URL is trusted for being handed over: the module, input and output must be the site's.
    shared.trust.check(&req).map_err(|e| ApiFailure::forbidden(e.to_string())).inspect_err(|e| {
        tracing::warn!("refused: {}", e.message);
    })?;
    // Policy first: it fills in a class's default run time, which the token must then allow.
    let admission = shared
        .policy
        .admit(&claims.sub, claims.group.as_deref(), &mut req)
        .map_err(|e| ApiFailure::forbidden(e.to_string()))
        .inspect_err(|e| tracing::info!("refused: {}", e.message))?;
    check_limits(&req, &claims).inspect_err(|e| {
        shared.metrics.refused(Token::Submit, Reason::OverLimits);
        tracing::info!("refused: {}", e.message)
    })?;
    Ok(NewJob {
        request: req,
        owner: claims.sub,
        jti: claims.jti,
        issuer: claims.iss,
        group: claims.group,
        jobs: claims.jobs,
        exp: claims.exp,
        max_idle: shared.limits.max_idle,
        class: admission.class,
        hold: admission.hold,
    })
}

/// Counts a store's refusal of a job by its reason (a used-up or revoked token).
pub(crate) fn count_refusal(shared: &Shared, e: &crate::error::QueueError) {
    match e {
        crate::error::QueueError::TokenUsed { .. } => shared.metrics.refused(Token::Submit, Reason::UsedUp),
        crate::error::QueueError::Revoked { .. } => shared.metrics.refused(Token::Submit, Reason::Revoked),
        _ => {}
    }
    tracing::info!("refused: {e}");
}
