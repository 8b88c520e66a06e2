//! `htfaas trace JOB|EVENT|TRACE-ID`: one event's span tree, rebuilt from the
//! components' own records — the jobs of the trace and each one's attempts
//! ([`htfaas_functions::spans::job_spans`]).
//!
//! Must not know: how the tree is printed (the CLI's output), the components' stores.

use super::Client;
pub use htfaas_functions::spans::{Span, job_spans};
use htfaas_functions::trace::{TraceParent, is_trace_id};
use serde::Serialize;

/// One event's trace: its jobs' spans, each job's in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceView {
    /// The trace id (32 hex digits).
    pub trace_id: String,
    /// The event: its id and path, from the first job.
    pub event: Option<(String, String)>,
    /// The spans, a job's gateway span first, then its queue and attempts.
    pub spans: Vec<Span>,
}

impl Client {
    /// The trace of `what`: a trace id, a job id (its event's trace), or an event id (the trace
    /// derived from it, as the gateway does for an event that brought none).
    pub async fn trace(&self, what: &str) -> anyhow::Result<TraceView> {
        let trace_id = if is_trace_id(what) {
            what.to_owned()
        } else if let Ok(job) = self.job(what).await {
            job.event.trace_parent().map(|t| t.trace_id_hex()).ok_or_else(|| {
                anyhow::anyhow!("job {what} has no trace (submitted before traces, or by a token bearer)")
            })?
        } else {
            TraceParent::for_event(what).trace_id_hex()
        };
        let jobs = self.jobs_of_trace(&trace_id).await?;
        anyhow::ensure!(!jobs.is_empty(), "no job of trace {trace_id} (from {what:?})");
        let event = jobs.first().map(|j| (j.event.id.clone(), j.event.path.clone()));
        let mut spans = Vec::new();
        for job in &jobs {
            let attempts = self.job_history(&job.id).await?;
            spans.extend(job_spans(job, &attempts));
        }
        Ok(TraceView { trace_id, event, spans })
    }
}
