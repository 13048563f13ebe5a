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
    redactor: berth_artifacts::Redactor,
    /// Output not yet written: bytes after the last newline, so a secret split across chunks
    /// is whole when it is masked.
    stdout_pending: Vec<u8>,
    stderr_pending: Vec<u8>,
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
    /// Starts `agent.jsonl`, `events.jsonl` and `agent.stderr` anew in `dir`. Every byte goes
    /// through `redactor` before it is written or normalized.
    pub fn open(
        dir: &Path,
        harness: Harness,
        key: &str,
        redactor: berth_artifacts::Redactor,
    ) -> std::io::Result<AgentLogs> {
        Ok(AgentLogs {
            last_output: Arc::default(),
            started: std::time::Instant::now(),
            raw: create_private(&dir.join("agent.jsonl"))?,
            events_file: create_private(&dir.join("events.jsonl"))?,
            stderr: create_private(&dir.join("agent.stderr"))?,
            normalizer: Normalizer::new(harness, key, "agent.jsonl"),
            redactor,
            stdout_pending: Vec::new(),
            stderr_pending: Vec::new(),
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

    /// The events normalized so far (from output already masked and written).
    pub fn events(&self) -> &[berth_harness::Event] {
        &self.events
    }

    /// Normalizes a last line without a newline; every event, and whether the raw log was cut
    /// at its limit.
    pub fn finish(mut self) -> std::io::Result<(Vec<berth_harness::Event>, bool)> {
        self.flush(Stream::Stdout, true);
        self.flush(Stream::Stderr, true);
        let last = self.normalizer.finish();
        self.record(last);
        match self.failed {
            Some(e) => Err(e),
            None => Ok((self.events, self.truncated)),
        }
    }
}

impl AgentLogs {
    /// Masks and writes the pending output of `stream` up to its last newline — or, at the end
    /// (`all`) or when a line outgrows [`MAX_PENDING`], everything but the last [`HOLD_BACK`]
    /// bytes (all of it at the end).
    fn flush(&mut self, stream: Stream, all: bool) {
        use std::io::Write;
        let pending = match stream {
            Stream::Stdout => &mut self.stdout_pending,
            Stream::Stderr => &mut self.stderr_pending,
        };
        // Only what is written is masked: masking the start of a token the next read continues
        // would leave its continuation unmasked.
        let upto = if all {
            self.redactor.redact(pending);
            pending.len()
        } else if let Some(newline) = memchr::memrchr(b'\n', pending) {
            // Whole lines: no token shape spans a newline.
            self.redactor.redact(&mut pending[..newline + 1]);
            newline + 1
        } else if pending.len() > MAX_PENDING {
            // A long line in parts: cut between token runs, far enough back that a known value
            // crossing the cut ends inside the buffer (found by the scan of all of it).
            let hold = HOLD_BACK.max(self.redactor.longest_known());
            let limit = pending.len().saturating_sub(hold);
            let cut = pending[..limit]
                .iter()
                .rposition(|b| !berth_artifacts::redact::is_token_byte(*b))
                .map_or(limit, |at| at + 1);
            self.redactor.redact_known(pending);
            self.redactor.redact(&mut pending[..cut]);
            cut
        } else {
            return;
        };
        let ready: Vec<u8> = pending.drain(..upto).collect();
        match stream {
            Stream::Stdout => {
                if let Err(e) = self.raw.write_all(&ready) {
                    self.failed.get_or_insert(e);
                }
                let events = self.normalizer.push(&ready);
                self.record(events);
            }
            Stream::Stderr => {
                if let Err(e) = self.stderr.write_all(&ready) {
                    self.failed.get_or_insert(e);
                }
            }
        }
    }
}

/// A line longer than this is written in parts (all but [`HOLD_BACK`] bytes at a time).
const MAX_PENDING: usize = 1 << 20;
/// What stays behind when a long line is written in parts: longer than any token shape's
/// prefix and minimum tail, so a secret split at the cut is still whole when masked.
const HOLD_BACK: usize = 64 << 10;

impl OutputSink for AgentLogs {
    fn chunk(&mut self, stream: Stream, bytes: &[u8]) {
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
                self.stdout_pending.extend_from_slice(kept);
            }
            Stream::Stderr => {
                let room = MAX_AGENT_STDERR.saturating_sub(self.stderr_kept);
                let kept = &bytes[..bytes.len().min(room)];
                self.stderr_kept += kept.len();
                self.stderr_pending.extend_from_slice(kept);
            }
        }
        self.flush(stream, false);
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

/// Masks what `redactor` knows in the attempt's logs as they are on disk, in place and the
/// same length (a watcher's offsets stay true), a window at a time. Berth's own files; one
/// that cannot be opened is left, said on stderr.
pub(super) fn mask_again(logs: &Path, redactor: &berth_artifacts::Redactor) {
    use std::os::unix::fs::FileExt;
    const WINDOW: u64 = 8 << 20;
    let overlap = redactor.longest_known() as u64;
    if overlap == 0 {
        return;
    }
    for name in [
        "agent.jsonl",
        "events.jsonl",
        "agent.stderr",
        "gateway.jsonl",
    ] {
        let path = logs.join(name);
        let masked = (|| -> std::io::Result<()> {
            let file = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
            {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                opened => opened?,
            };
            let size = file.metadata()?.len();
            let mut at = 0;
            while at < size {
                // A value that starts in this window ends in it or in its overlap.
                let len = (WINDOW + overlap).min(size - at) as usize;
                let mut window = vec![0; len];
                file.read_exact_at(&mut window, at)?;
                if redactor.redact_known(&mut window) > 0 {
                    file.write_all_at(&window, at)?;
                }
                at += WINDOW;
            }
            Ok(())
        })();
        if let Err(e) = masked {
            eprintln!("berth: cannot mask {} again: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANARY: &str = "canary-9f2c1e-do-not-leak";

    #[test]
    fn secrets_split_across_chunks_and_long_lines_never_reach_the_logs() {
        let dir = tempfile::tempdir().unwrap();
        let redactor = berth_artifacts::Redactor::new([CANARY.to_owned()]);
        let mut logs = AgentLogs::open(dir.path(), Harness::Codex, "at-1", redactor).unwrap();
        // A JSON line whose secret arrives in three chunks, byte by byte at the seam.
        let line = format!(
            "{{\"type\":\"item.completed\",\"text\":\"key {CANARY} and sk-{}\"}}\n",
            "a".repeat(30)
        );
        let (a, rest) = line.split_at(30);
        let (b, c) = rest.split_at(12);
        for part in [a, b, c] {
            logs.chunk(Stream::Stdout, part.as_bytes());
        }
        // A line longer than what is held pending, with the secret across the cut.
        let mut long = "x".repeat(MAX_PENDING - HOLD_BACK - 5);
        long.push(' ');
        long.push_str(CANARY);
        long.push_str(&" y".repeat(HOLD_BACK));
        for piece in long.as_bytes().chunks(4096) {
            logs.chunk(Stream::Stdout, piece);
        }
        logs.chunk(Stream::Stdout, b"\n");
        // A token the first read ends inside of, on a line that continues: masked whole.
        let split = (
            "{\"t\":\"x\"}\nnext sk-aaaaaaaaaaaaaaaaaaaaaaaa".to_owned(),
            format!("{} done\n", "b".repeat(30)),
        );
        logs.chunk(Stream::Stdout, split.0.as_bytes());
        logs.chunk(Stream::Stdout, split.1.as_bytes());
        // stderr, and a last line without a newline.
        logs.chunk(Stream::Stderr, &CANARY.as_bytes()[..5]);
        logs.chunk(Stream::Stderr, &CANARY.as_bytes()[5..]);
        logs.chunk(Stream::Stdout, format!("tail {CANARY}").as_bytes());
        let (_events, truncated) = logs.finish().unwrap();
        assert!(!truncated);
        let mut total = 0;
        for file in ["agent.jsonl", "events.jsonl", "agent.stderr"] {
            let bytes = std::fs::read(dir.path().join(file)).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains(CANARY), "{file} holds the canary");
            assert!(!text.contains("sk-aaaa"), "{file} holds the token");
            assert!(
                !text.contains("bbbbbbbbbb"),
                "{file} holds the token's continuation"
            );
            total += bytes.len();
        }
        let raw = std::fs::read_to_string(dir.path().join("agent.jsonl")).unwrap();
        // Masked in place: lengths and the JSON structure survive.
        assert_eq!(
            raw.len(),
            line.len()
                + long.len()
                + 1
                + split.0.len()
                + split.1.len()
                + "tail ".len()
                + CANARY.len()
        );
        assert!(raw.starts_with("{\"type\":\"item.completed\""));
        assert!(raw.ends_with(&format!("tail {}", "*".repeat(CANARY.len()))));
        assert!(total > raw.len());
    }
}

#[cfg(test)]
mod mask_again_tests {
    use super::mask_again;

    /// Values at the start, across a window's edge, in the overlap and at the end of a log
    /// longer than two windows are all masked; nothing else changes, the length stays.
    #[test]
    fn every_value_in_a_long_log_is_masked_in_place() {
        let value = "refreshed-oauth-0123456789abcdef";
        let dir = tempfile::tempdir().unwrap();
        let mut log = vec![b'.'; (20 << 20) + 7];
        let window = 8 << 20;
        let places = [
            0,
            window - 5,
            window + 40,
            2 * window - value.len(),
            log.len() - value.len(),
        ];
        for at in places {
            log[at..at + value.len()].copy_from_slice(value.as_bytes());
        }
        std::fs::write(dir.path().join("agent.jsonl"), &log).unwrap();
        std::fs::write(dir.path().join("gateway.jsonl"), format!("x{value}y")).unwrap();
        mask_again(
            dir.path(),
            &berth_artifacts::Redactor::new([value.to_owned()]),
        );
        let after = std::fs::read(dir.path().join("agent.jsonl")).unwrap();
        assert_eq!(after.len(), log.len());
        let mut expected = log.clone();
        for at in places {
            expected[at..at + value.len()].fill(b'*');
        }
        assert!(after == expected, "a value was left or other bytes changed");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("gateway.jsonl")).unwrap(),
            format!("x{}y", "*".repeat(value.len()))
        );
        // Absent logs are no error; no known value changes nothing.
        mask_again(dir.path(), &berth_artifacts::Redactor::default());
    }
}
