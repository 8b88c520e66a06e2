//! One job's span tree, rebuilt from its records: the gateway's span (carried in the
//! job's event with the time the gateway took the event in), the scheduler's queue span, each
//! attempt's span on its EP and that attempt's phases as the EP reported them. Every span's id
//! is the one its hop derived ([`TraceParent::child`]), so `htfaas trace` and the scheduler's
//! OTLP export draw the same tree the components' log lines name.
//!
//! Must not know: where the records come from, how the tree is printed or exported.

use crate::proto::{Attempt, JobRecord};
use crate::trace::TraceParent;
use serde::Serialize;

/// One span of the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Span {
    /// `gateway.fire`, `scheduler.queue`, `ep.attempt`, or a phase of an attempt.
    pub name: String,
    /// Span id (16 hex digits); none for a job from before traces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    /// Its parent's span id: for the gateway's span the producer's (when the event came with a
    /// `traceparent`), else none; none for a job from before traces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// Depth in the tree: 0 for a job's gateway span.
    pub depth: usize,
    /// Unix ms; none when the record does not say (a job recorded by an older release).
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

/// The spans of one job and its attempts (first first): the gateway's, the queue's, and per
/// attempt its own, its phases one after the other from its start, and the report's way back.
pub fn job_spans(job: &JobRecord, attempts: &[Attempt]) -> Vec<Span> {
    let gateway = job.event.trace_parent();
    let hex = |t: Option<TraceParent>| t.map(|t| t.span_id_hex());
    let queue = gateway.map(|g| g.queue_span(&job.id));
    let mut spans = vec![
        Span {
            name: "gateway.fire".into(),
            span_id: hex(gateway),
            parent_id: job
                .event
                .producer_span
                .clone()
                .filter(|p| p.len() == 16 && p.bytes().all(|b| b.is_ascii_hexdigit())),
            depth: 0,
            start_ms: job.event.seen_at_ms,
            end_ms: Some(job.submitted_at_ms),
            detail: format!("{} v{} → job {}", job.function, job.version, job.id),
        },
        Span {
            name: "scheduler.queue".into(),
            span_id: hex(queue),
            parent_id: hex(gateway),
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
        let attempt = gateway.map(|g| g.attempt_span(&job.id, a.n));
        spans.push(Span {
            name: "ep.attempt".into(),
            span_id: hex(attempt),
            parent_id: hex(queue),
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
        // What is left of the wall time after the phases is the EP's own (slots, directories).
        let phase = |name: &str, start: u64, end: u64, detail: &str| Span {
            name: name.into(),
            span_id: hex(attempt.map(|t| t.child(name))),
            parent_id: hex(attempt),
            depth: 3,
            start_ms: Some(start),
            end_ms: Some(end),
            detail: detail.into(),
        };
        let mut at = a.started_at_ms;
        for (name, ms) in usage.phases.named() {
            spans.push(phase(name, at, at.saturating_add(ms), ""));
            at = at.saturating_add(ms);
        }
        let ran = a.started_at_ms.saturating_add(usage.wall_ms);
        if let Some(end) = a.ended_at_ms.filter(|e| *e >= ran) {
            spans.push(phase("report", ran, end, "the EP's report reaches the scheduler"));
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{EventRef, JobState, Phases, Usage};

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
        // Each span's parent is the span above it.
        assert_eq!(spans[1].parent_id, spans[0].span_id);
        assert_eq!(spans[2].parent_id, spans[1].span_id);
        assert!(spans[3..].iter().all(|s| s.parent_id == spans[2].span_id && s.span_id.is_some()));
        assert_eq!(spans[0].parent_id, None, "no producer span: the gateway's span is a root");
        // The producer's span, when the event came with one, is the gateway span's parent; a
        // value that is no span id is not drawn.
        for (producer, parent) in [("00f067aa0ba902b7", Some("00f067aa0ba902b7")), ("not hex at all!!", None)] {
            let mut j = job(Some(gateway));
            j.event.producer_span = Some(producer.into());
            assert_eq!(job_spans(&j, &[]).first().and_then(|s| s.parent_id.clone()).as_deref(), parent);
        }
        assert_eq!(spans[6].start_ms, Some(1_106), "run starts after module, compile and input");
        assert_eq!(spans[8].ms(), Some(20), "the attempt's end minus its wall time");
        // A job from before traces: its spans, without ids.
        let old = job_spans(&job(None), &[]);
        assert!(old.iter().all(|s| s.span_id.is_none() && s.parent_id.is_none()) && old.len() == 2);
    }
}
