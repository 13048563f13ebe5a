//! The one module that reads Berth's environment variables.
//!
//! - `BERTH_HOME` — state directory (default `$XDG_DATA_HOME/berth`, else
//!   `~/.local/share/berth`). Holds `berth.db` (SQLite) and `state/<provider>/`.
//! - `BERTH_OWNER` — owner label on everything Berth creates (default `$USER@<hostname>`).
//! - `BERTH_FAULT` — test hook: `panic-after-create`, `error-after-create`,
//!   `kill-before-event:N`, `kill-after-event:N` or `kill-in-publication:N` (missions),
//!   `kill-in-move:PHASE` or `term-in-move:PHASE` (`berth move`), `kill-in-session:STEP`
//!   (`berth prompt` saving its session).
//!
//! Everything else in the environment is passed to the factory as an opaque snapshot, from
//! which adapters read only the credential variables their manifest names, and the gateway
//! only the variables a command or mission names (`--credential-env`, `credential_env`) and
//! `BERTH_PROXY_CA_FILE`; missions on the host provider look for agent CLIs in
//! `BERTH_AGENT_BIN_DIR` and `PATH`; artifact publication reads `BERTH_ARTIFACTS_*` and the
//! credential variables those name.

use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use berth_factory::Environment;

/// Resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// State directory.
    pub home: PathBuf,
    /// Owner label.
    pub owner: String,
    /// The environment snapshot.
    pub env: Environment,
    /// Test hook (`BERTH_FAULT`): inject a failure at a named point, to prove cleanup fires.
    pub fault: Option<Fault>,
    /// Colour is allowed on a terminal: `NO_COLOR` is unset (any value, even empty, turns it
    /// off) and `TERM` is not `dumb`.
    pub colour_allowed: bool,
}

/// Injected failures (`BERTH_FAULT=panic-after-create|error-after-create`). Used by the test
/// suite to prove that must-fire cleanup runs on panics and errors; never set in normal use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Panic right after a command's sandbox was created.
    PanicAfterCreate,
    /// Return an error right after a command's sandbox was created.
    ErrorAfterCreate,
}

impl Config {
    /// Reads the process environment once.
    pub fn from_process() -> Result<Config> {
        // `std::env::vars` panics on a variable that is not UTF-8 (anything in the caller's
        // environment): such variables are left out; BERTH_HOME, a path, is read as bytes.
        let vars: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        let get = |name: &str| {
            vars.iter()
                .find(|(k, v)| k == name && !v.is_empty())
                .map(|(_, v)| v.clone())
        };
        let berth_home = std::env::var_os("BERTH_HOME").filter(|h| !h.is_empty());
        let home = match (berth_home, get("XDG_DATA_HOME"), get("HOME")) {
            (Some(home), _, _) => PathBuf::from(home),
            (None, Some(data), _) => PathBuf::from(data).join("berth"),
            (None, None, Some(user_home)) => PathBuf::from(user_home).join(".local/share/berth"),
            (None, None, None) => bail!("cannot place berth's state: set BERTH_HOME or HOME"),
        };
        // Absolute from here on: sandboxes, the reaper and the store are reached from other
        // working directories (a command's cwd is its workspace), where a relative home names
        // somewhere else.
        let home = std::path::absolute(&home)
            .with_context(|| format!("cannot place berth's state at {}", home.display()))?;
        if home.to_str().is_none() {
            // SQLite takes only UTF-8 file names: refused here, before anything is created.
            return Err(crate::errors::CliError::setup(
                format!("berth's home {} is not a UTF-8 path", home.display()),
                "set BERTH_HOME to a directory whose path is UTF-8",
            )
            .into());
        }
        let owner = match get("BERTH_OWNER") {
            Some(owner) => owner,
            None => {
                let user = get("USER")
                    .or_else(|| get("LOGNAME"))
                    .unwrap_or_else(|| "user".into());
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_else(|_| "localhost".into());
                format!("{user}@{host}")
            }
        };
        let fault = match get("BERTH_FAULT").as_deref() {
            None => None,
            // Mission, move and session boundaries are read by those commands themselves.
            Some(f)
                if f.starts_with("kill-before-event:")
                    || f.starts_with("kill-after-event:")
                    || f.starts_with("kill-in-publication:")
                    || f.starts_with("kill-in-move:")
                    || f.starts_with("term-in-move:")
                    || f.starts_with("kill-in-session:") =>
            {
                None
            }
            Some("panic-after-create") => Some(Fault::PanicAfterCreate),
            Some("error-after-create") => Some(Fault::ErrorAfterCreate),
            Some(other) => bail!(
                "BERTH_FAULT=`{other}` is not a fault point (panic-after-create, error-after-create)"
            ),
        };
        let colour_allowed =
            !vars.iter().any(|(k, _)| k == "NO_COLOR") && get("TERM").as_deref() != Some("dumb");
        Ok(Config {
            home,
            owner,
            env: Environment::from_vars(vars),
            fault,
            colour_allowed,
        })
    }

    /// The SQLite database.
    pub fn database(&self) -> PathBuf {
        self.home.join("berth.db")
    }

    /// Providers' state root.
    pub fn state_dir(&self) -> PathBuf {
        self.home.join("state")
    }
}
