//! Berth's normalized agent events (schema `berth.events/v1`).
//!
//! The CLI's raw JSONL stays the source of truth; every normalized event points back into it
//! (file, byte offset, length) and carries `event_id = <attempt key>:<seq>`. Kinds are named
//! after the Agent Client Protocol's `session/update` kinds where one exists
//! (`agent_message_chunk`, `agent_thought_chunk`, `tool_call`, `tool_call_update`); the rest are
//! Berth's (`session_started`, `turn_started`, `turn_completed`, `file_change`, `usage`,
//! `error`, `heartbeat`, `stalled`, `unparsed`). A line that is not JSON, or JSON of a shape this
//! build does not know, is kept as `unparsed` — never dropped.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::Harness;

/// The schema every event carries.
pub const EVENTS_SCHEMA: &str = "berth.events/v1";

/// The most text of one field an event keeps (the raw log has it all).
const MAX_TEXT: usize = 4096;

/// What an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The CLI's session began (its native session id).
    SessionStarted,
    /// A model turn began.
    TurnStarted,
    /// A turn ended (`is_error`, `result`).
    TurnCompleted,
    /// Assistant text.
    AgentMessageChunk,
    /// Reasoning text.
    AgentThoughtChunk,
    /// A tool call (`id`, `name`, `input`).
    ToolCall,
    /// A tool call's result (`id`, `is_error`, `content`).
    ToolCallUpdate,
    /// Files the agent changed.
    FileChange,
    /// Tokens (`input` with cached counted once, `output`, `cached`).
    Usage,
    /// A classified error (`kind`, `retryable`, `message`).
    Error,
    /// The monitor saw the agent alive without new output.
    Heartbeat,
    /// No output for longer than the idle limit.
    Stalled,
    /// A line kept as is.
    Unparsed,
}

/// Where an event came from in the raw log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RawPointer {
    /// The raw log's file name (in the attempt's log directory).
    pub file: String,
    /// Byte offset of the line.
    pub offset: u64,
    /// Its length in bytes (without the newline).
    pub len: u64,
}

/// One normalized event (`berth.events/v1`; published as `schemas/events.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Event {
    /// [`EVENTS_SCHEMA`].
    pub schema: String,
    /// `<attempt key>:<seq>`.
    pub event_id: String,
    /// 0, 1, … within the attempt.
    pub seq: u64,
    /// What it is.
    pub kind: EventKind,
    /// The CLI's own session id, when known.
    pub session_id: Option<String>,
    /// Where in the raw log.
    pub raw: RawPointer,
    /// Kind-specific fields (a CLI may add its own): `session_started` {} (Claude Code:
    /// `model`, `cwd`, `version`), `turn_completed` {`is_error`, `result`},
    /// `agent_message_chunk` / `agent_thought_chunk` {`text`}, `tool_call` {`id`, `name`,
    /// `input`}, `tool_call_update` {`id`, `is_error`, `content`}, `file_change` {`paths`},
    /// `usage` {`input`, `output`, `cached` (`null`: unknown, the CLI reported no valid count), `cost_usd`}, `error` {`kind`, `retryable`, `message`},
    /// `unparsed` {`text`, `reason`}; text fields are cut at 4 KiB (the raw log has them whole).
    pub data: Value,
}

/// The JSON Schema of one line of `events.jsonl` (`berth schema events`).
pub fn json_schema() -> String {
    let mut text = serde_json::to_string_pretty(&schemars::schema_for!(Event)).expect("schema");
    text.push('\n');
    text
}

fn bounded(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A token count the CLI must report: a non-negative integer, else unknown (a negative,
/// fractional, textual or missing count says nothing true about what was used).
fn count(value: &Value) -> Option<u64> {
    value.as_u64()
}

/// A part of a count that a CLI leaves out when there is none (cached tokens): absent is 0,
/// anything but a non-negative integer is unknown.
fn part_count(value: &Value) -> Option<u64> {
    if value.is_null() {
        Some(0)
    } else {
        value.as_u64()
    }
}

/// A `usage` event's data: `input` (the whole prompt, cached tokens inside it, as ATIF counts
/// them), `cached`, `output`, and the CLI's `cost_usd` as it came. A count the stream (written
/// in the sandbox) got wrong — malformed, past `u64`, or cached above the prompt — is `null`:
/// unknown, never a made-up 0 or a wrapped sum.
fn usage_data(input: Option<u64>, cached: Option<u64>, output: Option<u64>, cost: &Value) -> Value {
    let (input, cached) = match (input, cached) {
        (Some(input), Some(cached)) if cached > input => (None, None),
        other => other,
    };
    json!({ "input": input, "cached": cached, "output": output, "cost_usd": cost })
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => bounded(s),
        Value::Array(parts) => bounded(
            &parts
                .iter()
                .filter_map(|p| p["text"].as_str().or(p.as_str()))
                .collect::<Vec<_>>()
                .join(""),
        ),
        Value::Null => String::new(),
        other => bounded(&other.to_string()),
    }
}

/// The events of one raw line (kind and data), with the session id it names.
fn line_events(harness: Harness, line: &Value) -> (Option<String>, Vec<(EventKind, Value)>) {
    use EventKind::*;
    let mut out = Vec::new();
    let kind = line["type"].as_str().unwrap_or("");
    let session = match harness {
        Harness::ClaudeCode => line["session_id"].as_str(),
        Harness::Opencode => line["sessionID"].as_str(),
        Harness::Codex => line["thread_id"].as_str(),
    }
    .map(str::to_owned);
    match (harness, kind) {
        (Harness::ClaudeCode, "system") if line["subtype"] == "init" => out.push((
            SessionStarted,
            json!({ "model": line["model"], "cwd": line["cwd"], "version": line["claude_code_version"] }),
        )),
        (Harness::ClaudeCode, "system") if line["subtype"] == "api_retry" => out.push((
            Error,
            json!({ "kind": "api_retry", "retryable": true, "message": format!("retry {} after HTTP {}", line["attempt"], line["error_status"]) }),
        )),
        (Harness::ClaudeCode, "assistant") | (Harness::ClaudeCode, "user") => {
            for block in line["message"]["content"].as_array().into_iter().flatten() {
                match block["type"].as_str() {
                    Some("text") => out.push((AgentMessageChunk, json!({ "text": text_of(&block["text"]) }))),
                    Some("thinking") => out.push((AgentThoughtChunk, json!({ "text": text_of(&block["thinking"]) }))),
                    Some("tool_use") => out.push((ToolCall, json!({ "id": block["id"], "name": block["name"], "input": block["input"] }))),
                    Some("tool_result") => out.push((ToolCallUpdate, json!({
                        "id": block["tool_use_id"], "is_error": block["is_error"].as_bool().unwrap_or(false),
                        "content": text_of(&block["content"]),
                    }))),
                    _ => {}
                }
            }
        }
        (Harness::ClaudeCode, "result") => {
            let usage = &line["usage"];
            if !usage["input_tokens"].is_null() {
                let cached = part_count(&usage["cache_read_input_tokens"]);
                let input = [
                    count(&usage["input_tokens"]),
                    cached,
                    part_count(&usage["cache_creation_input_tokens"]),
                ]
                .into_iter()
                .try_fold(0u64, |sum, n| sum.checked_add(n?));
                out.push((
                    Usage,
                    usage_data(input, cached, count(&usage["output_tokens"]), &line["total_cost_usd"]),
                ));
            }
            let is_error = line["is_error"].as_bool().unwrap_or(true);
            out.push((TurnCompleted, json!({ "is_error": is_error, "result": text_of(&line["result"]), "subtype": line["subtype"] })));
            if is_error {
                out.push((Error, json!({ "kind": "result_error", "retryable": false, "message": text_of(&line["result"]) })));
            }
        }
        (Harness::Opencode, "step_start") => out.push((TurnStarted, json!({}))),
        (Harness::Opencode, "text") => out.push((AgentMessageChunk, json!({ "text": text_of(&line["part"]["text"]) }))),
        (Harness::Opencode, "reasoning") => out.push((AgentThoughtChunk, json!({ "text": text_of(&line["part"]["text"]) }))),
        (Harness::Opencode, "tool_use") => {
            let part = &line["part"];
            let state = &part["state"];
            out.push((ToolCall, json!({ "id": part["callID"], "name": part["tool"], "input": state["input"] })));
            let failed = state["status"] == "error";
            out.push((ToolCallUpdate, json!({
                "id": part["callID"], "is_error": failed,
                "content": text_of(if failed { &state["error"] } else { &state["output"] }),
            })));
            if matches!(part["tool"].as_str(), Some("write" | "edit")) && !failed {
                out.push((FileChange, json!({ "paths": [state["input"]["filePath"]] })));
            }
        }
        (Harness::Opencode, "step_finish") => {
            let part = &line["part"];
            let tokens = &part["tokens"];
            if !tokens["input"].is_null() {
                let cached = part_count(&tokens["cache"]["read"]);
                let input = count(&tokens["input"]).zip(cached).and_then(|(i, c)| i.checked_add(c));
                out.push((
                    Usage,
                    usage_data(input, cached, count(&tokens["output"]), &part["cost"]),
                ));
            }
            if part["reason"] != "tool-calls" {
                out.push((TurnCompleted, json!({ "is_error": false, "result": part["reason"] })));
            }
        }
        (Harness::Opencode, "error") => {
            let error = &line["error"];
            out.push((Error, json!({
                "kind": error["name"].as_str().unwrap_or("error"),
                "retryable": error["data"]["isRetryable"].as_bool().unwrap_or(false),
                "message": text_of(&error["data"]["message"]),
            })));
        }
        (Harness::Codex, "thread.started") => out.push((SessionStarted, json!({}))),
        (Harness::Codex, "turn.started") => out.push((TurnStarted, json!({}))),
        (Harness::Codex, "item.started") | (Harness::Codex, "item.completed") => {
            let item = &line["item"];
            let completed = kind == "item.completed";
            match (item["type"].as_str(), completed) {
                (Some("command_execution"), false) => out.push((ToolCall, json!({ "id": item["id"], "name": "command_execution", "input": { "command": item["command"] } }))),
                (Some("command_execution"), true) => out.push((ToolCallUpdate, json!({
                    "id": item["id"], "is_error": item["exit_code"].as_i64().is_some_and(|c| c != 0),
                    "content": text_of(&item["aggregated_output"]), "exit_code": item["exit_code"],
                }))),
                (Some("file_change"), true) => out.push((FileChange, json!({
                    "paths": item["changes"].as_array().into_iter().flatten().map(|c| c["path"].clone()).collect::<Vec<_>>(),
                }))),
                (Some("agent_message"), true) => out.push((AgentMessageChunk, json!({ "text": text_of(&item["text"]) }))),
                (Some("reasoning"), true) => out.push((AgentThoughtChunk, json!({ "text": text_of(&item["text"]) }))),
                // Codex reports warnings (e.g. unknown model metadata) as error items.
                (Some("error"), true) => out.push((Error, json!({ "kind": "warning", "retryable": true, "message": text_of(&item["message"]) }))),
                (Some(other), true) if other.ends_with("_call") || other == "mcp_tool_call" => out.push((ToolCall, json!({ "id": item["id"], "name": other, "input": item }))),
                _ => {}
            }
        }
        (Harness::Codex, "turn.completed") => {
            let usage = &line["usage"];
            // Codex's `input_tokens` already holds the cached ones.
            out.push((
                Usage,
                usage_data(
                    count(&usage["input_tokens"]),
                    part_count(&usage["cached_input_tokens"]),
                    count(&usage["output_tokens"]),
                    &Value::Null,
                ),
            ));
            out.push((TurnCompleted, json!({ "is_error": false })));
        }
        (Harness::Codex, "turn.failed") => {
            out.push((TurnCompleted, json!({ "is_error": true, "result": text_of(&line["error"]["message"]) })));
            out.push((Error, json!({ "kind": "turn_failed", "retryable": false, "message": text_of(&line["error"]["message"]) })));
        }
        (Harness::Codex, "error") => out.push((Error, json!({ "kind": "stream", "retryable": true, "message": text_of(&line["message"]) }))),
        _ => {}
    }
    (session, out)
}

/// Normalizes an agent's raw JSONL as it arrives: feed chunks with [`Normalizer::push`], then
/// [`Normalizer::finish`] for a last line without a newline. Events come out exactly as
/// [`normalize`] would produce them for the whole log.
#[derive(Debug)]
pub struct Normalizer {
    harness: Harness,
    attempt_key: String,
    raw_file: String,
    next_seq: u64,
    session: Option<String>,
    /// Byte offset of `partial`'s first byte in the raw log.
    offset: u64,
    partial: Vec<u8>,
}

/// The longest line kept whole while waiting for its newline; beyond it the line is cut into
/// an `unparsed` event (the raw log keeps it all).
const MAX_LINE: usize = 8 << 20;

impl Normalizer {
    /// A normalizer for one attempt's raw log named `raw_file`.
    pub fn new(harness: Harness, attempt_key: &str, raw_file: &str) -> Normalizer {
        Normalizer {
            harness,
            attempt_key: attempt_key.to_owned(),
            raw_file: raw_file.to_owned(),
            next_seq: 0,
            session: None,
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// The events of every line `bytes` completes.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        let mut rest = bytes;
        while let Some(at) = rest.iter().position(|b| *b == b'\n') {
            self.partial.extend_from_slice(&rest[..at]);
            rest = &rest[at + 1..];
            let line = std::mem::take(&mut self.partial);
            self.line(&line, &mut events);
            self.offset += line.len() as u64 + 1;
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() > MAX_LINE {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, &mut events);
            self.offset += line.len() as u64;
        }
        events
    }

    /// The events of a last line that had no newline.
    pub fn finish(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        let line = std::mem::take(&mut self.partial);
        self.line(&line, &mut events);
        self.offset += line.len() as u64;
        events
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<Event>) {
        let pointer = RawPointer {
            file: self.raw_file.clone(),
            offset: self.offset,
            len: line.len() as u64,
        };
        let text = String::from_utf8_lossy(line);
        if text.trim().is_empty() {
            return;
        }
        let parsed: Option<Value> = serde_json::from_str(text.trim()).ok();
        let produced = match &parsed {
            Some(value) if value.is_object() && value["type"].is_string() => {
                let (named, produced) = line_events(self.harness, value);
                if named.is_some() && self.session.is_none() {
                    self.session = named;
                }
                produced
            }
            _ => vec![(
                EventKind::Unparsed,
                json!({ "text": bounded(&text), "reason": if parsed.is_some() { "unknown shape" } else { "not JSON" } }),
            )],
        };
        for (kind, data) in produced {
            let seq = self.next_seq;
            self.next_seq += 1;
            out.push(Event {
                schema: EVENTS_SCHEMA.into(),
                event_id: format!("{}:{seq}", self.attempt_key),
                seq,
                kind,
                session_id: self.session.clone(),
                raw: pointer.clone(),
                data,
            });
        }
    }
}

/// Normalizes the whole raw JSONL of one agent run (`raw_file`, as stored in the attempt's log
/// directory). Lines of known shapes that carry nothing of interest produce no event; lines
/// that cannot be read are kept as `unparsed`.
pub fn normalize(harness: Harness, attempt_key: &str, raw_file: &str, raw: &[u8]) -> Vec<Event> {
    let mut normalizer = Normalizer::new(harness, attempt_key, raw_file);
    let mut events = normalizer.push(raw);
    events.extend(normalizer.finish());
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{judge, Harness};

    const CLAUDE: &str = r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s-1","model":"m","claude_code_version":"2.1.197"}
{"type":"assistant","message":{"content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"printf hi > hello.txt"}}]},"session_id":"s-1"}
{"type":"user","message":{"content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"(Bash completed with no output)","is_error":false}]},"session_id":"s-1"}
not json at all
{"type":"assistant","message":{"content":[{"type":"text","text":"Done"}]},"session_id":"s-1"}
{"type":"result","subtype":"success","is_error":false,"result":"Done","session_id":"s-1","usage":{"input_tokens":40,"cache_read_input_tokens":60,"output_tokens":5},"total_cost_usd":0.001}
"#;

    #[test]
    fn claude_code_stream_json_normalizes_with_pointers_and_keeps_bad_lines() {
        let events = normalize(
            Harness::ClaudeCode,
            "m:t:1",
            "agent.jsonl",
            CLAUDE.as_bytes(),
        );
        let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                EventKind::SessionStarted,
                EventKind::ToolCall,
                EventKind::ToolCallUpdate,
                EventKind::Unparsed,
                EventKind::AgentMessageChunk,
                EventKind::Usage,
                EventKind::TurnCompleted
            ]
        );
        assert_eq!(events[1].event_id, "m:t:1:1");
        assert_eq!(events[1].session_id.as_deref(), Some("s-1"));
        // The pointer finds the raw line.
        let p = &events[3].raw;
        assert_eq!(
            &CLAUDE.as_bytes()[p.offset as usize..(p.offset + p.len) as usize],
            b"not json at all"
        );
        assert_eq!(events[5].data["input"], 100);
        let judged = judge(Harness::ClaudeCode, &events);
        assert_eq!(judged.verdict, Ok(()));
        assert_eq!((judged.tool_calls, judged.unparsed), (1, 1));
        assert_eq!(judged.session_id.as_deref(), Some("s-1"));
    }

    /// Usage comes from a stream the sandbox writes: a count past `u64`, a sum that would
    /// overflow, a negative or textual count, or cached tokens above the prompt are unknown
    /// (`null`), never a wrapped sum, a panic or a made-up 0.
    #[test]
    fn hostile_usage_counts_are_unknown_never_wrapped_or_zero() {
        let max = u64::MAX;
        let cases = [
            (
                Harness::ClaudeCode,
                format!(r#"{{"type":"result","is_error":false,"usage":{{"input_tokens":{max},"cache_read_input_tokens":5,"output_tokens":1}}}}"#),
                json!({ "input": null, "cached": 5, "output": 1, "cost_usd": null }),
            ),
            (
                Harness::ClaudeCode,
                r#"{"type":"result","is_error":false,"usage":{"input_tokens":-1,"cache_read_input_tokens":"x","output_tokens":2.5},"total_cost_usd":0.5}"#.into(),
                json!({ "input": null, "cached": null, "output": null, "cost_usd": 0.5 }),
            ),
            (
                Harness::Opencode,
                format!(r#"{{"type":"step_finish","part":{{"reason":"stop","tokens":{{"input":{max},"output":1,"cache":{{"read":7}}}}}}}}"#),
                json!({ "input": null, "cached": 7, "output": 1, "cost_usd": null }),
            ),
            (
                Harness::Codex,
                r#"{"type":"turn.completed","usage":{"input_tokens":1,"cached_input_tokens":9,"output_tokens":"lots"}}"#.into(),
                json!({ "input": null, "cached": null, "output": null, "cost_usd": null }),
            ),
            (
                Harness::Codex,
                r#"{"type":"turn.completed","usage":{"input_tokens":10,"output_tokens":3}}"#.into(),
                json!({ "input": 10, "cached": 0, "output": 3, "cost_usd": null }),
            ),
        ];
        for (harness, line, want) in cases {
            let events = normalize(harness, "k", "a", line.as_bytes());
            let usage: Vec<_> = events
                .iter()
                .filter(|e| e.kind == EventKind::Usage)
                .collect();
            assert_eq!(usage.len(), 1, "{line}: {events:?}");
            assert_eq!(usage[0].data, want, "{line}");
        }
    }

    #[test]
    fn chunked_input_normalizes_exactly_like_the_whole_log() {
        let whole = normalize(Harness::ClaudeCode, "k", "a", CLAUDE.as_bytes());
        for size in [1, 3, 17, 256] {
            let mut n = Normalizer::new(Harness::ClaudeCode, "k", "a");
            let mut events = Vec::new();
            for chunk in CLAUDE.as_bytes().chunks(size) {
                events.extend(n.push(chunk));
            }
            events.extend(n.finish());
            assert_eq!(events, whole, "chunks of {size}");
        }
    }

    #[test]
    fn claude_success_with_is_error_is_rejected() {
        let raw = r#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t","name":"Bash","input":{}}]}}
{"type":"result","subtype":"success","is_error":true,"result":"API Error: 500 boom"}"#;
        let events = normalize(Harness::ClaudeCode, "k", "a", raw.as_bytes());
        let verdict = judge(Harness::ClaudeCode, &events).verdict.unwrap_err();
        assert!(verdict.contains("API Error: 500 boom"), "{verdict}");
    }

    #[test]
    fn opencode_permission_auto_reject_is_rejected_though_it_exits_zero() {
        let raw = r#"{"type":"step_start","sessionID":"ses_1","part":{}}
{"type":"tool_use","sessionID":"ses_1","part":{"tool":"write","callID":"c1","state":{"status":"error","input":{"filePath":"/etc/x"},"error":"The user rejected permission to use this specific tool call."}}}
{"type":"step_finish","sessionID":"ses_1","part":{"reason":"stop","tokens":{"input":10,"output":1,"cache":{"read":0}}}}"#;
        let events = normalize(Harness::Opencode, "k", "a", raw.as_bytes());
        let verdict = judge(Harness::Opencode, &events).verdict.unwrap_err();
        assert!(verdict.contains("refused a permission"), "{verdict}");
    }

    #[test]
    fn an_agent_that_made_no_tool_call_is_vacuous() {
        let raw = r#"{"type":"thread.started","thread_id":"th-1"}
{"type":"turn.started"}
{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Model metadata for `x` not found."}}
{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"I did it"}}
{"type":"turn.completed","usage":{"input_tokens":10,"cached_input_tokens":0,"output_tokens":2}}"#;
        let events = normalize(Harness::Codex, "k", "a", raw.as_bytes());
        let judged = judge(Harness::Codex, &events);
        assert_eq!(judged.session_id.as_deref(), Some("th-1"));
        assert!(judged.verdict.unwrap_err().starts_with("vacuous"));
    }

    #[test]
    fn codex_turn_failed_and_a_missing_final_event_are_rejected() {
        let failed = r#"{"type":"item.started","item":{"id":"i","type":"command_execution","command":"ls"}}
{"type":"turn.failed","error":{"message":"unexpected status 401 Unauthorized"}}"#;
        let events = normalize(Harness::Codex, "k", "a", failed.as_bytes());
        assert!(judge(Harness::Codex, &events)
            .verdict
            .unwrap_err()
            .contains("401"));
        let cut = r#"{"type":"item.started","item":{"id":"i","type":"command_execution","command":"ls"}}"#;
        let events = normalize(Harness::Codex, "k", "a", cut.as_bytes());
        assert!(judge(Harness::Codex, &events)
            .verdict
            .unwrap_err()
            .contains("never completed"));
    }
}
