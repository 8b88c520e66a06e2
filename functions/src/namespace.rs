//! Namespaces: which storage paths an owner (or an accounting group) may trigger on and read,
//! under which it may write outputs (and replace files), and which annexes its jobs may ask for.
//!
//! A site grants rights, one [`Grant`] at a time: `read /data/alice/`, `write /data/alice/out/`,
//! `replace /data/alice/out/`, `annex alice-hpc`. Path rights are directories (clean, absolute,
//! ending in `/`) and cover everything below them. The grants of a principal — an owner, or
//! `group:<name>` for an accounting group — make its [`Namespace`]; a name with no grant has an
//! empty namespace and may do nothing. The checks here are the one definition of "inside":
//!
//! - [`Namespace::confine`]: a manifest's trigger must be bounded to the read namespace (from
//!   [`crate::trigger::Rule::path_bound`]: a rule that could fire outside it, or anywhere, is
//!   refused with the reason), its output directory must lie in the write namespace, a
//!   `replace` output in the replace namespace, an annex among its annexes;
//! - [`Namespace::may_read`] / [`Namespace::may_write`]: again when a firing becomes a job and
//!   for manual runs, dry runs, tests and replays.
//!
//! Pure: no I/O. The registry stores grants ([`crate::registry::Registry::grant`]), the
//! gateway checks them; neither the scheduler nor an EP knows namespaces.

use crate::manifest::{FunctionManifest, check_name, is_clean_abs_path};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Longest path or annex a grant may name, bytes.
pub const MAX_GRANT_VALUE: usize = 1024;
/// The prefix of a group principal: `group:atlas`.
pub const GROUP_PREFIX: &str = "group:";

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Right {
    /// Trigger on, and read, files under a directory.
    Read,
    /// Write new files (outputs) under a directory.
    Write,
    /// Replace files under a directory (a write macaroon with `DELETE`); needs `write` too.
    Replace,
    /// Ask for an annex (EPs whose attach token names it).
    Annex,
    /// Charge runs to an accounting group (a manifest's `group`), taking part in its quota and
    /// reaching what `group:<name>` is granted. Only an owner's own grant counts.
    Group,
}

impl Right {
    /// The lowercase name (`read`, `write`, `replace`, `annex`, `group`).
    pub fn as_str(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Write => "write",
            Right::Replace => "replace",
            Right::Annex => "annex",
            Right::Group => "group",
        }
    }

    /// Parses [`Right::as_str`]'s form.
    pub fn parse(s: &str) -> Option<Right> {
        [Right::Read, Right::Write, Right::Replace, Right::Annex, Right::Group].into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Right {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One right of one principal: `alice read /data/alice/`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// An owner (a manifest's `owner`, a token's `sub`) or `group:<accounting group>`.
    pub principal: String,
    /// What is allowed.
    pub right: Right,
    /// A directory (`/data/alice/`) for path rights, an annex name for [`Right::Annex`].
    pub value: String,
}

/// Where a grant in force comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrantSource {
    /// The gateway's configuration (`namespaces`): only the configuration takes it back.
    Config,
    /// An admin, through the API (`htfaas ns grant`), kept in the registry.
    Admin,
    /// The site's identity map: a rule's grants for an identity it mapped, in force while
    /// the map keeps the rule ([`crate::identity_map`]).
    Map,
}

/// A grant in force, as `GET /v1/namespaces` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantEntry {
    /// The grant.
    #[serde(flatten)]
    pub grant: Grant,
    /// Where it comes from.
    pub source: GrantSource,
}

/// Why a grant or a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NamespaceError(pub String);

fn refuse(message: impl Into<String>) -> NamespaceError {
    NamespaceError(message.into())
}

impl Grant {
    /// A grant, checked ([`Grant::validate`]).
    pub fn new(principal: impl Into<String>, right: Right, value: impl Into<String>) -> Result<Grant, NamespaceError> {
        let grant = Grant { principal: principal.into(), right, value: value.into() };
        grant.validate()?;
        Ok(grant)
    }

    /// Checks the principal (an owner as manifests allow it, or `group:` and a name) and the
    /// value (a clean absolute directory ending in `/` for path rights, an annex name).
    pub fn validate(&self) -> Result<(), NamespaceError> {
        let p = &self.principal;
        if p.is_empty() || p.len() > 128 || p.chars().any(char::is_control) {
            return Err(refuse("the principal must be 1-128 printable characters"));
        }
        if let Some(group) = p.strip_prefix(GROUP_PREFIX) {
            check_name(group).map_err(|e| refuse(format!("group {e}")))?;
        }
        let v = &self.value;
        if v.len() > MAX_GRANT_VALUE {
            return Err(refuse(format!("the value is longer than {MAX_GRANT_VALUE} bytes")));
        }
        match self.right {
            Right::Annex => check_name(v).map_err(|e| refuse(format!("annex {e}"))),
            Right::Group => check_name(v).map_err(|e| refuse(format!("group {e}"))),
            Right::Read | Right::Write | Right::Replace => {
                if is_clean_abs_path(v) && v.ends_with('/') {
                    Ok(())
                } else {
                    Err(refuse(format!(
                        "{v:?} is not a directory: a {} grant names a clean absolute path ending in '/'",
                        self.right
                    )))
                }
            }
        }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.principal, self.right, self.value)
    }
}

/// What one owner (with its accounting group, if any) may do: the union of its grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace {
    read: Vec<String>,
    write: Vec<String>,
    replace: Vec<String>,
    annexes: Vec<String>,
    /// Accounting groups the owner may charge (its own `group` grants only).
    groups: Vec<String>,
}

/// Whether `path` (a clean absolute path) lies under one of `dirs` (each ending in `/`).
fn under(dirs: &[String], path: &str) -> bool {
    dirs.iter().any(|d| path.starts_with(d.as_str()))
}

impl Namespace {
    /// The namespace of `owner`, widened by its accounting `group`'s grants when it has one.
    pub fn of<'a>(grants: impl IntoIterator<Item = &'a Grant>, owner: &str, group: Option<&str>) -> Namespace {
        let group = group.map(|g| format!("{GROUP_PREFIX}{g}"));
        let mut ns = Namespace::default();
        for g in grants {
            if g.principal != owner && group.as_deref() != Some(g.principal.as_str()) {
                continue;
            }
            let list = match g.right {
                Right::Read => &mut ns.read,
                Right::Write => &mut ns.write,
                Right::Replace => &mut ns.replace,
                Right::Annex => &mut ns.annexes,
                // A group grants no membership in another group.
                Right::Group if g.principal != owner => continue,
                Right::Group => &mut ns.groups,
            };
            list.push(g.value.clone());
        }
        ns
    }

    /// Whether nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.read.is_empty()
            && self.write.is_empty()
            && self.replace.is_empty()
            && self.annexes.is_empty()
            && self.groups.is_empty()
    }

    /// Whether the file `path` may trigger a function and be read.
    pub fn may_read(&self, path: &str) -> bool {
        is_clean_abs_path(path) && under(&self.read, path)
    }

    /// Whether outputs may be written into the directory `dir`.
    pub fn may_write(&self, dir: &str) -> bool {
        is_clean_abs_path(dir) && under(&self.write, dir)
    }

    /// Whether files in the directory `dir` may be replaced (it must be writable too).
    pub fn may_replace(&self, dir: &str) -> bool {
        self.may_write(dir) && under(&self.replace, dir)
    }

    /// Whether jobs may ask for `annex`.
    pub fn may_use_annex(&self, annex: &str) -> bool {
        self.annexes.iter().any(|a| a == annex)
    }

    /// Whether runs may be charged to the accounting group `group`.
    pub fn may_charge_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// The read directories (each ending in `/`): where the owner's functions may fire, so
    /// what the gateway's lane of this owner reads (`proto::path_filters`).
    pub fn read_dirs(&self) -> &[String] {
        &self.read
    }

    /// The read directories, for messages.
    fn readable(&self) -> String {
        if self.read.is_empty() { "nothing".into() } else { self.read.join(", ") }
    }

    /// Checks a manifest against this namespace (its owner's): the trigger may fire only inside
    /// the read namespace (a trigger on no file fires on no path), the output directory lies in
    /// the write namespace (and in the replace namespace when it asks to replace files), the
    /// annex is granted. The error says which part is outside and what the namespace holds.
    pub fn confine(&self, m: &FunctionManifest) -> Result<(), NamespaceError> {
        if !m.trigger.on_no_file() {
            self.confine_trigger(m)?;
        }
        if let Some(r) = m.inputs.refs.iter().find(|r| !self.may_read(r)) {
            return Err(refuse(format!(
                "the reference input {r} is outside {}'s read namespace ({})",
                m.owner,
                self.readable()
            )));
        }
        let dir = &m.outputs.dir;
        if !self.may_write(dir) {
            return Err(refuse(format!(
                "the output directory {dir} is outside {}'s write namespace ({})",
                m.owner,
                if self.write.is_empty() { "nothing".into() } else { self.write.join(", ") }
            )));
        }
        if m.outputs.replace && !self.may_replace(dir) {
            return Err(refuse(format!("{} may not replace files in {dir} (no replace grant there)", m.owner)));
        }
        if let Some(annex) = &m.annex
            && !self.may_use_annex(annex)
        {
            return Err(refuse(format!("{} may not use annex {annex:?} (no annex grant)", m.owner)));
        }
        Ok(())
    }

    /// The trigger of `m` fires only inside the read namespace.
    fn confine_trigger(&self, m: &FunctionManifest) -> Result<(), NamespaceError> {
        let rule = m.trigger.compile().map_err(|e| refuse(format!("trigger: {e}")))?;
        let Some(bound) = rule.path_bound() else {
            return Err(refuse(format!(
                "the trigger {} could fire on any path: bound it with a path glob or a `path prefix` test inside \
                 {}'s read namespace ({})",
                m.trigger,
                m.owner,
                self.readable()
            )));
        };
        for prefix in &bound {
            if !self.bound_inside(prefix) {
                return Err(refuse(format!(
                    "the trigger {} could fire on paths under {prefix:?}, outside {}'s read namespace ({})",
                    m.trigger,
                    m.owner,
                    self.readable()
                )));
            }
        }
        Ok(())
    }

    /// Whether every path starting with `prefix` is readable: `prefix` (clean up to its last
    /// `/`) extends a read directory.
    fn bound_inside(&self, prefix: &str) -> bool {
        let dir = &prefix[..prefix.rfind('/').map_or(0, |i| i + 1)];
        is_clean_abs_path(dir) && under(&self.read, prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;
    use crate::manifest::{Outputs, Trigger};
    use crate::resources::Resources;

    fn grants() -> Vec<Grant> {
        [
            ("alice", Right::Read, "/data/alice/"),
            ("alice", Right::Write, "/data/alice/out/"),
            ("alice", Right::Annex, "alice-hpc"),
            ("group:atlas", Right::Read, "/data/atlas/"),
            ("bob", Right::Read, "/data/bob/"),
            ("bob", Right::Write, "/data/bob/"),
            ("bob", Right::Replace, "/data/bob/sums/"),
        ]
        .into_iter()
        .map(|(p, r, v)| Grant::new(p, r, v).expect("grant"))
        .collect()
    }

    fn manifest(owner: &str, trigger: Trigger, out: &str) -> FunctionManifest {
        FunctionManifest {
            runtime: Default::default(),
            command: Vec::new(),
            handler: false,
            retry: None,
            name: "f".into(),
            owner: owner.into(),
            module: Digest::of(b"m"),
            trigger,
            resources: Resources::default(),
            outputs: Outputs::into_dir(out),
            args: vec![],
            env: vec![],
            annex: None,
            class: None,
            limits: Default::default(),
            group: None,
            secrets: Default::default(),
            webhook: None,
            max_concurrent: None,
            inputs: Default::default(),
            vacate_s: None,
            checkpoint: None,
        }
    }

    fn rule(r: &str) -> Trigger {
        Trigger::on_rule(r)
    }

    #[test]
    fn grants_are_checked() {
        assert!(Grant::new("alice", Right::Read, "/data/alice").is_err(), "a directory ends in /");
        assert!(Grant::new("alice", Right::Read, "data/").is_err());
        assert!(Grant::new("alice", Right::Write, "/data/../etc/").is_err());
        assert!(Grant::new("alice", Right::Annex, "Bad Name").is_err());
        assert!(Grant::new("group:", Right::Read, "/data/").is_err());
        assert!(Grant::new("", Right::Read, "/data/").is_err());
        assert!(Grant::new("alice", Right::Read, "/").is_ok(), "the whole storage is a directory");
        assert_eq!(Right::parse("replace"), Some(Right::Replace));
        assert_eq!(Right::parse("admin"), None);
    }

    #[test]
    fn a_namespace_holds_the_owners_and_its_groups_grants_only() {
        let g = grants();
        let alice = Namespace::of(&g, "alice", None);
        assert!(alice.may_read("/data/alice/x.dat") && !alice.may_read("/data/atlas/x.dat"));
        assert!(!alice.may_read("/data/alicex/y"), "a directory, not a string prefix");
        assert!(!alice.may_read("/data/alice/../bob/x"), "an unclean path is outside");
        let with_group = Namespace::of(&g, "alice", Some("atlas"));
        assert!(with_group.may_read("/data/atlas/x.dat"));
        assert!(Namespace::of(&g, "mallory", None).is_empty());
        assert!(alice.may_write("/data/alice/out/") && !alice.may_write("/data/alice/"));
        assert!(!alice.may_replace("/data/alice/out/"));
        let bob = Namespace::of(&g, "bob", None);
        assert!(bob.may_replace("/data/bob/sums/") && !bob.may_replace("/data/bob/"));
        assert!(alice.may_use_annex("alice-hpc") && !bob.may_use_annex("alice-hpc"));
    }

    /// Membership of an accounting group is the owner's own `group` grant; a group's grant of
    /// another group makes no one a member of it.
    #[test]
    fn only_an_owners_own_group_grant_lets_it_charge_a_group() {
        let mut g = grants();
        g.push(Grant::new("alice", Right::Group, "atlas").expect("grant"));
        g.push(Grant::new("group:atlas", Right::Group, "cms").expect("grant"));
        let alice = Namespace::of(&g, "alice", None);
        assert!(alice.may_charge_group("atlas") && !alice.may_charge_group("cms"));
        let with_group = Namespace::of(&g, "alice", Some("atlas"));
        assert!(!with_group.may_charge_group("cms"), "a group's group grant counts for no one");
        assert!(!Namespace::of(&g, "bob", None).may_charge_group("atlas"));
        assert!(Grant::new("alice", Right::Group, "Not A Name").is_err());
        assert_eq!(Right::parse("group"), Some(Right::Group));
    }

    #[test]
    fn triggers_must_be_bounded_inside_the_read_namespace() {
        let g = grants();
        let alice = Namespace::of(&g, "alice", None);
        let ok = |t: Trigger| alice.confine(&manifest("alice", t, "/data/alice/out/"));
        assert!(ok(Trigger::on_path("/data/alice/**")).is_ok());
        assert!(ok(Trigger::on_path("/data/alice/raw/*.h5")).is_ok());
        assert!(ok(rule(r#"path prefix "/data/alice/" and size > 1MB"#)).is_ok());
        assert!(ok(rule(r#"size > 1MB and path glob "/data/alice/a/**""#)).is_ok());
        assert!(ok(rule(r#"path prefix "/data/alice/a/" or path glob "/data/alice/b/**""#)).is_ok());
        assert!(ok(rule(r#"path prefix "/data/" and path prefix "/data/alice/""#)).is_ok(), "and: the tighter side");
        let mut both = Trigger::on_path("/data/**");
        both.rule = Some(r#"path prefix "/data/alice/""#.into());
        assert!(ok(both).is_ok(), "a glob and a rule: both must hold");

        let refused = |t: Trigger| ok(t).expect_err("refused").0;
        let e = refused(Trigger::on_path("/data/**"));
        assert!(e.contains("outside alice's read namespace (/data/alice/)"), "{e}");
        assert!(refused(Trigger::on_path("/data/al*/x")).contains("\"/data/al\""));
        assert!(refused(rule(r#"path prefix "/data/alice""#)).contains("outside"), "/data/alicex matches");
        assert!(refused(rule("size > 1MB")).contains("could fire on any path"));
        assert!(refused(rule(r#"owner == "alice""#)).contains("could fire on any path"));
        assert!(refused(rule(r#"not path prefix "/data/bob/""#)).contains("any path"));
        assert!(refused(rule(r#"path prefix "/data/alice/" or size > 1MB"#)).contains("any path"));
        assert!(refused(rule(r#"path prefix "/data/alice/../bob/""#)).contains("outside"));
        assert!(refused(Trigger::on_path("/data/alice/../bob/**")).contains("outside"));
        assert!(refused(rule(r#"path suffix "/data/alice/x""#)).contains("any path"));
    }

    #[test]
    fn outputs_and_annexes_must_be_granted() {
        let g = grants();
        let alice = Namespace::of(&g, "alice", None);
        let t = || Trigger::on_path("/data/alice/**");
        let e = alice.confine(&manifest("alice", t(), "/data/bob/")).expect_err("foreign output").0;
        assert!(e.contains("output directory /data/bob/ is outside alice's write namespace"), "{e}");
        let mut m = manifest("alice", t(), "/data/alice/out/");
        m.outputs.replace = true;
        assert!(alice.confine(&m).expect_err("no replace").0.contains("may not replace"));
        let mut m = manifest("alice", t(), "/data/alice/out/");
        m.annex = Some("bob-hpc".into());
        assert!(alice.confine(&m).expect_err("annex").0.contains("annex \"bob-hpc\""));
        m.annex = Some("alice-hpc".into());
        assert!(alice.confine(&m).is_ok());
        let bob = Namespace::of(&g, "bob", None);
        let mut m = manifest("bob", Trigger::on_path("/data/bob/in/**"), "/data/bob/sums/");
        m.outputs.replace = true;
        assert!(bob.confine(&m).is_ok());
        let empty = Namespace::of(&g, "mallory", None);
        let e = empty.confine(&manifest("mallory", Trigger::on_path("/data/**"), "/data/raw/")).expect_err("x").0;
        assert!(e.contains("read namespace (nothing)"), "{e}");
    }
}
