//! Turns a fired (event, function) pair into a job at the scheduler: mints the single-use
//! submit token that allows exactly this job and posts the [`SubmitRequest`]; mints (and
//! verifies) the job's renewal grant ([`Submitter::grant`]).

use crate::storage_client::snippet;
use htfaas_functions::proto::RenewalGrant;
use htfaas_functions::proto::{ApiError, SubmitRequest, SubmitResponse, WarmRequest, WarmResponse};
use htfaas_functions::token::{
    RENEW_AUDIENCE, RenewClaims, SUBMIT_AUDIENCE, SigningKey, SubmitClaims, Verifier, new_jti, now_s,
};

/// How long a job may wait (queued or held) and still have its macaroons renewed, seconds: a
/// renewal grant expires this long after its job was submitted, plus the job's run time. A
/// week, as long as the events stream keeps an event
/// ([`htfaas_functions::proto::EVENTS_MAX_AGE_S`]).
pub const GRANT_QUEUE_S: u64 = htfaas_functions::proto::EVENTS_MAX_AGE_S;

/// Why a submission did not go through.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Scheduler unreachable or failing (5xx): retry later.
    #[error("scheduler unavailable: {0}")]
    Unavailable(String),
    /// The scheduler will take it later (429: the owner is at a queue limit): retry later.
    #[error("scheduler busy: {0}")]
    Busy(String),
    /// The scheduler refused the job (4xx): retrying will not help.
    #[error("scheduler refused the job ({status}): {reason}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The scheduler's reason.
        reason: String,
    },
    /// The token could not be minted.
    #[error("mint submit token: {0}")]
    Token(htfaas_functions::token::TokenError),
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<htfaas_functions::token::TokenError> for SubmitError {
    fn from(e: htfaas_functions::token::TokenError) -> SubmitError {
        SubmitError::Token(e)
    }
}

/// Mints submit tokens and posts jobs.
pub struct Submitter {
    http: reqwest::Client,
    scheduler_url: String,
    jobs_url: String,
    key: SigningKey,
    verifier: Verifier,
    /// Verifies renewal grants (the same key, [`RENEW_AUDIENCE`]).
    renew_verifier: Verifier,
    issuer: String,
    token_ttl_s: u64,
}

impl Submitter {
    /// A submitter to the scheduler at `scheduler_url`, signing with `key` as `issuer`.
    pub fn new(
        http: reqwest::Client,
        scheduler_url: &str,
        key: SigningKey,
        issuer: &str,
        token_ttl_s: u64,
    ) -> Result<Submitter, htfaas_functions::token::TokenError> {
        let verifier = Verifier::new(issuer, SUBMIT_AUDIENCE, &key.jwks())?;
        let renew_verifier = Verifier::new(issuer, RENEW_AUDIENCE, &key.jwks())?;
        Ok(Submitter {
            renew_verifier,
            http,
            scheduler_url: scheduler_url.trim_end_matches('/').to_owned(),
            jobs_url: format!("{}/v1/jobs", scheduler_url.trim_end_matches('/')),
            key,
            verifier,
            issuer: issuer.to_owned(),
            token_ttl_s,
        })
    }

    /// Checks a caller's submit token as the scheduler will (signature, issuer, audience,
    /// expiry), so that no macaroon is requested for a token that cannot submit. Use counts
    /// stay with the scheduler.
    pub fn verify(&self, token: &str) -> Result<SubmitClaims, htfaas_functions::token::TokenError> {
        self.verifier.verify(token)
    }

    /// The renewal grant of `req`, a job of `owner` submitted with the token `jti`,
    /// writing to `output` (its function's output directory): exactly its function version,
    /// input file (`req.event.path`) and output directory, until [`GRANT_QUEUE_S`] plus its run
    /// time from now.
    pub fn grant(
        &self,
        owner: &str,
        jti: &str,
        output: &str,
        req: &SubmitRequest,
    ) -> Result<RenewalGrant, htfaas_functions::token::TokenError> {
        let now = now_s();
        let runtime_s = match req.resources.runtime_s {
            0 => htfaas_functions::manifest::MAX_RUNTIME_S,
            r => r,
        };
        let claims = RenewClaims {
            iss: self.issuer.clone(),
            sub: owner.to_owned(),
            aud: RENEW_AUDIENCE.to_owned(),
            exp: now.saturating_add(GRANT_QUEUE_S).saturating_add(runtime_s),
            iat: now,
            jti: jti.to_owned(),
            function: req.function.name.clone(),
            version: req.function.version,
            digest: req.function.digest.clone(),
            input: req.event.path.clone(),
            output: output.to_owned(),
        };
        Ok(RenewalGrant(self.key.sign(&claims)?))
    }

    /// Checks a renewal grant (signature, issuer, audience [`RENEW_AUDIENCE`], expiry).
    pub fn verify_grant(&self, token: &str) -> Result<RenewClaims, htfaas_functions::token::TokenError> {
        self.renew_verifier.verify(token)
    }

    /// The scheduler's base URL.
    pub fn scheduler_url(&self) -> &str {
        &self.scheduler_url
    }

    /// Claims allowing exactly `req` for `owner` (charged to `group`, if any): one job, its
    /// resources, its function.
    pub fn claims_for(&self, owner: &str, group: Option<&str>, req: &SubmitRequest) -> SubmitClaims {
        let now = now_s();
        SubmitClaims {
            iss: self.issuer.clone(),
            sub: owner.to_owned(),
            aud: SUBMIT_AUDIENCE.to_owned(),
            exp: now + self.token_ttl_s,
            iat: now,
            jti: new_jti(),
            jobs: 1,
            cpus: req.resources.cpus,
            memory_mb: req.resources.memory_mb,
            // 0 asks for the job class's default, which only the scheduler knows; it bounds
            // that by the class's maximum.
            runtime_s: match req.resources.runtime_s {
                0 => htfaas_functions::manifest::MAX_RUNTIME_S,
                r => r,
            },
            function: Some(req.function.bound_digest()),
            group: group.map(str::to_owned),
        }
    }

    /// Submits `req` on behalf of `owner` with a token minted for exactly this job. `Ok` means
    /// the scheduler has the job durably.
    #[tracing::instrument(name = "gateway.submit", skip_all, fields(function = %req.function.name, event = %req.event.id))]
    pub async fn submit(
        &self,
        owner: &str,
        group: Option<&str>,
        req: &SubmitRequest,
    ) -> Result<SubmitResponse, SubmitError> {
        let (claims, token) = self.mint(owner, group, req)?;
        let reply = self.submit_with_token(&token, req).await?;
        tracing::info!(job = %reply.job_id, jti = %claims.jti, created = reply.created, "job accepted");
        Ok(reply)
    }

    /// Mints the token allowing exactly `req` for `owner` (charged to `group`): its claims
    /// (what the audit trail records) and the signed token (what only the scheduler sees).
    pub fn mint(
        &self,
        owner: &str,
        group: Option<&str>,
        req: &SubmitRequest,
    ) -> Result<(SubmitClaims, String), SubmitError> {
        let claims = self.claims_for(owner, group, req);
        let token = self.key.sign(&claims)?;
        Ok((claims, token))
    }

    /// Posts `req` with a token the caller brought (or [`Submitter::mint`]ed); the scheduler decides.
    pub async fn submit_with_token(&self, token: &str, req: &SubmitRequest) -> Result<SubmitResponse, SubmitError> {
        let resp = self
            .http
            .post(&self.jobs_url)
            .bearer_auth(token)
            .json(req)
            .send()
            .await
            .map_err(|e| SubmitError::Unavailable(e.to_string()))?;
        answer(resp).await
    }

    /// Asks the scheduler whether `token` could submit now (signature, expiry, revocation,
    /// uses left) without using it, so that no macaroon is requested for a token the
    /// scheduler would refuse. `Ok` carries the uses left.
    pub async fn preflight(&self, token: &str) -> Result<u32, SubmitError> {
        let resp = self
            .http
            .post(format!("{}/v1/preflight", self.scheduler_url))
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| SubmitError::Unavailable(e.to_string()))?;
        #[derive(serde::Deserialize)]
        struct Preflight {
            remaining: u32,
        }
        Ok(answer::<Preflight>(resp).await?.remaining)
    }

    /// Tells the scheduler that `req`'s module belongs to a registered function of
    /// `owner`, for EPs to compile ahead of its first job (`POST /v1/modules/warm`), with a
    /// token of `owner` naming the digest and allowing no job (the route counts no use).
    pub async fn warm(&self, owner: &str, req: &WarmRequest) -> Result<WarmResponse, SubmitError> {
        let now = now_s();
        let claims = SubmitClaims {
            iss: self.issuer.clone(),
            sub: owner.to_owned(),
            aud: SUBMIT_AUDIENCE.to_owned(),
            exp: now + self.token_ttl_s,
            iat: now,
            jti: new_jti(),
            jobs: 0,
            cpus: 0,
            memory_mb: 0,
            runtime_s: 0,
            function: Some(req.digest.clone()),
            group: None,
        };
        let token = self.key.sign(&claims)?;
        let resp = self
            .http
            .post(format!("{}/v1/modules/warm", self.scheduler_url))
            .bearer_auth(&token)
            .json(req)
            .send()
            .await
            .map_err(|e| SubmitError::Unavailable(e.to_string()))?;
        answer(resp).await
    }
}

/// A scheduler answer: the JSON body on success; 5xx is [`SubmitError::Unavailable`], other
/// statuses [`SubmitError::Refused`] with the scheduler's reason.
async fn answer<T: serde::de::DeserializeOwned>(resp: reqwest::Response) -> Result<T, SubmitError> {
    let status = resp.status();
    let text = resp.text().await.map_err(|e| SubmitError::Unavailable(e.to_string()))?;
    if status.is_success() {
        return serde_json::from_str(&text).map_err(|e| SubmitError::Unavailable(format!("bad reply: {e}")));
    }
    let reason = serde_json::from_str::<ApiError>(&text).map(|e| e.error).unwrap_or_else(|_| snippet(&text));
    if status.is_server_error() {
        Err(SubmitError::Unavailable(format!("{status}: {reason}")))
    } else if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        Err(SubmitError::Busy(reason))
    } else {
        Err(SubmitError::Refused { status: status.as_u16(), reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheduler stand-in answering every request with `status` and an `ApiError` body.
    async fn answering(status: u16) -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let app = axum::Router::new().fallback(move || async move {
            let status = axum::http::StatusCode::from_u16(status).expect("status");
            (status, axum::Json(ApiError { error: format!("said {status}") }))
        });
        (url, tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") }))
    }

    /// What the ingest loop does with an answer depends on this mapping: 5xx and 429 are retried
    /// later (the owner is at a queue limit), other 4xx are final. 507 (the
    /// scheduler's disk is full, nothing was stored) is a 5xx like the others: retried with
    /// backoff, never dropped.
    #[tokio::test]
    async fn busy_and_unavailable_are_retryable_and_other_refusals_are_final() {
        for (status, expect) in [
            (429, "busy"),
            (500, "unavailable"),
            (503, "unavailable"),
            (507, "unavailable"),
            (400, "refused"),
            (403, "refused"),
            (401, "refused"),
        ] {
            let (url, server) = answering(status).await;
            let (key, _) = SigningKey::generate("k").expect("keygen");
            let s = Submitter::new(crate::clients::http_client().expect("client"), &url, key, "gw", 60).expect("new");
            let got = match s.preflight("token").await {
                Err(SubmitError::Busy(r)) => ("busy", r),
                Err(SubmitError::Unavailable(r)) => ("unavailable", r),
                Err(SubmitError::Refused { reason, .. }) => ("refused", reason),
                other => panic!("{status}: {other:?}"),
            };
            assert_eq!(got.0, expect, "{status}");
            assert!(got.1.contains(&format!("said {status}")), "{status}: {}", got.1);
            server.abort();
        }
    }
    /// A minted token allows exactly the job, except that a request for the class's default
    /// run time (0) is allowed up to the longest run time: the scheduler fills in and bounds it.
    #[test]
    fn minted_claims_allow_exactly_the_job() {
        let (key, _) = SigningKey::generate("k").expect("keygen");
        let s = Submitter::new(crate::clients::http_client().expect("client"), "http://127.0.0.1:1", key, "gw", 60)
            .expect("new");
        let req = |runtime_s| SubmitRequest {
            retry: None,
            function: htfaas_functions::proto::FunctionRef {
                name: "f".into(),
                version: 1,
                digest: htfaas_functions::Digest::of(b"m"),
                module_url: "http://127.0.0.1:1/m".into(),
                native: None,
            },
            resources: htfaas_functions::Resources::new(2, 512, runtime_s),
            input: htfaas_functions::proto::InputSpec::new("http://s/a", "a", "m"),
            output: htfaas_functions::proto::OutputSpec {
                url: "http://s/o/".into(),
                macaroon: "m".into(),
                on_failure: Default::default(),
            },
            args: vec![],
            env: vec![],
            event: htfaas_functions::proto::EventRef::new("s", "i", "/a"),
            dedupe_key: "k".into(),
            annex: None,
            bind_ep_address: false,
            class: None,
            limits: Default::default(),
            secrets: Default::default(),
            renewal: None,
        };
        let c = s.claims_for("alice", None, &req(60));
        assert_eq!((c.sub.as_str(), c.jobs, c.cpus, c.memory_mb, c.runtime_s), ("alice", 1, 2, 512, 60));
        assert_eq!((c.function, c.group), (Some(htfaas_functions::Digest::of(b"m")), None));
        assert_eq!(s.claims_for("alice", None, &req(0)).runtime_s, htfaas_functions::manifest::MAX_RUNTIME_S);
        // A manifest's accounting group goes into its job's token: the scheduler charges it.
        assert_eq!(s.claims_for("alice", Some("physics"), &req(60)).group.as_deref(), Some("physics"));
    }
}
