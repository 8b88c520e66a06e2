//! The local stack's NATS: who may do what ([`Role`], [`stack_user`]), on the one nats-server
//! harness of `htfaas_functions::nats_server` (re-exported here: [`NatsServer`], [`NatsUser`],
//! [`find_binary`], [`free_port`]).
//!
//! Used by `htfaas up`, the harnesses and the tests. Each user is an nkey public key with the
//! subjects it may publish to and subscribe to; a client without a credential, or with an
//! unknown one, cannot connect.

use htfaas_functions::nats::NatsCredential;
pub use htfaas_functions::nats_server::{NatsServer, NatsServerError, NatsUser, find_binary, free_port};
use htfaas_functions::proto::{
    BILLING_SUBSCRIPTION, CLOUDEVENTS_SUBJECT_PREFIX, EVENTS_STREAM, EVENTS_SUBJECT, JOBS_STREAM, JOBS_SUBJECTS,
    PATH_SUBJECTS,
};

/// A role in the local stack, with what its NATS credential may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The built-in storage: publishes billing messages on [`EVENTS_SUBJECT`] and the path
    /// subjects ([`PATH_SUBJECTS`]) (waiting for
    /// the PubAck) and makes sure the events stream exists (JetStream `STREAM.INFO` and
    /// `STREAM.CREATE` of [`EVENTS_STREAM`] only).
    Storage,
    /// The scheduler: publishes job-end notifications on [`JOBS_SUBJECTS`] (waiting for the
    /// PubAck) and makes sure their stream exists (`STREAM.INFO` and `STREAM.CREATE` of
    /// [`JOBS_STREAM`] only); it reads nothing.
    Scheduler,
    /// The gateway: the JetStream API (stream and consumer set-up, its durable and its replays'
    /// ephemeral consumers, pulls, message reads) and acks; it publishes no event.
    Gateway,
    /// A bridge whose events go on `storage.cloudevents.<source>`: that subject only.
    Bridge(String),
    /// The dCache Kafka bridge (`htfaas bridge dcache-kafka`): dCache's own billing messages, so
    /// it publishes where the storage does ([`EVENTS_SUBJECT`], [`PATH_SUBJECTS`], waiting for
    /// the PubAck); nothing of the JetStream API (its offsets are committed to Kafka's consumer
    /// group).
    KafkaBridge,
    /// The site's operator (`htfaas` tools, the tests, the crash harness, the bench): publishes
    /// on every events subject, as any source would, subscribes to them and to the job-end
    /// notifications, and reads both streams and their consumers; it changes no stream or
    /// consumer.
    Operator,
}

/// What `role`'s credential `credential` may do in the local stack.
pub fn stack_user(role: &Role, credential: &NatsCredential) -> NatsUser {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let (publish, subscribe) = match role {
        Role::Storage => (
            vec![
                EVENTS_SUBJECT.to_owned(),
                PATH_SUBJECTS.to_owned(),
                format!("$JS.API.STREAM.INFO.{EVENTS_STREAM}"),
                format!("$JS.API.STREAM.CREATE.{EVENTS_STREAM}"),
            ],
            vec![],
        ),
        Role::Scheduler => (
            vec![
                JOBS_SUBJECTS.to_owned(),
                format!("$JS.API.STREAM.INFO.{JOBS_STREAM}"),
                format!("$JS.API.STREAM.CREATE.{JOBS_STREAM}"),
            ],
            vec![],
        ),
        Role::Gateway => (s(&["$JS.API.>", "$JS.ACK.>"]), vec![]),
        Role::Bridge(source) => (vec![format!("{CLOUDEVENTS_SUBJECT_PREFIX}.{source}")], vec![]),
        Role::KafkaBridge => (vec![EVENTS_SUBJECT.to_owned(), PATH_SUBJECTS.to_owned()], vec![]),
        Role::Operator => {
            let cloudevents = format!("{CLOUDEVENTS_SUBJECT_PREFIX}.>");
            let mut publish = vec![
                EVENTS_SUBJECT.to_owned(),
                PATH_SUBJECTS.to_owned(),
                cloudevents.clone(),
                "$JS.API.INFO".to_owned(),
            ];
            for stream in [EVENTS_STREAM, JOBS_STREAM] {
                for read in ["STREAM.INFO", "STREAM.MSG.GET", "DIRECT.GET", "CONSUMER.INFO"] {
                    publish.push(format!("$JS.API.{read}.{stream}.>"));
                    publish.push(format!("$JS.API.{read}.{stream}"));
                }
                publish.push(format!("$JS.API.CONSUMER.NAMES.{stream}"));
            }
            publish.push("$JS.API.STREAM.NAMES".to_owned());
            (publish, vec![BILLING_SUBSCRIPTION.to_owned(), cloudevents, JOBS_SUBJECTS.to_owned()])
        }
    };
    NatsUser {
        public_key: credential.public_key().to_owned(),
        publish,
        subscribe,
        inbox_prefix: credential.inbox_prefix(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::nats_server::authorization;

    #[test]
    fn the_authorization_block_quotes_every_string_and_confines_each_user_to_its_inbox() {
        let bridge = NatsCredential::generate();
        let mut user = stack_user(&Role::Bridge("xrootd-notify".into()), &bridge);
        assert_eq!(user.publish, ["storage.cloudevents.xrootd-notify"]);
        user.publish.push("a\"b}".into());
        let text = authorization(&[user]);
        let pk = bridge.public_key();
        assert_eq!(
            text,
            format!(
                "authorization {{\n  users = [\n    {{nkey: \"{pk}\", permissions: {{publish: {{allow: \
                 [\"storage.cloudevents.xrootd-notify\", \"a\\\"b}}\"]}}, subscribe: {{allow: [\"_INBOX.{pk}.>\"]}}}}}}\n  ]\n}}\n"
            )
        );
        let storage = stack_user(&Role::Storage, &bridge);
        assert_eq!(
            storage.publish,
            [
                "storage.dcache.billing",
                "storage.dcache.billing.path.>",
                "$JS.API.STREAM.INFO.DCACHE_BILLING",
                "$JS.API.STREAM.CREATE.DCACHE_BILLING"
            ]
        );
    }

    #[test]
    fn the_kafka_bridge_publishes_billing_and_nothing_else() {
        let kafka = stack_user(&Role::KafkaBridge, &NatsCredential::generate());
        assert_eq!(kafka.publish, ["storage.dcache.billing", "storage.dcache.billing.path.>"]);
        assert!(kafka.subscribe.is_empty(), "only its inbox");
    }
}
