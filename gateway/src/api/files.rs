//! Who the caller is (`GET /v1/whoami`), and storage credentials for one file of the caller's
//! namespace (`POST /v1/files/credential`): a developer with an API token and no storage
//! password up- and downloads through the site's storage with a macaroon the gateway obtains
//! for it — read: exactly that file, inside its read namespace; write: new files in the
//! file's directory, inside its write namespace. Each credential is audited.
//!
//! Must not know: the JetStream consumer, the firing table, jobs.

use crate::http_error::HttpError;
use crate::state::Shared;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use htfaas_functions::audit::Subject;
use htfaas_functions::manifest::is_clean_abs_path;
use htfaas_functions::proto::{FileAccess, FileCredential, FileCredentialRequest, WhoAmI};
use std::sync::Arc;

/// `GET /v1/whoami`.
pub(super) async fn whoami(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Result<Json<WhoAmI>, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let identity = shared.oidc_caller(&headers).map(|who| htfaas_functions::proto::MappedIdentity {
        issuer: who.issuer,
        sub: who.sub,
        rule: who.rule,
        groups: who.groups,
        scopes: who.scopes,
    });
    Ok(Json(WhoAmI { name: caller.name, scope: caller.scope.as_str().to_owned(), identity }))
}

/// `POST /v1/files/credential`.
pub(super) async fn credential(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<FileCredential>, HttpError> {
    let caller = shared.require_caller(&headers)?;
    let request: FileCredentialRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError(StatusCode::BAD_REQUEST, format!("invalid credential request: {e}")))?;
    let path = request.path;
    if !is_clean_abs_path(&path) || path.ends_with('/') {
        return Err(HttpError(StatusCode::BAD_REQUEST, format!("{path:?} is not a clean absolute file path")));
    }
    let dir = &path[..path.rfind('/').map_or(1, |i| i + 1)];
    // A token of the site's provider with WLCG scopes: within its storage scopes too.
    if let Some(who) = shared.oidc_caller(&headers) {
        crate::identities::check_storage_scopes(who.scopes.as_deref(), request.access == FileAccess::Write, &path)?;
    }
    // An admin acts for the site: its namespace is every path.
    if !caller.is_admin() {
        let ns = shared.namespaces.of(&caller.name, None);
        let allowed = match request.access {
            FileAccess::Read => ns.may_read(&path),
            FileAccess::Write => ns.may_write(dir),
        };
        if !allowed {
            let what = if request.access == FileAccess::Read { "read namespace" } else { "write namespace" };
            tracing::info!(caller = %caller.name, %path, "file credential refused: outside the {what}");
            return Err(HttpError(StatusCode::FORBIDDEN, format!("{path} is outside the {what} of {}", caller.name)));
        }
    }
    let macaroon = match request.access {
        FileAccess::Read => shared.storage.read_macaroon(&path).await,
        // Issued for the caller: it rewrites nothing a function's run (or anyone else) wrote.
        FileAccess::Write => {
            shared.storage.write_macaroon(dir, false, &crate::storage_client::writer_of_user(&caller.name)).await
        }
    }
    .map_err(|e| {
        let status = if e.is_transient() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::BAD_GATEWAY };
        HttpError(status, format!("the storage refused a macaroon for {path}: {e}"))
    })?;
    let subject = Subject { owner: Some(caller.name.clone()), paths: vec![path.clone()], ..Default::default() };
    let access = if request.access == FileAccess::Read { "read" } else { "write" };
    super::audit::record_admin(&shared, &headers, "file.credential", subject, serde_json::json!({"access": access}))
        .await;
    Ok(Json(FileCredential { url: shared.storage.url_of(&path), macaroon }))
}
