//! An attempt's agent logs: the raw output, the normalized events and stderr as they arrive,
//! and finding them again by attempt key.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_contract::{OutputSink, Stream};
use berth_harness::{Harness, Normalizer};

use super::{harness_of, MAX_AGENT_OUTPUT};
use crate::{MissionSpec, Orchestrator, OrchestratorError};

/// The attempt's log directory (created, private).
pub(super) fn log_dir(
    orch: &Orchestrator<'_>,
    mission: &str,
    task: &str,
    ordinal: u32,
) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = orch
        .mission_dir(mission)
        .join("attempts")
        .join(format!("{task}-{ordinal}"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    Ok(dir)
}

/// Where a streaming agent run's output goes while it runs: the raw log and the normalized
/// events, appended as lines complete (so a watcher follows them live), and stderr.
pub struct AgentLogs {
    /// When output last arrived (milliseconds since `started`), for the idle watchdog.
    pub(super) last_output: Arc<std::sync::atomic::AtomicU64>,
    pub(super) started: std::time::Instant,
    raw: std::fs::File,
    events_file: std::fs::File,
    stderr: std::fs::File,
    normalizer: Normalizer,
    events: Vec<berth_harness::Event>,
    raw_kept: usize,
    stderr_kept: usize,
    truncated: bool,
    failed: Option<std::io::Error>,
}

/// Most stderr kept per attempt.
const MAX_AGENT_STDERR: usize = 8 << 20;

pub(crate) fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    // A rerun (after a crash) starts the files anew: a new file, so watchers see a new
    // identity and replay from the start.
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

impl std::fmt::Debug for AgentLogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentLogs")
            .field("events", &self.events.len())
            .field("raw_kept", &self.raw_kept)
            .finish()
    }
}

impl AgentLogs {
    /// Starts `agent.jsonl`, `events.jsonl` and `agent.stderr` anew in `dir`.
    pub fn open(dir: &Path, harness: Harness, key: &str) -> std::io::Result<AgentLogs> {
        Ok(AgentLogs {
            last_output: Arc::default(),
            started: std::time::Instant::now(),
            raw: create_private(&dir.join("agent.jsonl"))?,
            events_file: create_private(&dir.join("events.jsonl"))?,
            stderr: create_private(&dir.join("agent.stderr"))?,
            normalizer: Normalizer::new(harness, key, "agent.jsonl"),
            events: Vec::new(),
            raw_kept: 0,
            stderr_kept: 0,
            truncated: false,
            failed: None,
        })
    }

    fn record(&mut self, events: Vec<berth_harness::Event>) {
        use std::io::Write;
        let mut lines = String::new();
        for event in &events {
            lines.push_str(&serde_json::to_string(event).expect("events serialize"));
            lines.push('\n');
        }
        if let Err(e) = self.events_file.write_all(lines.as_bytes()) {
            self.failed.get_or_insert(e);
        }
        self.events.extend(events);
    }

    /// Normalizes a last line without a newline; every event, and whether the raw log was cut
    /// at its limit.
    pub fn finish(mut self) -> std::io::Result<(Vec<berth_harness::Event>, bool)> {
        let last = self.normalizer.finish();
        self.record(last);
        match self.failed {
            Some(e) => Err(e),
            None => Ok((self.events, self.truncated)),
        }
    }
}

impl OutputSink for AgentLogs {
    fn chunk(&mut self, stream: Stream, bytes: &[u8]) {
        use std::io::Write;
        self.last_output.store(
            self.started.elapsed().as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        match stream {
            Stream::Stdout => {
                let room = MAX_AGENT_OUTPUT.saturating_sub(self.raw_kept);
                let kept = &bytes[..bytes.len().min(room)];
                self.truncated |= kept.len() < bytes.len();
                self.raw_kept += kept.len();
                if let Err(e) = self.raw.write_all(kept) {
                    self.failed.get_or_insert(e);
                }
                let events = self.normalizer.push(kept);
                self.record(events);
            }
            Stream::Stderr => {
                let room = MAX_AGENT_STDERR.saturating_sub(self.stderr_kept);
                let kept = &bytes[..bytes.len().min(room)];
                self.stderr_kept += kept.len();
                if let Err(e) = self.stderr.write_all(kept) {
                    self.failed.get_or_insert(e);
                }
            }
        }
    }
}

/// Where one attempt's agent logs are, found by its key among the owner's missions.
#[derive(Debug, Clone)]
pub struct AttemptLogs {
    /// The attempt's status when it was looked up.
    pub status: berth_mission::authority::AttemptStatus,
    /// The mission.
    pub mission: String,
    /// The mission's spec (harness, model, tasks).
    pub spec: MissionSpec,
    /// The task's id.
    pub task: String,
    /// The attempt's ordinal.
    pub ordinal: u32,
    /// The directory (`agent.jsonl`, `events.jsonl`, `gateway.jsonl`, `agent.stderr`).
    pub dir: PathBuf,
}

impl AttemptLogs {
    /// The task's instructions.
    pub fn instructions(&self) -> &str {
        self.spec
            .file
            .tasks
            .iter()
            .find(|t| t.id == self.task)
            .map(|t| t.instructions.as_str())
            .unwrap_or_default()
    }

    /// The agent CLI that ran, if the harness is one.
    pub fn harness(&self) -> Option<Harness> {
        harness_of(&self.spec.file)
    }

    /// Whether the agent's run is over (it stopped, or the attempt ended): nothing more will
    /// be appended to its logs.
    pub fn agent_done(&self) -> bool {
        use berth_mission::authority::{AttemptStatus, Phase};
        !matches!(
            self.status,
            AttemptStatus::InProgress {
                phase: Phase::Claimed | Phase::SandboxReady | Phase::Staged
            }
        )
    }
}

impl Orchestrator<'_> {
    /// Finds attempt `key` among this owner's missions.
    pub async fn attempt_logs(&self, key: &str) -> Result<Option<AttemptLogs>, OrchestratorError> {
        for row in self.store.mission_list(self.ledger.owner()).await? {
            let record: berth_mission::authority::MissionRecord =
                serde_json::from_str(&row.record_json)
                    .map_err(|e| OrchestratorError::Corrupt(e.to_string()))?;
            for task in &record.tasks {
                if let Some(attempt) = task.attempts.iter().find(|a| a.key.0 == key) {
                    let (spec, _, _) = self.load(&row.id).await?;
                    return Ok(Some(AttemptLogs {
                        status: attempt.status.clone(),
                        dir: self
                            .mission_dir(&row.id)
                            .join("attempts")
                            .join(format!("{}-{}", task.id, attempt.ordinal)),
                        mission: row.id.clone(),
                        spec,
                        task: task.id.clone(),
                        ordinal: attempt.ordinal,
                    }));
                }
            }
        }
        Ok(None)
    }
}
