//! The audit trails as text: a record as a line, a file's lineage as a chain, a verify report.
//! Must not know: where the records come from.

use super::fmt_unix_ms;
use htfaas_functions::audit::{AuditRecord, VerifyReport};
use htfaas_functions::proto::{Lineage, Rerun, RerunVerdict};

/// `htfaas audit --file F` alone: the file's lineage.
pub fn lineage(lineage: &Lineage, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(lineage)?);
    } else {
        print!("{}", lineage_text(lineage));
    }
    Ok(())
}

/// `htfaas audit …`: the records, one line each.
pub fn audit_records(records: &[AuditRecord], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(records)?);
    } else {
        for r in records {
            println!("{}", trail_line(r));
        }
    }
    Ok(())
}

/// `htfaas audit rerun`: one line per re-derived file (or a JSON array of `{rerun, verdict}`);
/// an error when any is not identical.
pub fn reruns(checked: &[(Rerun, RerunVerdict)], json: bool) -> anyhow::Result<()> {
    if json {
        let list: Vec<_> = checked.iter().map(|(r, v)| serde_json::json!({ "rerun": r, "verdict": v })).collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for (r, v) in checked {
            println!("{}", rerun_line(r, v));
        }
    }
    let bad = checked.iter().filter(|(_, v)| !v.is_identical()).count();
    anyhow::ensure!(bad == 0, "{bad} of {} re-derived files are not identical", checked.len());
    Ok(())
}

fn rerun_line(r: &Rerun, v: &RerunVerdict) -> String {
    let what =
        format!("{} ({} v{}, job {} on {}; re-run {})", r.file, r.function, r.version, r.job, r.input, r.rerun_job);
    match v {
        RerunVerdict::Identical => format!("identical  {what}: sha256 {}", r.sha256),
        RerunVerdict::Differs { sha256 } => {
            format!("DIFFERS    {what}: recorded sha256 {}, re-derived {sha256} ({})", r.sha256, r.expected)
        }
        RerunVerdict::Missing => format!("MISSING    {what}: the re-run did not write {}", r.expected),
        RerunVerdict::InputChanged { reason } => format!("INPUT      {what}: nothing ran: {reason}"),
        RerunVerdict::Failed { state, reason } => format!("FAILED     {what}: {}: {reason}", state.as_str()),
        RerunVerdict::Pending { state } => format!("PENDING    {what}: still {} at the timeout", state.as_str()),
    }
}

/// A trail's head, `SEQ:HASH`.
pub fn head(head: &impl std::fmt::Display) {
    println!("{head}");
}

/// `htfaas audit verify`: both trails' reports, and an error naming each trail's first problem.
pub fn verify_reports(reports: &[(&str, VerifyReport)], json: bool) -> anyhow::Result<()> {
    if json {
        let map: serde_json::Map<String, serde_json::Value> = reports
            .iter()
            .map(|(t, r)| Ok(((*t).to_owned(), serde_json::to_value(r)?)))
            .collect::<anyhow::Result<_>>()?;
        println!("{}", serde_json::to_string_pretty(&map)?);
    }
    let mut failed = Vec::new();
    for (trail, report) in reports {
        if !json {
            println!("{trail} trail:");
        }
        if let Err(e) = verify(report, json) {
            failed.push(format!("{trail}: {e:#}"));
        }
    }
    anyhow::ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(())
}

/// A verify report as lines, and an error naming the first problem if there is one.
pub fn verify(report: &htfaas_functions::audit::VerifyReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        println!(
            "{} records, {} checkpoints; chain read to record {}",
            report.records, report.checkpoints, report.last_seq
        );
        match report.last_checkpoint_seq {
            Some(k) => println!(
                "last valid signed checkpoint at record {k}; {} later record(s) protected by the chain only",
                report.last_seq.saturating_sub(k)
            ),
            None => println!("no valid signed checkpoint: every record is protected by the chain only"),
        }
    }
    match &report.first_problem {
        None => {
            if !json {
                println!("ok: no problem found");
            }
            Ok(())
        }
        Some(p) => anyhow::bail!("the audit trail has a problem at record {}: {}", p.seq, p.message),
    }
}

/// One audit record as a line: seq, time, kind, actor, subject and the kind's main facts.
fn audit_line(r: &htfaas_functions::audit::AuditRecord) -> String {
    let s = &r.subject;
    let mut parts = Vec::new();
    for (key, value) in [
        ("job", &s.job),
        ("token", &s.token_jti),
        ("owner", &s.owner),
        ("function", &s.function),
        ("event", &s.event_id),
    ] {
        if let Some(v) = value {
            parts.push(format!("{key}={v}"));
        }
    }
    if !s.paths.is_empty() {
        parts.push(format!("paths={}", s.paths.join(",")));
    }
    let d = &r.detail;
    let text = |key: &str| d.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let note = match r.kind.as_str() {
        "job.dispatched" => Some(format!("ep={} attempt={}", d["ep"].as_str().unwrap_or("?"), d["attempt"])),
        "job.finished" => {
            let outputs = d["outputs"].as_array().filter(|o| !o.is_empty()).map(|o| {
                let files: Vec<String> =
                    o.iter().map(|f| format!("{}({} B)", f["path"].as_str().unwrap_or("?"), f["size"])).collect();
                format!(" outputs={}", files.join(","))
            });
            let read = d["input"]["bytes"].as_u64().map(|b| format!(" read={b} B"));
            Some(format!(
                "state={}{}{} {}",
                text("state").unwrap_or_else(|| "?".into()),
                read.unwrap_or_default(),
                outputs.unwrap_or_default(),
                text("reason").unwrap_or_default()
            ))
        }
        "job.refused" => Some(format!("status={} {}", d["status"], text("reason").unwrap_or_default())),
        "attempt.lost" => Some(format!("{}: {}", text("then").unwrap_or_default(), text("why").unwrap_or_default())),
        "admin.action" => {
            Some(format!("{} {}", text("action").unwrap_or_default(), text("reason").unwrap_or_default()))
        }
        _ => text("reason"),
    };
    if let Some(note) = note.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()) {
        parts.push(format!("-- {note}"));
    }
    let line = format!(
        "{:>6} {} {:<15} {:<10} {}",
        r.seq,
        fmt_unix_ms(r.time_ms),
        r.kind.as_str(),
        r.actor.as_deref().unwrap_or("-"),
        parts.join(" ")
    );
    line.trim_end().to_owned()
}

/// [`audit_line`] after the record's trail (`gateway`, `scheduler`), with the main facts of the
/// gateway's kinds.
fn trail_line(r: &htfaas_functions::audit::AuditRecord) -> String {
    let d = &r.detail;
    let note = match r.kind.as_str() {
        "event.matched" => {
            let fired: Vec<String> = d["functions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| format!("{}({})", f["name"].as_str().unwrap_or("?"), f["firing"].as_str().unwrap_or("?")))
                .collect();
            let cause = d["caused_by"]["function"].as_str().map(|f| format!(" caused_by={f}")).unwrap_or_default();
            Some(format!("fired={}{cause}", fired.join(",")))
        }
        "token.minted" => Some(format!(
            "jobs={} cpus={} memory_mb={} runtime_s={} exp={}",
            d["jobs"], d["cpus"], d["memory_mb"], d["runtime_s"], d["exp"]
        )),
        "macaroons.obtained" => {
            let ids: Vec<String> = d["macaroons"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| format!("{}={}", m["role"].as_str().unwrap_or("?"), m["identifier"].as_str().unwrap_or("?")))
                .collect();
            Some(ids.join(" "))
        }
        _ => None,
    };
    let line = audit_line(r);
    match note {
        Some(n) if r.writer == "gateway" => format!("{:<9} {line} -- {n}", r.writer),
        _ => format!("{:<9} {line}", r.writer),
    }
}

/// A lineage as a readable chain: each job that wrote (or read) the file, why it ran (event,
/// rule, function@digest, token, macaroons) and what it did, then the step before it.
fn lineage_text(l: &htfaas_functions::proto::Lineage) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "lineage of {}", l.file);
    if l.steps.is_empty() {
        let _ = writeln!(out, "  no job wrote or read it (an upload no function ran on, or not a known file)");
    }
    let none = || "?".to_owned();
    for s in &l.steps {
        let indent = "  ".repeat(s.depth as usize + 1);
        let verb = match s.relation {
            htfaas_functions::proto::LineageRelation::Wrote => "written by",
            htfaas_functions::proto::LineageRelation::Read => "read by",
        };
        let record = |kind: &str| s.records.iter().find(|r| r.kind.as_str() == kind);
        let _ =
            writeln!(out, "{indent}{} {verb} job {} (owner {})", s.file, s.job, s.owner.clone().unwrap_or_else(none));
        let matched = record("event.matched");
        let source = matched.map(|r| {
            let e = &r.detail["event"];
            format!(" from {} {}", e["source"].as_str().unwrap_or("?"), e["producer"].as_str().unwrap_or("?"))
        });
        let _ = writeln!(
            out,
            "{indent}  event     {} on {}{}",
            s.event_id.clone().unwrap_or_else(none),
            s.input.clone().unwrap_or_else(none),
            source.unwrap_or_default()
        );
        if let Some(c) = &s.caused_by {
            let _ = writeln!(
                out,
                "{indent}  caused by function {}'s job on event {} (chain {})",
                c.function,
                c.event_id,
                c.chain.join(" → ")
            );
        }
        let _ = writeln!(out, "{indent}  rule      {}", s.rule.clone().unwrap_or_else(none));
        let version = s.function_version.map(|v| format!(" v{v}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "{indent}  function  {}@{}{version}",
            s.function.clone().unwrap_or_else(none),
            s.digest.clone().unwrap_or_else(none)
        );
        let limits = record("token.minted").map(|r| {
            let d = &r.detail;
            format!(" (jobs {}, cpus {}, memory {} MB, expires {})", d["jobs"], d["cpus"], d["memory_mb"], d["exp"])
        });
        let _ = writeln!(
            out,
            "{indent}  token     {}{}",
            s.token_jti.clone().unwrap_or_else(none),
            limits.unwrap_or_default()
        );
        if !s.macaroons.is_empty() {
            let _ = writeln!(out, "{indent}  macaroons {}", s.macaroons.join(", "));
        }
        if let Some(d) = record("job.dispatched") {
            let _ = writeln!(
                out,
                "{indent}  ran on    {} (attempt {})",
                d.detail["ep"].as_str().unwrap_or("?"),
                d.detail["attempt"]
            );
        }
        if let Some(f) = record("job.finished") {
            let state = f.detail["state"].as_str().unwrap_or("?");
            let line = format!("{indent}  finished  {state} {}", f.detail["reason"].as_str().unwrap_or_default());
            let _ = writeln!(out, "{}", line.trim_end());
        }
        for r in &s.refs {
            let _ = writeln!(out, "{indent}  reference {} sha256 {}", r.path, r.sha256);
        }
        if !s.outputs.is_empty() {
            let _ = writeln!(out, "{indent}  outputs   {}", s.outputs.join(", "));
        }
    }
    if l.truncated {
        let _ = writeln!(out, "  … (more steps back: the depth or step limit was reached)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lineage_reads_back_from_the_output_to_the_upload() {
        let record = |seq: u64, writer: &str, kind: &str, detail: serde_json::Value| {
            serde_json::from_value::<htfaas_functions::audit::AuditRecord>(serde_json::json!({
                "format": 1, "seq": seq, "time_ms": 1_700_000_000_000u64 + seq, "writer": writer, "kind": kind,
                "actor": null, "subject": {}, "detail": detail, "prev_hash": "00", "hash": "11",
            }))
            .expect("a record")
        };
        let step = |depth: u32, file: &str, job: &str, function: &str, input: &str, caused_by| {
            htfaas_functions::proto::LineageStep {
                depth,
                file: file.into(),
                relation: htfaas_functions::proto::LineageRelation::Wrote,
                job: job.into(),
                function: Some(function.into()),
                function_version: Some(2),
                digest: Some(format!("sha256:{function}")),
                owner: Some("alice".into()),
                token_jti: Some(format!("jti-{job}")),
                event_id: Some(format!("ev-{job}")),
                rule: Some(format!("path glob \"{input}\"")),
                caused_by,
                input: Some(input.into()),
                outputs: vec![file.into()],
                macaroons: vec![format!("rd-{job}"), format!("wr-{job}")],
                records: vec![
                    record(
                        1,
                        "gateway",
                        "event.matched",
                        serde_json::json!({"event": {"source": "dcache", "producer": "pool1@d"}}),
                    ),
                    record(
                        2,
                        "gateway",
                        "token.minted",
                        serde_json::json!({"jobs": 1, "cpus": 1, "memory_mb": 2048, "exp": 99}),
                    ),
                    record(3, "scheduler", "job.dispatched", serde_json::json!({"ep": "ep-1", "attempt": 1})),
                    record(4, "scheduler", "job.finished", serde_json::json!({"state": "completed", "reason": ""})),
                ],
                refs: Vec::new(),
            }
        };
        let cause = htfaas_functions::proto::Cause {
            function: "a".into(),
            digest: htfaas_functions::Digest::of(b"a"),
            event_id: "ev-j1".into(),
            chain: vec!["a".into()],
            trace: None,
        };
        let lineage = htfaas_functions::proto::Lineage {
            file: "/out/b/x.sum".into(),
            steps: vec![
                step(0, "/out/b/x.sum", "j2", "b", "/out/a/x.sum", Some(cause)),
                step(1, "/out/a/x.sum", "j1", "a", "/data/x", None),
            ],
            truncated: true,
        };
        let text = lineage_text(&lineage);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "lineage of /out/b/x.sum");
        assert_eq!(lines[1], "  /out/b/x.sum written by job j2 (owner alice)", "{text}");
        for expected in [
            "    event     ev-j2 on /out/a/x.sum from dcache pool1@d",
            "    caused by function a's job on event ev-j1 (chain a)",
            "    function  b@sha256:b v2",
            "    token     jti-j2 (jobs 1, cpus 1, memory 2048 MB, expires 99)",
            "    macaroons rd-j2, wr-j2",
            "    ran on    ep-1 (attempt 1)",
            "    finished  completed",
            "    /out/a/x.sum written by job j1 (owner alice)",
            "      event     ev-j1 on /data/x from dcache pool1@d",
            "      rule      path glob \"/data/x\"",
        ] {
            assert!(lines.contains(&expected), "{expected:?} missing from\n{text}");
        }
        assert!(text.find("job j2").expect("j2") < text.find("job j1").expect("j1"), "newest step first");
        assert!(lines.last().expect("a line").contains("more steps back"), "{text}");
    }

    #[test]
    fn audit_records_print_as_one_line() {
        use htfaas_functions::audit::{AuditKind, AuditRecord, Subject};
        let r = AuditRecord {
            format: 1,
            seq: 7,
            time_ms: 1_740_830_400_250,
            writer: "scheduler".into(),
            kind: AuditKind::JobDispatched,
            actor: None,
            subject: Subject {
                job: Some("j1".into()),
                owner: Some("alice".into()),
                paths: vec!["/data/raw/a.dat".into()],
                ..Subject::default()
            },
            detail: serde_json::json!({"ep": "ep-1", "session": "s", "attempt": 2}),
            prev_hash: String::new(),
            hash: String::new(),
        };
        assert_eq!(
            audit_line(&r),
            "     7 2025-03-01T12:00:00.250Z job.dispatched  -          job=j1 owner=alice paths=/data/raw/a.dat -- \
             ep=ep-1 attempt=2"
        );
    }
}
