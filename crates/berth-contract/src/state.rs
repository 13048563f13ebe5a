//! Canonical lifecycle states. The raw provider state is always kept beside the canonical one,
//! and an unmapped state is `Unknown`, never `Running`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Provider-independent lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CanonicalState {
    /// Being created.
    Creating,
    /// Ready for exec.
    Running,
    /// Stop requested, not settled.
    Stopping,
    /// Stopped cold: no processes, filesystem kept.
    Stopped,
    /// Suspend requested, not settled.
    Suspending,
    /// Suspended with memory kept.
    Suspended,
    /// A snapshot is being taken.
    Snapshotting,
    /// The provider reports a failure state.
    Failed,
    /// Terminal: destroyed or deleted but still visible (e.g. soft-deleted rows).
    Gone,
    /// The provider's state could not be mapped.
    Unknown,
}

impl CanonicalState {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            CanonicalState::Creating => "creating",
            CanonicalState::Running => "running",
            CanonicalState::Stopping => "stopping",
            CanonicalState::Stopped => "stopped",
            CanonicalState::Suspending => "suspending",
            CanonicalState::Suspended => "suspended",
            CanonicalState::Snapshotting => "snapshotting",
            CanonicalState::Failed => "failed",
            CanonicalState::Gone => "gone",
            CanonicalState::Unknown => "unknown",
        }
    }
}

impl fmt::Display for CanonicalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What observe saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "presence", rename_all = "snake_case")]
pub enum Observation {
    /// The provider positively reports no such sandbox.
    Absent,
    /// The sandbox exists (possibly soft-deleted).
    Present {
        /// Canonical state.
        state: CanonicalState,
        /// The provider's own state string, unmodified.
        raw: String,
        /// Whether the provider still lists it after deletion.
        soft_deleted: bool,
        /// Labels as the provider reports them (empty when it cannot report labels).
        labels: BTreeMap<String, String>,
    },
}

impl Observation {
    /// Absent, or present only as a soft-deleted/terminal row.
    pub fn is_gone(&self) -> bool {
        match self {
            Observation::Absent => true,
            Observation::Present {
                state,
                soft_deleted,
                ..
            } => *soft_deleted || *state == CanonicalState::Gone,
        }
    }
}

/// What destroy achieved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DestroyOutcome {
    /// Observe confirmed the sandbox gone.
    VerifiedGone {
        /// It was already absent before this call.
        already_absent: bool,
    },
    /// The provider accepted the request but gone-ness is not verified yet; the ledger keeps
    /// checking.
    Accepted {
        /// The raw state last seen.
        raw_state: String,
    },
}

/// What a power transition achieved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "transition", rename_all = "snake_case")]
pub enum Transition {
    /// The target state was observed.
    Settled {
        /// The state observed.
        state: CanonicalState,
    },
    /// Accepted, not yet settled.
    Accepted {
        /// The raw state last seen.
        raw_state: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gone_means_absent_or_terminal() {
        assert!(Observation::Absent.is_gone());
        let present = |state, soft_deleted| Observation::Present {
            state,
            raw: "x".into(),
            soft_deleted,
            labels: BTreeMap::new(),
        };
        assert!(!present(CanonicalState::Running, false).is_gone());
        assert!(present(CanonicalState::Running, true).is_gone());
        assert!(present(CanonicalState::Gone, false).is_gone());
        assert!(!present(CanonicalState::Unknown, false).is_gone());
    }
}
