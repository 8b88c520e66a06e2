//! The rule language's tests: syntax, errors, evaluation, path bounds, properties.

use super::*;
use crate::event::EventSource;

/// A dCache write of 5 MB of `/data/raw/run42/a.h5`, class `exp:raw`, by alice.
fn write() -> StorageEvent {
    StorageEvent {
        source: EventSource { kind: SourceKind::DcacheBilling, producer: "pool-a@poolDomain".into(), message: None },
        kind: EventKind::Write,
        msg_type: "transfer".into(),
        path: "/data/raw/run42/a.h5".into(),
        size: Some(5_000_000),
        storage_class: Some("exp:raw".into()),
        owner: Some("alice".into()),
        macaroon: None,
        id: "dcache-billing:transfer:0001/s".into(),
        time: None,
        traceparent: None,
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
    let removes = Rule::path_glob("/data/raw/**").expect("glob").and(Rule::parse(r#"kind == "remove""#).expect("rule"));
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
        SourceKind::DcacheBilling
        | SourceKind::DcacheSse
        | SourceKind::XrootdNotify
        | SourceKind::Cloudevents
        | SourceKind::Backfill => SOURCES.contains(&k),
    };
    assert!(SOURCES.into_iter().all(listed));
    assert_eq!(SOURCES.len(), 5);
}
