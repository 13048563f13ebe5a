//! Missions end to end through the `berth` binary on the host provider: the bundled example,
//! crash recovery at every durable boundary (SIGKILL, then `mission resume`), and validator
//! cases (pass, fail, vacuous pass, timeout, tampering after the freeze).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn berth(home: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.args(args)
        .env("BERTH_HOME", home)
        .env("BERTH_OWNER", "mission-tester")
        .env_remove("BERTH_FAULT")
        .stdin(Stdio::null());
    cmd
}

fn run(home: &Path, args: &[&str]) -> Output {
    berth(home, args).output().unwrap()
}

fn json(home: &Path, args: &[&str]) -> (i32, Value) {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = run(home, &full);
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), doc)
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/fix-the-test/mission.toml")
}

fn home() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("berth-test-mission-")
        .tempdir()
        .unwrap()
}

fn only_mission(home: &Path) -> String {
    let (_, doc) = json(home, &["mission", "list"]);
    let missions = doc["missions"].as_array().unwrap();
    assert_eq!(missions.len(), 1, "{doc}");
    missions[0]["id"].as_str().unwrap().to_owned()
}

/// The ledger's sandbox rows (snapshot rows — mission checkpoints — are kept by retention).
fn sandbox_rows(doc: &Value) -> Vec<Value> {
    doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "sandbox")
        .cloned()
        .collect()
}

/// Deletes the mission's checkpoints (snapshot rows), as an operator would with `berth
/// destroy`: tests leave no snapshot image or archive behind.
fn drop_checkpoints(home: &Path) {
    let (_, doc) = json(home, &["ledger", "list"]);
    for row in doc["entries"].as_array().unwrap() {
        if row["kind"] == "snapshot" {
            let key = row["berth_id"].as_str().unwrap();
            let out = run(home, &["destroy", key]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Every sandbox the mission made is verified gone, one per attempt role, and none is left;
/// each accepted attempt's checkpoint is a snapshot row, kept by its retention.
fn assert_clean_ledger(home: &Path, expected_rows: usize) {
    let (_, doc) = json(home, &["ledger", "list", "--all"]);
    for checkpoint in doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "snapshot")
    {
        assert_eq!(checkpoint["state"], "created", "{checkpoint}");
        assert!(
            checkpoint["expires_at"].is_string(),
            "a checkpoint without retention: {checkpoint}"
        );
    }
    let rows = sandbox_rows(&doc);
    let rows = &rows;
    assert_eq!(
        rows.len(),
        expected_rows,
        "one sandbox per attempt and role: {doc}"
    );
    for row in rows {
        assert_eq!(row["state"], "verified_gone", "{row}");
    }
    let dir = home.join("state/host/sandboxes");
    let left = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "sandbox directories left in {}", dir.display());
}

/// How many events an uninterrupted run of the example stores (each is a durable boundary).
fn example_events() -> u64 {
    let home = home();
    let out = run(
        home.path(),
        &["mission", "run", example().to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = only_mission(home.path());
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    doc["events"].as_u64().expect("an event count")
}

fn assert_example_succeeded(home: &Path, id: &str) {
    assert_example_succeeded_in(home, id, example_events_cached());
}

fn example_events_cached() -> u64 {
    static EVENTS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *EVENTS.get_or_init(example_events)
}

fn assert_example_succeeded_in(home: &Path, id: &str, events: u64) {
    let (code, doc) = json(home, &["mission", "status", id]);
    assert_eq!(code, 0);
    let mission = &doc["mission"];
    assert_eq!(mission["state"]["state"], "succeeded", "{doc}");
    let attempts = mission["tasks"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "no lost and no extra attempt: {doc}");
    assert_eq!(attempts[0]["status"]["status"], "rejected");
    assert_eq!(attempts[1]["status"]["status"], "accepted");
    assert_eq!(attempts[1]["status"]["finalized"], true);
    assert_eq!(doc["events"], events, "every event exactly once");
}

#[test]
fn the_bundled_example_is_rejected_once_then_accepted() {
    let home = home();
    let out = run(
        home.path(),
        &["mission", "run", example().to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("REJECTED — validator exited with code 1"),
        "{stdout}"
    );
    assert!(stdout.contains("succeeded"), "{stdout}");
    let id = only_mission(home.path());
    assert_example_succeeded(home.path(), &id);
    assert_clean_ledger(home.path(), 4);
    // The accepted work is exported: the bundle holds a commit where the test passes.
    let bundle = home.path().join(format!("missions/{id}/fix-add.bundle"));
    let clone = home.path().join("check");
    let status = Command::new("git")
        .args(["clone", "-q"])
        .arg(&bundle)
        .arg(&clone)
        .status()
        .unwrap();
    assert!(status.success());
    let calc = std::fs::read_to_string(clone.join("calc.py")).unwrap();
    assert!(calc.contains("return a + b"), "{calc}");
}

#[test]
fn a_kill_at_every_durable_boundary_resumes_to_the_same_result() {
    // The boundaries come from the event log of an uninterrupted run, not a hard-coded count.
    let events = example_events_cached();
    assert!(
        events > 2,
        "the example stores its steps as events ({events})"
    );
    for boundary in ["kill-before-event", "kill-after-event"] {
        // One past the last event the fault never fires: the run completes on its own.
        let beyond_home = home();
        let beyond = format!("{boundary}:{}", events + 1);
        let out = berth(
            beyond_home.path(),
            &["mission", "run", example().to_str().unwrap()],
        )
        .env("BERTH_FAULT", &beyond)
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{beyond}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for n in 1..=events {
            let home = home();
            let fault = format!("{boundary}:{n}");
            let out = berth(
                home.path(),
                &["mission", "run", example().to_str().unwrap()],
            )
            .env("BERTH_FAULT", &fault)
            .output()
            .unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                out.status.signal(),
                Some(9),
                "{fault}: the process was not killed"
            );
            let id = only_mission(home.path());
            let resumed = run(home.path(), &["mission", "resume", &id]);
            assert!(
                resumed.status.success(),
                "{fault}: resume failed: {}{}",
                String::from_utf8_lossy(&resumed.stdout),
                String::from_utf8_lossy(&resumed.stderr)
            );
            assert_example_succeeded(home.path(), &id);
            assert_clean_ledger(home.path(), 4);
        }
    }
}

fn write_mission(
    dir: &Path,
    agent: &str,
    validator: &str,
    timeout: &str,
    evidence: &str,
    attempts: u32,
) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir_all(repo.join(".agent")).unwrap();
    std::fs::write(repo.join("README"), "case\n").unwrap();
    std::fs::write(repo.join(".agent/agent.sh"), agent).unwrap();
    let file = dir.join("mission.toml");
    std::fs::write(
        &file,
        format!(
            r#"schema_version = 1
name = "case"
[repository]
path = "repo"
base = "snapshot"
[sandbox]
provider = "host"
[harness]
kind = "script"
command = "sh .agent/agent.sh"
[[tasks]]
id = "t"
instructions = "do it"
max_attempts = {attempts}
agent_timeout = "30s"
[tasks.validator]
command = {validator:?}
timeout = "{timeout}"
evidence = [{evidence}]
"#
        ),
    )
    .unwrap();
    file
}

fn first_reason(home: &Path) -> (i32, String, Value) {
    let id = only_mission(home);
    let (_, doc) = json(home, &["mission", "status", &id]);
    let attempt = &doc["mission"]["tasks"][0]["attempts"][0]["status"];
    let reason = attempt["reason"].as_str().unwrap_or_default().to_owned();
    (0, reason, doc)
}

#[test]
fn validator_cases_pass_fail_vacuous_timeout() {
    let cases = [
        (
            "pass",
            "echo ok > .berth-out",
            "\".berth-out\"",
            "10s",
            "accepted",
        ),
        (
            "fail",
            "exit 3",
            "\".berth-out\"",
            "10s",
            "validator exited with code 3",
        ),
        ("vacuous", "true", "\".berth-out\"", "10s", "vacuous pass"),
        (
            "timeout",
            "sleep 30",
            "\".berth-out\"",
            "1s",
            "validator timed out",
        ),
    ];
    for (name, validator, evidence, timeout, want) in cases {
        let home = home();
        let file = write_mission(home.path(), "true\n", validator, timeout, evidence, 1);
        let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
        let (_, reason, doc) = first_reason(home.path());
        if want == "accepted" {
            assert!(out.status.success(), "{name}: {doc}");
            assert_eq!(doc["mission"]["state"]["state"], "succeeded", "{name}");
        } else {
            assert_eq!(
                out.status.code(),
                Some(12),
                "{name}: an exhausted mission exits 12"
            );
            assert_eq!(doc["mission"]["state"]["state"], "failed", "{name}: {doc}");
            assert_eq!(doc["mission"]["tasks"][0]["state"]["state"], "exhausted");
            assert!(reason.contains(want), "{name}: reason {reason:?}");
        }
        assert_clean_ledger(home.path(), 2);
    }
}

#[test]
fn tampering_after_the_freeze_cannot_change_the_verdict() {
    let home = home();
    // The agent writes the right answer, then leaves a process (outside its process group) that
    // overwrites it shortly after the agent has stopped and the workspace is frozen.
    let agent = "echo 42 > answer.txt\nsetsid sh -c 'sleep 0.4; echo 0 > answer.txt' </dev/null >/dev/null 2>&1 &\n";
    let validator = "sleep 1.5; test \"$(cat answer.txt)\" = 42 && echo ok > .berth-out";
    let file = write_mission(home.path(), agent, validator, "20s", "\".berth-out\"", 1);
    let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
    let (_, _, doc) = first_reason(home.path());
    assert!(
        out.status.success(),
        "the frozen copy kept the agent's answer: {doc}"
    );
    assert_clean_ledger(home.path(), 2);
}

#[test]
fn the_example_mission_runs_on_docker_too() {
    let engine = Command::new("docker")
        .args(["image", "inspect", "berth/agent:bookworm"])
        .output();
    if !matches!(engine, Ok(ref o) if o.status.success()) {
        if std::env::var_os("BERTH_SKIP_DOCKER").is_some() {
            eprintln!("SKIPPED (BERTH_SKIP_DOCKER set): no docker engine or reference image");
            return;
        }
        panic!("docker engine or berth/agent:bookworm missing; run scripts/test (or set BERTH_SKIP_DOCKER=1)");
    }
    let home = home();
    let dir = home.path().join("mission");
    std::fs::create_dir_all(&dir).unwrap();
    let example_dir = example().parent().unwrap().to_owned();
    let status = Command::new("cp")
        .arg("-r")
        .arg(example_dir.join("repo"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(example()).unwrap().replace(
        "provider = \"host\"",
        "provider = \"docker\"\nimage = \"berth/agent:bookworm\"",
    );
    let file = dir.join("mission.toml");
    std::fs::write(&file, text).unwrap();
    let out = berth(home.path(), &["mission", "run", file.to_str().unwrap()])
        .env(
            "BERTH_OWNER",
            format!("mission-docker-{}", std::process::id()),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cmd = berth(home.path(), &["--json", "mission", "list"]);
    cmd.env(
        "BERTH_OWNER",
        format!("mission-docker-{}", std::process::id()),
    );
    let list: Value = serde_json::from_slice(&cmd.output().unwrap().stdout).unwrap();
    let id = list["missions"][0]["id"].as_str().unwrap().to_owned();
    let mut cmd = berth(home.path(), &["--json", "mission", "status", &id]);
    cmd.env(
        "BERTH_OWNER",
        format!("mission-docker-{}", std::process::id()),
    );
    let doc: Value = serde_json::from_slice(&cmd.output().unwrap().stdout).unwrap();
    assert_eq!(doc["mission"]["state"]["state"], "succeeded", "{doc}");
    let checkpoint = doc["mission"]["tasks"][0]["attempts"][1]["status"]["checkpoint"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        checkpoint.starts_with("sha256:"),
        "a docker commit digest: {checkpoint}"
    );
    // The checkpoint image is the mission's restorable artifact; the test removes it.
    let _ = Command::new("docker").args(["rmi", &checkpoint]).output();
    let left = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=berth.owner=mission-docker-{}", std::process::id()),
        ])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "containers left behind");
}

#[test]
fn bad_mission_files_and_unsupported_requests_are_clear_errors() {
    let home = home();
    let dir = home.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "schema_version = 1\nname = \"x\"\n").unwrap();
    let out = run(home.path(), &["mission", "run", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 1") && stderr.contains("missing field `repository`"),
        "{stderr}"
    );
}

/// An unavailable provider falls back to the next; a provider that refuses the request (a
/// missing image) does not.
#[test]
fn missions_fall_back_only_when_the_provider_is_unavailable() {
    let home = home();
    let dir = home.path().join("m");
    let file = write_mission(
        &dir,
        "true\n",
        "echo ok > .berth-out",
        "10s",
        "\".berth-out\"",
        1,
    );
    let text = std::fs::read_to_string(&file).unwrap().replace(
        "provider = \"host\"",
        "provider = \"docker\"\nimage = \"berth/agent:bookworm\"\nfallback = [\"host\"]",
    );
    std::fs::write(&file, text).unwrap();
    let out = berth(home.path(), &["mission", "run", file.to_str().unwrap()])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let id = only_mission(home.path());
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    let sandbox = doc["facts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "sandbox")
        .unwrap()
        .clone();
    assert_eq!(sandbox["detail"]["provider"], "host", "{doc}");
    let skipped = sandbox["detail"]["fallback_skipped"][0]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        skipped.starts_with("docker:") && skipped.contains("not reachable"),
        "{skipped}"
    );
    let (_, ledger) = json(home.path(), &["ledger", "list", "--all"]);
    for row in sandbox_rows(&ledger) {
        if row["provider"] == "host" {
            assert_eq!(row["state"], "verified_gone", "{row}");
        } else {
            // Docker was unreachable: nothing was created, and the ledger cannot verify it gone.
            assert_ne!(row["state"], "verified_gone", "{row}");
        }
    }

    // A refused request is not a fallback reason: the attempt is rejected, host never tried.
    let home = self::home();
    let dir = home.path().join("m");
    let file = write_mission(
        &dir,
        "true\n",
        "echo ok > .berth-out",
        "10s",
        "\".berth-out\"",
        1,
    );
    let text = std::fs::read_to_string(&file).unwrap().replace(
        "provider = \"host\"",
        "provider = \"docker\"\nimage = \"berth/never-built:none\"\nfallback = [\"host\"]",
    );
    std::fs::write(&file, text).unwrap();
    if Command::new("docker")
        .arg("info")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
    {
        let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(12));
        let (_, reason, _) = first_reason(home.path());
        assert!(reason.contains("never pulls"), "{reason}");
        let (_, ledger) = json(home.path(), &["ledger", "list", "--all"]);
        let rows = ledger["entries"].as_array().unwrap();
        assert!(
            rows.iter().all(|r| r["provider"] == "docker"),
            "host was tried: {ledger}"
        );
    } else if std::env::var_os("BERTH_SKIP_DOCKER").is_none() {
        panic!("docker engine missing; run scripts/test (or set BERTH_SKIP_DOCKER=1)");
    }
}

#[test]
fn a_mission_can_start_from_a_git_url() {
    let home = home();
    // A real repository reached by URL (file://), at a named branch.
    let upstream = home.path().join("upstream");
    let example_repo = example().parent().unwrap().join("repo");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(&example_repo)
        .arg(&upstream)
        .status()
        .unwrap();
    assert!(copied.success());
    for args in [
        vec!["init", "-q", "-b", "trunk"],
        vec!["add", "-A"],
        vec![
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@l",
            "commit",
            "-q",
            "-m",
            "upstream",
        ],
    ] {
        assert!(Command::new("git")
            .arg("-C")
            .arg(&upstream)
            .args(&args)
            .status()
            .unwrap()
            .success());
    }
    let text = std::fs::read_to_string(example())
        .unwrap()
        .replace(
            "path = \"repo\"",
            &format!("url = \"file://{}\"", upstream.display()),
        )
        .replace("base = \"snapshot\"", "base = \"trunk\"");
    let file = home.path().join("mission.toml");
    std::fs::write(&file, text).unwrap();
    let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let id = only_mission(home.path());
    assert_example_succeeded(home.path(), &id);
}

/// One runner per mission: while a runner holds the lease, concurrent `mission resume`s exit 8
/// at once without running an agent; the first runner finishes with exactly one agent run.
#[test]
fn concurrent_runners_exit_8_and_run_nothing() {
    let home = home();
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("agent-runs");
    std::fs::create_dir(&runs).unwrap();
    // The agent leaves a mark outside the sandbox (host isolates nothing), then works slowly.
    let agent = format!(
        "touch {}/run-$$; sleep 3; mkdir -p .berth; echo ok > .berth/verdict\n",
        runs.display()
    );
    let file = write_mission(
        dir.path(),
        &agent,
        "test -f .berth/verdict",
        "30s",
        "\".berth/verdict\"",
        1,
    );
    let mut first = berth(home.path(), &["mission", "run", file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the first runner's agent is running (it holds the lease by then).
    for _ in 0..600 {
        if std::fs::read_dir(&runs).unwrap().count() > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_dir(&runs).unwrap().count(),
        1,
        "agent never started"
    );
    let id = only_mission(home.path());
    let others: Vec<_> = (0..4)
        .map(|_| {
            berth(home.path(), &["--json", "mission", "resume", &id])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for other in others {
        let out = other.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(8),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["error"]["kind"], "conflict", "{doc}");
    }
    assert!(first.wait().unwrap().success());
    assert_eq!(
        std::fs::read_dir(&runs).unwrap().count(),
        1,
        "a second agent ran"
    );
    let (code, doc) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(code, 0);
    assert_eq!(doc["mission"]["state"]["state"], "succeeded", "{doc}");
    // The lease is released: a later resume of the finished mission is not refused.
    let again = run(home.path(), &["mission", "resume", &id]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

/// SIGKILL `mission run` at points spread over the whole run (inside steps, not only at event
/// boundaries), sometimes sweep the ledger as an operator would, then resume: with one attempt
/// allowed and an agent that is always right, the mission succeeds every time, and nothing is
/// left behind.
fn kill_anywhere(provider: &str, image: Option<&str>, kills: u64, step_ms: u64) {
    let dir = tempfile::tempdir().unwrap();
    let file = write_mission(
        dir.path(),
        "printf right > answer.txt\n",
        "test \"$(cat answer.txt)\" = right && mkdir -p .berth && echo pass > .berth/verdict",
        "60s",
        "\".berth/verdict\"",
        1,
    );
    let mut text = std::fs::read_to_string(&file).unwrap();
    text = text.replace("provider = \"host\"", &format!("provider = \"{provider}\""));
    if let Some(image) = image {
        text = text.replace("[harness]", &format!("image = \"{image}\"\n[harness]"));
    }
    std::fs::write(&file, text).unwrap();
    for round in 0..kills {
        let home = home();
        let delay = std::time::Duration::from_millis(round * step_ms);
        let mut child = berth(home.path(), &["mission", "run", file.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        let (_, listed) = json(home.path(), &["mission", "list"]);
        let Some(id) = listed["missions"][0]["id"].as_str().map(str::to_owned) else {
            continue; // killed before the mission was registered: nothing to resume
        };
        if round % 2 == 1 {
            let swept = run(home.path(), &["ledger", "sweep"]);
            assert!(
                swept.status.success(),
                "round {round}: sweep failed: {}{}",
                String::from_utf8_lossy(&swept.stdout),
                String::from_utf8_lossy(&swept.stderr)
            );
        }
        let resumed = run(home.path(), &["mission", "resume", &id]);
        let (_, doc) = json(home.path(), &["mission", "status", &id]);
        assert!(
            resumed.status.success(),
            "round {round} ({delay:?}): resume failed: {}{}\n{doc}",
            String::from_utf8_lossy(&resumed.stdout),
            String::from_utf8_lossy(&resumed.stderr)
        );
        assert_eq!(
            doc["mission"]["state"]["state"], "succeeded",
            "round {round}: {doc}"
        );
        let swept = run(home.path(), &["ledger", "sweep"]);
        assert!(swept.status.success());
        let (_, ledger) = json(home.path(), &["ledger", "list"]);
        assert_eq!(
            sandbox_rows(&ledger).len(),
            0,
            "round {round}: open sandbox rows after the mission: {ledger}"
        );
        // Exactly one checkpoint, however often the checkpoint step was interrupted.
        let checkpoints: Vec<_> = ledger["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["kind"] == "snapshot")
            .collect();
        assert_eq!(checkpoints.len(), 1, "round {round}: {ledger}");
        drop_checkpoints(home.path());
    }
}

#[test]
fn a_kill_anywhere_never_costs_an_attempt_on_host() {
    kill_anywhere("host", None, 40, 13);
}

#[test]
fn a_kill_anywhere_never_costs_an_attempt_on_docker() {
    let image = Command::new("docker")
        .args(["image", "inspect", "berth/agent:bookworm"])
        .output();
    if !matches!(image, Ok(ref o) if o.status.success()) {
        if std::env::var_os("BERTH_SKIP_DOCKER").is_some() {
            eprintln!("SKIPPED (BERTH_SKIP_DOCKER set): no docker engine or reference image");
            return;
        }
        panic!("docker engine or berth/agent:bookworm missing; run scripts/test (or set BERTH_SKIP_DOCKER=1)");
    }
    kill_anywhere("docker", Some("berth/agent:bookworm"), 10, 350);
}

/// A runner killed while its agent works takes the agent with it — including a child the
/// agent detached with `setsid` — so a resumed run's agent never works beside a stale one.
#[test]
fn a_killed_runner_leaves_no_agent_behind() {
    let home = home();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let agent = format!(
        "setsid sh -c 'echo $$ > {m}/detached; exec sleep 300' </dev/null >/dev/null 2>&1 &\n\
         echo $$ > {m}/agent\nsleep 300\n",
        m = marks.display()
    );
    let file = write_mission(dir.path(), &agent, "true", "30s", "\"README\"", 1);
    let mut runner = berth(home.path(), &["mission", "run", file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids = berth_testkit::wait_for_pids(
        &marks,
        &["agent", "detached"],
        std::time::Duration::from_secs(10),
    )
    .expect("the agent never started");
    runner.kill().unwrap();
    runner.wait().unwrap();
    assert!(
        berth_testkit::wait_all_gone(&pids, std::time::Duration::from_secs(5)),
        "the agent or its detached child {pids:?} outlived the killed runner"
    );
    let id = only_mission(home.path());
    let _ = run(home.path(), &["ledger", "sweep"]);
    // Nothing to adopt from a stale agent; the mission stays resumable (its sandbox is held).
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(doc["mission"]["state"]["state"], "running", "{doc}");
}

/// A repository cannot run code on the host: a `.git` *file* pointing at a gitdir with a
/// pre-commit hook and an fsmonitor command (what a worktree or a hostile tree carries) is
/// never copied, and Berth's own git runs without hooks, fsmonitor or outside config; a URL
/// that looks like an option never reaches git as one.
#[test]
fn a_repository_cannot_run_code_on_the_host() {
    let home = home();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let evil = dir.path().join("evil.git");
    let init = Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&evil)
        .status()
        .unwrap();
    assert!(init.success());
    let hook = |name: &str| format!("#!/bin/sh\ntouch {}/{name}\n", marks.display());
    std::fs::write(evil.join("hooks/pre-commit"), hook("pre-commit")).unwrap();
    let monitor = dir.path().join("monitor.sh");
    std::fs::write(&monitor, hook("fsmonitor")).unwrap();
    for script in [evil.join("hooks/pre-commit"), monitor.clone()] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = evil.join("config");
    for (key, value) in [
        ("core.bare", "false".to_owned()),
        ("core.fsmonitor", monitor.display().to_string()),
    ] {
        let set = Command::new("git")
            .arg("config")
            .arg("--file")
            .arg(&config)
            .args([key, &value])
            .status()
            .unwrap();
        assert!(set.success());
    }
    let file = write_mission(dir.path(), "true\n", "true", "30s", "\"README\"", 1);
    std::fs::write(
        dir.path().join("repo/.git"),
        format!("gitdir: {}\n", evil.display()),
    )
    .unwrap();
    let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ran: Vec<_> = std::fs::read_dir(&marks)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(ran.is_empty(), "repository code ran on the host: {ran:?}");

    // An option-shaped URL: refused or failed, never run.
    let text = std::fs::read_to_string(&file).unwrap().replace(
        "path = \"repo\"",
        &format!(
            "url = \"--upload-pack=touch {}/upload-pack;x:y\"",
            marks.display()
        ),
    );
    let text = text.replace("base = \"snapshot\"", "base = \"main\"");
    std::fs::write(&file, text).unwrap();
    let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        !marks.join("upload-pack").exists(),
        "a URL reached git as an option"
    );
}
