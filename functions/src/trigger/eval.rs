//! The compiled form of a rule and its three-valued evaluation on one event: the expression
//! tree ([`Expr`]), its tests, and the path bound a rule implies ([`Expr::path_bound`]).
//!
//! Must not know: the rule text and its syntax (the parser's), manifests, namespaces.

use super::{RuleError, SOURCES, Truth, err, quote};
use crate::event::{EventKind, StorageEvent};
use globset::GlobMatcher;

/// A parsed rule. `and` and `or` chains are flat lists, so the tree is only as deep as the
/// nesting of parentheses and `not` (at most [`MAX_DEPTH`](super::MAX_DEPTH)).
#[derive(Debug, Clone)]
pub(super) enum Expr {
    Test(Test),
    Not(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

impl Expr {
    pub(super) fn eval(&self, e: &StorageEvent) -> Truth {
        match self {
            Expr::Test(t) => t.eval(e),
            Expr::Not(x) => x.eval(e).not(),
            Expr::And(xs) => chain(xs, e, Truth::False),
            Expr::Or(xs) => chain(xs, e, Truth::True),
        }
    }
}

impl Expr {
    /// See [`Rule::path_bound`](super::Rule::path_bound).
    pub(super) fn path_bound(&self) -> Option<Vec<String>> {
        match self {
            Expr::Test(Test::PathGlob(g)) => Some(vec![glob_literal_prefix(g.glob().glob()).to_owned()]),
            Expr::Test(Test::PathPrefix(p)) => Some(vec![p.clone()]),
            Expr::Test(_) | Expr::Not(_) => None,
            // True only where every part is true: any bounded part bounds it; the longest
            // single bound is the tightest of them.
            Expr::And(xs) => xs
                .iter()
                .filter_map(Expr::path_bound)
                .min_by_key(|b| (b.len(), std::cmp::Reverse(b.iter().map(String::len).min().unwrap_or(0)))),
            // True where any part is true: bounded only if every part is.
            Expr::Or(xs) => {
                let mut all = Vec::new();
                for x in xs {
                    all.extend(x.path_bound()?);
                }
                Some(all)
            }
        }
    }
}

/// The text of `glob` before its first wildcard, class, alternation or escape: every path the
/// glob matches starts with it (matching is case-sensitive; see [`crate::glob::compile_glob`]).
fn glob_literal_prefix(glob: &str) -> &str {
    let end = glob.find(['*', '?', '[', '{', '\\']).unwrap_or(glob.len());
    &glob[..end]
}

/// An `and` (`decisive` false) or `or` (`decisive` true) chain: the decisive value wins
/// whatever else is undefined.
fn chain(xs: &[Expr], e: &StorageEvent, decisive: Truth) -> Truth {
    let mut undefined = false;
    for x in xs {
        match x.eval(e) {
            t if t == decisive => return decisive,
            Truth::Undefined => undefined = true,
            _ => {}
        }
    }
    if undefined { Truth::Undefined } else { decisive.not() }
}

/// An attribute compared with strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    Kind,
    Type,
    Source,
    Class,
    Owner,
}

impl Field {
    pub(super) fn lookup(word: &str) -> Option<Field> {
        [Field::Kind, Field::Type, Field::Source, Field::Class, Field::Owner]
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(word))
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Field::Kind => "kind",
            Field::Type => "type",
            Field::Source => "source",
            Field::Class => "class",
            Field::Owner => "owner",
        }
    }

    /// The event's value, `None` when it lacks it.
    pub(super) fn value(self, e: &StorageEvent) -> Option<&str> {
        match self {
            Field::Kind => Some(e.kind.as_str()),
            Field::Type => Some(&e.msg_type),
            Field::Source => Some(e.source.kind.as_str()),
            Field::Class => e.storage_class.as_deref(),
            Field::Owner => e.owner.as_deref(),
        }
    }

    /// Refuses a literal the field can never have.
    pub(super) fn check(self, literal: &str, col: usize) -> Result<(), RuleError> {
        let known: Vec<&str> = match self {
            Field::Kind => EventKind::ALL.iter().map(|k| k.as_str()).collect(),
            Field::Source => SOURCES.iter().map(|s| s.as_str()).collect(),
            Field::Type | Field::Class | Field::Owner => return Ok(()),
        };
        if known.contains(&literal) {
            return Ok(());
        }
        Err(err(col, format!("{} is not a {}; one of: {}", quote(literal), self.name(), known.join(", "))))
    }
}

/// A size comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SizeOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

/// One test on one attribute.
#[derive(Debug, Clone)]
pub(super) enum Test {
    PathGlob(GlobMatcher),
    PathPrefix(String),
    PathSuffix(String),
    NameGlob(GlobMatcher),
    NameSuffix(String),
    ClassGlob(GlobMatcher),
    /// `==` (one value), `in` (several), or `!=` (`negate`, one value).
    Is {
        field: Field,
        values: Vec<String>,
        negate: bool,
    },
    Size(SizeOp, u64),
    /// Both ends included.
    SizeIn(u64, u64),
}

impl Test {
    pub(super) fn eval(&self, e: &StorageEvent) -> Truth {
        let name = || e.path.rsplit('/').next().unwrap_or("");
        match self {
            Test::PathGlob(g) => Truth::of(g.is_match(&e.path)),
            Test::PathPrefix(p) => Truth::of(e.path.starts_with(p.as_str())),
            Test::PathSuffix(s) => Truth::of(e.path.ends_with(s.as_str())),
            Test::NameGlob(g) => Truth::of(g.is_match(name())),
            Test::NameSuffix(s) => Truth::of(name().ends_with(s.as_str())),
            Test::ClassGlob(g) => e.storage_class.as_deref().map_or(Truth::Undefined, |c| Truth::of(g.is_match(c))),
            Test::Is { field, values, negate } => match field.value(e) {
                None => Truth::Undefined,
                Some(v) => Truth::of(values.iter().any(|x| x == v) != *negate),
            },
            Test::Size(op, n) => match e.size {
                None => Truth::Undefined,
                Some(s) => Truth::of(match op {
                    SizeOp::Lt => s < *n,
                    SizeOp::Le => s <= *n,
                    SizeOp::Gt => s > *n,
                    SizeOp::Ge => s >= *n,
                    SizeOp::Eq => s == *n,
                    SizeOp::Ne => s != *n,
                }),
            },
            Test::SizeIn(lo, hi) => e.size.map_or(Truth::Undefined, |s| Truth::of(*lo <= s && s <= *hi)),
        }
    }
}
