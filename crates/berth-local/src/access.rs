//! Interactive access for local launchers: a terminal session served in-process by the
//! supervisor's terminal code around the launcher's own command line (directly on the host, or
//! bwrap's), and connections to loopback ports where the sandbox's loopback is this machine's.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::Path;

use async_trait::async_trait;
use berth_contract::{Access, ErrorKind, NativeId, ProviderError, PtyRequest, Result};

use crate::classify::io_error;
use crate::process::{DEFAULT_PATH, MARKER};
use crate::provider::{LaunchContext, Launcher, LocalProvider};
use crate::PROVIDER_ID;

impl<L: Launcher> LocalProvider<L> {
    async fn open_pty_inner(&self, id: &NativeId, req: &PtyRequest) -> Result<UnixStream> {
        if req.argv.is_empty() {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                PROVIDER_ID,
                "empty argv: nothing to run",
            ));
        }
        berth_contract::check_argv(&req.argv)
            .and_then(|()| berth_contract::check_env(&req.env))
            .map_err(|m| ProviderError::new(ErrorKind::InvalidRequest, PROVIDER_ID, m))?;
        let helper = self
            .config()
            .reaper
            .clone()
            .or_else(|| self.launcher().terminal_helper().map(Path::to_path_buf))
            .ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::Setup,
                    PROVIDER_ID,
                    "a terminal needs Berth's helper binary (the reaper), and none is configured",
                )
            })?;
        // A terminal session is never proven contained (its helper kills the session, not a
        // subtree): the mark stays, and destroy searches the process table.
        let mark = self.command_started(id);
        let (name, workspace, network) = self.ready_named(id)?;
        drop(mark?);
        let home = self.home_in_sandbox(&workspace);
        let mut env = BTreeMap::from([
            ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
            ("HOME".to_owned(), home.clone()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ]);
        env.extend(req.env.clone());
        // Destroy finds every process of the sandbox by this marker.
        env.insert(MARKER.to_owned(), name.clone());
        // The launcher's own command line (bwrap and its arguments, or the command itself),
        // started on the terminal by the helper.
        let command =
            berth_contract::Command::Argv(self.launcher().terminal_argv(req.argv.clone()));
        let launched = self.launcher().command(&LaunchContext {
            sandbox: &name,
            workspace: &workspace,
            cwd_in_sandbox: &home,
            command: &command,
            network,
            terminal: true,
        })?;
        let launched = launched.as_std();
        let argv: Vec<String> = std::iter::once(launched.get_program())
            .chain(launched.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        berth_supervisor::pty::serve_local(
            &helper,
            argv,
            workspace.to_string_lossy().into_owned(),
            env,
            req.cols,
            req.rows,
        )
        .map_err(|e| io_error("open a terminal", e))
    }

    async fn connect_port_inner(&self, id: &NativeId, port: u16) -> Result<UnixStream> {
        if port == 0 {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                PROVIDER_ID,
                "connect to a port other than 0",
            ));
        }
        let (_, _, network) = self.ready_named(id)?;
        if !self.launcher().shares_host_loopback(network) {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                PROVIDER_ID,
                format!(
                    "nothing listens on 127.0.0.1:{port} in this sandbox: without network \
                     `host`, every command runs in a network namespace of its own that ends with \
                     it, so no port can be waiting for a connection"
                ),
            ));
        }
        let tcp = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(tcp) => tcp,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(ProviderError::new(
                    ErrorKind::Unavailable,
                    PROVIDER_ID,
                    format!("nothing listens on 127.0.0.1:{port}"),
                ))
            }
            Err(e) => return Err(io_error("connect to the port", e)),
        };
        let tcp = tcp
            .into_std()
            .and_then(|t| t.set_nonblocking(false).map(|()| t))
            .map_err(|e| io_error("connect to the port", e))?;
        let _ = tcp.set_nodelay(true);
        let (caller, ours) = UnixStream::pair().map_err(|e| io_error("connect to the port", e))?;
        std::thread::spawn(move || berth_supervisor::forward::splice_tcp(&ours, tcp));
        Ok(caller)
    }
}

#[async_trait]
impl<L: Launcher> Access for LocalProvider<L> {
    async fn open_pty(&self, id: &NativeId, req: &PtyRequest) -> Result<UnixStream> {
        self.open_pty_inner(id, req).await.map_err(|e| self.own(e))
    }

    async fn connect_port(&self, id: &NativeId, port: u16) -> Result<UnixStream> {
        self.connect_port_inner(id, port)
            .await
            .map_err(|e| self.own(e))
    }
}
