//! Failure webhooks' URLs and keys: a developer's manifest cannot make the gateway
//! POST anywhere the site did not allow (not over plain HTTP, not to a host outside
//! `webhook_hosts`, not behind a user part, nowhere at all on a site that lists none), and
//! cannot hand the signing key to its own runs. Each is refused at registration (400, naming
//! the field), and nothing is registered.

use htfaas_functions::manifest::Webhook;
use htfaas_tests::{start_stack_with, upload_checksum};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_to_a_host_the_site_did_not_allow_or_a_key_the_runs_would_get_is_refused() {
    let (_dir, stack) = start_stack_with(|o| {
        o.gateway_settings.insert("webhook_hosts".into(), serde_json::json!(["hooks.example.org"]));
    })
    .await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    let hooked = |url: &str, key: &str, secrets: &[&str]| htfaas_functions::FunctionManifest {
        name: "hooked".into(),
        webhook: Some(Webhook { url: url.into(), key_secret: key.into() }),
        secrets: secrets.iter().map(|s| (*s).to_owned()).collect(),
        ..htfaas::stack::demo_manifest(digest.clone())
    };
    for (m, says) in [
        (hooked("http://hooks.example.org/h", "WEBHOOK_KEY", &[]), "webhook.url"),
        (hooked("https://169.254.169.254/latest/meta-data", "WEBHOOK_KEY", &[]), "this site allows"),
        (hooked("https://hooks.example.org.attacker.example/h", "WEBHOOK_KEY", &[]), "this site allows"),
        (hooked("https://hooks.example.org@127.0.0.1/h", "WEBHOOK_KEY", &[]), "webhook.url"),
        (hooked("https://hooks.example.org/h", "DB_PASSWORD", &["DB_PASSWORD"]), "webhook.key_secret"),
    ] {
        let e = format!("{:#}", client.register(&m).await.expect_err("refused"));
        assert!(e.contains("400") && e.contains(says), "{:?}: {e}", m.webhook);
    }
    assert!(client.functions().await.expect("functions").iter().all(|f| f.manifest.name != "hooked"));
    // The allowed host, over https, with a key of its own: registered.
    client.register(&hooked("https://hooks.example.org/h", "WEBHOOK_KEY", &[])).await.expect("allowed");
    stack.stop().await.expect("stop");

    // A site that lists no host takes no webhook at all.
    let (_dir, stack) = start_stack_with(|_| {}).await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    let m = htfaas_functions::FunctionManifest {
        webhook: Some(Webhook { url: "https://hooks.example.org/h".into(), key_secret: "WEBHOOK_KEY".into() }),
        ..htfaas::stack::demo_manifest(digest)
    };
    let e = format!("{:#}", client.register(&m).await.expect_err("refused"));
    assert!(e.contains("400") && e.contains("this site allows"), "{e}");
    stack.stop().await.expect("stop");
}
