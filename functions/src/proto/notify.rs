//! Job-end notifications: what the scheduler publishes on NATS when a job ends for
//! good ([`JobNotification`]), on which stream ([`JOBS_STREAM`]) and subject
//! ([`notification_subject`]: `htfaas.jobs.<owner>.<function>.<outcome>`).
//!
//! A subscriber (a chained workflow, the gateway's dead-letter list) reads them instead of
//! polling. Each is published after the job's end is committed (the scheduler's outbox), with
//! the header [`MSG_ID_HEADER`] set to [`JobNotification::msg_id`], so a re-publish after a
//! crash is dropped by the stream's duplicate window.
//!
//! Must not know: how the outbox is kept, NATS clients, who consumes the stream.

use super::attach::{OutputFile, Usage};
use super::events::EventRef;
use super::jobs::JobState;
use crate::digest::Digest;
use serde::{Deserialize, Serialize};

/// The JetStream stream that keeps job-end notifications (the scheduler creates it).
pub const JOBS_STREAM: &str = "HTFAAS_JOBS";
/// First tokens of every notification subject.
pub const JOBS_SUBJECT_PREFIX: &str = "htfaas.jobs";
/// Every notification subject, the stream's one subject filter.
pub const JOBS_SUBJECTS: &str = "htfaas.jobs.>";
/// The header JetStream deduplicates a publish by.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// How long the stream keeps a notification, seconds (7 days, as the events stream).
pub const JOBS_MAX_AGE_S: u64 = 7 * 24 * 3600;

/// A failure webhook's request: the header holding `sha256=<hex>`, the HMAC-SHA256
/// under the function's key of `<timestamp>.<body>` ([`webhook_signature`]).
pub const WEBHOOK_SIGNATURE_HEADER: &str = "x-htfaas-signature";
/// The Unix seconds the signature covers: a receiver refuses an old one (a replay).
pub const WEBHOOK_TIMESTAMP_HEADER: &str = "x-htfaas-timestamp";
/// The notification's identity ([`JobNotification::msg_id`]): the same for every try of one
/// delivery, so a receiver can drop a repeat.
pub const WEBHOOK_DELIVERY_HEADER: &str = "x-htfaas-delivery";

/// The value of [`WEBHOOK_SIGNATURE_HEADER`] for `body` sent at `timestamp` under `key`.
pub fn webhook_signature(key: &[u8], timestamp: u64, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    format!("sha256={}", hex::encode(ctx.sign().as_ref()))
}

/// Whether `signature` (the header's value) signs `body` at `timestamp` under `key`, compared
/// in constant time: what a receiver checks (besides the timestamp's age).
pub fn verify_webhook(key: &[u8], timestamp: u64, body: &[u8], signature: &str) -> bool {
    let Some(mac) = signature.strip_prefix("sha256=").and_then(|h| hex::decode(h).ok()) else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let mut signed = timestamp.to_string().into_bytes();
    signed.push(b'.');
    signed.extend_from_slice(body);
    ring::hmac::verify(&key, &signed, &mac).is_ok()
}

/// One job's end, as published on [`notification_subject`]: JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobNotification {
    /// The outbox entry's number in the scheduler's store: with the job id, the message's
    /// identity ([`JobNotification::msg_id`]).
    pub seq: u64,
    /// Job id.
    pub job_id: String,
    /// Owner (accounted user).
    pub owner: String,
    /// Function name.
    pub function: String,
    /// Function version.
    pub version: u32,
    /// Module digest the job ran (absent only if its stored request did not read back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    /// How it ended: `completed`, `failed`, `held` or `removed`.
    pub state: JobState,
    /// Why (empty when completed): the outcome's reason, the hold's or the removal's.
    #[serde(default)]
    pub reason: String,
    /// The hold code of a held job (`HOLD_CODE_*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_code: Option<u32>,
    /// The event that fired it.
    pub event: EventRef,
    /// The outputs it stored, with their sha256.
    #[serde(default)]
    pub outputs: Vec<OutputFile>,
    /// What it used, when its EP reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Run attempts it had.
    pub attempts: u32,
    /// The guest's exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// When it ended, ms since the epoch.
    pub finished_at_ms: u64,
    /// Its checkpoint area's URL (a directory), for a job of a function that checkpoints: what
    /// the gateway clears once the job has ended for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

impl JobNotification {
    /// The subject it is published on.
    pub fn subject(&self) -> String {
        notification_subject(&self.owner, &self.function, self.state)
    }

    /// Its `Nats-Msg-Id`: `<job id>.<seq>`, the same for every publish of one outbox entry.
    pub fn msg_id(&self) -> String {
        format!("{}.{}", self.job_id, self.seq)
    }
}

/// `htfaas.jobs.<owner>.<function>.<state>`, each name a [`subject_token`].
pub fn notification_subject(owner: &str, function: &str, state: JobState) -> String {
    format!("{JOBS_SUBJECT_PREFIX}.{}.{}.{}", subject_token(owner), subject_token(function), state.as_str())
}

/// `name` as one NATS subject token: ASCII letters, digits, `-` and `_` as they are, every
/// other byte `%XX` (upper-case hex), so `.`, `*`, `>`, white space and `%` itself never reach
/// the subject and two names never share a token. An empty name is `%`. A function name
/// (`[a-z0-9][a-z0-9_-]*`) and a plain owner name (`alice`) are unchanged.
pub fn subject_token(name: &str) -> String {
    crate::percent::name_token(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_signature_verifies_only_for_its_key_time_and_body() {
        let key = b"Jefe";
        let sig = webhook_signature(key, 1_700_000_000, br#"{"job_id":"j"}"#);
        assert!(sig.starts_with("sha256=") && sig.len() == 7 + 64, "{sig}");
        assert!(verify_webhook(key, 1_700_000_000, br#"{"job_id":"j"}"#, &sig));
        assert!(!verify_webhook(b"jefe", 1_700_000_000, br#"{"job_id":"j"}"#, &sig), "another key");
        assert!(!verify_webhook(key, 1_700_000_001, br#"{"job_id":"j"}"#, &sig), "another time");
        assert!(!verify_webhook(key, 1_700_000_000, br#"{"job_id":"k"}"#, &sig), "another body");
        for bad in ["", "sha256=", "sha256=zz", "md5=00", &sig[..sig.len() - 2]] {
            assert!(!verify_webhook(key, 1_700_000_000, br#"{"job_id":"j"}"#, bad), "{bad:?}");
        }
        // What is signed: `<timestamp>.<body>`, as a receiver in another language rebuilds it.
        let data = b"what do ya want for nothing?";
        let mut signed = b"7.".to_vec();
        signed.extend_from_slice(data);
        let mac = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key), &signed);
        assert_eq!(webhook_signature(key, 7, data), format!("sha256={}", hex::encode(mac.as_ref())));
    }

    #[test]
    fn subject_tokens_escape_what_a_subject_would_split_on_and_stay_distinct() {
        assert_eq!(subject_token("alice"), "alice");
        assert_eq!(subject_token("fn_1-a"), "fn_1-a");
        assert_eq!(subject_token("a.b"), "a%2Eb");
        assert_eq!(subject_token("*"), "%2A");
        assert_eq!(subject_token(">"), "%3E");
        assert_eq!(subject_token("a b"), "a%20b");
        assert_eq!(subject_token("%2E"), "%252E");
        assert_eq!(subject_token("ü"), "%C3%BC");
        assert_eq!(subject_token(""), "%");
        assert_ne!(subject_token("a.b"), subject_token("a%2Eb"));
        for name in ["a.b", "*", ">", "a b\t", "x%y", ""] {
            let t = subject_token(name);
            assert!(!t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic() && !b".*>".contains(&b)), "{t}");
        }
        assert_eq!(
            notification_subject("al.ice", "checksum", JobState::Failed),
            "htfaas.jobs.al%2Eice.checksum.failed"
        );
    }

    #[test]
    fn a_notification_round_trips_and_names_its_subject_and_id() {
        let n = JobNotification {
            seq: 7,
            job_id: "j-1".into(),
            owner: "alice".into(),
            function: "checksum".into(),
            version: 2,
            digest: Some(Digest::of(b"m")),
            state: JobState::Completed,
            reason: String::new(),
            hold_code: None,
            event: EventRef::new("test", "e1", "/data/raw/a"),
            outputs: vec![OutputFile { path: "/data/out/a".into(), size: 3, sha256: "ab".into() }],
            usage: Some(Usage { wall_ms: 5, ..Usage::default() }),
            attempts: 1,
            exit_code: Some(0),
            finished_at_ms: 1,
            checkpoint: None,
        };
        let text = serde_json::to_string(&n).expect("serializes");
        assert_eq!(serde_json::from_str::<JobNotification>(&text).expect("parses"), n);
        assert_eq!(n.subject(), "htfaas.jobs.alice.checksum.completed");
        assert_eq!(n.msg_id(), "j-1.7");
    }
}
