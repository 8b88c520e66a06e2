//! XRootD `ofs.notify` lines to events ([`parse_line`]) and events to CloudEvents
//! ([`cloud_event`]).
//!
//! Must not know: where lines come from, NATS.

use super::MAX_LINE_BYTES;
use htfaas_functions::event::{BridgedEvent, CE_TYPE_PREFIX, CloudEvent, EventKind, SourceKind};
use htfaas_functions::manifest::is_clean_abs_path;

/// Why a line was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Longer than [`MAX_LINE_BYTES`].
    #[error("line longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
    /// Not UTF-8.
    #[error("line is not UTF-8")]
    NotUtf8,
    /// Fewer fields than the event needs (or none at all).
    #[error("too few fields for {0:?}")]
    TooFewFields(String),
    /// An event name `ofs.notify` does not write.
    #[error("unknown event {0:?}")]
    UnknownEvent(String),
    /// A mode that is not 1 to 6 octal digits.
    #[error("bad mode {0:?}")]
    BadMode(String),
    /// Not an absolute, clean path below `/`.
    #[error("path {0:?} is not a clean absolute path")]
    BadPath(String),
    /// A field after the path that is not a size (a path with white space, or a custom format).
    #[error("unexpected field {0:?} after the path (a path with white space?)")]
    Unexpected(String),
}

/// Parses one notify line (without its newline) into the events it reports, with the LFNs as
/// paths: none for a line the bridge ignores (`trunc`, a blank line), two for `mv`.
pub fn parse_line(line: &str) -> Result<Vec<BridgedEvent>, LineError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.len() > MAX_LINE_BYTES {
        return Err(LineError::TooLong);
    }
    let mut fields = line.split_ascii_whitespace();
    let Some(tid) = fields.next() else { return Ok(Vec::new()) };
    let Some(event) = fields.next() else { return Err(LineError::TooFewFields(excerpt(tid))) };
    let owner = owner_of_tid(tid);
    let rest: Vec<&str> = fields.collect();
    let too_few = || LineError::TooFewFields(event.to_owned());
    let one = |kind: EventKind, with_mode: bool| -> Result<Vec<BridgedEvent>, LineError> {
        let (path, after) = if with_mode {
            let [mode, path, after @ ..] = rest.as_slice() else { return Err(too_few()) };
            check_mode(mode)?;
            (*path, after)
        } else {
            let [path, after @ ..] = rest.as_slice() else { return Err(too_few()) };
            (*path, after)
        };
        let size = match after {
            [] => None,
            [size] => Some(size.parse::<u64>().map_err(|_| LineError::Unexpected(excerpt(size)))?),
            [_, extra, ..] => return Err(LineError::Unexpected(excerpt(extra))),
        };
        Ok(vec![BridgedEvent { kind, msg_type: event.to_owned(), path: clean_path(path)?, size, owner: owner.clone() }])
    };
    match event {
        "closew" => one(EventKind::Write, false),
        "create" => one(EventKind::Create, true),
        "rm" => one(EventKind::Remove, false),
        "closer" => one(EventKind::Read, false),
        "mkdir" | "chmod" => one(EventKind::Other, true),
        "rmdir" | "openr" | "openw" | "fwrite" => one(EventKind::Other, false),
        "trunc" => Ok(Vec::new()),
        "mv" => {
            let [from, to, after @ ..] = rest.as_slice() else { return Err(too_few()) };
            if let Some(extra) = after.first() {
                return Err(LineError::Unexpected(excerpt(extra)));
            }
            let event = |kind, path: &str| -> Result<BridgedEvent, LineError> {
                Ok(BridgedEvent {
                    kind,
                    msg_type: "mv".to_owned(),
                    path: clean_path(path)?,
                    size: None,
                    owner: owner.clone(),
                })
            };
            Ok(vec![event(EventKind::Remove, from)?, event(EventKind::Write, to)?])
        }
        other => Err(LineError::UnknownEvent(excerpt(other))),
    }
}

/// The user part of an XRootD trace id `user.pid:fd@host`, unless it is `unknown` (XrdHttp's
/// name for a client without one) or the id has another shape.
pub fn owner_of_tid(tid: &str) -> Option<String> {
    let (user_pid_fd, _host) = tid.split_once('@')?;
    let (user_pid, fd) = user_pid_fd.rsplit_once(':')?;
    let (user, pid) = user_pid.rsplit_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let ok = digits(pid)
        && digits(fd)
        && !user.is_empty()
        && user.len() <= 64
        && user != "unknown"
        && !user.chars().any(char::is_control);
    ok.then(|| user.to_owned())
}

pub(super) fn check_mode(mode: &str) -> Result<(), LineError> {
    if (1..=6).contains(&mode.len()) && mode.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        Ok(())
    } else {
        Err(LineError::BadMode(excerpt(mode)))
    }
}

/// An LFN as an event path: clean, absolute, below `/`, without a trailing `/`.
pub(super) fn clean_path(path: &str) -> Result<String, LineError> {
    if path == "/" || !is_clean_abs_path(path) || path.chars().any(char::is_control) {
        return Err(LineError::BadPath(excerpt(path)));
    }
    Ok(path.strip_suffix('/').unwrap_or(path).to_owned())
}

/// At most 120 characters of `s`, for errors and logs.
pub(super) fn excerpt(s: &str) -> String {
    match s.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// `prefix` made ready to put in front of a path: empty, or clean and absolute without a
/// trailing `/`.
pub fn normalize_prefix(prefix: &str) -> anyhow::Result<String> {
    if prefix.is_empty() {
        return Ok(String::new());
    }
    anyhow::ensure!(
        is_clean_abs_path(prefix) && !prefix.chars().any(char::is_control),
        "path prefix {prefix:?} must be an absolute path without . or .. segments"
    );
    Ok(prefix.trim_end_matches('/').to_owned())
}

/// The CloudEvent for one event, as the bridge publishes it.
pub fn cloud_event(event: &BridgedEvent, id: String, source_host: &str, time: String) -> CloudEvent {
    CloudEvent {
        specversion: "1.0".to_owned(),
        id,
        source: format!("xrootd://{source_host}"),
        ty: format!("{CE_TYPE_PREFIX}{}.{}", SourceKind::XrootdNotify.as_str(), event.msg_type),
        subject: Some(event.path.clone()),
        time: Some(time),
        datacontenttype: Some("application/json".to_owned()),
        data: serde_json::to_value(event).ok(),
        extensions: Default::default(),
    }
}
