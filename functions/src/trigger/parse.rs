//! The rule language's lexer and recursive-descent parser: text to an [`Expr`], with the
//! column of the first problem, the depth and list limits, and the checks of every literal.
//!
//! Must not know: how an expression is evaluated on an event, manifests, namespaces.

use super::eval::{Expr, Field, SizeOp, Test};
use super::{MAX_DEPTH, MAX_LIST_ITEMS, RuleError, err, quote};
use globset::GlobMatcher;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Tok {
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
pub(super) struct Token {
    pub(super) tok: Tok,
    /// Character column of its first character, from 1.
    pub(super) col: usize,
    /// Its text, for error messages.
    text: String,
}

impl Token {
    pub(super) fn describe(&self) -> String {
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

pub(super) fn lex(src: &str) -> Result<Vec<Token>, RuleError> {
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

pub(super) struct Parser {
    pub(super) toks: Vec<Token>,
    pub(super) pos: usize,
    /// Current nesting of parentheses and `not`.
    pub(super) depth: usize,
    /// Whether a `kind` or `type` test was seen (no default kind then).
    pub(super) mentions_kind: bool,
}

impl Parser {
    pub(super) fn peek(&self) -> &Token {
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

    pub(super) fn or(&mut self) -> Result<Expr, RuleError> {
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
                    crate::glob::compile_glob(&s)
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
