//! dCache's inotify events to actions and CloudEvents ([`map_inotify`], [`loss_marker`]).
//!
//! Must not know: HTTP, NATS, the state file.

use super::{LOSS_TYPE_SUFFIX, join};
use htfaas_functions::event::{BridgedEvent, CE_TYPE_PREFIX, CloudEvent, EventKind, SourceKind};
use htfaas_functions::proto::CLOUDEVENTS_SUBJECT_PREFIX;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The `data` of an `inotify` or `SYSTEM` SSE event: `{"event":…,"subscription":…}`.
#[derive(Debug, Deserialize)]
pub(super) struct InotifyData {
    pub(super) event: InotifyEvent,
    pub(super) subscription: String,
}

/// dCache's inotify event object (its four shapes: child, move, self, management).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct InotifyEvent {
    /// The child's name (child and move events).
    #[serde(default)]
    pub name: Option<String>,
    /// The flags, e.g. `["IN_MOVED_TO","IN_ISDIR"]`.
    pub mask: Vec<String>,
    /// Pairs `IN_MOVED_FROM` and `IN_MOVED_TO` of one rename.
    #[serde(default)]
    pub cookie: Option<serde_json::Value>,
}

/// What one inotify event means to the bridge, given the watched path of its subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A file event: published with type `org.htfaas.storage.dcache-sse.<event.msg_type>`.
    Publish(BridgedEvent),
    /// A directory event (`IN_ISDIR`): not published; `flag` at `path` drives recursion.
    Directory {
        /// The primary flag, e.g. `IN_CREATE`.
        flag: String,
        /// The directory's path.
        path: String,
    },
    /// `IN_Q_OVERFLOW`: dCache dropped events of this watch; a loss marker.
    Overflow,
    /// A self or management event (`IN_DELETE_SELF`, `IN_MOVE_SELF`, `IN_IGNORED`,
    /// `IN_UNMOUNT`): logged; `IN_IGNORED` ends the watch.
    Watch {
        /// The primary flag.
        flag: String,
    },
}

/// Flags that qualify another flag rather than name an event.
pub(super) const MODIFIERS: [&str; 1] = ["IN_ISDIR"];

/// Maps a parsed inotify event of a subscription watching `watched`. An error is a malformed
/// event (no flag, a child event without a usable name).
pub fn map_inotify(ev: &InotifyEvent, watched: &str) -> Result<Action, InotifyRefused> {
    let Some(flag) = ev.mask.iter().find(|f| !MODIFIERS.contains(&f.as_str())) else {
        return Err(InotifyRefused(format!("no event flag in mask {:?}", ev.mask)));
    };
    let is_dir = ev.mask.iter().any(|f| f == "IN_ISDIR");
    match flag.as_str() {
        "IN_Q_OVERFLOW" => return Ok(Action::Overflow),
        "IN_IGNORED" | "IN_UNMOUNT" | "IN_DELETE_SELF" | "IN_MOVE_SELF" => {
            return Ok(Action::Watch { flag: flag.clone() });
        }
        _ => {}
    }
    let Some(name) = ev.name.as_deref() else {
        return Err(InotifyRefused(format!("{flag} without a name")));
    };
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(InotifyRefused(format!("{flag} with an unusable name {name:?}")));
    }
    let path = join(watched, name);
    // What the gateway would refuse (a backslash, say) is refused here, at its source.
    if !htfaas_functions::manifest::is_clean_abs_path(&path) {
        return Err(InotifyRefused(format!("{flag} with an unusable name {name:?}")));
    }
    if is_dir {
        return Ok(Action::Directory { flag: flag.clone(), path });
    }
    let kind = match flag.as_str() {
        "IN_CLOSE_WRITE" | "IN_MOVED_TO" => EventKind::Write,
        "IN_CREATE" => EventKind::Create,
        "IN_DELETE" | "IN_MOVED_FROM" => EventKind::Remove,
        _ => EventKind::Other,
    };
    Ok(Action::Publish(BridgedEvent { kind, msg_type: flag.clone(), path, size: None, owner: None }))
}

/// Why [`map_inotify`] refused an event: no event flag, or a name that is no file name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InotifyRefused(String);

/// The CloudEvent type of a published event or loss marker.
pub fn ce_type(suffix: &str) -> String {
    format!("{CE_TYPE_PREFIX}{}.{suffix}", SourceKind::DcacheSse.as_str())
}

/// The NATS subject the bridge publishes on: `storage.cloudevents.dcache-sse`.
pub fn subject() -> String {
    format!("{CLOUDEVENTS_SUBJECT_PREFIX}.{}", SourceKind::DcacheSse.as_str())
}

/// A loss marker for `watched`: kind `other`, `msg_type` `EVENT_LOSS` or `IN_Q_OVERFLOW`.
pub fn loss_marker(channel: &str, id: String, msg_type: &str, watched: &str) -> CloudEvent {
    let data = BridgedEvent {
        kind: EventKind::Other,
        msg_type: msg_type.to_owned(),
        path: watched.to_owned(),
        size: None,
        owner: None,
    };
    cloud_event(channel, id, ce_type(LOSS_TYPE_SUFFIX), data)
}

pub(super) fn cloud_event(channel: &str, id: String, ty: String, data: BridgedEvent) -> CloudEvent {
    CloudEvent {
        specversion: "1.0".to_owned(),
        id,
        source: channel.to_owned(),
        ty,
        subject: Some(data.path.clone()),
        time: Some(htfaas_functions::time::utc_timestamp_ms(htfaas_functions::time::now_ms())),
        datacontenttype: Some("application/json".to_owned()),
        data: Some(serde_json::to_value(&data).unwrap_or(serde_json::Value::Null)),
        extensions: BTreeMap::new(),
    }
}

/// The last path segment of a channel URL: its id.
pub(super) fn channel_id(channel: &str) -> &str {
    channel.trim_end_matches('/').rsplit('/').next().unwrap_or(channel)
}

pub(super) fn now_ms() -> u128 {
    u128::from(htfaas_functions::time::now_ms())
}
