//! Schedules: each enabled function with a `trigger.schedule` fires on its ticks, read in the
//! site's time zone ([`htfaas_functions::schedule`]), not on events.
//!
//! A tick fires the function on every file below the directories its trigger is bounded to
//! (its path glob's or rule's, inside the owner's read namespace since registration) that the
//! trigger is true for, listed through the storage as a back-fill lists them
//! ([`crate::backfill::event_for`]; quarantine and re-run directories never fire). Each firing
//! goes through the firing table like any event's (recorded as `event.matched`, checked again
//! against the namespace when it becomes a job), under a replay id of the tick's own
//! (`schedule:<function>:<tick ms>`), so each (tick, file) fires once, and a file fires again at
//! the next tick.
//!
//! A function scheduled on no file (neither a path glob nor a rule:
//! [`htfaas_functions::Trigger::on_no_file`]) lists nothing: each tick fires it once, on an
//! event that names no file ([`no_file_event`]), and its job reads only its reference inputs.
//!
//! The last fired tick is kept in the firing table's file once the tick's firings are written:
//! a crash between the two fires the same tick again, which the firing keys drop. Ticks missed
//! while the gateway was down collapse into the latest one, which fires once on start; a
//! version fires no tick from before its registration.
//!
//! Must not know: HTTP routes (`axum`), the consumer loop.

use crate::firing::NewFirings;
use crate::ingest::{Verdict, fire_batch};
use crate::replay::Target;
use crate::state::Shared;
use htfaas_functions::FunctionRecord;
use htfaas_functions::event::{EventKind, EventSource, SourceKind, StorageEvent};
use htfaas_functions::schedule::{Cron, due};
use jiff::Timestamp;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the schedules are looked at: a tick fires within this of its time.
const EVERY: Duration = Duration::from_secs(1);
/// Most firings written in one batch.
const CHUNK: usize = 512;

/// Why a tick did not fire (it is tried again at the next look).
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// The stored schedule or trigger does not parse (a bug: manifests are checked).
    #[error("{0}")]
    Stored(String),
    /// The storage could not list a directory.
    #[error("list {dir}: {why}")]
    List {
        /// The directory.
        dir: String,
        /// Why.
        why: String,
    },
    /// The firing table could not be read or written.
    #[error("the firing table: {0}")]
    Firings(String),
}

/// Fires each scheduled function's due tick, every [`EVERY`], until `shutdown`. Each function's
/// last fired tick is read from the firing table once, then kept here: this loop is its only
/// writer.
pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut last: HashMap<String, Option<Timestamp>> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
        for function in shared.triggers.scheduled() {
            let name = &function.manifest.name;
            let known = match last.get(name) {
                Some(known) => *known,
                None => match last_tick(&shared, name).await {
                    Ok(read) => *last.entry(name.clone()).or_insert(read),
                    Err(e) => {
                        tracing::warn!(function = %name, "schedule: {e}");
                        continue;
                    }
                },
            };
            match tick(&shared, &function, known, Timestamp::now()).await {
                Ok(Some(fired)) => {
                    last.insert(name.clone(), Some(fired));
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(function = %name, "schedule: {e}"),
            }
        }
    }
}

/// `function`'s last fired tick as the firing table keeps it.
async fn last_tick(shared: &Shared, function: &str) -> Result<Option<Timestamp>, ScheduleError> {
    let name = function.to_owned();
    let ms = shared.firings.call(move |f| f.last_tick(&name)).await;
    let ms = ms.map_err(|e| ScheduleError::Firings(e.to_string()))?;
    Ok(ms.and_then(|ms| Timestamp::from_millisecond(i64::try_from(ms).ok()?).ok()))
}

/// Fires `function`'s tick due at `now` after its `last` fired one, if one is, and returns it.
pub async fn tick(
    shared: &Shared,
    function: &FunctionRecord,
    last: Option<Timestamp>,
    now: Timestamp,
) -> Result<Option<Timestamp>, ScheduleError> {
    let m = &function.manifest;
    let Some(schedule) = &m.trigger.schedule else { return Ok(None) };
    let cron = Cron::parse(schedule).map_err(|e| ScheduleError::Stored(e.to_string()))?;
    let since =
        Timestamp::from_second(i64::try_from(function.registered_at).unwrap_or(i64::MAX)).unwrap_or(Timestamp::MAX);
    let Some(at) = due(&cron, &shared.time_zone.0, last, since, now) else { return Ok(None) };
    let tick_ms = u64::try_from(at.as_millisecond()).unwrap_or(0);
    let replay = format!("schedule:{}:{tick_ms}", m.name);
    let fired = if m.trigger.on_no_file() {
        let event = no_file_event(&m.name, tick_ms);
        fire(shared, vec![NewFirings { event, functions: vec![function.clone()], replay: Some(replay) }]).await?
    } else {
        fire_listed(shared, function, tick_ms, &replay).await?
    };
    let name = m.name.clone();
    shared
        .firings
        .call(move |f| f.set_last_tick(&name, tick_ms))
        .await
        .map_err(|e| ScheduleError::Firings(e.to_string()))?;
    tracing::info!(function = %m.name, tick = %at, fired, "schedule: tick fired");
    Ok(Some(at))
}

/// The event of a tick of `function` scheduled on no file at `tick_ms`: a `backfill`-source
/// event of kind `other` and type `schedule`, naming no path, its id
/// `backfill:schedule:<function>:<tick ms>` (the same tick is the same event).
pub(crate) fn no_file_event(function: &str, tick_ms: u64) -> StorageEvent {
    StorageEvent {
        source: EventSource { kind: SourceKind::Backfill, producer: format!("schedule:{tick_ms}"), message: None },
        kind: EventKind::Other,
        msg_type: "schedule".into(),
        path: String::new(),
        size: None,
        storage_class: None,
        owner: None,
        macaroon: None,
        id: format!("{}:schedule:{function}:{tick_ms}", SourceKind::Backfill.as_str()),
        time: Some(htfaas_functions::time::utc_timestamp(tick_ms / 1000)),
        traceparent: None,
    }
}

/// Fires `function` at its tick `tick_ms` on every file below its trigger's directories that
/// the trigger is true for, under the tick's `replay` id; returns how many fired.
async fn fire_listed(
    shared: &Shared,
    function: &FunctionRecord,
    tick_ms: u64,
    replay: &str,
) -> Result<usize, ScheduleError> {
    let m = &function.manifest;
    let target = Target::new(function.clone()).map_err(|e| ScheduleError::Stored(format!("trigger: {e}")))?;
    let rule = m.trigger.compile().map_err(|e| ScheduleError::Stored(format!("trigger: {e}")))?;
    let mut fired = 0usize;
    for dir in rule.bound_dirs().unwrap_or_default() {
        let listing = crate::listing::list_tree(&shared.storage, &dir, crate::backfill::MAX_FILES)
            .await
            .map_err(|e| ScheduleError::List { dir: dir.clone(), why: e.to_string() })?;
        if listing.truncated {
            tracing::warn!(function = %m.name, dir, "schedule: the listing stopped at its bound; the rest is not fired");
        }
        let batch: Vec<NewFirings> = listing
            .files
            .iter()
            .filter(|f| crate::backfill::may_fire(f))
            .map(|f| {
                let mut event = crate::backfill::event_for(f);
                event.msg_type = "schedule".into();
                event.source.producer = format!("schedule:{tick_ms}");
                event
            })
            .filter(|e| target.fires_on(e))
            .map(|event| NewFirings { event, functions: vec![function.clone()], replay: Some(replay.to_owned()) })
            .collect();
        fired += fire(shared, batch).await?;
    }
    Ok(fired)
}

/// Writes `batch` through the firing table, [`CHUNK`] at a time; returns how many.
async fn fire(shared: &Shared, batch: Vec<NewFirings>) -> Result<usize, ScheduleError> {
    for chunk in batch.chunks(CHUNK) {
        if fire_batch(&shared.firings, &shared.stats, chunk.to_vec()).await != Verdict::Ack {
            return Err(ScheduleError::Firings("the tick's firings could not be written".into()));
        }
    }
    Ok(batch.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tick on no file is one event per function and tick, naming no file.
    #[test]
    fn a_tick_on_no_file_is_an_event_naming_none() {
        let e = no_file_event("summary", 1_795_705_200_000);
        assert_eq!(
            (e.source.kind, e.kind, e.msg_type.as_str(), e.path.as_str()),
            (SourceKind::Backfill, EventKind::Other, "schedule", "")
        );
        assert_eq!(e.id, "backfill:schedule:summary:1795705200000");
        assert_eq!(e.source.producer, "schedule:1795705200000");
        assert_eq!(e.time.as_deref(), Some("2026-11-26T15:00:00Z"));
        assert_eq!(e, no_file_event("summary", 1_795_705_200_000));
        assert_ne!(e.id, no_file_event("summary", 1_795_705_260_000).id);
        assert_ne!(e.id, no_file_event("other", 1_795_705_200_000).id);
    }
}
