//! The attach protocol as this scheduler speaks it: its version and close codes (from
//! [`htfaas_functions::proto`], which the EP shares), the bounds an EP sees, minting the attach
//! tokens EPs dial in with ([`mint_attach_token`]), and the rule for renewing one over a
//! session ([`lease`], [`renewed_claims`]): a renewed token is the same credential (its `jti`,
//! owner and annex: revoking one revokes the other) with a later expiry, for as long as the
//! first one was given, never past its annex's end, and only once half its life is gone.
//! One place for them, low in the crate, so that the store, revocation and the session all
//! name the same codes.
//!
//! Must not know: sessions, the EP table, the store or HTTP.

use htfaas_functions::proto::AttachLease;
pub use htfaas_functions::proto::{CLOSE_EXPIRED, CLOSE_FORBIDDEN, PROTOCOL};
use htfaas_functions::token::{ATTACH_AUDIENCE, AttachClaims, SigningKey, TokenError, new_jti, now_s};

/// Largest message accepted from an EP, bytes (a report carries a bounded log).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Longest close reason a close frame holds, bytes.
pub const MAX_CLOSE_REASON_BYTES: usize = 123;

/// Mints an attach token signed by the scheduler's attach key.
pub fn mint_attach_token(
    key: &SigningKey,
    issuer: &str,
    sub: &str,
    owner: Option<String>,
    annex: Option<String>,
    ttl_s: u64,
) -> Result<String, TokenError> {
    let now = now_s();
    key.sign(&AttachClaims {
        iss: issuer.to_owned(),
        sub: sub.to_owned(),
        aud: ATTACH_AUDIENCE.to_owned(),
        exp: now.saturating_add(ttl_s),
        iat: now,
        jti: new_jti(),
        owner,
        annex,
    })
}

/// A token's life as it was given (`exp - iat`), ms; at least a second.
fn life_ms(claims: &AttachClaims) -> u64 {
    claims.exp.saturating_sub(claims.iat).max(1).saturating_mul(1000)
}

/// What the EP is told of its token at `now_ms`: its time left and, when `renews` (the EP asks
/// and the site renews) and a renewal would give it more time (its annex, ending at
/// `annex_ends_ms`, outlasts it), when to ask: once a third of its life is left.
pub fn lease(claims: &AttachClaims, now_ms: u64, renews: bool, annex_ends_ms: Option<u64>) -> AttachLease {
    let exp_ms = claims.exp.saturating_mul(1000);
    let expires_in_ms = exp_ms.saturating_sub(now_ms);
    let more = annex_ends_ms.is_none_or(|end| end > exp_ms);
    let renew_in_ms = (renews && more).then(|| expires_in_ms.saturating_sub(life_ms(claims) / 3));
    AttachLease { expires_in_ms, renew_in_ms }
}

/// Why an attach token is not renewed ([`renewed_claims`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenewRefusal {
    /// More than half its life is left (the EP is told to ask when a third is left; the slack
    /// absorbs the delay of the message).
    #[error("asked too early: {left_s} s of the token's {life_s} s are left; ask once half or less is left")]
    TooEarly {
        /// Seconds left.
        left_s: u64,
        /// Its whole life, seconds.
        life_s: u64,
    },
    /// Its annex ended.
    #[error("the annex has ended")]
    AnnexEnded,
    /// It already lasts until its annex ends.
    #[error("the token already lasts until its annex ends")]
    AtAnnexEnd,
}

/// The claims of `claims` renewed at `now_ms`: the same credential, issued now, for its first
/// life again, but never past `annex_ends_ms` (the annex's end, when the scheduler keeps a
/// record of it). Revocation is checked by the caller.
pub fn renewed_claims(
    claims: &AttachClaims,
    now_ms: u64,
    annex_ends_ms: Option<u64>,
) -> Result<AttachClaims, RenewRefusal> {
    let life = life_ms(claims);
    let left = claims.exp.saturating_mul(1000).saturating_sub(now_ms);
    if left.saturating_mul(2) > life {
        return Err(RenewRefusal::TooEarly { left_s: left / 1000, life_s: life / 1000 });
    }
    let now = now_ms / 1000;
    let mut exp = now.saturating_add(life / 1000);
    if let Some(end) = annex_ends_ms {
        if now_ms >= end {
            return Err(RenewRefusal::AnnexEnded);
        }
        exp = exp.min(end.div_ceil(1000));
    }
    if exp <= claims.exp {
        return Err(RenewRefusal::AtAnnexEnd);
    }
    Ok(AttachClaims { iat: now, exp, ..claims.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(iat: u64, exp: u64) -> AttachClaims {
        AttachClaims {
            iss: "s".into(),
            sub: "site".into(),
            aud: ATTACH_AUDIENCE.into(),
            exp,
            iat,
            jti: "j".into(),
            owner: Some("alice".into()),
            annex: Some("a".into()),
        }
    }

    #[test]
    fn a_token_is_renewed_once_a_third_of_its_life_is_left_as_the_same_credential() {
        let c = claims(1000, 1090);
        let told = lease(&c, 1_000_000, true, None);
        assert_eq!(told, AttachLease { expires_in_ms: 90_000, renew_in_ms: Some(60_000) });
        let early = renewed_claims(&c, 1_044_000, None).expect_err("more than half left");
        assert_eq!(early, RenewRefusal::TooEarly { left_s: 46, life_s: 90 });
        assert!(renewed_claims(&c, 1_045_000, None).is_ok(), "half left");
        let renewed = renewed_claims(&c, 1_060_000, None).expect("a third left");
        assert_eq!((renewed.iat, renewed.exp), (1060, 1150));
        assert_eq!(renewed, AttachClaims { iat: 1060, exp: 1150, ..c.clone() }, "same jti, owner, annex");
        assert_eq!(lease(&c, 1_000_000, false, None).renew_in_ms, None, "not for an EP that does not renew");
    }

    #[test]
    fn a_renewal_never_outlasts_the_annex() {
        let c = claims(1000, 1090);
        let renewed = renewed_claims(&c, 1_060_000, Some(1_100_500)).expect("the annex lasts longer");
        assert_eq!(renewed.exp, 1101, "capped at the annex's end");
        assert_eq!(lease(&renewed, 1_060_000, true, Some(1_100_500)).renew_in_ms, None, "nothing more to gain");
        assert_eq!(renewed_claims(&c, 1_060_000, Some(1_080_000)), Err(RenewRefusal::AtAnnexEnd));
        assert_eq!(renewed_claims(&c, 1_085_000, Some(1_080_000)), Err(RenewRefusal::AnnexEnded));
    }
}
