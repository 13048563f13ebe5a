//! Detached processes: started in their own process group, their output relayed into bounded
//! files, waited for by a thread that records how they ended and reaps them once nothing is
//! left in their group. Handles live as long as this supervisor process.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
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
    let pipes = child
        .stdout
        .take()
        .zip(child.stderr.take())
        .ok_or_else(|| io::Error::other("no pipes"))
        .and_then(|(out, err)| Relay::start([out.into(), err.into()], [stdout, stderr], keep));
    let relay = match pipes {
        Ok(relay) => relay,
        Err(e) => {
            // Without its relay the process would block on a full pipe: it is not left
            // running unseen.
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
            return Exit::SpawnFailed {
                kind: "other".into(),
                message: format!("cannot relay the output of `{program}`: {e}"),
            };
        }
    };
    let pgid = Pid::from_raw(child.id() as i32);
    table().lock().unwrap_or_else(|p| p.into_inner()).insert(
        handle.clone(),
        Process {
            pgid,
            ended: None,
            group_gone: false,
            relay: relay.clone(),
        },
    );
    let waiter_handle = handle.clone();
    std::thread::spawn(move || {
        // Not reaped yet: while it is a zombie its pid, and so its group's id, cannot be given
        // to another process, so `kill` can still signal what it left in its group.
        let ended = exit_of(loop {
            match waitid(Id::Pid(pgid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                Err(nix::errno::Errno::EINTR) => continue,
                waited => break waited,
            }
        });
        // Finished means its output is in the files: what it wrote before it ended is relayed
        // first (not what a descendant still holding the pipes writes after).
        relay.wait_relayed_so_far();
        set(&waiter_handle, |process| process.ended = Some(ended));
        // Reaped once nothing else is left in its group; the group is marked gone first, so a
        // `kill` never signals a group id that could be someone else's.
        while !crate::members(crate::Joined::Group, pgid.as_raw()).is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        set(&waiter_handle, |process| process.group_gone = true);
        let _ = child.wait();
    });
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

/// A detached process's stdout and stderr: pipes whose bytes one thread copies into the
/// streams' files, the first `keep` of each ([`MAX_KEPT_OUTPUT`] unless the request says);
/// the rest is read and dropped (counted), so a process that never stops writing neither fills
/// the disk nor blocks.
struct Relay {
    streams: Mutex<[Relayed; 2]>,
}

/// One stream of a [`Relay`].
struct Relayed {
    /// A duplicate of the pipe's read end, to ask how much is waiting in it. The relay's
    /// thread reads its own (non-blocking: only once `poll` says so, under the lock); both,
    /// and the file, are closed once every writer has closed the pipe, so an ended process
    /// holds no descriptor of the supervisor's.
    probe: Option<OwnedFd>,
    file: Option<File>,
    /// The most to keep.
    keep: u64,
    /// Bytes read from the pipe so far (kept or dropped).
    taken: u64,
    kept: u64,
    dropped: u64,
}

impl Relay {
    fn start(pipes: [OwnedFd; 2], files: [File; 2], keep: u64) -> io::Result<Arc<Relay>> {
        let [out_file, err_file] = files;
        let stream = |pipe: &OwnedFd, file| -> io::Result<Relayed> {
            rustix::io::ioctl_fionbio(pipe, true)?;
            Ok(Relayed {
                probe: Some(pipe.try_clone()?),
                file: Some(file),
                keep,
                taken: 0,
                kept: 0,
                dropped: 0,
            })
        };
        let relay = Arc::new(Relay {
            streams: Mutex::new([stream(&pipes[0], out_file)?, stream(&pipes[1], err_file)?]),
        });
        let running = relay.clone();
        std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || running.run(pipes))?;
        Ok(relay)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, [Relayed; 2]> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Copies until every writer has closed both pipes. Bytes are only ever in this thread's
    /// hands while it holds the lock, so under the lock an empty pipe means all read is
    /// written.
    fn run(&self, pipes: [OwnedFd; 2]) {
        let mut open = pipes.map(Some);
        let mut buf = vec![0u8; 64 << 10];
        while open.iter().any(Option::is_some) {
            let waiting: Vec<usize> = {
                let (which, mut fds): (Vec<usize>, Vec<PollFd<'_>>) = open
                    .iter()
                    .enumerate()
                    .filter_map(|(n, pipe)| Some((n, PollFd::new(pipe.as_ref()?, PollFlags::IN))))
                    .unzip();
                match rustix::event::poll(&mut fds, None) {
                    Ok(_) | Err(Errno::INTR) => {}
                    Err(_) => break,
                }
                which
                    .into_iter()
                    .zip(&fds)
                    .filter(|(_, fd)| !fd.revents().is_empty())
                    .map(|(n, _)| n)
                    .collect()
            };
            for n in waiting {
                let Some(pipe) = open[n].as_ref() else {
                    continue;
                };
                let mut streams = self.lock();
                match rustix::io::read(pipe, &mut buf) {
                    Ok(0) => {}
                    Ok(read) => {
                        streams[n].take(&buf[..read]);
                        continue;
                    }
                    Err(Errno::AGAIN | Errno::INTR) => continue,
                    Err(_) => {}
                }
                // The end (or a failed pipe): this stream is closed.
                streams[n].probe = None;
                streams[n].file = None;
                drop(streams);
                open[n] = None;
            }
        }
        for stream in self.lock().iter_mut() {
            stream.probe = None;
            stream.file = None;
        }
    }

    /// Waits until every byte in the pipes now has been relayed (or a pipe closed): called
    /// once the process has ended, so what it wrote is all there already, however much a
    /// descendant writes after.
    fn wait_relayed_so_far(&self) {
        let targets = self.lock().each_ref().map(|stream| {
            let waiting = stream
                .probe
                .as_ref()
                .map_or(0, |pipe| rustix::io::ioctl_fionread(pipe).unwrap_or(0));
            stream.taken + waiting
        });
        loop {
            let caught_up = self
                .lock()
                .iter()
                .zip(targets)
                .all(|(stream, target)| stream.probe.is_none() || stream.taken >= target);
            if caught_up {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn dropped(&self) -> [u64; 2] {
        self.lock().each_ref().map(|stream| stream.dropped)
    }
}

impl Relayed {
    /// Writes what fits under `keep` to the file; the rest, and whatever the file refuses (a
    /// full disk), is counted as dropped.
    fn take(&mut self, bytes: &[u8]) {
        self.taken += bytes.len() as u64;
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
