//! Output: the versioned JSON envelope and human error rendering.

use serde_json::{json, Value};

use crate::errors::classify;

/// The JSON schema tag of every `--json` document.
pub const SCHEMA: &str = "berth.cli/v1";

tokio::task_local! {
    /// Set while `berth serve` runs a command: its document is kept here, not printed.
    static CAPTURED: std::cell::RefCell<Option<Value>>;
}

/// Runs `work` and returns what it emitted instead of printing it (`berth serve`).
pub async fn capture<F: std::future::Future>(work: F) -> (F::Output, Option<Value>) {
    CAPTURED
        .scope(std::cell::RefCell::new(None), async move {
            let out = work.await;
            let doc = CAPTURED.with(|c| c.borrow_mut().take());
            (out, doc)
        })
        .await
}

/// Prints one JSON document: `{"schema", "command", ...fields}`.
pub fn emit(command: &str, fields: Value) {
    let mut doc = json!({ "schema": SCHEMA, "command": command });
    if let (Some(doc), Value::Object(fields)) = (doc.as_object_mut(), fields) {
        doc.extend(fields);
    }
    let doc = match CAPTURED.try_with(|c| c.borrow_mut().replace(doc.clone())) {
        Ok(_) => return,
        Err(_) => doc,
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&doc).expect("json serializes")
    );
}

/// Reports an error (JSON on stdout, or text on stderr) and returns its exit code.
pub fn failure(json: bool, command: &str, err: &anyhow::Error) -> i32 {
    let failure = classify(err);
    if json {
        emit(command, json!({ "error": failure }));
    } else {
        eprintln!("berth: error: {}", failure.message);
        if let Some(hint) = &failure.hint {
            eprintln!("hint: {hint}");
        }
    }
    failure.exit_code
}
