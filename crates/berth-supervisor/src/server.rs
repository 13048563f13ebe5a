//! The supervisor's server: one thread per connection, one request per connection.

mod exec;

use std::io::{self, BufRead, BufReader, Read};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use exec::{exec, spawn_failure};

use crate::{write_frame, Exit, Request, PROTOCOL_VERSION, TAG_ACCEPTED, TAG_EXIT};

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
    for connection in listener.incoming() {
        match connection {
            Ok(stream) => {
                std::thread::spawn(move || {
                    if let Err(err) = handle(stream) {
                        eprintln!("berth-supervisor: connection failed: {err}");
                    }
                });
            }
            Err(err) => eprintln!("berth-supervisor: accept failed: {err}"),
        }
    }
    Ok(())
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
            ..
        } => send_exit(&out, &detached::spawn(&argv, &cwd, &env, &log_dir)),
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
            sent
        }
    }
}

/// Detached processes: started in their own process group, reaped by a waiter thread that
/// records how they ended. Handles live as long as this supervisor process.
mod detached {
    use std::collections::{BTreeMap, HashMap};
    use std::process::{Command, Stdio};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, OnceLock};

    use nix::sys::signal::{killpg, Signal};
    use nix::unistd::Pid;

    use std::fs::File;
    use std::io;
    use std::os::unix::fs::FileExt;
    use std::os::unix::net::UnixStream;

    use super::{spawn_failure, status_to_exit};
    use crate::{write_frame, Exit, TAG_STDERR, TAG_STDOUT};

    struct Process {
        pgid: Pid,
        ended: Option<Exit>,
    }

    fn table() -> &'static Mutex<HashMap<String, Process>> {
        static TABLE: OnceLock<Mutex<HashMap<String, Process>>> = OnceLock::new();
        TABLE.get_or_init(Default::default)
    }

    static NEXT: AtomicU64 = AtomicU64::new(1);

    pub(super) fn spawn(
        argv: &[String],
        cwd: &str,
        env: &BTreeMap<String, String>,
        log_dir: &str,
    ) -> Exit {
        use std::os::unix::process::CommandExt;
        let Some((program, args)) = argv.split_first() else {
            return Exit::BadRequest {
                message: "empty argv".into(),
            };
        };
        let handle = format!("p{}", NEXT.fetch_add(1, Ordering::SeqCst));
        let open = |suffix: &str| {
            std::fs::create_dir_all(log_dir)?;
            std::fs::File::create(format!("{log_dir}/{handle}.{suffix}"))
        };
        let (stdout, stderr) = match (open("out"), open("err")) {
            (Ok(out), Ok(err)) => (out, err),
            (Err(e), _) | (_, Err(e)) => {
                return Exit::SpawnFailed {
                    kind: "other".into(),
                    message: format!("cannot create output files in `{log_dir}`: {e}"),
                }
            }
        };
        let spawned = Command::new(program)
            .args(args)
            .env_clear()
            .envs(env)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .process_group(0)
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(err) => return spawn_failure(program, cwd, &err),
        };
        let pgid = Pid::from_raw(child.id() as i32);
        table()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle.clone(), Process { pgid, ended: None });
        let waiter_handle = handle.clone();
        std::thread::spawn(move || {
            let ended = status_to_exit(child.wait(), false);
            if let Some(process) = table()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(&waiter_handle)
            {
                process.ended = Some(ended);
            }
        });
        Exit::Started { process: handle }
    }

    /// The most of one stream one `Output` reply carries, whatever is asked.
    const MAX_OUTPUT: u64 = 4 << 20;

    /// Sends `max` bytes (at most) of each of the process's streams from its offset, as frames;
    /// says each stream's size. The files are the sandbox's to change: a handle is a plain name,
    /// nothing is opened through a symlink or as anything but a regular file, and every read
    /// is bounded.
    pub(super) fn output(
        out: &Mutex<UnixStream>,
        handle: &str,
        log_dir: &str,
        from: [u64; 2],
        max: u64,
    ) -> Exit {
        if !crate::process_handle_ok(handle) {
            return Exit::BadRequest {
                message: format!("`{}` is not a process handle", handle.escape_debug()),
            };
        }
        let max = max.min(MAX_OUTPUT);
        let mut sizes = [0u64; 2];
        for (n, (suffix, tag)) in [("out", TAG_STDOUT), ("err", TAG_STDERR)]
            .into_iter()
            .enumerate()
        {
            let path = format!("{log_dir}/{handle}.{suffix}");
            let file = match open_regular(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound && suffix == "out" => {
                    return Exit::UnknownProcess {
                        process: handle.to_owned(),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Exit::Unknown {
                        reason: format!("cannot read `{path}`: {e}"),
                    }
                }
            };
            match send_from(out, &file, tag, from[n], max) {
                Ok(size) => sizes[n] = size,
                Err(e) => {
                    return Exit::Unknown {
                        reason: format!("cannot send `{path}`: {e}"),
                    }
                }
            }
        }
        Exit::Output {
            stdout_size: sizes[0],
            stderr_size: sizes[1],
        }
    }

    /// Opens `path` for reading only if its last component is a regular file and no symlink
    /// (a FIFO is refused without waiting for a writer).
    fn open_regular(path: &str) -> io::Result<File> {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let file = File::from(rustix::fs::open(path, flags, Mode::empty())?);
        if !file.metadata()?.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        Ok(file)
    }

    /// Sends the file's bytes from `from` (at most `max`) in frames; returns its size.
    fn send_from(
        out: &Mutex<UnixStream>,
        file: &File,
        tag: u8,
        from: u64,
        max: u64,
    ) -> io::Result<u64> {
        let size = file.metadata()?.len();
        let mut at = from;
        let end = size.min(from.saturating_add(max));
        let mut buf = vec![0u8; (crate::MAX_FRAME as u64).min(max) as usize];
        while at < end {
            let want = ((end - at) as usize).min(buf.len());
            let n = file.read_at(&mut buf[..want], at)?;
            if n == 0 {
                break;
            }
            let mut writer = out.lock().unwrap_or_else(|p| p.into_inner());
            write_frame(&mut *writer, tag, &buf[..n])?;
            at += n as u64;
        }
        Ok(size)
    }

    pub(super) fn status(handle: &str) -> Exit {
        match table()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(handle)
        {
            None => Exit::UnknownProcess {
                process: handle.to_owned(),
            },
            Some(Process { ended: None, .. }) => Exit::Running,
            Some(Process {
                ended: Some(exit), ..
            }) => exit.clone(),
        }
    }

    pub(super) fn kill(handle: &str, signal: i32) -> Exit {
        let table = table().lock().unwrap_or_else(|p| p.into_inner());
        let Some(process) = table.get(handle) else {
            return Exit::UnknownProcess {
                process: handle.to_owned(),
            };
        };
        if process.ended.is_some() {
            // Idempotent: the process already ended.
            return Exit::Exited { code: 0 };
        }
        let Ok(signal) = Signal::try_from(signal) else {
            return Exit::BadRequest {
                message: format!("{signal} is not a signal"),
            };
        };
        let _ = killpg(process.pgid, signal);
        Exit::Exited { code: 0 }
    }
}

fn status_to_exit(status: io::Result<std::process::ExitStatus>, timed_out: bool) -> Exit {
    match status {
        _ if timed_out => Exit::TimedOut,
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Exited { code },
            (None, Some(signal)) => Exit::Signalled { signal },
            (None, None) => Exit::SpawnFailed {
                kind: "other".into(),
                message: format!("wait returned {status:?}"),
            },
        },
        Err(err) => Exit::SpawnFailed {
            kind: "other".into(),
            message: format!("wait failed: {err}"),
        },
    }
}
