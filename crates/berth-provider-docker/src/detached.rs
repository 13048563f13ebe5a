//! Detached processes: started through the supervisor, their output kept in the sandbox.

use super::container::*;
use super::*;

/// Where detached processes' output files go, inside the container's own filesystem (readable
/// with the files API; the engine's archive API does not see tmpfs mounts).
pub const PROCESS_LOGS: &str = "/var/tmp/berth-procs";

#[async_trait]
impl DetachedExec for DockerProvider {
    async fn spawn(&self, id: &NativeId, req: &ExecRequest) -> Result<ProcessHandle> {
        if req.timeout.is_some() {
            return Err(err(
                ErrorKind::InvalidRequest,
                "a detached process takes no timeout; kill it when it is done",
            ));
        }
        let (argv, cwd, env) = prepare(req)?;
        let request = Request::Spawn {
            v: PROTOCOL_VERSION,
            argv,
            cwd,
            env,
            log_dir: PROCESS_LOGS.into(),
        };
        match self.call(id, &request).await? {
            Exit::Started { process } => Ok(ProcessHandle(process)),
            Exit::SpawnFailed { kind, message } => Err(spawn_error(&kind, message)),
            other => Err(err(
                ErrorKind::Unknown,
                format!("supervisor answered spawn with {other:?}"),
            )),
        }
    }

    async fn status(&self, id: &NativeId, process: &ProcessHandle) -> Result<ProcessStatus> {
        let request = Request::Status {
            v: PROTOCOL_VERSION,
            process: process.0.clone(),
        };
        match self.call(id, &request).await? {
            Exit::Running => Ok(ProcessStatus::Running),
            Exit::Exited { code } => Ok(ProcessStatus::Finished {
                status: ExitStatus::Exited { code },
            }),
            Exit::Signalled { signal } => Ok(ProcessStatus::Finished {
                status: ExitStatus::Signalled { signal },
            }),
            Exit::UnknownProcess { process } => Err(unknown_process(id, &process)),
            other => Ok(ProcessStatus::Finished {
                status: ExitStatus::Unknown {
                    reason: format!("supervisor reported {other:?}"),
                },
            }),
        }
    }

    async fn kill(&self, id: &NativeId, process: &ProcessHandle) -> Result<()> {
        let request = Request::Kill {
            v: PROTOCOL_VERSION,
            process: process.0.clone(),
            signal: 9,
        };
        match self.call(id, &request).await? {
            Exit::Exited { code: 0 } => Ok(()),
            Exit::UnknownProcess { process } => Err(unknown_process(id, &process)),
            other => Err(err(
                ErrorKind::Unknown,
                format!("supervisor answered kill with {other:?}"),
            )),
        }
    }

    async fn list(&self, id: &NativeId) -> Result<Vec<ProcessHandle>> {
        let entries = match Files::list(self, id, PROCESS_LOGS).await {
            Ok(entries) => entries,
            // Nothing was ever spawned here.
            Err(e) if e.kind() == ErrorKind::NotFound && self.inspect(&id.0).await?.is_some() => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e),
        };
        Ok(entries
            .into_iter()
            .filter(|e| e.kind == FileKind::File)
            .filter_map(|e| e.name.strip_suffix(".out").map(str::to_owned))
            .filter(|h| process_handle_ok(h))
            .map(ProcessHandle)
            .collect())
    }

    async fn output(&self, id: &NativeId, process: &ProcessHandle) -> Result<(Vec<u8>, Vec<u8>)> {
        if !process_handle_ok(&process.0) {
            return Err(err(
                ErrorKind::InvalidRequest,
                format!("`{}` is not a process handle", process.0.escape_debug()),
            ));
        }
        let read = |stream: &'static str| async move {
            let path = format!("{PROCESS_LOGS}/{}.{stream}", process.0);
            match Files::read(self, id, &path).await {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            }
        };
        let Some(stdout) = read("out").await? else {
            return Err(unknown_process(id, &process.0));
        };
        let stderr = read("err").await?.unwrap_or_default();
        Ok((stdout, stderr))
    }
}

/// Handles are the supervisor's own (`p1`, `p2`, …); anything else never reaches a path.
pub(crate) fn process_handle_ok(handle: &str) -> bool {
    !handle.is_empty()
        && handle.len() <= 32
        && handle
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

pub(crate) fn unknown_process(id: &NativeId, process: &str) -> ProviderError {
    err(
        ErrorKind::NotFound,
        format!(
            "no process `{process}` in sandbox `{}` (handles do not survive a stop/start)",
            id.0
        ),
    )
}
