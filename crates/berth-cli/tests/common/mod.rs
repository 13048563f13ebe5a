//! What the CLI's end-to-end tests share: a throwaway BERTH_HOME that sweeps itself, docker
//! readiness, and process helpers.
#![allow(dead_code)] // each test binary uses its own subset

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const CANARY: &str = "canary-9f2c1e-do-not-leak";

pub struct Home {
    pub dir: tempfile::TempDir,
    /// Owners this test acted as; each is swept when the test ends.
    pub owners: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

impl Home {
    pub fn new() -> Home {
        Home {
            dir: tempfile::Builder::new()
                .prefix("berth-test-cli-")
                .tempdir()
                .unwrap(),
            owners: Default::default(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn command(&self, owner: &str, args: &[&str]) -> Command {
        self.owners.borrow_mut().insert(owner.to_owned());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.args(args)
            .env("BERTH_HOME", self.path())
            .env("BERTH_OWNER", owner)
            .env("CANARY_TOKEN", CANARY)
            .stdin(Stdio::null());
        cmd
    }

    pub fn run_as(&self, owner: &str, args: &[&str]) -> Output {
        self.command(owner, args).output().unwrap()
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.run_as("tester", args)
    }

    /// `berth exec ID -- sh -c LINE`.
    pub fn sh(&self, id: &str, line: &str) -> Output {
        self.run(&["exec", id, "--", "sh", "-c", line])
    }

    pub fn json_as(&self, owner: &str, args: &[&str]) -> (i32, Value) {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let out = self.run_as(owner, &full);
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{args:?}: not JSON ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(doc["schema"], "berth.cli/v1", "{doc}");
        (out.status.code().unwrap(), doc)
    }

    pub fn json(&self, args: &[&str]) -> (i32, Value) {
        self.json_as("tester", args)
    }

    pub fn create(&self, owner: &str) -> String {
        let (code, doc) = self.json_as(owner, &["create"]);
        assert_eq!(code, 0, "{doc}");
        doc["sandbox"]["berth_id"].as_str().unwrap().to_owned()
    }

    /// A docker sandbox of the test image, made with `extra` arguments; its id.
    pub fn create_docker(&self, extra: &[&str]) -> String {
        let image = test_image();
        let mut args = vec!["create", "-p", "docker", "--image", &image];
        args.extend_from_slice(extra);
        let (code, doc) = self.json(&args);
        assert_eq!(code, 0, "{doc}");
        doc["sandbox"]["berth_id"].as_str().unwrap().to_owned()
    }

    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.path().join("state/host/sandboxes").join(id)
    }

    pub fn ledger_state(&self, owner: &str, id: &str) -> String {
        let (_, doc) = self.json_as(owner, &["ledger", "list", "--all"]);
        doc["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["berth_id"] == id)
            .map(|e| e["state"].as_str().unwrap().to_owned())
            .unwrap_or_else(|| panic!("{id} not in ledger: {doc}"))
    }

    /// Every byte Berth persisted: the database files and the provider state.
    pub fn assert_no_canary_persisted(&self) {
        let holding = berth_testkit::files_holding(self.path(), CANARY.as_bytes());
        assert!(holding.is_empty(), "canary secret persisted in {holding:?}");
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        // Leave nothing running: sweep for every owner this test acted as.
        let owners: Vec<String> = self.owners.borrow().iter().cloned().collect();
        for owner in owners {
            let _ = self.run_as(&owner, &["ledger", "sweep"]);
        }
    }
}

/// `berth cp` of a file onto a directory in sandbox `id` is refused (invalid input) and changes
/// nothing: the directory keeps its tree and nothing of the copy is left beside it.
pub fn a_file_onto_a_directory_changes_nothing(home: &Home, id: &str) {
    home.sh(
        id,
        "mkdir -p onto/tree/sub && echo precious > onto/tree/sub/f",
    );
    let small = home.path().join("small.txt");
    std::fs::write(&small, b"x").unwrap();
    let (code, doc) = home.json(&["cp", small.to_str().unwrap(), &format!("{id}:onto/tree")]);
    assert_eq!(code, 5, "{doc}");
    let out = home.sh(id, "cat onto/tree/sub/f; ls -A onto");
    assert_eq!(
        text(&out.stdout),
        "precious\ntree\n",
        "{}",
        text(&out.stderr)
    );
}

pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                out.extend(walk(&path));
            } else if meta.is_file() {
                out.push(path);
            }
        }
    }
    out
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Polls until `check` holds. The ceiling is generous because other tests (a nested cargo
/// build among them) share the machine's two cores; it bounds a hang, it does not time anything.
pub fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// Starts `berth run -- sh -c 'echo $$ > pid; sleep 60'` and waits until the command runs.
pub fn start_run(home: &Home) -> (RunningCli, String, i32) {
    start_run_of(home, "exec sleep 60", Stdio::null())
}

/// `berth run -- sh -c 'echo $$ > pid; SCRIPT'`, once the script runs: the child, the
/// sandbox's id and the script's pid.
/// A `berth run` under way, killed if the test ends first (a failed assertion must not leave
/// it waiting forever: the home's sweep then takes its sandbox, its run being over).
pub struct RunningCli(Option<Child>);

impl From<Child> for RunningCli {
    fn from(child: Child) -> RunningCli {
        RunningCli(Some(child))
    }
}

impl RunningCli {
    pub fn wait_with_output(mut self) -> std::io::Result<std::process::Output> {
        self.0.take().expect("not yet waited").wait_with_output()
    }
}

impl std::ops::Deref for RunningCli {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().expect("not yet waited")
    }
}

impl std::ops::DerefMut for RunningCli {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("not yet waited")
    }
}

impl Drop for RunningCli {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn start_run_of(home: &Home, script: &str, stdout: Stdio) -> (RunningCli, String, i32) {
    let script = format!("echo $$ > pid; {script}");
    let child = RunningCli(Some(
        home.command("tester", &["run", "--", "sh", "-c", &script])
            .stdout(stdout)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let sandboxes = home.path().join("state/host/sandboxes");
    let mut found = None;
    wait_for("the run's command to start", || {
        let Ok(entries) = std::fs::read_dir(&sandboxes) else {
            return false;
        };
        for entry in entries.flatten() {
            if let Ok(pid) = std::fs::read_to_string(entry.path().join("workspace/pid")) {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    found = Some((entry.file_name().to_string_lossy().into_owned(), pid));
                    return true;
                }
            }
        }
        false
    });
    let (id, pid) = found.unwrap();
    (child, id, pid)
}

/// A 4 GiB sparse file in the home: seconds of copying into a sandbox to be killed in.
pub fn big_sparse_file(home: &Home) -> PathBuf {
    let local = home.path().join("big.local");
    std::fs::File::create(&local)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    local
}

/// `berth ARGS…` as `owner`, SIGKILLed once it has written 64 MiB (to a file or a socket, as
/// the kernel counts its writes): nothing of Berth's runs after that.
pub fn killed_midway(home: &Home, owner: &str, args: &[&str]) {
    let child = home
        .command(owner, args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = RunningCli(Some(child));
    let io_file = format!("/proc/{}/io", child.id());
    wait_for("the command to be under way", || {
        let io = std::fs::read_to_string(&io_file).unwrap_or_default();
        io.lines()
            .find_map(|l| l.strip_prefix("wchar: "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 64 << 20)
    });
    signal(&child, nix::sys::signal::Signal::SIGKILL);
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{args:?} ended before it was killed"
    );
}

pub fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

pub fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
}

/// Docker is shared by every test on the machine and sweeps discover by owner label, so each
/// docker test acts as an owner of its own.
///
/// Docker-backed CLI tests need a running engine and the reference image; they fail without
/// them unless `BERTH_SKIP_DOCKER=1` says to skip explicitly.
pub fn docker_ready() -> bool {
    let engine = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output();
    let image = std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth/agent:bookworm".into());
    let has_image = Command::new("docker")
        .args(["image", "inspect", &image])
        .output();
    let ok = matches!(engine, Ok(ref o) if o.status.success())
        && matches!(has_image, Ok(ref o) if o.status.success());
    if ok {
        return true;
    }
    if std::env::var_os("BERTH_SKIP_DOCKER").is_some() {
        eprintln!("SKIPPED (BERTH_SKIP_DOCKER set): no docker engine or image {image}");
        return false;
    }
    panic!("docker engine or image {image} missing; run scripts/test (or set BERTH_SKIP_DOCKER=1 to skip explicitly)");
}

pub fn test_image() -> String {
    std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth/agent:bookworm".into())
}

pub fn container_exists(name: &str) -> bool {
    Command::new("docker")
        .args(["inspect", "--format", "{{.State.Status}}", name])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

pub struct ForeignContainer(pub String);

impl Drop for ForeignContainer {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

pub fn foreign_container(name: &str, labels: &[&str]) -> ForeignContainer {
    let mut cmd = Command::new("docker");
    cmd.args(["run", "-d", "--name", name, "--network", "none"]);
    for label in labels {
        cmd.args(["--label", label]);
    }
    cmd.args([&test_image(), "sleep", "300"]);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    ForeignContainer(name.to_owned())
}

pub fn which(program: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|candidate| candidate.is_file())
        })
        .ok_or(())
}

/// A running `berth serve` on a free loopback port (killed on drop); `addr` is `HOST:PORT`.
pub struct Served {
    pub child: Child,
    pub addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `berth serve --listen 127.0.0.1:0 --allow-unisolated` (the tests' sandboxes are the
/// host's) and reads the address it printed.
pub fn serve(home: &Home) -> Served {
    serve_with(home, &["--allow-unisolated"])
}

/// Starts `berth serve --listen 127.0.0.1:0 EXTRA…` and reads the address it printed.
pub fn serve_with(home: &Home, extra: &[&str]) -> Served {
    serve_configured(home, extra, &[])
}

/// [`serve_with`], the server's environment holding `env` too.
pub fn serve_configured(home: &Home, extra: &[&str], env: &[(&str, String)]) -> Served {
    use std::io::BufRead;
    let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut child = home
        .command("server", &args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    Served { child, addr }
}

/// A bench target's `met` agrees with the verdict it names: true for `met`, false for
/// `not_met`, null for `undecided` (the run could not tell); any other verdict fails.
pub fn assert_verdict_agrees(target: &Value) {
    let met = match target["verdict"].as_str() {
        Some("met") => Value::Bool(true),
        Some("not_met") => Value::Bool(false),
        Some("undecided") => Value::Null,
        other => panic!("verdict {other:?} in {target}"),
    };
    assert_eq!(target["met"], met, "{target}");
}

/// `berth ls` lists what the provider's file API sees of sandbox `id`, sorted: a symlink is
/// shown as one and never listed through, a name with a control character reaches the terminal
/// escaped, `..` and a missing directory are refused with their codes. Destroys the sandbox.
pub fn assert_ls_lists_and_never_follows_a_link(home: &Home, id: &str) {
    let made = home.sh(
        id,
        "mkdir -p d/e && printf abc > d/f && ln -s /etc d/l && touch \"d/$(printf 'x\\033[31my')\"",
    );
    assert!(made.status.success(), "{}", text(&made.stderr));
    let (code, doc) = home.json(&["ls", &format!("{id}:d")]);
    assert_eq!(code, 0, "{doc}");
    let entries: Vec<(String, String, u64)> = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["kind"].as_str().unwrap().to_owned(),
                e["size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            ("e".into(), "dir".into(), 0),
            ("f".into(), "file".into(), 3),
            ("l".into(), "symlink".into(), 0),
            ("x\u{1b}[31my".into(), "file".into(), 0),
        ],
        "{id}: {doc}"
    );
    let shown = home.run(&["ls", &format!("{id}:d")]);
    assert!(shown.status.success());
    let shown = text(&shown.stdout);
    assert!(
        !shown.contains('\u{1b}'),
        "{id}: a raw escape reached the terminal: {shown:?}"
    );
    assert!(shown.contains("x\\u{1b}[31my"), "{id}: {shown}");
    for (path, code) in [("d/l", 5), ("..", 5), ("d/../..", 5), ("nothing", 3)] {
        let out = home.run(&["ls", &format!("{id}:{path}")]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{id}:{path}: {}",
            text(&out.stderr)
        );
    }
    let out = home.run(&["destroy", id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// An image the test builds, removed when the test ends however it ends.
pub struct TestImage(pub &'static str);

impl TestImage {
    /// `berth/agent:bookworm` with `extra` (Dockerfile lines) on top, tagged as this image.
    pub fn build(&self, extra: &str) {
        use std::io::Write;
        let mut build = Command::new("docker")
            .args(["build", "-q", "-t", self.0, "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let dockerfile = format!("FROM berth/agent:bookworm\n{extra}\n");
        build
            .stdin
            .take()
            .unwrap()
            .write_all(dockerfile.as_bytes())
            .unwrap();
        let out = build.wait_with_output().unwrap();
        assert!(out.status.success(), "docker build: {}", text(&out.stderr));
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", self.0]).output();
    }
}

/// `berth mission run FILE` as `owner`, killed once its agent has written its pid to
/// `marks/agent`: the mission is left running with its attempt in progress and its sandbox held.
/// The mission's id.
pub fn mission_left_running(home: &Home, owner: &str, file: &Path, marks: &Path) -> String {
    let mut runner = home
        .command(owner, &["mission", "run", &file.to_string_lossy()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    berth_testkit::wait_for_pids(marks, &["agent"], Duration::from_secs(20))
        .expect("the agent never started");
    runner.kill().unwrap();
    runner.wait().unwrap();
    let (_, listed) = home.json_as(owner, &["mission", "list"]);
    listed["missions"][0]["id"].as_str().unwrap().to_owned()
}

/// The reference image with the pinned agent CLIs (`scripts/build-agent-clis-image.sh`).
pub const AGENT_IMAGE: &str = "berth/agent-clis:bookworm";

/// Whether [`AGENT_IMAGE`] is built; missing, the test fails unless `BERTH_SKIP_AGENT_CLIS=1`
/// says to skip it.
pub fn agent_image() -> bool {
    let found = Command::new("docker")
        .args(["image", "inspect", AGENT_IMAGE])
        .output();
    if matches!(found, Ok(ref o) if o.status.success()) {
        return true;
    }
    if std::env::var("BERTH_SKIP_AGENT_CLIS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: {AGENT_IMAGE} not built (BERTH_SKIP_AGENT_CLIS=1)");
        return false;
    }
    panic!("{AGENT_IMAGE} is missing: run scripts/setup-substrates (or BERTH_SKIP_AGENT_CLIS=1)");
}

/// The S3 configuration of a fresh prefix on the test server (SeaweedFS, started by
/// `scripts/test`), or `None` when skipped explicitly.
pub fn s3_env(name: &str) -> Option<(Vec<(&'static str, String)>, berth_artifacts::Objects)> {
    let Ok(endpoint) = std::env::var("BERTH_TEST_S3_ENDPOINT") else {
        if std::env::var("BERTH_SKIP_S3").as_deref() == Ok("1") {
            return None;
        }
        panic!("BERTH_TEST_S3_ENDPOINT is not set: run scripts/test (it starts SeaweedFS), or BERTH_SKIP_S3=1");
    };
    let prefix = format!(
        "{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let objects = berth_artifacts::Objects::s3(&berth_artifacts::S3Config {
        url: format!("s3://artifacts/{prefix}"),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
        access_key_id: "test".into(),
        secret_access_key: "testsecret".into(),
    })
    .unwrap();
    let env = vec![
        ("BERTH_ARTIFACTS_URL", format!("s3://artifacts/{prefix}")),
        ("BERTH_ARTIFACTS_ENDPOINT", endpoint),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "testsecret".into()),
    ];
    Some((env, objects))
}
