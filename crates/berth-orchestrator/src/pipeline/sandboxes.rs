//! An attempt's sandboxes: names, placement (the mission's provider, then its fallbacks),
//! adoption of what a crash left, readiness, reconciliation and teardown.

use super::*;

/// The providers an attempt may use, in order: the mission's provider, then its fallbacks.
pub(crate) fn candidates(spec: &MissionSpec) -> Vec<String> {
    std::iter::once(spec.file.sandbox.provider.clone())
        .chain(spec.file.sandbox.fallback.iter().cloned())
        .collect()
}

/// The attempt's sandbox name on candidate `choice` (0 = the mission's provider).
pub(crate) fn main_name(key: &AttemptKey, choice: usize) -> SandboxName {
    match choice {
        0 => sandbox_name(key),
        n => SandboxName(format!("{}-f{n}", sandbox_name(key).0)),
    }
}

/// Generation `n` (1-based) of the attempt's frozen copy. A freeze interrupted by a crash is
/// not adopted half-made: it is destroyed and the next generation is made under a new name (a
/// ledger name is never reused).
pub(crate) fn frozen_gen(main: &SandboxName, n: usize) -> SandboxName {
    match n {
        1 => SandboxName(format!("{}-v", main.0)),
        n => SandboxName(format!("{}-v{n}", main.0)),
    }
}

/// How long a mission's checkpoints are kept after they are taken, once the mission is no
/// longer running (while it runs, they are always kept).
pub(crate) const CHECKPOINT_RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// Most validator sandboxes one attempt may make before it is rejected (each interrupted
/// validation costs one).
pub(crate) const MAX_FREEZES: usize = 8;

/// Every frozen-copy generation with a ledger row, oldest first.
pub(crate) async fn frozen_rows(
    orch: &Orchestrator<'_>,
    main: &SandboxName,
) -> Result<Vec<berth_store::LedgerRow>, OrchestratorError> {
    let mut rows = Vec::new();
    for n in 1..=MAX_FREEZES {
        match orch.ledger.row(&frozen_gen(main, n).0).await {
            Ok(row) => rows.push(row),
            Err(LedgerError::Store(StoreError::NotFound(..))) => break,
            Err(LedgerError::Store(e)) => return Err(e.into()),
            Err(_) => break,
        }
    }
    Ok(rows)
}

/// The origin recorded on a mission's ledger rows: names the mission, so a sweep leaves what
/// a mission that is still running will adopt.
pub(crate) fn mission_origin(mission: &str, role: &str) -> String {
    format!("mission {mission} {role}")
}

/// The candidate whose sandbox this attempt created and still holds, if any (ledger rows say;
/// a failed or gone row does not count).
pub(crate) async fn placement(
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
            Ok(_) | Err(LedgerError::Store(StoreError::NotFound(..))) => {}
            Err(LedgerError::Store(e)) => return Err(e.into()),
            Err(_) => {}
        }
    }
    Ok(None)
}

pub(crate) fn sandbox_name(key: &AttemptKey) -> SandboxName {
    SandboxName(format!("bx-{}", key.0.trim_start_matches("at-")))
}

/// Creates the attempt's sandbox on the first candidate provider that can take it, moving on
/// only for capacity, quota, a rate limit or unavailability (never for a request the provider refuses).
/// Candidates tried before (their ledger rows exist) are not tried again, unless what stopped
/// them was retryable. Returns the provider, the sandbox name and id, and why earlier
/// candidates were passed over. When no candidate could take it and one of them failed only for
/// now (unreachable, no capacity, throttled), the run stops rather than rejecting the attempt.
#[allow(clippy::type_complexity)]
pub(crate) async fn choose(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    task: &Task,
    mission: &str,
    key: &AttemptKey,
) -> Result<
    Result<(Arc<dyn Provider>, SandboxName, NativeId, Vec<String>), Failure>,
    OrchestratorError,
> {
    let mut skipped = Vec::new();
    let mut for_now = None;
    for (choice, provider_id) in candidates(spec).into_iter().enumerate() {
        let name = main_name(key, choice);
        match orch.ledger.row(&name.0).await {
            Ok(row) => match free_for_retry(orch, &provider_id, &row).await? {
                Ok(true) => {}
                Ok(false) => {
                    skipped.push(format!("{provider_id}: tried before ({})", row.state));
                    continue;
                }
                Err(failure) => return Ok(Err(failure)),
            },
            Err(LedgerError::Store(StoreError::NotFound(..))) => {}
            Err(LedgerError::Store(e)) => return Err(e.into()),
            Err(e) => return Ok(Err(Failure::Reject(e.to_string()))),
        }
        let provider = orch.provider(&provider_id)?;
        match ensure(orch, &provider, spec, mission, task, &name, false).await? {
            Ok(id) => return Ok(Ok((provider, name, id, skipped))),
            Err(Failure::Retry { source, .. }) if source.kind().allows_fallback() => {
                skipped.push(format!("{provider_id}: {source}"));
                for_now = Some(source);
            }
            Err(Failure::Fallback(source)) => skipped.push(format!("{provider_id}: {source}")),
            Err(failure) => return Ok(Err(failure)),
        }
    }
    let doing = format!("no provider could take the attempt: {}", skipped.join("; "));
    Ok(Err(match for_now {
        Some(source) => Failure::Retry { doing, source },
        None => Failure::Reject(doing),
    }))
}

/// Whether a candidate's earlier try at the attempt's sandbox failed only for now (its row
/// records a retryable error and no sandbox): then whatever it left is verified gone and the
/// name freed, so the candidate is tried again.
async fn free_for_retry(
    orch: &Orchestrator<'_>,
    provider_id: &str,
    row: &berth_store::LedgerRow,
) -> Result<Result<bool, Failure>, OrchestratorError> {
    let failed_for_now = matches!(
        row.state,
        LedgerState::CreateFailed | LedgerState::VerifiedGone
    ) && row.last_error_kind.as_deref().is_some_and(|recorded| {
        ErrorKind::ALL
            .iter()
            .any(|kind| kind.as_str() == recorded && kind.retryable())
    });
    if !failed_for_now {
        return Ok(Ok(false));
    }
    if row.state != LedgerState::VerifiedGone {
        let provider = orch.provider(provider_id)?;
        match orch.ledger.destroy_row(provider.as_ref(), row).await {
            Ok(DestroyOutcome::VerifiedGone { .. }) => {}
            Ok(DestroyOutcome::Accepted { .. }) => return Ok(Ok(false)),
            Err(e) => {
                let doing = format!("making sure the failed try `{}` left nothing", row.berth_id);
                return removal_failed(doing, e).map(Err);
            }
        }
    }
    orch.ledger.store().ledger_retire(&row.berth_id).await?;
    Ok(Ok(true))
}

/// A sandbox Berth must remove before the step can go on (`doing`, in words) could not be
/// removed: a retryable provider error stops the run (resume tries again), anything else is an
/// error of the run.
pub(crate) fn removal_failed(doing: String, e: LedgerError) -> Result<Failure, OrchestratorError> {
    match e {
        LedgerError::Provider { source, .. } if source.retryable() => {
            Ok(Failure::Retry { doing, source })
        }
        LedgerError::Store(e) => Err(e.into()),
        e => Err(OrchestratorError::Repository(format!("{doing}: {e}"))),
    }
}

/// Destroys a row's sandbox (unless it is verified gone) and retires its name, so the attempt
/// places again under it. A removal that fails is the step's failure (`doing`, in words).
pub(crate) async fn retire(
    orch: &Orchestrator<'_>,
    provider: &dyn Provider,
    row: &berth_store::LedgerRow,
    doing: String,
) -> Result<Result<(), Failure>, OrchestratorError> {
    if row.state != LedgerState::VerifiedGone {
        if let Err(e) = orch.ledger.destroy_row(provider, row).await {
            return Ok(Err(removal_failed(doing, e)?));
        }
    }
    orch.ledger.store().ledger_retire(&row.berth_id).await?;
    Ok(Ok(()))
}

/// A sandbox that should exist for this attempt: found in the ledger and observed present.
/// A rejection when it is provably gone; the run stops when the provider cannot say for now.
pub(crate) async fn existing(
    orch: &Orchestrator<'_>,
    provider: &dyn Provider,
    name: &SandboxName,
) -> Result<Result<NativeId, Failure>, OrchestratorError> {
    let row = match orch.ledger.row(&name.0).await {
        Ok(row) => row,
        Err(LedgerError::Store(StoreError::NotFound(..))) => {
            return Ok(Err(format!("sandbox `{name}` was never created").into()))
        }
        Err(LedgerError::Store(e)) => return Err(e.into()),
        Err(e) => return Ok(Err(e.to_string().into())),
    };
    if row.state == LedgerState::VerifiedGone {
        return Ok(Err(format!("sandbox `{name}` is gone").into()));
    }
    let id = berth_ledger::native_id(&row);
    match provider.observe(&id).await {
        Ok(Observation::Present { .. }) => Ok(Ok(id)),
        Ok(Observation::Absent) => Ok(Err(format!("sandbox `{name}` is absent").into())),
        Err(e) => Ok(Err(Failure::of(
            format_args!("cannot observe sandbox `{name}`"),
            e,
        ))),
    }
}

/// Adopts the attempt's sandbox if the ledger has it, else creates it under the ledger with the
/// attempt-derived name. Never creates while a ledger row says it may exist.
pub(crate) async fn ensure(
    orch: &Orchestrator<'_>,
    provider: &Arc<dyn Provider>,
    spec: &MissionSpec,
    mission: &str,
    task: &Task,
    name: &SandboxName,
    validator: bool,
) -> Result<Result<NativeId, Failure>, OrchestratorError> {
    match orch.ledger.row(&name.0).await {
        Ok(_) => return existing(orch, provider.as_ref(), name).await,
        Err(LedgerError::Store(StoreError::NotFound(..))) => {}
        Err(LedgerError::Store(e)) => return Err(e.into()),
        Err(e) => return Ok(Err(e.to_string().into())),
    }
    // The mission's image is for providers that take images; one that has none (host,
    // just-bash: `[images] model = "none"` in its manifest) — a fallback, typically — runs
    // without it rather than refusing the request.
    let takes_images = orch
        .registry
        .manifest(provider.id())
        .map_or(true, |manifest| manifest.images.model != "none");
    let image = spec.file.sandbox.image.clone().filter(|_| takes_images);
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
        Err(LedgerError::Provider { source, .. }) if source.retryable() => {
            Ok(Err(Failure::Retry {
                doing: format!("creating sandbox `{name}`"),
                source,
            }))
        }
        Err(LedgerError::Provider { source, .. }) if source.kind().allows_fallback() => {
            Ok(Err(Failure::Fallback(source)))
        }
        Err(LedgerError::Provider { source, .. }) => Ok(Err(source.to_string().into())),
        Err(e) => Ok(Err(e.to_string().into())),
    }
}

/// The row's resource is present and running (not absent, not still being created).
pub(crate) async fn is_ready(provider: &dyn Provider, row: &berth_store::LedgerRow) -> bool {
    row.state != LedgerState::VerifiedGone
        && matches!(
            provider.observe(&berth_ledger::native_id(row)).await,
            Ok(Observation::Present {
                state: CanonicalState::Running,
                ..
            })
        )
}

/// Recovery: sandboxes of attempts that are over (rejected, or finalized and not kept) must be
/// gone; a crash between an attempt's last event and its teardown leaves them, so every tick
/// finishes that teardown first.
pub(crate) async fn reconcile(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    record: &MissionRecord,
) -> Result<(), OrchestratorError> {
    let mut over = Vec::new();
    let cancelled = matches!(record.state, MissionState::Cancelled { .. });
    for task in &record.tasks {
        for attempt in &task.attempts {
            match &attempt.status {
                // A cancelled mission's attempts are all over, whatever their status.
                AttemptStatus::InProgress { .. } if cancelled => {
                    over.push((attempt.key.clone(), false))
                }
                AttemptStatus::Accepted { .. } if cancelled => {
                    over.push((attempt.key.clone(), spec.file.sandbox.keep))
                }
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
        // Once per runner for an attempt it saw fully torn down: the first pass (also after a
        // restart) repeats destroys a killed runner may have left to an engine.
        if !orch.settled.contains(&key) {
            teardown(orch, spec, &key, keep_main, Recheck::GoneToo).await;
        }
    }
    Ok(())
}

/// Which of an attempt's rows a teardown destroys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recheck {
    /// Those not verified gone: right after a step of this runner.
    OpenOnly,
    /// Verified-gone ones again too (see below): [`reconcile`], once per runner.
    GoneToo,
}

/// Destroys the attempt's sandboxes on every candidate provider (ledger-verified), unless the
/// mission keeps the main one. When every one is verified gone, the attempt is settled for this
/// orchestrator.
pub(crate) async fn teardown(
    orch: &Orchestrator<'_>,
    spec: &MissionSpec,
    key: &AttemptKey,
    keep_main: bool,
    recheck: Recheck,
) {
    let mut all_gone = true;
    for choice in 0..candidates(spec).len() {
        let main = main_name(key, choice);
        let mut rows = frozen_rows(orch, &main).await.unwrap_or_default();
        if !keep_main {
            if let Ok(row) = orch.ledger.row(&main.0).await {
                rows.push(row);
            }
        }
        for row in rows {
            if row.state == LedgerState::VerifiedGone && recheck == Recheck::OpenOnly {
                continue;
            }
            let Ok(provider) = orch.provider(&row.provider) else {
                all_gone = false;
                continue;
            };
            if row.state != LedgerState::VerifiedGone {
                let gone = orch.ledger.destroy_row(provider.as_ref(), &row).await;
                all_gone &= matches!(gone, Ok(DestroyOutcome::VerifiedGone { .. }));
            } else {
                // Verified gone, but an engine may finish work a killed runner asked for after
                // that (a fork's image committed late): destroying again is idempotent and
                // removes it.
                let again = provider.destroy(&berth_ledger::native_id(&row)).await;
                all_gone &= matches!(again, Ok(DestroyOutcome::VerifiedGone { .. }));
            }
        }
    }
    // Settled for this runner once every row is verified gone — after rechecking gone rows,
    // unless this runner claimed the attempt (no other runner can have left work for it).
    if all_gone && (recheck == Recheck::GoneToo || orch.settled.claimed_here(key)) {
        orch.settled.settle(key);
    }
}
