//! The API's routes for portable workspaces: a sandbox moved to another provider, checkpoints
//! taken, listed, restored on any provider and deleted — each the CLI's own command.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;

use super::auth::Scope;
use super::resources::{default_network, default_ttl, shape};
use super::routes::{bad_body, call, Document, ErrorBody};
use super::Server;

/// Move a sandbox's workspace to a new sandbox.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MoveBody {
    /// Provider to move to.
    to: String,
    /// Image or template for the new sandbox, for providers that have them.
    image: Option<String>,
    /// `none` (default), `bridge` or `host`.
    #[serde(default = "default_network")]
    network: String,
    /// The new sandbox's expiry (`30m`, `24h`, `7d`; default `24h`).
    #[serde(default = "default_ttl")]
    ttl: String,
}

/// Move a sandbox's workspace to a new sandbox on another provider (scope `exec`), as `berth
/// move`: checkpoint, create, restore, verify, then destroy the source, which is kept whole if
/// anything fails (422 when the target is not the checkpoint; 409 when the source was written
/// to meanwhile or another move of it is under way).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/move", tag = "sandboxes", request_body = MoveBody,
    security(("bearer" = [])), params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "`move` document: `move` (`target`, `checkpoint`, \
        `counts`, `not_carried`, `source_teardown`, `times`)", body = Document),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody), (status = 422, body = ErrorBody),
              (status = 403, description = "a target that isolates nothing or network `host`, on a \
                  server without `--allow-unisolated` (or a token without scope exec)", body = ErrorBody)))]
pub(crate) async fn move_sandbox(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<MoveBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let body = body
        .map(|Json(body)| body)
        .map_err(|rejected| bad_body("move", rejected));
    let policy = server.clone();
    call(
        &server,
        &headers,
        Method::POST,
        "/v1/sandboxes/{id}/move",
        "move",
        Scope::Exec,
        Some(id.clone()),
    )
    .run_with(body, |app, body| async move {
        policy.require_isolated(&app, &body.to)?;
        policy.require_own_network(&body.network)?;
        let args = crate::cli::MoveArgs {
            id,
            to: body.to,
            shape: shape(body.image, body.network, body.ttl)?,
        };
        crate::commands::moving::move_sandbox(&app, args).await
    })
    .await
}

/// Take a checkpoint of a sandbox.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointBody {
    /// Retention (`7d`); kept until deleted without one.
    ttl: Option<String>,
}

/// Keep a sandbox's workspace as a checkpoint of Berth's own (scope `exec`), as `berth
/// checkpoint`: its id is `ws-` and the content's digest.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoint", tag = "checkpoints",
    request_body = CheckpointBody, security(("bearer" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "`checkpoint` document: `checkpoint` (`id`, `digest`, \
        `counts`, `not_carried`, `expires_at`)", body = Document),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn take_checkpoint(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<CheckpointBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let ttl = body
        .map(|Json(body)| body.ttl)
        .map_err(|rejected| bad_body("checkpoint", rejected));
    call(
        &server,
        &headers,
        Method::POST,
        "/v1/sandboxes/{id}/checkpoint",
        "checkpoint",
        Scope::Exec,
        Some(id.clone()),
    )
    .run_with(ttl, |app, ttl| async move {
        crate::commands::moving::checkpoint(&app, &id, ttl.as_deref()).await
    })
    .await
}

/// This owner's checkpoints.
#[utoipa::path(get, path = "/v1/checkpoints", tag = "checkpoints", security(("bearer" = [])),
    responses((status = 200, description = "`checkpoints` document", body = Document),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub(crate) async fn list_checkpoints(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
) -> Response {
    call(
        &server,
        &headers,
        Method::GET,
        "/v1/checkpoints",
        "checkpoints",
        Scope::Read,
        None,
    )
    .run(|app| async move { crate::commands::moving::checkpoints(&app).await })
    .await
}

/// Make a sandbox of a checkpoint.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RestoreBody {
    /// Provider to restore on.
    provider: String,
    /// Image or template, for providers that have them.
    image: Option<String>,
    /// The new sandbox's expiry (`30m`, `24h`, `7d`; default `24h`).
    #[serde(default = "default_ttl")]
    ttl: String,
}

/// Make a sandbox of a checkpoint on any provider (scope `exec`), as `berth restore ws-…`: the
/// sandbox is read back and must be the checkpoint (422 and removed otherwise).
#[utoipa::path(post, path = "/v1/checkpoints/{id}/restore", tag = "checkpoints",
    request_body = RestoreBody, security(("bearer" = [])),
    params(("id" = String, Path, description = "Checkpoint id (`ws-…`)")),
    responses((status = 200, description = "`restore` document: `sandbox`, `checkpoint`, \
        `counts`", body = Document),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody),
              (status = 403, description = "a provider that isolates nothing, on a server \
                  without `--allow-unisolated` (or a token without scope exec)", body = ErrorBody)))]
pub(crate) async fn restore_checkpoint(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<RestoreBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let body = body
        .map(|Json(body)| body)
        .map_err(|rejected| bad_body("restore", rejected));
    let policy = server.clone();
    call(
        &server,
        &headers,
        Method::POST,
        "/v1/checkpoints/{id}/restore",
        "restore",
        Scope::Exec,
        Some(id.clone()),
    )
    .run_with(body, |app, body| async move {
        policy.require_isolated(&app, &body.provider)?;
        crate::commands::moving::restore_checkpoint(
            &app,
            &id,
            &body.provider,
            body.image,
            &body.ttl,
        )
        .await
    })
    .await
}

/// Delete a checkpoint (scope `exec`), as `berth destroy ws-…`.
#[utoipa::path(delete, path = "/v1/checkpoints/{id}", tag = "checkpoints", security(("bearer" = [])),
    params(("id" = String, Path, description = "Checkpoint id (`ws-…`)")),
    responses((status = 200, description = "`destroy` document", body = Document),
              (status = 404, body = ErrorBody)))]
pub(crate) async fn delete_checkpoint(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    delete_kept(
        &server,
        &headers,
        id,
        "/v1/checkpoints/{id}",
        berth_portable::CHECKPOINT_PREFIX,
        "checkpoint",
    )
    .await
}

/// This owner's agent sessions (scope `read`), as `berth sessions`: each conversation `berth
/// prompt` kept, with its harness, turns and where each ran.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", security(("bearer" = [])),
    responses((status = 200, description = "`sessions` document: `sessions` (records: `id`, \
        `harness`, `cli_session`, `turns`, `history`, `forked_from`, `not_carried`, …)",
        body = Document),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub(crate) async fn list_sessions(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
) -> Response {
    call(
        &server,
        &headers,
        Method::GET,
        "/v1/sessions",
        "sessions",
        Scope::Read,
        None,
    )
    .run(|app| async move { crate::commands::prompt::sessions(&app).await })
    .await
}

/// Delete an agent session (scope `exec`), as `berth destroy as-…`: a turn of it being saved
/// meanwhile is waited for and deleted too, or kept as a fork (409 past a minute's wait).
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions", security(("bearer" = [])),
    params(("id" = String, Path, description = "Agent session id (`as-…`)")),
    responses((status = 200, description = "`destroy` document", body = Document),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn delete_session(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    delete_kept(
        &server,
        &headers,
        id,
        "/v1/sessions/{id}",
        berth_portable::SESSION_PREFIX,
        "agent session",
    )
    .await
}

/// `DELETE` of one of Berth's own records (a checkpoint, an agent session), as `berth destroy
/// ID`: an id without `prefix` is not one of them (404, nothing touched).
async fn delete_kept(
    server: &Server,
    headers: &HeaderMap,
    id: String,
    route: &'static str,
    prefix: &'static str,
    what: &'static str,
) -> Response {
    call(
        server,
        headers,
        Method::DELETE,
        route,
        "destroy",
        Scope::Exec,
        Some(id.clone()),
    )
    .run(|app| async move {
        if !id.starts_with(prefix) {
            return Err(crate::errors::CliError::not_found(
                format!("`{}` is no {what} id", id.escape_debug()),
                &format!("`GET {}` lists them", route.trim_end_matches("/{id}")),
            )
            .into());
        }
        crate::commands::sandbox::destroy(&app, &[id]).await
    })
    .await
}
