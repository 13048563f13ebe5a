//! Interactive access through the supervisor: a terminal session (`berth ssh`) and
//! connections to the container's own loopback ports (`berth port`) — both over the
//! supervisor's socket, so they work with network `none`.

use std::os::unix::net::UnixStream;

use async_trait::async_trait;
use berth_contract::{Access, ErrorKind, ExecRequest, NativeId, PtyRequest, Result};
use berth_supervisor::{Exit, Request, PROTOCOL_VERSION};

use crate::container::prepare;
use crate::supervise;
use crate::{err, io_err, DockerProvider};

fn refused(what: &str, exit: Exit) -> berth_contract::ProviderError {
    match exit {
        Exit::SpawnFailed { kind, message } if kind == "refused" => {
            err(ErrorKind::Unavailable, message)
        }
        Exit::SpawnFailed { kind, message } if kind == "limit" => err(ErrorKind::Capacity, message),
        Exit::SpawnFailed { kind, message } => {
            crate::container::spawn_error(&kind, format!("{what}: {message}"))
        }
        Exit::BadRequest { message } => err(ErrorKind::InvalidRequest, message),
        other => err(
            ErrorKind::Unknown,
            format!("the supervisor refused {what}: {other:?}"),
        ),
    }
}

fn into_std(stream: tokio::net::UnixStream, what: &str) -> Result<UnixStream> {
    stream
        .into_std()
        .and_then(|s| s.set_nonblocking(false).map(|()| s))
        .map_err(|e| io_err(what, e))
}

impl DockerProvider {
    async fn answered(
        &self,
        id: &NativeId,
        answer: std::io::Result<std::result::Result<tokio::net::UnixStream, Exit>>,
        what: &str,
    ) -> Result<UnixStream> {
        match answer {
            Ok(Ok(stream)) => into_std(stream, what),
            Ok(Err(exit)) => Err(refused(what, exit)),
            Err(connect) => Err(self.unreachable_supervisor(id, connect).await),
        }
    }
}

#[async_trait]
impl Access for DockerProvider {
    async fn open_pty(&self, id: &NativeId, req: &PtyRequest) -> Result<UnixStream> {
        let mut exec = ExecRequest::argv(req.argv.clone());
        exec.env = req.env.clone();
        let (argv, cwd, env) = prepare(&exec)?;
        let request = Request::Pty {
            v: PROTOCOL_VERSION,
            argv,
            cwd,
            env,
            cols: req.cols,
            rows: req.rows,
        };
        let (socket, expect) = self.channel(&id.0).await?;
        let answer = supervise::pty(&socket, &expect, &request).await;
        self.answered(id, answer, "a terminal").await
    }

    async fn connect_port(&self, id: &NativeId, port: u16) -> Result<UnixStream> {
        if port == 0 {
            return Err(err(
                ErrorKind::InvalidRequest,
                "connect to a port other than 0",
            ));
        }
        let (socket, expect) = self.channel(&id.0).await?;
        let answer = supervise::connect_port(&socket, &expect, port).await;
        self.answered(id, answer, &format!("a connection to port {port}"))
            .await
    }
}
