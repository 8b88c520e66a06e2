// Long because it holds lexer, parser, evaluator and path bound of one small language; kept whole until issue 19 splits it along its layers.
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

use crate::event::{EventKind, SourceKind, StorageEvent};
use globset::GlobMatcher;
use std::fmt;

/// Longest rule text, in bytes.
pub const MAX_RULE_BYTES: usize = 4096;
/// Deepest nesting of parentheses and `not`.
pub const MAX_DEPTH: usize = 64;
/// Most strings in one `in [...]` list.
pub const MAX_LIST_ITEMS: usize = 256;

/// Every source kind, for validating `source` literals.
const SOURCES: [SourceKind; 4] =
    [SourceKind::DcacheBilling, SourceKind::DcacheSse, SourceKind::XrootdNotify, SourceKind::Cloudevents];

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
        let matcher = crate::proto::compile_glob(glob).map_err(|e| err(1, format!("bad path glob: {e}")))?;
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

/// A parsed rule. `and` and `or` chains are flat lists, so the tree is only as deep as the
/// nesting of parentheses and `not` (at most [`MAX_DEPTH`]).
#[derive(Debug, Clone)]
enum Expr {
    Test(Test),
    Not(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

impl Expr {
    fn eval(&self, e: &StorageEvent) -> Truth {
        match self {
            Expr::Test(t) => t.eval(e),
            Expr::Not(x) => x.eval(e).not(),
            Expr::And(xs) => chain(xs, e, Truth::False),
            Expr::Or(xs) => chain(xs, e, Truth::True),
        }
    }
}

impl Expr {
    /// See [`Rule::path_bound`].
    fn path_bound(&self) -> Option<Vec<String>> {
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
/// glob matches starts with it (matching is case-sensitive; see [`crate::proto::compile_glob`]).
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
enum Field {
    Kind,
    Type,
    Source,
    Class,
    Owner,
}

impl Field {
    fn lookup(word: &str) -> Option<Field> {
        [Field::Kind, Field::Type, Field::Source, Field::Class, Field::Owner]
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(word))
    }

    fn name(self) -> &'static str {
        match self {
            Field::Kind => "kind",
            Field::Type => "type",
            Field::Source => "source",
            Field::Class => "class",
            Field::Owner => "owner",
        }
    }

    /// The event's value, `None` when it lacks it.
    fn value(self, e: &StorageEvent) -> Option<&str> {
        match self {
            Field::Kind => Some(e.kind.as_str()),
            Field::Type => Some(&e.msg_type),
            Field::Source => Some(e.source.kind.as_str()),
            Field::Class => e.storage_class.as_deref(),
            Field::Owner => e.owner.as_deref(),
        }
    }

    /// Refuses a literal the field can never have.
    fn check(self, literal: &str, col: usize) -> Result<(), RuleError> {
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
enum SizeOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

/// One test on one attribute.
#[derive(Debug, Clone)]
enum Test {
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
    fn eval(&self, e: &StorageEvent) -> Truth {
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

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// A keyword or field name: `[A-Za-z_][A-Za-z0-9_]*`.
    Word(String),
    Str(String),
    /// Digits, with the letters that follow them directly (a unit), if any.
    Num(u64, Option<String>),
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    DotDot,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    End,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    /// Character column of its first character, from 1.
    col: usize,
    /// Its text, for error messages.
    text: String,
}

impl Token {
    fn describe(&self) -> String {
        match &self.tok {
            Tok::End => "the end".into(),
            Tok::Str(_) => "a string".into(),
            _ => {
                let cut: String = self.text.chars().take(32).collect();
                if cut.len() < self.text.len() { format!("{}…", quote(&cut)) } else { quote(&cut) }
            }
        }
    }

    fn is_word(&self, w: &str) -> bool {
        matches!(&self.tok, Tok::Word(x) if x.eq_ignore_ascii_case(w))
    }
}

fn lex(src: &str) -> Result<Vec<Token>, RuleError> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let col = i + 1;
        let next = chars.get(i + 1).copied();
        let (tok, len) = match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '(' => (Tok::LParen, 1),
            ')' => (Tok::RParen, 1),
            '[' => (Tok::LBracket, 1),
            ']' => (Tok::RBracket, 1),
            ',' => (Tok::Comma, 1),
            '.' if next == Some('.') => (Tok::DotDot, 2),
            '=' if next == Some('=') => (Tok::Eq, 2),
            '!' if next == Some('=') => (Tok::Ne, 2),
            '<' if next == Some('=') => (Tok::Le, 2),
            '<' => (Tok::Lt, 1),
            '>' if next == Some('=') => (Tok::Ge, 2),
            '>' => (Tok::Gt, 1),
            '=' => return Err(err(col, "expected \"==\"; a single \"=\" is not an operator")),
            '!' => return Err(err(col, "expected \"!=\"; write \"not\" to negate")),
            '&' => return Err(err(col, "unexpected \"&\"; write \"and\"")),
            '|' => return Err(err(col, "unexpected \"|\"; write \"or\"")),
            '"' => {
                let (s, len) = lex_string(&chars, i)?;
                (Tok::Str(s), len)
            }
            '0'..='9' => {
                let digits = chars[i..].iter().take_while(|c| c.is_ascii_digit()).count();
                let mut n: u64 = 0;
                for d in &chars[i..i + digits] {
                    let digit = u64::from(d.to_digit(10).unwrap_or(0));
                    n = n
                        .checked_mul(10)
                        .and_then(|n| n.checked_add(digit))
                        .ok_or_else(|| err(col, "the number is too large"))?;
                }
                let unit_len = chars[i + digits..].iter().take_while(|c| c.is_ascii_alphabetic()).count();
                let unit = (unit_len > 0).then(|| chars[i + digits..i + digits + unit_len].iter().collect::<String>());
                (Tok::Num(n, unit), digits + unit_len)
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let len = chars[i..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == '_').count();
                (Tok::Word(chars[i..i + len].iter().collect()), len)
            }
            c => return Err(err(col, format!("unexpected character {c:?}"))),
        };
        let text = match &tok {
            Tok::Str(_) => String::new(),
            _ => chars[i..i + len].iter().collect(),
        };
        out.push(Token { tok, col, text });
        i += len;
    }
    out.push(Token { tok: Tok::End, col: chars.len() + 1, text: String::new() });
    Ok(out)
}

/// The string literal whose opening quote is `chars[at]`: its value and its length in chars.
fn lex_string(chars: &[char], at: usize) -> Result<(String, usize), RuleError> {
    let mut value = String::new();
    let mut i = at + 1;
    while let Some(&c) = chars.get(i) {
        match c {
            '"' => return Ok((value, i + 1 - at)),
            '\\' => match chars.get(i + 1) {
                Some(&e @ ('"' | '\\')) => {
                    value.push(e);
                    i += 1;
                }
                _ => return Err(err(i + 1, "unknown escape: only \\\" and \\\\ are allowed")),
            },
            '\0' => return Err(err(i + 1, "a string cannot contain NUL")),
            c => value.push(c),
        }
        i += 1;
    }
    Err(err(at + 1, "unterminated string"))
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    /// Current nesting of parentheses and `not`.
    depth: usize,
    /// Whether a `kind` or `type` test was seen (no default kind then).
    mentions_kind: bool,
}

impl Parser {
    fn peek(&self) -> &Token {
        // `lex` ends the list with `End`, and `bump` never moves past it.
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if t.tok != Tok::End {
            self.pos += 1;
        }
        t
    }

    /// Enters one more level of nesting, at the `(` or `not` at `col`.
    fn enter(&mut self, col: usize) -> Result<(), RuleError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(err(col, format!("nested more than {MAX_DEPTH} deep")));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Expr, RuleError> {
        let mut items = vec![self.and()?];
        while self.peek().is_word("or") {
            self.bump();
            items.push(self.and()?);
        }
        Ok(if items.len() == 1 { items.remove(0) } else { Expr::Or(items) })
    }

    fn and(&mut self) -> Result<Expr, RuleError> {
        let mut items = vec![self.unary()?];
        while self.peek().is_word("and") {
            self.bump();
            items.push(self.unary()?);
        }
        Ok(if items.len() == 1 { items.remove(0) } else { Expr::And(items) })
    }

    fn unary(&mut self) -> Result<Expr, RuleError> {
        let t = self.bump();
        match &t.tok {
            Tok::Word(w) if w.eq_ignore_ascii_case("not") => {
                self.enter(t.col)?;
                let inner = self.unary()?;
                self.depth -= 1;
                Ok(Expr::Not(Box::new(inner)))
            }
            Tok::LParen => {
                self.enter(t.col)?;
                let inner = self.or()?;
                let close = self.bump();
                if close.tok != Tok::RParen {
                    return Err(err(
                        close.col,
                        format!("expected \")\" to close the \"(\" at column {}, found {}", t.col, close.describe()),
                    ));
                }
                self.depth -= 1;
                Ok(inner)
            }
            Tok::Word(w) if !t.is_word("and") && !t.is_word("or") => self.test(w, t.col).map(Expr::Test),
            _ => Err(err(t.col, format!("expected a test, \"not\" or \"(\", found {}", t.describe()))),
        }
    }

    /// The rest of the test that starts with the word `head` at `col`.
    fn test(&mut self, head: &str, col: usize) -> Result<Test, RuleError> {
        let head = head.to_ascii_lowercase();
        match head.as_str() {
            "path" => {
                let op = self.bump();
                let (s, at) = self.string_after(&op)?;
                if op.is_word("glob") {
                    crate::proto::compile_glob(&s)
                        .map(Test::PathGlob)
                        .map_err(|e| err(at, format!("bad path glob: {e}")))
                } else if op.is_word("prefix") {
                    if !s.starts_with('/') {
                        return Err(err(
                            at,
                            format!("the path prefix {} must be absolute (start with '/')", quote(&s)),
                        ));
                    }
                    Ok(Test::PathPrefix(s))
                } else if op.is_word("suffix") {
                    Ok(Test::PathSuffix(s))
                } else {
                    Err(expected(&op, "\"glob\", \"prefix\" or \"suffix\" after \"path\""))
                }
            }
            "name" => {
                let op = self.bump();
                if op.is_word("glob") {
                    let (s, at) = self.string_after(&op)?;
                    if s.contains('/') {
                        return Err(err(at, "a name glob matches the last path segment: it cannot contain '/'"));
                    }
                    glob(&s, true).map(Test::NameGlob).map_err(|e| err(at, format!("bad name glob: {e}")))
                } else if op.is_word("suffix") {
                    let (s, _) = self.string_after(&op)?;
                    Ok(Test::NameSuffix(s))
                } else {
                    Err(expected(&op, "\"glob\" or \"suffix\" after \"name\""))
                }
            }
            "size" => self.size_test(),
            _ => {
                let Some(field) = Field::lookup(&head) else {
                    return Err(err(
                        col,
                        format!(
                            "unknown test {}; a test starts with path, name, kind, type, source, class, owner or size",
                            quote(&head)
                        ),
                    ));
                };
                if matches!(field, Field::Kind | Field::Type) {
                    self.mentions_kind = true;
                }
                let op = self.bump();
                match op.tok {
                    Tok::Eq | Tok::Ne => {
                        let (s, at) = self.string_after(&op)?;
                        field.check(&s, at)?;
                        Ok(Test::Is { field, values: vec![s], negate: op.tok == Tok::Ne })
                    }
                    _ if op.is_word("in") => Ok(Test::Is { field, values: self.list(field)?, negate: false }),
                    _ if op.is_word("glob") && field == Field::Class => {
                        let (s, at) = self.string_after(&op)?;
                        glob(&s, false).map(Test::ClassGlob).map_err(|e| err(at, format!("bad class glob: {e}")))
                    }
                    _ if field == Field::Class => {
                        Err(expected(&op, "\"==\", \"!=\", \"in\" or \"glob\" after \"class\""))
                    }
                    _ => Err(expected(&op, &format!("\"==\", \"!=\" or \"in\" after {}", quote(field.name())))),
                }
            }
        }
    }

    /// A string literal after `op`: its value and column.
    fn string_after(&mut self, op: &Token) -> Result<(String, usize), RuleError> {
        let t = self.bump();
        match t.tok {
            Tok::Str(s) => Ok((s, t.col)),
            _ => Err(err(t.col, format!("expected a string after {}, found {}", op.describe(), t.describe()))),
        }
    }

    /// `[ STRING ("," STRING)* ]`, each checked for `field`.
    fn list(&mut self, field: Field) -> Result<Vec<String>, RuleError> {
        let open = self.bump();
        if open.tok != Tok::LBracket {
            return Err(expected(&open, "\"[\" after \"in\""));
        }
        let mut values = Vec::new();
        let mut sep = open;
        loop {
            let (s, at) = self.string_after(&sep)?;
            if values.len() == MAX_LIST_ITEMS {
                return Err(err(at, format!("a list holds at most {MAX_LIST_ITEMS} strings")));
            }
            field.check(&s, at)?;
            values.push(s);
            let t = self.bump();
            match t.tok {
                Tok::Comma => sep = t,
                Tok::RBracket => return Ok(values),
                _ => return Err(expected(&t, "\",\" or \"]\" in a list")),
            }
        }
    }

    fn size_test(&mut self) -> Result<Test, RuleError> {
        let t = self.bump();
        let op = match t.tok {
            Tok::Lt => SizeOp::Lt,
            Tok::Le => SizeOp::Le,
            Tok::Gt => SizeOp::Gt,
            Tok::Ge => SizeOp::Ge,
            Tok::Eq => SizeOp::Eq,
            Tok::Ne => SizeOp::Ne,
            _ if t.is_word("in") => {
                let (lo, lo_col) = self.size(&t)?;
                let dots = self.bump();
                if dots.tok != Tok::DotDot {
                    return Err(expected(&dots, "\"..\" in a size range"));
                }
                let (hi, _) = self.size(&dots)?;
                if lo > hi {
                    return Err(err(lo_col, format!("empty size range: {lo} is more than {hi} bytes")));
                }
                return Ok(Test::SizeIn(lo, hi));
            }
            _ => return Err(expected(&t, "a comparison (<, <=, >, >=, ==, !=) or \"in\" after \"size\"")),
        };
        let (n, _) = self.size(&t)?;
        Ok(Test::Size(op, n))
    }

    /// A size after `after`, in bytes, with its column.
    fn size(&mut self, after: &Token) -> Result<(u64, usize), RuleError> {
        let t = self.bump();
        let Tok::Num(n, unit) = t.tok else {
            return Err(err(t.col, format!("expected a size after {}, found {}", after.describe(), t.describe())));
        };
        let (unit, unit_col) = match unit {
            Some(u) => (Some(u), t.col),
            // A unit after a space: only when the word is one.
            None => match self.peek().tok.clone() {
                Tok::Word(w) if unit_bytes(&w).is_some() => (Some(w), self.bump().col),
                _ => (None, t.col),
            },
        };
        let factor = match unit {
            None => 1,
            Some(u) => unit_bytes(&u).ok_or_else(|| {
                err(unit_col, format!("unknown size unit {}; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB", quote(&u)))
            })?,
        };
        let bytes = n.checked_mul(factor).ok_or_else(|| err(t.col, "the size is too large"))?;
        Ok((bytes, t.col))
    }
}

/// An "expected …, found …" error at `t`.
fn expected(t: &Token, what: &str) -> RuleError {
    err(t.col, format!("expected {what}, found {}", t.describe()))
}

/// Bytes per `unit`, ignoring case; `None` for anything else.
fn unit_bytes(unit: &str) -> Option<u64> {
    const UNITS: [(&str, u64); 9] = [
        ("b", 1),
        ("kb", 1000),
        ("mb", 1000 * 1000),
        ("gb", 1000 * 1000 * 1000),
        ("tb", 1000 * 1000 * 1000 * 1000),
        ("kib", 1 << 10),
        ("mib", 1 << 20),
        ("gib", 1 << 30),
        ("tib", 1 << 40),
    ];
    UNITS.iter().find(|(n, _)| n.eq_ignore_ascii_case(unit)).map(|&(_, b)| b)
}

/// A glob over a name (`*` stops at `/` when `literal_separator`) or a storage class.
fn glob(pattern: &str, literal_separator: bool) -> Result<GlobMatcher, String> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(literal_separator)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("{}: {e}", quote(pattern)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventSource;

    /// A dCache write of 5 MB of `/data/raw/run42/a.h5`, class `exp:raw`, by alice.
    fn write() -> StorageEvent {
        StorageEvent {
            source: EventSource {
                kind: SourceKind::DcacheBilling,
                producer: "pool-a@poolDomain".into(),
                message: None,
            },
            kind: EventKind::Write,
            msg_type: "transfer".into(),
            path: "/data/raw/run42/a.h5".into(),
            size: Some(5_000_000),
            storage_class: Some("exp:raw".into()),
            owner: Some("alice".into()),
            macaroon: None,
            id: "dcache-billing:transfer:0001/s".into(),
            time: None,
        }
    }

    /// The same event without size, class or owner.
    fn bare() -> StorageEvent {
        StorageEvent { size: None, storage_class: None, owner: None, ..write() }
    }

    fn eval(rule: &str, e: &StorageEvent) -> Truth {
        match Rule::parse(rule) {
            Ok(r) => r.evaluate(e),
            Err(err) => panic!("{rule:?} does not parse: {err}"),
        }
    }

    fn refused(rule: &str) -> RuleError {
        match Rule::parse(rule) {
            Ok(r) => panic!("{rule:?} parsed: {r:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn every_test_on_a_full_event() {
        let e = write();
        let cases: &[(&str, bool)] = &[
            (r#"path glob "/data/raw/**""#, true),
            (r#"path glob "/data/*.h5""#, false),
            (r#"path glob "/data/raw/*/a.h5""#, true),
            (r#"path prefix "/data/raw/""#, true),
            (r#"path prefix "/data/raw/run4""#, true),
            (r#"path prefix "/data/cooked/""#, false),
            (r#"path suffix ".h5""#, true),
            (r#"path suffix ".root""#, false),
            (r#"name glob "*.h5""#, true),
            (r#"name glob "a.*""#, true),
            (r#"name glob "run42*""#, false),
            (r#"name suffix "a.h5""#, true),
            (r#"name suffix "run42/a.h5""#, false),
            (r#"kind == "write""#, true),
            (r#"kind != "write""#, false),
            (r#"kind in ["remove", "write"]"#, true),
            (r#"kind in ["remove"] or kind == "read""#, false),
            (r#"type == "transfer""#, true),
            (r#"type == "Transfer""#, false),
            (r#"type in ["closew", "IN_CLOSE_WRITE"]"#, false),
            (r#"source == "dcache-billing""#, true),
            (r#"source != "xrootd-notify""#, true),
            (r#"class == "exp:raw""#, true),
            (r#"class != "exp:raw""#, false),
            (r#"class glob "exp:*""#, true),
            (r#"class glob "atlas:*""#, false),
            (r#"class in ["atlas:raw", "exp:raw"]"#, true),
            (r#"owner == "alice""#, true),
            (r#"owner in ["bob", "carol"]"#, false),
            ("size > 4MB", true),
            ("size > 5MB", false),
            ("size >= 5MB", true),
            ("size >= 5 MB", true),
            ("size < 5MiB", true),
            ("size <= 5000000", true),
            ("size < 5000000B", false),
            ("size == 5000kB", true),
            ("size != 5000kB", false),
            ("size == 5000 kb", true),
            ("size in 1MB..5MB", true),
            ("size in 5MB..5MB", true),
            ("size in 0..4999999", false),
            ("size in 6MB..1TiB", false),
            ("size > 1GB", false),
            ("size < 1GiB", true),
            ("size < 1TB", true),
        ];
        for (rule, want) in cases {
            assert_eq!(eval(rule, &e), Truth::of(*want), "{rule}");
        }
    }

    #[test]
    fn units_are_powers_of_1000_and_1024() {
        for (size, bytes) in [
            ("1B", 1u64),
            ("1kB", 1000),
            ("1KiB", 1024),
            ("1MB", 1_000_000),
            ("1MiB", 1 << 20),
            ("1GB", 1_000_000_000),
            ("1GiB", 1 << 30),
            ("2TB", 2_000_000_000_000),
            ("2TiB", 2 << 40),
        ] {
            let e = StorageEvent { size: Some(bytes), ..write() };
            assert!(Rule::parse(&format!("size == {size}")).expect("parses").matches(&e), "{size}");
            let e = StorageEvent { size: Some(bytes + 1), ..write() };
            assert!(!Rule::parse(&format!("size == {size}")).expect("parses").matches(&e), "{size}");
        }
    }

    #[test]
    fn not_binds_tighter_than_and_and_and_tighter_than_or() {
        let e = write();
        // `true or (false and ...)`: true.
        assert_eq!(eval(r#"owner == "alice" or owner == "bob" and size > 1TB"#, &e), Truth::True);
        // `(true or false) and false`: false.
        assert_eq!(eval(r#"(owner == "alice" or owner == "bob") and size > 1TB"#, &e), Truth::False);
        // `not` applies to the test next to it only.
        assert_eq!(eval(r#"not owner == "bob" and size > 1TB"#, &e), Truth::False);
        assert_eq!(eval(r#"not (owner == "bob" and size > 1TB)"#, &e), Truth::True);
        assert_eq!(eval(r#"not not owner == "alice""#, &e), Truth::True);
        assert_eq!(eval(r#"((((owner == "alice"))))"#, &e), Truth::True);
        // Keywords ignore case.
        assert_eq!(eval(r#"NOT Owner == "bob" AND Size > 1kb"#, &e), Truth::True);
    }

    #[test]
    fn an_unknown_attribute_is_undefined_and_only_true_fires() {
        let e = bare();
        for rule in ["size > 1", "size < 1TB", "not size > 1", "size in 0..1TB", r#"class glob "*""#] {
            assert_eq!(eval(rule, &e), Truth::Undefined, "{rule}");
            assert!(!Rule::parse(rule).expect("parses").matches(&e), "{rule}");
        }
        for rule in [r#"owner == "alice""#, r#"owner != "alice""#, r#"class in ["exp:raw"]"#] {
            assert_eq!(eval(rule, &e), Truth::Undefined, "{rule}");
        }
        // false and undefined = false; true or undefined = true; else undefined.
        assert_eq!(eval(r#"path suffix ".root" and size > 1"#, &e), Truth::False);
        assert_eq!(eval(r#"size > 1 and path suffix ".root""#, &e), Truth::False);
        assert_eq!(eval(r#"path suffix ".h5" or size > 1"#, &e), Truth::True);
        assert_eq!(eval(r#"size > 1 or path suffix ".h5""#, &e), Truth::True);
        assert_eq!(eval(r#"path suffix ".h5" and size > 1"#, &e), Truth::Undefined);
        assert_eq!(eval(r#"path suffix ".root" or size > 1"#, &e), Truth::Undefined);
        assert_eq!(eval(r#"not (path suffix ".root" or size > 1)"#, &e), Truth::Undefined);
        // A test that does not need the missing attribute still decides.
        assert!(Rule::parse(r#"path suffix ".h5" and kind == "write""#).expect("parses").matches(&e));
    }

    #[test]
    fn without_kind_or_type_a_rule_fires_only_on_writes() {
        let path = Rule::parse(r#"path prefix "/data/raw/""#).expect("parses");
        let negated = Rule::parse(r#"not path prefix "/elsewhere/""#).expect("parses");
        assert!(path.matches(&write()));
        assert!(negated.matches(&write()));
        for kind in EventKind::ALL.into_iter().filter(|k| *k != EventKind::Write) {
            let e = StorageEvent { kind, ..write() };
            assert_eq!(path.evaluate(&e), Truth::False, "{kind:?}");
            assert!(!negated.matches(&e), "{kind:?}");
        }
        // Naming a kind, or a type, lifts the default.
        let remove = StorageEvent { kind: EventKind::Remove, msg_type: "remove".into(), ..write() };
        assert!(Rule::parse(r#"kind == "remove" and path prefix "/data/""#).expect("parses").matches(&remove));
        assert!(Rule::parse(r#"kind != "write""#).expect("parses").matches(&remove));
        assert!(Rule::parse(r#"type == "remove""#).expect("parses").matches(&remove));
        let read = StorageEvent { kind: EventKind::Read, ..write() };
        assert!(Rule::parse(r#"type == "transfer""#).expect("parses").matches(&read));
        assert!(!Rule::parse(r#"kind == "write""#).expect("parses").matches(&read));
    }

    #[test]
    fn and_of_a_path_glob_and_a_rule() {
        let both = Rule::path_glob("/data/raw/**").expect("glob").and(Rule::parse("size > 1MB").expect("rule"));
        assert_eq!(both.text(), r#"path glob "/data/raw/**" and (size > 1MB)"#);
        assert!(both.matches(&write()));
        assert!(!both.matches(&StorageEvent { size: Some(10), ..write() }));
        assert!(!both.matches(&StorageEvent { path: "/data/x/a.h5".into(), ..write() }));
        assert!(!both.matches(&StorageEvent { kind: EventKind::Remove, ..write() }));
        // The displayed text is itself a rule meaning the same.
        let again = Rule::parse(both.text()).expect("reparses");
        assert!(again.matches(&write()));
        // A rule naming a kind lifts the default for the whole.
        let removes =
            Rule::path_glob("/data/raw/**").expect("glob").and(Rule::parse(r#"kind == "remove""#).expect("rule"));
        assert!(removes.matches(&StorageEvent { kind: EventKind::Remove, ..write() }));
        assert!(Rule::path_glob("data/**").is_err());
    }

    #[test]
    fn strings_escape_quotes_and_backslashes() {
        let e = StorageEvent { owner: Some(r#"C="x\y""#.into()), ..write() };
        assert!(Rule::parse(r#"owner == "C=\"x\\y\"""#).expect("parses").matches(&e));
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
        // Non-ASCII is fine, and columns count characters, not bytes.
        let e = StorageEvent { path: "/data/é/ß.h5".into(), ..write() };
        assert!(Rule::parse(r#"path glob "/data/é/*.h5""#).expect("parses").matches(&e));
        assert_eq!(refused(r#"owner == "é" and"#).column, 17);
    }

    #[test]
    fn errors_name_their_column() {
        let cases: &[(&str, usize, &str)] = &[
            (r#"path glob and size > 1"#, 11, r#"expected a string after "glob", found "and""#),
            ("", 1, r#"expected a test, "not" or "(", found the end"#),
            ("   ", 4, "found the end"),
            (r#"path globby "/x""#, 6, r#"expected "glob", "prefix" or "suffix" after "path", found "globby""#),
            (r#"name prefix "a""#, 6, r#"expected "glob" or "suffix" after "name""#),
            (r#"path prefix "data/""#, 13, "must be absolute"),
            (r#"path glob "data/**""#, 11, "bad path glob"),
            (r#"path glob "/data/[raw""#, 11, "bad path glob"),
            (r#"name glob "a/b""#, 11, "cannot contain '/'"),
            (r#"kind == "wirte""#, 9, r#""wirte" is not a kind; one of: write, create"#),
            (r#"kind in ["write", "moved"]"#, 19, r#""moved" is not a kind"#),
            (r#"source == "dcache""#, 11, r#""dcache" is not a source"#),
            (r#"kind = "write""#, 6, r#"a single "=" is not an operator"#),
            (r#"kind > "write""#, 6, r#"expected "==", "!=" or "in" after "kind", found ">""#),
            (r#"class < "x""#, 7, r#"expected "==", "!=", "in" or "glob" after "class""#),
            (r#"owner in "alice""#, 10, r#"expected "[" after "in", found a string"#),
            (r#"owner in []"#, 11, r#"expected a string after "[", found "]""#),
            (r#"owner in ["a",]"#, 15, r#"expected a string after ",", found "]""#),
            (r#"owner in ["a" "b"]"#, 15, r#"expected "," or "]" in a list, found a string"#),
            ("size > big", 8, r#"expected a size after ">", found "big""#),
            ("size > 1XB", 8, r#"unknown size unit "XB""#),
            ("size => 1", 6, r#"a single "=" is not an operator"#),
            ("size ~ 1", 6, "unexpected character '~'"),
            ("size in 5..1", 9, "empty size range"),
            ("size in 1 2", 11, r#"expected ".." in a size range, found "2""#),
            ("size > 99999999999999999999", 8, "the number is too large"),
            ("size > 20000000TiB", 8, "the size is too large"),
            ("size", 5, "found the end"),
            (r#"owner == "alice" && size > 1"#, 18, r#"write "and""#),
            (r#"owner == "alice" || size > 1"#, 18, r#"write "or""#),
            (r#"!owner == "alice""#, 1, r#"write "not" to negate"#),
            (r#"size > 1 size > 2"#, 10, r#"expected "and", "or" or the end, found "size""#),
            (r#"(size > 1"#, 10, r#"expected ")" to close the "(" at column 1, found the end"#),
            (r#"size > 1)"#, 9, r#"")" closes no "(""#),
            (r#"owner == "alice"#, 10, "unterminated string"),
            (r#"owner == "a\nb""#, 12, "unknown escape"),
            (r#"colour == "red""#, 1, r#"unknown test "colour""#),
            (r#"size > 1 and or size > 2"#, 14, r#"expected a test, "not" or "(", found "or""#),
            (r#"not"#, 4, "found the end"),
        ];
        for (rule, column, message) in cases {
            let e = refused(rule);
            assert_eq!(e.column, *column, "{rule}: {e}");
            assert!(e.message.contains(message), "{rule}: {e}");
        }
        assert_eq!(
            refused(r#"path glob and size > 1"#).to_string(),
            r#"at column 11: expected a string after "glob", found "and""#
        );
    }

    #[test]
    fn bounds_are_refused_with_a_clear_error() {
        // Length.
        let long = format!(r#"owner == "{}""#, "a".repeat(MAX_RULE_BYTES));
        let e = refused(&long);
        assert_eq!(e.column, MAX_RULE_BYTES + 1);
        assert!(e.message.contains("more than 4096"), "{e}");
        let fits = format!(r#"owner == "{}""#, "a".repeat(MAX_RULE_BYTES - 11));
        assert_eq!(fits.len(), MAX_RULE_BYTES);
        assert!(Rule::parse(&fits).is_ok());
        // Depth: parentheses and `not` both count.
        let deep = |n: usize| format!("{}size > 1{}", "(".repeat(n), ")".repeat(n));
        assert!(Rule::parse(&deep(MAX_DEPTH)).is_ok());
        let e = refused(&deep(MAX_DEPTH + 1));
        assert_eq!((e.column, e.message.as_str()), (MAX_DEPTH + 1, "nested more than 64 deep"));
        assert!(Rule::parse(&format!("{}size > 1", "not ".repeat(MAX_DEPTH))).is_ok());
        let e = refused(&format!("{}size > 1", "not ".repeat(MAX_DEPTH + 1)));
        assert_eq!(e.column, 4 * MAX_DEPTH + 1, "{e}");
        let e = refused(&format!("{}(size > 1)", "not ".repeat(MAX_DEPTH)));
        assert!(e.message.contains("nested"), "{e}");
        // A long flat chain is not nesting.
        let chain = vec!["size > 1"; 300].join(" and ");
        assert!(Rule::parse(&chain).expect("parses").matches(&write()));
        // Lists.
        let list = |n: usize| {
            let items: Vec<String> = (0..n).map(|i| format!("\"{i}\"")).collect();
            format!("owner in [{}]", items.join(","))
        };
        assert!(Rule::parse(&list(MAX_LIST_ITEMS)).is_ok());
        let e = refused(&list(MAX_LIST_ITEMS + 1));
        assert!(e.message.contains("at most 256 strings"), "{e}");
        assert_eq!(list(MAX_LIST_ITEMS + 1).chars().nth(e.column - 1), Some('"'));
    }

    /// A small deterministic generator, so a failure is reproducible.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn no_input_panics() {
        const PIECES: &[&str] = &[
            "path",
            "name",
            "glob",
            "prefix",
            "suffix",
            "kind",
            "type",
            "source",
            "class",
            "owner",
            "size",
            "in",
            "and",
            "or",
            "not",
            "(",
            ")",
            "[",
            "]",
            ",",
            "..",
            "==",
            "!=",
            "<",
            "<=",
            ">",
            ">=",
            "=",
            "!",
            "\"",
            "\"/data/**\"",
            "\"write\"",
            "\"a\\\"b\"",
            "\"\\",
            "\\",
            "1",
            "5MB",
            "KiB",
            "99999999999999999999",
            " ",
            "\n",
            "é",
            "\u{0}",
            "*",
            "{",
            "&&",
        ];
        let valid = [
            r#"path glob "/data/raw/**" and (size in 1kB..2GiB or not name suffix ".tmp")"#,
            r#"kind in ["write", "restore"] and class glob "exp:*" and owner != "bob""#,
        ];
        let events = [write(), bare(), StorageEvent { kind: EventKind::Remove, path: "/".into(), ..bare() }];
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut parsed = 0;
        for round in 0..20_000 {
            let text = if round % 4 == 0 {
                // A valid rule cut anywhere (on a character boundary).
                let v = valid[rng.below(valid.len())];
                v.chars().take(rng.below(v.chars().count() + 1)).collect::<String>()
            } else {
                (0..rng.below(24)).map(|_| PIECES[rng.below(PIECES.len())]).collect::<Vec<_>>().join(" ")
            };
            if let Ok(rule) = Rule::parse(&text) {
                parsed += 1;
                for e in &events {
                    let _ = rule.evaluate(e);
                }
            }
        }
        // Some random texts are rules, so evaluation was exercised too.
        assert!(parsed > 100, "{parsed}");
        for v in valid {
            assert!(Rule::parse(v).is_ok(), "{v}");
        }
    }

    /// Fails to compile when a source kind is added: add it to `SOURCES` too.
    #[test]
    fn sources_lists_every_source_kind() {
        let listed = |k: SourceKind| match k {
            SourceKind::DcacheBilling | SourceKind::DcacheSse | SourceKind::XrootdNotify | SourceKind::Cloudevents => {
                SOURCES.contains(&k)
            }
        };
        assert!(SOURCES.into_iter().all(listed));
        assert_eq!(SOURCES.len(), 4);
    }
}
