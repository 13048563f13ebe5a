//! The scripted model: a deterministic model read from a TOML file.
//!
//! ```toml
//! schema_version = 1
//! side_text = "Scripted task"        # the answer to requests without tools (titles)
//!
//! [[step]]
//! shell = "printf hi > hello.txt"    # call the harness's shell tool
//! [[step]]
//! write = { path = "hello.txt", content = "hi\n" }   # its write tool (or the shell)
//! [[step]]
//! read = "hello.txt"                 # its read tool (Claude Code writes only files it read)
//! [[step]]
//! edit = { path = "hello.txt", old = "hi", new = "hello" }
//! [[step]]
//! error = { status = 500, message = "scripted outage" }
//! delay_ms = 200
//! [[step]]
//! text = "Done"
//! usage = { input = 1200, output = 40, cached = 1000 }
//! ```
//!
//! The model is stateless: the step answered is the number of tool results already in the
//! request (the last step repeats), so a harness that retries or resumes gets the same answer.
//!
//! A mission's attempts can get different scripts: instead of top-level steps, `[[attempt]]`
//! blocks, each with its own `[[attempt.step]]`s; attempt N answers from block N (the last block
//! repeats).
//!
//! ```toml
//! schema_version = 1
//! [[attempt]]                       # attempt 1: a wrong change
//! [[attempt.step]]
//! shell = "echo wrong > answer.txt"
//! [[attempt.step]]
//! text = "Done"
//! [[attempt]]                       # attempt 2 and later: the right one
//! [[attempt.step]]
//! shell = "echo right > answer.txt"
//! [[attempt.step]]
//! text = "Done"
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::GatewayError;

/// The schema version this build reads.
pub const SCRIPT_SCHEMA_VERSION: u32 = 1;

/// The largest script file read.
const MAX_SCRIPT_BYTES: u64 = 1 << 20;

/// A scripted model.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// Always [`SCRIPT_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// What a request without tools gets (the harnesses' title requests).
    #[serde(default = "default_side_text")]
    pub side_text: String,
    /// The steps, in order (every attempt), or empty when `attempts` are given.
    #[serde(rename = "step", default)]
    pub steps: Vec<Step>,
    /// Per-attempt steps: attempt N answers from entry N (the last repeats).
    #[serde(rename = "attempt", default)]
    pub attempts: Vec<AttemptSteps>,
}

/// The steps of one attempt.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AttemptSteps {
    /// The steps, in order.
    #[serde(rename = "step")]
    pub steps: Vec<Step>,
}

fn default_side_text() -> String {
    "Scripted task".into()
}

/// One answer of the scripted model.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Run a shell command through the harness's shell tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Read a file through the harness's read tool (its shell when it has none). Claude Code
    /// refuses to write or edit an existing file it has not read in the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<String>,
    /// Write a file through the harness's write tool (its shell when it has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<WriteStep>,
    /// Replace text in a file through the harness's edit tool (its shell when it has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit: Option<EditStep>,
    /// A final assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// An HTTP error in the API's own error shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorStep>,
    /// Wait this long before answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// The usage reported with the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A file to write.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WriteStep {
    /// Relative paths are made absolute from the working directory named in the prompt.
    pub path: String,
    /// The file's whole content.
    pub content: String,
}

/// A replacement in a file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EditStep {
    /// Relative paths are made absolute from the working directory named in the prompt.
    pub path: String,
    /// The text replaced (its first occurrence).
    pub old: String,
    /// The replacement.
    pub new: String,
}

/// A scripted HTTP error.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorStep {
    /// 400–599.
    pub status: u16,
    /// The message in the error body.
    pub message: String,
}

/// Token usage of one model response. Cached input tokens are part of `input` (counted once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Input tokens, cached ones included.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Of `input`, the tokens read from a cache.
    #[serde(default)]
    pub cached: u64,
}

impl Usage {
    /// What a scripted answer reports when its step names no usage.
    pub const SCRIPTED_DEFAULT: Usage = Usage {
        input: 100,
        output: 10,
        cached: 0,
    };
}

/// What a step does, once validated.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Call the shell tool.
    Shell(String),
    /// Call the read tool.
    Read(String),
    /// Call the write tool.
    Write(WriteStep),
    /// Call the edit tool.
    Edit(EditStep),
    /// Answer with text.
    Text(String),
    /// Answer with an HTTP error.
    Error(ErrorStep),
}

impl Step {
    /// The one action this step names.
    pub fn action(&self) -> Action {
        // `Script::parse` checked that exactly one is set.
        if let Some(cmd) = &self.shell {
            Action::Shell(cmd.clone())
        } else if let Some(path) = &self.read {
            Action::Read(path.clone())
        } else if let Some(write) = &self.write {
            Action::Write(write.clone())
        } else if let Some(edit) = &self.edit {
            Action::Edit(edit.clone())
        } else if let Some(error) = &self.error {
            Action::Error(error.clone())
        } else {
            Action::Text(self.text.clone().unwrap_or_default())
        }
    }
}

impl Script {
    /// Parses and checks a script: schema version, at least one step, exactly one action per
    /// step, error statuses 400–599, delays up to 10 minutes.
    pub fn parse(text: &str) -> Result<Script, GatewayError> {
        let script: Script =
            toml::from_str(text).map_err(|e| GatewayError::Script(e.to_string()))?;
        if script.schema_version != SCRIPT_SCHEMA_VERSION {
            return Err(GatewayError::Script(format!(
                "schema_version {} is not supported (this build reads {SCRIPT_SCHEMA_VERSION})",
                script.schema_version
            )));
        }
        match (script.steps.is_empty(), script.attempts.is_empty()) {
            (true, true) => {
                return Err(GatewayError::Script(
                    "a script needs at least one [[step]] (or [[attempt]] blocks)".into(),
                ))
            }
            (false, false) => {
                return Err(GatewayError::Script(
                    "give either top-level [[step]]s or [[attempt]] blocks, not both".into(),
                ))
            }
            _ => {}
        }
        if script.attempts.iter().any(|a| a.steps.is_empty()) {
            return Err(GatewayError::Script(
                "every [[attempt]] needs at least one [[attempt.step]]".into(),
            ));
        }
        let all = script
            .steps
            .iter()
            .chain(script.attempts.iter().flat_map(|a| a.steps.iter()));
        for (n, step) in all.enumerate() {
            let set = [
                step.shell.is_some(),
                step.read.is_some(),
                step.write.is_some(),
                step.edit.is_some(),
                step.text.is_some(),
                step.error.is_some(),
            ]
            .iter()
            .filter(|s| **s)
            .count();
            if set != 1 {
                return Err(GatewayError::Script(format!(
                    "step {}: name exactly one of shell, read, write, edit, text, error (found {set})",
                    n + 1
                )));
            }
            if let Some(error) = &step.error {
                if !(400..=599).contains(&error.status) {
                    return Err(GatewayError::Script(format!(
                        "step {}: error status {} is not 400–599",
                        n + 1,
                        error.status
                    )));
                }
            }
            if step.delay_ms.is_some_and(|d| d > 600_000) {
                return Err(GatewayError::Script(format!(
                    "step {}: delay_ms is over 10 minutes",
                    n + 1
                )));
            }
            if let Some(usage) = step.usage {
                if usage.cached > usage.input {
                    return Err(GatewayError::Script(format!(
                        "step {}: usage.cached ({}) exceeds usage.input ({}): cached tokens \
                         are part of the input",
                        n + 1,
                        usage.cached,
                        usage.input
                    )));
                }
            }
        }
        Ok(script)
    }

    /// Reads a script file (bounded).
    pub fn load(path: &Path) -> Result<Script, GatewayError> {
        let shown = path.display();
        let bytes = berth_files::read_regular(path, MAX_SCRIPT_BYTES).map_err(|e| match e {
            berth_files::ReadError::TooLarge { .. } => {
                GatewayError::Script(format!("{shown} is over {MAX_SCRIPT_BYTES} bytes"))
            }
            other => GatewayError::Script(format!("cannot read {shown}: {other}")),
        })?;
        let text = String::from_utf8(bytes)
            .map_err(|_| GatewayError::Script(format!("{shown} is not UTF-8 text")))?;
        Script::parse(&text)
    }

    /// The steps attempt `ordinal` (1-based) answers from.
    pub fn steps_of(&self, ordinal: u32) -> &[Step] {
        if self.attempts.is_empty() {
            return &self.steps;
        }
        let index = (ordinal.max(1) as usize - 1).min(self.attempts.len() - 1);
        &self.attempts[index].steps
    }

    /// For attempt `ordinal`, the request at `step` (see `Turn::step`): the step's index and the
    /// step (the last one repeats).
    pub fn step_of(&self, ordinal: u32, step: usize) -> (usize, &Step) {
        let steps = self.steps_of(ordinal);
        let index = step.min(steps.len() - 1);
        (index, &steps[index])
    }

    /// [`Script::step_of`] for a single-attempt script.
    pub fn step(&self, step: usize) -> &Step {
        self.step_of(1, step).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_action_and_repeats_the_last_step() {
        let script = Script::parse(
            r#"
schema_version = 1
[[step]]
shell = "ls"
[[step]]
write = { path = "a", content = "b" }
[[step]]
edit = { path = "a", old = "b", new = "c" }
[[step]]
error = { status = 503, message = "busy" }
delay_ms = 5
[[step]]
text = "done"
usage = { input = 10, output = 2, cached = 4 }
"#,
        )
        .unwrap();
        assert_eq!(script.side_text, "Scripted task");
        assert_eq!(script.step(0).action(), Action::Shell("ls".into()));
        assert!(matches!(script.step(3).action(), Action::Error(e) if e.status == 503));
        assert_eq!(script.step(4).action(), Action::Text("done".into()));
        assert_eq!(script.step(99).action(), Action::Text("done".into()));
    }

    #[test]
    fn attempts_get_their_own_steps_and_the_last_block_repeats() {
        let script = Script::parse(
            "schema_version = 1\n[[attempt]]\n[[attempt.step]]\nshell = \"wrong\"\n\
             [[attempt]]\n[[attempt.step]]\nshell = \"right\"\n[[attempt.step]]\ntext = \"ok\"\n",
        )
        .unwrap();
        assert_eq!(
            script.step_of(1, 0).1.action(),
            Action::Shell("wrong".into())
        );
        assert_eq!(
            script.step_of(1, 5).1.action(),
            Action::Shell("wrong".into())
        );
        assert_eq!(
            script.step_of(2, 0).1.action(),
            Action::Shell("right".into())
        );
        assert_eq!(script.step_of(3, 1), (1, &script.attempts[1].steps[1]));
    }

    #[test]
    fn malformed_scripts_are_refused_with_the_reason() {
        for (text, why) in [
            ("schema_version = 2\n[[step]]\ntext = \"x\"", "schema_version 2"),
            ("schema_version = 1\nstep = []", "at least one"),
            (
                "schema_version = 1\n[[step]]\ntext = \"x\"\n[[attempt]]\n[[attempt.step]]\ntext = \"y\"",
                "not both",
            ),
            ("schema_version = 1\n[[attempt]]\nstep = []", "at least one [[attempt.step]]"),
            ("schema_version = 1\n[[step]]\ntext = \"x\"\nshell = \"y\"", "exactly one"),
            ("schema_version = 1\n[[step]]", "exactly one"),
            (
                "schema_version = 1\n[[step]]\nerror = { status = 200, message = \"x\" }",
                "not 400–599",
            ),
            ("schema_version = 1\n[[step]]\ntext = \"x\"\nbogus = 1", "unknown field"),
            (
                "schema_version = 1\n[[step]]\ntext = \"x\"\nusage = { input = 1, output = 1, cached = 2 }",
                "part of the input",
            ),
            ("not toml at all [", "expected"),
        ] {
            let err = Script::parse(text).unwrap_err().to_string();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }
}
