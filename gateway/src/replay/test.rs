//! `htfaas fn test`: how one message (given, or recorded) parses and what one function's
//! trigger says about it, part by part ([`test_event`]).
//!
//! Must not know: firings, HTTP.

use super::ReplayError;
use super::reader::{Events, unavailable};
use async_nats::jetstream;
use htfaas_functions::proto::{EVENTS_STREAM, PartVerdict, TestReport, TestRequest};
use htfaas_functions::sources::{self, Decision, SourcePolicy};
use htfaas_functions::trigger::{Rule, Truth};
use htfaas_functions::{FunctionRecord, Trigger};

/// Most headers a test request may give.
const MAX_TEST_HEADERS: usize = 64;

/// Tests `record`'s trigger on the message `request` gives or names (`events` reads a recorded
/// one), parsed with `policy` and held to `bindings` (the paths its subject may speak for) as
/// the ingest does.
pub async fn test_request(
    events: Option<&Events>,
    record: &FunctionRecord,
    request: &TestRequest,
    policy: &SourcePolicy,
    bindings: &htfaas_functions::sources::binding::Bindings,
) -> Result<TestReport, ReplayError> {
    match (&request.event, request.seq) {
        (Some(event), None) => {
            if request.headers.len() > MAX_TEST_HEADERS {
                return Err(ReplayError::BadRequest(format!("at most {MAX_TEST_HEADERS} headers")));
            }
            let mut headers = async_nats::HeaderMap::new();
            for (name, value) in &request.headers {
                let n: async_nats::header::HeaderName =
                    name.parse().map_err(|e| ReplayError::BadRequest(format!("header name {name:?}: {e}")))?;
                let v: async_nats::HeaderValue =
                    value.parse().map_err(|e| ReplayError::BadRequest(format!("header {name} value: {e}")))?;
                headers.insert(n, v);
            }
            let payload = serde_json::to_vec(event).map_err(|e| ReplayError::BadRequest(format!("event: {e}")))?;
            let subject = request.subject.as_deref().unwrap_or(htfaas_functions::proto::EVENTS_SUBJECT);
            let headers = (!request.headers.is_empty()).then_some(&headers);
            Ok(test_event(record, subject, headers, &payload, "test", policy, bindings))
        }
        (None, Some(seq)) => {
            if request.subject.is_some() || !request.headers.is_empty() {
                return Err(ReplayError::BadRequest("a recorded message (seq) has its own subject and headers".into()));
            }
            let Some(Events(js)) = events else {
                return Err(ReplayError::Unavailable("the gateway reads no recorded events".into()));
            };
            let stream =
                js.get_stream(EVENTS_STREAM).await.map_err(|e| unavailable("the events stream")(e.to_string()))?;
            let message = stream.get_raw_message(seq).await.map_err(|e| {
                if matches!(e.kind(), jetstream::stream::RawMessageErrorKind::NoMessageFound) {
                    ReplayError::NotFound(format!("no recorded message with sequence {seq}"))
                } else {
                    unavailable("read a recorded message")(e.to_string())
                }
            })?;
            let headers = (!message.headers.is_empty()).then_some(&message.headers);
            let id = format!("nats-seq-{seq}");
            Ok(test_event(record, &message.subject, headers, &message.payload, &id, policy, bindings))
        }
        _ => Err(ReplayError::BadRequest("give either event (with subject, headers) or seq".into())),
    }
}

/// `true`, `false` or `undefined`.
pub fn truth_str(t: Truth) -> &'static str {
    match t {
        Truth::True => "true",
        Truth::False => "false",
        Truth::Undefined => "undefined",
    }
}

/// Parses one message as the ingest would (`subject`, `headers`, `payload`, `message_id`) and
/// evaluates `record`'s trigger on it.
pub fn test_event(
    record: &FunctionRecord,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    message_id: &str,
    policy: &SourcePolicy,
    bindings: &htfaas_functions::sources::binding::Bindings,
) -> TestReport {
    let trigger: &Trigger = &record.manifest.trigger;
    let mut report = TestReport {
        function: record.manifest.name.clone(),
        version: record.version,
        trigger: trigger.to_string(),
        outcome: String::new(),
        reason: None,
        event: None,
        verdict: None,
        parts: Vec::new(),
        own_output: false,
        fires: false,
        group: None,
    };
    let event = match sources::decide_bound(subject, headers, payload, message_id, policy, bindings) {
        Ok(Decision::Fire(e)) => e,
        Ok(Decision::Ignore(why)) => {
            report.outcome = "ignored".into();
            report.reason = Some(why.to_owned());
            return report;
        }
        Ok(Decision::NotEnabled(ty)) => {
            report.outcome = "not-enabled".into();
            report.reason = Some(format!("type {ty} is not enabled by the site"));
            return report;
        }
        Err(e @ sources::EventError::OutOfBounds { .. }) => {
            report.outcome = "out-of-bounds".into();
            report.reason = Some(e.to_string());
            return report;
        }
        Err(e) => {
            report.outcome = "malformed".into();
            report.reason = Some(e.to_string());
            return report;
        }
    };
    report.outcome = "event".into();
    let whole = trigger.compile().map(|r| r.evaluate(&event));
    report.verdict = Some(match &whole {
        Ok(t) => truth_str(*t).to_owned(),
        Err(e) => format!("the trigger does not compile: {e}"),
    });
    if !trigger.path.is_empty()
        && let Ok(rule) = Rule::path_glob(&trigger.path)
    {
        let verdict = truth_str(rule.evaluate(&event)).to_owned();
        report.parts.push(PartVerdict { part: "path".into(), text: trigger.path.clone(), verdict });
    }
    if let Some(text) = &trigger.rule
        && let Ok(rule) = Rule::parse(text)
    {
        let verdict = truth_str(rule.evaluate(&event)).to_owned();
        report.parts.push(PartVerdict { part: "rule".into(), text: text.clone(), verdict });
    }
    report.own_output = event.path.starts_with(&record.manifest.outputs.dir);
    report.fires = whole == Ok(Truth::True) && !report.own_output;
    report.event = Some(*event);
    report
}
