//! The attach link: one WebSocket to the scheduler at a time, re-dialled with backoff.
//!
//! State that outlives a connection ([`Link`]): the ids of running jobs and the reports not yet
//! sent. Job tasks send their reports into one channel; a connected session drains it onto the
//! socket, and a report is dropped from `pending` only once the socket accepted it.
//!
//! Cancel safety: in the session loop every `select!` branch is cancel-safe
//! (`StreamExt::next`, `UnboundedReceiver::recv`, `Interval::tick`, `cancelled`); sends happen
//! inside a branch body, never inside the `select!`.

use crate::Settings;
use crate::job::Jobs;
use anyhow::{Context as _, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use htfaas_functions::proto::{EpMsg, Hello, JobReport, SchedulerMsg};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::http::header::AUTHORIZATION;
use tokio_tungstenite::tungstenite::protocol::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// First delay before re-dialling.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest delay between dials.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long to wait for the TCP + WebSocket handshake, and then for `Welcome`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Keep-alive ping period.
const PING_EVERY: Duration = Duration::from_secs(15);
/// Protocol version sent in `Hello`.
const PROTOCOL: u32 = 1;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What survives a reconnect.
struct Link {
    settings: Arc<Settings>,
    jobs: Arc<Jobs>,
    tracker: TaskTracker,
    report_tx: mpsc::UnboundedSender<JobReport>,
    report_rx: mpsc::UnboundedReceiver<JobReport>,
    /// Jobs assigned and not yet reported into `pending`.
    running: HashSet<String>,
    /// Finished jobs whose report the scheduler has not been sent yet.
    pending: VecDeque<JobReport>,
    /// Frames from the scheduler that did not parse.
    bad_frames: u64,
    /// Set once shutdown began: no new jobs; leave when `running` and `pending` are empty.
    drain_deadline: Option<Instant>,
}

/// How a session ended without an error.
enum SessionEnd {
    /// Shutdown drained everything (or ran out of time); stop.
    Done,
}

pub(crate) async fn run(settings: Arc<Settings>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (report_tx, report_rx) = mpsc::unbounded_channel();
    let mut link = Link {
        jobs: Arc::new(Jobs::new(settings.clone())),
        settings,
        tracker: TaskTracker::new(),
        report_tx,
        report_rx,
        running: HashSet::new(),
        pending: VecDeque::new(),
        bad_frames: 0,
        drain_deadline: None,
    };
    tracing::info!(name = %link.settings.name, url = %link.settings.attach_url, "ep starting");
    let mut backoff = MIN_BACKOFF;
    loop {
        if shutdown.is_cancelled() {
            link.begin_drain();
            link.absorb_finished();
            if link.drained() {
                break;
            }
            if link.drain_expired() {
                link.warn_abandoned();
                break;
            }
        }
        let mut welcomed = false;
        match link.session(&shutdown, &mut welcomed).await {
            Ok(SessionEnd::Done) => break,
            Err(e) => tracing::warn!("scheduler link failed: {e:#}"),
        }
        if welcomed {
            backoff = MIN_BACKOFF;
        }
        // Wait before re-dialling; during a drain, never past its deadline.
        let mut wake = Instant::now() + backoff;
        if let Some(d) = link.drain_deadline {
            wake = wake.min(d);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = shutdown.cancelled(), if link.drain_deadline.is_none() => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    link.tracker.close();
    tracing::info!(unparsable_frames = link.bad_frames, "ep stopped");
    Ok(())
}

impl Link {
    fn begin_drain(&mut self) {
        if self.drain_deadline.is_none() {
            tracing::info!(running = self.running.len(), "shutdown: no new jobs; draining");
            self.drain_deadline = Some(Instant::now() + self.settings.drain_timeout);
        }
    }

    fn drained(&self) -> bool {
        self.running.is_empty() && self.pending.is_empty()
    }

    fn drain_expired(&self) -> bool {
        self.drain_deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn warn_abandoned(&self) {
        tracing::warn!(
            running = self.running.len(),
            unsent_reports = self.pending.len(),
            "drain deadline passed; leaving jobs and reports behind"
        );
    }

    /// Moves reports that arrived on the channel into `pending`.
    fn absorb_finished(&mut self) {
        while let Ok(report) = self.report_rx.try_recv() {
            self.finished(report);
        }
    }

    fn finished(&mut self, report: JobReport) {
        self.running.remove(&report.job_id);
        self.settings.activity.set_running(self.running.len());
        self.pending.push_back(report);
    }

    /// One connection: dial, hello, welcome, then serve until it fails or shutdown drains.
    async fn session(&mut self, shutdown: &CancellationToken, welcomed: &mut bool) -> anyhow::Result<SessionEnd> {
        let mut ws = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.dial()).await.context("dial timed out")??;
        let hello = EpMsg::Hello(Hello {
            name: self.settings.name.clone(),
            slots: self.settings.slots,
            protocol: PROTOCOL,
            annex: None,
        });
        ws.send(Message::text(serde_json::to_string(&hello)?)).await.context("send hello")?;
        let ep_id = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.welcome(&mut ws)).await.context("no welcome")??;
        *welcomed = true;
        tracing::info!(%ep_id, pending_reports = self.pending.len(), "attached to scheduler");

        let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
        loop {
            self.absorb_finished();
            self.flush(&mut ws).await?;
            if self.drain_deadline.is_some() {
                if self.drained() {
                    tracing::info!("drained: every job reported");
                    let _ = ws.close(None).await;
                    return Ok(SessionEnd::Done);
                }
                if self.drain_expired() {
                    self.warn_abandoned();
                    let _ = ws.close(None).await;
                    return Ok(SessionEnd::Done);
                }
            }
            let drain_wake = self.drain_deadline.unwrap_or_else(|| Instant::now() + PING_EVERY);
            tokio::select! {
                frame = ws.next() => match frame {
                    None => bail!("scheduler closed the connection"),
                    Some(Err(e)) => return Err(anyhow!(e).context("read from scheduler")),
                    Some(Ok(Message::Text(text))) => self.on_text(text.as_str()),
                    Some(Ok(Message::Binary(_))) => {
                        self.bad_frames += 1;
                        tracing::warn!(total = self.bad_frames, "ignored a binary frame from the scheduler");
                    }
                    Some(Ok(Message::Close(frame))) => bail!("scheduler closed the connection: {frame:?}"),
                    Some(Ok(_)) => {} // ping/pong: tungstenite answers pings itself
                },
                report = self.report_rx.recv() => {
                    if let Some(report) = report {
                        self.finished(report);
                    }
                }
                _ = ping.tick() => ws.send(Message::Ping(Default::default())).await.context("send ping")?,
                _ = shutdown.cancelled(), if self.drain_deadline.is_none() => self.begin_drain(),
                _ = tokio::time::sleep_until(drain_wake), if self.drain_deadline.is_some() => {}
            }
        }
    }

    async fn dial(&self) -> anyhow::Result<Ws> {
        let mut request = self.settings.attach_url.as_str().into_client_request().context("attach URL")?;
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", self.settings.attach_token))
            .map_err(|_| anyhow!("attach token is not a valid header value"))?;
        auth.set_sensitive(true);
        request.headers_mut().insert(AUTHORIZATION, auth);
        let (ws, _response) = tokio_tungstenite::connect_async(request).await.map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(resp) => {
                anyhow!("attach refused: HTTP {}", resp.status())
            }
            other => anyhow!(other).context(format!("connect to {}", self.settings.attach_url)),
        })?;
        Ok(ws)
    }

    async fn welcome(&mut self, ws: &mut Ws) -> anyhow::Result<String> {
        loop {
            match ws.next().await {
                None => bail!("scheduler closed the connection before welcome"),
                Some(Err(e)) => return Err(anyhow!(e).context("read welcome")),
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<SchedulerMsg>(text.as_str()) {
                    Ok(SchedulerMsg::Welcome { ep_id }) => return Ok(ep_id),
                    Ok(SchedulerMsg::Assign(job)) => {
                        bail!("scheduler assigned job {} before welcome", job.job_id)
                    }
                    Ok(SchedulerMsg::Cancel { job_id, .. }) => {
                        bail!("scheduler cancelled job {job_id} before welcome")
                    }
                    Err(e) => {
                        self.bad_frames += 1;
                        tracing::warn!(total = self.bad_frames, "unparsable frame from the scheduler: {e}");
                    }
                },
                Some(Ok(Message::Close(frame))) => bail!("scheduler closed the connection: {frame:?}"),
                Some(Ok(_)) => {}
            }
        }
    }

    fn on_text(&mut self, text: &str) {
        match serde_json::from_str::<SchedulerMsg>(text) {
            Ok(SchedulerMsg::Assign(job)) => {
                if self.drain_deadline.is_some() {
                    tracing::warn!(job.id = %job.job_id, "assignment during shutdown not started");
                } else if !self.running.insert(job.job_id.clone()) {
                    tracing::warn!(job.id = %job.job_id, "assignment for a job already running ignored");
                } else {
                    self.settings.activity.set_running(self.running.len());
                    let jobs = self.jobs.clone();
                    let tx = self.report_tx.clone();
                    self.tracker.spawn(async move {
                        let report = jobs.execute(job).await;
                        let _ = tx.send(report);
                    });
                }
            }
            Ok(SchedulerMsg::Welcome { ep_id }) => tracing::warn!(%ep_id, "unexpected second welcome ignored"),
            Ok(SchedulerMsg::Cancel { job_id, reason }) => {
                tracing::warn!(job.id = %job_id, %reason, "cancel not supported yet; job runs on")
            }
            Err(e) => {
                self.bad_frames += 1;
                tracing::warn!(total = self.bad_frames, "unparsable frame from the scheduler: {e}");
            }
        }
    }

    /// Sends every pending report, oldest first; one stays pending until the socket took it.
    async fn flush(&mut self, ws: &mut Ws) -> anyhow::Result<()> {
        while let Some(report) = self.pending.front() {
            let text = serde_json::to_string(&EpMsg::Finished(report.clone()))?;
            ws.send(Message::text(text)).await.context("send report")?;
            tracing::debug!(job.id = %report.job_id, "report sent");
            self.pending.pop_front();
        }
        Ok(())
    }
}
