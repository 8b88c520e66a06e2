//! The batch job script of an annex: one `htfaas ep` per job, configured from what
//! `htfaas annex create` knows, with the attach token taken from the job's environment.
//!
//! The script holds no secret (it may be shown by `scontrol write batch_script` to the job's
//! owner and the batch system's admins): the token is in `HTFAAS_ATTACH_TOKEN`, which
//! `htfaas ep` reads. It makes a private scratch directory (`umask 077`, `mktemp -d` under the
//! job's `TMPDIR` or the scratch directory given), writes the EP's config there (every value quoted here, for the shell and for
//! JSON; only the job id and the scratch path are filled in at run time, each checked to be
//! plain), starts the EP in the background, ignores SIGTERM itself (the batch system signals
//! every process of the job: the EP drains on its own, and a second SIGTERM forwarded by the
//! shell would stop it hard), waits for it, removes the scratch directory and exits with the
//! EP's status — so the job ends when the EP leaves (idle, lifetime, annex deleted).
//!
//! Must not know: which batch system runs it (it is told the variable holding the job id).

use std::fmt::Write as _;
use std::path::PathBuf;

/// The environment variable the job's EP takes its attach token from (`htfaas ep` reads it).
pub const TOKEN_ENV: &str = "HTFAAS_ATTACH_TOKEN";

/// What each EP of the annex is.
#[derive(Debug, Clone)]
pub struct EpSpec {
    /// The annex.
    pub annex: String,
    /// The `htfaas` binary on the batch nodes (absolute).
    pub htfaas: PathBuf,
    /// Where EPs dial the scheduler.
    pub scheduler_url: String,
    /// Cores advertised.
    pub cpus: u32,
    /// Memory advertised, MiB (less than the job's, for the EP's own use).
    pub memory_mb: u64,
    /// Longest job accepted, seconds.
    pub runtime_s: u64,
    /// The EP's own lifetime, seconds (the scheduler replaces it with the annex's end on attach).
    pub lifetime_s: u64,
    /// Leave after this long without a job, seconds.
    pub idle_shutdown_s: Option<u64>,
    /// How long a drain waits for running jobs, seconds.
    pub drain_s: u64,
    /// Origins jobs may fetch from and store to (`allowed_origins`); none: the EP's default.
    pub allowed_origins: Option<Vec<String>>,
    /// Extra CA certificates on the batch nodes (`tls_ca_file`).
    pub tls_ca_file: Option<PathBuf>,
    /// The provider's name, for the EP's labels.
    pub provider: String,
    /// The environment variable holding the running job's id (`SLURM_JOB_ID`).
    pub job_id_var: String,
    /// Where on the node each EP makes its scratch directory (absolute); none: the job's
    /// `TMPDIR` (else /tmp).
    pub scratch_dir: Option<PathBuf>,
}

/// Placeholders of the config template, filled in by the script at run time.
const JOB: &str = "@@HTFAAS_JOB_ID@@";
const WORK: &str = "@@HTFAAS_WORK_DIR@@";

/// `s` single-quoted for bash (a `'` becomes `'\''`).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The EP's config as JSON, with the job id and scratch directory as placeholders.
fn config_template(spec: &EpSpec) -> Result<String, String> {
    let mut config = serde_json::json!({
        "name": format!("{}-{JOB}", spec.annex),
        "scheduler_url": spec.scheduler_url,
        "work_dir": format!("{WORK}/ep"),
        "slots": { "cpus": spec.cpus, "memory_mb": spec.memory_mb, "runtime_s": spec.runtime_s },
        "labels": { "annex": spec.annex, "annex.provider": spec.provider, "annex.job": JOB },
    });
    if let Some(origins) = &spec.allowed_origins {
        config["allowed_origins"] = serde_json::json!(origins);
    }
    if let Some(ca) = &spec.tls_ca_file {
        config["tls_ca_file"] = serde_json::json!(ca);
    }
    let text = serde_json::to_string(&config).map_err(|e| e.to_string())?;
    // A value of the caller's holding a placeholder would be filled in too.
    if text.matches(JOB).count() != 2 || text.matches(WORK).count() != 1 {
        return Err("a value holds one of the script's placeholders".into());
    }
    Ok(text)
}

/// The job script for `spec`.
pub(crate) fn job_script(spec: &EpSpec) -> Result<String, String> {
    if !spec.htfaas.is_absolute() {
        return Err(format!("the htfaas binary must be an absolute path, not {}", spec.htfaas.display()));
    }
    if !spec.job_id_var.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') {
        return Err(format!("job id variable {:?}", spec.job_id_var));
    }
    let template = config_template(spec)?;
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "#!/bin/bash");
    let _ = writeln!(
        w,
        "# htfaas annex {}: one execution point per batch job (written by `htfaas annex create`).",
        spec.annex
    );
    let _ = writeln!(w, "# The attach token is in the job's environment ({TOKEN_ENV}), never in this script.");
    let _ = writeln!(w, "umask 077");
    let _ = writeln!(w, "job=${{{}:-}}", spec.job_id_var);
    let _ = writeln!(
        w,
        "case \"$job\" in ''|*[!A-Za-z0-9._-]*) echo \"htfaas annex: no usable job id in {}\" >&2; exit 1 ;; esac",
        spec.job_id_var
    );
    let _ = writeln!(
        w,
        "[ -n \"${{{TOKEN_ENV}:-}}\" ] || {{ echo \"htfaas annex: {TOKEN_ENV} is not set\" >&2; exit 1; }}"
    );
    let scratch = match &spec.scratch_dir {
        Some(d) if d.is_absolute() => shell_quote(&d.to_string_lossy()),
        Some(d) => return Err(format!("the scratch directory must be an absolute path, not {}", d.display())),
        None => "\"${TMPDIR:-/tmp}\"".to_owned(),
    };
    let _ = writeln!(w, "work=$(mktemp -d {scratch}/htfaas-annex.XXXXXXXX) || exit 1");
    let _ = writeln!(w, "trap 'rm -rf \"$work\"' EXIT");
    let _ = writeln!(
        w,
        "case \"$work\" in *[!A-Za-z0-9._/-]*) echo \"htfaas annex: unusable scratch path $work\" >&2; exit 1 ;; esac"
    );
    // The config, piece by piece: the literal parts single-quoted, the job id and scratch path
    // (checked above) between them.
    let _ = write!(w, "{{");
    for (i, piece) in template.split(JOB).enumerate() {
        if i > 0 {
            let _ = write!(w, " printf '%s' \"$job\";");
        }
        for (k, part) in piece.split(WORK).enumerate() {
            if k > 0 {
                let _ = write!(w, " printf '%s' \"$work\";");
            }
            if !part.is_empty() {
                let _ = write!(w, " printf '%s' {};", shell_quote(part));
            }
        }
    }
    let _ = writeln!(w, " }} > \"$work/ep.json\" || exit 1");
    let mut ep = vec![
        shell_quote(&spec.htfaas.to_string_lossy()),
        "ep".into(),
        "--config".into(),
        "\"$work/ep.json\"".into(),
        "--annex".into(),
        shell_quote(&spec.annex),
        "--lifetime".into(),
        format!("{}s", spec.lifetime_s.max(1)),
        "--drain-timeout".into(),
        format!("{}s", spec.drain_s.max(1)),
    ];
    if let Some(idle) = spec.idle_shutdown_s {
        ep.extend(["--idle-shutdown".into(), format!("{}s", idle.max(1))]);
    }
    let _ = writeln!(w, "{} &", ep.join(" "));
    let _ = writeln!(w, "ep=$!");
    let _ = writeln!(w, "# The batch system signals every process of the job; the EP drains on its own SIGTERM.");
    let _ = writeln!(w, "trap '' TERM");
    let _ = writeln!(w, "rc=0");
    let _ = writeln!(w, "wait \"$ep\" || rc=$?");
    let _ = writeln!(w, "while kill -0 \"$ep\" 2>/dev/null; do rc=0; wait \"$ep\" || rc=$?; done");
    let _ = writeln!(w, "exit \"$rc\"");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> EpSpec {
        EpSpec {
            annex: "bob-gpu".into(),
            htfaas: "/opt/htfaas/bin/htfaas".into(),
            scheduler_url: "https://ap.example:8090".into(),
            cpus: 4,
            memory_mb: 7372,
            runtime_s: 3600,
            lifetime_s: 3240,
            idle_shutdown_s: Some(300),
            drain_s: 360,
            allowed_origins: Some(vec!["https://dcache.example:2880".into()]),
            tls_ca_file: Some("/etc/grid-security/site-ca.pem".into()),
            provider: "slurm".into(),
            job_id_var: "SLURM_JOB_ID".into(),
            scratch_dir: None,
        }
    }

    #[test]
    fn the_script_runs_the_ep_with_no_secret_and_every_value_quoted() {
        let s = job_script(&spec()).expect("script");
        assert!(s.starts_with("#!/bin/bash\n"));
        assert!(s.contains("'/opt/htfaas/bin/htfaas' ep --config \"$work/ep.json\" --annex 'bob-gpu'"), "{s}");
        assert!(s.contains("--lifetime 3240s --drain-timeout 360s --idle-shutdown 300s &"), "{s}");
        assert!(s.contains("job=${SLURM_JOB_ID:-}"), "{s}");
        assert!(!s.contains("attach_token"), "no token in the script or its config: {s}");
        assert!(!s.contains("@@"), "every placeholder is filled in at run time: {s}");
    }

    #[test]
    fn the_config_the_script_writes_is_the_eps_config() {
        // Run the script's config part by bash, with a job id and a scratch dir, and parse it.
        let s = job_script(&spec()).expect("script");
        let line = s.lines().find(|l| l.starts_with("{ printf")).expect("the config line");
        let dir = tempfile::tempdir().expect("tempdir");
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("job=42; work={}; {line}; cat \"$work/ep.json\"", dir.path().display()))
            .output()
            .expect("bash");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut config: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(config["name"], "bob-gpu-42");
        assert_eq!(config["labels"]["annex.job"], "42");
        assert_eq!(config["work_dir"], format!("{}/ep", dir.path().display()));
        config["attach_token"] = "from-the-environment".into();
        let parsed: htfaas_ep::Config = serde_json::from_value(config).expect("the EP's config");
        assert_eq!(parsed.slots.cpus, 4);
        assert_eq!(parsed.tls_ca_file.as_deref(), Some(std::path::Path::new("/etc/grid-security/site-ca.pem")));
    }

    #[test]
    fn quoting_survives_quotes_and_placeholders_are_refused() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        let mut odd = spec();
        odd.scheduler_url = "https://x/$(rm -rf /)'`".into();
        let s = job_script(&odd).expect("script");
        assert!(s.contains(r"'\''"), "{s}");
        let mut sneaky = spec();
        sneaky.scheduler_url = format!("https://x/{JOB}");
        assert!(job_script(&sneaky).is_err());
        let mut relative = spec();
        relative.htfaas = "htfaas".into();
        assert!(job_script(&relative).is_err());
    }
}
