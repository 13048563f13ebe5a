//! Keeping a run's turn: its conversation taken out of the sandbox (kept beside the logs
//! before the agent's home goes), then saved as an agent session — the next turn of the one it
//! resumed, a new one, or a fork.

use berth_contract::ExecRequest;
use berth_harness::{archive_session, remove_agent_home, vars, Harness};
use berth_portable::{AgentSession, Saved, SessionArchive, SessionStore, SessionTurn};

use super::{agent_home, runs};
use crate::cli::PromptArgs;

/// `BERTH_FAULT=kill-in-session:STEP`: SIGKILL this process once keeping the turn's session
/// has done STEP — `taken` (the record out of the sandbox, kept beside the logs), `home-removed`,
/// then saving's `claimed`, `archived`, `recorded` (crash tests).
fn crash_at(step: &str) {
    if std::env::var("BERTH_FAULT").ok().as_deref() == Some(&format!("kill-in-session:{step}")) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    }
}

fn crash_after(step: berth_portable::SaveStep) {
    crash_at(step.as_str());
}

/// A turn to keep: what it ran and what it resumed.
pub(super) struct TurnOf<'a> {
    pub harness: Harness,
    /// The run's name (its claim of the resumed session's next turn is its own).
    pub run: &'a str,
    pub model: &'a str,
    /// The CLI's conversation id, from its events.
    pub cli_session: String,
    /// The session record the turn started from.
    pub resumed: Option<AgentSession>,
    pub turn: SessionTurn,
}

/// Keeps the run's session: a new one, or the next turn of the resumed one. The run's record
/// goes once its turn is kept or there is nothing to keep; while the conversation is still in
/// the sandbox or not stored, it stays, and `berth gc` tries again.
#[allow(clippy::too_many_arguments)]
pub(super) async fn keep_session(
    sessions: &SessionStore,
    provider: &dyn berth_contract::Provider,
    native: &berth_contract::NativeId,
    harness: Harness,
    args: &PromptArgs,
    cli_session: Option<String>,
    resumed: Option<AgentSession>,
    turn: SessionTurn,
    (run, in_flight): (&str, runs::InFlight),
    redactor: &berth_artifacts::Redactor,
) -> std::result::Result<(AgentSession, Saved), String> {
    let beside = runs::beside_logs(std::path::Path::new(&turn.logs));
    let archive = match take_session(provider, native, harness, &args.cwd, run, redactor, &beside)
        .await
    {
        Ok(archive) => archive,
        Err(NotTaken { why, retry: true }) => return Err(format!("{why}; `berth gc` tries again")),
        Err(NotTaken { why, retry: false }) => {
            in_flight.done();
            return Err(why);
        }
    };
    let (cli_session, archive) = match (cli_session, archive) {
        (Some(cli_session), Some(archive)) => (cli_session, archive),
        (cli_session, _) => {
            in_flight.done();
            let _ = std::fs::remove_file(&beside);
            return Err(match cli_session {
                None => "the agent CLI named no session id in its events",
                Some(_) => "the agent CLI left no session record",
            }
            .to_owned());
        }
    };
    let of = TurnOf {
        harness,
        run,
        model: &args.model,
        cli_session,
        resumed,
        turn,
    };
    let saved = save_turn(sessions, of, archive).await.map_err(|why| {
        format!(
            "{why}; its record is kept in {}, and `berth gc` tries again",
            beside.display()
        )
    })?;
    let _ = std::fs::remove_file(&beside);
    in_flight.done();
    Ok(saved)
}

/// Saves a turn with its conversation `archive`: a new session, the next turn of the resumed
/// one, or a fork of it.
pub(super) async fn save_turn(
    sessions: &SessionStore,
    of: TurnOf<'_>,
    archive: SessionArchive,
) -> std::result::Result<(AgentSession, Saved), String> {
    let TurnOf {
        harness,
        run,
        model,
        cli_session,
        resumed,
        turn,
    } = of;
    // A resumed CLI that reports another conversation than the one it was given did not go
    // on with it: the turn is a new session, and the resumed one stays as it was.
    let mut forked = None;
    if let Some(started) = &resumed {
        if started.cli_session != cli_session {
            forked = Some(format!(
                "the CLI went on in another conversation (`{}`) than the one resumed (`{}`)",
                cli_session.escape_debug(),
                started.cli_session.escape_debug()
            ));
        }
    }
    let session = match &resumed {
        Some(started) => {
            let mut next = started.clone();
            if forked.is_some() {
                next.id = SessionStore::new_id();
                next.forked_from = Some(started.id.clone());
            }
            next.cli_session = cli_session;
            next.model = model.to_owned();
            next.updated_at = turn.at;
            next.turns += 1;
            next.history.push(turn);
            next
        }
        None => AgentSession::first(
            "prompt".into(),
            harness.as_str(),
            cli_session,
            model.to_owned(),
            turn,
        ),
    };
    let (session, saved) = sessions
        .save_observed(
            session,
            archive,
            resumed.as_ref().filter(|_| forked.is_none()),
            Some(run),
            &mut crash_after,
        )
        .await
        .map_err(|e| format!("the agent session could not be stored: {e}"))?;
    match (forked, resumed) {
        (Some(why), Some(started)) => Ok((
            session,
            Saved::Forked {
                from: started.id,
                why,
            },
        )),
        _ => Ok((session, saved)),
    }
}

/// Why a session record was not taken: `retry` when the sandbox could not be asked (the agent's
/// home is still there, for a later try), otherwise a refusal that trying again cannot change
/// (the home is removed all the same).
pub(super) struct NotTaken {
    pub why: String,
    pub retry: bool,
}

/// Takes the CLI's session record out of the sandbox, masked by `redactor` and read with the
/// strict rules, keeps it at `beside` (durable before the agent's home goes), then removes the
/// agent's home there. `Ok(None)`: the CLI left none.
pub(super) async fn take_session(
    provider: &dyn berth_contract::Provider,
    native: &berth_contract::NativeId,
    harness: Harness,
    cwd: &str,
    run: &str,
    redactor: &berth_artifacts::Redactor,
    beside: &std::path::Path,
) -> std::result::Result<Option<SessionArchive>, NotTaken> {
    let in_home = |line: String| {
        ExecRequest::shell(line)
            .with_cwd(cwd.to_owned())
            .with_env(vars::AGENT_HOME, agent_home(run))
            .with_timeout(std::time::Duration::from_secs(60))
    };
    let retry = |why: String| NotTaken { why, retry: true };
    let mut req = in_home(archive_session(harness));
    req.max_output_bytes = berth_portable::MAX_SESSION_ARCHIVE + 1;
    let out = provider
        .exec(native, &req)
        .await
        .map_err(|e| retry(format!("the session record could not be collected: {e}")))?;
    let taken = if !out.status.success() {
        Err(format!(
            "collecting the session record ended {}",
            out.status
        ))
    } else if out.stdout_truncated() {
        Err(format!(
            "the session record is larger than {} MiB",
            berth_portable::MAX_SESSION_ARCHIVE >> 20
        ))
    } else if out.stdout.is_empty() {
        Ok(None)
    } else {
        let mut record = out.stdout;
        let masked = berth_artifacts::redact_archive(redactor, &mut record);
        SessionArchive::read(&record)
            .map_err(|e| e.to_string())
            .map(|mut archive| {
                if masked > 0 {
                    archive.not_carried.push(masked_note(masked));
                }
                Some(archive)
            })
    };
    if let Ok(Some(archive)) = &taken {
        // The logs' directory (0700), made again if it was removed meanwhile.
        let made = beside.parent().map_or(Ok(()), |dir| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
        });
        made.and_then(|()| std::fs::write(beside, &archive.archive))
            .map_err(|e| {
                retry(format!(
                    "cannot keep the session record in {}: {e}",
                    beside.display()
                ))
            })?;
        crash_at("taken");
    }
    let removed = provider
        .exec(native, &in_home(remove_agent_home()))
        .await
        .map_err(|e| retry(format!("the agent's home could not be removed: {e}")))?;
    if !removed.status.success() {
        return Err(retry(format!(
            "removing the agent's home ended {}",
            removed.status
        )));
    }
    crash_at("home-removed");
    taken.map_err(|why| NotTaken { why, retry: false })
}

/// What a session record says of the secrets masked in it.
pub(super) fn masked_note(masked: usize) -> String {
    format!(
        "{masked} secret value(s) the conversation held, masked with `*` of the same length \
         (Berth keeps no secret; the CLI reads the masks)"
    )
}
