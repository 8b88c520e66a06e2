//! The audit routes (`/v1/audit`, `/v1/audit/verify`, `/v1/audit/keys`, `/v1/lineage`) and the
//! API's side of the gateway's trail ([`crate::audit`]): admin actions recorded after they
//! succeeded ([`record_admin`]), queries and verification of the trail, and the lineage of a
//! file across both trails ([`lineage`]).
//!
//! Must not know: the firing table's SQL (it reads the trail through the library), the
//! JetStream consumer.

use super::forward::{forward, forward_get, scheduler_json};
use crate::audit::{AUDIT_WRITER, EVENT_MATCHED};
use crate::auth::Scheduler;
use crate::firing::Firings;
use crate::http_error::HttpError;
use crate::replay;
use crate::state::Shared;
use axum::Json;
use axum::extract::{Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use htfaas_functions::Digest;
use htfaas_functions::audit::{
    self, AuditError, AuditFilter, AuditKind, AuditRecord, AuditSigner, Subject, VerifyReport,
};
use htfaas_functions::proto::{AuditTrail, Cause, Lineage, LineageRef, LineageRelation, LineageStep};
use serde_json::{Value, json};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

/// `GET /v1/audit`: an admin's query goes to the scheduler as it came (the scheduler parses it
/// and refuses unknown parameters); a developer's is parsed here and gets `owner=<sub>`.
pub(super) async fn proxy_audit(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let (trail, query) = audit_trail(query)?;
    if caller.is_admin() && trail == AuditTrail::Scheduler {
        let suffix = query.map(|q| format!("?{q}")).unwrap_or_default();
        return forward_get(&shared.scheduler(), &format!("/v1/audit{suffix}")).await;
    }
    let uri: axum::http::Uri = format!("/v1/audit?{}", query.unwrap_or_default())
        .parse()
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid audit query: {e}")))?;
    let Query(mut filter) = Query::<htfaas_functions::audit::AuditFilter>::try_from_uri(&uri)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid audit query: {}", e.body_text())))?;
    if caller.is_admin() {
        return gateway_audit(&shared.firings, filter).await;
    }
    if filter.owner.as_ref().is_some_and(|o| *o != caller.name) {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!("a developer token of {:?} reads only its own audit records", caller.name),
        ));
    }
    filter.owner = Some(caller.name);
    if trail == AuditTrail::Gateway {
        return gateway_audit(&shared.firings, filter).await;
    }
    let mut url = reqwest::Url::parse(&format!("{}/v1/audit", shared.submitter_base()))
        .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("scheduler URL: {e}")))?;
    if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(&filter) {
        let mut pairs = url.query_pairs_mut();
        for (k, v) in fields {
            match v {
                serde_json::Value::String(s) => pairs.append_pair(&k, &s),
                serde_json::Value::Null => continue,
                other => pairs.append_pair(&k, &other.to_string()),
            };
        }
    }
    forward(shared.http.get(url).bearer_auth(&shared.scheduler_admin_token)).await
}

/// `GET /v1/audit/verify[?trail=gateway]`: the scheduler's trail (default) or the gateway's,
/// checked under its writer's key.
pub(super) async fn proxy_audit_verify(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    match audit_trail(query)? {
        (AuditTrail::Scheduler, None) => forward_get(&shared.scheduler(), "/v1/audit/verify").await,
        (AuditTrail::Gateway, None) => {
            let report = verify(&shared.firings, &shared.audit.signer).await.map_err(|e| {
                tracing::error!("verify the gateway's audit trail: {e}");
                HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("verify the gateway's audit trail: {e}"))
            })?;
            Ok(Json(report).into_response())
        }
        (_, Some(q)) => Err(HttpError(StatusCode::BAD_REQUEST, format!("unknown audit verify parameters {q:?}"))),
    }
}

/// `GET /v1/audit/keys[?trail=]`: both audit keys in one JWKS (kids `scheduler-audit-1`,
/// `gateway-audit-1`), so one file verifies a copy of either trail; or one trail's.
pub(super) async fn proxy_audit_keys(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    let gateway = shared.audit.signer.jwks();
    match query.as_deref() {
        Some("trail=gateway") => return Ok(Json(gateway).into_response()),
        Some("trail=scheduler") => return forward_get(&shared.scheduler(), "/v1/audit/keys").await,
        Some(q) => return Err(HttpError(StatusCode::BAD_REQUEST, format!("unknown audit keys parameters {q:?}"))),
        None => {}
    }
    let mut both: serde_json::Value = scheduler_json(&shared.scheduler(), "/v1/audit/keys").await?;
    let ours = serde_json::to_value(&gateway).ok();
    let ours = ours.as_ref().and_then(|v| v.get("keys")).and_then(|k| k.as_array()).cloned().unwrap_or_default();
    match both.get_mut("keys").and_then(|k| k.as_array_mut()) {
        Some(keys) => keys.extend(ours),
        None => return Err(HttpError(StatusCode::BAD_GATEWAY, "the scheduler's audit keys are not a JWKS".into())),
    }
    Ok(Json(both).into_response())
}

/// `?trail=gateway|scheduler` taken out of an audit route's query: the trail and the rest.
pub(super) fn audit_trail(query: Option<String>) -> Result<(AuditTrail, Option<String>), HttpError> {
    let Some(query) = query else { return Ok((AuditTrail::Scheduler, None)) };
    let mut trail = AuditTrail::Scheduler;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.strip_prefix("trail=") {
            Some("gateway") => trail = AuditTrail::Gateway,
            Some("scheduler") => trail = AuditTrail::Scheduler,
            Some(other) => {
                return Err(HttpError(
                    StatusCode::BAD_REQUEST,
                    format!("unknown trail {other:?} (gateway, scheduler)"),
                ));
            }
            None => rest.push(pair),
        }
    }
    Ok((trail, (!rest.is_empty()).then(|| rest.join("&"))))
}

/// The gateway trail's records `filter` selects (limit as the scheduler's: default 1000, at
/// most 100,000).
pub(super) async fn gateway_audit(
    firings: &Firings,
    mut filter: htfaas_functions::audit::AuditFilter,
) -> Result<Response, HttpError> {
    filter.limit = Some(filter.limit.unwrap_or(1000).min(100_000));
    let records = query(firings, filter).await.map_err(|e| {
        tracing::error!("query the gateway's audit trail: {e}");
        HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("query the gateway's audit trail: {e}"))
    })?;
    Ok(Json(records).into_response())
}

/// `GET /v1/lineage?file=PATH[&depth=N]`: where the file comes from, from both trails.
pub(super) async fn get_lineage(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<htfaas_functions::proto::LineageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, HttpError> {
    shared.require_admin(&headers)?;
    let Query(q) = query.map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid lineage query: {e}")))?;
    let depth = q.depth.unwrap_or(MAX_LINEAGE_DEPTH);
    let lineage = lineage(&shared.scheduler(), &shared.firings, &q.file, depth).await.map_err(|e| {
        tracing::warn!(file = %q.file, "lineage: {e}");
        HttpError(StatusCode::BAD_GATEWAY, format!("lineage of {}: {e}", q.file))
    })?;
    Ok(Json(lineage).into_response())
}

/// The audit subject of a module.
pub(super) fn audit_digest(digest: &Digest) -> htfaas_functions::audit::Subject {
    htfaas_functions::audit::Subject { digest: Some(digest.as_str().to_owned()), ..Default::default() }
}

/// The audit subject of a registered function.
pub(super) fn audit_function(record: &htfaas_functions::FunctionRecord) -> htfaas_functions::audit::Subject {
    let m = &record.manifest;
    htfaas_functions::audit::Subject {
        function: Some(m.name.clone()),
        owner: Some(m.owner.clone()),
        digest: Some(m.module.as_str().to_owned()),
        paths: vec![m.outputs.dir.clone()],
        ..Default::default()
    }
}

/// What a registration's record keeps of the function: version and trigger.
pub(super) fn audit_args(record: &htfaas_functions::FunctionRecord) -> serde_json::Value {
    serde_json::json!({ "version": record.version, "trigger": record.manifest.trigger })
}

/// Most steps a lineage follows back from the file asked about.
pub const MAX_LINEAGE_DEPTH: u32 = 16;
/// Most jobs one lineage lists (then `truncated`).
pub const MAX_LINEAGE_STEPS: usize = 256;
/// Most records read per query of a lineage.
const LINEAGE_QUERY_LIMIT: u64 = 10_000;

/// The name of the credential of a request (its API token's `sub`, the owner an OIDC token
/// maps to, or `admin` for the admin token), as the audit trail names actors; never the
/// credential itself.
pub fn actor(shared: &Shared, headers: &axum::http::HeaderMap) -> String {
    shared.require_caller(headers).map(|c| c.name).unwrap_or_else(|_| "unknown".into())
}

/// Records the action `action` on `subject` (with `args`) by the caller of `headers`, after it
/// succeeded; a failure to record is logged, not answered: the action is done.
pub async fn record_admin(
    shared: &Shared,
    headers: &axum::http::HeaderMap,
    action: &str,
    subject: Subject,
    args: Value,
) {
    record_action(shared, &actor(shared, headers), action, subject, args).await;
}

/// [`record_admin`] for an `actor` already known.
pub async fn record_action(shared: &Shared, actor: &str, action: &str, subject: Subject, args: Value) {
    let draft = crate::audit::admin_action(actor, action, subject, args);
    if let Err(e) = shared.firings.append_async(draft).await {
        tracing::error!(action, actor, "failed to record an admin action in the audit trail: {e}");
    }
}

/// [`record_admin`] when the scheduler's `response` to a forwarded action is a success; returns
/// the response as it came.
pub async fn record_forwarded(
    shared: &Shared,
    headers: &axum::http::HeaderMap,
    action: &str,
    subject: Subject,
    args: Value,
    response: axum::response::Response,
) -> axum::response::Response {
    if response.status().is_success() {
        record_admin(shared, headers, action, subject, args).await;
    }
    response
}

/// Records a replay (not a dry run): its id, function and window, and what it fired.
pub async fn record_replay(
    shared: &Shared,
    headers: &axum::http::HeaderMap,
    mode: &replay::Mode,
    report: &htfaas_functions::proto::Report,
) {
    if let replay::Mode::Replay(id) = mode {
        let subject = Subject {
            function: report.functions.first().cloned().filter(|_| report.functions.len() == 1),
            ..Subject::default()
        };
        let args = json!({ "replay_id": id, "functions": report.functions, "since": report.since,
            "until": report.until, "matched": report.matched });
        record_admin(shared, headers, "events.replay", subject, args).await;
    }
}

/// The gateway trail's records that `filter` selects, read on a connection of their own.
pub async fn query(firings: &Firings, filter: AuditFilter) -> Result<Vec<AuditRecord>, AuditError> {
    let path = firings.path().to_owned();
    tokio::task::spawn_blocking(move || audit::query(&path, &filter))
        .await
        .map_err(|e| AuditError::Corrupt(format!("query task: {e}")))?
}

/// The gateway's trail (in the firing table's file) checked under its own key (`signer`'s).
pub async fn verify(firings: &Firings, signer: &AuditSigner) -> Result<VerifyReport, AuditError> {
    let path = firings.path().to_owned();
    let keys = signer.keys();
    tokio::task::spawn_blocking(move || audit::verify(&path, &keys))
        .await
        .map_err(|e| AuditError::Corrupt(format!("verify task: {e}")))?
}

/// Why a lineage could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum LineageError {
    /// The scheduler's trail could not be read.
    #[error("scheduler audit trail: {0}")]
    Scheduler(String),
    /// The gateway's own trail could not be read.
    #[error("gateway audit trail: {0}")]
    Gateway(AuditError),
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<AuditError> for LineageError {
    fn from(e: AuditError) -> LineageError {
        LineageError::Gateway(e)
    }
}

/// The scheduler's records that `filter` selects, over its admin API.
pub(super) async fn scheduler_records(
    scheduler: &Scheduler<'_>,
    filter: &AuditFilter,
) -> Result<Vec<AuditRecord>, LineageError> {
    let base = format!("{}/v1/audit", scheduler.url);
    let mut url = reqwest::Url::parse(&base).map_err(|e| LineageError::Scheduler(format!("{base}: {e}")))?;
    {
        let mut q = url.query_pairs_mut();
        for (key, value) in [("file", &filter.file), ("job", &filter.job)] {
            if let Some(v) = value {
                q.append_pair(key, v);
            }
        }
        q.append_pair("limit", &LINEAGE_QUERY_LIMIT.to_string());
    }
    let resp = scheduler
        .http
        .get(url)
        .bearer_auth(scheduler.admin_token)
        .send()
        .await
        .map_err(|e| LineageError::Scheduler(format!("unreachable: {e}")))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| LineageError::Scheduler(e.to_string()))?;
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body);
        return Err(LineageError::Scheduler(format!("{status}: {}", crate::storage_client::snippet(&text))));
    }
    serde_json::from_slice(&body).map_err(|e| LineageError::Scheduler(format!("bad answer: {e}")))
}

/// The output paths a job's records name (`detail.outputs[].path`, whichever record holds them).
fn outputs_of(records: &[AuditRecord]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in records {
        for o in r.detail.get("outputs").and_then(Value::as_array).into_iter().flatten() {
            if let Some(p) = o.get("path").and_then(Value::as_str)
                && !out.iter().any(|x| x == p)
            {
                out.push(p.to_owned());
            }
        }
    }
    out
}

/// The reference files a job's records name (`detail.refs[]` of its `job.finished` records).
fn refs_of(records: &[AuditRecord]) -> Vec<LineageRef> {
    let mut out: Vec<LineageRef> = Vec::new();
    for r in records.iter().filter(|r| r.kind == AuditKind::JobFinished) {
        for f in r.detail.get("refs").and_then(Value::as_array).into_iter().flatten() {
            let (Some(path), Some(sha256)) =
                (f.get("path").and_then(Value::as_str), f.get("sha256").and_then(Value::as_str))
            else {
                continue;
            };
            if !out.iter().any(|x| x.path == path && x.sha256 == sha256) {
                out.push(LineageRef { path: path.to_owned(), sha256: sha256.to_owned() });
            }
        }
    }
    out
}

/// The lineage of `file`, at most `max_depth` (≤ [`MAX_LINEAGE_DEPTH`]) steps back: the
/// scheduler's trail read over its admin API (`scheduler`), the gateway's in `firings`' file.
pub async fn lineage(
    scheduler: &Scheduler<'_>,
    firings: &Firings,
    file: &str,
    max_depth: u32,
) -> Result<Lineage, LineageError> {
    let max_depth = max_depth.min(MAX_LINEAGE_DEPTH);
    let mut lineage = Lineage { file: file.to_owned(), steps: Vec::new(), truncated: false };
    let mut files_seen = HashSet::new();
    let mut jobs_seen = HashSet::new();
    let mut queue = VecDeque::from([(file.to_owned(), 0u32)]);
    while let Some((path, depth)) = queue.pop_front() {
        if !files_seen.insert(path.clone()) {
            continue;
        }
        let by_file = AuditFilter { file: Some(path.clone()), ..AuditFilter::default() };
        let mut jobs: Vec<String> = Vec::new();
        for r in scheduler_records(scheduler, &by_file).await? {
            if let Some(j) = r.subject.job
                && !jobs.contains(&j)
            {
                jobs.push(j);
            }
        }
        for job in jobs {
            if jobs_seen.contains(&job) {
                continue;
            }
            let records =
                scheduler_records(scheduler, &AuditFilter { job: Some(job.clone()), ..AuditFilter::default() }).await?;
            let outputs = outputs_of(&records);
            let relation = if outputs.contains(&path) { LineageRelation::Wrote } else { LineageRelation::Read };
            // Back from the file asked about: only the jobs that wrote each earlier file.
            if depth > 0 && relation == LineageRelation::Read {
                continue;
            }
            if lineage.steps.len() >= MAX_LINEAGE_STEPS {
                lineage.truncated = true;
                return Ok(lineage);
            }
            jobs_seen.insert(job.clone());
            let step = step(firings, &path, depth, relation, job, records, outputs).await?;
            if relation == LineageRelation::Wrote {
                let read = step.input.iter().chain(step.refs.iter().map(|r| &r.path));
                for input in read {
                    if depth < max_depth {
                        queue.push_back((input.clone(), depth + 1));
                    } else if !files_seen.contains(input) {
                        lineage.truncated = true;
                    }
                }
            }
            lineage.steps.push(step);
        }
    }
    Ok(lineage)
}

/// One job of a lineage: its scheduler records, and the gateway's records of its event and
/// its token, in time order.
async fn step(
    firings: &Firings,
    file: &str,
    depth: u32,
    relation: LineageRelation,
    job: String,
    records: Vec<AuditRecord>,
    outputs: Vec<String>,
) -> Result<LineageStep, LineageError> {
    let accepted = records.iter().find(|r| r.kind == AuditKind::JobAccepted);
    let any = accepted.or(records.first());
    let subject = any.map(|r| r.subject.clone()).unwrap_or_default();
    // A run on no file records its input as null; a record from before inputs were recorded
    // has the input as its subject's first path.
    let input = match accepted.and_then(|r| r.detail.get("input")) {
        Some(Value::Null) => None,
        Some(i) => i.get("path").and_then(Value::as_str).map(str::to_owned),
        None => subject.paths.first().cloned(),
    };
    let function_version = accepted.and_then(|r| r.detail.get("function_version").and_then(Value::as_u64));
    let mut gateway = Vec::new();
    if let Some(jti) = &subject.token_jti {
        gateway.extend(query(firings, AuditFilter { token: Some(jti.clone()), ..AuditFilter::default() }).await?);
    }
    if let Some(event) = &subject.event_id {
        let of_event = query(firings, AuditFilter { event_id: Some(event.clone()), ..AuditFilter::default() }).await?;
        // The event's own records; another job's token records of the same event are not this one's.
        gateway.extend(of_event.into_iter().filter(|r| {
            r.subject.token_jti.is_none()
                && (r.subject.function.is_none() || r.subject.function == subject.function)
                && r.kind != AuditKind::AdminAction
        }));
    }
    gateway.sort_by_key(|r| r.seq);
    gateway.dedup_by_key(|r| r.seq);
    let matched = gateway.iter().find(|r| r.kind.as_str() == EVENT_MATCHED);
    let rule = matched.and_then(|r| {
        let functions = r.detail.get("functions")?.as_array()?;
        let f = functions.iter().find(|f| f.get("name").and_then(Value::as_str) == subject.function.as_deref())?;
        let glob = f.get("glob").and_then(Value::as_str).map(|g| format!("path glob {g:?}"));
        let rule = f.get("rule").and_then(Value::as_str).map(str::to_owned);
        match (glob, rule) {
            (Some(g), Some(r)) => Some(format!("{g} and ({r})")),
            (g, r) => g.or(r),
        }
    });
    let caused_by = matched
        .and_then(|r| r.detail.get("caused_by"))
        .filter(|v| !v.is_null())
        .and_then(|v| serde_json::from_value::<Cause>(v.clone()).ok())
        .or_else(|| {
            accepted
                .and_then(|r| r.detail.pointer("/event/caused_by"))
                .filter(|v| !v.is_null())
                .and_then(|v| serde_json::from_value(v.clone()).ok())
        });
    let macaroons: Vec<String> = gateway
        .iter()
        .filter(|r| r.kind == AuditKind::MacaroonsObtained)
        .flat_map(|r| r.detail.get("macaroons").and_then(Value::as_array).cloned().unwrap_or_default())
        .filter_map(|m| m.get("identifier").and_then(Value::as_str).map(str::to_owned))
        .collect();
    let refs = refs_of(&records);
    let mut all: Vec<AuditRecord> = gateway.into_iter().chain(records).collect();
    all.sort_by_key(|a| (a.time_ms, a.writer != AUDIT_WRITER, a.seq));
    Ok(LineageStep {
        depth,
        file: file.to_owned(),
        relation,
        job,
        function: subject.function,
        function_version,
        digest: subject.digest,
        owner: subject.owner,
        token_jti: subject.token_jti,
        event_id: subject.event_id,
        rule,
        caused_by,
        input,
        outputs,
        refs,
        macaroons,
        records: all,
    })
}
