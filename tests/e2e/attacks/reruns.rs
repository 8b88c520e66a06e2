//! "Re-derive this file" against its abusers. Another owner's developer cannot
//! re-derive a file: 404, worded as for a file no job wrote, so paths of others reveal nothing.
//! A file a job only read is no output, and a path that is not clean is refused before anything
//! is looked up. A re-run's outputs land in a scratch directory and fire nothing, even for a
//! function whose trigger covers the whole output directory: checked after a witness file in
//! the same directory has fired that function, not by waiting.

use super::failures::{downstream, fired_on, witness};
use htfaas::stack::demo_manifest;
use htfaas_functions::proto::{JobState, RerunVerdict};
use htfaas_functions::token::Scope;
use htfaas_tests::{start_stack, upload_checksum};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);
const INPUT: &str = "/data/raw/r.dat";
const SUM: &str = "/data/checksums/r.dat.checksums.json";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_is_the_owners_alone_and_its_outputs_fire_nothing() {
    let (dir, stack) = start_stack().await;
    let admin = stack.client().expect("client");
    admin.register(&demo_manifest(upload_checksum(&admin).await)).await.expect("register");
    // Fires on whatever lands in the checksum's output directory, the output itself first.
    downstream(&admin, "sums-watch", "/data/checksums/").await;
    admin.put_bytes(b"rerun attacks".to_vec(), INPUT).await.expect("put");
    let job = crate::failures::final_job(&admin, "checksum", INPUT).await;
    assert_eq!(job.state, JobState::Completed, "{job:#?}");
    crate::failures::final_job(&admin, "sums-watch", SUM).await;

    // Another owner's developer: the same 404 as for a file nobody wrote.
    let mallory = admin.clone().with_token(super::api_token(dir.path(), "mallory", Scope::Developer));
    let nobody = "/data/checksums/nobody.json";
    for file in [SUM, nobody] {
        let e = format!("{:#}", mallory.rerun(file).await.expect_err("refused"));
        assert!(e.contains("404") && e.contains(&format!("no completed job of yours wrote {file}")), "{e}");
    }
    // An input is not an output; a path that is not clean is not looked up.
    let e = format!("{:#}", admin.rerun(INPUT).await.expect_err("an input"));
    assert!(e.contains("404"), "{e}");
    for bad in ["/data/checksums/../raw/r.dat", "data/x", "/data/checksums/"] {
        let e = format!("{:#}", admin.rerun(bad).await.expect_err(bad));
        assert!(e.contains("400") && e.contains("not a clean absolute file path"), "{bad}: {e}");
    }

    // The owner's own developer may; the re-derived file lands in the scratch directory.
    let alice = admin.clone().with_token(super::api_token(dir.path(), "alice", Scope::Developer));
    let rerun = alice.rerun(SUM).await.expect("the owner re-derives her file");
    let (verdict, _) = alice.rerun_verdict(&rerun, LIMIT).await.expect("verdict");
    assert_eq!(verdict, RerunVerdict::Identical);
    assert!(admin.get_bytes(&rerun.expected).await.expect("get").is_some());

    // It fired nothing, once the witness did.
    witness(&admin, "sums-watch", "/data/checksums/").await;
    let mut fired = fired_on(&admin, "sums-watch").await;
    fired.sort();
    assert_eq!(fired, [SUM, "/data/checksums/witness.txt"], "nothing of {}", rerun.scratch);
    stack.stop().await.expect("clean stop");
}
