//! OpenAI Responses (Codex: its only wire API for custom providers).

use serde_json::{json, Value};

use super::{new_id, sse, Call, Reply, Tool, Turn};
use crate::script::Usage;

/// `tools: [{type: "function", name, parameters} | {type: "custom", name}]`.
pub fn tools(body: &Value) -> Vec<Tool> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| {
                    let name = t["name"].as_str()?.to_owned();
                    match t["type"].as_str()? {
                        "function" => Some(Tool {
                            name,
                            schema: t["parameters"].clone(),
                            freeform: false,
                        }),
                        "custom" => Some(Tool {
                            name,
                            schema: Value::Null,
                            freeform: true,
                        }),
                        _ => None,
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Input items of type `…_call_output`.
pub fn tool_results(body: &Value) -> usize {
    body["input"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|i| {
                    i["type"]
                        .as_str()
                        .is_some_and(|t| t.ends_with("_call_output"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// The conversation: `message` items by role, `…_call` items as tool calls.
pub fn history(body: &Value) -> Vec<super::Said> {
    use super::Said;
    body["input"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|i| match (i["type"].as_str(), i["role"].as_str()) {
                    (Some("message") | None, Some("user")) => Said::Prompt,
                    (Some("message") | None, Some("assistant")) => Said::Answer,
                    (Some(kind), _) if kind.ends_with("_call") => Said::ToolCall,
                    _ => Said::Other,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn usage_json(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.input,
        "input_tokens_details": { "cached_tokens": usage.cached },
        "output_tokens": usage.output,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": usage.input + usage.output,
    })
}

/// A `response` object or its event stream.
pub fn render(turn: &Turn, reply: &Reply, usage: Usage) -> String {
    let response_id = new_id("resp_");
    let item_id = new_id("item_");
    let call_id = new_id("call_");
    let item = match reply {
        Reply::Text(text) => json!({
            "type": "message", "id": item_id, "role": "assistant", "status": "completed",
            "content": [{ "type": "output_text", "text": text, "annotations": [] }],
        }),
        Reply::Call(Call::Function { name, arguments }) => json!({
            "type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments.to_string(), "status": "completed",
        }),
        Reply::Call(Call::Custom { name, input }) => json!({
            "type": "custom_tool_call", "id": item_id, "call_id": call_id, "name": name,
            "input": input, "status": "completed",
        }),
    };
    let response = |status: &str, output: Value, usage: Value| {
        json!({
            "id": response_id, "object": "response", "status": status, "model": turn.model,
            "output": output, "usage": usage,
        })
    };
    if !turn.stream {
        return response("completed", json!([item]), usage_json(usage)).to_string();
    }
    let mut out = String::new();
    let mut seq = 0u64;
    let mut event = |out: &mut String, kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(seq);
        seq += 1;
        sse(out, Some(kind), &data);
    };
    let pending = response("in_progress", json!([]), Value::Null);
    event(&mut out, "response.created", json!({ "response": pending }));
    event(
        &mut out,
        "response.in_progress",
        json!({ "response": pending }),
    );
    let mut added = item.clone();
    added["status"] = json!("in_progress");
    match reply {
        Reply::Text(text) => {
            added["content"] = json!([]);
            event(
                &mut out,
                "response.output_item.added",
                json!({ "output_index": 0, "item": added }),
            );
            let part = json!({ "type": "output_text", "text": "", "annotations": [] });
            let at = json!({ "item_id": item_id, "output_index": 0, "content_index": 0 });
            let with = |extra: Value| {
                let mut v = at.clone();
                for (k, x) in extra.as_object().into_iter().flatten() {
                    v[k] = x.clone();
                }
                v
            };
            event(
                &mut out,
                "response.content_part.added",
                with(json!({ "part": part })),
            );
            event(
                &mut out,
                "response.output_text.delta",
                with(json!({ "delta": text })),
            );
            event(
                &mut out,
                "response.output_text.done",
                with(json!({ "text": text })),
            );
            event(
                &mut out,
                "response.content_part.done",
                with(json!({ "part": { "type": "output_text", "text": text, "annotations": [] } })),
            );
        }
        Reply::Call(Call::Function { arguments, .. }) => {
            added["arguments"] = json!("");
            event(
                &mut out,
                "response.output_item.added",
                json!({ "output_index": 0, "item": added }),
            );
            let args = arguments.to_string();
            event(
                &mut out,
                "response.function_call_arguments.delta",
                json!({ "item_id": item_id, "output_index": 0, "delta": args }),
            );
            event(
                &mut out,
                "response.function_call_arguments.done",
                json!({ "item_id": item_id, "output_index": 0, "arguments": args }),
            );
        }
        Reply::Call(Call::Custom { input, .. }) => {
            added["input"] = json!("");
            event(
                &mut out,
                "response.output_item.added",
                json!({ "output_index": 0, "item": added }),
            );
            event(
                &mut out,
                "response.custom_tool_call_input.delta",
                json!({ "item_id": item_id, "output_index": 0, "delta": input }),
            );
            event(
                &mut out,
                "response.custom_tool_call_input.done",
                json!({ "item_id": item_id, "output_index": 0, "input": input }),
            );
        }
    }
    event(
        &mut out,
        "response.output_item.done",
        json!({ "output_index": 0, "item": item }),
    );
    event(
        &mut out,
        "response.completed",
        json!({ "response": response("completed", json!([item]), usage_json(usage)) }),
    );
    out
}

/// The usage of a Responses body (JSON or event stream).
pub fn usage_of(body: &str) -> Option<Usage> {
    let read = |u: &Value| -> Option<Usage> {
        Some(Usage {
            input: u["input_tokens"].as_u64()?,
            output: u["output_tokens"].as_u64()?,
            cached: u["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
        })
    };
    if let Ok(doc) = serde_json::from_str::<Value>(body) {
        return read(&doc["usage"]);
    }
    super::sse_data(body)
        .filter_map(|d| read(&d["response"]["usage"]))
        .last()
}
