//! Berth's model gateway: what a coding agent in a sandbox talks to instead of a model
//! provider.
//!
//! It speaks the three wire dialects the agent CLIs use — OpenAI Chat Completions (OpenCode),
//! OpenAI Responses (Codex), Anthropic Messages (Claude Code) — streamed (SSE) and not, in
//! front of one upstream:
//!
//! - **scripted** ([`script`]): a deterministic model from a script file, which maps its steps
//!   onto each CLI's own tools — for tests, and for users who try a mission without paying for
//!   a model;
//! - **proxy** ([`Proxy`]): a real endpoint; the gateway adds the real credential itself.
//!
//! A sandbox gets only a per-attempt token ([`Gateway::admit`]), which the gateway maps to the
//! attempt and its journal; the credential never enters the sandbox, its environment, argv,
//! files or snapshots. Every request is journaled per attempt ([`journal`]), redacted, with its
//! usage and, when a price table names the model, its cost.
//!
//! The gateway owns no sandbox, no store and no mission state: missions start one and admit
//! attempts; `berth gateway` runs one on its own.

pub mod dialect;
pub mod journal;
mod proxy;
pub mod script;
mod server;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

pub use crate::dialect::Dialect;
pub use crate::journal::{Entry, Journal};
pub use crate::proxy::{Proxy, PROXY_CA_FILE_VAR};
pub use crate::script::{Script, Usage};
pub use crate::server::{Connections, RunningGateway, TOKEN_HEADER};

/// What goes wrong in the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The script file is malformed.
    #[error("invalid model script: {0}")]
    Script(String),
    /// The price table is malformed.
    #[error("invalid price table: {0}")]
    Prices(String),
    /// The proxy's configuration is unusable.
    #[error("invalid proxy upstream: {0}")]
    Proxy(String),
    /// The listener could not be opened.
    #[error("cannot listen: {0}")]
    Listen(#[source] std::io::Error),
}

/// Where answers come from.
#[derive(Debug, Clone)]
pub enum Upstream {
    /// A scripted model.
    Scripted(Arc<Script>),
    /// A real endpoint.
    Proxy(Arc<Proxy>),
}

impl Upstream {
    fn name(&self) -> &'static str {
        match self {
            Upstream::Scripted(_) => "scripted",
            Upstream::Proxy(_) => "proxy",
        }
    }
}

/// US dollars per million tokens, by model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    /// Model name → its prices.
    #[serde(default)]
    pub models: HashMap<String, Price>,
}

/// One model's prices, US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Uncached input.
    pub input: f64,
    /// Output.
    pub output: f64,
    /// Cached input (defaults to the input price).
    #[serde(default)]
    pub cached_input: Option<f64>,
}

impl Prices {
    /// Checks that every price is finite and not negative.
    pub fn check(&self) -> Result<(), GatewayError> {
        for (model, p) in &self.models {
            let all = [p.input, p.output, p.cached_input.unwrap_or(0.0)];
            if all.iter().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(GatewayError::Prices(format!(
                    "model `{model}`: prices must be finite and not negative"
                )));
            }
        }
        Ok(())
    }

    /// The cost of `usage` on `model`, or why it is unknown.
    pub fn cost(&self, model: Option<&str>, usage: Option<Usage>) -> Result<f64, String> {
        let usage = usage.ok_or("the response reported no usage")?;
        let model = model.ok_or("the request named no model")?;
        let price = self
            .models
            .get(model)
            .ok_or_else(|| format!("no price for model `{model}`"))?;
        let fresh = usage.input.saturating_sub(usage.cached) as f64;
        Ok((fresh * price.input
            + usage.cached as f64 * price.cached_input.unwrap_or(price.input)
            + usage.output as f64 * price.output)
            / 1_000_000.0)
    }
}

/// A gateway's configuration.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Where answers come from.
    pub upstream: Upstream,
    /// Prices, when the mission gives a table.
    pub prices: Option<Prices>,
}

/// One admitted attempt.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub(crate) key: String,
    /// 1-based: which of a script's `[[attempt]]` blocks answers.
    pub(crate) ordinal: u32,
    pub(crate) journal: Journal,
    /// Secret values this attempt was handed besides the gateway's (a login's), scrubbed from
    /// its journal: the agent's tools can print them into what it sends the model.
    pub(crate) secrets: Vec<String>,
}

/// The token a sandbox presents (as its API key) for one attempt. Not a model credential: it
/// reaches only this gateway, and only while the attempt is admitted.
#[derive(Clone, PartialEq, Eq)]
pub struct AttemptToken(String);

impl AttemptToken {
    /// The value to configure as the harness's API key.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AttemptToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttemptToken(..)")
    }
}

/// The gateway: configuration and admitted attempts. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Gateway {
    pub(crate) config: Arc<GatewayConfig>,
    pub(crate) attempts: Arc<RwLock<HashMap<String, Arc<Attempt>>>>,
    /// Request bodies held now, across connections.
    pub(crate) held: server::Held,
}

impl Gateway {
    /// A gateway with no attempt admitted.
    pub fn new(config: GatewayConfig) -> Gateway {
        Gateway {
            config: Arc::new(config),
            attempts: Arc::default(),
            held: Default::default(),
        }
    }

    /// Admits an attempt: requests carrying the returned token are answered and journaled to
    /// `journal`.
    pub fn admit(&self, attempt_key: &str, journal: PathBuf) -> AttemptToken {
        self.admit_nth(attempt_key, 1, journal, Vec::new())
    }

    /// [`Gateway::admit`] for a mission's attempt `ordinal` (1-based), which selects the
    /// scripted model's `[[attempt]]` block; `secrets` are values the attempt was handed
    /// (a login's), scrubbed from its journal as the gateway's own credential is.
    pub fn admit_nth(
        &self,
        attempt_key: &str,
        ordinal: u32,
        journal: PathBuf,
        secrets: Vec<String>,
    ) -> AttemptToken {
        let mut bytes = [0u8; 24];
        getrandom::fill(&mut bytes).expect("the OS random source works");
        let token = format!("berth-gw-{}", hex::encode(bytes));
        self.attempts
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                token.clone(),
                Arc::new(Attempt {
                    key: attempt_key.to_owned(),
                    ordinal,
                    journal: Journal::new(journal),
                    secrets,
                }),
            );
        AttemptToken(token)
    }

    /// Revokes a token: its requests are refused (401) from now on.
    pub fn revoke(&self, token: &AttemptToken) {
        self.attempts
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&token.0);
    }

    pub(crate) fn attempt(&self, token: &str) -> Option<Arc<Attempt>> {
        self.attempts
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .cloned()
    }

    /// Secret values scrubbed from every journal line.
    pub(crate) fn secrets(&self) -> Vec<String> {
        match &self.config.upstream {
            Upstream::Proxy(proxy) => proxy.credential().map(str::to_owned).into_iter().collect(),
            Upstream::Scripted(_) => Vec::new(),
        }
    }

    /// Listens on `127.0.0.1:port` (0: any free port) and serves until the returned handle is
    /// stopped or dropped.
    pub async fn listen(&self, port: u16) -> Result<RunningGateway, GatewayError> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(GatewayError::Listen)?;
        Ok(server::serve(self.clone(), listener))
    }
}
