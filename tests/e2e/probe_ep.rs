//! The test as an EP: an annex function whose jobs only an EP of annex `probe` runs, and this
//! test attached as that EP over the real attach protocol (`path`'s address binding,
//! `attacks::renewals`' renewals).

use futures_util::{SinkExt as _, StreamExt as _};
use htfaas::stack::{Stack, demo_manifest, mint_ep_token};
use htfaas_functions::Resources;
use htfaas_functions::proto::{EpMsg, Hello, SchedulerMsg};
use htfaas_tests::upload_checksum;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

const LIMIT: Duration = Duration::from_secs(60);

/// The test's link to the scheduler.
pub type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next message on `ws` other than a Warm (compiling ahead is a real EP's business),
/// skipping pings, within `LIMIT`.
pub async fn next_msg(ws: &mut Ws) -> SchedulerMsg {
    loop {
        let frame = tokio::time::timeout(LIMIT, ws.next()).await.expect("a message in time");
        match frame.expect("link open").expect("frame") {
            Message::Text(t) => match serde_json::from_str(t.as_str()).expect("SchedulerMsg") {
                SchedulerMsg::Warm { .. } => continue,
                msg => return msg,
            },
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

/// Registers alice's checksum function `name` on `/data/<name>/**` (outputs to
/// `/data/<name>-out/`) for annex `probe`, then attaches this test as EP `probe-1` of that
/// annex; returns the link once welcomed.
pub async fn attach_probe(stack: &Stack, dir: &std::path::Path, name: &str) -> Ws {
    attach_probe_with(stack, dir, name, |_| {}).await
}

/// [`attach_probe`], with the probe function's manifest changed by `tweak` first.
pub async fn attach_probe_with(
    stack: &Stack,
    dir: &std::path::Path,
    name: &str,
    tweak: impl FnOnce(&mut htfaas_functions::FunctionManifest),
) -> Ws {
    let client = stack.client().expect("client");
    let mut probe = demo_manifest(upload_checksum(&client).await);
    probe.name = name.into();
    probe.trigger.path = format!("/data/{name}/**");
    probe.outputs.dir = format!("/data/{name}-out/");
    probe.annex = Some("probe".into());
    tweak(&mut probe);
    client.grant("alice", htfaas_functions::namespace::Right::Annex, "probe").await.expect("grant the annex");
    client.register(&probe).await.expect("register the probe");

    let token = mint_ep_token(dir, None, Some("probe".into()), 600).expect("mint");
    let url = stack.info().scheduler_url.replacen("http://", "ws://", 1) + "/v1/ep/attach";
    let mut req = url.into_client_request().expect("request");
    req.headers_mut().insert("authorization", format!("Bearer {token}").parse().expect("header"));
    let (mut ws, _) = tokio::time::timeout(LIMIT, tokio_tungstenite::connect_async(req))
        .await
        .expect("attach in time")
        .expect("attach");
    let hello = EpMsg::Hello(Hello {
        name: "probe-1".into(),
        slots: Resources::new(1, 1024, 600),
        protocol: 1,
        annex: Some("probe".into()),
        labels: Default::default(),
        prefetch: None,
        runtimes: vec![htfaas_functions::manifest::RuntimeKind::Wasm],
        images: Vec::new(),
        renews_attach: false,
    });
    ws.send(Message::text(serde_json::to_string(&hello).expect("encode"))).await.expect("hello");
    assert!(matches!(next_msg(&mut ws).await, SchedulerMsg::Welcome { .. }));
    ws
}
