//! What an attempt leaves on the host and in the store, by name: its captured commit's branch,
//! bundle and patch, and the (masked) tails of its sandbox's output.

use berth_contract::ExecOutput;
use berth_mission::authority::AttemptKey;
use berth_mission::file::Task;
use serde_json::json;

use crate::{capture, MissionSpec, Orchestrator, OrchestratorError};

pub(crate) fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let start = text.len().saturating_sub(2000);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].to_owned()
}

pub(crate) fn output_json(
    out: &ExecOutput,
    redactor: &berth_artifacts::Redactor,
) -> serde_json::Value {
    json!({
        "status": out.status,
        "stdout_tail": redacted_tail(&out.stdout, redactor),
        "stderr_tail": out.stderr.as_deref().map(|e| redacted_tail(e, redactor)),
        "duration_ms": out.duration.as_secs_f64() * 1000.0,
    })
}

/// The tail of a sandbox's output, masked (before it is cut, so a secret the cut would split
/// is still recognized) before it goes into the store.
pub(crate) fn redacted_tail(bytes: &[u8], redactor: &berth_artifacts::Redactor) -> String {
    let mut masked = bytes.to_vec();
    redactor.redact(&mut masked);
    tail(&masked)
}

/// Writes the task's final bundle at `path`: the one made at capture, copied (or made again from
/// the work repository when a crash lost it). Returns its size.
pub(crate) fn final_bundle(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    mission: &str,
    task: &Task,
    ordinal: u32,
    key: &AttemptKey,
    path: &std::path::Path,
) -> Result<u64, OrchestratorError> {
    let made = attempt_bundle(orch, mission, task, ordinal);
    if made.is_file() {
        capture::copy_bundle(&made, path)
    } else {
        let repo = capture::work_repo(&orch.mission_dir(mission), &spec.base_bundle)?;
        capture::bundle(&repo, &attempt_ref(key), path)
    }
}

/// The branch of the mission's work repository holding the attempt's captured commit.
pub(crate) fn attempt_ref(key: &AttemptKey) -> String {
    // Attempt keys are Berth's own (`at-` + hex); anything else never reaches a ref name.
    let safe: String = key
        .0
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    format!("refs/heads/berth/{safe}")
}

/// Where the attempt's captured commit is bundled on the host.
pub(crate) fn attempt_bundle(
    orch: &Orchestrator<'_>,
    mission: &str,
    task: &Task,
    ordinal: u32,
) -> std::path::PathBuf {
    orch.mission_dir(mission)
        .join(format!("{}.attempt-{ordinal}.bundle", task.id))
}

/// Where an attempt's patch against the mission's base is kept, made at capture. Named by the
/// commit it describes, so a patch is never read for a different commit.
pub(crate) fn attempt_patch(
    orch: &Orchestrator<'_>,
    mission: &str,
    task: &Task,
    ordinal: u32,
    commit: &str,
) -> std::path::PathBuf {
    orch.mission_dir(mission)
        .join(format!("{}.attempt-{ordinal}.{commit}.patch", task.id))
}
