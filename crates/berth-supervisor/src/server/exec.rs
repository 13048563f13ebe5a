//! One exec: the command under its reaper, its output relayed as frames, its status from the
//! reaper.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::reaper::{PipeLeft, Report};
use crate::{write_frame, Exit, TAG_STDERR, TAG_STDOUT};

pub(super) fn exec(
    stream: &UnixStream,
    out: &Arc<Mutex<UnixStream>>,
    argv: &[String],
    cwd: &str,
    env: &BTreeMap<String, String>,
    timeout_ms: Option<u64>,
    grace_ms: u64,
) -> Exit {
    let Some(program) = argv.first() else {
        return Exit::BadRequest {
            message: "empty argv".into(),
        };
    };
    // The command runs under this binary's reaper mode: it is a child subreaper, so what the
    // command starts cannot leave the exec by `setsid` or double-forking (see `reaper`). The
    // reaper was started ahead of this exec when it could be (see `prepare_next`).
    let job = crate::reaper::Job {
        argv: argv.to_vec(),
        cwd: cwd.to_owned(),
        env: env.clone(),
    };
    let Waiting { mut child, control } = match reaper_for(&job.to_frame()) {
        Ok(waiting) => waiting,
        Err(err) => return spawn_failure(program, cwd, &err),
    };
    let mut reports = match control.try_clone() {
        Ok(read) => BufReader::new(read).lines(),
        Err(err) => {
            let _ = child.kill();
            let _ = child.wait();
            return spawn_failure(program, cwd, &err);
        }
    };
    let mut next_report = move || {
        reports
            .next()
            .and_then(|line| line.ok())
            .and_then(|line| Report::parse(&line))
    };
    match next_report() {
        Some(Report::Started) => {}
        Some(Report::Failed { kind, message }) => {
            let _ = child.wait();
            return Exit::SpawnFailed { kind, message };
        }
        other => {
            let _ = child.kill();
            let _ = child.wait();
            return Exit::SpawnFailed {
                kind: "other".into(),
                message: crate::reaper::start_unconfirmed(program, other.as_ref()),
            };
        }
    }
    let tell = {
        let control = Mutex::new(control);
        Arc::new(move |line: &str| {
            let mut control = control.lock().unwrap_or_else(|p| p.into_inner());
            let _ = std::io::Write::write_all(&mut *control, format!("{line}\n").as_bytes());
        })
    };
    let pgid = Pid::from_raw(child.id() as i32);
    let timed_out = Arc::new(AtomicBool::new(false));

    // Deadline: the reaper sends SIGTERM to the whole subtree, SIGKILL after the grace period.
    // On a thread of its own, so it fires even while a frame waits on a client that reads
    // nothing.
    let (cancel, cancelled) = mpsc::channel::<()>();
    let timer = timeout_ms.map(|ms| {
        let timed_out = Arc::clone(&timed_out);
        let tell = Arc::clone(&tell);
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) =
                cancelled.recv_timeout(Duration::from_millis(ms))
            {
                timed_out.store(true, Ordering::SeqCst);
                tell(&format!("term {grace_ms}"));
            }
        })
    });

    let pipes = [
        (
            TAG_STDOUT,
            child.stdout.take().map(std::os::fd::OwnedFd::from),
        ),
        (
            TAG_STDERR,
            child.stderr.take().map(std::os::fd::OwnedFd::from),
        ),
    ];
    // Seen to end through a pidfd (the reaper is not waited for yet, so its pid stays its own).
    let reaper = rustix::process::Pid::from_child(&child);
    let reaper = rustix::process::pidfd_open(reaper, rustix::process::PidfdFlags::empty()).ok();
    relay(stream, out, pipes, reaper.as_ref(), &*tell);
    let status = child.wait();
    // The reaper has already killed and reaped its subtree; the group is empty.
    let _ = killpg(pgid, Signal::SIGKILL);
    drop(cancel);
    if let Some(timer) = timer {
        let _ = timer.join();
    }
    if timed_out.load(Ordering::SeqCst) {
        return Exit::TimedOut;
    }
    match next_report() {
        Some(Report::Exited(code)) => Exit::Exited { code },
        Some(Report::Signalled(signal)) => Exit::Signalled { signal },
        other => Exit::Unknown {
            reason: crate::reaper::status_lost(
                &match status {
                    Ok(status) => status.to_string(),
                    Err(err) => err.to_string(),
                },
                other.as_ref(),
            ),
        },
    }
}

/// A reaper started before the exec it will run (`reaper::run_waiting`): its process, with
/// its output pipes, and its control channel.
struct Waiting {
    child: Child,
    control: UnixStream,
}

/// The reaper waiting for the next exec, if one is.
static WAITING: Mutex<Option<Waiting>> = Mutex::new(None);

impl Waiting {
    fn start() -> io::Result<Waiting> {
        let (control, reaper_end) = UnixStream::pair()?;
        // Spawned without a directory or environment of its own: the job brings both, and the
        // spawn stays a `vfork` of this process.
        let child = Command::new(std::env::current_exe()?)
            .arg(crate::reaper::REAP_WAITING_ARG)
            .env_clear()
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(reaper_end)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()?;
        Ok(Waiting { child, control })
    }

    fn send(&self, frame: &[u8]) -> io::Result<()> {
        (&self.control).write_all(frame)
    }
}

/// Starts a reaper for the next exec unless one is waiting already: called when the supervisor
/// starts and after each exec has answered, so the next exec finds its reaper running.
pub(super) fn prepare_next() {
    let mut slot = WAITING.lock().unwrap_or_else(|p| p.into_inner());
    if slot.is_none() {
        *slot = Waiting::start().ok();
    }
}

/// A reaper that has been given `frame`: the waiting one when it takes it, else one started
/// now (the waiting one is taken by a concurrent exec, or is gone: anything in the sandbox may
/// kill it).
fn reaper_for(frame: &[u8]) -> io::Result<Waiting> {
    let waiting = WAITING.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(mut waiting) = waiting {
        if waiting.send(frame).is_ok() {
            return Ok(waiting);
        }
        let _ = waiting.child.kill();
        let _ = waiting.child.wait();
    }
    let mut fresh = Waiting::start()?;
    if let Err(err) = fresh.send(frame) {
        let _ = fresh.child.kill();
        let _ = fresh.child.wait();
        return Err(err);
    }
    Ok(fresh)
}

/// The command's output as frames to the client, until both pipes end — or, once the reaper has
/// ended, until what was in them at that moment is relayed (`reaper`: its pidfd, when the
/// kernel gives one; without it, the pipes' end is waited for). Every process of the exec is
/// gone when the reaper ends, so what it wrote is all in the pipes then; a pipe still open is
/// held by something outside the exec (a process that opened `/proc/PID/fd/1` of one of its
/// commands), which must not hold the exec open; what it writes after that is not relayed.
///
/// One loop on this connection's thread, where it used to be three threads per exec. The
/// client sends nothing after its request, so the client turning readable (end of file, or
/// anything at all) means it hung up: the command is killed with it. A frame that cannot be
/// written (the client is gone) does the same; the pipes are still drained so nothing blocks
/// on them.
fn relay(
    client: &UnixStream,
    out: &Mutex<UnixStream>,
    mut pipes: [(u8, Option<std::os::fd::OwnedFd>); 2],
    reaper: Option<&std::os::fd::OwnedFd>,
    tell: &dyn Fn(&str),
) {
    use rustix::event::{poll, PollFd, PollFlags};
    const CLIENT: usize = 2;
    const REAPER: usize = 3;
    let mut watching = true;
    let mut writing = true;
    let mut reaper_running = reaper.is_some();
    let mut left = [PipeLeft::default(); 2];
    let mut buf = vec![0u8; 64 * 1024];
    while pipes.iter().any(|(_, pipe)| pipe.is_some()) {
        // Which pipes are readable (or ended), whether the client hung up, the reaper ended.
        let mut ready = [false; 4];
        {
            let mut fds = Vec::with_capacity(4);
            let mut which = Vec::with_capacity(4);
            for (n, (_, pipe)) in pipes.iter().enumerate() {
                if let Some(pipe) = pipe {
                    fds.push(PollFd::new(pipe, PollFlags::IN));
                    which.push(n);
                }
            }
            if watching {
                fds.push(PollFd::new(client, PollFlags::IN));
                which.push(CLIENT);
            }
            if let Some(reaper) = reaper.filter(|_| reaper_running) {
                fds.push(PollFd::new(reaper, PollFlags::IN));
                which.push(REAPER);
            }
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    // Cannot wait on the pipes: end the command rather than leave it blocked
                    // on output nobody reads.
                    tell("kill");
                    return;
                }
            }
            for (fd, n) in fds.iter().zip(which) {
                ready[n] = !fd.revents().is_empty();
            }
        }
        if ready[REAPER] {
            reaper_running = false;
            for ((_, pipe), left) in pipes.iter().zip(left.iter_mut()) {
                if let Some(pipe) = pipe {
                    *left = PipeLeft::buffered_in(pipe);
                }
            }
        }
        if ready[CLIENT] {
            watching = false;
            tell("kill");
        }
        for (n, (tag, pipe)) in pipes.iter_mut().enumerate() {
            if left[n].is_done() {
                *pipe = None;
            }
            let Some(fd) = pipe.as_ref().filter(|_| ready[n]) else {
                continue;
            };
            let most = left[n].most(buf.len());
            match rustix::io::read(fd, &mut buf[..most]) {
                Ok(0) => *pipe = None,
                Ok(read) => {
                    if !left[n].consume(read) {
                        *pipe = None;
                    }
                    if writing {
                        let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
                        if write_frame(&mut *out, *tag, &buf[..read]).is_err() {
                            writing = false;
                            tell("kill");
                        }
                    }
                }
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                Err(_) => *pipe = None,
            }
        }
    }
}

pub(super) fn spawn_failure(program: &str, cwd: &str, err: &io::Error) -> Exit {
    Exit::SpawnFailed {
        kind: crate::reaper::start_failure_kind(err).into(),
        message: format!(
            "cannot start `{program}` in `{cwd}`: {err}{}",
            crate::reaper::at_process_limit(err)
        ),
    }
}
