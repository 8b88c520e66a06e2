//! The scheduler doubts what an EP reports. Any holder of a valid attach token can
//! run an EP, so its word about a job is checked against what the scheduler knows before any of
//! it is recorded or charged:
//!
//! - usage is clamped to what could be: wall time to what the scheduler observed between the
//!   job's dispatch and the report, plus [`WALL_SLACK_MS`]; CPU time to that wall time × the
//!   job's cpus; peak memory to the job's memory. What was cut is kept with the report's record
//!   ([`Clamped`]), so the audit trail shows both the claim and the charge;
//! - outputs must be files under the job's own output directory (the path of the `output.url`
//!   it was submitted with), with a clean path of at most [`MAX_OUTPUT_PATH_BYTES`] bytes and a
//!   sha256 of 64 hex digits, and at most [`MAX_REPORTED_OUTPUTS`] of them; a path in a
//!   quarantine directory only as `<output dir>.quarantine/<its job id>/<name>`, for a job that
//!   asked for quarantine (`outputs.on_failure`) and a run that failed; a path in a re-run's
//!   scratch directory only for a re-run; an input sha256, when named, of 64 hex
//!   digits; reference files only those the job was given, each once, with a sha256 of 64 hex
//!   digits: a report that
//!   breaks this is a protocol violation ([`Violation`]). It is not believed at all — neither its
//!   outcome, its outputs (nothing enters the lineage) nor its usage (nothing is charged) — and
//!   the attempt counts as lost ([`crate::queue::Queue::finish`]).
//!
//! Pure: no SQL, no session, no HTTP; the queue calls [`doubt`] inside the report's transaction.

use htfaas_functions::manifest::{FailedOutputs, is_clean_abs_path};
use htfaas_functions::on_failure::{is_quarantined, quarantine_dir};
use htfaas_functions::proto::JobReport;
use htfaas_functions::proto::rerun::in_scratch;

/// What an EP's wall time may exceed the scheduler's own view of the attempt by, ms: the
/// Assign's and the report's time on the wire and in the EP's queues (both ends of the view are
/// the scheduler's clock, so no clock skew is involved).
pub const WALL_SLACK_MS: u64 = 5_000;
/// Most outputs one report may name.
pub const MAX_REPORTED_OUTPUTS: usize = 10_000;
/// Longest output path a report may name, bytes.
pub const MAX_OUTPUT_PATH_BYTES: usize = 4096;
/// Longest output path shown in a violation's message, characters.
const SHOWN_PATH_CHARS: usize = 200;

/// What the scheduler knows of the attempt a report is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// When the job was dispatched (its `started_at_ms`), Unix ms; `None` if the store has none.
    pub started_at_ms: Option<u64>,
    /// Now, Unix ms.
    pub now_ms: u64,
    /// The job's cpus.
    pub cpus: u32,
    /// The job's memory, MiB.
    pub memory_mb: u64,
    /// The job's output directory: the decoded path of its `output.url`, ending in `/`.
    pub output_dir: String,
    /// What the job asked for its outputs after a failed run (`output.on_failure`).
    pub on_failure: FailedOutputs,
    /// The guest paths of its reference inputs (`refs`), in order.
    pub refs: Vec<String>,
}

/// The usage figures an EP claimed above what could be, each with its claim (the report now
/// holds the clamped figure).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clamped {
    /// Claimed wall time, ms.
    pub wall_ms: Option<u64>,
    /// Claimed CPU time, ms.
    pub cpu_ms: Option<u64>,
    /// Claimed peak memory, bytes.
    pub peak_memory_bytes: Option<u64>,
}

impl Clamped {
    /// Whether nothing was clamped.
    pub fn is_empty(&self) -> bool {
        *self == Clamped::default()
    }

    /// `{"wall_ms": claimed, …}` of the figures clamped, for the report's audit record.
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (k, v) in
            [("wall_ms", self.wall_ms), ("cpu_ms", self.cpu_ms), ("peak_memory_bytes", self.peak_memory_bytes)]
        {
            if let Some(v) = v {
                m.insert(k.into(), v.into());
            }
        }
        serde_json::Value::Object(m)
    }
}

/// A report that breaks the protocol: it is not believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// More outputs than [`MAX_REPORTED_OUTPUTS`].
    #[error("the report names {count} outputs, at most {MAX_REPORTED_OUTPUTS} are accepted")]
    TooManyOutputs {
        /// How many it named.
        count: usize,
    },
    /// An output path longer than [`MAX_OUTPUT_PATH_BYTES`].
    #[error("the report names an output path of {bytes} bytes, at most {MAX_OUTPUT_PATH_BYTES} are accepted")]
    PathTooLong {
        /// Its length.
        bytes: usize,
    },
    /// An output outside the job's output directory, or not a clean path.
    #[error("the report names output {path:?}, which is not a file under the job's output directory {dir:?}")]
    ForeignOutput {
        /// The path (cut to 200 characters).
        path: String,
        /// The job's output directory.
        dir: String,
    },
    /// An output's sha256 that is not 64 hex digits.
    #[error("the report names output {path:?} with a sha256 that is not 64 hex digits")]
    BadDigest {
        /// The path (cut to 200 characters).
        path: String,
    },
    /// The input's sha256 is not 64 hex digits.
    #[error("the report's input sha256 is not 64 hex digits")]
    BadInputDigest,
    /// A reference file the job was not given, named twice, or with a sha256 that is not 64
    /// hex digits.
    #[error("the report names reference {path:?}, which is not one of the job's, is named twice, or has a bad sha256")]
    ForeignReference {
        /// The path (cut to 200 characters).
        path: String,
    },
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn shown(path: &str) -> String {
    match path.char_indices().nth(SHOWN_PATH_CHARS) {
        Some((i, _)) => format!("{}…", &path[..i]),
        None => path.to_owned(),
    }
}

/// Whether `path` (with a quarantine segment) is where this job's EP may quarantine an output:
/// exactly `<output dir>.quarantine/<job id>/<name>`, for a job that asked for quarantine and a
/// run that did not succeed.
fn quarantine_ok(report: &JobReport, seen: &Observed, path: &str) -> bool {
    let dir = format!("{}{}", seen.output_dir, quarantine_dir(&report.job_id));
    seen.on_failure == FailedOutputs::Quarantine
        && !report.outcome.is_success()
        && path.strip_prefix(&dir).is_some_and(|name| !name.is_empty() && !name.contains('/'))
}

/// Checks `report` against what the scheduler `seen`: a [`Violation`] if its outputs are not
/// the job's, else its usage clamped in place and what was clamped.
pub fn doubt(report: &mut JobReport, seen: &Observed) -> Result<Clamped, Violation> {
    if report.outputs.len() > MAX_REPORTED_OUTPUTS {
        return Err(Violation::TooManyOutputs { count: report.outputs.len() });
    }
    if report.input_sha256.as_deref().is_some_and(|h| !is_sha256_hex(h)) {
        return Err(Violation::BadInputDigest);
    }
    for (i, r) in report.refs.iter().enumerate() {
        if !seen.refs.contains(&r.path)
            || report.refs[..i].iter().any(|o| o.path == r.path)
            || !is_sha256_hex(&r.sha256)
        {
            return Err(Violation::ForeignReference { path: shown(&r.path) });
        }
    }
    for o in &report.outputs {
        if o.path.len() > MAX_OUTPUT_PATH_BYTES {
            return Err(Violation::PathTooLong { bytes: o.path.len() });
        }
        let inside = o.path.strip_prefix(seen.output_dir.as_str()).is_some_and(|name| !name.is_empty());
        if !inside
            || (is_quarantined(&o.path) && !quarantine_ok(report, seen, &o.path))
            // Only a re-run writes into a re-run's scratch directory (its output directory is one).
            || (in_scratch(&o.path) && !in_scratch(&seen.output_dir))
            || o.path.ends_with('/')
            || !is_clean_abs_path(&o.path)
            || o.path.chars().any(char::is_control)
        {
            return Err(Violation::ForeignOutput { path: shown(&o.path), dir: seen.output_dir.clone() });
        }
        if !is_sha256_hex(&o.sha256) {
            return Err(Violation::BadDigest { path: shown(&o.path) });
        }
    }
    let mut clamped = Clamped::default();
    let u = &mut report.usage;
    let observed = seen.started_at_ms.map_or(0, |s| seen.now_ms.saturating_sub(s));
    let max_wall = observed.saturating_add(WALL_SLACK_MS);
    if u.wall_ms > max_wall {
        clamped.wall_ms = Some(u.wall_ms);
        u.wall_ms = max_wall;
    }
    let max_cpu = u.wall_ms.saturating_mul(u64::from(seen.cpus.max(1)));
    if u.cpu_ms > max_cpu {
        clamped.cpu_ms = Some(u.cpu_ms);
        u.cpu_ms = max_cpu;
    }
    let max_memory = seen.memory_mb.saturating_mul(1 << 20);
    if u.peak_memory_bytes > max_memory {
        clamped.peak_memory_bytes = Some(u.peak_memory_bytes);
        u.peak_memory_bytes = max_memory;
    }
    // The phases are a breakdown of the wall time: never more than it (not audited as a
    // clamp: they are no charge).
    u.phases = u.phases.clamped(u.wall_ms);
    Ok(clamped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::proto::{Outcome, OutputFile, Usage};

    fn seen() -> Observed {
        Observed {
            started_at_ms: Some(1_000_000),
            now_ms: 1_060_000,
            cpus: 2,
            memory_mb: 256,
            output_dir: "/data/out/".into(),
            on_failure: FailedOutputs::Discard,
            refs: vec!["data/calib/p.h5".into()],
        }
    }

    /// A report names only the reference files its job was given, each once, each with a
    /// sha256: anything else is not believed.
    #[test]
    fn references_are_only_the_jobs_own_each_once_with_a_digest() {
        use htfaas_functions::proto::ReferenceRead;
        let read = |path: &str, sha256: String| ReferenceRead { path: path.into(), size: 1, sha256 };
        let mut r = report(&[], Usage::default());
        r.refs = vec![read("data/calib/p.h5", "cd".repeat(32))];
        assert_eq!(doubt(&mut r, &seen()), Ok(Clamped::default()));
        for refs in [
            vec![read("data/other/secret.h5", "cd".repeat(32))],
            vec![read("data/calib/p.h5", "cd".repeat(32)), read("data/calib/p.h5", "cd".repeat(32))],
            vec![read("data/calib/p.h5", "not hex".into())],
        ] {
            let mut r = report(&[], Usage::default());
            r.refs = refs;
            assert!(matches!(doubt(&mut r, &seen()), Err(Violation::ForeignReference { .. })), "{:?}", r.refs);
        }
    }

    fn report(outputs: &[&str], usage: Usage) -> JobReport {
        JobReport {
            input_sha256: None,
            job_id: "j".into(),
            outcome: Outcome::Exited { exit_code: 0 },
            usage,
            outputs: outputs
                .iter()
                .map(|p| OutputFile { path: (*p).into(), size: 1, sha256: "ab".repeat(32) })
                .collect(),
            log: String::new(),
            refs: Vec::new(),
            checkpoint: None,
        }
    }

    #[test]
    fn usage_is_clamped_to_what_the_scheduler_saw() {
        let honest = Usage { wall_ms: 59_000, cpu_ms: 50_000, peak_memory_bytes: 1 << 20, ..Usage::default() };
        let mut r = report(&["/data/out/a.sum"], honest);
        assert_eq!(doubt(&mut r, &seen()), Ok(Clamped::default()));
        assert_eq!(r.usage, honest);

        let inflated =
            Usage { wall_ms: 3_600_000_000, cpu_ms: u64::MAX, peak_memory_bytes: u64::MAX, ..Usage::default() };
        let mut r = report(&[], inflated);
        let clamped = doubt(&mut r, &seen()).expect("no violation");
        assert_eq!(r.usage.wall_ms, 60_000 + WALL_SLACK_MS);
        assert_eq!(r.usage.cpu_ms, 2 * (60_000 + WALL_SLACK_MS));
        assert_eq!(r.usage.peak_memory_bytes, 256 << 20);
        assert_eq!(
            clamped,
            Clamped { wall_ms: Some(3_600_000_000), cpu_ms: Some(u64::MAX), peak_memory_bytes: Some(u64::MAX) }
        );
        assert_eq!(clamped.to_json()["wall_ms"], 3_600_000_000u64);

        // Phases past the (clamped) wall time are cut to it.
        let phases = htfaas_functions::proto::Phases { run_ms: u64::MAX, output_ms: 5, ..Default::default() };
        let mut r = report(&[], Usage { wall_ms: 10_000, phases, ..Usage::default() });
        doubt(&mut r, &seen()).expect("no violation");
        assert_eq!((r.usage.phases.run_ms, r.usage.phases.output_ms), (10_000, 0));

        // Within the wall time, CPU time is still bounded by wall × cpus.
        let mut r = report(&[], Usage { wall_ms: 10_000, cpu_ms: 30_000, ..Usage::default() });
        assert_eq!(doubt(&mut r, &seen()).expect("ok").cpu_ms, Some(30_000));
        assert_eq!(r.usage.cpu_ms, 20_000);
    }

    #[test]
    fn outputs_must_be_the_jobs_own() {
        for bad in [
            "/data/raw/a.dat",
            "/data/out",
            "/data/out/",
            "/data/outx/a",
            "/data/out/../raw/a.dat",
            "/data/out/./a",
            "/data/out//a",
            "/data/out/sub/",
            "data/out/a",
            "/data/out/a\nb",
        ] {
            let mut r = report(&["/data/out/ok.sum", bad], Usage::default());
            let e = doubt(&mut r, &seen()).expect_err(bad);
            assert!(matches!(e, Violation::ForeignOutput { .. }), "{bad:?}: {e}");
        }
        let mut r = report(&["/data/raw/a.dat"], Usage::default());
        assert_eq!(
            doubt(&mut r, &seen()).expect_err("foreign").to_string(),
            "the report names output \"/data/raw/a.dat\", which is not a file under the job's output directory \
             \"/data/out/\""
        );
        let mut r = report(&["/data/out/sub/a.sum"], Usage::default());
        assert!(doubt(&mut r, &seen()).is_ok(), "a subdirectory of the output directory is the job's");
    }

    // Quarantined outputs, and only the job's own, only for a failed run that asked.
    #[test]
    fn quarantine_paths_are_the_jobs_own_and_only_for_a_failed_run_that_asked() {
        let quarantine = Observed { on_failure: FailedOutputs::Quarantine, ..seen() };
        let failed = |outputs: &[&str]| JobReport {
            outcome: Outcome::Exited { exit_code: 3 },
            ..report(outputs, Usage::default())
        };
        let mut r = failed(&["/data/out/.quarantine/j/partial.txt"]);
        assert_eq!(doubt(&mut r, &quarantine), Ok(Clamped::default()));
        for bad in [
            "/data/out/.quarantine/other-job/partial.txt",
            "/data/out/.quarantine/j/sub/partial.txt",
            "/data/out/.quarantine/j/",
            "/data/out/.quarantine/partial.txt",
            "/data/out/sub/.quarantine/j/partial.txt",
        ] {
            let mut r = failed(&[bad]);
            assert!(matches!(doubt(&mut r, &quarantine), Err(Violation::ForeignOutput { .. })), "{bad}");
        }
        // A job that did not ask for quarantine, or a run that succeeded, has none.
        let mut r = failed(&["/data/out/.quarantine/j/partial.txt"]);
        assert!(matches!(doubt(&mut r, &seen()), Err(Violation::ForeignOutput { .. })));
        let mut r = report(&["/data/out/.quarantine/j/partial.txt"], Usage::default());
        assert!(matches!(doubt(&mut r, &quarantine), Err(Violation::ForeignOutput { .. })));
    }

    #[test]
    fn outputs_are_bounded_in_number_length_and_form() {
        let many: Vec<String> = (0..=MAX_REPORTED_OUTPUTS).map(|i| format!("/data/out/{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let mut r = report(&many, Usage::default());
        assert_eq!(doubt(&mut r, &seen()), Err(Violation::TooManyOutputs { count: MAX_REPORTED_OUTPUTS + 1 }));
        let long = format!("/data/out/{}", "a".repeat(MAX_OUTPUT_PATH_BYTES));
        let mut r = report(&[&long], Usage::default());
        assert!(matches!(doubt(&mut r, &seen()), Err(Violation::PathTooLong { .. })));
        let mut r = report(&["/data/out/a"], Usage::default());
        r.outputs[0].sha256 = "zz".repeat(32);
        assert!(matches!(doubt(&mut r, &seen()), Err(Violation::BadDigest { .. })));
    }

    // The input's checksum is what a re-run is held to, so it must be one.
    #[test]
    fn an_input_sha256_must_be_64_hex_digits() {
        for (bad, refused) in
            [("ab".repeat(32), false), ("zz".repeat(32), true), ("ab".repeat(31), true), (String::new(), true)]
        {
            let mut r = report(&["/data/out/a"], Usage::default());
            r.input_sha256 = Some(bad.clone());
            assert_eq!(doubt(&mut r, &seen()) == Err(Violation::BadInputDigest), refused, "{bad:?}");
        }
    }

    // A re-run's scratch directory is written by the re-run only.
    #[test]
    fn only_a_rerun_reports_outputs_in_a_rerun_scratch_directory() {
        let mut r = report(&["/data/out/.rerun/r1/a.sum"], Usage::default());
        assert!(matches!(doubt(&mut r, &seen()), Err(Violation::ForeignOutput { .. })));
        let rerun = Observed { output_dir: "/data/out/.rerun/r1/".into(), ..seen() };
        let mut r = report(&["/data/out/.rerun/r1/a.sum"], Usage::default());
        assert_eq!(doubt(&mut r, &rerun), Ok(Clamped::default()));
    }
}
