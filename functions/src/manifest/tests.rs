//! The manifest's validation: each refused field named, and what old records read as.

use super::*;
use crate::collect::Collect;

fn manifest() -> FunctionManifest {
    FunctionManifest {
        runtime: Default::default(),
        command: Vec::new(),
        handler: false,
        retry: None,
        name: "checksum".into(),
        owner: "alice".into(),
        module: Digest::of(b"m"),
        trigger: Trigger::on_path("/data/raw/**"),
        resources: Resources::default(),
        outputs: Outputs::into_dir("/data/checksums/"),
        args: vec![],
        env: vec![],
        annex: None,
        class: None,
        limits: Default::default(),
        group: None,
        secrets: Default::default(),
        webhook: None,
        max_concurrent: None,
        inputs: Inputs::default(),
        vacate_s: None,
        checkpoint: None,
    }
}

fn collect_count(n: u32) -> Collect {
    Collect { key: None, count: Some(n), marker: None, quiet_s: None, timeout_s: None }
}

#[test]
fn a_good_manifest_validates() {
    assert_eq!(manifest().validate(), Ok(()));
}

#[test]
fn bad_fields_are_named() {
    type Mutation = Box<dyn Fn(&mut FunctionManifest)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("name", Box::new(|m| m.name = "Bad Name".into())),
        ("trigger.path", Box::new(|m| m.trigger.path = "data/raw/**".into())),
        ("trigger.path", Box::new(|m| m.trigger.path = "/data/[raw".into())),
        ("resources.cpus", Box::new(|m| m.resources.cpus = 0)),
        ("resources.gpus", Box::new(|m| m.resources.gpus = MAX_GPUS + 1)),
        ("resources.disk_mb", Box::new(|m| m.resources.disk_mb = MAX_DISK_MB + 1)),
        ("class", Box::new(|m| m.class = Some("Lite!".into()))),
        ("outputs.dir", Box::new(|m| m.outputs.dir = "/data/../etc/".into())),
        ("outputs.dir", Box::new(|m| m.outputs.dir = "/data/out".into())),
        ("env", Box::new(|m| m.env = vec![("A=B".into(), "c".into())])),
        ("trigger", Box::new(|m| m.trigger = Trigger::on_path(""))),
        (
            "handler",
            Box::new(|m| {
                (m.runtime, m.command, m.handler) = (RuntimeKind::Native, vec!["/bin/h".into()], true);
                m.trigger = Trigger { schedule: Some("0 3 * * *".into()), ..Trigger::on_path("") };
            }),
        ),
        ("trigger.rule", Box::new(|m| m.trigger.rule = Some("size >".into()))),
        ("trigger.rule", Box::new(|m| m.trigger = Trigger::on_rule(""))),
        ("trigger.rate", Box::new(|m| m.trigger.rate = Some(RateLimit { per_s: 0.0, burst: 1 }))),
        ("max_concurrent", Box::new(|m| m.max_concurrent = Some(0))),
        ("trigger.schedule", Box::new(|m| m.trigger.schedule = Some("0 3 * *".into()))),
        ("trigger.schedule", Box::new(|m| m.trigger.schedule = Some("0 25 * * *".into()))),
        ("trigger.collect", Box::new(|m| m.trigger.collect = Some(collect_count(0)))),
        (
            "trigger.collect",
            Box::new(|m| m.trigger.collect = Some(Collect { marker: Some("_C".into()), ..collect_count(2) })),
        ),
        (
            "trigger.collect",
            Box::new(|m| {
                m.trigger.collect = Some(collect_count(2));
                m.trigger.debounce_s = Some(5);
            }),
        ),
        ("max_concurrent", Box::new(|m| m.max_concurrent = Some(MAX_CONCURRENT + 1))),
        ("inputs.ref", Box::new(|m| m.inputs.refs = vec!["calib/p.h5".into()])),
        ("inputs.ref", Box::new(|m| m.inputs.refs = vec!["/data/../etc/passwd".into()])),
        ("inputs.ref", Box::new(|m| m.inputs.refs = vec!["/".into()])),
        ("inputs.ref", Box::new(|m| m.inputs.refs = vec!["/a".into(), "/a".into()])),
        ("trigger.rate", Box::new(|m| m.trigger.rate = Some(RateLimit { per_s: f64::NAN, burst: 1 }))),
        ("trigger.rate", Box::new(|m| m.trigger.rate = Some(RateLimit { per_s: 1e6, burst: 1 }))),
        ("trigger.rate", Box::new(|m| m.trigger.rate = Some(RateLimit { per_s: 1.0, burst: 0 }))),
        ("trigger.debounce_s", Box::new(|m| m.trigger.debounce_s = Some(MAX_DEBOUNCE_S + 1))),
    ];
    for (field, mutate) in cases {
        let mut m = manifest();
        mutate(&mut m);
        assert_eq!(m.validate().map_err(|e| e.field), Err(field));
    }
}

/// A schedule with neither a path glob nor a rule runs on no file: it validates, means no
/// rule, and says so; without the schedule the same trigger is refused.
#[test]
fn a_schedule_without_a_path_or_rule_runs_on_no_file() {
    let mut m = manifest();
    m.trigger = Trigger { schedule: Some("0 3 * * *".into()), ..Trigger::on_path("") };
    m.inputs.refs = vec!["/data/daily/".into()];
    assert_eq!(m.validate(), Ok(()));
    assert!(m.trigger.on_no_file());
    assert!(m.trigger.compile().is_err(), "no rule: no event fires it");
    assert_eq!(m.trigger.to_string(), r#"no file at each tick of "0 3 * * *""#);
    for not in
        [Trigger::on_path("/data/**"), Trigger { schedule: Some("* * * * *".into()), ..Trigger::on_path("/a/**") }]
    {
        assert!(!not.on_no_file(), "{not}");
    }
    m.trigger.schedule = None;
    assert_eq!(m.validate().map_err(|e| e.field), Err("trigger"));
    // A native command started per run may run on no file; a handler may not.
    m.trigger.schedule = Some("0 3 * * *".into());
    (m.runtime, m.command) = (RuntimeKind::Native, vec!["/bin/summary".into()]);
    assert_eq!(m.validate(), Ok(()));
    m.handler = true;
    let e = m.validate().expect_err("a handler on no file");
    assert_eq!(e.field, "handler");
    assert!(e.to_string().contains("cannot be scheduled on no file"), "{e}");
}

#[test]
fn a_bad_rule_is_refused_with_its_column() {
    let mut m = manifest();
    m.trigger.rule = Some(r#"path glob and size > 1"#.into());
    let e = m.validate().expect_err("refused");
    assert_eq!(e.field, "trigger.rule");
    assert_eq!(
        e.to_string(),
        r#"invalid manifest: trigger.rule: at column 11: expected a string after "glob", found "and""#
    );
}

#[test]
fn triggers_with_a_rule_rate_and_debounce_validate() {
    let mut m = manifest();
    m.trigger = Trigger::on_rule(r#"path suffix ".h5" and size > 1MB"#);
    m.trigger.rate = Some(RateLimit { per_s: 0.5, burst: 10 });
    m.trigger.debounce_s = Some(30);
    assert_eq!(m.validate(), Ok(()));
    m.trigger.path = "/data/raw/**".into();
    assert_eq!(m.validate(), Ok(()));
}

#[test]
fn a_trigger_compiles_to_its_glob_and_its_rule() {
    use crate::event::{EventKind, EventSource, SourceKind, StorageEvent};
    let event = |path: &str, size: u64| StorageEvent {
        source: EventSource { kind: SourceKind::DcacheBilling, producer: "p".into(), message: None },
        kind: EventKind::Write,
        msg_type: "transfer".into(),
        path: path.into(),
        size: Some(size),
        storage_class: None,
        owner: None,
        macaroon: None,
        id: "x".into(),
        time: None,
        traceparent: None,
    };
    let glob = Trigger::on_path("/data/raw/**").compile().expect("compiles");
    assert!(glob.matches(&event("/data/raw/a", 1)) && !glob.matches(&event("/data/b", 1)));
    let rule = Trigger::on_rule("size > 10").compile().expect("compiles");
    assert!(rule.matches(&event("/data/b", 11)) && !rule.matches(&event("/data/b", 10)));
    let both = Trigger { rule: Some("size > 10".into()), ..Trigger::on_path("/data/raw/**") };
    let both = both.compile().expect("compiles");
    assert!(both.matches(&event("/data/raw/a", 11)));
    assert!(!both.matches(&event("/data/raw/a", 10)));
    assert!(!both.matches(&event("/data/b", 11)));
    assert_eq!(Trigger::on_path("").compile().err().map(|e| e.column), Some(1));
    assert_eq!(Trigger::on_rule("size >").compile().err().map(|e| e.column), Some(7));
}

#[test]
fn stored_triggers_read_as_before_and_round_trip() {
    let old: Trigger = serde_json::from_str(r#"{"path": "/data/raw/**"}"#).expect("old trigger parses");
    assert_eq!(old, Trigger::on_path("/data/raw/**"));
    assert_eq!(serde_json::to_string(&old).expect("json"), r#"{"path":"/data/raw/**"}"#);
    let new = Trigger {
        rule: Some("size > 1MB".into()),
        rate: Some(RateLimit { per_s: 2.5, burst: 4 }),
        debounce_s: Some(60),
        ..Trigger::on_path("")
    };
    let json = serde_json::to_string(&new).expect("json");
    assert_eq!(json, r#"{"rule":"size > 1MB","rate":{"per_s":2.5,"burst":4},"debounce_s":60}"#);
    assert_eq!(serde_json::from_str::<Trigger>(&json).expect("parses"), new);
    assert!(serde_json::from_str::<Trigger>(r#"{"path": "/a", "glob": "x"}"#).is_err());
    assert_eq!(new.to_string(), "size > 1MB");
    let both = Trigger { path: "/data/**".into(), ..new };
    assert_eq!(both.to_string(), r#"path glob "/data/**" and (size > 1MB)"#);
}

#[test]
fn clean_paths() {
    for ok in ["/", "/a", "/a/b/", "/a/b.c"] {
        assert!(is_clean_abs_path(ok), "{ok}");
    }
    for bad in ["", "a", "/a//b", "/a/../b", "/./a", "/a\\b", "/a/\0"] {
        assert!(!is_clean_abs_path(bad), "{bad}");
    }
}

/// A native function's vacate time: within the run time and [`MAX_VACATE_S`], refused for
/// wasm, and absent from stored records that never had one.
#[test]
fn a_vacate_time_is_native_bounded_by_the_run_time_and_optional() {
    let native = || FunctionManifest {
        runtime: RuntimeKind::Native,
        command: vec!["/bin/run".into()],
        resources: Resources::new(1, 256, 600),
        ..manifest()
    };
    let with = |v: u64, m: FunctionManifest| FunctionManifest { vacate_s: Some(v), ..m };
    assert_eq!(with(0, native()).validate(), Ok(()), "0: killed at once");
    assert_eq!(with(599, native()).validate(), Ok(()));
    let refused = |m: FunctionManifest| m.validate().map_err(|e| e.field);
    assert_eq!(refused(with(600, native())), Err("vacate_s"), "as long as the run time");
    assert_eq!(refused(with(5, manifest())), Err("vacate_s"), "wasm has no SIGTERM");
    let class_default = FunctionManifest { resources: Resources::new(1, 256, 0), ..native() };
    assert_eq!(with(MAX_VACATE_S, class_default.clone()).validate(), Ok(()));
    assert_eq!(refused(with(MAX_VACATE_S + 1, class_default)), Err("vacate_s"));
    let e = with(600, native()).validate().expect_err("refused");
    assert_eq!(
        e.to_string(),
        "invalid manifest: vacate_s: must be 0..=1800 and below resources.runtime_s (it is counted inside the run time)"
    );
    let json = serde_json::to_string(&native()).expect("json");
    assert!(!json.contains("vacate_s"), "none is not written: {json}");
    let back: FunctionManifest = serde_json::from_str(&json).expect("an old record reads");
    assert_eq!(back.vacate_s, None);
}
