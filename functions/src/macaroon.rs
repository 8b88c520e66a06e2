//! The macaroon codec: the only module of htfaas that touches the `macaroon` crate (0.3).
//!
//! Everything that leaves it is a plain `String` token, a list of caveat strings or a
//! [`RootKey`]. What the caveats *mean* (dCache's grammar) lives with their one checker, the
//! storage (`htfaas_storage::macaroons`); the scheduler only adds caveats ([`attenuate`]).
//!
//! **Format.** We emit libmacaroons **V1** (`%04x`-length packets), url-safe base64 **without
//! `=` padding**, byte-identical to dCache (jmacaroons), libmacaroons and pymacaroons; the crate
//! pads, so `serialize` strips it. Input may be padded or not, url-safe or standard alphabet
//! (V2 binary is also parsed; dCache never sends it).
//!
//! **Authentication** ([`authenticate`]) recomputes the HMAC chain with the crate's primitives
//! (`Macaroon::create` + `add_first_party_caveat`) and compares in constant time: the crate's
//! own `Verifier` compares with `==`, and its `fn`-pointer callbacks cannot see the request.
//! Third-party caveats are refused. The crate had fuzzer-found panics in its parser, so parsing
//! runs under `catch_unwind`.

use crate::token::constant_time_eq as ct_eq;
use std::fmt;

use macaroon::{Caveat, Format, Macaroon, MacaroonKey};

/// Longest token we try to parse.
const MAX_TOKEN_LEN: usize = 16 * 1024;

/// The root key that signs and verifies macaroons. `Debug` does not print it.
#[derive(Clone)]
pub struct RootKey(MacaroonKey);

impl RootKey {
    /// libmacaroons/pymacaroons convention: `HMAC-SHA256("macaroons-key-generator", secret)`.
    pub fn derive(secret: &[u8]) -> RootKey {
        init();
        RootKey(MacaroonKey::generate(secret))
    }

    /// dCache/jmacaroons convention: the 32 bytes are the key.
    pub fn raw(bytes: [u8; 32]) -> RootKey {
        init();
        RootKey(MacaroonKey::from(bytes))
    }
}

impl fmt::Debug for RootKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RootKey(..)")
    }
}

/// libsodium initialisation (thread-safe RNG); HMAC works without it, so a failure is only logged.
fn init() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        if macaroon::initialize().is_err() {
            tracing::warn!("libsodium initialisation failed; continuing (only HMAC is used)");
        }
    });
}

/// Why a token could not be parsed, authenticated or re-serialized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(String);

/// A macaroon whose signature matched: its identifier and first-party caveats, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    /// The identifier (lossy UTF-8).
    pub identifier: String,
    /// The caveats, each as UTF-8 text.
    pub caveats: Vec<String>,
}

/// Parses `token` and checks its HMAC chain against `key`, in constant time.
pub fn authenticate(token: &str, key: &RootKey) -> Result<Authenticated, CodecError> {
    let m = parse(token)?;
    let predicates = first_party(&m)?;
    let mut expected = Macaroon::create(m.location(), &key.0, m.identifier()).map_err(|e| CodecError(e.to_string()))?;
    for p in &predicates {
        expected.add_first_party_caveat(p.clone().into());
    }
    if !ct_eq(&expected.signature(), &m.signature()) {
        return Err(CodecError("signature does not match".into()));
    }
    let mut caveats = Vec::with_capacity(predicates.len());
    for p in predicates {
        caveats.push(String::from_utf8(p).map_err(|_| CodecError("caveat is not UTF-8".into()))?);
    }
    Ok(Authenticated { identifier: String::from_utf8_lossy(&m.identifier().0).into_owned(), caveats })
}

/// Adds first-party caveats as a holder would (no key needed), returning the new token (V1,
/// base64url, no padding).
pub fn attenuate(token: &str, caveats: &[&str]) -> Result<String, CodecError> {
    let mut m = parse(token)?;
    for c in caveats {
        m.add_first_party_caveat((*c).into());
    }
    serialize(&m)
}

/// The first-party caveats of a token, without checking its signature (for diagnostics, audit
/// and tests). A third-party caveat is shown as `<third-party LOCATION>`.
pub fn inspect(token: &str) -> Result<Vec<String>, CodecError> {
    describe(token).map(|(_, caveats)| caveats)
}

/// The identifier and first-party caveats of a token ([`identifier`] and [`inspect`] from one
/// parse), without checking its signature.
pub fn describe(token: &str) -> Result<(String, Vec<String>), CodecError> {
    let m = parse(token)?;
    let caveats = m
        .caveats()
        .into_iter()
        .map(|c| match c {
            Caveat::FirstParty(fp) => String::from_utf8_lossy(&fp.predicate().0).into_owned(),
            Caveat::ThirdParty(tp) => format!("<third-party {}>", tp.location()),
        })
        .collect();
    Ok((String::from_utf8_lossy(&m.identifier().0).into_owned(), caveats))
}

/// The identifier of a token, without checking its signature (safe to log: it is not a secret).
pub fn identifier(token: &str) -> Result<String, CodecError> {
    let m = parse(token)?;
    Ok(String::from_utf8_lossy(&m.identifier().0).into_owned())
}

/// Mints a V1 macaroon with exactly these caveats (no checks of their meaning).
pub fn mint(key: &RootKey, location: &str, identifier: &str, caveats: &[String]) -> Result<String, CodecError> {
    if identifier.is_empty() {
        return Err(CodecError("empty identifier".into()));
    }
    let mut m = Macaroon::create(Some(location.to_owned()), &key.0, identifier.into())
        .map_err(|e| CodecError(e.to_string()))?;
    for c in caveats {
        m.add_first_party_caveat(c.as_str().into());
    }
    serialize(&m)
}

fn first_party(m: &Macaroon) -> Result<Vec<Vec<u8>>, CodecError> {
    m.caveats()
        .into_iter()
        .map(|c| match c {
            Caveat::FirstParty(fp) => Ok(fp.predicate().0),
            Caveat::ThirdParty(_) => Err(CodecError("third-party caveats are not supported".into())),
        })
        .collect()
}

fn parse(token: &str) -> Result<Macaroon, CodecError> {
    let token = token.trim();
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(CodecError("empty or oversized token".into()));
    }
    // The crate had fuzzer-found panics in its parsers; never let a token take the task down.
    std::panic::catch_unwind(|| Macaroon::deserialize(token))
        .map_err(|_| CodecError("unparsable token".into()))?
        .map_err(|e| CodecError(format!("unparsable token: {e}")))
}

/// V1, url-safe base64, `=` stripped.
fn serialize(m: &Macaroon) -> Result<String, CodecError> {
    let s = m.serialize(Format::V1).map_err(|e| CodecError(e.to_string()))?;
    Ok(s.trim_end_matches('=').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> RootKey {
        RootKey::derive(b"codec-test-secret")
    }

    fn token(caveats: &[&str]) -> String {
        let caveats: Vec<String> = caveats.iter().map(|c| (*c).to_owned()).collect();
        mint(&key(), "loc", "id-1", &caveats).expect("mints")
    }

    #[test]
    fn attenuated_token_authenticates_with_caveats_in_order() {
        let t = token(&["activity:DOWNLOAD", "path:/data/a"]);
        let t2 = attenuate(&t, &["before:2030-01-01T00:00:00Z"]).expect("attenuates");
        assert!(!t2.ends_with('='));
        let a = authenticate(&t2, &key()).expect("authenticates");
        assert_eq!(a.identifier, "id-1");
        assert_eq!(a.caveats, ["activity:DOWNLOAD", "path:/data/a", "before:2030-01-01T00:00:00Z"]);
        assert_eq!(identifier(&t2).expect("parses"), "id-1");
    }

    /// Splits a V1 token into its packets (`%04x` length, then `key value\n`).
    fn packets(token: &str) -> Vec<Vec<u8>> {
        use base64::Engine as _;
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).expect("base64");
        let mut out = Vec::new();
        let mut i = 0;
        while i < raw.len() {
            let len = usize::from_str_radix(std::str::from_utf8(&raw[i..i + 4]).expect("hex"), 16).expect("len");
            out.push(raw[i..i + len].to_vec());
            i += len;
        }
        out
    }

    fn join(packets: &[Vec<u8>]) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(packets.concat())
    }

    /// A holder cannot drop or reorder caveats: either changes the HMAC chain, and the
    /// signature packet it still carries no longer matches.
    #[test]
    fn removed_or_reordered_caveat_fails() {
        let full = token(&["activity:DOWNLOAD", "path:/data/a"]);
        let p = packets(&full);
        // location, identifier, cid activity, cid path, signature.
        assert_eq!(p.len(), 5);
        assert!(p[2].ends_with(b"cid activity:DOWNLOAD\n"), "{:?}", String::from_utf8_lossy(&p[2]));
        assert!(authenticate(&join(&p), &key()).is_ok(), "the re-joined original must still verify");
        let removed = join(&[p[0].clone(), p[1].clone(), p[3].clone(), p[4].clone()]);
        let reordered = join(&[p[0].clone(), p[1].clone(), p[3].clone(), p[2].clone(), p[4].clone()]);
        for (what, t) in [("removed", removed), ("reordered", reordered)] {
            let err = authenticate(&t, &key()).expect_err(what);
            assert!(err.to_string().contains("signature does not match"), "{what}: {err}");
        }
    }

    #[test]
    fn third_party_caveat_is_refused() {
        let mut m = parse(&token(&["activity:DOWNLOAD"])).expect("parses");
        m.add_third_party_caveat("https://auth.example", &MacaroonKey::generate(b"tp"), "tp-id".into());
        let t = serialize(&m).expect("serializes");
        let err = authenticate(&t, &key()).expect_err("third party");
        assert!(err.to_string().contains("third-party"), "{err}");
    }

    #[test]
    fn wrong_key_and_garbage_fail_without_panic() {
        let t = token(&["activity:DOWNLOAD"]);
        assert!(authenticate(&t, &RootKey::derive(b"other")).is_err());
        for junk in ["", "not a macaroon", "AAAA", &"x".repeat(MAX_TOKEN_LEN + 1)] {
            assert!(authenticate(junk, &key()).is_err(), "{junk:.20}");
            assert!(inspect(junk).is_err());
        }
        assert!(mint(&key(), "loc", "", &[]).is_err());
    }
}
