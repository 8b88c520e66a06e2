//! Content digests (`sha256:<64 hex>`) that name wasm modules everywhere in htfaas.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// The sha256 of a module's bytes, written `sha256:<64 lower-case hex>`.
///
/// Parsing accepts only that exact form, so a digest is always safe to use as a file name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

/// Why a string is not a digest.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a digest (want sha256:<64 lower-case hex>): {0:?}")]
pub struct BadDigest(String);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// Wraps a finished hasher.
    pub fn from_hasher(hasher: Sha256) -> Digest {
        Digest(format!("sha256:{}", hex::encode(hasher.finalize())))
    }

    /// The full form, `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hex part alone, fit for a file name.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// The first 12 hex digits, for logs.
    pub fn short(&self) -> &str {
        &self.hex()[..12]
    }
}

impl FromStr for Digest {
    type Err = BadDigest;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = s
            .strip_prefix("sha256:")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        if ok { Ok(Digest(s.to_owned())) } else { Err(BadDigest(s.to_owned())) }
    }
}

impl TryFrom<String> for Digest {
    type Error = BadDigest;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_of_empty_is_the_known_sha256() {
        assert_eq!(Digest::of(b"").as_str(), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn parse_refuses_anything_but_the_canonical_form() {
        let good = Digest::of(b"x");
        assert_eq!(good.as_str().parse::<Digest>(), Ok(good.clone()));
        for bad in [
            "",
            "sha256:",
            "sha1:abcd",
            &good.as_str().to_uppercase(),
            &format!("{}0", good.as_str()),
            "sha256:../../../../etc/passwd0000000000000000000000000000000000000000",
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad:?} parsed");
        }
    }
}
