//! Loopback forwarding through the supervisor: a listener on `127.0.0.1:PORT` inside the
//! container (its own network namespace; the container keeps network `none`), each connection
//! claimed over the supervisor's socket and handed to the caller as a stream on the host.

use std::path::PathBuf;

use async_trait::async_trait;
use berth_contract::{ErrorKind, ForwardedPort, LoopbackForward, NativeId, Result};
use berth_supervisor::Exit;

use crate::supervise::{self, Expect};
use crate::{err, io_err, DockerProvider};

/// A listening forward: its control stream, and how to reach the supervisor again.
struct DockerForward {
    name: String,
    control: tokio::net::UnixStream,
    socket: PathBuf,
    expect: Expect,
}

fn refused(exit: Exit) -> berth_contract::ProviderError {
    match exit {
        Exit::SpawnFailed { kind, message } if kind == "in_use" => {
            err(ErrorKind::Conflict, message)
        }
        Exit::SpawnFailed { message, .. } | Exit::BadRequest { message } => {
            err(ErrorKind::InvalidRequest, message)
        }
        other => err(
            ErrorKind::Unknown,
            format!("the supervisor refused the forward: {other:?}"),
        ),
    }
}

#[async_trait]
impl LoopbackForward for DockerProvider {
    async fn forward_loopback(&self, id: &NativeId, port: u16) -> Result<Box<dyn ForwardedPort>> {
        if port == 0 {
            return Err(err(
                ErrorKind::InvalidRequest,
                "forward a port other than 0",
            ));
        }
        let (socket, expect) = self.channel(&id.0).await?;
        let control = match supervise::listen(&socket, &expect, port).await {
            Ok(Ok(control)) => control,
            Ok(Err(exit)) => return Err(refused(exit)),
            Err(connect) => return Err(self.unreachable_supervisor(id, connect).await),
        };
        Ok(Box::new(DockerForward {
            name: id.0.clone(),
            control,
            socket,
            expect,
        }))
    }
}

#[async_trait]
impl ForwardedPort for DockerForward {
    async fn accept(&mut self) -> Result<std::os::unix::net::UnixStream> {
        let id = supervise::next_connection(&mut self.control)
            .await
            .map_err(|e| io_err("read the forward's announcements", e))?
            .ok_or_else(|| {
                err(
                    ErrorKind::Unavailable,
                    format!(
                        "the forward into `{}` ended (the sandbox stopped or its supervisor \
                         restarted)",
                        self.name
                    ),
                )
            })?;
        let stream = match supervise::attach(&self.socket, &self.expect, id).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(exit)) => return Err(refused(exit)),
            Err(e) => return Err(io_err("claim a forwarded connection", e)),
        };
        stream
            .into_std()
            .and_then(|s| s.set_nonblocking(false).map(|()| s))
            .map_err(|e| io_err("hand over a forwarded connection", e))
    }
}
