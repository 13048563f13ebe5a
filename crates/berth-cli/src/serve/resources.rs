//! The API's resource routes: sandboxes (list, create, show, destroy, exec, files), the ledger,
//! missions and the audit log. Each runs the CLI's own command through `routes::Call`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use berth_store::AccessStore;
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use super::auth::Scope;
use super::routes::{authorize, bad_body, call, failure, owned_mission, Document, ErrorBody};
use super::Server;
use crate::output::SCHEMA;

/// Create a sandbox.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateBody {
    /// Provider (default `host`).
    #[serde(default = "default_provider")]
    provider: String,
    /// Providers to try next when the first is unavailable, at capacity or out of quota.
    #[serde(default)]
    fallback: Vec<String>,
    /// Image or template, for providers that have them.
    image: Option<String>,
    /// `none` (default), `bridge` or `host`.
    #[serde(default = "default_network")]
    network: String,
    /// Expiry (`30m`, `24h`, `7d`; default `24h`).
    #[serde(default = "default_ttl")]
    ttl: String,
}

fn default_provider() -> String {
    "host".into()
}
pub(crate) fn default_network() -> String {
    "none".into()
}
pub(crate) fn default_ttl() -> String {
    "24h".into()
}

/// A new sandbox's shape from a body, as the CLI's flags take it (the network checked as clap
/// checks the flag). The API sets no resource limits: the provider's defaults apply.
pub(crate) fn shape(
    image: Option<String>,
    network: String,
    ttl: String,
) -> anyhow::Result<crate::cli::ShapeArgs> {
    if !["none", "bridge", "host"].contains(&network.as_str()) {
        return Err(crate::errors::CliError::invalid(
            format!("unknown network `{}`", network.escape_debug()),
            "network is none, bridge or host",
        )
        .into());
    }
    Ok(crate::cli::ShapeArgs {
        image,
        network: crate::cli::NetworkArg { network },
        limits: crate::cli::LimitArgs {
            cpus: None,
            memory_mib: None,
            pids: None,
        },
        ttl: crate::cli::TtlArg { ttl },
    })
}

/// Run a command in a sandbox: `argv` or `shell`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecBody {
    /// Program and arguments.
    #[serde(default)]
    argv: Vec<String>,
    /// A line for `sh -c` (instead of `argv`).
    shell: Option<String>,
    /// Environment values for the command (values are never logged, stored or echoed).
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Deadline (`500ms`, `30s`, `5m`).
    timeout: Option<String>,
    /// Working directory inside the sandbox.
    cwd: Option<String>,
}

/// This owner's sandboxes.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", security(("bearer" = [])),
    responses((status = 200, description = "`list` document", body = Document),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub(crate) async fn list_sandboxes(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
) -> Response {
    call(
        &server,
        &headers,
        Method::GET,
        "/v1/sandboxes",
        "list",
        Scope::Read,
        None,
    )
    .run(|app| async move { crate::commands::sandbox::list(&app, false).await })
    .await
}

/// Create a sandbox (scope `exec`).
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", request_body = CreateBody, security(("bearer" = [])),
    responses((status = 200, description = "`create` document", body = Document),
              (status = 400, body = ErrorBody), (status = 503, body = ErrorBody),
              (status = 403, description = "a provider that isolates nothing or network `host`, on a \
                  server without `--allow-unisolated` (or a token without scope exec)", body = ErrorBody)))]
pub(crate) async fn create_sandbox(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
    body: Result<Json<CreateBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    // A refused body is answered only once the caller is authorized (and then audited).
    let body = body
        .map(|Json(body)| body)
        .map_err(|rejected| bad_body("create", rejected));
    let policy = server.clone();
    call(
        &server,
        &headers,
        Method::POST,
        "/v1/sandboxes",
        "create",
        Scope::Exec,
        None,
    )
    .run_with(body, |app, body| async move {
        for provider in std::iter::once(&body.provider).chain(&body.fallback) {
            policy.require_isolated(&app, provider)?;
        }
        policy.require_own_network(&body.network)?;
        let args = crate::cli::CreateArgs {
            provider: body.provider,
            fallback: body.fallback,
            shape: shape(body.image, body.network, body.ttl)?,
        };
        crate::commands::sandbox::create(&app, args).await
    })
    .await
}

/// One sandbox: ledger entry, observed state, open forwards.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = String, Path, description = "Sandbox id (`bx-…`)")),
    responses((status = 200, description = "`status` document", body = Document),
              (status = 404, body = ErrorBody)))]
pub(crate) async fn show_sandbox(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    call(
        &server,
        &headers,
        Method::GET,
        "/v1/sandboxes/{id}",
        "status",
        Scope::Read,
        Some(id.clone()),
    )
    .run(|app| async move { crate::commands::sandbox::status(&app, &id).await })
    .await
}

/// Destroy a sandbox and verify it gone (scope `exec`).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "`destroy` document", body = Document),
              (status = 404, body = ErrorBody)))]
pub(crate) async fn destroy_sandbox(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    call(
        &server,
        &headers,
        Method::DELETE,
        "/v1/sandboxes/{id}",
        "destroy",
        Scope::Exec,
        Some(id.clone()),
    )
    .run(|app| async move { crate::commands::sandbox::destroy(&app, &[id]).await })
    .await
}

/// Run a command and wait for it (scope `exec`); the document carries its exit code and output.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "sandboxes", request_body = ExecBody,
    security(("bearer" = [])), params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "`exec` document (any exit code)", body = Document),
              (status = 404, body = ErrorBody), (status = 422, body = ErrorBody),
              (status = 403, description = "a sandbox that isolates nothing, on a server \
                  without `--allow-unisolated` (or a token without scope exec)", body = ErrorBody)))]
pub(crate) async fn exec_in_sandbox(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<ExecBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let body = checked_exec_body("exec", body);
    let policy = server.clone();
    call(
        &server,
        &headers,
        Method::POST,
        "/v1/sandboxes/{id}/exec",
        "exec",
        Scope::Exec,
        Some(id.clone()),
    )
    .run_with(body, |app, body| async move {
        let (row, _) = app.row(&id).await?;
        policy.require_isolated(&app, &row.provider)?;
        let spec = command_spec(body);
        let args = crate::cli::ExecArgs {
            id,
            detach: false,
            spec,
        };
        crate::commands::exec::exec(&app, args).await
    })
    .await
}

/// This owner's ledger (open entries).
#[utoipa::path(get, path = "/v1/ledger", tag = "ledger", security(("bearer" = [])),
    responses((status = 200, description = "`ledger list` document", body = Document)))]
pub(crate) async fn ledger(State(server): State<Arc<Server>>, headers: HeaderMap) -> Response {
    call(
        &server,
        &headers,
        Method::GET,
        "/v1/ledger",
        "ledger list",
        Scope::Read,
        None,
    )
    .run(|app| async move { crate::commands::ledger::list(&app, false).await })
    .await
}

/// This owner's missions.
#[utoipa::path(get, path = "/v1/missions", tag = "missions", security(("bearer" = [])),
    responses((status = 200, description = "`mission list` document", body = Document)))]
pub(crate) async fn missions(State(server): State<Arc<Server>>, headers: HeaderMap) -> Response {
    call(
        &server,
        &headers,
        Method::GET,
        "/v1/missions",
        "mission list",
        Scope::Read,
        None,
    )
    .run(|app| async move {
        crate::commands::mission::run(&app, crate::cli::MissionCommand::List).await
    })
    .await
}

/// One mission: tasks, attempts, facts.
#[utoipa::path(get, path = "/v1/missions/{id}", tag = "missions", security(("bearer" = [])),
    params(("id" = String, Path, description = "Mission id")),
    responses((status = 200, description = "`mission status` document", body = Document),
              (status = 404, body = ErrorBody)))]
pub(crate) async fn mission(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let token = match authorize(&server, &headers, Scope::Read, "mission status").await {
        Ok(token) => token,
        Err(response) => return response,
    };
    if let Err(response) = owned_mission(&server, &token, &id, "mission status").await {
        return response;
    }
    call(
        &server,
        &headers,
        Method::GET,
        "/v1/missions/{id}",
        "mission status",
        Scope::Read,
        Some(id.clone()),
    )
    .run(|app| async move {
        crate::commands::mission::run(&app, crate::cli::MissionCommand::Status { id }).await
    })
    .await
}

/// Which file of a sandbox.
#[derive(Debug, Deserialize, ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileQuery {
    /// Relative to the sandbox's workspace; `..`, absolute paths and symlinks leading out are
    /// refused.
    path: String,
}

/// A whole file for a sandbox.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileBody {
    /// Relative to the sandbox's workspace (the same rules as reading).
    path: String,
    /// The file's bytes, base64 (standard alphabet, padded); at most 8 MiB decoded.
    content_base64: String,
}

/// Read a file of a sandbox (scope `exec`, as running `cat` would be): the `file read`
/// document, its bytes in `content_base64`; at most 8 MiB (`berth cp` streams any size).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "sandboxes",
    security(("bearer" = [])), params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, description = "`file read` document: `path`, `bytes`, `content_base64`", body = Document),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn read_file(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    query: Result<axum::extract::Query<FileQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let path = file_query("file read", query);
    call(
        &server,
        &headers,
        Method::GET,
        "/v1/sandboxes/{id}/files",
        "file read",
        Scope::Exec,
        Some(id.clone()),
    )
    .run_with(path, |app, path| async move {
        crate::commands::copy::api_read(&app, &id, &path).await
    })
    .await
}

/// List a directory of a sandbox (scope `exec`), as `berth ls`: the `ls` document, `entries`
/// sorted by name (`name`, `kind` — file, dir, symlink, other —, `size`); links not followed.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ls", tag = "sandboxes",
    security(("bearer" = [])), params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, description = "`ls` document: `path`, `entries`", body = Document),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn list_dir(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    query: Result<axum::extract::Query<FileQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let path = file_query("ls", query);
    call(
        &server,
        &headers,
        Method::GET,
        "/v1/sandboxes/{id}/ls",
        "ls",
        Scope::Exec,
        Some(id.clone()),
    )
    .run_with(path, |app, path| async move {
        crate::commands::copy::ls(&app, &id, &path).await
    })
    .await
}

/// The path a file route names, or the 400 that answers a query without one.
#[allow(clippy::result_large_err)] // the error is the handler's answer, returned at once
fn file_query(
    command: &str,
    query: Result<axum::extract::Query<FileQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<String, Response> {
    match query {
        Ok(axum::extract::Query(query)) => Ok(query.path),
        Err(rejected) => Err(failure(
            StatusCode::BAD_REQUEST,
            command,
            "invalid_request",
            format!("query: {}", rejected.body_text()),
            Some("name the path: `?path=RELATIVE/PATH`"),
        )),
    }
}

/// Write a whole file into a sandbox (scope `exec`), creating its directories: the `file
/// write` document. The file appears whole or keeps what it had.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "sandboxes", request_body = FileBody,
    security(("bearer" = [])), params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "`file write` document: `path`, `bytes`", body = Document),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody)))]
pub(crate) async fn write_file(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<FileBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    use base64::Engine as _;
    let file = match body {
        Ok(Json(body)) => {
            match base64::engine::general_purpose::STANDARD.decode(body.content_base64.as_bytes()) {
                Ok(bytes) => Ok((body.path, bytes)),
                Err(e) => Err(failure(
                    StatusCode::BAD_REQUEST,
                    "file write",
                    "invalid_request",
                    format!("content_base64: {e}"),
                    Some("standard base64 with padding"),
                )),
            }
        }
        Err(rejected) => Err(bad_body("file write", rejected)),
    };
    call(
        &server,
        &headers,
        Method::PUT,
        "/v1/sandboxes/{id}/files",
        "file write",
        Scope::Exec,
        Some(id.clone()),
    )
    .run_with(file, |app, (path, bytes)| async move {
        crate::commands::copy::api_write(&app, &id, &path, bytes).await
    })
    .await
}

/// Why a mission is cancelled.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelBody {
    /// Recorded with the mission (1 to 500 characters, no control characters).
    reason: Option<String>,
}

/// End a mission where it stands and remove the sandboxes it holds (scope `exec`), as
/// `berth mission cancel`: 409 while a run drives it or once it succeeded or failed.
#[utoipa::path(post, path = "/v1/missions/{id}/cancel", tag = "missions", request_body = CancelBody,
    security(("bearer" = [])), params(("id" = String, Path, description = "Mission id")),
    responses((status = 200, description = "`mission cancel` document: `state`, `sandboxes` \
        (`verified_gone`, `kept`, `not_removed`)", body = Document),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn cancel_mission(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<CancelBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    // Another owner's mission is the command's refusal, answered 404 as a missing one; a
    // refused request is audited like any other mutation.
    let reason = body
        .map(|Json(body)| body.reason)
        .map_err(|rejected| bad_body("mission cancel", rejected));
    call(
        &server,
        &headers,
        Method::POST,
        "/v1/missions/{id}/cancel",
        "mission cancel",
        Scope::Exec,
        Some(id.clone()),
    )
    .run_with(reason, |app, reason| async move {
        let reason = reason.unwrap_or_else(|| "cancelled through the HTTP API".into());
        crate::commands::mission::run(&app, crate::cli::MissionCommand::Cancel { id, reason }).await
    })
    .await
}

/// The audit log of this token's owner (scope `admin`).
#[utoipa::path(get, path = "/v1/audit", tag = "audit", security(("bearer" = [])),
    responses((status = 200, description = "`audit` document: `entries`", body = Document),
              (status = 403, body = ErrorBody)))]
pub(crate) async fn audit(State(server): State<Arc<Server>>, headers: HeaderMap) -> Response {
    let token = match authorize(&server, &headers, Scope::Admin, "audit").await {
        Ok(token) => token,
        Err(response) => return response,
    };
    match server.store.audit_list(Some(&token.owner)).await {
        Ok(rows) => {
            Json(json!({ "schema": SCHEMA, "command": "audit", "entries": rows })).into_response()
        }
        Err(err) => failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            "audit",
            "internal",
            err.to_string(),
            None,
        ),
    }
}

/// An exec body, checked: environment names must be plain (values travel only as
/// `NAME=VALUE`: a bare name would read the server's own environment).
#[allow(clippy::result_large_err)] // the error is the handler's answer, returned at once
pub(crate) fn checked_exec_body(
    command: &str,
    body: Result<Json<ExecBody>, axum::extract::rejection::JsonRejection>,
) -> Result<ExecBody, Response> {
    let Json(body) = body.map_err(|rejected| bad_body(command, rejected))?;
    match body.env.keys().find(|name| !env_name_ok(name)) {
        Some(bad) => Err(failure(
            StatusCode::BAD_REQUEST,
            command,
            "invalid_request",
            format!(
                "environment variable name `{}` is not [A-Za-z_][A-Za-z0-9_]*",
                bad.escape_debug()
            ),
            None,
        )),
        None => Ok(body),
    }
}

/// The CLI's command spec for an exec body.
pub(crate) fn command_spec(body: ExecBody) -> crate::cli::CommandSpec {
    crate::cli::CommandSpec {
        timeout: body.timeout,
        env: body.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        cwd: body.cwd,
        shell: body.shell,
        argv: body.argv,
    }
}

pub(crate) fn env_name_ok(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b == b'_' || b.is_ascii_alphabetic())
        && bytes.all(|b| b == b'_' || b.is_ascii_alphanumeric())
        && name.len() <= 256
}
