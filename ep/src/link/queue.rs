//! The link's local queue: prefetched jobs waiting for their room, started oldest first as
//! the running jobs' reserved cpus and memory leave it, handed back past the granted wait or at
//! a drain, dropped with their session.
//!
//! Must not know: the WebSocket (`tokio_tungstenite`).

use super::{Link, PREFETCH_WAIT_REASON};
use htfaas_functions::Resources;
use htfaas_functions::proto::{EpMsg, JobReport};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

impl Link {
    /// Answers an assignment that will not start here: `NotStarted` within the extension (the
    /// scheduler requeues it at once), else a `Cancelled` report (a return).
    pub(super) fn hand_back(&mut self, job_id: String, reason: &str) {
        tracing::info!(job.id = %job_id, %reason, "handing a job back unstarted");
        let msg = if self.ext.is_some() {
            EpMsg::NotStarted { job_id, reason: reason.to_owned() }
        } else {
            EpMsg::Finished(JobReport::unstarted(job_id, reason.to_owned()))
        };
        self.pending.push_back(msg);
    }

    /// The session ended: its queued jobs were requeued by the scheduler with it, so they are
    /// dropped here unstarted.
    pub(super) fn drop_queue(&mut self) {
        if !self.queued.is_empty() {
            let ids: Vec<&str> = self.queued.iter().map(|(j, _)| j.job_id.as_str()).collect();
            tracing::info!(jobs = ?ids, "session gone: queued jobs dropped unstarted (the scheduler runs them elsewhere)");
            self.queued.clear();
            self.set_activity();
        }
        self.ext = None;
    }

    pub(super) fn set_activity(&self) {
        self.settings.activity.set_running(self.running.len() + self.queued.len());
    }

    /// Whether `r` fits beside the jobs started.
    pub(super) fn fits(&self, r: &Resources) -> bool {
        let (cpus, memory_mb) = self
            .reserved
            .values()
            .fold((0u64, 0u64), |(c, m), x| (c + u64::from(x.cpus), m.saturating_add(x.memory_mb)));
        cpus + u64::from(r.cpus) <= u64::from(self.settings.slots.cpus)
            && memory_mb.saturating_add(r.memory_mb) <= self.settings.slots.memory_mb
    }

    /// Starts queued jobs, oldest first, while they fit (or nothing runs; without the
    /// extension, all at once); then hands back the queued ones that waited past the granted
    /// wait.
    pub(super) fn start_ready(&mut self) {
        while let Some((head, _)) = self.queued.front() {
            if self.ext.is_some() && !self.running.is_empty() && !self.fits(&head.resources) {
                break;
            }
            if let Some((job, _)) = self.queued.pop_front() {
                self.start(job);
            }
        }
        if let Some(p) = self.ext {
            let wait = Duration::from_millis(p.wait_ms);
            let now = Instant::now();
            let (late, keep): (VecDeque<_>, VecDeque<_>) =
                std::mem::take(&mut self.queued).into_iter().partition(|(_, since)| now.duration_since(*since) >= wait);
            self.queued = keep;
            for (job, _) in late {
                self.hand_back(job.job_id, PREFETCH_WAIT_REASON);
            }
        }
        self.set_activity();
    }

    /// When the oldest queued job's wait ends.
    pub(super) fn next_handback(&self) -> Option<Instant> {
        let p = self.ext?;
        self.queued.iter().map(|(_, since)| *since + Duration::from_millis(p.wait_ms)).min()
    }
}
