//! Fuzz target: the bridges' pure parsers, and that what they accept the gateway accepts.
//!
//! - `xrootd::parse_line`: one `ofs.notify` line; every event it yields, published as the
//!   bridge publishes it (`xrootd::cloud_event`), must be fired by the gateway's `decide`;
//! - `sse::SseParser::feed`: a `text/event-stream`, cut into chunks where the input says, must
//!   yield the same items as when fed whole, within the parser's bounds;
//! - `sse::map_inotify`: dCache's inotify event JSON (the `data` of an SSE event); a
//!   published event must be fired by the gateway too.
//!
//! Byte 0 picks the parser; the rest is its input.
#![no_main]

use htfaas_functions::event::{BridgedEvent, CE_TYPE_PREFIX, CloudEvent, SourceKind};
use htfaas_bridges::{sse, xrootd};
use htfaas_functions::sources::{Decision, SourcePolicy, decide};
use libfuzzer_sys::fuzz_target;

/// The gateway must fire the CloudEvent a bridge publishes for `event`.
fn gateway_fires(ce: &CloudEvent, event: &BridgedEvent) {
    let subject = format!("storage.cloudevents.{}", ce.source.len());
    let body = serde_json::to_vec(ce).expect("a CloudEvent serializes");
    match decide(&subject, None, &body, "nats-seq-1", &SourcePolicy::default()) {
        Ok(Decision::Fire(e)) => {
            assert_eq!((e.kind, e.path.as_str(), e.size), (event.kind, event.path.as_str(), event.size));
            assert_eq!(e.msg_type, event.msg_type);
        }
        other => panic!("the gateway refused a bridged event {event:?}: {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let [selector, rest @ ..] = data else { return };
    match selector % 3 {
        0 => {
            let Ok(line) = std::str::from_utf8(rest) else { return };
            let _ = xrootd::owner_of_tid(line);
            if let Ok(events) = xrootd::parse_line(line) {
                for (i, event) in events.iter().enumerate() {
                    let ce = xrootd::cloud_event(event, format!("id-{i}"), "data01.example.org:1094", "t".into());
                    assert!(ce.ty.starts_with(CE_TYPE_PREFIX));
                    gateway_fires(&ce, event);
                }
            }
        }
        1 => {
            // Small bounds so that the refusal paths are reached too.
            let (max_line, max_event) = (64 + usize::from(selector % 7) * 16, 256);
            let mut whole = Vec::new();
            sse::SseParser::new(max_line, max_event).feed(rest, &mut whole);
            let mut chunked = Vec::new();
            let mut parser = sse::SseParser::new(max_line, max_event);
            // Chunk boundaries from the input's own bytes: after every byte below 0x10.
            for chunk in rest.split_inclusive(|b| *b < 0x10) {
                parser.feed(chunk, &mut chunked);
            }
            assert_eq!(whole, chunked, "chunking changed what the SSE parser yields");
            // Finding 1 of the README (fixed): the parser once left the `\n` joining `data`
            // lines out of `max_event`. HTFAAS_FUZZ_SSE_KNOWN=1 checks the looser bound that
            // held before the fix (to reproduce the first run).
            let known = std::env::var_os("HTFAAS_FUZZ_SSE_KNOWN").is_some();
            for item in &whole {
                if let sse::SseItem::Event(e) = item {
                    let separators = if known { e.data.as_ref().map_or(0, |d| d.matches('\n').count()) } else { 0 };
                    assert!(e.data.as_ref().is_none_or(|d| d.len() <= max_event + separators), "data over max_event");
                }
            }
        }
        _ => {
            let Ok(ev) = serde_json::from_slice::<sse::InotifyEvent>(rest) else { return };
            if let Ok(sse::Action::Publish(event)) = sse::map_inotify(&ev, "/data/watched") {
                let ce = CloudEvent {
                    specversion: "1.0".into(),
                    id: "1".into(),
                    source: "https://frontend.example.org:3880/api/v1/events/channels/c".into(),
                    ty: format!("{CE_TYPE_PREFIX}{}.{}", SourceKind::DcacheSse.as_str(), event.msg_type),
                    subject: Some(event.path.clone()),
                    time: None,
                    datacontenttype: Some("application/json".into()),
                    data: serde_json::to_value(&event).ok(),
                    extensions: Default::default(),
                };
                gateway_fires(&ce, &event);
            }
        }
    }
});
