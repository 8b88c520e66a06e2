//! OTLP export of each ended job's spans: when `otlp_endpoint` is set, the scheduler
//! sends, once a job has ended for good, its span tree ([`htfaas_functions::spans::job_spans`]:
//! the gateway's span, the queue, each attempt and its phases) to an OpenTelemetry collector
//! over OTLP/HTTP (JSON), with the trace and span ids every hop derived and logged — so the
//! collector's tree and `htfaas trace` are one tree, and a producer that sent a `traceparent`
//! finds htfaas's spans in its own trace.
//!
//! Built from the records, not from live `tracing` spans: what is exported is what the store
//! committed (an EP's phases after the scheduler's clamp), and a restart loses nothing already
//! recorded. Export is best effort, in the background, in batches: the jobs that end within
//! [`BATCH_WAIT`] of each other (at most [`MAX_BATCH_JOBS`]) go in one request, one try per
//! batch; at most [`MAX_WAITING`] jobs wait, a job past them is not exported (warned). A
//! collector that is down costs a warning, never a job. Batching is what makes export cheap:
//! one request per job cost the scheduler 0.44 ms of CPU per job at 300 jobs/s (`htfaas
//! bench`, `end_costs.otlp`), most of it the request.
//!
//! Must not know: the attach protocol, routes, how a job's end was decided.

use crate::queue::Queue;
use htfaas_functions::proto::{JobRecord, JobState};
use htfaas_functions::spans::{Span, job_spans};
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};
use tokio::sync::mpsc;

/// How long one export may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long a batch waits for more ended jobs after its first.
pub const BATCH_WAIT: Duration = Duration::from_millis(200);
/// Most jobs in one export request.
pub const MAX_BATCH_JOBS: usize = 512;
/// Most ended jobs waiting for their export; a job ending beyond them is not exported (warned).
pub const MAX_WAITING: usize = 8192;

/// Why the exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("otlp_endpoint {endpoint:?}: {reason}")]
pub struct OtlpError {
    endpoint: String,
    reason: String,
}

/// The ended jobs waiting for their export, once the batching task runs.
type Waiting = Arc<Mutex<Option<mpsc::Sender<(Queue, String)>>>>;

/// The exporter, and the queue of ended jobs its batching task exports (started with the first).
#[derive(Clone)]
pub struct Otlp {
    exporter: Arc<opentelemetry_otlp::SpanExporter>,
    waiting: Waiting,
    scope: InstrumentationScope,
}

impl std::fmt::Debug for Otlp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Otlp").finish_non_exhaustive()
    }
}

/// opentelemetry-otlp's HTTP transport over the workspace's reqwest.
#[derive(Debug)]
struct Client(reqwest::Client);

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut req = self.0.request(parts.method, parts.uri.to_string()).timeout(TIMEOUT).body(body);
        for (name, value) in &parts.headers {
            req = req.header(name, value);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        Ok(Response::builder().status(status).body(body)?)
    }
}

impl Otlp {
    /// An exporter to `endpoint` (the collector's full traces URL, e.g.
    /// `http://127.0.0.1:4318/v1/traces`), sending with `http`.
    pub fn new(endpoint: &str, http: reqwest::Client) -> Result<Otlp, OtlpError> {
        let err = |reason: String| OtlpError { endpoint: endpoint.to_owned(), reason };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(err("must be an http(s) URL".into()));
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_endpoint(endpoint)
            .with_timeout(TIMEOUT)
            .with_http_client(Client(http))
            .build()
            .map_err(|e| err(e.to_string()))?;
        Ok(Otlp {
            exporter: Arc::new(exporter),
            waiting: Arc::new(Mutex::new(None)),
            scope: InstrumentationScope::builder("htfaas-scheduler").with_version(env!("CARGO_PKG_VERSION")).build(),
        })
    }

    /// Exports job `job_id`'s spans in the background, once it has ended for good, in the next
    /// batch.
    pub fn job_ended(&self, queue: Queue, job_id: String) {
        let sender = {
            let mut waiting = self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match waiting.as_ref().filter(|tx| !tx.is_closed()) {
                Some(tx) => tx.clone(),
                None => {
                    let (tx, rx) = mpsc::channel(MAX_WAITING);
                    // The task holds no sender: it ends once this exporter (every clone) is dropped.
                    tokio::spawn(batches(self.exporter.clone(), self.scope.clone(), rx));
                    *waiting = Some(tx.clone());
                    tx
                }
            }
        };
        if sender.try_send((queue, job_id.clone())).is_err() {
            tracing::warn!(job.id = %job_id, "OTLP export skipped: {MAX_WAITING} ended jobs wait for theirs");
        }
    }
}

/// Exports the ended jobs of `rx` with `exporter`, a batch at a time, until every sender is gone.
async fn batches(
    exporter: Arc<opentelemetry_otlp::SpanExporter>,
    scope: InstrumentationScope,
    mut rx: mpsc::Receiver<(Queue, String)>,
) {
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        let deadline = tokio::time::Instant::now() + BATCH_WAIT;
        while jobs.len() < MAX_BATCH_JOBS {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(job)) => jobs.push(job),
                _ => break,
            }
        }
        let mut batch = Vec::new();
        for (queue, job_id) in &jobs {
            match spans(queue, job_id, &scope).await {
                Ok(spans) => batch.extend(spans),
                Err(e) => tracing::warn!(job.id = %job_id, "OTLP export skipped: {e}"),
            }
        }
        if !batch.is_empty()
            && let Err(e) = exporter.export(batch).await
        {
            tracing::warn!(jobs = jobs.len(), "OTLP export failed: {e}");
        }
    }
}

/// The spans of job `job_id`, once it has ended for good (none before).
async fn spans(queue: &Queue, job_id: &str, scope: &InstrumentationScope) -> Result<Vec<SpanData>, String> {
    let job = queue.get(job_id.to_owned()).await.map_err(|e| e.to_string())?.ok_or("the job is gone")?;
    if !matches!(job.state, JobState::Completed | JobState::Failed | JobState::Removed) {
        return Ok(Vec::new());
    }
    let attempts = queue.history(job_id.to_owned()).await.map_err(|e| e.to_string())?;
    Ok(span_data(&job, &job_spans(&job, &attempts), scope))
}

/// The spans of `job` as OTLP span data: those with ids and both ends only (a job from before
/// traces has none).
pub fn span_data(job: &JobRecord, spans: &[Span], scope: &InstrumentationScope) -> Vec<SpanData> {
    let Some(trace) = job.event.trace_parent() else { return Vec::new() };
    let trace_id = TraceId::from_bytes(trace.trace_id);
    let id = |hex: &Option<String>| {
        hex.as_deref().and_then(|h| u64::from_str_radix(h, 16).ok()).map(|v| SpanId::from_bytes(v.to_be_bytes()))
    };
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    spans
        .iter()
        .filter_map(|s| {
            let span_id = id(&s.span_id)?;
            let (start, end) = (s.start_ms?, s.end_ms?);
            let mut attributes = vec![
                KeyValue::new("htfaas.job.id", job.id.clone()),
                KeyValue::new("htfaas.function", job.function.clone()),
                KeyValue::new("htfaas.owner", job.owner.clone()),
            ];
            if !s.detail.is_empty() {
                attributes.push(KeyValue::new("htfaas.detail", s.detail.clone()));
            }
            let failed = s.name == "ep.attempt" && !s.detail.contains(": completed");
            Some(SpanData {
                span_context: SpanContext::new(trace_id, span_id, TraceFlags::SAMPLED, false, TraceState::default()),
                parent_span_id: id(&s.parent_id).unwrap_or(SpanId::INVALID),
                // The gateway span's parent is the producer's, in another process.
                parent_span_is_remote: s.depth == 0 && s.parent_id.is_some(),
                span_kind: if s.depth == 0 { SpanKind::Consumer } else { SpanKind::Internal },
                name: s.name.clone().into(),
                start_time: at(start),
                end_time: at(end.max(start)),
                attributes,
                dropped_attributes_count: 0,
                events: SpanEvents::default(),
                links: SpanLinks::default(),
                status: if failed { Status::error(s.detail.clone()) } else { Status::Unset },
                instrumentation_scope: scope.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix ms of `t`.
    fn ms(t: std::time::SystemTime) -> u64 {
        u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
    }

    #[test]
    fn spans_keep_their_derived_ids_parents_and_times() {
        let mut job: JobRecord = serde_json::from_value(serde_json::json!({
            "id": "j-1", "owner": "a", "function": "f", "version": 1, "digest": format!("sha256:{}", "0".repeat(64)),
            "state": "completed", "reason": "", "input": "/data/a/x",
            "event": {"source": "s", "id": "e", "path": "/data/a/x", "seen_at_ms": 1_000},
            "token_jti": "t", "token_issuer": "i", "attempts": 1, "resources": {"cpus": 1, "memory_mb": 1, "runtime_s": 1},
            "submitted_at_ms": 1_010, "finished_at_ms": 1_200, "outputs": []
        }))
        .expect("a job");
        let scope = InstrumentationScope::builder("t").build();
        assert!(span_data(&job, &job_spans(&job, &[]), &scope).is_empty(), "no trace, nothing exported");
        let gateway = htfaas_functions::trace::TraceParent::for_event("e").child("gateway.fire:f");
        job.event.trace = Some(gateway.to_string());
        let data = span_data(&job, &job_spans(&job, &[]), &scope);
        assert_eq!(data.len(), 2);
        assert_eq!(data[0].span_context.trace_id().to_bytes(), gateway.trace_id);
        assert_eq!(data[0].span_context.span_id().to_bytes(), gateway.parent_id);
        assert_eq!(data[0].parent_span_id, SpanId::INVALID);
        assert_eq!(data[1].parent_span_id, data[0].span_context.span_id());
        assert_eq!((ms(data[0].start_time), ms(data[0].end_time)), (1_000, 1_010));
        assert_eq!((ms(data[1].start_time), ms(data[1].end_time)), (1_010, 1_200));
    }
}
