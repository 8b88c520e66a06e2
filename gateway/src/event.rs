//! Storage events: a dCache billing message's bytes in, a decision out.
//!
//! A message fires only when it is a successful, non-pool-to-pool write:
//! `msgType == "transfer" && isWrite == "write" && !isP2p && status.code == 0`
//! (`shared/reference/dcache.md` §1.4). Anything else is either *ignored* (a well-formed message
//! of another kind) or *malformed* (not a billing message at all); both are acked and counted,
//! never retried.

use htfaas_functions::event::{EventKind, EventSource, SourceKind, StorageEvent};
use htfaas_functions::manifest::is_clean_abs_path;
use htfaas_functions::proto::TransferMessage;

/// What to do with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A successful write: match triggers.
    Fire(StorageEvent),
    /// A valid message that never fires; the reason is for logs and counters.
    Ignore(&'static str),
}

/// Why a message is malformed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventError {
    /// Not JSON, or a field of the wrong type.
    #[error("not a dCache billing message: {0}")]
    Json(String),
    /// The path is not a clean absolute path.
    #[error("bad path {0:?}")]
    BadPath(String),
}

/// Decides what a message means. `fallback_id` names the event when it carries no
/// `pnfsid`/`session` (e.g. the JetStream sequence).
pub fn decide(bytes: &[u8], fallback_id: &str) -> Result<Decision, EventError> {
    let msg: TransferMessage = serde_json::from_slice(bytes).map_err(|e| EventError::Json(e.to_string()))?;
    match msg.msg_type.as_deref() {
        Some("transfer") => {}
        Some(_) => return Ok(Decision::Ignore("not a transfer message")),
        None => return Err(EventError::Json("no msgType".into())),
    }
    match msg.is_write.as_deref() {
        Some("write") => {}
        Some("read") => return Ok(Decision::Ignore("a read")),
        Some(_) | None => return Err(EventError::Json("isWrite is neither \"write\" nor \"read\"".into())),
    }
    if msg.is_p2p == Some(true) {
        return Ok(Decision::Ignore("a pool-to-pool copy"));
    }
    match &msg.status {
        Some(s) if s.code == 0 => {}
        Some(_) => return Ok(Decision::Ignore("a failed transfer")),
        None => return Ok(Decision::Ignore("no status")),
    }
    let path = msg
        .transfer_path
        .clone()
        .or(msg.billing_path.clone())
        .filter(|p| p != "Unknown")
        .ok_or_else(|| EventError::Json("no transferPath or billingPath".into()))?;
    if !is_clean_abs_path(&path) || path.ends_with('/') {
        return Err(EventError::BadPath(path));
    }
    let id = match (&msg.pnfsid, &msg.session) {
        (Some(p), Some(s)) => format!("{p}/{s}"),
        (Some(p), None) => format!("{p}/{fallback_id}"),
        _ => fallback_id.to_owned(),
    };
    let producer = match (&msg.cell_name, &msg.cell_domain) {
        (Some(c), Some(d)) => format!("{c}@{d}"),
        (Some(c), None) => c.clone(),
        _ => "unknown".to_owned(),
    };
    Ok(Decision::Fire(StorageEvent {
        source: EventSource { kind: SourceKind::DcacheBilling, producer, message: Some(fallback_id.to_owned()) },
        kind: EventKind::Write,
        msg_type: "transfer".into(),
        path,
        size: msg.file_size,
        storage_class: None,
        owner: None,
        id,
        time: msg.date.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRITE: &str = r#"{"version":"1.0","msgType":"transfer","date":"2026-03-14T10:15:30.123+01:00",
      "cellName":"pool-a-1","cellType":"pool","cellDomain":"pool-aDomain","status":{"code":0,"msg":""},
      "session":"pool:pool-a-1@pool-aDomain:1773479730123-4711","subject":["UserNamePrincipal[alice]"],
      "pnfsid":"0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A","billingPath":"/data/incoming/run42.h5",
      "transferPath":"/data/incoming/run42.h5","fileSize":104857600,"storageInfo":"exp:raw@osm",
      "transferSize":104857600,"transferTime":912,"isWrite":"write","isP2p":false}"#;

    fn with(field: &str, value: serde_json::Value) -> Vec<u8> {
        let mut v: serde_json::Value = serde_json::from_str(WRITE).expect("fixture parses");
        v[field] = value;
        serde_json::to_vec(&v).expect("serializes")
    }

    #[test]
    fn a_successful_write_fires_with_its_identity() {
        let d = decide(WRITE.as_bytes(), "seq-1").expect("parses");
        let Decision::Fire(e) = d else { panic!("a write fires: {d:?}") };
        assert_eq!(e.path, "/data/incoming/run42.h5");
        assert_eq!(e.id, "0000C9B4E7A1F2D34E5C8B1A9F0E7D6C5B4A/pool:pool-a-1@pool-aDomain:1773479730123-4711");
        assert_eq!(e.size, Some(104857600));
        assert_eq!(e.source.producer, "pool-a-1@pool-aDomain");
    }

    #[test]
    fn reads_p2p_failures_and_other_types_are_ignored() {
        use serde_json::json;
        assert_eq!(decide(&with("isWrite", json!("read")), "s"), Ok(Decision::Ignore("a read")));
        assert_eq!(decide(&with("isP2p", json!(true)), "s"), Ok(Decision::Ignore("a pool-to-pool copy")));
        assert_eq!(
            decide(&with("status", json!({"code": 666, "msg": "no space"})), "s"),
            Ok(Decision::Ignore("a failed transfer"))
        );
        assert_eq!(decide(&with("msgType", json!("request")), "s"), Ok(Decision::Ignore("not a transfer message")));
    }

    #[test]
    fn missing_keys_fall_back_and_garbage_is_malformed() {
        use serde_json::json;
        let mut v: serde_json::Value = serde_json::from_str(WRITE).expect("fixture parses");
        let obj = v.as_object_mut().expect("object");
        obj.remove("transferPath");
        obj.remove("session");
        let d = decide(&serde_json::to_vec(&v).expect("json"), "seq-9").expect("parses");
        assert!(matches!(d, Decision::Fire(StorageEvent { ref path, ref id, .. })
            if path == "/data/incoming/run42.h5" && id.ends_with("/seq-9")));

        assert!(matches!(decide(b"{not json", "s"), Err(EventError::Json(_))));
        assert!(matches!(decide(b"[1,2]", "s"), Err(EventError::Json(_))));
        assert!(matches!(decide(&with("isWrite", json!(true)), "s"), Err(EventError::Json(_))));
        assert!(matches!(decide(&with("fileSize", json!("big")), "s"), Err(EventError::Json(_))));
        assert!(matches!(
            decide(&with("transferPath", json!("/data/../etc/passwd")), "s"),
            Err(EventError::BadPath(_))
        ));
    }
}
