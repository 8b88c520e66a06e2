//! The requirement language's tests: parsing, errors (where and what), evaluation over job ads.

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
        Err(e) => e.to_string(),
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
        ("RequestMemory < 99999999999999999999999", "at byte 16: integer is too large (at most 9223372036854775807)"),
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
    assert_eq!(
        e.map(|r| r.name).map_err(|e| e.to_string()),
        Err("requirement \"MaxMem\": at byte 13: \")\" closes no \"(\"".into())
    );
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
    let refused = |name: &str, message: &str| err(name, message).err().map(|e| e.to_string()).unwrap_or_default();
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
    assert_eq!(ok.map(|v| v.iter().map(|r| r.name().to_owned()).collect::<Vec<_>>()), Ok(vec!["A".into(), "B".into()]));
    assert_eq!(
        parse_all(&[config("A", "true", "a"), config("B", "true", "b"), config("a", "true", "c")])
            .map(|v| v.len())
            .map_err(|e| e.to_string()),
        Err("requirement \"a\": name used twice".into())
    );
    assert_eq!(
        parse_all(&[config("A", "true", "a"), config("B", "true", "")]).map(|v| v.len()).map_err(|e| e.to_string()),
        Err("requirement \"B\": message is empty".into())
    );
    assert_eq!(
        parse_all(&[config("A", "true", "a"), config("", "true", "b")]).map(|v| v.len()).map_err(|e| e.to_string()),
        Err("requirement \"\": name is empty".into())
    );
    assert_eq!(
        parse_all(&[config("A", "Owner >", "a")]).map(|v| v.len()).map_err(|e| e.to_string()),
        Err("requirement \"A\": at byte 7: expected a value, found the end".into())
    );
    assert_eq!(parse_all(&[]).map(|v| v.len()).map_err(|e| e.to_string()), Ok(0));
    assert!(matches!(
        parse_all(&[config("A", "true", "a"), config("a", "true", "b")]),
        Err(RequirementError { problem: RequirementProblem::UsedTwice, .. })
    ));
    assert!(matches!(
        parse_all(&[config("A", "Owner >", "a")]),
        Err(RequirementError { problem: RequirementProblem::Expression(ParseError { at: Some(7), .. }), .. })
    ));
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
    assert_eq!(name(&JobAd { gpus: 1, runtime_s: 7200, memory_mb: 4096, ..ad() }), Some(("Mem", "too much memory")));
    assert_eq!(name(&JobAd { runtime_s: 7200, ..ad() }), Some(("Time", "too long")));
    assert_eq!(first_violated(&[], &ad()).map(Requirement::name), None);
}

#[test]
fn the_config_refuses_unknown_fields() {
    let c: Result<RequirementConfig, _> = serde_json::from_str(r#"{"name":"A","requirement":"true","message":"m"}"#);
    assert_eq!(c.ok(), Some(config("A", "true", "m")));
    let c: Result<RequirementConfig, _> =
        serde_json::from_str(r#"{"name":"A","requirement":"true","message":"m","reason":"r"}"#);
    assert!(c.is_err_and(|e| e.to_string().contains("unknown field `reason`")));
}
