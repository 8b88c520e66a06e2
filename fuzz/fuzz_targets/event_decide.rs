//! Fuzz target: the gateway's event decoding, `htfaas_functions::sources::decide` (subject +
//! headers + payload → fire / ignore / not enabled / malformed), for dCache billing JSON (every
//! `msgType`) and CloudEvents in structured and binary mode.
//!
//! Input layout: byte 0 picks the subject and mode, byte 1 the site's [`SourcePolicy`], the
//! rest is the message (see `mode` below). Checked beyond "no panic": a fired event has a
//! clean absolute file path and an id prefixed by its source kind, survives a serde round
//! trip, and deciding twice gives the same answer.
#![no_main]

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use htfaas_functions::event::StorageEvent;
use htfaas_functions::manifest::is_clean_abs_path;
use htfaas_functions::sources::{Decision, SourcePolicy, dcache::MSG_TYPES, decide};
use libfuzzer_sys::fuzz_target;
use std::str::FromStr;

const DCACHE: &str = "storage.dcache.billing";
const CLOUDEVENTS: &str = "storage.cloudevents.fuzz";

/// Content types a producer may declare in structured mode.
const CONTENT_TYPES: [&str; 4] = [
    "application/cloudevents+json",
    "application/cloudevents-batch+json",
    "application/json; charset=utf-8",
    "text/plain",
];

/// `name: value` lines up to the first empty line, then the payload (binary mode).
fn headers_then_payload(data: &[u8]) -> (HeaderMap, &[u8]) {
    let mut headers = HeaderMap::new();
    let mut rest = data;
    while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
        let (line, after) = (&rest[..nl], &rest[nl + 1..]);
        rest = after;
        if line.is_empty() {
            break;
        }
        let Ok(line) = std::str::from_utf8(line) else { continue };
        let Some((name, value)) = line.split_once(':') else { continue };
        // The NATS client only ever hands the gateway valid header names and values.
        if let (Ok(name), Ok(value)) = (HeaderName::from_str(name.trim()), HeaderValue::from_str(value.trim())) {
            headers.insert(name, value);
        }
    }
    (headers, rest)
}

fn policy(bits: u8) -> SourcePolicy {
    let dcache_msg_types =
        MSG_TYPES.iter().enumerate().filter(|(i, _)| bits & (1 << i) != 0).map(|(_, t)| (*t).to_owned()).collect();
    SourcePolicy { dcache_msg_types, cloudevents: bits & 0x40 == 0 }
}

fn check(event: &StorageEvent) {
    assert!(is_clean_abs_path(&event.path) && !event.path.ends_with('/') && event.path != "/", "{:?}", event.path);
    let prefix = format!("{}:", event.source.kind.as_str());
    assert!(event.id.starts_with(&prefix), "id {:?} lacks {prefix:?}", event.id);
    let json = serde_json::to_string(event).expect("a StorageEvent serializes");
    let back: StorageEvent = serde_json::from_str(&json).expect("a serialized StorageEvent parses");
    assert_eq!(&back, event);
}

fuzz_target!(|data: &[u8]| {
    let [mode, bits, rest @ ..] = data else { return };
    let policy = policy(*bits);
    let ct_header;
    let binary_headers;
    let (subject, headers, payload): (String, Option<&HeaderMap>, &[u8]) = match mode % 5 {
        0 => (DCACHE.into(), None, rest),
        1 => (CLOUDEVENTS.into(), None, rest),
        2 => {
            let mut h = HeaderMap::new();
            h.insert("content-type", CONTENT_TYPES[usize::from(mode / 5) % CONTENT_TYPES.len()]);
            ct_header = h;
            (CLOUDEVENTS.into(), Some(&ct_header), rest)
        }
        3 => {
            let (h, payload) = headers_then_payload(rest);
            binary_headers = h;
            (CLOUDEVENTS.into(), Some(&binary_headers), payload)
        }
        // The subject itself from the first line (what `SubjectSource::of` reads).
        _ => {
            let nl = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
            let subject = String::from_utf8_lossy(&rest[..nl]).into_owned();
            (subject, None, rest.get(nl + 1..).unwrap_or_default())
        }
    };
    let first = decide(&subject, headers, payload, "nats-seq-1", &policy);
    if let Ok(Decision::Fire(event)) = &first {
        check(event);
    }
    assert_eq!(first, decide(&subject, headers, payload, "nats-seq-1", &policy), "decide is deterministic");
});
