//! What `htfaas dlq` prints: an entry per line (`list`), one entry in full with its re-drives
//! (`show`), and what `redrive` and `drop` did; the same as JSON with `--json`.
//! Must not know: where the data comes from.

use htfaas_functions::proto::{DeadLetter, RedriveResponse};
use htfaas_functions::time::utc_timestamp_ms;

/// `htfaas dlq list`.
pub fn dead_letters(list: &[DeadLetter], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!("{:>6} {:<11} {:<10} {:<14} {:<20} {:>8} REASON", "ID", "KIND", "OWNER", "FUNCTION", "WHEN", "REDRIVES");
    for e in list {
        let function = match e.version {
            Some(v) => format!("{}@{v}", e.function),
            None => e.function.clone(),
        };
        let dropped = if e.dropped.is_some() { " (dropped)" } else { "" };
        println!(
            "{:>6} {:<11} {:<10} {:<14} {:<20} {:>8} {}{dropped}",
            e.id,
            e.kind.as_str(),
            e.owner,
            function,
            utc_timestamp_ms(e.created_ms),
            e.redrives.len(),
            e.reason.lines().next().unwrap_or_default()
        );
    }
    Ok(())
}

/// `htfaas dlq show ID` (and `drop`).
pub fn dead_letter(e: &DeadLetter, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&e)?);
        return Ok(());
    }
    println!("entry     {} ({})", e.id, e.kind.as_str());
    println!("owner     {}", e.owner);
    let version = e.version.map(|v| format!(" v{v}")).unwrap_or_default();
    println!("function  {}{version} {}", e.function, e.digest.as_deref().unwrap_or_default());
    println!("event     {} {} ({})", e.event.id, e.event.path, e.event.source);
    if let Some(job) = &e.job_id {
        println!("job       {job}");
    }
    println!("when      {}", utc_timestamp_ms(e.created_ms));
    println!("reason    {}", e.reason);
    println!("redrivable {}", e.redrivable);
    for r in &e.redrives {
        let job = r.job_id.as_deref().unwrap_or("-");
        println!(
            "redrive {} by {} at {}: firing {} {} job {job}",
            r.n,
            r.by,
            utc_timestamp_ms(r.at_ms),
            r.firing,
            r.state
        );
    }
    if let Some(d) = &e.dropped {
        println!("dropped   by {} at {}: {}", d.by, utc_timestamp_ms(d.at_ms), d.reason);
    }
    Ok(())
}

/// `htfaas dlq redrive ID`.
pub fn redriven(r: &RedriveResponse, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let was = if r.created { "queued" } else { "was already there" };
        println!("entry {} re-drive {} {was}: firing {} ({})", r.id, r.redrive.n, r.redrive.firing, r.redrive.state);
    }
    Ok(())
}
