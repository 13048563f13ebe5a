//! The real supervisor binary on a real Unix socket.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use berth_supervisor::{
    read_frame, Exit, Request, PROTOCOL_VERSION, TAG_ACCEPTED, TAG_EXIT, TAG_STDERR, TAG_STDOUT,
};

struct Server {
    child: Child,
    socket: PathBuf,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server() -> Server {
    let dir = tempfile::Builder::new()
        .prefix("berth-test-supervisor-")
        .tempdir()
        .unwrap();
    let socket = dir.path().join("s.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_berth-supervisor"))
        .args(["serve", "--socket"])
        .arg(&socket)
        .spawn()
        .unwrap();
    // Ready when it accepts a connection: the socket file appears at bind(), before listen(),
    // and a connect in between is refused (seen under load).
    let until = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(&socket).is_err() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    Server { child, socket, dir }
}

struct Reply {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Exit,
}

fn send(socket: &Path, request: &Request) -> UnixStream {
    let mut stream = UnixStream::connect(socket).unwrap();
    let mut line = serde_json::to_vec(request).unwrap();
    line.push(b'\n');
    stream.write_all(&line).unwrap();
    stream
}

fn read_reply(mut stream: UnixStream) -> Reply {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut first = true;
    loop {
        let (tag, payload) = read_frame(&mut stream)
            .unwrap()
            .expect("exit frame before EOF");
        // Every acting request is acknowledged first (or refused outright).
        assert!(
            !first || matches!(tag, TAG_ACCEPTED | TAG_EXIT),
            "first frame {tag}"
        );
        first = false;
        match tag {
            TAG_ACCEPTED => assert!(payload.is_empty()),
            TAG_STDOUT => stdout.extend(payload),
            TAG_STDERR => stderr.extend(payload),
            TAG_EXIT => {
                return Reply {
                    stdout,
                    stderr,
                    exit: serde_json::from_slice(&payload).unwrap(),
                }
            }
            other => panic!("unknown tag {other}"),
        }
    }
}

fn exec(dir: &Path, line: &str, timeout_ms: Option<u64>) -> Request {
    Request::Exec {
        v: PROTOCOL_VERSION,
        argv: vec!["/bin/sh".into(), "-c".into(), line.into()],
        cwd: dir.to_string_lossy().into_owned(),
        env: BTreeMap::from([
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("GIVEN".into(), "yes".into()),
        ]),
        timeout_ms,
        grace_ms: 200,
    }
}

fn gone(pid: i32) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if gone_now(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Whether `pid` is gone or a zombie, now.
fn gone_now(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

/// A request to start `line` (with `sh -c`) detached, its output under `procs/` in the
/// server's directory, keeping `keep` of each stream (the supervisor's default when `None`).
fn spawn_request(s: &Server, line: &str, keep: Option<u64>) -> Request {
    Request::Spawn {
        v: PROTOCOL_VERSION,
        argv: vec!["/bin/sh".into(), "-c".into(), line.into()],
        cwd: s.dir.path().to_string_lossy().into_owned(),
        env: BTreeMap::from([("PATH".into(), "/usr/bin:/bin".into())]),
        log_dir: s.dir.path().join("procs").to_string_lossy().into_owned(),
        keep,
    }
}

#[test]
fn ping_and_exec_with_separate_streams_and_exact_env() {
    let s = server();
    let reply = read_reply(send(
        &s.socket,
        &Request::Ping {
            v: PROTOCOL_VERSION,
        },
    ));
    assert_eq!(reply.exit, Exit::Exited { code: 0 });
    let reply = read_reply(send(
        &s.socket,
        &exec(
            s.dir.path(),
            "echo out; echo err >&2; env | sort; exit 7",
            None,
        ),
    ));
    assert_eq!(reply.exit, Exit::Exited { code: 7 });
    assert_eq!(String::from_utf8_lossy(&reply.stderr), "err\n");
    let stdout = String::from_utf8_lossy(&reply.stdout);
    assert!(
        stdout.starts_with("out\nGIVEN=yes\nPATH=/usr/bin:/bin\n"),
        "{stdout}"
    );
    let signalled = read_reply(send(&s.socket, &exec(s.dir.path(), "kill -9 $$", None)));
    assert_eq!(signalled.exit, Exit::Signalled { signal: 9 });
}

#[test]
fn timeout_kills_the_group_even_when_sigterm_is_ignored() {
    let s = server();
    let started = Instant::now();
    let line = "trap '' TERM; sleep 30 & echo $! > child.pid; sleep 30";
    let reply = read_reply(send(&s.socket, &exec(s.dir.path(), line, Some(300))));
    assert_eq!(reply.exit, Exit::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(10));
    let pid: i32 = std::fs::read_to_string(s.dir.path().join("child.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(gone(pid), "child {pid} survived");
}

/// The pid a command wrote to `pidfile` (`echo $$ > FILE`), once it has (at most 5 s).
fn wait_for_pid(pidfile: &Path) -> i32 {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(pid) = std::fs::read_to_string(pidfile)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            return pid;
        }
        assert!(Instant::now() < until, "command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_client_that_hangs_up_takes_its_command_with_it() {
    let s = server();
    let stream = send(
        &s.socket,
        &exec(s.dir.path(), "echo $$ > leader.pid; sleep 60", None),
    );
    let pid = wait_for_pid(&s.dir.path().join("leader.pid"));
    drop(stream);
    assert!(gone(pid), "command {pid} outlived its client");
}

#[test]
fn spawn_failures_and_bad_requests_are_reported_not_fabricated() {
    let s = server();
    let missing = Request::Exec {
        v: PROTOCOL_VERSION,
        argv: vec!["/no/such/program".into()],
        cwd: "/".into(),
        env: BTreeMap::new(),
        timeout_ms: None,
        grace_ms: 0,
    };
    match read_reply(send(&s.socket, &missing)).exit {
        Exit::SpawnFailed { kind, .. } => assert_eq!(kind, "not_found"),
        other => panic!("{other:?}"),
    }
    let mut stream = UnixStream::connect(&s.socket).unwrap();
    stream.write_all(b"{not json\n").unwrap();
    assert!(matches!(read_reply(stream).exit, Exit::BadRequest { .. }));
    let future = Request::Ping { v: 99 };
    assert!(matches!(
        read_reply(send(&s.socket, &future)).exit,
        Exit::BadRequest { .. }
    ));
}

/// The reaper enters the working directory itself (so the supervisor can spawn it without
/// copying itself): the command runs there, and a directory it cannot enter is said as a start
/// failure naming the directory — the command never runs.
#[test]
fn the_command_runs_in_its_directory_and_a_bad_one_is_a_start_failure() {
    let s = server();
    let inner = s.dir.path().join("in ner");
    std::fs::create_dir(&inner).unwrap();
    let reply = read_reply(send(&s.socket, &exec(&inner, "pwd; touch ran", None)));
    assert_eq!(reply.exit, Exit::Exited { code: 0 });
    assert_eq!(
        String::from_utf8_lossy(&reply.stdout),
        format!("{}\n", inner.display())
    );
    let file = s.dir.path().join("plain");
    std::fs::write(&file, "x").unwrap();
    for (dir, want) in [(s.dir.path().join("missing"), "not_found"), (file, "other")] {
        let marker = s.dir.path().join("should-not-exist");
        let line = format!("touch '{}'", marker.display());
        match read_reply(send(&s.socket, &exec(&dir, &line, None))).exit {
            Exit::SpawnFailed { kind, message } => {
                assert_eq!(kind, want, "{message}");
                assert!(
                    message.contains(&format!("in `{}`", dir.display())),
                    "{message}"
                );
            }
            other => panic!("{}: {other:?}", dir.display()),
        }
        assert!(!marker.exists(), "the command ran in {}", dir.display());
    }
}

/// Anything in a sandbox running as the command's user can open `/proc/PID/fd/1` of a command
/// and so hold the exec's output pipe open after every process of the exec is gone. That must
/// not hold the exec open: once the reaper has ended, what is in the pipes is relayed and the
/// exit is sent (before, the exec waited for the pipe's end for as long as the holder lived).
#[test]
fn a_process_outside_the_exec_holding_its_output_pipe_cannot_hold_the_exec_open() {
    let s = server();
    let stream = send(
        &s.socket,
        &exec(
            s.dir.path(),
            "echo before; echo $$ > cmd.pid; sleep 0.5; echo after",
            None,
        ),
    );
    let pid = wait_for_pid(&s.dir.path().join("cmd.pid"));
    let held = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/fd/1"))
        .unwrap();
    // Past this, the exec is being held open: the read fails instead of waiting forever.
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let reply = read_reply(stream);
    assert_eq!(reply.exit, Exit::Exited { code: 0 });
    assert_eq!(String::from_utf8_lossy(&reply.stdout), "before\nafter\n");
    drop(held);
}

#[test]
fn large_output_arrives_whole() {
    let s = server();
    let reply = read_reply(send(
        &s.socket,
        &exec(s.dir.path(), "head -c 5000000 /dev/zero", None),
    ));
    assert_eq!(reply.exit, Exit::Exited { code: 0 });
    assert_eq!(reply.stdout.len(), 5_000_000);
    // A client that reads late: the command ends with its last output still in the pipes, and
    // all of it arrives, to the last byte of each stream.
    let stream = send(
        &s.socket,
        &exec(
            s.dir.path(),
            "head -c 3000000 /dev/zero; echo end; head -c 200000 /dev/zero >&2; echo err-end >&2",
            None,
        ),
    );
    std::thread::sleep(Duration::from_millis(500));
    let reply = read_reply(stream);
    assert_eq!(reply.exit, Exit::Exited { code: 0 });
    assert_eq!(reply.stdout.len(), 3_000_004);
    assert!(reply.stdout.ends_with(b"\0end\n"));
    assert_eq!(reply.stderr.len(), 200_008);
    assert!(reply.stderr.ends_with(b"\0err-end\n"));
}

fn detached(s: &Server, request: Request) -> Exit {
    read_reply(send(&s.socket, &request)).exit
}

fn wait_status(s: &Server, process: &str, want: &Exit) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let got = detached(
            s,
            Request::Status {
                v: PROTOCOL_VERSION,
                process: process.into(),
            },
        );
        if &got == want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn detached_processes_outlive_their_connection_and_can_be_killed() {
    let s = server();
    let logs = s.dir.path().join("procs");
    let spawn = |line: &str| spawn_request(&s, line, None);
    let Exit::Started { process: sleeper } = detached(&s, spawn("echo up; sleep 60 & sleep 60"))
    else {
        panic!("not started")
    };
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        detached(
            &s,
            Request::Status {
                v: PROTOCOL_VERSION,
                process: sleeper.clone()
            }
        ),
        Exit::Running
    );
    assert_eq!(
        std::fs::read_to_string(logs.join(format!("{sleeper}.out"))).unwrap(),
        "up\n"
    );
    let kill = || Request::Kill {
        v: PROTOCOL_VERSION,
        process: sleeper.clone(),
        signal: 9,
    };
    assert_eq!(detached(&s, kill()), Exit::Exited { code: 0 });
    assert!(wait_status(&s, &sleeper, &Exit::Signalled { signal: 9 }));
    assert_eq!(
        detached(&s, kill()),
        Exit::Exited { code: 0 },
        "kill is idempotent"
    );

    let Exit::Started { process: quick } = detached(&s, spawn("echo bad >&2; exit 3")) else {
        panic!("not started")
    };
    assert!(wait_status(&s, &quick, &Exit::Exited { code: 3 }));
    assert_eq!(
        std::fs::read_to_string(logs.join(format!("{quick}.err"))).unwrap(),
        "bad\n"
    );
    assert_eq!(
        detached(
            &s,
            Request::Status {
                v: PROTOCOL_VERSION,
                process: "p999".into()
            }
        ),
        Exit::UnknownProcess {
            process: "p999".into()
        }
    );
}

/// A detached process's output is read in bounded pieces from any offset, with each stream's
/// size; what the sandbox plants in place of its output files (a symlink, a FIFO) is refused,
/// never followed or waited on, and a handle is never a path.
#[test]
fn detached_output_is_read_in_bounded_pieces_and_never_through_what_the_sandbox_plants() {
    let s = server();
    let logs = s.dir.path().join("procs");
    let spawn = spawn_request(
        &s,
        "head -c 3000000 /dev/zero | tr '\\0' a; echo oops >&2",
        None,
    );
    let Exit::Started { process } = detached(&s, spawn) else {
        panic!("not started")
    };
    assert!(wait_status(&s, &process, &Exit::Exited { code: 0 }));
    let output = |process: &str, from: [u64; 2], max: u64| {
        read_reply(send(
            &s.socket,
            &Request::Output {
                v: PROTOCOL_VERSION,
                process: process.into(),
                log_dir: logs.to_string_lossy().into_owned(),
                stdout_from: from[0],
                stderr_from: from[1],
                max,
            },
        ))
    };
    let sizes = Exit::Output {
        stdout_size: 3_000_000,
        stderr_size: 5,
        stdout_dropped: Some(0),
        stderr_dropped: Some(0),
    };
    // Every piece is what the file holds there, and no more than asked.
    let mut whole = Vec::new();
    loop {
        let reply = output(&process, [whole.len() as u64, 0], 1_000_000);
        assert_eq!(reply.exit, sizes);
        assert!(reply.stdout.len() <= 1_000_000);
        if reply.stdout.is_empty() {
            break;
        }
        whole.extend(reply.stdout);
    }
    assert_eq!(whole.len(), 3_000_000);
    assert!(whole.iter().all(|b| *b == b'a'));
    let tail = output(&process, [2_999_998, 2], 100);
    assert_eq!(
        (tail.stdout, tail.stderr, tail.exit),
        (b"aa".to_vec(), b"ps\n".to_vec(), sizes.clone())
    );
    // Past the end: nothing, and the sizes say so (a reader that was further on sees it shrank).
    let past = output(&process, [9_000_000, 9], 100);
    assert!(past.stdout.is_empty() && past.stderr.is_empty());
    assert_eq!(past.exit, sizes);
    // However much is asked, one reply carries at most 4 MiB of a stream.
    let big = output(&process, [0, 0], u64::MAX);
    assert_eq!(big.stdout.len(), 3_000_000);

    // Planted by the sandbox: a symlink to a file outside, and a FIFO with no writer.
    let secret = s.dir.path().join("secret");
    std::fs::write(&secret, b"host secret").unwrap();
    std::fs::remove_file(logs.join(format!("{process}.out"))).unwrap();
    std::os::unix::fs::symlink(&secret, logs.join(format!("{process}.out"))).unwrap();
    let linked = output(&process, [0, 0], 100);
    assert!(linked.stdout.is_empty(), "read through a symlink");
    assert!(
        matches!(&linked.exit, Exit::Unknown { reason } if reason.contains("cannot read")),
        "{:?}",
        linked.exit
    );
    std::fs::remove_file(logs.join(format!("{process}.out"))).unwrap();
    let fifo = logs.join(format!("{process}.out"));
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let started = Instant::now();
    let piped = output(&process, [0, 0], 100);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited on a FIFO"
    );
    assert!(
        matches!(&piped.exit, Exit::Unknown { reason } if reason.contains("not a regular file")),
        "{:?}",
        piped.exit
    );
    // A handle is a plain name, never a path; an unknown one is said as such.
    for hostile in ["../secret", "/etc/passwd", "", "p1/../../x"] {
        assert!(
            matches!(output(hostile, [0, 0], 100).exit, Exit::BadRequest { .. }),
            "{hostile:?}"
        );
    }
    assert_eq!(
        output("p999", [0, 0], 100).exit,
        Exit::UnknownProcess {
            process: "p999".into()
        }
    );
}

/// A detached process that writes without end fills no disk: the supervisor keeps the first
/// `keep` bytes of each stream (`MAX_KEPT_OUTPUT` unless asked) and reads and counts the rest,
/// never making the process wait. Before, its output file grew as fast as it wrote (a detached
/// `yes` filled the 22 GB left on the host's disk in about ten seconds). Finished still means its output is all there, and a descendant holding its pipes
/// open does not keep it from finishing.
#[test]
fn a_detached_process_writing_without_end_keeps_a_bounded_file() {
    let s = server();
    let logs = s.dir.path().join("procs");
    // Kept: 8 MiB here (a docker sandbox keeps `MAX_KEPT_OUTPUT`, 1 GiB).
    let keep: u64 = 8 << 20;
    let over = 3 << 20;
    let script = format!(
        "echo $$ > leader; head -c {} /dev/zero; echo err >&2; (sleep 30; echo late) & echo last-before-exit",
        keep + over
    );
    let spawn = spawn_request(&s, &script, Some(keep));
    // What the supervisor's descriptors point at, sockets left out: a connection (the test's
    // own readiness probe, a request) comes and goes on its own.
    let descriptors = || -> std::collections::BTreeSet<String> {
        std::fs::read_dir(format!("/proc/{}/fd", s.child.id()))
            .unwrap()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .map(|target| target.to_string_lossy().into_owned())
            .filter(|target| !target.starts_with("socket:"))
            .collect()
    };
    let before = descriptors();
    let Exit::Started { process } = detached(&s, spawn) else {
        panic!("not started")
    };
    // The sleeping descendant still holds both pipes: the process is finished all the same.
    assert!(wait_status(&s, &process, &Exit::Exited { code: 0 }));
    let kept = std::fs::metadata(logs.join(format!("{process}.out")))
        .unwrap()
        .len();
    assert_eq!(kept, keep);
    let reply = read_reply(send(
        &s.socket,
        &Request::Output {
            v: PROTOCOL_VERSION,
            process: process.clone(),
            log_dir: logs.to_string_lossy().into_owned(),
            stdout_from: kept,
            stderr_from: 0,
            max: 100,
        },
    ));
    assert_eq!(
        reply.exit,
        Exit::Output {
            stdout_size: kept,
            stderr_size: 4,
            stdout_dropped: Some(over + "last-before-exit\n".len() as u64),
            stderr_dropped: Some(0),
        }
    );
    assert_eq!(reply.stderr, b"err\n");
    // Killing it after it ended kills what it left in its group (before: "killed", and the
    // background subshell lived on).
    let leader: i32 = std::fs::read_to_string(s.dir.path().join("leader"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(in_group(leader), "the background subshell is already gone");
    let kill = || Request::Kill {
        v: PROTOCOL_VERSION,
        process: process.clone(),
        signal: 9,
    };
    assert_eq!(detached(&s, kill()), Exit::Exited { code: 0 });
    let until = Instant::now() + Duration::from_secs(10);
    while in_group(leader) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!in_group(leader), "kill left its group's processes running");
    assert_eq!(detached(&s, kill()), Exit::Exited { code: 0 }, "idempotent");
    // Its pipes and files are closed once nothing writes to them any more.
    let kept = || {
        descriptors()
            .difference(&before)
            .cloned()
            .collect::<Vec<_>>()
    };
    while !kept().is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        kept(),
        Vec::<String>::new(),
        "the supervisor kept these open"
    );
}

/// Whether a live process is in process group `pgid`, from `/proc/*/stat` (zombies are not).
fn in_group(pgid: i32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map_or(Vec::new(), |(_, f)| f.split_whitespace().collect());
            fields.first() != Some(&"Z") && fields.get(2) == Some(&pgid.to_string().as_str())
        })
    })
}

/// A request the supervisor reads only after its client gave up (the supervisor was frozen, as
/// in a paused container) never runs: nothing is queued behind the caller's back.
#[test]
fn a_request_read_after_its_client_left_never_runs() {
    let server = server();
    let marker = server.dir.path().join("ran");
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let request = exec(
        server.dir.path(),
        &format!("touch {}", marker.display()),
        None,
    );
    let stream = send(&server.socket, &request);
    drop(stream);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    // A live request still runs afterwards (the supervisor is not wedged)…
    let reply = read_reply(send(
        &server.socket,
        &exec(server.dir.path(), "echo alive", None),
    ));
    assert_eq!(reply.stdout, b"alive\n");
    // …and the abandoned one did not.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "a request whose client left ran anyway");
}

/// What a reaper in `__reap_enter` mode says on its control channel, and how it ends.
fn reap_entering(args: &[&str]) -> (String, std::process::ExitStatus) {
    let mut all = vec![berth_supervisor::reaper::REAP_ENTER_ARG];
    all.extend_from_slice(args);
    reaper_says(&all, b"", false)
}

/// What a reaper run with `args` says on its control channel after being sent `sent`, and how
/// it ends. The channel is closed after `sent` when `then_close` (which, once a command runs,
/// means the caller is gone: the command is killed).
fn reaper_says(args: &[&str], sent: &[u8], then_close: bool) -> (String, std::process::ExitStatus) {
    use std::io::Read;
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth-supervisor"))
        .args(args)
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs,
        )))
        .spawn()
        .unwrap();
    ours.write_all(sent).unwrap();
    if then_close {
        ours.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let status = child.wait().unwrap();
    let mut said = String::new();
    ours.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    (&ours).take(4096).read_to_string(&mut said).unwrap();
    (said, status)
}

/// A reaper that cannot make the bwrap entry says which step failed, as a failure of its own
/// (`other`): never as the command being missing (which the caller would report as exit 127),
/// and it starts nothing.
#[test]
fn a_reaper_that_cannot_enter_says_why_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let missing = dir.path().join("no-such-workspace");
    let (said, _) = reap_entering(&[
        "65534",
        "65534",
        missing.to_str().unwrap(),
        dir.path().to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        &format!("touch {}", marker.display()),
    ]);
    assert!(
        said.starts_with("failed other cannot enter the sandbox: "),
        "{said:?}"
    );
    assert!(!said.contains("started"), "{said:?}");
    assert!(!marker.exists(), "the command ran without its entry");
    // Root is never the user it becomes.
    let (said, _) = reap_entering(&["0", "0", "/", "/mnt", "--", "/bin/true"]);
    assert_eq!(said, "failed other usage: refusing to enter as root\n");
}

/// A command that leaves a child made by `clone` with no exit signal still ends its reaper,
/// with the command's own status, and that child dies with it: the reaper ends once it has no
/// child of any kind, without reading `/proc`, so whatever the command left must be its child
/// by then (re-parented to it) and killed.
#[test]
fn a_reaper_ends_when_its_command_leaves_a_clone_child() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let script = "import ctypes, os, time\n\
                  libc = ctypes.CDLL(None, use_errno=True)\n\
                  pid = libc.syscall(56, 0, 0, 0, 0, 0)\n\
                  if pid == 0:\n    time.sleep(300)\n    os._exit(0)\n\
                  assert pid > 0, ctypes.get_errno()\n\
                  open('clone.pid', 'w').write(str(pid))\n";
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut reaper = Command::new(env!("CARGO_BIN_EXE_berth-supervisor"))
        .arg(berth_supervisor::reaper::REAP_ARG)
        .args(["python3", "-c", script])
        .current_dir(dir.path())
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            theirs,
        )))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let ended = loop {
        if let Some(status) = reaper.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let clone: i32 = std::fs::read_to_string(dir.path().join("clone.pid"))
        .expect("the command made its clone child")
        .parse()
        .unwrap();
    let clone = nix::unistd::Pid::from_raw(clone);
    if ended.is_none() {
        let _ = reaper.kill();
        let _ = reaper.wait();
        let _ = nix::sys::signal::kill(clone, nix::sys::signal::Signal::SIGKILL);
        panic!("the reaper did not end within 20 s of its command");
    }
    let mut said = String::new();
    ours.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    (&ours).take(4096).read_to_string(&mut said).unwrap();
    assert_eq!(said, "started\nexited 0\n");
    // The reaper reaped it before ending, so the pid names nothing (or, at worst, a stranger:
    // never a sleeping python of ours).
    let left = std::fs::read_to_string(format!("/proc/{clone}/cmdline")).unwrap_or_default();
    assert!(
        !left.contains("python"),
        "the clone child {clone} outlived its reaper: {left:?}"
    );
}

/// The supervisor's children running in reaper mode `mode` (the second word of their command
/// line), from `/proc`.
fn reapers_of(supervisor: u32, mode: &str) -> Vec<i32> {
    let mut found = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{supervisor}/task")) else {
        return found;
    };
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            if cmdline.split(|b| *b == 0).nth(1) == Some(mode.as_bytes()) && !gone_now(child) {
                found.push(child);
            }
        }
    }
    found
}

/// The one reaper waiting for the next exec, other than `not` (at most 5 s).
fn waiting_reaper(s: &Server, not: Option<i32>) -> i32 {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let waiting = reapers_of(s.child.id(), berth_supervisor::reaper::REAP_WAITING_ARG);
        match waiting.as_slice() {
            [one] if Some(*one) != not => return *one,
            many if many.len() > 1 => panic!("more than one reaper waiting: {many:?}"),
            _ if Instant::now() > until => panic!("no reaper waiting (other than {not:?})"),
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// An exec does not wait for its reaper to start: one is started when the supervisor starts
/// and again after each exec has answered, and the exec's command runs under it (its parent).
/// One that is gone when an exec comes (anything in a sandbox can kill it) is replaced, and the
/// exec runs all the same, in its directory and with exactly its environment; no more than one
/// ever waits.
#[test]
fn an_exec_runs_under_a_reaper_started_before_it() {
    let s = server();
    let first = waiting_reaper(&s, None);
    let reply = read_reply(send(&s.socket, &exec(s.dir.path(), "echo $PPID", None)));
    assert_eq!(reply.exit, Exit::Exited { code: 0 });
    assert_eq!(
        String::from_utf8_lossy(&reply.stdout).trim(),
        first.to_string()
    );

    let next = waiting_reaper(&s, Some(first));
    assert!(gone(first), "the used reaper ended with its command");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(next),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(gone(next));
    let line = "echo $PPID; pwd; env | grep -v '^PWD=\\|^SHLVL=\\|^_=' | sort";
    let reply = read_reply(send(&s.socket, &exec(s.dir.path(), line, None)));
    assert_eq!(
        reply.exit,
        Exit::Exited { code: 0 },
        "{reply_err}",
        reply_err = String::from_utf8_lossy(&reply.stderr)
    );
    let stdout = String::from_utf8_lossy(&reply.stdout).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_ne!(lines[0], next.to_string(), "ran under the killed reaper");
    assert_eq!(lines[1], s.dir.path().to_str().unwrap());
    assert_eq!(&lines[2..], ["GIVEN=yes", "PATH=/usr/bin:/bin"]);
    for _ in 0..5 {
        let reply = read_reply(send(&s.socket, &exec(s.dir.path(), "true", None)));
        assert_eq!(reply.exit, Exit::Exited { code: 0 });
    }
    waiting_reaper(&s, None);
}

/// What a reaper in `__reap_waiting` mode says after being sent `sent`, and how it ends.
fn reap_waiting(sent: &[u8], then_close: bool) -> (String, std::process::ExitStatus) {
    reaper_says(
        &[berth_supervisor::reaper::REAP_WAITING_ARG],
        sent,
        then_close,
    )
}

/// A waiting reaper runs only a whole, well-formed job: the channel closing before one (the
/// supervisor went away) ends it quietly, and a malformed or oversized one is its own failure
/// (`other`, never the command missing); in neither case does anything start.
#[test]
fn a_waiting_reaper_runs_only_a_whole_job() {
    let dir = tempfile::tempdir().unwrap();
    let job = berth_supervisor::reaper::Job {
        argv: vec!["/bin/sh".into(), "-c".into(), "echo ran > ran".into()],
        cwd: dir.path().to_string_lossy().into_owned(),
        env: BTreeMap::new(),
    };
    let frame = job.to_frame();
    let ran = Path::new(&job.cwd).join("ran");

    let (said, status) = reap_waiting(b"", true);
    assert_eq!((said.as_str(), status.code()), ("", Some(0)));
    let (said, status) = reap_waiting(&frame[..frame.len() - 1], true);
    assert_eq!((said.as_str(), status.code()), ("", Some(0)), "a cut job");
    let mut malformed = 5u64.to_be_bytes().to_vec();
    malformed.extend_from_slice(b"{argv");
    let (said, status) = reap_waiting(&malformed, true);
    assert!(said.starts_with("failed other malformed job"), "{said}");
    assert_eq!(status.code(), Some(2));
    let (said, status) = reap_waiting(&u64::MAX.to_be_bytes(), true);
    assert!(said.starts_with("failed other a job of"), "{said}");
    assert_eq!(status.code(), Some(2));
    assert!(!ran.exists(), "something ran");

    let (said, status) = reap_waiting(&frame, false);
    assert_eq!(
        (said.as_str(), status.code()),
        ("started\nexited 0\n", Some(0))
    );
    assert_eq!(std::fs::read_to_string(&ran).unwrap(), "ran\n");
}

/// The supervisor's threads, from `/proc`.
fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| tasks.count())
        .unwrap_or(0)
}

/// Each detached process costs the supervisor one thread (relaying its output, recording its
/// end and reaping it), not one per duty: in a sandbox every thread counts against the same
/// process limit as the sandbox's own processes (before: two threads per process, so a
/// container's 1024 held 340 detached processes). The thread ends with the process.
#[test]
fn a_detached_process_costs_one_supervisor_thread() {
    let s = server();
    let spawn = |line: &str| spawn_request(&s, line, None);
    // Settled: connection threads of earlier requests have ended.
    let settled = || {
        let until = Instant::now() + Duration::from_secs(5);
        let mut last = threads_of(s.child.id());
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = threads_of(s.child.id());
            if now == last || Instant::now() > until {
                return now;
            }
            last = now;
        }
    };
    let before = settled();
    let mut started = Vec::new();
    for _ in 0..8 {
        let Exit::Started { process } = detached(&s, spawn("exec sleep 30")) else {
            panic!("not started")
        };
        started.push(process);
    }
    assert_eq!(settled(), before + 8, "threads for 8 detached processes");
    for process in &started {
        let kill = Request::Kill {
            v: PROTOCOL_VERSION,
            process: process.clone(),
            signal: 9,
        };
        assert_eq!(detached(&s, kill), Exit::Exited { code: 0 });
        assert!(wait_status(&s, process, &Exit::Signalled { signal: 9 }));
    }
    let until = Instant::now() + Duration::from_secs(5);
    while settled() != before && Instant::now() < until {}
    assert_eq!(settled(), before, "the watchers ended with their processes");
}
