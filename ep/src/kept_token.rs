//! The EP's renewed attach token, kept across restarts: each token the scheduler renews
//! (`AttachRenewed`) is written to `work_dir/attach-token` (0600, replaced atomically), and an
//! EP starting again dials with it instead of its configured token when it is the same
//! credential (the same `jti` and `sub`, which a renewal keeps) and lasts longer. Without it an
//! EP that restarts after its first token's expiry (a crash, a node reboot) could never attach
//! again, though the scheduler renewed that very credential while it ran.
//!
//! The claims are read here without checking the signature: only to choose which of two tokens
//! the EP holds to present. The scheduler checks whichever is presented (signature, expiry,
//! revocation), so a token put in the file by someone else gains them nothing they could not
//! present themselves.
//!
//! Must not know: the attach protocol, jobs.

use base64::Engine as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// The kept token's file name in the work directory.
pub(crate) const FILE: &str = "attach-token";

/// The few claims compared, read unverified.
#[derive(serde::Deserialize)]
struct Claims {
    jti: String,
    sub: String,
    exp: u64,
}

/// `token`'s claims, without checking its signature; `None` when it is no JWT with them.
fn claims(token: &str) -> Option<Claims> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn path(work_dir: &Path) -> PathBuf {
    work_dir.join(FILE)
}

/// The token to dial with: the kept one when it is `configured`'s credential renewed (the
/// same `jti` and `sub`, a later `exp`), else `configured`.
pub(crate) fn pick(work_dir: &Path, configured: &str) -> String {
    let Ok(kept) = std::fs::read_to_string(path(work_dir)) else { return configured.to_owned() };
    let kept = kept.trim();
    match (claims(configured), claims(kept)) {
        (Some(c), Some(k)) if k.jti == c.jti && k.sub == c.sub && k.exp > c.exp => {
            tracing::info!(exp = k.exp, "dialing with the attach token renewed before this start");
            kept.to_owned()
        }
        _ => configured.to_owned(),
    }
}

/// Keeps `token` for a later start, replacing the kept one; a failure is logged (the token
/// is still used for this run).
pub(crate) fn keep(work_dir: &Path, token: &str) {
    let tmp = work_dir.join(format!(".{FILE}.tmp"));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(token.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path(work_dir)));
    if let Err(e) = written {
        tracing::warn!("could not keep the renewed attach token in {}: {e}", work_dir.display());
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(jti: &str, sub: &str, exp: u64) -> String {
        let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let header = b64(serde_json::json!({"alg": "EdDSA"}));
        format!("{header}.{}.sig", b64(serde_json::json!({"jti": jti, "sub": sub, "exp": exp})))
    }

    /// A kept token replaces the configured one only when it is the same credential renewed:
    /// not another credential's, not an older one, not one of another owner, not garbage.
    #[test]
    fn the_kept_token_is_used_only_when_it_renews_the_configured_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let configured = jwt("a1", "alice", 100);
        assert_eq!(pick(dir.path(), &configured), configured, "nothing kept");
        let renewed = jwt("a1", "alice", 200);
        keep(dir.path(), &renewed);
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path(dir.path())).expect("kept").permissions());
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(pick(dir.path(), &configured), renewed);
        for other in [jwt("b2", "alice", 300), jwt("a1", "bob", 300), jwt("a1", "alice", 50), "x.y.z".to_owned()] {
            keep(dir.path(), &other);
            assert_eq!(pick(dir.path(), &configured), configured, "{other}");
        }
        assert_eq!(pick(dir.path(), "not a token"), "not a token");
    }
}
