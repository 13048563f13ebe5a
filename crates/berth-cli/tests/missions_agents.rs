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

#[test]
fn each_agent_cli_is_rejected_when_wrong_and_accepted_when_right() {
    let Some(bin) = agent_bin() else { return };
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
