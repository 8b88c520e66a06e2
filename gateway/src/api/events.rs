//! The routes that read recorded events: a function's test on one message, a replay
//! ([`crate::replay`]); and a back-fill from the storage's namespace ([`crate::backfill`]).
//!
//! Must not know: the JetStream consumer's loop, the firing table's SQL.

use super::blocking;
use crate::firing::OpenGroup;
use crate::http_error::HttpError;
use crate::replay;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use htfaas_functions::collect::Collect;
use htfaas_functions::event::StorageEvent;
use htfaas_functions::proto::{GroupReport, ReplayRequest, TestRequest};
use std::sync::Arc;

/// The recorded events, or 503 when the router was built without them.
pub(super) fn recorded(events: Option<Extension<replay::Events>>) -> Result<replay::Events, HttpError> {
    events.map(|Extension(e)| e).ok_or_else(|| {
        HttpError(
            StatusCode::SERVICE_UNAVAILABLE,
            "this gateway API was started without access to recorded events".into(),
        )
    })
}

/// `POST /v1/functions/{name}/test`: how one message parses, and what the function's trigger
/// says about it.
pub(super) async fn test_function(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    events: Option<Extension<replay::Events>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<impl IntoResponse, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let request: TestRequest =
        serde_json::from_slice(&body).map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid test: {e}")))?;
    let s = shared.clone();
    let record = blocking(move || s.registry.latest(&name)).await?;
    if !caller.owns(&record.manifest.owner) {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!("function {} belongs to another owner", record.manifest.name),
        ));
    }
    let events = events.map(|Extension(e)| e);
    let mut report =
        replay::test_request(events.as_ref(), &record, &request, &shared.sources(), &shared.source_paths).await?;
    // A recorded message is another's unless it is an event inside the caller's read namespace:
    // a developer learns nothing of it, not even that it exists.
    if let Some(seq) = request.seq
        && !caller.is_admin()
        && !report.event.as_ref().is_some_and(|e| shared.namespaces.of(&caller.name, None).may_read(&e.path))
    {
        return Err(HttpError(
            StatusCode::NOT_FOUND,
            format!("no recorded event with sequence {seq} in the read namespace of {}", caller.name),
        ));
    }
    if report.fires
        && let (Some(collect), Some(event)) = (&record.manifest.trigger.collect, &report.event)
        && let Some(key) = collect.group_of(&event.path)
    {
        let (name, k) = (record.manifest.name.clone(), key.clone());
        let open = shared
            .firings
            .call(move |f| f.open_group(&name, &k))
            .await
            .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("read the group: {e}")))?;
        report.group = Some(group_report(collect, key, open, event));
    }
    Ok(Json(report))
}

/// What joining `event` to the group `key` (open as `open`, if it is) would do.
fn group_report(collect: &Collect, key: String, open: Option<OpenGroup>, event: &StorageEvent) -> GroupReport {
    let members = open.as_ref().map(|g| g.members.clone()).unwrap_or_default();
    if let Some(g) = &open
        && g.writer != event.owner
    {
        let refused = format!(
            "the group holds files of writer {}, this file is of {}: a group merges one writer's files",
            g.writer.as_deref().unwrap_or("(unnamed)"),
            event.owner.as_deref().unwrap_or("(unnamed)")
        );
        return GroupReport { key, members, completes: false, missing: None, refused: Some(refused) };
    }
    let after = members.len() + usize::from(!members.contains(&event.path));
    let after = u32::try_from(after).unwrap_or(u32::MAX);
    let name = event.path.rsplit('/').next().unwrap_or_default();
    let completes = collect.complete_on_arrival(after, name).is_some();
    let missing = (!completes).then(|| collect.missing(after));
    GroupReport { key, members, completes, missing, refused: None }
}

/// `POST /v1/events/replay`: a dry run lists the (event, function) pairs of the recorded events
/// that fire; a replay fires them again, under a replay id.
pub(super) async fn replay_events(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    events: Option<Extension<replay::Events>>,
    body: Bytes,
) -> Result<impl IntoResponse, HttpError> {
    shared.require_admin(&headers)?;
    let request: ReplayRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid replay request: {e}")))?;
    let (window, mode) = replay::plan(&request, replay::now_ms())?;
    let events = recorded(events)?;
    let s = shared.clone();
    let function = request.function.clone();
    // A function replays as it fires now: its live version, and not at all when disabled or
    // deleted (a named one is refused; of all functions, the disabled ones are left out).
    let records = blocking(move || match function {
        Some(name) => Ok(vec![s.registry.status(&name)?]),
        None => Ok(s.registry.statuses()?),
    })
    .await?;
    if let [one] = records.as_slice()
        && request.function.is_some()
        && !one.enabled
    {
        return Err(HttpError(
            StatusCode::CONFLICT,
            format!("function {} is disabled: enable it before replaying its events", one.record.manifest.name),
        ));
    }
    let records: Vec<_> = records.into_iter().filter(|s| s.enabled).map(|s| s.record).collect();
    if let replay::Mode::Replay(id) = &mode {
        tracing::info!(replay = %id, function = ?request.function, since = window.since_ms, "replay requested");
    }
    let report =
        replay::run(replay::ReplayContext::of(&shared), &events.0, &window, &replay::Target::all(records), &mode)
            .await?;
    super::audit::record_replay(&shared, &headers, &mode, &report).await;
    Ok(Json(report))
}

/// `POST /v1/events/backfill`: fires a function, once, on each file under a
/// directory that never fired it ([`crate::backfill`]); a dry run lists them. A developer
/// back-fills only its own functions, in its function's read namespace.
pub(super) async fn backfill_events(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, HttpError> {
    use htfaas_functions::proto::{BackfillRequest, DEFAULT_BACKFILL_MIN_AGE_S};
    let caller = shared.require_caller(&headers)?;
    let request: BackfillRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid BackfillRequest: {e}")))?;
    let prefix = format!("{}/", request.prefix.trim_end_matches('/'));
    if !htfaas_functions::manifest::is_clean_abs_path(&prefix) {
        return Err(HttpError(
            StatusCode::BAD_REQUEST,
            format!("{:?} is not a clean absolute directory", request.prefix),
        ));
    }
    let s = shared.clone();
    let name = request.function.clone();
    let status = blocking(move || s.registry.status(&name)).await?;
    let m = &status.record.manifest;
    if !caller.owns(&m.owner) {
        return Err(HttpError(StatusCode::FORBIDDEN, format!("function {} belongs to another owner", m.name)));
    }
    if !status.enabled {
        return Err(HttpError(StatusCode::CONFLICT, format!("function {} is disabled: enable it first", m.name)));
    }
    let ns = shared.namespaces.for_manifest(m).map_err(|e| HttpError(StatusCode::FORBIDDEN, e.to_string()))?;
    if !ns.may_read(&prefix) {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!("{prefix} is outside the read namespace of {} (the function's owner)", m.owner),
        ));
    }
    let cx = crate::backfill::BackfillContext {
        storage: &shared.storage,
        firings: &shared.firings,
        stats: &shared.stats,
        scheduler: shared.scheduler(),
    };
    let min_age_s = request.min_age_s.unwrap_or(DEFAULT_BACKFILL_MIN_AGE_S);
    let now_s = htfaas_functions::time::now_s();
    let report = crate::backfill::run(cx, status.record.clone(), &prefix, request.dry_run, min_age_s, now_s)
        .await
        .map_err(|e| {
            tracing::warn!(function = %m.name, prefix, "backfill: {e}");
            HttpError(StatusCode::BAD_GATEWAY, format!("backfill of {} under {prefix}: {e}", m.name))
        })?;
    if !request.dry_run {
        let subject = htfaas_functions::audit::Subject {
            function: Some(m.name.clone()),
            owner: Some(m.owner.clone()),
            digest: Some(m.module.as_str().to_owned()),
            paths: vec![prefix.clone()],
            ..Default::default()
        };
        let args = serde_json::json!({ "version": report.version, "prefix": prefix, "listed": report.listed,
            "matched": report.matched, "already": report.already, "too_recent": report.too_recent,
            "fired": report.fired_count, "truncated": report.truncated });
        super::audit::record_admin(&shared, &headers, "events.backfill", subject, args).await;
        tracing::info!(function = %m.name, prefix, fired = report.fired_count, "backfill");
    }
    Ok(Json(report))
}
