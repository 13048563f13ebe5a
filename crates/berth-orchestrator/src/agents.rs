//! Agent-CLI attempts: the mission's model gateway, the launch in the sandbox, and the
//! judgement from the agent's own events.
//!
//! A mission whose harness is an agent CLI gets one gateway per run (scripted model or
//! credential-adding proxy) on the host's loopback. Each attempt is admitted with its own token,
//! which is revoked as soon as the agent stops; the sandbox never sees a model credential. The
//! agent's raw JSONL, its normalized events and the gateway's journal land in the attempt's log
//! directory (`<mission>/attempts/<task>-<ordinal>/`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use berth_contract::{ExecRequest, OutputSink, Stream};
use berth_gateway::{Gateway, GatewayConfig, Proxy, RunningGateway, Script, Upstream};
use berth_harness::{
    collect_login, collect_session, judge, launch, vars, Harness, LOGIN_STAGED_FROM_REPO,
};
use berth_mission::file::{parse_duration, MissionFile, DEFAULT_IDLE_TIMEOUT};
use serde_json::json;
use std::time::Duration;

use crate::pipeline::{existing, Failure, Step};
use crate::steps::Attempt;
use crate::{MissionSpec, Orchestrator, OrchestratorError};

mod logs;
mod reach;

use logs::create_private;
use logs::log_dir;
use logs::mask_again;
pub use logs::{AgentLogs, AttemptLogs};
pub use reach::{
    agent_bin_dir, link_gateway, GatewayLink, GatewayReach, AGENT_BIN_DIR_VAR, IMAGE_AGENT_BIN_DIR,
    SANDBOX_GATEWAY_PORT,
};

/// Most agent output kept per attempt (the raw log).
const MAX_AGENT_OUTPUT: usize = 64 << 20;

/// The mission's agent CLI, if its harness is one.
pub(crate) fn harness_of(file: &MissionFile) -> Option<Harness> {
    Harness::parse(&file.harness.kind)
}

/// Checks, at registration, what the mission file alone cannot: where the agent may run and
/// that a scripted model parses. Returns the model script's text, kept in the spec (a resumed
/// mission answers from the same script even if the file changed).
pub(crate) fn register_check(
    file: &MissionFile,
    registry: &berth_factory::Registry,
    home: &Path,
    read_script: impl FnOnce(&str) -> Result<String, OrchestratorError>,
) -> Result<Option<String>, OrchestratorError> {
    let Some(harness) = harness_of(file) else {
        return Ok(None);
    };
    for provider in std::iter::once(&file.sandbox.provider).chain(&file.sandbox.fallback) {
        let manifest = registry
            .manifest(provider)
            .map_err(|_| OrchestratorError::UnknownProvider(provider.clone()))?;
        // A provider without the file API gets the repository by the text transport (see
        // transport.rs), but an agent CLI's login and session are staged as files: such a
        // mission would fail every attempt (and never fall back), so it is refused here.
        if manifest.support(berth_contract::Capability::Files) != berth_contract::Support::Supported
        {
            return Err(OrchestratorError::Unsupported(format!(
                "provider `{provider}` cannot run an agent harness: it does not support \
                 `files`, which staging the agent's login and session need (a command \
                 harness runs there)"
            )));
        }
        GatewayReach::of(manifest).map_err(|why| {
            OrchestratorError::Unsupported(format!("the `{}` harness: {why}", harness.as_str()))
        })?;
    }
    if let Some(name) = &file.harness.login {
        crate::logins::find(home, name, harness)
            .map_err(|why| OrchestratorError::Unsupported(format!("harness.login: {why}")))?;
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
    let ca_file = orch.config.env.get(berth_gateway::PROXY_CA_FILE_VAR);
    let upstream = match (&spec.model_script, &gateway.proxy) {
        (Some(text), _) => Upstream::Scripted(Arc::new(
            Script::parse(text).map_err(|e| OrchestratorError::Corrupt(e.to_string()))?,
        )),
        // Signed in with its own login: the proxy passes the CLI's key header through.
        (None, Some(origin)) if spec.file.harness.login.is_some() => Upstream::Proxy(Arc::new(
            Proxy::passthrough(origin)
                .and_then(|p| p.trust_configured(ca_file))
                .map_err(|e| OrchestratorError::Unsupported(e.to_string()))?,
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
                    .and_then(|p| p.trust_configured(ca_file))
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

impl Attempt<'_, '_> {
    /// Runs the attempt's agent CLI headless against the mission's gateway and judges it from
    /// its events.
    pub(crate) async fn run_agent_cli(&self, harness: Harness) -> Result<Step, OrchestratorError> {
        let mission = &self.record.id;
        let provider_id = self.provider.id().to_owned();
        let id = match existing(self.orch, self.provider.as_ref(), &self.main).await? {
            Ok(id) => id,
            Err(failure) => return self.fail(failure).await,
        };
        let reach = match self
            .orch
            .registry
            .manifest(&provider_id)
            .map_err(|e| e.to_string())
            .and_then(GatewayReach::of)
        {
            Ok(reach) => reach,
            Err(reason) => return Err(self.before_agent(reason)),
        };
        let bin = match agent_bin_dir(&self.orch.config.env, reach, harness) {
            Ok(bin) => bin,
            Err(reason) => return Err(self.before_agent(reason)),
        };
        let logs = log_dir(self.orch, mission, &self.task.id, self.attempt.ordinal)
            .map_err(|e| OrchestratorError::Repository(format!("attempt logs: {e}")))?;
        let gateway = gateway_for(self.orch, mission, self.spec).await?;
        let link = match link_gateway(self.provider.as_ref(), &id, reach, &gateway.running).await {
            Ok(link) => link,
            Err(e) => {
                return match Failure::of("the sandbox cannot reach the model gateway", e) {
                    Failure::Reject(reason) => Err(self.before_agent(reason)),
                    failure => self.fail(failure).await,
                };
            }
        };
        let timeout = parse_duration(&self.task.agent_timeout).expect("validated");
        // A subscription login: leased (one attempt at a time), staged for this run only.
        let lease = match &self.spec.file.harness.login {
            Some(name) => {
                let taken = match crate::logins::find(self.orch.home, name, harness) {
                    Ok(login) => crate::logins::Lease::take(self.orch.home, login, timeout).await,
                    Err(why) => Err(why),
                };
                match taken {
                    Ok(lease) => Some(lease),
                    Err(why) => return Err(self.before_agent(format!("harness.login: {why}"))),
                }
            }
            None => None,
        };
        if let Some(lease) = &lease {
            let staged = match berth_contract::ProviderExt::require_files(self.provider.as_ref()) {
                Ok(files) => files.write(&id, staging_path(), lease.staged()).await,
                Err(e) => Err(e),
            };
            if let Err(e) = staged {
                let redactor = crate::publication::redactor(self.orch, self.spec);
                let _ = self.keep_session(harness, &id, &logs, &redactor).await;
                return match Failure::of("harness.login: cannot stage the login", e) {
                    Failure::Reject(reason) => Err(self.before_agent(reason)),
                    failure => self.fail(failure).await,
                };
            }
        }
        let journal = logs.join("gateway.jsonl");
        // What the attempt is handed (a login's values) is masked in all it keeps.
        let handed =
            crate::publication::mission_secrets(&self.orch.config.env, self.orch.home, self.spec);
        let token = gateway.gateway.admit_nth(
            &self.key.0,
            self.attempt.ordinal,
            journal.clone(),
            handed.clone(),
        );
        let mut req = ExecRequest::shell(launch(harness))
            .with_cwd("repo")
            .with_timeout(timeout)
            .with_env(vars::BIN, bin)
            .with_env(vars::GATEWAY_URL, link.url.clone())
            .with_env(vars::GATEWAY_TOKEN, token.expose().to_owned())
            .with_env(vars::MODEL, self.spec.file.harness.model_name().to_owned())
            .with_env(vars::INSTRUCTIONS, self.task.instructions.clone())
            .with_env("BERTH_TASK", self.task.id.clone())
            .with_env("BERTH_ATTEMPT", self.attempt.ordinal.to_string());
        if lease.is_some() {
            req = req.with_env(vars::LOGIN, "1");
        }
        req.max_output_bytes = MAX_AGENT_OUTPUT;
        let redactor = berth_artifacts::Redactor::new(handed.clone());
        let mut sink = AgentLogs::open(&logs, harness, &self.key.0, redactor)
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
        // The token dies with the run: whatever the agent left behind cannot reach the model
        // (and, forwarded, cannot reach the gateway at all).
        gateway.gateway.revoke(&token);
        drop(link);
        let (login, refreshed) = match &lease {
            Some(lease) => {
                let (facts, left) = self.return_login(harness, &id, lease).await;
                (Some(facts), left)
            }
            None => (None, Vec::new()),
        };
        // Values the run made (a refreshed login's tokens) were unknown while its logs were
        // written: masked there now, and in the session record with all the rest.
        let refreshed: Vec<String> = refreshed
            .into_iter()
            .filter(|value| !handed.contains(value))
            .collect();
        let redactor =
            berth_artifacts::Redactor::new(handed.into_iter().chain(refreshed.iter().cloned()));
        let session = self.keep_session(harness, &id, &logs, &redactor).await;
        let refreshed = berth_artifacts::Redactor::new(refreshed);
        // The home (login included) is gone from the sandbox: the lease can go.
        drop(lease);
        let Some(ran) = ran else {
            let _ = sink.finish();
            mask_again(&logs, &refreshed);
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
            Err(e) => return self.fail(Failure::of("the agent could not run", e)).await,
        };
        let finished = sink.finish();
        mask_again(&logs, &refreshed);
        let (normalized, truncated) = finished.map_err(|e| {
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
        if let Some(login) = login {
            facts["login"] = login;
        }
        facts["session_archive"] = match &session {
            Ok(kept) => json!(kept),
            Err(why) => json!({ "unknown": why }),
        };
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

/// Where the login is staged, relative to the workspace (the launch line moves it).
fn staging_path() -> &'static str {
    LOGIN_STAGED_FROM_REPO.trim_start_matches("../")
}

/// Most of a CLI's session record kept per attempt.
const MAX_SESSION_ARCHIVE: usize = 64 << 20;

impl Attempt<'_, '_> {
    /// Reads the login file back as the run left it and writes a refreshed one back to the
    /// operator's file; what happened, for the attempt's facts (never the content), and the
    /// secret values of the file written back (none when it was refused).
    async fn return_login(
        &self,
        harness: Harness,
        id: &berth_contract::NativeId,
        lease: &crate::logins::Lease,
    ) -> (serde_json::Value, Vec<String>) {
        use crate::logins::WriteBack;
        let line = collect_login(harness).expect("a leased login has a file");
        let mut req = ExecRequest::shell(line)
            .with_cwd("repo")
            .with_timeout(Duration::from_secs(30));
        req.max_output_bytes = crate::logins::MAX_LOGIN_BYTES + 1;
        let mut left = Vec::new();
        let outcome = match self.provider.exec(id, &req).await {
            Ok(out) if out.status.success() => {
                let outcome = lease.write_back(&out.stdout);
                // Only a file taken as the login is one: the sandbox writes this file, and
                // would otherwise choose what is masked in its own logs.
                if matches!(outcome, WriteBack::Written | WriteBack::KeptBeside(..)) {
                    left = crate::publication::login_strings(&out.stdout);
                }
                outcome
            }
            Ok(out) => WriteBack::Refused(format!(
                "no login file was left to read back ({})",
                out.status
            )),
            Err(e) => WriteBack::Refused(format!("the login could not be read back: {e}")),
        };
        let facts = match outcome {
            WriteBack::Unchanged => {
                json!({"name": lease.name(), "written_back": false, "changed": false})
            }
            WriteBack::Written => {
                json!({"name": lease.name(), "written_back": true, "changed": true})
            }
            WriteBack::KeptBeside(path, why) => json!({
                "name": lease.name(), "written_back": false, "changed": true,
                "kept_beside": path, "reason": why,
            }),
            WriteBack::Refused(why) => {
                json!({"name": lease.name(), "written_back": false, "reason": why})
            }
        };
        (facts, left)
    }

    /// Takes the CLI's session record out of the sandbox into `session.tar` beside the other
    /// logs (kept as the sandbox made it, never extracted, but for the secrets `redactor`
    /// masks in place: the conversation holds whatever the agent's tools printed) and removes
    /// the agent's home from the sandbox. `Ok(None)`: the CLI wrote no session record.
    async fn keep_session(
        &self,
        harness: Harness,
        id: &berth_contract::NativeId,
        logs: &Path,
        redactor: &berth_artifacts::Redactor,
    ) -> Result<Option<serde_json::Value>, String> {
        let mut req = ExecRequest::shell(collect_session(harness))
            .with_cwd("repo")
            .with_timeout(Duration::from_secs(60));
        req.max_output_bytes = MAX_SESSION_ARCHIVE;
        let out = self
            .provider
            .exec(id, &req)
            .await
            .map_err(|e| format!("the agent's session record could not be collected: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "collecting the agent's session record ended {}: {}",
                out.status,
                String::from_utf8_lossy(out.stderr.as_deref().unwrap_or_default())
                    .chars()
                    .take(300)
                    .collect::<String>()
            ));
        }
        if out.stdout.is_empty() {
            return Ok(None);
        }
        let truncated = out.stdout_total > out.stdout.len() as u64;
        let mut record = out.stdout;
        let masked = berth_artifacts::redact_archive(redactor, &mut record);
        let path = logs.join("session.tar");
        let written = create_private(&path).and_then(|mut file| {
            use std::io::Write;
            file.write_all(&record)
        });
        written.map_err(|e| format!("cannot keep {}: {e}", path.display()))?;
        Ok(Some(json!({
            "path": path,
            "bytes": record.len(),
            "masked": masked,
            "truncated": truncated,
        })))
    }
}
