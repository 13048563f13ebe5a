//! `berth ssh` as a person uses it — tmux runs it, `send-keys` types, `capture-pane` reads the
//! screen — and `berth port` serving a web server from inside a sandbox, on host and docker.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::*;

/// A private tmux server (its own socket), killed when the test ends.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// A session running `sh` in a 100×30 window with `env` set.
    fn start(tag: &str, env: &[(&str, &str)]) -> Tmux {
        let tmux = Tmux {
            socket: format!("berth-test-{tag}-{}", std::process::id()),
        };
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &tmux.socket, "-f", "/dev/null", "new-session", "-d"])
            .args(["-s", "t", "-x", "100", "-y", "30"]);
        for (k, v) in env {
            cmd.args(["-e", &format!("{k}={v}")]);
        }
        cmd.args(["sh"]);
        let out = cmd.output().expect("tmux runs");
        assert!(out.status.success(), "tmux: {}", text(&out.stderr));
        tmux
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux {args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    }

    /// Types `line` and presses Enter.
    fn type_line(&self, line: &str) {
        self.tmux(&["send-keys", "-t", "t", "-l", line]);
        self.tmux(&["send-keys", "-t", "t", "Enter"]);
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-t", "t", "-S", "-300"])
    }

    /// Waits until the screen shows `needle`; panics with the screen after `timeout`.
    fn wait_for(&self, needle: &str, timeout: Duration) -> String {
        self.wait_for_any(&[needle], timeout)
    }

    /// Waits until the screen shows one of `needles`.
    fn wait_for_any(&self, needles: &[&str], timeout: Duration) -> String {
        let started = Instant::now();
        loop {
            let screen = self.screen();
            if needles.iter().any(|n| screen.contains(n)) {
                return screen;
            }
            if started.elapsed() > timeout {
                panic!("the screen never showed {needles:?}:\n{screen}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

fn tmux_ready() -> bool {
    if which("tmux").is_ok() {
        return true;
    }
    if std::env::var_os("BERTH_SKIP_TMUX").is_some() {
        eprintln!("SKIPPED (BERTH_SKIP_TMUX set): no tmux");
        return false;
    }
    panic!("tmux missing; run scripts/test (or set BERTH_SKIP_TMUX=1 to skip explicitly)");
}

/// The whole interactive path through tmux: a shell in the sandbox, typed commands, the window
/// size and a resize, Ctrl-C reaching the sandbox's process (not Berth), the exit code passed
/// through, and the outer terminal's mode restored afterwards.
fn terminal_session(home: &Home, owner: &str, id: &str, tag: &str) {
    let berth = env!("CARGO_BIN_EXE_berth");
    let home_dir = home.path().to_string_lossy().into_owned();
    let supervisor = std::env::var("BERTH_SUPERVISOR").unwrap_or_default();
    let tmux = Tmux::start(
        tag,
        &[
            ("BERTH_HOME", &home_dir),
            ("BERTH_OWNER", owner),
            ("BERTH_SUPERVISOR", &supervisor),
            ("PS1", "outer$ "),
        ],
    );
    let mode_file = home.path().join(format!("stty-{tag}"));
    let mode = mode_file.to_string_lossy();
    // The outer terminal's mode before berth runs, to compare after.
    tmux.type_line(&format!("stty -g > {mode}"));
    tmux.type_line(&format!("{berth} ssh {id}; echo OUTER-RC-$((1000+$?))"));
    // The sandbox's shell answers typed commands.
    tmux.type_line("echo SUM-$((6*7))");
    tmux.wait_for("SUM-42", Duration::from_secs(30));
    // The window's size reaches the sandbox's terminal, and so does a resize.
    tmux.type_line("echo SIZE-$(stty size | tr ' ' x)");
    tmux.wait_for("SIZE-30x100", Duration::from_secs(10));
    tmux.tmux(&["resize-window", "-t", "t", "-x", "120", "-y", "40"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux.type_line("echo RESIZED-$(stty size | tr ' ' x)");
    tmux.wait_for("RESIZED-40x120", Duration::from_secs(10));
    // Ctrl-C interrupts the sandbox's foreground command; the session (and Berth) carry on.
    tmux.type_line("sleep 300; echo SLEEP-ENDED-$?");
    std::thread::sleep(Duration::from_millis(500));
    tmux.tmux(&["send-keys", "-t", "t", "C-c"]);
    tmux.type_line("echo ALIVE-$((1+1))");
    let screen = tmux.wait_for("ALIVE-2", Duration::from_secs(10));
    assert!(
        !screen.contains("OUTER-RC-1"),
        "Ctrl-C ended berth instead of the sandbox's command:\n{screen}"
    );
    // A background job (a process group of its own) does not outlive the session.
    tmux.type_line("sleep 300 &");
    // The command's exit code comes back as berth's.
    tmux.type_line("exit 7");
    tmux.wait_for("OUTER-RC-1007", Duration::from_secs(10));
    // The outer terminal is back in the mode it had.
    tmux.type_line(&format!(
        "stty -g | cmp -s - {mode} && echo MODE-RESTORED-$((1+1)) || echo MODE-CHANGED-$((1+1))"
    ));
    let screen = tmux.wait_for_any(
        &["MODE-RESTORED-2", "MODE-CHANGED-2"],
        Duration::from_secs(10),
    );
    assert!(
        screen.contains("MODE-RESTORED-2"),
        "the outer terminal's mode was not restored:\n{screen}"
    );
}

#[test]
fn ssh_on_host_through_tmux() {
    if !tmux_ready() {
        return;
    }
    let home = Home::new();
    let id = home.create("tester");
    terminal_session(&home, "tester", &id, "host");
    // Nothing the session started survives it: no `sleep 300` carrying this sandbox's marker.
    let marker = format!("BERTH_SANDBOX={id}");
    let survivors: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|p| {
            let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            let environ = std::fs::read(p.path().join("environ")).unwrap_or_default();
            cmdline == b"sleep\x00300\x00"
                && environ.split(|b| *b == 0).any(|v| v == marker.as_bytes())
        })
        .map(|p| p.path())
        .collect();
    assert!(
        survivors.is_empty(),
        "a session process survived: {survivors:?}"
    );
}

#[test]
fn ssh_on_bwrap_through_tmux() {
    if !tmux_ready() {
        return;
    }
    let home = Home::new();
    let (code, doc) = home.json(&["create", "-p", "bwrap"]);
    if code != 0 && std::env::var_os("BERTH_SKIP_BWRAP").is_some() {
        eprintln!("SKIPPED (BERTH_SKIP_BWRAP set): {doc}");
        return;
    }
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    terminal_session(&home, "tester", &id, "bwrap");
    let (code, doc) = home.json(&["destroy", &id]);
    assert_eq!(code, 0, "{doc}");
}

#[test]
fn ssh_on_docker_through_tmux() {
    if !tmux_ready() || !docker_ready() {
        return;
    }
    let home = Home::new();
    let (code, doc) = home.json(&["create", "-p", "docker", "--image", &test_image()]);
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    terminal_session(&home, "tester", &id, "docker");
    let (code, doc) = home.json(&["destroy", &id]);
    assert_eq!(code, 0, "{doc}");
}

/// Without a terminal, `berth ssh ID -- CMD` still runs CMD on one and passes its code back;
/// piped input reaches it, and what the sandbox prints arrives.
#[test]
fn ssh_runs_a_command_on_a_terminal_without_one() {
    let home = Home::new();
    let id = home.create("tester");
    let out = home.run(&["ssh", &id, "--", "sh", "-c", "tty; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    for alias in ["connect", "shell"] {
        let out = home.run(&[alias, &id, "--", "sh", "-c", "exit 4"]);
        assert_eq!(out.status.code(), Some(4), "{alias}: {}", text(&out.stderr));
    }
    assert!(
        text(&out.stdout).contains("/dev/pts/"),
        "{}",
        text(&out.stdout)
    );
    let mut child = home
        .command(
            "tester",
            &["ssh", &id, "--", "sh", "-c", "read line; echo GOT-$line"],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("GOT-hello"),
        "{}",
        text(&out.stdout)
    );
    // A command that does not exist: the shell's 127, shown on the terminal.
    let out = home.run(&["ssh", &id, "--", "no-such-command-berth"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stdout));
    // bwrap: a terminal, and without network `host` no port of the sandbox can be listening
    // (every command has a network namespace of its own), which a connection says.
    let (code, doc) = home.json(&["create", "-p", "bwrap"]);
    if code == 0 {
        let bwrap = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
        let out = home.run(&["ssh", &bwrap, "--", "sh", "-c", "test -t 0 && exit 6"]);
        assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
        let (code, doc) = home.json(&["destroy", &bwrap]);
        assert_eq!(code, 0, "{doc}");
    }
}

/// A running `berth port`: its local address (first stdout line) and the process.
struct Forward {
    child: Child,
    local: String,
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn forward(home: &Home, id: &str, port: u16, local: Option<&str>) -> Forward {
    let mut args = vec!["port", id];
    let port = port.to_string();
    args.push(&port);
    if let Some(local) = local {
        args.extend(["--local", local]);
    }
    let mut child = home
        .command("tester", &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(!line.trim().is_empty(), "berth port printed no address");
    Forward {
        child,
        local: line.trim().to_owned(),
    }
}

/// One HTTP GET through the forward; the response text.
fn get(local: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(local).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// A web server started in the sandbox answers through `berth port`; `berth status` lists the
/// forward while it runs and not after.
fn serve_through_port(home: &Home, id: &str, port: u16) {
    let page = home.path().join(format!("page-{port}.txt"));
    std::fs::write(&page, "served-from-the-sandbox\n").unwrap();
    let out = home.run(&["cp", &page.to_string_lossy(), &format!("{id}:page.txt")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let port_arg = port.to_string();
    let server = [
        "python3",
        "-m",
        "http.server",
        "--bind",
        "127.0.0.1",
        &port_arg,
    ];
    // The server runs as a detached process where the provider has them, else under a
    // `berth exec` that this test ends.
    let detached = home.json(&[&["exec", "--detach", id, "--"][..], &server[..]].concat());
    let _foreground = match detached {
        (0, _) => None,
        (4, _) => Some(Forward {
            child: home
                .command("tester", &[&["exec", id, "--"][..], &server[..]].concat())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
            local: String::new(),
        }),
        (code, doc) => panic!("exec --detach: {code} {doc}"),
    };
    let fwd = forward(home, id, port, None);
    // The server needs a moment to listen; the forward refuses (closes) until then.
    let started = Instant::now();
    let response = loop {
        let response =
            std::panic::catch_unwind(|| get(&fwd.local, "/page.txt")).unwrap_or_default();
        if response.contains("200") || started.elapsed() > Duration::from_secs(20) {
            break response;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    assert!(response.contains("served-from-the-sandbox"), "{response}");
    let (code, doc) = home.json(&["status", id]);
    assert_eq!(code, 0, "{doc}");
    let forwards = doc["forwards"].as_array().unwrap();
    assert_eq!(forwards.len(), 1, "{doc}");
    assert_eq!(forwards[0]["port"], port, "{doc}");
    assert_eq!(forwards[0]["local"], fwd.local.as_str(), "{doc}");
    drop(fwd);
    let (_, doc) = home.json(&["status", id]);
    assert_eq!(doc["forwards"].as_array().unwrap().len(), 0, "{doc}");
}

/// A port nothing listens on at this moment on this machine's loopback (which host sandboxes,
/// and bwrap ones with network `host`, share).
fn free_loopback_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn port_forwards_a_web_server_on_host() {
    let home = Home::new();
    let id = home.create("tester");
    // A free port on this machine (the host sandbox shares its loopback).
    let port = free_loopback_port();
    serve_through_port(&home, &id, port);
    let (code, doc) = home.json(&["destroy", &id]);
    assert_eq!(code, 0, "{doc}");
}

#[test]
fn port_forwards_a_web_server_on_docker_with_network_none() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    let id = home.create_docker(&["--network", "none"]);
    serve_through_port(&home, &id, 8080);
    let (code, doc) = home.json(&["destroy", &id]);
    assert_eq!(code, 0, "{doc}");
}

/// bwrap with network `host` shares this machine's loopback, so a forward reaches a server in
/// it; without it, every command has a network namespace of its own, and a connection through
/// the forward is closed with the reason.
#[test]
fn port_forwards_a_web_server_on_bwrap_with_network_host_only() {
    let home = Home::new();
    let (code, doc) = home.json(&["create", "-p", "bwrap", "--network", "host"]);
    if code != 0 && std::env::var_os("BERTH_SKIP_BWRAP").is_some() {
        eprintln!("SKIPPED (BERTH_SKIP_BWRAP set): {doc}");
        return;
    }
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let port = free_loopback_port();
    serve_through_port(&home, &id, port);
    let (code, doc) = home.json(&["destroy", &id]);
    assert_eq!(code, 0, "{doc}");

    // Without network `host`: the forward listens, and each connection is closed with the
    // reason on berth's stderr.
    let (code, doc) = home.json(&["create", "-p", "bwrap"]);
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let mut fwd = forward(&home, &id, 8080, None);
    let mut stream = TcpStream::connect(&fwd.local).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _ = write!(stream, "GET / HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    assert!(answer.is_empty(), "{}", text(&answer));
    let mut stderr = fwd.child.stderr.take().unwrap();
    let _ = fwd.child.kill();
    let _ = fwd.child.wait();
    let mut said = String::new();
    stderr.read_to_string(&mut said).unwrap();
    assert!(
        said.contains("without network `host`"),
        "berth port said: {said}"
    );
    drop(fwd);
    let (code, doc) = home.json(&["destroy", &id]);
    assert_eq!(code, 0, "{doc}");
}

/// A forward answers on loopback only, and a hostile or wrong target is refused cleanly.
#[test]
fn port_refuses_non_loopback_addresses_and_unknown_sandboxes() {
    let home = Home::new();
    let id = home.create("tester");
    let (code, doc) = home.json(&["port", &id, "80", "--local", "0.0.0.0:0"]);
    assert_eq!(code, 5, "{doc}");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a loopback"),
        "{doc}"
    );
    let (code, doc) = home.json(&["port", &id, "0"]);
    assert_eq!(code, 5, "{doc}");
    let (code, doc) = home.json(&["port", "bx-000000000000", "80"]);
    assert_eq!(code, 3, "{doc}");
    // ssh passes its command's code through, so Berth's own failures are 125 (as with exec),
    // with the kind in the document.
    let out = home.run(&["ssh", "../../etc", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no sandbox"),
        "{}",
        text(&out.stderr)
    );
    // The terminal owns stdout: no JSON document can share it.
    let (code, doc) = home.json(&["ssh", &id, "--", "true"]);
    assert_eq!(code, 125, "{doc}");
    assert_eq!(doc["error"]["kind"], "invalid_request", "{doc}");
}

/// The signals a command starts with ignored, from `grep SigIgn /proc/self/status` output.
fn ignored_signals(status: &str) -> u64 {
    let mask = status
        .lines()
        .find_map(|line| line.trim().strip_prefix("SigIgn:"))
        .unwrap_or_else(|| panic!("no SigIgn line in {status:?}"));
    u64::from_str_radix(mask.trim(), 16).unwrap()
}

/// Berth started with SIGINT, SIGQUIT and SIGHUP ignored (a background job, `nohup`): what it
/// runs in a sandbox — an exec, a terminal session — starts with them at their defaults, so
/// Ctrl-C and a command's own signals work. It inherited them ignored before: Ctrl-C in a
/// terminal session did nothing (a shell cannot trap a signal ignored on entry), which the
/// bwrap conformance clause met once in CI.
#[test]
fn commands_start_with_default_signals_whatever_berth_inherited() {
    let home = Home::new();
    let (code, doc) = home.json(&["create", "-p", "bwrap"]);
    let bwrap = match code {
        0 => Some(doc["sandbox"]["berth_id"].as_str().unwrap().to_owned()),
        _ if std::env::var_os("BERTH_SKIP_BWRAP").is_some() => None,
        _ => panic!("bwrap sandbox: {doc}"),
    };
    let host = home.create("tester");
    let (int, quit, hup) = (1u64 << 1, 1u64 << 2, 1u64);
    for id in std::iter::once(&host).chain(bwrap.as_ref()) {
        for verb in ["exec", "ssh"] {
            let out = Command::new("sh")
                .args([
                    "-c",
                    "trap '' INT QUIT HUP; exec \"$0\" \"$@\"",
                    env!("CARGO_BIN_EXE_berth"),
                    verb,
                    id,
                    "--",
                    "grep",
                    "SigIgn",
                    "/proc/self/status",
                ])
                .env("BERTH_HOME", home.path())
                .env("BERTH_OWNER", "tester")
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{verb} {id}: {}",
                text(&out.stderr)
            );
            let ignored = ignored_signals(&text(&out.stdout));
            assert_eq!(
                ignored & (int | quit | hup),
                0,
                "{verb} in {id} started with SIGINT/SIGQUIT/SIGHUP ignored: {ignored:#x}"
            );
        }
    }
    for id in std::iter::once(host).chain(bwrap) {
        let (code, doc) = home.json(&["destroy", &id]);
        assert_eq!(code, 0, "{doc}");
    }
}
