//! Agent-CLI attempts: the mission's model gateway, the launch in the sandbox, and the
//! judgement from the agent's own events.
//!
//! A mission whose harness is an agent CLI gets one gateway per run (scripted model or
//! credential-adding proxy) on the host's loopback. Each attempt is admitted with its own token,
//! which is revoked as soon as the agent stops; the sandbox never sees a model credential. The
//! agent's raw JSONL, its normalized events and the gateway's journal land in the attempt's log
//! directory (`<mission>/attempts/<task>-<ordinal>/`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use berth_contract::{ExecRequest, OutputSink, Stream};
use berth_gateway::{Gateway, GatewayConfig, Proxy, RunningGateway, Script, Upstream};
use berth_harness::{judge, launch, vars, Harness, Normalizer};
use berth_mission::file::{parse_duration, MissionFile, DEFAULT_IDLE_TIMEOUT};
use serde_json::json;
use std::time::Duration;

use crate::pipeline::{existing, Step};
use crate::steps::Attempt;
use crate::{MissionSpec, Orchestrator, OrchestratorError};

/// The variable naming the host directory that holds the CLIs (host provider), when they are
/// not on `PATH`.
pub const AGENT_BIN_DIR_VAR: &str = "BERTH_AGENT_BIN_DIR";

/// Most agent output kept per attempt (the raw log).
const MAX_AGENT_OUTPUT: usize = 64 << 20;

/// The providers an agent CLI can run on in this build: the gateway listens on the host's
/// loopback, which a host-provider sandbox shares. Docker and bwrap sandboxes (network `none`)
/// need the supervisor's loopback forward, which is not built yet.
const AGENT_PROVIDERS: &[&str] = &["host"];

/// The mission's agent CLI, if its harness is one.
pub(crate) fn harness_of(file: &MissionFile) -> Option<Harness> {
    Harness::parse(&file.harness.kind)
}

/// Checks, at registration, what the mission file alone cannot: where the agent may run and
/// that a scripted model parses. Returns the model script's text, kept in the spec (a resumed
/// mission answers from the same script even if the file changed).
pub(crate) fn register_check(
    file: &MissionFile,
    read_script: impl FnOnce(&str) -> Result<String, OrchestratorError>,
) -> Result<Option<String>, OrchestratorError> {
    let Some(harness) = harness_of(file) else {
        return Ok(None);
    };
    for provider in std::iter::once(&file.sandbox.provider).chain(&file.sandbox.fallback) {
        if !AGENT_PROVIDERS.contains(&provider.as_str()) {
            return Err(OrchestratorError::Unsupported(format!(
                "the `{}` harness on provider `{provider}`: agent CLIs run on the host provider \
                 in this build (sandboxes without network need the supervisor's loopback \
                 forward to reach the model gateway, which is not built yet)",
                harness.as_str()
            )));
        }
    }
    let gateway = file.harness.gateway.as_ref().expect("validated");
    match &gateway.script {
        Some(path) => {
            let text = read_script(path)?;
            Script::parse(&text).map_err(|e| {
                OrchestratorError::Unsupported(format!("harness.gateway.script `{path}`: {e}"))
            })?;
            Ok(Some(text))
        }
        None => Ok(None),
    }
}

/// A mission's running gateway.
pub(crate) struct MissionGateway {
    gateway: Gateway,
    running: RunningGateway,
}

/// The gateways of the missions this orchestrator runs (one per mission, started on first
/// use, stopped when the orchestrator goes away).
#[derive(Default)]
pub struct Gateways(Mutex<HashMap<String, Arc<MissionGateway>>>);

impl std::fmt::Debug for Gateways {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let missions: Vec<String> = self
            .0
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        f.debug_tuple("Gateways").field(&missions).finish()
    }
}

async fn gateway_for(
    orch: &Orchestrator<'_>,
    mission: &str,
    spec: &MissionSpec,
) -> Result<Arc<MissionGateway>, OrchestratorError> {
    if let Some(found) = orch
        .gateways
        .0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(mission)
    {
        return Ok(found.clone());
    }
    let gateway = spec.file.harness.gateway.as_ref().expect("validated");
    let upstream = match (&spec.model_script, &gateway.proxy) {
        (Some(text), _) => Upstream::Scripted(Arc::new(
            Script::parse(text).map_err(|e| OrchestratorError::Corrupt(e.to_string()))?,
        )),
        (None, Some(origin)) => {
            let variable = gateway.credential_env.as_deref().expect("validated");
            let credential = orch.config.env.get(variable).unwrap_or_default();
            if credential.is_empty() {
                return Err(OrchestratorError::Unsupported(format!(
                    "the model proxy's credential variable `{variable}` is not set in Berth's \
                     environment"
                )));
            }
            Upstream::Proxy(Arc::new(
                Proxy::new(origin, credential.to_owned())
                    .map_err(|e| OrchestratorError::Unsupported(e.to_string()))?,
            ))
        }
        (None, None) => return Err(OrchestratorError::Corrupt("no model script kept".into())),
    };
    let gateway = Gateway::new(GatewayConfig {
        upstream,
        prices: None,
    });
    let running = gateway
        .listen(0)
        .await
        .map_err(|e| OrchestratorError::Unsupported(format!("model gateway: {e}")))?;
    let entry = Arc::new(MissionGateway { gateway, running });
    orch.gateways
        .0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(mission.to_owned(), entry.clone());
    Ok(entry)
}

/// Where `harness`'s CLI is, as a host-provider sandbox sees it: in [`AGENT_BIN_DIR_VAR`] or on
/// `PATH` (from Berth's environment). Other providers have no agent CLIs in this build.
pub fn agent_bin_dir(
    env: &berth_factory::Environment,
    provider: &str,
    harness: Harness,
) -> Result<String, String> {
    if provider != "host" {
        return Err(format!(
            "agent CLIs run on the host provider in this build, not on `{provider}`"
        ));
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

/// The attempt's log directory (created, private).
fn log_dir(
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
    last_output: Arc<std::sync::atomic::AtomicU64>,
    started: std::time::Instant,
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

fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
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

impl Attempt<'_, '_> {
    /// Runs the attempt's agent CLI headless against the mission's gateway and judges it from
    /// its events.
    pub(crate) async fn run_agent_cli(&self, harness: Harness) -> Result<Step, OrchestratorError> {
        let mission = &self.record.id;
        let provider_id = self.provider.id().to_owned();
        let id = match existing(self.orch, self.provider.as_ref(), &self.main).await? {
            Ok(id) => id,
            Err(reason) => return self.reject(reason).await,
        };
        let bin = match agent_bin_dir(&self.orch.config.env, &provider_id, harness) {
            Ok(bin) => bin,
            Err(reason) => return self.reject(reason).await,
        };
        let logs = log_dir(self.orch, mission, &self.task.id, self.attempt.ordinal)
            .map_err(|e| OrchestratorError::Repository(format!("attempt logs: {e}")))?;
        let gateway = gateway_for(self.orch, mission, self.spec).await?;
        let journal = logs.join("gateway.jsonl");
        let token = gateway
            .gateway
            .admit_nth(&self.key.0, self.attempt.ordinal, journal.clone());
        let timeout = parse_duration(&self.task.agent_timeout).expect("validated");
        let mut req = ExecRequest::shell(launch(harness))
            .with_cwd("repo")
            .with_timeout(timeout)
            .with_env(vars::BIN, bin)
            .with_env(vars::GATEWAY_URL, gateway.running.base_url())
            .with_env(vars::GATEWAY_TOKEN, token.expose().to_owned())
            .with_env(
                vars::MODEL,
                self.spec
                    .file
                    .harness
                    .model
                    .clone()
                    .unwrap_or_else(|| "scripted".into()),
            )
            .with_env(vars::INSTRUCTIONS, self.task.instructions.clone())
            .with_env("BERTH_TASK", self.task.id.clone())
            .with_env("BERTH_ATTEMPT", self.attempt.ordinal.to_string());
        req.max_output_bytes = MAX_AGENT_OUTPUT;
        let mut sink = AgentLogs::open(&logs, harness, &self.key.0)
            .map_err(|e| OrchestratorError::Repository(format!("attempt logs: {e}")))?;
        let idle = parse_duration(
            self.spec
                .file
                .harness
                .idle_timeout
                .as_deref()
                .unwrap_or(DEFAULT_IDLE_TIMEOUT),
        )
        .expect("validated");
        let (last_output, started) = (sink.last_output.clone(), sink.started);
        // The idle watchdog: no output for `idle` stops the agent. Dropping the exec future
        // kills the agent's whole process group (the provider's reaper sees its caller go).
        let watchdog = async {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let last =
                    Duration::from_millis(last_output.load(std::sync::atomic::Ordering::Relaxed));
                if started.elapsed().saturating_sub(last) >= idle {
                    return;
                }
            }
        };
        // Streamed where the provider can (watchers follow the logs live), else buffered.
        let ran = {
            let sink = &mut sink;
            let exec = async {
                match self.provider.streaming() {
                    Some(streaming) => streaming
                        .exec_streaming(&id, &req, sink)
                        .await
                        .map(|s| (s.status, s.duration, s.stdout_total)),
                    None => self.provider.exec(&id, &req).await.map(|out| {
                        sink.chunk(Stream::Stdout, &out.stdout);
                        sink.chunk(Stream::Stderr, out.stderr.as_deref().unwrap_or_default());
                        (out.status, out.duration, out.stdout_total)
                    }),
                }
            };
            tokio::select! {
                ran = exec => Some(ran),
                () = watchdog => None,
            }
        };
        // The token dies with the run: whatever the agent left behind cannot reach the model.
        gateway.gateway.revoke(&token);
        let Some(ran) = ran else {
            let _ = sink.finish();
            return self
                .reject(format!(
                    "the agent was idle for {idle:?} (no output; harness.idle_timeout) and was \
                     stopped (events: {})",
                    logs.join("events.jsonl").display()
                ))
                .await;
        };
        let (status, duration, stdout_total) = match ran {
            Ok(ran) => ran,
            Err(e) => return self.reject(format!("the agent could not run: {e}")).await,
        };
        let (normalized, truncated) = sink.finish().map_err(|e| {
            OrchestratorError::Repository(format!(
                "cannot keep the agent's logs in {}: {e}",
                logs.display()
            ))
        })?;
        let judged = judge(harness, &normalized);
        if let Err(reason) = &judged.verdict {
            let reason = format!(
                "{reason} (exit {status}; events: {})",
                logs.join("events.jsonl").display()
            );
            return self.reject(reason).await;
        }
        let mut facts = json!({
            "status": status,
            "duration_ms": duration.as_secs_f64() * 1000.0,
            "stdout_total": stdout_total,
        });
        facts["harness"] = json!(harness.as_str());
        facts["session_id"] = json!(judged.session_id);
        facts["tool_calls"] = json!(judged.tool_calls);
        facts["unparsed_lines"] = json!(judged.unparsed);
        facts["events"] = json!(normalized.len());
        facts["raw_truncated"] = json!(truncated);
        facts["logs"] = json!(logs);
        self.reached(
            berth_mission::authority::Phase::AgentStopped,
            format!(
                "agent {} finished its turn: {} tool calls, {} events",
                harness.as_str(),
                judged.tool_calls,
                normalized.len()
            ),
            "agent",
            facts,
        )
        .await
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
