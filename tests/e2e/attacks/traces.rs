//! Traces' tenancy and inputs: another owner's developer who knows (or guesses) a
//! trace id gets none of its jobs, the scheduler reads nothing but a well-formed trace id from a
//! query (a crafted one is a 400, at the gateway and at the scheduler), and a producer that
//! names another event's trace only labels its own jobs with it: each job keeps its owner.

use htfaas_functions::proto::{CLOUDEVENTS_SUBJECT_PREFIX, JobState};
use htfaas_functions::token::Scope;
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use std::time::Duration;

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// A developer token of `sub`.
fn api_token(dir: &std::path::Path, sub: &str) -> String {
    super::api_token(dir, sub, Scope::Developer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_id_opens_no_other_owners_jobs_and_a_crafted_one_is_refused() {
    let (dir, stack) = start_stack().await;
    let admin = stack.client().expect("client");
    admin.put_bytes(b"x".to_vec(), "/data/raw/t.dat").await.expect("put");
    htfaas_tests::events_settled(&admin).await;
    let digest = upload_checksum(&admin).await;
    admin.register(&htfaas::stack::demo_manifest(digest)).await.expect("register");
    let headers: Vec<(String, String)> = [
        ("ce-specversion", "1.0"),
        ("ce-id", "t-1"),
        ("ce-source", "//lab.example/daq"),
        ("ce-type", "org.example.daq.closed"),
        ("ce-subject", "/data/raw/t.dat"),
        ("ce-traceparent", &format!("00-{TRACE}-b7ad6b7169203331-01")),
        ("content-type", "application/json"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let subject = format!("{CLOUDEVENTS_SUBJECT_PREFIX}.daq");
    admin.publish_event_with_headers(&subject, &headers, br#"{"kind":"write"}"#.to_vec()).await.expect("publish");
    let owner = wait_for("the traced job completed", Duration::from_secs(60), || async {
        let jobs = admin.jobs_of_trace(TRACE).await.ok()?;
        jobs.into_iter().find(|j| j.state == JobState::Completed).map(|j| j.owner)
    })
    .await;

    // Its owner's developer sees it; another's gets nothing, by the trace id or the job's.
    let alice = admin.clone().with_token(api_token(dir.path(), &owner));
    assert_eq!(alice.jobs_of_trace(TRACE).await.expect("alice's").len(), 1);
    let mallory = admin.clone().with_token(api_token(dir.path(), "mallory"));
    assert!(mallory.jobs_of_trace(TRACE).await.expect("mallory's").is_empty());
    assert!(mallory.trace(TRACE).await.is_err(), "no job of the trace for mallory");

    // A crafted trace query never reaches a query of the scheduler's store.
    let info = stack.info().clone();
    let http = htfaas_gateway::http_client().expect("client");
    for (who, token) in [("admin", info.admin_token.clone()), ("developer", api_token(dir.path(), "mallory"))] {
        for bad in ["' OR 1=1 --", "4BF92F3577B34DA6A3CE929D0E0E4736", "00000000000000000000000000000000", "%"] {
            let url = reqwest::Url::parse_with_params(&format!("{}/v1/jobs", info.gateway_url), &[("trace", bad)])
                .expect("a url");
            let resp = http.get(url).bearer_auth(&token).send().await.expect("asked");
            assert_eq!(resp.status().as_u16(), 400, "{who} with trace {bad:?}");
        }
    }
    stack.stop().await.expect("stop");
}
