//! The supervisor's server: one thread per connection, one request per connection.

mod detached;
mod exec;

use std::io::{self, BufRead, BufReader, Read};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use exec::{exec, spawn_failure};

use crate::{
    write_frame, Exit, Request, MAX_KEPT_OUTPUT, PROTOCOL_VERSION, TAG_ACCEPTED, TAG_EXIT,
};

/// Longest request line accepted.
const MAX_REQUEST: u64 = 4 << 20;

/// Binds `socket` (replacing a stale one) and serves forever.
pub fn serve(socket: &Path) -> io::Result<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    }
    self::exec::prepare_next();
    for connection in listener.incoming() {
        match connection {
            Ok(stream) => {
                // At the sandbox's process limit no thread can be made: the request is refused
                // here, on the accepting thread, saying so. (`std::thread::spawn` panicked
                // there, ending the supervisor — and a container with it.)
                let spare = stream.try_clone();
                let spawned = std::thread::Builder::new().spawn(move || {
                    if let Err(err) = handle(stream) {
                        eprintln!("berth-supervisor: connection failed: {err}");
                    }
                });
                if let (Err(err), Ok(stream)) = (spawned, spare) {
                    refuse(stream, &err);
                }
            }
            Err(err) => eprintln!("berth-supervisor: accept failed: {err}"),
        }
    }
    Ok(())
}

/// Answers a request no thread could be made for: its line read (bounded, within a second),
/// then a start failure that names the sandbox's process count against its limit.
fn refuse(stream: UnixStream, err: &io::Error) {
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(1)));
    let mut line = String::new();
    let _ = BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line);
    let exit = Exit::SpawnFailed {
        kind: crate::reaper::start_failure_kind(err).into(),
        message: format!(
            "the sandbox's supervisor cannot take a request now: {err}{}",
            crate::reaper::at_process_limit(err)
        ),
    };
    let _ = send_exit(&Mutex::new(stream), &exit);
}

fn send_exit(stream: &Mutex<UnixStream>, exit: &Exit) -> io::Result<()> {
    let payload = serde_json::to_vec(exit).expect("exit serializes");
    let mut out = stream.lock().unwrap_or_else(|p| p.into_inner());
    write_frame(&mut *out, TAG_EXIT, &payload)
}

/// Whether the client has hung up (it sends nothing after its request line, so a readable
/// end-of-file means it is gone).
fn client_gone(stream: &UnixStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut byte = [0u8; 1];
    let gone = matches!((&*stream).read(&mut byte), Ok(0));
    let _ = stream.set_nonblocking(false);
    gone
}

fn handle(stream: UnixStream) -> io::Result<()> {
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line)?;
    let out = Arc::new(Mutex::new(stream.try_clone()?));
    let request = match serde_json::from_str::<Request>(&line) {
        Ok(request) => request,
        Err(err) => {
            return send_exit(
                &out,
                &Exit::BadRequest {
                    message: format!("malformed request: {err}"),
                },
            )
        }
    };
    match request {
        Request::Ping { v }
        | Request::Exec { v, .. }
        | Request::Spawn { v, .. }
        | Request::Status { v, .. }
        | Request::Output { v, .. }
        | Request::Kill { v, .. }
        | Request::Listen { v, .. }
        | Request::Attach { v, .. }
        | Request::Connect { v, .. }
        | Request::Pty { v, .. }
            if v != PROTOCOL_VERSION =>
        {
            send_exit(
                &out,
                &Exit::BadRequest {
                    message: format!(
                        "protocol version {v}; this supervisor speaks {PROTOCOL_VERSION}"
                    ),
                },
            )
        }
        Request::Ping { .. } => send_exit(&out, &Exit::Exited { code: 0 }),
        // Anything that acts runs only for a client still waiting for it: a request read late
        // (the sandbox was paused and the client gave up) is dropped, never run behind its back.
        _ if client_gone(&stream) => Ok(()),
        _ if {
            let mut writer = out.lock().unwrap_or_else(|p| p.into_inner());
            write_frame(&mut *writer, TAG_ACCEPTED, &[]).is_err()
        } =>
        {
            Ok(())
        }
        Request::Spawn {
            argv,
            cwd,
            env,
            log_dir,
            keep,
            ..
        } => send_exit(
            &out,
            &detached::spawn(&argv, &cwd, &env, &log_dir, keep.unwrap_or(MAX_KEPT_OUTPUT)),
        ),
        Request::Status { process, .. } => send_exit(&out, &detached::status(&process)),
        Request::Output {
            process,
            log_dir,
            stdout_from,
            stderr_from,
            max,
            ..
        } => {
            let exit = detached::output(&out, &process, &log_dir, [stdout_from, stderr_from], max);
            send_exit(&out, &exit)
        }
        Request::Listen { port, .. } => match crate::forward::listen(&stream, &out, port) {
            Ok(()) => Ok(()),
            Err(exit) => send_exit(&out, &exit),
        },
        Request::Attach { connection, .. } => match crate::forward::take(connection) {
            Some(tcp) => crate::forward::splice(&stream, tcp),
            None => send_exit(
                &out,
                &Exit::UnknownProcess {
                    process: format!("connection {connection}"),
                },
            ),
        },
        Request::Kill {
            process, signal, ..
        } => send_exit(&out, &detached::kill(&process, signal)),
        Request::Connect { port, .. } => match crate::forward::connect(port) {
            Ok((tcp, _slot)) => {
                // Connected: say so (an empty connection frame), then carry the bytes.
                let mut writer = out.lock().unwrap_or_else(|p| p.into_inner());
                if write_frame(&mut *writer, crate::TAG_CONNECTION, &[]).is_err() {
                    return Ok(());
                }
                drop(writer);
                crate::forward::splice_tcp(&stream, tcp)
            }
            Err(exit) => send_exit(&out, &exit),
        },
        Request::Pty {
            argv,
            cwd,
            env,
            cols,
            rows,
            ..
        } => {
            let helper = match std::env::current_exe() {
                Ok(helper) => helper,
                Err(err) => {
                    return send_exit(
                        &out,
                        &Exit::SpawnFailed {
                            kind: "other".into(),
                            message: format!("cannot find the supervisor's own binary: {err}"),
                        },
                    )
                }
            };
            let session = crate::pty::Session {
                helper: &helper,
                argv: &argv,
                cwd: &cwd,
                env: &env,
                cols,
                rows,
            };
            let exit = crate::pty::serve(&stream, &out, &session);
            let sent = send_exit(&out, &exit);
            let _ = stream.shutdown(Shutdown::Both);
            sent
        }
        Request::Exec {
            argv,
            cwd,
            env,
            timeout_ms,
            grace_ms,
            ..
        } => {
            let exit = exec(&stream, &out, &argv, &cwd, &env, timeout_ms, grace_ms);
            let sent = send_exit(&out, &exit);
            let _ = stream.shutdown(Shutdown::Both);
            // After the answer: the next exec's reaper starts while its client reads this one.
            self::exec::prepare_next();
            sent
        }
    }
}
