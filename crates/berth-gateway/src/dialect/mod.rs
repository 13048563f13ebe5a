//! The three wire dialects the harnesses speak, and the scripted model's choice of tool.
//!
//! A request is read into a [`Turn`] (its tools, how many tool results it carries, the working
//! directory named in its prompt, whether it streams); the scripted model's answer is a
//! [`Reply`], rendered back in the request's own dialect — a JSON body or server-sent events.

pub mod anthropic;
pub mod chat;
pub mod responses;

use serde_json::{json, Value};

use crate::script::{Action, Usage};

/// The API a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI Chat Completions (`POST …/chat/completions`; OpenCode).
    Chat,
    /// OpenAI Responses (`POST …/responses`; Codex).
    Responses,
    /// Anthropic Messages (`POST …/messages`; Claude Code).
    Anthropic,
}

impl Dialect {
    /// The dialect of a request path (the suffix decides, so `/v1/…` and `/…` both work).
    pub fn of_path(path: &str) -> Option<Dialect> {
        let path = path.split('?').next().unwrap_or(path).trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Some(Dialect::Chat)
        } else if path.ends_with("/responses") {
            Some(Dialect::Responses)
        } else if path.ends_with("/messages") {
            Some(Dialect::Anthropic)
        } else {
            None
        }
    }

    /// A stable name (journal, events).
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Chat => "openai-chat",
            Dialect::Responses => "openai-responses",
            Dialect::Anthropic => "anthropic-messages",
        }
    }

    /// An error body in this dialect's own shape.
    pub fn error_body(self, status: u16, message: &str) -> Value {
        match self {
            Dialect::Anthropic => json!({
                "type": "error",
                "error": { "type": anthropic::error_type(status), "message": message },
            }),
            Dialect::Chat | Dialect::Responses => json!({
                "error": {
                    "message": message,
                    "type": if status == 401 { "invalid_request_error" } else if status >= 500 { "server_error" } else { "invalid_request_error" },
                    "code": status,
                },
            }),
        }
    }
}

/// A tool the harness offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// Its parameters' JSON schema (`Null` for freeform tools).
    pub schema: Value,
    /// A freeform (custom) tool taking raw text, like Codex's `apply_patch`.
    pub freeform: bool,
}

/// One model request, as far as the scripted model needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The dialect.
    pub dialect: Dialect,
    /// The requested model name (echoed back).
    pub model: String,
    /// Whether the answer is streamed (SSE).
    pub stream: bool,
    /// Chat: whether a final usage chunk was asked for.
    pub include_usage: bool,
    /// The tools offered.
    pub tools: Vec<Tool>,
    /// Tool results already in the conversation.
    pub tool_results: usize,
    /// Turns of the conversation already answered (a resumed session carries them): final
    /// answers followed by a new prompt. With `tool_results`, the scripted model's step.
    pub answered_turns: usize,
    /// The working directory named in the prompt, if any.
    pub cwd: Option<String>,
}

impl Turn {
    /// Reads a request body of `dialect`.
    pub fn read(dialect: Dialect, body: &Value) -> Turn {
        let (tools, tool_results, history) = match dialect {
            Dialect::Chat => (
                chat::tools(body),
                chat::tool_results(body),
                chat::history(body),
            ),
            Dialect::Responses => (
                responses::tools(body),
                responses::tool_results(body),
                responses::history(body),
            ),
            Dialect::Anthropic => (
                anthropic::tools(body),
                anthropic::tool_results(body),
                anthropic::history(body),
            ),
        };
        Turn {
            dialect,
            model: body["model"].as_str().unwrap_or("scripted").to_owned(),
            stream: body["stream"].as_bool().unwrap_or(false),
            include_usage: body["stream_options"]["include_usage"]
                .as_bool()
                .unwrap_or(false),
            tools,
            tool_results,
            answered_turns: answered_turns(history),
            cwd: find_cwd(body),
        }
    }

    /// The scripted model's step for this request: one per tool result and one per answered
    /// turn before it, so a resumed conversation goes on where it stopped and a fresh one
    /// starts over.
    pub fn step(&self) -> usize {
        self.tool_results + self.answered_turns
    }
}

/// One entry of a conversation's history, as far as the scripted model cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    /// The user asked something (not a tool result).
    Prompt,
    /// The assistant answered without calling a tool.
    Answer,
    /// The assistant called a tool.
    ToolCall,
    /// Anything else (tool results, reasoning, system text).
    Other,
}

/// Answers followed by a new prompt: the turns a resumed conversation already had.
pub fn answered_turns(history: impl IntoIterator<Item = Said>) -> usize {
    let mut answered = 0;
    let mut answer_pending = false;
    for said in history {
        match said {
            Said::Answer => answer_pending = true,
            Said::ToolCall => answer_pending = false,
            Said::Prompt if answer_pending => {
                answered += 1;
                answer_pending = false;
            }
            Said::Prompt | Said::Other => {}
        }
    }
    answered
}

/// A tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// A function tool with JSON arguments.
    Function {
        /// The tool's name.
        name: String,
        /// Its arguments.
        arguments: Value,
    },
    /// A freeform tool with raw input.
    Custom {
        /// The tool's name.
        name: String,
        /// Its input.
        input: String,
    },
}

/// The scripted model's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A final message.
    Text(String),
    /// One tool call.
    Call(Call),
}

/// Shell tools, by harness: OpenCode, Claude Code, Codex (several generations).
const SHELL_TOOLS: &[&str] = &[
    "bash",
    "Bash",
    "exec_command",
    "shell",
    "shell_command",
    "local_shell",
];

impl Reply {
    /// What the scripted model answers to `turn` for `action` (not an error).
    pub fn decide(action: &Action, turn: &Turn, side_text: &str) -> Reply {
        if turn.tools.is_empty() {
            return Reply::Text(side_text.to_owned());
        }
        match action {
            Action::Text(text) => Reply::Text(text.clone()),
            Action::Error(error) => Reply::Text(error.message.clone()),
            Action::Shell(cmd) => shell_call(turn, cmd).map_or_else(
                || {
                    Reply::Text(format!(
                        "(scripted) the harness offers no shell tool for: {cmd}"
                    ))
                },
                Reply::Call,
            ),
            Action::Read(path) => {
                let path = absolute(path, turn.cwd.as_deref());
                if let Some(tool) = find(turn, &["read", "Read"]) {
                    let mut args = serde_json::Map::new();
                    args.insert(path_key(tool).into(), json!(path));
                    return Reply::Call(Call::Function {
                        name: tool.name.clone(),
                        arguments: Value::Object(args),
                    });
                }
                shell_call(turn, &format!("cat {}", shell_quote(&path))).map_or_else(
                    || Reply::Text("(scripted) the harness offers no read or shell tool".into()),
                    Reply::Call,
                )
            }
            Action::Write(write) => {
                let path = absolute(&write.path, turn.cwd.as_deref());
                if let Some(tool) = find(turn, &["write", "Write"]) {
                    let mut args = serde_json::Map::new();
                    args.insert(path_key(tool).into(), json!(path));
                    args.insert("content".into(), json!(write.content));
                    return Reply::Call(Call::Function {
                        name: tool.name.clone(),
                        arguments: Value::Object(args),
                    });
                }
                let mut body = format!("*** Add File: {path}\n");
                for line in write.content.lines() {
                    body.push_str(&format!("+{line}\n"));
                }
                if let Some(reply) = apply_patch(turn, &body) {
                    return reply;
                }
                let cmd = format!(
                    "printf '%s' {} > {}",
                    shell_quote(&write.content),
                    shell_quote(&path)
                );
                shell_call(turn, &cmd).map_or_else(
                    || Reply::Text("(scripted) the harness offers no write or shell tool".into()),
                    Reply::Call,
                )
            }
            Action::Edit(edit) => {
                let path = absolute(&edit.path, turn.cwd.as_deref());
                if let Some(tool) = find(turn, &["edit", "Edit"]) {
                    let snake = tool.name == "Edit";
                    let mut args = serde_json::Map::new();
                    args.insert(path_key(tool).into(), json!(path));
                    args.insert(
                        if snake { "old_string" } else { "oldString" }.into(),
                        json!(edit.old),
                    );
                    args.insert(
                        if snake { "new_string" } else { "newString" }.into(),
                        json!(edit.new),
                    );
                    return Reply::Call(Call::Function {
                        name: tool.name.clone(),
                        arguments: Value::Object(args),
                    });
                }
                let mut body = format!("*** Update File: {path}\n@@\n");
                for line in edit.old.lines() {
                    body.push_str(&format!("-{line}\n"));
                }
                for line in edit.new.lines() {
                    body.push_str(&format!("+{line}\n"));
                }
                if let Some(reply) = apply_patch(turn, &body) {
                    return reply;
                }
                Reply::Text(format!(
                    "(scripted) the harness offers no edit tool for {path}"
                ))
            }
        }
    }
}

fn find<'a>(turn: &'a Turn, names: &[&str]) -> Option<&'a Tool> {
    names
        .iter()
        .find_map(|n| turn.tools.iter().find(|t| !t.freeform && t.name == *n))
}

/// The key a write/edit tool takes its path under, from its schema.
fn path_key(tool: &Tool) -> &'static str {
    let props = &tool.schema["properties"];
    ["filePath", "file_path", "path"]
        .into_iter()
        .find(|k| !props[*k].is_null())
        .unwrap_or(if matches!(tool.name.as_str(), "Write" | "Edit" | "Read") {
            "file_path"
        } else {
            "filePath"
        })
}

/// The change as a call to the harness's freeform `apply_patch` tool (Codex), when it has one.
fn apply_patch(turn: &Turn, body: &str) -> Option<Reply> {
    let tool = turn
        .tools
        .iter()
        .find(|t| t.freeform && t.name == "apply_patch")?;
    Some(Reply::Call(Call::Custom {
        name: tool.name.clone(),
        input: format!("*** Begin Patch\n{body}*** End Patch"),
    }))
}

/// A call of the harness's shell tool running `cmd`, with arguments shaped by its schema.
fn shell_call(turn: &Turn, cmd: &str) -> Option<Call> {
    let tool = find(turn, SHELL_TOOLS)?;
    let props = &tool.schema["properties"];
    let mut args = serde_json::Map::new();
    if !props["command"].is_null() {
        let as_array = props["command"]["type"] == "array";
        args.insert(
            "command".into(),
            if as_array {
                json!(["bash", "-lc", cmd])
            } else {
                json!(cmd)
            },
        );
    } else if !props["cmd"].is_null() {
        args.insert("cmd".into(), json!(cmd));
    } else {
        args.insert("command".into(), json!(cmd));
    }
    if !props["description"].is_null() {
        args.insert("description".into(), json!("Scripted step"));
    }
    Some(Call::Function {
        name: tool.name.clone(),
        arguments: Value::Object(args),
    })
}

/// `path` made absolute from `cwd` (kept as given when there is none).
fn absolute(path: &str, cwd: Option<&str>) -> String {
    match cwd {
        Some(cwd) if !path.starts_with('/') => format!("{}/{path}", cwd.trim_end_matches('/')),
        _ => path.to_owned(),
    }
}

/// Single-quoted for a POSIX shell.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// The working directory a prompt names: `<cwd>…</cwd>` (Codex) or `Working directory: …`
/// (Claude Code, OpenCode), in any string of the request.
fn find_cwd(body: &Value) -> Option<String> {
    fn walk(value: &Value) -> Option<String> {
        match value {
            Value::String(text) => {
                if let Some(start) = text.find("<cwd>") {
                    let rest = &text[start + 5..];
                    if let Some(end) = rest.find("</cwd>") {
                        return Some(rest[..end].trim().to_owned());
                    }
                }
                // "Working directory: /…" (OpenCode), "Primary working directory: /…" (Claude
                // Code); other mentions of working directories are skipped.
                const MARK: &str = "working directory: ";
                let lower = text.to_ascii_lowercase();
                lower.match_indices(MARK).find_map(|(start, _)| {
                    let line = text[start + MARK.len()..].lines().next()?.trim();
                    line.starts_with('/').then(|| line.to_owned())
                })
            }
            Value::Array(items) => items.iter().find_map(walk),
            Value::Object(map) => map.values().find_map(walk),
            _ => None,
        }
    }
    walk(body)
}

/// A random id with a prefix (`call_…`, `msg_…`).
pub(crate) fn new_id(prefix: &str) -> String {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    format!("{prefix}{}", hex::encode(bytes))
}

/// One server-sent event.
pub(crate) fn sse(out: &mut String, event: Option<&str>, data: &Value) {
    if let Some(event) = event {
        out.push_str("event: ");
        out.push_str(event);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

/// A rendered answer: JSON body or event stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// `application/json` or `text/event-stream`.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

/// Renders `reply` for `turn`.
pub fn render(turn: &Turn, reply: &Reply, usage: Usage) -> Rendered {
    let body = match turn.dialect {
        Dialect::Chat => chat::render(turn, reply, usage),
        Dialect::Responses => responses::render(turn, reply, usage),
        Dialect::Anthropic => anthropic::render(turn, reply, usage),
    };
    Rendered {
        content_type: if turn.stream {
            "text/event-stream"
        } else {
            "application/json"
        },
        body,
    }
}

/// The JSON `data:` payloads of an event stream (`[DONE]` and unparseable ones skipped).
pub(crate) fn sse_data(body: &str) -> impl Iterator<Item = Value> + '_ {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
}

/// The usage a response body of `dialect` reports (JSON or event stream).
pub fn usage_of(dialect: Dialect, body: &str) -> Option<Usage> {
    match dialect {
        Dialect::Chat => chat::usage_of(body),
        Dialect::Responses => responses::usage_of(body),
        Dialect::Anthropic => anthropic::usage_of(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(tools: Vec<Tool>, cwd: Option<&str>) -> Turn {
        Turn {
            dialect: Dialect::Chat,
            model: "m".into(),
            stream: false,
            include_usage: false,
            tools,
            tool_results: 0,
            answered_turns: 0,
            cwd: cwd.map(str::to_owned),
        }
    }

    fn function(name: &str, props: Value) -> Tool {
        Tool {
            name: name.into(),
            schema: json!({ "type": "object", "properties": props }),
            freeform: false,
        }
    }

    #[test]
    fn shell_arguments_follow_each_harness_schema() {
        let opencode = turn(
            vec![function("bash", json!({"command": {"type": "string"}}))],
            None,
        );
        let codex = turn(
            vec![function("exec_command", json!({"cmd": {"type": "string"}}))],
            None,
        );
        let old_codex = turn(
            vec![function("shell", json!({"command": {"type": "array"}}))],
            None,
        );
        let claude = turn(
            vec![function("Bash", json!({"command": {}, "description": {}}))],
            None,
        );
        let shell = Action::Shell("ls".into());
        let args = |t: &Turn| match Reply::decide(&shell, t, "") {
            Reply::Call(Call::Function { arguments, .. }) => arguments,
            other => panic!("{other:?}"),
        };
        assert_eq!(args(&opencode), json!({"command": "ls"}));
        assert_eq!(args(&codex), json!({"cmd": "ls"}));
        assert_eq!(args(&old_codex), json!({"command": ["bash", "-lc", "ls"]}));
        assert_eq!(
            args(&claude),
            json!({"command": "ls", "description": "Scripted step"})
        );
    }

    #[test]
    fn writes_use_the_write_tool_then_apply_patch_then_a_quoted_shell() {
        let write = Action::Write(crate::script::WriteStep {
            path: "dir/it's.txt".into(),
            content: "a'b\n".into(),
        });
        let claude = turn(
            vec![function("Write", json!({"file_path": {}, "content": {}}))],
            Some("/w"),
        );
        assert_eq!(
            Reply::decide(&write, &claude, ""),
            Reply::Call(Call::Function {
                name: "Write".into(),
                arguments: json!({"file_path": "/w/dir/it's.txt", "content": "a'b\n"})
            })
        );
        let patch = turn(
            vec![Tool {
                name: "apply_patch".into(),
                schema: Value::Null,
                freeform: true,
            }],
            Some("/w"),
        );
        assert!(matches!(Reply::decide(&write, &patch, ""),
            Reply::Call(Call::Custom { input, .. }) if input.contains("*** Add File: /w/dir/it's.txt\n+a'b\n")));
        let shell_only = turn(vec![function("exec_command", json!({"cmd": {}}))], None);
        assert_eq!(
            Reply::decide(&write, &shell_only, ""),
            Reply::Call(Call::Function {
                name: "exec_command".into(),
                arguments: json!({"cmd": "printf '%s' 'a'\\''b\n' > 'dir/it'\\''s.txt'"})
            })
        );
        // No tools at all: the side text (a title request).
        assert_eq!(
            Reply::decide(&write, &turn(vec![], None), "title"),
            Reply::Text("title".into())
        );
    }

    #[test]
    fn the_working_directory_comes_from_the_prompt() {
        assert_eq!(
            find_cwd(
                &json!({"input": [{"content": [{"text": "<environment_context><cwd>/repo</cwd></environment_context>"}]}]})
            ),
            Some("/repo".into())
        );
        assert_eq!(
            find_cwd(&json!({"system": "Here.\nWorking directory: /work/x\nPlatform: linux"})),
            Some("/work/x".into())
        );
        assert_eq!(
            find_cwd(
                &json!({"system": "Working directory persists.\n - Primary working directory: /w/repo\n - Is a git repository"})
            ),
            Some("/w/repo".into())
        );
        assert_eq!(find_cwd(&json!({"messages": []})), None);
    }

    #[test]
    fn paths_pick_the_dialect() {
        assert_eq!(
            Dialect::of_path("/v1/chat/completions"),
            Some(Dialect::Chat)
        );
        assert_eq!(Dialect::of_path("/responses"), Some(Dialect::Responses));
        assert_eq!(
            Dialect::of_path("/v1/messages?beta=true"),
            Some(Dialect::Anthropic)
        );
        assert_eq!(Dialect::of_path("/v1/messages/count_tokens"), None);
        assert_eq!(Dialect::of_path("/v1/models"), None);
    }

    /// A resumed conversation (a first turn with a tool call, its answer, a new prompt) is at
    /// step 2 in every dialect; the same first turn still under way is at step 1, and a side
    /// text sent with a tool call is no answer.
    #[test]
    fn answered_turns_count_answers_followed_by_a_new_prompt() {
        let chat = json!({"messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "side", "tool_calls": [{"id": "c"}]},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": "done one"},
            {"role": "user", "content": "two"},
        ]});
        let anthropic = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "one"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "side"}, {"type": "tool_use", "id": "t"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "done one"}]},
            {"role": "user", "content": "two"},
        ]});
        let responses = json!({"input": [
            {"type": "message", "role": "developer", "content": "d"},
            {"type": "message", "role": "user", "content": "context"},
            {"type": "message", "role": "user", "content": "one"},
            {"type": "reasoning"},
            {"type": "message", "role": "assistant", "content": "side"},
            {"type": "function_call", "call_id": "c"},
            {"type": "function_call_output", "call_id": "c"},
            {"type": "message", "role": "assistant", "content": "done one"},
            {"role": "user", "content": "two"},
        ]});
        for (dialect, body, items) in [
            (Dialect::Chat, &chat, "messages"),
            (Dialect::Anthropic, &anthropic, "messages"),
            (Dialect::Responses, &responses, "input"),
        ] {
            let resumed = Turn::read(dialect, body);
            assert_eq!(
                (resumed.tool_results, resumed.answered_turns, resumed.step()),
                (1, 1, 2),
                "{dialect:?}"
            );
            // The first turn, after its tool result: nothing answered yet.
            let mut first = body.clone();
            let list = first[items].as_array_mut().unwrap();
            let cut = list.len() - 2;
            list.truncate(cut);
            let under_way = Turn::read(dialect, &first);
            assert_eq!(
                (under_way.answered_turns, under_way.step()),
                (0, 1),
                "{dialect:?}"
            );
            // An answer with no prompt after it is not a turn answered.
            let mut answered = body.clone();
            answered[items].as_array_mut().unwrap().pop();
            assert_eq!(
                Turn::read(dialect, &answered).answered_turns,
                0,
                "{dialect:?}"
            );
        }
    }
}
