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
    pub fn parse(c: &RequirementConfig) -> Result<Requirement, String> {
        let fail = |e: String| format!("requirement {}: {e}", shown_name(&c.name));
        check_name(&c.name).map_err(fail)?;
        check_message(&c.message).map_err(fail)?;
        let expr = parse_expression(&c.requirement).map_err(|e| fail(e.to_string()))?;
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
pub fn parse_all(list: &[RequirementConfig]) -> Result<Vec<Requirement>, String> {
    let mut out: Vec<Requirement> = Vec::with_capacity(list.len());
    for c in list {
        let r = Requirement::parse(c)?;
        if out.iter().any(|o| o.name.eq_ignore_ascii_case(&r.name)) {
            return Err(format!("requirement {}: name used twice", shown_name(&r.name)));
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

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("name is empty".into());
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-')) {
        return Err(format!("name contains {c:?}; only letters, digits, `_` and `-` are allowed"));
    }
    // All ASCII now, so bytes are characters.
    if name.len() > MAX_NAME_CHARS {
        return Err(format!("name is {} characters, more than {MAX_NAME_CHARS}", name.len()));
    }
    Ok(())
}

fn check_message(message: &str) -> Result<(), String> {
    if message.is_empty() {
        return Err("message is empty".into());
    }
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(format!("message is {} bytes, more than {MAX_MESSAGE_BYTES}", message.len()));
    }
    if let Some((i, c)) = message.char_indices().find(|(_, c)| c.is_control()) {
        return Err(format!("message has a control character ({c:?}) at byte {i}"));
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

/// A parse error: where (when it has a place) and what.
#[derive(Debug)]
struct ParseError {
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
mod tests {
    use super::*;

    fn config(name: &str, requirement: &str, message: &str) -> RequirementConfig {
        RequirementConfig { name: name.into(), requirement: requirement.into(), message: message.into() }
    }

    fn req(requirement: &str) -> Requirement {
        match Requirement::parse(&config("R", requirement, "no")) {
            Ok(r) => r,
            Err(e) => panic!("{requirement}: {e}"),
        }
    }

    fn parse_err(requirement: &str) -> String {
        match Requirement::parse(&config("R", requirement, "no")) {
            Ok(r) => panic!("{requirement}: parsed as {r:?}"),
            Err(e) => e,
        }
    }

    /// The three-valued result of `requirement` on `ad`.
    fn value<'a>(r: &'a Requirement, ad: &'a JobAd) -> Value<'a> {
        eval(&r.expr, ad)
    }

    fn ad() -> JobAd {
        JobAd {
            owner: "alice".into(),
            group: None,
            function: "resize".into(),
            class: Some("short".into()),
            annex: None,
            cpus: 2,
            memory_mb: 512,
            runtime_s: 60,
            gpus: 0,
            disk_mb: 100,
        }
    }

    #[track_caller]
    fn check(cases: &[(&str, bool)], ad: &JobAd) {
        for (src, want) in cases {
            assert_eq!(req(src).holds(ad), *want, "{src}");
        }
    }

    #[test]
    fn each_comparison_on_integers() {
        check(
            &[
                ("RequestCpus == 2", true),
                ("RequestCpus == 3", false),
                ("RequestCpus != 3", true),
                ("RequestCpus != 2", false),
                ("RequestMemory < 513", true),
                ("RequestMemory < 512", false),
                ("RequestMemory <= 512", true),
                ("RequestMemory <= 511", false),
                ("RequestRuntime > 59", true),
                ("RequestRuntime > 60", false),
                ("RequestRuntime >= 60", true),
                ("RequestRuntime >= 61", false),
                ("RequestGPUs =?= 0", true),
                ("RequestGPUs =?= 1", false),
                ("RequestDisk =!= 99", true),
                ("RequestDisk =!= 100", false),
                ("9223372036854775807 > RequestDisk", true),
            ],
            &ad(),
        );
    }

    #[test]
    fn each_comparison_on_strings_and_booleans() {
        check(
            &[
                ("Owner == \"alice\"", true),
                ("Owner != \"alice\"", false),
                ("Function < \"s\"", true),
                ("Function <= \"resize\"", true),
                ("Function > \"resize\"", false),
                ("Function >= \"rt\"", false),
                ("JobClass =?= \"short\"", true),
                ("JobClass =!= \"short\"", false),
                ("true == true", true),
                ("true != false", true),
                ("(RequestCpus == 2) == (Owner == \"bob\")", false),
                ("\"a\\\"b\\\\\" == \"A\\\"B\\\\\"", true),
                ("\"a\\\"b\" == \"a\\\\b\"", false),
            ],
            &ad(),
        );
    }

    #[test]
    fn each_logical_operator_and_parentheses() {
        check(
            &[
                ("true && true", true),
                ("true && false", false),
                ("false && true", false),
                ("false || false", false),
                ("false || true", true),
                ("true || false", true),
                ("!false", true),
                ("!true", false),
                ("!!true", true),
                ("(false)", false),
                ("((true))", true),
                ("false || false || false || true", true),
                ("true && true && true && false", false),
            ],
            &ad(),
        );
    }

    #[test]
    fn and_binds_tighter_than_or_and_not_looser_than_comparison() {
        check(
            &[
                // `||` loosest: true || (false && false), not (true || false) && false.
                ("true || false && false", true),
                ("false && false || true", true),
                ("(true || false) && false", false),
                // `!` looser than a comparison: !(RequestCpus == 3), not (!RequestCpus) == 3.
                ("!RequestCpus == 3", true),
                ("!RequestCpus == 2", false),
                // `!` tighter than `&&`: (!false) && false.
                ("!false && false", false),
                ("!(false && false)", true),
            ],
            &ad(),
        );
    }

    #[test]
    fn names_and_keywords_are_case_insensitive() {
        check(
            &[
                ("requestcpus == 2", true),
                ("OWNER == \"alice\"", true),
                ("RequestGpus == 0 && REQUESTGPUS == 0 && requestGPUs == 0", true),
                ("TRUE && !False", true),
                ("acctgroup =?= UNDEFINED", true),
            ],
            &ad(),
        );
    }

    #[test]
    fn string_comparisons_ignore_case_but_identity_does_not() {
        check(
            &[
                ("Owner == \"ALICE\"", true),
                ("Owner != \"Alice\"", false),
                // Byte-wise "alice" > "BOB"; ignoring case it is less.
                ("Owner < \"BOB\"", true),
                ("Owner >= \"BOB\"", false),
                ("Owner =?= \"ALICE\"", false),
                ("Owner =!= \"ALICE\"", true),
            ],
            &ad(),
        );
    }

    #[test]
    fn an_absent_attribute_is_undefined_and_undefined_propagates() {
        let a = ad();
        let u = Value::Undefined;
        for (src, want) in [
            ("AcctGroup == \"x\"", u),
            ("AcctGroup != \"x\"", u),
            ("AcctGroup < \"x\"", u),
            ("!(AcctGroup == \"x\")", u),
            ("AcctGroup == \"x\" && true", u),
            ("AcctGroup == \"x\" && false", Value::Bool(false)),
            ("false && AcctGroup == \"x\"", Value::Bool(false)),
            ("AcctGroup == \"x\" || false", u),
            ("AcctGroup == \"x\" || true", Value::Bool(true)),
            ("true || AcctGroup == \"x\"", Value::Bool(true)),
            ("undefined == undefined", u),
            ("AcctGroup =?= undefined", Value::Bool(true)),
            ("AcctGroup =!= undefined", Value::Bool(false)),
            ("undefined =?= undefined", Value::Bool(true)),
            ("Owner =?= undefined", Value::Bool(false)),
            ("AcctGroup =?= \"x\"", Value::Bool(false)),
            ("(AcctGroup == \"x\") =?= undefined", Value::Bool(true)),
        ] {
            assert_eq!(value(&req(src), &a), want, "{src}");
        }
        // Only exactly `true` holds.
        check(
            &[
                ("AcctGroup == \"x\"", false),
                ("AcctGroup != \"x\"", false),
                ("!(AcctGroup == \"x\")", false),
                ("AcctGroup =?= undefined", true),
                ("Annex =?= undefined && JobClass =!= undefined", true),
            ],
            &a,
        );
        let grouped = JobAd { group: Some("x".into()), ..ad() };
        check(
            &[("AcctGroup == \"x\"", true), ("!(AcctGroup == \"x\")", false), ("AcctGroup =?= undefined", false)],
            &grouped,
        );
    }

    #[test]
    fn the_gpu_example_holds_for_no_gpus_or_the_gpu_group() {
        let r = req("RequestGPUs == 0 || AcctGroup == \"gpu\"");
        assert!(r.holds(&ad()));
        assert!(!r.holds(&JobAd { gpus: 1, ..ad() }), "GPUs, no group: undefined");
        assert!(!r.holds(&JobAd { gpus: 1, group: Some("cpu".into()), ..ad() }));
        assert!(r.holds(&JobAd { gpus: 1, group: Some("GPU".into()), ..ad() }));
    }

    #[test]
    fn parse_errors_say_where_and_what() {
        for (src, want) in [
            ("", "at byte 0: expected a value, found the end"),
            ("(RequestMemory <= )", "at byte 18: expected a value, found \")\""),
            ("((true)", "at byte 7: expected \")\" for the \"(\" at byte 0, found the end"),
            ("(true))", "at byte 6: \")\" closes no \"(\""),
            ("true false", "at byte 5: expected an operator or the end, found \"false\""),
            ("true \"x\"", "at byte 5: expected an operator or the end, found a string"),
            (
                "RequestMem < 3",
                "at byte 0: unknown attribute \"RequestMem\"; known attributes: Owner, AcctGroup, Function, \
                 JobClass, Annex, RequestCpus, RequestMemory, RequestRuntime, RequestGPUs, RequestDisk",
            ),
            ("Owner == \"alice", "at byte 9: unterminated string"),
            ("Owner == \"a\\\"", "at byte 9: unterminated string"),
            ("Owner == \"a\\n\"", "at byte 11: unknown escape: only `\\\"` and `\\\\` are allowed"),
            ("1 < RequestCpus < 3", "at byte 16: comparisons do not chain; add parentheses"),
            ("true == true != false", "at byte 13: comparisons do not chain; add parentheses"),
            ("Owner =?= \"a\" =!= true", "at byte 14: comparisons do not chain; add parentheses"),
            ("RequestMemory < 9223372036854775808", "at byte 16: integer is too large (at most 9223372036854775807)"),
            (
                "RequestMemory < 99999999999999999999999",
                "at byte 16: integer is too large (at most 9223372036854775807)",
            ),
            ("Owner > 3", "at byte 6: cannot compare a string with an integer (`>`)"),
            ("3 == Function", "at byte 2: cannot compare an integer with a string (`==`)"),
            ("true < false", "at byte 5: `<` cannot order booleans"),
            ("RequestCpus", "at byte 0: the requirement must be a boolean expression, found an integer"),
            ("(Owner)", "at byte 0: the requirement must be a boolean expression, found a string"),
            ("undefined", "at byte 0: the requirement must be a boolean expression, found undefined"),
            ("1 + 2", "at byte 2: unexpected character '+'"),
            ("Owner = \"a\"", "at byte 6: expected `==`, `=?=` or `=!=` after `=`"),
            ("Owner == \"a\" é", "at byte 13: unexpected character 'é'"),
            ("true && RequestCpus", "at byte 8: the operand of `&&` must be a boolean, found an integer"),
            ("Owner || true", "at byte 0: the operand of `||` must be a boolean, found a string"),
            ("!RequestDisk", "at byte 1: the operand of `!` must be a boolean, found an integer"),
            ("RequestCpus == !true", "at byte 15: expected a value, found \"!\""),
        ] {
            assert_eq!(parse_err(src), format!("requirement \"R\": {want}"), "{src}");
        }
    }

    #[test]
    fn the_error_format_of_the_docs() {
        let e = Requirement::parse(&config("MaxMem", "RequestMemory)", "too big"));
        assert_eq!(e.map(|r| r.name), Err("requirement \"MaxMem\": at byte 13: \")\" closes no \"(\"".into()));
    }

    #[test]
    fn nesting_is_limited_without_overflowing_the_stack() {
        let deep = "(".repeat(4000);
        assert_eq!(parse_err(&deep), "requirement \"R\": at byte 64: nested more than 64 deep");
        // 10,000 is refused for its length already; the depth limit alone also holds there.
        let deeper = "(".repeat(10_000);
        assert_eq!(parse_err(&deeper), "requirement \"R\": expression is 10000 bytes, more than 4096");
        let lexed = lex(&deeper).map(|t| t.len());
        assert_eq!(lexed.as_ref().ok(), Some(&10_001));
        let mut p = Parser { src: &deeper, toks: lex(&deeper).unwrap_or_default(), pos: 0, depth: 0 };
        assert_eq!(p.or().err().map(|e| e.to_string()), Some("at byte 64: nested more than 64 deep".into()));
        let nots = "!".repeat(4000);
        assert_eq!(parse_err(&nots), "requirement \"R\": at byte 64: nested more than 64 deep");
        let mixed = "!(".repeat(40) + "true" + &")".repeat(40);
        assert_eq!(parse_err(&mixed), "requirement \"R\": at byte 64: nested more than 64 deep");
        // Exactly the limit is fine.
        let ok = "(".repeat(63) + "!true" + &")".repeat(63);
        assert!(!req(&ok).holds(&ad()));
        let ok = "(".repeat(64) + "true" + &")".repeat(64);
        assert!(req(&ok).holds(&ad()));
        // A long flat chain is not nesting.
        let chain = vec!["RequestCpus == 2"; 200].join(" && ");
        assert!(req(&chain).holds(&ad()));
    }

    #[test]
    fn expressions_are_limited_in_length() {
        let just = " ".repeat(MAX_EXPRESSION_BYTES - 4) + "true";
        assert!(req(&just).holds(&ad()));
        let over = " ".repeat(MAX_EXPRESSION_BYTES - 3) + "true";
        assert_eq!(parse_err(&over), "requirement \"R\": expression is 4097 bytes, more than 4096");
    }

    #[test]
    fn names_and_messages_are_checked() {
        let err = |name: &str, message: &str| Requirement::parse(&config(name, "true", message)).map(|r| r.name);
        let refused = |name: &str, message: &str| err(name, message).err().unwrap_or_default();
        assert_eq!(refused("", "m"), "requirement \"\": name is empty");
        assert_eq!(
            refused("a b", "m"),
            "requirement \"a b\": name contains ' '; only letters, digits, `_` and `-` are allowed"
        );
        let long = "n".repeat(65);
        assert_eq!(
            refused(&long, "m"),
            format!("requirement \"{}\"…: name is 65 characters, more than 64", "n".repeat(64))
        );
        assert_eq!(err(&"n".repeat(64), "m").as_deref(), Ok(&*"n".repeat(64)));
        assert_eq!(err("Max-Mem_2", "m").as_deref(), Ok("Max-Mem_2"));
        assert_eq!(refused("R", ""), "requirement \"R\": message is empty");
        assert_eq!(refused("R", &"m".repeat(1025)), "requirement \"R\": message is 1025 bytes, more than 1024");
        assert!(err("R", &"m".repeat(1024)).is_ok());
        assert_eq!(refused("R", "bad\nline"), "requirement \"R\": message has a control character ('\\n') at byte 3");
        let r = req("true");
        assert_eq!((r.name(), r.message()), ("R", "no"));
    }

    #[test]
    fn parse_all_refuses_duplicate_names_and_bad_entries() {
        let ok = parse_all(&[config("A", "true", "a"), config("B", "false", "b")]);
        assert_eq!(
            ok.map(|v| v.iter().map(|r| r.name().to_owned()).collect::<Vec<_>>()),
            Ok(vec!["A".into(), "B".into()])
        );
        assert_eq!(
            parse_all(&[config("A", "true", "a"), config("B", "true", "b"), config("a", "true", "c")]).map(|v| v.len()),
            Err("requirement \"a\": name used twice".into())
        );
        assert_eq!(
            parse_all(&[config("A", "true", "a"), config("B", "true", "")]).map(|v| v.len()),
            Err("requirement \"B\": message is empty".into())
        );
        assert_eq!(
            parse_all(&[config("A", "true", "a"), config("", "true", "b")]).map(|v| v.len()),
            Err("requirement \"\": name is empty".into())
        );
        assert_eq!(
            parse_all(&[config("A", "Owner >", "a")]).map(|v| v.len()),
            Err("requirement \"A\": at byte 7: expected a value, found the end".into())
        );
        assert_eq!(parse_all(&[]).map(|v| v.len()), Ok(0));
    }

    #[test]
    fn first_violated_is_the_first_in_order() {
        let reqs = parse_all(&[
            config("Cpus", "RequestCpus <= 4", "too many CPUs"),
            config("Mem", "RequestMemory <= 1024", "too much memory"),
            config("Gpu", "RequestGPUs == 0 || AcctGroup == \"gpu\"", "Unauthorized GPU request"),
            config("Time", "RequestRuntime <= 3600", "too long"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let name = |ad: &JobAd| first_violated(&reqs, ad).map(|r| (r.name(), r.message()));
        assert_eq!(name(&ad()), None);
        assert_eq!(name(&JobAd { gpus: 1, runtime_s: 7200, ..ad() }), Some(("Gpu", "Unauthorized GPU request")));
        assert_eq!(
            name(&JobAd { gpus: 1, runtime_s: 7200, memory_mb: 4096, ..ad() }),
            Some(("Mem", "too much memory"))
        );
        assert_eq!(name(&JobAd { runtime_s: 7200, ..ad() }), Some(("Time", "too long")));
        assert_eq!(first_violated(&[], &ad()).map(Requirement::name), None);
    }

    #[test]
    fn the_config_refuses_unknown_fields() {
        let c: Result<RequirementConfig, _> =
            serde_json::from_str(r#"{"name":"A","requirement":"true","message":"m"}"#);
        assert_eq!(c.ok(), Some(config("A", "true", "m")));
        let c: Result<RequirementConfig, _> =
            serde_json::from_str(r#"{"name":"A","requirement":"true","message":"m","reason":"r"}"#);
        assert!(c.is_err_and(|e| e.to_string().contains("unknown field `reason`")));
    }
}
