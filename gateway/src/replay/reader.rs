//! The recorded events' reader: a window of the events stream through an ephemeral pull
//! consumer that acks nothing ([`Reader`]), each message decided as the ingest decides it.
//!
//! Must not know: triggers, firings, HTTP.

use super::{BATCH, ReplayError, Window};
use async_nats::jetstream::{self, consumer::AckPolicy, consumer::DeliverPolicy, consumer::PullConsumer};
use futures_util::StreamExt as _;
use htfaas_functions::proto::{EVENTS_STREAM, EVENTS_SUBJECTS};
use htfaas_functions::sources::{self, Decision, EventError, SourcePolicy};
use std::time::Duration;

/// One recorded message, parsed.
#[derive(Debug)]
pub struct Recorded {
    /// Its stream sequence.
    pub seq: u64,
    /// When the stream stored it, Unix ms.
    pub recorded_ms: u64,
    /// What [`sources::decide`] made of it.
    pub decision: Result<Decision, EventError>,
}

/// Reads a [`Window`] of the events stream in order, through an ephemeral consumer that acks
/// nothing. Call [`Reader::close`] when done (else the server drops the consumer after a
/// minute of inactivity).
pub struct Reader {
    /// The stream and the consumer; none when there is nothing to read.
    source: Option<(jetstream::stream::Stream, PullConsumer)>,
    /// Last stream sequence when the request began: the reader ends there.
    end_seq: u64,
    until_ms: Option<u64>,
    limit: u64,
    /// Messages read so far.
    read: u64,
    /// The last message read: (sequence, recording time).
    pub(super) last: Option<(u64, u64)>,
    /// Why it stopped before the end of its window, if it did.
    pub(super) cut: Option<String>,
    done: bool,
    policy: std::sync::Arc<SourcePolicy>,
    /// Which paths each subject may speak for: a recorded event outside them replays as it
    /// was ingested, refused.
    bindings: std::sync::Arc<htfaas_functions::sources::binding::Bindings>,
}

pub(super) fn unavailable(what: &str) -> impl FnOnce(String) -> ReplayError + '_ {
    move |e| ReplayError::Unavailable(format!("{what}: {e}"))
}

impl Reader {
    /// Opens `window` on the events stream of `js`, parsing with `policy` and refusing what
    /// `bindings` refuses (read as malformed). A missing or empty
    /// stream reads as no message.
    pub async fn open(
        js: &jetstream::Context,
        window: &Window,
        policy: std::sync::Arc<SourcePolicy>,
        bindings: std::sync::Arc<htfaas_functions::sources::binding::Bindings>,
    ) -> Result<Reader, ReplayError> {
        let mut reader = Reader {
            source: None,
            end_seq: 0,
            until_ms: window.until_ms,
            limit: window.limit,
            read: 0,
            last: None,
            cut: None,
            done: true,
            policy,
            bindings,
        };
        let mut stream = match js.get_stream(EVENTS_STREAM).await {
            Ok(stream) => stream,
            Err(e)
                if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref j)
                    if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
            {
                return Ok(reader);
            }
            Err(e) => return Err(unavailable("look up the events stream")(e.to_string())),
        };
        let end_seq =
            stream.info().await.map_err(|e| unavailable("read the events stream")(e.to_string()))?.state.last_sequence;
        if end_seq == 0 {
            return Ok(reader);
        }
        let start_time = async_nats::datetime::from_nanos(i128::from(window.since_ms) * 1_000_000)
            .map_err(|e| ReplayError::BadRequest(format!("since: {e}")))?;
        let config = jetstream::consumer::pull::Config {
            deliver_policy: DeliverPolicy::ByStartTime { start_time },
            ack_policy: AckPolicy::None,
            filter_subjects: EVENTS_SUBJECTS.iter().map(|s| s.to_string()).collect(),
            inactive_threshold: Duration::from_secs(60),
            memory_storage: true,
            description: Some("htfaas replay (ephemeral)".into()),
            ..Default::default()
        };
        let consumer: PullConsumer =
            stream.create_consumer(config).await.map_err(|e| unavailable("create a replay consumer")(e.to_string()))?;
        reader.done = consumer.cached_info().num_pending == 0;
        reader.source = Some((stream, consumer));
        reader.end_seq = end_seq;
        Ok(reader)
    }

    /// The next messages in stream order, or `None` at the end of the window (or of the
    /// limit).
    pub async fn next_batch(&mut self) -> Result<Option<Vec<Recorded>>, ReplayError> {
        let Some((_, consumer)) = &self.source else { return Ok(None) };
        if self.done {
            return Ok(None);
        }
        let want = BATCH.min(self.limit - self.read);
        if want == 0 {
            self.done = true;
            if self.last.is_some_and(|(seq, _)| seq < self.end_seq) {
                self.cut = Some(format!("the limit of {} messages", self.limit));
            }
            return Ok(None);
        }
        let mut messages = consumer
            .fetch()
            .max_messages(want as usize)
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .map_err(|e| unavailable("fetch recorded events")(e.to_string()))?;
        let mut batch = Vec::new();
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| unavailable("fetch recorded events")(e.to_string()))?;
            let Ok(info) = message.info() else {
                tracing::warn!("recorded message without JetStream info, skipped");
                continue;
            };
            let seq = info.stream_sequence;
            let recorded_ms = u64::try_from(info.published.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
            if seq > self.end_seq || self.until_ms.is_some_and(|u| recorded_ms > u) {
                self.done = true;
                break;
            }
            let decision = sources::decide_bound(
                &message.subject,
                message.headers.as_ref(),
                &message.payload,
                &format!("nats-seq-{seq}"),
                &self.policy,
                &self.bindings,
            );
            self.read += 1;
            self.last = Some((seq, recorded_ms));
            batch.push(Recorded { seq, recorded_ms, decision });
            if seq >= self.end_seq {
                self.done = true;
                break;
            }
        }
        if batch.is_empty() {
            self.done = true;
            return Ok(None);
        }
        Ok(Some(batch))
    }

    /// Deletes the consumer (best effort).
    pub async fn close(self) {
        if let Some((stream, consumer)) = self.source {
            let name = consumer.cached_info().name.clone();
            if let Err(e) = stream.delete_consumer(&name).await {
                tracing::debug!(consumer = %name, "replay consumer not deleted (it expires): {e}");
            }
        }
    }
}

/// Where recorded events are read from: the gateway's JetStream context. Handed to the API as
/// an `axum::Extension`; the API answers 503 on the routes that read recorded events without it.
#[derive(Clone)]
pub struct Events(pub jetstream::Context);

impl Events {
    /// Connects to NATS at `nats_url` as `credential`.
    pub async fn connect(
        nats_url: &str,
        credential: Option<&htfaas_functions::nats::NatsCredential>,
    ) -> anyhow::Result<Events> {
        use anyhow::Context as _;
        let client = htfaas_functions::nats::connect_options("htfaas-gateway-replay", credential)
            .connect(htfaas_functions::nats::servers(nats_url)?)
            .await
            .with_context(|| format!("connect to NATS at {nats_url} (replay)"))?;
        Ok(Events(jetstream::new(client)))
    }
}
