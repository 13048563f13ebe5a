//! The mission file's shape: what each section holds (validation is `parse`'s).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// Named by a field's doc (the published schema carries that text as written).
#[allow(unused_imports)]
use super::SCHEMA_VERSION;

/// A mission file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MissionFile {
    /// Must equal [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Mission name (letters, digits, `-`, `_`).
    pub name: String,
    /// The repository the agent works on.
    pub repository: Repository,
    /// Where attempts run.
    pub sandbox: SandboxSpec,
    /// The agent.
    pub harness: Harness,
    /// Ordered tasks.
    pub tasks: Vec<Task>,
}

/// The repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Repository {
    /// A local path (relative to the mission file).
    pub path: Option<String>,
    /// A git URL reachable from here.
    pub url: Option<String>,
    /// Commit, branch or tag to start from.
    pub base: String,
}

/// Where attempts run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// Provider id.
    pub provider: String,
    /// Providers to try next, on capacity/quota/rate limit/unavailable only.
    #[serde(default)]
    pub fallback: Vec<String>,
    /// Image, for providers that have one.
    pub image: Option<String>,
    /// Keep each attempt's sandbox instead of destroying it after the attempt.
    #[serde(default)]
    pub keep: bool,
    /// Resource limits of every attempt's sandbox (a task's own `limits` override them);
    /// unset: the provider's defaults (stated in its manifest).
    #[serde(default)]
    pub limits: Limits,
}

/// Resource limits of a sandbox; unset fields keep the provider's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// CPUs (fractional allowed), 0.01–1024.
    pub cpus: Option<f64>,
    /// Memory in MiB, 16–16777216.
    pub memory_mib: Option<u64>,
    /// Most processes at once, 8–4194304.
    pub pids: Option<u64>,
}

impl Limits {
    /// These limits, with `over`'s set fields taking precedence.
    pub fn overridden_by(&self, over: &Limits) -> Limits {
        Limits {
            cpus: over.cpus.or(self.cpus),
            memory_mib: over.memory_mib.or(self.memory_mib),
            pids: over.pids.or(self.pids),
        }
    }

    /// Why these limits cannot be used, if they cannot.
    pub(super) fn problem(&self) -> Option<String> {
        if let Some(cpus) = self.cpus {
            if !(0.01..=1024.0).contains(&cpus) {
                return Some(format!("cpus = {cpus} is outside 0.01–1024"));
            }
        }
        if let Some(memory) = self.memory_mib {
            if !(16..=16 << 20).contains(&memory) {
                return Some(format!("memory_mib = {memory} is outside 16–16777216"));
            }
        }
        if let Some(pids) = self.pids {
            if !(8..=1 << 22).contains(&pids) {
                return Some(format!("pids = {pids} is outside 8–4194304"));
            }
        }
        None
    }
}

/// The agent harness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Harness {
    /// `script` (any command), or an agent CLI: `opencode`, `codex`, `claude-code`.
    pub kind: String,
    /// `script` only: the command line, run with `sh -c` in the staged repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Agent CLIs: the model name the CLI asks for (default `scripted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Agent CLIs: where their model traffic goes (Berth's gateway, started per mission run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewaySpec>,
    /// Agent CLIs: stop the agent (attempt rejected) after this long without any output, e.g.
    /// `2m` (default [`DEFAULT_IDLE_TIMEOUT`]); the task's `agent_timeout` still bounds the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// `codex` and `claude-code`: the NAME of a subscription login in Berth's configuration
    /// (`$BERTH_HOME/logins.toml`; never a path or a value here). Leased to one attempt at a
    /// time and staged as the CLI's login file for the agent run only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login: Option<String>,
}

/// The idle watchdog's default for agent CLIs.
pub const DEFAULT_IDLE_TIMEOUT: &str = "5m";

/// The model name an agent CLI asks for when the mission file names none.
pub const DEFAULT_MODEL: &str = "scripted";

impl Harness {
    /// The model name the CLI asks for: the file's, or [`DEFAULT_MODEL`].
    pub fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or(DEFAULT_MODEL)
    }
}

/// The agent CLIs a mission can run, by `harness.kind`.
pub const AGENT_HARNESSES: [&str; 3] = ["opencode", "codex", "claude-code"];

/// Where an agent CLI's model traffic goes: exactly one of a scripted model or a proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GatewaySpec {
    /// A scripted model (TOML; `berth gateway --script`), relative to the mission file; read
    /// once when the mission is registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// A real endpoint's origin (`https://api.anthropic.com`, `http://127.0.0.1:8080`); the
    /// gateway adds the credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// The name of the variable in Berth's own environment that holds the proxy's credential
    /// (never the value; it never enters a sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_env: Option<String>,
}

/// One task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique id.
    pub id: String,
    /// What the agent is asked to do (given to it as `BERTH_INSTRUCTIONS`).
    pub instructions: String,
    /// Attempts allowed before the task is exhausted (1 to 1000).
    #[schemars(range(min = 1, max = 1000))]
    pub max_attempts: u32,
    /// Deadline for the agent, e.g. `2m`.
    pub agent_timeout: String,
    /// How an attempt is judged.
    pub validator: Validator,
    /// Resource limits for this task's sandboxes, over `sandbox.limits`.
    #[serde(default)]
    pub limits: Limits,
}

/// A validator: a command run on the frozen workspace, and the evidence it must produce.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Validator {
    /// The command line, run with `sh -c` after the agent is stopped.
    pub command: String,
    /// Deadline, e.g. `1m`.
    pub timeout: String,
    /// Files (relative to the repository) the validator must produce for a pass to count: no
    /// `..`, no control characters, each ending in a file name.
    pub evidence: Vec<String>,
    /// Run first in the validator's clean sandbox (e.g. installing the project's declared
    /// dependencies): nothing the agent installed outside the repository comes along.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
}
