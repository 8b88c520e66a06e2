//! Compile ahead: the modules of registered functions, which attached EPs are told
//! to fetch and compile before their first job ([`SchedulerMsg::Warm`]), so that compiling a
//! new version (a Python component: 5-13 s of cranelift) never sits on an event's path.
//!
//! The gateway says which modules are live (`POST /v1/modules/warm`, [`WarmRequest`], with a
//! submit token of the function's owner whose `function` claim is the digest; no use counted),
//! at registration and again now and then. The request is checked as a job's module is: its URL
//! must be a module store's URL for its digest ([`crate::trust::UrlTrust::check_module`]); a
//! refusal is counted (`htfaas_scheduler_warm_refused_total`). An accepted module joins the
//! warm list (in memory, at most [`MAX_WARM`](crate::state::MAX_WARM), the oldest dropped first; the gateway's repeats
//! refill it after a restart) and each attached EP that may run the owner's jobs (an EP bound to
//! another owner may not) is sent the message; an EP that attaches later is sent every module
//! on the list that it may run, right after its `Welcome`. A module already on the list is not
//! sent again. Nothing here waits for an EP: sends go into the sessions' queues.
//!
//! Must not know: HTTP routing, how an EP compiles.

use crate::failure::ApiFailure;
use crate::matching::ToEp;
use crate::state::{Shared, WarmEntry as Entry};
use crate::trust::UrlRefusal;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use htfaas_functions::Digest;
use htfaas_functions::proto::{SchedulerMsg, WarmRequest, WarmResponse};
use htfaas_functions::token::SubmitClaims;

/// Longest module URL taken, bytes.
const MAX_URL_BYTES: usize = 8192;

/// Why a warm request is refused (after its token verified).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WarmRefusal {
    /// The token's `function` claim names another module (or none).
    #[error("the submit token is for {token}, not for module {asked}")]
    OtherDigest {
        /// What the token names (`no function` when it names none).
        token: String,
        /// The digest asked for.
        asked: Digest,
    },
    /// The module URL is not a module store's URL for the digest.
    #[error(transparent)]
    Url(#[from] UrlRefusal),
}

/// Whether an EP bound to `ep_owner` (none: the site's pool) may run `owner`'s jobs.
fn may_run(ep_owner: Option<&str>, owner: &str) -> bool {
    ep_owner.is_none_or(|o| o == owner)
}

fn message(e: &Entry) -> SchedulerMsg {
    SchedulerMsg::Warm { digest: e.digest.clone(), module_url: e.module_url.clone() }
}

/// The route's work (`POST /v1/modules/warm`, [`crate::api`]), for a verified, unrevoked
/// submit token's `claims`: 400 for a body that is not a [`WarmRequest`], 403 for a refusal.
pub(crate) fn request(
    shared: &Shared,
    claims: &SubmitClaims,
    body: Result<Bytes, BytesRejection>,
) -> Result<WarmResponse, ApiFailure> {
    let body = body.map_err(|e| ApiFailure { status: e.status(), message: format!("request body: {e}") })?;
    let req: WarmRequest =
        serde_json::from_slice(&body).map_err(|e| ApiFailure::bad_request(format!("invalid warm request: {e}")))?;
    if req.module_url.len() > MAX_URL_BYTES {
        return Err(ApiFailure::bad_request(format!("module_url is longer than {MAX_URL_BYTES} bytes")));
    }
    announce(shared, &claims.sub, claims.function.as_ref(), req).map_err(|e| ApiFailure::forbidden(e.to_string()))
}

/// Checks `req` for `owner`, whose verified token names `token_digest`; adds the module to the
/// warm list and, when new, tells the attached EPs that may run `owner`'s jobs.
pub(crate) fn announce(
    shared: &Shared,
    owner: &str,
    token_digest: Option<&Digest>,
    req: WarmRequest,
) -> Result<WarmResponse, WarmRefusal> {
    let checked = match token_digest {
        Some(d) if *d == req.digest => {
            shared.trust.check_module(&req.digest, &req.module_url).map_err(WarmRefusal::from)
        }
        other => Err(WarmRefusal::OtherDigest {
            token: other.map_or_else(|| "no function".to_owned(), |d| format!("module {d}")),
            asked: req.digest.clone(),
        }),
    };
    if let Err(e) = checked {
        shared.metrics.warm_refused();
        tracing::warn!(%owner, "warm request refused: {e}");
        return Err(e);
    }
    let entry = Entry { digest: req.digest, module_url: req.module_url, owner: owner.to_owned() };
    if !shared.warm.add(entry.clone()) {
        return Ok(WarmResponse { eps: 0, new: false });
    }
    let msg = message(&entry);
    let eps = shared.eps();
    let told = eps
        .iter()
        .filter(|ep| may_run(ep.pool.owner.as_deref(), owner))
        .filter(|ep| ep.tx.send(ToEp::Send(msg.clone())).is_ok())
        .count();
    tracing::info!(digest = %entry.digest.short(), %owner, eps = told, "module on the warm list; EPs told to compile it");
    Ok(WarmResponse { eps: u32::try_from(told).unwrap_or(u32::MAX), new: true })
}

/// What a new session of an EP bound to `ep_owner` is told after its `Welcome`: every module
/// on the warm list it may run, oldest first.
pub(crate) fn on_attach(shared: &Shared, ep_owner: Option<&str>) -> Vec<SchedulerMsg> {
    shared.warm.snapshot().iter().filter(|e| may_run(ep_owner, &e.owner)).map(message).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::MAX_WARM;

    fn entry(n: usize) -> Entry {
        Entry { digest: Digest::of(&n.to_le_bytes()), module_url: format!("http://m/{n}"), owner: "o".into() }
    }

    #[test]
    fn the_list_keeps_each_module_once_and_drops_the_oldest_past_its_bound() {
        let list = crate::state::WarmList::default();
        assert!(list.add(entry(0)));
        assert!(!list.add(entry(0)), "a module already there is not new");
        for n in 1..=MAX_WARM {
            assert!(list.add(entry(n)));
        }
        assert_eq!(list.len(), MAX_WARM);
        let all = list.snapshot();
        assert_eq!(all.first(), Some(&entry(1)), "the oldest went first");
        assert_eq!(all.last(), Some(&entry(MAX_WARM)));
    }

    #[test]
    fn owner_bound_eps_are_told_only_their_owners_modules() {
        assert!(may_run(None, "alice"));
        assert!(may_run(Some("alice"), "alice"));
        assert!(!may_run(Some("bob"), "alice"));
    }
}
