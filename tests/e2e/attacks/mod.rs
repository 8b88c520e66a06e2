//! The attack suite: each attack a party could try on the real stack (real
//! nats-server, storage, scheduler, gateway and EP), tried and refused with a clear error, and
//! nothing lost. SECURITY.md names the test behind each refusal. One module per party.
mod annexes;
mod backfill;
mod checkpoints;
mod derived;
mod dlq;
mod failures;
mod files;
mod guests;
mod kafka;
mod native;
mod nats;
mod principals;
mod renewals;
mod reruns;
mod scheduler;
mod servers;
mod tenancy;
mod traces;
mod webhooks;

/// An API token for `sub` with `scope`, signed with the stack's gateway key under `dir` (as
/// `htfaas token api` makes one).
pub fn api_token(dir: &std::path::Path, sub: &str, scope: htfaas_functions::token::Scope) -> String {
    htfaas_tests::api_token(dir, sub, scope)
}

/// POSTs `body` to the gateway at `base`, route `path`, with the bearer `token`; (status, JSON
/// body, `null` when it is none).
pub async fn post(base: &str, path: &str, token: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let resp = htfaas_gateway::http_client()
        .expect("client")
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(serde_json::Value::Null))
}

/// A submit token for `owner` (charging `group`, if given) of 10 jobs, signed with the stack's
/// gateway key under `dir`.
pub fn submit_token(dir: &std::path::Path, owner: &str, group: Option<&str>) -> String {
    let grant = htfaas::stack::SubmitGrant {
        owner: owner.into(),
        jobs: 10,
        limits: htfaas_functions::Resources::new(2, 4096, 3600),
        function: None,
        group: group.map(str::to_owned),
        ttl_s: 600,
    };
    htfaas::stack::mint_submit_token(dir, &grant).expect("submit token")
}
