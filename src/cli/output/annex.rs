//! What `htfaas annex` prints: an annex per line (`list`), one annex in full (`show`), and what
//! `create`, `extend` and `delete` did; the same as JSON with `--json`. Never the attach token.
//! Must not know: where the data comes from.

use htfaas::annex::provider::{BatchJob, BatchState};
use htfaas::annex::{AnnexStatus, Deleted};
use htfaas_functions::proto::{AnnexRecord, AnnexState};

fn now_ms() -> u64 {
    htfaas_functions::time::now_ms()
}

/// `ends in 4m12s`, or `ended`.
fn ends(record: &AnnexRecord) -> String {
    let now = now_ms();
    if record.ends_ms <= now {
        return "ended".into();
    }
    let s = (record.ends_ms - now) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn state(record: &AnnexRecord) -> &'static str {
    match record.state {
        AnnexState::Active => "active",
        AnnexState::Draining => "draining",
    }
}

fn batch_state(s: &BatchState) -> String {
    match s {
        BatchState::Pending(reason) if !reason.is_empty() && reason != "None" => format!("pending({reason})"),
        BatchState::Pending(_) => "pending".into(),
        BatchState::Running => "running".into(),
        BatchState::Ending => "ending".into(),
        BatchState::Done(how) => how.to_lowercase(),
        BatchState::Gone => "gone".into(),
        BatchState::Other(s) => s.to_lowercase(),
    }
}

fn jobs_summary(status: &AnnexStatus) -> String {
    let ids = &status.view.annex.jobs;
    match &status.batch_jobs {
        Some(jobs) => ids
            .iter()
            .map(|id| format!("{id}:{}", jobs.get(id).map_or_else(|| "?".into(), |j: &BatchJob| batch_state(&j.state))))
            .collect::<Vec<_>>()
            .join(","),
        None => ids.iter().map(|id| format!("{id}:?")).collect::<Vec<_>>().join(","),
    }
}

/// `htfaas annex list`.
pub fn annexes(list: &[AnnexStatus], json: bool) -> anyhow::Result<()> {
    if json {
        return super::json(list);
    }
    println!(
        "{:<20} {:<12} {:<8} {:<9} {:>10} {:>4} {:>3}  JOBS",
        "ANNEX", "OWNER", "PROVIDER", "STATE", "ENDS IN", "CPUS", "EPS"
    );
    for s in list {
        let r = &s.view.annex;
        println!(
            "{:<20} {:<12} {:<8} {:<9} {:>10} {:>4} {:>3}  {}",
            r.name,
            r.owner,
            r.provider,
            state(r),
            ends(r),
            r.cpus,
            s.view.eps.len(),
            jobs_summary(s)
        );
    }
    for s in list.iter().filter(|s| s.batch_error.is_some()) {
        eprintln!(
            "annex {}: batch jobs' states unknown: {}",
            s.view.annex.name,
            s.batch_error.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

/// `htfaas annex show NAME`.
pub fn annex(s: &AnnexStatus, json: bool) -> anyhow::Result<()> {
    if json {
        return super::json(s);
    }
    let r = &s.view.annex;
    println!("annex {} ({}), owner {}, provider {}", r.name, state(r), r.owner, r.provider);
    println!(
        "  {} EP(s) of {} cpus, {} MiB; idle shutdown {}; partition {}",
        r.count,
        r.cpus,
        r.memory_mb,
        r.idle_shutdown_s.map_or_else(|| "none".into(), |s| format!("{s}s")),
        r.partition.as_deref().unwrap_or("(default)")
    );
    println!(
        "  created {}, ends {} (in {}; EPs leave {}s before), token {} expires {}",
        super::fmt_unix_ms(r.created_ms),
        super::fmt_unix_ms(r.ends_ms),
        ends(r),
        r.drain_s,
        r.token_jti,
        super::fmt_unix_ms(r.token_exp_ms)
    );
    println!("  batch jobs:");
    for id in &r.jobs {
        match s.batch_jobs.as_ref().and_then(|j| j.get(id)) {
            Some(j) => println!(
                "    {id:<12} {:<20} ran {:>6} limit {}",
                batch_state(&j.state),
                j.elapsed_s.map_or_else(|| "-".into(), |e| format!("{e}s")),
                j.time_limit_s.map_or_else(|| "-".into(), |l| format!("{l}s"))
            ),
            None => println!("    {id:<12} ?"),
        }
    }
    if let Some(e) = &s.batch_error {
        println!("    (states unknown: {e})");
    }
    println!("  EPs attached: {}", s.view.eps.len());
    for ep in &s.view.eps {
        println!("    {}", super::ep_line(ep));
    }
    Ok(())
}

/// `htfaas annex create`: each bound function the annex's EPs cannot run, as a warning on
/// stderr (so `--json` stays one document).
pub fn shortfalls(short: &[String]) {
    for s in short {
        eprintln!("warning: {s}");
    }
}

/// `htfaas annex create`: the record and its jobs (never the token).
pub fn created(r: &AnnexRecord, elapsed_ms: u64, json: bool) -> anyhow::Result<()> {
    if json {
        return super::json(r);
    }
    println!(
        "annex {} created for {} in {elapsed_ms} ms: {} {} job(s) [{}], ends {}",
        r.name,
        r.owner,
        r.provider,
        r.jobs.len(),
        r.jobs.join(", "),
        super::fmt_unix_ms(r.ends_ms)
    );
    Ok(())
}

/// `htfaas annex extend`.
pub fn extended(r: &AnnexRecord, changed: &[String], json: bool) -> anyhow::Result<()> {
    if json {
        return super::json(&serde_json::json!({ "annex": r, "extended_jobs": changed }));
    }
    println!(
        "annex {} now ends {} (in {}); time limit raised on job(s) [{}]",
        r.name,
        super::fmt_unix_ms(r.ends_ms),
        ends(r),
        changed.join(", ")
    );
    Ok(())
}

/// `htfaas annex delete`.
pub fn deleted(d: &Deleted, json: bool) -> anyhow::Result<()> {
    if json {
        return super::json(d);
    }
    let r = &d.deleted.annex;
    println!(
        "annex {} deleted: EPs drained ({} still attached at the end), job(s) cancelled [{}], token {} revoked",
        r.name,
        d.eps_left_attached,
        d.cancelled.join(", "),
        r.token_jti
    );
    Ok(())
}
