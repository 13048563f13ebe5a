//! Capabilities are data: an enum, declared tri-state in each provider's manifest and checked
//! against what the adapter implements when it is constructed.

use std::collections::BTreeSet;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An optional capability group of the provider contract.
///
/// The required core (create, observe, buffered exec, destroy) is not listed: every provider has
/// it. Everything here is reachable only through the matching accessor on
/// [`Provider`](crate::Provider), which returns `None` when the adapter does not implement it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Capability {
    /// Output chunks delivered while the command runs.
    ExecStreaming,
    /// Launch a process that outlives the call, then poll and kill it.
    ExecDetached,
    /// Read, write and list files, binary-safe.
    Files,
    /// Cold stop and start: processes gone, filesystem kept.
    StopStart,
    /// Suspend and resume with memory kept.
    SuspendResume,
    /// Filesystem snapshot, restorable into a new sandbox.
    FilesystemSnapshot,
    /// Memory (process) snapshot.
    MemorySnapshot,
    /// Fork a running sandbox into a new one.
    Fork,
    /// List sandboxes by label.
    Listing,
    /// Interactive terminals and connections to the sandbox's ports (`berth ssh`, `berth port`).
    Access,
    /// Provider-enforced time-to-live teardown.
    Ttl,
    /// Connections to a loopback port inside a sandbox that has no network, handed to the
    /// caller on the host (how an agent reaches Berth's model gateway and nothing else).
    LoopbackForward,
}

impl Capability {
    /// Every capability, in declaration order.
    pub const ALL: [Capability; 12] = [
        Capability::ExecStreaming,
        Capability::ExecDetached,
        Capability::Files,
        Capability::StopStart,
        Capability::SuspendResume,
        Capability::FilesystemSnapshot,
        Capability::MemorySnapshot,
        Capability::Fork,
        Capability::Listing,
        Capability::Access,
        Capability::Ttl,
        Capability::LoopbackForward,
    ];

    /// The snake_case name used in manifests, JSON and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::ExecStreaming => "exec_streaming",
            Capability::ExecDetached => "exec_detached",
            Capability::Files => "files",
            Capability::StopStart => "stop_start",
            Capability::SuspendResume => "suspend_resume",
            Capability::FilesystemSnapshot => "filesystem_snapshot",
            Capability::MemorySnapshot => "memory_snapshot",
            Capability::Fork => "fork",
            Capability::Listing => "listing",
            Capability::Access => "access",
            Capability::Ttl => "ttl",
            Capability::LoopbackForward => "loopback_forward",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a manifest declares about one capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Support {
    /// The provider supports it and the adapter implements it.
    Supported,
    /// The provider (or this adapter) does not support it; calls answer `Unsupported`.
    Unsupported,
    /// Nobody has established it yet. Stays unknown until evidence says otherwise.
    Unknown,
}

/// A set of capabilities, e.g. the ones an adapter implements.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilitySet(BTreeSet<Capability>);

impl CapabilitySet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a capability.
    pub fn insert(&mut self, capability: Capability) {
        self.0.insert(capability);
    }

    /// Whether the set holds `capability`.
    pub fn contains(&self, capability: Capability) -> bool {
        self.0.contains(&capability)
    }

    /// The capabilities in order.
    pub fn iter(&self) -> impl Iterator<Item = Capability> + '_ {
        self.0.iter().copied()
    }
}

impl FromIterator<Capability> for CapabilitySet {
    fn from_iter<T: IntoIterator<Item = Capability>>(iter: T) -> Self {
        Self(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_serde() {
        for capability in Capability::ALL {
            let json = serde_json::to_string(&capability).unwrap();
            assert_eq!(json, format!("\"{}\"", capability.as_str()));
            let back: Capability = serde_json::from_str(&json).unwrap();
            assert_eq!(back, capability);
        }
    }

    #[test]
    fn unknown_capability_name_is_rejected() {
        let err = serde_json::from_str::<Capability>("\"teleport\"").unwrap_err();
        assert!(err.to_string().contains("unknown variant"), "{err}");
    }
}
