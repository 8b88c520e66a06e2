//! Site requirements on jobs: HTCondor-style requirement expressions over a job's attributes
//! ([`JobAd`]), which the scheduler's site policy uses in two ways. A *submit requirement*
//! refuses, at submit, a job that does not satisfy it, with its message (HTCondor's
//! `SUBMIT_REQUIREMENT_<Name>` and `SUBMIT_REQUIREMENT_<Name>_REASON`); a *hold requirement*
//! accepts the job but holds it, with its message as the hold reason (for example
//! `RequestGPUs == 0 || AcctGroup == "gpu"`, "Unauthorized GPU request").
//!
//! The language is a ClassAd subset:
//! - values: non-negative decimal integers (at most [`MAX_INTEGER`]), double-quoted strings
//!   (escapes `\"` and `\\` only), `true`, `false`, `undefined`, and the attributes of
//!   [`JobAd`]; attribute names and keywords are case-insensitive;
//! - operators, loosest first: `||`, `&&`, unary `!`, then the comparisons `==`, `!=`, `<`,
//!   `<=`, `>`, `>=`, `=?=` (is identical) and `=!=` (is not identical), which do not chain
//!   (`a < b < c` is refused); parentheses group. As `!` binds more loosely than a comparison,
//!   `!RequestGPUs == 0` means `!(RequestGPUs == 0)`. There is no arithmetic.
//!
//! Types are checked when the expression is parsed: attributes have fixed types, so comparing
//! a string with an integer (`Owner > 3`), ordering booleans, a non-boolean operand of a logical
//! operator, and a non-boolean expression as a whole are errors, reported with their byte
//! offset (counted from 0).
//!
//! Evaluation follows ClassAds' three-valued logic. An absent optional attribute is
//! `undefined`; a comparison (other than `=?=`/`=!=`) with an `undefined` side is `undefined`;
//! `false && undefined` is `false`, `true || undefined` is `true`, and otherwise `undefined`
//! propagates, also through `!`. `=?=` is never `undefined`: `undefined =?= undefined` is true,
//! `undefined =?= x` false. `==`, `!=` and the orderings compare strings ignoring ASCII case, as
//! ClassAds do; `=?=` and `=!=` compare them exactly, also as ClassAds do. **A requirement holds
//! only when its expression is exactly `true`: one that evaluates to `undefined` is violated.**
//!
//! Limits against a hostile configuration: an expression of at most [`MAX_EXPRESSION_BYTES`],
//! nested (parentheses and `!`) at most [`MAX_DEPTH`] deep, so neither parsing nor evaluation
//! recurses deeper than that; names of at most [`MAX_NAME_CHARS`] characters of
//! `[A-Za-z0-9_-]`; messages of at most [`MAX_MESSAGE_BYTES`], without control characters.

/// Longest requirement expression, bytes.
pub const MAX_EXPRESSION_BYTES: usize = 4096;
/// Deepest nesting of parentheses and `!` in an expression.
pub const MAX_DEPTH: usize = 64;
/// Longest requirement name, characters.
pub const MAX_NAME_CHARS: usize = 64;
/// Longest requirement message, bytes.
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Largest integer literal: ClassAd integers are 64-bit signed.
pub const MAX_INTEGER: u64 = i64::MAX.unsigned_abs();

/// A requirement as written in the scheduler's config file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequirementConfig {
    /// Names the requirement in errors and logs; unique in its list, ignoring case.
    pub name: String,
    /// The expression a job must satisfy (see the module docs).
    pub requirement: String,
    /// Told to the owner of a job that violates it: the refusal or the hold reason.
    pub message: String,
}

/// The job's attributes a requirement can test, each under its ClassAd name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobAd {
    /// `Owner` (string): the job's owner.
    pub owner: String,
    /// `AcctGroup` (string): the accounting group; `undefined` when `None`.
    pub group: Option<String>,
    /// `Function` (string): the function's name.
    pub function: String,
    /// `JobClass` (string); `undefined` when `None`.
    pub class: Option<String>,
    /// `Annex` (string): the annex the job must run on; `undefined` when `None`.
    pub annex: Option<String>,
    /// `RequestCpus` (integer).
    pub cpus: u32,
    /// `RequestMemory` (integer, MiB).
    pub memory_mb: u64,
    /// `RequestRuntime` (integer, seconds).
    pub runtime_s: u64,
    /// `RequestGPUs` (integer).
    pub gpus: u32,
    /// `RequestDisk` (integer, MiB).
    pub disk_mb: u64,
}

/// A parsed and type-checked requirement, with a valid name and message.
#[derive(Debug, Clone)]
pub struct Requirement {
    /// From the config; unique in a list from [`parse_all`].
    name: String,
    /// The expression, boolean-typed.
    expr: Expr,
    /// Told to the owner of a job that violates it.
    message: String,
}

impl Requirement {
    /// Parses and checks `c`: its name, its message and its expression. An error reads like
    /// `requirement "MaxMem": at byte 14: expected a value, found ")"`.
    pub fn parse(c: &RequirementConfig) -> Result<Requirement, RequirementError> {
        let fail = |problem| RequirementError { requirement: shown_name(&c.name), problem };
        check_name(&c.name).map_err(fail)?;
        check_message(&c.message).map_err(fail)?;
        let expr = parse_expression(&c.requirement).map_err(|e| fail(RequirementProblem::Expression(e)))?;
        Ok(Requirement { name: c.name.clone(), expr, message: c.message.clone() })
    }

    /// The requirement's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The message for a job that violates it.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether `ad` satisfies the expression: only when it evaluates to exactly `true`, so an
    /// `undefined` result (say, `AcctGroup == "x"` for a job without a group) is a violation.
    pub fn holds(&self, ad: &JobAd) -> bool {
        eval(&self.expr, ad) == Value::Bool(true)
    }
}

/// Parses a list of requirements in order, refusing any [`Requirement::parse`] refuses (empty
/// or malformed names, empty messages, messages over [`MAX_MESSAGE_BYTES`] or with control
/// characters, bad expressions) and names used twice (ignoring ASCII case, as HTCondor's
/// configuration does).
pub fn parse_all(list: &[RequirementConfig]) -> Result<Vec<Requirement>, RequirementError> {
    let mut out: Vec<Requirement> = Vec::with_capacity(list.len());
    for c in list {
        let r = Requirement::parse(c)?;
        if out.iter().any(|o| o.name.eq_ignore_ascii_case(&r.name)) {
            return Err(RequirementError { requirement: shown_name(&r.name), problem: RequirementProblem::UsedTwice });
        }
        out.push(r);
    }
    Ok(out)
}

/// The first requirement of `reqs`, in order, that `ad` violates, if any.
pub fn first_violated<'a>(reqs: &'a [Requirement], ad: &JobAd) -> Option<&'a Requirement> {
    reqs.iter().find(|r| !r.holds(ad))
}

/// A name for an error message: quoted, escaped, and cut to [`MAX_NAME_CHARS`].
fn shown_name(name: &str) -> String {
    let cut: String = name.chars().take(MAX_NAME_CHARS).collect();
    if cut.len() < name.len() { format!("{cut:?}…") } else { format!("{cut:?}") }
}

/// Why a requirement was refused ([`Requirement::parse`], [`parse_all`]): which one and what
/// is wrong with it, as `requirement "MaxMem": at byte 14: expected a value, found ")"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("requirement {requirement}: {problem}")]
pub struct RequirementError {
    /// The requirement's name, quoted, escaped and cut to [`MAX_NAME_CHARS`].
    pub requirement: String,
    /// What is wrong with it.
    pub problem: RequirementProblem,
}

/// What is wrong with a requirement ([`RequirementError::problem`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementProblem {
    /// The name is the empty string.
    #[error("name is empty")]
    NameEmpty,
    /// The name holds a character other than `[A-Za-z0-9_-]`.
    #[error("name contains {0:?}; only letters, digits, `_` and `-` are allowed")]
    NameCharacter(char),
    /// The name is longer than [`MAX_NAME_CHARS`] (its length).
    #[error("name is {0} characters, more than {MAX_NAME_CHARS}")]
    NameTooLong(usize),
    /// The message is the empty string.
    #[error("message is empty")]
    MessageEmpty,
    /// The message is longer than [`MAX_MESSAGE_BYTES`] (its length).
    #[error("message is {0} bytes, more than {MAX_MESSAGE_BYTES}")]
    MessageTooLong(usize),
    /// The message holds a control character.
    #[error("message has a control character ({character:?}) at byte {at}")]
    MessageControl {
        /// The character.
        character: char,
        /// Its byte offset.
        at: usize,
    },
    /// The expression does not parse or type-check.
    #[error("{0}")]
    Expression(ParseError),
    /// Another requirement of the list has the same name (ignoring ASCII case).
    #[error("name used twice")]
    UsedTwice,
}

fn check_name(name: &str) -> Result<(), RequirementProblem> {
    if name.is_empty() {
        return Err(RequirementProblem::NameEmpty);
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-')) {
        return Err(RequirementProblem::NameCharacter(c));
    }
    // All ASCII now, so bytes are characters.
    if name.len() > MAX_NAME_CHARS {
        return Err(RequirementProblem::NameTooLong(name.len()));
    }
    Ok(())
}

fn check_message(message: &str) -> Result<(), RequirementProblem> {
    if message.is_empty() {
        return Err(RequirementProblem::MessageEmpty);
    }
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(RequirementProblem::MessageTooLong(message.len()));
    }
    if let Some((at, character)) = message.char_indices().find(|(_, c)| c.is_control()) {
        return Err(RequirementProblem::MessageControl { character, at });
    }
    Ok(())
}

/// An attribute of a [`JobAd`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attr {
    Owner,
    AcctGroup,
    Function,
    JobClass,
    Annex,
    RequestCpus,
    RequestMemory,
    RequestRuntime,
    RequestGpus,
    RequestDisk,
}

/// The attributes under their canonical names, in the order errors list them.
const ATTRS: [(&str, Attr); 10] = [
    ("Owner", Attr::Owner),
    ("AcctGroup", Attr::AcctGroup),
    ("Function", Attr::Function),
    ("JobClass", Attr::JobClass),
    ("Annex", Attr::Annex),
    ("RequestCpus", Attr::RequestCpus),
    ("RequestMemory", Attr::RequestMemory),
    ("RequestRuntime", Attr::RequestRuntime),
    ("RequestGPUs", Attr::RequestGpus),
    ("RequestDisk", Attr::RequestDisk),
];

impl Attr {
    fn lookup(name: &str) -> Option<Attr> {
        ATTRS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, a)| a)
    }

    fn ty(self) -> Ty {
        match self {
            Attr::Owner | Attr::AcctGroup | Attr::Function | Attr::JobClass | Attr::Annex => Ty::Str,
            Attr::RequestCpus | Attr::RequestMemory | Attr::RequestRuntime | Attr::RequestGpus | Attr::RequestDisk => {
                Ty::Int
            }
        }
    }

    fn value(self, ad: &JobAd) -> Value<'_> {
        match self {
            Attr::Owner => Value::Str(&ad.owner),
            Attr::AcctGroup => optional(&ad.group),
            Attr::Function => Value::Str(&ad.function),
            Attr::JobClass => optional(&ad.class),
            Attr::Annex => optional(&ad.annex),
            Attr::RequestCpus => Value::Int(u64::from(ad.cpus)),
            Attr::RequestMemory => Value::Int(ad.memory_mb),
            Attr::RequestRuntime => Value::Int(ad.runtime_s),
            Attr::RequestGpus => Value::Int(u64::from(ad.gpus)),
            Attr::RequestDisk => Value::Int(ad.disk_mb),
        }
    }
}

/// An optional string attribute: `undefined` when absent.
fn optional(s: &Option<String>) -> Value<'_> {
    s.as_deref().map_or(Value::Undefined, Value::Str)
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `=?=`
    Is,
    /// `=!=`
    Isnt,
}

impl CmpOp {
    fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
            CmpOp::Is => "=?=",
            CmpOp::Isnt => "=!=",
        }
    }

    fn orders(self) -> bool {
        matches!(self, CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge)
    }
}

/// A parsed expression. `&&` and `||` chains are flat lists, so the tree is only as deep as
/// the nesting of parentheses and `!` (at most [`MAX_DEPTH`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    Bool(bool),
    Int(u64),
    Str(String),
    Undefined,
    Attr(Attr),
    Not(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
}

/// A value during evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value<'a> {
    Bool(bool),
    Int(u64),
    Str(&'a str),
    Undefined,
}

fn eval<'a>(e: &'a Expr, ad: &'a JobAd) -> Value<'a> {
    match e {
        Expr::Bool(b) => Value::Bool(*b),
        Expr::Int(n) => Value::Int(*n),
        Expr::Str(s) => Value::Str(s),
        Expr::Undefined => Value::Undefined,
        Expr::Attr(a) => a.value(ad),
        // Operands of logical operators are boolean-typed (checked at parse), so any other
        // value here is `undefined`.
        Expr::Not(x) => match eval(x, ad) {
            Value::Bool(b) => Value::Bool(!b),
            _ => Value::Undefined,
        },
        Expr::And(xs) => logical(xs, ad, false),
        Expr::Or(xs) => logical(xs, ad, true),
        Expr::Cmp(op, l, r) => Value::Bool(match (*op, eval(l, ad), eval(r, ad)) {
            (CmpOp::Is, l, r) => l == r,
            (CmpOp::Isnt, l, r) => l != r,
            (_, Value::Undefined, _) | (_, _, Value::Undefined) => return Value::Undefined,
            (op, l, r) => {
                let ord = match (l, r) {
                    (Value::Int(a), Value::Int(b)) => a.cmp(&b),
                    (Value::Str(a), Value::Str(b)) => {
                        a.bytes().map(|c| c.to_ascii_lowercase()).cmp(b.bytes().map(|c| c.to_ascii_lowercase()))
                    }
                    (Value::Bool(a), Value::Bool(b)) if !op.orders() => a.cmp(&b),
                    // Refused at parse: attributes have fixed types.
                    _ => return Value::Bool(false),
                };
                match op {
                    CmpOp::Eq | CmpOp::Is => ord.is_eq(),
                    CmpOp::Ne | CmpOp::Isnt => ord.is_ne(),
                    CmpOp::Lt => ord.is_lt(),
                    CmpOp::Le => ord.is_le(),
                    CmpOp::Gt => ord.is_gt(),
                    CmpOp::Ge => ord.is_ge(),
                }
            }
        }),
    }
}

/// A chain of `||` (`decisive` = true) or `&&` (`decisive` = false): the decisive value wins
/// whatever else is `undefined`.
fn logical<'a>(xs: &'a [Expr], ad: &'a JobAd, decisive: bool) -> Value<'a> {
    let mut undefined = false;
    for x in xs {
        match eval(x, ad) {
            Value::Bool(b) if b == decisive => return Value::Bool(decisive),
            Value::Bool(_) => {}
            _ => undefined = true,
        }
    }
    if undefined { Value::Undefined } else { Value::Bool(!decisive) }
}

/// Why an expression does not parse or type-check: where (when it has a place, a byte offset)
/// and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    at: Option<usize>,
    what: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.at {
            Some(at) => write!(f, "at byte {at}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl std::error::Error for ParseError {}

fn error<T>(at: usize, what: String) -> Result<T, ParseError> {
    Err(ParseError { at: Some(at), what })
}

/// A static type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Bool,
    Int,
    Str,
    /// The literal `undefined`, which goes with any type.
    Undef,
}

impl Ty {
    fn describe(self) -> &'static str {
        match self {
            Ty::Bool => "a boolean",
            Ty::Int => "an integer",
            Ty::Str => "a string",
            Ty::Undef => "undefined",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Int(u64),
    Str(String),
    /// An identifier: a keyword or an attribute name.
    Ident,
    OrOr,
    AndAnd,
    Not,
    Cmp(CmpOp),
    LParen,
    RParen,
    End,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    /// Byte offset of its first byte.
    at: usize,
    /// Byte offset just past it.
    end: usize,
}

fn lex(src: &str) -> Result<Vec<Token>, ParseError> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        let at = i;
        let next = b.get(i + 1).copied();
        let (tok, len) = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'(' => (Tok::LParen, 1),
            b')' => (Tok::RParen, 1),
            b'|' if next == Some(b'|') => (Tok::OrOr, 2),
            b'&' if next == Some(b'&') => (Tok::AndAnd, 2),
            b'!' if next == Some(b'=') => (Tok::Cmp(CmpOp::Ne), 2),
            b'!' => (Tok::Not, 1),
            b'<' if next == Some(b'=') => (Tok::Cmp(CmpOp::Le), 2),
            b'<' => (Tok::Cmp(CmpOp::Lt), 1),
            b'>' if next == Some(b'=') => (Tok::Cmp(CmpOp::Ge), 2),
            b'>' => (Tok::Cmp(CmpOp::Gt), 1),
            b'=' => match (next, b.get(i + 2)) {
                (Some(b'='), _) => (Tok::Cmp(CmpOp::Eq), 2),
                (Some(b'?'), Some(b'=')) => (Tok::Cmp(CmpOp::Is), 3),
                (Some(b'!'), Some(b'=')) => (Tok::Cmp(CmpOp::Isnt), 3),
                _ => return error(at, "expected `==`, `=?=` or `=!=` after `=`".into()),
            },
            b'0'..=b'9' => {
                let len = b[at..].iter().take_while(|c| c.is_ascii_digit()).count();
                let mut n: u64 = 0;
                for d in &b[at..at + len] {
                    n = match n.checked_mul(10).and_then(|n| n.checked_add(u64::from(d - b'0'))) {
                        Some(n) if n <= MAX_INTEGER => n,
                        _ => return error(at, format!("integer is too large (at most {MAX_INTEGER})")),
                    };
                }
                (Tok::Int(n), len)
            }
            b'"' => {
                let (s, len) = lex_string(src, at)?;
                (Tok::Str(s), len)
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                (Tok::Ident, b[at..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count())
            }
            _ => {
                let ch = src.get(at..).and_then(|s| s.chars().next()).unwrap_or(char::REPLACEMENT_CHARACTER);
                return error(at, format!("unexpected character {ch:?}"));
            }
        };
        i += len;
        out.push(Token { tok, at, end: i });
    }
    out.push(Token { tok: Tok::End, at: src.len(), end: src.len() });
    Ok(out)
}

/// The string literal whose opening quote is at `at`: its value and its length in bytes.
fn lex_string(src: &str, at: usize) -> Result<(String, usize), ParseError> {
    let mut value = String::new();
    let mut chars = src.get(at + 1..).unwrap_or("").char_indices().map(|(i, c)| (at + 1 + i, c));
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, i + 1 - at)),
            '\\' => match chars.next() {
                Some((_, e @ ('"' | '\\'))) => value.push(e),
                _ => return error(i, "unknown escape: only `\\\"` and `\\\\` are allowed".into()),
            },
            c => value.push(c),
        }
    }
    error(at, "unterminated string".into())
}

/// A parsed subexpression: the expression, its type, and where it starts.
struct Node {
    expr: Expr,
    ty: Ty,
    at: usize,
}

struct Parser<'s> {
    src: &'s str,
    toks: Vec<Token>,
    pos: usize,
    /// Current nesting of parentheses and `!`.
    depth: usize,
}

fn parse_expression(src: &str) -> Result<Expr, ParseError> {
    if src.len() > MAX_EXPRESSION_BYTES {
        return Err(ParseError {
            at: None,
            what: format!("expression is {} bytes, more than {MAX_EXPRESSION_BYTES}", src.len()),
        });
    }
    let mut p = Parser { src, toks: lex(src)?, pos: 0, depth: 0 };
    let node = p.or()?;
    let t = p.peek();
    match t.tok {
        Tok::End => {}
        Tok::RParen => return error(t.at, "\")\" closes no \"(\"".into()),
        _ => return error(t.at, format!("expected an operator or the end, found {}", p.describe(t))),
    }
    if node.ty != Ty::Bool {
        return error(node.at, format!("the requirement must be a boolean expression, found {}", node.ty.describe()));
    }
    Ok(node.expr)
}

impl Parser<'_> {
    fn peek(&self) -> &Token {
        // `lex` ends the list with `End`, and nothing moves past it.
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if t.tok != Tok::End {
            self.pos += 1;
        }
        t
    }

    fn describe(&self, t: &Token) -> String {
        match t.tok {
            Tok::End => "the end".into(),
            Tok::Str(_) => "a string".into(),
            _ => {
                // Tokens other than strings are ASCII, so any cut is on a character boundary.
                let text = self.src.get(t.at..t.end).unwrap_or("");
                match text.get(..32) {
                    Some(cut) if cut.len() < text.len() => format!("{cut:?}…"),
                    _ => format!("{text:?}"),
                }
            }
        }
    }

    /// Enters one more level of nesting, at the `(` or `!` at `at`.
    fn enter(&mut self, at: usize) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return error(at, format!("nested more than {MAX_DEPTH} deep"));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Node, ParseError> {
        self.chain(Tok::OrOr, "||", Parser::and, Expr::Or)
    }

    fn and(&mut self) -> Result<Node, ParseError> {
        self.chain(Tok::AndAnd, "&&", Parser::not, Expr::And)
    }

    /// `operand (sep operand)*`, kept flat.
    fn chain(
        &mut self,
        sep: Tok,
        symbol: &str,
        operand: fn(&mut Self) -> Result<Node, ParseError>,
        build: fn(Vec<Expr>) -> Expr,
    ) -> Result<Node, ParseError> {
        let first = operand(self)?;
        if self.peek().tok != sep {
            return Ok(first);
        }
        let at = first.at;
        let mut items = vec![boolean(first, symbol)?];
        while self.peek().tok == sep {
            self.pos += 1;
            let next = operand(self)?;
            items.push(boolean(next, symbol)?);
        }
        Ok(Node { expr: build(items), ty: Ty::Bool, at })
    }

    fn not(&mut self) -> Result<Node, ParseError> {
        if self.peek().tok != Tok::Not {
            return self.comparison();
        }
        let at = self.bump().at;
        self.enter(at)?;
        let inner = self.not()?;
        self.depth -= 1;
        Ok(Node { expr: Expr::Not(Box::new(boolean(inner, "!")?)), ty: Ty::Bool, at })
    }

    fn comparison(&mut self) -> Result<Node, ParseError> {
        let left = self.primary()?;
        let Tok::Cmp(op) = self.peek().tok else { return Ok(left) };
        let op_at = self.bump().at;
        let right = self.primary()?;
        if let Tok::Cmp(_) = self.peek().tok {
            return error(self.peek().at, "comparisons do not chain; add parentheses".into());
        }
        match (left.ty, right.ty) {
            (Ty::Undef, _) | (_, Ty::Undef) => {}
            (l, r) if l != r => {
                return error(
                    op_at,
                    format!("cannot compare {} with {} (`{}`)", l.describe(), r.describe(), op.symbol()),
                );
            }
            (Ty::Bool, _) if op.orders() => return error(op_at, format!("`{}` cannot order booleans", op.symbol())),
            _ => {}
        }
        Ok(Node { expr: Expr::Cmp(op, Box::new(left.expr), Box::new(right.expr)), ty: Ty::Bool, at: left.at })
    }

    fn primary(&mut self) -> Result<Node, ParseError> {
        let t = self.bump();
        let (expr, ty) = match t.tok {
            Tok::Int(n) => (Expr::Int(n), Ty::Int),
            Tok::Str(s) => (Expr::Str(s), Ty::Str),
            Tok::Ident => {
                let name = self.src.get(t.at..t.end).unwrap_or("");
                if name.eq_ignore_ascii_case("true") {
                    (Expr::Bool(true), Ty::Bool)
                } else if name.eq_ignore_ascii_case("false") {
                    (Expr::Bool(false), Ty::Bool)
                } else if name.eq_ignore_ascii_case("undefined") {
                    (Expr::Undefined, Ty::Undef)
                } else if let Some(a) = Attr::lookup(name) {
                    (Expr::Attr(a), a.ty())
                } else {
                    let known: Vec<&str> = ATTRS.iter().map(|(n, _)| *n).collect();
                    return error(
                        t.at,
                        format!("unknown attribute {}; known attributes: {}", self.describe(&t), known.join(", ")),
                    );
                }
            }
            Tok::LParen => {
                self.enter(t.at)?;
                let inner = self.or()?;
                self.depth -= 1;
                let close = self.peek();
                if close.tok != Tok::RParen {
                    return error(
                        close.at,
                        format!("expected \")\" for the \"(\" at byte {}, found {}", t.at, self.describe(close)),
                    );
                }
                self.pos += 1;
                return Ok(Node { at: t.at, ..inner });
            }
            _ => return error(t.at, format!("expected a value, found {}", self.describe(&t))),
        };
        Ok(Node { expr, ty, at: t.at })
    }
}

/// `node` as an operand of the logical operator `symbol`, which must be boolean.
fn boolean(node: Node, symbol: &str) -> Result<Expr, ParseError> {
    match node.ty {
        Ty::Bool | Ty::Undef => Ok(node.expr),
        ty => error(node.at, format!("the operand of `{symbol}` must be a boolean, found {}", ty.describe())),
    }
}

#[cfg(test)]
mod tests;
