//! Talking to the in-container supervisor over its Unix socket (async side of the protocol
//! defined in `berth-supervisor`).

use std::io;
use std::path::Path;

use berth_contract::Stream;
use berth_supervisor::{
    Exit, Request, MAX_FRAME, PROTOCOL_VERSION, TAG_EXIT, TAG_STDERR, TAG_STDOUT,
};
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

async fn send(socket: &Path, request: &Request) -> io::Result<UnixStream> {
    let mut stream = UnixStream::connect(socket).await?;
    let mut line = serde_json::to_vec(request).expect("request serializes");
    line.push(b'\n');
    stream.write_all(&line).await?;
    Ok(stream)
}

async fn read_frame(stream: &mut UnixStream) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut header = [0u8; 5];
    match stream.read_exact(&mut header).await {
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(err) => return Err(err),
    }
    let len = u32::from_be_bytes(header[1..].try_into().expect("4 bytes"));
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "oversized frame",
        ));
    }
    let mut payload = vec![0u8; len as usize];
    stream.read_exact(&mut payload).await?;
    Ok(Some((header[0], payload)))
}

/// Whether the supervisor answers.
pub(crate) async fn ping(socket: &Path) -> io::Result<()> {
    let mut stream = send(
        socket,
        &Request::Ping {
            v: PROTOCOL_VERSION,
        },
    )
    .await?;
    match read_frame(&mut stream).await? {
        Some((TAG_EXIT, _)) => Ok(()),
        _ => Err(io::Error::other("supervisor did not answer the ping")),
    }
}

/// Runs one exec, handing every output chunk to `on_chunk`. Connection failures before the
/// request is sent are errors; a connection lost afterwards is [`Outcome::Lost`], never a
/// made-up exit status.
pub(crate) async fn exec(
    socket: &Path,
    request: &Request,
    mut on_chunk: impl FnMut(Stream, &[u8]),
) -> io::Result<Outcome> {
    let mut stream = send(socket, request).await?;
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

/// Sends a request answered by a single exit frame (spawn, status, kill).
pub(crate) async fn call(socket: &Path, request: &Request) -> io::Result<Outcome> {
    exec(socket, request, |_, _| {}).await
}
