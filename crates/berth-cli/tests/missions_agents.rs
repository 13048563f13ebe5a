//! Missions run by real agent CLIs (issue 11): each example in `examples/agents/` — OpenCode,
//! Codex, Claude Code, pinned — makes a wrong change first (rejected by the validator, durably)
//! and the right one next (accepted, committed), its model traffic through the mission's
//! gateway in front of a scripted model. The agent's raw log, normalized events and the
//! gateway's journal are kept per attempt; no secret of Berth's environment is persisted.
//!
//! The CLIs come from `agents/node_modules/.bin` (`scripts/install-agent-clis`); missing CLIs
//! fail the test unless `BERTH_SKIP_AGENT_CLIS=1` says to skip it.

mod common;

use std::path::{Path, PathBuf};

use common::{Home, CANARY};
use serde_json::Value;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents")
}

fn agent_bin() -> Option<PathBuf> {
    let dir = std::env::var_os("BERTH_AGENT_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../agents/node_modules/.bin")
        });
    if ["opencode", "codex", "claude"]
        .iter()
        .all(|b| dir.join(b).exists())
    {
        return Some(dir);
    }
    if std::env::var("BERTH_SKIP_AGENT_CLIS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: agent CLIs not installed (BERTH_SKIP_AGENT_CLIS=1)");
        return None;
    }
    panic!(
        "the agent CLIs are not installed in {}: run scripts/install-agent-clis (or \
         BERTH_SKIP_AGENT_CLIS=1 to skip explicitly)",
        dir.display()
    );
}

fn run_json(home: &Home, bin: &Path, args: &[&str]) -> (i32, Value, String) {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = home
        .command("tester", &full)
        .env("BERTH_AGENT_BIN_DIR", bin)
        // A model key in Berth's own environment must reach neither the sandbox nor the store.
        .env("ANTHROPIC_API_KEY", CANARY)
        .env("OPENAI_API_KEY", CANARY)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}): {}{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code().unwrap_or(-1), doc, stderr)
}

/// Samples every process's argv while it runs; what contained a secret.
struct ArgvScan {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>)>,
}

impl ArgvScan {
    fn start(secrets: Vec<String>) -> ArgvScan {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut samples, mut found) = (0, Vec::new());
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                    let Ok(argv) = std::fs::read(entry.path().join("cmdline")) else {
                        continue;
                    };
                    let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
                    for secret in &secrets {
                        if argv.contains(secret.as_str()) && !found.contains(&argv) {
                            found.push(argv.clone());
                        }
                    }
                }
                samples += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            (samples, found)
        });
        ArgvScan { stop, thread }
    }

    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

#[test]
fn each_agent_cli_is_rejected_when_wrong_and_accepted_when_right() {
    let Some(bin) = agent_bin() else { return };
    // No secret — the canary model key in Berth's environment, or any gateway token — is ever
    // in a process's argv while the missions run.
    let scan = ArgvScan::start(vec![CANARY.to_owned(), "berth-gw-".to_owned()]);
    for kind in ["opencode", "codex", "claude-code"] {
        let home = Home::new();
        let mission = examples().join(format!("{kind}.toml"));
        let (code, doc, stderr) =
            run_json(&home, &bin, &["mission", "run", mission.to_str().unwrap()]);
        assert_eq!(code, 0, "{kind}: {doc:#}\n{stderr}");
        let id = doc["mission"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{doc:#}"));
        let (_, status, _) = run_json(&home, &bin, &["mission", "status", id]);
        let attempts = status["mission"]["tasks"][0]["attempts"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(attempts.len(), 2, "{kind}: {status:#}");
        assert_eq!(attempts[0]["status"]["status"], "rejected", "{kind}");
        assert!(attempts[0]["status"]["reason"]
            .as_str()
            .unwrap()
            .contains("validator"));
        assert_eq!(attempts[1]["status"]["status"], "accepted", "{kind}");
        assert!(attempts[1]["inputs"]["harness"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{kind}/")));

        // Per attempt: the raw log, its normalized events (pointing back into it) and the
        // gateway's journal.
        let logs = home.path().join("missions").join(id).join("attempts");
        for ordinal in [1, 2] {
            let dir = logs.join(format!("fix-add-{ordinal}"));
            let raw = std::fs::read(dir.join("agent.jsonl")).unwrap();
            let events: Vec<Value> = std::fs::read_to_string(dir.join("events.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert!(events.iter().any(|e| e["kind"] == "tool_call"), "{kind}");
            for event in &events {
                assert_eq!(event["schema"], "berth.events/v1");
                let (offset, len) = (
                    event["raw"]["offset"].as_u64().unwrap() as usize,
                    event["raw"]["len"].as_u64().unwrap() as usize,
                );
                assert!(offset + len <= raw.len());
            }
            let journal = std::fs::read_to_string(dir.join("gateway.jsonl")).unwrap();
            assert!(journal.lines().count() >= 2, "{kind}: {journal}");
            assert!(
                journal.contains("\"authorization\":\"[redacted]\"")
                    || journal.contains("\"x-api-key\":\"[redacted]\"")
            );
        }
        // The accepted attempt's trajectory, as ATIF and as events.
        let key = attempts[1]["key"].as_str().unwrap();
        let (code, atif, _) = run_json(&home, &bin, &["attempt", "trajectory", key]);
        assert_eq!(code, 0, "{atif:#}");
        let trajectory = &atif["trajectory"];
        assert_eq!(trajectory["schema_version"], "ATIF-v1.4");
        assert_eq!(trajectory["agent"]["name"], kind);
        let steps = trajectory["steps"].as_array().unwrap();
        assert_eq!(steps[0]["source"], "user");
        assert!(steps[0]["message"].as_str().unwrap().contains("calc.add"));
        assert!(
            steps.iter().any(|s| s["tool_calls"].is_array()),
            "{kind}: {trajectory:#}"
        );
        let (code, events, _) = run_json(
            &home,
            &bin,
            &["attempt", "trajectory", key, "--format", "events"],
        );
        assert_eq!(code, 0);
        assert!(events["events"][0]["event_id"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{key}:")));
        home.assert_no_canary_persisted();
    }
    let (samples, found) = scan.finish();
    assert!(samples > 10, "the argv scan barely ran ({samples} samples)");
    assert!(found.is_empty(), "secrets in argv: {found:#?}");
    // An unknown attempt is a clear not-found.
    let home = Home::new();
    let out = home.run(&["attempt", "trajectory", "at-nope"]);
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn agent_harnesses_refuse_providers_that_cannot_reach_the_gateway_before_anything_is_durable() {
    let home = Home::new();
    let dir = home.path().join("m");
    std::fs::create_dir_all(dir.join("repo")).unwrap();
    std::fs::write(dir.join("repo/a.txt"), "a").unwrap();
    std::fs::write(
        dir.join("model.toml"),
        "schema_version = 1\n[[step]]\ntext = \"x\"\n",
    )
    .unwrap();
    let text = std::fs::read_to_string(examples().join("codex.toml"))
        .unwrap()
        .replace("provider = \"host\"", "provider = \"docker\"");
    std::fs::write(dir.join("mission.toml"), text).unwrap();
    let out = home.run(&["mission", "run", dir.join("mission.toml").to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("agent CLIs run on the host provider"),
        "{stderr}"
    );
    let (_, list) = home.json(&["mission", "list"]);
    assert_eq!(list["missions"].as_array().map(Vec::len), Some(0), "{list}");

    // A scripted model that does not parse is refused at registration too.
    std::fs::write(dir.join("model.toml"), "schema_version = 1\n").unwrap();
    let text = std::fs::read_to_string(examples().join("codex.toml")).unwrap();
    std::fs::write(dir.join("mission.toml"), text).unwrap();
    let out = home.run(&["mission", "run", dir.join("mission.toml").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("harness.gateway.script"), "{stderr}");
}

#[test]
fn a_mission_is_watched_live_and_a_late_watcher_replays_from_the_start() {
    let Some(bin) = agent_bin() else { return };
    let home = Home::new();
    let mission = examples().join("claude-code.toml");
    let mut run = home
        .command("tester", &["mission", "run", mission.to_str().unwrap()])
        .env("BERTH_AGENT_BIN_DIR", &bin)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut id = None;
    common::wait_for("the mission to be registered", || {
        let (_, list) = home.json(&["mission", "list"]);
        id = list["missions"][0]["id"].as_str().map(str::to_owned);
        id.is_some()
    });
    let id = id.unwrap();
    let watched = home
        .command(
            "tester",
            &["--json", "mission", "watch", &id, "--heartbeat", "200ms"],
        )
        .output()
        .unwrap();
    assert!(run.wait().unwrap().success());
    assert_eq!(
        watched.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&watched.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&watched.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let outcomes: Vec<&str> = lines
        .iter()
        .filter(|l| l["kind"] == "attempt_outcome")
        .map(|l| l["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes.len(), 2, "{lines:#?}");
    assert!(outcomes[0].starts_with("rejected: validator"));
    assert_eq!(outcomes[1], "accepted");
    let tool_calls = lines.iter().filter(|l| l["kind"] == "tool_call").count();
    assert!(tool_calls >= 3, "{lines:#?}");
    // Every stored event of the second attempt reached the live watcher, in order.
    let (_, status) = home.json(&["mission", "status", &id]);
    let key = status["mission"]["tasks"][0]["attempts"][1]["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let live: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["event_id"]
                .as_str()
                .is_some_and(|e| e.starts_with(&format!("{key}:")))
        })
        .collect();
    let stored = std::fs::read_to_string(
        home.path()
            .join("missions")
            .join(&id)
            .join("attempts/fix-add-2/events.jsonl"),
    )
    .unwrap();
    assert_eq!(live.len(), stored.lines().count());

    // A watcher that connects after the run replays from offset 0 and ends by itself.
    let late = home
        .command("tester", &["--json", "attempt", "watch", &key])
        .output()
        .unwrap();
    assert_eq!(late.status.code(), Some(0));
    let replayed: Vec<String> = String::from_utf8_lossy(&late.stdout)
        .lines()
        .filter(|l| !l.contains("\"heartbeat\""))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        replayed,
        stored.lines().map(str::to_owned).collect::<Vec<_>>()
    );
}

#[test]
fn an_agent_idle_past_its_limit_is_stopped_and_the_attempt_rejected() {
    let Some(bin) = agent_bin() else { return };
    let home = Home::new();
    let dir = home.path().join("m");
    std::fs::create_dir_all(dir.join("repo")).unwrap();
    for file in ["calc.py", "test_calc.py"] {
        std::fs::copy(
            examples().join("repo").join(file),
            dir.join("repo").join(file),
        )
        .unwrap();
    }
    // The model answers the second request only after a minute: the agent sits silent.
    std::fs::write(
        dir.join("model.toml"),
        "schema_version = 1\n[[step]]\nshell = \"true\"\n[[step]]\ntext = \"late\"\ndelay_ms = 60000\n",
    )
    .unwrap();
    let text = std::fs::read_to_string(examples().join("claude-code.toml"))
        .unwrap()
        .replace(
            "model = \"scripted\"",
            "model = \"scripted\"\nidle_timeout = \"2s\"",
        )
        .replace("max_attempts = 3", "max_attempts = 1");
    std::fs::write(dir.join("mission.toml"), text).unwrap();
    let started = std::time::Instant::now();
    let (code, doc, stderr) = run_json(
        &home,
        &bin,
        &["mission", "run", dir.join("mission.toml").to_str().unwrap()],
    );
    assert_eq!(code, 12, "{doc:#}\n{stderr}");
    assert!(started.elapsed() < std::time::Duration::from_secs(50));
    let reason = doc["mission"]["tasks"][0]["attempts"][0]["status"]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("idle"), "{reason}");
    // Nothing the agent started is left running in its sandbox.
    let sandboxes = home.path().join("state");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) {
            assert!(
                !cwd.starts_with(&sandboxes),
                "process {:?} still runs in {}",
                entry.file_name(),
                cwd.display()
            );
        }
    }
}

#[test]
fn berth_prompt_runs_an_agent_in_an_existing_sandbox_and_streams_its_events() {
    let Some(bin) = agent_bin() else { return };
    let home = Home::new();
    let id = home.create("tester");
    let script = examples().join("../gateway/hello.toml");
    let out = home
        .command(
            "tester",
            &[
                "--json",
                "prompt",
                &id,
                "--harness",
                "codex",
                "--script",
                script.to_str().unwrap(),
                "Create hello.txt containing hi",
            ],
        )
        .env("BERTH_AGENT_BIN_DIR", &bin)
        .env("OPENAI_API_KEY", CANARY)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.iter().any(|l| l["kind"] == "tool_call"));
    let last = lines.last().unwrap();
    assert_eq!(last["kind"], "prompt_finished");
    assert!(last["rejected"].is_null(), "{last}");
    let cat = home.run(&["exec", &id, "--", "cat", "hello.txt"]);
    assert_eq!(String::from_utf8_lossy(&cat.stdout), "hi");
    home.assert_no_canary_persisted();

    // Without a model, a clear error and nothing runs.
    let out = home.run(&["prompt", &id, "--harness", "codex", "x"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "clap refuses: no --script/--proxy"
    );
}
