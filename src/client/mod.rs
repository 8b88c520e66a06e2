//! Talking to a running local stack: what `htfaas put|get|fn|jobs|ep|accounting|events|annex`
//! do (`events replay`, `fn test` and `fn register --dry-run` included).
//!
//! `htfaas up` writes `<dir>/stack.json` (mode 0600) with the URLs and credentials; every
//! command reads it through [`StackInfo::load`], or a profile `htfaas login` saved for a remote
//! site ([`StackInfo::load_profile`]); where and how: `info`.

mod accounting;
pub mod device;
mod dlq;
mod images;
mod info;
mod rerun;
mod trace;

pub use info::{StackInfo, TokenSource, current_token, discover_bearer_token};
pub use trace::{Span, TraceView, job_spans};

use anyhow::{Context as _, bail};
use futures_util::StreamExt as _;
use htfaas_functions::audit::{AuditFilter, AuditRecord, VerifyReport};
use htfaas_functions::proto::{
    Account, ApiError, Attempt, EpAction, EpInfo, FactorRequest, JobAnalysis, JobRecord, ModuleUploaded, OwnerPriority,
    PriorityReport, RegisterQuery, ReplayRequest, Report, RunRequest, StatsSnapshot, TestReport, TestRequest,
};
use htfaas_functions::proto::{AccountingBy, AccountingReport, AuditTrail, Lineage};
use htfaas_functions::proto::{AnnexCreated, AnnexDeleted, AnnexRecord, AnnexView};
use htfaas_functions::proto::{FileAccess, FileCredential, FileCredentialRequest, WhoAmI};
use htfaas_functions::proto::{InvokeRequest, InvokeResponse};
use htfaas_functions::registry::FunctionStatus;
use htfaas_functions::{Digest, FunctionManifest, FunctionRecord};
use serde::Serialize;
use std::path::Path;

/// A client of one stack.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    info: StackInfo,
}

async fn check(resp: reqwest::Response, what: &str) -> anyhow::Result<reqwest::Response> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let text = resp.text().await.unwrap_or_default();
    let reason = serde_json::from_str::<ApiError>(&text).map(|e| e.error).unwrap_or(text);
    bail!("{what}: {status}: {}", reason.trim())
}

/// `name` as one URL path segment: percent-encoded, `/` included. `.` and `..` are refused,
/// since URL parsers take them (even encoded) as directory steps.
fn segment(name: &str) -> anyhow::Result<String> {
    if name.is_empty() || name == "." || name == ".." {
        bail!("{name:?} cannot be used as a name");
    }
    Ok(htfaas_functions::percent::segment(name))
}

impl Client {
    /// A client for `info`.
    pub fn new(info: StackInfo) -> anyhow::Result<Client> {
        Ok(Client { http: htfaas_gateway::http_client_trusting(info.ca_file.as_deref(), "ca_file")?, info })
    }

    /// The same client, calling the gateway's API with `token` (an API token from `htfaas token
    /// api`, of either scope) instead of the stack's admin token. A developer token then sees
    /// and changes only its owner's functions and jobs; admin routes answer 403.
    pub fn with_token(mut self, token: impl Into<String>) -> Client {
        self.info.admin_token = token.into();
        self
    }

    /// The stack it talks to.
    pub fn info(&self) -> &StackInfo {
        &self.info
    }

    fn storage_url(&self, path: &str) -> anyhow::Result<String> {
        if !htfaas_functions::manifest::is_clean_abs_path(path) || path.ends_with('/') {
            bail!("{path:?} is not a clean absolute file path");
        }
        Ok(format!("{}{}", self.info.storage_url, htfaas_functions::percent::path(path)))
    }

    /// Uploads `local` to `storage_path` as the stack's user, streaming.
    pub async fn put_file(&self, local: &Path, storage_path: &str) -> anyhow::Result<()> {
        let file = tokio::fs::File::open(local).await.with_context(|| format!("open {}", local.display()))?;
        let len = file.metadata().await?.len();
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
        self.put_body(body, Some(len), storage_path).await
    }

    /// Uploads `bytes` to `storage_path` as the stack's user.
    pub async fn put_bytes(&self, bytes: Vec<u8>, storage_path: &str) -> anyhow::Result<()> {
        let len = bytes.len() as u64;
        self.put_body(bytes.into(), Some(len), storage_path).await
    }

    async fn put_body(&self, body: reqwest::Body, len: Option<u64>, storage_path: &str) -> anyhow::Result<()> {
        let mut req = self.storage_request(reqwest::Method::PUT, storage_path).await?.body(body);
        if let Some(len) = len {
            req = req.header(reqwest::header::CONTENT_LENGTH, len);
        }
        check(req.send().await.context("upload")?, &format!("upload {storage_path}")).await?;
        Ok(())
    }

    async fn get(&self, storage_path: &str) -> anyhow::Result<reqwest::Response> {
        self.storage_request(reqwest::Method::GET, storage_path).await?.send().await.context("download")
    }

    /// A request to the storage for `storage_path`: with the stack's storage user, or, in a
    /// remote profile, to the URL and with the macaroon the gateway gives for that one file.
    async fn storage_request(
        &self,
        method: reqwest::Method,
        storage_path: &str,
    ) -> anyhow::Result<reqwest::RequestBuilder> {
        if !self.info.is_remote() {
            let url = self.storage_url(storage_path)?;
            return Ok(self.http.request(method, url).basic_auth(&self.info.user, Some(&self.info.user_secret)));
        }
        let access = if method == reqwest::Method::GET { FileAccess::Read } else { FileAccess::Write };
        let request = FileCredentialRequest { path: storage_path.to_owned(), access };
        let credential: FileCredential =
            self.admin_post("/v1/files/credential", &format!("a credential for {storage_path}"), &request).await?;
        Ok(self.http.request(method, credential.url).bearer_auth(credential.macaroon))
    }

    /// Who the credential acts as.
    pub async fn whoami(&self) -> anyhow::Result<WhoAmI> {
        self.admin_get("/v1/whoami").await
    }

    /// Downloads `storage_path`, or `None` if it does not exist.
    pub async fn get_bytes(&self, storage_path: &str) -> anyhow::Result<Option<Vec<u8>>> {
        let resp = self.get(storage_path).await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let resp = check(resp, &format!("download {storage_path}")).await?;
        Ok(Some(resp.bytes().await?.to_vec()))
    }

    /// Streams `storage_path` into `out`.
    pub async fn get_to(
        &self,
        storage_path: &str,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
    ) -> anyhow::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        let resp = check(self.get(storage_path).await?, &format!("download {storage_path}")).await?;
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            out.write_all(&chunk?).await?;
        }
        out.flush().await?;
        Ok(())
    }

    fn gateway(&self, path: &str) -> String {
        format!("{}{path}", self.info.gateway_url)
    }

    /// Uploads a wasm module to the registry.
    pub async fn upload_module(&self, bytes: Vec<u8>) -> anyhow::Result<Digest> {
        let resp =
            self.http.post(self.gateway("/v1/modules")).bearer_auth(&self.info.admin_token).body(bytes).send().await?;
        Ok(check(resp, "upload module").await?.json::<ModuleUploaded>().await?.digest)
    }

    /// Registers a function.
    pub async fn register(&self, manifest: &FunctionManifest) -> anyhow::Result<FunctionRecord> {
        let resp = self
            .http
            .post(self.gateway("/v1/functions"))
            .bearer_auth(&self.info.admin_token)
            .json(manifest)
            .send()
            .await?;
        Ok(check(resp, "register function").await?.json().await?)
    }

    /// Checks `manifest` as a registration would, without registering it, and lists the
    /// recorded events its trigger would fire on (`query.dry_run` is set here).
    pub async fn register_dry_run(&self, manifest: &FunctionManifest, query: &RegisterQuery) -> anyhow::Result<Report> {
        let mut url = reqwest::Url::parse(&self.gateway("/v1/functions")).context("gateway URL")?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("dry_run", "true");
            for (key, value) in [("since", &query.since), ("until", &query.until)] {
                if let Some(value) = value {
                    q.append_pair(key, value);
                }
            }
            if let Some(limit) = query.limit {
                q.append_pair("limit", &limit.to_string());
            }
        }
        let resp = self.http.post(url).bearer_auth(&self.info.admin_token).json(manifest).send().await?;
        Ok(check(resp, "dry-run registration").await?.json().await?)
    }

    /// How one message parses and what `function`'s trigger says about it.
    pub async fn test_function(&self, function: &str, request: &TestRequest) -> anyhow::Result<TestReport> {
        self.admin_post(&format!("/v1/functions/{}/test", segment(function)?), "test function", request).await
    }

    /// Runs `function` on a file with this client's own credential, waiting as `request` asks.
    pub async fn invoke_function(&self, function: &str, request: &InvokeRequest) -> anyhow::Result<InvokeResponse> {
        self.admin_post(&format!("/v1/functions/{}/invoke", segment(function)?), "invoke", request).await
    }

    /// Lists (dry run) or fires again the (event, function) pairs of the recorded events.
    pub async fn replay(&self, request: &ReplayRequest) -> anyhow::Result<Report> {
        self.admin_post("/v1/events/replay", "replay", request).await
    }

    /// Back-fills a function under a directory: [`htfaas_functions::proto::BackfillReport`].
    pub async fn backfill(
        &self,
        request: &htfaas_functions::proto::BackfillRequest,
    ) -> anyhow::Result<htfaas_functions::proto::BackfillReport> {
        self.admin_post("/v1/events/backfill", "backfill", request).await
    }

    async fn admin_get<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let resp = self.http.get(self.gateway(path)).bearer_auth(&self.info.admin_token).send().await?;
        Ok(check(resp, path).await?.json().await?)
    }

    /// Registered functions: the live version of each (deleted ones not).
    pub async fn functions(&self) -> anyhow::Result<Vec<FunctionRecord>> {
        self.admin_get("/v1/functions").await
    }

    /// Registered functions as each stands: live version, latest version, enabled, pinned.
    pub async fn function_statuses(&self) -> anyhow::Result<Vec<FunctionStatus>> {
        self.admin_get("/v1/functions").await
    }

    /// One function as it stands.
    pub async fn function(&self, name: &str) -> anyhow::Result<FunctionStatus> {
        self.admin_get(&format!("/v1/functions/{}", segment(name)?)).await
    }

    /// Every version of a function, oldest first.
    pub async fn function_versions(&self, name: &str) -> anyhow::Result<Vec<FunctionRecord>> {
        self.admin_get(&format!("/v1/functions/{}/versions", segment(name)?)).await
    }

    /// Makes `version` of a function the one that fires (a rollback); `None`: the latest again.
    pub async fn pin_function(&self, name: &str, version: Option<u32>) -> anyhow::Result<FunctionStatus> {
        let path = format!("/v1/functions/{}/pin", segment(name)?);
        self.admin_post(&path, "pin the function", &htfaas_functions::proto::PinRequest { version }).await
    }

    /// Disables (`false`) or enables (`true`) a function.
    pub async fn set_function_enabled(&self, name: &str, enabled: bool) -> anyhow::Result<FunctionStatus> {
        let action = if enabled { "enable" } else { "disable" };
        let path = format!("/v1/functions/{}/{action}", segment(name)?);
        self.admin_post(&path, &format!("{action} the function"), &serde_json::json!({})).await
    }

    /// Replaces every secret of a function with `values` (name → value); returns the names.
    pub async fn set_function_secrets(
        &self,
        name: &str,
        values: &std::collections::BTreeMap<String, String>,
    ) -> anyhow::Result<Vec<String>> {
        let url = self.gateway(&format!("/v1/functions/{}/secrets", segment(name)?));
        let resp = self.http.put(url).bearer_auth(&self.info.admin_token).json(values).send().await?;
        Ok(check(resp, "set the function's secrets").await?.json::<htfaas_functions::proto::SecretNames>().await?.names)
    }

    /// The names of a function's secrets.
    pub async fn function_secret_names(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let names: htfaas_functions::proto::SecretNames =
            self.admin_get(&format!("/v1/functions/{}/secrets", segment(name)?)).await?;
        Ok(names.names)
    }

    /// Deletes a function (its versions stay); returns the version that was live.
    pub async fn delete_function(&self, name: &str) -> anyhow::Result<FunctionRecord> {
        let url = self.gateway(&format!("/v1/functions/{}", segment(name)?));
        let resp = self.http.delete(url).bearer_auth(&self.info.admin_token).send().await?;
        Ok(check(resp, "delete the function").await?.json().await?)
    }

    /// The newest jobs (the scheduler's default page: 100), newest first.
    pub async fn jobs(&self) -> anyhow::Result<Vec<JobRecord>> {
        self.admin_get("/v1/jobs").await
    }

    /// The jobs of one event trace (32 lower-case hex digits), oldest first.
    pub async fn jobs_of_trace(&self, trace_id: &str) -> anyhow::Result<Vec<JobRecord>> {
        anyhow::ensure!(
            htfaas_functions::trace::is_trace_id(trace_id),
            "{trace_id:?} is no trace id (32 lower-case hex digits)"
        );
        self.admin_get(&format!("/v1/jobs?trace={trace_id}&limit=1000")).await
    }

    /// One job.
    pub async fn job(&self, id: &str) -> anyhow::Result<JobRecord> {
        self.admin_get(&format!("/v1/jobs/{}", segment(id)?)).await
    }

    /// Accounts per owner.
    pub async fn accounting(&self) -> anyhow::Result<Vec<Account>> {
        self.admin_get("/v1/accounting").await
    }

    /// Revokes tokens (admin): the scheduler refuses them from now on, removes their queued
    /// jobs, stops their running ones and closes EP sessions attached with them.
    pub async fn revoke(
        &self,
        target: htfaas_functions::proto::RevocationTarget,
        reason: &str,
    ) -> anyhow::Result<htfaas_functions::proto::Revocation> {
        let body = htfaas_functions::proto::RevokeRequest { target, reason: reason.to_owned() };
        let resp = self
            .http
            .post(self.gateway("/v1/revocations"))
            .bearer_auth(&self.info.admin_token)
            .json(&body)
            .send()
            .await?;
        Ok(check(resp, "revoke").await?.json().await?)
    }

    async fn admin_post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        what: &str,
        body: &impl Serialize,
    ) -> anyhow::Result<T> {
        let resp = self.http.post(self.gateway(path)).bearer_auth(&self.info.admin_token).json(body).send().await?;
        Ok(check(resp, what).await?.json().await?)
    }

    /// Grants one namespace right (admin): `principal` may read (and trigger on), write or
    /// replace under a directory, or use an annex. Granting twice changes nothing.
    pub async fn grant(
        &self,
        principal: &str,
        right: htfaas_functions::namespace::Right,
        value: &str,
    ) -> anyhow::Result<htfaas_functions::namespace::GrantEntry> {
        self.admin_post("/v1/namespaces", "grant", &htfaas_functions::namespace::Grant::new(principal, right, value)?)
            .await
    }

    /// Takes a namespace right back (admin); not one of the gateway configuration's.
    pub async fn revoke_grant(
        &self,
        principal: &str,
        right: htfaas_functions::namespace::Right,
        value: &str,
    ) -> anyhow::Result<htfaas_functions::namespace::GrantEntry> {
        let grant = htfaas_functions::namespace::Grant::new(principal, right, value)?;
        self.admin_post("/v1/namespaces/revoke", "revoke grant", &grant).await
    }

    /// The namespace grants in force, with where each comes from.
    pub async fn namespaces(&self) -> anyhow::Result<Vec<htfaas_functions::namespace::GrantEntry>> {
        self.admin_get("/v1/namespaces").await
    }

    /// Holds, releases or removes one job (admin); `verb` is `hold`, `release` or `remove`.
    /// Returns the job as it is now.
    pub async fn job_action(&self, id: &str, verb: &str, reason: &str) -> anyhow::Result<JobRecord> {
        let path = format!("/v1/jobs/{}/{verb}", segment(id)?);
        let body = htfaas_functions::proto::JobAction { reason: reason.to_owned() };
        self.admin_post(&path, verb, &body).await
    }

    /// The guest's stdout and stderr of one job's last reported run.
    pub async fn job_log(&self, id: &str) -> anyhow::Result<htfaas_functions::proto::JobLog> {
        self.admin_get(&format!("/v1/jobs/{}/log", segment(id)?)).await
    }

    /// One job's run attempts, first first.
    pub async fn job_history(&self, id: &str) -> anyhow::Result<Vec<Attempt>> {
        self.admin_get(&format!("/v1/jobs/{}/history", segment(id)?)).await
    }

    /// Why one job runs, or does not (`condor_q -analyze`).
    pub async fn job_analyze(&self, id: &str) -> anyhow::Result<JobAnalysis> {
        self.admin_get(&format!("/v1/jobs/{}/analyze", segment(id)?)).await
    }

    /// Attached EPs and every EP name with an admin setting.
    pub async fn eps(&self) -> anyhow::Result<Vec<EpInfo>> {
        self.admin_get("/v1/eps").await
    }

    /// Drains, disables, enables, pauses or resumes (a group on) one EP (admin); `verb` is
    /// `drain`, `disable`, `enable`, `pause` or `resume`. Returns the EP as it is now.
    pub async fn ep_action(&self, name: &str, verb: &str, action: &EpAction) -> anyhow::Result<EpInfo> {
        let path = format!("/v1/eps/{}/{verb}", segment(name)?);
        self.admin_post(&path, verb, action).await
    }

    /// Creates an annex (admin): the owner must hold the annex right. The answer
    /// holds the annex's attach token, shown this once.
    pub async fn annex_create(&self, request: &htfaas_functions::proto::AnnexRequest) -> anyhow::Result<AnnexCreated> {
        self.admin_post("/v1/annexes", "create annex", request).await
    }

    /// Every annex with its attached EPs.
    pub async fn annexes(&self) -> anyhow::Result<Vec<AnnexView>> {
        self.admin_get("/v1/annexes").await
    }

    /// One annex with its attached EPs.
    pub async fn annex(&self, name: &str) -> anyhow::Result<AnnexView> {
        self.admin_get(&format!("/v1/annexes/{}", segment(name)?)).await
    }

    /// Records batch jobs started for an annex.
    pub async fn annex_jobs(&self, name: &str, jobs: Vec<String>) -> anyhow::Result<AnnexRecord> {
        let path = format!("/v1/annexes/{}/jobs", segment(name)?);
        self.admin_post(&path, "record annex jobs", &htfaas_functions::proto::AnnexJobs { jobs }).await
    }

    /// The annex now ends `lifetime_s` from now; its EPs are told.
    pub async fn annex_extend(&self, name: &str, lifetime_s: u64) -> anyhow::Result<AnnexRecord> {
        let path = format!("/v1/annexes/{}/extend", segment(name)?);
        self.admin_post(&path, "extend annex", &htfaas_functions::proto::AnnexExtend { lifetime_s }).await
    }

    /// Tells the annex's EPs to leave now (after their running jobs).
    pub async fn annex_drain(&self, name: &str) -> anyhow::Result<AnnexView> {
        let path = format!("/v1/annexes/{}/drain", segment(name)?);
        self.admin_post(&path, "drain annex", &serde_json::json!({})).await
    }

    /// Revokes the annex's attach token and removes its record.
    pub async fn annex_delete(&self, name: &str) -> anyhow::Result<AnnexDeleted> {
        let path = format!("/v1/annexes/{}/delete", segment(name)?);
        self.admin_post(&path, "delete annex", &serde_json::json!({})).await
    }

    /// Fair-share standing of owners and groups (`condor_userprio`).
    pub async fn priorities(&self) -> anyhow::Result<PriorityReport> {
        self.admin_get("/v1/priorities").await
    }

    /// Sets an owner's priority factor (`condor_userprio -setfactor`); returns its new standing.
    pub async fn set_factor(&self, owner: &str, factor: f64) -> anyhow::Result<OwnerPriority> {
        let path = format!("/v1/accounting/{}/factor", segment(owner)?);
        self.admin_post(&path, "set factor", &FactorRequest { factor }).await
    }

    /// Every recorded revocation.
    pub async fn revocations(&self) -> anyhow::Result<Vec<htfaas_functions::proto::Revocation>> {
        self.admin_get("/v1/revocations").await
    }

    /// Gateway counters.
    pub async fn stats(&self) -> anyhow::Result<StatsSnapshot> {
        self.admin_get("/v1/stats").await
    }

    /// The scheduler's audit records that `filter` selects, in seq order (admin).
    pub async fn audit(&self, filter: &AuditFilter) -> anyhow::Result<Vec<AuditRecord>> {
        self.audit_trail(AuditTrail::Scheduler, filter).await
    }

    /// The records of both trails that `filter` selects: the gateway's, then the scheduler's
    /// (each in seq order), merged in time order (`writer` says which trail).
    pub async fn audit_both(&self, filter: &AuditFilter) -> anyhow::Result<Vec<AuditRecord>> {
        let mut records = self.audit_trail(AuditTrail::Gateway, filter).await?;
        records.extend(self.audit_trail(AuditTrail::Scheduler, filter).await?);
        records.sort_by_key(|a| (a.time_ms, a.writer != "gateway", a.seq));
        Ok(records)
    }

    /// The records of one audit trail that `filter` selects, in seq order (admin).
    pub async fn audit_trail(&self, trail: AuditTrail, filter: &AuditFilter) -> anyhow::Result<Vec<AuditRecord>> {
        let mut url = reqwest::Url::parse(&self.gateway("/v1/audit")).context("gateway URL")?;
        {
            let mut q = url.query_pairs_mut();
            if trail == AuditTrail::Gateway {
                q.append_pair("trail", "gateway");
            }
            let text = [
                ("job", &filter.job),
                ("token", &filter.token),
                ("owner", &filter.owner),
                ("file", &filter.file),
                ("function", &filter.function),
                ("event", &filter.event_id),
            ];
            for (key, value) in text {
                if let Some(value) = value {
                    q.append_pair(key, value);
                }
            }
            for (key, value) in [("since", filter.since_ms), ("until", filter.until_ms), ("limit", filter.limit)] {
                if let Some(value) = value {
                    q.append_pair(key, &value.to_string());
                }
            }
        }
        let resp = self.http.get(url).bearer_auth(&self.info.admin_token).send().await?;
        Ok(check(resp, "audit query").await?.json().await?)
    }

    /// The scheduler's verification of its whole audit trail, under its own audit key.
    pub async fn audit_verify(&self) -> anyhow::Result<VerifyReport> {
        self.admin_get("/v1/audit/verify").await
    }

    /// The gateway's verification of its own audit trail, under its audit key.
    pub async fn audit_verify_gateway(&self) -> anyhow::Result<VerifyReport> {
        self.admin_get("/v1/audit/verify?trail=gateway").await
    }

    /// Both audit keys (the scheduler's and the gateway's), one JWKS document (for
    /// [`verify_trail_file`] of either trail).
    pub async fn audit_keys(&self) -> anyhow::Result<serde_json::Value> {
        self.admin_get("/v1/audit/keys").await
    }

    /// The lineage of the storage file `path`: the jobs that wrote and read it, back to its
    /// first upload, from both trails (admin).
    pub async fn lineage(&self, path: &str) -> anyhow::Result<Lineage> {
        let mut url = reqwest::Url::parse(&self.gateway("/v1/lineage")).context("gateway URL")?;
        url.query_pairs_mut().append_pair("file", path);
        let resp = self.http.get(url).bearer_auth(&self.info.admin_token).send().await?;
        Ok(check(resp, "lineage").await?.json().await?)
    }

    /// A NATS client as the site's operator ([`StackInfo::nats_nkey_seed`]).
    pub async fn nats(&self) -> anyhow::Result<async_nats::Client> {
        let credential = self
            .info
            .nats_nkey_seed
            .as_deref()
            .map(htfaas_functions::nats::NatsCredential::from_seed)
            .transpose()
            .context("the stack's NATS seed")?;
        htfaas_functions::nats::connect_options("htfaas-cli", credential.as_ref())
            .connect(htfaas_functions::nats::servers(&self.info.nats_url)?)
            .await
            .with_context(|| format!("connect to NATS at {}", self.info.nats_url))
    }

    /// Publishes raw bytes on `subject` through JetStream and waits for the stream's ack.
    pub async fn publish_event(&self, subject: &str, bytes: Vec<u8>) -> anyhow::Result<u64> {
        self.publish_event_with_headers(subject, &[], bytes).await
    }

    /// [`Client::publish_event`] with NATS headers (`(name, value)`), e.g. a binary-mode
    /// CloudEvent's `ce-*` attributes.
    pub async fn publish_event_with_headers(
        &self,
        subject: &str,
        headers: &[(String, String)],
        bytes: Vec<u8>,
    ) -> anyhow::Result<u64> {
        let mut map = async_nats::HeaderMap::new();
        for (name, value) in headers {
            let name: async_nats::header::HeaderName =
                name.parse().map_err(|e| anyhow::anyhow!("header name {name:?}: {e}"))?;
            let value: async_nats::HeaderValue =
                value.parse().map_err(|e| anyhow::anyhow!("header {name} value {value:?}: {e}"))?;
            map.insert(name, value);
        }
        let js = async_nats::jetstream::new(self.nats().await?);
        let ack = js
            .publish_with_headers(subject.to_owned(), map, bytes.into())
            .await
            .context("publish")?
            .await
            .context("wait for the JetStream ack (is there a stream on this subject?)")?;
        Ok(ack.sequence)
    }
}

/// The name of a report's key column: `owner`, `group` or `function`.
fn key_name(by: AccountingBy) -> &'static str {
    match by {
        AccountingBy::Owner => "owner",
        AccountingBy::Group => "group",
        AccountingBy::Function => "function",
    }
}

/// The header of [`report_csv`]; the columns never change order (new ones go at the end).
pub const REPORT_CSV_COLUMNS: [&str; 12] = [
    "key",
    "period_start_ms",
    "completed",
    "failed",
    "removed",
    "core_hours",
    "wall_hours",
    "cpu_hours",
    "peak_memory_bytes",
    "bytes_read",
    "bytes_written",
    "instructions",
];

/// One CSV field: quoted (quotes doubled) when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_owned() }
}

/// `htfaas accounting --by … --csv`: a header row ([`REPORT_CSV_COLUMNS`]), then one line per
/// row, `\n`-terminated. Hours are printed so that they parse back to the same `f64`;
/// `instructions` is empty when no job metered them.
pub fn report_csv(report: &AccountingReport) -> String {
    let mut out = REPORT_CSV_COLUMNS.join(",");
    out.push('\n');
    for r in &report.rows {
        let state = |s: &str| r.jobs.get(s).copied().unwrap_or(0);
        let instructions = r.instructions.map(|i| i.to_string()).unwrap_or_default();
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{}\n",
            csv_field(&r.key),
            r.period_start_ms,
            state("completed"),
            state("failed"),
            state("removed"),
            r.core_hours,
            r.wall_hours,
            r.cpu_hours,
            r.peak_memory_bytes,
            r.bytes_read,
            r.bytes_written,
            instructions
        ));
    }
    out
}

/// `htfaas accounting --by …`: the range, then a table, one line per row (the period's start
/// in RFC 3339 UTC when the report is split).
pub fn report_table(report: &AccountingReport) -> String {
    use htfaas_gateway::replay::fmt_time;
    let mut out = format!("from {} to {}", fmt_time(report.since_ms), fmt_time(report.until_ms));
    if let Some(p) = report.period_s {
        out.push_str(&format!(", per {p} s"));
    }
    out.push('\n');
    let period = |label: &str| if report.period_s.is_some() { format!("{label:<24} ") } else { String::new() };
    out.push_str(&format!(
        "{:<16} {}{:>9} {:>6} {:>7} {:>12} {:>12} {:>12} {:>14} {:>14} {:>14} {:>14}\n",
        key_name(report.by).to_uppercase(),
        period("PERIOD"),
        "COMPLETED",
        "FAILED",
        "REMOVED",
        "CORE-HOURS",
        "WALL-HOURS",
        "CPU-HOURS",
        "PEAK-MEM-B",
        "BYTES-READ",
        "BYTES-WRITTEN",
        "INSTRUCTIONS"
    ));
    for r in &report.rows {
        let state = |s: &str| r.jobs.get(s).copied().unwrap_or(0);
        let instructions = r.instructions.map_or_else(|| "-".to_owned(), |i| i.to_string());
        out.push_str(&format!(
            "{:<16} {}{:>9} {:>6} {:>7} {:>12.6} {:>12.6} {:>12.6} {:>14} {:>14} {:>14} {:>14}\n",
            r.key,
            period(&fmt_time(r.period_start_ms)),
            state("completed"),
            state("failed"),
            state("removed"),
            r.core_hours,
            r.wall_hours,
            r.cpu_hours,
            r.peak_memory_bytes,
            r.bytes_read,
            r.bytes_written,
            instructions
        ));
    }
    out
}

/// `htfaas audit verify --file DB --keys JWKS`: verifies a copy of a trail (any SQLite file
/// with the audit tables: the scheduler's store or the gateway's firing table) offline, under
/// the keys of a JWKS file.
pub fn verify_trail_file(db: &Path, jwks: &Path) -> anyhow::Result<VerifyReport> {
    verify_trail_file_with_head(db, jwks, None)
}

/// [`verify_trail_file`], and with `head` the trail must still reach that record with that
/// hash ([`htfaas_functions::audit::anchor`]): a tail cut off with its checkpoints is refused.
pub fn verify_trail_file_with_head(
    db: &Path,
    jwks: &Path,
    head: Option<&htfaas_functions::audit::anchor::Head>,
) -> anyhow::Result<VerifyReport> {
    let text = std::fs::read_to_string(jwks).with_context(|| format!("read {}", jwks.display()))?;
    let keys = htfaas_functions::audit::keys_from_jwks_text(&text).with_context(|| format!("{}", jwks.display()))?;
    anyhow::ensure!(!keys.is_empty(), "{} holds no Ed25519 key with a kid", jwks.display());
    match head {
        None => htfaas_functions::audit::verify(db, &keys),
        Some(head) => htfaas_functions::audit::anchor::verify_with_head(db, &keys, head),
    }
    .with_context(|| format!("verify {}", db.display()))
}

impl Client {
    /// Runs `function` on `storage_path` with a submit token the caller holds.
    pub async fn run_function(
        &self,
        token: &str,
        function: &str,
        storage_path: &str,
    ) -> anyhow::Result<htfaas_functions::proto::SubmitResponse> {
        self.run_function_on(token, function, storage_path, None).await
    }

    /// [`Client::run_function`] on an annex: only EPs attached with a token for it run the job.
    pub async fn run_function_on(
        &self,
        token: &str,
        function: &str,
        storage_path: &str,
        annex: Option<&str>,
    ) -> anyhow::Result<htfaas_functions::proto::SubmitResponse> {
        let resp = self
            .http
            .post(self.gateway(&format!("/v1/functions/{}/runs", htfaas_functions::percent::path(function))))
            .bearer_auth(token.trim())
            .json(&RunRequest { path: storage_path.to_owned(), annex: annex.map(str::to_owned) })
            .send()
            .await
            .context("submit")?;
        Ok(check(resp, "submit refused").await?.json().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::proto::AccountingRow;

    #[test]
    fn report_csv_has_a_fixed_header_quotes_keys_and_prints_hours_that_parse_back() {
        let row = AccountingRow {
            key: "a,\"b\"".into(),
            period_start_ms: 3_600_000,
            jobs: [("failed".to_owned(), 2)].into(),
            core_hours: 1.0 / 3.0,
            wall_hours: 1e-9,
            instructions: Some(5),
            ..AccountingRow::default()
        };
        let report = AccountingReport {
            since_ms: 0,
            until_ms: 1,
            by: AccountingBy::Group,
            period_s: Some(3600),
            rows: vec![row],
        };
        let csv = report_csv(&report);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], REPORT_CSV_COLUMNS.join(","));
        assert_eq!(lines[1], "\"a,\"\"b\"\"\",3600000,0,2,0,0.3333333333333333,0.000000001,0,0,0,0,5");
        let core: f64 = lines[1].split(',').nth(6).expect("core_hours").parse().expect("f64");
        assert_eq!(core, 1.0 / 3.0);
        assert!(report_table(&report).contains("1970-01-01T01:00:00.000Z"));
    }
}
