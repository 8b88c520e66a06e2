//! The registry's routes: modules (upload, download) and functions (register, dry-run a
//! registration, list).
//!
//! Must not know: the JetStream consumer, the firing table.

use super::audit::{audit_args, audit_digest, audit_function};
use super::blocking;
use super::events::recorded;
use crate::http_error::HttpError;
use crate::replay;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use htfaas_functions::proto::{ModuleUploaded, RegisterQuery};
use htfaas_functions::{Digest, FunctionManifest, RegistryError};
use std::sync::Arc;

pub(super) async fn put_module(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let s = shared.clone();
    // A developer's uploads count against its owner's module quota; an admin's against none.
    let digest = if caller.is_admin() {
        blocking(move || s.registry.put_module(&body)).await?
    } else {
        let quota = shared.module_quota;
        blocking(move || s.registry.put_module_for(&caller.name, &body, quota)).await?
    };
    super::audit::record_admin(&shared, &headers, "module.upload", audit_digest(&digest), serde_json::json!({})).await;
    Ok((StatusCode::CREATED, Json(ModuleUploaded { digest })))
}

pub(super) async fn get_module(
    State(shared): State<Arc<Shared>>,
    Path(digest): Path<String>,
) -> Result<Response, HttpError> {
    let digest: Digest = digest.parse().map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("{e}")))?;
    let s = shared.clone();
    let d = digest.clone();
    let path = blocking(move || s.registry.module_path(&d))
        .await?
        .ok_or_else(|| HttpError(StatusCode::NOT_FOUND, format!("module {digest} not found")))?;
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("open module: {e}")))?;
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok(([(axum::http::header::CONTENT_TYPE, "application/wasm")], body).into_response())
}

pub(super) async fn register(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    events: Option<Extension<replay::Events>>,
    lanes: Option<Extension<crate::lanes::Lanes>>,
    uri: axum::http::Uri,
    body: Bytes,
) -> Result<Response, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let Query(query) = Query::<RegisterQuery>::try_from_uri(&uri)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid query: {}", e.body_text())))?;
    let manifest: FunctionManifest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid manifest: {e}")))?;
    if !caller.owns(&manifest.owner) {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!(
                "the manifest's owner is {:?}; a developer token of {:?} registers only its own functions",
                manifest.owner, caller.name
            ),
        ));
    }
    // Confined to its owner's namespace: where it may fire, write and run (a dry run too), once
    // it is known to be a manifest at all.
    manifest.validate().map_err(RegistryError::from)?;
    if let Err(e) = shared.namespaces.for_manifest(&manifest).and_then(|ns| ns.confine(&manifest)) {
        tracing::info!(function = %manifest.name, owner = %manifest.owner, "registration refused: {e}");
        return Err(HttpError(StatusCode::FORBIDDEN, format!("function {}: {e}", manifest.name)));
    }
    // A failure webhook only to a host the site allows.
    if let Some(webhook) = &manifest.webhook
        && let Err(e) = shared.webhooks.check(webhook)
    {
        tracing::info!(function = %manifest.name, owner = %manifest.owner, "registration refused: {e}");
        return Err(HttpError(StatusCode::BAD_REQUEST, format!("function {}: {e}", manifest.name)));
    }
    if manifest.checkpoint.is_some() && shared.checkpoint_dir.is_none() {
        return Err(HttpError(
            StatusCode::BAD_REQUEST,
            format!("function {}: asks for checkpoints, and this site keeps none (no checkpoint_dir)", manifest.name),
        ));
    }
    if query.dry_run {
        return dry_run_registration(&shared, events, &query, manifest).await;
    }
    if query != RegisterQuery::default() {
        return Err(HttpError(StatusCode::BAD_REQUEST, "since, until and limit go with dry_run=true".into()));
    }
    // Whose the name is, is decided in the registry's transaction that stores the version
    // (`RegistryError::NotOwner`, 403): two owners registering one new name at once cannot
    // both succeed.
    let s = shared.clone();
    let (name, asker) = (manifest.name.clone(), caller.name.clone());
    let record = blocking(move || {
        let record = s.registry.register(manifest)?;
        s.triggers.reload(&s.registry)?;
        Ok(record)
    })
    .await
    .inspect_err(|e| {
        if e.0 == StatusCode::FORBIDDEN {
            tracing::info!(function = %name, caller = %asker, "registration refused: {}", e.1);
        }
    })?;
    tracing::info!(function = %record.manifest.name, version = record.version, "function registered");
    // EPs compile its module ahead of its first event.
    crate::warm::announce(&shared, &record);
    // A new owner's lane reads before the registration is answered.
    crate::lanes::after_change(lanes.as_deref(), "a registration").await;
    super::audit::record_admin(&shared, &headers, "function.register", audit_function(&record), audit_args(&record))
        .await;
    Ok((StatusCode::CREATED, Json(record)).into_response())
}

/// `POST /v1/functions?dry_run=true`: the manifest is checked as a registration checks it (same
/// errors), not stored, and answered with the recorded events its trigger would fire on.
pub(super) async fn dry_run_registration(
    shared: &Arc<Shared>,
    events: Option<Extension<replay::Events>>,
    query: &RegisterQuery,
    manifest: FunctionManifest,
) -> Result<Response, HttpError> {
    let window = replay::register_window(query, replay::now_ms())?;
    let s = shared.clone();
    let manifest = blocking(move || {
        manifest.validate()?;
        s.registry.code_path(&manifest)?;
        Ok(manifest)
    })
    .await?;
    let events = recorded(events)?;
    let target = replay::candidate(manifest)?;
    let report =
        replay::run(replay::ReplayContext::of(shared), &events.0, &window, &[target], &replay::Mode::DryRun).await?;
    Ok((StatusCode::OK, Json(report)).into_response())
}

/// `GET /v1/functions`: every function for an admin, a developer's own otherwise, as each
/// stands (its live version, latest version, enabled, pinned); deleted ones not.
pub(super) async fn list_functions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let s = shared.clone();
    let mut statuses = blocking(move || s.registry.statuses()).await?;
    statuses.retain(|r| caller.owns(&r.record.manifest.owner));
    Ok(Json(statuses))
}
