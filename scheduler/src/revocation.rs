//! Revocation targets: which credentials a [`RevocationTarget`] names
//! ([`Credential::is_named_by`], the one place that decides it), the in-memory set of revoked
//! targets that makes every check O(1) ([`Revoked`]), their stored form and the bounds of a
//! request. [`crate::revoke`] applies one everywhere at once.
//!
//! A revocation is permanent. It refuses, from the moment it is made, every submit token and
//! attach token it names; takes the idle and held jobs of those submit tokens out of the queue
//! (a held job is not left to be released with a revoked token); stops
//! their running jobs ([`SchedulerMsg::Cancel`](htfaas_functions::proto::SchedulerMsg::Cancel)
//! to the EP, which answers with a `Finished` that is still charged); and closes the EP sessions
//! of the attach tokens it names (code [`CLOSE_FORBIDDEN`]), whose other jobs go back to idle.
//!
//! Must not know: the store, the EP table, sessions or HTTP.
//!
//! [`CLOSE_FORBIDDEN`]: crate::attach::CLOSE_FORBIDDEN

use htfaas_functions::proto::{RevocationTarget, RevokeRequest};
use htfaas_functions::token::{AttachClaims, SubmitClaims};
use std::collections::HashMap;

/// Subject of a site EP's attach token: it names no owner.
pub const SITE_SUBJECT: &str = "site";
/// Longest revoked value (a `jti`, owner or issuer), characters.
pub const MAX_VALUE_CHARS: usize = 256;
/// Longest revocation reason, characters.
pub const MAX_REASON_CHARS: usize = 1024;

/// A token as revocation sees it: its id, the owner it acts for, and who signed it. Built from
/// submit claims, attach claims, or a stored job (which keeps its submit token's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// The token's `jti`.
    pub jti: String,
    /// The owner: a submit token's `sub`; an attach token's `owner`, or its `sub` when that
    /// names an owner (is not [`SITE_SUBJECT`]).
    pub owner: Option<String>,
    /// The token's `iss`.
    pub issuer: String,
}

impl Credential {
    /// A submit token's credential.
    pub fn of_submit(c: &SubmitClaims) -> Credential {
        Credential { jti: c.jti.clone(), owner: Some(c.sub.clone()), issuer: c.iss.clone() }
    }

    /// An attach token's credential.
    pub fn of_attach(c: &AttachClaims) -> Credential {
        let owner = c.owner.clone().or_else(|| (c.sub != SITE_SUBJECT).then(|| c.sub.clone()));
        Credential { jti: c.jti.clone(), owner, issuer: c.iss.clone() }
    }

    /// Every target that revokes this credential.
    pub fn targets(&self) -> Vec<RevocationTarget> {
        let mut t = vec![RevocationTarget::Jti(self.jti.clone()), RevocationTarget::Issuer(self.issuer.clone())];
        t.extend(self.owner.clone().map(RevocationTarget::Owner));
        t
    }

    /// Whether `target` revokes this credential: the one definition of "matches".
    pub fn is_named_by(&self, target: &RevocationTarget) -> bool {
        self.targets().contains(target)
    }
}

/// The revoked targets and their reasons, loaded from the store at start.
#[derive(Debug, Default)]
pub struct Revoked {
    reasons: HashMap<RevocationTarget, String>,
}

impl Revoked {
    /// Adds `target`; a target revoked twice keeps its first reason.
    pub fn insert(&mut self, target: RevocationTarget, reason: String) {
        self.reasons.entry(target).or_insert(reason);
    }

    /// The reason `c` is revoked, if it is.
    pub fn reason_for(&self, c: &Credential) -> Option<&str> {
        c.targets().iter().find_map(|t| self.reasons.get(t)).map(String::as_str)
    }
}

/// The stored form of a target: `(kind, value)`.
pub fn target_parts(t: &RevocationTarget) -> (&'static str, &str) {
    match t {
        RevocationTarget::Jti(v) => ("jti", v),
        RevocationTarget::Owner(v) => ("owner", v),
        RevocationTarget::Issuer(v) => ("issuer", v),
    }
}

/// Reads [`target_parts`] back.
pub fn target_from_parts(kind: &str, value: String) -> Option<RevocationTarget> {
    match kind {
        "jti" => Some(RevocationTarget::Jti(value)),
        "owner" => Some(RevocationTarget::Owner(value)),
        "issuer" => Some(RevocationTarget::Issuer(value)),
        _ => None,
    }
}

/// Why a revocation request is refused ([`validate`], 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RevokeInvalid {
    /// The target's value is empty, too long or holds a control character (the target's kind).
    #[error("target {0}: value must be 1-{MAX_VALUE_CHARS} printable characters")]
    Target(&'static str),
    /// The reason is too long or holds a NUL.
    #[error("reason must be at most {MAX_REASON_CHARS} characters without NUL")]
    Reason,
}

/// Why a revocation request is refused (400).
pub fn validate(req: &RevokeRequest) -> Result<(), RevokeInvalid> {
    let (kind, value) = target_parts(&req.target);
    let n = value.chars().count();
    if n == 0 || n > MAX_VALUE_CHARS || value.chars().any(char::is_control) {
        return Err(RevokeInvalid::Target(kind));
    }
    if req.reason.chars().count() > MAX_REASON_CHARS || req.reason.contains('\0') {
        return Err(RevokeInvalid::Reason);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(owner: Option<&str>) -> Credential {
        Credential { jti: "j1".into(), owner: owner.map(str::to_owned), issuer: "gw".into() }
    }

    #[test]
    fn a_target_names_a_credential_by_jti_owner_or_issuer() {
        let c = cred(Some("alice"));
        for t in [
            RevocationTarget::Jti("j1".into()),
            RevocationTarget::Owner("alice".into()),
            RevocationTarget::Issuer("gw".into()),
        ] {
            assert!(c.is_named_by(&t), "{t:?}");
        }
        for t in [
            RevocationTarget::Jti("gw".into()),
            RevocationTarget::Owner("bob".into()),
            RevocationTarget::Issuer("alice".into()),
        ] {
            assert!(!c.is_named_by(&t), "{t:?}");
        }
        assert!(!cred(None).is_named_by(&RevocationTarget::Owner(String::new())));
    }

    #[test]
    fn an_attach_tokens_owner_is_its_owner_claim_or_a_non_site_subject() {
        let claims = |sub: &str, owner: Option<&str>| AttachClaims {
            iss: "s".into(),
            sub: sub.into(),
            aud: "a".into(),
            exp: 0,
            iat: 0,
            jti: "j".into(),
            owner: owner.map(str::to_owned),
            annex: None,
        };
        assert_eq!(Credential::of_attach(&claims("site", None)).owner, None);
        assert_eq!(Credential::of_attach(&claims("site", Some("alice"))).owner.as_deref(), Some("alice"));
        assert_eq!(Credential::of_attach(&claims("bob", None)).owner.as_deref(), Some("bob"));
    }

    #[test]
    fn the_set_answers_with_the_first_reason() {
        let mut r = Revoked::default();
        assert_eq!(r.reason_for(&cred(Some("alice"))), None);
        r.insert(RevocationTarget::Owner("alice".into()), "first".into());
        r.insert(RevocationTarget::Owner("alice".into()), "second".into());
        assert_eq!(r.reason_for(&cred(Some("alice"))), Some("first"));
        assert_eq!(r.reason_for(&cred(Some("bob"))), None);
    }

    #[test]
    fn requests_are_bounded() {
        let req = |t: RevocationTarget, reason: &str| RevokeRequest { target: t, reason: reason.into() };
        assert_eq!(validate(&req(RevocationTarget::Jti("x".into()), "leaked")), Ok(()));
        assert_eq!(validate(&req(RevocationTarget::Jti(String::new()), "r")), Err(RevokeInvalid::Target("jti")));
        assert_eq!(validate(&req(RevocationTarget::Owner("é".repeat(257)), "r")), Err(RevokeInvalid::Target("owner")));
        assert_eq!(validate(&req(RevocationTarget::Owner("é".repeat(256)), "")), Ok(()));
        assert_eq!(validate(&req(RevocationTarget::Issuer("a\nb".into()), "r")), Err(RevokeInvalid::Target("issuer")));
        assert_eq!(
            validate(&req(RevocationTarget::Issuer("gw".into()), &"r".repeat(1025))),
            Err(RevokeInvalid::Reason)
        );
        for t in [RevocationTarget::Jti("a".into()), RevocationTarget::Owner("b".into())] {
            let (kind, value) = target_parts(&t);
            assert_eq!(target_from_parts(kind, value.to_owned()), Some(t.clone()));
        }
        assert_eq!(target_from_parts("user", "x".into()), None);
    }
}
