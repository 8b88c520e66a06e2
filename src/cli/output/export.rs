//! `htfaas accounting export`: one record per ended job in the terms a site's accounting
//! already reads: HTCondor's job ClassAd attributes (`condor_history -l` text, or the same
//! attributes as CSV or JSON), with htfaas's own attributes prefixed `Htfaas`.
//!
//! - `Owner`, `AcctGroupUser`: the owner accounted; `AcctGroup` and `AccountingGroup`
//!   (`<group>.<owner>`) when the run charged a group.
//! - `QDate`, `JobStartDate`, `CompletionDate`: Unix seconds (submitted, first started, ended).
//! - `RemoteWallClockTime`: the EP's wall time of the run (fetch, run, store), seconds;
//!   `RemoteUserCpu`: the guest's CPU time, seconds, as the EP measures it (user and system
//!   together: an EP reports one figure), so `RemoteSysCpu` is 0.
//! - `RequestCpus`, `RequestMemory` (MiB), `MemoryUsage` (the guest's peak, MiB, rounded up).
//! - `JobStatus`: 4 (completed, failed) or 3 (removed); `ExitCode` when the guest exited;
//!   `RemoveReason` for a removed job, `HoldReason` while held; `HtfaasReason` why a run failed.
//! - `LastRemoteHost`: the EP; for a job of an annex, `HtfaasBatchJobId` is the batch job
//!   (an annex's EPs are named `<annex>-<batch job id>`).
//!
//! Must not know: HTTP, how the jobs were read.

use htfaas_functions::proto::{JobRecord, JobState};
use serde_json::{Map, Value};

/// The export's formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// `condor_history -l`: one ClassAd per job, `Name = value` lines, a blank line between.
    CondorHistory,
    /// A header row, then one line per job.
    Csv,
    /// A JSON array of objects (as `condor_history -json`).
    Json,
}

impl ExportFormat {
    /// `condor-history`, `csv` or `json`.
    pub fn parse(s: &str) -> Option<ExportFormat> {
        match s {
            "condor-history" => Some(ExportFormat::CondorHistory),
            "csv" => Some(ExportFormat::Csv),
            "json" => Some(ExportFormat::Json),
            _ => None,
        }
    }
}

/// The attributes, in the order CSV prints them.
pub const COLUMNS: [&str; 27] = [
    "GlobalJobId",
    "Owner",
    "AcctGroup",
    "AcctGroupUser",
    "AccountingGroup",
    "Cmd",
    "HtfaasFunctionVersion",
    "HtfaasDigest",
    "JobStatus",
    "QDate",
    "JobStartDate",
    "CompletionDate",
    "RemoteWallClockTime",
    "RemoteUserCpu",
    "RemoteSysCpu",
    "RequestCpus",
    "RequestMemory",
    "MemoryUsage",
    "ExitCode",
    "HoldReason",
    "RemoveReason",
    "HtfaasReason",
    "LastRemoteHost",
    "HtfaasAnnex",
    "HtfaasBatchJobId",
    "HtfaasEvent",
    "HtfaasInput",
];

/// One job's attributes (absent ones are undefined: left out).
pub fn attributes(job: &JobRecord) -> Map<String, Value> {
    let mut ad = Map::new();
    let mut put = |k: &str, v: Value| {
        if !v.is_null() {
            ad.insert(k.to_owned(), v);
        }
    };
    let secs = |ms: u64| Value::from(ms / 1000);
    put("GlobalJobId", job.id.clone().into());
    put("Owner", job.owner.clone().into());
    put("AcctGroupUser", job.owner.clone().into());
    if let Some(g) = &job.group {
        put("AcctGroup", g.clone().into());
        put("AccountingGroup", format!("{g}.{}", job.owner).into());
    }
    put("Cmd", job.function.clone().into());
    put("HtfaasFunctionVersion", job.version.into());
    put("HtfaasDigest", job.digest.as_str().into());
    put("JobStatus", (if job.state == JobState::Removed { 3 } else { 4 }).into());
    put("QDate", secs(job.submitted_at_ms));
    put("JobStartDate", job.started_at_ms.map_or(Value::Null, secs));
    put("CompletionDate", job.finished_at_ms.map_or(Value::Null, secs));
    if let Some(u) = &job.usage {
        put("RemoteWallClockTime", real(u.wall_ms));
        put("RemoteUserCpu", real(u.cpu_ms));
        put("RemoteSysCpu", Value::from(0.0));
        put("MemoryUsage", u.peak_memory_bytes.div_ceil(1 << 20).into());
    }
    put("RequestCpus", job.resources.cpus.into());
    put("RequestMemory", job.resources.memory_mb.into());
    put("ExitCode", job.exit_code.map_or(Value::Null, Value::from));
    let reason = if job.reason.is_empty() { Value::Null } else { Value::from(job.reason.clone()) };
    if job.hold_code.is_some() {
        put("HoldReason", reason.clone());
    }
    match job.state {
        JobState::Removed => put("RemoveReason", reason),
        _ => put("HtfaasReason", reason),
    }
    put("LastRemoteHost", job.ep.clone().map_or(Value::Null, Value::from));
    if let Some(annex) = &job.annex {
        put("HtfaasAnnex", annex.clone().into());
        let batch = job.ep.as_deref().and_then(|ep| ep.strip_prefix(annex.as_str())).and_then(|r| r.strip_prefix('-'));
        put("HtfaasBatchJobId", batch.map_or(Value::Null, Value::from));
    }
    put("HtfaasEvent", job.event.id.clone().into());
    put("HtfaasInput", job.input.clone().into());
    ad
}

fn real(ms: u64) -> Value {
    // Seconds as a real, to the millisecond.
    serde_json::Number::from_f64(ms as f64 / 1000.0).map_or(Value::Null, Value::Number)
}

/// `jobs` in `format`.
pub fn render(jobs: &[JobRecord], format: ExportFormat) -> String {
    let ads: Vec<Map<String, Value>> = jobs.iter().map(attributes).collect();
    match format {
        ExportFormat::Json => serde_json::to_string_pretty(&ads).unwrap_or_else(|_| "[]".into()) + "\n",
        ExportFormat::Csv => {
            let mut out = COLUMNS.join(",") + "\n";
            for ad in &ads {
                let row: Vec<String> = COLUMNS.iter().map(|c| ad.get(*c).map(csv_field).unwrap_or_default()).collect();
                out.push_str(&row.join(","));
                out.push('\n');
            }
            out
        }
        ExportFormat::CondorHistory => {
            let mut out = String::new();
            for ad in &ads {
                for (k, v) in ad {
                    out.push_str(&format!("{k} = {}\n", classad_value(v)));
                }
                out.push('\n');
            }
            out
        }
    }
}

/// A ClassAd literal: strings quoted with `\` escapes, numbers as they are.
fn classad_value(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let mut q = String::with_capacity(s.len() + 2);
            q.push('"');
            for c in s.chars() {
                match c {
                    '"' => q.push_str("\\\""),
                    '\\' => q.push_str("\\\\"),
                    '\n' => q.push_str("\\n"),
                    c if c.is_control() => q.push(' '),
                    c => q.push(c),
                }
            }
            q.push('"');
            q
        }
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or_default();
            format!("{f:.3}")
        }
        other => other.to_string(),
    }
}

fn csv_field(v: &Value) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.contains([',', '"', '\n', '\r']) { format!("\"{}\"", text.replace('"', "\"\"")) } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: &str, reason: &str, annex: Option<&str>, ep: &str) -> JobRecord {
        serde_json::from_value(serde_json::json!({
            "id": "01a2-job", "owner": "carol", "function": "calibrate", "version": 3,
            "digest": htfaas_functions::Digest::of(b"m").as_str(), "state": state, "reason": reason,
            "input": "https://storage/data/carol/run-1.dat",
            "event": {"source": "dcache-billing:pool", "id": "ev-1", "path": "/data/carol/run-1.dat"},
            "token_jti": "t1", "group": "cms", "annex": annex,
            "resources": {"cpus": 2, "memory_mb": 512, "runtime_s": 60},
            "ep": ep, "submitted_at_ms": 1_000_500, "started_at_ms": 1_002_000, "finished_at_ms": 1_009_999,
            "exit_code": 0,
            "usage": {"wall_ms": 7_250, "cpu_ms": 6_500, "peak_memory_bytes": 3_000_000, "bytes_in": 1, "bytes_out": 2},
            "outputs": []
        }))
        .expect("a job record")
    }

    #[test]
    fn a_job_becomes_the_classad_attributes_a_sites_accounting_reads() {
        let text = render(&[job("completed", "", Some("gpu"), "gpu-4711")], ExportFormat::CondorHistory);
        for line in [
            "GlobalJobId = \"01a2-job\"",
            "Owner = \"carol\"",
            "AcctGroup = \"cms\"",
            "AcctGroupUser = \"carol\"",
            "AccountingGroup = \"cms.carol\"",
            "Cmd = \"calibrate\"",
            "HtfaasFunctionVersion = 3",
            "JobStatus = 4",
            "QDate = 1000",
            "JobStartDate = 1002",
            "CompletionDate = 1009",
            "RemoteWallClockTime = 7.250",
            "RemoteUserCpu = 6.500",
            "RemoteSysCpu = 0.000",
            "RequestCpus = 2",
            "RequestMemory = 512",
            "MemoryUsage = 3",
            "ExitCode = 0",
            "LastRemoteHost = \"gpu-4711\"",
            "HtfaasBatchJobId = \"4711\"",
            "HtfaasEvent = \"ev-1\"",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
        assert!(text.ends_with("\n\n"), "a blank line after each ad");
        assert!(!text.contains("HoldReason") && !text.contains("RemoveReason"), "undefined ones are left out");
    }

    #[test]
    fn text_is_escaped_for_each_format_and_removed_jobs_say_why() {
        let removed = job("removed", "revoked: \"leak\", by admin", None, "ep-1");
        let ad = render(std::slice::from_ref(&removed), ExportFormat::CondorHistory);
        assert!(ad.contains("RemoveReason = \"revoked: \\\"leak\\\", by admin\""), "{ad}");
        assert!(ad.contains("JobStatus = 3"), "{ad}");
        assert!(!ad.contains("HtfaasBatchJobId"), "no annex, no batch job");
        let csv = render(std::slice::from_ref(&removed), ExportFormat::Csv);
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some(COLUMNS.join(",").as_str()));
        let row = lines.next().expect("a row");
        assert!(row.contains(",\"revoked: \"\"leak\"\", by admin\","), "{row}");
        let json: Vec<serde_json::Value> = serde_json::from_str(&render(&[removed], ExportFormat::Json)).expect("JSON");
        assert_eq!(json[0]["Owner"], "carol");
        assert_eq!(json[0]["RemoteWallClockTime"], 7.25);
    }
}
