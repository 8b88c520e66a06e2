//! One EP session over the attach WebSocket (HTCondor's direct attach, without a central
//! manager): the EP dials in with an attach token, says [`EpMsg::Hello`], gets
//! [`SchedulerMsg::Welcome`], then receives [`SchedulerMsg::Assign`] and answers each with
//! [`EpMsg::Finished`]. One JSON text frame per message.
//!
//! The token (checked before the upgrade, in [`crate::api`]) decides which owners' jobs the
//! EP may run; the EP's own messages never widen that. A bad frame is logged and counted,
//! and the session goes on (up to [`MAX_BAD_FRAMES`]). A `Finished` for a job that is not
//! running on this session is ignored. When the session ends, for whatever reason, its
//! running jobs go back to idle.
//!
//! Cancel safety: `WebSocket::recv` and `mpsc::recv` are both cancel-safe, so the session
//! loop can `select!` on them and on shutdown without losing a message.

use crate::Shared;
use crate::matching::EpSlot;
use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use htfaas_functions::manifest::MAX_RUNTIME_S;
use htfaas_functions::proto::{EpMsg, Hello, JobReport, SchedulerMsg};
use htfaas_functions::token::AttachClaims;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Protocol version this scheduler speaks.
pub const PROTOCOL: u32 = 1;
/// How long an EP has to say Hello after the upgrade.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Bad frames tolerated in one session before it is closed.
pub const MAX_BAD_FRAMES: u32 = 64;
/// Largest EP an Hello may describe: cores.
pub const MAX_EP_CPUS: u32 = 65_536;
/// Largest EP an Hello may describe: memory, MiB (64 TiB).
pub const MAX_EP_MEMORY_MB: u64 = 64 * 1024 * 1024;
/// Largest message accepted from an EP, bytes (a report carries a bounded log).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Why a Hello is refused.
pub fn check_hello(h: &Hello) -> Result<(), String> {
    if h.protocol != PROTOCOL {
        return Err(format!("unsupported protocol {} (this scheduler speaks {PROTOCOL})", h.protocol));
    }
    if h.name.is_empty() || h.name.len() > 128 || h.name.chars().any(char::is_control) {
        return Err("name must be 1-128 printable characters".into());
    }
    let s = &h.slots;
    if s.cpus == 0 || s.cpus > MAX_EP_CPUS {
        return Err(format!("slots.cpus must be 1..={MAX_EP_CPUS}"));
    }
    if s.memory_mb == 0 || s.memory_mb > MAX_EP_MEMORY_MB {
        return Err(format!("slots.memory_mb must be 1..={MAX_EP_MEMORY_MB}"));
    }
    if s.runtime_s == 0 || s.runtime_s > 100 * MAX_RUNTIME_S {
        return Err(format!("slots.runtime_s must be 1..={}", 100 * MAX_RUNTIME_S));
    }
    Ok(())
}

/// Runs one session to its end.
#[tracing::instrument(name = "scheduler.attach", skip_all,
    fields(ep.sub = %claims.sub, ep.owner = ?claims.owner, token.jti = %claims.jti,
           ep.id = tracing::field::Empty, ep.name = tracing::field::Empty))]
pub async fn serve(mut ws: WebSocket, claims: AttachClaims, shared: Arc<Shared>, shutdown: CancellationToken) {
    let hello = tokio::select! {
        _ = shutdown.cancelled() => return,
        h = tokio::time::timeout(HELLO_TIMEOUT, ws.recv()) => h,
    };
    let hello = match hello {
        Err(_) => return close(ws, close_code::POLICY, "no hello in time").await,
        Ok(None | Some(Err(_))) => return,
        Ok(Some(Ok(Message::Text(t)))) => match serde_json::from_str::<EpMsg>(t.as_str()) {
            Ok(EpMsg::Hello(h)) => h,
            Ok(other) => {
                tracing::warn!(kind = kind(&other), "first message is not a hello");
                return close(ws, close_code::PROTOCOL, "expected hello").await;
            }
            Err(e) => {
                tracing::warn!("first frame does not parse: {e}");
                return close(ws, close_code::PROTOCOL, "expected hello").await;
            }
        },
        Ok(Some(Ok(_))) => {
            return close(ws, close_code::PROTOCOL, "expected a text frame with hello").await;
        }
    };
    if let Err(why) = check_hello(&hello) {
        tracing::warn!("refusing hello: {why}");
        let mut why = why;
        why.truncate(120);
        return close(ws, close_code::POLICY, &why).await;
    }

    let ep_id = uuid::Uuid::new_v4().to_string();
    let span = tracing::Span::current();
    span.record("ep.id", ep_id.as_str());
    span.record("ep.name", hello.name.as_str());
    if send(&mut ws, &SchedulerMsg::Welcome { ep_id: ep_id.clone() }).await.is_err() {
        return;
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    shared.eps().insert(EpSlot::new(ep_id.clone(), hello.name.clone(), claims.owner.clone(), hello.slots, tx));
    tracing::info!(
        cpus = hello.slots.cpus,
        memory_mb = hello.slots.memory_mb,
        runtime_s = hello.slots.runtime_s,
        "EP attached"
    );
    shared.wake.notify_one();

    let mut bad_frames = 0u32;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = ws.send(close_frame(close_code::AWAY, "scheduler shutting down")).await;
                break;
            }
            out = rx.recv() => {
                let Some(msg) = out else { break };
                if send(&mut ws, &msg).await.is_err() {
                    break;
                }
            }
            frame = ws.recv() => {
                let text = match frame {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(Message::Binary(_))) => {
                        bad_frame(&shared, &mut bad_frames, "binary frame");
                        if bad_frames > MAX_BAD_FRAMES { break }
                        continue;
                    }
                    Some(Ok(Message::Text(t))) => t,
                };
                match serde_json::from_str::<EpMsg>(text.as_str()) {
                    Ok(EpMsg::Finished(report)) => finished(&shared, &ep_id, report).await,
                    Ok(EpMsg::Hello(_)) => bad_frame(&shared, &mut bad_frames, "second hello"),
                    Err(e) => bad_frame(&shared, &mut bad_frames, &format!("does not parse: {e}")),
                }
                if bad_frames > MAX_BAD_FRAMES {
                    let _ = ws.send(close_frame(close_code::POLICY, "too many bad frames")).await;
                    break;
                }
            }
        }
    }

    // Leave the table first (no new Assigns), then close the channel (a late send fails and
    // its job is reverted by the dispatcher), then requeue whatever was running here.
    shared.eps().remove(&ep_id);
    rx.close();
    drop(rx);
    match shared.queue.requeue_session(ep_id.clone()).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(jobs = n, "jobs of the departed EP are idle again"),
        Err(e) => tracing::error!("failed to requeue the departed EP's jobs: {e}"),
    }
    tracing::info!("EP detached");
    shared.wake.notify_one();
}

/// Records a finished job, frees its resources and wakes the dispatcher.
#[tracing::instrument(name = "scheduler.finish", skip_all,
    fields(job.id = %report.job_id, outcome = ?report.outcome, state = tracing::field::Empty))]
async fn finished(shared: &Shared, ep_id: &str, report: JobReport) {
    let job_id = report.job_id.clone();
    if !shared.eps().is_running(ep_id, &job_id) {
        shared.ignored_reports.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("ignoring a report for a job not running on this EP");
        return;
    }
    match shared.queue.finish(ep_id.to_owned(), report).await {
        Ok(Some(f)) => {
            tracing::Span::current().record("state", f.state.as_str());
            tracing::info!(owner = %f.owner, "job finished");
        }
        Ok(None) => {
            shared.ignored_reports.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("ignoring a report for a job the store does not have running on this EP");
        }
        Err(e) => tracing::error!("failed to record a finished job: {e}"),
    }
    shared.eps().release(ep_id, &job_id);
    shared.wake.notify_one();
}

fn bad_frame(shared: &Shared, count: &mut u32, what: &str) {
    *count += 1;
    shared.bad_frames.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(bad_frames = *count, "bad frame from EP: {what}");
}

fn kind(m: &EpMsg) -> &'static str {
    match m {
        EpMsg::Hello(_) => "hello",
        EpMsg::Finished(_) => "finished",
    }
}

async fn send(ws: &mut WebSocket, msg: &SchedulerMsg) -> Result<(), ()> {
    let text = match serde_json::to_string(msg) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("failed to encode a message for the EP: {e}");
            return Err(());
        }
    };
    ws.send(Message::Text(text.into())).await.map_err(|e| tracing::info!("EP connection lost: {e}"))
}

fn close_frame(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame { code, reason: reason.to_owned().into() }))
}

async fn close(mut ws: WebSocket, code: u16, reason: &str) {
    let _ = ws.send(close_frame(code, reason)).await;
}
