//! `berth prompt ID --harness NAME "instructions"`: an agent CLI in an existing sandbox, its
//! model traffic through a gateway of this process, its normalized events streamed as they
//! arrive.
//!
//! A sandbox on the host's network reaches the gateway's port; an isolated one (docker) a
//! loopback port inside it that its provider forwards here, and runs its image's CLIs
//! (`berth/agent-clis:bookworm`). The sandbox gets the gateway's address and a token for this
//! one run (revoked when the agent stops), never a model credential. The raw log, the events,
//! stderr and the gateway's journal are kept under `$BERTH_HOME/state/prompts/<sandbox>-<run>/`,
//! masked before they are written (the token, the gateway's credential, the artifact store's
//! keys, token shapes), as is the session record: the agent's tools may print anything they
//! can read. Exit 0 when the agent finished its turn without error and did something; 12
//! otherwise (the judgement is printed).
//!
//! After the run, the CLI's session record is taken out of the sandbox (with the agent's home,
//! which goes) and kept by Berth as an agent session (`as-…`, `berth_portable::SessionStore`);
//! `--resume as-…` unpacks it into the next run's fresh home, in any sandbox, and the CLI goes
//! on with the same conversation.

use anyhow::Result;
use berth_contract::{ExecRequest, OutputSink, ProviderExt, Stream};
use berth_gateway::{Gateway, GatewayConfig};
use berth_harness::{judge, launch, launch_resumed, vars, Harness};
use berth_portable::{AgentSession, Saved, SessionTurn};
use serde_json::{json, Value};

use crate::app::App;
use crate::cli::PromptArgs;
use crate::errors::{code, CliError};

mod keep;
mod runs;
mod sessions;

use keep::{keep_session, masked_note, save_turn, take_session, NotTaken, TurnOf};

pub(crate) use sessions::session_store;
pub use sessions::{attempt_session, delete_session, sessions};

pub(crate) use runs::{killed_owners, recover as recover_killed_runs, Outcome as RecoveredOutcome};

/// Keeps the run's logs (masked before they are written: the raw output, the normalized
/// events, stderr) and prints each event as its line completes.
struct Live {
    json: bool,
    logs: berth_orchestrator::AgentLogs,
    shown: usize,
}

impl OutputSink for Live {
    fn chunk(&mut self, stream: Stream, bytes: &[u8]) {
        self.logs.chunk(stream, bytes);
        let events = &self.logs.events()[self.shown..];
        self.shown += events.len();
        show(self.json, events);
    }
}

impl Live {
    /// Every event, the last ones printed.
    fn finish(self) -> std::io::Result<Vec<berth_harness::Event>> {
        let (events, _) = self.logs.finish()?;
        show(self.json, &events[self.shown..]);
        Ok(events)
    }
}

fn show(json: bool, events: &[berth_harness::Event]) {
    // Under `berth serve` the answer is one document; the events are in the logs.
    if crate::output::capturing() {
        return;
    }
    for event in events {
        if json {
            outln!(
                "{}",
                serde_json::to_string(event).expect("events serialize")
            );
        } else {
            let value = serde_json::to_value(event).expect("events serialize");
            outln!("{}", super::watch::human(&value));
        }
    }
}

/// The harness a run uses: the resumed session's, which `--harness` may only repeat.
fn harness_of(args: &PromptArgs, resumed: Option<&AgentSession>) -> Result<Harness> {
    let named = args.harness.as_deref();
    let name = match (resumed, named) {
        (Some(session), Some(named)) if named != session.harness => {
            return Err(CliError::invalid(
                format!(
                    "session `{}` is a {} session; --harness {named} cannot go on with it",
                    session.id, session.harness
                ),
                "leave --harness out to resume, or start a new session without --resume",
            )
            .into())
        }
        (Some(session), _) => session.harness.as_str(),
        (None, Some(named)) => named,
        (None, None) => return Err(CliError::invalid(
            "no harness: name the agent CLI (opencode, codex, claude-code) or a session to resume",
            "give --harness NAME, or --resume as-…",
        )
        .into()),
    };
    Harness::parse(name).ok_or_else(|| {
        CliError::invalid(
            format!(
                "session record names harness `{}`, not one Berth drives",
                name.escape_debug()
            ),
            "`berth sessions` lists this owner's agent sessions",
        )
        .into()
    })
}

/// This run's name: its time and 8 random hex digits, so runs started together in one
/// sandbox (or one millisecond) keep apart their logs, staged archives and agent homes.
fn run_name() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let mut random = [0u8; 4];
    getrandom::fill(&mut random).expect("the OS random source works");
    format!("{millis}-{}", hex::encode(random))
}

/// The run's agent home beside the working directory: its own, so another run in the same
/// sandbox neither wipes it at its start nor takes it as its session record at its end.
fn agent_home(run: &str) -> String {
    format!(".berth-agent-{run}")
}

/// Where the resumed session's archive is staged, relative to the workspace, and its name
/// relative to the working directory.
fn staging(cwd: &str, run: &str) -> (String, String) {
    let name = format!(".berth-session-{run}.tar");
    let dir = cwd.trim_end_matches('/');
    let path = if dir.is_empty() || dir == "." {
        name.clone()
    } else {
        format!("{dir}/{name}")
    };
    (path, name)
}

/// The largest instructions a run takes (an environment variable holds at most 128 KiB).
const MAX_INSTRUCTIONS: usize = 100 << 10;

/// `berth prompt`.
pub async fn prompt(app: &App, args: PromptArgs) -> Result<i32> {
    let upstream = super::gateway::upstream(
        &app.config,
        args.script.as_deref(),
        args.proxy.as_deref(),
        args.credential_env.as_deref(),
    )?;
    prompt_with(app, args, upstream).await
}

/// `berth prompt` with its model given (`args.script` and `args.proxy` are not read; the
/// variable `args.credential_env` names is masked): the CLI's, or what `berth serve` serves.
/// Under `berth serve` (its output captured) the events are not printed: the answer is the
/// `prompt` document.
pub async fn prompt_with(
    app: &App,
    args: PromptArgs,
    upstream: berth_gateway::Upstream,
) -> Result<i32> {
    let timeout = crate::duration::parse(&args.timeout)?;
    // They travel in the agent's environment: no NUL, and within what one variable may hold
    // (the kernel's 128 KiB), refused before anything of the run exists.
    for (what, value, max) in [
        ("instructions", &args.instructions, MAX_INSTRUCTIONS),
        ("model", &args.model, 1024),
        ("working directory", &args.cwd, 4096),
    ] {
        if value.contains('\0') || value.len() > max {
            return Err(CliError::invalid(
                format!("the {what} hold a NUL byte or are over {max} bytes"),
                "they go to the agent in its environment, which holds neither",
            )
            .into());
        }
    }
    // A killed run's turn in this sandbox or of this session is kept first, so this turn
    // follows it.
    for recovered in runs::recover(app, "berth prompt", |r| {
        r.sandbox == args.id || r.resumed.as_ref().map(|s| &s.id) == args.resume.as_ref()
    })
    .await
    {
        errln!("berth: {}", recovered.line());
    }
    let sessions = session_store(app)?;
    let resumed = match &args.resume {
        Some(id) => Some(sessions.get(id).await?),
        None => None,
    };
    let harness = harness_of(&args, resumed.as_ref().map(|(s, _)| s))?;
    let (_, provider, native) = app.sandbox(&args.id).await?;
    if resumed.is_some() {
        provider.require_files()?;
    }
    let reach = berth_orchestrator::GatewayReach::of(app.registry.manifest(provider.id())?)
        .map_err(|why| CliError {
            kind: "unsupported",
            exit_code: code::UNSUPPORTED,
            message: why,
            hint: Some(
                "use a host sandbox, or a docker one from berth/agent-clis:bookworm \
                 (scripts/build-agent-clis-image.sh)"
                    .into(),
            ),
        })?;
    let bin = berth_orchestrator::agent_bin_dir(&app.settings, reach, harness)
        .map_err(|why| CliError::not_found(why, "scripts/install-agent-clis"))?;
    let run = run_name();
    let dir = app
        .config
        .state_dir()
        .join("prompts")
        .join(format!("{}-{run}", args.id));
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
    }
    let gateway = Gateway::new(GatewayConfig {
        upstream,
        prices: None,
    });
    let key = format!("prompt-{}-{run}", args.id);
    let token = gateway.admit(&key, dir.join("gateway.jsonl"));
    let running = gateway.listen(0).await?;
    let link =
        berth_orchestrator::link_gateway(provider.as_ref(), &native, reach, &running).await?;
    let line = match resumed {
        Some(_) => launch_resumed(harness),
        None => launch(harness),
    };
    let mut req = ExecRequest::shell(line)
        .with_cwd(args.cwd.clone())
        .with_timeout(timeout)
        .with_env(vars::BIN, bin)
        .with_env(vars::GATEWAY_URL, link.url.clone())
        .with_env(vars::GATEWAY_TOKEN, token.expose().to_owned())
        .with_env(vars::MODEL, args.model.clone())
        .with_env(vars::INSTRUCTIONS, args.instructions.clone())
        .with_env(vars::AGENT_HOME, agent_home(&run));
    req.max_output_bytes = 64 << 20;
    // Recorded before anything of the run is in the sandbox: a killed run's turn is recovered.
    let in_flight = runs::InFlight::record(
        app,
        &runs::RunRecord {
            schema: runs::RUN_SCHEMA.into(),
            owner: app.ledger.owner().to_owned(),
            run: run.clone(),
            sandbox: args.id.clone(),
            provider: provider.id().to_owned(),
            harness: harness.as_str().into(),
            cwd: args.cwd.clone(),
            model: args.model.clone(),
            credential_env: args.credential_env.clone(),
            staged: resumed.as_ref().map(|_| staging(&args.cwd, &run).0),
            resumed: resumed.as_ref().map(|(s, _)| s.clone()),
            logs: dir.clone(),
            started_at: chrono::Utc::now(),
        },
    )
    .map_err(|e| anyhow::anyhow!("cannot record the run in {}: {e}", dir.display()))?;
    let mut staged = None;
    if let Some((session, archive)) = &resumed {
        let (path, name) = staging(&args.cwd, &run);
        provider
            .require_files()?
            .write(&native, &path, archive)
            .await?;
        req = req
            .with_env(vars::SESSION_ARCHIVE, name)
            .with_env(vars::RESUME_SESSION, session.cli_session.clone());
        staged = Some(path);
    }
    // What this run was handed is masked in everything it keeps (the token too: an agent's
    // tools can print it, and its conversation is kept).
    let mut secrets = berth_orchestrator::publication::known_secrets(
        &app.settings,
        &app.config.home,
        args.credential_env.as_deref(),
        None,
    );
    secrets.push(token.expose().to_owned());
    let redactor = berth_artifacts::Redactor::new(secrets);
    let mut live = Live {
        json: app.json,
        logs: berth_orchestrator::AgentLogs::open(&dir, harness, &key, redactor.clone())?,
        shown: 0,
    };
    // Interrupted (SIGINT, SIGTERM), the agent is stopped and what it did is kept: the turn
    // and its conversation so far (`berth` itself waits for this, up to its bound).
    let mut interrupted = None;
    let ran = {
        let exec = async {
            match provider.streaming() {
                Some(streaming) => streaming
                    .exec_streaming(&native, &req, &mut live)
                    .await
                    .map(|out| out.status),
                None => provider.exec(&native, &req).await.map(|out| {
                    live.chunk(Stream::Stdout, &out.stdout);
                    live.chunk(Stream::Stderr, out.stderr.as_deref().unwrap_or_default());
                    out.status
                }),
            }
        };
        // Dropping the exec stops the agent's whole process group.
        tokio::select! {
            ran = exec => ran,
            signal = crate::stop::requested() => {
                let exit = match signal {
                    "SIGTERM" => code::TERMINATED,
                    _ => code::INTERRUPTED,
                };
                interrupted = Some((exit, signal));
                Ok(stopped_by(signal))
            }
        }
    };
    let events = live.finish();
    gateway.revoke(&token);
    drop(link);
    let status = match ran {
        Ok(status) => status,
        Err(e) => {
            // The launch line removes the staged archive first; a run that never started
            // leaves it in the workspace.
            if let Some(path) = &staged {
                remove_staged(provider.as_ref(), &native, path).await;
            }
            return Err(e.into());
        }
    };
    let events = events
        .map_err(|e| anyhow::anyhow!("cannot keep the agent's logs in {}: {e}", dir.display()))?;
    let judged = judge(harness, &events);
    let verdict = match (&judged.verdict, interrupted) {
        (_, Some((_, signal))) => Some(format!(
            "interrupted: berth received {signal} and stopped the agent before its turn ended"
        )),
        (Ok(()), None) => None,
        (Err(why), None) => Some(why.clone()),
    };
    let turn = SessionTurn {
        turn: resumed.as_ref().map_or(1, |(s, _)| s.turns + 1),
        at: chrono::Utc::now(),
        sandbox: args.id.clone(),
        provider: provider.id().to_owned(),
        cwd: args.cwd.clone(),
        exit: status.to_string(),
        rejected: verdict.clone(),
        tool_calls: judged.tool_calls as u64,
        logs: dir.display().to_string(),
    };
    let kept = keep_session(
        &sessions,
        provider.as_ref(),
        &native,
        harness,
        &args,
        judged.session_id.clone(),
        resumed.map(|(s, _)| s),
        turn,
        (&run, in_flight),
        &redactor,
    )
    .await;
    let finished = json!({
        "harness": harness.as_str(),
        "exit": status,
        "tool_calls": judged.tool_calls,
        "session_id": judged.session_id,
        "rejected": verdict,
        "logs": dir,
        "session": kept.as_ref().ok().map(|(s, _)| s.id.clone()),
        "turn": kept.as_ref().ok().map(|(s, _)| s.turns),
        "forked_from": kept.as_ref().ok().and_then(|(s, _)| s.forked_from.clone()),
        "fork_reason": kept.as_ref().ok().and_then(|(_, saved)| match saved {
            Saved::Forked { why, .. } => Some(why.clone()),
            Saved::Advanced => None,
        }),
        "session_not_kept": kept.as_ref().err(),
        "events": events.len(),
    });
    if crate::output::capturing() {
        crate::output::emit("prompt", finished);
    } else if app.json {
        let mut line = json!({
            "schema": berth_harness::EVENTS_SCHEMA,
            "kind": "prompt_finished",
        });
        if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), finished) {
            line.extend(fields);
        }
        outln!("{line}");
    } else {
        match &verdict {
            None => outln!(
                "berth: {} finished its turn ({} tool calls; {status}); logs in {}",
                harness.as_str(),
                judged.tool_calls,
                dir.display()
            ),
            Some(why) => outln!("berth: {why}; logs in {}", dir.display()),
        }
        match &kept {
            Ok((session, saved)) => {
                if let Saved::Forked { from, why } = saved {
                    outln!(
                        "berth: {why}: this turn is kept as a new session forked from {from}, \
                         which stays as it was"
                    );
                }
                outln!(
                    "berth: agent session {} (turn {}); go on with: berth prompt ID --resume {} \"…\"",
                    session.id,
                    session.turns,
                    session.id
                );
            }
            Err(why) => outln!("berth: the agent session was not kept: {why}"),
        }
    }
    Ok(match (interrupted, &verdict) {
        (Some((exit, _)), _) => exit,
        (None, None) => code::OK,
        (None, Some(_)) => code::VERIFICATION_FAILED,
    })
}

/// Removes a staged session archive (`path`, relative to the workspace) a run left: one that
/// never started, or one that was killed. Best effort: the launch line of a later run in that
/// directory removes any left over 10 minutes.
async fn remove_staged(
    provider: &dyn berth_contract::Provider,
    native: &berth_contract::NativeId,
    path: &str,
) {
    let _ = provider
        .exec(
            native,
            &ExecRequest::shell("rm -f -- \"$BERTH_SESSION_ARCHIVE\"")
                .with_env(vars::SESSION_ARCHIVE, path.to_owned()),
        )
        .await;
}

/// The status of an agent Berth stopped: its own exit was never seen.
fn stopped_by(signal: &str) -> berth_contract::ExitStatus {
    berth_contract::ExitStatus::Unknown {
        reason: format!("berth received {signal} and stopped the agent; its exit was not seen"),
    }
}
