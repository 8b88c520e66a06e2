//! Trigger rules: which [`StorageEvent`]s fire a function.
//!
//! A rule is a boolean expression over one event, written as text in the function's manifest
//! (`trigger.rule`), checked when the function is registered and compiled once into a [`Rule`]
//! that the gateway evaluates on every event. Examples:
//!
//! ```text
//! path glob "/data/raw/**" and name suffix ".h5"
//! path prefix "/data/run42/" and size >= 1MB and not name glob "*.tmp"
//! kind in ["write", "restore"] and class == "exp:raw"
//! (owner == "alice" or owner == "bob") and size in 1kB..10GiB
//! source == "xrootd-notify" and type == "closew" and path suffix ".root"
//! ```
//!
//! # Syntax
//!
//! ```text
//! rule   := or
//! or     := and ("or" and)*
//! and    := unary ("and" unary)*
//! unary  := "not" unary | "(" rule ")" | test
//! test   := "path" ("glob" | "prefix" | "suffix") STRING
//!         | "name" ("glob" | "suffix") STRING
//!         | FIELD ("==" | "!=") STRING                    FIELD: kind, type, source, class, owner
//!         | FIELD "in" "[" STRING ("," STRING)* "]"
//!         | "class" "glob" STRING
//!         | "size" ("<" | "<=" | ">" | ">=" | "==" | "!=") SIZE
//!         | "size" "in" SIZE ".." SIZE                     (both ends included)
//! SIZE   := digits, then optionally a unit, with or without a space: B, kB, MB, GB, TB
//!           (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024); units ignore case
//! STRING := "…" with the escapes \" and \\ only
//! ```
//!
//! `not` binds tightest, then `and`, then `or`: `a or b and not c` is `a or (b and (not c))`.
//! Keywords and field names ignore ASCII case; string comparisons are exact.
//!
//! # Tests
//!
//! - `path glob`: the whole storage path against a glob (absolute; `*` stays within one path
//!   segment, `**` spans segments, `\` escapes), as a plain `trigger.path` does;
//!   `path prefix` / `path suffix`: plain string prefix or suffix of the path (a prefix must be
//!   absolute; end it with `/` to mean a directory: `"/data/raw"` also matches `/data/rawx`).
//! - `name glob` / `name suffix`: the same on the last path segment (the file name); a name
//!   glob cannot contain `/`.
//! - `kind`: what happened, normalized ([`EventKind::as_str`]: `write`, `create`, `remove`,
//!   `read`, `store`, `restore`, `hit`, `replica-remove`, `other`); any other literal is refused.
//!   `type`: the producer's own message type (dCache `transfer`, XRootD `closew`, …).
//!   `source`: the producer kind ([`SourceKind::as_str`]: `dcache-billing`, `dcache-sse`,
//!   `xrootd-notify`, `cloudevents`); any other literal is refused.
//!   `class`: the dCache storage class (`exp:raw`); `class glob` matches it against a glob in
//!   which `*` spans everything. `owner`: the principal that caused the event.
//! - `size`: the file's size in bytes.
//!
//! # Three-valued evaluation
//!
//! Not every source says everything: an event may lack its size, storage class or owner. A
//! test on an attribute the event lacks is *undefined*, as in the scheduler's ClassAd
//! requirements: `not undefined` is undefined; `false and undefined` is false and
//! `true or undefined` true, otherwise undefined propagates. **A rule fires only when it is
//! true**: `size < 1MB` fires on no event without a size, and neither does `not size >= 1MB`.
//!
//! # The default kind
//!
//! A rule that mentions neither `kind` nor `type` fires only on writes, as if it were
//! `kind == "write" and (…)`: a plain path rule does not fire on removes, reads or stages. To
//! fire on anything else, say so (`kind == "remove"`, `type == "IN_ATTRIB"`).
//!
//! # Overlaps and fan-out
//!
//! Each function's rule is evaluated on each event independently: one event fires every
//! function whose rule is true, once each, however much their rules overlap.
//!
//! # Limits and errors
//!
//! A rule is at most [`MAX_RULE_BYTES`] long, nests parentheses and `not` at most
//! [`MAX_DEPTH`] deep (so neither parsing nor evaluation recurses deeper), and lists at most
//! [`MAX_LIST_ITEMS`] strings in one `in [...]`. A refused rule's [`RuleError`] names the
//! column (in characters, from 1, counting a line break as one) where the problem is, e.g.
//! `at column 11: expected a string after "glob", found "and"`. No input makes parsing or
//! evaluation panic.

mod eval;
mod parse;
#[cfg(test)]
mod tests;

use crate::event::{EventKind, SourceKind, StorageEvent};
use eval::{Expr, Test};
use parse::{Parser, Tok, lex};
use std::fmt;

/// Longest rule text, in bytes.
pub const MAX_RULE_BYTES: usize = 4096;
/// Deepest nesting of parentheses and `not`.
pub const MAX_DEPTH: usize = 64;
/// Most strings in one `in [...]` list.
pub const MAX_LIST_ITEMS: usize = 256;

/// Every source kind, for validating `source` literals.
const SOURCES: [SourceKind; 5] = [
    SourceKind::DcacheBilling,
    SourceKind::DcacheSse,
    SourceKind::XrootdNotify,
    SourceKind::Cloudevents,
    SourceKind::Backfill,
];

/// Why a rule was refused: where and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at column {column}: {message}")]
pub struct RuleError {
    /// Character column of the problem in the rule text, from 1.
    pub column: usize,
    /// What is wrong there.
    pub message: String,
}

/// A three-valued truth: what a rule says about one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truth {
    /// The rule holds: the function fires.
    True,
    /// The rule does not hold.
    False,
    /// The rule depends on an attribute the event lacks (size, storage class, owner).
    Undefined,
}

impl Truth {
    fn of(b: bool) -> Truth {
        if b { Truth::True } else { Truth::False }
    }

    fn not(self) -> Truth {
        match self {
            Truth::True => Truth::False,
            Truth::False => Truth::True,
            Truth::Undefined => Truth::Undefined,
        }
    }
}

/// A compiled rule: parse once with [`Rule::parse`], evaluate on every event.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The expression.
    expr: Expr,
    /// Whether the rule mentions neither `kind` nor `type`, and so fires only on writes.
    writes_only: bool,
    /// The rule's text, for display.
    text: String,
}

impl Rule {
    /// Parses and checks `text`. See the module docs for the language.
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        if text.len() > MAX_RULE_BYTES {
            // Point at the first character past the limit.
            let column = text.char_indices().take_while(|(i, _)| *i < MAX_RULE_BYTES).count() + 1;
            return Err(RuleError {
                column,
                message: format!("the rule is {} bytes, more than {MAX_RULE_BYTES}", text.len()),
            });
        }
        let mut p = Parser { toks: lex(text)?, pos: 0, depth: 0, mentions_kind: false };
        let expr = p.or()?;
        let t = p.peek();
        match t.tok {
            Tok::End => {}
            Tok::RParen => return Err(err(t.col, "\")\" closes no \"(\"")),
            _ => return Err(err(t.col, format!("expected \"and\", \"or\" or the end, found {}", t.describe()))),
        }
        Ok(Rule { expr, writes_only: !p.mentions_kind, text: text.to_owned() })
    }

    /// The rule `path glob "<glob>"`: what a plain `trigger.path` means.
    pub fn path_glob(glob: &str) -> Result<Rule, RuleError> {
        let matcher = crate::glob::compile_glob(glob).map_err(|e| err(1, format!("bad path glob: {e}")))?;
        Ok(Rule {
            expr: Expr::Test(Test::PathGlob(matcher)),
            writes_only: true,
            text: format!("path glob {}", quote(glob)),
        })
    }

    /// Both rules: true where both are. Fires only on writes when neither mentions `kind` or
    /// `type`.
    pub fn and(self, other: Rule) -> Rule {
        Rule {
            text: format!("{} and ({})", self.text, other.text),
            writes_only: self.writes_only && other.writes_only,
            expr: Expr::And(vec![self.expr, other.expr]),
        }
    }

    /// What the rule says about `event`, in three values (the default kind included).
    pub fn evaluate(&self, event: &StorageEvent) -> Truth {
        if self.writes_only && event.kind != EventKind::Write {
            return Truth::False;
        }
        self.expr.eval(event)
    }

    /// Whether `event` fires the rule: only when it is exactly true.
    pub fn matches(&self, event: &StorageEvent) -> bool {
        self.evaluate(event) == Truth::True
    }

    /// The rule's text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Path prefixes that bound every event this rule fires on: when the rule is true for an
    /// event, the event's path starts with one of them. `None` when the rule does not bound the
    /// path (it could fire anywhere). Sound, not complete: `and` takes the tightest bounded
    /// side, `or` needs every side bounded, `not` and tests on other attributes bound nothing;
    /// a glob bounds by its literal text before the first wildcard. What [`crate::namespace`]
    /// checks a trigger against.
    pub fn path_bound(&self) -> Option<Vec<String>> {
        self.expr.path_bound()
    }

    /// The directories of [`Rule::path_bound`]: each prefix up to its last `/`, sorted, without
    /// repeats; every path the rule fires on lies below one. `None` as for the prefixes.
    pub fn bound_dirs(&self) -> Option<Vec<String>> {
        let mut dirs: Vec<String> =
            self.path_bound()?.iter().map(|p| p[..p.rfind('/').map_or(0, |i| i + 1)].to_owned()).collect();
        dirs.sort();
        dirs.dedup();
        Some(dirs)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// `s` as a rule string literal.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn err(column: usize, message: impl Into<String>) -> RuleError {
    RuleError { column, message: message.into() }
}
