//! The attempt pipeline, one durable step per call.

use std::sync::Arc;
use std::time::Duration;

use berth_contract::{
    CanonicalState, ExecOutput, ExecRequest, ExitStatus, NativeId, Observation, Provider,
    ProviderExt, SandboxName,
};
use berth_ledger::LedgerError;
use berth_mission::authority::{
    AttemptInputs, AttemptKey, AttemptStatus, Event, MissionRecord, MissionState, Phase,
};
use berth_mission::file::{parse_duration, Task};
use berth_store::{LedgerState, StoreError};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::{capture, MissionSpec, Orchestrator, OrchestratorError};

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
        harness: format!("script/{}", spec.file.harness.command),
        validator: format!("sha256:{}", hex::encode(hasher.finalize())),
    }
}

/// The providers an attempt may use, in order: the mission's provider, then its fallbacks.
fn candidates(spec: &MissionSpec) -> Vec<String> {
    std::iter::once(spec.file.sandbox.provider.clone())
        .chain(spec.file.sandbox.fallback.iter().cloned())
        .collect()
}

/// The attempt's sandbox name on candidate `choice` (0 = the mission's provider).
fn main_name(key: &AttemptKey, choice: usize) -> SandboxName {
    match choice {
        0 => sandbox_name(key),
        n => SandboxName(format!("{}-f{n}", sandbox_name(key).0)),
    }
}

/// Generation `n` (1-based) of the attempt's frozen copy. A freeze interrupted by a crash is
/// not adopted half-made: it is destroyed and the next generation is made under a new name (a
/// ledger name is never reused).
fn frozen_gen(main: &SandboxName, n: usize) -> SandboxName {
    match n {
        1 => SandboxName(format!("{}-v", main.0)),
        n => SandboxName(format!("{}-v{n}", main.0)),
    }
}

/// How long a mission's checkpoints are kept after they are taken, once the mission is no
/// longer running (while it runs, they are always kept).
const CHECKPOINT_RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// Most freezes one attempt may start before it is rejected (each crash mid-freeze costs one).
const MAX_FREEZES: usize = 8;

/// Every frozen-copy generation with a ledger row, oldest first.
async fn frozen_rows(
    orch: &Orchestrator<'_>,
    main: &SandboxName,
) -> Result<Vec<berth_store::LedgerRow>, OrchestratorError> {
    let mut rows = Vec::new();
    for n in 1..=MAX_FREEZES {
        match orch.ledger.row(&frozen_gen(main, n).0).await {
            Ok(row) => rows.push(row),
            Err(LedgerError::Store(StoreError::NotFound(_))) => break,
            Err(LedgerError::Store(e)) => return Err(e.into()),
            Err(_) => break,
        }
    }
    Ok(rows)
}

/// The current frozen copy's name: the newest generation with a row (the first when none).
async fn frozen_of(
    orch: &Orchestrator<'_>,
    main: &SandboxName,
) -> Result<SandboxName, OrchestratorError> {
    let rows = frozen_rows(orch, main).await?;
    Ok(frozen_gen(main, rows.len().max(1)))
}

/// The origin recorded on a mission's ledger rows: names the mission, so a sweep leaves what
/// a mission that is still running will adopt.
pub(crate) fn mission_origin(mission: &str, role: &str) -> String {
    format!("mission {mission} {role}")
}

/// The candidate whose sandbox this attempt created and still holds, if any (ledger rows say;
/// a failed or gone row does not count).
async fn placement(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    key: &AttemptKey,
) -> Result<Option<(String, SandboxName)>, OrchestratorError> {
    for (choice, provider) in candidates(spec).into_iter().enumerate() {
        let name = main_name(key, choice);
        match orch.ledger.row(&name.0).await {
            Ok(row)
                if !matches!(
                    row.state,
                    LedgerState::VerifiedGone | LedgerState::CreateFailed
                ) =>
            {
                return Ok(Some((provider, name)))
            }
            Ok(_) | Err(LedgerError::Store(StoreError::NotFound(_))) => {}
            Err(LedgerError::Store(e)) => return Err(e.into()),
            Err(_) => {}
        }
    }
    Ok(None)
}

fn sandbox_name(key: &AttemptKey) -> SandboxName {
    SandboxName(format!("bx-{}", key.0.trim_start_matches("at-")))
}

/// Creates the attempt's sandbox on the first candidate provider that can take it, moving on
/// only for capacity, quota or unavailability (never for a request the provider refuses).
/// Candidates tried before (their ledger rows exist) are not tried again. Returns the provider,
/// the sandbox name and id, and why earlier candidates were passed over.
#[allow(clippy::type_complexity)]
async fn choose(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    task: &Task,
    mission: &str,
    key: &AttemptKey,
) -> Result<
    Result<(Arc<dyn Provider>, SandboxName, NativeId, Vec<String>), String>,
    OrchestratorError,
> {
    let mut skipped = Vec::new();
    for (choice, provider_id) in candidates(spec).into_iter().enumerate() {
        let name = main_name(key, choice);
        match orch.ledger.row(&name.0).await {
            Ok(row) => {
                skipped.push(format!("{provider_id}: tried before ({})", row.state));
                continue;
            }
            Err(LedgerError::Store(StoreError::NotFound(_))) => {}
            Err(LedgerError::Store(e)) => return Err(e.into()),
            Err(e) => return Ok(Err(e.to_string())),
        }
        let provider = orch.registry.construct(&provider_id, orch.config)?;
        match ensure(orch, &provider, spec, mission, task, &name, false).await? {
            Ok(id) => return Ok(Ok((provider, name, id, skipped))),
            Err(reason) => match reason.strip_prefix(FALLBACK_MARK) {
                Some(why) => skipped.push(format!("{provider_id}: {why}")),
                None => return Ok(Err(reason)),
            },
        }
    }
    Ok(Err(format!(
        "no provider could take the attempt: {}",
        skipped.join("; ")
    )))
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let start = text.len().saturating_sub(2000);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].to_owned()
}

fn output_json(out: &ExecOutput) -> serde_json::Value {
    json!({
        "status": out.status,
        "stdout_tail": tail(&out.stdout),
        "stderr_tail": out.stderr.as_deref().map(tail),
        "duration_ms": out.duration.as_secs_f64() * 1000.0,
    })
}

/// A sandbox that should exist for this attempt: found in the ledger and observed present.
/// `Ok(Err(reason))` when it is provably gone.
async fn existing(
    orch: &Orchestrator<'_>,
    provider: &dyn Provider,
    name: &SandboxName,
) -> Result<Result<NativeId, String>, OrchestratorError> {
    let row = match orch.ledger.row(&name.0).await {
        Ok(row) => row,
        Err(LedgerError::Store(StoreError::NotFound(_))) => {
            return Ok(Err(format!("sandbox `{name}` was never created")))
        }
        Err(LedgerError::Store(e)) => return Err(e.into()),
        Err(e) => return Ok(Err(e.to_string())),
    };
    if row.state == LedgerState::VerifiedGone {
        return Ok(Err(format!("sandbox `{name}` is gone")));
    }
    let id = berth_ledger::native_id(&row);
    match provider.observe(&id).await {
        Ok(Observation::Present { .. }) => Ok(Ok(id)),
        Ok(Observation::Absent) => Ok(Err(format!("sandbox `{name}` is absent"))),
        Err(e) => Ok(Err(format!("cannot observe sandbox `{name}`: {e}"))),
    }
}

/// Adopts the attempt's sandbox if the ledger has it, else creates it under the ledger with the
/// attempt-derived name. Never creates while a ledger row says it may exist.
async fn ensure(
    orch: &Orchestrator<'_>,
    provider: &Arc<dyn Provider>,
    spec: &MissionSpec,
    mission: &str,
    task: &Task,
    name: &SandboxName,
    validator: bool,
) -> Result<Result<NativeId, String>, OrchestratorError> {
    match orch.ledger.row(&name.0).await {
        Ok(_) => return existing(orch, provider.as_ref(), name).await,
        Err(LedgerError::Store(StoreError::NotFound(_))) => {}
        Err(LedgerError::Store(e)) => return Err(e.into()),
        Err(e) => return Ok(Err(e.to_string())),
    }
    let image = spec.file.sandbox.image.clone();
    let limits = spec.file.sandbox.limits.overridden_by(&task.limits);
    let resources = berth_contract::Resources {
        cpus: limits.cpus,
        memory_mib: limits.memory_mib,
        pids: limits.pids,
    };
    let origin = mission_origin(mission, if validator { "validator" } else { "attempt" });
    let created = orch
        .ledger
        .create_tracked_as(
            name.clone(),
            provider.as_ref(),
            &origin,
            None,
            |r| {
                r.image = image;
                r.resources = resources;
            },
            |req| {
                let provider = provider.clone();
                async move { provider.create(&req).await }
            },
        )
        .await;
    match created {
        Ok(tracked) => Ok(Ok(NativeId(tracked.native_id))),
        Err(LedgerError::Store(e)) => Err(e.into()),
        Err(LedgerError::Provider { source, .. }) if source.kind().allows_fallback() => {
            Ok(Err(format!("{FALLBACK_MARK}{source}")))
        }
        Err(LedgerError::Provider { source, .. }) => Ok(Err(source.to_string())),
        Err(e) => Ok(Err(e.to_string())),
    }
}

/// The row's resource is present and running (not absent, not still being created).
async fn is_ready(provider: &dyn Provider, row: &berth_store::LedgerRow) -> bool {
    row.state != LedgerState::VerifiedGone
        && matches!(
            provider.observe(&berth_ledger::native_id(row)).await,
            Ok(Observation::Present {
                state: CanonicalState::Running,
                ..
            })
        )
}

/// Prefix of an `ensure` failure that allows moving on to the next provider.
const FALLBACK_MARK: &str = "fallback-eligible: ";

/// Recovery: sandboxes of attempts that are over (rejected, or finalized and not kept) must be
/// gone; a crash between an attempt's last event and its teardown leaves them, so every tick
/// finishes that teardown first.
pub(crate) async fn reconcile(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    record: &MissionRecord,
) -> Result<(), OrchestratorError> {
    let mut over = Vec::new();
    for task in &record.tasks {
        for attempt in &task.attempts {
            match &attempt.status {
                AttemptStatus::Rejected { .. } => over.push((attempt.key.clone(), false)),
                AttemptStatus::Accepted {
                    finalized: true, ..
                } => over.push((attempt.key.clone(), spec.file.sandbox.keep)),
                // The frozen copy is done once the validator's verdict is recorded.
                AttemptStatus::Accepted { .. } => over.push((attempt.key.clone(), true)),
                AttemptStatus::InProgress { .. } => {}
            }
        }
    }
    if over.is_empty() {
        return Ok(());
    }
    for (key, keep_main) in over {
        teardown(orch, spec, &key, keep_main).await;
    }
    Ok(())
}

/// Destroys the attempt's sandboxes on every candidate provider (ledger-verified), unless the
/// mission keeps the main one.
async fn teardown(orch: &Orchestrator<'_>, spec: &MissionSpec, key: &AttemptKey, keep_main: bool) {
    for choice in 0..candidates(spec).len() {
        let main = main_name(key, choice);
        let mut rows = frozen_rows(orch, &main).await.unwrap_or_default();
        if !keep_main {
            if let Ok(row) = orch.ledger.row(&main.0).await {
                rows.push(row);
            }
        }
        for row in rows {
            let Ok(provider) = orch.registry.construct(&row.provider, orch.config) else {
                continue;
            };
            if row.state != LedgerState::VerifiedGone {
                let _ = orch.ledger.destroy_row(provider.as_ref(), &row).await;
            } else {
                // Verified gone, but an engine may finish work a killed runner asked for after
                // that (a fork's image committed late): destroying again is idempotent and
                // removes it.
                let _ = provider.destroy(&berth_ledger::native_id(&row)).await;
            }
        }
    }
}

fn task_of<'s>(spec: &'s MissionSpec, record: &MissionRecord) -> (usize, &'s Task) {
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
fn input_of(
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
    let provider = orch.registry.construct(&provider_id, orch.config)?;
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
    // A needed sandbox that is provably gone rejects the attempt, with the reason.
    macro_rules! or_reject {
        ($found:expr) => {
            match $found {
                Ok(id) => id,
                Err(reason) => return reject(orch, spec, record, seq, key, reason).await,
            }
        };
    }
    let mission = &record.id;
    // Each step's facts are stored in the same transaction as its event.
    let reached = |phase: Phase, what: String, kind: &'static str, detail: serde_json::Value| async move {
        let event = Event::Reached {
            key: key.clone(),
            phase,
        };
        orch.commit_event(mission, record, seq, &event, &[(kind, detail)])
            .await?;
        Ok::<Step, OrchestratorError>(Step::Advanced {
            key: key.clone(),
            what,
        })
    };
    match status {
        // Sandbox and staging are one durable step: adoption by name makes the sandbox half
        // repeatable and staging starts from scratch, so a crash in between costs no event.
        AttemptStatus::InProgress {
            phase: Phase::Claimed | Phase::SandboxReady,
        } => {
            // A sandbox a crash left half-made (intent recorded, absent or still creating) holds
            // nothing yet: it is destroyed, its name retired, and the attempt places again —
            // the crash costs no attempt.
            let mut placed = placed;
            if let Some((_, name)) = &placed {
                if let Ok(row) = orch.ledger.row(&name.0).await {
                    if !is_ready(provider.as_ref(), &row).await {
                        if row.state != LedgerState::VerifiedGone {
                            orch.ledger
                                .destroy_row(provider.as_ref(), &row)
                                .await
                                .map_err(|e| {
                                    OrchestratorError::Repository(format!(
                                        "cannot remove the interrupted sandbox `{name}`: {e}"
                                    ))
                                })?;
                        }
                        orch.ledger.store().ledger_retire(&name.0).await?;
                        placed = None;
                    }
                }
            }
            let (provider, main, id, skipped) = if placed.is_none() {
                match choose(orch, spec, task, mission, key).await? {
                    Ok(chosen) => chosen,
                    Err(reason) => return reject(orch, spec, record, seq, key, reason).await,
                }
            } else {
                let id = or_reject!(existing(orch, provider.as_ref(), &main).await?);
                (provider.clone(), main.clone(), id, Vec::new())
            };
            let (bundle, commit) = input_of(orch, spec, record, index);
            let staged = stage(provider.as_ref(), &id, &bundle, &commit).await;
            match staged {
                Ok(()) => {
                    let event = Event::Reached {
                        key: key.clone(),
                        phase: Phase::Staged,
                    };
                    let facts = [
                        (
                            "sandbox",
                            json!({
                                "sandbox": main.0.clone(),
                                "native_id": id.0,
                                "provider": provider.id(),
                                "fallback_skipped": skipped,
                            }),
                        ),
                        ("stage", json!({ "commit": commit })),
                    ];
                    orch.commit_event(mission, record, seq, &event, &facts)
                        .await?;
                    Ok(Step::Advanced {
                        key: key.clone(),
                        what: format!(
                            "sandbox {} ready, repository staged at {}",
                            main,
                            &commit[..12.min(commit.len())]
                        ),
                    })
                }
                Err(reason) => reject(orch, spec, record, seq, key, reason).await,
            }
        }
        AttemptStatus::InProgress {
            phase: Phase::Staged,
        } => {
            let id = or_reject!(existing(orch, provider.as_ref(), &main).await?);
            let timeout = parse_duration(&task.agent_timeout).expect("validated");
            let req = ExecRequest::shell(spec.file.harness.command.clone())
                .with_cwd("repo")
                .with_timeout(timeout)
                .with_env("BERTH_TASK", task.id.clone())
                .with_env("BERTH_INSTRUCTIONS", task.instructions.clone())
                .with_env("BERTH_ATTEMPT", attempt.ordinal.to_string());
            match provider.exec(&id, &req).await {
                Ok(out) => {
                    reached(
                        Phase::AgentStopped,
                        format!("agent {}", out.status),
                        "agent",
                        output_json(&out),
                    )
                    .await
                }
                Err(e) => {
                    reject(
                        orch,
                        spec,
                        record,
                        seq,
                        key,
                        format!("the agent could not run: {e}"),
                    )
                    .await
                }
            }
        }
        AttemptStatus::InProgress {
            phase: Phase::AgentStopped,
        } => {
            // The workspace leaves the agent's sandbox as data and is committed on the host;
            // the validator judges exactly that commit, in a clean sandbox.
            let main_id = or_reject!(existing(orch, provider.as_ref(), &main).await?);
            let mut req = ExecRequest::shell(capture::SCRIPT)
                .with_cwd("repo")
                .with_timeout(Duration::from_secs(600));
            req.max_output_bytes = capture::LIMIT + 1;
            let out = match provider.exec(&main_id, &req).await {
                Ok(out) if out.status.success() => out,
                Ok(out) => {
                    let why = format!(
                        "the workspace could not be captured ({}): {}",
                        out.status,
                        tail(out.stderr.as_deref().unwrap_or_default()).trim()
                    );
                    return reject(orch, spec, record, seq, key, why).await;
                }
                Err(e) => {
                    let why = format!("the workspace could not be captured: {e}");
                    return reject(orch, spec, record, seq, key, why).await;
                }
            };
            let captured = match capture::parse(&out.stdout) {
                Ok(captured) => captured,
                Err(why) => return reject(orch, spec, record, seq, key, why).await,
            };
            let (input, parent) = input_of(orch, spec, record, index);
            let repo = capture::work_repo(&orch.mission_dir(mission), &spec.base_bundle)?;
            let commit = capture::commit(
                &repo,
                &input,
                &attempt_ref(key),
                &parent,
                &format!("berth: {} (attempt {})", task.id, attempt.ordinal),
                &captured,
            )?;
            let bundle = attempt_bundle(orch, mission, task, attempt.ordinal);
            let bytes = capture::bundle(&repo, &attempt_ref(key), &bundle)?;
            reached(
                Phase::Frozen,
                format!(
                    "workspace captured: {} files, commit {}",
                    captured.files.len(),
                    &commit[..12]
                ),
                "capture",
                json!({
                    "commit": commit,
                    "files": captured.files.len(),
                    "bytes": captured.bytes(),
                    "skipped": captured.skipped,
                    "bundle": bundle,
                    "bundle_bytes": bytes,
                }),
            )
            .await
        }
        AttemptStatus::InProgress {
            phase: Phase::Frozen,
        } => {
            // A fresh sandbox from the mission's image, holding a checkout of the captured
            // commit and nothing else of the agent's. A sandbox a crash left half-made is
            // destroyed and the next generation made (it costs no attempt).
            let mut frozen = frozen_of(orch, &main).await?;
            if let Ok(row) = orch.ledger.row(&frozen.0).await {
                if !is_ready(provider.as_ref(), &row).await {
                    let generations = frozen_rows(orch, &main).await?.len();
                    if generations >= MAX_FREEZES {
                        let why = format!(
                            "the validator's sandbox could not be made in {MAX_FREEZES} tries"
                        );
                        return reject(orch, spec, record, seq, key, why).await;
                    }
                    if row.state != LedgerState::VerifiedGone {
                        if let Err(e) = orch.ledger.destroy_row(provider.as_ref(), &row).await {
                            return Err(OrchestratorError::Repository(format!(
                                "cannot remove the interrupted validator sandbox `{frozen}`: {e}"
                            )));
                        }
                    }
                    frozen = frozen_gen(&main, generations + 1);
                }
            }
            let frozen = match ensure(orch, &provider, spec, mission, task, &frozen, true).await? {
                Ok(id) => id,
                Err(reason) => return reject(orch, spec, record, seq, key, reason).await,
            };
            let repo = capture::work_repo(&orch.mission_dir(mission), &spec.base_bundle)?;
            let commit = capture::resolve(&repo, &attempt_ref(key))?;
            let bundle = attempt_bundle(orch, mission, task, attempt.ordinal);
            if let Err(why) = stage(provider.as_ref(), &frozen, &bundle, &commit).await {
                return reject(orch, spec, record, seq, key, format!("validator {why}")).await;
            }
            let timeout = parse_duration(&task.validator.timeout).expect("validated");
            if let Some(setup) = &task.validator.setup {
                let req = ExecRequest::shell(setup.clone())
                    .with_cwd("repo")
                    .with_timeout(timeout);
                let why = match provider.exec(&frozen, &req).await {
                    Ok(out) if out.status.success() => None,
                    Ok(out) => Some(format!(
                        "validator setup {}: {}",
                        out.status,
                        tail(out.stderr.as_deref().unwrap_or_default()).trim()
                    )),
                    Err(e) => Some(format!("validator setup could not run: {e}")),
                };
                if let Some(why) = why {
                    return reject(orch, spec, record, seq, key, why).await;
                }
            }
            let req = ExecRequest::shell(task.validator.command.clone())
                .with_cwd("repo")
                .with_timeout(timeout);
            let out = match provider.exec(&frozen, &req).await {
                Ok(out) => out,
                Err(e) => {
                    let why = format!("the validator could not run: {e}");
                    return reject(orch, spec, record, seq, key, why).await;
                }
            };
            let validator_fact = output_json(&out);
            let event = match &out.status {
                ExitStatus::Exited { code: 0 } => {
                    let files = provider
                        .require_files()
                        .map_err(|e| OrchestratorError::Repository(e.to_string()));
                    let mut present = Vec::new();
                    if let Ok(files) = files {
                        for evidence in &task.validator.evidence {
                            if files
                                .read(&frozen, &format!("repo/{evidence}"))
                                .await
                                .is_ok()
                            {
                                present.push(evidence.clone());
                            }
                        }
                    }
                    Event::ValidatorPassed {
                        key: key.clone(),
                        evidence: present,
                    }
                }
                ExitStatus::TimedOut => Event::Rejected {
                    key: key.clone(),
                    reason: format!("validator timed out after {}", task.validator.timeout),
                },
                other => Event::Rejected {
                    key: key.clone(),
                    reason: format!(
                        "validator {other}: {}",
                        tail(out.stderr.as_deref().unwrap_or_default())
                            .lines()
                            .last()
                            .unwrap_or("")
                    ),
                },
            };
            // An accepted attempt's commit is the one just judged: recorded in the same
            // transaction as the verdict (one durable commit, not two).
            let accepted = matches!(event, Event::ValidatorPassed { .. })
                && berth_mission::authority::apply(record, &event).is_ok_and(|next| {
                    next.tasks[index].attempts.iter().any(|a| {
                        &a.key == key && matches!(a.status, AttemptStatus::Accepted { .. })
                    })
                });
            let (events, facts) = match event {
                Event::ValidatorPassed { .. } if accepted => (
                    vec![
                        event,
                        Event::Committed {
                            key: key.clone(),
                            commit: commit.clone(),
                        },
                    ],
                    vec![
                        ("validator", validator_fact),
                        ("commit", json!({ "commit": commit })),
                    ],
                ),
                other => (vec![other], vec![("validator", validator_fact)]),
            };
            let (next, _) = orch
                .commit_events(mission, record, seq, &events, &facts)
                .await?;
            // The frozen copy has served its purpose.
            if let Ok(row) = orch.ledger.row(&frozen.0).await {
                let _ = orch.ledger.destroy_row(provider.as_ref(), &row).await;
            }
            let status = &next.tasks[index]
                .attempts
                .iter()
                .find(|a| &a.key == key)
                .expect("attempt")
                .status;
            match status {
                AttemptStatus::Rejected { reason } => {
                    teardown(orch, spec, key, false).await;
                    Ok(Step::Rejected {
                        key: key.clone(),
                        reason: reason.clone(),
                    })
                }
                _ => Ok(Step::Advanced {
                    key: key.clone(),
                    what: "validator accepted".into(),
                }),
            }
        }
        AttemptStatus::Accepted { commit: None, .. } => {
            // The commit the validator judged, computed on the host at capture.
            let repo = capture::work_repo(&orch.mission_dir(mission), &spec.base_bundle)?;
            let commit = capture::resolve(&repo, &attempt_ref(key))?;
            orch.commit_event(
                mission,
                record,
                seq,
                &Event::Committed {
                    key: key.clone(),
                    commit: commit.clone(),
                },
                &[("commit", json!({ "commit": commit }))],
            )
            .await?;
            Ok(Step::Advanced {
                key: key.clone(),
                what: format!("committed {}", &commit[..12.min(commit.len())]),
            })
        }
        AttemptStatus::Accepted {
            checkpoint: None, ..
        } => {
            let id = or_reject!(existing(orch, provider.as_ref(), &main).await?);
            // A provider snapshot where the provider has one; otherwise a workspace snapshot: the
            // repository exported as a git bundle under the mission directory.
            let (checkpoint, detail) = match provider.snapshots() {
                Some(_) => {
                    // A ledger row keyed by the attempt, recorded before the snapshot: a
                    // checkpoint a crash interrupted is replaced, never duplicated, and the
                    // snapshot is deleted once the mission is over and its retention passed.
                    let snap = orch
                        .ledger
                        .snapshot_tracked(
                            provider.as_ref(),
                            &id,
                            &format!("ck-{}", key.0.trim_start_matches("at-")),
                            &mission_origin(mission, "checkpoint"),
                            Some(CHECKPOINT_RETENTION),
                        )
                        .await
                        .map_err(|e| {
                            OrchestratorError::Repository(format!("checkpoint failed: {e}"))
                        })?;
                    (snap.handle.clone(), json!({ "snapshot": snap }))
                }
                // The captured commit's bundle, written on the host at capture.
                None => {
                    let path = attempt_bundle(orch, mission, task, attempt.ordinal);
                    (
                        format!("bundle:{}", path.display()),
                        json!({ "workspace_bundle": path }),
                    )
                }
            };
            // Finalizing is local (the bundle made at capture, copied): it lands in the same
            // transaction as the checkpoint.
            let path = orch
                .mission_dir(mission)
                .join(format!("{}.bundle", task.id));
            let bytes = final_bundle(orch, spec, mission, task, attempt.ordinal, key, &path)?;
            orch.commit_events(
                mission,
                record,
                seq,
                &[
                    Event::Checkpointed {
                        key: key.clone(),
                        checkpoint: checkpoint.clone(),
                    },
                    Event::Finalized { key: key.clone() },
                ],
                &[
                    ("checkpoint", detail),
                    ("finalize", json!({ "bundle": path, "bytes": bytes })),
                ],
            )
            .await?;
            teardown(orch, spec, key, spec.file.sandbox.keep).await;
            Ok(Step::Advanced {
                key: key.clone(),
                what: format!(
                    "checkpoint {checkpoint}; finalized, task `{}` done",
                    task.id
                ),
            })
        }
        AttemptStatus::Accepted {
            finalized: false, ..
        } => {
            let path = orch
                .mission_dir(mission)
                .join(format!("{}.bundle", task.id));
            let bytes = final_bundle(orch, spec, mission, task, attempt.ordinal, key, &path)?;
            orch.commit_event(
                mission,
                record,
                seq,
                &Event::Finalized { key: key.clone() },
                &[("finalize", json!({ "bundle": path, "bytes": bytes }))],
            )
            .await?;
            teardown(orch, spec, key, spec.file.sandbox.keep).await;
            Ok(Step::Advanced {
                key: key.clone(),
                what: format!("finalized; task `{}` done", task.id),
            })
        }
        other => Err(OrchestratorError::Corrupt(format!(
            "attempt {key} is not open: {other:?}"
        ))),
    }
}

/// Writes the task's final bundle at `path`: the one made at capture, copied (or made again from
/// the work repository when a crash lost it). Returns its size.
fn final_bundle(
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
fn attempt_ref(key: &AttemptKey) -> String {
    // Attempt keys are Berth's own (`at-` + hex); anything else never reaches a ref name.
    let safe: String = key
        .0
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    format!("refs/heads/berth/{safe}")
}

/// Where the attempt's captured commit is bundled on the host.
fn attempt_bundle(
    orch: &Orchestrator<'_>,
    mission: &str,
    task: &Task,
    ordinal: u32,
) -> std::path::PathBuf {
    orch.mission_dir(mission)
        .join(format!("{}.attempt-{ordinal}.bundle", task.id))
}

/// The staging command: `.berth-input.bundle` checked out at `$BERTH_COMMIT` as `repo/`.
pub const STAGE_SCRIPT: &str = "rm -rf repo && git clone -q .berth-input.bundle repo && git -C repo checkout -q --detach \"$BERTH_COMMIT\" && rm -f .berth-input.bundle";

/// Stages a repository bundle at `commit` as `repo/` in the sandbox (replacing what is
/// there). The commit travels in the environment, never in the command line.
async fn stage(
    provider: &dyn Provider,
    id: &NativeId,
    bundle: &std::path::Path,
    commit: &str,
) -> Result<(), String> {
    if !capture::is_commit_id(commit) {
        return Err(format!("`{}` is not a commit id", commit.escape_debug()));
    }
    let bytes =
        std::fs::read(bundle).map_err(|e| format!("cannot read {}: {e}", bundle.display()))?;
    provider
        .require_files()
        .map_err(|e| e.to_string())?
        .write(id, ".berth-input.bundle", &bytes)
        .await
        .map_err(|e| e.to_string())?;
    let req = ExecRequest::shell(STAGE_SCRIPT)
        .with_env("BERTH_COMMIT", commit)
        .with_timeout(Duration::from_secs(600));
    let out = provider.exec(id, &req).await.map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "staging failed: {}",
            tail(out.stderr.as_deref().unwrap_or_default())
        ))
    }
}

async fn reject(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    record: &MissionRecord,
    seq: i64,
    key: &AttemptKey,
    reason: String,
) -> Result<Step, OrchestratorError> {
    orch.commit_event(
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
    teardown(orch, spec, key, false).await;
    Ok(Step::Rejected {
        key: key.clone(),
        reason,
    })
}
