//! Agent sessions outside a run: `berth sessions`, an attempt's conversation kept as one,
//! deleting one, and the store they are kept in.

use anyhow::Result;
use berth_harness::judge;
use berth_portable::{AgentSession, SessionArchive, SessionStore, SessionTurn};
use serde_json::json;

use super::{masked_note, runs};
use crate::app::App;
use crate::errors::{code, CliError};

/// `berth sessions`.
pub async fn sessions(app: &App) -> Result<i32> {
    let found = session_store(app)?.list().await?;
    let killed = runs::waiting(app);
    if app.json {
        crate::output::emit(
            "sessions",
            json!({ "sessions": found, "killed_runs": killed }),
        );
        return Ok(code::OK);
    }
    let unreadable = killed
        .iter()
        .filter(|k| k.get("unreadable").is_some())
        .count();
    if killed.len() > unreadable {
        errln!(
            "berth: {} killed `berth prompt` run(s) left a turn not kept yet; `berth gc` keeps it",
            killed.len() - unreadable
        );
    }
    if unreadable > 0 {
        errln!(
            "berth: {unreadable} record(s) in {} are unreadable; `berth --json sessions` names them",
            app.config.state_dir().join("prompts/running").display()
        );
    }
    if found.is_empty() {
        outln!("no agent sessions for owner {}", app.ledger.owner());
        return Ok(code::OK);
    }
    let mut table = crate::human::Table::new(&["ID", "HARNESS", "TURNS", "LAST RAN IN", "AT"]);
    for s in &found {
        let last = s
            .last()
            .map(|t| format!("{} ({})", t.sandbox, t.provider))
            .unwrap_or_default();
        table.row([
            s.id.clone(),
            s.harness.clone(),
            s.turns.to_string(),
            last,
            s.updated_at.format("%Y-%m-%d %H:%M").to_string(),
        ]);
    }
    out!(
        "{}",
        table.render(crate::human::colour_on_stdout(&app.config))
    );
    Ok(code::OK)
}

/// `berth attempt session KEY`: an agent attempt's conversation (the session record the
/// mission kept beside its logs, and the CLI's id in its events) kept as an agent session.
pub async fn attempt_session(app: &App, key: &str) -> Result<i32> {
    let (logs, harness) = crate::commands::mission::agent_attempt(app, key, "conversation").await?;
    let (_, events) = crate::commands::mission::attempt_events(key, &logs)?;
    let judged = judge(harness, &events);
    let path = logs.dir.join("session.tar");
    let max = berth_portable::MAX_SESSION_ARCHIVE as u64;
    let record = match berth_files::read_regular(&path, max) {
        Ok(bytes) => bytes,
        Err(berth_files::ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CliError::not_found(
                format!(
                    "attempt `{key}` kept no session record ({} is missing)",
                    path.display()
                ),
                "its agent wrote none, or the attempt was rejected before the record was taken",
            )
            .into())
        }
        Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    };
    // Masked when the attempt kept it; again here with what the mission is handed now.
    let mut record = record;
    let redactor =
        berth_artifacts::Redactor::new(berth_orchestrator::publication::mission_secrets(
            &app.settings,
            &app.config.home,
            &logs.spec,
        ));
    let masked = berth_artifacts::redact_archive(&redactor, &mut record);
    let mut archive = SessionArchive::read(&record)?;
    if masked > 0 {
        archive.not_carried.push(masked_note(masked));
    }
    let cli_session = judged.session_id.clone().ok_or_else(|| {
        CliError::invalid(
            format!("attempt `{key}`'s events name no session id of its CLI"),
            "the agent's run did not get far enough to start a conversation",
        )
    })?;
    let model = logs.spec.file.harness.model_name().to_owned();
    let now = chrono::Utc::now();
    let turn = SessionTurn {
        turn: 1,
        at: now,
        sandbox: format!("attempt {key}"),
        provider: logs.spec.file.sandbox.provider.clone(),
        cwd: "repo".into(),
        exit: "unknown here (the attempt's facts have it: berth mission status)".into(),
        rejected: judged.verdict.err(),
        tool_calls: judged.tool_calls as u64,
        logs: logs.dir.display().to_string(),
    };
    let session = AgentSession::first(
        format!("attempt {key} of mission {}", logs.mission),
        harness.as_str(),
        cli_session,
        model,
        turn,
    );
    let (session, _) = session_store(app)?.save(session, archive, None).await?;
    if app.json {
        crate::output::emit(
            "attempt session",
            json!({ "attempt": key, "session": session }),
        );
    } else {
        outln!(
            "{} (attempt {key}'s {} conversation); go on with: berth prompt ID --resume {} --cwd repo \"…\"",
            session.id,
            session.harness,
            session.id
        );
    }
    Ok(code::OK)
}

/// `berth destroy as-…`: deletes an agent session.
pub async fn delete_session(app: &App, id: &str) -> Result<bool> {
    Ok(session_store(app)?.delete(id).await?)
}

pub(crate) fn session_store(app: &App) -> Result<SessionStore> {
    let objects = app.objects()?;
    Ok(SessionStore::new(objects, app.ledger.owner()))
}
