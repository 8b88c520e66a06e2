//! Property tests of the trigger-rule matcher (`htfaas_functions::trigger`)
//! against hostile input: random rules built from every kind of test, with `and`, `or`, `not`
//! and parentheses, are evaluated against an independent model of the documented semantics
//! (three-valued, Kleene: `false and undefined` is false, `true or undefined` true, otherwise
//! undefined propagates; a rule naming neither `kind` nor `type` fires only on writes), and
//! the laws that follow are checked on the real evaluator: double negation, commutativity,
//! De Morgan, distributivity, the display round trip, path globs, and that an attribute the
//! event lacks never makes a rule true.

use htfaas_functions::event::{EventKind, EventSource, SourceKind, StorageEvent};
use htfaas_functions::glob::compile_glob;
use htfaas_functions::trigger::{Rule, Truth, quote};
use proptest::prelude::*;

const SOURCES: [SourceKind; 4] =
    [SourceKind::DcacheBilling, SourceKind::DcacheSse, SourceKind::XrootdNotify, SourceKind::Cloudevents];
/// Strings that rules and events share, so that comparisons hit as well as miss; quotes and
/// backslashes exercise the string escapes.
const WORDS: [&str; 6] = ["alice", "bob", "a\"b", "c\\d", "é", "exp:raw"];
const TYPES: [&str; 4] = ["transfer", "closew", "IN_CLOSE_WRITE", "remove"];
const SEGMENTS: [&str; 6] = ["data", "raw", "run42.h5", "x.tmp", "é", "a.root"];
const SUFFIXES: [&str; 5] = [".h5", ".tmp", "", "run42.h5", ".root"];
/// Size units and their factors (`kb` checks that units ignore case).
const UNITS: [(&str, u64); 7] =
    [("", 1), ("B", 1), ("kB", 1000), ("kb", 1000), ("KiB", 1024), ("MB", 1_000_000), ("MiB", 1 << 20)];

/// One test of the language, with what the model needs to evaluate it.
#[derive(Debug, Clone)]
enum Atom {
    /// `size <op> <n><unit>`.
    Size(&'static str, u64, usize),
    /// `size in lo..hi`.
    SizeIn(u64, u64),
    /// `owner == s` / `owner != s`.
    Owner(&'static str, bool),
    /// `owner in [...]`.
    OwnerIn(Vec<&'static str>),
    /// `class == s`.
    Class(&'static str),
    /// `class glob "exp:*"`.
    ClassGlobExp,
    /// `path prefix "/<seg>/"`.
    PathPrefix(&'static str),
    /// `path suffix s`.
    PathSuffix(&'static str),
    /// `name suffix s`.
    NameSuffix(&'static str),
    /// `kind == k` / `kind != k`.
    Kind(EventKind, bool),
    /// `kind in [...]`.
    KindIn(Vec<EventKind>),
    /// `source == s`.
    Source(SourceKind),
    /// `type == t`.
    Type(&'static str),
}

#[derive(Debug, Clone)]
enum Ast {
    Atom(Atom),
    Not(Box<Ast>),
    And(Box<Ast>, Box<Ast>),
    Or(Box<Ast>, Box<Ast>),
}

fn t(b: bool) -> Truth {
    if b { Truth::True } else { Truth::False }
}

fn not(a: Truth) -> Truth {
    match a {
        Truth::True => Truth::False,
        Truth::False => Truth::True,
        Truth::Undefined => Truth::Undefined,
    }
}

fn and(a: Truth, b: Truth) -> Truth {
    match (a, b) {
        (Truth::False, _) | (_, Truth::False) => Truth::False,
        (Truth::True, Truth::True) => Truth::True,
        _ => Truth::Undefined,
    }
}

fn or(a: Truth, b: Truth) -> Truth {
    not(and(not(a), not(b)))
}

fn defined<T>(v: Option<T>, f: impl FnOnce(T) -> bool) -> Truth {
    v.map_or(Truth::Undefined, |v| t(f(v)))
}

impl Atom {
    fn text(&self) -> String {
        match self {
            Atom::Size(op, n, unit) => format!("size {op} {n}{}", UNITS[*unit].0),
            Atom::SizeIn(lo, hi) => format!("size in {lo}..{hi}"),
            Atom::Owner(s, neg) => format!("owner {} {}", if *neg { "!=" } else { "==" }, quote(s)),
            Atom::OwnerIn(xs) => format!("owner in [{}]", xs.iter().map(|x| quote(x)).collect::<Vec<_>>().join(", ")),
            Atom::Class(s) => format!("class == {}", quote(s)),
            Atom::ClassGlobExp => r#"class glob "exp:*""#.to_owned(),
            Atom::PathPrefix(s) => format!("path prefix {}", quote(&format!("/{s}/"))),
            Atom::PathSuffix(s) => format!("path suffix {}", quote(s)),
            Atom::NameSuffix(s) => format!("name suffix {}", quote(s)),
            Atom::Kind(k, neg) => format!("kind {} {}", if *neg { "!=" } else { "==" }, quote(k.as_str())),
            Atom::KindIn(ks) => {
                format!("kind in [{}]", ks.iter().map(|k| quote(k.as_str())).collect::<Vec<_>>().join(","))
            }
            Atom::Source(s) => format!("source == {}", quote(s.as_str())),
            Atom::Type(s) => format!("type == {}", quote(s)),
        }
    }

    fn mentions_kind(&self) -> bool {
        matches!(self, Atom::Kind(..) | Atom::KindIn(_) | Atom::Type(_))
    }

    /// The documented meaning, written independently of the implementation.
    fn model(&self, e: &StorageEvent) -> Truth {
        let name = e.path.rsplit('/').next().unwrap_or("");
        match self {
            Atom::Size(op, n, unit) => {
                let n = n * UNITS[*unit].1;
                defined(e.size, |s| match *op {
                    "<" => s < n,
                    "<=" => s <= n,
                    ">" => s > n,
                    ">=" => s >= n,
                    "==" => s == n,
                    _ => s != n,
                })
            }
            Atom::SizeIn(lo, hi) => defined(e.size, |s| *lo <= s && s <= *hi),
            Atom::Owner(s, neg) => defined(e.owner.as_deref(), |o| (o == *s) != *neg),
            Atom::OwnerIn(xs) => defined(e.owner.as_deref(), |o| xs.contains(&o)),
            Atom::Class(s) => defined(e.storage_class.as_deref(), |c| c == *s),
            Atom::ClassGlobExp => defined(e.storage_class.as_deref(), |c| c.starts_with("exp:")),
            Atom::PathPrefix(s) => t(e.path.starts_with(&format!("/{s}/"))),
            Atom::PathSuffix(s) => t(e.path.ends_with(s)),
            Atom::NameSuffix(s) => t(name.ends_with(s)),
            Atom::Kind(k, neg) => t((e.kind == *k) != *neg),
            Atom::KindIn(ks) => t(ks.contains(&e.kind)),
            Atom::Source(s) => t(e.source.kind == *s),
            Atom::Type(s) => t(e.msg_type == *s),
        }
    }
}

impl Ast {
    /// Rule text, fully parenthesized below the top so that precedence cannot matter.
    fn text(&self) -> String {
        match self {
            Ast::Atom(a) => a.text(),
            Ast::Not(x) => format!("not ({})", x.text()),
            Ast::And(a, b) => format!("({}) and ({})", a.text(), b.text()),
            Ast::Or(a, b) => format!("({}) or ({})", a.text(), b.text()),
        }
    }

    fn mentions_kind(&self) -> bool {
        match self {
            Ast::Atom(a) => a.mentions_kind(),
            Ast::Not(x) => x.mentions_kind(),
            Ast::And(a, b) | Ast::Or(a, b) => a.mentions_kind() || b.mentions_kind(),
        }
    }

    /// Kleene logic over the atoms' model.
    fn model_expr(&self, e: &StorageEvent) -> Truth {
        match self {
            Ast::Atom(a) => a.model(e),
            Ast::Not(x) => not(x.model_expr(e)),
            Ast::And(a, b) => and(a.model_expr(e), b.model_expr(e)),
            Ast::Or(a, b) => or(a.model_expr(e), b.model_expr(e)),
        }
    }

    /// The whole rule: the default kind, then the expression.
    fn model(&self, e: &StorageEvent) -> Truth {
        if !self.mentions_kind() && e.kind != EventKind::Write {
            return Truth::False;
        }
        self.model_expr(e)
    }

    fn rule(&self) -> Rule {
        let text = self.text();
        Rule::parse(&text).unwrap_or_else(|e| panic!("generated rule {text:?} refused: {e}"))
    }
}

fn atom() -> impl Strategy<Value = Atom> {
    let word = || prop::sample::select(&WORDS[..]);
    let size = || prop_oneof![0u64..3, 999u64..1002, 1023u64..1026, Just(5_000_000u64)];
    prop_oneof![
        (prop::sample::select(&["<", "<=", ">", ">=", "==", "!="][..]), size(), 0..UNITS.len())
            .prop_map(|(op, n, u)| Atom::Size(op, n, u)),
        (size(), size()).prop_map(|(a, b)| Atom::SizeIn(a.min(b), a.max(b))),
        (word(), any::<bool>()).prop_map(|(s, neg)| Atom::Owner(s, neg)),
        prop::collection::vec(word(), 1..4).prop_map(Atom::OwnerIn),
        word().prop_map(Atom::Class),
        Just(Atom::ClassGlobExp),
        prop::sample::select(&SEGMENTS[..]).prop_map(Atom::PathPrefix),
        prop::sample::select(&SUFFIXES[..]).prop_map(Atom::PathSuffix),
        prop::sample::select(&SUFFIXES[..]).prop_map(Atom::NameSuffix),
        (prop::sample::select(&EventKind::ALL[..]), any::<bool>()).prop_map(|(k, neg)| Atom::Kind(k, neg)),
        prop::collection::vec(prop::sample::select(&EventKind::ALL[..]), 1..4).prop_map(Atom::KindIn),
        prop::sample::select(&SOURCES[..]).prop_map(Atom::Source),
        prop::sample::select(&TYPES[..]).prop_map(Atom::Type),
    ]
}

/// Rules without `kind`/`type` tests, so that the default kind does not apply to a part and
/// not to the whole.
fn kindless_atom() -> impl Strategy<Value = Atom> {
    atom().prop_filter("no kind or type test", |a| !a.mentions_kind())
}

fn ast_of(leaf: impl Strategy<Value = Atom> + 'static) -> impl Strategy<Value = Ast> {
    leaf.prop_map(Ast::Atom).prop_recursive(5, 32, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|x| Ast::Not(Box::new(x))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Ast::And(Box::new(a), Box::new(b))),
            (inner.clone(), inner).prop_map(|(a, b)| Ast::Or(Box::new(a), Box::new(b))),
        ]
    })
}

fn ast() -> impl Strategy<Value = Ast> {
    ast_of(atom())
}

fn event() -> impl Strategy<Value = StorageEvent> {
    let path =
        prop::collection::vec(prop::sample::select(&SEGMENTS[..]), 1..4).prop_map(|s| format!("/{}", s.join("/")));
    let size = prop::option::of(prop_oneof![0u64..3, 999u64..1002, 1023u64..1026, Just(5_000_000u64), any::<u64>()]);
    let text = || prop::option::of(prop::sample::select(&WORDS[..]).prop_map(str::to_owned));
    (
        prop::sample::select(&EventKind::ALL[..]),
        prop::sample::select(&SOURCES[..]),
        prop::sample::select(&TYPES[..]),
        path,
        size,
        text(),
        text(),
    )
        .prop_map(|(kind, source, msg_type, path, size, storage_class, owner)| StorageEvent {
            source: EventSource { kind: source, producer: "p".into(), message: None },
            kind,
            msg_type: msg_type.into(),
            path,
            size,
            storage_class,
            owner,
            macaroon: None,
            id: "dcache-billing:write:x".into(),
            time: None,
            traceparent: None,
        })
}

fn write_event() -> impl Strategy<Value = StorageEvent> {
    event().prop_map(|e| StorageEvent { kind: EventKind::Write, ..e })
}

/// Any string, including the characters the rule language treats specially.
fn any_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(&['/', '.', '"', '\\', '*', '?', '[', ']', '{', '}', 'é', '\n', '\0', ' '][..]),
            any::<char>(),
        ],
        0..24,
    )
    .prop_map(String::from_iter)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The evaluator agrees with the model on every rule and event.
    #[test]
    fn evaluation_matches_the_three_valued_model(a in ast(), e in event()) {
        let rule = a.rule();
        prop_assert_eq!(rule.evaluate(&e), a.model(&e), "{}", a.text());
        prop_assert_eq!(rule.matches(&e), a.model(&e) == Truth::True);
    }

    /// `not not a` is `a`; `not` swaps true and false and keeps undefined.
    #[test]
    fn double_negation_and_negation(a in ast(), e in write_event()) {
        let x = a.rule().evaluate(&e);
        let nn = Rule::parse(&format!("not not ({})", a.text())).expect("parses");
        prop_assert_eq!(nn.evaluate(&e), x);
        let n = Rule::parse(&format!("not ({})", a.text())).expect("parses");
        prop_assert_eq!(n.evaluate(&e), not(x));
    }

    /// `and` is the Kleene minimum and `or` the maximum of the parts, both commutative, with
    /// De Morgan's laws and distributivity.
    #[test]
    fn and_or_laws(a in ast(), b in ast(), c in ast(), e in write_event()) {
        let eval = |text: String| Rule::parse(&text).expect("parses").evaluate(&e);
        let (ta, tb, tc) = (a.rule().evaluate(&e), b.rule().evaluate(&e), c.rule().evaluate(&e));
        let (sa, sb, sc) = (a.text(), b.text(), c.text());
        prop_assert_eq!(eval(format!("({sa}) and ({sb})")), and(ta, tb));
        prop_assert_eq!(eval(format!("({sa}) or ({sb})")), or(ta, tb));
        prop_assert_eq!(eval(format!("({sa}) and ({sb})")), eval(format!("({sb}) and ({sa})")));
        prop_assert_eq!(eval(format!("({sa}) or ({sb})")), eval(format!("({sb}) or ({sa})")));
        prop_assert_eq!(eval(format!("not (({sa}) and ({sb}))")), eval(format!("not ({sa}) or not ({sb})")));
        prop_assert_eq!(eval(format!("not (({sa}) or ({sb}))")), eval(format!("not ({sa}) and not ({sb})")));
        prop_assert_eq!(
            eval(format!("({sa}) and (({sb}) or ({sc}))")),
            eval(format!("(({sa}) and ({sb})) or (({sa}) and ({sc}))"))
        );
        // Flat chains (`a and b and c`) mean the nested ones.
        prop_assert_eq!(eval(format!("({sa}) and ({sb}) and ({sc})")), and(and(ta, tb), tc));
        prop_assert_eq!(eval(format!("({sa}) or ({sb}) or ({sc})")), or(or(ta, tb), tc));
    }

    /// `not` binds tighter than `and`, and `and` tighter than `or`.
    #[test]
    fn precedence(a in ast(), b in ast(), c in ast(), e in write_event()) {
        let (sa, sb, sc) = (a.text(), b.text(), c.text());
        let eval = |text: String| Rule::parse(&text).expect("parses").evaluate(&e);
        prop_assert_eq!(eval(format!("({sa}) or ({sb}) and ({sc})")), eval(format!("({sa}) or (({sb}) and ({sc}))")));
        prop_assert_eq!(eval(format!("not ({sa}) and ({sb})")), eval(format!("(not ({sa})) and ({sb})")));
    }

    /// A rule's displayed text is a rule that means the same, also after `and` with a path glob.
    #[test]
    fn display_round_trips(a in ast(), e in event()) {
        let rule = a.rule();
        prop_assert_eq!(rule.to_string(), a.text());
        prop_assert_eq!(rule.text(), a.text());
        let again = Rule::parse(&rule.to_string()).expect("a displayed rule parses");
        prop_assert_eq!(again.evaluate(&e), rule.evaluate(&e));
        let both = Rule::path_glob("/data/**").expect("glob").and(rule.clone());
        let reparsed = Rule::parse(&both.to_string()).expect("the text of an and parses");
        prop_assert_eq!(reparsed.evaluate(&e), both.evaluate(&e), "{}", both);
    }

    /// Without a `kind` or `type` test, a rule is false on every event that is not a write.
    #[test]
    fn kindless_rules_fire_only_on_writes(a in ast_of(kindless_atom()), e in event()) {
        let rule = a.rule();
        if e.kind != EventKind::Write {
            prop_assert_eq!(rule.evaluate(&e), Truth::False);
        } else {
            prop_assert_eq!(rule.evaluate(&e), a.model_expr(&e));
        }
    }

    /// An attribute the event lacks never makes a rule true (or false) that is undecided
    /// without it: removing size, class and owner only ever turns a result into undefined;
    /// and a rule whose only tests are on missing attributes is undefined, never true.
    #[test]
    fn missing_attributes_are_undefined_not_true(a in ast(), e in event()) {
        let rule = a.rule();
        let bare = StorageEvent { size: None, storage_class: None, owner: None, ..e.clone() };
        let (full, less) = (rule.evaluate(&e), rule.evaluate(&bare));
        prop_assert!(less == full || less == Truth::Undefined, "{}: {:?} → {:?}", a.text(), full, less);
        if full != Truth::True {
            prop_assert!(!rule.matches(&bare));
        }
    }

    #[test]
    fn tests_on_missing_attributes_alone_are_undefined(
        a in ast_of(atom().prop_filter("an attribute test", |a| matches!(a,
            Atom::Size(..) | Atom::SizeIn(..) | Atom::Owner(..) | Atom::OwnerIn(_) | Atom::Class(_) | Atom::ClassGlobExp))),
        e in write_event(),
    ) {
        let bare = StorageEvent { size: None, storage_class: None, owner: None, ..e };
        prop_assert_eq!(a.rule().evaluate(&bare), Truth::Undefined, "{}", a.text());
    }

    /// `path glob "<g>"` (parsed), `Rule::path_glob(g)` (a plain `trigger.path`) and the shared
    /// glob compiler agree on every path, and a literal glob matches exactly its own path.
    #[test]
    fn path_globs_match_what_the_glob_matches(
        g in prop::collection::vec(prop::sample::select(&["data", "raw", "*", "**", "*.h5", "run?2.h5", "é"][..]), 1..4),
        p in prop::collection::vec(prop::sample::select(&SEGMENTS[..]), 1..5),
    ) {
        let glob = format!("/{}", g.join("/"));
        let path = format!("/{}", p.join("/"));
        let e = StorageEvent { path: path.clone(), ..plain_write() };
        let parsed = Rule::parse(&format!("path glob {}", quote(&glob))).expect("parses");
        let plain = Rule::path_glob(&glob).expect("compiles");
        let expect = compile_glob(&glob).expect("compiles").is_match(&path);
        prop_assert_eq!(parsed.matches(&e), expect, "{} on {}", glob, path);
        prop_assert_eq!(plain.matches(&e), expect);
        // A single `*` never crosses a `/`; `**` spans any depth.
        if g.iter().all(|s| *s != "**") {
            prop_assert!(!expect || g.len() == p.len(), "{} matched {}", glob, path);
        }
        let literal = Rule::path_glob(&path).expect("a clean path is a glob");
        prop_assert!(literal.matches(&e));
        let deeper = StorageEvent { path: format!("{path}/x"), ..plain_write() };
        prop_assert!(!literal.matches(&deeper));
        let below = Rule::path_glob(&format!("{path}/**")).expect("compiles");
        let elsewhere = StorageEvent { path: "/elsewhere/x".into(), ..plain_write() };
        prop_assert!(below.matches(&deeper));
        prop_assert!(!below.matches(&elsewhere));
    }

    /// Keywords and field names ignore ASCII case.
    #[test]
    fn keywords_ignore_case(a in ast(), e in event()) {
        let upper = a.text().replace("size", "SIZE").replace(" and ", " AND ").replace("not ", "Not ").replace(" or ", " oR ")
            .replace("owner", "Owner").replace("path", "PATH").replace("kind", "KinD");
        // Only keywords were renamed: the strings in this generator have none of these words.
        let rule = Rule::parse(&upper).expect("parses");
        prop_assert_eq!(rule.evaluate(&e), a.rule().evaluate(&e), "{}", upper);
    }

    /// Parsing and evaluating arbitrary text and events never panics.
    #[test]
    fn nothing_panics(text in any_text(), a in ast(), path in any_text(), owner in any_text(), size in any::<Option<u64>>()) {
        if let Ok(rule) = Rule::parse(&text) {
            let _ = rule.evaluate(&plain_write());
        }
        let e = StorageEvent { path, owner: Some(owner.clone()), storage_class: Some(owner), size, ..plain_write() };
        let _ = a.rule().evaluate(&e);
        let _ = Rule::parse(&format!("owner == {}", quote(&text)));
    }
}

fn plain_write() -> StorageEvent {
    StorageEvent {
        source: EventSource { kind: SourceKind::DcacheBilling, producer: "p".into(), message: None },
        kind: EventKind::Write,
        msg_type: "transfer".into(),
        path: "/data/raw/run42.h5".into(),
        size: Some(1),
        storage_class: None,
        owner: None,
        macaroon: None,
        id: "dcache-billing:write:x".into(),
        time: None,
        traceparent: None,
    }
}
