//! The bridge's resume state file ([`State`]): channel, last SSE id, watches.
//!
//! Must not know: HTTP, NATS.

use super::STATE_VERSION;
use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What the bridge keeps across restarts, as JSON in the state file (written to a temporary
/// file, synced, renamed):
///
/// ```json
/// {"version":1,"frontend":"https://fe:3880/api/v1",
///  "channel":"https://fe:3880/api/v1/events/channels/MwcX…",
///  "subscriptions":{"https://…/subscriptions/inotify/AACF…":"/data/incoming"},
///  "last_event_id":"41","pending_loss":false}
/// ```
///
/// `last_event_id` is the SSE id of the last event handled (published and acked, or skipped
/// on purpose) on `channel`; `pending_loss` says a lost channel's loss markers are still to be
/// published. A local file, not a wire type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Format version (1).
    pub version: u32,
    /// The frontend the channel belongs to: a state of another frontend is not reused.
    pub frontend: String,
    /// The channel URL, once made.
    #[serde(default)]
    pub channel: Option<String>,
    /// Subscription URL → watched path.
    #[serde(default)]
    pub subscriptions: BTreeMap<String, String>,
    /// The resume point (`Last-Event-ID`).
    #[serde(default)]
    pub last_event_id: Option<String>,
    /// A channel was lost and its loss markers are not published yet.
    #[serde(default)]
    pub pending_loss: bool,
}

impl State {
    pub(super) fn fresh(frontend: &str) -> State {
        State {
            version: STATE_VERSION,
            frontend: frontend.to_owned(),
            channel: None,
            subscriptions: BTreeMap::new(),
            last_event_id: None,
            pending_loss: false,
        }
    }

    /// Reads the state file; a missing file, or one of another frontend, gives a fresh state.
    pub fn load(file: &Path, frontend: &str) -> anyhow::Result<State> {
        let bytes = match std::fs::read(file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::fresh(frontend)),
            Err(e) => return Err(e).with_context(|| format!("read state file {}", file.display())),
        };
        let state: State =
            serde_json::from_slice(&bytes).with_context(|| format!("parse state file {}", file.display()))?;
        anyhow::ensure!(state.version == STATE_VERSION, "state file {} has version {}", file.display(), state.version);
        if state.frontend != frontend {
            tracing::warn!(old = %state.frontend, "state file belongs to another frontend; starting a new channel");
            return Ok(State::fresh(frontend));
        }
        Ok(state)
    }

    /// Writes the state file atomically (temporary file, fsync, rename).
    pub fn save(&self, file: &Path) -> anyhow::Result<()> {
        use std::io::Write as _;
        let mut tmp = file.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let json = serde_json::to_vec_pretty(self).context("encode the state")?;
        let mut f = std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
        f.write_all(&json).and_then(|()| f.sync_all()).with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, file).with_context(|| format!("rename {} to {}", tmp.display(), file.display()))
    }
}
