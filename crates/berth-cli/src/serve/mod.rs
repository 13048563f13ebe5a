//! `berth serve`: Berth as an HTTP API — the CLI's own commands behind bearer tokens.
//!
//! Every route runs the same command function the CLI runs, in JSON mode, and answers with the
//! `berth.cli/v1` document that command emits (captured, not printed). A token belongs to one
//! owner and carries one scope (`read` ⊂ `exec` ⊂ `admin`); each request gets an [`App`] bound
//! to that owner — its own ledger view, an empty environment for `--env NAME` lookups (a caller
//! never reads the server's variables), and a run id of its own so a failed request cleans up
//! exactly what it made. Another owner's sandbox or mission answers 404, the same as one that
//! does not exist. A provider that isolates nothing (`host`) gets no sandbox and runs no
//! command over the API unless the server was started with `--allow-unisolated`: there a
//! command would run as the server's own user, past every owner's boundary. Every mutating
//! request is written to the audit log (token, owner, method, route template, target, status,
//! outcome — never a body, so never a secret).
//!
//! - `auth` — tokens (`berth token create/list/revoke`), hashing, scopes.
//! - `routes` — the router, authorization, the command runner and the OpenAPI description.
//! - `resources` — the handlers: sandboxes, ledger, missions, audit.
//! - `portable` — a sandbox moved, checkpoints taken, listed, restored and deleted.
//! - `agents` — `berth prompt` over HTTP (a scripted model, or the endpoint the server proxies).
//! - `events` — a mission's event log as server-sent events, resumable by event id.
//! - `jobs` — execs started over the API, their output as server-sent events.
//! - `ui` — the web dashboard: missions, attempts, live events, ledger, catalog, benchmarks.
//! - `listener` — the socket: at most 512 connections, a request head due 10 s after its
//!   first byte, a quiet connection closed after 120 s.

mod agents;
pub mod auth;
mod events;
mod jobs;
mod listener;
mod portable;
mod resources;
mod routes;
mod ui;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use berth_store::Store;

use crate::app::App;
use crate::config::Config;

pub use routes::openapi_json;

/// What every request starts from.
pub(crate) struct Server {
    /// The server's own configuration (home, the provider credentials in its environment).
    pub config: Config,
    pub store: Store,
    /// Execs started over the API, their output kept for their event streams.
    pub jobs: jobs::Jobs,
    /// Whether sandboxes of providers that isolate nothing are served (`--allow-unisolated`).
    pub allow_unisolated: bool,
    /// The model endpoint prompts without a script go to (`--prompt-proxy`).
    pub prompt_proxy: Option<PromptProxy>,
}

/// How `berth serve` is started, beyond where it listens.
#[derive(Debug, Default)]
pub struct Options {
    /// `--allow-unisolated`.
    pub allow_unisolated: bool,
    /// `--prompt-proxy URL --prompt-credential-env VAR`.
    pub prompt_proxy: Option<PromptProxy>,
}

/// A model endpoint the server proxies prompts to, with the server's own credential.
#[derive(Debug, Clone)]
pub struct PromptProxy {
    /// Its origin.
    pub origin: String,
    /// The server's variable holding its credential.
    pub credential_env: String,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("home", &self.config.home)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// An [`App`] for one request of `owner`.
    pub(crate) fn app_for(&self, owner: &str) -> Result<App> {
        let mut config = self.config.clone();
        config.owner = owner.to_owned();
        App::for_request(config, self.store.clone())
    }

    /// Refuses `provider` when it isolates nothing and this server was not started with
    /// `--allow-unisolated`: a command there runs as the server's own user, which reaches every
    /// owner's sandboxes, store and tokens — owner isolation would mean nothing. An unknown
    /// provider passes (the command says what is wrong with it).
    pub(crate) fn require_isolated(&self, app: &App, provider: &str) -> Result<()> {
        let unisolated = app
            .registry
            .manifest(provider)
            .is_ok_and(|m| m.isolation.class == berth_manifest::IsolationClass::None);
        if !unisolated || self.allow_unisolated {
            return Ok(());
        }
        Err(not_served(
            format!(
                "this server runs nothing on `{provider}`: it isolates nothing, so a command there \
                 would run as the server's own user, reaching every owner's data and tokens"
            ),
            "use a provider that isolates (docker, bwrap)",
        ))
    }

    /// Refuses network `host` (the server's own network, loopback services included: its
    /// databases, object store, this API) on a server without `--allow-unisolated`.
    pub(crate) fn require_own_network(&self, network: &str) -> Result<()> {
        if network != "host" || self.allow_unisolated {
            return Ok(());
        }
        Err(not_served(
            "this server makes no sandbox on its own network (`host`): the sandbox would reach \
             every service on the server's loopback"
                .into(),
            "use network `none` or `bridge`",
        ))
    }
}

/// What a server without `--allow-unisolated` refuses (403 `forbidden`): `instead`, or the flag.
fn not_served(message: String, instead: &str) -> anyhow::Error {
    crate::errors::CliError {
        kind: "forbidden",
        exit_code: crate::errors::code::AUTH,
        message,
        hint: Some(format!(
            "{instead}; a server for one trusted owner may be started with `berth serve \
             --allow-unisolated`"
        )),
    }
    .into()
}

/// `berth serve --listen ADDR`: serves until interrupted. Prints `listening on http://ADDR`
/// first (the bound address, so `:0` is usable).
pub async fn run(app: &App, listen: SocketAddr, options: Options) -> Result<i32> {
    let Options {
        allow_unisolated,
        prompt_proxy,
    } = options;
    // A proxy that cannot work is said now, not at the first prompt.
    if let Some(proxy) = &prompt_proxy {
        crate::commands::gateway::upstream(
            &app.config,
            None,
            Some(&proxy.origin),
            Some(&proxy.credential_env),
        )?;
    }
    let server = Arc::new(Server {
        config: app.config.clone(),
        store: app.ledger.store().clone(),
        jobs: Default::default(),
        allow_unisolated,
        prompt_proxy,
    });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    let local = listener.local_addr()?;
    outln!("listening on http://{local}");
    if allow_unisolated {
        errln!(
            "berth: warning: --allow-unisolated: a token with scope exec can run commands as \
             this server's user (host sandboxes), reaching every owner's data and tokens"
        );
    }
    if !local.ip().is_loopback() {
        errln!(
            "berth: warning: serving on {local}, beyond this machine; every route still needs a \
             token, but traffic is plain HTTP"
        );
    }
    {
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    // Prompts a killed server was running left their turns in their sandboxes: kept now, as
    // `berth gc` would (a live run's record, locked by its process, is left alone).
    tokio::spawn(keep_killed_prompts(server.clone()));
    axum::serve(
        listener::GuardedListener::new(listener),
        routes::router(server),
    )
    .await
    .context("serve HTTP")?;
    Ok(0)
}

/// Keeps the turns of `berth prompt` runs whose process was killed, for every owner that has
/// one, each said on stderr.
async fn keep_killed_prompts(server: Arc<Server>) {
    for owner in crate::commands::prompt::killed_owners(&server.config.state_dir()) {
        let Ok(app) = server.app_for(&owner) else {
            continue;
        };
        for recovered in
            crate::commands::prompt::recover_killed_runs(&app, "berth serve", |_| true).await
        {
            errln!("berth serve: {}", recovered.line());
        }
    }
}
