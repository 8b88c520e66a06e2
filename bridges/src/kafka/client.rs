//! The bridge's settings as librdkafka's configuration ([`client_config`]): the consumer group,
//! offsets committed by hand only, and the transport: plaintext, TLS (`ssl`, the brokers'
//! certificates checked against the system's CAs or `--ca-file`, and their names against the
//! broker's address), SASL (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`) with or without TLS.
//!
//! The SASL password is read from its file at start ([`read_password`]) and goes into the
//! configuration only: never into [`super::Settings`], a log line or an error message.
//!
//! Must not know: NATS, records, how the consumer is polled.

use super::{Security, Settings, SettingsError, StartAt};
use rdkafka::config::ClientConfig;
use std::path::Path;

/// The `client.id` the brokers see.
pub const CLIENT_ID: &str = "htfaas-bridge-dcache-kafka";

/// librdkafka's configuration for `settings`, with the SASL `password` when SASL is used.
pub fn client_config(settings: &Settings, password: Option<&str>) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", settings.brokers.join(","))
        .set("client.id", CLIENT_ID)
        .set("group.id", &settings.group)
        // Offsets are committed by the bridge, after the PubAcks, and by nothing else.
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // Only where the group has no offset and the bridge could not look one up at the
        // assignment (`group`), or where a committed offset left the partition (retention).
        .set(
            "auto.offset.reset",
            match settings.start {
                StartAt::Earliest => "earliest",
                StartAt::Latest => "latest",
            },
        )
        // Eager: every rebalance revokes everything, then assigns (`group` relies on it).
        .set("partition.assignment.strategy", "range,roundrobin")
        .set("fetch.wait.max.ms", settings.fetch_wait.as_millis().clamp(1, 300_000).to_string())
        .set("max.partition.fetch.bytes", settings.fetch_max_bytes.to_string())
        .set("statistics.interval.ms", settings.lag_interval.as_millis().clamp(10, 86_400_000).to_string())
        // New partitions of the topic (and a topic made after the bridge started) are found
        // within a minute.
        .set("topic.metadata.refresh.interval.ms", "60000");
    security(&mut c, &settings.security, password);
    c
}

fn security(c: &mut ClientConfig, s: &Security, password: Option<&str>) {
    c.set("security.protocol", s.protocol.as_str());
    if s.protocol.tls() {
        // Also librdkafka's default since 2.0; said here so that no default can turn it off.
        c.set("enable.ssl.certificate.verification", "true");
        c.set("ssl.endpoint.identification.algorithm", "https");
        if let Some(ca) = &s.ca_file {
            c.set("ssl.ca.location", ca.to_string_lossy());
        }
    }
    if s.protocol.sasl() {
        if let Some(m) = s.sasl_mechanism {
            c.set("sasl.mechanism", m.as_str());
        }
        if let Some(u) = &s.sasl_username {
            c.set("sasl.username", u);
        }
        if let Some(p) = password {
            c.set("sasl.password", p);
        }
    }
}

/// The SASL password in `file`: its content less one trailing line end.
pub fn read_password(file: &Path) -> Result<String, SettingsError> {
    let unreadable = |why: String| SettingsError::PasswordFile { file: file.to_owned(), why };
    let bytes = std::fs::read(file).map_err(|e| unreadable(e.to_string()))?;
    let mut text = String::from_utf8(bytes).map_err(|_| unreadable("not UTF-8".into()))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(unreadable("empty".into()));
    }
    if text.contains(['\0', '\n']) {
        return Err(unreadable("more than one line, or a NUL byte".into()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::super::{SaslMechanism, SecurityProtocol};
    use super::*;
    use std::path::PathBuf;

    fn settings(protocol: SecurityProtocol) -> Settings {
        let mut s = Settings::new(vec!["k1:9093".into(), "k2:9093".into()], "nats://127.0.0.1:4222");
        s.group = "site-a".into();
        s.security = Security { protocol, ..Default::default() };
        s
    }

    fn get<'a>(c: &'a ClientConfig, key: &str) -> Option<&'a str> {
        c.get(key)
    }

    #[test]
    fn the_group_commits_by_hand_only() {
        let c = client_config(&settings(SecurityProtocol::Plaintext), None);
        assert_eq!(get(&c, "bootstrap.servers"), Some("k1:9093,k2:9093"));
        assert_eq!(get(&c, "group.id"), Some("site-a"));
        assert_eq!(get(&c, "enable.auto.commit"), Some("false"));
        assert_eq!(get(&c, "enable.auto.offset.store"), Some("false"));
        assert_eq!(get(&c, "auto.offset.reset"), Some("latest"));
        assert_eq!(get(&c, "partition.assignment.strategy"), Some("range,roundrobin"));
        assert_eq!(get(&c, "security.protocol"), Some("plaintext"));
        assert_eq!(get(&c, "ssl.ca.location"), None);
        assert_eq!(get(&c, "sasl.password"), None);
        let mut s = settings(SecurityProtocol::Plaintext);
        s.start = StartAt::Earliest;
        assert_eq!(get(&client_config(&s, None), "auto.offset.reset"), Some("earliest"));
    }

    #[test]
    fn tls_and_sasl_map_to_librdkafkas_keys() {
        let mut s = settings(SecurityProtocol::SaslSsl);
        s.security.ca_file = Some(PathBuf::from("/etc/htfaas/kafka-ca.pem"));
        s.security.sasl_mechanism = Some(SaslMechanism::ScramSha512);
        s.security.sasl_username = Some("htfaas".into());
        s.security.sasl_password_file = Some(PathBuf::from("/etc/htfaas/kafka.password"));
        let c = client_config(&s, Some("s3cret"));
        assert_eq!(get(&c, "security.protocol"), Some("sasl_ssl"));
        assert_eq!(get(&c, "ssl.ca.location"), Some("/etc/htfaas/kafka-ca.pem"));
        assert_eq!(get(&c, "enable.ssl.certificate.verification"), Some("true"));
        assert_eq!(get(&c, "ssl.endpoint.identification.algorithm"), Some("https"));
        assert_eq!(get(&c, "sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(get(&c, "sasl.username"), Some("htfaas"));
        assert_eq!(get(&c, "sasl.password"), Some("s3cret"));
        assert!(!format!("{s:?}").contains("s3cret"), "the settings never hold the password");

        let mut s = settings(SecurityProtocol::SaslPlaintext);
        s.security.sasl_mechanism = Some(SaslMechanism::Plain);
        s.security.sasl_username = Some("u".into());
        let c = client_config(&s, Some("p"));
        assert_eq!(get(&c, "sasl.mechanism"), Some("PLAIN"));
        assert_eq!(get(&c, "ssl.endpoint.identification.algorithm"), None, "no TLS");
        let mut s = settings(SecurityProtocol::Ssl);
        s.security.ca_file = Some(PathBuf::from("ca.pem"));
        let c = client_config(&s, None);
        assert_eq!((get(&c, "security.protocol"), get(&c, "sasl.mechanism")), (Some("ssl"), None));
        assert_eq!(get(&c, "ssl.ca.location"), Some("ca.pem"));
    }

    #[test]
    fn the_password_file_is_one_line() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("password");
        for (content, want) in [("s3cret\n", "s3cret"), ("s3cret\r\n", "s3cret"), ("with space ", "with space ")] {
            std::fs::write(&file, content).expect("write");
            assert_eq!(read_password(&file).expect("read"), want);
        }
        for bad in ["", "\n", "two\nlines\n", "nul\0"] {
            std::fs::write(&file, bad).expect("write");
            let e = read_password(&file).expect_err(bad).to_string();
            assert!(e.starts_with(&format!("the SASL password file {}: ", file.display())), "{e}");
            assert!(!e.contains("lines") && !e.contains("nul\0"), "no content in the message: {e}");
        }
        let missing = read_password(&dir.path().join("missing")).expect_err("missing").to_string();
        assert!(missing.contains("No such file"), "{missing}");
    }
}
