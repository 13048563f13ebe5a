//! Shared machinery of Berth's local providers (`host`, `bwrap`): a sandbox is a workspace
//! directory under the provider's state dir, and a [`Launcher`] decides how commands start.
//!
//! - [`LocalProvider`] (`provider`) — the contract over the workspace, for any launcher.
//! - `layout` — where things live under the state dir, and sandbox metadata (versioned).
//! - `confine` — resolving sandbox paths without escaping the workspace.
//! - `process` — process-group exec with timeouts, output caps and leftover cleanup.
//! - `archive` — deterministic, content-addressed workspace archives.
//! - `classify` — the one place local I/O errors become [`berth_contract::ErrorKind`]s.

mod access;
mod archive;
mod classify;
mod confine;
mod layout;
mod newfile;
mod process;
mod provider;

pub use process::Finished;
pub use provider::{LaunchContext, Launcher, LocalConfig, LocalProvider};

/// Placeholder provider id on errors raised by the shared machinery; [`LocalProvider`]
/// replaces it with the launcher's id before an error leaves the crate.
pub(crate) const PROVIDER_ID: &str = "local";

/// Builds a command that runs directly on the host (argv, or `sh -c` for a shell line).
pub fn direct_command(
    command: &berth_contract::Command,
) -> berth_contract::Result<tokio::process::Command> {
    process::direct(command)
}
