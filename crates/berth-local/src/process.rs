//! Process-group exec: one new process group per command, scrubbed environment, separate
//! stdout/stderr, a deadline that kills the whole group, and no leftovers after exit.

use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use berth_contract::{
    Command, ErrorKind, ExecOutput, ExecRequest, ExecSummary, ExitStatus, OutputSink,
    ProviderError, Result, Stream,
};
use berth_supervisor::reaper::{PipeLeft, Report};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use crate::classify::io_error;
use crate::PROVIDER_ID;

/// The environment variable that marks every process of a sandbox, so destroy can find
/// processes that left the process group.
pub(crate) const MARKER: &str = "BERTH_SANDBOX";

pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where output goes.
pub(crate) enum Sink<'a> {
    /// Keep at most this many bytes per stream.
    Capture(usize),
    /// Hand every chunk to the caller.
    Stream(&'a mut dyn OutputSink),
}

pub(crate) struct Spec<'a> {
    pub(crate) sandbox: &'a str,
    /// `HOME` for the command: the workspace as the command sees it.
    pub(crate) home: &'a str,
    /// Host-side working directory of the spawned process.
    pub(crate) cwd: &'a Path,
    pub(crate) req: &'a ExecRequest,
    pub(crate) kill_grace: Duration,
    /// Run the command under this reaper program (`PROGRAM __reap ARGV…`).
    pub(crate) reaper: Option<&'a Path>,
}

/// A finished process, before it becomes an exec result.
#[derive(Debug)]
pub struct Finished {
    /// How it ended.
    pub status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// The first bytes of stderr, kept even when output is streamed, so a launcher can tell
    /// its own start-up failure from the command's output.
    pub stderr_head: Vec<u8>,
    stdout_total: u64,
    stderr_total: u64,
    duration: Duration,
    /// Nothing the command started is left: its reaper reported the command's end, which it
    /// does only once its whole subtree is reaped.
    pub(crate) contained: bool,
}

impl Finished {
    pub(crate) fn into_output(self) -> ExecOutput {
        ExecOutput {
            status: self.status,
            stdout: self.stdout,
            stderr: Some(self.stderr),
            stdout_total: self.stdout_total,
            stderr_total: Some(self.stderr_total),
            duration: self.duration,
        }
    }

    pub(crate) fn into_summary(self) -> ExecSummary {
        ExecSummary {
            status: self.status,
            stdout_total: self.stdout_total,
            stderr_total: Some(self.stderr_total),
            duration: self.duration,
        }
    }
}

/// Kills the process group if the exec future is dropped (caller cancelled, Ctrl-C). Under a
/// reaper, dropping its control channel does it instead: the reaper then kills its whole
/// subtree (killing the reaper first would orphan what left the group).
struct GroupGuard {
    pgid: Pid,
    armed: bool,
    reaped: bool,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed && !self.reaped {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }
}

/// The caller's end of a reaper's control channel.
struct Control {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>>,
    writer: tokio::net::unix::OwnedWriteHalf,
}

impl Control {
    async fn send(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        let _ = self.writer.write_all(format!("{line}\n").as_bytes()).await;
    }

    async fn report(&mut self) -> Option<Report> {
        match self.lines.next_line().await {
            Ok(Some(line)) => Report::parse(&line),
            _ => None,
        }
    }
}

/// Wraps `cmd` so it runs under `reaper`; returns the control channel's two ends (ours, and
/// the one that becomes the reaper's stdin).
#[allow(clippy::type_complexity)]
fn under_reaper(
    cmd: tokio::process::Command,
    reaper: &Path,
) -> Result<(
    tokio::process::Command,
    (
        std::os::unix::net::UnixStream,
        std::os::unix::net::UnixStream,
    ),
)> {
    let std_cmd = cmd.as_std();
    let mut wrapped = tokio::process::Command::new(reaper);
    let mut args = std_cmd.get_args().peekable();
    // The reaper's own binary entering a bwrap sandbox (`REAPER __enter …`): the reaper makes
    // the entry itself, one program start fewer per exec.
    let entering = std_cmd.get_program() == reaper.as_os_str()
        && args.peek() == Some(&OsStr::new(berth_supervisor::enter::ENTER_ARG));
    if entering {
        args.next();
        wrapped.arg(berth_supervisor::reaper::REAP_ENTER_ARG);
    } else {
        wrapped
            .arg(berth_supervisor::reaper::REAP_ARG)
            .arg(std_cmd.get_program());
    }
    wrapped.args(args);
    let pair = std::os::unix::net::UnixStream::pair()
        .map_err(|e| io_error("create the reaper's control channel", e))?;
    Ok((wrapped, pair))
}

const STDERR_HEAD: usize = 512;

struct Collector<'a> {
    sink: Sink<'a>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stderr_head: Vec<u8>,
    stdout_total: u64,
    stderr_total: u64,
}

impl Collector<'_> {
    fn push(&mut self, stream: Stream, bytes: &[u8]) {
        if stream == Stream::Stderr && self.stderr_head.len() < STDERR_HEAD {
            let room = STDERR_HEAD - self.stderr_head.len();
            self.stderr_head
                .extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
        let (kept, total) = match stream {
            Stream::Stdout => (&mut self.stdout, &mut self.stdout_total),
            Stream::Stderr => (&mut self.stderr, &mut self.stderr_total),
        };
        *total += bytes.len() as u64;
        match &mut self.sink {
            Sink::Capture(max) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            Sink::Stream(sink) => sink.chunk(stream, bytes),
        }
    }
}

fn invalid(message: String) -> ProviderError {
    ProviderError::new(ErrorKind::InvalidRequest, PROVIDER_ID, message)
}

/// Builds the program part of a direct (host) command.
pub(crate) fn direct(command: &Command) -> Result<tokio::process::Command> {
    Ok(match command {
        Command::Argv(argv) => {
            let (program, args) = argv
                .split_first()
                .ok_or_else(|| invalid("empty argv: nothing to run".into()))?;
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args);
            cmd
        }
        Command::Shell(line) => {
            let mut cmd = tokio::process::Command::new("/bin/sh");
            cmd.arg("-c").arg(line);
            cmd
        }
    })
}

/// Scrubs the environment and wires stdio and the process group. `home` is the workspace as
/// the command sees it.
fn prepare(cmd: &mut tokio::process::Command, spec: &Spec<'_>) -> Result<()> {
    cmd.env_clear()
        .env("PATH", DEFAULT_PATH)
        .env("HOME", spec.home)
        .env("LANG", "C.UTF-8");
    cmd.envs(&spec.req.env);
    cmd.env(MARKER, spec.sandbox)
        .current_dir(spec.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    Ok(())
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Runs one command to completion.
pub(crate) async fn run(
    mut cmd: tokio::process::Command,
    spec: Spec<'_>,
    sink: Sink<'_>,
) -> Result<Finished> {
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    let mut channel = None;
    if let Some(reaper) = spec.reaper {
        let (wrapped, pair) = under_reaper(cmd, reaper)?;
        cmd = wrapped;
        channel = Some(pair);
    }
    prepare(&mut cmd, &spec)?;
    let control_end = channel.map(|(ours, theirs)| {
        // Under a reaper its stdin is the control channel; the command still gets /dev/null.
        cmd.stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)));
        ours
    });
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|err| io_error(&format!("start `{program}`"), err))?;
    drop(cmd);
    let mut control = match control_end {
        None => None,
        Some(ours) => {
            ours.set_nonblocking(true)
                .map_err(|e| io_error("use the reaper's control channel", e))?;
            let stream = tokio::net::UnixStream::from_std(ours)
                .map_err(|e| io_error("use the reaper's control channel", e))?;
            let (read, writer) = stream.into_split();
            let mut control = Control {
                lines: tokio::io::BufReader::new(read).lines(),
                writer,
            };
            match control.report().await {
                Some(Report::Started) => Some(control),
                Some(Report::Failed { kind, message }) => {
                    let _ = child.wait().await;
                    return Err(ProviderError::not_started(
                        berth_contract::StartFailure::from_wire(&kind),
                        PROVIDER_ID,
                        message,
                    ));
                }
                other => {
                    let _ = child.kill().await;
                    return Err(ProviderError::new(
                        ErrorKind::Unknown,
                        PROVIDER_ID,
                        berth_supervisor::reaper::start_unconfirmed(&program, other.as_ref()),
                    ));
                }
            }
        }
    };
    let pid = child.id().ok_or_else(|| {
        ProviderError::new(
            ErrorKind::Unknown,
            PROVIDER_ID,
            "spawned process has no pid",
        )
    })?;
    let pgid = Pid::from_raw(pid as i32);
    let mut guard = GroupGuard {
        pgid,
        armed: true,
        reaped: control.is_some(),
    };
    let mut stdout = child.stdout.take().expect("stdout piped");
    let mut stderr = child.stderr.take().expect("stderr piped");
    let mut collector = Collector {
        sink,
        stdout: Vec::new(),
        stderr: Vec::new(),
        stderr_head: Vec::new(),
        stdout_total: 0,
        stderr_total: 0,
    };
    let deadline = spec.req.timeout.map(|t| started + t);
    let mut kill_at: Option<Instant> = None;
    let mut timed_out = false;
    let mut exit: Option<std::process::ExitStatus> = None;
    let mut exited_at = started;
    let (mut stdout_open, mut stderr_open) = (true, true);
    let mut left = [PipeLeft::default(); 2];
    let mut out_buf = vec![0u8; 64 * 1024];
    let mut err_buf = vec![0u8; 64 * 1024];

    while stdout_open || stderr_open || exit.is_none() {
        let (out_most, err_most) = (left[0].most(out_buf.len()), left[1].most(err_buf.len()));
        tokio::select! {
            read = stdout.read(&mut out_buf[..out_most]), if stdout_open => match read {
                Ok(0) | Err(_) => stdout_open = false,
                Ok(n) => {
                    collector.push(Stream::Stdout, &out_buf[..n]);
                    stdout_open = left[0].consume(n);
                }
            },
            read = stderr.read(&mut err_buf[..err_most]), if stderr_open => match read {
                Ok(0) | Err(_) => stderr_open = false,
                Ok(n) => {
                    collector.push(Stream::Stderr, &err_buf[..n]);
                    stderr_open = left[1].consume(n);
                }
            },
            waited = child.wait(), if exit.is_none() => {
                let status = waited.map_err(|e| io_error("wait for process", e))?;
                exit = Some(status);
                exited_at = Instant::now();
                // The leader is gone; whatever is left in its group would hold the pipes open
                // and outlive the exec. Processes do not outlive an exec on this provider.
                let _ = killpg(pgid, Signal::SIGKILL);
                if control.is_some() {
                    // The reaper has ended: what the exec wrote is all in the pipes now, and
                    // only that is read (see `PipeLeft`).
                    if stdout_open {
                        left[0] = PipeLeft::buffered_in(&stdout);
                        stdout_open = !left[0].is_done();
                    }
                    if stderr_open {
                        left[1] = PipeLeft::buffered_in(&stderr);
                        stderr_open = !left[1].is_done();
                    }
                }
            },
            _ = sleep_until(deadline), if !timed_out && exit.is_none() => {
                timed_out = true;
                match control.as_mut() {
                    // The reaper signals its whole subtree, not just the group.
                    Some(control) => control.send(&format!("term {}", spec.kill_grace.as_millis())).await,
                    None => { let _ = killpg(pgid, Signal::SIGTERM); }
                }
                kill_at = Some(Instant::now() + spec.kill_grace);
            },
            _ = sleep_until(kill_at), if kill_at.is_some() && exit.is_none() => {
                match control.as_mut() {
                    Some(control) => control.send("kill").await,
                    None => { let _ = killpg(pgid, Signal::SIGKILL); }
                }
                kill_at = None;
            },
        }
    }
    guard.armed = false;
    let exit = exit.expect("loop ends only after exit");
    // Under a reaper, the command's own status comes over the control channel; the reaper's
    // exit code is never taken for the command's.
    let reported = match control.as_mut() {
        Some(control) => Some(control.report().await),
        None => None,
    };
    let contained = matches!(
        reported,
        Some(Some(Report::Exited(_) | Report::Signalled(_)))
    );
    let status = if timed_out {
        ExitStatus::TimedOut
    } else if let Some(report) = reported {
        match report {
            Some(Report::Exited(code)) => ExitStatus::Exited { code },
            Some(Report::Signalled(signal)) => ExitStatus::Signalled { signal },
            other => ExitStatus::Unknown {
                reason: berth_supervisor::reaper::status_lost(&exit.to_string(), other.as_ref()),
            },
        }
    } else if let Some(code) = exit.code() {
        ExitStatus::Exited { code }
    } else if let Some(signal) = exit.signal() {
        ExitStatus::Signalled { signal }
    } else {
        ExitStatus::Unknown {
            reason: format!("wait returned {exit}"),
        }
    };
    Ok(Finished {
        status,
        stdout: collector.stdout,
        stderr: collector.stderr,
        stderr_head: collector.stderr_head,
        stdout_total: collector.stdout_total,
        stderr_total: collector.stderr_total,
        duration: exited_at - started,
        contained,
    })
}

/// Kills every process still marked with this sandbox or running inside its workspace
/// (processes that left the process group with `setsid`, for example).
pub(crate) fn kill_leftovers(sandbox: &str, workspace: &Path) {
    let marker = format!("{MARKER}={sandbox}");
    let workspace = workspace
        .canonicalize()
        .unwrap_or_else(|_| workspace.to_owned());
    let me = std::process::id();
    for _round in 0..20 {
        let mut killed = 0;
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == me {
                continue;
            }
            let dir = entry.path();
            let marked = std::fs::read(dir.join("environ"))
                .map(|env| env.split(|b| *b == 0).any(|var| var == marker.as_bytes()))
                .unwrap_or(false);
            let inside = std::fs::read_link(dir.join("cwd"))
                .map(|cwd| cwd.starts_with(&workspace))
                .unwrap_or(false);
            if (marked || inside) && kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
        if killed == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
