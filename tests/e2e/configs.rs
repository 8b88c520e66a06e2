//! The sample configs in `examples/config/` parse into each component's `Config`, so they stay
//! true as the structs change (`htfaas <component> --config FILE`).

use std::path::PathBuf;

fn sample(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/config").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn every_sample_config_parses() {
    let storage: htfaas_storage::Config = serde_json::from_slice(&sample("storage.json")).expect("storage.json");
    assert_eq!(storage.listen.port(), 2880);
    let scheduler: htfaas_scheduler::Config =
        serde_json::from_slice(&sample("scheduler.json")).expect("scheduler.json");
    assert_eq!(scheduler.submit_issuers.len(), 1);
    let gateway: htfaas_gateway::Config = serde_json::from_slice(&sample("gateway.json")).expect("gateway.json");
    assert_eq!(gateway.scheduler_url, "http://127.0.0.1:8090");
    // The scheduler trusts exactly the sample gateway's storage and its module store.
    assert_eq!(scheduler.storage_origins, std::slice::from_ref(&gateway.storage_url));
    assert_eq!(scheduler.module_stores, [format!("http://{}", gateway.listen)]);
    let ep: htfaas_ep::Config = serde_json::from_slice(&sample("ep.json")).expect("ep.json");
    assert_eq!(ep.slots.cpus, 2);
    // The EP reaches exactly the sample gateway (modules) and its storage.
    assert_eq!(ep.allowed_origins, Some(vec![format!("http://{}", gateway.listen), gateway.storage_url.clone()]));
    // The gateway's identity map loads, and its first rule maps the sample issuer's users.
    assert_eq!(gateway.oidc_issuers.len(), 1);
    assert_eq!(gateway.identity_map.as_deref(), Some(std::path::Path::new("examples/config/identity-map.json")));
    let map =
        htfaas_functions::identity_map::IdentityMap::parse(&sample("identity-map.json")).expect("identity-map.json");
    let who = htfaas_functions::identity_map::Identity {
        issuer: gateway.oidc_issuers[0].issuer.clone(),
        sub: "carol@example.org".into(),
        groups: vec!["/site/cms".into()],
    };
    assert_eq!(map.map(&who).expect("carol").owner, "carol");
    let users: serde_json::Value = serde_json::from_slice(&sample("storage-users.json")).expect("users");
    assert_eq!(users["users"][0]["name"], "gateway");
}

#[test]
fn a_typo_in_a_config_is_refused() {
    let mut v: serde_json::Value = serde_json::from_slice(&sample("gateway.json")).expect("gateway.json");
    v["scheduler_ulr"] = "http://127.0.0.1:1".into();
    let err = serde_json::from_value::<htfaas_gateway::Config>(v).expect_err("unknown field refused");
    assert!(err.to_string().contains("scheduler_ulr"), "{err}");
}
