//! A function's life after registration: show it, list its versions, pin one (a rollback),
//! disable and enable it, delete it. Each change is the owner's (or an admin's), reloads the
//! triggers at once and is audited with its actor.
//!
//! Must not know: the JetStream consumer, the firing table, jobs (a job carries the digest it
//! was fired with, whatever happens to its function afterwards).

use super::audit::audit_function;
use super::blocking;
use crate::http_error::HttpError;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use htfaas_functions::FunctionRecord;
use htfaas_functions::proto::{PinRequest, SecretNames};
use htfaas_functions::registry::FunctionStatus;
use std::sync::Arc;

/// `name`'s latest record if the caller may act on it: 404 when there is no such function,
/// 403 when it is another owner's.
async fn owned(shared: &Arc<Shared>, headers: &HeaderMap, name: String) -> Result<FunctionRecord, HttpError> {
    let caller = shared.require_caller(headers)?;
    let s = shared.clone();
    let latest = blocking(move || s.registry.latest(&name)).await?;
    if !caller.owns(&latest.manifest.owner) {
        return Err(HttpError(
            StatusCode::FORBIDDEN,
            format!("function {} belongs to another owner", latest.manifest.name),
        ));
    }
    Ok(latest)
}

/// After a change: the triggers see it, the owners' lanes follow, the trail records it.
async fn changed(
    shared: &Arc<Shared>,
    headers: &HeaderMap,
    lanes: Option<Extension<crate::lanes::Lanes>>,
    action: &str,
    record: &FunctionRecord,
    args: serde_json::Value,
) -> Result<(), HttpError> {
    let s = shared.clone();
    blocking(move || s.triggers.reload(&s.registry)).await?;
    crate::lanes::after_change(lanes.as_deref(), action).await;
    // A version that fires again (a rollback, an enable) is compiled ahead on the EPs, as a
    // registration's is, rather than at its first event.
    if action != "function.delete" && action != "function.disable" {
        crate::warm::announce(shared, record);
    }
    tracing::info!(function = %record.manifest.name, action, %args, "function changed");
    super::audit::record_admin(shared, headers, action, audit_function(record), args).await;
    Ok(())
}

/// `GET /v1/functions/{name}`: the function as it stands.
pub(super) async fn show(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<FunctionStatus>, HttpError> {
    owned(&shared, &headers, name.clone()).await?;
    let s = shared.clone();
    Ok(Json(blocking(move || s.registry.status(&name)).await?))
}

/// `GET /v1/functions/{name}/versions`: every version, oldest first (a deleted function's too).
pub(super) async fn versions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<Vec<FunctionRecord>>, HttpError> {
    owned(&shared, &headers, name.clone()).await?;
    let s = shared.clone();
    Ok(Json(blocking(move || s.registry.versions(&name)).await?))
}

/// `POST /v1/functions/{name}/pin`: `{"version": N}` makes version N the one that fires (a
/// rollback); `{"version": null}` the latest again.
pub(super) async fn pin(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    lanes: Option<Extension<crate::lanes::Lanes>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<FunctionStatus>, HttpError> {
    // Credentials first: an unauthenticated request is 401 whatever its body.
    owned(&shared, &headers, name.clone()).await?;
    let request: PinRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid pin request: {e}")))?;
    let s = shared.clone();
    let status = blocking(move || s.registry.pin(&name, request.version)).await?;
    let args = serde_json::json!({"version": status.record.version, "pinned": status.pinned});
    changed(&shared, &headers, lanes, "function.pin", &status.record, args).await?;
    Ok(Json(status))
}

/// `POST /v1/functions/{name}/disable`: it fires nothing; its matching events are counted.
pub(super) async fn disable(
    state: State<Arc<Shared>>,
    headers: HeaderMap,
    lanes: Option<Extension<crate::lanes::Lanes>>,
    path: Path<String>,
) -> Result<Json<FunctionStatus>, HttpError> {
    set_enabled(state, headers, lanes, path, false).await
}

/// `POST /v1/functions/{name}/enable`: it fires again (events while it was disabled do not:
/// `htfaas events replay` re-runs them).
pub(super) async fn enable(
    state: State<Arc<Shared>>,
    headers: HeaderMap,
    lanes: Option<Extension<crate::lanes::Lanes>>,
    path: Path<String>,
) -> Result<Json<FunctionStatus>, HttpError> {
    set_enabled(state, headers, lanes, path, true).await
}

async fn set_enabled(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    lanes: Option<Extension<crate::lanes::Lanes>>,
    Path(name): Path<String>,
    enabled: bool,
) -> Result<Json<FunctionStatus>, HttpError> {
    owned(&shared, &headers, name.clone()).await?;
    let s = shared.clone();
    let status = blocking(move || s.registry.set_enabled(&name, enabled)).await?;
    let action = if enabled { "function.enable" } else { "function.disable" };
    changed(&shared, &headers, lanes, action, &status.record, serde_json::json!({"version": status.record.version}))
        .await?;
    Ok(Json(status))
}

/// `DELETE /v1/functions/{name}`: it fires nothing and is listed nowhere; its versions stay
/// (audit trail, lineage, `versions`), and so do its modules. Registering it again (its owner)
/// brings it back as a new version.
pub(super) async fn delete(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    lanes: Option<Extension<crate::lanes::Lanes>>,
    Path(name): Path<String>,
) -> Result<Json<FunctionRecord>, HttpError> {
    owned(&shared, &headers, name.clone()).await?;
    let s = shared.clone();
    let record = blocking(move || s.registry.delete(&name)).await?;
    changed(&shared, &headers, lanes, "function.delete", &record, serde_json::json!({"version": record.version}))
        .await?;
    Ok(Json(record))
}

/// `PUT /v1/functions/{name}/secrets`: `{"NAME": "value", …}` replaces every secret of the
/// function (a rotation), sealed; the answer and the audit record name them, never a value.
pub(super) async fn set_secrets(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<SecretNames>, HttpError> {
    // Credentials first: an unauthenticated request is 401 whatever its body.
    let latest = owned(&shared, &headers, name.clone()).await?;
    // The body holds the values: an error must not quote it.
    let values: std::collections::BTreeMap<String, String> = serde_json::from_slice(&body).map_err(|e| {
        HttpError(
            StatusCode::BAD_REQUEST,
            format!(
                "the body must be a JSON object of names to string values (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
    })?;
    let s = shared.clone();
    let owner = latest.manifest.owner.clone();
    let names = tokio::task::spawn_blocking(move || s.secrets.set(&s.registry, &owner, &name, &values))
        .await
        .map_err(|e| HttpError(StatusCode::INTERNAL_SERVER_ERROR, format!("secrets task: {e}")))?
        .map_err(|e| match e {
            crate::secrets::SecretError::Invalid(_) => HttpError(StatusCode::BAD_REQUEST, e.to_string()),
            e => {
                tracing::error!("setting secrets failed: {e}");
                HttpError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
        })?;
    tracing::info!(function = %latest.manifest.name, secrets = names.len(), "function secrets set");
    super::audit::record_admin(
        &shared,
        &headers,
        "function.secrets",
        audit_function(&latest),
        serde_json::json!({"names": names}),
    )
    .await;
    Ok(Json(SecretNames { names }))
}

/// `GET /v1/functions/{name}/secrets`: the names of the function's secrets.
pub(super) async fn secret_names(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<SecretNames>, HttpError> {
    let owner = owned(&shared, &headers, name.clone()).await?.manifest.owner;
    let s = shared.clone();
    Ok(Json(SecretNames { names: blocking(move || s.registry.secret_names(&owner, &name)).await? }))
}
