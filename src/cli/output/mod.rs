//! Everything `htfaas` prints: the tables, the records as lines, the reports, and the same as
//! JSON with `--json`; the audit trails' records, lineages and verify reports in [`audit`];
//! annexes in [`annex`]. Must
//! not know: where the data comes from (the client, the stack, clap).

mod annex;
mod audit;
mod dlq;
pub mod export;
mod trace;

pub use annex::{
    annex, annexes, created as annex_created, deleted as annex_deleted, extended as annex_extended,
    shortfalls as annex_shortfalls,
};
pub use audit::{audit_records, head, lineage, reruns, verify, verify_reports};
pub use dlq::{dead_letter, dead_letters, redriven};
use htfaas::client::StackInfo;
use htfaas_functions::FunctionRecord;
use htfaas_functions::namespace::GrantEntry;
use htfaas_functions::proto::{
    Account, AccountingReport, Attempt, EpInfo, JobAnalysis, JobLog, JobRecord, OwnerPriority, PriorityReport, Report,
    Revocation, SubmitResponse, TestReport,
};
use htfaas_functions::registry::FunctionStatus;
use std::path::Path;
use std::time::Duration;
pub use trace::trace;

/// A value as pretty JSON, on a line of its own.
pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

// ---- bench, crash-test, overload

/// One figure of `htfaas bench`, as a JSON line.
pub fn bench_figure(f: &htfaas::bench::Figure) {
    if let Ok(line) = serde_json::to_string(f) {
        println!("{line}");
    }
}

/// The end of `htfaas bench`, on stderr.
pub fn bench_done(figures: usize, elapsed: Duration) {
    eprintln!("bench: {} figures in {:.1} s", figures, elapsed.as_secs_f64());
}

/// A harness's report (`crash-test`, `overload`), as it displays itself.
pub fn report(report: &impl std::fmt::Display) {
    println!("{report}");
}

// ---- up

/// `htfaas up`'s first lines: ready, where each component listens, where the console is.
pub fn stack_ready(info: &StackInfo, dir: &Path) {
    println!("ready");
    println!(
        "gateway {}  scheduler {}  storage {}  nats {}",
        info.gateway_url, info.scheduler_url, info.storage_url, info.nats_url
    );
    println!(
        "console {}/console  (admin token: \"admin_token\" in {})",
        info.gateway_url,
        dir.join("stack.json").display()
    );
}

/// Where a quiet `htfaas up` writes its logs.
pub fn logs_at(dir: &Path) {
    println!("logs in {} (htfaas logs [COMPONENT] [-f]; htfaas up -v prints them here)", dir.display());
}

/// The demo's output and how long it took.
pub fn demo_output(output: &str, elapsed: Duration) {
    println!("output after {:.1} ms:", elapsed.as_secs_f64() * 1e3);
    print!("{output}");
}

/// Why the demo failed, on stderr.
pub fn demo_failed(e: &anyhow::Error) {
    eprintln!("demo failed: {e:#}");
}

/// `htfaas up` runs until a signal.
pub fn running() {
    println!("running; Ctrl-C stops");
}

/// A component of `htfaas up` stopped by itself, on stderr.
pub fn stopped_unexpectedly(name: &str, result: anyhow::Result<()>) {
    eprintln!("{name} stopped unexpectedly: {:?}", result.err());
}

// ---- ep

fn ep_header() -> String {
    format!(
        "{:<20} {:<18} {:<44} {:>7} {:<24} {:<16} {:<12} {:<12} LABELS",
        "NAME", "STATE", "SLOTS(FREE/TOTAL)", "RUNNING", "DEADLINE", "PAUSED", "ANNEX", "OWNER"
    )
}

/// One EP as a row under [`ep_header`].
fn ep_line(ep: &htfaas_functions::proto::EpInfo) -> String {
    use htfaas_functions::proto::EpAdminState;
    let state = match ep.state {
        EpAdminState::Enabled => "enabled",
        EpAdminState::Draining => "draining",
        EpAdminState::Disabled => "disabled",
    };
    let state = if ep.session.is_some() { state.to_owned() } else { format!("{state},detached") };
    let slots = format!(
        "{}/{}cpu {}/{}MiB {}/{}gpu {}/{}GiB",
        ep.free.cpus,
        ep.total.cpus,
        ep.free.memory_mb,
        ep.total.memory_mb,
        ep.free.gpus,
        ep.total.gpus,
        ep.free.disk_mb / 1024,
        ep.total.disk_mb / 1024
    );
    let labels = if ep.labels.is_empty() {
        "-".to_owned()
    } else {
        ep.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
    };
    let deadline = ep.drain_deadline_ms.map_or_else(|| "-".to_owned(), fmt_unix_ms);
    let paused = if ep.paused_groups.is_empty() { "-".to_owned() } else { ep.paused_groups.join(",") };
    format!(
        "{:<20} {:<18} {:<44} {:>7} {:<24} {:<16} {:<12} {:<12} {}",
        ep.name,
        state,
        slots,
        ep.running.len(),
        deadline,
        paused,
        ep.annex.as_deref().unwrap_or("-"),
        ep.owner.as_deref().unwrap_or("-"),
        labels
    )
}

/// `htfaas ep list`.
pub fn eps(eps: &[EpInfo], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&eps)?);
    } else {
        println!("{}", ep_header());
        for ep in eps {
            println!("{}", ep_line(ep));
        }
    }
    Ok(())
}

/// One EP after an admin action.
pub fn ep(ep: &EpInfo) {
    println!("{}", ep_line(ep));
}

// ---- fn

/// `htfaas fn register --dry-run`: the (event, function) pairs and the counts.
pub fn dry_run(name: &str, report: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    println!("manifest of {} is valid; not registered (dry run)", name);
    for p in &report.pairs {
        println!("{}", pair_line(p));
    }
    println!("{}", report_summary(report));
    Ok(())
}

/// A registered function.
pub fn registered(record: &FunctionRecord) {
    println!("registered {} v{} {}", record.manifest.name, record.version, record.manifest.module);
}

/// `htfaas fn test`: how the event parsed and what the trigger said.
pub fn fn_test(report: &TestReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    match &report.event {
        Some(e) => println!("parsed: {} {} {} (id {})", e.kind.as_str(), e.msg_type, e.path, e.id),
        None => println!("parsed: {}: {}", report.outcome, report.reason.as_deref().unwrap_or("")),
    }
    println!("trigger of {} v{}: {}", report.function, report.version, report.trigger);
    for part in &report.parts {
        println!("  {} {}: {}", part.part, part.text, part.verdict);
    }
    if report.own_output {
        println!("  the file is in the function's own output directory: never fires");
    }
    let verdict = report.verdict.as_deref().unwrap_or("no event");
    println!("verdict: {verdict} ({})", if report.fires { "fires" } else { "does not fire" });
    if let Some(g) = &report.group {
        println!("group {}: {} file(s) so far", g.key, g.members.len());
        for m in &g.members {
            println!("  {m}");
        }
        match (&g.refused, g.completes, &g.missing) {
            (Some(why), _, _) => println!("  the file joins no group: {why}"),
            (None, true, _) => println!("  this file completes the group: it fires once, on this file"),
            (None, false, Some(missing)) => println!("  the group then waits for {missing}"),
            (None, false, None) => {}
        }
    }
    Ok(())
}

/// `htfaas fn list`.
pub fn functions(functions: &[FunctionStatus], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&functions)?);
    } else {
        // The trigger last: a rule can be long.
        println!(
            "{:<20} {:>4} {:>6} {:<8} {:<24} {:<16} TRIGGER",
            "NAME", "VER", "LATEST", "STATE", "OUTPUTS", "MODULE"
        );
        for f in functions {
            let m = &f.record.manifest;
            println!(
                "{:<20} {:>4} {:>6} {:<8} {:<24} {:<16} {}",
                m.name,
                f.record.version,
                f.latest_version,
                state(f),
                m.outputs.dir,
                m.module.short(),
                m.trigger
            );
        }
    }
    Ok(())
}

/// `enabled`, `disabled`, `pinned` (enabled, pinned), `disabled,pinned`.
fn state(f: &FunctionStatus) -> String {
    let base = if f.enabled { "enabled" } else { "disabled" };
    match (f.enabled, f.pinned) {
        (true, Some(_)) => "pinned".into(),
        (false, Some(_)) => format!("{base},pinned"),
        _ => base.into(),
    }
}

/// Every version of one function; the live one marked.
pub fn function_versions(status: &FunctionStatus, versions: &[FunctionRecord], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&versions)?);
        return Ok(());
    }
    println!("{} ({}): v{} fires", status.record.manifest.name, state(status), status.record.version);
    println!("  {:>4} {:<20} {:<16} TRIGGER", "VER", "REGISTERED", "MODULE");
    for r in versions {
        let mark = if r.version == status.record.version { "*" } else { " " };
        println!(
            "{mark} {:>4} {:<20} {:<16} {}",
            r.version,
            htfaas_functions::time::utc_timestamp(r.registered_at),
            r.manifest.module.short(),
            r.manifest.trigger
        );
    }
    Ok(())
}

/// A function after a change: what was done and what fires now.
pub fn function_changed(what: &str, status: &FunctionStatus) {
    println!(
        "{what} {}: v{} fires (latest v{}; {})",
        status.record.manifest.name,
        status.record.version,
        status.latest_version,
        state(status)
    );
}

// ---- ns

/// A grant given.
pub fn granted(entry: &GrantEntry) {
    println!("granted {}", entry.grant);
}

/// A grant taken back.
pub fn revoked_grant(entry: &GrantEntry) {
    println!("revoked {}", entry.grant);
}

/// `htfaas ns list`.
pub fn grants(grants: &[GrantEntry], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&grants)?);
    } else {
        println!("{:<20} {:<8} {:<7} VALUE", "PRINCIPAL", "RIGHT", "SOURCE");
        for e in grants {
            let source = match e.source {
                htfaas_functions::namespace::GrantSource::Config => "config",
                htfaas_functions::namespace::GrantSource::Admin => "admin",
                htfaas_functions::namespace::GrantSource::Map => "map",
            };
            println!("{:<20} {:<8} {:<7} {}", e.grant.principal, e.grant.right, source, e.grant.value);
        }
    }
    Ok(())
}

// ---- jobs

/// `htfaas jobs`.
pub fn jobs(jobs: &[JobRecord], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&jobs)?);
    } else {
        println!("{:<36} {:<10} {:<12} {:<10} {:>8} INPUT / REASON", "ID", "OWNER", "FUNCTION", "STATE", "WALL_MS");
        for j in jobs {
            let wall = j.usage.map(|u| u.wall_ms.to_string()).unwrap_or_default();
            let detail = if j.reason.is_empty() { j.event.path.clone() } else { j.reason.clone() };
            println!("{:<36} {:<10} {:<12} {:<10} {:>8} {}", j.id, j.owner, j.function, j.state.as_str(), wall, detail);
        }
    }
    Ok(())
}

/// `htfaas fn invoke`: the job id, or with a wait how the job ended and its outputs; an error
/// when it did not complete (or not within the wait), so that a script sees it.
pub fn invoked(answer: &htfaas_functions::proto::InvokeResponse, waited: bool, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    }
    let Some(job) = &answer.job else {
        if !json {
            println!("job {}", answer.job_id);
        }
        anyhow::ensure!(
            !waited,
            "job {} has not ended within the wait; follow it with `htfaas jobs history {}`",
            answer.job_id,
            answer.job_id
        );
        return Ok(());
    };
    if !json {
        let exit = job.exit_code.map(|c| format!(" (exit {c})")).unwrap_or_default();
        println!("job {} {}{exit}", job.id, job.state.as_str());
        for o in &job.outputs {
            println!("{}\t{} bytes\tsha256 {}", o.path, o.size, o.sha256);
        }
    }
    anyhow::ensure!(
        job.state == htfaas_functions::proto::JobState::Completed,
        "job {} {}: {}",
        job.id,
        job.state.as_str(),
        job.reason
    );
    Ok(())
}

/// One job after an admin action.
pub fn job(job: &JobRecord, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&job)?);
    } else {
        println!("job {} is {}: {}", job.id, job.state.as_str(), job.reason);
    }
    Ok(())
}

/// `htfaas jobs log ID`.
pub fn job_log(log: &JobLog, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&log)?);
    } else {
        print!("{}", log.log);
    }
    Ok(())
}

/// `htfaas jobs history ID`.
pub fn job_history(attempts: &[Attempt], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&attempts)?);
    } else {
        println!("{:>3} {:<20} {:<24} {:<24} {:<11} REASON", "N", "EP", "STARTED", "ENDED", "OUTCOME");
        for a in attempts {
            let ended = a.ended_at_ms.map_or_else(|| "-".to_owned(), fmt_unix_ms);
            let line = format!(
                "{:>3} {:<20} {:<24} {:<24} {:<11} {}",
                a.n,
                a.ep,
                fmt_unix_ms(a.started_at_ms),
                ended,
                a.outcome,
                a.reason
            );
            println!("{}", line.trim_end());
        }
    }
    Ok(())
}

/// `htfaas jobs analyze ID`.
pub fn job_analysis(analysis: &JobAnalysis, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&analysis)?);
    } else {
        println!("{}", analysis.summary);
        for reason in &analysis.reasons {
            println!("  - {reason}");
        }
        for v in &analysis.eps {
            match &v.refusal {
                None => println!("{}: would run here", v.ep),
                Some(refusal) => println!("{}: {refusal}", v.ep),
            }
        }
    }
    Ok(())
}

// ---- accounting

fn owner_header() -> String {
    format!(
        "{:<16} {:>14} {:>10} {:>8} {:>12} {:>14} {:>14}",
        "OWNER", "EFFECTIVE-PRIO", "REAL-PRIO", "FACTOR", "CORES-IN-USE", "DECAYED-CORE-H", "TOTAL-CORE-H"
    )
}

/// One owner as a row under [`owner_header`].
fn owner_line(o: &htfaas_functions::proto::OwnerPriority) -> String {
    format!(
        "{:<16} {:>14.2} {:>10.2} {:>8.2} {:>12} {:>14.3} {:>14.3}",
        o.owner,
        o.effective_priority,
        o.real_priority,
        o.factor,
        o.cores_in_use,
        o.decayed_core_hours,
        o.accumulated_core_hours
    )
}

/// An owner's standing after `accounting set-factor`.
pub fn owner_standing(standing: &OwnerPriority, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&standing)?);
    } else {
        println!("{}", owner_line(standing));
    }
    Ok(())
}

/// `htfaas accounting --by …`: JSON, CSV or a table.
pub fn accounting_report(report: &AccountingReport, json: bool, csv: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else if csv {
        print!("{}", htfaas::client::report_csv(report));
    } else {
        print!("{}", htfaas::client::report_table(report));
    }
    Ok(())
}

/// `htfaas accounting`: owners' and groups' priorities.
pub fn priorities(report: &PriorityReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", owner_header());
        for o in &report.owners {
            println!("{}", owner_line(o));
        }
        if !report.groups.is_empty() {
            println!();
            println!(
                "{:<16} {:>8} {:>8} {:>12} {:>14} {:>14}",
                "GROUP", "QUOTA", "CAP", "CORES-IN-USE", "DECAYED-CORE-H", "TOTAL-CORE-H"
            );
            let cores = |c: Option<f64>| c.map_or_else(|| "-".to_owned(), |c| format!("{c:.1}"));
            for g in &report.groups {
                println!(
                    "{:<16} {:>8} {:>8} {:>12} {:>14.3} {:>14.3}",
                    g.group,
                    cores(g.quota_cores),
                    cores(g.cap_cores),
                    g.cores_in_use,
                    g.decayed_core_hours,
                    g.accumulated_core_hours
                );
            }
        }
    }
    Ok(())
}

/// `htfaas accounting --usage`.
pub fn usage(accounts: &[Account], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&accounts)?);
    } else {
        println!(
            "{:<16} {:>9} {:>6} {:>12} {:>10} {:>12} {:>12}",
            "OWNER", "COMPLETED", "FAILED", "CORE_HOURS", "CPU_S", "BYTES_IN", "BYTES_OUT"
        );
        for a in accounts {
            println!(
                "{:<16} {:>9} {:>6} {:>12.6} {:>10.3} {:>12} {:>12}",
                a.owner,
                a.jobs_completed,
                a.jobs_failed,
                a.core_seconds / 3600.0,
                a.cpu_seconds,
                a.bytes_in,
                a.bytes_out
            );
        }
    }
    Ok(())
}

// ---- token, submit

/// A minted token, alone on its line.
pub fn token(token: &str) {
    println!("{token}");
}

/// What a revocation did.
pub fn revocation(r: &Revocation) {
    println!(
        "revoked {:?}: {} queued job(s) removed, {} running job(s) stopped, {} EP session(s) closed",
        r.target,
        r.removed_jobs.len(),
        r.stopped_jobs.len(),
        r.closed_eps.len()
    );
}

/// `htfaas token revocations`.
pub fn revocations(list: &[Revocation], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        println!("{:<8} {:<40} {:<24} REASON", "KIND", "VALUE", "AT");
        for r in list {
            let (kind, value) = match &r.target {
                htfaas_functions::proto::RevocationTarget::Jti(v) => ("jti", v),
                htfaas_functions::proto::RevocationTarget::Owner(v) => ("owner", v),
                htfaas_functions::proto::RevocationTarget::Issuer(v) => ("issuer", v),
            };
            println!("{kind:<8} {value:<40} {:<24} {}", r.at_ms, r.reason);
        }
    }
    Ok(())
}

/// A job submitted with `htfaas submit`.
pub fn submitted(reply: &SubmitResponse) {
    println!("job {} submitted", reply.job_id);
}

// ---- events

/// An event published.
pub fn published(subject: &str, seq: u64) {
    println!("published to {subject} (stream sequence {seq})");
}

/// `htfaas events replay`.
pub fn replay(report: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    // A replay's pairs are in --json; its lines are the counts.
    if report.dry_run {
        for p in &report.pairs {
            println!("{}", pair_line(p));
        }
    }
    println!("{}", report_summary(report));
    Ok(())
}

/// `htfaas events backfill`: each file fired (or that would be), then the counts.
pub fn backfill(r: &htfaas_functions::proto::BackfillReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
        return Ok(());
    }
    let verb = if r.dry_run { "would fire" } else { "fired" };
    for f in &r.fired {
        println!("{verb} {}@{} {f}", r.function, r.version);
    }
    if r.fired_count > r.fired.len() as u64 {
        println!("… and {} more", r.fired_count - r.fired.len() as u64);
    }
    println!(
        "{} under {}: {} files listed{}, {} matched, {} fired already, {} too recent, {} {verb}",
        r.function,
        r.prefix,
        r.listed,
        if r.truncated { " (the listing stopped at its bound)" } else { "" },
        r.matched,
        r.already,
        r.too_recent,
        r.fired_count
    );
    Ok(())
}

/// One (event, function) pair of a replay report, as a line.
fn pair_line(p: &htfaas_functions::proto::Pair) -> String {
    let fired = match p.fired {
        None => "",
        Some(true) => " fired",
        Some(false) => " FAILED",
    };
    let group = p.group.as_deref().map(|g| format!(" (group {g})")).unwrap_or_default();
    format!(
        "{:>8} {} {}@{} {} {} {} {}{fired}{group}",
        p.seq, p.recorded, p.function, p.version, p.kind, p.msg_type, p.path, p.event_id
    )
}

/// The counts of a replay report, and why it stopped early if it did.
fn report_summary(r: &htfaas_functions::proto::Report) -> String {
    let mut line = format!(
        "scanned {} since {} (events {}, ignored {}, not enabled {}, malformed {}); {} pairs {}",
        r.scanned,
        r.since,
        r.parsed,
        r.ignored,
        r.not_enabled,
        r.malformed,
        r.matched,
        if r.dry_run { "would fire" } else { "matched" }
    );
    if let Some(id) = &r.replay_id {
        line.push_str(&format!("; replay {id}: fired {}, failures {}", r.fired, r.failures));
    }
    if r.pairs_truncated {
        line.push_str(&format!("; only the first {} pairs listed", r.pairs.len()));
    }
    if let Some(why) = &r.stopped {
        line.push_str(&format!("\nstopped early at {why}"));
        if let Some(since) = &r.resume_since {
            line.push_str(&format!("; continue with --since {since}"));
            if let Some(id) = &r.replay_id {
                line.push_str(&format!(" --replay-id {id}"));
            }
        }
    }
    line
}

use htfaas_functions::time::utc_timestamp_ms as fmt_unix_ms;

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::Resources;

    #[test]
    fn ep_lines_show_disk_and_labels() {
        use htfaas_functions::proto::{EpAdminState, EpInfo};
        let total = Resources { cpus: 8, memory_mb: 30000, runtime_s: 3600, gpus: 2, disk_mb: 102400 };
        let free = Resources { cpus: 6, memory_mb: 28000, runtime_s: 3600, gpus: 1, disk_mb: 51200 };
        let ep = EpInfo {
            name: "ep-1".into(),
            session: Some("s1".into()),
            address: None,
            annex: None,
            owner: None,
            total,
            free,
            running: vec!["j1".into(), "j2".into()],
            state: EpAdminState::Draining,
            drain_deadline_ms: None,
            paused_groups: vec![],
            reason: String::new(),
            labels: [("arch".to_owned(), "x86_64".to_owned()), ("site".to_owned(), "desy".to_owned())].into(),
        };
        let line = ep_line(&ep);
        assert!(line.starts_with("ep-1 "), "{line}");
        assert!(line.contains("draining"), "{line}");
        assert!(line.contains("6/8cpu 28000/30000MiB 1/2gpu 50/100GiB"), "{line}");
        assert!(line.ends_with(" arch=x86_64,site=desy"), "{line}");
        let bare = EpInfo { labels: Default::default(), ..ep };
        assert!(ep_line(&bare).ends_with(" -"));
        assert!(ep_header().ends_with("OWNER        LABELS"));
    }

    #[test]
    fn replay_reports_print_one_line_per_pair_and_the_counts() {
        use htfaas_functions::proto::{Pair, Report};
        let pair = Pair {
            seq: 12,
            recorded: "2026-11-22T10:00:00.000Z".into(),
            event_id: "dcache-billing:write:0000BEEF/s".into(),
            path: "/data/raw/a.h5".into(),
            kind: "write".into(),
            msg_type: "transfer".into(),
            time: None,
            function: "a".into(),
            version: 2,
            fired: None,
            group: None,
        };
        assert_eq!(
            pair_line(&pair),
            "      12 2026-11-22T10:00:00.000Z a@2 write transfer /data/raw/a.h5 dcache-billing:write:0000BEEF/s"
        );
        let grouped = Pair { group: Some("/data/raw/".into()), ..pair.clone() };
        assert!(pair_line(&grouped).ends_with("0000BEEF/s (group /data/raw/)"), "{}", pair_line(&grouped));
        let report = Report {
            dry_run: false,
            replay_id: Some("r1".into()),
            since: "2026-11-22T08:00:00.000Z".into(),
            scanned: 5,
            parsed: 4,
            malformed: 1,
            matched: 3,
            fired: 3,
            stopped: Some("the limit of 5 messages".into()),
            resume_since: Some("2026-11-22T09:00:00.000Z".into()),
            ..Report::default()
        };
        assert_eq!(
            report_summary(&report),
            "scanned 5 since 2026-11-22T08:00:00.000Z (events 4, ignored 0, not enabled 0, malformed 1); 3 pairs \
             matched; replay r1: fired 3, failures 0\nstopped early at the limit of 5 messages; continue with \
             --since 2026-11-22T09:00:00.000Z --replay-id r1"
        );
    }

    #[test]
    fn unix_ms_is_formatted_as_utc() {
        assert_eq!(fmt_unix_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(fmt_unix_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(fmt_unix_ms(1_740_830_400_250), "2025-03-01T12:00:00.250Z");
    }
}
