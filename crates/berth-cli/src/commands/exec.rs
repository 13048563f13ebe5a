//! exec / run / cp.

use std::io::{Read, Write};

use anyhow::{Context, Result};
use berth_contract::{
    ExecRequest, ExecSummary, ExitStatus, NativeId, OutputSink, Provider, ProviderExt, Stream,
};
use serde_json::json;

use crate::app::App;
use crate::cli::{CommandSpec, ExecArgs, RunArgs};
use crate::config::Fault;
use crate::duration;
use crate::errors::{code, CliError};
use crate::output::emit;

/// Builds the request. `--env NAME` takes the value from berth's own environment, so a secret
/// never has to appear in argv.
fn request(app: &App, spec: &CommandSpec) -> Result<ExecRequest> {
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
        let _ = match stream {
            Stream::Stdout => std::io::stdout().lock().write_all(bytes),
            Stream::Stderr => std::io::stderr().lock().write_all(bytes),
        };
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
            eprintln!("berth: command {}", summary.status);
        }
        return Ok(summary.status);
    }
    let output = provider.exec(id, req).await?;
    if app.json {
        emit(
            command,
            json!({
                "sandbox": sandbox,
                "status": output.status,
                "exit_code": output.status.shell_code(),
                "stdout": String::from_utf8_lossy(&output.stdout),
                "stderr": output.stderr.as_deref().map(String::from_utf8_lossy),
                "stdout_bytes": output.stdout_total,
                "stderr_bytes": output.stderr_total,
                "stdout_truncated": output.stdout_truncated(),
                "stderr_truncated": output.stderr_truncated(),
                "duration_ms": output.duration.as_secs_f64() * 1000.0,
            }),
        );
    } else {
        Terminal.chunk(Stream::Stdout, &output.stdout);
        match &output.stderr {
            Some(stderr) => Terminal.chunk(Stream::Stderr, stderr),
            None => eprintln!("berth: this provider merges stderr into stdout"),
        }
    }
    Ok(output.status)
}

/// `berth exec`.
pub async fn exec(app: &App, args: ExecArgs) -> Result<i32> {
    let req = request(app, &args.spec)?;
    let (_row, provider, native) = app.sandbox(&args.id).await?;
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
        eprintln!(
            "berth: running in {} ({})",
            tracked.berth_id, tracked.provider
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
        eprintln!("berth: kept {}", tracked.berth_id);
    }
    Ok(status?.shell_code())
}

enum Endpoint<'a> {
    Sandbox { id: &'a str, path: &'a str },
    Local(&'a str),
}

fn endpoint(text: &str) -> Endpoint<'_> {
    // `bx-…:path` is a sandbox; anything with a `/` before the first `:` is a local path.
    match text.split_once(':') {
        Some((id, path)) if !id.is_empty() && !id.contains('/') => Endpoint::Sandbox { id, path },
        _ => Endpoint::Local(text),
    }
}

/// `berth cp`.
pub async fn cp(app: &App, source: &str, destination: &str) -> Result<i32> {
    let bytes = match (endpoint(source), endpoint(destination)) {
        (Endpoint::Sandbox { id, path }, Endpoint::Local(local)) => {
            let (_row, provider, native) = app.sandbox(id).await?;
            let data = provider.require_files()?.read(&native, path).await?;
            if local == "-" {
                std::io::stdout().lock().write_all(&data)?;
            } else {
                std::fs::write(local, &data).with_context(|| format!("cannot write {local}"))?;
            }
            data.len()
        }
        (Endpoint::Local(local), Endpoint::Sandbox { id, path }) => {
            let data = if local == "-" {
                let mut data = Vec::new();
                std::io::stdin().lock().read_to_end(&mut data)?;
                data
            } else {
                std::fs::read(local).with_context(|| format!("cannot read {local}"))?
            };
            let (_row, provider, native) = app.sandbox(id).await?;
            provider
                .require_files()?
                .write(&native, path, &data)
                .await?;
            data.len()
        }
        _ => {
            return Err(CliError::invalid(
                "cp needs exactly one side as ID:path",
                "e.g. `berth cp ./notes.txt bx-1234:notes.txt` or `berth cp bx-1234:out.txt -`",
            )
            .into())
        }
    };
    if app.json {
        emit(
            "cp",
            json!({ "from": source, "to": destination, "bytes": bytes }),
        );
    } else if destination != "-" {
        eprintln!("copied {bytes} bytes");
    }
    Ok(code::OK)
}
