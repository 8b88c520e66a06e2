//! JavaScript functions, built by componentize-js 0.23.0 (`scripts/install-deps.sh`
//! installs it in `.tools/node`) through `htfaas fn build`'s code into WASI preview 2
//! components, run in the EP's runtime:
//!
//! - the `csvsum` example: per-column sums checked against values computed here, a malformed
//!   CSV failing with exit status 1 and the guest's message on stderr;
//! - `fn new --lang js` → `fn build` → `fn run` (`htfaas_ep::local`) on the template's sample.

use htfaas_tests::{built_function, dev_tools, run_guest_alone};

#[test]
fn the_javascript_example_sums_each_column_and_fails_cleanly_on_a_malformed_csv() {
    let wasm = built_function("examples/js/csvsum");
    let bytes = std::fs::read(&wasm).expect("read");
    assert_eq!(htfaas_ep::runtime::GuestKind::of(&bytes), htfaas_ep::runtime::GuestKind::Component);
    let mut text = String::from("event,adc,label\r\n");
    let (mut events, mut adcs) = (0.0, 0.0);
    for i in 0..300u64 {
        let adc = (i * 2_654_435_761) % 4096;
        text.push_str(&format!("{i},{adc},run{}\r\n", i % 3));
        events += i as f64;
        adcs += adc as f64;
    }
    let (run, outputs) = run_guest_alone(&wasm, "run7.csv", text.as_bytes(), &[]);
    assert!(run.outcome.is_success(), "{run:?}");
    let v: serde_json::Value = serde_json::from_slice(&outputs["run7.csv.sums.json"]).expect("JSON");
    assert_eq!(v["file"], "run7.csv");
    assert_eq!(v["rows"], 300);
    let col = |c: usize| {
        (v["columns"][c]["name"].clone(), v["columns"][c]["numbers"].clone(), v["columns"][c]["sum"].as_f64())
    };
    assert_eq!(col(0), ("event".into(), 300.into(), Some(events)));
    assert_eq!(col(1), ("adc".into(), 300.into(), Some(adcs)));
    assert_eq!(col(2), ("label".into(), 0.into(), Some(0.0)));

    let (run, outputs) = run_guest_alone(&wasm, "bad.csv", b"a,b\n1,2\n3\n", &[]);
    assert_eq!(run.outcome, htfaas_functions::proto::Outcome::Exited { exit_code: 1 }, "{run:?}");
    assert_eq!(String::from_utf8_lossy(&run.stderr), "csvsum: line 3: 1 fields, the header has 2\n");
    assert!(outputs.is_empty(), "{outputs:?}");
}

#[test]
fn fn_new_build_and_run_a_javascript_function() {
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path().join("hello");
    htfaas::devkit::new_project("hello", htfaas::devkit::Lang::Js, &dir).expect("new");
    let project = htfaas::devkit::Project::detect(&dir).expect("detect");
    assert_eq!(project.lang, htfaas::devkit::Lang::Js);
    let built = htfaas::devkit::build(&project, None, &dev_tools(&dir)).expect("build (componentize-js)");
    let sample = dir.join("sample.txt");
    let opts = htfaas_ep::local::LocalRunOptions {
        memory_mb: 256,
        runtime_s: 60,
        env: vec![],
        args: vec![],
        name: "hello".into(),
        fuel: None,
        log_limit_bytes: 4096,
        cache_dir: None,
    };
    let scratch = tempfile::tempdir().expect("scratch");
    let out = work.path().join("out");
    let ran = htfaas_ep::local::run_local(&built.path, &sample, scratch.path(), &out, &opts).expect("run");
    assert!(ran.run.outcome.is_success(), "{:?}", ran.run);
    assert_eq!(String::from_utf8_lossy(&ran.run.stdout), "hello: 4 lines\n");
    let text = std::fs::read_to_string(&sample).expect("sample");
    let got = std::fs::read(out.join("sample.txt.count.json")).expect("copied out");
    let v: serde_json::Value = serde_json::from_slice(&got).expect("JSON");
    assert_eq!(v["bytes"], text.len());
    assert_eq!(v["lines"], 4);
    assert_eq!(v["words"], text.split_whitespace().count());
    assert_eq!(ran.outputs.len(), 1);
    assert_eq!(ran.outputs[0].size, got.len() as u64);
}
