//! Agent harnesses: the coding-agent CLIs a mission can run, as data.
//!
//! For each CLI this crate knows how to launch it headless against Berth's model gateway
//! ([`launch`]: a shell line plus environment, never splicing the task's text or the token into
//! the line), how to read its event stream into Berth's normalized events ([`events`]), and how
//! to judge an attempt from those events rather than the exit code ([`judge`]): OpenCode exits
//! 0 after auto-rejecting a permission, Claude Code can report `subtype: "success"` with
//! `is_error: true`, and an agent that made no tool call did nothing worth validating.
//!
//! Pure: no I/O. The orchestrator runs the line in a sandbox and stores what comes back.

pub mod atif;
pub mod events;

use serde::{Deserialize, Serialize};

pub use crate::events::{json_schema, normalize, Event, EventKind, Normalizer, EVENTS_SCHEMA};

/// The agent CLIs Berth drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Harness {
    /// OpenCode (`opencode run --format json`), OpenAI Chat Completions.
    Opencode,
    /// Codex CLI (`codex exec --json`), OpenAI Responses.
    Codex,
    /// Claude Code (`claude -p --output-format stream-json`), Anthropic Messages.
    ClaudeCode,
}

impl Harness {
    /// Every harness.
    pub const ALL: [Harness; 3] = [Harness::Opencode, Harness::Codex, Harness::ClaudeCode];

    /// The mission file's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Harness::Opencode => "opencode",
            Harness::Codex => "codex",
            Harness::ClaudeCode => "claude-code",
        }
    }

    /// From the mission file's name.
    pub fn parse(name: &str) -> Option<Harness> {
        Harness::ALL.into_iter().find(|h| h.as_str() == name)
    }

    /// The executable's name.
    pub fn program(self) -> &'static str {
        match self {
            Harness::Opencode => "opencode",
            Harness::Codex => "codex",
            Harness::ClaudeCode => "claude",
        }
    }

    /// The npm package and the version Berth pins (`agents/package.json`).
    pub fn pinned(self) -> (&'static str, &'static str) {
        match self {
            Harness::Opencode => ("opencode-ai", "1.18.33"),
            Harness::Codex => ("@openai/codex", "0.171.0"),
            Harness::ClaudeCode => ("@anthropic-ai/claude-code", "2.1.197"),
        }
    }

    /// Where, under its home, the CLI keeps its own session record (transcripts, session
    /// database, log) — what is kept with the attempt's logs. Not its configuration or any
    /// login file.
    pub fn session_paths(self) -> &'static [&'static str] {
        match self {
            Harness::Opencode => &[".local/share/opencode"],
            Harness::Codex => &[".codex/sessions"],
            Harness::ClaudeCode => &[".claude/projects"],
        }
    }

    /// Where, under its home, the CLI keeps a subscription login (`None`: logins are not
    /// supported for it).
    pub fn login_file(self) -> Option<&'static str> {
        match self {
            Harness::Opencode => None,
            Harness::Codex => Some(".codex/auth.json"),
            Harness::ClaudeCode => Some(".claude/.credentials.json"),
        }
    }

    /// The wire dialect it speaks to the gateway.
    pub fn dialect(self) -> &'static str {
        match self {
            Harness::Opencode => "openai-chat",
            Harness::Codex => "openai-responses",
            Harness::ClaudeCode => "anthropic-messages",
        }
    }
}

/// The environment variables a launch line reads (the orchestrator sets them on the exec).
pub mod vars {
    /// The directory holding the CLI, as the sandbox sees it.
    pub const BIN: &str = "BERTH_AGENT_BIN";
    /// The gateway's base URL, as the sandbox reaches it (`http://127.0.0.1:PORT`).
    pub const GATEWAY_URL: &str = "BERTH_GATEWAY_URL";
    /// The attempt's gateway token (not a model credential).
    pub const GATEWAY_TOKEN: &str = "BERTH_GATEWAY_TOKEN";
    /// The model name given to the CLI.
    pub const MODEL: &str = "BERTH_MODEL";
    /// The task's instructions (the prompt).
    pub const INSTRUCTIONS: &str = "BERTH_INSTRUCTIONS";
    /// Set (to `1`) when a subscription login was staged at [`super::LOGIN_STAGED_FROM_REPO`]:
    /// the CLI authenticates with it, and presents the gateway token in the `x-berth-token`
    /// header instead of as its key.
    pub const LOGIN: &str = "BERTH_LOGIN";
    /// A resumed run ([`super::launch_resumed`]): the CLI's own id of the session it goes on
    /// with.
    pub const RESUME_SESSION: &str = "BERTH_RESUME_SESSION";
    /// A resumed run: the session record to unpack into the fresh home, a tar archive staged
    /// at this path relative to the working directory (removed by the line before the CLI
    /// starts).
    pub const SESSION_ARCHIVE: &str = "BERTH_SESSION_ARCHIVE";
    /// The name of the run's home beside the repository, when not [`super::HOME_FROM_REPO`]'s
    /// (`.berth-agent-…`: runs that may share a sandbox each have their own). The launch,
    /// session and login lines of one run must all be given the same.
    pub const AGENT_HOME: &str = "BERTH_AGENT_HOME";
}

/// Where the orchestrator stages a subscription login before the run, relative to the
/// repository; the launch line moves it into the CLI's home.
pub const LOGIN_STAGED_FROM_REPO: &str = "../.berth-login/login.json";

/// The header carrying the gateway token when the CLI's own key header carries its login.
pub const TOKEN_HEADER: &str = "x-berth-token";

/// The per-attempt home, relative to the repository (outside it, so the capture never takes
/// it), unless [`vars::AGENT_HOME`] names another beside it.
pub const HOME_FROM_REPO: &str = "../.berth-agent";

/// The shell words that set `home` to the run's home (fixed text: the name comes from
/// [`vars::AGENT_HOME`], which only Berth sets).
fn home_line() -> String {
    format!(
        "home=\"$(cd .. && pwd)/${{{var}:-{default}}}\"\n",
        var = vars::AGENT_HOME,
        default = HOME_FROM_REPO.trim_start_matches("../")
    )
}

/// The shell line that runs `harness` headless in the repository: stdin closed, a fresh home
/// beside the repository, the gateway as its only endpoint. Every variable part comes from
/// the environment ([`vars`]); nothing is spliced into the line.
pub fn launch(harness: Harness) -> String {
    launch_line(harness, false)
}

/// [`launch`] going on with an earlier session of the same CLI: the session record (as
/// [`collect_session`] took it) is unpacked from [`vars::SESSION_ARCHIVE`] into the fresh home
/// and the CLI resumes [`vars::RESUME_SESSION`] with the new instructions. Claude Code keys its
/// transcripts by working directory and OpenCode binds a session to one, and a workspace's
/// path differs between providers, so a record taken elsewhere is rebound to this one.
pub fn launch_resumed(harness: Harness) -> String {
    launch_line(harness, true)
}

fn launch_line(harness: Harness, resumed: bool) -> String {
    let mut prologue = format!(
        "set -eu\n{home}rm -rf \"$home\"\nmkdir -p \"$home/tmp\"\n\
         export HOME=\"$home\" TMPDIR=\"$home/tmp\" XDG_CONFIG_HOME=\"$home/.config\" \
         XDG_DATA_HOME=\"$home/.local/share\" XDG_CACHE_HOME=\"$home/.cache\" \
         XDG_STATE_HOME=\"$home/.local/state\"\n",
        home = home_line()
    );
    // A session archive staged here by a run killed before it started (it removes its own
    // first thing) is gone once ten minutes old; one staged for a run starting now is not.
    prologue.push_str(
        "find . -maxdepth 1 -type f -name '.berth-session-*.tar' -mmin +10 -exec rm -f -- {} + \
         2>/dev/null || true\n",
    );
    if !resumed {
        prologue.push_str("resume=\n");
    } else {
        prologue.push_str(concat!(
            "resume=\"$BERTH_RESUME_SESSION\"\n",
            "archive=\"$BERTH_SESSION_ARCHIVE\"\nunpacked=0\n",
            "tar -xf \"$archive\" -C \"$home\" --no-same-owner || unpacked=$?\n",
            "rm -f -- \"$archive\"\n",
            "if [ \"$unpacked\" -ne 0 ]; then echo \"berth: the agent's session could not be unpacked\" >&2; exit 125; fi\n",
        ));
        if harness == Harness::ClaudeCode {
            prologue.push_str(concat!(
                "projects=\"$home/.claude/projects\"\n",
                "here=\"$projects/$(pwd | sed 's/[^A-Za-z0-9]/-/g')\"\n",
                "for kept in \"$projects\"/*; do\n",
                "  if [ -d \"$kept\" ] && [ ! -e \"$here\" ]; then mv -- \"$kept\" \"$here\"; fi\n",
                "done\n",
            ));
        }
    }
    let run = match harness {
        // The token by variable name (`{env:…}`), so it is in no config text either.
        Harness::Opencode => concat!(
            "export OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1\n",
            "export OPENCODE_CONFIG_CONTENT=\"{\\\"provider\\\":{\\\"berth\\\":{\\\"npm\\\":\\\"@ai-sdk/openai-compatible\\\",",
            "\\\"name\\\":\\\"Berth gateway\\\",\\\"options\\\":{\\\"baseURL\\\":\\\"$BERTH_GATEWAY_URL/v1\\\",",
            "\\\"apiKey\\\":\\\"{env:BERTH_GATEWAY_TOKEN}\\\"},\\\"models\\\":{\\\"$BERTH_MODEL\\\":{\\\"name\\\":\\\"$BERTH_MODEL\\\",",
            "\\\"tool_call\\\":true}}}},\\\"model\\\":\\\"berth/$BERTH_MODEL\\\",\\\"small_model\\\":\\\"berth/$BERTH_MODEL\\\",",
            "\\\"autoupdate\\\":false,\\\"share\\\":\\\"disabled\\\"}\"\n",
            // OpenCode resumes a session in the directory it ran in: rebind it to this one (the
            // database is the sandbox's own; both values are quoted for SQL).
            "if [ -n \"$resume\" ]; then\n",
            "  here=\"$(pwd | sed \"s/'/''/g\")\" id=\"$(printf %s \"$resume\" | sed \"s/'/''/g\")\"\n",
            "  \"$BERTH_AGENT_BIN/opencode\" db \"UPDATE session SET directory = '$here' WHERE id = '$id'\" > /dev/null < /dev/null\n",
            "fi\n",
            "set -- run --auto --format json -m \"berth/$BERTH_MODEL\"\n",
            "if [ -n \"$resume\" ]; then set -- \"$@\" --session \"$resume\"; fi\n",
            "exec \"$BERTH_AGENT_BIN/opencode\" \"$@\" \"$BERTH_INSTRUCTIONS\" < /dev/null\n",
        )
        .to_owned(),
        Harness::Codex => concat!(
            "mkdir -p \"$home/.codex\"\nexport CODEX_HOME=\"$home/.codex\"\n",
            // With a login, codex sends it as its key and the gateway token in a header.
            "auth='env_key=\"BERTH_GATEWAY_TOKEN\"'\n",
            "if [ -n \"${BERTH_LOGIN:-}\" ]; then\n",
            "  mv ../.berth-login/login.json \"$CODEX_HOME/auth.json\" && chmod 600 \"$CODEX_HOME/auth.json\"\n",
            "  auth='requires_openai_auth=true,env_http_headers={\"x-berth-token\"=\"BERTH_GATEWAY_TOKEN\"}'\n",
            "fi\n",
            "set -- exec\n",
            "if [ -n \"$resume\" ]; then set -- exec resume; fi\n",
            "set -- \"$@\" --json --skip-git-repo-check ",
            "--dangerously-bypass-approvals-and-sandbox -m \"$BERTH_MODEL\" -c model_provider=berth ",
            "-c 'cli_auth_credentials_store=\"file\"' ",
            "-c \"model_providers.berth={name=\\\"Berth gateway\\\",base_url=\\\"$BERTH_GATEWAY_URL/v1\\\",",
            "$auth,wire_api=\\\"responses\\\",request_max_retries=0,",
            "stream_max_retries=0}\"\n",
            "if [ -n \"$resume\" ]; then set -- \"$@\" \"$resume\"; fi\n",
            "exec \"$BERTH_AGENT_BIN/codex\" \"$@\" \"$BERTH_INSTRUCTIONS\" < /dev/null\n",
        )
        .to_owned(),
        Harness::ClaudeCode => concat!(
            "export CLAUDE_CONFIG_DIR=\"$home/.claude\" IS_SANDBOX=1 ",
            "ANTHROPIC_BASE_URL=\"$BERTH_GATEWAY_URL\" ",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 CLAUDE_CODE_MAX_RETRIES=1\n",
            // A key would override the login (in -p mode), so with a login the token travels
            // in a header.
            "if [ -n \"${BERTH_LOGIN:-}\" ]; then\n",
            "  mkdir -p \"$CLAUDE_CONFIG_DIR\"\n",
            "  mv ../.berth-login/login.json \"$CLAUDE_CONFIG_DIR/.credentials.json\" && chmod 600 \"$CLAUDE_CONFIG_DIR/.credentials.json\"\n",
            "  export ANTHROPIC_CUSTOM_HEADERS=\"x-berth-token: $BERTH_GATEWAY_TOKEN\"\n",
            "else\n",
            "  export ANTHROPIC_API_KEY=\"$BERTH_GATEWAY_TOKEN\"\n",
            "fi\n",
            "set -- -p \"$BERTH_INSTRUCTIONS\" --model \"$BERTH_MODEL\" ",
            "--output-format stream-json --verbose --dangerously-skip-permissions\n",
            "if [ -n \"$resume\" ]; then set -- \"$@\" --resume \"$resume\"; fi\n",
            "exec \"$BERTH_AGENT_BIN/claude\" \"$@\" < /dev/null\n",
        )
        .to_owned(),
    };
    prologue + &run
}

/// The shell line, run in the repository after the agent stopped, that writes the CLI's
/// session record ([`Harness::session_paths`]) to stdout as a tar archive and then removes the
/// whole per-attempt home, so nothing of the run (tokens in configs, caches) stays for the
/// capture, validators or snapshots. Fixed text: nothing is spliced in.
pub fn collect_session(harness: Harness) -> String {
    format!("{}{REMOVE_HOME}", archive_session(harness))
}

/// [`collect_session`]'s first half: the session record to stdout, the home left in place
/// (for a caller that keeps the record durably before the home goes: [`remove_agent_home`]).
pub fn archive_session(harness: Harness) -> String {
    let mut line = format!(
        "{home}if cd \"$home\" 2>/dev/null; then\n  set --\n",
        home = home_line()
    );
    for path in harness.session_paths() {
        // Each parent directory as an entry of its own before the path, so the archive makes
        // every directory before what is beneath it (the strict reading of a session record).
        let mut parents = String::new();
        let mut at = 0;
        while let Some(slash) = path[at..].find('/') {
            at += slash;
            parents.push_str(&format!(" './{}'", &path[..at]));
            at += 1;
        }
        line.push_str(&format!(
            "  [ -e '{path}' ] && set -- \"$@\" --no-recursion{parents} --recursion './{path}'\n"
        ));
    }
    line.push_str("  [ $# -eq 0 ] || tar -cf - \"$@\" 2>/dev/null\n  cd /\nfi\n");
    line
}

/// Removes the run's home (and a staged login beside it); exit 1 when it is still there.
const REMOVE_HOME: &str = "rm -rf \"$home\" \"$(dirname \"$home\")/.berth-login\"\n\
     [ ! -e \"$home\" ] || { echo \"the agent's home could not be removed\" >&2; exit 1; }\n";

/// [`collect_session`]'s second half on its own: the shell line that removes the run's home.
pub fn remove_agent_home() -> String {
    format!("{}{REMOVE_HOME}", home_line())
}

/// The shell line, run in the repository after the agent stopped (before
/// [`collect_session`]), that prints the CLI's login file as the run left it (refreshed tokens
/// included), at most 64 KiB + 1 byte; exit 3 when there is no regular file there. Fixed text.
pub fn collect_login(harness: Harness) -> Option<String> {
    let file = harness.login_file()?;
    Some(format!(
        "{home}f=\"$home/{file}\"\n[ -f \"$f\" ] && [ ! -L \"$f\" ] || exit 3\nexec head -c 65537 -- \"$f\"\n",
        home = home_line()
    ))
}

/// What an attempt's agent run amounted to, from its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judgement {
    /// The CLI's session id, when its stream named one.
    pub session_id: Option<String>,
    /// Tool calls made.
    pub tool_calls: usize,
    /// Events that could not be parsed (kept, marked).
    pub unparsed: usize,
    /// `Ok`: the agent finished its turn without error and did something; `Err`: why the
    /// attempt is rejected before any validator runs.
    pub verdict: Result<(), String>,
}

/// Judges an agent run from its normalized events: the final turn must have completed without
/// an error, no permission may have been refused, and at least one tool call must have been
/// made (otherwise the attempt is vacuous).
pub fn judge(harness: Harness, events: &[Event]) -> Judgement {
    let session_id = events.iter().find_map(|e| e.session_id.clone());
    let tool_calls = events
        .iter()
        .filter(|e| e.kind == EventKind::ToolCall)
        .count();
    let unparsed = events
        .iter()
        .filter(|e| e.kind == EventKind::Unparsed)
        .count();
    let name = harness.as_str();
    let fatal = events
        .iter()
        .find(|e| e.kind == EventKind::Error && !e.data["retryable"].as_bool().unwrap_or(false));
    let refused = events.iter().find(|e| {
        e.kind == EventKind::ToolCallUpdate
            && e.data["is_error"] == true
            && e.data["content"]
                .as_str()
                .is_some_and(|c| c.contains("rejected permission"))
    });
    let completed = events
        .iter()
        .rev()
        .find(|e| e.kind == EventKind::TurnCompleted);
    let verdict = if let Some(error) = fatal {
        Err(format!(
            "{name} reported an error: {}",
            error.data["message"].as_str().unwrap_or("(no message)")
        ))
    } else if let Some(refusal) = refused {
        Err(format!(
            "{name} was refused a permission and stopped: {}",
            refusal.data["content"].as_str().unwrap_or_default()
        ))
    } else if completed.is_none() {
        Err(format!("{name} never completed its turn (no final event)"))
    } else if completed.is_some_and(|c| c.data["is_error"] == true) {
        Err(format!(
            "{name} ended its turn with an error: {}",
            completed
                .and_then(|c| c.data["result"].as_str())
                .unwrap_or("")
        ))
    } else if tool_calls == 0 {
        Err(format!(
            "vacuous: {name} made no tool call (its trajectory is empty)"
        ))
    } else {
        Ok(())
    };
    Judgement {
        session_id,
        tool_calls,
        unparsed,
        verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resumed line, run by a real shell against stand-in CLIs that record their argv:
    /// the session record is unpacked into the fresh home and its staged archive removed
    /// before the CLI starts, the CLI is asked to resume the session by id (taken from the
    /// environment, however it is spelled), and a Claude Code transcript kept under another
    /// working directory is moved under this one's.
    #[test]
    fn a_resumed_launch_unpacks_the_session_and_resumes_it_by_id() {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("repo");
        let bin = root.path().join("bin");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        let argv_log = root.path().join("argv");
        for program in ["opencode", "codex", "claude"] {
            let stub = bin.join(program);
            std::fs::write(
                &stub,
                format!(
                    "#!/bin/sh\nfor a in \"$@\"; do printf '%s|' \"$a\"; done >> '{}'\necho >> '{}'\n\
                     ls -RA \"$HOME\" >> '{}'\n",
                    argv_log.display(),
                    argv_log.display(),
                    argv_log.display()
                ),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let id = "sess'; rm -rf / #";
        // The line in the repository, with what Berth's environment gives it.
        let run = |line: String, archive: Option<&str>| {
            let mut sh = std::process::Command::new("sh");
            sh.arg("-c")
                .arg(line)
                .current_dir(&repo)
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env(vars::BIN, &bin)
                .env(vars::GATEWAY_URL, "http://127.0.0.1:1")
                .env(vars::GATEWAY_TOKEN, "token")
                .env(vars::MODEL, "scripted")
                .env(vars::INSTRUCTIONS, "go on")
                .env(vars::RESUME_SESSION, id);
            if let Some(archive) = archive {
                sh.env(vars::SESSION_ARCHIVE, archive);
            }
            sh.output().unwrap()
        };
        for harness in Harness::ALL {
            let _ = std::fs::remove_file(&argv_log);
            // A record as the collection takes it (Claude Code's under another directory).
            let kept = root.path().join("kept");
            let _ = std::fs::remove_dir_all(&kept);
            let record = match harness {
                Harness::ClaudeCode => ".claude/projects/-elsewhere-workspace",
                Harness::Codex => ".codex/sessions/2026",
                Harness::Opencode => ".local/share/opencode",
            };
            std::fs::create_dir_all(kept.join(record)).unwrap();
            std::fs::write(kept.join(record).join("transcript.jsonl"), "turn one").unwrap();
            let status = std::process::Command::new("tar")
                .args(["-cf"])
                .arg(repo.join(".staged.tar"))
                .arg("-C")
                .arg(&kept)
                .arg(".")
                .status()
                .unwrap();
            assert!(status.success());
            let out = run(launch_resumed(harness), Some(".staged.tar"));
            assert!(out.status.success(), "{harness:?}: {out:?}");
            assert!(
                !repo.join(".staged.tar").exists(),
                "{harness:?}: archive left"
            );
            let log = std::fs::read_to_string(&argv_log).unwrap();
            let first = log.lines().next().unwrap();
            let expected = match harness {
                Harness::Codex => "exec|resume|--json|",
                Harness::ClaudeCode => "-p|go on|",
                Harness::Opencode => "db|UPDATE session SET directory = ",
            };
            assert!(first.starts_with(expected), "{harness:?}: {first}");
            let resumed = match harness {
                Harness::Codex => format!("|{id}|go on|"),
                Harness::ClaudeCode => format!("|--resume|{id}|"),
                Harness::Opencode => format!("|--session|{id}|go on|"),
            };
            assert!(log.contains(&resumed), "{harness:?}: {log}");
            assert!(log.contains("transcript.jsonl"), "{harness:?}: {log}");
            if harness == Harness::ClaudeCode {
                let here: String = repo
                    .to_str()
                    .unwrap()
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .collect();
                assert!(log.contains(&here), "{log}");
                assert!(!log.contains("-elsewhere-workspace"), "{log}");
            }
            // The plain launch resumes nothing, whatever the environment says.
            let _ = std::fs::remove_file(&argv_log);
            let out = run(launch(harness), None);
            assert!(out.status.success(), "{harness:?}: {out:?}");
            let log = std::fs::read_to_string(&argv_log).unwrap();
            assert!(
                !log.contains("resume") && !log.contains("--session"),
                "{log}"
            );
        }
    }

    #[test]
    fn launch_lines_take_every_variable_part_from_the_environment() {
        for harness in Harness::ALL {
            let line = launch(harness);
            assert!(line.contains("< /dev/null"), "{line}");
            assert!(line.contains("\"$BERTH_INSTRUCTIONS\""), "{line}");
            assert!(line.contains(&format!("$BERTH_AGENT_BIN/{}", harness.program())));
            // The token is read by name only.
            assert!(!line.contains("$BERTH_GATEWAY_TOKEN\"  "), "{line}");
            assert_eq!(Harness::parse(harness.as_str()), Some(harness));
        }
        assert!(launch(Harness::ClaudeCode).contains("ANTHROPIC_API_KEY=\"$BERTH_GATEWAY_TOKEN\""));
        assert!(launch(Harness::Codex).contains("auth='env_key=\"BERTH_GATEWAY_TOKEN\"'"));
        // With a login staged, the key header carries the login and the token its own header.
        for harness in [Harness::Codex, Harness::ClaudeCode] {
            let line = launch(harness);
            assert!(line.contains("if [ -n \"${BERTH_LOGIN:-}\" ]"), "{line}");
            assert!(line.contains(LOGIN_STAGED_FROM_REPO), "{line}");
            assert!(line.contains(TOKEN_HEADER), "{line}");
            assert!(collect_login(harness)
                .unwrap()
                .contains(harness.login_file().unwrap()));
        }
        assert!(collect_login(Harness::Opencode).is_none());
        assert!(launch(Harness::Opencode).contains("{env:BERTH_GATEWAY_TOKEN}"));
        assert_eq!(Harness::parse("script"), None);
    }

    #[test]
    fn published_events_schema_is_in_sync() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../schemas/events.schema.json");
        let generated = json_schema();
        if std::env::var_os("BERTH_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        assert!(
            std::fs::read_to_string(&path).unwrap_or_default() == generated,
            "schemas/events.schema.json is out of date; run BERTH_BLESS=1 cargo test -p berth-harness"
        );
        assert!(generated.contains("tool_call_update") && generated.contains("event_id"));
    }

    #[test]
    fn session_collection_archives_only_session_paths_and_removes_the_home() {
        for harness in Harness::ALL {
            let line = collect_session(harness);
            for path in harness.session_paths() {
                assert!(line.contains(&format!("'{path}'")), "{line}");
                assert!(!path.contains('\'') && !path.starts_with('/'));
            }
            assert!(line.contains("rm -rf \"$home\""), "{line}");
            // Its halves: the record without touching the home, then the home's removal.
            assert!(!archive_session(harness).contains("rm "), "{line}");
            assert!(remove_agent_home().contains("rm -rf \"$home\""));
            // The run's home is the only variable it reads of Berth's.
            let others = line.replace(vars::AGENT_HOME, "");
            assert!(!others.contains("BERTH_"), "{line}");
        }
    }
}
