//! The annexes' HTTP routes, merged into [`crate::api`]'s router; every one needs
//! the admin token, checked first by the function [`crate::api`] passes in (so this module
//! needs nothing of it), then the body, then [`crate::annex`] does the work.
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /v1/annexes` | `AnnexRequest` | 201 `AnnexCreated` (400 invalid, 409 name in use) |
//! | `GET /v1/annexes` | — | every `AnnexView` |
//! | `GET /v1/annexes/{name}` | — | `AnnexView` (404) |
//! | `POST /v1/annexes/{name}/jobs` | `AnnexJobs` | `AnnexRecord` |
//! | `POST /v1/annexes/{name}/extend` | `AnnexExtend` | `AnnexRecord` (409 past its token's expiry or while deleting) |
//! | `POST /v1/annexes/{name}/drain` | — | `AnnexView` |
//! | `POST /v1/annexes/{name}/delete` | — | `AnnexDeleted` |
//!
//! Must not know: the rest of the API, how annexes are stored.

use crate::failure::ApiFailure;
use crate::state::Shared;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use htfaas_functions::proto::{AnnexExtend, AnnexJobs, AnnexRequest};
use std::sync::Arc;

/// How the admin credential is checked (the API's own check).
pub type AdminCheck = fn(&Shared, &HeaderMap) -> Result<(), ApiFailure>;

/// Who annex deletions are recorded as made by (the one admin credential).
const ACTOR: &str = "admin";

/// The annexes' routes, each checking `admin` first.
pub fn routes(admin: AdminCheck) -> Router<Arc<Shared>> {
    Router::new()
        .route(
            "/v1/annexes",
            post(move |s: State<Arc<Shared>>, h: HeaderMap, b: Result<Bytes, BytesRejection>| create(s, h, b, admin))
                .get(move |s: State<Arc<Shared>>, h: HeaderMap| list(s, h, admin)),
        )
        .route(
            "/v1/annexes/{name}",
            get(move |s: State<Arc<Shared>>, h: HeaderMap, p: Path<String>| show(s, h, p, admin)),
        )
        .route(
            "/v1/annexes/{name}/{verb}",
            post(
                move |s: State<Arc<Shared>>,
                      h: HeaderMap,
                      p: Path<(String, String)>,
                      b: Result<Bytes, BytesRejection>| act(s, h, p, b, admin),
            ),
        )
}

fn body<T: serde::de::DeserializeOwned>(body: Result<Bytes, BytesRejection>, what: &str) -> Result<T, ApiFailure> {
    let body = body.map_err(|e| ApiFailure { status: e.status(), message: format!("request body: {e}") })?;
    serde_json::from_slice(&body).map_err(|e| ApiFailure::bad_request(format!("invalid {what}: {e}")))
}

async fn create(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
    admin: AdminCheck,
) -> Result<Response, ApiFailure> {
    admin(&shared, &headers)?;
    let req: AnnexRequest = body(b, "annex request")?;
    Ok((StatusCode::CREATED, Json(crate::annex::create(&shared, req).await?)).into_response())
}

async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    admin: AdminCheck,
) -> Result<Response, ApiFailure> {
    admin(&shared, &headers)?;
    Ok(Json(crate::annex::views(&shared)).into_response())
}

async fn show(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    admin: AdminCheck,
) -> Result<Response, ApiFailure> {
    admin(&shared, &headers)?;
    Ok(Json(crate::annex::view(&shared, &name)?).into_response())
}

async fn act(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((name, verb)): Path<(String, String)>,
    b: Result<Bytes, BytesRejection>,
    admin: AdminCheck,
) -> Result<Response, ApiFailure> {
    admin(&shared, &headers)?;
    Ok(match verb.as_str() {
        "jobs" => {
            Json(crate::annex::add_jobs(&shared, name, body::<AnnexJobs>(b, "annex jobs")?).await?).into_response()
        }
        "extend" => {
            let AnnexExtend { lifetime_s } = body(b, "annex extension")?;
            Json(crate::annex::extend(&shared, name, lifetime_s).await?).into_response()
        }
        "drain" => Json(crate::annex::drain(&shared, name).await?).into_response(),
        "delete" => Json(crate::annex::delete(&shared, name, ACTOR).await?).into_response(),
        other => {
            return Err(ApiFailure::not_found(format!("no annex action {other:?} (jobs, extend, drain, delete)")));
        }
    })
}
