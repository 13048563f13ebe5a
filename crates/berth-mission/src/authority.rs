//! The mission authority: a pure state machine over [`MissionRecord`]s.
//!
//! Invariants (property-tested):
//! - only [`apply`] changes a record, and it refuses every transition the rules do not allow;
//! - attempt keys are `hash(mission, task, ordinal)` and nothing else;
//! - at most one attempt is in progress per task, only the current task has one, and no task
//!   has more than `max_attempts` attempts;
//! - a task is done only when its accepted attempt has a commit, a restorable checkpoint and a
//!   completed finalization;
//! - a validator pass without every declared piece of evidence is a rejection (vacuous);
//! - a rejection is recorded with its reason; the last allowed rejection exhausts the task and
//!   fails the mission; a finished mission (succeeded or failed) accepts no further event.
//!
//! Replaying an event already applied (at-least-once delivery after a crash) is a no-op, never
//! a second transition.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Deterministic attempt identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AttemptKey(pub String);

impl fmt::Display for AttemptKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `hash(mission, task, ordinal)`: nothing else goes in, so a retry of the same attempt after a
/// crash has the same key, and a sandbox named from it can be adopted.
pub fn attempt_key(mission: &str, task: &str, ordinal: u32) -> AttemptKey {
    let mut hasher = Sha256::new();
    for part in ["berth.attempt/v1", mission, task] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hasher.update(ordinal.to_be_bytes());
    AttemptKey(format!("at-{}", &hex::encode(hasher.finalize())[..24]))
}

/// What an attempt ran with; recorded at start and checked when a mission resumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptInputs {
    /// Provider id.
    pub provider: String,
    /// Image, when the provider has one.
    pub image: Option<String>,
    /// Harness kind and version.
    pub harness: String,
    /// Hash of the validator (command, timeout, evidence).
    pub validator: String,
}

/// Pipeline phases, in order. An attempt moves forward only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The attempt is claimed; no side effect yet.
    Claimed,
    /// Its sandbox exists (created or adopted).
    SandboxReady,
    /// The repository is staged at the base commit.
    Staged,
    /// The agent ran and its process group is stopped.
    AgentStopped,
    /// The workspace is captured: taken out of the sandbox as data and committed on the host
    /// (the commit the validator will judge).
    Frozen,
}

/// Where an attempt stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum AttemptStatus {
    /// Moving through the pipeline.
    InProgress {
        /// The last phase reached.
        phase: Phase,
    },
    /// The validator accepted it; finalization gates pending or met.
    Accepted {
        /// Evidence the validator produced.
        evidence: Vec<String>,
        /// Commit made in the workspace.
        commit: Option<String>,
        /// Restorable checkpoint reference.
        checkpoint: Option<String>,
        /// The attempt's artifact bundle, once indexed (finalization waits for it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bundle: Option<String>,
        /// Finalization completed.
        finalized: bool,
    },
    /// Rejected, with the reason. Terminal for the attempt.
    Rejected {
        /// Why.
        reason: String,
    },
}

/// One attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Its key.
    pub key: AttemptKey,
    /// 1-based ordinal within the task.
    pub ordinal: u32,
    /// What it ran with.
    pub inputs: AttemptInputs,
    /// Where it stands.
    pub status: AttemptStatus,
}

/// Where a task stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum TaskState {
    /// Not started, or between attempts.
    Open,
    /// Its accepted attempt passed every gate.
    Done {
        /// The accepted attempt.
        accepted: AttemptKey,
    },
    /// Every allowed attempt was rejected. Terminal.
    Exhausted,
}

/// One task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Task id from the mission file.
    pub id: String,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Evidence the validator must produce for a pass to count.
    pub required_evidence: Vec<String>,
    /// Attempts so far.
    pub attempts: Vec<AttemptRecord>,
    /// State.
    pub state: TaskState,
}

/// Where a mission stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum MissionState {
    /// Tasks remain.
    Running,
    /// Every task is done. Terminal.
    Succeeded,
    /// A task was exhausted. Terminal.
    Failed {
        /// The exhausted task.
        task: String,
    },
    /// Someone ended it before it finished ([`Event::Cancel`]). Terminal. An attempt that was
    /// in progress keeps its status: it got no verdict.
    Cancelled {
        /// Why, as given.
        reason: String,
    },
}

/// A mission's authoritative record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissionRecord {
    /// Mission id.
    pub id: String,
    /// Ordered tasks.
    pub tasks: Vec<TaskRecord>,
    /// State.
    pub state: MissionState,
}

/// Something that happened, reported to the authority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Claim the next attempt of the current task.
    Start {
        /// Task id.
        task: String,
        /// Inputs of this attempt.
        inputs: AttemptInputs,
    },
    /// A pipeline phase completed.
    Reached {
        /// Attempt.
        key: AttemptKey,
        /// Phase.
        phase: Phase,
    },
    /// The validator passed and produced this evidence.
    ValidatorPassed {
        /// Attempt.
        key: AttemptKey,
        /// Evidence produced.
        evidence: Vec<String>,
    },
    /// The attempt is rejected (validator failed, timed out, or the pipeline failed).
    Rejected {
        /// Attempt.
        key: AttemptKey,
        /// Why.
        reason: String,
    },
    /// The accepted work was committed.
    Committed {
        /// Attempt.
        key: AttemptKey,
        /// Commit id.
        commit: String,
    },
    /// A restorable checkpoint exists.
    Checkpointed {
        /// Attempt.
        key: AttemptKey,
        /// Checkpoint reference.
        checkpoint: String,
    },
    /// The attempt's artifact bundle is published and indexed.
    Published {
        /// Attempt.
        key: AttemptKey,
        /// Bundle id.
        bundle: String,
    },
    /// Finalization completed.
    Finalized {
        /// Attempt.
        key: AttemptKey,
    },
    /// The mission is ended where it stands, whatever its tasks and attempts.
    Cancel {
        /// Why.
        reason: String,
    },
}

/// A refused transition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthorityError {
    /// The mission has finished.
    #[error("mission `{0}` has finished; no further transition is allowed")]
    Finished(String),
    /// The task is not the one the mission is on.
    #[error("task `{task}` is not the current task (`{current}`)")]
    NotCurrentTask {
        /// Asked for.
        task: String,
        /// Current.
        current: String,
    },
    /// An attempt is already in progress.
    #[error("task `{task}` already has attempt {key} in progress")]
    AttemptInProgress {
        /// Task.
        task: String,
        /// The attempt in progress.
        key: AttemptKey,
    },
    /// No such attempt.
    #[error("no attempt {0}")]
    UnknownAttempt(AttemptKey),
    /// The event does not fit the attempt's state.
    #[error("attempt {key}: {reason}")]
    Refused {
        /// Attempt.
        key: AttemptKey,
        /// Why.
        reason: String,
    },
}

impl MissionRecord {
    /// A fresh mission: `(task id, max attempts, required evidence)`.
    pub fn new(id: &str, tasks: Vec<(String, u32, Vec<String>)>) -> MissionRecord {
        MissionRecord {
            id: id.to_owned(),
            tasks: tasks
                .into_iter()
                .map(|(id, max_attempts, required_evidence)| TaskRecord {
                    id,
                    max_attempts: max_attempts.max(1),
                    required_evidence,
                    attempts: Vec::new(),
                    state: TaskState::Open,
                })
                .collect(),
            state: MissionState::Running,
        }
        .settled()
    }

    /// The task the mission is on, if it is running.
    pub fn current_task(&self) -> Option<&TaskRecord> {
        match self.state {
            MissionState::Running => self.tasks.iter().find(|t| t.state == TaskState::Open),
            _ => None,
        }
    }

    /// The attempt in progress (not rejected, not finalized) on the current task.
    pub fn open_attempt(&self) -> Option<&AttemptRecord> {
        self.current_task()?
            .attempts
            .iter()
            .find(|a| is_open(&a.status))
    }

    fn settled(mut self) -> Self {
        if self.state == MissionState::Running
            && self
                .tasks
                .iter()
                .all(|t| matches!(t.state, TaskState::Done { .. }))
        {
            self.state = MissionState::Succeeded;
        }
        self
    }
}

fn is_open(status: &AttemptStatus) -> bool {
    match status {
        AttemptStatus::InProgress { .. } => true,
        AttemptStatus::Accepted { finalized, .. } => !finalized,
        AttemptStatus::Rejected { .. } => false,
    }
}

/// What a tick should do next for this mission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Claim a new attempt (the one new agent submission this tick may make).
    Start {
        /// Task id.
        task: String,
        /// Its key.
        key: AttemptKey,
    },
    /// Continue (recover, reconcile or finalize) an attempt already claimed.
    Continue {
        /// Attempt.
        key: AttemptKey,
        /// Its status.
        status: AttemptStatus,
    },
    /// Nothing: the mission has finished.
    Finished(MissionState),
}

/// The next step for a tick.
pub fn next(mission: &MissionRecord) -> Next {
    if mission.state != MissionState::Running {
        return Next::Finished(mission.state.clone());
    }
    match (mission.current_task(), mission.open_attempt()) {
        (_, Some(open)) => Next::Continue {
            key: open.key.clone(),
            status: open.status.clone(),
        },
        (Some(task), None) => Next::Start {
            task: task.id.clone(),
            key: attempt_key(&mission.id, &task.id, task.attempts.len() as u32 + 1),
        },
        (None, None) => Next::Finished(mission.state.clone()),
    }
}

fn refused(key: &AttemptKey, reason: impl Into<String>) -> AuthorityError {
    AuthorityError::Refused {
        key: key.clone(),
        reason: reason.into(),
    }
}

/// Applies one event: the only way a mission record changes.
pub fn apply(mission: &MissionRecord, event: &Event) -> Result<MissionRecord, AuthorityError> {
    if mission.state != MissionState::Running {
        return Err(AuthorityError::Finished(mission.id.clone()));
    }
    let mut next = mission.clone();
    if let Event::Cancel { reason } = event {
        next.state = MissionState::Cancelled {
            reason: reason.clone(),
        };
        return Ok(next);
    }
    let current = next
        .tasks
        .iter()
        .position(|t| t.state == TaskState::Open)
        .expect("a running mission has an open task");
    if let Event::Start { task, inputs } = event {
        let record = &mut next.tasks[current];
        if *task != record.id {
            return Err(AuthorityError::NotCurrentTask {
                task: task.clone(),
                current: record.id.clone(),
            });
        }
        if let Some(open) = record.attempts.iter().find(|a| is_open(&a.status)) {
            return Err(AuthorityError::AttemptInProgress {
                task: task.clone(),
                key: open.key.clone(),
            });
        }
        let ordinal = record.attempts.len() as u32 + 1;
        // Exhaustion is applied when the last rejection lands, so this cannot exceed the bound.
        debug_assert!(ordinal <= record.max_attempts);
        record.attempts.push(AttemptRecord {
            key: attempt_key(&mission.id, task, ordinal),
            ordinal,
            inputs: inputs.clone(),
            status: AttemptStatus::InProgress {
                phase: Phase::Claimed,
            },
        });
        return Ok(next);
    }
    let key = match event {
        Event::Reached { key, .. }
        | Event::ValidatorPassed { key, .. }
        | Event::Rejected { key, .. }
        | Event::Committed { key, .. }
        | Event::Checkpointed { key, .. }
        | Event::Published { key, .. }
        | Event::Finalized { key } => key,
        Event::Start { .. } | Event::Cancel { .. } => unreachable!("handled above"),
    };
    let task = &mut next.tasks[current];
    let required = task.required_evidence.clone();
    let max = task.max_attempts;
    let Some(attempt) = task.attempts.iter_mut().find(|a| &a.key == key) else {
        return Err(AuthorityError::UnknownAttempt(key.clone()));
    };
    let attempts_made = attempt.ordinal;
    match (&mut attempt.status, event) {
        (AttemptStatus::InProgress { phase }, Event::Reached { phase: to, .. }) => {
            if *to < *phase {
                return Err(refused(
                    key,
                    format!("cannot go back from {phase:?} to {to:?}"),
                ));
            }
            *phase = *to;
        }
        (AttemptStatus::InProgress { phase }, Event::ValidatorPassed { evidence, .. }) => {
            if *phase != Phase::Frozen {
                return Err(refused(
                    key,
                    "the validator runs only on a frozen workspace",
                ));
            }
            let missing: Vec<&String> = required.iter().filter(|r| !evidence.contains(r)).collect();
            attempt.status = if missing.is_empty() {
                AttemptStatus::Accepted {
                    evidence: evidence.clone(),
                    commit: None,
                    checkpoint: None,
                    bundle: None,
                    finalized: false,
                }
            } else {
                AttemptStatus::Rejected {
                    reason: format!(
                        "vacuous pass: the validator did not produce {}",
                        missing
                            .iter()
                            .map(|m| format!("`{m}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
            };
        }
        (AttemptStatus::InProgress { .. }, Event::Rejected { reason, .. }) => {
            attempt.status = AttemptStatus::Rejected {
                reason: reason.clone(),
            };
        }
        (
            AttemptStatus::Accepted {
                commit,
                finalized: false,
                ..
            },
            Event::Committed { commit: c, .. },
        ) => match commit {
            Some(existing) if existing != c => {
                return Err(refused(key, format!("already committed as {existing}")))
            }
            _ => *commit = Some(c.clone()),
        },
        (
            AttemptStatus::Accepted {
                commit,
                checkpoint,
                finalized: false,
                ..
            },
            Event::Checkpointed { checkpoint: cp, .. },
        ) => {
            if commit.is_none() {
                return Err(refused(key, "checkpoint before commit"));
            }
            *checkpoint = Some(cp.clone());
        }
        (
            AttemptStatus::Accepted {
                checkpoint,
                bundle,
                finalized: false,
                ..
            },
            Event::Published { bundle: b, .. },
        ) => {
            if checkpoint.is_none() {
                return Err(refused(key, "publication before the checkpoint"));
            }
            match bundle {
                Some(existing) if existing != b => {
                    return Err(refused(key, format!("already published as {existing}")))
                }
                _ => *bundle = Some(b.clone()),
            }
        }
        (
            AttemptStatus::Accepted {
                commit,
                checkpoint,
                bundle,
                finalized,
                ..
            },
            Event::Finalized { .. },
        ) => {
            if commit.is_none() || checkpoint.is_none() {
                return Err(refused(
                    key,
                    "finalization needs a commit and a restorable checkpoint",
                ));
            }
            if bundle.is_none() {
                return Err(refused(
                    key,
                    "finalization needs the attempt's artifact bundle indexed",
                ));
            }
            *finalized = true;
        }
        // Replays of what already happened are no-ops.
        (AttemptStatus::Accepted { .. }, Event::ValidatorPassed { .. })
        | (AttemptStatus::Rejected { .. }, Event::Rejected { .. }) => return Ok(mission.clone()),
        (status, event) => {
            return Err(refused(
                key,
                format!("{event:?} does not apply to {status:?}"),
            ))
        }
    }
    // Task and mission consequences.
    let attempt = task
        .attempts
        .iter()
        .find(|a| &a.key == key)
        .expect("just updated");
    match &attempt.status {
        AttemptStatus::Accepted {
            finalized: true, ..
        } => {
            task.state = TaskState::Done {
                accepted: key.clone(),
            };
        }
        AttemptStatus::Rejected { .. } if attempts_made >= max => {
            task.state = TaskState::Exhausted;
            next.state = MissionState::Failed {
                task: task.id.clone(),
            };
        }
        _ => {}
    }
    Ok(next.settled())
}

#[cfg(test)]
#[path = "authority_tests.rs"]
mod tests;
