//! Anthropic Messages (Claude Code).

use serde_json::{json, Value};

use super::{new_id, sse, Call, Reply, Tool, Turn};
use crate::script::Usage;

/// `tools: [{name, input_schema}]` (server tools without a schema are skipped).
pub fn tools(body: &Value) -> Vec<Tool> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| {
                    Some(Tool {
                        name: t["name"].as_str()?.to_owned(),
                        schema: t.get("input_schema")?.clone(),
                        freeform: false,
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `tool_result` blocks in user messages.
pub fn tool_results(body: &Value) -> usize {
    body["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .filter_map(|m| m["content"].as_array())
                .flatten()
                .filter(|b| b["type"] == "tool_result")
                .count()
        })
        .unwrap_or(0)
}

/// The conversation: `user` messages are prompts unless they carry `tool_result` blocks;
/// `assistant` messages call a tool when they carry a `tool_use` block.
pub fn history(body: &Value) -> Vec<super::Said> {
    use super::Said;
    let has = |m: &Value, kind: &str| {
        m["content"]
            .as_array()
            .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == kind))
    };
    body["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .map(|m| match m["role"].as_str() {
                    Some("user") if has(m, "tool_result") => Said::Other,
                    Some("user") => Said::Prompt,
                    Some("assistant") if has(m, "tool_use") => Said::ToolCall,
                    Some("assistant") => Said::Answer,
                    _ => Said::Other,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The error type Anthropic uses for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// Anthropic reports cache reads apart from `input_tokens`; Berth's `input` includes them.
fn usage_json(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.input - usage.cached,
        "cache_read_input_tokens": usage.cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": usage.output,
    })
}

/// A `message` object or its event stream.
pub fn render(turn: &Turn, reply: &Reply, usage: Usage) -> String {
    let id = new_id("msg_");
    let tool_id = new_id("toolu_");
    let (block, stop) = match reply {
        Reply::Text(text) => (json!({ "type": "text", "text": text }), "end_turn"),
        Reply::Call(Call::Function { name, arguments }) => (
            json!({ "type": "tool_use", "id": tool_id, "name": name, "input": arguments }),
            "tool_use",
        ),
        Reply::Call(Call::Custom { name, input }) => (
            json!({ "type": "tool_use", "id": tool_id, "name": name, "input": { "input": input } }),
            "tool_use",
        ),
    };
    if !turn.stream {
        return json!({
            "id": id, "type": "message", "role": "assistant", "model": turn.model,
            "content": [block], "stop_reason": stop, "stop_sequence": null,
            "usage": usage_json(usage),
        })
        .to_string();
    }
    let mut out = String::new();
    let mut event = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        sse(&mut out, Some(kind), &data);
    };
    let mut start_usage = usage_json(usage);
    start_usage["output_tokens"] = json!(1);
    event(
        "message_start",
        json!({ "message": {
            "id": id, "type": "message", "role": "assistant", "model": turn.model,
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage,
        }}),
    );
    match reply {
        Reply::Text(text) => {
            event(
                "content_block_start",
                json!({ "index": 0, "content_block": { "type": "text", "text": "" } }),
            );
            event(
                "content_block_delta",
                json!({ "index": 0, "delta": { "type": "text_delta", "text": text } }),
            );
        }
        Reply::Call(_) => {
            let mut start = block.clone();
            start["input"] = json!({});
            event(
                "content_block_start",
                json!({ "index": 0, "content_block": start }),
            );
            event(
                "content_block_delta",
                json!({ "index": 0, "delta": {
                    "type": "input_json_delta", "partial_json": block["input"].to_string(),
                }}),
            );
        }
    }
    event("content_block_stop", json!({ "index": 0 }));
    event(
        "message_delta",
        json!({
            "delta": { "stop_reason": stop, "stop_sequence": null },
            "usage": { "output_tokens": usage.output },
        }),
    );
    event("message_stop", json!({}));
    out
}

/// The usage of a Messages body (JSON or event stream): input counted once, cache reads
/// included.
pub fn usage_of(body: &str) -> Option<Usage> {
    let read = |u: &Value| -> Option<(u64, u64, u64)> {
        let fresh = u["input_tokens"].as_u64()?;
        let cached = u["cache_read_input_tokens"].as_u64().unwrap_or(0);
        let created = u["cache_creation_input_tokens"].as_u64().unwrap_or(0);
        Some((
            fresh + cached + created,
            cached,
            u["output_tokens"].as_u64().unwrap_or(0),
        ))
    };
    if let Ok(doc) = serde_json::from_str::<Value>(body) {
        let (input, cached, output) = read(&doc["usage"])?;
        return Some(Usage {
            input,
            output,
            cached,
        });
    }
    // Streamed: input in message_start, the final output count in the last message_delta.
    let mut usage: Option<Usage> = None;
    for data in super::sse_data(body) {
        match data["type"].as_str() {
            Some("message_start") => {
                if let Some((input, cached, output)) = read(&data["message"]["usage"]) {
                    usage = Some(Usage {
                        input,
                        output,
                        cached,
                    });
                }
            }
            Some("message_delta") => {
                if let (Some(u), Some(output)) =
                    (usage.as_mut(), data["usage"]["output_tokens"].as_u64())
                {
                    u.output = output;
                }
            }
            _ => {}
        }
    }
    usage
}
