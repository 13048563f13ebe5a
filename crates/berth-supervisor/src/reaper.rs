//! The per-exec reaper: a small process that runs one command and makes sure nothing it
//! started outlives it.
//!
//! A process group does not hold a command's descendants: one that calls `setsid` leaves the
//! group, and one whose parent dies is re-parented away from it. The reaper marks itself a
//! child subreaper (`PR_SET_CHILD_SUBREAPER`), so every descendant that loses its parent is
//! re-parented to the reaper and stays in its subtree, wherever it moves in sessions and groups.
//! When the command ends, times out, or its caller goes away, the reaper signals every process
//! in its subtree and reaps until none is left; only then does it exit.
//!
//! It is spawned with its stdin connected to a Unix socket (the control channel; the command
//! itself gets `/dev/null`). Lines on it:
//!
//! - reaper → caller: `started`, or `failed <not_found|permission_denied|other> <message>`;
//!   at the end `exited <code>` or `signalled <signal>` — the command's own status, so the
//!   caller never reads the reaper's exit code as the command's.
//! - caller → reaper: `term <grace_ms>` (SIGTERM to the subtree, SIGKILL after the grace), or
//!   `kill`. End of file (the caller exited or was killed): SIGKILL to the subtree.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// The argument that selects reaper mode in the binaries that embed it.
pub const REAP_ARG: &str = "__reap";

/// The direct children of `pid`, from `/proc/<pid>/task/*/children`.
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            children.extend(
                list.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    children
}

/// Every live process whose parent chain leads to `root` (not `root` itself).
fn descendants(root: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for child in children_of(pid) {
            if seen.insert(child) {
                found.push(child);
                queue.push(child);
            }
        }
    }
    found
}

/// Whether the reaper has any child at all, of any kind (`__WALL`), exited or not. Without one
/// it has no descendant either: a process whose parent dies is re-parented to the reaper, so
/// the top of whatever is left of the subtree is always the reaper's child. Asked before
/// reading `/proc`: a command that leaves nothing behind (the usual case) costs no `/proc`
/// lookups, and the reaper's `/proc` entries — which the caller's wait must invalidate — stay
/// few.
fn has_children() -> bool {
    let any =
        WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT | WaitPidFlag::__WALL;
    !matches!(waitid(Id::All, any), Err(Errno::ECHILD))
}

fn signal_subtree(signal: Signal) {
    if !has_children() {
        return;
    }
    for pid in descendants(std::process::id() as i32) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

fn say(control: &UnixStream, line: &str) {
    let mut out = control;
    let _ = out.write_all(format!("{line}\n").as_bytes());
}

/// The argument that selects reaper mode with a bwrap entry (see [`run_entering`]).
pub const REAP_ENTER_ARG: &str = "__reap_enter";

fn control_channel() -> Option<UnixStream> {
    match io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => Some(fd.into()),
        Err(err) => {
            eprintln!("berth-reap: no control channel on stdin: {err}");
            None
        }
    }
}

/// Runs `argv` as the reaper (see the module docs); returns the reaper's own exit code.
pub fn run(argv: &[OsString]) -> i32 {
    let Some(control) = control_channel() else {
        return 2;
    };
    let Some((program, args)) = argv.split_first() else {
        say(&control, "failed other empty argv");
        return 2;
    };
    let mut command = Command::new(program);
    command.args(args);
    reap(control, command, true)
}

/// The argument that selects a reaper started before its command is known (see
/// [`run_waiting`]).
pub const REAP_WAITING_ARG: &str = "__reap_waiting";

/// The most a waiting reaper reads as its job.
const MAX_JOB_BYTES: u64 = 16 << 20;

/// What a waiting reaper runs: the command, the directory it runs in, its whole environment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Job {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Entered by the reaper before the command starts.
    pub cwd: String,
    /// The command's environment (nothing else is inherited).
    pub env: std::collections::BTreeMap<String, String>,
}

impl Job {
    /// The job as the control channel carries it: its length (8 bytes, big-endian), then JSON.
    pub fn to_frame(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("a job serializes");
        let mut frame = (json.len() as u64).to_be_bytes().to_vec();
        frame.extend_from_slice(&json);
        frame
    }
}

/// Reads one job frame; `None` at end of file before one (the supervisor went away or
/// discarded this reaper). Exactly the frame is read: what follows on the channel (`term`,
/// `kill`) is left for the reaper's command reader.
fn read_job(mut control: &UnixStream) -> Result<Option<Job>, String> {
    use std::io::Read;
    let mut length = [0u8; 8];
    if let Err(err) = control.read_exact(&mut length) {
        return match err.kind() {
            io::ErrorKind::UnexpectedEof => Ok(None),
            _ => Err(format!("cannot read the job: {err}")),
        };
    }
    let length = u64::from_be_bytes(length);
    if length > MAX_JOB_BYTES {
        return Err(format!("a job of {length} bytes; at most {MAX_JOB_BYTES}"));
    }
    let mut json = Vec::new();
    control
        .take(length)
        .read_to_end(&mut json)
        .map_err(|err| format!("cannot read the job: {err}"))?;
    if json.len() as u64 != length {
        return Ok(None);
    }
    serde_json::from_slice(&json)
        .map(Some)
        .map_err(|err| format!("malformed job: {err}"))
}

/// A reaper started ahead of its command (`__reap_waiting`), so that an exec does not wait for
/// the reaper's own start (on a machine whose C library start-up is slow, most of what an exec
/// costs): it reads one [`Job`] from its control channel, enters the job's directory itself
/// (the supervisor spawns it without one, so the spawn is a `vfork`, not a copy of the
/// supervisor), and reaps the command with the job's environment and nothing else. End of
/// file before a job: it exits, having started nothing.
pub fn run_waiting() -> i32 {
    let Some(control) = control_channel() else {
        return 2;
    };
    let job = match read_job(&control) {
        Ok(Some(job)) => job,
        Ok(None) => return 0,
        Err(message) => {
            say(
                &control,
                &format!("failed other {}", message.replace('\n', " ")),
            );
            return 2;
        }
    };
    let Some((program, args)) = job.argv.split_first() else {
        say(&control, "failed other empty argv");
        return 2;
    };
    if let Err(err) = std::env::set_current_dir(&job.cwd) {
        // Said as a start of the command would say it, the command never having started.
        say_start_failed(
            &control,
            start_failure_kind(&err),
            &format!("cannot start `{program}` in `{}`: {err}", job.cwd),
        );
        return 0;
    }
    let mut command = Command::new(program);
    command.args(args).env_clear().envs(&job.env);
    reap(control, command, true)
}

/// The reaper of a command that runs entered into a bwrap sandbox as an unprivileged user
/// (`__reap_enter` followed by [`crate::enter`]'s arguments): the same as `__reap` of
/// `__enter …`, one program start fewer. The reaper enters first — its own private mount
/// namespace, the unprivileged ids, no capabilities — then starts bwrap, so it reaps as the
/// user the sandbox's processes run as (enough to signal and wait for them), never as root.
pub fn run_entering(argv: &[OsString]) -> i32 {
    let Some(control) = control_channel() else {
        return 2;
    };
    let entry = match crate::enter::Entry::parse(argv) {
        Ok(entry) => entry,
        Err(usage) => {
            say(&control, &format!("failed other usage: {usage}"));
            return 2;
        }
    };
    if let Err((what, err)) = entry.enter() {
        say(
            &control,
            &format!("failed other cannot enter the sandbox: {what}: {err}"),
        );
        return 0;
    }
    let mut command = Command::new(&entry.program);
    command.args(&entry.args);
    // A failure here is bwrap's, never a missing or unexecutable command.
    reap(control, command, false)
}

/// Starts `command` and reaps it (see the module docs). `is_the_command`: a start failure is
/// the command's own (not found, not executable), not a helper's in front of it.
fn reap(control: UnixStream, mut command: Command, is_the_command: bool) -> i32 {
    let program = command.get_program().to_owned();
    if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
        say(
            &control,
            &format!("failed other cannot become a subreaper: {err}"),
        );
        return 2;
    }
    let child = match command.stdin(Stdio::null()).spawn() {
        Ok(child) => child,
        Err(err) => {
            let kind = if is_the_command {
                start_failure_kind(&err)
            } else {
                "other"
            };
            say_start_failed(
                &control,
                kind,
                &format!(
                    "cannot start `{}`: {err}{}",
                    program.to_string_lossy(),
                    at_process_limit(&err)
                ),
            );
            return 0;
        }
    };
    let root = Pid::from_raw(child.id() as i32);
    // The handle is not waited on through std: this thread reaps every child with waitpid.
    drop(child);
    say(&control, "started");

    // Commands from the caller; end of file means the caller is gone.
    if let Ok(reader) = control.try_clone() {
        std::thread::spawn(move || {
            let mut lines = BufReader::new(reader).lines();
            loop {
                match lines.next() {
                    Some(Ok(line)) if line.starts_with("term ") => {
                        let grace = line[5..].trim().parse::<u64>().unwrap_or(0);
                        signal_subtree(Signal::SIGTERM);
                        std::thread::sleep(Duration::from_millis(grace));
                        signal_subtree(Signal::SIGKILL);
                    }
                    Some(Ok(line)) if line == "kill" => signal_subtree(Signal::SIGKILL),
                    Some(Ok(_)) => {}
                    // EOF or a broken channel: nobody will read the result.
                    _ => loop {
                        signal_subtree(Signal::SIGKILL);
                        std::thread::sleep(Duration::from_millis(20));
                    },
                }
            }
        });
    }

    let mut status: Option<String> = None;
    loop {
        // `__WALL`: children of every kind (the kernel gives a re-parented process SIGCHLD as
        // its exit signal, but nothing is lost by not relying on it).
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == root => {
                status = Some(format!("exited {code}"));
                signal_subtree(Signal::SIGKILL);
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == root => {
                status = Some(format!("signalled {}", signal as i32));
                signal_subtree(Signal::SIGKILL);
            }
            Ok(_) => {
                if status.is_some() {
                    signal_subtree(Signal::SIGKILL);
                }
            }
            Err(Errno::EINTR) => {}
            // No child of any kind left: no descendant either (see `has_children`).
            Err(Errno::ECHILD) => break,
            Err(_) => break,
        }
    }
    say(
        &control,
        status
            .as_deref()
            .unwrap_or("failed other the command's status was lost"),
    );
    0
}

/// How a command that could not start is reported (`failed KIND MESSAGE`; see
/// [`Report::Failed`]): `not_found` or `permission_denied` when the command itself was missing
/// or not executable (or its working directory was), else `other`.
pub(crate) fn start_failure_kind(err: &io::Error) -> &'static str {
    match err.kind() {
        io::ErrorKind::NotFound => "not_found",
        io::ErrorKind::PermissionDenied => "permission_denied",
        _ => "other",
    }
}

/// When `err` is the kernel refusing another process or thread (`EAGAIN`), how many the
/// sandbox has against its limit (its pids cgroup, v1 or v2), when that can be read: the usual
/// reason. Otherwise nothing.
pub(crate) fn at_process_limit(err: &io::Error) -> String {
    if err.raw_os_error() != Some(Errno::EAGAIN as i32) {
        return String::new();
    }
    for dir in ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"] {
        let read = |name: &str| {
            let mut text = String::new();
            std::fs::File::open(format!("{dir}/{name}"))
                .and_then(|file| io::Read::read_to_string(&mut io::Read::take(file, 64), &mut text))
                .ok()
                .map(|_| text.trim().to_owned())
        };
        if let (Some(current), Some(max)) = (read("pids.current"), read("pids.max")) {
            return format!(" (the sandbox's processes and threads: {current} of its limit {max})");
        }
    }
    String::new()
}

/// Tells the caller the command could not start, on one line.
fn say_start_failed(control: &UnixStream, kind: &str, message: &str) {
    say(
        control,
        &format!("failed {kind} {}", message.replace('\n', " ")),
    );
}

/// What is still to be read from one of an exec's output pipes. While any process of the exec
/// may still write, that is everything up to the pipe's end. Once its reaper has ended, which
/// it does only when its whole subtree is gone, it is exactly the bytes then waiting in the
/// pipe: a pipe still open after that is held by something outside the exec (a process that
/// opened `/proc/PID/fd/1` of one of its commands), which must not hold the exec open, and what
/// that writes is not the exec's output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipeLeft(Option<u64>);

impl PipeLeft {
    /// What `pipe` holds now, the reaper having ended (up to its end when the kernel cannot
    /// tell).
    pub fn buffered_in(pipe: &impl std::os::fd::AsFd) -> PipeLeft {
        PipeLeft(rustix::io::ioctl_fionread(pipe).ok())
    }

    /// The most to read next into a buffer of `capacity` bytes.
    pub fn most(self, capacity: usize) -> usize {
        self.0.map_or(capacity, |left| {
            capacity.min(usize::try_from(left).unwrap_or(usize::MAX))
        })
    }

    /// Counts `read` bytes off; whether the pipe is still to be read.
    pub fn consume(&mut self, read: usize) -> bool {
        match &mut self.0 {
            Some(left) => {
                *left = left.saturating_sub(read as u64);
                *left > 0
            }
            None => true,
        }
    }

    /// Whether nothing is left to read (the pipe can be closed without reading it again).
    pub fn is_done(self) -> bool {
        self.0 == Some(0)
    }
}

/// What the reaper said about its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The command is running.
    Started,
    /// The command could not be started.
    Failed {
        /// `not_found`, `permission_denied` or `other`.
        kind: String,
        /// Why.
        message: String,
    },
    /// The command exited.
    Exited(i32),
    /// The command was killed by a signal.
    Signalled(i32),
}

impl Report {
    /// Parses one control line from the reaper.
    pub fn parse(line: &str) -> Option<Report> {
        let line = line.trim_end();
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        Some(match word {
            "started" => Report::Started,
            "failed" => {
                let (kind, message) = rest.split_once(' ').unwrap_or((rest, ""));
                Report::Failed {
                    kind: kind.to_owned(),
                    message: message.to_owned(),
                }
            }
            "exited" => Report::Exited(rest.parse().ok()?),
            "signalled" => Report::Signalled(rest.parse().ok()?),
            _ => return None,
        })
    }
}

impl Report {
    /// What the reaper said, in words a person reads.
    fn in_words(&self) -> String {
        match self {
            Report::Started => "that the command started".to_owned(),
            Report::Failed { kind, message } => {
                format!("that the command could not start ({kind}): {message}")
            }
            Report::Exited(code) => format!("that the command exited {code}"),
            Report::Signalled(signal) => format!("that the command was killed by signal {signal}"),
        }
    }
}

/// Why a command's status is unknown when its reaper ended without reporting one, in words a
/// person reads: `ended` says how the reaper itself ended (e.g. `signal: 9 (SIGKILL)`), `last`
/// what it said after the start, if anything.
pub fn status_lost(ended: &str, last: Option<&Report>) -> String {
    let said = match last {
        None => "nothing after the start".to_owned(),
        Some(Report::Started) => "only that the command started".to_owned(),
        Some(report) => report.in_words(),
    };
    format!("the reaper ended ({ended}) without reporting the command's status; it said {said}")
}

/// Why it is not known whether `program` started, when the reaper's first report is neither
/// `started` nor `failed` (`first`: what it said instead, if anything), in words.
pub fn start_unconfirmed(program: &str, first: Option<&Report>) -> String {
    match first {
        None => format!(
            "the reaper ended before saying whether `{program}` started (its channel closed, or \
             it said something that is not a report)"
        ),
        Some(report) => format!(
            "the reaper said {} before saying whether `{program}` started",
            report.in_words()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_the_reaper_exactly_what_a_pipe_holds_is_read() {
        // While the exec runs: up to the pipe's end, a whole buffer at a time.
        let mut running = PipeLeft::default();
        assert_eq!(running.most(64), 64);
        assert!(running.consume(64));
        assert!(!running.is_done());

        let (reader, mut writer) = std::io::pipe().expect("pipe");
        std::io::Write::write_all(&mut writer, b"12345").expect("write");
        // `writer` stays open, as a holder outside the exec would keep it.
        let mut left = PipeLeft::buffered_in(&reader);
        assert_eq!(left.most(64), 5);
        assert_eq!(left.most(2), 2);
        assert!(left.consume(3));
        assert_eq!(left.most(64), 2);
        assert!(!left.consume(2));
        assert!(left.is_done());

        let (empty, _held) = std::io::pipe().expect("pipe");
        assert!(PipeLeft::buffered_in(&empty).is_done());
    }

    #[test]
    fn reports_round_trip() {
        assert_eq!(Report::parse("started\n"), Some(Report::Started));
        assert_eq!(Report::parse("exited 3"), Some(Report::Exited(3)));
        assert_eq!(Report::parse("signalled 9"), Some(Report::Signalled(9)));
        assert_eq!(
            Report::parse("failed not_found cannot start `x`: No such file"),
            Some(Report::Failed {
                kind: "not_found".into(),
                message: "cannot start `x`: No such file".into()
            })
        );
        assert_eq!(Report::parse("exited x"), None);
        assert_eq!(Report::parse("nonsense"), None);
    }

    /// A lost status reads as words, never as Rust's debug form.
    #[test]
    fn a_lost_status_is_said_in_words() {
        let text = status_lost("signal: 9 (SIGKILL)", None);
        assert_eq!(
            text,
            "the reaper ended (signal: 9 (SIGKILL)) without reporting the command's status; it \
             said nothing after the start"
        );
        let text = status_lost("exit status: 0", Some(&Report::Started));
        assert!(
            text.ends_with("it said only that the command started"),
            "{text}"
        );
        let unconfirmed = start_unconfirmed("true", None);
        assert!(
            unconfirmed.starts_with("the reaper ended before saying whether `true` started"),
            "{unconfirmed}"
        );
        for text in [
            text,
            status_lost("x", Some(&Report::Exited(3))),
            unconfirmed,
            start_unconfirmed("true", Some(&Report::Signalled(9))),
        ] {
            assert!(!text.contains("None") && !text.contains("Some("), "{text}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        #[test]
        fn report_lines_parse_or_refuse_never_panic(line in "\\PC{0,60}") {
            let _ = Report::parse(&line);
        }
    }
}
