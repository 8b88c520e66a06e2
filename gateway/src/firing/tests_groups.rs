//! Tests of collecting triggers' groups in the firing table.

use super::*;
use crate::testing::{event, function};
use htfaas_functions::audit::{AuditFilter, AuditKind, AuditRecord};
use htfaas_functions::collect::Collect;
use std::path::Path;

fn open(dir: &Path) -> Firings {
    Firings::open(&dir.join("firings.sqlite"), 3600, 16).expect("open")
}

fn collecting(name: &str, collect: Collect) -> FunctionRecord {
    let mut f = function(name, None, None);
    f.manifest.trigger.collect = Some(collect);
    f
}

fn count(n: u32) -> Collect {
    Collect { key: None, count: Some(n), marker: None, quiet_s: None, timeout_s: None }
}

fn closed(f: &Firings) -> Vec<AuditRecord> {
    htfaas_functions::audit::query(f.path(), &AuditFilter::default())
        .expect("query")
        .into_iter()
        .filter(|r| r.kind == AuditKind::GroupClosed)
        .collect()
}

fn by(id: &str, path: &str, writer: &str) -> StorageEvent {
    StorageEvent { owner: Some(writer.into()), ..event(id, path) }
}

/// A run of three files fires once, on the third, with the other two as its members; a copy
/// of a member's event (before or after the group fired) joins nothing; the next file of the
/// directory opens a new group; a replay fires alone.
#[test]
fn a_group_fires_once_when_its_count_is_reached_and_copies_join_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let merge = collecting("merge", count(3));
    let one = std::slice::from_ref(&merge);
    let insert = |id: &str, path: &str| f.insert(&by(id, path, "alice"), one, None, 1_000).expect("insert");
    assert_eq!(insert("e1", "/data/run/a"), Inserted { collected: 1, ..Inserted::default() });
    assert_eq!(insert("e1", "/data/run/a"), Inserted { deduplicated: 1, ..Inserted::default() }, "a copy");
    assert_eq!(insert("e2", "/data/run/b").collected, 1);
    assert_eq!(f.pending(), 0, "nothing fired yet");
    assert_eq!(insert("e3", "/data/run/c"), Inserted { queued: 1, ..Inserted::default() });
    assert_eq!(insert("e2", "/data/run/b"), Inserted { deduplicated: 1, ..Inserted::default() }, "a late copy");
    let claim = f.claim(2_000, 10).expect("claim");
    assert_eq!(claim.ready.len(), 1);
    assert_eq!(claim.ready[0].event.path, "/data/run/c");
    assert_eq!(claim.ready[0].members, ["/data/run/a", "/data/run/b"]);
    let records = closed(&f);
    assert_eq!(records.len(), 1);
    assert_eq!(
        (records[0].detail["outcome"].as_str(), records[0].detail["how"].as_str()),
        (Some("fired"), Some("count"))
    );
    // The directory's next file opens a new group.
    assert_eq!(insert("e4", "/data/run/d").collected, 1);
    assert_eq!(f.open_group("merge", "/data/run/").expect("open").map(|g| g.members), Some(vec!["/data/run/d".into()]));
    // A replay fires the file alone.
    let replayed = f.insert(&by("e1", "/data/run/a", "alice"), one, Some("r1"), 3_000).expect("replay");
    assert_eq!(replayed.queued, 1);
    assert!(f.claim(4_000, 10).expect("claim").ready[0].members.is_empty());
}

/// A group merges one writer's files: another writer's file in the same directory is kept
/// out, counted, and fires nothing; the group's own writer completes it.
#[test]
fn a_group_never_merges_two_writers_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let merge = collecting("merge", count(2));
    let one = std::slice::from_ref(&merge);
    assert_eq!(f.insert(&by("e1", "/data/run/a", "alice"), one, None, 1_000).expect("insert").collected, 1);
    let other = f.insert(&by("e2", "/data/run/evil", "mallory"), one, None, 1_000).expect("insert");
    assert_eq!(other, Inserted { not_collected: 1, ..Inserted::default() });
    assert_eq!(f.pending(), 0, "mallory's file completed nothing");
    assert_eq!(f.insert(&by("e3", "/data/run/b", "alice"), one, None, 1_000).expect("insert").queued, 1);
    let claim = f.claim(2_000, 10).expect("claim");
    assert_eq!(claim.ready[0].members, ["/data/run/a"], "mallory's file is no member");
}

/// A quiet group fires on its newest file once no file arrived for its quiet period; a group
/// past its timeout expires, recorded and unfired; a marker completes its group on arrival.
#[test]
fn the_clock_fires_quiet_groups_and_expires_late_ones_and_a_marker_completes_its_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let quiet = collecting("quiet", Collect { count: None, quiet_s: Some(10), ..count(1) });
    let late = collecting("late", Collect { timeout_s: Some(5), ..count(5) });
    let marker = collecting("marked", Collect { count: None, marker: Some("_DONE".into()), ..count(1) });
    let all = [quiet, late, marker];
    f.insert(&by("e1", "/data/q/a", "alice"), &all, None, 1_000).expect("insert");
    f.insert(&by("e2", "/data/q/b", "alice"), &all, None, 4_000).expect("insert");
    assert_eq!(f.sweep_groups(5_999).expect("sweep"), Swept::default(), "nothing due yet");
    // At 6 s "late" is past its timeout; "quiet" has 8 s more to wait from its last file.
    assert_eq!(f.sweep_groups(6_000).expect("sweep"), Swept { fired: 0, expired: 1 });
    assert_eq!(f.sweep_groups(14_000).expect("sweep"), Swept { fired: 1, expired: 0 });
    let claim = f.claim(14_000, 10).expect("claim");
    let got: Vec<_> = claim.ready.iter().map(|c| (c.function.manifest.name.as_str(), c.event.path.as_str())).collect();
    assert_eq!(got, [("quiet", "/data/q/b")]);
    assert_eq!(claim.ready[0].members, ["/data/q/a"]);
    let hows: Vec<_> =
        closed(&f).iter().map(|r| (r.detail["how"].as_str().map(str::to_owned), r.detail["outcome"].clone())).collect();
    assert_eq!(hows.len(), 2);
    assert!(hows.contains(&(Some("timeout".into()), "expired".into())), "{hows:?}");
    assert!(hows.contains(&(Some("quiet".into()), "fired".into())), "{hows:?}");
    // The marker completes "marked" on arrival, its group's two data files its members.
    let done = f.insert(&by("e3", "/data/q/_DONE", "alice"), &all[2..], None, 15_000).expect("insert");
    assert_eq!(done.queued, 1);
    let claim = f.claim(15_000, 10).expect("claim");
    assert_eq!(claim.ready[0].members, ["/data/q/a", "/data/q/b"]);
    // Closed groups go with the key window, and a copy then joins a new group.
    f.prune(15_000 + 3_600_000, 100).expect("prune");
    assert_eq!(f.open_group("late", "/data/q/").expect("open"), None);
}

/// A group's state survives the table being closed and opened again: the 4th file after a
/// restart completes the group of the first three.
#[test]
fn a_group_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let merge = collecting("merge", count(4));
    let one = std::slice::from_ref(&merge);
    {
        let f = open(dir.path());
        for (i, p) in ["a", "b", "c"].iter().enumerate() {
            f.insert(&by(&format!("e{i}"), &format!("/data/run/{p}"), "alice"), one, None, 1_000).expect("insert");
        }
    }
    let f = open(dir.path());
    assert_eq!(f.insert(&by("e3", "/data/run/d", "alice"), one, None, 2_000).expect("insert").queued, 1);
    assert_eq!(f.claim(3_000, 10).expect("claim").ready[0].members.len(), 3);
}

/// A group's job that failed is re-driven on the group's files, not on its event's file alone,
/// even once the group and its firing were pruned; so is a group's firing refused for good.
#[test]
fn a_redriven_groups_firing_runs_on_the_groups_files() {
    use htfaas_functions::proto::{EventRef, JobNotification, JobState};
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let merge = collecting("merge", count(2));
    let one = std::slice::from_ref(&merge);
    for (id, path) in [("e1", "/data/run/a"), ("e2", "/data/run/b"), ("e3", "/data/two/a"), ("e4", "/data/two/b")] {
        f.insert(&by(id, path, "alice"), one, None, 1_000).expect("insert");
    }
    let claim = f.claim(2_000, 10).expect("claim");
    assert_eq!(claim.ready.len(), 2);
    let (failed, refused) = (&claim.ready[0], &claim.ready[1]);
    assert_eq!(
        (failed.event.path.as_str(), failed.members.as_slice()),
        ("/data/run/b", ["/data/run/a".to_owned()].as_slice())
    );
    f.mark_submitted(failed.seq, "job-1", 2_000).expect("submitted");
    f.mark_refused(refused.seq, "namespace refused", 2_000).expect("refused");
    let n = JobNotification {
        seq: 1,
        job_id: "job-1".into(),
        owner: "alice".into(),
        function: "merge".into(),
        version: merge.version,
        digest: Some(merge.manifest.module.clone()),
        state: JobState::Failed,
        reason: "exited with 3".into(),
        hold_code: None,
        event: EventRef::new("dcache-billing:pool@d", "e2", "/data/run/b"),
        outputs: vec![],
        usage: None,
        attempts: 1,
        exit_code: Some(3),
        finished_at_ms: 3_000,
        checkpoint: None,
    };
    assert!(f.dead_letter_job(&n, 3_000).expect("a failed job"));
    // Long after: the firings and the groups are pruned; the entries are not.
    let later = 10_000_000;
    f.prune(later, 100).expect("prune");
    let entries = f.dead_letters(&DeadLetterFilter { limit: 10, ..Default::default() }).expect("list");
    assert_eq!(entries.len(), 2, "{entries:?}");
    let record = |action: &str| {
        crate::audit::admin_action(
            "alice",
            action,
            htfaas_functions::audit::Subject::default(),
            serde_json::Value::Null,
        )
    };
    for e in &entries {
        f.redrive(e.id, None, "alice", record("dlq.redrive"), later).expect("re-drive");
    }
    let again = f.claim(later, 10).expect("claim");
    let mut runs: Vec<(String, Vec<String>)> =
        again.ready.iter().map(|c| (c.event.path.clone(), c.members.clone())).collect();
    runs.sort();
    assert_eq!(
        runs,
        [
            ("/data/run/b".to_owned(), vec!["/data/run/a".to_owned()]),
            ("/data/two/b".to_owned(), vec!["/data/two/a".to_owned()]),
        ]
    );
}
