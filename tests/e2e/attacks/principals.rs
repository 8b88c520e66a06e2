//! Principals: a function name has one owner, and a run gets only what its own principal may
//! have. The bearer who starts a run and the function's owner are different people: a manual
//! run, a re-run of its output and its writes are the bearer's; the owner's secrets, outputs
//! and name stay the owner's. Each attack was seen to succeed against an earlier build; each is
//! refused here with a clear message, and nothing of the victim's changes.

use super::{api_token, post, submit_token};
use htfaas_functions::manifest::{Outputs, Trigger, Webhook};
use htfaas_functions::namespace::Right;
use htfaas_functions::proto::{JobRecord, JobState};
use htfaas_functions::token::Scope;
use htfaas_functions::{Digest, FunctionManifest};
use htfaas_tests::{
    events_settled, gateway_metrics, guest_wasm, htfaas_binary, register_spin, share_data, start_stack,
    start_stack_with, upload_checksum, wait_for,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// `owner`'s checksum function `name` on `/data/raw/**`, writing into `out`.
fn sums(name: &str, owner: &str, module: &Digest, out: &str) -> FunctionManifest {
    FunctionManifest {
        name: name.into(),
        owner: owner.into(),
        outputs: Outputs::into_dir(out),
        ..htfaas::stack::demo_manifest(module.clone())
    }
}

async fn job_in(client: &htfaas::client::Client, id: &str, state: JobState) -> Option<JobRecord> {
    client.job(id).await.ok().filter(|j| j.state == state)
}

/// Attack 1: alice and mallory register the same new name at the same moment, 100 times. The
/// owner check and the version insert used to be separate steps, and both got 201 (19 of 40
/// trials): the name then held versions of both, and the later one's owner opened the other's
/// secrets. The name is claimed in the registration's transaction: exactly one gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_registering_one_new_name_at_once_never_share_it() {
    let (dir, stack) = start_stack().await;
    let admin = stack.client().expect("client");
    let module = upload_checksum(&admin).await;
    share_data(&admin, "mallory").await;
    let gw = stack.info().gateway_url.clone();
    let alice = api_token(dir.path(), "alice", Scope::Developer);
    let mallory = api_token(dir.path(), "mallory", Scope::Developer);
    let mut wins = BTreeMap::<&str, u32>::new();
    for i in 0..100 {
        let name = format!("race{i}");
        let mine = json!(sums(&name, "alice", &module, "/data/race/"));
        let theirs = json!(sums(&name, "mallory", &module, "/data/race/"));
        let ((a, a_body), (m, m_body)) =
            tokio::join!(post(&gw, "/v1/functions", &alice, &mine), post(&gw, "/v1/functions", &mallory, &theirs));
        let (winner, loser_body) = match (a, m) {
            (201, 403) => ("alice", m_body),
            (403, 201) => ("mallory", a_body),
            other => panic!("{name}: exactly one registration passes, got {other:?}: {a_body} {m_body}"),
        };
        assert_eq!(loser_body["error"], format!("function {name} belongs to another owner"), "{name}");
        *wins.entry(winner).or_default() += 1;
        let owners: std::collections::BTreeSet<String> =
            admin.function_versions(&name).await.expect("versions").into_iter().map(|v| v.manifest.owner).collect();
        assert_eq!(owners.len(), 1, "{name} holds versions of {owners:?}");
    }
    assert_eq!(wins.values().sum::<u32>(), 100, "{wins:?}");
    // The loser cannot add a version later either.
    let (status, _) = post(&gw, "/v1/functions", &alice, &json!(sums("race0", "alice", &module, "/data/r/"))).await;
    let (status_m, _) =
        post(&gw, "/v1/functions", &mallory, &json!(sums("race0", "mallory", &module, "/data/r/"))).await;
    assert_eq!([status, status_m].iter().filter(|s| **s == 201).count(), 1, "{status} {status_m}");
    stack.stop().await.expect("stop");
}

/// Attack 2, and a token's group: bob, with a submit token and read and write grants over
/// alice's function's paths, runs alice's function that has secrets. The job used to be bob's
/// with alice's secrets in its environment, which bob read from its log and outputs. Only
/// alice's own tokens run it by hand now. A token's `group` claim widens bob's namespace only
/// with a `group` grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_never_gets_the_function_owners_secrets_nor_a_group_it_was_not_granted() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let probe = client.upload_module(std::fs::read(guest_wasm("sandbox-probe")).expect("wasm")).await.expect("up");
    let manifest = FunctionManifest {
        name: "probe".into(),
        outputs: Outputs::into_dir("/data/probe-out/"),
        args: vec!["env:DB_PASSWORD".into()],
        secrets: vec!["DB_PASSWORD".into()],
        ..htfaas::stack::demo_manifest(probe)
    };
    client.register(&manifest).await.expect("register");
    let secret = BTreeMap::from([("DB_PASSWORD".to_owned(), "alices-secret-4f1a".to_owned())]);
    client.set_function_secrets("probe", &secret).await.expect("secret");
    share_data(&client, "bob").await;
    client.put_bytes(b"x".to_vec(), "/data/raw/x.dat").await.expect("upload");

    let bob = submit_token(dir.path(), "bob", None);
    let e = format!("{:#}", client.run_function(&bob, "probe", "/data/raw/x.dat").await.expect_err("refused"));
    assert!(
        e.contains("403")
            && e.contains(
                "function probe runs with secrets of its owner alice (DB_PASSWORD): only alice runs it by hand"
            ),
        "{e}"
    );
    assert!(client.jobs().await.expect("jobs").iter().all(|j| j.owner != "bob"), "bob got a job");

    // A group claim bob holds no grant for widens nothing: refused, naming the group.
    let digest = upload_checksum(&client).await;
    client.register(&sums("plain", "alice", &digest, "/data/plain-out/")).await.expect("register");
    let grouped = submit_token(dir.path(), "bob", Some("atlas"));
    let e = format!("{:#}", client.run_function(&grouped, "plain", "/data/raw/x.dat").await.expect_err("group"));
    assert!(e.contains("bob may not charge runs to the accounting group \"atlas\" (no group grant)"), "{e}");

    // alice's own token runs it, with her secret.
    let alice = submit_token(dir.path(), "alice", None);
    let id = client.run_function(&alice, "probe", "/data/raw/x.dat").await.expect("alice runs hers").job_id;
    let job = wait_for("alice's run", LIMIT, || job_in(&client, &id, JobState::Completed)).await;
    assert_eq!(job.owner, "alice");
    stack.stop().await.expect("stop");
}

/// Attack 3: `audit rerun` of a file that bob's manual run of alice's function wrote used to
/// make a job of alice (her token, her account, her secrets) whose output bob read. A re-run is
/// the original job's owner's: bob's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_of_a_bearers_job_is_the_bearers() {
    let (dir, stack) = start_stack().await;
    let admin = stack.client().expect("client");
    let module = upload_checksum(&admin).await;
    share_data(&admin, "bob").await;
    // The input lands before the function exists: only bob's manual run runs on it.
    admin.put_bytes(b"bob's input".to_vec(), "/data/raw/b.dat").await.expect("upload");
    events_settled(&admin).await;
    admin.register(&sums("sums", "alice", &module, "/data/sums/")).await.expect("register");
    let bob = submit_token(dir.path(), "bob", None);
    let id = admin.run_function(&bob, "sums", "/data/raw/b.dat").await.expect("bob runs it").job_id;
    let job = wait_for("bob's run", LIMIT, || job_in(&admin, &id, JobState::Completed)).await;
    assert_eq!(job.owner, "bob");

    let bob_dev = admin.clone().with_token(api_token(dir.path(), "bob", Scope::Developer));
    let rerun = bob_dev.rerun("/data/sums/b.dat.checksums.json").await.expect("bob re-derives his file");
    let again = wait_for("the re-run", LIMIT, || job_in(&admin, &rerun.rerun_job, JobState::Completed)).await;
    assert_eq!(again.owner, "bob", "a re-run of bob's job is bob's: {again:?}");
    assert_eq!(again.group, None);
    // alice's developer cannot re-derive bob's file: it is no job of hers.
    let alice_dev = admin.clone().with_token(api_token(dir.path(), "alice", Scope::Developer));
    let e = format!("{:#}", alice_dev.rerun("/data/sums/b.dat.checksums.json").await.expect_err("not hers"));
    assert!(e.contains("404") && e.contains("no completed job of yours wrote"), "{e}");
    stack.stop().await.expect("stop");
}

/// Attack 4: a function rolled back to v1, then disabled, then deleted, still ran v2 from a
/// submit token (manual runs took the latest version and checked neither). A manual run runs
/// the version that fires: the pinned one; nothing when disabled (409) or deleted (404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_run_obeys_the_pin_disabled_and_deleted() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let module = upload_checksum(&client).await;
    client.put_bytes(b"x".to_vec(), "/data/raw/l.dat").await.expect("upload");
    events_settled(&client).await;
    client.register(&sums("life", "alice", &module, "/data/life1/")).await.expect("v1");
    client.register(&sums("life", "alice", &module, "/data/life2/")).await.expect("v2");
    client.pin_function("life", Some(1)).await.expect("roll back to v1");
    let alice = submit_token(dir.path(), "alice", None);
    let id = client.run_function(&alice, "life", "/data/raw/l.dat").await.expect("runs").job_id;
    assert_eq!(client.job(&id).await.expect("job").version, 1, "the pinned version runs");

    client.set_function_enabled("life", false).await.expect("disable");
    let e = format!("{:#}", client.run_function(&alice, "life", "/data/raw/l.dat").await.expect_err("disabled"));
    assert!(e.contains("409") && e.contains("function life is disabled"), "{e}");
    client.set_function_enabled("life", true).await.expect("enable");
    client.delete_function("life").await.expect("delete");
    let e = format!("{:#}", client.run_function(&alice, "life", "/data/raw/l.dat").await.expect_err("deleted"));
    assert!(e.contains("404") && e.contains("not found"), "{e}");
    let versions: Vec<u32> = client.jobs().await.expect("jobs").iter().map(|j| j.version).collect();
    assert_eq!(versions, [1], "one manual run, of v1");
    stack.stop().await.expect("stop");
}

/// Attack 5: mallory, granted write in alice's function's output directory, gets a write file
/// credential there: its macaroon had the same path scope as the function's write macaroon, so
/// the storage's "the same scope may rewrite" rule let it replace alice's output (and lineage
/// still named alice's job as the writer). Rewrites are decided by the writer's identity now:
/// the credential is mallory's, the output the function's runs'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_credential_never_rewrites_a_functions_output() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let module = upload_checksum(&client).await;
    client.register(&sums("sums", "alice", &module, "/data/sums/")).await.expect("register");
    client.put_bytes(b"alice's data".to_vec(), "/data/raw/a.dat").await.expect("upload");
    let output = "/data/sums/a.dat.checksums.json";
    let original = wait_for("alice's output", LIMIT, || async { client.get_bytes(output).await.ok()? }).await;
    client.grant("mallory", Right::Write, "/data/sums/").await.expect("grant");

    let gw = stack.info().gateway_url.clone();
    let mallory = api_token(dir.path(), "mallory", Scope::Developer);
    let (status, cred) = post(&gw, "/v1/files/credential", &mallory, &json!({"path": output, "access": "write"})).await;
    assert_eq!(status, 200, "{cred}");
    let put = |body: &'static str, path: &str| {
        htfaas_gateway::http_client()
            .expect("client")
            .put(format!("{}{path}", stack.info().storage_url))
            .bearer_auth(cred["macaroon"].as_str().unwrap_or_default())
            .body(body)
            .send()
    };
    let resp = put("forged", output).await.expect("put");
    assert_eq!(resp.status().as_u16(), 403);
    let text = resp.text().await.unwrap_or_default();
    assert!(text.contains("was not written by this macaroon's writer: replacing it needs DELETE"), "{text}");
    assert_eq!(client.get_bytes(output).await.expect("get"), Some(original), "alice's output is unchanged");
    // The credential still creates, and rewrites what it wrote itself.
    assert_eq!(put("mine", "/data/sums/mallory.txt").await.expect("put").status().as_u16(), 201);
    assert_eq!(put("mine again", "/data/sums/mallory.txt").await.expect("put").status().as_u16(), 200);
    stack.stop().await.expect("stop");
}

/// Attack 6: bob's job is held, an admin revokes bob's read grant, bob releases the job, and it
/// read the file (its read macaroon still valid). Revoking a grant now removes the unfinished
/// jobs that needed it, naming the grant, so there is nothing left to release: bob's own, and
/// bob's runs of a function whose owner's grant it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_grant_stops_a_held_job_from_being_released() {
    let (dir, stack) = start_stack().await;
    let admin = stack.client().expect("client");
    register_spin(&admin).await;
    share_data(&admin, "bob").await;
    let bob = submit_token(dir.path(), "bob", None);
    let id = admin.run_function(&bob, "spin", "/data/spin/in.dat").await.expect("submit").job_id;
    wait_for("bob's job to run", LIMIT, || job_in(&admin, &id, JobState::Running)).await;
    let bob_dev = admin.clone().with_token(api_token(dir.path(), "bob", Scope::Developer));
    bob_dev.job_action(&id, "hold", "later").await.expect("bob holds his job");

    admin.revoke_grant("bob", Right::Read, "/data/").await.expect("revoke");
    let job = admin.job(&id).await.expect("job");
    assert_eq!(job.state, JobState::Removed, "{job:?}");
    assert!(
        job.reason.contains("the grant bob read /data/ was revoked")
            && job.reason.contains("/data/spin/in.dat is outside the read namespace of bob"),
        "{}",
        job.reason
    );
    let e = format!("{:#}", bob_dev.job_action(&id, "release", "now").await.expect_err("nothing to release"));
    assert!(e.contains("403") || e.contains("409"), "{e}");
    assert_eq!(admin.job(&id).await.expect("job").state, JobState::Removed);

    // The function owner's grant counts too: bob's held run of carol's function goes when
    // carol's read grant does.
    admin.grant("bob", Right::Read, "/data/").await.expect("grant again");
    for (right, dir) in [(Right::Read, "/data/spin/"), (Right::Write, "/data/cspin-out/")] {
        admin.grant("carol", right, dir).await.expect("grant carol");
    }
    let spin = admin.function("spin").await.expect("spin").record.manifest;
    let cspin = FunctionManifest {
        name: "cspin".into(),
        owner: "carol".into(),
        outputs: Outputs::into_dir("/data/cspin-out/"),
        ..spin
    };
    admin.register(&cspin).await.expect("carol's function");
    let bob = submit_token(dir.path(), "bob", None);
    let id = admin.run_function(&bob, "cspin", "/data/spin/in.dat").await.expect("submit").job_id;
    wait_for("bob's run of carol's function", LIMIT, || job_in(&admin, &id, JobState::Running)).await;
    bob_dev.job_action(&id, "hold", "later").await.expect("bob holds his job");
    admin.revoke_grant("carol", Right::Read, "/data/spin/").await.expect("revoke carol's");
    let job = admin.job(&id).await.expect("job");
    assert_eq!(job.state, JobState::Removed, "{job:?}");
    assert!(job.reason.contains("/data/spin/in.dat is outside the read namespace of carol"), "{}", job.reason);
    stack.stop().await.expect("stop");
}

/// Attack 7: `htfaas login` wrote the token into an existing 0644 profile (mode kept) or
/// through a symbolic link planted at the profile's path, and accepted a plain `http://`
/// gateway. The profile is opened without following a link and made 0600; http needs
/// `--insecure-http`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_keeps_the_token_private_and_off_plain_http() {
    use std::os::unix::fs::PermissionsExt as _;
    let (dir, stack) = start_stack_with(|o| o.tls = true).await;
    let info = stack.info().clone();
    let ca = info.ca_file.clone().expect("the stack's CA");
    let home = tempfile::tempdir().expect("home");
    let h = home.path();
    std::fs::write(h.join("alice.token"), api_token(dir.path(), "alice", Scope::Developer)).expect("token");
    let login = |gateway: String, profile: &'static str, extra: &'static [&'static str]| {
        let (h, ca) = (h.to_owned(), ca.clone());
        async move {
            tokio::process::Command::new(htfaas_binary())
                .args(["login", "--gateway", &gateway, "--token-file", "alice.token", "--profile", profile])
                .arg("--ca-file")
                .arg(&ca)
                .args(extra)
                .current_dir(&h)
                .env("HTFAAS_CONFIG_DIR", h.join("config"))
                .env_remove("HTFAAS_API_TOKEN")
                .output()
                .await
                .expect("run htfaas")
        }
    };
    let profiles = h.join("config/profiles");
    std::fs::create_dir_all(&profiles).expect("profiles");

    // A profile readable by others already there: the token goes in, and it is 0600 after.
    std::fs::write(profiles.join("default.json"), "{}").expect("old profile");
    std::fs::set_permissions(profiles.join("default.json"), std::fs::Permissions::from_mode(0o644)).expect("644");
    let out = login(info.gateway_url.clone(), "default", &[]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mode = std::fs::metadata(profiles.join("default.json")).expect("profile").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");

    // A link planted at the profile's path: refused, and its target untouched.
    let target = h.join("world-readable.txt");
    std::fs::write(&target, "nothing secret").expect("target");
    std::os::unix::fs::symlink(&target, profiles.join("linked.json")).expect("symlink");
    let out = login(info.gateway_url.clone(), "linked", &[]).await;
    assert!(!out.status.success(), "wrote through a link");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a symbolic link"), "{out:?}");
    assert_eq!(std::fs::read_to_string(&target).expect("target"), "nothing secret");

    // Plain http: refused before anything is sent, unless asked for.
    let plain = info.gateway_url.replacen("https://", "http://", 1);
    let out = login(plain.clone(), "plain", &[]).await;
    assert!(!out.status.success(), "logged in over plain http");
    assert!(String::from_utf8_lossy(&out.stderr).contains("would cross the network in clear"), "{out:?}");
    assert!(!profiles.join("plain.json").exists());
    stack.stop().await.expect("stop");
}

/// Attack 8: a later version listing the webhook's key among its run secrets saw it (and could
/// forge the earlier version's signed notifications); a webhook URL could use any port of an
/// allowed host; an allowed host name that resolves to loopback was delivered to. The key is a
/// kind of its own that no version's runs get, hosts are matched with their ports, and a
/// receiver's resolved addresses must be public or listed by the site.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_key_stays_out_of_runs_and_deliveries_go_only_where_the_site_allows() {
    // A receiver on loopback that counts connections: it must get none.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((_conn, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let (_dir, stack) = start_stack_with(|o| {
        o.gateway_settings.insert("webhook_hosts".into(), json!(["hooks.example.org", format!("localhost:{port}")]));
    })
    .await;
    let client = stack.client().expect("client");
    let hostile = client.upload_module(std::fs::read(guest_wasm("hostile")).expect("wasm")).await.expect("up");
    let hooked = |name: &str, url: &str| FunctionManifest {
        name: name.into(),
        trigger: Trigger::on_path(format!("/data/{name}-in/**")),
        args: vec!["exit".into(), "3".into()],
        outputs: Outputs::into_dir(format!("/data/{name}-out/")),
        webhook: Some(Webhook { url: url.into(), key_secret: Webhook::DEFAULT_KEY_SECRET.into() }),
        ..htfaas::stack::demo_manifest(hostile.clone())
    };

    // The key in a later version's run secrets: refused, naming why.
    client.register(&hooked("keyed", "https://hooks.example.org/h")).await.expect("v1");
    let leaking = FunctionManifest { webhook: None, secrets: vec!["WEBHOOK_KEY".into()], ..hooked("keyed", "") };
    let e = format!("{:#}", client.register(&leaking).await.expect_err("refused"));
    assert!(
        e.contains("400") && e.contains("WEBHOOK_KEY is the signing key of this function's failure webhook"),
        "{e}"
    );
    // Another port of an allowed host.
    let e =
        format!("{:#}", client.register(&hooked("ported", "https://hooks.example.org:22/h")).await.expect_err("port"));
    assert!(e.contains("400") && e.contains("hooks.example.org:22 is not a host and port this site allows"), "{e}");

    // An allowed name that resolves to loopback: registered, and its delivery given up
    // without a connection.
    let local = hooked("local", &format!("https://localhost:{port}/h"));
    client.register(&local).await.expect("an allowed host and port");
    let key = BTreeMap::from([(Webhook::DEFAULT_KEY_SECRET.to_owned(), "k".to_owned())]);
    client.set_function_secrets("local", &key).await.expect("key");
    client.put_bytes(b"x".to_vec(), "/data/local-in/hook.dat").await.expect("upload");
    let info = stack.info().clone();
    wait_for("the delivery given up", LIMIT, || async {
        let text = gateway_metrics(&info).await?;
        text.contains(r#"htfaas_gateway_webhook_deliveries_total{outcome="given_up"} 1"#).then_some(())
    })
    .await;
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0, "the gateway connected to loopback");
    stack.stop().await.expect("stop");
}
