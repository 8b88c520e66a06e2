//! A submit-token holder against the scheduler: a job posted straight to the
//! scheduler's `POST /v1/jobs`, skipping the gateway, whose input is an internal HTTP service
//! and whose output (or module) is a server of the attacker's, is refused with 403 naming the
//! field, the URL and the storage the scheduler trusts, and so is a job that claims a file's event
//! without an input (lying-no-input); and neither server ever hears from an
//! EP. "Never" is checked after a normal job has run end to end on the same stack (had a
//! refused job been queued, the EP would have taken it by then), not by waiting long enough.

use htfaas::stack::{SubmitGrant, demo_manifest, mint_submit_token};
use htfaas_functions::audit::AuditFilter;
use htfaas_functions::proto::{
    EventRef, FunctionRef, InputSpec, JobState, OutputSpec, ReferenceInput, SubmitRequest, WarmRequest,
};
use htfaas_functions::{Digest, Resources};
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(60);

/// A TCP listener on 127.0.0.1 that counts the connections it accepts (and answers none).
struct Listener {
    url: String,
    accepted: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl Listener {
    async fn start() -> Listener {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a listener");
        let url = format!("http://{}", tcp.local_addr().expect("its address"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let (count, until) = (accepted.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = until.cancelled() => return,
                    conn = tcp.accept() => if conn.is_ok() { count.fetch_add(1, Ordering::SeqCst); },
                }
            }
        });
        Listener { url, accepted, stop }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn request(digest: &Digest, module_url: String, input: String, output: String, key: &str) -> SubmitRequest {
    SubmitRequest {
        retry: None,
        function: FunctionRef { name: "checksum".into(), version: 1, digest: digest.clone(), module_url, native: None },
        resources: Resources::new(1, 256, 60),
        input: Some(InputSpec::new(input, "a.dat", "m")),
        output: OutputSpec { on_failure: Default::default(), url: output, macaroon: "m".into() },
        args: vec![],
        env: vec![],
        event: EventRef::new("attacker", key, "/data/raw/a.dat"),
        dedupe_key: key.into(),
        annex: None,
        bind_ep_address: false,
        class: None,
        limits: Default::default(),
        secrets: Default::default(),
        renewal: None,
        max_concurrent: None,
        refs: Vec::new(),
        checkpoint: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_posted_to_the_scheduler_with_foreign_urls_is_refused_and_no_ep_ever_calls_them() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let info = stack.info().clone();
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest.clone())).await.expect("register");

    let internal = Listener::start().await;
    let loot = Listener::start().await;
    let grant = SubmitGrant {
        owner: "mallory".into(),
        jobs: 3,
        limits: Resources::new(1, 256, 60),
        function: Some(digest.clone()),
        group: None,
        ttl_s: 300,
    };
    let token = mint_submit_token(dir.path(), &grant).expect("a plain submit token");
    let module = format!("{}/v1/modules/{digest}", info.gateway_url);
    let storage = &info.storage_url;
    let trusted = storage.clone();
    let cases = [
        (
            request(
                &digest,
                module.clone(),
                format!("{}/admin/secrets", internal.url),
                format!("{}/loot/", loot.url),
                "ssrf-input",
            ),
            format!(
                "input.url \"{}/admin/secrets\" is not on a storage this scheduler trusts ({trusted})",
                internal.url
            ),
        ),
        (
            request(
                &digest,
                module.clone(),
                format!("{storage}/data/raw/a.dat"),
                format!("{}/loot/", loot.url),
                "ssrf-output",
            ),
            format!("output.url \"{}/loot/\" is not on a storage this scheduler trusts ({trusted})", loot.url),
        ),
        (
            request(
                &digest,
                format!("{}/v1/modules/{digest}", internal.url),
                format!("{storage}/data/raw/a.dat"),
                format!("{storage}/data/out/"),
                "ssrf-module",
            ),
            format!(
                "function.module_url \"{}/v1/modules/{digest}\" is not the module store's URL for the job's \
                 digest: expected {}/v1/modules/{digest}",
                internal.url, info.gateway_url
            ),
        ),
        (
            // Trusted URLs, but the event claimed is another file's: the trails would show a job
            // of mallory's in the lineage of /data/alice/secret.txt.
            {
                let mut r = request(
                    &digest,
                    module.clone(),
                    format!("{storage}/data/raw/a.dat"),
                    format!("{storage}/data/out/"),
                    "lying-event",
                );
                r.event.path = "/data/alice/secret.txt".into();
                r
            },
            format!(
                "event.path \"/data/alice/secret.txt\" is not the file input.url \"{storage}/data/raw/a.dat\" names"
            ),
        ),
        (
            // A reference input is fetched by the EP as the input is: the same origins only.
            {
                let mut r = request(
                    &digest,
                    module.clone(),
                    format!("{storage}/data/raw/a.dat"),
                    format!("{storage}/data/out/"),
                    "ssrf-ref",
                );
                let url = format!("{}/admin/secrets", internal.url);
                r.refs = vec![ReferenceInput { url, path: "admin/secrets".into(), macaroon: "m".into(), sha256: None }];
                r
            },
            format!(
                "refs.url \"{}/admin/secrets\" is not on a storage this scheduler trusts ({trusted})",
                internal.url
            ),
        ),
        (
            // A reference posing as another file: its lineage would name alice's secret.
            {
                let mut r = request(
                    &digest,
                    module.clone(),
                    format!("{storage}/data/raw/a.dat"),
                    format!("{storage}/data/out/"),
                    "lying-ref",
                );
                let url = format!("{storage}/data/raw/a.dat");
                r.refs = vec![ReferenceInput {
                    url,
                    path: "data/alice/secret.txt".into(),
                    macaroon: "m".into(),
                    sha256: None,
                }];
                r
            },
            format!("refs: path \"data/alice/secret.txt\" is not the file \"{storage}/data/raw/a.dat\" names"),
        ),
        (
            // Lying about having no input (lying-no-input): a run on no file whose event claims
            // alice's file would sit in that file's lineage, no read macaroon for it ever asked.
            {
                let mut r = request(
                    &digest,
                    module.clone(),
                    format!("{storage}/data/raw/a.dat"),
                    format!("{storage}/data/out/"),
                    "lying-no-input",
                );
                r.input = None;
                r.event.path = "/data/alice/secret.txt".into();
                r
            },
            "event.path \"/data/alice/secret.txt\" names a file, but the job has no input: a run on no file names \
             no path"
                .to_owned(),
        ),
    ];
    let http = reqwest::Client::new();
    for (req, expected) in &cases {
        let resp = http
            .post(format!("{}/v1/jobs", info.scheduler_url))
            .bearer_auth(&token)
            .json(req)
            .send()
            .await
            .expect("the scheduler answers");
        assert_eq!(resp.status(), reqwest::StatusCode::FORBIDDEN, "{}", req.dedupe_key);
        let body: serde_json::Value = resp.json().await.expect("an ApiError");
        assert_eq!(body["error"].as_str(), Some(expected.as_str()), "{}", req.dedupe_key);
    }

    // A normal upload runs end to end on the same stack and EP.
    client.put_bytes(b"an honest file".to_vec(), "/data/raw/honest.dat").await.expect("upload");
    wait_for("the honest job to complete", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        jobs.into_iter().find(|j| j.event.path == "/data/raw/honest.dat" && j.state == JobState::Completed)
    })
    .await;

    // No job of mallory's exists, each refusal is in the trail, and neither listener was ever
    // called: not at submit, and not by the EP, which has run a job since.
    let jobs = client.jobs().await.expect("jobs");
    assert!(jobs.iter().all(|j| j.event.source != "attacker"), "a refused job was queued: {jobs:#?}");
    let filter = AuditFilter { owner: Some("mallory".into()), ..AuditFilter::default() };
    let refused = client.audit(&filter).await.expect("the scheduler's trail");
    assert_eq!(refused.iter().filter(|r| r.kind.as_str() == "job.refused").count(), cases.len(), "{refused:#?}");
    for listener in [&internal, &loot] {
        // A short, bounded look for a straggler; the assertion holds without it.
        let late = tokio::time::timeout(Duration::from_millis(300), async {
            while listener.accepted() == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        assert!(late.await.is_err(), "{} was called", listener.url);
        assert_eq!(listener.accepted(), 0, "{} was called", listener.url);
    }
    stack.stop().await.expect("clean stop");
}

/// Compile ahead: a submit-token holder asks the scheduler to have every EP fetch a
/// module from an internal address (`POST /v1/modules/warm`), or uses a token minted for one
/// module to warm another. Both are refused with 403 naming the check, and counted
/// (`htfaas_scheduler_warm_refused_total`); the internal address never hears from an EP, which
/// has compiled the registered function's module ahead since (the gateway's own warm).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_request_naming_a_foreign_url_or_another_module_is_refused_counted_and_never_fetched() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let info = stack.info().clone();
    let digest = upload_checksum(&client).await;
    let other = client.upload_module(wat::parse_str(htfaas_tests::SPIN_WAT).expect("wat")).await.expect("upload");
    let internal = Listener::start().await;
    let grant = SubmitGrant {
        owner: "mallory".into(),
        jobs: 1,
        limits: Resources::new(1, 256, 60),
        function: Some(digest.clone()),
        group: None,
        ttl_s: 300,
    };
    let token = mint_submit_token(dir.path(), &grant).expect("a plain submit token");
    let http = reqwest::Client::new();
    let warm = |digest: &Digest, module_url: String| {
        let req = WarmRequest { digest: digest.clone(), module_url };
        http.post(format!("{}/v1/modules/warm", info.scheduler_url)).bearer_auth(&token).json(&req).send()
    };
    let cases = [
        (
            warm(&digest, format!("{}/v1/modules/{digest}", internal.url)).await,
            format!(
                "function.module_url \"{}/v1/modules/{digest}\" is not the module store's URL for the job's \
                 digest: expected {}/v1/modules/{digest}",
                internal.url, info.gateway_url
            ),
        ),
        (
            warm(&other, format!("{}/v1/modules/{other}", info.gateway_url)).await,
            format!("the submit token is for module {digest}, not for module {other}"),
        ),
    ];
    for (resp, expected) in cases {
        let resp = resp.expect("the scheduler answers");
        assert_eq!(resp.status(), reqwest::StatusCode::FORBIDDEN, "{expected}");
        let body: serde_json::Value = resp.json().await.expect("an ApiError");
        assert_eq!(body["error"].as_str(), Some(expected.as_str()));
    }
    let scheduler_metrics = || async {
        let page = http
            .get(format!("{}/metrics", info.scheduler_url))
            .bearer_auth(stack.scheduler_admin_token())
            .send()
            .await
            .expect("the scheduler's metrics")
            .text()
            .await
            .expect("text");
        htfaas_tests::metric(&page, "htfaas_scheduler_warm_refused_total", "")
    };
    assert_eq!(scheduler_metrics().await, Some(2.0));

    // A registration: the gateway warms its module, and the EP compiles it ahead.
    client.register(&demo_manifest(digest.clone())).await.expect("register");
    let metrics = stack.ep_metrics_url().expect("the EP's metrics");
    wait_for("the EP to compile the registered module ahead", LIMIT, || async {
        let page = reqwest::get(&metrics).await.ok()?.text().await.ok()?;
        (htfaas_tests::metric(&page, "htfaas_ep_modules_warmed_total", "")? >= 1.0).then_some(())
    })
    .await;
    assert_eq!(internal.accepted(), 0, "{} was called", internal.url);
    stack.stop().await.expect("clean stop");
}
