//! Turns a fired (event, function) pair into a job at the scheduler: mints the single-use
//! submit token that allows exactly this job and posts the [`SubmitRequest`], alone or, from
//! the dispatcher, in batches ([`Batcher`]); mints (and verifies) the job's renewal grant
//! ([`Submitter::grant`]).

use crate::storage_client::snippet;
use htfaas_functions::proto::RenewalGrant;
use htfaas_functions::proto::{
    ApiError, BatchAnswer, MAX_SUBMIT_BATCH, MAX_SUBMIT_BATCH_BYTES, SubmitBatchResponse, SubmitRequest,
    SubmitResponse, WarmRequest, WarmResponse,
};
use htfaas_functions::token::{
    MacKey, RENEW_AUDIENCE, RenewClaims, SUBMIT_AUDIENCE, SigningKey, SubmitClaims, Verifier, new_jti, now_s,
};

/// What the renewal grants' MAC key is derived for ([`SigningKey::mac_key`]).
const GRANT_KEY_PURPOSE: &str = "renew";

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
    /// MACs renewal grants: only this gateway (or a replica with its key) verifies them.
    grant_key: MacKey,
    /// Verifies renewal grants ([`RENEW_AUDIENCE`]): MAC'd under `grant_key`, or signed with
    /// `key` (by a build before grants were MAC'd, valid until they expire).
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
        let grant_key = key.mac_key(GRANT_KEY_PURPOSE)?;
        let mut renew_verifier = Verifier::new(issuer, RENEW_AUDIENCE, &key.jwks())?;
        renew_verifier.trust_mac(&grant_key);
        Ok(Submitter {
            grant_key,
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
    /// input file (`req.event.path`; none for a job without an input) and output directory,
    /// until [`GRANT_QUEUE_S`] plus its run time from now.
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
            input: req.input.is_some().then(|| req.event.path.clone()),
            output: output.to_owned(),
            checkpoint: req.checkpoint.as_ref().map(|c| c.url.clone()),
            refs: (!req.refs.is_empty())
                .then(|| htfaas_functions::proto::refs_digest(req.refs.iter().map(|r| r.url.as_str()))),
        };
        Ok(RenewalGrant(self.grant_key.sign(&claims)?))
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

    /// A [`Batcher`] posting to this submitter's scheduler, its task spawned on the current
    /// runtime.
    pub fn batcher(&self) -> Batcher {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let url = format!("{}/v1/jobs/batch", self.scheduler_url);
        tokio::spawn(batch_loop(self.http.clone(), url, rx));
        Batcher { tx }
    }
}

/// Most batches posted at once by a [`Batcher`].
const BATCHES_IN_FLIGHT: usize = 2;

/// Jobs posted to the scheduler in batches (`POST /v1/jobs/batch`), each with its own
/// single-use token, each answered on its own as if posted alone. Group commit's rule: a job
/// that finds a batch free to go goes at once (alone, when nothing else waits); jobs that
/// arrive while [`BATCHES_IN_FLIGHT`] batches are out go together in the next one, up to
/// [`MAX_SUBMIT_BATCH`] jobs and [`MAX_SUBMIT_BATCH_BYTES`]. So batches grow with the load and
/// add no wait without it. Clones share one task, which ends when the last clone is dropped
/// and its batches are answered.
#[derive(Clone)]
pub struct Batcher {
    tx: tokio::sync::mpsc::UnboundedSender<Waiting>,
}

/// A job waiting for its batch: its batch entry as JSON, and where its answer goes.
struct Waiting {
    json: Vec<u8>,
    reply: tokio::sync::oneshot::Sender<Result<SubmitResponse, SubmitError>>,
}

/// One job of a batch as it is sent: the same JSON as [`htfaas_functions::proto::BatchJob`],
/// borrowed.
#[derive(serde::Serialize)]
struct Entry<'a> {
    token: &'a str,
    request: &'a SubmitRequest,
}

impl Batcher {
    /// Posts `req` with `token` in the next batch; answers as [`Submitter::submit_with_token`]
    /// does. `Ok` means the scheduler has the job durably.
    #[tracing::instrument(name = "gateway.submit", skip_all, fields(function = %req.function.name, event = %req.event.id))]
    pub async fn submit(&self, token: &str, req: &SubmitRequest) -> Result<SubmitResponse, SubmitError> {
        let json = serde_json::to_vec(&Entry { token, request: req })
            .map_err(|e| SubmitError::Unavailable(format!("encode the job: {e}")))?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let gone = || SubmitError::Unavailable("the gateway's batcher stopped".into());
        self.tx.send(Waiting { json, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// The [`Batcher`]'s task: takes what waits into batches and posts each in a task of its own,
/// at most [`BATCHES_IN_FLIGHT`] at once.
async fn batch_loop(http: reqwest::Client, url: String, mut rx: tokio::sync::mpsc::UnboundedReceiver<Waiting>) {
    // `{"jobs":[` and `]}`.
    const FRAME: usize = 11;
    let mut flights = tokio::task::JoinSet::new();
    let mut carried: Option<Waiting> = None;
    loop {
        while flights.try_join_next().is_some() {}
        if flights.len() >= BATCHES_IN_FLIGHT {
            flights.join_next().await;
            continue;
        }
        let first = match carried.take() {
            Some(w) => w,
            None => match rx.recv().await {
                Some(w) => w,
                None => break,
            },
        };
        let mut bytes = FRAME + first.json.len();
        let mut batch = vec![first];
        while batch.len() < MAX_SUBMIT_BATCH {
            match rx.try_recv() {
                Ok(w) if bytes + 1 + w.json.len() > MAX_SUBMIT_BATCH_BYTES => {
                    carried = Some(w);
                    break;
                }
                Ok(w) => {
                    bytes += 1 + w.json.len();
                    batch.push(w);
                }
                Err(_) => break,
            }
        }
        flights.spawn(post_batch(http.clone(), url.clone(), batch, bytes));
    }
    while flights.join_next().await.is_some() {}
}

/// Posts one batch and answers each of its jobs: with its own answer, or, when the batch as a
/// whole failed (no answer, a refused body, a reply that does not fit it), all with that.
async fn post_batch(http: reqwest::Client, url: String, batch: Vec<Waiting>, bytes: usize) {
    let mut body = Vec::with_capacity(bytes);
    body.extend_from_slice(b"{\"jobs\":[");
    for (i, w) in batch.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&w.json);
    }
    body.extend_from_slice(b"]}");
    let sent = http.post(&url).header(reqwest::header::CONTENT_TYPE, "application/json").body(body).send().await;
    let answered = match sent {
        Err(e) => Err(SubmitError::Unavailable(e.to_string())),
        Ok(resp) => answer::<SubmitBatchResponse>(resp).await.and_then(|r| {
            if r.results.len() == batch.len() {
                Ok(r.results)
            } else {
                Err(SubmitError::Unavailable(format!(
                    "bad reply: {} answers to a batch of {}",
                    r.results.len(),
                    batch.len()
                )))
            }
        }),
    };
    match answered {
        Ok(results) => {
            for (w, a) in batch.into_iter().zip(results) {
                let _ = w.reply.send(job_answer(a));
            }
        }
        Err(e) => {
            for w in batch {
                let _ = w.reply.send(Err(match &e {
                    SubmitError::Unavailable(r) => SubmitError::Unavailable(r.clone()),
                    SubmitError::Busy(r) => SubmitError::Busy(r.clone()),
                    SubmitError::Refused { status, reason } => {
                        SubmitError::Refused { status: *status, reason: reason.clone() }
                    }
                    other => SubmitError::Unavailable(other.to_string()),
                }));
            }
        }
    }
}

/// One job's answer in a batch, as the same status would be for a job posted alone.
fn job_answer(a: BatchAnswer) -> Result<SubmitResponse, SubmitError> {
    match (a.status, a.job) {
        (200..=299, Some(job)) => Ok(job),
        (200..=299, None) => Err(SubmitError::Unavailable("bad reply: a job accepted without its id".into())),
        (status, _) => Err(failure(status, a.error.unwrap_or_default())),
    }
}

/// A scheduler answer: the JSON body on success, else [`failure`].
async fn answer<T: serde::de::DeserializeOwned>(resp: reqwest::Response) -> Result<T, SubmitError> {
    let status = resp.status();
    let text = resp.text().await.map_err(|e| SubmitError::Unavailable(e.to_string()))?;
    if status.is_success() {
        return serde_json::from_str(&text).map_err(|e| SubmitError::Unavailable(format!("bad reply: {e}")));
    }
    let reason = serde_json::from_str::<ApiError>(&text).map(|e| e.error).unwrap_or_else(|_| snippet(&text));
    Err(failure(status.as_u16(), reason))
}

/// A refusal or failure with the HTTP `status`: 5xx (or no valid status) is
/// [`SubmitError::Unavailable`], 429 [`SubmitError::Busy`], other statuses
/// [`SubmitError::Refused`] with the scheduler's reason.
fn failure(status: u16, reason: String) -> SubmitError {
    match reqwest::StatusCode::from_u16(status) {
        Ok(s) if s.is_server_error() => SubmitError::Unavailable(format!("{s}: {reason}")),
        Ok(reqwest::StatusCode::TOO_MANY_REQUESTS) => SubmitError::Busy(reason),
        Ok(s) if s.is_client_error() => SubmitError::Refused { status, reason },
        _ => SubmitError::Unavailable(format!("{status}: {reason}")),
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
    /// A job of 2 cpus and 512 MB running `runtime_s`.
    fn request(runtime_s: u64) -> SubmitRequest {
        SubmitRequest {
            retry: None,
            function: htfaas_functions::proto::FunctionRef {
                name: "f".into(),
                version: 1,
                digest: htfaas_functions::Digest::of(b"m"),
                module_url: "http://127.0.0.1:1/m".into(),
                native: None,
            },
            resources: htfaas_functions::Resources::new(2, 512, runtime_s),
            input: Some(htfaas_functions::proto::InputSpec::new("http://s/a", "a", "m")),
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
            max_concurrent: None,
            refs: Vec::new(),
            checkpoint: None,
        }
    }

    /// Jobs submitted together through a [`Batcher`] go in fewer requests than jobs, each
    /// answered with its own answer (its id, or its own refusal), in whatever order they were
    /// batched.
    #[tokio::test]
    async fn a_batcher_sends_jobs_together_and_answers_each_on_its_own() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let requests = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let app = axum::Router::new().route(
            "/v1/jobs/batch",
            axum::routing::post(move |axum::Json(batch): axum::Json<htfaas_functions::proto::SubmitBatch>| {
                counted.fetch_add(1, Ordering::SeqCst);
                let results = batch
                    .jobs
                    .iter()
                    .map(|j| match j.token.as_str() {
                        "good" => BatchAnswer {
                            status: 201,
                            job: Some(SubmitResponse {
                                job_id: format!("job-{}", j.request.dedupe_key),
                                created: true,
                            }),
                            error: None,
                        },
                        _ => BatchAnswer { status: 401, job: None, error: Some("token refused".into()) },
                    })
                    .collect();
                async move { axum::Json(SubmitBatchResponse { results }) }
            }),
        );
        let server = tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        let (key, _) = SigningKey::generate("k").expect("keygen");
        let s = Submitter::new(crate::clients::http_client().expect("client"), &url, key, "gw", 60).expect("new");
        let batcher = s.batcher();
        let jobs: Vec<(String, SubmitRequest)> = (0..20)
            .map(|i| {
                let mut r = request(60);
                r.dedupe_key = format!("k{i}");
                (if i % 3 == 0 { "forged" } else { "good" }.to_owned(), r)
            })
            .collect();
        let answers = futures_util::future::join_all(jobs.iter().map(|(t, r)| batcher.submit(t, r))).await;
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(reply) if i % 3 != 0 => assert_eq!(reply.job_id, format!("job-k{i}")),
                Err(SubmitError::Refused { status: 401, reason }) if i % 3 == 0 => assert_eq!(reason, "token refused"),
                other => panic!("job {i}: {other:?}"),
            }
        }
        let n = requests.load(Ordering::SeqCst);
        assert!((1..20).contains(&n), "{n} requests for 20 jobs");
        server.abort();
    }

    /// A minted token allows exactly the job, except that a request for the class's default
    /// run time (0) is allowed up to the longest run time: the scheduler fills in and bounds it.
    #[test]
    fn minted_claims_allow_exactly_the_job() {
        let (key, _) = SigningKey::generate("k").expect("keygen");
        let s = Submitter::new(crate::clients::http_client().expect("client"), "http://127.0.0.1:1", key, "gw", 60)
            .expect("new");
        let req = request;
        let c = s.claims_for("alice", None, &req(60));
        assert_eq!((c.sub.as_str(), c.jobs, c.cpus, c.memory_mb, c.runtime_s), ("alice", 1, 2, 512, 60));
        assert_eq!((c.function, c.group), (Some(htfaas_functions::Digest::of(b"m")), None));
        assert_eq!(s.claims_for("alice", None, &req(0)).runtime_s, htfaas_functions::manifest::MAX_RUNTIME_S);
        // A manifest's accounting group goes into its job's token: the scheduler charges it.
        assert_eq!(s.claims_for("alice", Some("physics"), &req(60)).group.as_deref(), Some("physics"));
    }

    /// A job's renewal grant is MAC'd (`HS256`, the gateway's derived key) and verifies here;
    /// a grant an older build signed with the Ed25519 key still does; the scheduler's submit
    /// check, which trusts the Ed25519 key alone, refuses the grant (another audience and a
    /// `kid` it does not know), and so does another gateway's.
    #[test]
    fn a_renewal_grant_is_macd_and_verified_here_alone() {
        use base64::Engine as _;
        let (key, pem) = SigningKey::generate("k").expect("keygen");
        let jwks = key.jwks();
        let s = Submitter::new(crate::clients::http_client().expect("client"), "http://127.0.0.1:1", key, "gw", 60)
            .expect("new");
        let grant = s.grant("alice", "jti-1", "/out/", &request(60)).expect("grant");
        let header = grant.0.split('.').next().expect("header");
        let header: serde_json::Value =
            serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header).expect("b64"))
                .expect("json");
        assert_eq!((header["alg"].as_str(), header["kid"].as_str()), (Some("HS256"), Some("k#renew")));
        let claims = s.verify_grant(&grant.0).expect("its own grant");
        assert_eq!((claims.sub.as_str(), claims.jti.as_str(), claims.output.as_str()), ("alice", "jti-1", "/out/"));

        let older = SigningKey::from_pem("k", pem.as_bytes()).expect("the same key").sign(&claims).expect("sign");
        assert_eq!(s.verify_grant(&older).expect("an Ed25519 grant").jti, "jti-1");

        let submit = Verifier::new("gw", SUBMIT_AUDIENCE, &jwks).expect("the scheduler's verifier");
        assert!(submit.verify::<SubmitClaims>(&grant.0).is_err(), "a grant is no submit token");
        let (other, _) = SigningKey::generate("k").expect("another gateway's key, the same kid");
        let other =
            Submitter::new(crate::clients::http_client().expect("client"), "http://127.0.0.1:1", other, "gw", 60)
                .expect("new");
        assert!(other.verify_grant(&grant.0).is_err(), "another gateway's grant");
    }
}
