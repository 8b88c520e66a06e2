//! Credentials of the HTTP API: the bearer of a request ([`bearer`]), who it is
//! ([`require_caller`]: the admin token or an API token), whether it is an admin
//! ([`require_admin`]), and the scheduler's revocations as API-token and renewal-grant checks
//! read them ([`RevocationCache`]).
//!
//! Must not know: routes and handlers ([`crate::api`]), the gateway's shared state (it takes
//! the token, the verifier and the scheduler's address it needs).

use crate::http_error::HttpError;
use axum::http::{HeaderMap, StatusCode};
use htfaas_functions::proto::{Revocation, RevocationTarget};
use htfaas_functions::token::{ApiClaims, Scope, Verifier, constant_time_eq};
use std::time::{Duration, Instant};

/// Where the scheduler's revocations are read: its base URL and admin token, over `http`.
#[derive(Debug, Clone, Copy)]
pub struct Scheduler<'a> {
    /// The HTTP client.
    pub http: &'a reqwest::Client,
    /// The scheduler's base URL.
    pub url: &'a str,
    /// The scheduler's admin token.
    pub admin_token: &'a str,
}

/// The name a caller with the static admin token acts as.
pub const ADMIN_NAME: &str = "admin";

/// Who is calling, once the credential is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The owner an API token acts as (its `sub`); [`ADMIN_NAME`] for the admin token.
    pub name: String,
    /// What it may do.
    pub scope: Scope,
}

impl Caller {
    /// Whether it has the admin scope.
    pub fn is_admin(&self) -> bool {
        self.scope == Scope::Admin
    }

    /// Whether it may see and act on what `owner` owns.
    pub fn owns(&self, owner: &str) -> bool {
        self.is_admin() || self.name == owner
    }
}

/// The bearer credential of a request, if any.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(htfaas_functions::token::bearer)
}

/// The caller of a route open to either scope: the admin token, or an API token that verifies
/// (signature, `kid`, issuer, audience, expiry, a known scope; revocation is checked by the
/// API's `authenticate` layer). 401 otherwise.
pub fn require_caller(admin_token: &str, verifier: &Verifier, headers: &HeaderMap) -> Result<Caller, HttpError> {
    let token = bearer(headers).ok_or_else(|| {
        HttpError(StatusCode::UNAUTHORIZED, "API token required (Authorization: Bearer; see `htfaas token api`)".into())
    })?;
    if constant_time_eq(token.as_bytes(), admin_token.as_bytes()) {
        return Ok(Caller { name: ADMIN_NAME.into(), scope: Scope::Admin });
    }
    let claims = verifier
        .verify_api(token)
        .map_err(|e| HttpError(StatusCode::UNAUTHORIZED, format!("API token refused: {e}")))?;
    Ok(Caller { name: claims.sub, scope: claims.scope })
}

/// Checks that the caller has the admin scope: 401 without a valid credential, 403 with a
/// developer's.
pub fn require_admin(admin_token: &str, verifier: &Verifier, headers: &HeaderMap) -> Result<(), HttpError> {
    let caller = require_caller(admin_token, verifier, headers)?;
    if caller.is_admin() {
        return Ok(());
    }
    Err(HttpError(
        StatusCode::FORBIDDEN,
        format!("this route needs scope admin; the token of {:?} has scope {}", caller.name, caller.scope),
    ))
}

/// How long a fetched list of revocations is used before it is fetched again, seconds.
pub const REVOCATIONS_FRESH_S: u64 = 5;
/// How long an old list is still used while the scheduler cannot be asked, seconds; past it,
/// API tokens are refused with 503.
pub const REVOCATIONS_STALE_S: u64 = 60;

/// The scheduler's revocations as the API-token check reads them: fetched
/// (`GET /v1/revocations`, with the scheduler's admin token) at most every
/// [`REVOCATIONS_FRESH_S`] seconds, by one request at a time.
#[derive(Debug, Default)]
pub struct RevocationCache {
    state: tokio::sync::Mutex<RevocationState>,
}

#[derive(Debug, Default)]
struct RevocationState {
    /// The last list fetched, and when.
    fetched: Option<(Instant, Vec<Revocation>)>,
    /// When a fetch last failed (so that a down scheduler is asked once a second, not per request).
    failed_at: Option<Instant>,
}

impl RevocationCache {
    /// `Err` (401) when a revocation names the token's `jti`, its `sub` or its issuer.
    /// The scheduler is asked at `scheduler_url` with its admin token over `http`.
    pub async fn check(&self, scheduler: &Scheduler<'_>, claims: &ApiClaims) -> Result<(), HttpError> {
        match self.reason_for(scheduler, &claims.jti, &claims.sub, &claims.iss).await? {
            Some(reason) => Err(HttpError(StatusCode::UNAUTHORIZED, format!("API token revoked: {reason}"))),
            None => Ok(()),
        }
    }

    /// The reason of the first revocation naming `jti`, owner `sub` or issuer `iss` (any
    /// credential: an API token, a job's renewal grant), `None` when none does; `Err` (503)
    /// when the list is older than [`REVOCATIONS_STALE_S`] and the scheduler does not answer.
    pub async fn reason_for(
        &self,
        scheduler: &Scheduler<'_>,
        jti: &str,
        sub: &str,
        iss: &str,
    ) -> Result<Option<String>, HttpError> {
        let mut state = self.state.lock().await;
        let fresh =
            state.fetched.as_ref().is_some_and(|(at, _)| at.elapsed() < Duration::from_secs(REVOCATIONS_FRESH_S));
        let backing_off = state.failed_at.is_some_and(|at| at.elapsed() < Duration::from_secs(1));
        if !fresh && !backing_off {
            match fetch_revocations(scheduler).await {
                Ok(list) => *state = RevocationState { fetched: Some((Instant::now(), list)), failed_at: None },
                Err(e) => {
                    tracing::warn!("cannot read the scheduler's revocations: {e}");
                    state.failed_at = Some(Instant::now());
                }
            }
        }
        let usable = state.fetched.as_ref().filter(|(at, _)| at.elapsed() < Duration::from_secs(REVOCATIONS_STALE_S));
        let Some((_, list)) = usable else {
            return Err(HttpError(
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot check revocations: the scheduler does not answer".into(),
            ));
        };
        Ok(list.iter().find(|r| names(&r.target, jti, sub, iss)).map(|r| r.reason.clone()))
    }
}

/// Whether `target` revokes an API token: its `jti`, its owner (`sub`) or its issuer, as for
/// submit tokens ([`RevocationCache::check`]'s rule, for tests).
#[cfg(test)]
pub(crate) fn names_api_token(target: &RevocationTarget, claims: &ApiClaims) -> bool {
    names(target, &claims.jti, &claims.sub, &claims.iss)
}

/// Whether `target` names the credential `jti` of owner `sub` signed by `iss`.
fn names(target: &RevocationTarget, jti: &str, sub: &str, iss: &str) -> bool {
    match target {
        RevocationTarget::Jti(j) => j == jti,
        RevocationTarget::Owner(o) => o == sub,
        RevocationTarget::Issuer(i) => i == iss,
    }
}

async fn fetch_revocations(scheduler: &Scheduler<'_>) -> Result<Vec<Revocation>, String> {
    let resp = scheduler
        .http
        .get(format!("{}/v1/revocations", scheduler.url))
        .bearer_auth(scheduler.admin_token)
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("the scheduler answered {}", resp.status()));
    }
    resp.json().await.map_err(|e| e.to_string())
}
