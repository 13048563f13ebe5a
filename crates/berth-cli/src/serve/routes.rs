//! The routes: each authorizes, runs the CLI's command for the token's owner, and answers with
//! the document the command emitted. The OpenAPI description is generated from these
//! declarations (`berth serve` publishes it at `/v1/openapi.json`; `schemas/openapi.json` is
//! the committed copy).

use std::future::Future;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use berth_store::{AccessStore, ApiToken, MissionStore, NewAudit, StoreError};
use serde_json::json;
use utoipa::{OpenApi, ToSchema};

use super::auth::{self, Scope};
use super::resources;
use super::Server;
use crate::app::App;
use crate::errors::code;
use crate::output::{self, SCHEMA};

/// Largest request body accepted.
const MAX_BODY: usize = 1 << 20;

pub(crate) fn router(server: Arc<Server>) -> Router {
    Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route(
            "/v1/sandboxes",
            get(resources::list_sandboxes).post(resources::create_sandbox),
        )
        .route(
            "/v1/sandboxes/{id}",
            get(resources::show_sandbox).delete(resources::destroy_sandbox),
        )
        .route(
            "/v1/sandboxes/{id}/exec",
            axum::routing::post(resources::exec_in_sandbox),
        )
        .route(
            "/v1/sandboxes/{id}/files",
            get(resources::read_file)
                .put(resources::write_file)
                .layer(DefaultBodyLimit::max(
                    // A whole file of the API's largest, in base64, with room for the JSON around it.
                    (crate::commands::copy::API_FILE_MAX as usize).div_ceil(3) * 4 + (64 << 10),
                )),
        )
        .route("/v1/sandboxes/{id}/ls", get(resources::list_dir))
        .route(
            "/v1/sandboxes/{id}/move",
            axum::routing::post(super::portable::move_sandbox),
        )
        .route(
            "/v1/sandboxes/{id}/checkpoint",
            axum::routing::post(super::portable::take_checkpoint),
        )
        .route("/v1/checkpoints", get(super::portable::list_checkpoints))
        .route(
            "/v1/checkpoints/{id}",
            axum::routing::delete(super::portable::delete_checkpoint),
        )
        .route(
            "/v1/checkpoints/{id}/restore",
            axum::routing::post(super::portable::restore_checkpoint),
        )
        .route(
            "/v1/sandboxes/{id}/prompt",
            axum::routing::post(super::agents::prompt),
        )
        .route("/v1/sessions", get(super::portable::list_sessions))
        .route(
            "/v1/sessions/{id}",
            axum::routing::delete(super::portable::delete_session),
        )
        .route(
            "/v1/sandboxes/{id}/execs",
            axum::routing::post(super::jobs::start),
        )
        .route(
            "/v1/sandboxes/{id}/execs/{job}/events",
            get(super::jobs::events),
        )
        .route("/v1/ledger", get(resources::ledger))
        .route("/v1/missions", get(resources::missions))
        .route("/v1/missions/{id}", get(resources::mission))
        .route(
            "/v1/missions/{id}/events",
            get(super::events::mission_events),
        )
        .route(
            "/v1/missions/{id}/cancel",
            axum::routing::post(resources::cancel_mission),
        )
        .route("/v1/audit", get(resources::audit))
        .route("/", get(|| async { axum::response::Redirect::to("/ui") }))
        .route("/ui", get(super::ui::missions))
        .route(
            "/ui/login",
            get(super::ui::login_form).post(super::ui::login),
        )
        .route("/ui/logout", get(super::ui::logout))
        .route("/ui/missions/{id}", get(super::ui::mission))
        .route("/ui/ledger", get(super::ui::ledger))
        .route("/ui/catalog", get(super::ui::catalog))
        .route("/ui/bench", get(super::ui::bench))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(server)
}

/// A `berth.cli/v1` document: `schema`, `command`, then the command's own fields (or `error`).
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // described, not built: documents are the commands' own JSON
pub(crate) struct Document {
    /// Always `berth.cli/v1`.
    schema: String,
    /// The CLI verb that produced it (`list`, `create`, `exec`, …).
    command: String,
}

/// An error document's `error` field.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ErrorBody {
    /// `unauthenticated`, `forbidden`, `not_found`, `invalid_request`, `unavailable`, …
    kind: String,
    /// The CLI exit code for the same failure.
    exit_code: i32,
    /// What happened.
    message: String,
    /// What to do.
    hint: Option<String>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Berth",
        description = "Berth's HTTP API (`berth serve`): the CLI's commands behind bearer tokens. \
            Every answer is a `berth.cli/v1` document, the same the CLI prints with `--json`. \
            Scopes nest: read ⊂ exec ⊂ admin. Another owner's resources answer 404."
    ),
    paths(
        resources::list_sandboxes,
        resources::create_sandbox,
        resources::show_sandbox,
        resources::destroy_sandbox,
        resources::exec_in_sandbox,
        resources::read_file,
        resources::write_file,
        resources::list_dir,
        super::portable::move_sandbox,
        super::portable::take_checkpoint,
        super::portable::list_checkpoints,
        super::portable::restore_checkpoint,
        super::portable::delete_checkpoint,
        super::agents::prompt,
        super::portable::list_sessions,
        super::portable::delete_session,
        super::jobs::start,
        super::jobs::events,
        resources::ledger,
        resources::missions,
        resources::mission,
        super::events::mission_events,
        resources::cancel_mission,
        resources::audit
    ),
    components(schemas(
        Document,
        ErrorBody,
        resources::CreateBody,
        resources::ExecBody,
        resources::CancelBody,
        super::portable::MoveBody,
        super::portable::CheckpointBody,
        super::portable::RestoreBody,
        super::agents::PromptBody,
        resources::FileBody
    )),
    modifiers(&Bearer)
)]
struct ApiDoc;

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The OpenAPI description, as published.
pub fn openapi_json() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI description serializes")
}

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        openapi_json(),
    )
        .into_response()
}

/// An error document with an HTTP status.
pub(crate) fn failure(
    status: StatusCode,
    command: &str,
    kind: &str,
    message: String,
    hint: Option<&str>,
) -> Response {
    let exit_code = match status {
        StatusCode::NOT_FOUND => code::NOT_FOUND,
        StatusCode::BAD_REQUEST
        | StatusCode::PAYLOAD_TOO_LARGE
        | StatusCode::UNSUPPORTED_MEDIA_TYPE => code::INVALID,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => code::AUTH,
        _ => code::INTERNAL,
    };
    (
        status,
        Json(json!({
            "schema": SCHEMA,
            "command": command,
            "error": { "kind": kind, "exit_code": exit_code, "message": message, "hint": hint },
        })),
    )
        .into_response()
}

/// The token a request presents, if it may do `needed`. `Err` carries the answer, and the
/// token when one was recognised (a 403 is audited; a 401 has no one to attribute it to).
pub(crate) async fn authorize_as(
    server: &Server,
    headers: &HeaderMap,
    needed: Scope,
    command: &str,
) -> Result<ApiToken, (Response, Option<ApiToken>)> {
    let presented = presented(headers, needed);
    let unauthenticated = |message: &str| {
        failure(
            StatusCode::UNAUTHORIZED,
            command,
            "unauthenticated",
            message.to_owned(),
            Some("send `Authorization: Bearer TOKEN` (`berth token create` makes one)"),
        )
    };
    let Some(presented) = presented.as_deref() else {
        return Err((unauthenticated("no bearer token"), None));
    };
    match auth::verify(&server.store, presented.trim()).await {
        Ok(Some((token, scope))) if scope >= needed => Ok(token),
        Ok(Some((token, scope))) => Err((
            failure(
                StatusCode::FORBIDDEN,
                command,
                "forbidden",
                format!(
                    "this token's scope is {}; this request needs {}",
                    scope.as_str(),
                    needed.as_str()
                ),
                Some("use a token created with a wider --scope"),
            ),
            Some(token),
        )),
        Ok(None) => Err((unauthenticated("unknown or revoked token"), None)),
        Err(err) => Err((
            failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                command,
                "internal",
                format!("cannot check the token: {err}"),
                None,
            ),
            None,
        )),
    }
}

/// The token a request presents for a `needed` scope: its bearer token, or for reads the
/// dashboard's cookie (a browser's cookie authorizes reads only: a page can never be made to
/// send a mutation on its user's behalf).
pub(crate) fn presented(headers: &HeaderMap, needed: Scope) -> Option<String> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
        .or_else(|| {
            (needed == Scope::Read)
                .then(|| session_cookie(headers))
                .flatten()
        })
}

/// The dashboard's session cookie, if the request carries one.
fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            pair.trim()
                .strip_prefix(super::ui::COOKIE)
                .and_then(|rest| rest.strip_prefix('='))
                .map(str::to_owned)
        })
}

/// [`authorize_as`] for reads, which are not audited.
pub(crate) async fn authorize(
    server: &Server,
    headers: &HeaderMap,
    needed: Scope,
    command: &str,
) -> Result<ApiToken, Response> {
    authorize_as(server, headers, needed, command)
        .await
        .map_err(|(response, _)| response)
}

/// The HTTP status for a CLI exit code.
fn status_for(exit_code: i32) -> StatusCode {
    match exit_code {
        code::NOT_FOUND | code::REFUSED => StatusCode::NOT_FOUND,
        code::INVALID => StatusCode::BAD_REQUEST,
        code::UNSUPPORTED | code::COMMAND_NOT_FOUND | code::COMMAND_NOT_EXECUTABLE => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        code::UNAVAILABLE => StatusCode::SERVICE_UNAVAILABLE,
        code::AUTH => StatusCode::BAD_GATEWAY,
        code::CONFLICT => StatusCode::CONFLICT,
        // A check the request's subject failed (a moved workspace that is not its checkpoint).
        code::VERIFICATION_FAILED => StatusCode::UNPROCESSABLE_ENTITY,
        code::TIMEOUT => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// One request: who, what it may do, what it runs, what the audit log records.
pub(crate) struct Call<'a> {
    pub server: &'a Server,
    pub headers: &'a HeaderMap,
    pub method: Method,
    pub route: &'static str,
    pub command: &'static str,
    pub needed: Scope,
    pub target: Option<String>,
}

impl Call<'_> {
    /// Authorizes, runs `body` with an app for the token's owner, answers with its document,
    /// audits a mutating request.
    pub async fn run<F, Fut>(self, body: F) -> Response
    where
        F: FnOnce(Arc<App>) -> Fut,
        Fut: Future<Output = anyhow::Result<i32>>,
    {
        self.run_with(Ok(()), |app, ()| body(app)).await
    }

    /// [`Call::run`] with the request's parsed `input`: a refused one (its `Err`, a rejected
    /// body or query) is the answer once the caller is authorized, and nothing runs.
    pub async fn run_with<T, F, Fut>(self, input: Result<T, Response>, body: F) -> Response
    where
        F: FnOnce(Arc<App>, T) -> Fut,
        Fut: Future<Output = anyhow::Result<i32>>,
    {
        let (token, (response, outcome)) =
            match authorize_as(self.server, self.headers, self.needed, self.command).await {
                Err((response, None)) => return response,
                Err((response, Some(token))) => (token, (response, "forbidden".to_owned())),
                Ok(token) => match input {
                    Err(response) => (token, (response, "invalid_request".to_owned())),
                    Ok(input) => {
                        let answered = self.answer(&token, |app| body(app, input)).await;
                        (token, answered)
                    }
                },
            };
        if self.method != Method::GET {
            let audit = NewAudit {
                token_id: token.id.clone(),
                owner: token.owner.clone(),
                method: self.method.to_string(),
                route: self.route.to_owned(),
                target: self.target.clone(),
                status: response.status().as_u16(),
                outcome,
            };
            if let Err(err) = self.server.store.audit_append(&audit).await {
                // An unaudited mutation is reported, never hidden.
                errln!("berth serve: cannot write the audit log: {err}");
                return failure(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    self.command,
                    "internal",
                    "the request ran but could not be audited".into(),
                    None,
                );
            }
        }
        response
    }

    async fn answer<F, Fut>(&self, token: &ApiToken, body: F) -> (Response, String)
    where
        F: FnOnce(Arc<App>) -> Fut,
        Fut: Future<Output = anyhow::Result<i32>>,
    {
        let app = match self.server.app_for(&token.owner) {
            Ok(app) => Arc::new(app),
            Err(err) => {
                return (
                    failure(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        self.command,
                        "internal",
                        format!("{err:#}"),
                        None,
                    ),
                    "internal".into(),
                )
            }
        };
        let (result, document) = output::capture(body(app.clone())).await;
        match result {
            Ok(_) => match document {
                Some(doc) => ((StatusCode::OK, Json(doc)).into_response(), "ok".into()),
                None => (
                    failure(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        self.command,
                        "internal",
                        "the command produced no document".into(),
                        None,
                    ),
                    "internal".into(),
                ),
            },
            Err(err) => {
                // What this request created and did not hand over goes, as with the CLI.
                app.cleanup_after_failure().await;
                let failed = crate::errors::classify(&err);
                let status = match failed.kind {
                    // The server's own policy (`Server::require_isolated`), not the provider's.
                    "forbidden" => StatusCode::FORBIDDEN,
                    _ => status_for(failed.exit_code),
                };
                if failed.exit_code == code::REFUSED {
                    // Another owner's resource is indistinguishable from a missing one.
                    let what = self.target.as_deref().unwrap_or("that resource");
                    return (
                        failure(
                            status,
                            self.command,
                            "not_found",
                            format!("no `{what}` for this token's owner"),
                            None,
                        ),
                        "not_found".into(),
                    );
                }
                let kind = failed.kind.to_owned();
                (
                    (
                        status,
                        Json(json!({ "schema": SCHEMA, "command": self.command, "error": failed })),
                    )
                        .into_response(),
                    kind,
                )
            }
        }
    }
}

/// A mission of the token's owner, else 404 (another owner's is not found either).
pub(crate) async fn owned_mission(
    server: &Server,
    token: &ApiToken,
    id: &str,
    command: &str,
) -> Result<(), Response> {
    match server.store.mission_get(id).await {
        Ok(row) if row.owner == token.owner => Ok(()),
        Ok(_) | Err(StoreError::NotFound(..)) => Err(failure(
            StatusCode::NOT_FOUND,
            command,
            "not_found",
            format!("no mission `{id}` for this token's owner"),
            Some("`GET /v1/missions` lists this owner's missions"),
        )),
        Err(err) => Err(failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            command,
            "internal",
            err.to_string(),
            None,
        )),
    }
}

pub(crate) fn call<'a>(
    server: &'a Server,
    headers: &'a HeaderMap,
    method: Method,
    route: &'static str,
    command: &'static str,
    needed: Scope,
    target: Option<String>,
) -> Call<'a> {
    Call {
        server,
        headers,
        method,
        route,
        command,
        needed,
        target,
    }
}

pub(crate) fn bad_body(
    command: &str,
    rejected: axum::extract::rejection::JsonRejection,
) -> Response {
    // 413 for a body over the limit, 415 without a JSON content type, else 400.
    let status = match rejected.status() {
        s @ (StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE) => s,
        _ => StatusCode::BAD_REQUEST,
    };
    failure(
        status,
        command,
        "invalid_request",
        format!("request body: {}", rejected.body_text()),
        Some("see /v1/openapi.json for the body's shape"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_openapi_is_in_sync() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas/openapi.json");
        let generated = openapi_json();
        if std::env::var_os("BERTH_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        assert!(
            std::fs::read_to_string(&path).unwrap_or_default() == generated,
            "schemas/openapi.json is out of date; run BERTH_BLESS=1 cargo test -p berth-cli"
        );
        for route in [
            "/v1/sandboxes/{id}/exec",
            "/v1/missions/{id}/events",
            "/v1/audit",
        ] {
            assert!(generated.contains(route), "{route} is not described");
        }
        assert!(generated.contains("\"bearer\""));
    }

    #[test]
    fn environment_names_are_plain() {
        assert!(resources::env_name_ok("API_TOKEN") && resources::env_name_ok("_x1"));
        for bad in ["", "1A", "A=B", "A B", "A\0"] {
            assert!(!resources::env_name_ok(bad), "{bad:?}");
        }
    }

    #[test]
    fn statuses_follow_the_cli_exit_codes() {
        assert_eq!(status_for(code::REFUSED), StatusCode::NOT_FOUND);
        assert_eq!(status_for(code::NOT_FOUND), StatusCode::NOT_FOUND);
        assert_eq!(
            status_for(code::UNAVAILABLE),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(status_for(code::INVALID), StatusCode::BAD_REQUEST);
    }
}
