//! Interactive terminals: a command on a fresh pseudo-terminal, its screen streamed to the
//! host and the host's keystrokes and window size streamed back (`berth ssh`).
//!
//! After the [`TAG_ACCEPTED`](crate::TAG_ACCEPTED) frame a `pty` connection carries frames both
//! ways: to the host [`TAG_STDOUT`] (what the terminal shows) and finally one
//! [`TAG_EXIT`](crate::TAG_EXIT); from the host [`TAG_STDIN`] (keystrokes; an empty payload
//! hangs up) and [`TAG_RESIZE`] (`cols`, `rows` as two big-endian `u16`). Ctrl-C is a byte like
//! any other: the terminal's line discipline inside the sandbox turns it into SIGINT for the
//! sandbox's foreground process — never for Berth.
//!
//! The command runs through the [`PTY_ARG`] helper mode (of the supervisor, or of `berth`
//! itself on the host), which makes itself a session leader and takes the terminal as its
//! controlling terminal before it executes the command: safe code cannot do that between
//! `fork` and `exec`. When the command exits, or the host hangs up, its process group gets
//! SIGHUP and, after a grace period, SIGKILL.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::termios::Winsize;

use crate::{read_frame, write_frame, Exit, TAG_STDOUT};

/// The argument that selects the terminal helper mode in the binaries that embed it.
pub const PTY_ARG: &str = "__pty";
/// Frame tag, host → sandbox: keystrokes for the terminal; an empty payload hangs up.
pub const TAG_STDIN: u8 = 6;
/// Frame tag, host → sandbox: the window size, `cols` then `rows`, big-endian `u16` each.
pub const TAG_RESIZE: u8 = 7;

/// How long a hung-up session's process group has between SIGHUP and SIGKILL.
const HANGUP_GRACE: Duration = Duration::from_millis(500);

/// How long the screen is drained after the command exits (a process it left in the
/// background may hold the terminal open; it is killed with the group, but is not waited for).
const DRAIN: Duration = Duration::from_millis(500);

/// A resize payload.
pub fn resize_payload(cols: u16, rows: u16) -> [u8; 4] {
    let (c, r) = (cols.to_be_bytes(), rows.to_be_bytes());
    [c[0], c[1], r[0], r[1]]
}

fn winsize(cols: u16, rows: u16) -> Winsize {
    Winsize {
        ws_row: rows.max(1),
        ws_col: cols.max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// The helper mode: become a session leader, take standard input (the terminal) as the
/// controlling terminal, execute `PROGRAM ARGS…`. Returns only on failure: 127 when the
/// program does not exist, 126 otherwise — a shell's codes, shown on the terminal itself.
pub fn run_child(args: &[OsString]) -> i32 {
    let Some((program, rest)) = args.split_first() else {
        eprintln!("berth: nothing to run on the terminal");
        return 126;
    };
    if let Err(err) = rustix::process::setsid() {
        eprintln!("berth: cannot start a terminal session: {err}");
        return 126;
    }
    if let Err(err) = rustix::process::ioctl_tiocsctty(io::stdin()) {
        eprintln!("berth: cannot take the terminal: {err}");
        return 126;
    }
    let err = Command::new(program).args(rest).exec();
    eprintln!("berth: cannot run {}: {err}", program.to_string_lossy());
    if err.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// A new pseudo-terminal: (controlling side, terminal side).
fn open_terminal(cols: u16, rows: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::fs::{Mode, OFlags};
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let controller = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&controller)?;
    unlockpt(&controller)?;
    let name = ptsname(&controller, Vec::new())?;
    let terminal = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::termios::tcsetwinsize(&controller, winsize(cols, rows))?;
    Ok((controller, terminal))
}

/// What a terminal session runs.
#[derive(Debug, Clone)]
pub struct Session<'a> {
    /// The binary that has the [`PTY_ARG`] helper mode.
    pub helper: &'a Path,
    /// Program and arguments.
    pub argv: &'a [String],
    /// Working directory.
    pub cwd: &'a str,
    /// The complete environment.
    pub env: &'a BTreeMap<String, String>,
    /// Initial window size.
    pub cols: u16,
    /// Initial window size.
    pub rows: u16,
}

/// Runs one terminal session over `client` (already accepted); returns how the command ended,
/// for the caller's exit frame. `out` is the writing half shared with that frame.
pub fn serve(client: &UnixStream, out: &Arc<Mutex<UnixStream>>, session: &Session<'_>) -> Exit {
    if session.argv.is_empty() {
        return Exit::BadRequest {
            message: "empty argv: nothing to run".into(),
        };
    }
    let (controller, terminal) = match open_terminal(session.cols, session.rows) {
        Ok(pair) => pair,
        Err(err) => {
            return Exit::SpawnFailed {
                kind: "other".into(),
                message: format!("cannot open a terminal: {err}"),
            }
        }
    };
    let stdio = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
    let child = (|| {
        Command::new(session.helper)
            .arg(PTY_ARG)
            .args(session.argv)
            .current_dir(session.cwd)
            .env_clear()
            .envs(session.env)
            .stdin(stdio(&terminal)?)
            .stdout(stdio(&terminal)?)
            .stderr(stdio(&terminal)?)
            .spawn()
    })();
    // Only the command holds the terminal side now: when it (and what it started) is gone,
    // reading the controlling side ends.
    drop(terminal);
    let mut child = match child {
        Ok(child) => child,
        // Berth's own helper failed to start, not the user's command (the helper reports that
        // one on the terminal, 127 or 126): never `not_found`, which would say the command was
        // missing.
        Err(err) => {
            return Exit::SpawnFailed {
                kind: "other".into(),
                message: format!("cannot start the terminal helper: {err}"),
            }
        }
    };
    // The helper called setsid: its process group is its pid. The group is signalled only
    // while the command is unreaped (a zombie keeps its pid, so the id names no one else).
    let group = Pid::from_raw(child.id() as i32);
    let reaped = Arc::new(Mutex::new(false));
    let signal_group = {
        let reaped = reaped.clone();
        move |signal: Signal| {
            let reaped = reaped.lock().unwrap_or_else(|p| p.into_inner());
            if !*reaped {
                let _ = killpg(group, signal);
                // Job-control shells put each job in a group of its own; the session holds
                // them all (a process that starts a session of its own leaves it).
                for member in crate::members(crate::Joined::Session, group.as_raw()) {
                    let _ = nix::sys::signal::kill(Pid::from_raw(member), signal);
                }
            }
        }
    };
    let finished = Arc::new(AtomicBool::new(false));
    let screen = {
        let (controller, out, finished) = (controller.try_clone(), out.clone(), finished.clone());
        std::thread::spawn(move || {
            if let Ok(controller) = controller {
                copy_screen(&controller, &out, &finished);
            }
        })
    };
    {
        let client = client.try_clone();
        let controller = controller.try_clone();
        let signal_group = signal_group.clone();
        std::thread::spawn(move || {
            if let (Ok(client), Ok(controller)) = (client, controller) {
                copy_keys(&client, &controller);
            }
            // The host hung up (or asked to): the session ends. After the command has ended
            // this finds it reaped and does nothing.
            signal_group(Signal::SIGHUP);
            std::thread::sleep(HANGUP_GRACE);
            signal_group(Signal::SIGKILL);
        });
    }
    // Wait without reaping, end what the command left in its group, then reap.
    let _ = waitid(Id::Pid(group), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT);
    signal_group(Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(20));
    signal_group(Signal::SIGKILL);
    let status = {
        let mut reaped = reaped.lock().unwrap_or_else(|p| p.into_inner());
        *reaped = true;
        child.wait()
    };
    finished.store(true, Ordering::SeqCst);
    let _ = screen.join();
    drop(controller);
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Exited { code },
            (None, Some(signal)) => Exit::Signalled { signal },
            (None, None) => Exit::Unknown {
                reason: "the terminal's command ended without a code or a signal".into(),
            },
        },
        Err(err) => Exit::Unknown {
            reason: format!("cannot wait for the terminal's command: {err}"),
        },
    }
}

/// Terminal output → [`TAG_STDOUT`] frames, until the terminal closes, or `finished` is set
/// and nothing more arrives within [`DRAIN`].
fn copy_screen(controller: &OwnedFd, out: &Mutex<UnixStream>, finished: &AtomicBool) {
    let mut buf = vec![0u8; 16 << 10];
    let mut quiet_since: Option<std::time::Instant> = None;
    loop {
        let mut fds = [PollFd::new(controller, PollFlags::IN)];
        let tick = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        match poll(&mut fds, Some(&tick)) {
            Ok(0) => {
                if finished.load(Ordering::SeqCst) {
                    let since = *quiet_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() >= DRAIN {
                        return;
                    }
                }
                continue;
            }
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
        match rustix::io::read(controller, &mut buf) {
            Ok(0) => return,
            Ok(n) => {
                quiet_since = None;
                let mut writer = out.lock().unwrap_or_else(|p| p.into_inner());
                if write_frame(&mut *writer, TAG_STDOUT, &buf[..n]).is_err() {
                    return;
                }
            }
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
            // EIO: every terminal side is closed — the session is over.
            Err(_) => return,
        }
    }
}

/// Host frames → the terminal, until the host hangs up or sends an empty [`TAG_STDIN`].
fn copy_keys(client: &UnixStream, controller: &OwnedFd) {
    let mut input = client;
    loop {
        match read_frame(&mut input) {
            Ok(Some((TAG_STDIN, bytes))) if bytes.is_empty() => return,
            Ok(Some((TAG_STDIN, bytes))) => {
                let mut rest = &bytes[..];
                while !rest.is_empty() {
                    match rustix::io::write(controller, rest) {
                        Ok(n) => rest = &rest[n..],
                        Err(rustix::io::Errno::INTR) => {}
                        Err(_) => return,
                    }
                }
            }
            Ok(Some((TAG_RESIZE, size))) if size.len() == 4 => {
                let cols = u16::from_be_bytes([size[0], size[1]]);
                let rows = u16::from_be_bytes([size[2], size[3]]);
                let _ = rustix::termios::tcsetwinsize(controller.as_fd(), winsize(cols, rows));
            }
            // Unknown frames are ignored (a newer host); a broken stream ends the session.
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return,
        }
    }
}

/// The host side, blocking: sends keystrokes and sizes, reads the screen. `berth ssh` drives
/// one of these per session over the stream a provider's `open_pty` returned.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
}

/// What the sandbox's terminal sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Screen {
    /// Bytes to show.
    Output(Vec<u8>),
    /// The session ended.
    Ended(Exit),
}

impl Client {
    /// Wraps an accepted `pty` stream.
    pub fn new(stream: UnixStream) -> Self {
        Client { stream }
    }

    /// A second handle on the same session (one thread types while another reads).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Client {
            stream: self.stream.try_clone()?,
        })
    }

    /// Sends keystrokes (an empty slice is ignored: hanging up is [`Client::hang_up`]).
    pub fn send(&self, keys: &[u8]) -> io::Result<()> {
        for chunk in keys.chunks(32 << 10) {
            write_frame(&mut &self.stream, TAG_STDIN, chunk)?;
        }
        Ok(())
    }

    /// Sends the window size.
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        write_frame(&mut &self.stream, TAG_RESIZE, &resize_payload(cols, rows))
    }

    /// Ends the session from the host's side.
    pub fn hang_up(&self) -> io::Result<()> {
        write_frame(&mut &self.stream, TAG_STDIN, &[])
    }

    /// The next thing the terminal sent. A stream that ends without an exit frame is an error:
    /// how the session ended is then not known.
    pub fn next(&self) -> io::Result<Screen> {
        match read_frame(&mut &self.stream)? {
            Some((TAG_STDOUT, bytes)) => Ok(Screen::Output(bytes)),
            Some((crate::TAG_EXIT, payload)) => serde_json::from_slice(&payload)
                .map(Screen::Ended)
                .map_err(|e| io::Error::other(format!("unreadable exit frame: {e}"))),
            Some((tag, _)) => Err(io::Error::other(format!(
                "unexpected frame {tag} from a terminal session"
            ))),
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the terminal session ended without saying how",
            )),
        }
    }
}

/// Runs a terminal session on this machine for a caller in the same process (the host
/// provider): a socket pair, the session served on a thread at one end, the other end
/// returned — the same stream a supervisor in a container gives.
pub fn serve_local(
    helper: &Path,
    argv: Vec<String>,
    cwd: String,
    env: BTreeMap<String, String>,
    cols: u16,
    rows: u16,
) -> io::Result<UnixStream> {
    let (host, sandbox) = UnixStream::pair()?;
    let helper = helper.to_path_buf();
    std::thread::spawn(move || {
        let out = match sandbox.try_clone() {
            Ok(out) => Arc::new(Mutex::new(out)),
            Err(_) => return,
        };
        let session = Session {
            helper: &helper,
            argv: &argv,
            cwd: &cwd,
            env: &env,
            cols,
            rows,
        };
        let exit = serve(&sandbox, &out, &session);
        let payload = serde_json::to_vec(&exit).expect("exit serializes");
        let mut writer = out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = write_frame(&mut *writer, crate::TAG_EXIT, &payload);
        let _ = sandbox.shutdown(std::net::Shutdown::Both);
    });
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_payload_is_cols_then_rows() {
        assert_eq!(resize_payload(0x0102, 0x0304), [1, 2, 3, 4]);
    }

    #[test]
    fn an_empty_argv_is_a_bad_request() {
        let (a, b) = UnixStream::pair().unwrap();
        let out = Arc::new(Mutex::new(b.try_clone().unwrap()));
        let env = BTreeMap::new();
        let exit = serve(
            &a,
            &out,
            &Session {
                helper: Path::new("/bin/true"),
                argv: &[],
                cwd: "/",
                env: &env,
                cols: 80,
                rows: 24,
            },
        );
        assert!(matches!(exit, Exit::BadRequest { .. }), "{exit:?}");
    }

    /// Berth's own helper missing is Berth's failure (`other`), not the user's command missing
    /// (`not_found`, which the CLI turns into exit 127 "command not found").
    #[test]
    fn a_missing_terminal_helper_is_not_a_missing_command() {
        let (a, b) = UnixStream::pair().unwrap();
        let out = Arc::new(Mutex::new(b.try_clone().unwrap()));
        let env = BTreeMap::new();
        let argv = ["true".to_owned()];
        let exit = serve(
            &a,
            &out,
            &Session {
                helper: Path::new("/nonexistent/berth-helper"),
                argv: &argv,
                cwd: "/",
                env: &env,
                cols: 80,
                rows: 24,
            },
        );
        match exit {
            Exit::SpawnFailed { kind, message } => {
                assert_eq!(kind, "other", "{message}");
                assert!(message.contains("terminal helper"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
