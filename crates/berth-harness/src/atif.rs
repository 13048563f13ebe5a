//! ATIF (Harbor's Agent Trajectory Interchange Format, v1.4) from Berth's normalized events.
//!
//! Step 1 is the user's instructions; every agent step gathers, in order, the assistant's text
//! and reasoning, its tool calls and their results (an agent step ends when a result is followed
//! by new text or a new call). Token totals come from the CLI's own usage events, each counted
//! once (cached tokens inside the prompt total, as ATIF defines them). A trajectory with no agent
//! step is refused: an empty trajectory is not a run.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::events::{Event, EventKind};
use crate::Harness;

/// The ATIF version written.
pub const ATIF_VERSION: &str = "ATIF-v1.4";

#[derive(Default)]
struct AgentStep {
    message: String,
    reasoning: String,
    calls: Vec<Value>,
    results: Vec<Value>,
    events: Vec<String>,
}

impl AgentStep {
    fn is_empty(&self) -> bool {
        self.message.is_empty()
            && self.reasoning.is_empty()
            && self.calls.is_empty()
            && self.results.is_empty()
    }
}

fn call_arguments(input: &Value) -> Value {
    match input {
        Value::Object(_) => input.clone(),
        Value::Null => json!({}),
        other => json!({ "input": other }),
    }
}

/// The ATIF trajectory of one attempt's agent run.
pub fn trajectory(
    harness: Harness,
    instructions: &str,
    model: Option<&str>,
    events: &[Event],
) -> Result<Value, String> {
    let mut steps: Vec<AgentStep> = Vec::new();
    let mut current = AgentStep::default();
    // Which step each call id is in (the open step is `steps.len()`): one lookup per result,
    // however long the stream a sandbox wrote.
    let mut step_of_call: HashMap<String, usize> = HashMap::new();
    // Totals stay `Some` while every usage event's count is known and the sum fits.
    let (mut prompt, mut completion, mut cached) = (Some(0u64), Some(0u64), Some(0u64));
    let (mut cost, mut priced) = (Some(0f64), false);
    let mut usage_seen = false;
    for event in events {
        let starts_new = matches!(
            event.kind,
            EventKind::AgentMessageChunk | EventKind::AgentThoughtChunk | EventKind::ToolCall
        ) && !current.results.is_empty();
        if starts_new {
            steps.push(std::mem::take(&mut current));
        }
        match event.kind {
            EventKind::AgentMessageChunk => current
                .message
                .push_str(event.data["text"].as_str().unwrap_or("")),
            EventKind::AgentThoughtChunk => current
                .reasoning
                .push_str(event.data["text"].as_str().unwrap_or("")),
            EventKind::ToolCall => {
                let id = event.data["id"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| event.event_id.clone());
                step_of_call.insert(id.clone(), steps.len());
                current.calls.push(json!({
                    "tool_call_id": id,
                    "function_name": event.data["name"].as_str().unwrap_or("tool"),
                    "arguments": call_arguments(&event.data["input"]),
                }))
            }
            EventKind::ToolCallUpdate => {
                // ATIF ties a result to a call of its own step. The CLI's stream comes from the
                // sandbox: a result may name a call of an earlier step (it goes there, beside
                // its call), a call never reported, or an id that is not a string (then it is
                // a result without a call id, which ATIF allows).
                let id = event.data["id"].as_str();
                let result = |source: Option<&str>| {
                    json!({
                        "source_call_id": source,
                        "content": event.data["content"].as_str().unwrap_or(""),
                    })
                };
                match id.and_then(|id| step_of_call.get(id)).copied() {
                    Some(earlier) if earlier < steps.len() => {
                        let step = &mut steps[earlier];
                        step.results.push(result(id));
                        step.events.push(event.event_id.clone());
                        continue;
                    }
                    Some(_) => current.results.push(result(id)),
                    None => current.results.push(result(None)),
                }
            }
            EventKind::Usage => {
                usage_seen = true;
                let add = |total: Option<u64>, n: &Value| total?.checked_add(n.as_u64()?);
                prompt = add(prompt, &event.data["input"]);
                completion = add(completion, &event.data["output"]);
                cached = add(cached, &event.data["cached"]);
                let price = &event.data["cost_usd"];
                if !price.is_null() {
                    priced = true;
                    cost = cost
                        .zip(price.as_f64().filter(|c| c.is_finite() && *c >= 0.0))
                        .map(|(total, c)| total + c)
                        .filter(|total| total.is_finite());
                }
            }
            _ => {}
        }
        if !matches!(event.kind, EventKind::Usage | EventKind::Unparsed) {
            current.events.push(event.event_id.clone());
        }
    }
    if !current.is_empty() {
        steps.push(current);
    }
    steps.retain(|s| !s.is_empty());
    if steps.is_empty() {
        return Err(format!(
            "the {} run has no agent step: an empty trajectory is not exported",
            harness.as_str()
        ));
    }
    let session_id = events
        .iter()
        .find_map(|e| e.session_id.clone())
        .unwrap_or_else(|| {
            events
                .first()
                .map(|e| e.event_id.clone())
                .unwrap_or_default()
        });
    let mut out = vec![json!({ "step_id": 1, "source": "user", "message": instructions })];
    for (n, step) in steps.into_iter().enumerate() {
        let mut object = Map::new();
        object.insert("step_id".into(), json!(n + 2));
        object.insert("source".into(), json!("agent"));
        if let Some(model) = model {
            object.insert("model_name".into(), json!(model));
        }
        object.insert("message".into(), json!(step.message));
        if !step.reasoning.is_empty() {
            object.insert("reasoning_content".into(), json!(step.reasoning));
        }
        if !step.calls.is_empty() {
            object.insert("tool_calls".into(), Value::Array(step.calls));
        }
        if !step.results.is_empty() {
            object.insert("observation".into(), json!({ "results": step.results }));
        }
        object.insert("extra".into(), json!({ "berth_event_ids": step.events }));
        out.push(Value::Object(object));
    }
    let (package, version) = harness.pinned();
    let mut final_metrics = json!({ "total_steps": out.len() });
    // A total that any usage event left unknown is left out (ATIF's totals are optional),
    // never written as a sum of the known part.
    if usage_seen {
        for (name, total) in [
            ("total_prompt_tokens", prompt),
            ("total_completion_tokens", completion),
            ("total_cached_tokens", cached),
        ] {
            if let Some(total) = total {
                final_metrics[name] = json!(total);
            }
        }
    }
    if let Some(cost) = cost.filter(|_| priced) {
        final_metrics["total_cost_usd"] = json!(cost);
    }
    Ok(json!({
        "schema_version": ATIF_VERSION,
        "session_id": session_id,
        "agent": {
            "name": harness.as_str(),
            "version": version,
            "model_name": model,
            "extra": { "package": package },
        },
        "steps": out,
        "final_metrics": final_metrics,
        "notes": "Exported by Berth from its normalized events (berth.events/v1); the CLI's raw JSONL is the source of truth.",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize;

    #[test]
    fn a_claude_run_becomes_user_then_agent_steps_with_observations_and_totals() {
        let raw = r#"{"type":"system","subtype":"init","session_id":"s-9","model":"m"}
{"type":"assistant","message":{"content":[{"type":"thinking","thinking":"look first"},{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"/w/a"}}]},"session_id":"s-9"}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"old","is_error":false}]},"session_id":"s-9"}
{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t2","name":"Write","input":{"file_path":"/w/a","content":"new"}}]},"session_id":"s-9"}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t2","content":"ok","is_error":false}]},"session_id":"s-9"}
{"type":"assistant","message":{"content":[{"type":"text","text":"Done"}]},"session_id":"s-9"}
{"type":"result","subtype":"success","is_error":false,"result":"Done","session_id":"s-9","usage":{"input_tokens":30,"cache_read_input_tokens":70,"output_tokens":9},"total_cost_usd":0.002}"#;
        let events = normalize(Harness::ClaudeCode, "k", "agent.jsonl", raw.as_bytes());
        let t = trajectory(Harness::ClaudeCode, "fix it", Some("m"), &events).unwrap();
        assert_eq!(t["schema_version"], ATIF_VERSION);
        assert_eq!(t["session_id"], "s-9");
        let steps = t["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 4, "{t:#}");
        assert_eq!(steps[0]["source"], "user");
        assert_eq!(steps[1]["reasoning_content"], "look first");
        assert_eq!(steps[1]["tool_calls"][0]["function_name"], "Read");
        assert_eq!(
            steps[1]["observation"]["results"][0]["source_call_id"],
            "t1"
        );
        assert_eq!(steps[2]["tool_calls"][0]["arguments"]["content"], "new");
        assert_eq!(steps[3]["message"], "Done");
        let ids: Vec<u64> = steps
            .iter()
            .map(|s| s["step_id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        assert_eq!(t["final_metrics"]["total_prompt_tokens"], 100);
        assert_eq!(t["final_metrics"]["total_cached_tokens"], 70);
        assert_eq!(t["final_metrics"]["total_cost_usd"], 0.002);
        assert_harbor_accepts(&t);
    }

    /// What Harbor's own model requires of a trajectory (its pydantic validators): step ids
    /// 1, 2, … in order; a tool call id is a string; an observation result's `source_call_id`
    /// is null or names a tool call of the same step.
    fn assert_harbor_accepts(t: &Value) {
        let steps = t["steps"].as_array().unwrap();
        for (n, step) in steps.iter().enumerate() {
            assert_eq!(step["step_id"], n + 1, "{t:#}");
            let calls: Vec<&str> = step["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| c["tool_call_id"].as_str().expect("a string tool_call_id"))
                .collect();
            for result in step["observation"]["results"]
                .as_array()
                .into_iter()
                .flatten()
            {
                match &result["source_call_id"] {
                    Value::Null => {}
                    Value::String(id) => assert!(
                        calls.contains(&id.as_str()),
                        "step {}: result for `{id}`, calls {calls:?}",
                        n + 1
                    ),
                    other => panic!("source_call_id {other}"),
                }
            }
        }
    }

    /// The stream comes from the sandbox: results out of their call's step, for calls never
    /// reported, or with ids that are not strings still make a trajectory Harbor accepts, and
    /// each result stays beside its call.
    #[test]
    fn every_result_sits_in_its_calls_step_or_names_no_call() {
        let raw = r#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t1","name":"Read","input":{}},{"type":"tool_use","id":"t2","name":"Read","input":{}}]}}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"one"}]}}
{"type":"assistant","message":{"content":[{"type":"text","text":"half way"}]}}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t2","content":"two"}]}}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"ghost","content":"three"}]}}
{"type":"assistant","message":{"content":[{"type":"tool_use","id":7,"name":"Bash","input":"ls"}]}}
{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":7,"content":"four"}]}}"#;
        let events = normalize(Harness::ClaudeCode, "k", "agent.jsonl", raw.as_bytes());
        let t = trajectory(Harness::ClaudeCode, "go", None, &events).unwrap();
        assert_harbor_accepts(&t);
        let steps = t["steps"].as_array().unwrap();
        let first = &steps[1]["observation"]["results"];
        assert_eq!(first[0]["content"], "one");
        assert_eq!(first[1]["source_call_id"], "t2", "{t:#}");
        assert_eq!(first[1]["content"], "two");
        let later: Vec<&Value> = steps[2..]
            .iter()
            .flat_map(|s| s["observation"]["results"].as_array().into_iter().flatten())
            .collect();
        assert_eq!(later.len(), 2, "{t:#}");
        assert!(later.iter().all(|r| r["source_call_id"].is_null()), "{t:#}");
    }

    /// A total is written only when every usage event's count is known and the sum fits: a
    /// count the sandbox's stream got wrong leaves that total out, and a price that is not a
    /// finite, non-negative number leaves the cost out.
    #[test]
    fn totals_are_left_out_when_any_part_is_unknown() {
        let max = u64::MAX;
        let raw = format!(
            r#"{{"type":"assistant","message":{{"content":[{{"type":"text","text":"hi"}}]}}}}
{{"type":"result","is_error":false,"usage":{{"input_tokens":{max},"output_tokens":1}},"total_cost_usd":1e308}}
{{"type":"result","is_error":false,"usage":{{"input_tokens":{max},"output_tokens":1}},"total_cost_usd":1e308}}
"#
        );
        let events = normalize(Harness::ClaudeCode, "k", "a", raw.as_bytes());
        let t = trajectory(Harness::ClaudeCode, "go", None, &events).unwrap();
        assert_harbor_accepts(&t);
        let totals = &t["final_metrics"];
        assert!(totals.get("total_prompt_tokens").is_none(), "{totals}");
        assert!(totals.get("total_cost_usd").is_none(), "{totals}");
        assert_eq!(totals["total_completion_tokens"], 2);
        assert_eq!(totals["total_cached_tokens"], 0);
        // Each count fits, the sum does not.
        let half = max / 2 + 1;
        let raw = format!(
            r#"{{"type":"turn.completed","usage":{{"input_tokens":{half},"output_tokens":{half}}}}}
{{"type":"item.completed","item":{{"id":"i","type":"agent_message","text":"hi"}}}}
{{"type":"turn.completed","usage":{{"input_tokens":{half},"output_tokens":1}}}}
"#
        );
        let events = normalize(Harness::Codex, "k", "a", raw.as_bytes());
        let t = trajectory(Harness::Codex, "go", None, &events).unwrap();
        let totals = &t["final_metrics"];
        assert!(totals.get("total_prompt_tokens").is_none(), "{totals}");
        assert_eq!(totals["total_completion_tokens"], json!(half + 1));
        let raw = r#"{"type":"assistant","message":{"content":[{"type":"text","text":"hi"}]}}
{"type":"result","is_error":false,"usage":{"input_tokens":3,"output_tokens":1},"total_cost_usd":-2}
"#;
        let events = normalize(Harness::ClaudeCode, "k", "a", raw.as_bytes());
        let t = trajectory(Harness::ClaudeCode, "go", None, &events).unwrap();
        assert!(t["final_metrics"].get("total_cost_usd").is_none(), "{t:#}");
        assert_eq!(t["final_metrics"]["total_prompt_tokens"], 3);
    }

    #[test]
    fn an_empty_run_exports_nothing() {
        let events = normalize(Harness::Codex, "k", "a", b"{\"type\":\"turn.started\"}\n");
        assert!(trajectory(Harness::Codex, "x", None, &events)
            .unwrap_err()
            .contains("empty trajectory"));
    }
}
