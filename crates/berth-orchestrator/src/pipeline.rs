//! The attempt pipeline, one durable step per call.

use std::sync::Arc;
use std::time::Duration;

use berth_contract::{
    CanonicalState, DestroyOutcome, ErrorKind, NativeId, Observation, Provider, ProviderError,
    SandboxName,
};
use berth_ledger::LedgerError;
use berth_mission::authority::{
    AttemptInputs, AttemptKey, AttemptStatus, Event, MissionRecord, MissionState, Phase,
};
use berth_mission::file::Task;
use berth_store::{LedgerState, LedgerStore as _, StoreError};
use serde_json::json;
use sha2::{Digest, Sha256};

pub(crate) use crate::attempt_files::{
    attempt_bundle, attempt_patch, attempt_ref, final_bundle, output_json, redacted_tail, tail,
};
use crate::steps::Attempt;
use crate::{MissionSpec, Orchestrator, OrchestratorError};

mod sandboxes;
pub(crate) use sandboxes::*;

/// What one tick did.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A new attempt was claimed (the tick's one new submission).
    Claimed {
        /// Task.
        task: String,
        /// Attempt.
        key: AttemptKey,
    },
    /// An attempt moved forward.
    Advanced {
        /// Attempt.
        key: AttemptKey,
        /// What happened, in words.
        what: String,
    },
    /// An attempt was rejected (durably, with its reason).
    Rejected {
        /// Attempt.
        key: AttemptKey,
        /// Why.
        reason: String,
    },
    /// The mission has finished.
    Finished(MissionState),
}

/// Why a step could not do its work.
///
/// Either the attempt is rejected (its own doing, or a condition no retry changes), or a
/// provider call the step needs failed in a way the provider calls retryable — its daemon
/// unreachable, a timeout, no capacity — which is no verdict on the attempt: the run stops with
/// nothing recorded for the step, and `berth mission resume` runs the step again.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Reject the attempt, for this reason.
    Reject(String),
    /// Stop the run: `doing` (words) met a retryable provider error.
    Retry {
        /// What the step was doing.
        doing: String,
        /// The provider's error.
        source: ProviderError,
    },
    /// The provider cannot take the sandbox for a reason another provider may not share (no
    /// capacity, quota, a rate limit, unavailable), and no retry of its own is due: the next
    /// fallback candidate is tried; with none left, the attempt is rejected with it.
    Fallback(ProviderError),
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Failure::Reject(reason)
    }
}

impl Failure {
    /// The provider's error `source`, met while `doing`: a retryable one stops the run, any
    /// other rejects the attempt with both in its reason.
    pub(crate) fn of(doing: impl std::fmt::Display, source: ProviderError) -> Failure {
        if source.retryable() {
            Failure::Retry {
                doing: doing.to_string(),
                source,
            }
        } else {
            Failure::Reject(format!("{doing}: {source}"))
        }
    }
}

/// The inputs an attempt runs with (its lock record).
pub(crate) fn inputs(spec: &MissionSpec, task_id: &str) -> AttemptInputs {
    let task = spec
        .file
        .tasks
        .iter()
        .find(|t| t.id == task_id)
        .expect("task exists");
    let mut hasher = Sha256::new();
    for part in [&task.validator.command, &task.validator.timeout] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    for evidence in &task.validator.evidence {
        hasher.update(evidence.as_bytes());
        hasher.update([0]);
    }
    if let Some(setup) = &task.validator.setup {
        hasher.update(b"setup\0");
        hasher.update(setup.as_bytes());
    }
    AttemptInputs {
        provider: spec.file.sandbox.provider.clone(),
        image: spec.file.sandbox.image.clone(),
        harness: harness_input(spec),
        validator: format!("sha256:{}", hex::encode(hasher.finalize())),
    }
}

/// The harness an attempt runs with, as its lock record names it: the script's command, or
/// the agent CLI's pinned version, model and what answers it (the scripted model's hash, or the
/// proxy's origin).
fn harness_input(spec: &MissionSpec) -> String {
    let harness = &spec.file.harness;
    let Some(cli) = berth_harness::Harness::parse(&harness.kind) else {
        return format!("script/{}", harness.command.as_deref().unwrap_or_default());
    };
    let (package, version) = cli.pinned();
    let answered_by = match (
        &spec.model_script,
        harness.gateway.as_ref().and_then(|g| g.proxy.as_ref()),
    ) {
        (Some(script), _) => format!(
            "scripted:sha256:{}",
            hex::encode(Sha256::digest(script.as_bytes()))
        ),
        (None, Some(origin)) => format!("proxy:{origin}"),
        (None, None) => "unknown".into(),
    };
    format!(
        "{}/{package}@{version}/model={}/{answered_by}",
        cli.as_str(),
        harness.model_name()
    )
}

pub(crate) fn task_of<'s>(spec: &'s MissionSpec, record: &MissionRecord) -> (usize, &'s Task) {
    let current = record
        .current_task()
        .expect("an attempt in progress has a current task");
    let index = record
        .tasks
        .iter()
        .position(|t| t.id == current.id)
        .expect("present");
    (
        index,
        spec.file
            .tasks
            .iter()
            .find(|t| t.id == current.id)
            .expect("spec task"),
    )
}

/// The input of task `index`: the base bundle and commit, or the previous task's accepted work.
pub(crate) fn input_of(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    record: &MissionRecord,
    index: usize,
) -> (std::path::PathBuf, String) {
    if index == 0 {
        return (spec.base_bundle.clone(), spec.base_commit.clone());
    }
    let previous = &record.tasks[index - 1];
    let commit = previous
        .attempts
        .iter()
        .find_map(|a| match &a.status {
            AttemptStatus::Accepted {
                commit: Some(c),
                finalized: true,
                ..
            } => Some(c.clone()),
            _ => None,
        })
        .expect("a later task starts only after the previous one was finalized");
    (
        orch.mission_dir(&record.id)
            .join(format!("{}.bundle", previous.id)),
        commit,
    )
}

/// One step of the attempt `key`.
pub(crate) async fn advance(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    record: &MissionRecord,
    seq: i64,
    key: &AttemptKey,
    status: &AttemptStatus,
) -> Result<Step, OrchestratorError> {
    // Which provider and sandbox this attempt uses: the one it already holds, or (before its
    // sandbox exists) the mission's provider — fallbacks are tried when it is created.
    let placed = placement(orch, spec, key).await?;
    let (provider_id, main) = match &placed {
        Some((provider, name)) => (provider.clone(), name.clone()),
        None => (spec.file.sandbox.provider.clone(), main_name(key, 0)),
    };
    let provider = orch.provider(&provider_id)?;
    let (index, task) = task_of(spec, record);
    let attempt = record.tasks[index]
        .attempts
        .iter()
        .find(|a| &a.key == key)
        .expect("attempt");
    // The lock record: an attempt resumes only with the inputs it started with.
    if attempt.inputs != inputs(spec, &task.id) {
        return reject(
            orch,
            spec,
            record,
            seq,
            key,
            "attempt inputs changed since it started (lock record mismatch)".into(),
        )
        .await;
    }
    let attempt = Attempt {
        orch,
        spec,
        record,
        seq,
        key,
        index,
        task,
        attempt,
        provider,
        main,
        placed,
    };
    match status {
        AttemptStatus::InProgress {
            phase: Phase::Claimed | Phase::SandboxReady,
        } => attempt.stage_sandbox().await,
        AttemptStatus::InProgress {
            phase: Phase::Staged,
        } => attempt.run_agent().await,
        AttemptStatus::InProgress {
            phase: Phase::AgentStopped,
        } => attempt.capture().await,
        AttemptStatus::InProgress {
            phase: Phase::Frozen,
        } => attempt.validate().await,
        AttemptStatus::Accepted { commit: None, .. } => attempt.record_commit().await,
        AttemptStatus::Accepted {
            checkpoint: None, ..
        } => attempt.checkpoint().await,
        AttemptStatus::Accepted {
            finalized: false, ..
        } => attempt.finalize().await,
        other => Err(OrchestratorError::Corrupt(format!(
            "attempt {key} is not open: {other:?}"
        ))),
    }
}

pub(crate) async fn reject(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    record: &MissionRecord,
    seq: i64,
    key: &AttemptKey,
    reason: String,
) -> Result<Step, OrchestratorError> {
    let (after, _) = orch
        .commit_event(
            &record.id,
            record,
            seq,
            &Event::Rejected {
                key: key.clone(),
                reason: reason.clone(),
            },
            &[("rejected", json!({ "reason": reason }))],
        )
        .await?;
    crate::publication::publish_rejected(orch, spec, &after, key, &reason).await;
    teardown(orch, spec, key, false, Recheck::OpenOnly).await;
    Ok(Step::Rejected {
        key: key.clone(),
        reason,
    })
}
