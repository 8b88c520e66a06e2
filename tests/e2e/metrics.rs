//! Prometheus metrics of each component, scraped from a running stack: the gateway's and the
//! scheduler's `/metrics` ask for the admin token; the EP's loopback listener asks for none. A
//! processed upload and a forged submit token move exactly the counters they should.

use htfaas::stack::demo_manifest;
use htfaas_tests::{stack_secret, start_stack, upload_checksum, wait_for};
use std::collections::BTreeMap;
use std::time::Duration;

/// One scrape: every sample by its name and labels (sorted), e.g. `a_total{x="1",y="2"}`.
#[derive(Debug)]
pub(crate) struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    /// The sample `name` with exactly `labels`; panics when it is absent.
    pub(crate) fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let key = key(name, labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        *self.0.get(&key).unwrap_or_else(|| panic!("no sample {key} in the scrape:\n{:#?}", self.0.keys()))
    }
}

fn key(name: &str, labels: BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return name.to_owned();
    }
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// Parses the OpenMetrics text exposition; panics, naming the line, on anything malformed:
/// an unknown `#` line, a sample before its `# TYPE`, a bad name, label or value, a repeated
/// sample, or no `# EOF` at the very end.
fn parse(text: &str) -> Scrape {
    let mut samples = BTreeMap::new();
    let mut families: Vec<String> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "the exposition must end with # EOF:\n{text}");
    for line in &lines[..lines.len() - 1] {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (kind, family) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            assert!(matches!(kind, "HELP" | "TYPE" | "UNIT"), "unknown metadata line {line:?}");
            assert!(valid_name(family), "bad family name in {line:?}");
            if kind == "TYPE" {
                let t = parts.next().unwrap_or("");
                assert!(matches!(t, "counter" | "gauge" | "histogram" | "info" | "unknown"), "bad type in {line:?}");
                families.push(family.to_owned());
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|e| panic!("bad value in {line:?}: {e}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
                (name, parse_labels(body, line))
            }
        };
        assert!(valid_name(name), "bad metric name in {line:?}");
        assert!(
            families
                .iter()
                .any(|f| name == f.as_str() || name.strip_prefix(f.as_str()).is_some_and(|s| s.starts_with('_'))),
            "sample {line:?} before its # TYPE"
        );
        let k = key(name, labels);
        assert!(samples.insert(k.clone(), value).is_none(), "sample {k} twice");
    }
    Scrape(samples)
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `k="v",k2="v2"` with `\\`, `\"` and `\n` escapes.
fn parse_labels(body: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("bad label in {line:?}"));
        assert!(valid_name(name) && !name.contains(':'), "bad label name {name:?} in {line:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                None => panic!("unterminated label value in {line:?}"),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    _ => panic!("bad escape in {line:?}"),
                },
                Some((_, c)) => value.push(c),
            }
        };
        assert!(labels.insert(name.to_owned(), value).is_none(), "label {name} twice in {line:?}");
        rest = &after[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else {
            assert!(rest.is_empty(), "junk after a label in {line:?}");
        }
    }
    labels
}

/// GET `url` with `token` (if any): the status and body; the body only of a 200, which must
/// be OpenMetrics text.
async fn get(http: &reqwest::Client, url: &str, token: Option<&str>) -> (u16, String) {
    let mut request = http.get(url);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.expect("scrape");
    let status = response.status().as_u16();
    if status == 200 {
        let ct = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(ct.starts_with("application/openmetrics-text"), "content type {ct:?} of {url}");
    }
    (status, response.text().await.expect("body"))
}

/// The metrics at `url`, asked with `token` (if any).
pub(crate) async fn scrape(http: &reqwest::Client, url: &str, token: Option<&str>) -> Scrape {
    let (status, body) = get(http, url, token).await;
    assert_eq!(status, 200, "{url}: {body}");
    parse(&body)
}

#[test]
fn the_parser_refuses_malformed_expositions() {
    let good = "# TYPE a counter\n# HELP a Things.\na_total{x=\"1\",y=\"q\\\"\"} 2\n# EOF\n";
    assert_eq!(parse(good).get("a_total", &[("x", "1"), ("y", "q\"")]), 2.0);
    for bad in [
        "# TYPE a counter\na_total 1\n",                   // no EOF
        "a_total 1\n# EOF\n",                              // no TYPE first
        "# TYPE a counter\na_total one\n# EOF\n",          // bad value
        "# TYPE a counter\na_total{x=\"1} 1\n# EOF\n",     // unterminated label
        "# TYPE a counter\na_total{x=1} 1\n# EOF\n",       // unquoted label
        "# TYPE a counter\na_total 1\na_total 2\n# EOF\n", // twice
        "# TYPE 1a counter\n# EOF\n",                      // bad name
        "# NOTE a x\n# EOF\n",                             // unknown metadata
    ] {
        assert!(std::panic::catch_unwind(|| parse(bad)).is_err(), "accepted {bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_component_counts_a_processed_upload_and_a_forged_token() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let http = htfaas_gateway::http_client().expect("http");
    let info = stack.info().clone();
    let gateway = format!("{}/metrics", info.gateway_url);
    let scheduler = format!("{}/metrics", info.scheduler_url);
    let ep = stack.ep_metrics_url().expect("the stack's EP serves metrics");
    let (gateway_token, scheduler_token) =
        (info.admin_token.clone(), stack_secret(dir.path(), "scheduler_admin_token"));
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");

    let g0 = scrape(&http, &gateway, Some(&gateway_token)).await;
    let s0 = scrape(&http, &scheduler, Some(&scheduler_token)).await;
    let e0 = scrape(&http, &ep, None).await;

    // Without the admin token: 401, and counted by reason.
    for url in [&gateway, &scheduler] {
        assert_eq!(get(&http, url, None).await.0, 401, "{url} without a token");
        assert_eq!(get(&http, url, Some("not-the-admin-token")).await.0, 401, "{url} with a wrong token");
    }
    // A forged submit token, at the gateway (a run) and at the scheduler (a submission).
    let (forger, _) = htfaas_functions::token::SigningKey::generate("gateway-1").expect("keygen");
    let now = htfaas_functions::token::now_s();
    let forged = forger
        .sign(&htfaas_functions::token::SubmitClaims {
            iss: "htfaas-gateway".into(),
            sub: "mallory".into(),
            aud: htfaas_functions::token::SUBMIT_AUDIENCE.into(),
            exp: now + 60,
            iat: now,
            jti: htfaas_functions::token::new_jti(),
            jobs: 1,
            cpus: 1,
            memory_mb: 512,
            runtime_s: 60,
            function: None,
            group: None,
        })
        .expect("sign");
    let err = client.run_function(&forged, "checksum", "/data/raw/x.dat").await.expect_err("forged");
    assert!(err.to_string().contains("401"), "{err:#}");
    let refused = http
        .post(format!("{}/v1/jobs", info.scheduler_url))
        .bearer_auth(&forged)
        .body("{}")
        .send()
        .await
        .expect("submit");
    assert_eq!(refused.status().as_u16(), 401);

    // One upload, processed end to end.
    client.put_bytes(b"measured".to_vec(), "/data/raw/x.dat").await.expect("put");
    let completed = ("state", "completed");
    let s1 = wait_for("the job to complete", Duration::from_secs(60), || async {
        let s = scrape(&http, &scheduler, Some(&scheduler_token)).await;
        (s.get("htfaas_scheduler_jobs", &[completed]) > s0.get("htfaas_scheduler_jobs", &[completed])).then_some(s)
    })
    .await;
    assert!(client.get_bytes("/data/checksums/x.dat.checksums.json").await.expect("get").is_some());
    let g1 = scrape(&http, &gateway, Some(&gateway_token)).await;
    let e1 = scrape(&http, &ep, None).await;

    let delta = |a: &Scrape, b: &Scrape, name: &str, labels: &[(&str, &str)]| b.get(name, labels) - a.get(name, labels);
    // Gateway.
    assert_eq!(delta(&g0, &g1, "htfaas_gateway_events_total", &[("outcome", "fired")]), 1.0);
    assert_eq!(delta(&g0, &g1, "htfaas_gateway_firings_total", &[("outcome", "queued")]), 1.0);
    assert_eq!(delta(&g0, &g1, "htfaas_gateway_submissions_total", &[("outcome", "created")]), 1.0);
    assert!(delta(&g0, &g1, "htfaas_gateway_events_received_total", &[("source", "dcache_billing")]) >= 1.0);
    let gw_refusal = |token, reason| [("reason", reason), ("token", token)];
    assert_eq!(delta(&g0, &g1, "htfaas_gateway_token_refusals_total", &gw_refusal("submit", "bad_signature")), 1.0);
    assert_eq!(delta(&g0, &g1, "htfaas_gateway_token_refusals_total", &gw_refusal("api", "missing")), 1.0);
    assert_eq!(delta(&g0, &g1, "htfaas_gateway_token_refusals_total", &gw_refusal("api", "malformed")), 1.0);
    assert_eq!(delta(&g0, &g1, "htfaas_gateway_token_refusals_total", &gw_refusal("submit", "expired")), 0.0);
    // Scheduler.
    assert_eq!(delta(&s0, &s1, "htfaas_scheduler_jobs", &[completed]), 1.0);
    assert_eq!(s1.get("htfaas_scheduler_jobs", &[("state", "running")]), 0.0);
    assert_eq!(delta(&s0, &s1, "htfaas_scheduler_dispatch_latency_seconds_count", &[]), 1.0);
    let sum = delta(&s0, &s1, "htfaas_scheduler_dispatch_latency_seconds_sum", &[]);
    assert!(sum > 0.0 && sum < 60.0, "dispatch latency {sum} s");
    assert_eq!(delta(&s0, &s1, "htfaas_scheduler_dispatch_latency_seconds_bucket", &[("le", "+Inf")]), 1.0);
    let refusal = |token, reason| [("reason", reason), ("token", token)];
    assert_eq!(delta(&s0, &s1, "htfaas_scheduler_token_refusals_total", &refusal("submit", "bad_signature")), 1.0);
    assert_eq!(delta(&s0, &s1, "htfaas_scheduler_token_refusals_total", &refusal("admin", "missing")), 1.0);
    assert_eq!(delta(&s0, &s1, "htfaas_scheduler_token_refusals_total", &refusal("admin", "wrong_token")), 1.0);
    assert_eq!(delta(&s0, &s1, "htfaas_scheduler_token_refusals_total", &refusal("submit", "used_up")), 0.0);
    assert!(delta(&s0, &s1, "htfaas_scheduler_audit_records_total", &[]) >= 3.0, "refused, accepted, dispatched…");
    // Submit, dispatch and finish are writes at least; never more commits than writes.
    let writes = delta(&s0, &s1, "htfaas_scheduler_store_writes_total", &[]);
    let commits = delta(&s0, &s1, "htfaas_scheduler_store_write_batches_total", &[]);
    assert!(writes >= 3.0 && commits >= 1.0 && commits <= writes, "{writes} writes in {commits} commits");
    assert_eq!(s1.get("htfaas_scheduler_eps_attached", &[]), 1.0);
    assert_eq!(s1.get("htfaas_scheduler_ep_cpus", &[]), 2.0);
    assert_eq!(s1.get("htfaas_scheduler_ep_busy_cpus", &[]), 0.0);
    assert_eq!(s1.get("htfaas_scheduler_ep_memory_bytes", &[]), (4096u64 << 20) as f64);
    // EP: the slots as the stack configured them (2 cores, 4 GiB), one run.
    assert_eq!(e1.get("htfaas_ep_slot_cpus", &[]), 2.0);
    assert_eq!(e1.get("htfaas_ep_slot_memory_bytes", &[]), (4096u64 << 20) as f64);
    assert_eq!(e1.get("htfaas_ep_jobs_running", &[]), 0.0);
    assert_eq!(delta(&e0, &e1, "htfaas_ep_runs_total", &[("outcome", "exited")]), 1.0);
    assert_eq!(delta(&e0, &e1, "htfaas_ep_instantiations_total", &[]), 1.0);
    assert_eq!(delta(&e0, &e1, "htfaas_ep_job_duration_seconds_count", &[]), 1.0);
    assert_eq!(e1.get("htfaas_ep_modules_compiled_total", &[]), 1.0);
    stack.stop().await.expect("clean stop");
}
