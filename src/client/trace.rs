//! `htfaas trace JOB|EVENT|TRACE-ID` (issue 23): one event's span tree, rebuilt from the
//! components' own records — the job records (the gateway's `seen_at_ms` and span carried in
//! the event, the scheduler's submission and end) and each attempt's phases as its EP reported
//! them. The span ids are the ones each hop derived and logged ([`TraceParent::child`]), so a
//! line in any component's log with the same `trace_id` finds its place here.
//!
//! Must not know: how the tree is printed (the CLI's output), the components' stores.

use super::Client;
use htfaas_functions::proto::{Attempt, JobRecord};
use htfaas_functions::trace::{TraceParent, is_trace_id};
use serde::Serialize;

/// One span of the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Span {
    /// `gateway.fire`, `scheduler.queue`, `ep.attempt`, or a phase of an attempt.
    pub name: String,
    /// Span id (16 hex digits), when the hop derives one (phases have none of their own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    /// Depth in the tree: 0 for a job's gateway span.
    pub depth: usize,
    /// Unix ms; none when the record does not say (a job from before issue 23).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<u64>,
    /// Unix ms; none while it lasts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_ms: Option<u64>,
    /// What the record says of it: the function and job, the EP and outcome, …
    pub detail: String,
}

impl Span {
    /// Its length, when both ends are known.
    pub fn ms(&self) -> Option<u64> {
        Some(self.end_ms?.saturating_sub(self.start_ms?))
    }
}

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

/// The spans of one job and its attempts (first first).
pub fn job_spans(job: &JobRecord, attempts: &[Attempt]) -> Vec<Span> {
    let gateway = job.event.trace_parent();
    let id = |t: Option<TraceParent>| t.map(|t| t.span_id_hex());
    let mut spans = vec![
        Span {
            name: "gateway.fire".into(),
            span_id: id(gateway),
            depth: 0,
            start_ms: job.event.seen_at_ms,
            end_ms: Some(job.submitted_at_ms),
            detail: format!("{} v{} → job {}", job.function, job.version, job.id),
        },
        Span {
            name: "scheduler.queue".into(),
            span_id: id(gateway.map(|g| g.queue_span(&job.id))),
            depth: 1,
            start_ms: Some(job.submitted_at_ms),
            end_ms: job.finished_at_ms,
            detail: format!(
                "{}{}",
                job.state.as_str(),
                if job.reason.is_empty() { String::new() } else { format!(": {}", job.reason) }
            ),
        },
    ];
    for a in attempts {
        spans.push(Span {
            name: "ep.attempt".into(),
            span_id: id(gateway.map(|g| g.attempt_span(&job.id, a.n))),
            depth: 2,
            start_ms: Some(a.started_at_ms),
            end_ms: a.ended_at_ms,
            detail: format!(
                "#{} on {}: {}{}",
                a.n,
                a.ep,
                a.outcome,
                if a.reason.is_empty() { String::new() } else { format!(" ({})", a.reason) }
            ),
        });
        let Some(usage) = a.usage.filter(|u| !u.phases.is_unset()) else { continue };
        // The phases one after the other from the attempt's start; what is left of its wall
        // time is the EP's own (slots, directories), and after it the report's way back.
        let mut at = a.started_at_ms;
        for (name, ms) in usage.phases.named() {
            spans.push(Span {
                name: name.into(),
                span_id: None,
                depth: 3,
                start_ms: Some(at),
                end_ms: Some(at.saturating_add(ms)),
                detail: String::new(),
            });
            at = at.saturating_add(ms);
        }
        let ran = a.started_at_ms.saturating_add(usage.wall_ms);
        if let Some(end) = a.ended_at_ms.filter(|e| *e >= ran) {
            spans.push(Span {
                name: "report".into(),
                span_id: None,
                depth: 3,
                start_ms: Some(ran),
                end_ms: Some(end),
                detail: "the EP's report reaches the scheduler".into(),
            });
        }
    }
    spans
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

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::proto::{EventRef, JobState, Phases, Usage};

    fn job(trace: Option<TraceParent>) -> JobRecord {
        let mut event = EventRef::new("s", "e-1", "/data/a/in/x");
        event.trace = trace.map(|t| t.to_string());
        event.seen_at_ms = Some(1_000);
        serde_json::from_value(serde_json::json!({
            "id": "j-1", "owner": "a", "function": "f", "version": 2, "digest": format!("sha256:{}", "0".repeat(64)),
            "state": JobState::Completed.as_str(), "reason": "", "input": "/data/a/in/x", "event": event,
            "token_jti": "t", "token_issuer": "i", "attempts": 1, "resources": {"cpus": 1, "memory_mb": 1, "runtime_s": 1},
            "submitted_at_ms": 1_010, "finished_at_ms": 1_200, "outputs": []
        }))
        .expect("a job record")
    }

    #[test]
    fn a_jobs_spans_are_the_hops_ids_and_its_phases_in_order() {
        let gateway = TraceParent::for_event("e-1").child("gateway.fire:f");
        let phases = Phases { module_ms: 1, compile_ms: 2, input_ms: 3, run_ms: 50, output_ms: 4 };
        let attempt = Attempt {
            n: 1,
            ep: "ep1".into(),
            started_at_ms: 1_100,
            ended_at_ms: Some(1_190),
            outcome: "completed".into(),
            reason: String::new(),
            usage: Some(Usage { wall_ms: 70, phases, ..Usage::default() }),
        };
        let spans = job_spans(&job(Some(gateway)), &[attempt]);
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gateway.fire",
                "scheduler.queue",
                "ep.attempt",
                "fetch module",
                "compile or load",
                "fetch input",
                "run",
                "upload outputs",
                "report"
            ]
        );
        assert_eq!(spans[0].span_id, Some(gateway.span_id_hex()));
        assert_eq!(spans[0].ms(), Some(10), "seen → submitted");
        assert_eq!(spans[1].span_id, Some(gateway.queue_span("j-1").span_id_hex()));
        assert_eq!(spans[2].span_id, Some(gateway.attempt_span("j-1", 1).span_id_hex()));
        assert_eq!(spans[6].start_ms, Some(1_106), "run starts after module, compile and input");
        assert_eq!(spans[8].ms(), Some(20), "the attempt's end minus its wall time");
        // A job from before traces: its spans, without ids.
        let old = job_spans(&job(None), &[]);
        assert!(old.iter().all(|s| s.span_id.is_none()) && old.len() == 2);
    }
}
