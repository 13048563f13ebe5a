//! How an agent in a sandbox reaches the mission's gateway, and where its CLI is.

use std::path::PathBuf;
use std::time::Duration;

use berth_gateway::RunningGateway;
use berth_harness::Harness;

/// The variable naming the host directory that holds the CLIs (host provider), when they are
/// not on `PATH`.
pub const AGENT_BIN_DIR_VAR: &str = "BERTH_AGENT_BIN_DIR";

/// The loopback port inside an isolated sandbox where the agent finds the model gateway
/// (forwarded to the host through the provider's loopback forward).
pub const SANDBOX_GATEWAY_PORT: u16 = 47_800;

/// Where the reference image variant with the agent CLIs keeps them
/// (`scripts/build-agent-clis-image.sh`, `berth/agent-clis:bookworm`).
pub const IMAGE_AGENT_BIN_DIR: &str = "/opt/berth/agents/bin";

/// How an agent in a provider's sandbox reaches the model gateway on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayReach {
    /// The sandbox shares the host's network (isolation `none`): the gateway's own port.
    SharedLoopback,
    /// The sandbox has its own network namespace: a loopback port inside it, forwarded to the
    /// gateway (the provider's `loopback_forward`); nothing else is reachable.
    Forwarded,
}

impl GatewayReach {
    /// How `manifest`'s sandboxes reach the gateway, or why they cannot.
    pub fn of(manifest: &berth_manifest::ProviderManifest) -> Result<GatewayReach, String> {
        use berth_contract::{Capability, Support};
        use berth_manifest::IsolationClass;
        if manifest.isolation.class == IsolationClass::None {
            return Ok(GatewayReach::SharedLoopback);
        }
        match manifest.capabilities.get(&Capability::LoopbackForward) {
            Some(Support::Supported) => Ok(GatewayReach::Forwarded),
            _ => Err(format!(
                "agent CLIs cannot run on provider `{}`: its sandboxes have their own network and \
                 it does not forward a loopback port to the host (loopback_forward), so the model \
                 gateway is out of reach",
                manifest.id
            )),
        }
    }
}

/// A sandbox's way to the gateway for one agent run; a forward stops when this is dropped.
#[derive(Debug)]
pub struct GatewayLink {
    /// The gateway's base URL as seen from inside the sandbox.
    pub url: String,
    forward: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for GatewayLink {
    fn drop(&mut self) {
        if let Some(task) = self.forward.take() {
            task.abort();
        }
    }
}

/// Opens sandbox `id`'s way to `running` (see [`GatewayReach`]).
pub async fn link_gateway(
    provider: &dyn berth_contract::Provider,
    id: &berth_contract::NativeId,
    reach: GatewayReach,
    running: &RunningGateway,
) -> berth_contract::Result<GatewayLink> {
    use berth_contract::{ErrorKind, ProviderExt};
    if reach == GatewayReach::SharedLoopback {
        return Ok(GatewayLink {
            url: running.base_url(),
            forward: None,
        });
    }
    let forward = provider.require_loopback_forward()?;
    // An earlier run's forward on the same port may still be closing inside the sandbox.
    let mut tries = 0;
    let mut port = loop {
        match forward.forward_loopback(id, SANDBOX_GATEWAY_PORT).await {
            Err(e) if e.kind() == ErrorKind::Conflict && tries < 40 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other?,
        }
    };
    let connections = running.connections();
    let task = tokio::spawn(async move {
        // Ends when the sandbox or the gateway goes away, or when the link is dropped.
        while let Ok(stream) = port.accept().await {
            if connections.serve(stream).is_err() {
                break;
            }
        }
    });
    Ok(GatewayLink {
        url: format!("http://127.0.0.1:{SANDBOX_GATEWAY_PORT}"),
        forward: Some(task),
    })
}

/// Where `harness`'s CLI is, as the sandbox sees it. A sandbox on the host's network runs the
/// host's CLIs: [`AGENT_BIN_DIR_VAR`] or `PATH` (from Berth's environment). An isolated sandbox
/// runs its image's, at [`IMAGE_AGENT_BIN_DIR`] (the launch line fails plainly when the image
/// has none there).
pub fn agent_bin_dir(
    env: &berth_factory::Environment,
    reach: GatewayReach,
    harness: Harness,
) -> Result<String, String> {
    if reach == GatewayReach::Forwarded {
        return Ok(IMAGE_AGENT_BIN_DIR.to_owned());
    }
    let mut search: Vec<PathBuf> = env
        .get(AGENT_BIN_DIR_VAR)
        .filter(|d| !d.is_empty())
        .map(|d| vec![PathBuf::from(d)])
        .unwrap_or_default();
    search.extend(
        env.get("PATH")
            .unwrap_or_default()
            .split(':')
            .filter(|p| p.starts_with('/'))
            .map(PathBuf::from),
    );
    search
        .into_iter()
        .find(|dir| dir.join(harness.program()).is_file())
        .map(|dir| dir.display().to_string())
        .ok_or_else(|| {
            format!(
                "`{}` was found neither in {AGENT_BIN_DIR_VAR} nor on PATH (install the pinned \
                 CLIs with scripts/install-agent-clis and set {AGENT_BIN_DIR_VAR} to \
                 agents/node_modules/.bin)",
                harness.program()
            )
        })
}
