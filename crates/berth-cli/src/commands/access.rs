//! `berth ssh` / `berth connect`: an interactive terminal in a sandbox; `berth port`: a port of
//! a sandbox forwarded to this machine's loopback.
//!
//! The terminal is the provider's (`Access::open_pty`): keystrokes go to it raw, so Ctrl-C is a
//! byte the sandbox's own terminal turns into SIGINT for its foreground process, never a signal
//! to Berth. The local terminal's mode is restored on every way out but SIGKILL.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::path::PathBuf;

use anyhow::{Context, Result};
use berth_contract::{ProviderExt, PtyRequest};
use berth_supervisor::pty::{Client, Screen};
use berth_supervisor::Exit;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::app::App;
use crate::cli::{PortArgs, SshArgs};
use crate::errors::{code, CliError};
use crate::output::emit;

/// What `berth ssh` runs without `-- CMD`: bash where the sandbox has it, else sh.
const DEFAULT_SHELL: &str =
    "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi";

/// The caller's `TERM`, when it is a plain terminal name (it goes into the sandbox).
fn terminal_name() -> String {
    match std::env::var("TERM") {
        Ok(term)
            if !term.is_empty()
                && term.len() <= 64
                && term
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b)) =>
        {
            term
        }
        _ => "xterm-256color".into(),
    }
}

/// The local terminal in raw mode for as long as this lives.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> std::io::Result<Self> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(stdin.as_fd())?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(stdin.as_fd(), rustix::termios::OptionalActions::Now, &raw)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin().as_fd(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

fn window_size() -> (u16, u16) {
    match rustix::termios::tcgetwinsize(std::io::stdout().as_fd()) {
        Ok(size) if size.ws_col > 0 && size.ws_row > 0 => (size.ws_col, size.ws_row),
        _ => (80, 24),
    }
}

/// `berth ssh ID [-- CMD…]`: exits with the command's exit code (128+N when a signal ended it).
pub async fn ssh(app: &App, args: SshArgs) -> Result<i32> {
    if app.json {
        // The terminal's screen owns stdout; a document there would be mixed into it.
        return Err(CliError::invalid(
            "`berth ssh` is interactive: its terminal owns stdout, so --json does not combine \
             with it",
            "use `berth exec --json ID -- CMD` for a machine-readable result",
        )
        .into());
    }
    let (_row, provider, native) = app.sandbox(&args.id).await?;
    let access = provider.require_access()?;
    let argv = if args.command.is_empty() {
        vec!["/bin/sh".into(), "-c".into(), DEFAULT_SHELL.into()]
    } else {
        args.command.clone()
    };
    let interactive = rustix::termios::isatty(std::io::stdin().as_fd());
    let (cols, rows) = window_size();
    let request = PtyRequest {
        argv,
        env: [("TERM".to_owned(), terminal_name())].into(),
        cols,
        rows,
    };
    let stream = access.open_pty(&native, &request).await?;
    let client = Client::new(stream);
    // Restored when this function's future ends or is dropped (SIGINT/SIGTERM to Berth abort
    // it), and before any error is printed.
    let raw = if interactive {
        Some(RawMode::enter().context("put the terminal in raw mode")?)
    } else {
        None
    };
    let keys = client.try_clone().context("share the terminal session")?;
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    // Piped input ended: end of file for the terminal's reader (Ctrl-D).
                    let _ = keys.send(&[4]);
                    return;
                }
                Ok(n) => {
                    if keys.send(&buf[..n]).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let resizes = match client.try_clone() {
        Ok(sizes) if interactive => Some(tokio::spawn(async move {
            let Ok(mut winch) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            while winch.recv().await.is_some() {
                let (cols, rows) = window_size();
                if sizes.resize(cols, rows).is_err() {
                    return;
                }
            }
        })),
        _ => None,
    };
    let ended = tokio::task::spawn_blocking(move || -> std::io::Result<Exit> {
        let mut stdout = std::io::stdout().lock();
        loop {
            match client.next()? {
                Screen::Output(bytes) => {
                    stdout.write_all(&bytes)?;
                    stdout.flush()?;
                }
                Screen::Ended(exit) => return Ok(exit),
            }
        }
    })
    .await
    .context("the terminal relay stopped")?;
    if let Some(task) = resizes {
        task.abort();
    }
    drop(raw);
    let exit = ended.context("the terminal session broke off")?;
    match exit {
        Exit::Exited { code } => Ok(code),
        Exit::Signalled { signal } => Ok(128 + signal),
        // Never a made-up code: 125 is Berth's own "could not run it / status unknown".
        other => {
            let why = match &other {
                Exit::TimedOut => "it timed out".to_owned(),
                Exit::SpawnFailed { kind, message } => format!("{kind}: {message}"),
                Exit::Unknown { reason } => reason.clone(),
                Exit::BadRequest { message } => format!("bad request: {message}"),
                _ => "the supervisor answered something else".to_owned(),
            };
            errln!(
                "berth: the terminal session ended without the command's status: {}",
                crate::human::printable(&why, false)
            );
            Ok(code::EXEC_FAILED)
        }
    }
}

/// One open forward, as `berth status` lists it. Schema version 1.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Forward {
    /// Schema version of this record.
    pub schema_version: u32,
    /// The sandbox.
    pub sandbox: String,
    /// The sandbox's port.
    pub port: u16,
    /// Where it answers on this machine.
    pub local: String,
    /// The forwarding `berth port` process.
    pub pid: u32,
    /// That process's start time (clock ticks since boot), so a reused pid is not mistaken
    /// for it.
    pub started: u64,
}

fn forwards_dir(app: &App) -> PathBuf {
    app.config.home.join("forwards")
}

/// A process's start time from `/proc/PID/stat` (field 22, after the parenthesised name).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The live forwards into `sandbox` (records of ended processes are removed).
pub fn open_forwards(app: &App, sandbox: &str) -> Vec<Forward> {
    let dir = forwards_dir(app);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut live = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        // Our own small records only: bounded reads, no symlinks followed.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() || meta.len() > 4096 {
            continue;
        }
        let Some(forward) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Forward>(&b).ok())
        else {
            continue;
        };
        if start_time(forward.pid) != Some(forward.started) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if forward.sandbox == sandbox {
            live.push(forward);
        }
    }
    live.sort_by_key(|f| (f.port, f.local.clone()));
    live
}

/// Removes its record when the forward ends.
struct Recorded(PathBuf);

impl Drop for Recorded {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn record(app: &App, sandbox: &str, port: u16, local: SocketAddr) -> Result<Recorded> {
    let dir = forwards_dir(app);
    std::fs::create_dir_all(&dir).context("create the forwards directory")?;
    let pid = std::process::id();
    let forward = Forward {
        schema_version: 1,
        sandbox: sandbox.to_owned(),
        port,
        local: local.to_string(),
        pid,
        started: start_time(pid).context("read this process's start time")?,
    };
    let path = dir.join(format!("{pid}-{port}.json"));
    std::fs::write(&path, serde_json::to_vec(&forward)?).context("record the forward")?;
    Ok(Recorded(path))
}

fn loopback_only(local: &SocketAddr) -> Result<()> {
    if local.ip().is_loopback() {
        return Ok(());
    }
    Err(CliError::invalid(
        format!("{local} is not a loopback address"),
        "a forward answers on this machine's loopback only (127.0.0.1 or [::1]): a sandbox's \
         port is not published to the network",
    )
    .into())
}

/// `berth port ID PORT [--local ADDR]`: until interrupted.
pub async fn port(app: &App, args: PortArgs) -> Result<i32> {
    loopback_only(&args.local)?;
    if args.port == 0 {
        return Err(CliError::invalid(
            "port 0 names no port in the sandbox",
            "give the port the sandbox's service listens on, e.g. `berth port ID 8080`",
        )
        .into());
    }
    let (_row, provider, native) = app.sandbox(&args.id).await?;
    provider.require_access()?;
    let listener =
        TcpListener::bind(args.local).with_context(|| format!("listen on {}", args.local))?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let local = listener.local_addr()?;
    let _recorded = record(app, &args.id, args.port, local)?;
    if app.json {
        emit(
            "port",
            json!({ "sandbox": args.id, "port": args.port, "local": local.to_string() }),
        );
    } else {
        outln!("{local}");
        errln!(
            "forwarding {local} → port {} of {} (Ctrl-C to stop)",
            args.port,
            args.id
        );
    }
    let _ = std::io::stdout().flush();
    loop {
        let (tcp, _) = listener.accept().await.context("accept a connection")?;
        let provider = provider.clone();
        let native = native.clone();
        let port = args.port;
        tokio::spawn(async move {
            let Ok(access) = provider.require_access() else {
                return;
            };
            let stream = match access.connect_port(&native, port).await {
                Ok(stream) => stream,
                // One refused connection is that client's business; the forward stays open.
                Err(err) => {
                    errln!("berth: port {port}: {err}");
                    return;
                }
            };
            let Ok(tcp) = tcp.into_std() else { return };
            let _ = tcp.set_nonblocking(false);
            std::thread::spawn(move || berth_supervisor::forward::splice_tcp(&stream, tcp));
        });
    }
}
