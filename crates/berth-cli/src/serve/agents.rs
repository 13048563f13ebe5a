//! The API's agent route: `berth prompt` over HTTP. The model is a script given in the body or
//! the endpoint the server was started to proxy to (`berth serve --prompt-proxy URL
//! --prompt-credential-env VAR`): its credential is the server's and never reaches a caller or
//! a sandbox; a caller names no variable of the server's.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;

use super::auth::Scope;
use super::routes::{bad_body, call, Document, ErrorBody};
use super::Server;
use crate::errors::CliError;

fn default_model() -> String {
    "scripted".into()
}

fn default_cwd() -> String {
    ".".into()
}

fn default_timeout() -> String {
    "10m".into()
}

/// One turn of an agent CLI in a sandbox.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PromptBody {
    /// What the agent is asked to do.
    instructions: String,
    /// The agent CLI: `opencode`, `codex` or `claude-code` (a resumed session's own when left
    /// out).
    harness: Option<String>,
    /// Go on with an agent session (`as-…`), whichever sandbox its last turn ran in.
    resume: Option<String>,
    /// A scripted model: the TOML a `berth gateway --script` file holds. Without it, the model
    /// the server proxies to (`berth serve --prompt-proxy`).
    script: Option<String>,
    /// The model name the CLI asks for (default `scripted`).
    #[serde(default = "default_model")]
    model: String,
    /// The working directory in the sandbox, relative to its workspace (default `.`).
    #[serde(default = "default_cwd")]
    cwd: String,
    /// Deadline for the agent (default `10m`).
    #[serde(default = "default_timeout")]
    timeout: String,
}

/// Run an agent CLI in a sandbox for one turn and wait for it (scope `exec`), as `berth
/// prompt`: its model traffic through a gateway of the server's, its conversation kept as an
/// agent session. The answer is the `prompt` document (the events are in `logs`); a turn that
/// did nothing or failed is still 200, with `rejected` saying why.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/prompt", tag = "sandboxes",
    request_body = PromptBody, security(("bearer" = [])),
    params(("id" = String, Path, description = "Sandbox id (host or docker)")),
    responses((status = 200, description = "`prompt` document: `harness`, `exit`, `tool_calls`, \
        `session_id`, `rejected`, `logs`, `session`, `turn`, `forked_from`, `fork_reason`, \
        `session_not_kept`, `events`", body = Document),
              (status = 400, description = "no model: neither `script` nor a server proxy; a \
                  script that does not parse", body = ErrorBody),
              (status = 403, description = "a sandbox that isolates nothing, on a server \
                  without `--allow-unisolated` (or a token without scope exec)", body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn prompt(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<PromptBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let body = body
        .map(|Json(body)| body)
        .map_err(|rejected| bad_body("prompt", rejected));
    let policy = server.clone();
    call(
        &server,
        &headers,
        Method::POST,
        "/v1/sandboxes/{id}/prompt",
        "prompt",
        Scope::Exec,
        Some(id.clone()),
    )
    .run_with(body, |app, body| async move {
        let (row, _) = app.row(&id).await?;
        policy.require_isolated(&app, &row.provider)?;
        let upstream = match (&body.script, &policy.prompt_proxy) {
            (Some(text), _) => berth_gateway::Upstream::Scripted(
                berth_gateway::Script::parse(text)
                    .map_err(|e| {
                        CliError::invalid(
                            format!("the body's script: {e}"),
                            "see the README's \"Model gateway\" section for the format",
                        )
                    })?
                    .into(),
            ),
            (None, Some(proxy)) => crate::commands::gateway::upstream(
                &policy.config,
                None,
                Some(&proxy.origin),
                Some(&proxy.credential_env),
            )?,
            (None, None) => {
                return Err(CliError::invalid(
                    "no model: give `script`; this server proxies to no model endpoint",
                    "send a scripted model, or start the server with `--prompt-proxy URL \
                     --prompt-credential-env VAR`",
                )
                .into())
            }
        };
        let args = crate::cli::PromptArgs {
            id,
            harness: body.harness,
            instructions: body.instructions,
            resume: body.resume,
            script: None,
            proxy: None,
            // The server's own variable, so its value is masked in what the run keeps.
            credential_env: policy
                .prompt_proxy
                .as_ref()
                .map(|p| p.credential_env.clone()),
            model: body.model,
            cwd: body.cwd,
            timeout: body.timeout,
        };
        crate::commands::prompt::prompt_with(&app, args, upstream).await
    })
    .await
}
