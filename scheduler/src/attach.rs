//! The attach protocol as this scheduler speaks it: its version and close codes (from
//! [`htfaas_functions::proto`], which the EP shares), the bounds an EP sees, and minting the attach tokens EPs dial in with ([`mint_attach_token`]).
//! One place for them, low in the crate, so that the store, revocation and the session all
//! name the same codes.
//!
//! Must not know: sessions, the EP table, the store or HTTP.

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
