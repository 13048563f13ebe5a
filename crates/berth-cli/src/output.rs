//! Output: the versioned JSON envelope and human error rendering.

use std::io::Write as _;

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

/// Set once a write to stdout failed: nothing more is written there.
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Set when that failure was not the reader going away (a full disk behind a redirect).
static STDOUT_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes to stdout (what `outln!`/`out!` call). A reader that went away (`berth … | head`)
/// ends the output, not the command: the rest is dropped, and the command finishes its work
/// and its cleanup and exits as it would have. Any other write error (a full disk behind a
/// redirect) is said once on stderr and makes a command that succeeded exit 1 (see
/// [`flush_stdout`]). Never panics, unlike `println!`.
pub fn stdout_write(args: std::fmt::Arguments<'_>) {
    stdout_bytes(|out| out.write_fmt(args));
}

/// Writes raw bytes to stdout (a command's output, a file's bytes), as [`stdout_write`].
pub fn stdout_write_bytes(bytes: &[u8]) {
    stdout_bytes(|out| out.write_all(bytes));
}

fn stdout_bytes(write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>) {
    use std::sync::atomic::Ordering;
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = write(&mut out) {
        if !STDOUT_GONE.swap(true, Ordering::Relaxed) && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            STDOUT_FAILED.store(true, Ordering::Relaxed);
            errln!("berth: cannot write to stdout: {e}");
        }
    }
}

/// Flushes what stdout still buffers; true when output was lost to an error other than the
/// reader going away (the command's exit code must not then say everything went well).
pub fn flush_stdout() -> bool {
    stdout_bytes(|out| out.flush());
    STDOUT_FAILED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether `berth serve` is running the command (its document is kept, stdout unused).
pub fn capturing() -> bool {
    CAPTURED.try_with(|_| ()).is_ok()
}

/// Whether everything written so far reached stdout (flushed, no write failed), or was kept
/// for `berth serve`. A command whose output is the only copy of something (a new token) must
/// not call it done when it was not.
pub fn delivered() -> bool {
    if capturing() {
        return true;
    }
    stdout_bytes(|out| out.flush());
    !STDOUT_GONE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether stdout is `/dev/null` (redirected there, or closed when Berth started: the runtime
/// then opens `/dev/null` in its place), so what is written there is lost. Never, under
/// `berth serve`.
pub fn stdout_is_null() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if capturing() {
        return false;
    }
    let stdout = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata());
    match (stdout, std::fs::metadata("/dev/null")) {
        (Ok(out), Ok(null)) => out.file_type().is_char_device() && out.rdev() == null.rdev(),
        _ => false,
    }
}

/// Whether stdout's reader went away: a command that only follows output (`logs --follow`,
/// `watch`) stops then.
pub fn stdout_gone() -> bool {
    STDOUT_GONE.load(std::sync::atomic::Ordering::Relaxed)
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
    outln!(
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
        say_failure(None, &failure);
    }
    failure.exit_code
}

/// Says a failure to people on stderr, with its hint; `subject` (an id of several a command
/// works through) leads the message. Messages carry names and text from sandboxes and
/// repositories: shown, never obeyed.
pub fn say_failure(subject: Option<&str>, failure: &crate::errors::Failure) {
    let message = match subject {
        Some(subject) => format!("{subject}: {}", failure.message),
        None => failure.message.clone(),
    };
    errln!("berth: error: {}", crate::human::printable(&message, true));
    if let Some(hint) = &failure.hint {
        errln!("hint: {}", crate::human::printable(hint, true));
    }
}
