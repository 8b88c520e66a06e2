//! "Re-derive this file": a re-run submitted, waited for and judged
//! ([`htfaas_functions::proto::rerun::verdict`]), and the recent outputs `audit rerun --all`
//! samples. Must not know: how verdicts are printed.

use super::Client;
use htfaas_functions::proto::rerun::{in_scratch, verdict};
use htfaas_functions::proto::{JobRecord, JobState, Rerun, RerunRequest, RerunVerdict};
use std::time::{Duration, Instant};

/// How often a re-run's job is looked at while it runs.
const POLL: Duration = Duration::from_millis(250);
/// Most completed jobs `recent_outputs` looks through.
const RECENT_JOBS: usize = 10_000;

impl Client {
    /// Submits the re-derivation of `file` (an output of a completed job of the caller's).
    pub async fn rerun(&self, file: &str) -> anyhow::Result<Rerun> {
        self.admin_post("/v1/audit/rerun", "re-derive the file", &RerunRequest { file: file.to_owned() }).await
    }

    /// The verdict on `rerun` once its job has ended, or [`RerunVerdict::Pending`] after
    /// `timeout`; with the job's last record.
    pub async fn rerun_verdict(&self, rerun: &Rerun, timeout: Duration) -> anyhow::Result<(RerunVerdict, JobRecord)> {
        let start = Instant::now();
        loop {
            let job = self.job(&rerun.rerun_job).await?;
            let v = verdict(rerun, &job);
            if !matches!(v, RerunVerdict::Pending { .. }) || start.elapsed() >= timeout {
                return Ok((v, job));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Up to `sample` outputs of the caller's jobs that completed at or after `since_ms` (Unix
    /// ms), spread evenly over them, newest first; re-runs' own outputs are not sampled.
    pub async fn recent_outputs(&self, since_ms: u64, sample: usize) -> anyhow::Result<Vec<String>> {
        let jobs: Vec<JobRecord> = self.admin_get(&format!("/v1/jobs?limit={RECENT_JOBS}")).await?;
        let outputs: Vec<String> = jobs
            .into_iter()
            .filter(|j| j.state == JobState::Completed && j.finished_at_ms.is_some_and(|t| t >= since_ms))
            .filter(|j| !in_scratch(&j.input) && j.event.source != "rerun")
            .filter_map(|j| j.outputs.into_iter().map(|o| o.path).find(|p| !in_scratch(p)))
            .collect();
        Ok(spread(outputs, sample))
    }
}

/// At most `n` of `items`, evenly spaced, the first always in.
fn spread<T>(items: Vec<T>, n: usize) -> Vec<T> {
    let len = items.len();
    if len <= n {
        return items;
    }
    items.into_iter().enumerate().filter(|(i, _)| (i * n) % len < n).map(|(_, x)| x).take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn a_sample_is_spread_over_the_whole_list() {
        assert_eq!(spread((0..10).collect(), 3), [0, 4, 7]);
        assert_eq!(spread((0..3).collect(), 5), [0, 1, 2]);
        assert_eq!(spread((0..4).collect::<Vec<u8>>(), 0), Vec::<u8>::new());
        assert_eq!(spread((0..100).collect::<Vec<u32>>(), 10).len(), 10);
    }
}
