//! Tokens issued by an admin: the bearer of a submit token runs a registered function on a
//! file through the same path a triggered job takes, within the token's limits, once per use.

use htfaas::stack::{SubmitGrant, demo_manifest, mint_submit_token};
use htfaas_functions::Resources;
use htfaas_functions::namespace::Right;
use htfaas_functions::proto::JobState;
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use std::time::Duration;

fn grant(owner: &str) -> SubmitGrant {
    SubmitGrant {
        owner: owner.into(),
        jobs: 1,
        limits: Resources::new(1, 512, 120),
        function: None,
        group: None,
        ttl_s: 600,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_token_runs_one_job_accounted_to_its_owner_and_is_refused_beyond_its_grant() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    // The upload fires it once for alice (the function's owner); bob's token runs it again.
    let mut m = demo_manifest(digest);
    m.trigger.path = "/data/manual/**".into();
    // Both runs write the same output, the second replacing the first's (without `replace`, the
    // storage refuses a file another writer wrote). Each run acts as its own principal: both
    // need the grant.
    m.outputs.replace = true;
    for owner in [htfaas::stack::USER, "bob"] {
        client.grant(owner, Right::Replace, "/data/checksums/").await.expect("grant replace");
    }
    client.register(&m).await.expect("register");
    client.put_bytes(b"by hand".to_vec(), "/data/manual/x.dat").await.expect("put");

    // Alice's run ends first, always: bob's then replaces its output.
    wait_for("alice's output", Duration::from_secs(60), || async {
        client.get_bytes("/data/checksums/x.dat.checksums.json").await.ok().flatten()
    })
    .await;
    htfaas_tests::share_data(&client, "bob").await;
    let token = mint_submit_token(dir.path(), &grant("bob")).expect("mint");
    let reply = client.run_function(&token, "checksum", "/data/manual/x.dat").await.expect("submit");
    let job = wait_for("bob's job", Duration::from_secs(60), || async {
        let jobs = client.jobs().await.expect("jobs");
        jobs.into_iter().find(|j| j.id == reply.job_id && j.state == JobState::Completed)
    })
    .await;
    assert_eq!(job.owner, "bob", "accounted to the token's subject");
    assert_eq!(job.event.source, "submit");
    assert!(client.get_bytes("/data/checksums/x.dat.checksums.json").await.expect("get").is_some());
    let bob = client.accounting().await.expect("accounts").into_iter().find(|a| a.owner == "bob").expect("bob");
    assert_eq!(bob.jobs_completed, 1);

    // Single use.
    let again = client.run_function(&token, "checksum", "/data/manual/x.dat").await.expect_err("used up");
    assert!(again.to_string().contains("already used"), "{again:#}");
    // Over a limit: the function asks 256 MiB.
    let mut small = grant("bob");
    small.limits.memory_mb = 128;
    let err = client
        .run_function(&mint_submit_token(dir.path(), &small).expect("mint"), "checksum", "/data/manual/x.dat")
        .await
        .expect_err("over the memory limit");
    assert!(err.to_string().contains("memory"), "{err:#}");
    // Outside the function's trigger.
    let err = client
        .run_function(&mint_submit_token(dir.path(), &grant("bob")).expect("mint"), "checksum", "/etc/passwd")
        .await
        .expect_err("outside the trigger");
    assert!(err.to_string().contains("does not match the trigger"), "{err:#}");
    // Pinned to another function.
    let mut pinned = grant("bob");
    pinned.function = Some(htfaas_functions::Digest::of(b"another module"));
    let err = client
        .run_function(&mint_submit_token(dir.path(), &pinned).expect("mint"), "checksum", "/data/manual/x.dat")
        .await
        .expect_err("other function");
    assert!(err.to_string().contains("does not allow function"), "{err:#}");
    // Forged, and garbage.
    let (forger, _) = htfaas_functions::token::SigningKey::generate("gateway-1").expect("keygen");
    let forged = {
        let now = htfaas_functions::token::now_s();
        forger
            .sign(&htfaas_functions::token::SubmitClaims {
                iss: "htfaas-gateway".into(),
                sub: "mallory".into(),
                aud: htfaas_functions::token::SUBMIT_AUDIENCE.into(),
                exp: now + 60,
                iat: now,
                jti: htfaas_functions::token::new_jti(),
                jobs: 100,
                cpus: 64,
                memory_mb: 1 << 20,
                runtime_s: 86_400,
                function: None,
                group: None,
            })
            .expect("sign")
    };
    let err = client.run_function(&forged, "checksum", "/data/manual/x.dat").await.expect_err("forged");
    assert!(err.to_string().contains("401"), "{err:#}");
    let err = client.run_function("garbage", "checksum", "/data/manual/x.dat").await.expect_err("garbage");
    assert!(err.to_string().contains("401"), "{err:#}");

    let bobs: Vec<_> = client.jobs().await.expect("jobs").into_iter().filter(|j| j.owner == "bob").collect();
    assert_eq!(bobs.len(), 1, "only the one good submission made a job: {bobs:#?}");
    stack.stop().await.expect("clean stop");
}
