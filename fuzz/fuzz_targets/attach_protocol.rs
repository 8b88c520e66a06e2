//! Fuzz target: the EP↔scheduler attach protocol, one WebSocket text frame at a time:
//! `htfaas_functions::proto::{EpMsg, SchedulerMsg}` decoded from JSON, and what the scheduler
//! checks of a Hello (`htfaas_scheduler::ep_link::{check_hello, check_annex}`, with
//! `proto::check_labels`).
//!
//! Byte 0 picks the direction (even: EP → scheduler, odd: scheduler → EP); the rest is the
//! frame. Checked beyond "no panic": a decoded message re-encodes and decodes to itself; an
//! admitted Hello's labels pass `check_labels`; a Hello that names no annex is never refused
//! for its annex.
#![no_main]

use htfaas_functions::proto::{EpMsg, SchedulerMsg, check_labels};
use htfaas_functions::token::AttachClaims;
use htfaas_scheduler::ep_link::{check_annex, check_hello};
use libfuzzer_sys::fuzz_target;

fn roundtrip<T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(m: &T) {
    let text = serde_json::to_string(m).expect("a decoded message encodes");
    let back: T = serde_json::from_str(&text).expect("an encoded message decodes");
    assert_eq!(&back, m);
}

fn claims(annex: Option<&str>) -> AttachClaims {
    AttachClaims {
        iss: "htfaas-scheduler".into(),
        sub: "site".into(),
        aud: "htfaas-scheduler/attach".into(),
        exp: u64::MAX,
        iat: 0,
        jti: "j".into(),
        owner: None,
        annex: annex.map(str::to_owned),
    }
}

fuzz_target!(|data: &[u8]| {
    let [dir, frame @ ..] = data else { return };
    let Ok(text) = std::str::from_utf8(frame) else { return };
    if dir % 2 == 0 {
        let Ok(msg) = serde_json::from_str::<EpMsg>(text) else { return };
        roundtrip(&msg);
        if let EpMsg::Hello(h) = &msg {
            if check_hello(h).is_ok() {
                assert!(check_labels(&h.labels).is_ok());
                assert!(!h.name.is_empty() && h.slots.cpus > 0 && h.slots.memory_mb > 0);
            }
            let annex = h.annex.as_deref();
            assert!(check_annex(h, &claims(annex)).is_ok(), "the token's own annex");
            if annex.is_none() {
                assert!(check_annex(h, &claims(Some("gpu"))).is_ok(), "no annex takes the token's");
            } else {
                assert!(check_annex(h, &claims(None)).is_err(), "an annex the token does not give");
            }
        }
    } else if let Ok(msg) = serde_json::from_str::<SchedulerMsg>(text) {
        roundtrip(&msg);
    }
});
