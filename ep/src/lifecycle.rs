//! Whether the EP is busy: how many jobs run now and since when it has had none, for
//! [`Settings::idle_shutdown`](crate::config::Settings::idle_shutdown); and when its lifetime
//! ends ([`Lease`]): [`Settings::lifetime`](crate::config::Settings::lifetime) after start,
//! or what the scheduler said last (`SchedulerMsg::Lifetime`, an annex's end).
//!
//! The bottom of the EP; must not know about jobs' contents, the link or the config.

use std::time::Duration;

/// Running jobs and the moment the EP last had none, for [`Settings::idle_shutdown`](crate::Settings::idle_shutdown).
pub(crate) struct Activity {
    running: std::sync::atomic::AtomicUsize,
    idle_since: std::sync::Mutex<tokio::time::Instant>,
}

impl Activity {
    pub(crate) fn new() -> Activity {
        Activity {
            running: std::sync::atomic::AtomicUsize::new(0),
            idle_since: std::sync::Mutex::new(tokio::time::Instant::now()),
        }
    }

    /// Records how many jobs run now.
    pub(crate) fn set_running(&self, n: usize) {
        let before = self.running.swap(n, std::sync::atomic::Ordering::Relaxed);
        if n == 0 && before != 0 {
            *self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = tokio::time::Instant::now();
        }
    }

    /// Jobs running now.
    pub(crate) fn running(&self) -> usize {
        self.running.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How long the EP has had no job, if it has none now.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        if self.running.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            return None;
        }
        Some(self.idle_since.lock().unwrap_or_else(|p| p.into_inner()).elapsed())
    }
}

/// When the EP leaves (drains, then exits): set at start from its lifetime, and replaced by
/// the scheduler's word (an annex extended or deleted); none: no end.
pub(crate) struct Lease {
    ends: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Lease {
    pub(crate) fn new() -> Lease {
        Lease { ends: std::sync::Mutex::new(None) }
    }

    /// The EP leaves `after` from now, whatever was set before.
    pub(crate) fn end_in(&self, after: Duration) {
        *self.ends.lock().unwrap_or_else(|p| p.into_inner()) = Some(tokio::time::Instant::now() + after);
    }

    /// The EP leaves `after` from now, unless an end was set already (the scheduler spoke first).
    pub(crate) fn start(&self, after: Duration) {
        let mut ends = self.ends.lock().unwrap_or_else(|p| p.into_inner());
        if ends.is_none() {
            *ends = Some(tokio::time::Instant::now() + after);
        }
    }

    /// Whether the end has come.
    pub(crate) fn over(&self) -> bool {
        self.ends.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|e| tokio::time::Instant::now() >= e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_schedulers_word_replaces_the_lifetime_either_way() {
        let lease = Lease::new();
        assert!(!lease.over(), "no end: never over");
        lease.end_in(Duration::from_secs(100));
        lease.start(Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!lease.over(), "the scheduler spoke first: the start's lifetime does not apply");
        lease.end_in(Duration::from_secs(1));
        assert!(!lease.over());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(lease.over(), "shortened");
        lease.end_in(Duration::from_secs(3600));
        assert!(!lease.over(), "extended again");
    }
}
