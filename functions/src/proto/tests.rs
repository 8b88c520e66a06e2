//! The wire types' tests: parsing what peers send, round trips.

use super::*;
use crate::digest::Digest;
use crate::resources::Resources;

#[test]
fn transfer_message_parses_dcache_quirks() {
    // Key order arbitrary, isWrite a string, unknown keys ignored, absent keys are None.
    let raw = r#"{"isWrite":"write","msgType":"transfer","transferPath":"/data/raw/a","pnfsid":"00A",
        "status":{"code":0,"msg":""},"isP2p":false,"unknownKey":[1,2],"readIdle":"PT0S"}"#;
    let m: TransferMessage = serde_json::from_str(raw).expect("parses");
    assert_eq!(m.is_write.as_deref(), Some("write"));
    assert_eq!(m.transfer_path.as_deref(), Some("/data/raw/a"));
    assert_eq!(m.session, None);
}

#[test]
fn ep_messages_round_trip() {
    let msg = EpMsg::Finished(JobReport {
        input_sha256: None,
        job_id: "j1".into(),
        outcome: Outcome::TimeExceeded { limit_s: 3, vacate: None },
        usage: Usage { wall_ms: 1, ..Usage::default() },
        outputs: vec![],
        log: "x".into(),
        refs: Vec::new(),
        checkpoint: None,
    });
    let text = serde_json::to_string(&msg).expect("serializes");
    assert_eq!(serde_json::from_str::<EpMsg>(&text).expect("parses"), msg);
}

#[test]
fn storage_unavailable_is_transient_named_on_the_wire_and_not_a_success() {
    let o = Outcome::StorageUnavailable { reason: "GET http://s/a: HTTP 503".into() };
    let text = serde_json::to_string(&o).expect("serializes");
    assert_eq!(text, r#"{"kind":"storage_unavailable","reason":"GET http://s/a: HTTP 503"}"#);
    assert_eq!(serde_json::from_str::<Outcome>(&text).expect("parses"), o);
    assert!(o.is_transient() && !o.is_success());
    assert_eq!(o.reason(), "storage unavailable: GET http://s/a: HTTP 503");
    assert!(!Outcome::InputFailed { reason: "HTTP 403".into() }.is_transient());
}

#[test]
fn bind_ep_address_is_on_the_wire_only_when_true() {
    let mut req = SubmitRequest {
        retry: None,
        function: FunctionRef {
            name: "f".into(),
            version: 1,
            digest: Digest::of(b"m"),
            module_url: "http://gw/v1/modules/m".into(),
            native: None,
        },
        resources: Resources::new(1, 1, 1),
        input: Some(InputSpec::new("http://s/data/a", "a", "r")),
        output: OutputSpec { on_failure: Default::default(), url: "http://s/data/out/".into(), macaroon: "w".into() },
        args: vec![],
        env: vec![],
        event: EventRef::new("dcache", "e", "/data/a"),
        dedupe_key: "k".into(),
        annex: None,
        bind_ep_address: false,
        class: None,
        limits: Default::default(),
        secrets: Default::default(),
        renewal: None,
        max_concurrent: None,
        refs: Vec::new(),
        checkpoint: None,
    };
    // Absent when false: a request (or a stored one) without the field means false, and a
    // scheduler that predates it still accepts requests that do not ask for it.
    let text = serde_json::to_string(&req).expect("serializes");
    assert!(!text.contains("bind_ep_address"), "{text}");
    assert_eq!(serde_json::from_str::<SubmitRequest>(&text).expect("parses"), req);
    req.bind_ep_address = true;
    let text = serde_json::to_string(&req).expect("serializes");
    assert!(text.contains(r#""bind_ep_address":true"#), "{text}");
    assert_eq!(serde_json::from_str::<SubmitRequest>(&text).expect("parses"), req);
    // A run on no file: no input on the wire, and none read back.
    req.input = None;
    let text = serde_json::to_string(&req).expect("serializes");
    assert!(!text.contains("\"input\""), "{text}");
    assert_eq!(serde_json::from_str::<SubmitRequest>(&text).expect("parses"), req);
}

/// A renewal of a job without an input carries no read macaroon nor input URL on the wire; one
/// of a job with an input reads as before.
#[test]
fn a_renewal_without_an_input_names_none() {
    let answer = SchedulerMsg::Renewed {
        job_id: "j".into(),
        input_macaroon: None,
        output_macaroon: "w".into(),
        checkpoint_macaroon: None,
        ref_macaroons: Vec::new(),
    };
    let text = serde_json::to_string(&answer).expect("serializes");
    assert!(!text.contains("input_macaroon"), "{text}");
    assert_eq!(serde_json::from_str::<SchedulerMsg>(&text).expect("parses"), answer);
    let old: RenewResponse =
        serde_json::from_str(r#"{"input_macaroon":"r","output_macaroon":"w"}"#).expect("an answer with both");
    assert_eq!(old.input_macaroon.as_deref(), Some("r"));
    let none: RenewResponse = serde_json::from_str(r#"{"output_macaroon":"w"}"#).expect("the write one alone");
    assert_eq!(none.input_macaroon, None);
}

#[test]
fn gateway_api_types_read_what_clients_send_and_round_trip() {
    // A time is a number (Unix seconds) or a string; optional fields may be absent.
    let r: ReplayRequest = serde_json::from_str(r#"{"since":0}"#).expect("parses");
    assert_eq!((r.since, r.until, r.dry_run), (TimeArg::Unix(0), None, false));
    let r: ReplayRequest = serde_json::from_str(r#"{"since":"-2h","until":"1795341600"}"#).expect("parses");
    assert_eq!((r.since, r.until), (TimeArg::Text("-2h".into()), Some(TimeArg::Text("1795341600".into()))));
    assert!(serde_json::from_str::<ReplayRequest>(r#"{"since":0,"typo":1}"#).is_err());
    // A run without an annex, as the client sends it (`null`) or leaves it out.
    for text in [r#"{"path":"/a","annex":null}"#, r#"{"path":"/a"}"#] {
        let run: RunRequest = serde_json::from_str(text).expect("parses");
        assert_eq!(run, RunRequest { path: "/a".into(), annex: None });
    }
    // Absent options stay off the wire and read back the same.
    let report = Report { since: "s".into(), pairs_truncated: true, ..Report::default() };
    let text = serde_json::to_string(&report).expect("serializes");
    assert!(!text.contains("replay_id") && !text.contains("resume_since"), "{text}");
    assert_eq!(serde_json::from_str::<Report>(&text).expect("parses"), report);
    // A gateway that predates the newer counters still answers a readable snapshot.
    let old = r#"{"events_received":1,"events_malformed":0,"events_ignored":0,"events_unmatched":0,
        "jobs_submitted":1,"jobs_deduplicated":0,"jobs_refused":0,"transient_failures":0}"#;
    let snapshot: StatsSnapshot = serde_json::from_str(old).expect("parses");
    assert_eq!((snapshot.jobs_submitted, snapshot.firings_pending), (1, 0));
}

/// A request or assignment logged with `?` shows its secrets' names, never a value; on the wire
/// they are pairs like `env`, and absent when there are none.
#[test]
fn secrets_show_their_names_only_when_debugged() {
    let secrets = SecretEnv(vec![("DB_PASSWORD".into(), "hunter2".into())]);
    let shown = format!("{secrets:?}");
    assert!(shown.contains("DB_PASSWORD") && !shown.contains("hunter2"), "{shown}");
    assert_eq!(serde_json::to_value(&secrets).expect("json"), serde_json::json!([["DB_PASSWORD", "hunter2"]]));
    assert_eq!(secrets.names(), ["DB_PASSWORD"]);
    assert!(SecretEnv::default().is_empty());
}
