//! Accounting reports: per owner, group and function, per period; figures equal the sum of the job records.
//!
//! Jobs of three owners (one in a group) and two functions (one that exits 3) run on the real
//! stack in two phases; the report (`GET /v1/accounting/report` through the gateway) is checked
//! against sums computed here from `GET /v1/jobs`: exact for counts, bytes and peak memory,
//! within 1e-9 relative for hours. Split into periods it adds up to the unsplit report; a
//! `since`/`until` between the phases keeps exactly the jobs on its side; its CSV parses back
//! to the same numbers.

use htfaas::client::{Client, REPORT_CSV_COLUMNS, report_csv};
use htfaas::stack::{SubmitGrant, USER, demo_manifest, mint_submit_token};
use htfaas_functions::Resources;
use htfaas_functions::namespace::Right;
use htfaas_functions::proto::{AccountingBy, AccountingQuery, AccountingReport, AccountingRow, JobRecord, JobState};
use htfaas_tests::{guest_wasm, start_stack, upload_checksum, wait_for};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);
const INPUT: &str = "/data/acct/in.dat";

/// What a report row should say, summed here from job records.
#[derive(Debug, Default, Clone, PartialEq)]
struct Expected {
    jobs: BTreeMap<String, u64>,
    core_ms: u64,
    wall_ms: u64,
    cpu_ms: u64,
    peak_memory_bytes: u64,
    bytes_read: u64,
    bytes_written: u64,
    instructions: Option<u64>,
}

fn key_of(job: &JobRecord, by: AccountingBy) -> String {
    match by {
        AccountingBy::Owner => job.owner.clone(),
        AccountingBy::Group => job.group.clone().unwrap_or_else(|| "(none)".into()),
        AccountingBy::Function => job.function.clone(),
    }
}

/// Per key, the sums over `jobs` that `keep` selects.
fn expected(jobs: &[JobRecord], by: AccountingBy, keep: impl Fn(&JobRecord) -> bool) -> BTreeMap<String, Expected> {
    let mut out: BTreeMap<String, Expected> = BTreeMap::new();
    for j in jobs.iter().filter(|j| keep(j)) {
        let e = out.entry(key_of(j, by)).or_default();
        *e.jobs.entry(j.state.as_str().to_owned()).or_default() += 1;
        if let Some(u) = &j.usage {
            e.core_ms += u64::from(j.resources.cpus) * u.wall_ms;
            e.wall_ms += u.wall_ms;
            e.cpu_ms += u.cpu_ms;
            e.peak_memory_bytes = e.peak_memory_bytes.max(u.peak_memory_bytes);
            e.bytes_read += u.bytes_in;
            e.bytes_written += u.bytes_out;
            if let Some(i) = u.instructions {
                e.instructions = Some(e.instructions.unwrap_or(0) + i);
            }
        }
    }
    out
}

fn close(hours: f64, ms: u64, what: &str) {
    let want = ms as f64 / 3_600_000.0;
    assert!((hours - want).abs() <= 1e-9 * want.abs().max(f64::MIN_POSITIVE), "{what}: {hours} h, want {want} h");
}

/// The rows of `report` (one per key: it must be unsplit) equal `want`.
fn assert_matches(report: &AccountingReport, want: &BTreeMap<String, Expected>, what: &str) {
    let keys: Vec<&str> = report.rows.iter().map(|r| r.key.as_str()).collect();
    let want_keys: Vec<&str> = want.keys().map(String::as_str).collect();
    assert_eq!(keys, want_keys, "{what}: keys, sorted: {report:#?}");
    for row in &report.rows {
        let e = &want[&row.key];
        let at = format!("{what}, {}", row.key);
        assert_eq!(row.jobs, e.jobs, "{at}: jobs by state");
        assert_eq!(
            (row.peak_memory_bytes, row.bytes_read, row.bytes_written, row.instructions),
            (e.peak_memory_bytes, e.bytes_read, e.bytes_written, e.instructions),
            "{at}: peak memory, bytes read and written, instructions"
        );
        close(row.core_hours, e.core_ms, &format!("{at}: core-hours"));
        close(row.wall_hours, e.wall_ms, &format!("{at}: wall hours"));
        close(row.cpu_hours, e.cpu_ms, &format!("{at}: cpu hours"));
    }
}

async fn report(client: &Client, by: AccountingBy, since_ms: Option<u64>, until_ms: Option<u64>) -> AccountingReport {
    let query = AccountingQuery { since_ms, until_ms, by, period_s: None };
    client.accounting_report(&query).await.expect("report")
}

/// Cores the `fail` function asks: 2 where the EP has them, so that core-hours are not wall hours.
fn cores() -> u32 {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 { 2 } else { 1 }
}

/// Runs `function` on [`INPUT`] as `owner` (in `group`, granted to it), with a token of its own.
/// Its write macaroon is `owner`'s, so it may replace the output of the same input that another
/// principal's run wrote only with a `replace` grant there (given).
async fn run(client: &Client, dir: &Path, owner: &str, group: Option<&str>, function: &str) -> String {
    let grant = SubmitGrant {
        owner: owner.into(),
        jobs: 1,
        limits: Resources::new(2, 512, 120),
        function: None,
        group: group.map(str::to_owned),
        ttl_s: 600,
    };
    htfaas_tests::share_data(client, owner).await;
    client.grant(owner, Right::Replace, "/data/acct-sums/").await.expect("grant replace");
    if let Some(group) = group {
        client.grant(owner, Right::Group, group).await.expect("grant the group");
    }
    let token = mint_submit_token(dir, &grant).expect("mint");
    client.run_function(&token, function, INPUT).await.expect("submit").job_id
}

/// Every job, once `n` of them are in a final state and none is not.
async fn all_final(client: &Client, n: usize) -> Vec<JobRecord> {
    wait_for(&format!("{n} jobs in a final state"), LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        let done = jobs.iter().all(|j| matches!(j.state, JobState::Completed | JobState::Failed | JobState::Removed));
        (done && jobs.len() == n).then_some(jobs)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_by_owner_group_and_function_equal_the_sums_of_the_job_records() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    // Two functions on the same files: `checksum`, and `fail` (the hostile guest exiting 3).
    let mut checksum = demo_manifest(upload_checksum(&client).await);
    checksum.trigger.path = "/data/acct/**".into();
    checksum.outputs.dir = "/data/acct-sums/".into();
    // Every principal's run writes the same output: each replaces the one before.
    checksum.outputs.replace = true;
    client.grant("alice", Right::Replace, "/data/acct-sums/").await.expect("grant replace");
    client.register(&checksum).await.expect("register checksum");
    let hostile = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("hostile.wasm")).await;
    let mut fail = demo_manifest(hostile.expect("upload hostile"));
    fail.name = "fail".into();
    fail.trigger.path = "/data/acct/**".into();
    fail.outputs.dir = "/data/acct-fail/".into();
    fail.args = vec!["exit".into(), "3".into()];
    fail.resources = Resources::new(cores(), 64, 60);
    client.register(&fail).await.expect("register fail");

    // Phase 1: the upload fires both for alice (the functions' owner); bob (group physics)
    // runs checksum.
    client.put_bytes(b"some bytes to account for".to_vec(), INPUT).await.expect("put");
    wait_for("the upload's two jobs", LIMIT, || async { (client.jobs().await.ok()?.len() >= 2).then_some(()) }).await;
    run(&client, dir.path(), "bob", Some("physics"), "checksum").await;
    let first = all_final(&client, 3).await;
    let split = first.iter().filter_map(|j| j.finished_at_ms).max().expect("finished") + 1;
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Phase 2: bob fails in physics, carol (no group) runs both.
    run(&client, dir.path(), "bob", Some("physics"), "fail").await;
    run(&client, dir.path(), "carol", None, "checksum").await;
    run(&client, dir.path(), "carol", None, "fail").await;
    let jobs = all_final(&client, 6).await;
    let states = |s: JobState| jobs.iter().filter(|j| j.state == s).count();
    assert_eq!((states(JobState::Completed), states(JobState::Failed)), (3, 3), "{jobs:#?}");
    assert!(jobs.iter().all(|j| j.finished_at_ms.is_some() && j.usage.is_some()), "{jobs:#?}");
    if cores() > 1 {
        assert!(jobs.iter().any(|j| j.resources.cpus == 2), "core-hours must differ from wall hours somewhere");
    }

    for by in [AccountingBy::Owner, AccountingBy::Group, AccountingBy::Function] {
        let whole = report(&client, by, None, None).await;
        assert_eq!((whole.by, whole.since_ms, whole.period_s), (by, 0, None));
        assert_matches(&whole, &expected(&jobs, by, |_| true), &format!("{by:?}"));

        // Since and until between the phases: each side has exactly its jobs.
        let before = report(&client, by, None, Some(split)).await;
        let want_before = expected(&jobs, by, |j| j.finished_at_ms < Some(split));
        assert_matches(&before, &want_before, &format!("{by:?} until the split"));
        let after = report(&client, by, Some(split), None).await;
        let want_after = expected(&jobs, by, |j| j.finished_at_ms >= Some(split));
        assert_matches(&after, &want_after, &format!("{by:?} since the split"));
        let count = |w: &BTreeMap<String, Expected>| w.values().flat_map(|e| e.jobs.values()).sum::<u64>();
        assert_eq!((count(&want_before), count(&want_after)), (3, 3));

        // One-second periods add up to the whole.
        let split_query = AccountingQuery { since_ms: None, until_ms: Some(whole.until_ms), by, period_s: Some(1) };
        let periods = client.accounting_report(&split_query).await.expect("split report");
        assert_eq!(periods.period_s, Some(1));
        let mut sums: BTreeMap<&str, AccountingRow> = BTreeMap::new();
        for r in &periods.rows {
            assert_eq!(r.period_start_ms % 1000, 0, "aligned: {r:?}");
            let s = sums.entry(r.key.as_str()).or_default();
            for (state, n) in &r.jobs {
                *s.jobs.entry(state.clone()).or_default() += n;
            }
            s.core_hours += r.core_hours;
            s.wall_hours += r.wall_hours;
            s.cpu_hours += r.cpu_hours;
            s.peak_memory_bytes = s.peak_memory_bytes.max(r.peak_memory_bytes);
            s.bytes_read += r.bytes_read;
            s.bytes_written += r.bytes_written;
        }
        assert_eq!(sums.len(), whole.rows.len(), "{by:?}: the same keys");
        for row in &whole.rows {
            let s = &sums[row.key.as_str()];
            let at = format!("{by:?} {} in periods", row.key);
            assert_eq!(s.jobs, row.jobs, "{at}: jobs");
            assert!((s.core_hours - row.core_hours).abs() <= 1e-9 * row.core_hours, "{at}: core-hours");
            assert!((s.wall_hours - row.wall_hours).abs() <= 1e-9 * row.wall_hours, "{at}: wall hours");
            assert!((s.cpu_hours - row.cpu_hours).abs() <= 1e-9 * row.cpu_hours, "{at}: cpu hours");
            let bytes = (s.peak_memory_bytes, s.bytes_read, s.bytes_written);
            assert_eq!(bytes, (row.peak_memory_bytes, row.bytes_read, row.bytes_written), "{at}");
        }

        // The CSV parses back to the same numbers.
        let csv = report_csv(&whole);
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some(REPORT_CSV_COLUMNS.join(",").as_str()));
        let parsed: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(parsed.len(), whole.rows.len());
        for (fields, row) in parsed.iter().zip(&whole.rows) {
            assert_eq!(fields.len(), REPORT_CSV_COLUMNS.len(), "{fields:?}");
            let int = |i: usize| fields[i].parse::<u64>().expect("an integer");
            let float = |i: usize| fields[i].parse::<f64>().expect("a number");
            let state = |s: &str| row.jobs.get(s).copied().unwrap_or(0);
            assert_eq!(fields[0], row.key);
            assert_eq!(int(1), row.period_start_ms);
            assert_eq!((int(2), int(3), int(4)), (state("completed"), state("failed"), state("removed")));
            assert_eq!((float(5), float(6), float(7)), (row.core_hours, row.wall_hours, row.cpu_hours));
            assert_eq!((int(8), int(9), int(10)), (row.peak_memory_bytes, row.bytes_read, row.bytes_written));
            assert_eq!(fields[11].parse::<u64>().ok(), row.instructions);
        }
    }

    // The keys this run produced.
    let by_group = report(&client, AccountingBy::Group, None, None).await;
    let groups: Vec<&str> = by_group.rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(groups, ["(none)", "physics"]);
    let by_owner = report(&client, AccountingBy::Owner, None, None).await;
    let owners: Vec<&str> = by_owner.rows.iter().map(|r| r.key.as_str()).collect();
    let mut want_owners = vec![USER, "bob", "carol"];
    want_owners.sort_unstable();
    assert_eq!(owners, want_owners);

    // A bad query is refused by the scheduler, through the gateway, with what is wrong.
    let zero = AccountingQuery { since_ms: None, until_ms: None, by: AccountingBy::Owner, period_s: Some(0) };
    let err = client.accounting_report(&zero).await.expect_err("period 0");
    assert!(format!("{err:#}").contains("400") && format!("{err:#}").contains("period_s"), "{err:#}");
    let many = AccountingQuery { since_ms: Some(0), until_ms: None, by: AccountingBy::Owner, period_s: Some(60) };
    let err = client.accounting_report(&many).await.expect_err("too many periods");
    assert!(format!("{err:#}").contains("at most 10000"), "{err:#}");
    stack.stop().await.expect("clean stop");
}

/// A manifest may name an accounting group (`fn register --group`), with a `group`
/// grant of its owner's: its triggered jobs are then charged to the group (the scheduler's
/// group quotas and pauses apply to them). Without the grant the registration is refused;
/// with it revoked, the next firing is refused when it would become a job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifests_accounting_group_charges_its_triggered_jobs_only_with_a_group_grant() {
    let (_dir, stack) = htfaas_tests::start_stack().await;
    let client = stack.client().expect("client");
    let digest = htfaas_tests::upload_checksum(&client).await;
    let mut manifest = htfaas::stack::demo_manifest(digest);
    manifest.group = Some("physics".into());
    let e = format!("{:#}", client.register(&manifest).await.expect_err("no group grant"));
    assert!(e.contains("403") && e.contains("accounting group \"physics\""), "{e}");

    client.grant("alice", Right::Group, "physics").await.expect("grant");
    client.register(&manifest).await.expect("registered with its group");
    client.put_bytes(b"physics".to_vec(), "/data/raw/physics.dat").await.expect("upload");
    let job = htfaas_tests::wait_for("the group's job", Duration::from_secs(60), || async {
        client
            .jobs()
            .await
            .ok()?
            .into_iter()
            .find(|j| j.event.path == "/data/raw/physics.dat" && j.state == JobState::Completed)
    })
    .await;
    assert_eq!(job.group.as_deref(), Some("physics"), "{job:#?}");
    let by_group = report(&client, AccountingBy::Group, None, None).await;
    let physics: u64 = by_group.rows.iter().filter(|r| r.key == "physics").flat_map(|r| r.jobs.values()).sum();
    assert_eq!(physics, 1, "{by_group:#?}");

    // Revoked: the next firing is refused, counted, and makes no job.
    client.revoke_grant("alice", Right::Group, "physics").await.expect("revoke");
    let refused = client.stats().await.expect("stats").jobs_refused;
    client.put_bytes(b"no group".to_vec(), "/data/raw/nogroup.dat").await.expect("upload");
    htfaas_tests::wait_for("the firing to be refused", Duration::from_secs(60), || async {
        (client.stats().await.ok()?.jobs_refused > refused).then_some(())
    })
    .await;
    let jobs = client.jobs().await.expect("jobs");
    assert!(jobs.iter().all(|j| j.event.path != "/data/raw/nogroup.dat"), "{jobs:#?}");
    stack.stop().await.expect("stop");
}
