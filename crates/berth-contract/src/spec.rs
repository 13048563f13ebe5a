//! Create requests and ids.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Labels;

/// Berth's own name for a sandbox (`bx-…`). Chosen before create so the ledger row exists
/// before any side effect, and used by providers to name the native resource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SandboxName(pub String);

/// The provider's own id for a sandbox (a container id, a directory name, a VM id).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NativeId(pub String);

impl fmt::Display for SandboxName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for NativeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Network access for a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// No network (the default where the provider can enforce it).
    #[default]
    None,
    /// Outbound network through a network of the sandbox's own (the provider's default
    /// bridge); the host's loopback services are not reachable through it.
    Bridge,
    /// The host's own network namespace, loopback services included: no network isolation.
    Host,
}

/// Resource limits. `None` means the provider's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    /// CPUs (fractional allowed).
    pub cpus: Option<f64>,
    /// Memory in MiB.
    pub memory_mib: Option<u64>,
    /// Maximum number of processes.
    pub pids: Option<u64>,
}

/// Everything a provider needs to create a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateRequest {
    /// Berth's name for the sandbox.
    pub name: SandboxName,
    /// Labels the resource must carry.
    pub labels: Labels,
    /// Image or template, for providers that have them.
    pub image: Option<String>,
    /// Resource limits.
    pub resources: Resources,
    /// Network access.
    pub network: NetworkMode,
    /// Extra non-secret metadata labels.
    pub extra_labels: BTreeMap<String, String>,
}

impl CreateRequest {
    /// A request with defaults for everything but name and labels.
    pub fn new(name: SandboxName, labels: Labels) -> Self {
        CreateRequest {
            name,
            labels,
            image: None,
            resources: Resources::default(),
            network: NetworkMode::default(),
            extra_labels: BTreeMap::new(),
        }
    }
}

/// What create returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Created {
    /// The provider's id.
    pub native_id: NativeId,
    /// The raw provider state right after create.
    pub raw_state: String,
}
