//! The job report's log: the guest's stdout, then its stderr, then the EP's notes, bounded.
//!
//! Between the runtime (whose [`GuestRun`] it reads) and the job; must not know about
//! transfers or the link.

use crate::runtime::GuestRun;

/// The report's log: stdout, then stderr, then the EP's notes, bounded.
pub(crate) struct LogText {
    text: String,
}

impl LogText {
    pub(crate) fn new(run: &GuestRun) -> LogText {
        let mut text = String::from_utf8_lossy(&run.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&run.stderr));
        let mut log = LogText { text };
        if run.log_dropped > 0 {
            log.note(&format!("{} bytes of guest output dropped (log limit)", run.log_dropped));
        }
        for n in &run.notes {
            log.note(n);
        }
        log
    }

    pub(crate) fn note(&mut self, note: &str) {
        if !self.text.is_empty() && !self.text.ends_with('\n') {
            self.text.push('\n');
        }
        self.text.push_str("[htfaas-ep] ");
        self.text.push_str(note);
        self.text.push('\n');
    }

    /// The log, cut to `limit` bytes plus room for the EP's notes (at most 4 KiB more).
    pub(crate) fn finish(mut self, limit: usize) -> String {
        let max = limit.saturating_add(4096);
        if self.text.len() > max {
            let mut cut = max;
            while !self.text.is_char_boundary(cut) {
                cut -= 1;
            }
            self.text.truncate(cut);
            self.text.push_str("\n[htfaas-ep] log truncated\n");
        }
        self.text
    }
}
