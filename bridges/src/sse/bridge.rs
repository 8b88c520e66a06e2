//! The bridge's loop ([`run`]): make or resume the channel, subscribe the watches, read the
//! stream, publish each event on JetStream, record the resume point after the PubAck.
//!
//! Must not know: the gateway.

use super::inotify::{
    Action, InotifyData, ce_type, channel_id, cloud_event, loss_marker, map_inotify, now_ms, subject,
};
use super::parse::{SseItem, SseParser};
use super::state::State;
use super::{Auth, PUBLISH_TIMEOUT, REQUEST_TIMEOUT, Settings, is_below};
use anyhow::Context as _;
use async_nats::jetstream::{self, message::PublishMessage};
use futures_util::StreamExt as _;
use htfaas_functions::event::CloudEvent;
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Counters, logged at shutdown.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) published: u64,
    pub(super) malformed: u64,
    pub(super) losses: u64,
    pub(super) skipped: u64,
    pub(super) reconnects: u64,
}

/// Why a stream session ended.
pub(super) enum End {
    /// Shutdown was asked for.
    Shutdown,
    /// The stream ended or the channel was renewed; `progress` when it delivered something.
    Ended { progress: bool },
    /// Another client took the channel.
    Displaced,
}

/// Exponential backoff between `min` and `max`.
pub(super) struct Backoff {
    pub(super) min: Duration,
    pub(super) max: Duration,
    pub(super) next: Duration,
}

impl Backoff {
    pub(super) fn new(min: Duration, max: Duration) -> Backoff {
        Backoff { min, max, next: min }
    }
    pub(super) fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
    pub(super) fn reset(&mut self) {
        self.next = self.min;
    }
}

pub(super) struct Bridge {
    pub(super) settings: Settings,
    pub(super) http: reqwest::Client,
    pub(super) js: jetstream::Context,
    pub(super) state: State,
    pub(super) counters: Counters,
    /// Whether the subscriptions of a reused channel were checked against the frontend.
    pub(super) reconciled: bool,
}

/// Runs the bridge until `shutdown`.
pub async fn run(mut settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    settings.validate()?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .tcp_keepalive(Duration::from_secs(30))
        .user_agent(concat!("htfaas-bridge-dcache-sse/", env!("CARGO_PKG_VERSION")));
    if let Some(ca) = &settings.ca_file {
        let pem = std::fs::read(ca).with_context(|| format!("read CA file {}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).with_context(|| format!("parse {}", ca.display()))?;
        anyhow::ensure!(!certs.is_empty(), "CA file {} holds no certificate", ca.display());
        builder = builder.tls_certs_merge(certs);
    }
    let http = builder.build().context("build the HTTP client")?;
    let nats = htfaas_functions::nats::connect_options("htfaas-bridge-dcache-sse", settings.nats_credential.as_ref())
        .retry_on_initial_connect()
        .connect(htfaas_functions::nats::servers(&settings.nats_url)?)
        .await
        .with_context(|| format!("connect to NATS at {}", settings.nats_url))?;
    let js = jetstream::new(nats);
    let state = State::load(&settings.state_file, &settings.frontend)?;
    tracing::info!(frontend = %settings.frontend, watch = ?settings.watch, recursive = settings.recursive,
        channel = state.channel.as_deref().unwrap_or("(new)"), resume = state.last_event_id.as_deref().unwrap_or(""),
        "dcache-sse bridge starting");
    let mut bridge = Bridge { settings, http, js, state, counters: Counters::default(), reconciled: false };
    bridge.run(&shutdown).await;
    if let Err(e) = bridge.state.save(&bridge.settings.state_file) {
        tracing::error!("failed to save the state at shutdown: {e:#}");
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), bridge.js.client().flush()).await;
    let c = &bridge.counters;
    tracing::info!(
        published = c.published,
        malformed = c.malformed,
        losses = c.losses,
        skipped = c.skipped,
        reconnects = c.reconnects,
        "dcache-sse bridge stopped"
    );
    Ok(())
}

impl Bridge {
    pub(super) async fn run(&mut self, shutdown: &CancellationToken) {
        let mut backoff = Backoff::new(self.settings.backoff_min, self.settings.backoff_max);
        loop {
            let delay = match self.session(shutdown).await {
                Ok(End::Shutdown) => return,
                Ok(End::Ended { progress }) => {
                    if progress {
                        backoff.reset();
                    }
                    backoff.next()
                }
                Ok(End::Displaced) => {
                    tracing::error!(
                        channel = self.state.channel.as_deref().unwrap_or(""),
                        "another client reads this channel (COMPETING_CLIENT); backing off"
                    );
                    self.settings.backoff_max
                }
                Err(e) => {
                    tracing::warn!("dcache-sse stream failed: {e:#}");
                    backoff.next()
                }
            };
            if shutdown.is_cancelled() {
                return;
            }
            tracing::debug!(?delay, "reconnecting");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            self.counters.reconnects += 1;
        }
    }

    /// One connection: make sure the channel and watches exist, stream, handle events.
    pub(super) async fn session(&mut self, shutdown: &CancellationToken) -> anyhow::Result<End> {
        if !self.ensure_channel().await? {
            return Ok(End::Ended { progress: true });
        }
        if self.state.pending_loss && !self.publish_channel_loss(shutdown).await? {
            return Ok(End::Shutdown);
        }
        let channel = self.state.channel.clone().context("no channel")?;
        let mut req = self.authed(self.http.get(&channel)).header("accept", "text/event-stream");
        if let Some(id) = &self.state.last_event_id {
            req = req.header("last-event-id", id);
        }
        let resp = tokio::select! {
            _ = shutdown.cancelled() => return Ok(End::Shutdown),
            r = tokio::time::timeout(REQUEST_TIMEOUT, req.send()) => {
                r.map_err(|_| anyhow::anyhow!("no answer within {REQUEST_TIMEOUT:?}"))?.context("GET the channel")?
            }
        };
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            self.channel_gone()?;
            return Ok(End::Ended { progress: true });
        }
        anyhow::ensure!(resp.status().is_success(), "GET the channel: {}", resp.status());
        tracing::info!(%channel, resume = self.state.last_event_id.as_deref().unwrap_or(""), "stream open");
        let mut stream = resp.bytes_stream();
        let mut parser = SseParser::default();
        let mut items = Vec::new();
        let mut progress = false;
        loop {
            let chunk = tokio::select! {
                _ = shutdown.cancelled() => return Ok(End::Shutdown),
                c = stream.next() => c,
            };
            let chunk = match chunk {
                None => {
                    tracing::info!("stream ended");
                    return Ok(End::Ended { progress });
                }
                Some(Err(e)) if progress => {
                    tracing::warn!("stream broke: {e}");
                    return Ok(End::Ended { progress });
                }
                Some(Err(e)) => return Err(e).context("read the stream"),
                Some(Ok(c)) => c,
            };
            parser.feed(&chunk, &mut items);
            for item in items.drain(..) {
                progress = true;
                if let Some(end) = self.handle(item, shutdown).await? {
                    return Ok(end);
                }
            }
        }
    }

    pub(super) fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let read = |f: &Path| {
            std::fs::read_to_string(f).map(|s| s.trim().to_owned()).unwrap_or_else(|e| {
                tracing::warn!("failed to read {}: {e}", f.display());
                String::new()
            })
        };
        match &self.settings.auth {
            Auth::Bearer { token_file } => req.bearer_auth(read(token_file)),
            Auth::Basic { user, secret_file } => req.basic_auth(user, Some(read(secret_file))),
        }
    }

    pub(super) fn save(&self) -> anyhow::Result<()> {
        self.state.save(&self.settings.state_file)
    }

    /// Makes a channel when there is none, checks a reused one's watches once, subscribes the
    /// configured paths missing. `false` when the channel turned out to be gone.
    pub(super) async fn ensure_channel(&mut self) -> anyhow::Result<bool> {
        if self.state.channel.is_none() {
            let url = format!("{}/events/channels", self.settings.frontend);
            let resp = self
                .authed(self.http.post(&url))
                .timeout(REQUEST_TIMEOUT)
                .send()
                .await
                .context("POST /events/channels")?;
            anyhow::ensure!(resp.status().is_success(), "POST /events/channels: {}", resp.status());
            let channel = location(&resp).context("POST /events/channels: no Location")?;
            tracing::info!(%channel, "channel made");
            self.state.channel = Some(channel);
            self.state.subscriptions.clear();
            self.state.last_event_id = None;
            self.reconciled = true;
            self.save()?;
        } else if !self.reconciled {
            if !self.reconcile().await? {
                return Ok(false);
            }
            self.reconciled = true;
        }
        let missing: Vec<String> = self
            .settings
            .watch
            .iter()
            .filter(|p| !self.state.subscriptions.values().any(|w| w == *p))
            .cloned()
            .collect();
        for path in missing {
            match self.subscribe(&path).await {
                Ok(Subscribed::Yes) => {}
                Ok(Subscribed::ChannelGone) => return Ok(false),
                // A watch root that does not exist (yet) is not fatal: the others run, and it is
                // tried again at the next reconnect.
                Ok(Subscribed::Refused(status)) => tracing::warn!(%path, %status, "frontend refused the watch"),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Matches the state's subscriptions with the channel's (after a restart): learns the path
    /// of unknown ones from their selector, forgets vanished ones, ends watches no longer
    /// configured. `false` when the channel is gone.
    pub(super) async fn reconcile(&mut self) -> anyhow::Result<bool> {
        let Some(channel) = self.state.channel.clone() else { return Ok(true) };
        let resp = self
            .authed(self.http.get(format!("{channel}/subscriptions")))
            .header("accept", "application/json")
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .context("list the channel's subscriptions")?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            self.channel_gone()?;
            return Ok(false);
        }
        anyhow::ensure!(resp.status().is_success(), "list the channel's subscriptions: {}", resp.status());
        let listed: Vec<String> = resp.json().await.context("parse the subscription list")?;
        self.state.subscriptions.retain(|url, _| listed.contains(url));
        for url in listed {
            if !self.state.subscriptions.contains_key(&url) {
                #[derive(Deserialize)]
                struct Selector {
                    path: String,
                }
                let resp = self
                    .authed(self.http.get(&url))
                    .header("accept", "application/json")
                    .timeout(REQUEST_TIMEOUT)
                    .send()
                    .await
                    .context("GET a subscription")?;
                match resp.json::<Selector>().await {
                    Ok(s) => {
                        self.state.subscriptions.insert(url, s.path);
                    }
                    Err(e) => tracing::warn!(%url, "failed to read an unknown subscription's selector: {e}"),
                }
            }
        }
        let stale: Vec<String> =
            self.state.subscriptions.iter().filter(|(_, p)| !self.settings.covers(p)).map(|(u, _)| u.clone()).collect();
        for url in stale {
            tracing::info!(%url, "ending a watch no longer configured");
            self.unsubscribe(&url).await;
        }
        self.save()?;
        tracing::info!(watches = self.state.subscriptions.len(), "reused the channel");
        Ok(true)
    }

    pub(super) async fn subscribe(&mut self, path: &str) -> anyhow::Result<Subscribed> {
        let channel = self.state.channel.clone().context("no channel")?;
        let body = serde_json::json!({"path": path, "flags": self.settings.subscribe_flags()});
        let resp = self
            .authed(self.http.post(format!("{channel}/subscriptions/inotify")))
            .json(&body)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .with_context(|| format!("subscribe {path}"))?;
        let status = resp.status();
        if status.is_success() {
            let url = location(&resp).with_context(|| format!("subscribe {path}: no Location"))?;
            tracing::info!(%path, subscription = %url, "watching");
            self.state.subscriptions.insert(url, path.to_owned());
            self.save()?;
            return Ok(Subscribed::Yes);
        }
        // dCache answers 404 both for a missing path and a missing channel: ask which.
        if status == reqwest::StatusCode::NOT_FOUND && !self.channel_exists(&channel).await? {
            self.channel_gone()?;
            return Ok(Subscribed::ChannelGone);
        }
        if status.is_server_error() || status == reqwest::StatusCode::UNAUTHORIZED {
            anyhow::bail!("subscribe {path}: {status}");
        }
        Ok(Subscribed::Refused(status))
    }

    pub(super) async fn channel_exists(&self, channel: &str) -> anyhow::Result<bool> {
        let resp = self
            .authed(self.http.get(channel))
            .header("accept", "application/json")
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .context("GET the channel")?;
        Ok(resp.status() != reqwest::StatusCode::NOT_FOUND)
    }

    /// Ends a watch (best effort) and forgets it.
    pub(super) async fn unsubscribe(&mut self, url: &str) {
        let r = self.authed(self.http.delete(url)).timeout(REQUEST_TIMEOUT).send().await;
        match r {
            Ok(resp) if resp.status().is_success() || resp.status() == reqwest::StatusCode::NOT_FOUND => {}
            Ok(resp) => tracing::warn!(%url, status = %resp.status(), "failed to end a watch"),
            Err(e) => tracing::warn!(%url, "failed to end a watch: {e}"),
        }
        self.state.subscriptions.remove(url);
    }

    /// The channel is gone (dCache collected it): a new one is made at the next session, and
    /// what happened in between is lost.
    pub(super) fn channel_gone(&mut self) -> anyhow::Result<()> {
        tracing::warn!(
            channel = self.state.channel.as_deref().unwrap_or(""),
            "the channel is gone; making a new one (events in between are lost)"
        );
        self.state.channel = None;
        self.state.subscriptions.clear();
        self.state.last_event_id = None;
        self.state.pending_loss = true;
        self.save()
    }

    /// Publishes the loss markers of a lost channel, one per watch root. `false` on shutdown.
    pub(super) async fn publish_channel_loss(&mut self, shutdown: &CancellationToken) -> anyhow::Result<bool> {
        if !self.publish_loss("EVENT_LOSS", "channel-lost", shutdown).await? {
            return Ok(false);
        }
        self.state.pending_loss = false;
        self.save()?;
        Ok(true)
    }

    /// Publishes one loss marker per watch root.
    pub(super) async fn publish_loss(
        &mut self,
        msg_type: &str,
        why: &str,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<bool> {
        let channel = self.state.channel.clone().context("no channel")?;
        let ch = channel_id(&channel).to_owned();
        let at = now_ms();
        self.counters.losses += 1;
        for (i, root) in self.settings.watch.clone().iter().enumerate() {
            tracing::warn!(path = %root, %why, "dCache events lost; publishing a loss marker");
            let ce = loss_marker(&channel, format!("{ch}/{why}-{at}-{i}"), msg_type, root);
            if !self.publish(&ce, shutdown).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Handles one SSE item; `Some` ends the session.
    pub(super) async fn handle(&mut self, item: SseItem, shutdown: &CancellationToken) -> anyhow::Result<Option<End>> {
        let ev = match item {
            SseItem::Refused { id, reason } => {
                self.counters.malformed += 1;
                tracing::warn!(id = id.as_deref().unwrap_or(""), %reason, "skipping a malformed SSE event");
                self.done(id)?;
                return Ok(None);
            }
            SseItem::Event(ev) => ev,
        };
        let Some(data) = ev.data.as_deref() else {
            self.done(ev.id)?;
            return Ok(None);
        };
        let end = match ev.event.as_str() {
            "SYSTEM" => self.handle_system(data, shutdown).await?,
            "inotify" => {
                if !self.handle_inotify(data, ev.id.as_deref(), shutdown).await? {
                    return Ok(Some(End::Shutdown));
                }
                None
            }
            other => {
                tracing::debug!(event = %other, "skipping an event of another type");
                self.counters.skipped += 1;
                None
            }
        };
        self.done(ev.id)?;
        Ok(end)
    }

    /// Records `id` (when given) as the resume point.
    pub(super) fn done(&mut self, id: Option<String>) -> anyhow::Result<()> {
        let Some(id) = id else { return Ok(()) };
        let id = (!id.is_empty()).then_some(id);
        if id != self.state.last_event_id {
            self.state.last_event_id = id;
            self.save()?;
        }
        Ok(())
    }

    pub(super) async fn handle_system(
        &mut self,
        data: &str,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Option<End>> {
        #[derive(Deserialize)]
        struct System {
            #[serde(rename = "type")]
            ty: String,
            #[serde(default)]
            subscription: Option<String>,
        }
        // dCache wraps it like the others (`{"event":{"type":…}}`) or not, depending on the
        // version: accept both.
        let parsed = serde_json::from_str::<serde_json::Value>(data).ok().and_then(|v| {
            let inner = v.get("event").filter(|e| e.is_object()).cloned().unwrap_or_else(|| v.clone());
            let mut s: System = serde_json::from_value(inner).ok()?;
            if s.subscription.is_none() {
                s.subscription = v.get("subscription").and_then(|s| s.as_str()).map(str::to_owned);
            }
            Some(s)
        });
        let Some(sys) = parsed else {
            self.counters.malformed += 1;
            tracing::warn!("skipping a malformed SYSTEM event");
            return Ok(None);
        };
        match sys.ty.as_str() {
            "NEW_SUBSCRIPTION" => {
                tracing::debug!(subscription = sys.subscription.as_deref().unwrap_or(""), "subscribed")
            }
            "SUBSCRIPTION_CLOSED" => {
                if let Some(url) = sys.subscription
                    && let Some(path) = self.state.subscriptions.remove(&url)
                {
                    tracing::warn!(%path, "dCache closed a watch");
                    self.save()?;
                }
            }
            "EVENT_LOSS" => {
                if !self.publish_loss("EVENT_LOSS", "event-loss", shutdown).await? {
                    return Ok(Some(End::Shutdown));
                }
            }
            "COMPETING_CLIENT" => return Ok(Some(End::Displaced)),
            "SHUTDOWN" => tracing::info!("the frontend is shutting down"),
            other => tracing::debug!(r#type = %other, "unknown SYSTEM event"),
        }
        Ok(None)
    }

    /// Handles one inotify event; `false` on shutdown.
    pub(super) async fn handle_inotify(
        &mut self,
        data: &str,
        sse_id: Option<&str>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<bool> {
        let parsed: InotifyData = match serde_json::from_str(data) {
            Ok(p) => p,
            Err(e) => {
                self.counters.malformed += 1;
                tracing::warn!(id = sse_id.unwrap_or(""), "skipping a malformed inotify event: {e}");
                return Ok(true);
            }
        };
        let Some(watched) = self.state.subscriptions.get(&parsed.subscription).cloned() else {
            self.counters.skipped += 1;
            tracing::warn!(subscription = %parsed.subscription, "skipping an event of an unknown subscription");
            return Ok(true);
        };
        let action = match map_inotify(&parsed.event, &watched) {
            Ok(a) => a,
            Err(e) => {
                self.counters.malformed += 1;
                tracing::warn!(id = sse_id.unwrap_or(""), "skipping a malformed inotify event: {e}");
                return Ok(true);
            }
        };
        let channel = self.state.channel.clone().context("no channel")?;
        let ch = channel_id(&channel).to_owned();
        let id = match sse_id {
            Some(id) if !id.is_empty() => format!("{ch}/{id}"),
            _ => format!("{ch}/noid-{}", now_ms()),
        };
        match action {
            Action::Publish(event) => {
                if !self.settings.wants(&event.msg_type) {
                    self.counters.skipped += 1;
                    return Ok(true);
                }
                let ce = cloud_event(&channel, id, ce_type(&event.msg_type), event);
                return self.publish(&ce, shutdown).await;
            }
            Action::Overflow => {
                self.counters.losses += 1;
                tracing::warn!(path = %watched, "dCache overflowed (IN_Q_OVERFLOW); publishing a loss marker");
                let ce = loss_marker(&channel, id, "IN_Q_OVERFLOW", &watched);
                return self.publish(&ce, shutdown).await;
            }
            Action::Watch { flag } => {
                if flag == "IN_IGNORED" {
                    self.state.subscriptions.remove(&parsed.subscription);
                    self.save()?;
                }
                if self.settings.watch.contains(&watched) {
                    tracing::warn!(path = %watched, %flag, "watch root event");
                } else {
                    tracing::info!(path = %watched, %flag, "watch event");
                }
            }
            Action::Directory { flag, path } => {
                self.counters.skipped += 1;
                if self.settings.recursive {
                    self.follow_directory(&flag, &path).await?;
                }
            }
        }
        Ok(true)
    }

    /// Recursion: watch a directory created or moved in, forget one moved away.
    pub(super) async fn follow_directory(&mut self, flag: &str, path: &str) -> anyhow::Result<()> {
        match flag {
            "IN_CREATE" | "IN_MOVED_TO" if !self.state.subscriptions.values().any(|p| p == path) => {
                match self.subscribe(path).await {
                    Ok(Subscribed::Yes) => {}
                    Ok(Subscribed::ChannelGone) => anyhow::bail!("the channel is gone"),
                    Ok(Subscribed::Refused(status)) => {
                        tracing::warn!(%path, %status, "could not watch a new directory")
                    }
                    Err(e) => tracing::warn!(%path, "could not watch a new directory: {e:#}"),
                }
            }
            "IN_MOVED_FROM" => {
                let gone: Vec<String> = self
                    .state
                    .subscriptions
                    .iter()
                    .filter(|(_, p)| (*p == path || is_below(p, path)) && !self.settings.watch.contains(p))
                    .map(|(u, _)| u.clone())
                    .collect();
                for url in gone {
                    self.unsubscribe(&url).await;
                }
                self.save()?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Publishes until acked; retries with backoff, reading nothing else meanwhile. `false` on
    /// shutdown (the event is then not recorded, and is read again at the next start).
    pub(super) async fn publish(&mut self, ce: &CloudEvent, shutdown: &CancellationToken) -> anyhow::Result<bool> {
        let payload = bytes::Bytes::from(serde_json::to_vec(ce).context("encode a CloudEvent")?);
        let subject = subject();
        let mut backoff = Backoff::new(self.settings.backoff_min, self.settings.backoff_max);
        loop {
            let msg = PublishMessage::build()
                .payload(payload.clone())
                .message_id(&ce.id)
                .header("content-type", "application/cloudevents+json");
            let attempt = async {
                let ack = self.js.send_publish(subject.clone(), msg).await.map_err(|e| e.to_string())?;
                ack.await.map_err(|e| e.to_string())
            };
            let result = tokio::select! {
                _ = shutdown.cancelled() => return Ok(false),
                r = tokio::time::timeout(PUBLISH_TIMEOUT, attempt) => r,
            };
            match result {
                Ok(Ok(ack)) => {
                    self.counters.published += 1;
                    tracing::debug!(id = %ce.id, r#type = %ce.ty, seq = ack.sequence, duplicate = ack.duplicate, "published");
                    return Ok(true);
                }
                Ok(Err(e)) => tracing::warn!(id = %ce.id, "failed to publish; retrying: {e}"),
                Err(_) => tracing::warn!(id = %ce.id, "no PubAck within {PUBLISH_TIMEOUT:?}; retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(false),
                _ = tokio::time::sleep(backoff.next()) => {}
            }
        }
    }
}

/// The outcome of a subscribe request.
pub(super) enum Subscribed {
    Yes,
    ChannelGone,
    /// Refused for this path (403, 404 path, 400): not retried now.
    Refused(reqwest::StatusCode),
}

/// The response's `Location`, resolved against the request URL.
pub(super) fn location(resp: &reqwest::Response) -> Option<String> {
    let loc = resp.headers().get(reqwest::header::LOCATION)?.to_str().ok()?;
    resp.url().join(loc).ok().map(|u| u.to_string())
}
