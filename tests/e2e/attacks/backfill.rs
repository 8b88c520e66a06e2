//! Back-fill against its abusers: another owner's developer cannot back-fill a
//! function (403), nor can its owner list outside the function's read namespace (403, before the
//! storage is asked anything) or name a directory that is not clean (400); an unknown function
//! is 404 and a disabled one 409. None of these fires anything. The storage's own refusals of a
//! listing (no `LIST` right, another tree, `Depth: infinity`): `storage/tests/http.rs`.

use htfaas::stack::demo_manifest;
use htfaas_functions::proto::BackfillRequest;
use htfaas_functions::token::Scope;
use htfaas_tests::{start_stack, upload_checksum};

fn request(function: &str, prefix: &str) -> BackfillRequest {
    BackfillRequest { function: function.into(), prefix: prefix.into(), dry_run: false, min_age_s: Some(0) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_is_the_owners_alone_and_stays_in_its_namespace() {
    let (dir, stack) = start_stack().await;
    let admin = stack.client().expect("client");
    admin.register(&demo_manifest(upload_checksum(&admin).await)).await.expect("register");
    admin.put_bytes(b"x".to_vec(), "/data/raw/x.dat").await.expect("put");
    crate::failures::final_job(&admin, "checksum", "/data/raw/x.dat").await;
    let refused = |r: anyhow::Result<_>, status: &str, words: &str| {
        let e = format!("{:#}", r.map(|_: htfaas_functions::proto::BackfillReport| ()).expect_err("refused"));
        assert!(e.contains(status) && e.contains(words), "{status} {words}: {e}");
    };
    let mallory = admin.clone().with_token(super::api_token(dir.path(), "mallory", Scope::Developer));
    refused(mallory.backfill(&request("checksum", "/data/raw/")).await, "403", "belongs to another owner");
    let alice = admin.clone().with_token(super::api_token(dir.path(), "alice", Scope::Developer));
    for outside in ["/", "/etc/", "/datax/"] {
        refused(alice.backfill(&request("checksum", outside)).await, "403", "outside the read namespace of alice");
    }
    for bad in ["data/raw", "/data/../etc", "/data//raw"] {
        refused(alice.backfill(&request("checksum", bad)).await, "400", "not a clean absolute directory");
    }
    refused(alice.backfill(&request("nosuch", "/data/raw/")).await, "404", "nosuch");
    admin.set_function_enabled("checksum", false).await.expect("disable");
    refused(alice.backfill(&request("checksum", "/data/raw/")).await, "409", "disabled");
    assert_eq!(admin.jobs().await.expect("jobs").len(), 1, "nothing fired");
    stack.stop().await.expect("clean stop");
}
