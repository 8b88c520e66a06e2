//! The crash harness's quick version, run by the test command: 300 events, every component
//! killed once (SIGKILL) at a random moment and started again, then every check of
//! [`htfaas::crash`]. An integration test of the root package, because it runs the `htfaas`
//! binary's subcommands as the component processes (`CARGO_BIN_EXE_htfaas`).
//! `htfaas crash-test` is the full run (10,000 events). The long-job harness
//! ([`htfaas::crash::long`], `htfaas crash-test --long`) runs here with a job of 120 steps.

use htfaas::crash::CrashOptions;
use htfaas::crash::long::{Kind, LongOptions};
use htfaas::procs::Component;
use std::path::PathBuf;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_component_killed_at_random_loses_nothing_and_runs_nothing_twice() {
    let wasm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/target/wasm32-wasip1/release");
    let mut opts = CrashOptions::new(PathBuf::from(env!("CARGO_BIN_EXE_htfaas")), wasm);
    opts.events = 300;
    opts.rate = 15;
    opts.drain_timeout = Duration::from_secs(300);
    println!("seed {} (replay: htfaas crash-test --events 300 --rate 15 --seed {})", opts.seed, opts.seed);
    let report = htfaas::crash::run(opts).await.expect("the harness runs");
    println!("{report}");
    let mut killed: Vec<Component> = report.kills.iter().map(|k| k.component).collect();
    killed.sort();
    assert_eq!(killed, Component::ALL.to_vec(), "each component killed once");
    assert!(report.passed(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_job_outlives_a_scheduler_restart_a_link_cut_token_renewals_and_a_move_with_an_uninterrupted_runs_output()
 {
    let wasm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/target/wasm32-wasip1/release");
    let mut opts = LongOptions::new(PathBuf::from(env!("CARGO_BIN_EXE_htfaas")), wasm);
    // Two minutes of steps: the first EP's part (about 80 s) and a part on the second.
    opts.steps = 120;
    let report = htfaas::crash::long::run(opts).await.expect("the harness runs");
    println!("{report}");
    let kinds: Vec<_> = report.interruptions.iter().map(|i| i.kind).collect();
    for kind in [Kind::SchedulerRestart, Kind::LinkCut, Kind::TokenRenewal, Kind::Resume] {
        assert!(kinds.contains(&kind), "{kind:?} happened during the run: {kinds:?}");
    }
    assert!(report.passed(), "{report}");
}
