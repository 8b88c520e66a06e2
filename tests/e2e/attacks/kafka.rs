//! Attacks through dCache's Kafka topic: whoever may produce to the billing topic
//! speaks, through `htfaas bridge dcache-kafka`, as the storage does, and may lie. What a
//! lying record gets, on the real stack with a real broker (tansu):
//!
//! - a record claiming an upload in another owner's directory (and another uploader) fires
//!   only the functions that directory's rules fire, as a real upload there would: its owner's,
//!   never the claimed uploader's; the bridge puts it on that directory's path subject, which
//!   only that owner's lane reads;
//! - a record for a path outside the paths the billing subject may speak for (`source_paths`)
//!   is refused by the gateway and counted (`events_out_of_bounds`), though a function waits on
//!   that path;
//! - a path that is not clean (`..`) is refused by the bridge, counted malformed, and never
//!   published;
//! - a record's own `Nats-Msg-Id` header (and key) are dropped: it cannot make JetStream drop
//!   the next record as a duplicate of itself;
//! - the bridge's NATS credential publishes billing messages and nothing else
//!   (`Permissions Violation` on a CloudEvents subject).
//!
//! And the bridge's own Kafka credential and TLS (`sasl_ssl`, as DESY's Kafka), against tansu
//! requiring SCRAM logins behind a TLS proxy with a site CA: a bridge given another CA refuses
//! the broker's certificate, and one the site's CA signed for another name (the handshake is
//! broken off, nothing is read or published); a wrong password is refused by the broker and
//! reads nothing while a bridge with the right one beside it reads and fires the record; SCRAM-
//! SHA-256 works too.
//!
//! A legitimate record last: the lanes read in order, so by its job everything before it was
//! decided.

use crate::kafka::{Bridge, settings, wait_committed};
use crate::kafka_support::{Access, Pki, Tansu, TlsProxy, apply, create_topic, tansu_installed, transfer};
use htfaas::stack::{USER, demo_manifest};
use htfaas_bridges::kafka::{SaslMechanism, Security, SecurityProtocol, message_id};
use htfaas_functions::manifest::{Outputs, Trigger};
use htfaas_functions::namespace::Right;
use htfaas_functions::nats::connect_options;
use htfaas_functions::proto::{CLOUDEVENTS_SUBJECT_PREFIX, JobState};
use htfaas_tests::{events_settled, start_stack, upload_checksum, wait_for};
use std::sync::atomic::Ordering;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_record_fires_only_what_its_directorys_rules_allow_and_chooses_neither_subject_nor_message_id() {
    let Some(tansu) = tansu_installed("the Kafka attack") else { return };
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let broker = tokio::task::block_in_place(|| Tansu::start(&tansu, &dir.path().join("kafka")));
    let p = create_topic(&Access::plain(&broker), "billing", 1).await;

    // bob reads /data/bob/ and fires on it (writing to /data/bob-out/); alice (the stack's user) fires on /data/alice/ and,
    // granted /site/, on /site/ (outside the billing subject's source_paths, /data/).
    client.grant("bob", Right::Read, "/data/bob/").await.expect("grant bob /data/bob/");
    client.grant("bob", Right::Write, "/data/bob-out/").await.expect("grant bob /data/bob-out/");
    client.grant(USER, Right::Read, "/site/").await.expect("grant /site/");
    for path in ["/data/bob/in.dat", "/data/alice/in.dat", "/data/alice/next.dat"] {
        client.put_bytes(b"kafka".to_vec(), path).await.expect("put");
    }
    events_settled(&client).await;
    let digest = upload_checksum(&client).await;
    let function = |name: &str, owner: &str, trigger: &str, out: &str| {
        let mut m = demo_manifest(digest.clone());
        m.name = name.into();
        m.owner = owner.into();
        m.trigger = Trigger::on_path(trigger);
        m.outputs = Outputs::into_dir(out);
        m
    };
    client.register(&function("bobs", "bob", "/data/bob/**", "/data/bob-out/")).await.expect("bob's function");
    client.register(&function("alices", USER, "/data/alice/**", "/data/alice-out/")).await.expect("alice's");
    client.register(&function("site", USER, "/site/**", "/data/site-out/")).await.expect("alice's on /site/");

    let bridge = Bridge::start(settings(&stack, &broker.bootstrap()));
    // 1. An upload to bob's directory, claimed as alice's.
    let o1 = p.produce(0, &transfer("/data/bob/in.dat", 1)).await;
    // 2. Outside the paths the billing subject may speak for.
    p.produce(0, &transfer("/site/in/forged.dat", 2)).await;
    // 3. A path climbing out of alice's directory into bob's.
    p.produce(0, &transfer("/data/alice/../bob/in.dat", 3)).await;
    // 4. A record naming the next record's message id (and a key): if the bridge passed it on,
    // JetStream would drop the next one as its duplicate.
    let next = o1 + 4;
    let forged_id = message_id("billing", 0, next);
    let key = b"storage.dcache.billing.path.data.bob._";
    p.produce_with(0, &transfer("/data/alice/in.dat", 4), Some(key), &[("Nats-Msg-Id", forged_id.as_bytes())]).await;
    let o5 = p.produce(0, &transfer("/data/alice/next.dat", 5)).await;
    assert_eq!(o5, next);

    let jobs = wait_for("the jobs of every record", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        let done = |path: &str| jobs.iter().any(|j| j.event.path == path && j.state == JobState::Completed);
        (done("/data/bob/in.dat") && done("/data/alice/in.dat") && done("/data/alice/next.dat")).then_some(jobs)
    })
    .await;
    wait_for("the refusal to be counted", LIMIT, || async {
        (client.stats().await.ok()?.events_out_of_bounds == 1).then_some(())
    })
    .await;
    let mut ran: Vec<(String, String, String)> =
        jobs.iter().map(|j| (j.function.clone(), j.owner.clone(), j.event.path.clone())).collect();
    ran.sort();
    let want = [
        ("alices", USER, "/data/alice/in.dat"),
        ("alices", USER, "/data/alice/next.dat"),
        ("bobs", "bob", "/data/bob/in.dat"),
    ]
    .map(|(f, o, p)| (f.to_owned(), o.to_owned(), p.to_owned()));
    assert_eq!(ran, want, "bob's directory fired bob's function only, /site/ nothing, the climbing path nothing");
    let s = bridge.wait("every record committed", |s| s.received == 5 && s.lag == 0).await;
    assert_eq!((s.published, s.malformed, s.duplicates), (4, 1, 0), "the climbing path was never published: {s:?}");
    bridge.stop().await;

    // 5. The bridge's credential publishes billing messages only.
    let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let nats = connect_options("kafka-bridge", stack.nats_credential("bridge-dcache-kafka"))
        .event_callback(move |event| {
            let errors_tx = errors_tx.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    let _ = errors_tx.send(e.to_string());
                }
            }
        })
        .connect(stack.nats_url())
        .await
        .expect("the bridge's credential connects");
    let subject = format!("{CLOUDEVENTS_SUBJECT_PREFIX}.dcache-sse");
    nats.publish(subject.clone(), b"{}".to_vec().into()).await.expect("queued");
    nats.flush().await.expect("flush");
    let refusal = tokio::time::timeout(LIMIT, errors.recv()).await.expect("a refusal").expect("an error");
    assert_eq!(refusal, format!(r#"nats: Permissions Violation for Publish to "{subject}""#));
    stack.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_and_sasl_the_kafka_bridge_refuses_a_broker_its_ca_did_not_sign_and_a_wrong_password_reads_nothing() {
    let Some(tansu) = tansu_installed("the Kafka TLS/SASL attack") else { return };
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let site = Pki::new(&dir.path().join("pki"), "site-ca");
    let other = Pki::new(&dir.path().join("pki"), "other-ca");
    // tansu on its own port, advertising the proxy's: every connection goes through TLS.
    let port = htfaas::nats::free_port().expect("a free port");
    let proxy = TlsProxy::start(site.server(&["127.0.0.1"]), port).await;
    // The same broker behind a certificate the site's CA signed for another name.
    let misnamed = TlsProxy::start(site.server(&["kafka.example.org"]), port).await;
    let mut broker =
        tokio::task::block_in_place(|| Tansu::start_behind(&tansu, &dir.path().join("kafka"), port, proxy.port));
    let password = "correct horse battery staple";
    tokio::task::block_in_place(|| {
        broker.create_user("htfaas", password, SaslMechanism::ScramSha512);
        broker.create_user("htfaas-256", password, SaslMechanism::ScramSha256);
        broker.require_logins();
    });
    let secrets = dir.path().join("secrets");
    std::fs::create_dir_all(&secrets).expect("secrets");
    let (right, wrong) = (secrets.join("kafka.password"), secrets.join("wrong.password"));
    std::fs::write(&right, format!("{password}\n")).expect("write");
    std::fs::write(&wrong, "Tr0ub4dor&3\n").expect("write");
    let access = Access {
        bootstrap: broker.bootstrap(),
        security: Security {
            protocol: SecurityProtocol::SaslSsl,
            ca_file: Some(site.ca_file.clone()),
            sasl_mechanism: Some(SaslMechanism::ScramSha512),
            sasl_username: Some("htfaas".into()),
            sasl_password_file: None,
        },
        password: Some(password.into()),
    };
    let producer = create_topic(&access, "billing", 1).await;
    let path = "/data/raw/over-tls.dat".to_owned();
    client.put_bytes(b"kafka".to_vec(), &path).await.expect("put");
    events_settled(&client).await;
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");
    producer.produce(0, &transfer(&path, 1)).await;
    // Gone before the handshakes are counted: only the bridges connect from here on.
    drop(producer);
    let bridge_settings = |group: &str, ca: &std::path::Path, password_file: &std::path::Path| {
        let mut s = settings(&stack, &broker.bootstrap());
        apply(&access, &mut s, Some(password_file.to_owned()));
        s.group = group.into();
        s.security.ca_file = Some(ca.to_owned());
        s
    };

    // 1. Another CA: the bridge breaks the handshake off; it reads and publishes nothing.
    let handshakes = proxy.handshakes.load(Ordering::Relaxed);
    let bridge = Bridge::start(bridge_settings("other-ca", &other.ca_file, &right));
    bridge.wait("the broker's certificate refused", |s| s.tls_refused >= 1).await;
    wait_for("the proxy to see the handshake broken off", LIMIT, || async {
        (proxy.refused.load(Ordering::Relaxed) >= 1).then_some(())
    })
    .await;
    let s = bridge.stop().await;
    assert_eq!((s.received, s.published, s.partitions, s.login_refused), (0, 0, 0, 0), "{s:?}");
    assert_eq!(proxy.handshakes.load(Ordering::Relaxed), handshakes, "no handshake completed with another CA");

    // 2. The site's CA, but a certificate for another name than the address connected to.
    let mut s = bridge_settings("misnamed", &site.ca_file, &right);
    s.brokers = vec![format!("127.0.0.1:{}", misnamed.port)];
    let bridge = Bridge::start(s);
    bridge.wait("the misnamed certificate refused", |s| s.tls_refused >= 1).await;
    let s = bridge.stop().await;
    assert_eq!((s.received, s.published, s.partitions), (0, 0, 0), "{s:?}");
    assert_eq!(misnamed.handshakes.load(Ordering::Relaxed), 0, "{} refused", misnamed.refused.load(Ordering::Relaxed));

    // 3. The site's CA and a wrong password, beside a bridge with the right one (SCRAM-SHA-512):
    // the TLS handshakes complete, the wrong login is refused and reads nothing, while the
    // right one reads and fires the record.
    let wrong_bridge = Bridge::start(bridge_settings("wrong-password", &site.ca_file, &wrong));
    let right_bridge = Bridge::start(bridge_settings("htfaas", &site.ca_file, &right));
    wait_for("the record's job", LIMIT, || async {
        let jobs = client.jobs().await.ok()?;
        jobs.iter().any(|j| j.event.path == path && j.state == JobState::Completed).then_some(())
    })
    .await;
    wait_committed(&access, "htfaas", 1, &[(0, 1)]).await;
    wrong_bridge.wait("the wrong password refused", |s| s.login_refused >= 1).await;
    assert!(proxy.handshakes.load(Ordering::Relaxed) > handshakes, "TLS went through");
    let s = wrong_bridge.stop().await;
    assert_eq!((s.received, s.published, s.partitions, s.tls_refused), (0, 0, 0, 0), "{s:?}");
    let s = right_bridge.stop().await;
    assert_eq!((s.received, s.published, s.duplicates), (1, 1, 0), "{s:?}");

    // 4. SCRAM-SHA-256, in another group: reads the same record, which JetStream drops as a
    // duplicate (same id).
    let mut sha256 = bridge_settings("scram-256", &site.ca_file, &right);
    sha256.security.sasl_mechanism = Some(SaslMechanism::ScramSha256);
    sha256.security.sasl_username = Some("htfaas-256".into());
    let bridge = Bridge::start(sha256);
    let s = bridge.wait("the record read again", |s| s.published == 1).await;
    assert_eq!((s.received, s.duplicates), (1, 1), "{s:?}");
    bridge.stop().await;
    events_settled(&client).await;
    let jobs = client.jobs().await.expect("jobs");
    assert_eq!(jobs.len(), 1, "one job: {jobs:?}");
    stack.stop().await.expect("clean stop");
}
