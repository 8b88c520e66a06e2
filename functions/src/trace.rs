//! W3C Trace Context: the `traceparent` value that follows one event across every hop (NATS
//! headers, the gateway, the submit request, the scheduler, the Assign, the EP, the storage).
//!
//! An event that brings no `traceparent` (a CloudEvent's extension, a NATS header) gets one
//! derived from its identity ([`TraceParent::for_event`]): a redelivery, a replay of the same
//! record or `htfaas trace EVENT` computes the same trace id without asking anyone. Each hop's
//! span id is derived from its parent's and the hop's name ([`TraceParent::child`]), so the
//! components' own records rebuild the tree.
//!
//! Must not know: NATS, HTTP, `tracing`, any other module of this crate.

use sha2::{Digest as _, Sha256};

/// The `traceparent` header's (and CloudEvents extension's) name.
pub const HEADER: &str = "traceparent";

/// The gateway's span for one function on an event: [`TraceParent::child`] of the event's
/// trace named this prefix and the function's name.
pub const GATEWAY_SPAN: &str = "gateway.fire:";
/// The scheduler's span for a job: a child of the gateway's span named this prefix and the
/// job's id (its time in the queue).
pub const QUEUE_SPAN: &str = "scheduler.queue:";
/// An attempt's span on its EP: a child of the queue's span named this prefix and the
/// attempt's number (the `traceparent` of its Assign).
pub const ATTEMPT_SPAN: &str = "ep.attempt:";

/// A parsed `traceparent`: version 00, the trace id, the parent span id and the sampled flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// 16 bytes, never all zero.
    pub trace_id: [u8; 16],
    /// The span this one continues: 8 bytes, never all zero.
    pub parent_id: [u8; 8],
    /// The `sampled` flag.
    pub sampled: bool,
}

/// Why a `traceparent` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// Not `version-traceid-parentid-flags` in lower-case hex of the right lengths.
    #[error("traceparent is not `vv-<32 hex>-<16 hex>-ff` in lower-case hex")]
    Format,
    /// Version `ff` is forbidden by the specification.
    #[error("traceparent version ff is invalid")]
    Version,
    /// An all-zero trace or parent id.
    #[error("traceparent has an all-zero trace id or parent id")]
    Zero,
}

/// Lower-case hex only (the specification refuses upper case).
fn hex_field<const N: usize>(s: &str) -> Result<[u8; N], TraceError> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(TraceError::Format);
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).map_err(|_| TraceError::Format)?;
    Ok(out)
}

impl TraceParent {
    /// Parses a `traceparent` value. A version above 00 is read as 00 when its first four
    /// fields are there (the specification's forward compatibility); `ff` is refused.
    pub fn parse(value: &str) -> Result<TraceParent, TraceError> {
        let value = value.trim();
        // 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55.
        if value.len() < 55 || !value.is_ascii() {
            return Err(TraceError::Format);
        }
        let version: [u8; 1] = hex_field(&value[..2])?;
        if version[0] == 0xff {
            return Err(TraceError::Version);
        }
        if (version[0] == 0 && value.len() != 55) || (value.len() > 55 && value.as_bytes()[55] != b'-') {
            return Err(TraceError::Format);
        }
        let b = value.as_bytes();
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(TraceError::Format);
        }
        let trace_id: [u8; 16] = hex_field(&value[3..35])?;
        let parent_id: [u8; 8] = hex_field(&value[36..52])?;
        let flags: [u8; 1] = hex_field(&value[53..55])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return Err(TraceError::Zero);
        }
        Ok(TraceParent { trace_id, parent_id, sampled: flags[0] & 1 == 1 })
    }

    /// The trace of an event that came without one: ids derived from the event's identity
    /// (its firing key), sampled.
    pub fn for_event(event_key: &str) -> TraceParent {
        let h = Sha256::new().chain_update(b"htfaas-trace\0").chain_update(event_key.as_bytes()).finalize();
        let mut trace_id = [0u8; 16];
        let mut parent_id = [0u8; 8];
        trace_id.copy_from_slice(&h[..16]);
        parent_id.copy_from_slice(&h[16..24]);
        TraceParent { trace_id: nonzero(trace_id), parent_id: nonzero(parent_id), sampled: true }
    }

    /// The context a hop named `name` passes on: the same trace, a span id derived from this
    /// one's and the name (the same hop of the same parent always gets the same id).
    pub fn child(&self, name: &str) -> TraceParent {
        let h = Sha256::new().chain_update(self.parent_id).chain_update(name.as_bytes()).finalize();
        let mut parent_id = [0u8; 8];
        parent_id.copy_from_slice(&h[..8]);
        TraceParent { parent_id: nonzero(parent_id), ..*self }
    }

    /// The scheduler's span for job `job_id` under this (the gateway's) span.
    pub fn queue_span(&self, job_id: &str) -> TraceParent {
        self.child(&format!("{QUEUE_SPAN}{job_id}"))
    }

    /// Attempt `n` of job `job_id` on its EP, under this (the gateway's) span.
    pub fn attempt_span(&self, job_id: &str, n: u32) -> TraceParent {
        self.queue_span(job_id).child(&format!("{ATTEMPT_SPAN}{n}"))
    }

    /// The trace id in lower-case hex (what log lines and `htfaas trace` show).
    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// The span id in lower-case hex.
    pub fn span_id_hex(&self) -> String {
        hex::encode(self.parent_id)
    }
}

/// Whether `s` is a trace id as [`TraceParent::trace_id_hex`] writes it: 32 lower-case hex
/// digits, not all zero.
pub fn is_trace_id(s: &str) -> bool {
    hex_field::<16>(s).is_ok_and(|id| id != [0; 16])
}

/// `bytes`, or the same with its last byte 1 when all are zero (a hash almost never is).
fn nonzero<const N: usize>(mut bytes: [u8; N]) -> [u8; N] {
    if bytes.iter().all(|b| *b == 0) {
        bytes[N - 1] = 1;
    }
    bytes
}

impl std::fmt::Display for TraceParent {
    /// The `traceparent` value, version 00.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "00-{}-{}-{:02x}", self.trace_id_hex(), self.span_id_hex(), u8::from(self.sampled))
    }
}

impl std::str::FromStr for TraceParent {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<TraceParent, TraceError> {
        TraceParent::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specifications_example_round_trips() {
        let t = TraceParent::parse(SPEC).expect("the spec's example");
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.span_id_hex(), "00f067aa0ba902b7");
        assert!(t.sampled);
        assert_eq!(t.to_string(), SPEC);
        let unsampled = TraceParent::parse(&SPEC.replace("-01", "-00")).expect("unsampled");
        assert!(!unsampled.sampled);
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\u{e9}",
        ] {
            assert_eq!(TraceParent::parse(bad), Err(TraceError::Format), "{bad:?}");
        }
        assert_eq!(TraceParent::parse(&SPEC.replacen("00", "ff", 1)), Err(TraceError::Version));
        assert_eq!(
            TraceParent::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            Err(TraceError::Zero)
        );
        assert_eq!(
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
            Err(TraceError::Zero)
        );
        // A later version with more fields is read for its first four.
        let later = TraceParent::parse(&format!("{}-what-comes-next", SPEC.replacen("00", "01", 1))).expect("v01");
        assert_eq!(later.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn an_events_trace_and_its_hops_are_derived_the_same_way_every_time() {
        let a = TraceParent::for_event("dcache-billing:write:0000ABCD/door-1");
        assert_eq!(a, TraceParent::for_event("dcache-billing:write:0000ABCD/door-1"));
        assert_ne!(a.trace_id, TraceParent::for_event("dcache-billing:write:0000ABCD/door-2").trace_id);
        let gateway = a.child("gateway");
        assert_eq!(gateway.trace_id, a.trace_id, "a hop stays in the trace");
        assert_ne!(gateway.parent_id, a.parent_id);
        assert_eq!(gateway, a.child("gateway"));
        assert_ne!(gateway.parent_id, a.child("scheduler").parent_id);
        assert_eq!(TraceParent::parse(&gateway.to_string()), Ok(gateway));
        let attempt = gateway.attempt_span("j-1", 2);
        assert_eq!(attempt, gateway.queue_span("j-1").child("ep.attempt:2"));
        assert_ne!(attempt, gateway.attempt_span("j-1", 3));
    }

    #[test]
    fn trace_ids_are_32_lower_case_hex_digits_not_all_zero() {
        assert!(is_trace_id("4bf92f3577b34da6a3ce929d0e0e4736"));
        for bad in
            ["", "4BF92F3577B34DA6A3CE929D0E0E4736", "4bf92f3577b34da6a3ce929d0e0e473", &"0".repeat(32), "x' OR 1=1 --"]
        {
            assert!(!is_trace_id(bad), "{bad:?}");
        }
    }
}
