//! API scopes: developer and admin tokens, each refused where it should be; the OpenAPI document.
//!
//! The document drives the tests: every documented operation is routed, the router's list of
//! routes is exactly the documented set, every operation refuses what its `x-htfaas-scope`
//! refuses, and live answers validate against the documented schemas.

use htfaas_functions::proto::JobRecord;
use htfaas_functions::token::{ApiClaims, LEEWAY_S, Scope, SigningKey, now_s};
use htfaas_tests::{start_stack, wait_for};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// A guest that exits at once.
const EXIT_WAT: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

fn document() -> Value {
    serde_json::from_str(htfaas_gateway::openapi::DOCUMENT).expect("the OpenAPI document parses")
}

/// (method, path, scope) of every documented operation.
fn operations(doc: &Value) -> Vec<(String, String, String)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let scope = op["x-htfaas-scope"].as_str().expect("x-htfaas-scope").to_owned();
            ops.push((method.to_uppercase(), path.clone(), scope));
        }
    }
    ops
}

/// The path with placeholder values for its parameters.
fn concrete(path: &str) -> String {
    path.replace("{id}", "00000000-0000-0000-0000-000000000000")
        .replace("{name}", "placeholder")
        .replace("{owner}", "nobody")
        .replace("{digest}", htfaas_functions::Digest::of(b"placeholder").as_str())
}

/// The gateway's key, as `htfaas token api` uses it.
fn gateway_key(dir: &Path) -> SigningKey {
    SigningKey::load_or_create(&dir.join("gateway/submit.pem"), "gateway-1").expect("the gateway's key")
}

fn api_token(dir: &Path, sub: &str, scope: Scope) -> String {
    gateway_key(dir).sign(&ApiClaims::new("htfaas-gateway", sub, scope, 600)).expect("sign")
}

/// Sends `method path` with `token` (and `body` as JSON, `{}` for a POST without one);
/// returns status and body text.
async fn send(base: &str, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> (u16, String) {
    let http = htfaas_gateway::http_client().expect("client");
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let is_post = method == reqwest::Method::POST;
    let mut req = http.request(method, format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(b);
    } else if is_post {
        req = req.json(&json!({}));
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// Validates `value` against the document's schema `schema` (e.g. `{"$ref": …}`), resolving
/// references inside the document.
fn validate(doc: &Value, schema: Value, value: &Value, what: &str) {
    let mut root = schema;
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    root["components"] = doc["components"].clone();
    let validator = jsonschema::validator_for(&root).expect("a valid schema");
    let errors: Vec<String> = validator.iter_errors(value).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "{what} does not match its documented schema: {errors:?}\n{value}");
}

fn list_of(name: &str) -> Value {
    json!({"type": "array", "items": {"$ref": format!("#/components/schemas/{name}")}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_served_and_matches_the_router() {
    let (_dir, stack) = start_stack().await;
    let info = stack.info().clone();
    let base = info.gateway_url.as_str();
    let doc = document();

    let (status, served) = send(base, "GET", "/v1/openapi.json", None, None).await;
    assert_eq!(status, 200, "the document needs no token");
    assert_eq!(json_of(&served), doc, "the served document is the checked-in one");

    // The router's list of routes is exactly the documented set.
    let documented: BTreeSet<(String, String)> = operations(&doc).into_iter().map(|(m, p, _)| (m, p)).collect();
    let routed: BTreeSet<(String, String)> =
        htfaas_gateway::api::ROUTES.iter().map(|r| (r.method.to_owned(), r.path.to_owned())).collect();
    assert_eq!(routed, documented, "api::ROUTES and openapi.json differ");

    // Every documented operation is routed: not the router's own 404 (no body) or 405.
    let (status, body) = send(base, "GET", "/v1/no-such-route", Some(&info.admin_token), None).await;
    assert_eq!((status, body.as_str()), (404, ""), "an unrouted path is what the check below looks for");
    for (method, path, _) in operations(&doc) {
        let (status, body) = send(base, &method, &concrete(&path), Some(&info.admin_token), None).await;
        assert_ne!(status, 405, "{method} {path} is documented but not routed for {method}");
        assert!(!(status == 404 && body.is_empty()), "{method} {path} is documented but not routed");
    }
    stack.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_refuses_what_its_scope_refuses() {
    let (dir, stack) = start_stack().await;
    let info = stack.info().clone();
    let base = info.gateway_url.as_str();
    let developer = api_token(dir.path(), "alice", Scope::Developer);
    let admin = api_token(dir.path(), "root", Scope::Admin);
    let mut expired = ApiClaims::new("htfaas-gateway", "root", Scope::Admin, 0);
    expired.exp = now_s() - LEEWAY_S - 30;
    let expired = gateway_key(dir.path()).sign(&expired).expect("sign");
    let (forger, _) = SigningKey::generate("gateway-1").expect("keygen");
    let forged = forger.sign(&ApiClaims::new("htfaas-gateway", "root", Scope::Admin, 600)).expect("sign");
    let grant = htfaas::stack::SubmitGrant {
        owner: "root".into(),
        jobs: 5,
        limits: htfaas_functions::Resources::new(1, 512, 60),
        function: None,
        group: None,
        ttl_s: 600,
    };
    let submit = htfaas::stack::mint_submit_token(dir.path(), &grant).expect("mint");

    let mut checked = 0;
    for (method, path, scope) in operations(&document()) {
        let path = concrete(&path);
        let at = format!("{method} {path} (scope {scope})");
        let status = |(s, _): (u16, String)| s;
        if scope == "none" {
            assert_ne!(status(send(base, &method, &path, None, None).await), 401, "{at} needs no token");
            continue;
        }
        let (s, body) = send(base, &method, &path, None, None).await;
        assert_eq!(s, 401, "{at} without a token: {body}");
        assert!(json_of(&body)["error"].as_str().is_some_and(|e| e.contains("required")), "{at}: {body}");
        for (what, token) in [("an expired API token", &expired), ("a forged API token", &forged)] {
            let (s, body) = send(base, &method, &path, Some(token), None).await;
            assert_eq!(s, 401, "{at} with {what}: {body}");
        }
        match scope.as_str() {
            "submit" => {
                // The one route for submit tokens takes no API token, whatever its scope.
                let (s, body) = send(base, &method, &path, Some(&admin), None).await;
                assert_eq!(s, 401, "{at} with an API token: {body}");
                assert!(body.contains("an API token is not a submit token"), "{at}: {body}");
            }
            "renewal" => {
                // The scheduler's route takes a job's renewal grant only: neither an
                // API token of any scope nor a submit token is one (another audience).
                for (what, token) in
                    [("an admin API token", &admin), ("a developer token", &developer), ("a submit token", &submit)]
                {
                    let (s, body) = send(base, &method, &path, Some(token), None).await;
                    assert_eq!(s, 401, "{at} with {what}: {body}");
                    assert!(body.contains("renewal grant refused"), "{at}: {body}");
                }
            }
            "developer" | "admin" => {
                let (s, body) = send(base, &method, &path, Some(&submit), None).await;
                assert_eq!(s, 401, "{at} with a submit token: {body}");
                assert!(body.contains("wrong audience"), "{at}: {body}");
                let (s, body) = send(base, &method, &path, Some(&developer), None).await;
                if scope == "admin" {
                    assert_eq!(s, 403, "{at} with a developer token: {body}");
                    assert!(body.contains("needs scope admin"), "{at}: {body}");
                } else {
                    assert!(s != 401 && s != 403, "{at} refused a developer token: {s} {body}");
                }
                let (s, body) = send(base, &method, &path, Some(&admin), None).await;
                assert!(s != 401 && s != 403, "{at} refused an admin API token: {s} {body}");
            }
            other => panic!("{at}: unknown scope {other}"),
        }
        checked += 1;
    }
    assert!(checked >= 25, "only {checked} operations with a scope");

    // An API token is no submit token at the scheduler either.
    let scheduler = info.scheduler_url.as_str();
    for token in [&developer, &admin] {
        let (s, body) = send(scheduler, "POST", "/v1/preflight", Some(token), None).await;
        assert_eq!(s, 401, "scheduler preflight with an API token: {body}");
        let (s, body) = send(scheduler, "POST", "/v1/jobs", Some(token), None).await;
        assert_eq!(s, 401, "scheduler submit with an API token: {body}");
    }
    stack.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_developer_sees_and_changes_only_its_own_and_answers_match_the_schemas() {
    let (dir, stack) = start_stack().await;
    htfaas_tests::share_data(&stack.client().expect("client"), "bob").await;
    let info = stack.info().clone();
    let base = info.gateway_url.as_str();
    let client = stack.client().expect("client");
    let doc = document();
    let alice = api_token(dir.path(), "alice", Scope::Developer);
    let admin = info.admin_token.clone();

    // A developer uploads modules and registers its own functions only.
    let http = htfaas_gateway::http_client().expect("client");
    let wasm = wat::parse_str(EXIT_WAT).expect("wat");
    let resp = http.post(format!("{base}/v1/modules")).bearer_auth(&alice).body(wasm).send().await.expect("upload");
    assert_eq!(resp.status().as_u16(), 201);
    let module = resp.json::<Value>().await.expect("json")["digest"].clone();
    let manifest = |name: &str, owner: &str| {
        json!({"name": name, "owner": owner, "module": module, "trigger": {"path": format!("/data/{name}/**")},
            "outputs": {"dir": format!("/data/{name}-out/")}, "resources": {"cpus": 1, "memory_mb": 64, "runtime_s": 60}})
    };
    let (s, body) = send(base, "POST", "/v1/functions", Some(&alice), Some(&manifest("alice-fn", "alice"))).await;
    assert_eq!(s, 201, "{body}");
    let (s, body) = send(base, "POST", "/v1/functions", Some(&alice), Some(&manifest("bobs", "bob"))).await;
    assert_eq!(s, 403, "a developer registering for another owner: {body}");
    assert!(body.contains("registers only its own functions"), "{body}");
    let (s, body) = send(base, "POST", "/v1/functions", Some(&admin), Some(&manifest("bob-fn", "bob"))).await;
    assert_eq!(s, 201, "{body}");
    // Taking over another owner's function name.
    let (s, body) = send(base, "POST", "/v1/functions", Some(&alice), Some(&manifest("bob-fn", "alice"))).await;
    assert_eq!(s, 403, "{body}");
    assert!(body.contains("belongs to another owner"), "{body}");
    let (s, body) = send(base, "POST", "/v1/functions?dry_run=true", Some(&alice), Some(&manifest("x", "bob"))).await;
    assert_eq!(s, 403, "a dry run for another owner: {body}");
    let (s, body) = send(base, "POST", "/v1/functions/bob-fn/test", Some(&alice), Some(&json!({"event": {}}))).await;
    assert_eq!(s, 403, "testing another owner's function: {body}");

    let names = |text: &str| -> Vec<String> {
        json_of(text)
            .as_array()
            .map(|a| a.iter().filter_map(|f| f["manifest"]["name"].as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    let (s, body) = send(base, "GET", "/v1/functions", Some(&alice), None).await;
    assert_eq!((s, names(&body)), (200, vec!["alice-fn".to_owned()]), "a developer's list");
    let (s, body) = send(base, "GET", "/v1/functions", Some(&admin), None).await;
    assert_eq!((s, names(&body)), (200, vec!["alice-fn".to_owned(), "bob-fn".to_owned()]), "the admin's list");
    validate(&doc, list_of("FunctionStatus"), &json_of(&body), "GET /v1/functions");

    // One job each, fired by uploads.
    client.put_bytes(b"a".to_vec(), "/data/alice-fn/a.dat").await.expect("put");
    client.put_bytes(b"b".to_vec(), "/data/bob-fn/b.dat").await.expect("put");
    let jobs: Vec<JobRecord> = wait_for("both jobs to finish", Duration::from_secs(60), || async {
        let jobs = client.jobs().await.ok()?;
        let done = |o: &str| jobs.iter().any(|j| j.owner == o && j.finished_at_ms.is_some());
        (done("alice") && done("bob")).then_some(jobs)
    })
    .await;
    let job_of = |o: &str| jobs.iter().find(|j| j.owner == o).expect("job").id.clone();
    let (alice_job, bob_job) = (job_of("alice"), job_of("bob"));

    let (s, body) = send(base, "GET", "/v1/jobs", Some(&alice), None).await;
    assert_eq!(s, 200, "{body}");
    let listed: Vec<JobRecord> = serde_json::from_str(&body).expect("jobs");
    assert!(!listed.is_empty() && listed.iter().all(|j| j.owner == "alice"), "{body}");
    validate(&doc, list_of("JobRecord"), &json_of(&body), "GET /v1/jobs (developer)");
    let (_, body) = send(base, "GET", "/v1/jobs", Some(&admin), None).await;
    validate(&doc, list_of("JobRecord"), &json_of(&body), "GET /v1/jobs (admin)");
    for view in ["", "/history", "/log", "/analyze"] {
        let (s, body) = send(base, "GET", &format!("/v1/jobs/{alice_job}{view}"), Some(&alice), None).await;
        assert_eq!(s, 200, "own job{view}: {body}");
        let (s, body) = send(base, "GET", &format!("/v1/jobs/{bob_job}{view}"), Some(&alice), None).await;
        assert_eq!(s, 404, "another owner's job{view}: {body}");
        assert_eq!(json_of(&body)["error"], json!(format!("job {bob_job:?} not found")), "as an unknown job");
    }
    let (s, body) = send(base, "GET", &format!("/v1/jobs/{alice_job}"), Some(&alice), None).await;
    validate(&doc, json!({"$ref": "#/components/schemas/JobRecord"}), &json_of(&body), "GET /v1/jobs/{id}");
    assert_eq!(s, 200);
    let reason = json!({"reason": "mine"});
    for action in ["hold", "release", "remove"] {
        let (s, body) = send(base, "POST", &format!("/v1/jobs/{bob_job}/{action}"), Some(&alice), Some(&reason)).await;
        assert_eq!(s, 404, "{action} of another owner's job: {body}");
    }
    // Its own finished job: the scheduler's own refusal (409), not a scope refusal.
    let (s, body) = send(base, "POST", &format!("/v1/jobs/{alice_job}/hold"), Some(&alice), Some(&reason)).await;
    assert_eq!(s, 409, "hold of its own finished job: {body}");

    // Accounting and audit: its own rows and records only.
    let (s, body) = send(base, "GET", "/v1/accounting", Some(&alice), None).await;
    assert_eq!(s, 200, "{body}");
    let rows = json_of(&body);
    assert!(rows.as_array().is_some_and(|r| r.len() == 1 && r[0]["owner"] == "alice"), "{body}");
    validate(&doc, list_of("Account"), &rows, "GET /v1/accounting (developer)");
    let (_, body) = send(base, "GET", "/v1/accounting", Some(&admin), None).await;
    assert!(json_of(&body).as_array().is_some_and(|r| r.len() >= 2), "{body}");
    validate(&doc, list_of("Account"), &json_of(&body), "GET /v1/accounting (admin)");
    let (s, body) = send(base, "GET", "/v1/audit", Some(&alice), None).await;
    assert_eq!(s, 200, "{body}");
    let records = json_of(&body);
    assert!(
        records.as_array().is_some_and(|r| !r.is_empty() && r.iter().all(|x| x["subject"]["owner"] == "alice")),
        "{body}"
    );
    validate(&doc, list_of("AuditRecord"), &records, "GET /v1/audit (developer)");
    let (s, body) = send(base, "GET", "/v1/audit?owner=bob", Some(&alice), None).await;
    assert_eq!(s, 403, "another owner's audit records: {body}");
    let (_, body) = send(base, "GET", "/v1/audit", Some(&admin), None).await;
    validate(&doc, list_of("AuditRecord"), &json_of(&body), "GET /v1/audit (admin)");

    // A revoked API token is refused within the gateway's revocation cache time.
    let jti = {
        use base64::Engine as _;
        let payload = alice.split('.').nth(1).expect("payload");
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).expect("base64");
        serde_json::from_slice::<Value>(&bytes).expect("claims")["jti"].as_str().expect("jti").to_owned()
    };
    let revoke = json!({"target": {"kind": "jti", "value": jti}, "reason": "left the lab"});
    let (s, body) = send(base, "POST", "/v1/revocations", Some(&admin), Some(&revoke)).await;
    assert_eq!(s, 200, "{body}");
    let refusal = wait_for("the revoked API token to be refused", Duration::from_secs(20), || async {
        let (s, body) = send(base, "GET", "/v1/jobs", Some(&alice), None).await;
        (s == 401).then_some(body)
    })
    .await;
    assert!(refusal.contains("API token revoked: left the lab"), "{refusal}");
    // Another developer token of alice's is not named by that revocation.
    let other = api_token(dir.path(), "alice", Scope::Developer);
    assert_eq!(send(base, "GET", "/v1/jobs", Some(&other), None).await.0, 200);
    stack.stop().await.expect("stop");
}
