//! A provider that fails for now (its daemon unreachable) is no verdict on an attempt: the run
//! stops with the provider's kind and code, nothing is recorded for the step, and `berth
//! mission resume` runs the step again once the provider answers. Real dockerd, reached
//! through a socket this test takes away and brings back (as a daemon restart does).

mod common;
mod missions_support;

use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestImage;
use missions_support::*;
use serde_json::Value;

/// The engine's socket, forwarded while up: `down` removes it and closes every connection
/// through it, `up` serves it again at the same path.
struct EngineSocket {
    path: PathBuf,
    serving: Option<Serving>,
}

struct Serving {
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<UnixStream>>>,
    accepting: std::thread::JoinHandle<()>,
}

fn engine() -> PathBuf {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if host.starts_with("unix://") => PathBuf::from(&host["unix://".len()..]),
        _ => PathBuf::from("/var/run/docker.sock"),
    }
}

impl EngineSocket {
    fn new(path: PathBuf) -> Self {
        let mut socket = EngineSocket {
            path,
            serving: None,
        };
        socket.up();
        socket
    }

    fn up(&mut self) {
        let listener = UnixListener::bind(&self.path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (stopped, conns) = (stop.clone(), open.clone());
        let accepting = std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    Err(e) => panic!("accept: {e}"),
                };
                client.set_nonblocking(false).unwrap();
                let daemon = UnixStream::connect(engine()).unwrap();
                for (from, to) in [(&client, &daemon), (&daemon, &client)] {
                    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Write);
                    });
                }
                conns.lock().unwrap().extend([client, daemon]);
            }
        });
        self.serving = Some(Serving {
            stop,
            open,
            accepting,
        });
    }

    fn down(&mut self) {
        let Some(serving) = self.serving.take() else {
            return;
        };
        std::fs::remove_file(&self.path).unwrap();
        serving.stop.store(true, Ordering::SeqCst);
        serving.accepting.join().unwrap();
        for conn in serving.open.lock().unwrap().drain(..) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for EngineSocket {
    fn drop(&mut self) {
        self.down();
    }
}

/// One test's mission: its home, its owner (labels its containers), its engine socket.
struct Case {
    // Fields drop in order: the socket before the directory holding it.
    socket: EngineSocket,
    home: tempfile::TempDir,
    dir: tempfile::TempDir,
    owner: &'static str,
}

impl Case {
    fn new(owner: &'static str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = EngineSocket::new(dir.path().join("engine.sock"));
        Case {
            home: home(),
            dir,
            owner,
            socket,
        }
    }

    /// `berth` as this case's owner, reaching the engine through its socket.
    fn berth(&self, args: &[&str]) -> Command {
        let mut cmd = berth(self.home.path(), args);
        cmd.env("BERTH_OWNER", self.owner).env(
            "DOCKER_HOST",
            format!("unix://{}", self.socket.path.display()),
        );
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.berth(args).output().unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(&[&["--json"], args].concat());
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
    }

    fn mission(&self) -> Option<String> {
        self.json(&["mission", "list"])["missions"][0]["id"]
            .as_str()
            .map(str::to_owned)
    }

    /// A docker mission of one task and one attempt whose agent takes `agent_secs`, and is
    /// right.
    fn docker_mission(&self, agent_secs: u32) -> PathBuf {
        let file = write_mission(
            self.dir.path(),
            &format!("sleep {agent_secs}\nprintf right > answer.txt\n"),
            "test \"$(cat answer.txt)\" = right && mkdir -p .berth && echo pass > .berth/verdict",
            "60s",
            "\".berth/verdict\"",
            1,
        );
        let text = std::fs::read_to_string(&file)
            .unwrap()
            .replace("provider = \"host\"", "provider = \"docker\"")
            .replace("[harness]", "image = \"berth/agent:bookworm\"\n[harness]");
        std::fs::write(&file, text).unwrap();
        file
    }

    /// `mission run FILE` in the background until its attempt is staged (the agent at work):
    /// the runner and the mission's status then.
    // The runner is handed to the caller, who waits for it; clippy does not follow it there.
    #[allow(clippy::zombie_processes)]
    fn run_until_staged(&self, file: &Path) -> (std::process::Child, Value) {
        let mut runner = self
            .berth(&["mission", "run", file.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        loop {
            if started.elapsed() > Duration::from_secs(60) {
                kill_runner(&mut runner);
                panic!("never staged");
            }
            if let Some(id) = self.mission() {
                let doc = self.json(&["mission", "status", &id]);
                if doc["mission"]["tasks"][0]["attempts"][0]["status"]["phase"] == "staged" {
                    return (runner, doc);
                }
            }
            std::thread::sleep(Duration::from_millis(40));
        }
    }

    /// The interrupted run's output says what happened and the way on; the attempt is still
    /// open, with no verdict. `made_row`: the run recorded the attempt's sandbox (its cleanup
    /// keeps the row for the resume and says so).
    fn assert_interrupted(&self, out: &Output, made_row: bool) -> String {
        assert_eq!(out.status.code(), Some(6), "{}", text(out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("unavailable"), "{}", text(out));
        assert!(
            stderr.contains("nothing was recorded for this step"),
            "{}",
            text(out)
        );
        let id = self.mission().expect("the mission is registered");
        assert!(
            stderr.contains(&format!("berth mission resume {id}")),
            "{}",
            text(out)
        );
        // The attempt's sandbox row is kept for the resume, and said to be: nothing was
        // "cleaned up" (the run's cleanup once counted what it kept as cleaned).
        assert!(!stderr.contains("cleaned up"), "{}", text(out));
        assert_eq!(
            stderr.contains(&format!("kept: held by mission `{id}`")),
            made_row,
            "{}",
            text(out)
        );
        let doc = self.json(&["mission", "status", &id]);
        assert_eq!(doc["mission"]["state"]["state"], "running", "{doc}");
        let attempts = doc["mission"]["tasks"][0]["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{doc}");
        assert_eq!(attempts[0]["status"]["status"], "in_progress", "{doc}");
        // Nothing drives it now, and status says so with the way on, and why it stopped.
        assert_eq!(doc["runner"]["state"], "none", "{doc}");
        assert_eq!(doc["stopped"]["stop"], "interrupted", "{doc}");
        assert_eq!(doc["stopped"]["error_kind"], "unavailable", "{doc}");
        assert_eq!(doc["stopped"]["attempt"], attempts[0]["key"], "{doc}");
        let said = self.run(&["mission", "status", &id]);
        assert!(
            String::from_utf8_lossy(&said.stdout).contains(&format!(
                "no runner is driving it: `berth mission resume {id}` continues it"
            )),
            "{}",
            text(&said)
        );
        id
    }

    /// The resumed mission succeeds with its one attempt, and nothing of it is left.
    fn assert_resumed(&self, id: &str) {
        let resumed = self.run(&["mission", "resume", id]);
        assert!(resumed.status.success(), "{}", text(&resumed));
        let doc = self.json(&["mission", "status", id]);
        assert_eq!(doc["mission"]["state"]["state"], "succeeded", "{doc}");
        let attempts = doc["mission"]["tasks"][0]["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{doc}");
        assert_eq!(attempts[0]["status"]["status"], "accepted", "{doc}");
        let ledger = self.json(&["ledger", "list"]);
        assert_eq!(
            sandbox_rows(&ledger).len(),
            0,
            "open sandbox rows: {ledger}"
        );
        // The checkpoint (a snapshot image) goes too.
        for row in ledger["entries"].as_array().unwrap() {
            let out = self.run(&["destroy", row["berth_id"].as_str().unwrap()]);
            assert!(out.status.success(), "{}", text(&out));
        }
    }
}

impl Drop for Case {
    /// A failed test leaves no container of its owner behind.
    fn drop(&mut self) {
        let label = format!("label=berth.owner={}", self.owner);
        if let Ok(listed) = Command::new("docker")
            .args(["ps", "-aq", "--filter", &label])
            .output()
        {
            for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
                let _ = Command::new("docker").args(["rm", "-f", id]).output();
            }
        }
    }
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The daemon goes away while the agent works: the step that next needs it stops the run
/// (before this, the attempt was rejected — "cannot observe sandbox" — and the mission,
/// allowed one attempt, FAILED with no verdict on the agent's work).
#[test]
fn a_daemon_gone_mid_attempt_stops_the_run_and_resume_finishes_it() {
    if !reference_image_ready() {
        return;
    }
    let mut case = Case::new("mission-interrupted-mid-attempt");
    let file = case.docker_mission(4);
    let (runner, doc) = case.run_until_staged(&file);
    // The runner at work is named by its lease.
    assert_eq!(doc["runner"]["state"], "holding", "{doc}");
    let holder = doc["runner"]["holder"].as_str().unwrap();
    assert!(holder.contains(&format!("pid {}", runner.id())), "{doc}");
    case.socket.down();
    let out = runner.wait_with_output().unwrap();
    let id = case.assert_interrupted(&out, true);
    case.socket.up();
    case.assert_resumed(&id);
}

/// The daemon is not there when the attempt's sandbox is to be made: the run stops instead of
/// rejecting the attempt ("no provider could take the attempt"), and resume makes the sandbox
/// under a fresh name once the daemon is back (the failed try's row is verified gone and kept).
#[test]
fn a_daemon_gone_at_placement_stops_the_run_and_resume_places_the_attempt() {
    if !reference_image_ready() {
        return;
    }
    let mut case = Case::new("mission-interrupted-placement");
    let file = case.docker_mission(0);
    case.socket.down();
    let out = case.run(&["mission", "run", file.to_str().unwrap()]);
    let id = case.assert_interrupted(&out, true);
    // Resumed while the daemon is still away: it stops the same way, and costs nothing.
    let again = case.run(&["mission", "resume", &id]);
    case.assert_interrupted(&again, false);
    case.socket.up();
    case.assert_resumed(&id);
}

/// A mission cancelled while its provider is away is cancelled all the same; the sandbox it
/// held is named as not removed (exit 10), and `berth ledger sweep` removes it once the
/// daemon is back (the mission no longer holds it).
#[test]
fn a_mission_cancelled_while_its_daemon_is_away_says_what_it_could_not_remove() {
    if !reference_image_ready() {
        return;
    }
    let mut case = Case::new("mission-cancelled-daemon-away");
    let file = case.docker_mission(4);
    let (runner, doc) = case.run_until_staged(&file);
    let id = doc["mission"]["id"].as_str().unwrap().to_owned();
    case.socket.down();
    let out = runner.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    let cancel = case.run(&["mission", "cancel", &id]);
    assert_eq!(cancel.status.code(), Some(10), "{}", text(&cancel));
    let said = String::from_utf8_lossy(&cancel.stdout);
    assert!(said.contains("CANCELLED"), "{}", text(&cancel));
    assert!(said.contains("NOT removed: bx-"), "{}", text(&cancel));
    assert!(said.contains("berth ledger sweep"), "{}", text(&cancel));
    let doc = case.json(&["mission", "status", &id]);
    assert_eq!(doc["mission"]["state"]["state"], "cancelled", "{doc}");
    case.socket.up();
    let swept = case.run(&["ledger", "sweep"]);
    assert!(swept.status.success(), "{}", text(&swept));
    let ledger = case.json(&["ledger", "list"]);
    assert_eq!(sandbox_rows(&ledger).len(), 0, "{ledger}");
    let label = format!("label=berth.owner={}", case.owner);
    let left = Command::new("docker")
        .args(["ps", "-aq", "--filter", &label])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "containers left: {}", text(&left));
}

/// Staging runs before the agent, so its failure is no verdict on the attempt — and every
/// later attempt would meet it (here an image without git). The run stops (exit 14) with
/// nothing recorded and the sandbox removed; once the image is fixed under the same name,
/// resume stages in a fresh sandbox and the mission succeeds with its one attempt. Before,
/// the attempt was rejected, and the mission (allowed one) FAILED without its agent running.
#[test]
fn a_staging_failure_stops_the_run_and_resume_stages_in_a_fresh_sandbox() {
    if !reference_image_ready() {
        return;
    }
    let case = Case::new("mission-staging-failed");
    let image = TestImage("berth-test/staging-no-git:latest");
    image.build("RUN rm -f /usr/bin/git");
    let file = case.docker_mission(0);
    let mission = std::fs::read_to_string(&file)
        .unwrap()
        .replace("berth/agent:bookworm", image.0);
    std::fs::write(&file, mission).unwrap();
    let out = case.run(&["mission", "run", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(14), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("before its agent ran"), "{}", text(&out));
    assert!(stderr.contains("staging failed"), "{}", text(&out));
    assert!(stderr.contains("git"), "{}", text(&out));
    let id = case.mission().unwrap();
    assert!(
        stderr.contains(&format!("berth mission resume {id}")),
        "{}",
        text(&out)
    );
    let doc = case.json(&["mission", "status", &id]);
    let attempts = doc["mission"]["tasks"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{doc}");
    assert_eq!(attempts[0]["status"]["status"], "in_progress", "{doc}");
    assert_eq!(doc["stopped"]["stop"], "before_agent", "{doc}");
    assert!(
        doc["stopped"]["reason"]
            .as_str()
            .unwrap()
            .contains("staging failed"),
        "{doc}"
    );
    let ledger = case.json(&["ledger", "list"]);
    assert_eq!(
        sandbox_rows(&ledger).len(),
        0,
        "the sandbox stays: {ledger}"
    );
    // The image is fixed under the same name; resume makes a fresh sandbox from it.
    image.build("");
    case.assert_resumed(&id);
}
