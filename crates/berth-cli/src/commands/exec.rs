//! exec / run / ps / logs / kill.

use std::io::Write;

use anyhow::Result;
use base64::Engine as _;
use berth_contract::{
    ExecRequest, ExecSummary, ExitStatus, NativeId, OutputSink, Provider, ProviderExt, Stream,
};
use serde_json::{json, Value};

use crate::app::App;
use crate::cli::{CommandSpec, ExecArgs, RunArgs};
use crate::config::Fault;
use crate::duration;
use crate::errors::{code, CliError};
use crate::output::emit;

/// Puts a command's output into a JSON document: `NAME`, the bytes as text (U+FFFD where they
/// are not UTF-8), and — only when that text is not the bytes — `NAME_base64`, the exact bytes,
/// so binary output is never silently changed. `None` (a merged stream) is `null`.
fn put_output(doc: &mut Value, name: &str, bytes: Option<&[u8]>) {
    let text = bytes.map(String::from_utf8_lossy);
    let lossy = matches!(text, Some(std::borrow::Cow::Owned(_)));
    doc[name] = json!(text);
    if let (true, Some(bytes)) = (lossy, bytes) {
        doc[format!("{name}_base64")] = base64::engine::general_purpose::STANDARD
            .encode(bytes)
            .into();
    }
}

/// Builds the request. `--env NAME` takes the value from berth's own environment, so a secret
/// never has to appear in argv.
pub(crate) fn request(app: &App, spec: &CommandSpec) -> Result<ExecRequest> {
    let mut req = match (&spec.shell, spec.argv.is_empty()) {
        (Some(line), _) => ExecRequest::shell(line.clone()),
        (None, false) => ExecRequest::argv(spec.argv.clone()),
        (None, true) => {
            return Err(CliError::invalid(
                "nothing to run",
                "give a command after `--` (e.g. `-- ls -la`) or a line with `-c`",
            )
            .into())
        }
    };
    if let Some(timeout) = &spec.timeout {
        req.timeout = Some(duration::parse(timeout)?);
    }
    req.cwd = spec.cwd.clone();
    for item in &spec.env {
        match item.split_once('=') {
            Some((name, value)) => {
                req.env.insert(name.to_owned(), value.to_owned());
            }
            None => {
                let value = app.config.env.get(item).ok_or_else(|| {
                    CliError::invalid(
                        format!("--env {item}: `{item}` is not set in berth's environment"),
                        "export it first, or pass NAME=VALUE",
                    )
                })?;
                req.env.insert(item.clone(), value.to_owned());
            }
        }
    }
    Ok(req)
}

struct Terminal;

impl OutputSink for Terminal {
    fn chunk(&mut self, stream: Stream, bytes: &[u8]) {
        // A closed terminal must not abort the command; the status still matters.
        match stream {
            Stream::Stdout => crate::output::stdout_write_bytes(bytes),
            Stream::Stderr => {
                let _ = std::io::stderr().lock().write_all(bytes);
            }
        }
    }
}

/// Runs `req`: streamed to the terminal when the provider streams and output is text,
/// buffered otherwise. Prints JSON when asked. Returns the status.
async fn run_request(
    app: &App,
    command: &str,
    sandbox: &str,
    provider: &dyn Provider,
    id: &NativeId,
    req: &ExecRequest,
) -> Result<ExitStatus> {
    if let (false, Some(streaming)) = (app.json, provider.streaming()) {
        let summary: ExecSummary = streaming.exec_streaming(id, req, &mut Terminal).await?;
        if let ExitStatus::TimedOut | ExitStatus::Unknown { .. } = summary.status {
            errln!(
                "berth: command {}",
                crate::human::printable(&summary.status.to_string(), true)
            );
        }
        return Ok(summary.status);
    }
    let output = provider.exec(id, req).await?;
    if app.json {
        let mut doc = json!({
            "sandbox": sandbox,
            "status": output.status,
            "exit_code": output.status.shell_code(),
            "stdout_bytes": output.stdout_total,
            "stderr_bytes": output.stderr_total,
            "stdout_truncated": output.stdout_truncated(),
            "stderr_truncated": output.stderr_truncated(),
            "duration_ms": output.duration.as_secs_f64() * 1000.0,
        });
        put_output(&mut doc, "stdout", Some(&output.stdout));
        put_output(&mut doc, "stderr", output.stderr.as_deref());
        emit(command, doc);
    } else {
        Terminal.chunk(Stream::Stdout, &output.stdout);
        match &output.stderr {
            Some(stderr) => Terminal.chunk(Stream::Stderr, stderr),
            None => errln!("berth: this provider merges stderr into stdout"),
        }
        // An exit code the user cannot read as the command's own (124, 125) says why.
        if let ExitStatus::TimedOut | ExitStatus::Unknown { .. } = output.status {
            errln!(
                "berth: command {}",
                crate::human::printable(&output.status.to_string(), true)
            );
        }
    }
    Ok(output.status)
}

/// `berth exec`.
pub async fn exec(app: &App, args: ExecArgs) -> Result<i32> {
    let req = request(app, &args.spec)?;
    let (_row, provider, native) = app.sandbox(&args.id).await?;
    if args.detach {
        let handle = provider.require_detached()?.spawn(&native, &req).await?;
        if app.json {
            emit(
                "exec",
                json!({ "sandbox": args.id, "detached": true, "handle": handle.0 }),
            );
        } else {
            outln!("{}", handle.0);
        }
        return Ok(code::OK);
    }
    let status = run_request(app, "exec", &args.id, provider.as_ref(), &native, &req).await?;
    Ok(status.shell_code())
}

/// `berth run`: create, exec, destroy (unless `--keep`).
pub async fn run(app: &App, args: RunArgs) -> Result<i32> {
    let req = request(app, &args.spec)?;
    let provider = app.provider(&args.provider)?;
    let tracked = app
        .ledger
        .create_tracked(
            provider.as_ref(),
            "run",
            Some(std::time::Duration::from_secs(24 * 3600)),
            |create| {
                create.image = args.image.clone();
                create.network = args.network.mode();
            },
            |create| {
                let provider = provider.clone();
                async move { provider.create(&create).await }
            },
        )
        .await?;
    if !app.json {
        errln!(
            "berth: running in {} ({})",
            tracked.berth_id,
            tracked.provider
        );
    }
    match app.config.fault {
        Some(Fault::PanicAfterCreate) => panic!("injected fault: panic-after-create"),
        Some(Fault::ErrorAfterCreate) => anyhow::bail!("injected fault: error-after-create"),
        None => {}
    }
    let native = NativeId(tracked.native_id.clone());
    let status = run_request(
        app,
        "run",
        &tracked.berth_id,
        provider.as_ref(),
        &native,
        &req,
    )
    .await;
    if !args.keep {
        super::sandbox::destroy_tracked(app, provider.as_ref(), &tracked).await?;
    } else if !app.json {
        errln!("berth: kept {}", tracked.berth_id);
    }
    Ok(status?.shell_code())
}

fn process_status_json(
    status: &Result<berth_contract::ProcessStatus, berth_contract::ProviderError>,
) -> serde_json::Value {
    match status {
        Ok(berth_contract::ProcessStatus::Running) => json!({ "state": "running" }),
        Ok(berth_contract::ProcessStatus::Finished { status }) => {
            json!({ "state": "finished", "status": status, "exit_code": status.shell_code() })
        }
        Err(e) => json!({ "state": "unknown", "reason": e.to_string() }),
    }
}

/// `berth ps`.
pub async fn ps(app: &App, id: &str) -> Result<i32> {
    let (_row, provider, native) = app.sandbox(id).await?;
    let detached = provider.require_detached()?;
    let mut rows = Vec::new();
    for handle in detached.list(&native).await? {
        let status = detached.status(&native, &handle).await;
        rows.push((handle, process_status_json(&status)));
    }
    if app.json {
        let processes: Vec<_> = rows
            .iter()
            .map(|(h, s)| json!({ "handle": h.0, "status": s }))
            .collect();
        emit("ps", json!({ "sandbox": id, "processes": processes }));
    } else {
        outln!("{:<10} STATUS", "HANDLE");
        for (handle, status) in &rows {
            let shown = match status["state"].as_str() {
                Some("finished") => format!("finished ({})", status["exit_code"]),
                Some("unknown") => format!("unknown: {}", status["reason"].as_str().unwrap_or("")),
                other => other.unwrap_or("").to_owned(),
            };
            // A process's state and reason come from the sandbox's supervisor.
            outln!(
                "{:<10} {}",
                handle.0,
                crate::human::printable(&shown, false)
            );
        }
    }
    Ok(code::OK)
}

/// `berth logs [--follow]`.
pub async fn logs(app: &App, id: &str, handle: &str, follow: bool) -> Result<i32> {
    let (_row, provider, native) = app.sandbox(id).await?;
    let detached = provider.require_detached()?;
    let handle = berth_contract::ProcessHandle(handle.to_owned());
    if app.json && follow {
        return Err(CliError::invalid(
            "--follow streams output; it does not combine with --json",
            "leave out --follow for one JSON document of the output so far",
        )
        .into());
    }
    if app.json {
        // The status first: output read after it is complete when it says finished.
        let status = detached.status(&native, &handle).await;
        let (output, last) = read_output(
            detached,
            &native,
            &handle,
            berth_contract::DEFAULT_MAX_OUTPUT_BYTES,
        )
        .await?;
        let mut doc = json!({
            "sandbox": id,
            "handle": handle.0,
            "status": process_status_json(&status),
            "stdout_bytes": last.stdout_size,
            "stderr_bytes": last.stderr_size,
            "stdout_truncated": (output.0.len() as u64) < last.stdout_size,
            "stderr_truncated": (output.1.len() as u64) < last.stderr_size,
            // Written past what the sandbox keeps, and gone (null: unknown).
            "stdout_dropped_bytes": last.stdout_dropped,
            "stderr_dropped_bytes": last.stderr_dropped,
        });
        put_output(&mut doc, "stdout", Some(&output.0));
        put_output(&mut doc, "stderr", Some(&output.1));
        emit("logs", doc);
        return Ok(code::OK);
    }
    // Piece by piece from where the last read ended: memory stays bounded however long the
    // output, and following reads only what is new.
    let mut at = berth_contract::OutputOffsets::default();
    let mut dropped;
    loop {
        let status = detached.status(&native, &handle).await;
        // Without --follow, the output there is now: never chasing a process that goes on
        // writing.
        let mut until = None;
        let mut rewound = false;
        loop {
            let piece = detached
                .output(&native, &handle, at, berth_contract::MAX_OUTPUT_CHUNK)
                .await?;
            if !follow {
                until.get_or_insert((piece.stdout_size, piece.stderr_size));
            }
            dropped = (piece.stdout_dropped, piece.stderr_dropped);
            // A log that shrank (rewritten inside the sandbox) is shown again from its start;
            // rewritten again under the reads, it waits for the next look.
            if piece.stdout_size < at.stdout || piece.stderr_size < at.stderr {
                if std::mem::replace(&mut rewound, true) {
                    break;
                }
                if piece.stdout_size < at.stdout {
                    at.stdout = 0;
                }
                if piece.stderr_size < at.stderr {
                    at.stderr = 0;
                }
                if let Some(until) = until.as_mut() {
                    *until = (piece.stdout_size, piece.stderr_size);
                }
                continue;
            }
            if piece.stdout.is_empty() && piece.stderr.is_empty() {
                break;
            }
            Terminal.chunk(Stream::Stdout, &piece.stdout);
            Terminal.chunk(Stream::Stderr, &piece.stderr);
            at.stdout += piece.stdout.len() as u64;
            at.stderr += piece.stderr.len() as u64;
            if crate::output::stdout_gone()
                || until.is_some_and(|(out, err)| at.stdout >= out && at.stderr >= err)
            {
                break;
            }
        }
        let running = matches!(status, Ok(berth_contract::ProcessStatus::Running));
        // Following for a reader that went away (`| head`) has no one to follow for.
        if !follow || !running || crate::output::stdout_gone() {
            say_dropped(&handle.0, dropped);
            if follow {
                if let Err(e) = &status {
                    errln!("berth: {e}");
                }
            }
            return Ok(code::OK);
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Says on stderr what a detached process wrote past what its sandbox keeps (`logs` prints
/// the output itself on stdout and stderr).
fn say_dropped(handle: &str, dropped: (Option<u64>, Option<u64>)) {
    for line in dropped_notes(handle, dropped) {
        errln!("{line}");
    }
}

/// The lines [`say_dropped`] prints: one per stream that lost bytes (none for unknown or 0).
fn dropped_notes(handle: &str, (stdout, stderr): (Option<u64>, Option<u64>)) -> Vec<String> {
    [("stdout", stdout), ("stderr", stderr)]
        .into_iter()
        .filter_map(|(stream, dropped)| {
            dropped.filter(|b| *b > 0).map(|bytes| {
                format!(
                    "berth: {handle} wrote {bytes} more bytes to {stream} than its sandbox keeps; \
                     they were dropped"
                )
            })
        })
        .collect()
}

/// A detached process's output from its start, at most `limit` bytes of each stream, with the
/// last piece read (each stream's whole size, and what was dropped).
async fn read_output(
    detached: &dyn berth_contract::DetachedExec,
    native: &berth_contract::NativeId,
    handle: &berth_contract::ProcessHandle,
    limit: usize,
) -> Result<((Vec<u8>, Vec<u8>), berth_contract::OutputChunk)> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    // Bounded even against a sandbox that keeps rewriting its output under the reads.
    let rounds = 2 * limit.div_ceil(berth_contract::MAX_OUTPUT_CHUNK) + 2;
    for round in 1.. {
        let at = berth_contract::OutputOffsets {
            stdout: stdout.len() as u64,
            stderr: stderr.len() as u64,
        };
        let room = limit - stdout.len().min(stderr.len());
        let piece = detached.output(native, handle, at, room).await?;
        let keep = |kept: &mut Vec<u8>, bytes: &[u8], size: u64| {
            // Rewritten meanwhile: what was read no longer matches; none of it is kept.
            if size < kept.len() as u64 {
                kept.clear();
            }
            let room = limit.saturating_sub(kept.len());
            kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        };
        let before = (stdout.len(), stderr.len());
        keep(&mut stdout, &piece.stdout, piece.stdout_size);
        keep(&mut stderr, &piece.stderr, piece.stderr_size);
        let done = |kept: &Vec<u8>, size: u64| kept.len() >= limit || kept.len() as u64 >= size;
        if (done(&stdout, piece.stdout_size) && done(&stderr, piece.stderr_size))
            || (stdout.len(), stderr.len()) == before
            || round == rounds
        {
            return Ok(((stdout, stderr), piece));
        }
    }
    unreachable!("the rounds end with a return")
}

/// `berth kill`.
pub async fn kill(app: &App, id: &str, handle: &str) -> Result<i32> {
    let (_row, provider, native) = app.sandbox(id).await?;
    let handle = berth_contract::ProcessHandle(handle.to_owned());
    provider.require_detached()?.kill(&native, &handle).await?;
    if app.json {
        emit(
            "kill",
            json!({ "sandbox": id, "handle": handle.0, "killed": true }),
        );
    } else {
        errln!("killed {}", handle.0);
    }
    Ok(code::OK)
}

#[cfg(test)]
mod tests {
    use super::dropped_notes;

    /// Only bytes known to be dropped are said, per stream; unknown (`None`) and none are not.
    #[test]
    fn only_known_dropped_bytes_are_said() {
        assert!(dropped_notes("p1", (None, Some(0))).is_empty());
        assert_eq!(
            dropped_notes("p1", (Some(5), None)),
            ["berth: p1 wrote 5 more bytes to stdout than its sandbox keeps; they were dropped"]
        );
        assert_eq!(dropped_notes("p2", (Some(1), Some(2))).len(), 2);
    }
}
