//! `POST /v1/audit/rerun`: "re-derive this file". The scheduler's trail names the
//! completed job that last wrote the file, with the sha256 it wrote and the sha256 of the input
//! it read; that job's function version runs again on the same input, into a scratch directory
//! of its output directory ([`htfaas_functions::proto::rerun`]), as a job of the same owner
//! with a token and macaroons of its own. The EP runs nothing unless the input still has the
//! recorded bytes. The caller compares the outputs ([`htfaas_functions::proto::rerun::verdict`]).
//!
//! A developer re-derives only its own files: another owner's file answers 404 exactly as a file
//! no job wrote. The re-run acts as the original job's owner ([`crate::jobs::RunsAs`]), in that
//! job's accounting group: a re-run of a bearer's manual run of another owner's function is the
//! bearer's, in the bearer's namespace, without the function owner's secrets (refused when the
//! function has some), never the function's owner's. The re-run is recorded in the gateway's trail (`audit.rerun`, with its actor,
//! token `jti` and macaroon identifiers). Its outputs fire nothing (the gateway ignores events in
//! scratch directories) and are ordinary outputs otherwise: the storage keeps them.
//!
//! Must not know: the firing table, the JetStream consumer.

use super::{audit, blocking, runs};
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use htfaas_functions::audit::{AuditFilter, AuditRecord, MacaroonFacts, Subject};
use htfaas_functions::proto::rerun::scratch_dir;
use htfaas_functions::proto::{EventRef, JobRecord, JobState, Rerun, RerunRequest};
use serde_json::{Value, json};
use std::sync::Arc;

/// What the trail says of the run that last wrote a file.
#[derive(Debug)]
struct Wrote {
    job: String,
    sha256: String,
    /// Its input; none for a run on no file.
    input: Option<String>,
    input_sha256: Option<String>,
    /// The reference files it read: storage path and sha256.
    refs: Vec<(String, String)>,
}

fn not_written(file: &str) -> HttpError {
    HttpError(StatusCode::NOT_FOUND, format!("no completed job of yours wrote {file}"))
}

fn conflict(why: String) -> HttpError {
    HttpError(StatusCode::CONFLICT, why)
}

/// The completed run among `records` (the scheduler's, by file) that last wrote `file`.
fn last_writer(records: &[AuditRecord], file: &str) -> Option<Wrote> {
    records.iter().rev().find_map(|r| {
        let d = &r.detail;
        if r.kind.as_str() != "job.finished" || d.get("state").and_then(Value::as_str) != Some("completed") {
            return None;
        }
        let out = d.get("outputs")?.as_array()?.iter().find(|o| o.get("path").and_then(Value::as_str) == Some(file))?;
        let input = d.get("input").filter(|i| !i.is_null());
        Some(Wrote {
            job: r.subject.job.clone()?,
            sha256: out.get("sha256")?.as_str()?.to_owned(),
            input: match input {
                Some(i) => Some(i.get("path")?.as_str()?.to_owned()),
                None => None,
            },
            input_sha256: input.and_then(|i| i.get("sha256")).and_then(Value::as_str).map(str::to_owned),
            refs: d
                .get("refs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|f| Some((f.get("path")?.as_str()?.to_owned(), f.get("sha256")?.as_str()?.to_owned())))
                .collect(),
        })
    })
}

/// Pins each reference file of a re-run to the bytes the run it re-derives read (`read`: storage
/// path and sha256). The same version names the same references, but a directory reference is
/// listed again: a file read then and gone now, or new since, changes the constants, and the
/// re-run is refused (409) rather than run on others.
fn pin_references(
    refs: &mut [htfaas_functions::proto::ReferenceInput],
    read: &[(String, String)],
) -> Result<(), HttpError> {
    if refs.len() != read.len() {
        return Err(conflict(format!(
            "the function's reference inputs now hold {} files, the run re-derived read {}: it cannot be re-derived \
             with the same constants",
            refs.len(),
            read.len()
        )));
    }
    for r in refs.iter_mut() {
        let path = format!("/{}", r.path);
        let Some((_, sha256)) = read.iter().find(|(p, _)| *p == path) else {
            return Err(conflict(format!(
                "reference {path} was not read by the run re-derived: the constants changed"
            )));
        };
        r.sha256 = Some(sha256.clone());
    }
    Ok(())
}

/// `POST /v1/audit/rerun`.
pub(super) async fn rerun(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let request: RerunRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid RerunRequest: {e}")))?;
    let file = request.file;
    if !htfaas_functions::manifest::is_clean_abs_path(&file) || file.ends_with('/') {
        return Err(HttpError(StatusCode::BAD_REQUEST, format!("{file:?} is not a clean absolute file path")));
    }
    let scheduler = shared.scheduler();
    let by_file = AuditFilter { file: Some(file.clone()), ..AuditFilter::default() };
    let records = audit::scheduler_records(&scheduler, &by_file)
        .await
        .map_err(|e| HttpError(StatusCode::BAD_GATEWAY, format!("the writer of {file}: {e}")))?;
    let wrote = last_writer(&records, &file).ok_or_else(|| not_written(&file))?;
    let job: JobRecord = super::forward::scheduler_json(&scheduler, &format!("/v1/jobs/{}", wrote.job)).await?;
    if !caller.owns(&job.owner) || job.state != JobState::Completed {
        return Err(not_written(&file));
    }
    let Some(input) = wrote.input.clone() else {
        return Err(conflict(format!(
            "job {} ran on no file: a re-run re-derives a file from the input it read, and {file} has none",
            job.id
        )));
    };
    let Some(input_sha256) = wrote.input_sha256.clone() else {
        return Err(conflict(format!(
            "job {} recorded no checksum of its input {input} (its EP predates re-runs): {file} cannot be re-derived",
            job.id
        )));
    };
    let function = {
        let s = shared.clone();
        let name = job.function.clone();
        blocking(move || s.registry.versions(&name)).await
    }
    .ok()
    .and_then(|v| v.into_iter().find(|f| f.version == job.version && f.manifest.module == job.digest))
    .ok_or_else(|| conflict(format!("version {} of function {} is no longer registered", job.version, job.function)))?;
    let m = &function.manifest;
    let Some(output_name) = file.strip_prefix(m.outputs.dir.as_str()).filter(|n| !n.contains('/') && !n.is_empty())
    else {
        return Err(conflict(format!("{file} is not in the output directory {} of {}", m.outputs.dir, m.name)));
    };
    // The scratch directory: the function's own output directory, so its write namespace holds it.
    let id = format!("{}.{}", job.id, htfaas_functions::token::random_tag());
    let scratch = scratch_dir(&m.outputs.dir, &id);
    let mut again = function.clone();
    again.manifest.outputs.dir = scratch.clone();
    again.manifest.outputs.replace = false;
    again.manifest.outputs.on_failure = htfaas_functions::manifest::FailedOutputs::Discard;
    again.manifest.retry = None;
    let event = EventRef::new("rerun", format!("rerun:{id}"), input.clone());
    let runs_as = crate::jobs::RunsAs::of(m, &job.owner, job.group.as_deref());
    // A collecting function's run read its group's other files beside its input: the same
    // files again, each pinned below as its constants are.
    let members: Vec<String> = match &m.trigger.collect {
        Some(_) => wrote.refs.iter().map(|(p, _)| p.clone()).collect(),
        None => Vec::new(),
    };
    let mut submit = crate::jobs::prepare(shared.jobs(), &again, runs_as, event, format!("rerun:{id}"), &members)
        .await
        .map_err(|e| match e {
            crate::jobs::JobError::Transient(e) => HttpError(StatusCode::SERVICE_UNAVAILABLE, e),
            crate::jobs::JobError::Permanent(e) => HttpError(StatusCode::FORBIDDEN, e),
        })?;
    if let Some(read) = submit.input.as_mut() {
        read.sha256 = Some(input_sha256.clone());
    }
    pin_references(&mut submit.refs, &wrote.refs)?;
    let (claims, token) = shared
        .submitter
        .mint(&job.owner, job.group.as_deref(), &submit)
        .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("mint the re-run's token: {e}")))?;
    submit.renewal = Some(
        shared
            .submitter
            .grant(&job.owner, &claims.jti, &scratch, &submit)
            .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("mint the renewal grant: {e}")))?,
    );
    let reply = shared.submitter.submit_with_token(&token, &submit).await.map_err(runs::scheduler_failure)?;
    let read = submit.input.as_ref().map(|i| ("read", &i.macaroon));
    let macaroons: Vec<MacaroonFacts> = read
        .into_iter()
        .chain([("write", &submit.output.macaroon)])
        .filter_map(|(role, bearer)| MacaroonFacts::from_bearer(role, bearer).ok())
        .collect();
    let subject = Subject {
        job: Some(job.id.clone()),
        owner: Some(job.owner.clone()),
        function: Some(job.function.clone()),
        digest: Some(job.digest.as_str().to_owned()),
        token_jti: Some(claims.jti.clone()),
        paths: vec![file.clone(), input.clone()],
        ..Subject::default()
    };
    let args = json!({ "rerun_job": reply.job_id, "scratch": scratch, "sha256": wrote.sha256,
        "input_sha256": input_sha256, "macaroons": macaroons });
    let record = crate::audit::admin_action(&caller.name, "audit.rerun", subject, args);
    if let Err(e) = shared.firings.append_async(record).await {
        tracing::error!(file, "failed to record a re-run in the audit trail: {e}");
    }
    tracing::info!(file, job = %job.id, rerun_job = %reply.job_id, by = %caller.name, "re-run submitted");
    let answer = Rerun {
        expected: format!("{scratch}{output_name}"),
        file,
        sha256: wrote.sha256,
        job: job.id,
        function: job.function,
        version: job.version,
        digest: job.digest,
        input,
        input_sha256,
        scratch,
        rerun_job: reply.job_id,
    };
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}
