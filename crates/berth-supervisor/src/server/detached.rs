//! Detached processes: started in their own process group, each watched by one thread that
//! relays its output into bounded files, records how it ended and reaps it once nothing is left
//! in its group (one thread, not one per duty: each counts against the sandbox's process
//! limit). Handles live as long as this supervisor process.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;

use super::spawn_failure;
#[cfg(doc)]
use crate::MAX_KEPT_OUTPUT;
use crate::{write_frame, Exit, TAG_STDERR, TAG_STDOUT};

struct Process {
    pgid: Pid,
    ended: Option<Exit>,
    /// It ended and nothing is left in its process group (its leader was then reaped).
    group_gone: bool,
    /// Its stdout and stderr.
    relay: Arc<Relay>,
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
    keep: u64,
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
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => return spawn_failure(program, cwd, &err),
    };
    let pipes = child.stdout.take().zip(child.stderr.take());
    let started = pipes
        .ok_or_else(|| io::Error::other("no pipes"))
        .and_then(|(out, err)| {
            let pipes: [OwnedFd; 2] = [out.into(), err.into()];
            for pipe in &pipes {
                rustix::io::ioctl_fionbio(pipe, true)?;
            }
            Ok(pipes)
        })
        .map(|pipes| (pipes, Arc::new(Relay::new([stdout, stderr], keep))));
    let pgid = Pid::from_raw(child.id() as i32);
    let watched = started.and_then(|(pipes, relay)| {
        table().lock().unwrap_or_else(|p| p.into_inner()).insert(
            handle.clone(),
            Process {
                pgid,
                ended: None,
                group_gone: false,
                relay: relay.clone(),
            },
        );
        let watched = handle.clone();
        std::thread::Builder::new()
            .name("watch".into())
            .spawn(move || watch(&relay, pipes, child, &watched, pgid))
    });
    if let Err(e) = watched {
        // Unwatched, the process would block on a full pipe and never be reaped: it is not
        // left running unseen.
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pgid, None);
        table()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle);
        return Exit::SpawnFailed {
            kind: "other".into(),
            message: format!(
                "cannot watch `{program}`: {e}{}",
                crate::reaper::at_process_limit(&e)
            ),
        };
    }
    Exit::Started { process: handle }
}

/// Changes the table's entry for `handle`.
fn set(handle: &str, change: impl FnOnce(&mut Process)) {
    if let Some(process) = table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_mut(handle)
    {
        change(process);
    }
}

/// How a waited-for process ended.
fn exit_of(waited: nix::Result<WaitStatus>) -> Exit {
    match waited {
        Ok(WaitStatus::Exited(_, code)) => Exit::Exited { code },
        Ok(WaitStatus::Signaled(_, signal, _)) => Exit::Signalled {
            signal: signal as i32,
        },
        other => Exit::SpawnFailed {
            kind: "other".into(),
            message: format!("wait returned {other:?}"),
        },
    }
}

/// A detached process's stdout and stderr as they reach its files: the first `keep` of each
/// ([`MAX_KEPT_OUTPUT`] unless the request says) is written, the rest read and dropped
/// (counted), so a process that never stops writing neither fills the disk nor blocks.
struct Relay {
    streams: Mutex<[Relayed; 2]>,
}

/// One stream of a [`Relay`].
struct Relayed {
    /// Closed once every writer has closed the pipe, so an ended process holds no descriptor
    /// of the supervisor's.
    file: Option<File>,
    /// The most to keep.
    keep: u64,
    kept: u64,
    dropped: u64,
}

impl Relay {
    fn new(files: [File; 2], keep: u64) -> Relay {
        let streams = files.map(|file| Relayed {
            file: Some(file),
            keep,
            kept: 0,
            dropped: 0,
        });
        Relay {
            streams: Mutex::new(streams),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, [Relayed; 2]> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads what `pipe` has (at most `most` bytes) into stream `n`: how many bytes, or `None`
    /// at its end (or a failed pipe), when the stream's file is closed.
    fn relay_from(&self, n: usize, pipe: &OwnedFd, buf: &mut [u8], most: usize) -> Option<usize> {
        let most = most.min(buf.len());
        match rustix::io::read(pipe, &mut buf[..most]) {
            Ok(0) => {}
            Ok(read) => {
                self.lock()[n].take(&buf[..read]);
                return Some(read);
            }
            Err(Errno::AGAIN | Errno::INTR) => return Some(0),
            Err(_) => {}
        }
        self.lock()[n].file = None;
        None
    }

    fn dropped(&self) -> [u64; 2] {
        self.lock().each_ref().map(|stream| stream.dropped)
    }
}

/// How often, once the process has ended, its group is looked at (and, without a pidfd, how
/// often the process is).
const TICK: std::time::Duration = std::time::Duration::from_millis(200);

/// Watches one detached process on one thread until its pipes are closed and its group is
/// gone: relays its output; when it ends, relays what it wrote before (the bytes then waiting
/// in the pipes, not what a descendant still holding them writes after) and only then records
/// how it ended; reaps it once nothing else is in its group — until then its pid, and so its
/// group's id, cannot be given to another process, so `kill` can still signal what it left —
/// marking the group gone first.
fn watch(relay: &Relay, pipes: [OwnedFd; 2], mut child: Child, handle: &str, pgid: Pid) {
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_child(&child),
        rustix::process::PidfdFlags::empty(),
    )
    .ok();
    let mut open = pipes.map(Some);
    let mut buf = vec![0u8; 64 << 10];
    let (mut ended, mut group_gone) = (false, false);
    while !group_gone || open.iter().any(Option::is_some) {
        // Waits for output, for the process's end (its pidfd), and once it has ended, for the
        // next look at its group.
        let tick = match (ended, group_gone, &pidfd) {
            (_, true, _) | (false, _, Some(_)) => None,
            _ => Some(TICK),
        };
        let readable: Vec<usize> = {
            let (mut which, mut fds) = (Vec::new(), Vec::new());
            for (n, pipe) in open.iter().enumerate() {
                if let Some(pipe) = pipe {
                    which.push(n);
                    fds.push(PollFd::new(pipe, PollFlags::IN));
                }
            }
            if let (false, Some(pidfd)) = (ended, &pidfd) {
                fds.push(PollFd::new(pidfd, PollFlags::IN));
            }
            let timeout = tick.map(|tick| rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: i64::from(tick.subsec_nanos()),
            });
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(_) => std::thread::sleep(TICK),
            }
            which
                .into_iter()
                .zip(&fds)
                .filter(|(_, fd)| !fd.revents().is_empty())
                .map(|(n, _)| n)
                .collect()
        };
        for n in readable {
            if let Some(pipe) = &open[n] {
                if relay.relay_from(n, pipe, &mut buf, usize::MAX).is_none() {
                    open[n] = None;
                }
            }
        }
        if !ended {
            let now = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            let waited = match waitid(Id::Pid(pgid), now) {
                Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => continue,
                waited => waited,
            };
            // Finished means its output is in the files: the bytes in the pipes now are all it
            // wrote (a descendant may write more; that is not waited for).
            for (n, slot) in open.iter_mut().enumerate() {
                let Some(pipe) = slot.as_ref() else { continue };
                let mut left = rustix::io::ioctl_fionread(pipe).unwrap_or(0);
                // A read that finds nothing (interrupted) is retried, a bounded number of times.
                let mut retries = 100;
                while left > 0 && retries > 0 {
                    let most = usize::try_from(left).unwrap_or(usize::MAX);
                    match relay.relay_from(n, pipe, &mut buf, most) {
                        Some(0) => retries -= 1,
                        Some(read) => left = left.saturating_sub(read as u64),
                        None => {
                            *slot = None;
                            break;
                        }
                    }
                }
            }
            set(handle, |process| process.ended = Some(exit_of(waited)));
            ended = true;
        }
        if ended && !group_gone && crate::members(crate::Joined::Group, pgid.as_raw()).is_empty() {
            set(handle, |process| process.group_gone = true);
            let _ = child.wait();
            group_gone = true;
        }
    }
}

impl Relayed {
    /// Writes what fits under `keep` to the file; the rest, and whatever the file refuses (a
    /// full disk), is counted as dropped.
    fn take(&mut self, bytes: &[u8]) {
        let room = self.keep.saturating_sub(self.kept);
        let mut keep = &bytes[..bytes.len().min(usize::try_from(room).unwrap_or(usize::MAX))];
        let mut written = 0;
        while let (false, Some(file)) = (keep.is_empty(), self.file.as_mut()) {
            match file.write(keep) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    written += n;
                    keep = &keep[n..];
                }
            }
        }
        self.kept += written as u64;
        self.dropped += (bytes.len() - written) as u64;
    }
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
    let dropped = table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(handle)
        .map(|process| process.relay.clone())
        .map(|relay| relay.dropped());
    let dropped = |n: usize| dropped.map(|dropped| dropped[n]);
    Exit::Output {
        stdout_size: sizes[0],
        stderr_size: sizes[1],
        stdout_dropped: dropped(0),
        stderr_dropped: dropped(1),
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
    if process.group_gone {
        // Idempotent: it ended, and so did everything in its group.
        return Exit::Exited { code: 0 };
    }
    // Also once it has ended: what it started in its group (`sh -c 'server &'`) goes too.
    let Ok(signal) = Signal::try_from(signal) else {
        return Exit::BadRequest {
            message: format!("{signal} is not a signal"),
        };
    };
    let _ = killpg(process.pgid, signal);
    Exit::Exited { code: 0 }
}
