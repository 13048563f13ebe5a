//! `berth attempt watch KEY` and `berth mission watch ID`: an agent's normalized events, live.
//!
//! The watcher reads only what Berth keeps on the host (`events.jsonl` in the attempt's log
//! directory, appended while the agent runs), so it needs no model credential and no access to
//! the sandbox. It follows the file by (identity, offset): a late watcher replays from the
//! start, a replaced file is replayed again (and said so). While nothing arrives it prints a
//! heartbeat — the monitor's own clock, the offset it holds and how long the agent has been
//! quiet — so a quiet agent is told apart from a stuck monitor; an agent quiet for longer than
//! `--stall` is reported stalled (the watcher keeps following). A mission no runner drives (its
//! run stopped, or its runner is gone) is said to be `unattended`, with the resume that
//! continues it, and `attended` again once a runner holds it. With `--json`, one JSON object a
//! line: the events as Berth stored them, and the monitor's `heartbeat`, `stalled`,
//! `replayed`, `unattended` and `attended` lines, and `mission_finished` (with the mission's
//! final state) last.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use berth_mission::authority::{AttemptStatus, MissionState};
use berth_orchestrator::follow::Follower;
use berth_orchestrator::Runner;
use serde_json::{json, Value};

use crate::app::App;
use crate::cli::WatchArgs;
use crate::errors::{code, CliError};

use berth_orchestrator::follow::POLL_INTERVAL as POLL;
/// How often the attempt's state is read from the store.
const STATE_EVERY: Duration = Duration::from_millis(250);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

struct Limits {
    heartbeat: Duration,
    stall: Duration,
}

fn limits(args: &WatchArgs) -> Result<Limits> {
    Ok(Limits {
        heartbeat: crate::duration::parse(&args.heartbeat)?,
        stall: crate::duration::parse(&args.stall)?,
    })
}

/// One event as a terminal line.
pub(super) fn human(event: &Value) -> String {
    let data = &event["data"];
    let one_line = |v: &Value| {
        let text = v
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| v.to_string());
        let line = text.lines().next().unwrap_or("").to_owned();
        if line.chars().count() > 120 {
            format!("{}…", line.chars().take(120).collect::<String>())
        } else {
            line
        }
    };
    let what = match event["kind"].as_str().unwrap_or("?") {
        "tool_call" => format!("{} {}", one_line(&data["name"]), one_line(&data["input"])),
        "tool_call_update" => format!(
            "{} {}",
            if data["is_error"] == true {
                "error"
            } else {
                "ok"
            },
            one_line(&data["content"])
        ),
        "agent_message_chunk" | "agent_thought_chunk" => one_line(&data["text"]),
        "usage" => {
            let count = |n: &Value| match n {
                Value::Null => "unknown".to_owned(),
                n => n.to_string(),
            };
            format!(
                "input {} (cached {}), output {}",
                count(&data["input"]),
                count(&data["cached"]),
                count(&data["output"])
            )
        }
        "error" => format!(
            "{} ({}): {}",
            one_line(&data["kind"]),
            if data["retryable"] == true {
                "retryable"
            } else {
                "fatal"
            },
            one_line(&data["message"])
        ),
        "turn_completed" => format!(
            "{}{}",
            if data["is_error"] == true {
                "with an error: "
            } else {
                ""
            },
            one_line(&data["result"])
        ),
        "unparsed" => one_line(&data["text"]),
        _ => String::new(),
    };
    // An agent's words and tool output come from the sandbox: shown, never obeyed.
    let line = format!(
        "{:>5} {:<20} {what}",
        event["seq"]
            .as_u64()
            .map(|s| s.to_string())
            .unwrap_or_default(),
        event["kind"].as_str().unwrap_or("?")
    );
    crate::human::printable(&line, false).into_owned()
}

fn monitor_line(json_out: bool, kind: &str, key: &str, fields: Value, text: String) {
    monitor_line_on(json_out, kind, ("attempt", key), fields, text);
}

/// A monitor line about `subject` — (`attempt`, its key) or (`mission`, its id).
fn monitor_line_on(
    json_out: bool,
    kind: &str,
    (field, subject): (&str, &str),
    fields: Value,
    text: String,
) {
    if json_out {
        // In this order, as every monitor line has it: schema, kind, subject, clock, fields.
        let mut line = serde_json::Map::new();
        line.insert("schema".into(), json!(berth_harness::EVENTS_SCHEMA));
        line.insert("kind".into(), json!(kind));
        line.insert(field.into(), json!(subject));
        line.insert("monitor_unix_ms".into(), json!(now_ms()));
        if let Value::Object(fields) = fields {
            line.extend(fields);
        }
        outln!("{}", Value::Object(line));
    } else {
        outln!("      {kind:<20} {}", crate::human::printable(&text, false));
    }
}

/// Whether a runner drives the mission, said when it changes: a watcher is not left waiting on
/// nothing after a run stopped (a provider that failed for now, a killed runner), and hears
/// when a resume picks it up. No runner for a moment is normal (a run starting, a lease
/// changing hands): only one missing for [`UNATTENDED_AFTER`] is said.
struct Attendance {
    said_unattended: bool,
    missing_since: Option<Instant>,
}

/// How long a mission must have had no runner before a watcher says so.
const UNATTENDED_AFTER: Duration = Duration::from_secs(1);

impl Attendance {
    fn new() -> Self {
        Attendance {
            said_unattended: false,
            missing_since: None,
        }
    }

    async fn check(
        &mut self,
        app: &App,
        orch: &berth_orchestrator::Orchestrator<'_>,
        mission: &str,
    ) -> Result<()> {
        let runner = orch.runner(mission).await?;
        if let Runner::Holding { holder, .. } = &runner {
            self.missing_since = None;
            if std::mem::replace(&mut self.said_unattended, false) {
                monitor_line_on(
                    app.json,
                    "attended",
                    ("mission", mission),
                    json!({ "runner": runner }),
                    format!("driven again, by {holder}"),
                );
            }
            return Ok(());
        }
        let since = *self.missing_since.get_or_insert_with(Instant::now);
        if !self.said_unattended && since.elapsed() >= UNATTENDED_AFTER {
            self.said_unattended = true;
            monitor_line_on(
                app.json,
                "unattended",
                ("mission", mission),
                json!({ "runner": runner }),
                format!(
                    "no runner is driving mission {mission}: `berth mission resume {mission}` \
                     continues it (still watching)"
                ),
            );
        }
        Ok(())
    }
}

/// Follows one attempt until its agent's run is over and every event has been shown.
async fn follow_attempt(app: &App, key: &str, limits: &Limits) -> Result<()> {
    let orch = super::mission::orchestrator(app);
    let Some(mut logs) = orch.attempt_logs(key).await? else {
        return Err(CliError::not_found(
            format!("no attempt `{key}` in your missions"),
            "`berth mission status ID` lists a mission's attempts",
        )
        .into());
    };
    if logs.harness().is_none() {
        return Err(CliError::invalid(
            format!("attempt `{key}` runs the `script` harness, which has no event stream"),
            "watch opencode, codex or claude-code attempts",
        )
        .into());
    }
    let mut follower = Follower::new(&logs.dir.join("events.jsonl"));
    let (mut last_event, mut last_beat, mut last_state) =
        (Instant::now(), Instant::now(), Instant::now());
    let mut stalled = false;
    let mut attendance = Attendance::new();
    loop {
        let polled = follower.poll()?;
        if polled.restarted {
            monitor_line(
                app.json,
                "replayed",
                key,
                json!({ "reason": "the event log was replaced (the agent step ran again)" }),
                "the event log was replaced; replaying from the start".into(),
            );
        }
        let drained = polled.lines.is_empty();
        for line in &polled.lines {
            if app.json {
                outln!("{line}");
            } else {
                match serde_json::from_str::<Value>(line) {
                    Ok(event) => outln!("{}", human(&event)),
                    Err(_) => outln!(
                        "      (unreadable line) {}",
                        crate::human::printable(line, false)
                    ),
                }
            }
        }
        if !drained {
            last_event = Instant::now();
            last_beat = Instant::now();
            stalled = false;
        }
        if last_state.elapsed() >= STATE_EVERY {
            last_state = Instant::now();
            if let Some(now) = orch.attempt_logs(key).await? {
                logs = now;
            }
            if !logs.agent_done() {
                attendance.check(app, &orch, &logs.mission).await?;
            }
        }
        // Following for a reader that went away (`| head`) has no one to follow for.
        if crate::output::stdout_gone() {
            return Ok(());
        }
        if logs.agent_done() && drained {
            // One last read: the run may have ended right after the poll above.
            let tail = follower.poll()?;
            for line in &tail.lines {
                if app.json {
                    outln!("{line}");
                } else if let Ok(event) = serde_json::from_str::<Value>(line) {
                    outln!("{}", human(&event));
                }
            }
            if tail.lines.is_empty() {
                return Ok(());
            }
            continue;
        }
        let quiet = follower
            .modified()
            .and_then(|m| m.elapsed().ok())
            .unwrap_or_else(|| last_event.elapsed());
        if last_beat.elapsed() >= limits.heartbeat {
            last_beat = Instant::now();
            monitor_line(
                app.json,
                "heartbeat",
                key,
                json!({ "offset": follower.offset(), "agent_quiet_ms": quiet.as_millis() as u64, "waiting_for_log": polled.missing }),
                format!(
                    "monitor alive; agent quiet for {:.1}s (offset {})",
                    quiet.as_secs_f64(),
                    follower.offset()
                ),
            );
        }
        if !stalled && !polled.missing && quiet >= limits.stall {
            stalled = true;
            monitor_line(
                app.json,
                "stalled",
                key,
                json!({ "agent_quiet_ms": quiet.as_millis() as u64 }),
                format!("no output from the agent for {:.0}s", quiet.as_secs_f64()),
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `berth attempt watch KEY`.
pub async fn attempt(app: &App, key: &str, args: &WatchArgs) -> Result<i32> {
    follow_attempt(app, key, &limits(args)?).await?;
    Ok(code::OK)
}

/// `berth mission watch ID`: every agent attempt's events as they arrive, and each attempt's
/// outcome; ends when the mission has finished.
pub async fn mission(app: &App, id: &str, args: &WatchArgs) -> Result<i32> {
    let limits = limits(args)?;
    let orch = super::mission::orchestrator(app);
    let (spec, _, _) = orch.load(id).await?;
    let agent = berth_harness::Harness::parse(&spec.file.harness.kind).is_some();
    let (mut followed, mut reported) = (BTreeSet::new(), BTreeSet::new());
    let mut attendance = Attendance::new();
    loop {
        let (_, record, _) = orch.load(id).await?;
        let mut progressed = false;
        for task in &record.tasks {
            for attempt in &task.attempts {
                let key = attempt.key.0.clone();
                if agent && followed.insert(key.clone()) {
                    progressed = true;
                    if !app.json {
                        outln!("{}: attempt {} ({key})", task.id, attempt.ordinal);
                    }
                    follow_attempt(app, &key, &limits).await?;
                }
                let outcome = match &attempt.status {
                    AttemptStatus::Accepted { .. } => Some("accepted".to_owned()),
                    AttemptStatus::Rejected { reason } => Some(format!("rejected: {reason}")),
                    AttemptStatus::InProgress { .. } => None,
                };
                if let Some(outcome) = outcome {
                    if reported.insert(key.clone()) {
                        progressed = true;
                        monitor_line(
                            app.json,
                            "attempt_outcome",
                            &key,
                            json!({ "task": task.id, "outcome": outcome }),
                            format!("{} attempt {}: {outcome}", task.id, attempt.ordinal),
                        );
                    }
                }
            }
        }
        if record.state != MissionState::Running && !progressed {
            if app.json {
                // The last line says how it ended, so a reader need not ask again.
                monitor_line_on(
                    true,
                    "mission_finished",
                    ("mission", id),
                    json!({ "state": record.state }),
                    String::new(),
                );
            } else {
                outln!("mission {id}: {}", super::mission::describe(&record.state));
            }
            return Ok(code::OK);
        }
        if !progressed {
            attendance.check(app, &orch, id).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// An agent's text (model-written, from the sandbox) reaches the terminal with its escape
    /// sequences shown, not sent.
    #[test]
    fn an_agents_escape_sequences_are_shown_not_sent() {
        let event = json!({
            "seq": 3,
            "kind": "agent_message_chunk",
            "data": { "text": "done\x1b]0;owned\x07\x1b[2J" }
        });
        let line = super::human(&event);
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(
            line.ends_with("done\\u{1b}]0;owned\\u{7}\\u{1b}[2J"),
            "{line:?}"
        );
    }
}
