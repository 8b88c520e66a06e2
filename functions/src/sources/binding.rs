//! Which storage paths each events subject may speak for (`source_paths` in the gateway's
//! configuration).
//!
//! NATS permissions let each publisher's credential publish on its own subject only (the
//! storage on the billing subject, a bridge on `storage.cloudevents.<source>`); this binds
//! what a subject says to the part of the namespace its storage serves, so that a bridge of
//! one site cannot name a file of another storage, whose macaroons the gateway would then ask
//! for. An event outside its subject's prefixes is refused: counted, acked, never retried.
//!
//! Rules are tried in order; the first whose subject pattern matches decides. A subject no rule
//! matches speaks for nothing. Without any rule (`source_paths` absent) every subject speaks for
//! every path, as before bindings existed: right for one trusted storage, and logged at start.
//!
//! This module knows subjects and clean paths; nothing of credentials, NATS or triggers.

use crate::manifest::is_clean_abs_path;
use serde::Deserialize;

/// One rule: the subjects of `subject` speak only for paths under `paths`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourcePaths {
    /// An events subject (`storage.dcache.billing`, `storage.cloudevents.xrootd-notify`) or a
    /// NATS pattern of them (`*` one token, `>` the rest, e.g. `storage.cloudevents.>`).
    pub subject: String,
    /// Path prefixes, each a clean absolute path: `/data/` covers what is under `/data/`;
    /// `/data/run1` covers `/data/run1` itself and what is under `/data/run1/`, not
    /// `/data/run10`. At least one.
    pub paths: Vec<String>,
}

/// A `source_paths` rule that cannot be used; the gateway refuses to start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BindingError {
    /// Not a subject or subject pattern.
    #[error("source_paths: {0:?} is not a NATS subject or subject pattern")]
    Subject(String),
    /// A prefix that is not a clean absolute path.
    #[error("source_paths: {subject}: {prefix:?} is not a clean absolute path")]
    Prefix {
        /// The rule's subject.
        subject: String,
        /// The prefix.
        prefix: String,
    },
    /// A rule without a prefix.
    #[error("source_paths: {0}: no path prefix (leave the subject out to refuse all its events)")]
    Empty(String),
}

/// Why a subject may not speak for a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No rule names the subject.
    Unbound,
    /// The path is outside the prefixes of the subject's rule.
    Outside,
}

/// The checked rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bindings {
    /// `None`: no rule at all, every subject speaks for every path.
    rules: Option<Vec<SourcePaths>>,
}

impl Bindings {
    /// Checks `rules`; `None` binds nothing.
    pub fn new(rules: Option<Vec<SourcePaths>>) -> Result<Bindings, BindingError> {
        for rule in rules.iter().flatten() {
            if !valid_pattern(&rule.subject) {
                return Err(BindingError::Subject(rule.subject.clone()));
            }
            if rule.paths.is_empty() {
                return Err(BindingError::Empty(rule.subject.clone()));
            }
            if let Some(bad) = rule.paths.iter().find(|p| !is_clean_abs_path(p)) {
                return Err(BindingError::Prefix { subject: rule.subject.clone(), prefix: bad.clone() });
            }
        }
        Ok(Bindings { rules })
    }

    /// Whether no rule is configured (every subject speaks for every path).
    pub fn is_open(&self) -> bool {
        self.rules.is_none()
    }

    /// Whether `subject` may speak for the clean absolute path `path`.
    pub fn check(&self, subject: &str, path: &str) -> Result<(), Refusal> {
        let Some(rules) = &self.rules else { return Ok(()) };
        let rule = rules.iter().find(|r| subject_matches(&r.subject, subject)).ok_or(Refusal::Unbound)?;
        if rule.paths.iter().any(|p| under(path, p)) { Ok(()) } else { Err(Refusal::Outside) }
    }
}

/// Whether `path` is `prefix` or under it (whole path segments only).
fn under(path: &str, prefix: &str) -> bool {
    if prefix.ends_with('/') {
        return path.starts_with(prefix);
    }
    path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}

/// Non-empty tokens, no whitespace, `>` only as the last token.
fn valid_pattern(pattern: &str) -> bool {
    let tokens: Vec<&str> = pattern.split('.').collect();
    tokens
        .iter()
        .enumerate()
        .all(|(i, t)| !t.is_empty() && !t.contains(char::is_whitespace) && (*t != ">" || i == tokens.len() - 1))
}

/// NATS subject matching: `*` is one token, a final `>` one token or more.
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for p in pattern.split('.') {
        match (p, subject_tokens.next()) {
            (">", Some(_)) => return true,
            (_, None) => return false,
            ("*", Some(_)) => {}
            (p, Some(s)) if p == s => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(subject: &str, paths: &[&str]) -> SourcePaths {
        SourcePaths { subject: subject.into(), paths: paths.iter().map(|p| (*p).to_owned()).collect() }
    }

    #[test]
    fn subjects_match_as_nats_matches_them() {
        for (pattern, subject, yes) in [
            ("storage.dcache.billing", "storage.dcache.billing", true),
            ("storage.dcache.billing", "storage.dcache.billing.x", false),
            ("storage.dcache.billing", "storage.dcache", false),
            ("storage.cloudevents.>", "storage.cloudevents.xrootd-notify", true),
            ("storage.cloudevents.>", "storage.cloudevents.a.b", true),
            ("storage.cloudevents.>", "storage.cloudevents", false),
            ("storage.*.billing", "storage.dcache.billing", true),
            ("storage.*.billing", "storage.dcache.x.billing", false),
        ] {
            assert_eq!(subject_matches(pattern, subject), yes, "{pattern} ~ {subject}");
        }
        for bad in ["", "a..b", "a.>.b", "a b", ".a"] {
            assert!(!valid_pattern(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_first_matching_rule_decides_and_an_unbound_subject_speaks_for_nothing() {
        let b = Bindings::new(Some(vec![
            rule("storage.cloudevents.xrootd-notify", &["/store/"]),
            rule("storage.dcache.billing", &["/data/", "/site/run1"]),
            rule("storage.cloudevents.>", &["/data/"]),
        ]))
        .expect("valid");
        let xrd = "storage.cloudevents.xrootd-notify";
        assert_eq!(b.check(xrd, "/store/in/a.dat"), Ok(()));
        assert_eq!(b.check(xrd, "/data/a.dat"), Err(Refusal::Outside), "its own rule decides, not the wildcard");
        assert_eq!(b.check("storage.cloudevents.daq", "/data/a.dat"), Ok(()));
        assert_eq!(b.check("storage.dcache.billing", "/site/run1/x"), Ok(()));
        assert_eq!(b.check("storage.dcache.billing", "/site/run1"), Ok(()));
        assert_eq!(b.check("storage.dcache.billing", "/site/run10/x"), Err(Refusal::Outside), "whole segments");
        assert_eq!(b.check("storage.dcache.billing", "/datax/a"), Err(Refusal::Outside));
        let only = Bindings::new(Some(vec![rule("storage.dcache.billing", &["/data/"])])).expect("valid");
        assert_eq!(only.check("storage.cloudevents.daq", "/data/a"), Err(Refusal::Unbound));
        assert!(Bindings::new(None).expect("none").check("any.subject", "/x").is_ok());
        assert!(Bindings::default().is_open() && !only.is_open());
    }

    #[test]
    fn unusable_rules_are_refused_at_start() {
        let e = |r: SourcePaths| Bindings::new(Some(vec![r])).expect_err("refused").to_string();
        assert_eq!(e(rule("a.>.b", &["/x/"])), r#"source_paths: "a.>.b" is not a NATS subject or subject pattern"#);
        assert_eq!(e(rule("s", &["x/"])), r#"source_paths: s: "x/" is not a clean absolute path"#);
        assert_eq!(e(rule("s", &["/a/../b/"])), r#"source_paths: s: "/a/../b/" is not a clean absolute path"#);
        assert_eq!(
            e(rule("s", &[])),
            "source_paths: s: no path prefix (leave the subject out to refuse all its events)"
        );
        let parsed: Vec<SourcePaths> =
            serde_json::from_str(r#"[{"subject": "storage.dcache.billing", "paths": ["/data/"]}]"#).expect("parses");
        assert_eq!(parsed, vec![rule("storage.dcache.billing", &["/data/"])]);
        assert!(serde_json::from_str::<SourcePaths>(r#"{"subject": "s", "paths": [], "prefix": 1}"#).is_err());
    }
}
