//! Function code against its EP, through the whole path (upload → event → gateway → scheduler →
//! EP): a guest that sleeps far past its deadline, again and again, more times than the EP's
//! pool has slots, and a guest that opens files without end. Each ends with its own reason, and
//! the EP runs the next function as if nothing happened.

use htfaas::client::Client;
use htfaas::stack::demo_manifest;
use htfaas_functions::Resources;
use htfaas_functions::proto::{JobRecord, JobState};
use htfaas_tests::{guest_wasm, start_stack, upload_checksum, wait_for};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// Registers the hostile example guest as `name` with `args`, fired by `/data/<name>/**`.
async fn register_hostile(client: &Client, name: &str, args: &[&str], resources: Resources) {
    let module = std::fs::read(guest_wasm("hostile")).expect("read hostile.wasm");
    let mut m = demo_manifest(client.upload_module(module).await.expect("upload"));
    m.name = name.into();
    m.trigger.path = format!("/data/{name}/**");
    m.outputs.dir = format!("/data/{name}-out/");
    m.args = args.iter().map(|a| a.to_string()).collect();
    m.resources = resources;
    client.register(&m).await.expect("register");
}

/// The jobs fired under `/data/<dir>/`, once `n` of them have ended (failed or completed).
async fn ended(client: &Client, dir: &str, n: usize) -> Vec<JobRecord> {
    let prefix = format!("/data/{dir}/");
    wait_for(&format!("{n} jobs under {prefix} to end"), LIMIT, || async {
        let jobs: Vec<JobRecord> = client
            .jobs()
            .await
            .ok()?
            .into_iter()
            .filter(|j| j.event.path.starts_with(&prefix))
            .filter(|j| matches!(j.state, JobState::Failed | JobState::Completed))
            .collect();
        (jobs.len() >= n).then_some(jobs)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_that_sleep_past_their_deadline_or_hoard_files_leave_the_ep_serving() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    client.register(&demo_manifest(upload_checksum(&client).await)).await.expect("register checksum");
    register_hostile(&client, "sleeper", &["sleep", "86400"], Resources::new(1, 64, 1)).await;
    register_hostile(&client, "hoarder", &["fds", "100000"], Resources::new(1, 64, 60)).await;

    // One sleeper more than the EP's pool has slots (cpus + 16): each used to keep its slot
    // after its deadline, and the last would have found none.
    let cpus = htfaas::stack::StackOptions::new(std::path::Path::new("unused")).ep_slots.cpus as usize;
    let sleepers = cpus + 17;
    for i in 0..sleepers {
        client.put_bytes(b"zz".to_vec(), &format!("/data/sleeper/s{i:02}")).await.expect("put");
    }
    client.put_bytes(b"x".to_vec(), "/data/hoarder/in").await.expect("put");
    for job in ended(&client, "sleeper", sleepers).await {
        assert_eq!((job.state, job.reason.as_str()), (JobState::Failed, "wall-time limit of 1 s exceeded"), "{job:#?}");
        assert!(job.outputs.is_empty(), "{job:#?}");
    }
    let [hoarder] = <[JobRecord; 1]>::try_from(ended(&client, "hoarder", 1).await).expect("one job");
    assert_eq!(hoarder.state, JobState::Failed, "{hoarder:#?}");
    assert!(
        hoarder.reason.starts_with("trapped: too many open files: the guest held 256 WASI resources at once"),
        "{hoarder:#?}"
    );

    // The same EP runs the next function.
    client.put_bytes(b"Wikipedia".to_vec(), "/data/raw/after.txt").await.expect("put");
    let out = wait_for("the checksum after the attacks", LIMIT, || async {
        client.get_bytes("/data/checksums/after.txt.checksums.json").await.ok().flatten()
    })
    .await;
    assert!(String::from_utf8_lossy(&out).contains("\"adler32\":\"11e60398\""), "{}", String::from_utf8_lossy(&out));
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_functions_own_narrower_output_limit_reaches_its_ep_and_is_enforced() {
    let (_dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let mut m = demo_manifest(upload_checksum(&client).await);
    (m.name, m.trigger.path, m.outputs.dir) = ("tight".into(), "/data/tight/**".into(), "/data/tight-out/".into());
    // The checksum's output is a JSON document of more than 10 bytes; the EP allows 16 GiB.
    m.limits.max_output_bytes = Some(10);
    client.register(&m).await.expect("register");
    m.limits.max_output_bytes = Some(0);
    let e = client.register(&m).await.expect_err("zero is refused").to_string();
    assert!(e.contains("limits.max_output_bytes") && e.contains("at least 1"), "{e}");
    client.put_bytes(b"some input".to_vec(), "/data/tight/in.dat").await.expect("put");
    let job = ended(&client, "tight", 1).await.remove(0);
    assert_eq!(job.state, JobState::Failed, "{job:?}");
    assert!(job.reason.contains("more than the output byte limit of 10"), "{job:?}");
    assert_eq!(client.get_bytes("/data/tight-out/in.dat.checksums.json").await.expect("get"), None, "nothing stored");
    stack.stop().await.expect("stop");
}
