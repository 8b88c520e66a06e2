//! The multi-host harness's quick version, run by the test command: a site of network
//! namespaces ([`htfaas::cluster`]) under 600 events while a NATS node dies, an EP host's link
//! is cut and the service host restarts; then every check of the crash harness, the faults'
//! own effects and the NAT probe. An integration test of the root package, because each host
//! runs the `htfaas` binary's subcommands (`CARGO_BIN_EXE_htfaas`). Needs root for the
//! namespaces: skipped without, except under CI, where it must run.
//! `htfaas cluster-test` is the longer run (2,000 events).

use htfaas::cluster::ClusterOptions;
use std::path::PathBuf;
use std::time::Duration;

#[test]
fn a_site_of_hosts_loses_nothing_when_a_nats_node_dies_a_link_is_cut_and_the_service_host_restarts() {
    if let Some(why) = htfaas::netns::Site::unavailable() {
        assert!(std::env::var_os("CI").is_none(), "CI must run the multi-host harness: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let opts = ClusterOptions {
        htfaas: PathBuf::from(env!("CARGO_BIN_EXE_htfaas")),
        nats_binary: None,
        wasm_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/target/wasm32-wasip1/release"),
        events: 600,
        rate: 20,
        dir: None,
        drain_timeout: Duration::from_secs(300),
    };
    let report = htfaas::cluster::run(opts).expect("the harness runs");
    println!("{report}");
    assert_eq!(report.stream_replicas, 3, "{report}");
    assert_eq!(report.faults.len(), 3, "a NATS node killed, a link cut, the service host restarted: {report}");
    assert!(report.ep1_busy_at_cut && report.moved_from_ep1 > 0, "the cut EP's jobs ran elsewhere: {report}");
    let (state, why) = report.nat_probe.clone().expect("the NAT probe ended");
    assert_eq!(state, htfaas_functions::proto::JobState::Failed, "{why}");
    assert!(why.contains("403") && why.contains("ip: caveats"), "{why}");
    assert!(report.passed(), "{report}");
}
