//! Collecting a set (fan-in): a trigger's files grouped by a key taken from their path, and
//! the rule that says when a group is complete ([`Collect`]). The gateway keeps the groups
//! (durably, beside its firings) and fires a group's function once, when it completes; this
//! module only says which group a path joins, whether an arrival completes it and what it
//! still misses.
//!
//! Must not know: manifests, the gateway's tables, SQLite (`rusqlite`).

use serde::{Deserialize, Serialize};

/// Most files one group holds: a group this full is complete whatever its rule, and the next
/// files start a new group (a job's reference inputs are bounded, and so is one merge).
pub const MAX_GROUP_MEMBERS: u32 = 128;
/// A group's timeout when the rule names none: one day.
pub const DEFAULT_TIMEOUT_S: u64 = 86_400;
/// Longest timeout a rule may name: seven days (the events stream's and the firing keys' age).
pub const MAX_TIMEOUT_S: u64 = 7 * 86_400;

/// When a collecting trigger fires: its files grouped (by directory, or by the directory
/// level `key` names), each group fired once, when exactly one of `count`, `marker` or
/// `quiet_s` says it is complete (or it holds [`MAX_GROUP_MEMBERS`] files). A group not
/// complete `timeout_s` after its first file expires: recorded, never fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Collect {
    /// A glob naming the group's directory level, ending in `/`, e.g. `/data/runs/*/`: a file
    /// at any depth below such a directory joins that directory's group. Default: the file's
    /// own directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Complete once it holds this many distinct files (1..=[`MAX_GROUP_MEMBERS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Complete when a file of this name arrives (a name, not a path, e.g. `_COMPLETE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marker: Option<String>,
    /// Complete once no new file has arrived for this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_s: Option<u64>,
    /// Seconds after its first file at which an incomplete group expires (default
    /// [`DEFAULT_TIMEOUT_S`], at most [`MAX_TIMEOUT_S`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
}

/// Why a [`Collect`] was refused; the text names the part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CollectError(String);

/// How a group came to be complete, or why it closed without being.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// It holds `count` files.
    Count,
    /// Its marker file arrived.
    Marker,
    /// No file arrived for `quiet_s`.
    Quiet,
    /// It holds [`MAX_GROUP_MEMBERS`] files.
    Full,
    /// Its timeout passed first: expired, not fired.
    Timeout,
}

impl Closing {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Closing::Count => "count",
            Closing::Marker => "marker",
            Closing::Quiet => "quiet",
            Closing::Full => "full",
            Closing::Timeout => "timeout",
        }
    }
}

impl Collect {
    /// Checks the rule: exactly one completion, each in its range, a key that names one
    /// directory level.
    pub fn validate(&self) -> Result<(), CollectError> {
        let rules = [self.count.is_some(), self.marker.is_some(), self.quiet_s.is_some()];
        if rules.iter().filter(|r| **r).count() != 1 {
            return Err(CollectError("needs exactly one of count, marker or quiet_s".into()));
        }
        if let Some(n) = self.count
            && !(1..=MAX_GROUP_MEMBERS).contains(&n)
        {
            return Err(CollectError(format!("count must be 1..={MAX_GROUP_MEMBERS}")));
        }
        if let Some(m) = &self.marker
            && (m.is_empty() || m.contains('/') || m == "." || m == "..")
        {
            return Err(CollectError(format!("marker {m:?} must be a file name, not a path")));
        }
        let timeout = self.timeout_s();
        if !(1..=MAX_TIMEOUT_S).contains(&timeout) {
            return Err(CollectError(format!("timeout_s must be 1..={MAX_TIMEOUT_S}")));
        }
        if let Some(q) = self.quiet_s
            && !(1..=timeout).contains(&q)
        {
            return Err(CollectError(format!("quiet_s must be 1..=timeout_s ({timeout})")));
        }
        if let Some(key) = &self.key {
            if !key.starts_with('/') || !key.ends_with('/') || key.contains("**") || key.contains("//") {
                return Err(CollectError(format!(
                    "key {key:?} must be an absolute directory glob ending in / without **"
                )));
            }
            crate::glob::compile_glob(key).map_err(|e| CollectError(format!("key: {e}")))?;
        }
        Ok(())
    }

    /// The timeout, its default applied.
    pub fn timeout_s(&self) -> u64 {
        self.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S)
    }

    /// The group `path` joins: its directory (ending in `/`), or the directory level `key`
    /// names above it. `None` when the path is not below such a directory (it joins none).
    pub fn group_of(&self, path: &str) -> Option<String> {
        let dir = &path[..path.rfind('/')? + 1];
        let Some(key) = &self.key else { return Some(dir.to_owned()) };
        // The key's depth in segments: `/data/runs/*/` is three (`""`, `data`, `runs`, `*`…).
        let depth = key.matches('/').count();
        let end = dir.match_indices('/').nth(depth - 1)?.0 + 1;
        let group = &dir[..end];
        let matcher = crate::glob::compile_glob(key).ok()?;
        matcher.is_match(group).then(|| group.to_owned())
    }

    /// Whether a group that now holds `members` distinct files, the newest named `name`, is
    /// complete on this arrival, and how. A quiet period completes only by the clock
    /// ([`Collect::is_quiet`]).
    pub fn complete_on_arrival(&self, members: u32, name: &str) -> Option<Closing> {
        if self.marker.as_deref() == Some(name) {
            return Some(Closing::Marker);
        }
        if self.count.is_some_and(|n| members >= n) {
            return Some(Closing::Count);
        }
        (members >= MAX_GROUP_MEMBERS).then_some(Closing::Full)
    }

    /// Whether a group whose last file arrived at `last_ms` is complete by its quiet period at
    /// `now_ms`.
    pub fn is_quiet(&self, last_ms: u64, now_ms: u64) -> bool {
        self.quiet_s.is_some_and(|q| now_ms >= last_ms.saturating_add(q.saturating_mul(1000)))
    }

    /// What a group holding `members` files still waits for, in words.
    pub fn missing(&self, members: u32) -> String {
        if let Some(n) = self.count {
            return format!("{} more file(s): it holds {members} of {n}", n.saturating_sub(members));
        }
        if let Some(m) = &self.marker {
            return format!("the marker file {m:?}: it holds {members} file(s)");
        }
        let q = self.quiet_s.unwrap_or(0);
        format!("{q} s without a new file: it holds {members} file(s)")
    }
}

impl std::fmt::Display for Collect {
    /// The CLI's form: `count=4,key=/data/runs/*/,timeout=86400`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.count, &self.marker, self.quiet_s) {
            (Some(n), _, _) => write!(f, "count={n}")?,
            (_, Some(m), _) => write!(f, "marker={m}")?,
            (_, _, Some(q)) => write!(f, "quiet={q}")?,
            _ => f.write_str("(no rule)")?,
        }
        if let Some(key) = &self.key {
            write!(f, ",key={key}")?;
        }
        write!(f, ",timeout={}", self.timeout_s())
    }
}

impl std::str::FromStr for Collect {
    type Err = CollectError;

    /// `count=4`, `marker=_COMPLETE` or `quiet=60`, with optional `key=/data/runs/*/` and
    /// `timeout=86400`, comma-separated (the CLI's `--collect`); checked as [`Collect::validate`].
    fn from_str(s: &str) -> Result<Collect, CollectError> {
        let mut c = Collect { key: None, count: None, marker: None, quiet_s: None, timeout_s: None };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) =
                part.split_once('=').ok_or_else(|| CollectError(format!("{part:?} is not name=value")))?;
            let number = |v: &str| v.parse::<u64>().map_err(|_| CollectError(format!("{name}: {v:?} is not a number")));
            match name {
                "key" => c.key = Some(value.to_owned()),
                "count" => {
                    c.count = Some(u32::try_from(number(value)?).map_err(|_| CollectError("count: too large".into()))?)
                }
                "marker" => c.marker = Some(value.to_owned()),
                "quiet" | "quiet_s" => c.quiet_s = Some(number(value)?),
                "timeout" | "timeout_s" => c.timeout_s = Some(number(value)?),
                other => {
                    return Err(CollectError(format!("unknown part {other:?}: count, marker, quiet, key or timeout")));
                }
            }
        }
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(n: u32) -> Collect {
        Collect { key: None, count: Some(n), marker: None, quiet_s: None, timeout_s: None }
    }

    #[test]
    fn a_path_joins_its_directory_or_the_level_its_key_names() {
        let c = count(4);
        assert_eq!(c.group_of("/data/runs/42/a.dat").as_deref(), Some("/data/runs/42/"));
        let keyed = Collect { key: Some("/data/runs/*/".into()), ..count(4) };
        assert_eq!(keyed.group_of("/data/runs/42/a.dat").as_deref(), Some("/data/runs/42/"));
        assert_eq!(keyed.group_of("/data/runs/42/sub/deep/b.dat").as_deref(), Some("/data/runs/42/"));
        assert_eq!(keyed.group_of("/data/runs/a.dat"), None, "above the key's level");
        assert_eq!(keyed.group_of("/data/other/42/a.dat"), None, "outside the key");
        assert_eq!(keyed.group_of("no-slash"), None);
    }

    #[test]
    fn an_arrival_completes_by_count_marker_or_fullness_and_a_quiet_group_by_the_clock() {
        let c = count(3);
        assert_eq!(c.complete_on_arrival(2, "b"), None);
        assert_eq!(c.complete_on_arrival(3, "c"), Some(Closing::Count));
        assert_eq!(c.missing(1), "2 more file(s): it holds 1 of 3");
        let m = Collect { count: None, marker: Some("_COMPLETE".into()), ..count(1) };
        assert_eq!(m.complete_on_arrival(5, "x.dat"), None);
        assert_eq!(m.complete_on_arrival(6, "_COMPLETE"), Some(Closing::Marker));
        assert_eq!(m.complete_on_arrival(MAX_GROUP_MEMBERS, "y.dat"), Some(Closing::Full));
        let q = Collect { count: None, quiet_s: Some(60), ..count(1) };
        assert_eq!(q.complete_on_arrival(7, "x"), None);
        assert!(!q.is_quiet(1_000, 60_999));
        assert!(q.is_quiet(1_000, 61_000));
        assert!(!c.is_quiet(0, u64::MAX), "a count group is never complete by the clock");
    }

    #[test]
    fn a_rule_needs_exactly_one_completion_in_range_and_a_one_level_key() {
        for bad in [
            "count=4,marker=_C",
            "key=/data/*/",
            "count=0",
            "count=129",
            "marker=a/b",
            "quiet=0",
            "quiet=100,timeout=50",
            "count=2,timeout=0",
            "count=2,timeout=604801",
            "count=2,key=/data/**/",
            "count=2,key=data/*/",
            "count=2,key=/data/*",
            "count=x",
            "count=2,colour=red",
            "count",
        ] {
            assert!(bad.parse::<Collect>().is_err(), "{bad} was taken");
        }
        let c: Collect = "count=4, key=/data/runs/*/ ,timeout=3600".parse().expect("a rule");
        assert_eq!(c, Collect { key: Some("/data/runs/*/".into()), timeout_s: Some(3600), ..count(4) });
        assert_eq!(c.to_string(), "count=4,key=/data/runs/*/,timeout=3600");
        assert_eq!(c.to_string().parse::<Collect>(), Ok(c), "its own form reads back");
        assert_eq!("quiet=60".parse::<Collect>().expect("quiet").timeout_s(), DEFAULT_TIMEOUT_S);
    }
}
