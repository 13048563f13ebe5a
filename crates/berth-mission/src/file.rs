//! The mission file: TOML with a `schema_version`, validated, with errors that point at lines.
//!
//! ```toml
//! schema_version = 1
//! name = "fix-the-test"
//!
//! [repository]
//! path = "repo"            # or: url = "https://…/repo.git"
//! base = "main"            # a commit, branch or tag, resolved once when the mission starts
//!
//! [sandbox]
//! provider = "host"
//! fallback = []            # tried in order on capacity / quota / rate limit / unavailable only
//! # image = "berth/agent:bookworm"
//!
//! [harness]
//! kind = "script"
//! command = "sh agent.sh"  # run with sh -c in the staged repository
//! # or an agent CLI, its model traffic through Berth's gateway:
//! # kind = "claude-code"   # opencode | codex | claude-code
//! # model = "scripted"
//! # [harness.gateway]
//! # script = "model.toml"  # a scripted model; or proxy = "http://…" + credential_env = "NAME"
//!
//! [[tasks]]
//! id = "fix"
//! instructions = "Make the test pass."
//! max_attempts = 3
//! agent_timeout = "2m"
//! [tasks.validator]
//! command = "python3 -m unittest -v > .berth/validator.log 2>&1 && echo ok > .berth/verdict"
//! timeout = "1m"
//! evidence = [".berth/verdict"]
//! ```

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;

/// The mission file schema version this Berth reads.
pub const SCHEMA_VERSION: u32 = 1;

/// A mission file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MissionFileError {
    /// TOML syntax or shape error (the message carries line and column).
    #[error("{origin}: {message}")]
    Syntax {
        /// File name.
        origin: String,
        /// Parser message with line and column.
        message: String,
    },
    /// Unsupported schema version.
    #[error("{origin}: schema_version {found} is not supported; this berth reads schema_version {SCHEMA_VERSION}")]
    SchemaVersion {
        /// File name.
        origin: String,
        /// What the file says.
        found: u32,
    },
    /// A value breaks a rule.
    #[error("{origin}:{line}: `{field}` {problem}")]
    Invalid {
        /// File name.
        origin: String,
        /// 1-based line of the offending key (or its table).
        line: usize,
        /// Field path, e.g. `tasks[1].max_attempts`.
        field: String,
        /// What is wrong.
        problem: String,
    },
}

/// The largest mission file Berth reads.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Bounds on single fields: what is stored and handed to every attempt stays small.
const MAX_NAME: usize = 64;
const MAX_COMMAND: usize = 64 * 1024;
const MAX_INSTRUCTIONS: usize = 256 * 1024;
const MAX_TASKS: usize = 1000;
/// Attempts per task: each costs at least a sandbox and a validator sandbox, and every one is a
/// durable event; a bound keeps a failing task from running (and logging) without end.
const MAX_ATTEMPTS: u32 = 1000;
const MAX_EVIDENCE: usize = 256;
const MAX_PATH: usize = 4096;

/// The longest duration Berth accepts anywhere (timeouts, TTLs): a year.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 86_400);

/// Parses a duration such as `500ms`, `30s`, `2m`, `1h`, `1d`; a bare number is seconds.
/// `None` for anything else, for zero, and for more than [`MAX_DURATION`] — never a panic.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.len() > 32 {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" | "" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86_400.0,
        _ => return None,
    };
    (seconds.is_finite() && seconds > 0.0 && seconds <= MAX_DURATION.as_secs_f64())
        .then(|| Duration::from_secs_f64(seconds))
}

/// The line of `key` inside the `index`-th `[[tasks]]` block (or of the block, or of a
/// top-level table), 1-based; 1 when it cannot be found.
fn line_of(text: &str, section: &str, index: Option<usize>, key: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let header = match index {
        Some(i) => lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trim() == format!("[[{section}]]"))
            .nth(i)
            .map(|(n, _)| n),
        None if section.is_empty() => Some(0),
        None => lines
            .iter()
            .position(|l| l.trim() == format!("[{section}]")),
    };
    let Some(start) = header else { return 1 };
    for (n, line) in lines.iter().enumerate().skip(start) {
        if n > start && line.trim_start().starts_with("[[") && index.is_some() {
            break;
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with(key) && trimmed[key.len()..].trim_start().starts_with('=') {
            return n + 1;
        }
    }
    start + 1
}

/// Parses and validates a mission file.
pub fn parse(origin: &str, text: &str) -> Result<MissionFile, MissionFileError> {
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(MissionFileError::Syntax {
            origin: origin.into(),
            message: format!(
                "the file is {} bytes; mission files are at most {MAX_FILE_BYTES} bytes",
                text.len()
            ),
        });
    }
    #[derive(Deserialize)]
    struct Probe {
        schema_version: Option<u32>,
    }
    if let Ok(Probe {
        schema_version: Some(found),
    }) = toml::from_str::<Probe>(text)
    {
        if found != SCHEMA_VERSION {
            return Err(MissionFileError::SchemaVersion {
                origin: origin.into(),
                found,
            });
        }
    }
    let file: MissionFile = toml::from_str(text).map_err(|e| MissionFileError::Syntax {
        origin: origin.into(),
        message: syntax::describe(text, &e),
    })?;
    let invalid =
        |section: &str, index: Option<usize>, key: &str, field: String, problem: String| {
            MissionFileError::Invalid {
                origin: origin.into(),
                line: line_of(text, section, index, key),
                field,
                problem,
            }
        };
    let slug = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    let provider_id = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_' || c == ':'
            })
    };
    for (key, field, value) in std::iter::once((
        "provider",
        "sandbox.provider".to_owned(),
        &file.sandbox.provider,
    ))
    .chain(
        file.sandbox
            .fallback
            .iter()
            .enumerate()
            .map(|(i, f)| ("fallback", format!("sandbox.fallback[{i}]"), f)),
    ) {
        if !provider_id(value) {
            return Err(invalid(
                "sandbox",
                None,
                key,
                field,
                format!(
                    "`{}` is not a provider id (lowercase letters, digits, `-`, `_`, `:`)",
                    value.escape_debug()
                ),
            ));
        }
    }
    if let Some(image) = &file.sandbox.image {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/:@".contains(c);
        if image.is_empty()
            || image.len() > 255
            || !image.chars().all(allowed)
            || image.split('/').any(|p| p == ".." || p == ".")
        {
            return Err(invalid(
                "sandbox",
                None,
                "image",
                "sandbox.image".into(),
                "is not an image reference (letters, digits, `.`, `_`, `-`, `/`, `:`, `@`; no `..`)".into(),
            ));
        }
    }
    if let Some(problem) = file.sandbox.limits.problem() {
        return Err(invalid(
            "sandbox.limits",
            None,
            "",
            "sandbox.limits".into(),
            problem,
        ));
    }
    let limits = [
        ("", "name", "name", file.name.len(), MAX_NAME),
        (
            "harness",
            "command",
            "harness.command",
            file.harness.command.as_deref().map_or(0, str::len),
            MAX_COMMAND,
        ),
        ("", "name", "tasks", file.tasks.len(), MAX_TASKS),
    ];
    for (section, key, field, len, max) in limits {
        if len > max {
            return Err(invalid(
                section,
                None,
                key,
                field.into(),
                format!("is too large ({len}; at most {max})"),
            ));
        }
    }
    if let Some((section, index, key, field)) = nul_field(&file) {
        return Err(invalid(
            section,
            index,
            key,
            field,
            "contains a NUL byte, which no command line, environment value, path or URL can \
             carry (every attempt would fail to run)"
                .into(),
        ));
    }
    if !slug(&file.name) {
        return Err(invalid(
            "",
            None,
            "name",
            "name".into(),
            "must be letters, digits, `-` or `_`".into(),
        ));
    }
    match (&file.repository.path, &file.repository.url) {
        (Some(_), None) | (None, Some(_)) => {}
        _ => {
            return Err(invalid(
                "repository",
                None,
                "path",
                "repository".into(),
                "needs exactly one of `path` or `url`".into(),
            ))
        }
    }
    if let Some((key, problem)) = harness_problem(&file.harness) {
        return Err(invalid(
            "harness",
            None,
            key,
            format!("harness.{key}"),
            problem,
        ));
    }
    if file.tasks.is_empty() {
        return Err(invalid(
            "",
            None,
            "name",
            "tasks".into(),
            "is empty: a mission needs at least one [[tasks]]".into(),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, task) in file.tasks.iter().enumerate() {
        let at = |key: &str, field: &str, problem: String| {
            invalid(
                "tasks",
                Some(i),
                key,
                format!("tasks[{i}].{field}"),
                problem,
            )
        };
        if let Some(problem) = task.limits.problem() {
            return Err(at("limits", "limits", problem));
        }
        let sizes = [
            ("id", "id", task.id.len(), MAX_NAME),
            (
                "instructions",
                "instructions",
                task.instructions.len(),
                MAX_INSTRUCTIONS,
            ),
            (
                "command",
                "validator.command",
                task.validator.command.len(),
                MAX_COMMAND,
            ),
            (
                "setup",
                "validator.setup",
                task.validator.setup.as_ref().map_or(0, String::len),
                MAX_COMMAND,
            ),
            (
                "evidence",
                "validator.evidence",
                task.validator.evidence.len(),
                MAX_EVIDENCE,
            ),
        ];
        for (key, field, len, max) in sizes {
            if len > max {
                return Err(at(
                    key,
                    field,
                    format!("is too large ({len}; at most {max})"),
                ));
            }
        }
        if let Some(long) = task.validator.evidence.iter().find(|e| e.len() > MAX_PATH) {
            return Err(at(
                "evidence",
                "validator.evidence",
                format!("has a path of {} bytes; at most {MAX_PATH}", long.len()),
            ));
        }
        if !slug(&task.id) {
            return Err(at("id", "id", "must be letters, digits, `-` or `_`".into()));
        }
        if !seen.insert(task.id.clone()) {
            return Err(at(
                "id",
                "id",
                format!("`{}` is used by an earlier task", task.id),
            ));
        }
        if task.max_attempts == 0 || task.max_attempts > MAX_ATTEMPTS {
            return Err(at(
                "max_attempts",
                "max_attempts",
                format!("must be from 1 to {MAX_ATTEMPTS}"),
            ));
        }
        if parse_duration(&task.agent_timeout).is_none() {
            return Err(at(
                "agent_timeout",
                "agent_timeout",
                format!(
                    "`{}` is not a duration between 1ms and 366d (e.g. `90s`, `2m`)",
                    task.agent_timeout
                ),
            ));
        }
        if parse_duration(&task.validator.timeout).is_none() {
            return Err(at(
                "timeout",
                "validator.timeout",
                format!(
                    "`{}` is not a duration between 1ms and 366d (e.g. `90s`, `2m`)",
                    task.validator.timeout
                ),
            ));
        }
        if task.validator.evidence.is_empty() {
            return Err(at(
                "evidence",
                "validator.evidence",
                "is empty: a validator must name the evidence it produces, or a pass would be vacuous".into(),
            ));
        }
        for evidence in &task.validator.evidence {
            if let Some(problem) = evidence_path_problem(evidence) {
                return Err(at(
                    "evidence",
                    "validator.evidence",
                    format!("`{}` {problem}", evidence.escape_debug()),
                ));
            }
        }
    }
    Ok(file)
}

/// The first free-text field holding a NUL byte (section, task index, key, field path). Such a
/// value reaches a process as an argument, an environment value or a path, none of which can
/// carry one, so the file is refused before anything is durable rather than failing every
/// attempt. Fields with their own character rules (names, ids, providers, image, durations,
/// evidence, harness names) are checked by those.
fn nul_field(file: &MissionFile) -> Option<(&'static str, Option<usize>, &'static str, String)> {
    let has_nul = |value: Option<&String>| value.is_some_and(|v| v.contains('\0'));
    let repository = &file.repository;
    let gateway = file.harness.gateway.as_ref();
    let top = [
        ("repository", "path", repository.path.as_ref()),
        ("repository", "url", repository.url.as_ref()),
        ("repository", "base", Some(&repository.base)),
        ("harness", "command", file.harness.command.as_ref()),
        ("harness", "script", gateway.and_then(|g| g.script.as_ref())),
        ("harness", "proxy", gateway.and_then(|g| g.proxy.as_ref())),
    ];
    if let Some((section, key, _)) = top.into_iter().find(|(_, _, value)| has_nul(*value)) {
        let field = match key {
            "script" | "proxy" => format!("harness.gateway.{key}"),
            _ => format!("{section}.{key}"),
        };
        return Some((section, None, key, field));
    }
    file.tasks.iter().enumerate().find_map(|(i, task)| {
        let fields = [
            ("instructions", "instructions", Some(&task.instructions)),
            (
                "command",
                "validator.command",
                Some(&task.validator.command),
            ),
            ("setup", "validator.setup", task.validator.setup.as_ref()),
        ];
        fields
            .into_iter()
            .find(|(_, _, value)| has_nul(*value))
            .map(|(key, field, _)| ("tasks", Some(i), key, format!("tasks[{i}].{field}")))
    })
}

/// What is wrong with a validator's evidence path, if anything. It names a file beneath the
/// repository that the validator writes: relative, no `..`, ending in a name (not `/` or
/// `.`), no control characters (a NUL could never name a file; the path is also handed to the
/// validator's environment and shown in status), at most 1024 bytes.
fn evidence_path_problem(path: &str) -> Option<&'static str> {
    let last = path.rsplit('/').next().unwrap_or_default();
    if path.starts_with('/') || path.split('/').any(|part| part == "..") {
        Some("must be a path inside the repository")
    } else if last.is_empty() || last == "." {
        Some("must name a file, not a directory (e.g. `.berth/verdict`)")
    } else if path.chars().any(char::is_control) {
        Some("must not contain control characters")
    } else if path.len() > 1024 {
        Some("is longer than 1024 bytes")
    } else {
        None
    }
}

mod harness_check;
mod model;
mod syntax;
use harness_check::harness_problem;
pub use harness_check::is_login_name;
pub use model::*;

/// The JSON Schema of mission files.
pub fn json_schema() -> String {
    let mut text =
        serde_json::to_string_pretty(&schemars::schema_for!(MissionFile)).expect("schema");
    text.push('\n');
    text
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
