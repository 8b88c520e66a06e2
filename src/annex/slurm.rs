//! Slurm as an annex provider: `sbatch`, `squeue`, `scontrol update` and `scancel`, each run with
//! `SLURM_CONF` set explicitly (a client without it falls back to /etc/slurm and then a DNS SRV
//! lookup), their output parsed defensively (an answer that does not parse is an error naming
//! the command, never a panic or a guess).
//!
//! - submit: one `sbatch --parsable` per EP, the script on its standard input (no file), with
//!   `--time` = the annex's lifetime (whole minutes, rounded up: Slurm ends the job then, even if
//!   nothing else does), `--cpus-per-task`, `--mem`, `--partition`, `--output`, and
//!   `--export=ALL` over an environment cleared down to `PATH`, `SLURM_CONF` and the secret
//!   (the attach token): the token reaches the job's environment (readable by the job's user
//!   and root only, kept by slurmctld in its 0700 state directory), never an argument (`ps`) or
//!   a file of ours, and no other variable of the caller leaks into the job.
//! - states: `squeue -h --states=all -j IDS -o '%i|%T|%M|%l|%r'`; ids squeue no longer knows
//!   (past `MinJobAge`) are [`BatchState::Gone`].
//! - extend: `scontrol update JobId=J TimeLimit=M` with M = run time so far + the new lifetime,
//!   in minutes rounded up (raising a limit is an operator's right in Slurm: the annex's owner
//!   must be one, or an admin runs it).
//! - cancel: `scancel IDS` of the live ones.
//!
//! Must not know: htfaas's API, what the script runs.

use super::provider::{BatchJob, BatchState, Launch, Provider, ProviderError};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The `PATH` of the commands and of the jobs (the script names the htfaas binary absolutely).
pub const JOB_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// Most bytes of a command's standard error quoted in an error.
const MAX_STDERR: usize = 400;

/// A Slurm cluster, reached through its client commands.
#[derive(Debug, Clone)]
pub struct Slurm {
    /// The cluster's `slurm.conf`, given to every command as `SLURM_CONF`.
    pub conf: PathBuf,
    /// Where `sbatch`, `squeue`, `scontrol` and `scancel` are; none: found on [`JOB_PATH`].
    pub bin_dir: Option<PathBuf>,
}

impl Slurm {
    /// The cluster whose configuration is `conf`.
    pub fn new(conf: impl Into<PathBuf>) -> Slurm {
        Slurm { conf: conf.into(), bin_dir: None }
    }

    fn command(&self, name: &str) -> Command {
        let program = self.bin_dir.as_ref().map_or_else(|| PathBuf::from(name), |d| d.join(name));
        let mut c = Command::new(program);
        c.env_clear().env("PATH", JOB_PATH).env("SLURM_CONF", &self.conf).stdin(Stdio::null());
        c
    }

    /// Runs `c` (named `what`), feeding it `input`; its standard output when it succeeds.
    fn run(&self, what: &str, mut c: Command, input: Option<&str>) -> Result<String, ProviderError> {
        use std::io::Write as _;
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        if input.is_some() {
            c.stdin(Stdio::piped());
        }
        let spawn = |source| ProviderError::Spawn { command: what.to_owned(), source };
        let mut child = c.spawn().map_err(spawn)?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(text.as_bytes()).map_err(spawn)?;
        }
        let out = child.wait_with_output().map_err(spawn)?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stderr: String = stderr.trim().chars().take(MAX_STDERR).collect();
            return Err(ProviderError::Refused { command: what.to_owned(), status: out.status.to_string(), stderr });
        }
        String::from_utf8(out.stdout)
            .map_err(|_| ProviderError::Output { command: what.to_owned(), detail: "not UTF-8".into() })
    }

    fn submit_one(&self, launch: &Launch, secret_env: &[(&str, &str)]) -> Result<String, ProviderError> {
        let mut c = self.command("sbatch");
        c.arg("--parsable")
            .arg(format!("--job-name=htfaas-annex-{}", launch.annex))
            .args(["--nodes=1", "--ntasks=1"])
            .arg(format!("--cpus-per-task={}", launch.cpus))
            .arg(format!("--mem={}", launch.memory_mb))
            .arg(format!("--time={}", minutes(launch.time_limit)))
            .arg("--export=ALL");
        match &launch.log_dir {
            Some(dir) => c.arg(format!("--output={}/htfaas-annex-{}-%j.out", dir.display(), launch.annex)),
            None => c.arg("--output=/dev/null"),
        };
        if let Some(p) = &launch.partition {
            c.arg(format!("--partition={p}"));
        }
        if let Some(d) = &launch.work_dir {
            c.arg(format!("--chdir={}", d.display()));
        }
        for (k, v) in secret_env {
            c.env(k, v);
        }
        let out = self.run("sbatch", c, Some(&launch.script))?;
        parse_sbatch(&out).map_err(|detail| ProviderError::Output { command: "sbatch".into(), detail })
    }
}

/// `d` in whole minutes, rounded up, at least 1 (Slurm's `--time` and `TimeLimit` unit).
pub fn minutes(d: Duration) -> u64 {
    d.as_secs().div_ceil(60).max(1)
}

/// The job id `sbatch --parsable` printed (`ID` or `ID;CLUSTER`).
pub(crate) fn parse_sbatch(out: &str) -> Result<String, String> {
    let line = out.lines().map(str::trim).find(|l| !l.is_empty()).ok_or("no job id")?;
    let id = line.split(';').next().unwrap_or_default().trim();
    htfaas_functions::proto::check_annex_job_id(id).map_err(|e| e.to_string())?;
    if !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("job id {id:?} is not a number"));
    }
    Ok(id.to_owned())
}

/// A Slurm duration (`MM:SS`, `HH:MM:SS`, `D-HH:MM:SS`, `D-HH`, `D-HH:MM`, or minutes alone) in
/// seconds; `None` for `UNLIMITED`, `INVALID`, `N/A` or anything else.
pub fn parse_slurm_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    let num = |p: &str| p.parse::<u64>().ok().filter(|_| !p.is_empty() && p.len() <= 9);
    let (days, rest) = match s.split_once('-') {
        Some((d, rest)) => (num(d)?, rest),
        None => (0, s),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Option<_>>()?;
    let hms = match (s.contains('-'), parts.as_slice()) {
        (false, [m]) => m * 60,
        (false, [m, sec]) => m * 60 + sec,
        (_, [h, m, sec]) => h * 3600 + m * 60 + sec,
        (true, [h]) => h * 3600,
        (true, [h, m]) => h * 3600 + m * 60,
        _ => return None,
    };
    Some(days * 86_400 + hms)
}

/// The lines of `squeue -h -o '%i|%T|%M|%l|%r'`, by id; a line that does not parse is an error.
pub(crate) fn parse_squeue(out: &str) -> Result<BTreeMap<String, BatchJob>, String> {
    let mut jobs = BTreeMap::new();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split('|').collect();
        let [id, state, elapsed, limit, reason] = fields.as_slice() else {
            return Err(format!("line {line:?}: want 5 fields"));
        };
        htfaas_functions::proto::check_annex_job_id(id).map_err(|e| e.to_string())?;
        let state = match *state {
            "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "CONFIGURING" | "RESV_DEL_HOLD" => {
                BatchState::Pending(reason.to_string())
            }
            "RUNNING" | "SUSPENDED" | "RESIZING" | "SIGNALING" | "STAGE_OUT" => BatchState::Running,
            "COMPLETING" | "STOPPED" => BatchState::Ending,
            "COMPLETED" | "CANCELLED" | "FAILED" | "TIMEOUT" | "NODE_FAIL" | "PREEMPTED" | "BOOT_FAIL" | "DEADLINE"
            | "OUT_OF_MEMORY" | "REVOKED" | "SPECIAL_EXIT" => BatchState::Done(state.to_string()),
            other if !other.is_empty() && other.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') => {
                BatchState::Other(other.to_owned())
            }
            other => return Err(format!("line {line:?}: state {other:?}")),
        };
        let job = BatchJob {
            id: id.to_string(),
            state,
            elapsed_s: parse_slurm_duration(elapsed),
            time_limit_s: parse_slurm_duration(limit),
        };
        jobs.insert(id.to_string(), job);
    }
    Ok(jobs)
}

impl Provider for Slurm {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn job_id_var(&self) -> &'static str {
        "SLURM_JOB_ID"
    }

    fn submit(&self, launch: &Launch, secret_env: &[(&str, &str)]) -> Result<Vec<String>, ProviderError> {
        let mut started = Vec::new();
        for _ in 0..launch.count {
            match self.submit_one(launch, secret_env) {
                Ok(id) => started.push(id),
                Err(e) if started.is_empty() => return Err(e),
                Err(e) => return Err(ProviderError::Partial { started, source: Box::new(e) }),
            }
        }
        Ok(started)
    }

    fn states(&self, jobs: &[String]) -> Result<BTreeMap<String, BatchJob>, ProviderError> {
        let mut found = BTreeMap::new();
        if !jobs.is_empty() {
            let mut c = self.command("squeue");
            c.args(["-h", "--states=all", "-o", "%i|%T|%M|%l|%r", "-j"]).arg(jobs.join(","));
            match self.run("squeue", c, None) {
                Ok(out) => {
                    found = parse_squeue(&out)
                        .map_err(|detail| ProviderError::Output { command: "squeue".into(), detail })?;
                }
                // Every id unknown (all of them past MinJobAge): squeue refuses the list.
                Err(ProviderError::Refused { stderr, .. }) if stderr.contains("Invalid job id") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(jobs
            .iter()
            .map(|id| {
                let job = found.remove(id).unwrap_or_else(|| BatchJob {
                    id: id.clone(),
                    state: BatchState::Gone,
                    elapsed_s: None,
                    time_limit_s: None,
                });
                (id.clone(), job)
            })
            .collect())
    }

    fn extend(&self, jobs: &[String], lifetime: Duration) -> Result<Vec<String>, ProviderError> {
        let mut changed = Vec::new();
        for job in self.states(jobs)?.into_values().filter(|j| j.state.is_live()) {
            let ran = Duration::from_secs(job.elapsed_s.unwrap_or(0));
            let mut c = self.command("scontrol");
            c.arg("update").arg(format!("JobId={}", job.id)).arg(format!("TimeLimit={}", minutes(ran + lifetime)));
            match self.run("scontrol update", c, None) {
                Ok(_) => changed.push(job.id),
                // It ended meanwhile: nothing to extend.
                Err(ProviderError::Refused { stderr, .. })
                    if stderr.contains("Invalid job id") || stderr.contains("already completing or completed") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(changed)
    }

    fn cancel(&self, jobs: &[String]) -> Result<(), ProviderError> {
        let live: Vec<String> = self.states(jobs)?.into_values().filter(|j| j.state.is_live()).map(|j| j.id).collect();
        if live.is_empty() {
            return Ok(());
        }
        let mut c = self.command("scancel");
        c.args(&live);
        match self.run("scancel", c, None) {
            Ok(_) => Ok(()),
            Err(ProviderError::Refused { stderr, .. })
                if stderr.contains("Invalid job id") || stderr.contains("already completing or completed") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbatch_answers_are_ids_or_errors() {
        assert_eq!(parse_sbatch("17\n"), Ok("17".into()));
        assert_eq!(parse_sbatch("  18;cluster-a\n"), Ok("18".into()));
        for bad in ["", "\n", "Submitted batch job 19", "x y;c", "12a"] {
            assert!(parse_sbatch(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn slurm_durations() {
        assert_eq!(parse_slurm_duration("0:06"), Some(6));
        assert_eq!(parse_slurm_duration("10:00"), Some(600));
        assert_eq!(parse_slurm_duration("1:02:03"), Some(3723));
        assert_eq!(parse_slurm_duration("2-01:00:00"), Some(2 * 86_400 + 3600));
        assert_eq!(parse_slurm_duration("1-02"), Some(86_400 + 7200));
        assert_eq!(parse_slurm_duration("5"), Some(300));
        for bad in ["UNLIMITED", "INVALID", "N/A", "", "1:2:3:4", "-1", "a:b", "99999999999:00"] {
            assert_eq!(parse_slurm_duration(bad), None, "{bad:?}");
        }
        assert_eq!(minutes(Duration::from_secs(61)), 2);
        assert_eq!(minutes(Duration::from_secs(0)), 1);
    }

    #[test]
    fn squeue_lines_parse_or_are_refused() {
        let out = "2|RUNNING|0:06|10:00|None\n1|COMPLETED|0:05|2:00|None\n3|PENDING|0:00|2:00|Priority\n\
                   4|WEIRD_NEW|0:00|UNLIMITED|None\n";
        let jobs = parse_squeue(out).expect("parses");
        assert_eq!(jobs["2"].state, BatchState::Running);
        assert_eq!(jobs["2"].time_limit_s, Some(600));
        assert_eq!(jobs["1"].state, BatchState::Done("COMPLETED".into()));
        assert_eq!(jobs["3"].state, BatchState::Pending("Priority".into()));
        assert_eq!(jobs["4"].state, BatchState::Other("WEIRD_NEW".into()));
        assert_eq!(jobs["4"].time_limit_s, None);
        assert!(jobs["4"].state.is_live() && !jobs["1"].state.is_live());
        for bad in ["2|RUNNING|0:06", "x y|RUNNING|0|0|r", "5|running|0:00|1:00|None", "6||0:00|1:00|None"] {
            assert!(parse_squeue(bad).is_err(), "{bad:?}");
        }
    }
}
