//! Talking to the in-container supervisor over its Unix socket (async side of the protocol
//! defined in `berth-supervisor`).

use std::io;
use std::path::Path;

use berth_contract::Stream;
use berth_supervisor::{
    Exit, Request, PROTOCOL_VERSION, TAG_ACCEPTED, TAG_EXIT, TAG_STDERR, TAG_STDOUT,
};

/// How long the supervisor may take to acknowledge a request. A frozen (paused) container
/// accepts connections but never answers; the client then hangs up, and the supervisor drops
/// the request instead of running it later behind the caller's back.
pub(crate) const ACCEPT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// How a supervised exec ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The supervisor reported the end.
    Exit(Exit),
    /// The connection ended without an exit frame (container stopped, supervisor killed).
    Lost(String),
}

/// A process, as the host sees it: pid and start time (so a reused pid is a different peer).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Peer {
    pub pid: u32,
    pub start: String,
}

impl Peer {
    /// The process `pid` now (`None`: gone or unreadable).
    pub fn of(pid: u32) -> Option<Peer> {
        let (start, _) = stat_fields(pid)?;
        Some(Peer { pid, start })
    }

    /// Its parent's pid.
    pub fn parent(&self) -> Option<u32> {
        stat_fields(self.pid).map(|(_, ppid)| ppid)
    }
}

/// Start time (field 22) and parent pid (field 4) from `/proc/PID/stat`.
fn stat_fields(pid: u32) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis start at 3.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((rest.get(19)?.to_string(), rest.get(1)?.parse().ok()?))
}

/// Who serves a socket: the supervisor pinned at the sandbox's start, or (while it starts)
/// any child of the container's init.
#[derive(Debug, Clone)]
pub(crate) enum Expect {
    Pinned(Peer),
    ChildOf(u32),
}

/// Connects to the supervisor's socket and proves who listens before anything is sent: the
/// socket directory is writable from inside the sandbox, so the path may have been replaced
/// (a symlink to another sandbox's socket or a host listener, or a listener of the sandbox's
/// own). The peer's credentials (`SO_PEERCRED`) must be the expected process.
pub(crate) async fn connect(socket: &Path, expect: &Expect) -> io::Result<(UnixStream, Peer)> {
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::symlink_metadata(socket)?.file_type();
    if !kind.is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the supervisor's socket path is not a socket (replaced from inside the sandbox?)",
        ));
    }
    let stream = UnixStream::connect(socket).await?;
    let refused = |why: String| io::Error::new(io::ErrorKind::PermissionDenied, why);
    let pid = stream
        .peer_cred()?
        .pid()
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            refused("the socket's listener is not visible from this pid namespace".into())
        })?;
    let peer = Peer::of(pid as u32)
        .ok_or_else(|| refused(format!("the socket's listener (pid {pid}) vanished")))?;
    let trusted = match expect {
        Expect::Pinned(pinned) => &peer == pinned,
        Expect::ChildOf(init) => peer.parent() == Some(*init),
    };
    if !trusted {
        return Err(refused(format!(
            "the socket is served by pid {pid}, not by this sandbox's supervisor (the socket was \
             replaced from inside the sandbox); nothing was sent"
        )));
    }
    Ok((stream, peer))
}

async fn send(socket: &Path, expect: &Expect, request: &Request) -> io::Result<UnixStream> {
    let (mut stream, _) = connect(socket, expect).await?;
    let mut line = serde_json::to_vec(request).expect("request serializes");
    line.push(b'\n');
    stream.write_all(&line).await?;
    Ok(stream)
}

async fn read_frame(stream: &mut UnixStream) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut header = [0u8; berth_supervisor::FRAME_HEADER];
    match stream.read_exact(&mut header).await {
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(err) => return Err(err),
    }
    let (tag, len) = berth_supervisor::parse_frame_header(&header)?;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await?;
    Ok(Some((tag, payload)))
}

/// Whether the supervisor answers; returns who answered.
pub(crate) async fn ping(socket: &Path, expect: &Expect) -> io::Result<Peer> {
    let (mut stream, peer) = connect(socket, expect).await?;
    let mut line = serde_json::to_vec(&Request::Ping {
        v: PROTOCOL_VERSION,
    })
    .expect("request serializes");
    line.push(b'\n');
    stream.write_all(&line).await?;
    match read_frame(&mut stream).await? {
        Some((TAG_EXIT, _)) => Ok(peer),
        _ => Err(io::Error::other("supervisor did not answer the ping")),
    }
}

/// Runs one exec, handing every output chunk to `on_chunk`. Connection failures before the
/// request is sent are errors; a connection lost afterwards is [`Outcome::Lost`], never a
/// made-up exit status.
pub(crate) async fn exec(
    socket: &Path,
    expect: &Expect,
    request: &Request,
    mut on_chunk: impl FnMut(Stream, &[u8]),
) -> io::Result<Outcome> {
    let mut stream = send(socket, expect, request).await?;
    match tokio::time::timeout(ACCEPT_DEADLINE, read_frame(&mut stream)).await {
        Ok(Ok(Some((TAG_ACCEPTED, _)))) => {}
        // Refused before running (bad request, protocol version).
        Ok(Ok(Some((TAG_EXIT, payload)))) => {
            return Ok(match serde_json::from_slice(&payload) {
                Ok(exit) => Outcome::Exit(exit),
                Err(err) => Outcome::Lost(format!("unreadable exit frame: {err}")),
            })
        }
        Ok(Ok(Some((tag, _)))) => {
            return Ok(Outcome::Lost(format!(
                "the supervisor answered with frame {tag} before accepting the request"
            )))
        }
        // Nothing ran: the request was never accepted.
        Ok(Ok(None)) => {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the supervisor closed the connection before accepting the request",
            ))
        }
        Ok(Err(err)) => return Err(err),
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the supervisor did not accept the request within {ACCEPT_DEADLINE:?}"),
            ))
        }
    }
    loop {
        match read_frame(&mut stream).await {
            Ok(Some((TAG_STDOUT, bytes))) => on_chunk(Stream::Stdout, &bytes),
            Ok(Some((TAG_STDERR, bytes))) => on_chunk(Stream::Stderr, &bytes),
            Ok(Some((TAG_EXIT, payload))) => {
                return Ok(match serde_json::from_slice(&payload) {
                    Ok(exit) => Outcome::Exit(exit),
                    Err(err) => Outcome::Lost(format!("unreadable exit frame: {err}")),
                })
            }
            Ok(Some((tag, _))) => return Ok(Outcome::Lost(format!("unknown frame tag {tag}"))),
            Ok(None) => {
                return Ok(Outcome::Lost(
                    "supervisor connection closed before the command's exit was reported".into(),
                ))
            }
            Err(err) => {
                return Ok(Outcome::Lost(format!(
                    "supervisor connection failed: {err}"
                )))
            }
        }
    }
}

/// For benchmarks: one exec over the socket with none of Berth's checks (no `lstat`, no peer
/// credentials, no ping) — the same request and frames, the bare mechanism.
pub(crate) async fn bare_exec(socket: &Path, request: &Request) -> io::Result<Outcome> {
    let mut stream = UnixStream::connect(socket).await?;
    let mut line = serde_json::to_vec(request).expect("request serializes");
    line.push(b'\n');
    stream.write_all(&line).await?;
    loop {
        match read_frame(&mut stream).await? {
            Some((TAG_EXIT, payload)) => {
                return Ok(match serde_json::from_slice(&payload) {
                    Ok(exit) => Outcome::Exit(exit),
                    Err(err) => Outcome::Lost(format!("unreadable exit frame: {err}")),
                })
            }
            Some(_) => {}
            None => return Ok(Outcome::Lost("connection closed".into())),
        }
    }
}

/// Sends a request answered by a single exit frame (spawn, status, kill).
pub(crate) async fn call(socket: &Path, expect: &Expect, request: &Request) -> io::Result<Outcome> {
    exec(socket, expect, request, |_, _| {}).await
}

/// Sends `request` and waits for it to be accepted: the stream, or the supervisor's refusal.
async fn accepted(
    socket: &Path,
    expect: &Expect,
    request: &Request,
) -> io::Result<Result<UnixStream, Exit>> {
    let mut stream = send(socket, expect, request).await?;
    match tokio::time::timeout(ACCEPT_DEADLINE, read_frame(&mut stream)).await {
        Ok(Ok(Some((TAG_ACCEPTED, _)))) => Ok(Ok(stream)),
        Ok(Ok(Some((TAG_EXIT, payload)))) => match serde_json::from_slice(&payload) {
            Ok(exit) => Ok(Err(exit)),
            Err(err) => Err(io::Error::other(format!("unreadable exit frame: {err}"))),
        },
        Ok(Ok(Some((tag, _)))) => Err(io::Error::other(format!(
            "the supervisor answered with frame {tag} before accepting the request"
        ))),
        Ok(Ok(None)) => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the supervisor closed the connection before accepting the request",
        )),
        Ok(Err(err)) => Err(err),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the supervisor did not accept the request within {ACCEPT_DEADLINE:?}"),
        )),
    }
}

/// Starts listening on the sandbox's loopback `port`; the control stream announces
/// connections (see [`next_connection`]) for as long as it stays open.
pub(crate) async fn listen(
    socket: &Path,
    expect: &Expect,
    port: u16,
) -> io::Result<Result<UnixStream, Exit>> {
    let request = Request::Listen {
        v: PROTOCOL_VERSION,
        port,
    };
    let mut control = match accepted(socket, expect, &request).await? {
        Ok(control) => control,
        Err(exit) => return Ok(Err(exit)),
    };
    // The port is open once an empty announcement arrives; a refusal comes as an exit frame.
    match tokio::time::timeout(ACCEPT_DEADLINE, read_frame(&mut control)).await {
        Ok(Ok(Some((berth_supervisor::TAG_CONNECTION, payload)))) if payload.is_empty() => {
            Ok(Ok(control))
        }
        Ok(Ok(Some((TAG_EXIT, payload)))) => serde_json::from_slice(&payload)
            .map(Err)
            .map_err(|e| io::Error::other(format!("unreadable exit frame: {e}"))),
        Ok(Ok(Some((tag, _)))) => Err(io::Error::other(format!(
            "the supervisor answered a listen with frame {tag}"
        ))),
        Ok(Ok(None)) => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the supervisor closed the connection before listening",
        )),
        Ok(Err(err)) => Err(err),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the supervisor did not open the port within {ACCEPT_DEADLINE:?}"),
        )),
    }
}

/// Starts a terminal session (a [`Request::Pty`]): the accepted stream carries its frames.
pub(crate) async fn pty(
    socket: &Path,
    expect: &Expect,
    request: &Request,
) -> io::Result<Result<UnixStream, Exit>> {
    accepted(socket, expect, request).await
}

/// Connects to the sandbox's loopback `port`: the stream carries that connection's bytes once
/// the supervisor says it is connected; a refusal comes as its exit frame.
pub(crate) async fn connect_port(
    socket: &Path,
    expect: &Expect,
    port: u16,
) -> io::Result<Result<UnixStream, Exit>> {
    let request = Request::Connect {
        v: PROTOCOL_VERSION,
        port,
    };
    let mut stream = match accepted(socket, expect, &request).await? {
        Ok(stream) => stream,
        Err(exit) => return Ok(Err(exit)),
    };
    match tokio::time::timeout(ACCEPT_DEADLINE, read_frame(&mut stream)).await {
        Ok(Ok(Some((berth_supervisor::TAG_CONNECTION, payload)))) if payload.is_empty() => {
            Ok(Ok(stream))
        }
        Ok(Ok(Some((TAG_EXIT, payload)))) => serde_json::from_slice(&payload)
            .map(Err)
            .map_err(|e| io::Error::other(format!("unreadable exit frame: {e}"))),
        Ok(Ok(Some((tag, _)))) => Err(io::Error::other(format!(
            "the supervisor answered a connect with frame {tag}"
        ))),
        Ok(Ok(None)) => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the supervisor closed the connection before connecting",
        )),
        Ok(Err(err)) => Err(err),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the supervisor did not connect within {ACCEPT_DEADLINE:?}"),
        )),
    }
}

/// The next connection announced on a `listen` control stream; `None` when it ended.
pub(crate) async fn next_connection(control: &mut UnixStream) -> io::Result<Option<u64>> {
    loop {
        match read_frame(control).await? {
            Some((berth_supervisor::TAG_CONNECTION, payload)) => {
                let id = std::str::from_utf8(&payload)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| io::Error::other("unreadable connection frame"))?;
                return Ok(Some(id));
            }
            Some((TAG_EXIT, _)) | None => return Ok(None),
            Some(_) => {}
        }
    }
}

/// Claims announced connection `id`: after this, the stream carries its bytes both ways.
pub(crate) async fn attach(
    socket: &Path,
    expect: &Expect,
    id: u64,
) -> io::Result<Result<UnixStream, Exit>> {
    let request = Request::Attach {
        v: PROTOCOL_VERSION,
        connection: id,
    };
    accepted(socket, expect, &request).await
}
