//! The `host` provider: each sandbox is a workspace directory under Berth's state dir and each
//! exec is a plain host process group in it. It isolates nothing, and its manifest says so.
//!
//! The workspace machinery (files, snapshots, fork, listing, process-group exec, destroy) is
//! shared with other local providers in `berth-local`; this crate only says how a command
//! starts: directly, with the workspace's host path as `HOME`.

use berth_contract::Result;
use berth_local::{LaunchContext, Launcher, LocalProvider};

pub use berth_local::LocalConfig as HostConfig;

/// The provider id.
pub const PROVIDER_ID: &str = "host";

/// Starts commands directly on the host.
#[derive(Debug, Clone, Copy, Default)]
pub struct Direct;

impl Launcher for Direct {
    fn id(&self) -> &'static str {
        PROVIDER_ID
    }

    fn workspace_alias(&self) -> Option<&'static str> {
        None
    }

    fn command(&self, ctx: &LaunchContext<'_>) -> Result<tokio::process::Command> {
        berth_local::direct_command(ctx.command)
    }

    fn interactive(&self) -> bool {
        true
    }

    /// The host provider has no network of its own: its loopback is this machine's.
    fn shares_host_loopback(&self, _network: berth_contract::NetworkMode) -> bool {
        true
    }
}

/// The host provider.
pub type HostProvider = LocalProvider<Direct>;

/// A host provider keeping its sandboxes under `state_dir`.
pub fn new(state_dir: impl Into<std::path::PathBuf>, config: HostConfig) -> Result<HostProvider> {
    LocalProvider::new(state_dir, config, Direct)
}
