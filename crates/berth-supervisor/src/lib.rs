//! The in-sandbox supervisor and its wire protocol.
//!
//! The supervisor runs inside a sandbox (as the container's main process, under an init that
//! reaps orphans) and listens on a Unix socket in a directory bind-mounted from the host, so
//! Berth reaches it without any network. Each connection carries one request; for `exec` the
//! supervisor starts the command in a new process group, streams its stdout and stderr as
//! frames, kills the whole group on timeout (SIGTERM, then SIGKILL after a grace period) and
//! when the command exits (nothing outlives an exec), and ends with one exit frame. If the
//! client goes away mid-exec, the group is killed.
//!
//! Wire format (version [`PROTOCOL_VERSION`]):
//! - request: one JSON line ([`Request`]);
//! - response: frames `[tag: u8][len: u32 big-endian][payload]` — [`TAG_STDOUT`] and
//!   [`TAG_STDERR`] carry raw bytes, [`TAG_EXIT`] carries a JSON [`Exit`] and ends the reply.
//!
//! This crate has no tokio: the server is threads and blocking I/O, to stay small. Clients
//! (the docker provider) speak the protocol with [`write_frame`]/[`read_frame`] semantics.

pub mod enter;
pub mod reaper;

/// The helper modes a Berth binary runs instead of its own `main` when its first argument
/// asks for one (`__reap`, `__reap_waiting`, `__reap_enter`, `__enter`, `__pty`); `None` for a
/// normal invocation. `berth` and `berth-supervisor` both call this first, so either can serve
/// as the helper.
pub fn helper_mode(args: &[std::ffi::OsString]) -> Option<i32> {
    let mode = args.get(1)?.to_str()?;
    if [
        reaper::REAP_ARG,
        reaper::REAP_WAITING_ARG,
        reaper::REAP_ENTER_ARG,
        enter::ENTER_ARG,
        pty::PTY_ARG,
    ]
    .contains(&mode)
    {
        default_signals_for_commands();
    }
    match mode {
        reaper::REAP_ARG => Some(reaper::run(&args[2..])),
        reaper::REAP_WAITING_ARG => Some(reaper::run_waiting()),
        reaper::REAP_ENTER_ARG => Some(reaper::run_entering(&args[2..])),
        enter::ENTER_ARG => Some(enter::run(&args[2..])),
        pty::PTY_ARG => Some(pty::run_child(&args[2..])),
        _ => None,
    }
}
pub mod forward;
pub mod pty;
pub mod server;

/// Every command a helper starts begins with the default signal dispositions and nothing
/// blocked, whatever Berth inherited. Started as a background job or under `nohup`, Berth has
/// SIGINT and SIGQUIT (or SIGHUP) ignored, and a command inheriting that cannot be
/// interrupted: Ctrl-C in a terminal session did nothing, since a shell cannot even trap a
/// signal ignored on entry, and a test that interrupts itself hung. An ignored signal is made
/// caught (into a flag nobody reads: for the helper itself still no effect), and `execve`
/// resets a caught signal to its default.
fn default_signals_for_commands() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let ignored = status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap_or(0);
    let unused = Arc::new(AtomicBool::new(false));
    for signal in 1..=64 {
        if ignored & (1u64 << (signal - 1)) != 0 {
            // Refused for the signals no handler may take (SIGKILL, SIGSTOP, faults) and the
            // C library's own: those stay as they are.
            let _ = signal_hook::flag::register(signal, unused.clone());
        }
    }
    let _ = nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    );
}

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Protocol version carried by every request. 2: requests other than ping are acknowledged
/// with a [`TAG_ACCEPTED`] frame before anything runs.
pub const PROTOCOL_VERSION: u32 = 2;
/// Frame tag: stdout bytes.
pub const TAG_STDOUT: u8 = 1;
/// Frame tag: stderr bytes.
pub const TAG_STDERR: u8 = 2;
/// Frame tag: the final exit record (JSON).
pub const TAG_EXIT: u8 = 3;
/// Frame tag (empty): the request was read and will run — sent first, before anything runs,
/// and only while the client is still connected. A client that gets no such frame in time (a
/// paused sandbox) hangs up, and the request then never runs.
pub const TAG_ACCEPTED: u8 = 4;
/// Frame tag (forwarding): a connection was made to the forwarded port; the payload is its id
/// (decimal ASCII), which an `attach` request claims. The first such frame on a `listen`
/// connection has an empty payload: the port is open.
pub const TAG_CONNECTION: u8 = 5;

/// Largest frame payload accepted.
pub const MAX_FRAME: u32 = 1 << 20;

/// One request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Liveness check; answered with an exit frame `{"status":"exited","code":0}`.
    Ping {
        /// Protocol version.
        v: u32,
    },
    /// Run a command.
    Exec {
        /// Protocol version.
        v: u32,
        /// Program and arguments.
        argv: Vec<String>,
        /// Working directory.
        cwd: String,
        /// The complete environment.
        env: BTreeMap<String, String>,
        /// Deadline in milliseconds.
        timeout_ms: Option<u64>,
        /// SIGTERM → SIGKILL grace in milliseconds.
        grace_ms: u64,
    },
    /// Start a detached process (its own process group) that outlives the connection. Its
    /// stdout and stderr go to `<log_dir>/<process>.out` and `.err`.
    Spawn {
        /// Protocol version.
        v: u32,
        /// Program and arguments.
        argv: Vec<String>,
        /// Working directory.
        cwd: String,
        /// The complete environment.
        env: BTreeMap<String, String>,
        /// Where output files go.
        log_dir: String,
        /// The most of each stream to keep (absent: [`MAX_KEPT_OUTPUT`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        keep: Option<u64>,
    },
    /// The state of a detached process.
    Status {
        /// Protocol version.
        v: u32,
        /// The handle from `Spawn`.
        process: String,
    },
    /// A piece of a detached process's output: [`TAG_STDOUT`] and [`TAG_STDERR`] frames of at
    /// most `max` bytes of each stream from its offset, then [`Exit::Output`] with each stream's
    /// size. Read from the files `Spawn` made (regular files only, never through a symlink).
    Output {
        /// Protocol version.
        v: u32,
        /// The handle from `Spawn`.
        process: String,
        /// Where `Spawn` put the output files.
        log_dir: String,
        /// Offset into stdout.
        stdout_from: u64,
        /// Offset into stderr.
        stderr_from: u64,
        /// The most bytes of each stream to send.
        max: u64,
    },
    /// Listen on `127.0.0.1:port` in the sandbox's network namespace while this connection
    /// stays open; each connection made to it is announced with a [`TAG_CONNECTION`] frame.
    Listen {
        /// Protocol version.
        v: u32,
        /// The port.
        port: u16,
    },
    /// Claim an announced connection: after the [`TAG_ACCEPTED`] frame, this connection carries
    /// its bytes unchanged, both ways, until either side closes.
    Attach {
        /// Protocol version.
        v: u32,
        /// The id from the [`TAG_CONNECTION`] frame.
        connection: u64,
    },
    /// Signal a detached process's whole group.
    Kill {
        /// Protocol version.
        v: u32,
        /// The handle from `Spawn`.
        process: String,
        /// The signal number.
        signal: i32,
    },
    /// Connect to `127.0.0.1:port` in the sandbox's network namespace (`berth port`): after the
    /// [`TAG_ACCEPTED`] frame, an empty [`TAG_CONNECTION`] frame says it is connected, and from
    /// then on this connection carries that connection's bytes unchanged, both ways. A refusal
    /// is an exit frame instead.
    Connect {
        /// Protocol version.
        v: u32,
        /// The port.
        port: u16,
    },
    /// Run a command on a new pseudo-terminal (`berth ssh`): see [`pty`] for the frames that
    /// follow the [`TAG_ACCEPTED`] frame.
    Pty {
        /// Protocol version.
        v: u32,
        /// Program and arguments.
        argv: Vec<String>,
        /// Working directory.
        cwd: String,
        /// The complete environment.
        env: BTreeMap<String, String>,
        /// Window width.
        cols: u16,
        /// Window height.
        rows: u16,
    },
}

/// How a command ended, as the supervisor saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Exit {
    /// Exited with a code.
    Exited {
        /// The code.
        code: i32,
    },
    /// Killed by a signal (not the timeout).
    Signalled {
        /// The signal.
        signal: i32,
    },
    /// The deadline passed and the group was killed.
    TimedOut,
    /// The command could not be started.
    SpawnFailed {
        /// `not_found`, `permission_denied` or `other`.
        kind: String,
        /// The OS error.
        message: String,
    },
    /// The command ran, but how it ended is not known (the reaper was killed before it
    /// reported). Never guessed.
    Unknown {
        /// Why.
        reason: String,
    },
    /// The request was malformed.
    BadRequest {
        /// What was wrong.
        message: String,
    },
    /// A detached process was started.
    Started {
        /// Its handle.
        process: String,
    },
    /// A detached process is still running.
    Running,
    /// No detached process has this handle (never started, or the supervisor restarted).
    UnknownProcess {
        /// The handle asked about.
        process: String,
    },
    /// The end of an `Output` reply: how many bytes each stream held when it was read, and how
    /// many the process wrote to it beyond what is kept (`Spawn`'s `keep`, by default
    /// [`MAX_KEPT_OUTPUT`]), dropped; absent when this supervisor did not start the process, so
    /// it cannot say.
    Output {
        /// Stdout's size.
        stdout_size: u64,
        /// Stderr's size.
        stderr_size: u64,
        /// Stdout's bytes dropped.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stdout_dropped: Option<u64>,
        /// Stderr's bytes dropped.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stderr_dropped: Option<u64>,
    },
}

/// The most of each stream of a detached process the supervisor keeps (in its output file):
/// what the process writes beyond it is read and dropped, and counted ([`Exit::Output`]), so
/// a process that never stops writing cannot fill the sandbox's disk — for a container, the
/// host's.
pub const MAX_KEPT_OUTPUT: u64 = 1 << 30;

/// What a process can be a member of, by the id of the process that leads it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Joined {
    /// A process group.
    Group,
    /// A session.
    Session,
}

/// The processes other than `id` itself (zombies included) whose process group or session is
/// `id`, from `/proc/*/stat`.
pub(crate) fn members(of: Joined, id: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    // After the parenthesised name (which may hold anything, `)` included): state, ppid, pgrp,
    // session.
    let field = match of {
        Joined::Group => 2,
        Joined::Session => 3,
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != id)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(field)?.parse::<i32>().ok()
                })
                == Some(id)
        })
        .collect()
}

/// Whether `handle` is a detached process handle as the supervisor makes them (`p1`, `p2`, …):
/// a short plain name, so no handle ever reaches a path as anything else.
pub fn process_handle_ok(handle: &str) -> bool {
    !handle.is_empty()
        && handle.len() <= 32
        && handle
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Bytes before a frame's payload: its tag, then the payload's length (big-endian `u32`).
pub const FRAME_HEADER: usize = 5;

/// The header of a frame carrying `len` payload bytes under `tag`.
pub fn frame_header(tag: u8, len: usize) -> io::Result<[u8; FRAME_HEADER]> {
    let len = u32::try_from(len).map_err(|_| io::Error::other("frame too large"))?;
    let mut header = [0u8; FRAME_HEADER];
    header[0] = tag;
    header[1..].copy_from_slice(&len.to_be_bytes());
    Ok(header)
}

/// A frame header's tag and payload length, refusing a payload over [`MAX_FRAME`]. The one
/// decoder of the frame format: the blocking reader below and the docker adapter's async client
/// both go through it.
pub fn parse_frame_header(header: &[u8; FRAME_HEADER]) -> io::Result<(u8, usize)> {
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the limit"),
        ));
    }
    Ok((header[0], len as usize))
}

/// Writes one frame.
pub fn write_frame(out: &mut impl Write, tag: u8, payload: &[u8]) -> io::Result<()> {
    out.write_all(&frame_header(tag, payload.len())?)?;
    out.write_all(payload)
}

/// Reads one frame; `None` at a clean end of stream.
pub fn read_frame(input: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut header = [0u8; FRAME_HEADER];
    match input.read_exact(&mut header) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(err) => return Err(err),
    }
    let (tag, len) = parse_frame_header(&header)?;
    let mut payload = vec![0u8; len];
    input.read_exact(&mut payload)?;
    Ok(Some((tag, payload)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, TAG_STDOUT, b"hello").unwrap();
        write_frame(&mut buf, TAG_EXIT, b"{}").unwrap();
        let mut input = &buf[..];
        assert_eq!(
            read_frame(&mut input).unwrap(),
            Some((TAG_STDOUT, b"hello".to_vec()))
        );
        assert_eq!(
            read_frame(&mut input).unwrap(),
            Some((TAG_EXIT, b"{}".to_vec()))
        );
        assert_eq!(read_frame(&mut input).unwrap(), None);
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut buf = vec![TAG_STDOUT];
        buf.extend_from_slice(&(MAX_FRAME + 1).to_be_bytes());
        assert!(read_frame(&mut &buf[..]).is_err());
    }
}
