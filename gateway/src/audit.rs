//! The gateway's audit trail: what the gateway decided, in its own chain (writer
//! [`AUDIT_WRITER`]), inside the firing table's database (`firings.sqlite`, see
//! [`crate::firing`]), signed with the gateway's own checkpoint key ([`AUDIT_KID`]).
//!
//! # Records (see [`htfaas_functions::audit`] for the format)
//!
//! | kind | written | subject | detail |
//! |---|---|---|---|
//! | `event.matched` ([`EVENT_MATCHED`]) | with the event's firings, in the ingest's batch transaction | event id, owner, the event's path; function and digest when one function fired | `event {source, producer, id, kind, msg_type, path, size, owner, macaroon}`, `caused_by` (the job that wrote the file, if one did), `replay`, `functions [{name, version, digest, owner, glob, rule, firing}]`, `firing` = `queued` \| `duplicate` \| `loop_guarded` \| `collected` \| `completed` \| `ungrouped` \| `other_writer`, and `group` for a collecting function |
//! | `group.closed` | when a collecting function's group fires or expires, in that transaction | owner, function, digest, every member's path | `group`, `outcome` = `fired` \| `expired`, `how`, `members`, `firing`, `version` |
//! | `token.minted` | with the write macaroon's provenance, before the submit | jti, owner, digest, function, event id, input path | the claims' limits: `jobs, cpus, memory_mb, runtime_s, exp, iat, iss, aud, group`; plus `firing`, `function_version`, `replay` |
//! | `macaroons.obtained` | same transaction | jti, owner, function, digest, event id, the input path and the output directory (what the two macaroons reach); indexed only by the jti and the output directory, the rest through its `token.minted` | `macaroons [{role: read \| write, identifier, caveats}]` |
//! | `job.refused` | with the firing's refusal | event id, function, digest, input path | `reason`, `firing` (the storage or the scheduler refused for good) |
//! | `admin.action` | after the action succeeded | what it acted on | `action` and its arguments; actor = the credential's name |
//!
//! **Invariant: a decision of the firing table and its record commit in one transaction**: an
//! event's firings and its `event.matched`; a job's write-macaroon provenance and its
//! `token.minted` + `macaroons.obtained`; a firing's refusal and its `job.refused`. Admin
//! actions act on other databases (the registry, the scheduler), so their records follow the
//! action (a crash between the two loses the record, never the other way round).
//!
//! Not recorded, only counted (`crate::stats`): events that match no function, events ignored
//! or of a type the site did not enable, malformed messages, and copies of an event whose every
//! firing was already there (a redelivery).
//!
//! **No bearer credential is recorded**: a token's claims are recorded, never the signed token;
//! a macaroon's identifier and caveats ([`htfaas_functions::audit::MacaroonFacts::from_bearer`]), never its serialized
//! form. The library redacts any that slips through.
//!
//! # Lineage
//!
//! The API's lineage ([`crate::api::audit::lineage`]) answers "where does this file come from": the jobs that wrote (or read) it, from
//! the scheduler's trail (queried over its API), each with its acceptance (event, token,
//! function digest, input), its dispatch and finish, and the gateway's records of its event
//! and its token; then, for a job that wrote the file, the same for its input, back to the
//! first upload (at most `MAX_LINEAGE_DEPTH` steps back, each file and job once).
//!
//! This module holds the records and the trail's key; the API's side (admin actions' records,
//! queries, verification, lineage) is [`crate::api::audit`]; a job's credentials' records are
//! the dispatcher's (`crate::dispatch::credentials`).
//!
//! Must not know: the firing table's SQL or its types, HTTP, the gateway's shared state.

use htfaas_functions::FunctionRecord;
use htfaas_functions::audit::{AuditDraft, AuditKind, AuditSigner, CheckpointPolicy, Subject};
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::Cause;
use serde_json::{Value, json};
use std::sync::Arc;

/// The writer of the gateway's trail.
pub const AUDIT_WRITER: &str = "gateway";
/// Key id of the gateway's audit-checkpoint key.
pub const AUDIT_KID: &str = "gateway-audit-1";
/// File name of the audit key in the state directory when `audit_key_file` is not set.
pub const DEFAULT_AUDIT_KEY_FILE: &str = "gateway-audit-key.pem";
/// The stored name of [`AuditKind::EventMatched`]: the record of an event that fired (or was
/// kept from firing) functions.
pub const EVENT_MATCHED: &str = "event.matched";

/// The gateway's checkpoint signer and when it signs.
#[derive(Clone)]
pub struct Auditing {
    /// Signs checkpoints of the trail's head.
    pub signer: Arc<AuditSigner>,
    /// When.
    pub policy: CheckpointPolicy,
}

impl std::fmt::Debug for Auditing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auditing").field("kid", &self.signer.kid()).field("policy", &self.policy).finish()
    }
}

/// What became of one matched function on an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// A new firing was queued.
    Queued,
    /// Its firing was already there (a copy of the event).
    Duplicate,
    /// Not fired: the file was written by its chain.
    LoopGuarded,
    /// A collecting function's file joined the group named (its key), which waits for more.
    Collected(String),
    /// A collecting function's file joined the group named and completed it: its one firing
    /// was queued.
    Completed(String),
    /// A collecting function fired on the file alone: a replay's firing, or a file below no
    /// directory of its group key.
    Ungrouped,
    /// A collecting function's file written by another writer than the group's first file's:
    /// left out of the group named, never fired (a group merges one writer's files).
    OtherWriter(String),
}

impl Fired {
    fn as_str(&self) -> &'static str {
        match self {
            Fired::Queued => "queued",
            Fired::Duplicate => "duplicate",
            Fired::LoopGuarded => "loop_guarded",
            Fired::Collected(_) => "collected",
            Fired::Completed(_) => "completed",
            Fired::Ungrouped => "ungrouped",
            Fired::OtherWriter(_) => "other_writer",
        }
    }

    /// Whether a firing was queued.
    pub fn queued(&self) -> bool {
        matches!(self, Fired::Queued | Fired::Completed(_) | Fired::Ungrouped)
    }

    /// The group the file joined or was kept out of, if any.
    pub fn group(&self) -> Option<&str> {
        match self {
            Fired::Collected(g) | Fired::Completed(g) | Fired::OtherWriter(g) => Some(g),
            _ => None,
        }
    }
}

/// The `event.matched` record of `event`, or `None` when nothing was decided about it (every
/// firing already there: a copy).
pub fn event_matched(
    event: &StorageEvent,
    fired: &[(&FunctionRecord, Fired)],
    cause: Option<&Cause>,
    replay: Option<&str>,
) -> Option<AuditDraft> {
    if fired.iter().all(|(_, f)| *f == Fired::Duplicate) {
        return None;
    }
    // The function named by the subject: the one that fired, or whose group the file joined
    // or was kept out of.
    let queued: Vec<&FunctionRecord> =
        fired.iter().filter(|(_, f)| f.queued() || f.group().is_some()).map(|(r, _)| *r).collect();
    let mut owners = fired.iter().map(|(r, _)| r.manifest.owner.as_str());
    let first_owner = owners.next();
    let owner = match first_owner {
        Some(o) if owners.all(|x| x == o) => Some(o.to_owned()),
        _ => event.owner.clone(),
    };
    let one = (queued.len() == 1).then(|| queued[0]);
    let subject = Subject {
        event_id: Some(event.id.clone()),
        owner,
        function: one.map(|r| r.manifest.name.clone()),
        digest: one.map(|r| r.manifest.module.as_str().to_owned()),
        paths: vec![event.path.clone()],
        ..Subject::default()
    };
    let functions: Vec<Value> = fired
        .iter()
        .map(|(r, f)| {
            let m = &r.manifest;
            let mut v = json!({
                "name": m.name, "version": r.version, "digest": m.module.as_str(), "owner": m.owner,
                "glob": (!m.trigger.path.is_empty()).then_some(&m.trigger.path), "rule": m.trigger.rule,
                "firing": f.as_str(),
            });
            if let Some(g) = f.group() {
                v["group"] = json!(g);
            }
            v
        })
        .collect();
    let detail = json!({
        "event": {
            "source": event.source.kind.as_str(), "producer": event.source.producer, "id": event.id,
            "kind": event.kind, "msg_type": event.msg_type, "path": event.path, "size": event.size,
            "owner": event.owner, "macaroon": event.macaroon,
        },
        "caused_by": cause,
        "replay": replay,
        "functions": functions,
    });
    Some(AuditDraft::new(AuditKind::EventMatched, subject, detail))
}

/// The `group.closed` record of a collecting function's group: fired (with its firing) or
/// expired, how (`count`, `marker`, `quiet`, `full`, `timeout`), and every member's path.
pub fn group_closed(
    function: &FunctionRecord,
    group: &str,
    how: htfaas_functions::collect::Closing,
    members: &[String],
    firing: Option<i64>,
) -> AuditDraft {
    let m = &function.manifest;
    let subject = Subject {
        owner: Some(m.owner.clone()),
        function: Some(m.name.clone()),
        digest: Some(m.module.as_str().to_owned()),
        paths: members.to_vec(),
        ..Subject::default()
    };
    let outcome = if firing.is_some() { "fired" } else { "expired" };
    let detail = json!({
        "group": group, "outcome": outcome, "how": how.as_str(), "members": members,
        "firing": firing, "version": function.version,
    });
    AuditDraft::new(AuditKind::GroupClosed, subject, detail)
}

/// An admin's action `action` on `subject`, by the credential named `actor`.
pub fn admin_action(actor: &str, action: &str, subject: Subject, args: Value) -> AuditDraft {
    AuditDraft::admin_action(actor, action, subject, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::credentials;
    use crate::firing::{Firings, NewFirings};
    use crate::testing::event;
    use htfaas_functions::audit::{self, AuditFilter, AuditRecord};
    use htfaas_functions::audit::{ProblemKind, rusqlite::Connection};
    use htfaas_functions::manifest::Resources;
    use htfaas_functions::proto::SubmitRequest;
    use htfaas_functions::token::SubmitClaims;

    fn function(name: &str) -> FunctionRecord {
        crate::testing::function(name, None, None)
    }

    fn all(f: &Firings) -> Vec<AuditRecord> {
        audit::query(f.path(), &AuditFilter::default()).expect("query")
    }

    #[test]
    fn an_events_record_is_written_in_its_firings_transaction_and_copies_add_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = Firings::open(&dir.path().join("firings.sqlite"), 3600, 16).expect("open");
        let (a, b) = (function("a"), function("b"));
        let batch = [
            NewFirings { event: event("e1", "/data/x"), functions: vec![a.clone(), b.clone()], replay: None },
            NewFirings { event: event("e2", "/data/y"), functions: vec![a.clone()], replay: None },
            // A copy of e1 in the same batch: no record of its own.
            NewFirings { event: event("e1", "/data/x"), functions: vec![a.clone()], replay: None },
        ];
        f.insert_batch(&batch, 1_000).expect("batch");
        let records = all(&f);
        assert_eq!(records.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>(), [EVENT_MATCHED, EVENT_MATCHED]);
        let e1 = &records[0];
        assert_eq!((e1.subject.event_id.as_deref(), e1.subject.function.as_deref()), (Some("e1"), None));
        assert_eq!(e1.subject.paths, ["/data/x"]);
        assert_eq!(e1.subject.owner.as_deref(), Some("alice"));
        let names: Vec<_> = e1.detail["functions"].as_array().expect("functions").iter().map(|f| &f["name"]).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(e1.detail["functions"][0]["glob"], "/data/**");
        assert_eq!(e1.detail["functions"][0]["digest"], a.manifest.module.as_str());
        assert_eq!(e1.detail["functions"][0]["version"], 3);
        assert_eq!(e1.detail["event"]["size"], 7);
        let e2 = &records[1];
        assert_eq!(e2.subject.function.as_deref(), Some("a"), "one function fired: indexed by it");
        assert_eq!(e2.subject.digest.as_deref(), Some(a.manifest.module.as_str()));
        // Redelivered whole: every firing is there, nothing new is recorded.
        f.insert_batch(&batch, 2_000).expect("batch");
        assert_eq!(all(&f).len(), 2);

        // A batch that fails writes neither firings nor records.
        Connection::open(f.path())
            .expect("open")
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON firings WHEN NEW.event_key = 'bad' \
                 BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
            )
            .expect("trigger");
        let failing = [
            NewFirings { event: event("e3", "/data/z"), functions: vec![a.clone()], replay: None },
            NewFirings { event: event("bad", "/data/w"), functions: vec![a], replay: None },
        ];
        assert!(f.insert_batch(&failing, 3_000).is_err());
        assert_eq!(all(&f).len(), 2, "the record of e3 rolled back with its firing");
        assert_eq!(f.list(0, 100).expect("list").len(), 3);
    }

    #[test]
    fn a_loop_guarded_event_is_recorded_with_its_cause() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = Firings::open(&dir.path().join("firings.sqlite"), 3600, 16).expect("open");
        let (a, b) = (function("a"), function("b"));
        let cause = Cause {
            function: "a".into(),
            digest: a.manifest.module.clone(),
            event_id: "e0".into(),
            chain: vec!["a".into()],
            trace: None,
        };
        f.record_provenance("M1", &cause, 0).expect("provenance");
        let written = StorageEvent { macaroon: Some("M1".into()), ..event("e1", "/data/a/x") };
        f.insert(&written, &[a, b], None, 1_000).expect("insert");
        let r = &all(&f)[0];
        assert_eq!(r.detail["caused_by"]["event_id"], "e0");
        assert_eq!(r.detail["functions"][0]["firing"], "loop_guarded");
        assert_eq!(r.detail["functions"][1]["firing"], "queued");
        assert_eq!(r.subject.function.as_deref(), Some("b"));
    }

    #[test]
    fn credentials_are_recorded_by_their_facts_and_a_tampered_copy_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("firings.sqlite");
        let f = Firings::open(&path, 3600, 16).expect("open");
        let a = function("a");
        f.insert(&event("e1", "/data/x"), std::slice::from_ref(&a), None, 0).expect("insert");
        let claimed = f.claim(0, 1).expect("claim").ready.remove(0);
        // Real credentials: a signed submit token and two macaroons.
        let (key, _) = htfaas_functions::token::SigningKey::generate("k").expect("keygen");
        let claims = SubmitClaims {
            iss: "gw".into(),
            sub: "alice".into(),
            aud: htfaas_functions::token::SUBMIT_AUDIENCE.into(),
            exp: 2_000_000_000,
            iat: 1_000_000_000,
            jti: "jti-1".into(),
            jobs: 1,
            cpus: 2,
            memory_mb: 512,
            runtime_s: 60,
            function: Some(a.manifest.module.clone()),
            group: None,
        };
        let token = key.sign(&claims).expect("sign");
        let root = htfaas_functions::macaroon::RootKey::raw([7; 32]);
        let mint = |path: &str, id: &str| {
            htfaas_functions::macaroon::mint(&root, "loc", id, &[format!("path:{path}")]).expect("macaroon")
        };
        // The read macaroon as the gateway derives it from a dCache base on the directory: its
        // second `path:` is relative to the first, so `/x` is no path it reaches.
        let read = htfaas_functions::macaroon::attenuate(&mint("/data/", "read-id-1"), &["path:/x"]).expect("derive");
        let write = mint("/out/a/", "write-id-1");
        let request: SubmitRequest = serde_json::from_value(json!({
            "function": {"name": "a", "version": 3, "digest": a.manifest.module, "module_url": "http://m"},
            "resources": Resources::default(),
            "input": {"url": "http://s/data/x", "name": "x", "macaroon": read},
            "output": {"url": "http://s/out/a/", "macaroon": write},
            "args": [], "env": [],
            "event": {"source": "s", "id": "e1", "path": "/data/x"},
            "dedupe_key": "k",
        }))
        .expect("request");
        let drafts = credentials(&claimed, &claims, &request).0;
        let cause = Cause {
            function: "a".into(),
            digest: a.manifest.module.clone(),
            event_id: "e1".into(),
            chain: vec!["a".into()],
            trace: None,
        };
        f.record_provenance_with("write-id-1", &cause, 0, drafts.to_vec()).expect("record");
        f.append(admin_action("admin", "register", Subject::default(), json!({"note": format!("Bearer {token}")})))
            .expect("admin");

        let records = all(&f);
        let kinds: Vec<_> = records.iter().map(|r| r.kind.as_str()).collect();
        assert_eq!(kinds, [EVENT_MATCHED, "token.minted", "macaroons.obtained", "admin.action"]);
        let minted = &records[1];
        assert_eq!(minted.subject.token_jti.as_deref(), Some("jti-1"));
        assert_eq!((minted.detail["cpus"].as_u64(), minted.detail["memory_mb"].as_u64()), (Some(2), Some(512)));
        assert_eq!(minted.detail["exp"], 2_000_000_000u64);
        let got = &records[2];
        let ids: Vec<_> = got.detail["macaroons"].as_array().expect("list").iter().map(|m| &m["identifier"]).collect();
        assert_eq!(ids, ["read-id-1", "write-id-1"]);
        // Indexed by what the two macaroons reach, not by their raw `path:` caveats.
        assert_eq!(got.subject.paths, ["/data/x", "/out/a/"], "{:?}", got.subject);
        // No bearer string anywhere in the stored trail.
        let conn = Connection::open(&path).expect("open");
        let texts: Vec<String> = conn
            .prepare("SELECT json FROM audit_records")
            .expect("prepare")
            .query_map([], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        for t in &texts {
            for secret in [&token, &read, &write] {
                assert!(!t.contains(secret.as_str()), "a bearer credential in {t}");
            }
        }

        // Signed, then tampered with in a copy: verify names the record.
        let (signer, _) = AuditSigner::generate(AUDIT_KID).expect("keygen");
        f.checkpoint(&signer, CheckpointPolicy::default(), true).expect("checkpoint").expect("signed");
        let report = audit::verify(&path, &signer.keys()).expect("verify");
        assert!(report.ok() && report.records == 4, "{report:?}");
        drop(f);
        conn.execute_batch("DROP TRIGGER audit_records_append_only_u").expect("drop the guard");
        let text = texts[1].replace("\"cpus\":2", "\"cpus\":64");
        conn.execute("UPDATE audit_records SET json = ?1 WHERE seq = 2", [text]).expect("alter");
        let report = audit::verify(&path, &signer.keys()).expect("verify");
        let problem = report.first_problem.expect("caught");
        assert_eq!((problem.seq, problem.what), (2, ProblemKind::Altered), "{problem:?}");
    }
}
