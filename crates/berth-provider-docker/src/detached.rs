//! Detached processes: started through the supervisor, their output kept in the sandbox.

use super::container::*;
use super::*;
use berth_contract::{OutputChunk, OutputOffsets, Stream, MAX_OUTPUT_CHUNK};
use berth_supervisor::process_handle_ok;

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
            keep: None,
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

    async fn output(
        &self,
        id: &NativeId,
        process: &ProcessHandle,
        from: OutputOffsets,
        max: usize,
    ) -> Result<OutputChunk> {
        if !process_handle_ok(&process.0) {
            return Err(err(
                ErrorKind::InvalidRequest,
                format!("`{}` is not a process handle", process.0.escape_debug()),
            ));
        }
        let max = max.min(MAX_OUTPUT_CHUNK);
        let request = Request::Output {
            v: PROTOCOL_VERSION,
            process: process.0.clone(),
            log_dir: PROCESS_LOGS.into(),
            stdout_from: from.stdout,
            stderr_from: from.stderr,
            max: max as u64,
        };
        let channel = match self.channel(&id.0).await {
            Ok(channel) => channel,
            // Not running (stopped, paused): its files are still there to read.
            Err(e) if e.kind() == ErrorKind::Conflict => {
                return self.output_through_archive(id, process, from, max).await
            }
            Err(e) => return Err(e),
        };
        let mut chunk = OutputChunk::default();
        let answered = tokio::time::timeout(
            OUTPUT_DEADLINE,
            supervise::exec(&channel.0, &channel.1, &request, |stream, bytes| {
                // The supervisor sends at most `max` of each; more is not kept.
                let kept = match stream {
                    Stream::Stdout => &mut chunk.stdout,
                    Stream::Stderr => &mut chunk.stderr,
                };
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }),
        )
        .await;
        match answered {
            Ok(Ok(supervise::Outcome::Exit(Exit::Output {
                stdout_size,
                stderr_size,
                stdout_dropped,
                stderr_dropped,
            }))) => Ok(OutputChunk {
                stdout_size,
                stderr_size,
                stdout_dropped,
                stderr_dropped,
                ..chunk
            }),
            Ok(Ok(supervise::Outcome::Exit(Exit::UnknownProcess { process }))) => {
                Err(unknown_process(id, &process))
            }
            // A supervisor from before `output` (a sandbox an older Berth made).
            Ok(Ok(supervise::Outcome::Exit(Exit::BadRequest { message })))
                if message.starts_with("malformed request") =>
            {
                self.output_through_archive(id, process, from, max).await
            }
            // What the sandbox put where its output was (a symlink, a FIFO), said as such.
            Ok(Ok(supervise::Outcome::Exit(Exit::Unknown { reason }))) => {
                Err(err(ErrorKind::Unknown, reason))
            }
            Ok(Ok(supervise::Outcome::Exit(other))) => Err(err(
                ErrorKind::Unknown,
                format!("supervisor answered output with {other:?}"),
            )),
            Ok(Ok(supervise::Outcome::Lost(reason))) => Err(err(ErrorKind::Unavailable, reason)),
            Ok(Err(connect)) => match self.unreachable_supervisor(id, connect).await {
                // Stopped or paused meanwhile: its files are still there to read.
                e if e.kind() == ErrorKind::Conflict => {
                    self.output_through_archive(id, process, from, max).await
                }
                e => Err(e),
            },
            Err(_) => Err(err(
                ErrorKind::Unavailable,
                format!(
                    "the supervisor in `{}` did not send the output within {OUTPUT_DEADLINE:?}",
                    id.0
                ),
            )),
        }
    }
}

/// How long reading one piece of a detached process's output may take.
const OUTPUT_DEADLINE: Duration = Duration::from_secs(60);

impl DockerProvider {
    /// A detached process's output read whole through the engine's archive API (at most
    /// [`berth_contract::MAX_FILE_READ_BYTES`] of each stream) and cut to the piece asked for:
    /// for a sandbox whose supervisor is not running, or is from before `output`.
    async fn output_through_archive(
        &self,
        id: &NativeId,
        process: &ProcessHandle,
        from: OutputOffsets,
        max: usize,
    ) -> Result<OutputChunk> {
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
        let piece = |bytes: &[u8], from: u64| {
            let start = (from.min(bytes.len() as u64)) as usize;
            bytes[start..bytes.len().min(start.saturating_add(max))].to_vec()
        };
        Ok(OutputChunk {
            stdout: piece(&stdout, from.stdout),
            stderr: piece(&stderr, from.stderr),
            stdout_size: stdout.len() as u64,
            stderr_size: stderr.len() as u64,
            // What the supervisor dropped it counted in memory: it is not running.
            stdout_dropped: None,
            stderr_dropped: None,
        })
    }
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
