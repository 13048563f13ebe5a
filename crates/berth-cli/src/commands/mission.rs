//! `berth mission run|resume|status|list`.

use anyhow::Result;
use berth_mission::authority::{AttemptStatus, MissionRecord, MissionState, TaskState};
use berth_orchestrator::{Boundary, Orchestrator, Runner, Step};
use berth_store::MissionStore;
use serde_json::json;

use crate::app::App;
use crate::cli::MissionCommand;
use crate::errors::code;
use crate::output::emit;

/// `BERTH_FAULT=kill-before-event:N|kill-after-event:N|kill-in-publication:N`: SIGKILL this
/// process at that durable boundary (crash-recovery tests).
fn crash_at(boundary: Boundary) {
    let Ok(fault) = std::env::var("BERTH_FAULT") else {
        return;
    };
    let hit = match (fault.split_once(':'), boundary) {
        (Some(("kill-before-event", n)), Boundary::BeforeEvent(at))
        | (Some(("kill-after-event", n)), Boundary::AfterEvent(at)) => n.parse() == Ok(at),
        (Some(("kill-in-publication", n)), Boundary::Publication(at)) => n.parse() == Ok(at),
        _ => false,
    };
    if hit {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    }
}

pub(super) fn orchestrator(app: &App) -> Orchestrator<'_> {
    Orchestrator {
        store: app.ledger.store(),
        ledger: &app.ledger,
        registry: &app.registry,
        config: &app.provider_config,
        home: &app.config.home,
        boundary: Some(crash_at),
        lease: Default::default(),
        gateways: Default::default(),
        settled: Default::default(),
        last_stored: Default::default(),
        providers: Default::default(),
    }
}

fn exit_for(state: &MissionState) -> i32 {
    match state {
        MissionState::Succeeded => code::OK,
        // Nothing failed verification: it was ended on purpose, and cannot run again.
        MissionState::Cancelled { .. } => code::CONFLICT,
        _ => code::VERIFICATION_FAILED,
    }
}

async fn drive(app: &App, id: &str) -> Result<i32> {
    use crate::human::printable;
    let orch = orchestrator(app);
    let json = app.json;
    let started = std::time::Instant::now();
    let mut report = |step: &Step| {
        if json {
            return;
        }
        let at = started.elapsed().as_secs_f64();
        match step {
            Step::Claimed { task, key } => outln!("[{at:>7.2}s] {task}: attempt {key} claimed"),
            // What an attempt did and why it was rejected come from sandboxes and repositories.
            Step::Advanced { key, what } => {
                outln!("[{at:>7.2}s]   {key}: {}", printable(what, true))
            }
            Step::Rejected { key, reason } => {
                outln!(
                    "[{at:>7.2}s]   {key}: REJECTED — {}",
                    printable(reason, true)
                )
            }
            Step::Finished(state) => outln!("[{at:>7.2}s] mission {id}: {}", describe(state)),
        }
    };
    let state = orch.run(id, &mut report).await?;
    if json {
        return status(app, id).await.map(|_| exit_for(&state));
    }
    Ok(exit_for(&state))
}

pub(super) fn describe(state: &MissionState) -> String {
    match state {
        MissionState::Running => "running".into(),
        MissionState::Succeeded => "succeeded".into(),
        MissionState::Failed { task } => format!("FAILED (task `{task}` exhausted its attempts)"),
        MissionState::Cancelled { reason } => format!("CANCELLED ({reason})"),
    }
}

/// `berth mission cancel ID`: ends the mission, then says which of its sandboxes are gone,
/// kept (`sandbox.keep`), or not removed yet (exit 10; `berth ledger sweep` finishes).
async fn cancel(app: &App, id: &str, reason: &str) -> Result<i32> {
    if reason.chars().count() > 500 || reason.chars().any(char::is_control) || reason.is_empty() {
        return Err(crate::errors::CliError::invalid(
            "--reason must be 1 to 500 characters without control characters",
            "give a shorter reason on one line",
        )
        .into());
    }
    let (state, teardown) = orchestrator(app).cancel(id, reason).await?;
    if app.json {
        emit(
            "mission cancel",
            json!({ "mission": id, "state": state, "sandboxes": teardown }),
        );
    } else {
        outln!(
            "mission {id}: {}",
            crate::human::printable(&describe(&state), true)
        );
        outln!("  {} sandbox(es) verified gone", teardown.verified_gone);
        for name in &teardown.kept {
            outln!("  kept: {name} (the mission file says `keep`)");
        }
        for left in &teardown.not_removed {
            let why = left.error.as_deref().unwrap_or("not removed yet");
            outln!(
                "  NOT removed: {} ({}): `berth ledger sweep` removes it",
                left.sandbox,
                crate::human::printable(why, true)
            );
        }
    }
    Ok(if teardown.not_removed.is_empty() {
        code::OK
    } else {
        code::CLEANUP_INCOMPLETE
    })
}

async fn status(app: &App, id: &str) -> Result<i32> {
    let orch = orchestrator(app);
    let (spec, record, seq) = orch.load(id).await?;
    let runner = orch.runner(id).await?;
    let facts = app.ledger.store().attempt_facts(id).await?;
    let stopped = last_stop(app, id, &record, &runner, &facts).await?;
    if app.json {
        let facts: Vec<_> = facts
            .iter()
            .map(|f| json!({
                "attempt": f.attempt_key, "kind": f.kind, "at": f.at,
                "detail": serde_json::from_str::<serde_json::Value>(&f.detail_json).unwrap_or_default(),
            }))
            .collect();
        emit(
            "mission status",
            json!({ "mission": record, "events": seq, "base_commit": spec.base_commit, "runner": runner, "stopped": stopped, "facts": facts }),
        );
        return Ok(code::OK);
    }
    print_record(&record, &spec.base_commit, seq);
    if record.state == MissionState::Running {
        let line = match &runner {
            Runner::None => {
                format!("no runner is driving it: `berth mission resume {id}` continues it")
            }
            Runner::Holding { holder, expires_at } => {
                format!("driven by {holder} (lease until {expires_at})")
            }
            Runner::Gone { holder, .. } => {
                format!("its runner ({holder}) is gone: `berth mission resume {id}` takes over")
            }
        };
        outln!("  {}", crate::human::printable(&line, true));
    }
    if let Some(stop) = &stopped {
        let line = match stop["stop"].as_str() {
            Some("before_agent") => format!(
                "the last run stopped before the agent of {} ran ({}): {}; once that is fixed, \
                 `berth mission resume {id}`",
                stop["attempt"].as_str().unwrap_or("?"),
                stop["at"].as_str().unwrap_or("?"),
                stop["reason"].as_str().unwrap_or("?")
            ),
            _ => format!(
                "the last run stopped at {} ({}): {}; `berth mission resume {id}` runs that step \
                 again",
                stop["attempt"].as_str().unwrap_or("?"),
                stop["at"].as_str().unwrap_or("?"),
                stop["reason"].as_str().unwrap_or("?")
            ),
        };
        outln!("  {}", crate::human::printable(&line, false));
    }
    for fact in facts
        .iter()
        .filter(|f| f.kind == "agent" || f.kind == "validator")
    {
        let detail: serde_json::Value = serde_json::from_str(&fact.detail_json).unwrap_or_default();
        outln!(
            "  {} {:<9} {} ({:.0} ms)",
            fact.attempt_key,
            fact.kind,
            detail["status"],
            detail["duration_ms"].as_f64().unwrap_or(f64::NAN)
        );
    }
    Ok(code::OK)
}

/// Why the last run stopped with an attempt in progress, while that is still the news: the
/// mission is running, nothing drives it, and nothing was appended since the stop.
async fn last_stop(
    app: &App,
    id: &str,
    record: &MissionRecord,
    runner: &Runner,
    facts: &[berth_store::AttemptFact],
) -> Result<Option<serde_json::Value>> {
    if record.state != MissionState::Running || matches!(runner, Runner::Holding { .. }) {
        return Ok(None);
    }
    let Some(stop) = facts.iter().rev().find(|f| f.kind == "run_stopped") else {
        return Ok(None);
    };
    if stop.at < app.ledger.store().mission_get(id).await?.updated_at {
        return Ok(None);
    }
    let mut detail: serde_json::Value = serde_json::from_str(&stop.detail_json).unwrap_or_default();
    detail["attempt"] = json!(stop.attempt_key);
    detail["at"] = json!(stop.at);
    Ok(Some(detail))
}

fn print_record(record: &MissionRecord, base: &str, events: i64) {
    outln!(
        "mission {}: {} (base {}, {events} events)",
        record.id,
        describe(&record.state),
        &base[..12.min(base.len())]
    );
    for task in &record.tasks {
        let state = match &task.state {
            TaskState::Open => "open".to_owned(),
            TaskState::Done { accepted } => format!("done (accepted {accepted})"),
            TaskState::Exhausted => "EXHAUSTED".to_owned(),
        };
        outln!(
            "  task {} — {state}, {}/{} attempts",
            task.id,
            task.attempts.len(),
            task.max_attempts
        );
        let cancelled = matches!(record.state, MissionState::Cancelled { .. });
        for attempt in &task.attempts {
            let outcome = match &attempt.status {
                AttemptStatus::InProgress { phase } if cancelled => {
                    format!("no verdict: the mission was cancelled at {phase:?}")
                }
                AttemptStatus::InProgress { phase } => format!("in progress ({phase:?})"),
                AttemptStatus::Rejected { reason } => format!("rejected: {reason}"),
                AttemptStatus::Accepted {
                    commit,
                    checkpoint,
                    finalized,
                    ..
                } => format!(
                    "accepted; commit {}, checkpoint {}, finalized {finalized}",
                    commit
                        .as_deref()
                        .map(|c| &c[..12.min(c.len())])
                        .unwrap_or("-"),
                    checkpoint
                        .as_deref()
                        .map(|c| &c[..19.min(c.len())])
                        .unwrap_or("-"),
                ),
            };
            outln!(
                "    #{} {} {}",
                attempt.ordinal,
                attempt.key,
                crate::human::printable(&outcome, true)
            );
        }
    }
}

/// Runs a mission subcommand.
pub async fn run(app: &App, command: MissionCommand) -> Result<i32> {
    match command {
        MissionCommand::Run {
            file,
            allow_outside_path,
        } => {
            let id = orchestrator(app)
                .create_with(&file, allow_outside_path)
                .await?;
            if !app.json {
                outln!("mission {id} registered from {}", file.display());
            }
            drive(app, &id).await
        }
        MissionCommand::Resume { id } => drive(app, &id).await,
        MissionCommand::Cancel { id, reason } => cancel(app, &id, &reason).await,
        MissionCommand::Status { id } => status(app, &id).await,
        MissionCommand::Bench { .. } => unreachable!("dispatched to berth_bench::mission"),
        MissionCommand::Watch { .. } => unreachable!("dispatched to commands::watch"),
        MissionCommand::List => {
            let rows = app.ledger.store().mission_list(app.ledger.owner()).await?;
            if app.json {
                let missions: Vec<_> = rows
                    .iter()
                    .map(|r| json!({ "id": r.id, "name": r.name, "state": r.state, "events": r.seq, "created_at": r.created_at, "updated_at": r.updated_at }))
                    .collect();
                emit("mission list", json!({ "missions": missions }));
            } else if rows.is_empty() {
                outln!("no missions (start one with `berth mission run FILE`)");
            } else {
                for r in rows {
                    outln!(
                        "{:<32} {:<10} {:>4} events  {}",
                        r.id,
                        r.state,
                        r.seq,
                        r.updated_at.format("%Y-%m-%d %H:%M:%S")
                    );
                }
            }
            Ok(code::OK)
        }
    }
}

/// Attempt `key` of this owner's missions and the agent CLI it ran (`what` it has that a
/// `script` attempt has not: for the error).
pub(super) async fn agent_attempt(
    app: &App,
    key: &str,
    what: &str,
) -> Result<(berth_orchestrator::AttemptLogs, berth_harness::Harness)> {
    let orch = orchestrator(app);
    let Some(logs) = orch.attempt_logs(key).await? else {
        return Err(crate::errors::CliError::not_found(
            format!("no attempt `{key}` in your missions"),
            "`berth mission status ID` lists a mission's attempts",
        )
        .into());
    };
    let Some(harness) = logs.harness() else {
        return Err(crate::errors::CliError::invalid(
            format!("attempt `{key}` ran the `script` harness, which has no agent {what}"),
            "only opencode, codex and claude-code attempts have one",
        )
        .into());
    };
    Ok((logs, harness))
}

/// The largest events log read back (`events.jsonl`: written by Berth, sized by the agent).
pub(crate) const MAX_EVENTS: u64 = 256 << 20;

/// An agent attempt's normalized events: the file's text and the events.
pub(super) fn attempt_events(
    key: &str,
    logs: &berth_orchestrator::AttemptLogs,
) -> Result<(String, Vec<berth_harness::Event>)> {
    let path = logs.dir.join("events.jsonl");
    // Written by Berth from the agent's output, but its size is the agent's: bounded, and
    // opened without blocking.
    let text = match berth_files::read_regular(&path, MAX_EVENTS) {
        Ok(bytes) => String::from_utf8(bytes)
            .map_err(|_| anyhow::anyhow!("{} is not UTF-8", path.display()))?,
        Err(berth_files::ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(crate::errors::CliError::not_found(
                format!(
                    "attempt `{key}` has no events yet ({} is missing)",
                    path.display()
                ),
                "the agent has not finished its run, or the attempt was rejected before it ran",
            )
            .into())
        }
        Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    };
    let events = text
        .lines()
        .map(serde_json::from_str::<berth_harness::Event>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{} is unreadable: {e}", path.display()))?;
    Ok((text, events))
}

/// `berth attempt trajectory KEY [--format atif|events]`.
pub async fn attempt(app: &App, command: crate::cli::AttemptCommand) -> Result<i32> {
    let crate::cli::AttemptCommand::Trajectory { key, format } = command else {
        unreachable!("watch and session are dispatched to their own commands")
    };
    let (logs, harness) = agent_attempt(app, &key, "trajectory").await?;
    let (text, events) = attempt_events(&key, &logs)?;
    if format == "events" {
        if app.json {
            emit(
                "attempt trajectory",
                json!({ "attempt": key, "events": events }),
            );
        } else {
            out!("{text}");
        }
        return Ok(code::OK);
    }
    let model = logs.spec.file.harness.model_name();
    let trajectory =
        berth_harness::atif::trajectory(harness, logs.instructions(), Some(model), &events)
            .map_err(|why| {
                crate::errors::CliError::invalid(why, "the attempt did nothing to export")
            })?;
    if app.json {
        emit(
            "attempt trajectory",
            json!({ "attempt": key, "trajectory": trajectory }),
        );
    } else {
        outln!(
            "{}",
            serde_json::to_string_pretty(&trajectory).expect("json serializes")
        );
    }
    Ok(code::OK)
}
