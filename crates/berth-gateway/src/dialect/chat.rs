//! OpenAI Chat Completions (OpenCode, through `@ai-sdk/openai-compatible`).

use serde_json::{json, Value};

use super::{new_id, sse, Call, Reply, Tool, Turn};
use crate::script::Usage;

/// `tools: [{type: "function", function: {name, parameters}}]`.
pub fn tools(body: &Value) -> Vec<Tool> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| {
                    Some(Tool {
                        name: t["function"]["name"].as_str()?.to_owned(),
                        schema: t["function"]["parameters"].clone(),
                        freeform: false,
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Messages with `role: "tool"`.
pub fn tool_results(body: &Value) -> usize {
    body["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] == "tool").count())
        .unwrap_or(0)
}

/// The conversation: `user` prompts, `assistant` messages with or without `tool_calls`.
pub fn history(body: &Value) -> Vec<super::Said> {
    use super::Said;
    body["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .map(|m| match m["role"].as_str() {
                    Some("user") => Said::Prompt,
                    Some("assistant") => match m["tool_calls"].as_array() {
                        Some(calls) if !calls.is_empty() => Said::ToolCall,
                        _ => Said::Answer,
                    },
                    _ => Said::Other,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn usage_json(usage: Usage) -> Value {
    json!({
        "prompt_tokens": usage.input,
        "completion_tokens": usage.output,
        "total_tokens": usage.input + usage.output,
        "prompt_tokens_details": { "cached_tokens": usage.cached },
    })
}

fn tool_call(call: &Call, id: &str) -> Value {
    let (name, arguments) = match call {
        Call::Function { name, arguments } => (name.clone(), arguments.to_string()),
        // Chat has no freeform tools; never offered here.
        Call::Custom { name, input } => (name.clone(), json!({ "input": input }).to_string()),
    };
    json!({ "id": id, "type": "function", "function": { "name": name, "arguments": arguments } })
}

/// A `chat.completion` object or its chunk stream.
pub fn render(turn: &Turn, reply: &Reply, usage: Usage) -> String {
    let id = new_id("chatcmpl-");
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let call_id = new_id("call_");
    let finish = match reply {
        Reply::Text(_) => "stop",
        Reply::Call(_) => "tool_calls",
    };
    if !turn.stream {
        let message = match reply {
            Reply::Text(text) => json!({ "role": "assistant", "content": text }),
            Reply::Call(call) => json!({
                "role": "assistant", "content": null, "tool_calls": [tool_call(call, &call_id)],
            }),
        };
        return json!({
            "id": id, "object": "chat.completion", "created": created, "model": turn.model,
            "choices": [{ "index": 0, "message": message, "finish_reason": finish }],
            "usage": usage_json(usage),
        })
        .to_string();
    }
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": turn.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        })
    };
    let mut out = String::new();
    match reply {
        Reply::Text(text) => {
            sse(
                &mut out,
                None,
                &chunk(json!({ "role": "assistant", "content": "" }), None),
            );
            sse(&mut out, None, &chunk(json!({ "content": text }), None));
        }
        Reply::Call(call) => {
            let mut call = tool_call(call, &call_id);
            call["index"] = json!(0);
            sse(
                &mut out,
                None,
                &chunk(
                    json!({ "role": "assistant", "content": null, "tool_calls": [call] }),
                    None,
                ),
            );
        }
    }
    sse(&mut out, None, &chunk(json!({}), Some(finish)));
    if turn.include_usage {
        sse(
            &mut out,
            None,
            &json!({
                "id": id, "object": "chat.completion.chunk", "created": created,
                "model": turn.model, "choices": [], "usage": usage_json(usage),
            }),
        );
    }
    out.push_str("data: [DONE]\n\n");
    out
}

/// The usage of a Chat Completions response body (JSON or event stream).
pub fn usage_of(body: &str) -> Option<Usage> {
    let read = |u: &Value| -> Option<Usage> {
        Some(Usage {
            input: u["prompt_tokens"].as_u64()?,
            output: u["completion_tokens"].as_u64()?,
            cached: u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
        })
    };
    if let Ok(doc) = serde_json::from_str::<Value>(body) {
        return read(&doc["usage"]);
    }
    super::sse_data(body)
        .filter_map(|d| read(&d["usage"]))
        .last()
}
