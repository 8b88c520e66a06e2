//! The site's own identities, against a real OpenID provider (`oidc-provider`): its RS256
//! access tokens sign users in at the gateway; the identity map makes owners, accounting
//! groups and grants of them with no admin step; a mapped owner registers a function in its
//! granted namespace and it fires on an upload, accounted to the owner and its group. And what
//! must be refused: an unmapped identity, a second identity mapped to a bound owner, a forged
//! token, a token whose WLCG scopes allow no compute, an admin route; a broken map keeps the
//! previous one, and a rule taken out of the map takes its grants with it.

use crate::attacks::post;
use crate::oidc_support::{AUDIENCE, Provider};
use htfaas_functions::FunctionManifest;
use htfaas_functions::audit::{AuditFilter, AuditKind};
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::namespace::{GrantSource, Right};
use htfaas_functions::proto::{AuditTrail, JobState};
use htfaas_tests::{start_stack_with, upload_checksum, wait_for};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

fn map_file(issuer: &str) -> Value {
    json!({"rules": [
        // carol-cli → carol, charging the group of its /desy/<group> membership.
        {"name": "staff", "issuer": issuer, "sub": "^(?P<u>[a-z]+)-cli$", "group": "^/desy/(?P<g>[a-z]+)$",
         "owner": "{u}", "groups": ["{g}"],
         "grants": [{"right": "read", "value": "/data/{owner}/"}, {"right": "write", "value": "/out/{owner}/"}]},
        // carol-bot would be carol too: the owner is bound to carol-cli, so it is refused.
        {"name": "bots", "issuer": issuer, "sub": "^(?P<u>[a-z]+)-bot$", "owner": "{u}"}
    ]})
}

fn write_map(path: &Path, map: &Value) {
    // Written whole and renamed, as an admin's deploy would, so the watcher never reads half.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, map.to_string()).expect("write the map");
    std::fs::rename(&tmp, path).expect("rename the map");
}

async fn get(base: &str, path: &str, token: &str) -> (u16, Value) {
    let resp = htfaas_gateway::http_client()
        .expect("client")
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn manifest(owner: &str, module: &htfaas_functions::Digest, group: Option<&str>) -> FunctionManifest {
    FunctionManifest {
        runtime: Default::default(),
        command: Vec::new(),
        handler: false,
        retry: None,
        name: format!("{owner}-checksum"),
        owner: owner.into(),
        module: module.clone(),
        trigger: Trigger::on_path(format!("/data/{owner}/**")),
        resources: htfaas_functions::Resources::new(1, 256, 60),
        outputs: Outputs::into_dir(format!("/out/{owner}/")),
        args: vec![],
        env: vec![],
        annex: None,
        class: None,
        limits: Default::default(),
        group: group.map(str::to_owned),
        secrets: Default::default(),
        webhook: None,
        max_concurrent: None,
        inputs: Default::default(),
        vacate_s: None,
        checkpoint: None,
    }
}

async fn gateway_records(
    client: &htfaas::client::Client,
    kind: AuditKind,
) -> Vec<htfaas_functions::audit::AuditRecord> {
    let all = client.audit_trail(AuditTrail::Gateway, &AuditFilter::default()).await.expect("the gateway's trail");
    all.into_iter().filter(|r| r.kind == kind).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_user_signs_in_with_the_providers_token_and_runs_as_its_mapped_owner() {
    let idp = Provider::start();
    let map_dir = tempfile::tempdir().expect("tempdir");
    let map_path = map_dir.path().join("identity-map.json");
    write_map(&map_path, &map_file(&idp.issuer));
    let (issuer, path) = (idp.issuer.clone(), map_path.clone());
    let (dir, stack) = start_stack_with(move |o| {
        o.gateway_settings.insert("oidc_issuers".into(), json!([{"issuer": issuer, "audience": AUDIENCE}]));
        o.gateway_settings.insert("identity_map".into(), json!(path));
    })
    .await;
    let admin = stack.client().expect("client");
    let gw = stack.info().gateway_url.clone();

    // carol signs in: the provider's token alone, no htfaas admin step.
    let carol = idp.token("carol-cli", "compute.create").await;
    let (status, who) = get(&gw, "/v1/whoami", &carol).await;
    assert_eq!(status, 200, "{who}");
    assert_eq!((who["name"].as_str(), who["scope"].as_str()), (Some("carol"), Some("developer")));
    assert_eq!(who["identity"]["rule"], "staff");
    assert_eq!(who["identity"]["sub"], "carol-cli");
    assert_eq!(who["identity"]["groups"], json!(["cms"]));
    assert_eq!(who["identity"]["scopes"], json!(["compute.create"]));
    let mapped = gateway_records(&admin, AuditKind::IdentityMapped).await;
    assert_eq!(mapped.len(), 1, "one record of the first sign-in: {mapped:?}");
    assert_eq!(mapped[0].subject.owner.as_deref(), Some("carol"));
    assert_eq!(mapped[0].detail["first"], true);
    // The rule's grants are in force, shown as the map's.
    let grants = admin.namespaces().await.expect("grants");
    let carols: Vec<_> = grants.iter().filter(|g| g.grant.principal == "carol").collect();
    assert!(carols.iter().all(|g| g.source == GrantSource::Map), "{carols:?}");
    let rights: Vec<_> = carols.iter().map(|g| (g.grant.right, g.grant.value.as_str())).collect();
    for want in [(Right::Read, "/data/carol/"), (Right::Write, "/out/carol/"), (Right::Group, "cms")] {
        assert!(rights.contains(&want), "{want:?} in {rights:?}");
    }

    // carol registers a function in her namespace, charged to her group, with her token.
    let module = upload_checksum(&admin).await;
    let (status, body) = post(&gw, "/v1/functions", &carol, &json!(manifest("carol", &module, Some("cms")))).await;
    assert_eq!(status, 201, "{body}");
    // Another owner's function, or another group, is refused as for any developer.
    let (status, body) = post(&gw, "/v1/functions", &carol, &json!(manifest("dave", &module, None))).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = post(&gw, "/v1/functions", &carol, &json!(manifest("carol", &module, Some("atlas")))).await;
    assert_eq!(status, 403, "{body}");

    // An upload under /data/carol/ fires it: a job of carol, charged to cms.
    let file = map_dir.path().join("run-1.dat");
    std::fs::write(&file, b"calibrate me").expect("write");
    admin.put_file(&file, "/data/carol/run-1.dat").await.expect("upload");
    let job = wait_for("carol's job", Duration::from_secs(60), || async {
        let jobs = admin.jobs().await.ok()?;
        jobs.into_iter().find(|j| {
            j.owner == "carol" && j.input.ends_with("/data/carol/run-1.dat") && j.state == JobState::Completed
        })
    })
    .await;
    assert_eq!(job.group.as_deref(), Some("cms"));
    // The run, in the site's accounting terms: `htfaas accounting export --format condor-history`.
    let out = tokio::process::Command::new(htfaas_tests::htfaas_binary())
        .args(["accounting", "export", "--format", "condor-history", "--since", "-1h", "--dir"])
        .arg(dir.path())
        .output()
        .await
        .expect("run htfaas accounting export");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let ad = text.split("\n\n").find(|ad| ad.contains(&format!("GlobalJobId = \"{}\"", job.id))).expect("carol's ad");
    let started = job.started_at_ms.expect("started") / 1000;
    for line in [
        "Owner = \"carol\"".to_owned(),
        "AcctGroup = \"cms\"".to_owned(),
        "AcctGroupUser = \"carol\"".to_owned(),
        "Cmd = \"carol-checksum\"".to_owned(),
        format!("HtfaasDigest = \"{}\"", module.as_str()),
        format!("QDate = {}", job.submitted_at_ms / 1000),
        format!("JobStartDate = {started}"),
        format!("CompletionDate = {}", job.finished_at_ms.expect("ended") / 1000),
        "RequestCpus = 1".to_owned(),
        "RequestMemory = 256".to_owned(),
        "ExitCode = 0".to_owned(),
        format!("LastRemoteHost = \"{}\"", job.ep.clone().expect("its EP")),
    ] {
        assert!(ad.lines().any(|l| l == line), "{line:?} in\n{ad}");
    }
    for attribute in ["RemoteWallClockTime = ", "RemoteUserCpu = ", "RemoteSysCpu = ", "MemoryUsage = "] {
        assert!(ad.lines().any(|l| l.starts_with(attribute)), "{attribute} in\n{ad}");
    }
    // carol's token may not export every owner's runs.
    let (status, body) = get(&gw, "/v1/jobs?ended_since_ms=0", &carol).await;
    assert_eq!(status, 403, "{body}");

    // carol sees her job with her token.
    let (status, jobs) = get(&gw, "/v1/jobs", &carol).await;
    assert_eq!(status, 200, "{jobs}");
    assert!(jobs.as_array().expect("jobs").iter().any(|j| j["id"] == job.id.as_str()), "{jobs}");

    // File credentials follow the token's WLCG storage scopes: a read within storage.read:/data
    // is given, a write without storage.create is not, and a token with no storage scope gets none.
    let reader = idp.token("carol-cli", "compute.create storage.read:/data").await;
    let read = json!({"path": "/data/carol/run-1.dat", "access": "read"});
    let (status, body) = post(&gw, "/v1/files/credential", &reader, &read).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) =
        post(&gw, "/v1/files/credential", &reader, &json!({"path": "/out/carol/new.dat", "access": "write"})).await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("storage.create"), "{body}");
    let (status, body) = post(&gw, "/v1/files/credential", &carol, &read).await;
    assert_eq!(status, 403, "compute.create alone reads no file: {body}");
    let storage_only = idp.token("carol-cli", "storage.read:/data").await;
    let (status, body) = post(&gw, "/v1/files/credential", &storage_only, &read).await;
    assert_eq!(status, 200, "a storage scope alone suffices for a file: {body}");

    // Refused, each with its reason:
    // an identity no rule maps, recorded;
    let mallory = idp.token("mallory-cli", "compute.create").await;
    let (status, body) = get(&gw, "/v1/whoami", &mallory).await;
    assert_eq!(status, 401, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("no rule"), "{body}");
    let refused = gateway_records(&admin, AuditKind::IdentityRefused).await;
    assert!(refused.iter().any(|r| r.detail["sub"] == "mallory-cli"), "{refused:?}");
    // a second identity mapped to the owner carol-cli holds;
    let bot = idp.token("carol-bot", "compute.create").await;
    let (status, body) = get(&gw, "/v1/whoami", &bot).await;
    assert_eq!(status, 401, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("bound to another identity"), "{body}");
    // a token whose payload was changed after signing;
    let parts: Vec<&str> = carol.split('.').collect();
    let forged_claims = {
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut claims: Value = serde_json::from_slice(&engine.decode(parts[1]).expect("b64")).expect("claims");
        claims["sub"] = json!("dave-cli");
        engine.encode(claims.to_string())
    };
    let forged = format!("{}.{}.{}", parts[0], forged_claims, parts[2]);
    let (status, body) = get(&gw, "/v1/whoami", &forged).await;
    assert_eq!(status, 401, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("bad signature"), "{body}");
    // a token whose WLCG scopes allow no compute (a storage-only token);
    let (status, body) = get(&gw, "/v1/whoami", &storage_only).await;
    assert_eq!(status, 403, "{body}");
    // an admin route.
    let (status, body) = get(&gw, "/v1/eps", &carol).await;
    assert_eq!(status, 403, "{body}");

    // The CLI signs in with the provider's token: the profile keeps where the token is read,
    // never the token, and each command reads the file afresh (a token agent renews it).
    let config = tempfile::tempdir().expect("config dir");
    let token_file = map_dir.path().join("token.jwt");
    std::fs::write(&token_file, &carol).expect("write the token");
    let cli = |args: &[&str]| {
        let mut c = std::process::Command::new(htfaas_tests::htfaas_binary());
        c.args(args).env("HTFAAS_CONFIG_DIR", config.path()).env_remove("HTFAAS_DIR");
        let out = c.output().expect("run htfaas");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let token_path = token_file.to_str().expect("utf-8 path");
    let (ok, said) =
        cli(&["login", "--gateway", &gw, "--oidc", "--token-file", token_path, "--insecure-http", "--profile", "site"]);
    assert!(ok, "{said}");
    assert!(said.contains("as carol (developer) as carol-cli"), "{said}");
    let profile = std::fs::read_to_string(config.path().join("profiles/site.json")).expect("the profile");
    assert!(!profile.contains(&carol) && profile.contains("token.jwt"), "{profile}");
    let (ok, said) = cli(&["whoami", "--profile", "site"]);
    assert!(ok && said.starts_with("carol (developer)"), "{said}");
    std::fs::write(&token_file, idp.token("dave-cli", "compute.create").await).expect("a renewed file");
    let (ok, said) = cli(&["whoami", "--profile", "site"]);
    assert!(ok && said.starts_with("dave (developer)"), "the file is read at each command: {said}");

    // The device login (RFC 8628): the CLI prints where to confirm, a person confirms in a
    // browser (here headless chromium on the provider's own pages), the CLI gets the token.
    device_login(&gw, &idp.issuer, config.path()).await;
    let (ok, said) = cli(&["whoami", "--profile", "dev"]);
    assert!(ok && said.starts_with("erin (developer)"), "{said}");
    let token_kept = config.path().join("profiles/dev.token");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&token_kept).expect("token").permissions());
    assert_eq!(mode & 0o077, 0, "the device login's token is its owner's alone");

    // A broken map is not taken: the previous one stays, and a fresh token still maps.
    std::fs::write(&map_path, b"{\"rules\": [").expect("break the map");
    let info = stack.info().clone();
    let reloads = |outcome: &'static str| {
        let info = info.clone();
        async move {
            let page = htfaas_tests::gateway_metrics(&info).await?;
            htfaas_tests::metric(&page, "htfaas_gateway_identity_map_reloads_total", &format!("outcome=\"{outcome}\""))
        }
    };
    wait_for("the broken map seen and refused", Duration::from_secs(30), || async {
        reloads("refused").await.filter(|n| *n >= 1.0)
    })
    .await;
    let again = idp.token("carol-cli", "compute.create").await;
    let (status, body) = get(&gw, "/v1/whoami", &again).await;
    assert_eq!(status, 200, "the previous map stays: {body}");
    // A map without the staff rule: carol's grants leave with it, and she is refused.
    let mut without = map_file(&idp.issuer);
    without["rules"].as_array_mut().expect("rules").remove(0);
    write_map(&map_path, &without);
    wait_for("the new map loaded", Duration::from_secs(30), || async { reloads("loaded").await.filter(|n| *n >= 1.0) })
        .await;
    wait_for("carol's grants gone", Duration::from_secs(30), || async {
        let grants = admin.namespaces().await.ok()?;
        (!grants.iter().any(|g| g.grant.principal == "carol")).then_some(())
    })
    .await;
    let (status, body) = get(&gw, "/v1/whoami", &carol).await;
    assert_eq!(status, 401, "the map changed: her token is looked at again and no rule maps it: {body}");

    // An admin frees the name carol: the identity the bots rule maps to it may take it now.
    let bound = admin.identities().await.expect("bindings");
    assert!(bound.iter().any(|b| b.owner == "carol" && b.sub == "carol-cli"), "{bound:?}");
    let freed = admin.unbind_identity("carol").await.expect("unbind");
    assert_eq!((freed.owner.as_str(), freed.sub.as_str()), ("carol", "carol-cli"));
    assert!(admin.unbind_identity("carol").await.is_err(), "a second unbind finds nothing");
    let (status, who) = get(&gw, "/v1/whoami", &bot).await;
    assert_eq!(status, 200, "{who}");
    assert_eq!((who["name"].as_str(), who["identity"]["rule"].as_str()), (Some("carol"), Some("bots")));
    let (status, body) = get(&gw, "/v1/identities", &bot).await;
    assert_eq!(status, 403, "a developer does not list identities: {body}");
    let unbinds: Vec<_> = gateway_records(&admin, AuditKind::AdminAction)
        .await
        .into_iter()
        .filter(|r| r.detail["action"] == "identity.unbind")
        .collect();
    assert_eq!(unbinds.len(), 1, "{unbinds:?}");
}

/// `htfaas login --oidc --device` as profile `dev`, confirmed as `erin-cli` in headless chromium.
async fn device_login(gateway: &str, issuer: &str, config: &Path) {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = tokio::process::Command::new(htfaas_tests::htfaas_binary())
        .args(["login", "--gateway", gateway, "--insecure-http", "--profile", "dev", "--oidc", "--device"])
        .args([
            "--issuer",
            issuer,
            "--client-id",
            "htfaas-cli",
            "--audience",
            AUDIENCE,
            "--scope",
            "openid compute.create",
        ])
        .env("HTFAAS_CONFIG_DIR", config)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the device login");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let uri = loop {
        let line = lines.next_line().await.expect("the CLI's output").expect("the CLI names where to confirm");
        if let Some(rest) = line.strip_prefix("to sign in, open ") {
            break rest.split_whitespace().next().expect("a URL").to_owned();
        }
    };
    let browser = htfaas_tests::cdp::Browser::launch().await.expect("start headless chromium");
    browser.navigate(&uri).await.expect("open the confirmation page");
    // Each page of the provider: confirm the code, sign in, consent; until its success page.
    let step = r#"(() => {
        if (document.readyState !== 'complete' || window.__htfaas_acted) return 'loading';
        if (document.title === 'Sign-in Success') return 'done';
        const f = document.forms[0];
        if (!f) return 'no form';
        const login = f.querySelector('input[name=login]');
        if (login) { login.value = 'erin-cli'; f.querySelector('input[name=password]').value = 'any'; }
        window.__htfaas_acted = true;
        const button = f.querySelector('button[autofocus]') || f.querySelector('button[type=submit]');
        if (button) { button.click(); } else { f.submit(); }
        return document.title;
    })()"#;
    let mut seen = Vec::new();
    for _ in 0..10 {
        let got = browser
            .wait_for(
                "a page of the provider",
                &format!("(r => r === 'loading' ? null : r)({step})"),
                Duration::from_secs(30),
            )
            .await
            .expect("the provider's pages");
        seen.push(got.clone());
        if got == "done" {
            break;
        }
    }
    assert_eq!(seen.last().and_then(Value::as_str), Some("done"), "the pages seen: {seen:?}");
    browser.close();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the CLI ends after the confirmation")
        .expect("the CLI's exit");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("as erin (developer) as erin-cli"), "{said}");
}
