//! Whether the EP is busy: how many jobs run now and since when it has had none, for
//! [`Settings::idle_shutdown`](crate::config::Settings::idle_shutdown).
//!
//! The bottom of the EP; must not know about jobs' contents, the link or the config.

use std::time::Duration;

/// Running jobs and the moment the EP last had none, for [`Settings::idle_shutdown`].
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
