//! The site's identity map: which owner, accounting groups and namespace grants a verified
//! identity from the site's OIDC provider (issuer, `sub`, groups or entitlements) becomes.
//!
//! A map is an ordered list of rules, the first matching rule deciding (HTCondor-CE's
//! mapfiles and Globus Compute's identity mapping work the same way). A rule names an issuer
//! exactly and matches `sub` and/or one of the identity's groups with regular expressions;
//! its `owner`, `groups` and grants are templates over the expressions' named captures.
//!
//! ```json
//! {"rules": [
//!   {"name": "desy-staff", "issuer": "https://login.example.org/realms/site",
//!    "sub": "^(?P<user>[a-z][a-z0-9]{1,15})@example\\.org$", "owner": "{user}",
//!    "groups": ["cms"],
//!    "grants": [{"right": "read", "value": "/data/{owner}/"},
//!               {"right": "write", "value": "/data/{owner}/out/"}]},
//!   {"name": "cms-robots", "issuer": "https://login.example.org/realms/site",
//!    "group": "^/cms/robots$", "sub": "^(?P<id>[a-z0-9-]{4,40})$", "owner": "robot-{id}"}
//! ]}
//! ```
//!
//! What a map refuses, at load (a file that breaks a rule is no map at all):
//! - an expression not written anchored (`^…$`); each is also compiled as a whole-string match
//!   (`\A(?:…)\z`), so a top-level alternation (`^alice$|.*`) cannot match more than its text says;
//! - a template naming a capture its rule's expressions do not define;
//! - a grant value naming anything but `{owner}` (a capture is the identity's own text, a path is
//!   the site's: a `sub` of `../x` must never reach a path);
//! - an owner template that is a fixed `admin` (no identity is mapped to the admin).
//!
//! What a match refuses (the identity is refused, no later rule is tried): an owner or group
//! that is not a valid name (`[a-z0-9][a-z0-9_-]{0,62}`, so a capture cannot smuggle a `/`,
//! a `group:` prefix or a space), and the owner `admin`.
//!
//! A rule may name a `program` instead of an `owner` (the `program` module): a site's own
//! lookup, run with the identity on its standard input, whose answer is checked as a
//! template's result.
//!
//! Must not know: tokens and their signatures (the gateway verifies them first), HTTP, the
//! registry. This module decides from claims already verified.

mod program;

pub use program::{DEFAULT_TIMEOUT as PROGRAM_DEFAULT_TIMEOUT, MAX_TIMEOUT as PROGRAM_MAX_TIMEOUT};

use crate::manifest::check_name;
use crate::namespace::{Grant, Right};
use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The name no mapped identity may take: the admin token's.
pub const RESERVED_OWNER: &str = "admin";
/// Most rules a map may hold.
pub const MAX_RULES: usize = 10_000;
/// Largest compiled expression, bytes (the regex crate's size limit).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// A verified identity, as the map sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The token's issuer (`iss`), exactly.
    pub issuer: String,
    /// The subject (`sub`).
    pub sub: String,
    /// Its groups or entitlements (`groups`, `wlcg.groups`, `eduperson_entitlement`, …).
    #[serde(default)]
    pub groups: Vec<String>,
}

impl Identity {
    /// The identity in a token's claims: `iss`, `sub`, and the groups of every claim named in
    /// `group_claims` (a string or an array of strings; a dotted name such as `wlcg.groups` is
    /// looked up as one key first, then as a path). Missing `iss` or `sub` is an error.
    pub fn from_claims(claims: &serde_json::Value, group_claims: &[String]) -> Result<Identity, MapError> {
        let text = |k: &str| claims.get(k).and_then(serde_json::Value::as_str).map(str::to_owned);
        let issuer = text("iss").ok_or_else(|| MapError::Claims("no `iss` claim".into()))?;
        let sub = text("sub").filter(|s| !s.is_empty()).ok_or_else(|| MapError::Claims("no `sub` claim".into()))?;
        let mut groups = Vec::new();
        for name in group_claims {
            let value = claims
                .get(name)
                .or_else(|| name.split('.').try_fold(claims, |v, part| v.get(part)).filter(|_| name.contains('.')));
            match value {
                Some(serde_json::Value::String(s)) => groups.extend(s.split_whitespace().map(str::to_owned)),
                Some(serde_json::Value::Array(items)) => {
                    groups.extend(items.iter().filter_map(serde_json::Value::as_str).map(str::to_owned))
                }
                _ => {}
            }
        }
        groups.sort();
        groups.dedup();
        Ok(Identity { issuer, sub, groups })
    }
}

/// A grant a rule implies, its value a template over `{owner}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantTemplate {
    /// What is allowed.
    pub right: Right,
    /// A directory (or an annex name); `{owner}` is the mapped owner.
    pub value: String,
}

/// One rule of the map file, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The rule's name: identities bound by it are named by it in the audit trail, and its
    /// grants stay in force only while a rule of that name is in the map.
    pub name: String,
    /// The issuer, exactly as its tokens' `iss`.
    pub issuer: String,
    /// An anchored expression the `sub` must match. At least one of `sub` and `group`.
    #[serde(default)]
    pub sub: Option<String>,
    /// An anchored expression one of the identity's groups must match.
    #[serde(default)]
    pub group: Option<String>,
    /// The owner: a template over the named captures and `{sub}`. Exactly one of `owner` and
    /// `program`.
    #[serde(default)]
    pub owner: Option<String>,
    /// A program that maps the identities this rule matches (see the `program` module): its
    /// command and arguments (the identity goes only to its standard input).
    #[serde(default)]
    pub program: Option<Vec<String>>,
    /// How long the program may take, ms. Default 2000, at most 10000.
    #[serde(default)]
    pub program_timeout_ms: Option<u64>,
    /// Accounting groups the owner may charge runs to (templates, as `owner`).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Namespace grants the owner holds while the rule is in the map.
    #[serde(default)]
    pub grants: Vec<GrantTemplate>,
}

/// A map file, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapSpec {
    /// The rules, in order: the first that matches decides.
    pub rules: Vec<RuleSpec>,
}

#[derive(Debug, Clone)]
struct Rule {
    spec: RuleSpec,
    sub: Option<Regex>,
    group: Option<Regex>,
}

/// A loaded, checked identity map.
#[derive(Debug, Clone)]
pub struct IdentityMap {
    rules: Vec<Rule>,
}

/// What an identity is mapped to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapped {
    /// The rule that matched.
    pub rule: String,
    /// The owner it acts as.
    pub owner: String,
    /// The accounting groups it may charge (each also a `group` grant in `grants`).
    pub groups: Vec<String>,
    /// The grants it holds through the rule: the rule's own, then one `group` grant per group.
    pub grants: Vec<Grant>,
}

/// Why a map did not load, or why an identity is not mapped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// The file is not a map (syntax, a field, a rule that breaks a check).
    #[error("identity map: {0}")]
    Invalid(String),
    /// The claims lack what an identity needs.
    #[error("token claims: {0}")]
    Claims(String),
    /// No rule matched.
    #[error("no rule of the identity map matches issuer {issuer:?}, sub {sub:?} (groups {groups:?})")]
    Unmapped {
        /// `iss`.
        issuer: String,
        /// `sub`.
        sub: String,
        /// The groups looked at.
        groups: Vec<String>,
    },
    /// A rule matched, and what it makes of the identity is refused.
    #[error("rule {rule:?} matched and is refused: {reason}")]
    Refused {
        /// The rule.
        rule: String,
        /// Why.
        reason: String,
    },
}

fn invalid(rule: &str, reason: impl std::fmt::Display) -> MapError {
    MapError::Invalid(format!("rule {rule:?}: {reason}"))
}

impl IdentityMap {
    /// Parses and checks a map file's JSON.
    pub fn parse(text: &[u8]) -> Result<IdentityMap, MapError> {
        let spec: MapSpec = serde_json::from_slice(text).map_err(|e| MapError::Invalid(e.to_string()))?;
        IdentityMap::from_spec(spec)
    }

    /// Checks a map: every rule named once, issuers and expressions as the module says,
    /// templates naming only what their rule captures.
    pub fn from_spec(spec: MapSpec) -> Result<IdentityMap, MapError> {
        if spec.rules.len() > MAX_RULES {
            return Err(MapError::Invalid(format!("{} rules, at most {MAX_RULES}", spec.rules.len())));
        }
        let mut names = BTreeSet::new();
        let mut rules = Vec::with_capacity(spec.rules.len());
        for r in spec.rules {
            check_name(&r.name).map_err(|e| invalid(&r.name, format!("its name {e}")))?;
            if !names.insert(r.name.clone()) {
                return Err(invalid(&r.name, "a second rule of this name"));
            }
            if r.issuer.is_empty() || r.issuer.chars().any(char::is_control) {
                return Err(invalid(&r.name, "issuer must be the exact `iss` of the provider's tokens"));
            }
            if r.sub.is_none() && r.group.is_none() {
                return Err(invalid(&r.name, "needs `sub` or `group` (write \"^.*$\" to match every sub on purpose)"));
            }
            let sub = r.sub.as_deref().map(|p| compile(&r.name, "sub", p)).transpose()?;
            let group = r.group.as_deref().map(|p| compile(&r.name, "group", p)).transpose()?;
            let mut captures: BTreeSet<String> = ["sub".to_owned()].into();
            for re in sub.iter().chain(group.iter()) {
                captures.extend(re.capture_names().flatten().map(str::to_owned));
            }
            match (&r.owner, &r.program) {
                (Some(owner), None) => {
                    check_template(&r.name, "owner", owner, &captures)?;
                    if owner == RESERVED_OWNER {
                        return Err(invalid(&r.name, "maps to `admin`: no identity is mapped to the admin"));
                    }
                }
                (None, Some(command)) => {
                    if command.first().is_none_or(|p| !p.starts_with('/')) {
                        return Err(invalid(&r.name, "program must name its executable by absolute path"));
                    }
                    let limit = program::MAX_TIMEOUT.as_millis() as u64;
                    if r.program_timeout_ms.is_some_and(|t| t == 0 || t > limit) {
                        return Err(invalid(&r.name, format!("program_timeout_ms must be 1-{limit}")));
                    }
                }
                _ => return Err(invalid(&r.name, "needs exactly one of `owner` and `program`")),
            }
            for g in &r.groups {
                check_template(&r.name, "groups", g, &captures)?;
            }
            let owner_only: BTreeSet<String> = ["owner".to_owned()].into();
            for g in &r.grants {
                check_template(&r.name, "grants", &g.value, &owner_only)?;
                if g.right == Right::Group {
                    return Err(invalid(&r.name, "a `group` grant is written as `groups`"));
                }
                // The grant as it would be for a valid owner name: its value must be one.
                let probe =
                    Grant { principal: "probe".into(), right: g.right, value: g.value.replace("{owner}", "probe") };
                probe.validate().map_err(|e| invalid(&r.name, format!("grant {}: {e}", g.value)))?;
            }
            rules.push(Rule { spec: r, sub, group });
        }
        Ok(IdentityMap { rules })
    }

    /// The rules' names, in order.
    pub fn rule_names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.spec.name.as_str())
    }

    /// The issuer of the rule named `name`, if the map has it.
    pub fn issuer_of(&self, name: &str) -> Option<&str> {
        self.rules.iter().find(|r| r.spec.name == name).map(|r| r.spec.issuer.as_str())
    }

    /// Maps `identity` by the first rule that matches it. Blocks while a rule's mapping
    /// program runs (at most its timeout).
    pub fn map(&self, identity: &Identity) -> Result<Mapped, MapError> {
        for rule in &self.rules {
            if rule.spec.issuer != identity.issuer {
                continue;
            }
            let mut values: Vec<(String, String)> = vec![("sub".into(), identity.sub.clone())];
            if let Some(re) = &rule.sub {
                let Some(c) = re.captures(&identity.sub) else { continue };
                push_captures(re, &c, &mut values);
            }
            if let Some(re) = &rule.group {
                let Some((re, c)) = identity.groups.iter().find_map(|g| re.captures(g).map(|c| (re, c))) else {
                    continue;
                };
                push_captures(re, &c, &mut values);
            }
            return rule.apply(identity, &values);
        }
        Err(MapError::Unmapped {
            issuer: identity.issuer.clone(),
            sub: identity.sub.clone(),
            groups: identity.groups.clone(),
        })
    }
}

impl Rule {
    fn apply(&self, identity: &Identity, values: &[(String, String)]) -> Result<Mapped, MapError> {
        let name = &self.spec.name;
        let refused = |reason: String| MapError::Refused { rule: name.clone(), reason };
        let (owner, asked_groups) = match (&self.spec.owner, &self.spec.program) {
            (Some(template), _) => (fill(template, values), Vec::new()),
            (None, Some(command)) => {
                let timeout =
                    self.spec.program_timeout_ms.map_or(program::DEFAULT_TIMEOUT, std::time::Duration::from_millis);
                let captures: serde_json::Map<String, serde_json::Value> =
                    values.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
                let input = serde_json::json!({
                    "issuer": identity.issuer, "sub": identity.sub, "groups": identity.groups,
                    "rule": name, "captures": captures,
                });
                let answer = program::ask(command, timeout, input.to_string().as_bytes()).map_err(refused)?;
                if let Some(why) = answer.refuse {
                    return Err(refused(format!("the mapping program refused: {why}")));
                }
                (answer.owner.ok_or_else(|| refused("the mapping program named no owner".into()))?, answer.groups)
            }
            (None, None) => return Err(refused("the rule names no owner".into())),
        };
        check_name(&owner).map_err(|e| refused(format!("owner {e}")))?;
        if owner == RESERVED_OWNER {
            return Err(refused("the owner would be `admin`".into()));
        }
        let mut groups = Vec::new();
        let templated = self.spec.groups.iter().map(|g| fill(g, values));
        for g in templated.chain(asked_groups) {
            check_name(&g).map_err(|e| refused(format!("group {e}")))?;
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        let mut grants = Vec::new();
        for t in &self.spec.grants {
            let grant = Grant { principal: owner.clone(), right: t.right, value: t.value.replace("{owner}", &owner) };
            grant.validate().map_err(|e| refused(format!("grant {}: {e}", grant.value)))?;
            grants.push(grant);
        }
        grants.extend(groups.iter().map(|g| Grant { principal: owner.clone(), right: Right::Group, value: g.clone() }));
        Ok(Mapped { rule: name.clone(), owner, groups, grants })
    }
}

fn push_captures(re: &Regex, c: &regex::Captures<'_>, values: &mut Vec<(String, String)>) {
    for name in re.capture_names().flatten() {
        if let Some(m) = c.name(name) {
            values.push((name.to_owned(), m.as_str().to_owned()));
        }
    }
}

/// An anchored expression, compiled as a whole-string match.
fn compile(rule: &str, field: &str, pattern: &str) -> Result<Regex, MapError> {
    if !pattern.starts_with('^') || !pattern.ends_with('$') || pattern.ends_with("\\$") {
        return Err(invalid(rule, format!("{field} {pattern:?} must be anchored: start with ^ and end with $")));
    }
    RegexBuilder::new(&format!(r"\A(?:{pattern})\z"))
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| invalid(rule, format!("{field} {pattern:?}: {e}")))
}

/// Checks that `template`'s `{…}` name only `allowed`, and that its braces pair up.
fn check_template(rule: &str, field: &str, template: &str, allowed: &BTreeSet<String>) -> Result<(), MapError> {
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err(invalid(rule, format!("{field} {template:?}: a `}}` without its `{{`")));
        }
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| invalid(rule, format!("{field} {template:?}: an unclosed `{{`")))?;
        let name = &after[..close];
        if !allowed.contains(name) {
            let known = allowed.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
            return Err(invalid(rule, format!("{field} {template:?} names {{{name}}}, which is not one of: {known}")));
        }
        rest = &after[close + 1..];
    }
    Ok(())
}

fn fill(template: &str, values: &[(String, String)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else { break };
        let name = &after[..close];
        // The last value of a name wins: a `group` capture after a `sub` one of the same name.
        if let Some((_, v)) = values.iter().rev().find(|(k, _)| k == name) {
            out.push_str(v);
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISS: &str = "https://idp.example.org";

    fn map(rules: serde_json::Value) -> Result<IdentityMap, MapError> {
        IdentityMap::parse(serde_json::json!({ "rules": rules }).to_string().as_bytes())
    }

    fn who(sub: &str, groups: &[&str]) -> Identity {
        Identity { issuer: ISS.into(), sub: sub.into(), groups: groups.iter().map(|g| (*g).to_owned()).collect() }
    }

    fn site() -> IdentityMap {
        map(serde_json::json!([
            {"name": "robots", "issuer": ISS, "group": "^/cms/robots$", "sub": "^(?P<id>[a-z0-9-]{4,40})$",
             "owner": "robot-{id}"},
            {"name": "staff", "issuer": ISS, "sub": "^(?P<user>[a-z][a-z0-9]{1,15})@example\\.org$",
             "owner": "{user}", "groups": ["cms"],
             "grants": [{"right": "read", "value": "/data/{owner}/"}, {"right": "write", "value": "/data/{owner}/out/"}]},
            {"name": "groups", "issuer": ISS, "group": "^/desy/(?P<g>[a-z]+)$", "sub": "^(?P<u>[a-z]+)$",
             "owner": "{u}", "groups": ["{g}"]}
        ]))
        .expect("the map")
    }

    #[test]
    fn the_first_matching_rule_decides_with_its_captures() {
        let m = site();
        let alice = m.map(&who("alice@example.org", &["/desy/cms"])).expect("alice");
        assert_eq!(
            (alice.rule.as_str(), alice.owner.as_str(), alice.groups.clone()),
            ("staff", "alice", vec!["cms".into()])
        );
        let values: Vec<_> = alice.grants.iter().map(|g| (g.right, g.value.as_str())).collect();
        assert_eq!(values, [(Right::Read, "/data/alice/"), (Right::Write, "/data/alice/out/"), (Right::Group, "cms")]);
        assert!(alice.grants.iter().all(|g| g.principal == "alice"));
        // Both expressions of a rule must match: a robot id without the robots group falls through.
        let bob = m.map(&who("bob", &["/desy/atlas", "/cms/robots-not"])).expect("bob");
        assert_eq!(
            (bob.rule.as_str(), bob.owner.as_str(), bob.groups.clone()),
            ("groups", "bob", vec!["atlas".into()])
        );
        let robot = m.map(&who("ci-7", &["/cms/robots"])).expect("robot");
        assert_eq!((robot.rule.as_str(), robot.owner.as_str()), ("robots", "robot-ci-7"));
    }

    #[test]
    fn an_identity_no_rule_matches_is_refused_with_what_was_looked_at() {
        let m = site();
        let other_issuer = Identity { issuer: "https://evil.example".into(), ..who("alice@example.org", &[]) };
        assert!(matches!(m.map(&other_issuer), Err(MapError::Unmapped { .. })), "the issuer is matched exactly");
        let err = m.map(&who("Alice@example.org", &[])).expect_err("upper case");
        assert!(err.to_string().contains("no rule"), "{err}");
    }

    #[test]
    fn an_alternation_or_a_newline_cannot_widen_an_anchored_expression() {
        // Written anchored, but `^alice$|.*` would match anything if only searched.
        let m = map(serde_json::json!([
            {"name": "one", "issuer": ISS, "sub": "^alice$|^bob$", "owner": "{sub}"}
        ]))
        .expect("map");
        assert!(m.map(&who("alice", &[])).is_ok());
        for sneaky in ["mallory", "alice\nmallory", "xalice", "alicex", "bob\n"] {
            assert!(matches!(m.map(&who(sneaky, &[])), Err(MapError::Unmapped { .. })), "{sneaky:?}");
        }
    }

    #[test]
    fn captures_that_would_escape_a_name_or_become_admin_are_refused_not_mapped() {
        let m = map(serde_json::json!([
            {"name": "loose", "issuer": ISS, "sub": "^(?P<u>.+)$", "owner": "{u}",
             "grants": [{"right": "read", "value": "/data/{owner}/"}]},
            {"name": "never", "issuer": ISS, "sub": "^.*$", "owner": "fallback"}
        ]))
        .expect("map");
        for bad in ["../../etc", "group:cms", "a b", "admin", "ALICE"] {
            match m.map(&who(bad, &[])) {
                Err(MapError::Refused { rule, .. }) => assert_eq!(rule, "loose", "{bad:?}: no fall-through"),
                other => panic!("{bad:?} mapped: {other:?}"),
            }
        }
        assert_eq!(m.map(&who("carol", &[])).expect("carol").grants[0].value, "/data/carol/");
    }

    #[test]
    fn maps_that_break_a_rule_do_not_load() {
        let cases = [
            (serde_json::json!([{"name": "a", "issuer": ISS, "sub": "alice", "owner": "alice"}]), "anchored"),
            (serde_json::json!([{"name": "a", "issuer": ISS, "sub": "^alice", "owner": "alice"}]), "anchored"),
            (serde_json::json!([{"name": "a", "issuer": ISS, "sub": "^alice\\$", "owner": "alice"}]), "anchored"),
            (serde_json::json!([{"name": "a", "issuer": ISS, "owner": "alice"}]), "needs `sub` or `group`"),
            (serde_json::json!([{"name": "a", "issuer": ISS, "sub": "^.*$", "owner": "admin"}]), "admin"),
            (serde_json::json!([{"name": "a", "issuer": ISS, "sub": "^(?P<u>.*)$", "owner": "{user}"}]), "{user}"),
            (
                serde_json::json!([{"name": "a", "issuer": ISS, "sub": "^(?P<u>.*)$", "owner": "x",
                  "grants": [{"right": "read", "value": "/data/{u}/"}]}]),
                "{u}",
            ),
            (
                serde_json::json!([{"name": "a", "issuer": ISS, "sub": "^.*$", "owner": "x",
                  "grants": [{"right": "read", "value": "data"}]}]),
                "grant data",
            ),
            (serde_json::json!([{"name": "a", "issuer": ISS, "sub": "^(.*$", "owner": "x"}]), "sub"),
            (serde_json::json!([{"name": "a", "issuer": "", "sub": "^.*$", "owner": "x"}]), "issuer"),
            (
                serde_json::json!([{"name": "a", "issuer": ISS, "sub": "^.*$", "owner": "x"},
                                   {"name": "a", "issuer": ISS, "sub": "^.*$", "owner": "y"}]),
                "second rule",
            ),
            (
                serde_json::json!([{"name": "a", "issuer": ISS, "sub": "^.*$", "owner": "x", "admin": true}]),
                "unknown field",
            ),
        ];
        for (rules, says) in cases {
            let err = map(rules.clone()).expect_err(&rules.to_string());
            assert!(err.to_string().contains(says), "{rules}: {err}");
        }
        assert!(IdentityMap::parse(b"{\"rules\": [").is_err());
    }

    /// A map whose one rule asks `script` (a shell script written to `dir`), within `timeout_ms`.
    fn asking(dir: &std::path::Path, script: &str, timeout_ms: u64) -> IdentityMap {
        let path = dir.join(format!("mapper-{}.sh", script.len()));
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).expect("write the mapper");
        let mut perms = std::fs::metadata(&path).expect("meta").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).expect("chmod");
        map(serde_json::json!([
            {"name": "ldap", "issuer": ISS, "sub": "^(?P<uid>[a-z]+)@example\\.org$",
             "program": [path.to_str().expect("utf-8 path")], "program_timeout_ms": timeout_ms,
             "groups": ["users"], "grants": [{"right": "read", "value": "/data/{owner}/"}]}
        ]))
        .expect("the map")
    }

    #[test]
    fn a_mapping_program_answers_from_the_identity_on_its_input() {
        let dir = tempfile::tempdir().expect("tempdir");
        // The site's lookup: reads the identity, answers the owner from the capture, and a group.
        let m = asking(
            dir.path(),
            r#"input=$(cat); case "$input" in *'"uid":"carol"'*) echo '{"owner": "carol", "groups": ["cms"]}';; *) echo '{"refuse": "not in the directory"}';; esac"#,
            2000,
        );
        let carol = m.map(&who("carol@example.org", &[])).expect("carol");
        assert_eq!((carol.rule.as_str(), carol.owner.as_str()), ("ldap", "carol"));
        assert_eq!(carol.groups, ["users", "cms"]);
        assert_eq!(carol.grants[0].value, "/data/carol/");
        let err = m.map(&who("dave@example.org", &[])).expect_err("dave");
        assert!(err.to_string().contains("refused: not in the directory"), "{err}");
    }

    #[test]
    fn a_mapping_program_that_hangs_fails_or_prints_garbage_maps_nobody() {
        let dir = tempfile::tempdir().expect("tempdir");
        let alice = who("alice@example.org", &[]);
        let cases = [
            ("exec sleep 30", "did not answer within 300 ms"),
            ("echo 'owner: alice'", "not {"),
            ("echo '{\"owner\": \"alice\"}'; exit 3", "failed"),
            ("echo '{\"owner\": \"admin\"}'", "`admin`"),
            ("echo '{\"owner\": \"../../etc\"}'", "owner"),
            ("echo '{\"owner\": \"alice\", \"groups\": [\"group:x\"]}'", "group"),
            ("echo '{\"owner\": \"alice\", \"admin\": true}'", "unknown field"),
            ("echo '{}'", "named no owner"),
            ("head -c 70000 /dev/zero | tr '\\0' a", "more than"),
        ];
        for (script, says) in cases {
            let err = asking(dir.path(), script, 300).map(&alice).expect_err(script);
            assert!(matches!(err, MapError::Refused { .. }), "{script}: {err}");
            assert!(err.to_string().contains(says), "{script}: {err}");
        }
        // A program named by a relative path, or given too long, does not load.
        for (program, timeout, says) in
            [("mapper.sh", 1000, "absolute path"), ("/bin/true", 60_000, "program_timeout_ms")]
        {
            let err = map(serde_json::json!([
                {"name": "x", "issuer": ISS, "sub": "^.*$", "program": [program], "program_timeout_ms": timeout}
            ]))
            .expect_err(program);
            assert!(err.to_string().contains(says), "{err}");
        }
        let both = map(
            serde_json::json!([{"name": "x", "issuer": ISS, "sub": "^.*$", "owner": "a", "program": ["/bin/true"]}]),
        );
        assert!(both.expect_err("both").to_string().contains("exactly one"));
    }

    #[test]
    fn the_readmes_example_map_loads_and_maps_as_it_says() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("{\"rules\": [\n  {\"name\": \"staff\"").expect("the example map in README.md");
        let end = start + readme[start..].find("```").expect("its end");
        let m = IdentityMap::parse(&readme.as_bytes()[start..end]).expect("the README's map loads");
        let who = Identity {
            issuer: "https://login.example.org/realms/site".into(),
            sub: "carol@example.org".into(),
            groups: vec!["/site/cms".into()],
        };
        let carol = m.map(&who).expect("carol");
        assert_eq!((carol.owner.as_str(), carol.groups.clone()), ("carol", vec!["cms".to_owned()]));
    }

    #[test]
    fn groups_come_from_every_named_claim_in_either_form() {
        let claims = serde_json::json!({
            "iss": ISS, "sub": "alice", "groups": ["/desy/cms", "/desy/cms"],
            "wlcg.groups": "/wlcg/a /wlcg/b", "eduperson_entitlement": ["urn:x"], "other": ["ignored"]
        });
        let names = ["groups", "wlcg.groups", "eduperson_entitlement"].map(String::from);
        let id = Identity::from_claims(&claims, &names).expect("identity");
        assert_eq!(id.groups, ["/desy/cms", "/wlcg/a", "/wlcg/b", "urn:x"]);
        let nested = serde_json::json!({"iss": ISS, "sub": "a", "wlcg": {"groups": ["/n"]}});
        assert_eq!(Identity::from_claims(&nested, &names).expect("nested").groups, ["/n"]);
        assert!(Identity::from_claims(&serde_json::json!({"iss": ISS}), &names).is_err());
        assert!(Identity::from_claims(&serde_json::json!({"iss": ISS, "sub": ""}), &names).is_err());
    }
}
