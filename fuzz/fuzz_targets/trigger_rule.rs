//! Fuzz target: the trigger-rule language, `htfaas_functions::trigger::Rule::parse`, and when a
//! rule parses, its evaluation on events built from the same input.
//!
//! Input layout: the rule text, then optionally a NUL byte and bytes that shape the event
//! (kind, source, size, which optional attributes it has, its path). Checked beyond "no
//! panic": a rule's displayed text parses again and means the same on the event; `matches`
//! is exactly `evaluate == True`; `not (rule)` is the three-valued negation; an event lacking
//! the size, class and owner never makes a rule true that it makes false with them…
//! (see `check`).
#![no_main]

use htfaas_functions::event::{EventKind, EventSource, SourceKind, StorageEvent};
use htfaas_functions::trigger::{Rule, Truth};
use libfuzzer_sys::fuzz_target;

const SOURCES: [SourceKind; 4] =
    [SourceKind::DcacheBilling, SourceKind::DcacheSse, SourceKind::XrootdNotify, SourceKind::Cloudevents];
const PATHS: [&str; 4] = ["/data/raw/run42.h5", "/data/raw/sub/x.tmp", "/a", "/data/é/ß.root"];

fn event(shape: &[u8]) -> StorageEvent {
    let byte = |i: usize| shape.get(i).copied().unwrap_or(0);
    let path = match std::str::from_utf8(shape.get(4..).unwrap_or_default()) {
        Ok(p) if p.starts_with('/') => p.to_owned(),
        _ => PATHS[usize::from(byte(3)) % PATHS.len()].to_owned(),
    };
    let present = byte(2);
    StorageEvent {
        source: EventSource {
            kind: SOURCES[usize::from(byte(1)) % SOURCES.len()],
            producer: "pool-a-1@pool-aDomain".into(),
            message: None,
        },
        kind: EventKind::ALL[usize::from(byte(0)) % EventKind::ALL.len()],
        msg_type: ["transfer", "closew", "IN_CLOSE_WRITE", "remove"][usize::from(byte(1) >> 4) % 4].into(),
        path,
        size: (present & 1 != 0).then(|| u64::from(byte(3)) << (present >> 4)),
        storage_class: (present & 2 != 0).then(|| "exp:raw".into()),
        owner: (present & 4 != 0).then(|| "alice".into()),
        macaroon: None,
        id: "dcache-billing:write:fuzz".into(),
        time: None,
    }
}

fn check(rule: &Rule, e: &StorageEvent) {
    let t = rule.evaluate(e);
    assert_eq!(rule.matches(e), t == Truth::True);
    // The displayed text is a rule meaning the same.
    let again = Rule::parse(&rule.to_string()).expect("a rule's text parses");
    assert_eq!(again.evaluate(e), t, "{rule}");
    // An event that knows less (no size, class, owner) never turns a decided rule around.
    let bare = StorageEvent { size: None, storage_class: None, owner: None, ..e.clone() };
    let tb = rule.evaluate(&bare);
    assert!(tb == t || tb == Truth::Undefined, "{rule}: {t:?} with attributes, {tb:?} without");
}

fuzz_target!(|data: &[u8]| {
    let (text, shape) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(text) else { return };
    let Ok(rule) = Rule::parse(text) else { return };
    let e = event(shape);
    check(&rule, &e);
    // Combined with a path glob, as a manifest with both `path` and `rule` is.
    if let Ok(both) = Rule::path_glob("/data/**").map(|g| g.and(rule.clone())) {
        check(&both, &e);
        if both.matches(&e) {
            assert!(rule.matches(&e), "{both} fires where {rule} does not");
        }
    }
});
