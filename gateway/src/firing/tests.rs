//! Tests of the firing table.

use super::schema::*;
use super::*;
use crate::testing::{event, function};
use htfaas_functions::audit::AuditDraft;
use htfaas_functions::manifest::RateLimit;
use htfaas_functions::store::Durability;
use rusqlite::{Connection, params};
use std::path::Path;

fn open(dir: &Path) -> Firings {
    Firings::open(&dir.join("firings.sqlite"), 3600, 16).expect("open")
}

fn states(f: &Firings) -> Vec<(String, String, FiringState)> {
    f.list(0, 1000).expect("list").into_iter().map(|r| (r.event_key, r.function, r.state)).collect()
}

#[test]
fn an_output_never_fires_its_own_chain_and_a_claim_carries_its_cause() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let (a, b) = (function("a", None, None), function("b", None, None));
    // a's job wrote with macaroon M1; b's job (caused by it) wrote with M2.
    let cause_a = Cause {
        function: "a".into(),
        digest: a.manifest.module.clone(),
        event_id: "e0".into(),
        chain: vec!["a".into()],
        trace: None,
    };
    f.record_provenance("M1", &cause_a, 1_000).expect("record");
    let cause_b =
        Cause { function: "b".into(), event_id: "e1".into(), chain: vec!["a".into(), "b".into()], ..cause_a.clone() };
    f.record_provenance("M2", &cause_b, 1_000).expect("record");
    assert_eq!(f.cause_of("M1").expect("lookup"), Some(cause_a.clone()));
    assert_eq!(f.cause_of("unknown").expect("lookup"), None);

    let written =
        |id: &str, path: &str, macaroon: &str| StorageEvent { macaroon: Some(macaroon.into()), ..event(id, path) };
    // a's output: a is guarded, b fires and carries the cause.
    let done = f.insert(&written("e1", "/data/a/x", "M1"), &[a.clone(), b.clone()], None, 2_000).expect("insert");
    assert_eq!(done, Inserted { queued: 1, deduplicated: 0, superseded: 0, loop_guarded: 1, ..Inserted::default() });
    // b's output: both a and b are up its chain.
    let done = f.insert(&written("e2", "/data/b/x", "M2"), &[a.clone(), b.clone()], None, 2_000).expect("insert");
    assert_eq!(done, Inserted { queued: 0, deduplicated: 0, superseded: 0, loop_guarded: 2, ..Inserted::default() });
    // A file written with a macaroon this gateway never handed out fires as usual.
    let done = f.insert(&written("e3", "/data/c/x", "M9"), std::slice::from_ref(&a), None, 2_000).expect("insert");
    assert_eq!(done.queued, 1);
    let claim = f.claim(10_000, 10).expect("claim");
    let causes: Vec<_> = claim.ready.iter().map(|c| (c.function.manifest.name.clone(), c.cause.clone())).collect();
    assert_eq!(causes, [("b".to_owned(), Some(cause_a)), ("a".to_owned(), None)]);
    // Provenance goes with the key window.
    f.prune(1_000 + 3_600_000, 100).expect("prune");
    assert_eq!(f.cause_of("M1").expect("lookup"), None);
}

#[test]
fn a_second_copy_of_an_event_is_dropped_on_its_key_and_a_replay_gets_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let (a, b) = (function("a", None, None), function("b", None, None));
    let e = event("dcache-billing:write:0001/s1", "/data/x");
    let first = f.insert(&e, &[a.clone(), b.clone()], None, 1_000).expect("insert");
    assert_eq!(first, Inserted { queued: 2, deduplicated: 0, superseded: 0, loop_guarded: 0, ..Inserted::default() });
    let again = f.insert(&e, &[b.clone(), a.clone()], None, 2_000).expect("insert");
    assert_eq!(again, Inserted { queued: 0, deduplicated: 2, superseded: 0, loop_guarded: 0, ..Inserted::default() });
    // Another session of the same file is another occurrence.
    let other = f.insert(&event("dcache-billing:write:0001/s2", "/data/x"), std::slice::from_ref(&a), None, 2_000);
    assert_eq!(other.expect("insert").queued, 1);
    // A replay runs again, once per replay id.
    assert_eq!(f.insert(&e, std::slice::from_ref(&a), Some("r1"), 3_000).expect("insert").queued, 1);
    assert_eq!(f.insert(&e, std::slice::from_ref(&a), Some("r1"), 3_000).expect("insert").deduplicated, 1);
    assert_eq!(f.pending(), 4);
    let rows = f.list(0, 100).expect("list");
    assert_eq!(rows[3].event_key, "replay:r1#dcache-billing:write:0001/s1");
    assert_eq!(rows[3].replay.as_deref(), Some("r1"));
    assert_eq!(rows[0].expires_ms, 1_000 + 3_600_000);
}

#[test]
fn one_functions_backlog_does_not_keep_another_functions_firing_out_of_the_next_claim() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let (flood, one, two) = (function("flood", None, None), function("one", None, None), function("two", None, None));
    for i in 0..200 {
        f.insert(&event(&format!("a{i}"), "/data/a"), std::slice::from_ref(&flood), None, 0).expect("insert");
    }
    // Later events of two other functions.
    f.insert(&event("b0", "/data/b"), std::slice::from_ref(&one), None, 5).expect("insert");
    f.insert(&event("c0", "/data/c"), std::slice::from_ref(&two), None, 6).expect("insert");
    let claim = f.claim(10, 4).expect("claim");
    let ids: Vec<&str> = claim.ready.iter().map(|c| c.event.id.as_str()).collect();
    assert_eq!(ids.len(), 4);
    assert!(ids.contains(&"b0") && ids.contains(&"c0"), "{ids:?}");
    // The flood's own firings still go oldest first.
    let flood_ids: Vec<&str> = ids.iter().copied().filter(|i| i.starts_with('a')).collect();
    assert_eq!(flood_ids, ["a0", "a1"]);
    // With the others claimed, a claim takes the flood alone, in order.
    let next = f.claim(10, 3).expect("claim");
    assert_eq!(next.ready.iter().map(|c| c.event.id.as_str()).collect::<Vec<_>>(), ["a2", "a3", "a4"]);
    // Claims of one firing each (a dispatcher with one free slot) go round the functions.
    f.insert(&event("b1", "/data/b"), std::slice::from_ref(&one), None, 20).expect("insert");
    f.insert(&event("c1", "/data/c"), std::slice::from_ref(&two), None, 20).expect("insert");
    let mut singles: Vec<String> = (0..3).map(|_| f.claim(30, 1).expect("claim").ready[0].event.id.clone()).collect();
    singles.sort();
    assert_eq!(singles, ["a5", "b1", "c1"]);
}

#[test]
fn keys_are_forgotten_after_their_window_but_pending_firings_are_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let a = function("a", None, None);
    for (i, at) in [(1, 0), (2, 0), (3, 0), (4, 1_000_000)] {
        f.insert(&event(&format!("e{i}"), "/data/x"), std::slice::from_ref(&a), None, at).expect("insert");
    }
    let claim = f.claim(0, 2).expect("claim");
    assert_eq!(claim.ready.iter().map(|c| c.event.id.as_str()).collect::<Vec<_>>(), ["e1", "e2"]);
    f.mark_submitted(claim.ready[0].seq, "job-1", 10).expect("mark");
    f.mark_refused(claim.ready[1].seq, "no", 10).expect("mark");
    assert_eq!(f.pending(), 2);
    // Not yet expired.
    assert_eq!(f.prune(3_599_999, 10).expect("prune"), 0);
    // e1 and e2 are finished and expired; e3 expired too but is pending; e4 is not expired.
    assert_eq!(f.prune(3_600_000, 1).expect("prune"), 1, "bounded batch");
    assert_eq!(f.prune(3_600_000, 10).expect("prune"), 1);
    let left: Vec<_> = states(&f).into_iter().map(|(k, _, s)| (k, s)).collect();
    assert_eq!(left, [("e3".into(), FiringState::Pending), ("e4".into(), FiringState::Pending)]);
    // Its key forgotten, e1 may be inserted again (the scheduler's key still dedupes it).
    assert_eq!(f.insert(&event("e1", "/data/x"), &[a], None, 3_600_001).expect("insert").queued, 1);
}

#[test]
fn a_burst_of_writes_to_one_path_leaves_one_firing_for_the_last_event_after_the_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let d = function("d", None, Some(2));
    let plain = function("plain", None, None);
    let both = [d.clone(), plain.clone()];
    for (i, at) in [(1, 0u64), (2, 100), (3, 200)] {
        let done = f.insert(&event(&format!("w{i}"), "/data/one"), &both, None, at).expect("insert");
        assert_eq!(done.superseded, u64::from(i > 1), "w{i}");
    }
    // Another path is debounced on its own.
    f.insert(&event("o1", "/data/other"), std::slice::from_ref(&d), None, 200).expect("insert");
    // The plain function fires on every event, at once; the debounced one waits.
    let now = f.claim(300, 100).expect("claim");
    let fired: Vec<_> = now.ready.iter().map(|c| (c.function.manifest.name.as_str(), c.event.id.as_str())).collect();
    assert_eq!(fired, [("plain", "w1"), ("plain", "w2"), ("plain", "w3")]);
    assert!(f.claim(2_199, 100).expect("claim").ready.is_empty(), "w3 waits 2 s from its arrival");
    let later = f.claim(2_200, 100).expect("claim");
    let fired: Vec<_> = later.ready.iter().map(|c| (c.function.manifest.name.as_str(), c.event.id.as_str())).collect();
    assert_eq!(fired, [("d", "w3"), ("d", "o1")]);
    let rows = f.list(0, 100).expect("list");
    let w1 = rows.iter().find(|r| r.event_key == "w1" && r.function == "d").expect("w1");
    let w2 = rows.iter().find(|r| r.event_key == "w2" && r.function == "d").expect("w2");
    let w3 = rows.iter().find(|r| r.event_key == "w3" && r.function == "d").expect("w3");
    assert_eq!((w1.state, w2.state), (FiringState::Superseded, FiringState::Superseded));
    assert_eq!((w1.superseded_by, w2.superseded_by), (Some(w2.seq), Some(w3.seq)));
    // A redelivered superseded event stays dropped.
    assert_eq!(f.insert(&event("w1", "/data/one"), &[d], None, 3_000).expect("insert").deduplicated, 1);
    assert_eq!(f.pending(), 5, "3 plain + w3 + o1 submitting");
}

fn new(e: StorageEvent, functions: &[FunctionRecord]) -> NewFirings {
    NewFirings { event: e, functions: functions.to_vec(), replay: None }
}

#[test]
fn two_copies_of_an_event_in_one_batch_make_one_firing_per_function() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let (a, b) = (function("a", None, None), function("b", None, None));
    let e = event("dcache-billing:write:0001/s1", "/data/x");
    let batch = [
        new(e.clone(), &[a.clone(), b.clone()]),
        new(event("e2", "/data/y"), std::slice::from_ref(&a)),
        new(e.clone(), &[b.clone(), a.clone()]),
        // A replay's copy of the same event in the same batch is its own.
        NewFirings { replay: Some("r1".into()), ..new(e.clone(), std::slice::from_ref(&a)) },
    ];
    let done = f.insert_batch(&batch, 1_000).expect("batch");
    let q =
        |queued, deduplicated| Inserted { queued, deduplicated, superseded: 0, loop_guarded: 0, ..Inserted::default() };
    assert_eq!(done, [q(2, 0), q(1, 0), q(0, 2), q(1, 0)]);
    assert_eq!(f.pending(), 4);
    let keys: Vec<_> = states(&f).into_iter().map(|(k, func, _)| format!("{k}/{func}")).collect();
    assert_eq!(
        keys,
        [
            "dcache-billing:write:0001/s1/a",
            "dcache-billing:write:0001/s1/b",
            "e2/a",
            "replay:r1#dcache-billing:write:0001/s1/a"
        ]
    );
    // The same batch redelivered (acks lost) is dropped whole; so is one insert of it.
    let again = f.insert_batch(&batch, 2_000).expect("batch");
    assert_eq!(again, [q(0, 2), q(0, 1), q(0, 2), q(0, 1)]);
    assert_eq!(f.insert(&e, &[a], None, 3_000).expect("insert"), q(0, 1));
    assert_eq!(f.pending(), 4);
    assert!(f.insert_batch(&[], 3_000).expect("empty").is_empty());
}

#[test]
fn debounce_supersedes_in_arrival_order_inside_a_batch_and_across_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let d = function("d", None, Some(2));
    let one = |id: &str, path: &str| new(event(id, path), std::slice::from_ref(&d));
    f.insert_batch(&[one("w1", "/data/one")], 0).expect("batch");
    let done = f
        .insert_batch(&[one("w2", "/data/one"), one("o1", "/data/other"), one("w3", "/data/one")], 100)
        .expect("batch");
    assert_eq!(done.iter().map(|d| (d.queued, d.superseded)).collect::<Vec<_>>(), [(1, 1), (1, 0), (1, 1)]);
    assert_eq!(f.pending(), 2, "w3 and o1");
    let rows = f.list(0, 100).expect("list");
    let row = |k: &str| rows.iter().find(|r| r.event_key == k).expect("row").clone();
    let (w1, w2, w3, o1) = (row("w1"), row("w2"), row("w3"), row("o1"));
    assert_eq!((w1.state, w1.superseded_by), (FiringState::Superseded, Some(w2.seq)));
    assert_eq!((w2.state, w2.superseded_by), (FiringState::Superseded, Some(w3.seq)));
    assert_eq!((w3.state, o1.state), (FiringState::Pending, FiringState::Pending));
    assert_eq!(w3.not_before_ms, 2_100);
    let fired: Vec<_> = f.claim(2_100, 10).expect("claim").ready.into_iter().map(|c| c.event.id).collect();
    assert_eq!(fired, ["o1", "w3"], "arrival order");
}

#[test]
fn the_loop_guard_looks_up_each_event_of_a_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let (a, b) = (function("a", None, None), function("b", None, None));
    let cause_a = Cause {
        function: "a".into(),
        digest: a.manifest.module.clone(),
        event_id: "e0".into(),
        chain: vec!["a".into()],
        trace: None,
    };
    f.record_provenance("M1", &cause_a, 0).expect("record");
    let long = Cause { chain: vec!["x".into(); MAX_CHAIN], ..cause_a.clone() };
    f.record_provenance("M2", &long, 0).expect("record");
    let written = |id: &str, macaroon: &str| StorageEvent { macaroon: Some(macaroon.into()), ..event(id, "/data/x") };
    let both = [a.clone(), b.clone()];
    let done = f
        .insert_batch(
            &[
                new(written("e1", "M1"), &both),
                new(event("e2", "/data/x"), &both),
                new(written("e3", "M2"), &both),
                new(written("e4", "M9"), &both),
            ],
            1_000,
        )
        .expect("batch");
    let g =
        |queued, loop_guarded| Inserted { queued, deduplicated: 0, superseded: 0, loop_guarded, ..Inserted::default() };
    assert_eq!(done, [g(1, 1), g(2, 0), g(0, 2), g(2, 0)]);
    let claim = f.claim(1_000, 10).expect("claim");
    let fired: Vec<_> = claim
        .ready
        .iter()
        .map(|c| (c.event.id.as_str(), c.function.manifest.name.as_str(), c.cause.is_some()))
        .collect();
    assert_eq!(
        fired,
        [("e1", "b", true), ("e2", "a", false), ("e2", "b", false), ("e4", "a", false), ("e4", "b", false)]
    );
    assert_eq!(claim.ready[0].cause, Some(cause_a));
}

#[test]
fn a_failed_batch_writes_nothing_and_can_be_inserted_again_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let (a, d) = (function("a", None, None), function("d", None, Some(2)));
    f.insert(&event("w0", "/data/one"), std::slice::from_ref(&d), None, 0).expect("insert");
    // The table refuses the third event's firing, after the first two were written in the
    // transaction (and w0 superseded by w1).
    f.with(|c| {
        Ok(c.execute_batch(
            "CREATE TRIGGER refuse_bad BEFORE INSERT ON firings WHEN NEW.event_key = 'bad' \
             BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
        )?)
    })
    .expect("trigger");
    let batch = [
        new(event("w1", "/data/one"), &[a.clone(), d.clone()]),
        new(event("e2", "/data/two"), std::slice::from_ref(&a)),
        new(event("bad", "/data/three"), std::slice::from_ref(&a)),
    ];
    let e = f.insert_batch(&batch, 100).expect_err("refused");
    assert!(e.to_string().contains("injected failure"), "{e}");
    assert_eq!(states(&f), [("w0".into(), "d".into(), FiringState::Pending)], "nothing of the batch");
    assert_eq!(f.pending(), 1);
    f.with(|c| Ok(c.execute_batch("DROP TRIGGER refuse_bad;")?)).expect("drop trigger");
    // Redelivered, the whole batch is new: no half of it was kept.
    let done = f.insert_batch(&batch, 200).expect("batch");
    assert_eq!(
        done.iter().map(|d| (d.queued, d.deduplicated, d.superseded)).collect::<Vec<_>>(),
        [(2, 0, 1), (1, 0, 0), (1, 0, 0)]
    );
    assert_eq!(f.pending(), 4, "w1 a, w1 d, e2, bad; w0 superseded");
}

#[test]
fn the_token_bucket_lends_future_tokens_at_its_rate() {
    let mut b = TokenBucket::new(2.0, 1, 0);
    assert_eq!(b.reserve(0), 0);
    assert_eq!(b.reserve(0), 500);
    assert_eq!(b.reserve(0), 1_000);
    assert_eq!(b.reserve(100), 1_500, "lent tokens stay lent");
    // After a quiet spell the bucket is full again, up to its burst.
    let mut b = TokenBucket::new(10.0, 3, 0);
    assert_eq!([b.reserve(0), b.reserve(0), b.reserve(0), b.reserve(0)], [0, 0, 0, 100]);
    assert_eq!(b.reserve(10_000), 10_000);
    assert_eq!(b.reserve(10_000), 10_000);
    assert_eq!(b.reserve(10_000), 10_000);
    assert_eq!(b.reserve(10_000), 10_100);
    // Refill is capped at the burst.
    let mut b = TokenBucket::new(1.0, 2, 0);
    assert_eq!([b.reserve(100_000), b.reserve(100_000), b.reserve(100_000)], [100_000, 100_000, 101_000]);
}

#[test]
fn rate_limited_firings_wait_for_their_token_and_none_is_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let r = function("r", Some(RateLimit { per_s: 2.0, burst: 1 }), None);
    for i in 0..4 {
        f.insert(&event(&format!("e{i}"), &format!("/data/{i}")), std::slice::from_ref(&r), None, 0).expect("ins");
    }
    let first = f.claim(0, 100).expect("claim");
    assert_eq!((first.ready.len(), first.rate_delayed), (1, 3));
    let nb: Vec<u64> = f.list(0, 10).expect("list").iter().map(|r| r.not_before_ms).collect();
    assert_eq!(nb, [0, 500, 1_000, 1_500]);
    assert!(f.claim(499, 100).expect("claim").ready.is_empty());
    for at in [500, 1_000, 1_500] {
        let c = f.claim(at, 100).expect("claim");
        assert_eq!((c.ready.len(), c.rate_delayed), (1, 0), "at {at}: its reserved token");
    }
    assert_eq!(f.pending(), 4, "all submitting, none dropped");
}

/// A storm on a rate-limited trigger: 10,000 events in one commit, claimed as a dispatcher
/// claims them on a clock that moves 50 ms at a time. Every firing is claimed exactly once
/// (none lost, none twice), never faster than the bucket allows at any point, and the whole
/// storm takes the time its rate says. As it drains, the function's held count (the metrics'
/// `htfaas_gateway_firings_rate_waiting`) is the firings the rate delayed and that are not
/// claimed yet: never more than it delayed or than are left, exactly the pending firings given
/// a later time as the table lists them, and none once the storm is through.
#[test]
fn a_storm_of_10000_events_on_a_rate_limited_trigger_all_fire_at_the_rate_none_lost() {
    const EVENTS: usize = 10_000;
    let (per_s, burst) = (2_000.0, 20);
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let r = function("r", Some(RateLimit { per_s, burst }), None);
    let batch: Vec<NewFirings> = (0..EVENTS)
        .map(|i| NewFirings {
            event: event(&format!("e{i}"), &format!("/data/{i}")),
            functions: vec![r.clone()],
            replay: None,
        })
        .collect();
    let inserted = f.insert_batch(&batch, 0).expect("insert the storm");
    assert_eq!(inserted.iter().map(|i| i.queued).sum::<u64>(), EVENTS as u64);
    let held = |f: &Firings| match f.rate_waiting().expect("the held firings").as_slice() {
        [] => 0,
        [(function, n)] if function == "r" => *n,
        other => panic!("only r is rate-limited: {other:?}"),
    };
    let mut fired = std::collections::HashSet::new();
    let (mut now, mut delayed, mut most_held) = (0, 0, 0);
    while fired.len() < EVENTS && now <= 60_000 {
        let claim = f.claim(now, 1_000).expect("claim");
        delayed += claim.rate_delayed;
        for c in claim.ready {
            assert!(fired.insert(c.event.id.clone()), "{} claimed twice", c.event.id);
        }
        let allowed = burst as f64 + per_s * now as f64 / 1000.0;
        assert!(fired.len() as f64 <= allowed + 1.0, "{} fired by {now} ms: faster than the rate", fired.len());
        let waiting = held(&f);
        assert!(waiting <= delayed, "{waiting} held at {now} ms, {delayed} delayed");
        assert!(waiting as usize <= EVENTS - fired.len(), "{waiting} held at {now} ms, {} fired", fired.len());
        if now % 1_000 == 0 {
            let listed = f.list(0, EVENTS).expect("list");
            let later = listed.iter().filter(|x| x.state == FiringState::Pending && x.not_before_ms > 0);
            assert_eq!(waiting, later.count() as u64, "at {now} ms");
        }
        most_held = most_held.max(waiting);
        now += 50;
    }
    assert_eq!(fired.len(), EVENTS, "every event fired");
    assert!(most_held >= 1_000, "the storm was held by its rate: at most {most_held} at once");
    assert_eq!(f.rate_waiting().expect("the held firings"), [], "drained: nothing held, no function listed");
    let needed = ((EVENTS - burst as usize) as f64 / per_s * 1000.0) as u64;
    assert!(now >= needed, "the storm took {now} ms of the clock, its rate needs {needed} ms");
    assert_eq!(f.pending(), EVENTS as u64, "all submitting, none dropped");
}

/// A schedule's last fired tick is kept across a reopen and never moves back.
#[test]
fn a_schedules_last_tick_survives_a_restart_and_never_moves_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let f = open(dir.path());
        assert_eq!(f.last_tick("nightly").expect("read"), None);
        f.set_last_tick("nightly", 2_000).expect("write");
        f.set_last_tick("nightly", 1_000).expect("an older tick");
    }
    let f = open(dir.path());
    assert_eq!(f.last_tick("nightly").expect("read"), Some(2_000));
    assert_eq!(f.last_tick("other").expect("read"), None);
}

#[test]
fn pending_and_submitting_firings_survive_a_restart_and_failures_back_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = function("a", None, None);
    {
        let f = open(dir.path());
        for i in 0..3 {
            f.insert(&event(&format!("e{i}"), "/data/x"), std::slice::from_ref(&a), None, 0).expect("insert");
        }
        let c = f.claim(0, 2).expect("claim");
        f.mark_submitted(c.ready[0].seq, "job-0", 1).expect("mark");
        // e1 is submitting when the gateway dies; e2 is pending.
    }
    let f = open(dir.path());
    assert_eq!(f.pending(), 2);
    let c = f.claim(10, 10).expect("claim");
    assert_eq!(c.ready.iter().map(|c| c.event.id.as_str()).collect::<Vec<_>>(), ["e1", "e2"]);
    assert_eq!(c.ready[0].function, a, "the stored record");
    // A redelivery after the restart is still dropped.
    assert_eq!(f.insert(&event("e0", "/data/x"), std::slice::from_ref(&a), None, 20).expect("ins").deduplicated, 1);
    // Transient failures: 0.5 s, 1 s, 2 s, … up to a minute.
    let seq = c.ready[1].seq;
    assert_eq!(f.retry_later(seq, "down", 100).expect("retry"), 100 + 500);
    assert!(f.claim(599, 10).expect("claim").ready.is_empty());
    assert_eq!(f.claim(600, 10).expect("claim").ready.len(), 1);
    assert_eq!(f.retry_later(seq, "down", 1_000).expect("retry"), 1_000 + 1_000);
    assert_eq!((backoff_ms(1), backoff_ms(3), backoff_ms(8), backoff_ms(40)), (500, 2_000, 60_000, 60_000));
    let row = f.list(0, 10).expect("list").into_iter().find(|r| r.seq == seq).expect("row");
    assert_eq!((row.state, row.attempts, row.reason.as_deref()), (FiringState::Pending, 2, Some("down")));
}

#[test]
fn a_newer_schema_is_refused_and_an_unreadable_row_is_refused_not_fatal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    f.insert(&event("e", "/data/x"), &[function("a", None, None)], None, 0).expect("insert");
    f.with(|c| Ok(c.execute("UPDATE firings SET record = 'not json'", [])?)).expect("corrupt");
    let c = f.claim(0, 10).expect("claim");
    assert_eq!((c.ready.len(), c.unreadable), (0, 1));
    assert_eq!(states(&f)[0].2, FiringState::Refused);
    f.with(|c| Ok(c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)?)).expect("bump");
    drop(f);
    let e = Firings::open(&dir.path().join("firings.sqlite"), 1, 1).expect_err("refused");
    assert!(
        matches!(e, FiringError::SchemaTooNew { found, supported } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{e}"
    );
}

#[test]
fn a_version_1_file_is_migrated_keeping_its_firings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("firings.sqlite");
    {
        let conn = Connection::open(&path).expect("open");
        conn.execute_batch(SCHEMA_1).expect("version 1 schema");
        conn.pragma_update(None, "user_version", 1).expect("version");
        conn.execute(
            "INSERT INTO firings (event_key, function, digest, version, path, record, event, state, not_before_ms, \
             created_ms, updated_ms, expires_ms) VALUES ('e', 'a', 'd', 1, '/p', ?1, ?2, 'pending', 0, 0, 0, 1)",
            params![
                serde_json::to_string(&function("a", None, None)).expect("json"),
                serde_json::to_string(&event("e", "/p")).expect("json")
            ],
        )
        .expect("a version 1 firing");
    }
    let f = Firings::open(&path, 3600, 16).expect("migrated");
    let claim = f.claim(0, 10).expect("claim");
    assert_eq!(claim.ready.len(), 1);
    assert_eq!(claim.ready[0].cause, None);
    assert_eq!(f.cause_of("M").expect("provenance table exists"), None);
}

/// Function `name` of `owner` (otherwise [`function`]'s).
fn owned(name: &str, owner: &str) -> FunctionRecord {
    let mut f = function(name, None, None);
    f.manifest.owner = owner.into();
    f
}

/// Claims go round owners first, then round each owner's functions. Owner A has five
/// functions with a backlog each, owner B one function with one firing, the newest of all: a
/// claim of two (a round robin over functions alone would take two of A's six functions'
/// oldest) takes B's firing, and claims of one each alternate between the owners.
#[test]
fn one_owners_many_functions_do_not_crowd_out_another_owners_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    for i in 0..5 {
        let a = owned(&format!("a{i}"), "owner-a");
        for j in 0..20 {
            f.insert(&event(&format!("a{i}-{j}"), "/data/a"), std::slice::from_ref(&a), None, 0).expect("insert");
        }
    }
    // Named to sort among A's functions, and arriving last.
    let b = owned("a2b", "owner-b");
    f.insert(&event("b0", "/data/b"), std::slice::from_ref(&b), None, 5).expect("insert");
    let claim = f.claim(10, 2).expect("claim");
    let ids: Vec<&str> = claim.ready.iter().map(|c| c.event.id.as_str()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&"b0"), "owner B's firing waits behind owner A's functions: {ids:?}");
    // A's functions take turns among themselves: with B's firing gone, claims of one each go
    // round A's five functions before any takes a second.
    let mut functions: Vec<String> =
        (0..5).map(|_| f.claim(10, 1).expect("claim").ready[0].function.manifest.name.clone()).collect();
    functions.sort();
    functions.dedup();
    assert_eq!(functions.len(), 5, "{functions:?}");
    // B's next firing is in the very next claim of two, however long A's backlog.
    f.insert(&event("b1", "/data/b"), std::slice::from_ref(&b), None, 20).expect("insert");
    let ids: Vec<String> = f.claim(30, 2).expect("claim").ready.iter().map(|c| c.event.id.clone()).collect();
    assert!(ids.contains(&"b1".to_owned()), "{ids:?}");
}

/// The dispatcher's writes of many firings commit in one transaction, each in a
/// savepoint of its own: a write that fails is undone alone (its provenance too, though it was
/// written before its audit record failed) and answered with its reason; the others commit,
/// their outcomes and audit records with them, and the chain still verifies.
#[test]
fn a_failed_write_in_a_batch_fails_alone_with_its_reason() {
    use htfaas_functions::audit::{AuditKind, Subject};
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let a = function("a", None, None);
    for i in 0..3 {
        f.insert(&event(&format!("e{i}"), "/data/x"), std::slice::from_ref(&a), None, 0).expect("insert");
    }
    let seqs: Vec<i64> = f.claim(0, 3).expect("claim").ready.iter().map(|c| c.seq).collect();
    assert_eq!((seqs.len(), f.pending()), (3, 3));
    // Any audit record about owner "mallory" is refused (a stand-in for a write that fails).
    f.with(|c| {
        Ok(c.execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON audit_records WHEN NEW.owner = 'mallory' \
             BEGIN SELECT RAISE(ABORT, 'poisoned record'); END",
        )?)
    })
    .expect("trigger");
    let cause = |id: &str| Cause {
        function: "a".into(),
        digest: a.manifest.module.clone(),
        event_id: id.into(),
        chain: vec!["a".into()],
        trace: None,
    };
    let record = |owner: &str| {
        AuditDraft::new(
            AuditKind::TokenMinted,
            Subject { owner: Some(owner.into()), ..Subject::default() },
            serde_json::json!({}),
        )
    };
    let writes = vec![
        Write::Provenance { macaroon: "M1".into(), cause: cause("e0"), records: vec![record("alice")] },
        Write::Provenance { macaroon: "M2".into(), cause: cause("e1"), records: vec![record("mallory")] },
        Write::Outcome { seq: seqs[0], outcome: Outcome::Submitted { job_id: "job-0".into() } },
        Write::Outcome { seq: seqs[1], outcome: Outcome::Refused { reason: "no".into() } },
        Write::Outcome { seq: seqs[2], outcome: Outcome::RetryLater { reason: "down".into() } },
    ];
    let done = f.write_batch(writes, 100);
    assert_eq!(done.len(), 5);
    let err = done[1].as_ref().expect_err("the poisoned write fails");
    assert!(err.to_string().contains("poisoned record"), "{err}");
    for i in [0, 2, 3, 4] {
        assert!(done[i].is_ok(), "write {i}: {:?}", done[i]);
    }
    assert!(done[2].as_ref().expect("ok").finished);
    assert_eq!(done[4].as_ref().expect("ok").retry_at_ms, Some(100 + backoff_ms(1)));
    assert_eq!(f.cause_of("M1").expect("lookup"), Some(cause("e0")));
    assert_eq!(f.cause_of("M2").expect("lookup"), None, "the failed write's provenance was undone with it");
    let rows = f.list(0, 10).expect("list");
    let got: Vec<(FiringState, Option<&str>)> = rows.iter().map(|r| (r.state, r.job_id.as_deref())).collect();
    assert_eq!(
        got,
        [(FiringState::Submitted, Some("job-0")), (FiringState::Refused, None), (FiringState::Pending, None)]
    );
    // Two finished, one pending again.
    assert_eq!(f.pending(), 1);
    let records = htfaas_functions::audit::query(f.path(), &Default::default()).expect("query");
    let kinds: Vec<&str> = records.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["event.matched", "event.matched", "event.matched", "token.minted", "job.refused"]);
    let (signer, _) = htfaas_functions::audit::AuditSigner::generate("k").expect("keygen");
    f.checkpoint(&signer, Default::default(), true).expect("checkpoint");
    let report = htfaas_functions::audit::verify(f.path(), &signer.keys()).expect("verify");
    assert!(report.ok() && report.records == 5, "{report:?}");
}

/// The group commit answers each write only once it is committed (what a task
/// awaited is in the table), whatever the number of tasks writing at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_commit_answers_each_write_once_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = open(dir.path());
    let a = function("a", None, None);
    let n = 200;
    for i in 0..n {
        f.insert(&event(&format!("e{i}"), "/data/x"), std::slice::from_ref(&a), None, 0).expect("insert");
    }
    let claimed = f.claim(0, n).expect("claim").ready;
    assert_eq!(claimed.len(), n);
    let writer = FiringWriter::start(f.clone()).expect("writer");
    let mut tasks = tokio::task::JoinSet::new();
    for c in claimed {
        let (f, writer) = (f.clone(), writer.clone());
        tasks.spawn(async move {
            let id = format!("M{}", c.seq);
            let cause = Cause {
                function: "a".into(),
                digest: c.function.manifest.module.clone(),
                event_id: c.event.id.clone(),
                chain: vec!["a".into()],
                trace: None,
            };
            writer
                .write(Write::Provenance { macaroon: id.clone(), cause: cause.clone(), records: vec![] })
                .await
                .expect("provenance");
            // Committed before the answer: the next step (the submit) may rely on it.
            assert_eq!(f.cause_of(&id).expect("lookup"), Some(cause));
            let outcome = Outcome::Submitted { job_id: format!("job-{}", c.seq) };
            writer.write(Write::Outcome { seq: c.seq, outcome }).await.expect("outcome");
            let row = f.list(c.seq - 1, 1).expect("list").pop().expect("row");
            assert_eq!(row.state, FiringState::Submitted);
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task");
    }
    assert_eq!(f.pending(), 0);
}

/// What the dispatcher's writes cost per firing (provenance with its two credentials'
/// records, then the outcome), one transaction each (as before the group commit) against
/// `per_tx` firings' writes in one transaction, for each durability. Prints one JSON line:
/// `cargo test -p htfaas-gateway --lib -- --ignored --nocapture dispatcher_writes_per_firing`.
#[test]
#[ignore = "a measurement, not a test"]
fn dispatcher_writes_per_firing() {
    use htfaas_functions::audit::{AuditKind, Subject};
    let a = function("a", None, None);
    let mut out = Vec::new();
    for durability in [Durability::Log, Durability::Fsync] {
        for per_tx in [1usize, 4, 16] {
            let dir = tempfile::tempdir().expect("tempdir");
            let f = Firings::open_with(&dir.path().join("firings.sqlite"), 3600, 16, durability).expect("open");
            let n = 400;
            for i in 0..n {
                f.insert(&event(&format!("e{i}"), "/data/x"), std::slice::from_ref(&a), None, 0).expect("insert");
            }
            let claimed = f.claim(0, n).expect("claim").ready;
            let record = |c: &Claimed, kind| {
                let subject = Subject {
                    token_jti: Some(format!("jti-{}", c.seq)),
                    owner: Some("alice".into()),
                    event_id: Some(c.event.id.clone()),
                    paths: vec![c.event.path.clone()],
                    ..Subject::default()
                };
                AuditDraft::new(kind, subject, serde_json::json!({"firing": c.seq, "cpus": 1, "memory_mb": 512}))
            };
            let t = std::time::Instant::now();
            for chunk in claimed.chunks(per_tx) {
                let provenance = chunk
                    .iter()
                    .map(|c| Write::Provenance {
                        macaroon: format!("M{}", c.seq),
                        cause: Cause {
                            function: "a".into(),
                            digest: a.manifest.module.clone(),
                            event_id: c.event.id.clone(),
                            chain: vec!["a".into()],
                            trace: None,
                        },
                        records: vec![record(c, AuditKind::TokenMinted), record(c, AuditKind::MacaroonsObtained)],
                    })
                    .collect();
                assert!(f.write_batch(provenance, 1).iter().all(Result::is_ok));
                let outcomes = chunk
                    .iter()
                    .map(|c| Write::Outcome {
                        seq: c.seq,
                        outcome: Outcome::Submitted { job_id: format!("j{}", c.seq) },
                    })
                    .collect();
                assert!(f.write_batch(outcomes, 2).iter().all(Result::is_ok));
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            out.push(format!("\"{durability:?}_per_tx_{per_tx}_us\":{us:.0}"));
        }
    }
    println!("{{{}}}", out.join(","));
}
