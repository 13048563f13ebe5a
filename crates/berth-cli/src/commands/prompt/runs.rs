//! A `berth prompt` run is recorded before its agent starts, and its record is locked for as
//! long as the `berth` process lives (a lock the kernel drops with the process). A run whose
//! process was killed (SIGKILL, a crash, the machine) leaves its agent's home in the sandbox,
//! holding the conversation so far, and its record, unlocked: `berth gc` — and `berth prompt`
//! in the same sandbox or session, before it starts, and `berth serve` as it starts — takes the
//! conversation out, removes the
//! home and the staged archive, and keeps the turn, marked interrupted with its exit unknown.
//! `berth sessions` lists the runs still waiting for that. Every run keeps the conversation
//! beside its logs (`session.tar`) from the moment it is out of the sandbox — before the home
//! goes — until the turn is saved, so a kill between the two loses nothing.
//!
//! Records live in `$BERTH_HOME/state/prompts/running/RUN.json` (schema
//! `berth.prompt-run/v1`), written whole before they are named (a lock taken on the unnamed
//! file first, so a record is never seen unlocked while its process lives).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use berth_harness::{judge, Harness};
use berth_portable::{AgentSession, SessionTurn};
use serde::{Deserialize, Serialize};

use crate::app::App;

/// The records' schema.
pub(super) const RUN_SCHEMA: &str = "berth.prompt-run/v1";

/// The largest record read back (one holds the resumed session's record, itself bounded).
const MAX_RUN_RECORD: u64 = 4 << 20;

/// How long a record never named is left to the process writing it.
const UNNAMED_KEPT: std::time::Duration = std::time::Duration::from_secs(60);

/// What a run in flight is: enough to take its conversation out of its sandbox and keep it
/// as the turn it was, without the process that ran it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunRecord {
    pub schema: String,
    pub owner: String,
    /// The run's name (its agent home is `.berth-agent-RUN`).
    pub run: String,
    pub sandbox: String,
    pub provider: String,
    pub harness: String,
    pub cwd: String,
    pub model: String,
    /// The variable holding the proxy's credential (its name: the value is read again to be
    /// masked).
    pub credential_env: Option<String>,
    /// The staged session archive, relative to the workspace, for a resumed turn.
    pub staged: Option<String>,
    /// The session record the turn resumed, as it was when the turn started.
    pub resumed: Option<AgentSession>,
    /// The run's logs.
    pub logs: PathBuf,
    pub started_at: chrono::DateTime<chrono::Utc>,
}

fn running_dir(app: &App) -> PathBuf {
    running_under(&app.config.state_dir())
}

fn running_under(state: &Path) -> PathBuf {
    state.join("prompts").join("running")
}

/// A run's record, locked while this process runs it.
#[derive(Debug)]
pub(super) struct InFlight {
    /// Holds the lock.
    _file: File,
    path: PathBuf,
}

impl InFlight {
    /// Records `record` durably before its run touches the sandbox.
    pub(super) fn record(app: &App, record: &RunRecord) -> std::io::Result<InFlight> {
        let dir = running_dir(app);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        let path = dir.join(format!("{}.json", record.run));
        let unnamed = dir.join(format!(".{}.json.tmp", record.run));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&unnamed)?;
        file.lock()?;
        file.write_all(&serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&unnamed, &path)?;
        File::open(&dir)?.sync_all()?;
        Ok(InFlight { _file: file, path })
    }

    /// The run is over and what it had to keep is kept (or it kept nothing): its record goes.
    /// A record this process could not remove is an ended run's, found empty by the next
    /// recovery.
    pub(super) fn done(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Where a run's conversation waits, taken out of the sandbox, until its turn is saved.
pub(super) fn beside_logs(logs: &Path) -> PathBuf {
    logs.join("session.tar")
}

/// What became of a killed run's turn.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// The turn is kept: in the session it resumed, a new one, or a fork.
    Kept {
        session: String,
        turn: u64,
        forked_from: Option<String>,
    },
    /// There was nothing to keep (its sandbox is gone, or the agent left no conversation);
    /// its record is removed.
    NotKept { reason: String },
    /// It could not be looked at now (its provider is away, the store failed); its record
    /// stays for the next try.
    Waiting { reason: String },
}

/// A killed run and what became of it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Recovered {
    pub run: String,
    pub sandbox: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl Recovered {
    /// One line for people.
    pub(crate) fn line(&self) -> String {
        let what = match &self.outcome {
            Outcome::Kept {
                session,
                turn,
                forked_from,
            } => match forked_from {
                Some(from) => format!(
                    "its turn is kept as {session} (turn {turn}, forked from {from}), interrupted"
                ),
                None => format!("its turn is kept as {session} (turn {turn}), interrupted"),
            },
            Outcome::NotKept { reason } => format!("nothing kept: {reason}"),
            Outcome::Waiting { reason } => format!("not recovered yet: {reason}"),
        };
        let line = match self.sandbox.as_str() {
            "" => format!("prompt run record {}: {what}", self.run),
            sandbox => format!("killed prompt run {} in {sandbox}: {what}", self.run),
        };
        crate::human::printable(&line, false).into_owned()
    }
}

/// A record found in the directory: locked by this process (its own process is gone).
struct Found {
    file: File,
    path: PathBuf,
    record: std::result::Result<RunRecord, String>,
}

/// The records of this owner's runs whose process is gone, each locked by this process.
fn killed_runs(app: &App) -> Vec<Found> {
    killed_in(&running_dir(app), Some(app.ledger.owner()))
}

/// The owners whose killed runs wait under `state` (for `berth serve`, which keeps them when it
/// starts: a server killed mid-prompt left them).
pub(crate) fn killed_owners(state: &Path) -> std::collections::BTreeSet<String> {
    killed_in(&running_under(state), None)
        .into_iter()
        .filter_map(|found| found.record.ok().map(|r| r.owner))
        .collect()
}

/// The records in `dir` of runs whose process is gone (of `owner`, when given; an unreadable
/// one is anyone's), each locked by this process.
fn killed_in(dir: &Path, owner: Option<&str>) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = entry.path();
        let Some(file) = lock_if_abandoned(&path) else {
            continue;
        };
        if name.starts_with('.') {
            // A record never named: its process died writing it, before its run began. One
            // just made is not locked yet for a moment: only an old one goes.
            let old = file
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|at| at.elapsed().is_ok_and(|age| age > UNNAMED_KEPT));
            if name.ends_with(".json.tmp") && old {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        if !name.ends_with(".json") {
            continue;
        }
        let record = read_record(&file);
        if let (Ok(record), Some(owner)) = (&record, owner) {
            if record.owner != owner {
                continue;
            }
        }
        found.push(Found { file, path, record });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// The file at `path`, locked, when no live process holds it and it is still the one named
/// there (another recovery may have removed it meanwhile).
fn lock_if_abandoned(path: &Path) -> Option<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    file.try_lock().ok()?;
    let named = std::fs::symlink_metadata(path).ok()?;
    (named.ino() == meta.ino() && named.dev() == meta.dev()).then_some(file)
}

fn read_record(file: &File) -> std::result::Result<RunRecord, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    file.take(MAX_RUN_RECORD + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_RUN_RECORD {
        return Err(format!("larger than {} MiB", MAX_RUN_RECORD >> 20));
    }
    let record: RunRecord = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if record.schema != RUN_SCHEMA {
        return Err(format!("schema `{}`", record.schema.escape_debug()));
    }
    Ok(record)
}

/// Killed runs not recovered yet (for `berth sessions`; no run is touched — only a record
/// never named and over a minute old, a dead writer's, goes).
pub(super) fn waiting(app: &App) -> Vec<serde_json::Value> {
    killed_runs(app)
        .into_iter()
        .map(|found| match found.record {
            Ok(r) => serde_json::json!({
                "run": r.run,
                "sandbox": r.sandbox,
                "harness": r.harness,
                "resumed": r.resumed.map(|s| s.id),
                "started_at": r.started_at,
            }),
            Err(why) => serde_json::json!({
                "record": found.path,
                "unreadable": why,
            }),
        })
        .collect()
}

/// Recovers the turns of killed runs that `which` picks; `by` names the command (it is said
/// in the turn). A record that cannot be read is reported and left for a person to look at.
pub(crate) async fn recover(
    app: &App,
    by: &str,
    which: impl Fn(&RunRecord) -> bool,
) -> Vec<Recovered> {
    let mut recovered = Vec::new();
    for found in killed_runs(app) {
        let record = match found.record {
            Ok(record) => record,
            Err(why) => {
                recovered.push(Recovered {
                    run: found.path.display().to_string(),
                    sandbox: String::new(),
                    outcome: Outcome::Waiting {
                        reason: format!(
                            "its record is unreadable ({why}); remove it once looked at"
                        ),
                    },
                });
                continue;
            }
        };
        if !which(&record) {
            continue;
        }
        let outcome = recover_one(app, by, &record).await;
        if !matches!(outcome, Outcome::Waiting { .. }) {
            let _ = std::fs::remove_file(&found.path);
        }
        drop(found.file);
        recovered.push(Recovered {
            run: record.run,
            sandbox: record.sandbox,
            outcome,
        });
    }
    recovered
}

/// The status of an agent whose `berth` process was killed: its exit was never seen.
fn unseen_exit() -> berth_contract::ExitStatus {
    berth_contract::ExitStatus::Unknown {
        reason: "the berth process running the agent was killed; its exit was not seen".into(),
    }
}

async fn recover_one(app: &App, by: &str, record: &RunRecord) -> Outcome {
    let Some(harness) = Harness::parse(&record.harness) else {
        return Outcome::NotKept {
            reason: format!("harness `{}` is not one Berth drives", record.harness),
        };
    };
    let sandbox = match app.sandbox(&record.sandbox).await {
        Ok((_, provider, native)) => Some((provider, native)),
        Err(err) => {
            let failure = crate::errors::classify(&err);
            if failure.kind != "not_found" {
                return Outcome::Waiting {
                    reason: format!("{}: {}", failure.kind, failure.message),
                };
            }
            None
        }
    };
    // What the run was handed is masked as it would have been (its gateway's token, gone with
    // the process, by its shape).
    let redactor = berth_artifacts::Redactor::new(berth_orchestrator::publication::known_secrets(
        &app.settings,
        &app.config.home,
        record.credential_env.as_deref(),
        None,
    ));
    let taken = match &sandbox {
        Some((provider, native)) => {
            if let Some(staged) = &record.staged {
                super::remove_staged(provider.as_ref(), native, staged).await;
            }
            super::take_session(
                provider.as_ref(),
                native,
                harness,
                &record.cwd,
                &record.run,
                &redactor,
                &beside_logs(&record.logs),
            )
            .await
        }
        None => Ok(None),
    };
    let sessions = match super::session_store(app) {
        Ok(sessions) => sessions,
        Err(e) => {
            return Outcome::Waiting {
                reason: e.to_string(),
            }
        }
    };
    // Killed after its turn was saved (its record names these logs): nothing more to keep.
    match sessions.list().await {
        Ok(listed) => {
            let logs = record.logs.display().to_string();
            if let Some(kept) = listed
                .iter()
                .find(|s| s.history.iter().any(|t| t.logs == logs))
            {
                let _ = std::fs::remove_file(beside_logs(&record.logs));
                return Outcome::NotKept {
                    reason: format!("its turn was kept in {} before the kill", kept.id),
                };
            }
        }
        Err(e) => {
            return Outcome::Waiting {
                reason: e.to_string(),
            }
        }
    }
    let beside = beside_logs(&record.logs);
    let archive = match taken {
        Ok(Some(archive)) => archive,
        // Killed while saving: the conversation was already out of the sandbox.
        Ok(None) => match kept_beside(&beside) {
            Some(archive) => archive,
            None if sandbox.is_none() => {
                return Outcome::NotKept {
                    reason: "its sandbox is gone, with the conversation".into(),
                }
            }
            None => {
                return Outcome::NotKept {
                    reason: "the agent left no conversation (it had not started)".into(),
                }
            }
        },
        Err(super::NotTaken { why, retry: true }) => return Outcome::Waiting { reason: why },
        Err(super::NotTaken { why, retry: false }) => return Outcome::NotKept { reason: why },
    };
    let events = read_events(&record.logs);
    let judged = judge(harness, &events);
    let Some(cli_session) = judged.session_id else {
        let _ = std::fs::remove_file(&beside);
        return Outcome::NotKept {
            reason: "the agent CLI named no session id in its events before the kill".into(),
        };
    };
    let turn = SessionTurn {
        turn: record.resumed.as_ref().map_or(1, |s| s.turns + 1),
        at: chrono::Utc::now(),
        sandbox: record.sandbox.clone(),
        provider: record.provider.clone(),
        cwd: record.cwd.clone(),
        exit: unseen_exit().to_string(),
        rejected: Some(format!(
            "interrupted: the berth process running this turn was killed before keeping it; \
             `{by}` kept the conversation as it was"
        )),
        tool_calls: judged.tool_calls as u64,
        logs: record.logs.display().to_string(),
    };
    let kept = super::save_turn(
        &sessions,
        super::TurnOf {
            harness,
            run: &record.run,
            model: &record.model,
            cli_session,
            resumed: record.resumed.clone(),
            turn,
        },
        archive,
    )
    .await;
    match kept {
        Ok((session, saved)) => {
            let _ = std::fs::remove_file(&beside);
            Outcome::Kept {
                turn: session.turns,
                forked_from: match saved {
                    berth_portable::Saved::Forked { from, .. } => Some(from),
                    berth_portable::Saved::Advanced => None,
                },
                session: session.id,
            }
        }
        Err(why) => Outcome::Waiting {
            reason: format!(
                "its conversation was taken out but not stored ({why}); it waits in {}",
                beside.display()
            ),
        },
    }
}

/// The conversation a run killed while saving kept beside its logs, read with the strict
/// rules again.
fn kept_beside(path: &Path) -> Option<berth_portable::SessionArchive> {
    let bytes = berth_files::read_regular(path, berth_portable::MAX_SESSION_ARCHIVE as u64).ok()?;
    berth_portable::SessionArchive::read(&bytes).ok()
}

/// The events a killed run's logs hold (the last line may be cut short: it is passed over).
fn read_events(logs: &Path) -> Vec<berth_harness::Event> {
    let Ok(bytes) = berth_files::read_regular(
        &logs.join("events.jsonl"),
        crate::commands::mission::MAX_EVENTS,
    ) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record never named is a dead writer's only once old: one just made is about to be
    /// locked by the process writing it, and must not be taken from under it.
    #[test]
    fn an_unnamed_record_goes_only_once_old() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join(".1-aaaa.json.tmp");
        let old = dir.path().join(".2-bbbb.json.tmp");
        std::fs::write(&fresh, b"{").unwrap();
        std::fs::write(&old, b"{").unwrap();
        let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
        File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        assert!(killed_in(dir.path(), None).is_empty());
        assert!(fresh.exists(), "a record being written was removed");
        assert!(!old.exists(), "a dead writer's record stayed");
    }
}
