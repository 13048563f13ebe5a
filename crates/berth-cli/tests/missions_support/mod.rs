//! Helpers shared by missions.rs and the files split from it.
#![allow(dead_code)] // each test binary uses its own subset

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub fn berth(home: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.args(args)
        .env("BERTH_HOME", home)
        .env("BERTH_OWNER", "mission-tester")
        .env_remove("BERTH_FAULT")
        .stdin(Stdio::null());
    cmd
}

pub fn run(home: &Path, args: &[&str]) -> Output {
    berth(home, args).output().unwrap()
}

pub fn json(home: &Path, args: &[&str]) -> (i32, Value) {
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

pub fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/fix-the-test/mission.toml")
}

pub fn home() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("berth-test-mission-")
        .tempdir()
        .unwrap()
}

pub fn only_mission(home: &Path) -> String {
    let (_, doc) = json(home, &["mission", "list"]);
    let missions = doc["missions"].as_array().unwrap();
    assert_eq!(missions.len(), 1, "{doc}");
    missions[0]["id"].as_str().unwrap().to_owned()
}

/// The ledger's sandbox rows (snapshot rows — mission checkpoints — are kept by retention).
pub fn sandbox_rows(doc: &Value) -> Vec<Value> {
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
pub fn drop_checkpoints(home: &Path) {
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

/// Every sandbox the mission made is verified gone, one per attempt and one validator's per
/// attempt — plus at most `revalidations` more validator's (a validation a kill interrupted
/// runs again in a fresh sandbox) — and none is left; each accepted attempt's checkpoint is a
/// snapshot row, kept by its retention.
pub fn assert_clean_ledger(home: &Path, attempts: usize, revalidations: usize) {
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
    let role = |role: &str| {
        rows.iter()
            .filter(|r| r["origin"].as_str().unwrap_or_default().ends_with(role))
            .count()
    };
    assert_eq!(role(" attempt"), attempts, "one sandbox per attempt: {doc}");
    let validators = role(" validator");
    assert!(
        (attempts..=attempts + revalidations).contains(&validators),
        "{validators} validator sandboxes for {attempts} attempts: {doc}"
    );
    assert_eq!(rows.len(), attempts + validators, "{doc}");
    for row in rows {
        assert_eq!(row["state"], "verified_gone", "{row}");
    }
    let dir = home.join("state/host/sandboxes");
    let left = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "sandbox directories left in {}", dir.display());
}

/// How many events an uninterrupted run of the example stores (each is a durable boundary).
pub fn example_events() -> u64 {
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

pub fn assert_example_succeeded(home: &Path, id: &str) {
    assert_example_succeeded_in(home, id, example_events_cached());
}

pub fn example_events_cached() -> u64 {
    static EVENTS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *EVENTS.get_or_init(example_events)
}

pub fn assert_example_succeeded_in(home: &Path, id: &str, events: u64) {
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

pub fn write_mission(
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

pub fn first_reason(home: &Path) -> (i32, String, Value) {
    let id = only_mission(home);
    let (_, doc) = json(home, &["mission", "status", &id]);
    let attempt = &doc["mission"]["tasks"][0]["attempts"][0]["status"];
    let reason = attempt["reason"].as_str().unwrap_or_default().to_owned();
    (0, reason, doc)
}

/// SIGKILL `mission run` at points spread over the whole run (inside steps, not only at event
/// boundaries), sometimes sweep the ledger as an operator would, then resume: with one attempt
/// allowed and an agent that is always right, the mission succeeds every time, and nothing is
/// left behind.
pub fn kill_anywhere(provider: &str, image: Option<&str>, kills: u64, step_ms: u64) {
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

/// Whether the docker engine and the reference image are there; without them a docker test
/// fails, unless `BERTH_SKIP_DOCKER=1` says to skip it explicitly.
pub fn reference_image_ready() -> bool {
    let image = Command::new("docker")
        .args(["image", "inspect", "berth/agent:bookworm"])
        .output();
    if matches!(image, Ok(ref o) if o.status.success()) {
        return true;
    }
    if std::env::var_os("BERTH_SKIP_DOCKER").is_some() {
        eprintln!("SKIPPED (BERTH_SKIP_DOCKER set): no docker engine or reference image");
        return false;
    }
    panic!("docker engine or berth/agent:bookworm missing; run scripts/test (or set BERTH_SKIP_DOCKER=1)");
}

/// `mission run FILE` in the background until each of `names` has written its pid into
/// `marks` (30 s at most; the runner is killed if not): the runner and those pids.
pub fn run_until_marked(
    home: &Path,
    file: &Path,
    marks: &Path,
    names: &[&str],
) -> (std::process::Child, Vec<i32>) {
    let mut runner = berth(home, &["mission", "run", file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    match berth_testkit::wait_for_pids(marks, names, std::time::Duration::from_secs(30)) {
        Some(pids) => (runner, pids),
        None => {
            kill_runner(&mut runner);
            panic!("{names:?} never started");
        }
    }
}

/// SIGKILLs a runner and reaps it.
pub fn kill_runner(runner: &mut std::process::Child) {
    runner.kill().unwrap();
    runner.wait().unwrap();
}
