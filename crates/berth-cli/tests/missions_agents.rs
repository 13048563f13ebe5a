//! Missions run by real agent CLIs (issue 11): each example in `examples/agents/` — OpenCode,
//! Codex, Claude Code, pinned — makes a wrong change first (rejected by the validator, durably)
//! and the right one next (accepted, committed), its model traffic through the mission's
//! gateway in front of a scripted model. The agent's raw log, normalized events and the
//! gateway's journal are kept per attempt; no secret of Berth's environment is persisted.
//!
//! The examples run in docker sandboxes without network, from `berth/agent-clis:bookworm`
//! (`scripts/build-agent-clis-image.sh`), the gateway reached through the supervisor's loopback
//! forward; host runs use `agents/node_modules/.bin` (`scripts/install-agent-clis`). Missing
//! CLIs or image fail the tests unless `BERTH_SKIP_AGENT_CLIS=1` says to skip them.

mod common;

use std::path::{Path, PathBuf};

use common::{agent_image, Home, AGENT_IMAGE, CANARY};
use serde_json::Value;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents")
}

/// The example for `kind`, copied into `dir` and moved to the host provider.
fn host_example(kind: &str, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("repo")).unwrap();
    for file in ["calc.py", "test_calc.py"] {
        std::fs::copy(
            examples().join("repo").join(file),
            dir.join("repo").join(file),
        )
        .unwrap();
    }
    std::fs::copy(examples().join("model.toml"), dir.join("model.toml")).unwrap();
    let text = std::fs::read_to_string(examples().join(format!("{kind}.toml")))
        .unwrap()
        .replace(
            "provider = \"docker\"\nimage = \"berth/agent-clis:bookworm\"",
            "provider = \"host\"",
        );
    assert!(text.contains("provider = \"host\""));
    let path = dir.join(format!("{kind}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Everything `docker inspect` says about Berth's containers now.
fn inspect_berth_containers() -> String {
    let ids = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", "label=berth.owner"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let ids: Vec<&str> = ids.split_whitespace().collect();
    if ids.is_empty() {
        return String::new();
    }
    std::process::Command::new("docker")
        .arg("inspect")
        .args(&ids)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
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
    thread: std::thread::JoinHandle<(usize, usize, Vec<String>)>,
}

impl ArgvScan {
    fn start(secrets: Vec<String>) -> ArgvScan {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut samples, mut inspects, mut found) = (0, 0, Vec::new());
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
                // Every so often, what the engine says about Berth's containers, too.
                if samples % 50 == 0 {
                    let inspected = inspect_berth_containers();
                    for secret in &secrets {
                        if inspected.contains(secret.as_str()) {
                            found.push(format!("docker inspect: {secret}"));
                        }
                    }
                    inspects += usize::from(!inspected.is_empty());
                }
                samples += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            (samples, inspects, found)
        });
        ArgvScan { stop, thread }
    }

    /// Samples of argv taken, `docker inspect`s that saw a container, what held a secret.
    fn finish(self) -> (usize, usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

#[test]
fn each_agent_cli_is_rejected_when_wrong_and_accepted_when_right() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    if !agent_image() {
        return;
    }
    // No secret — the canary model key in Berth's environment, or any gateway token — is ever
    // in a process's argv or in `docker inspect` while the missions run.
    let scan = ArgvScan::start(vec![CANARY.to_owned(), "berth-gw-".to_owned()]);
    let scratch = tempfile::tempdir().unwrap();
    // The three examples in docker (no network: the loopback forward), and one on the host.
    let runs = [
        ("opencode", examples().join("opencode.toml")),
        ("codex", examples().join("codex.toml")),
        ("claude-code", examples().join("claude-code.toml")),
        ("claude-code", host_example("claude-code", scratch.path())),
    ];
    for (kind, mission) in runs {
        let home = Home::new();
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
            // The CLI's own session record, as a tar archive (never extracted).
            let session = std::fs::read(dir.join("session.tar")).unwrap();
            assert_eq!(&session[257..262], b"ustar", "{kind}: not a tar archive");
            assert!(!session.windows(9).any(|w| w == b"berth-gw-"), "{kind}");
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
        // The agent's home is gone before the checkpoint: no session, config or cache of
        // the run is in the checkpoint image.
        let checkpoints: Vec<String> = attempts[1]["status"]["checkpoint"]
            .as_str()
            .filter(|c| c.starts_with("sha256:"))
            .map(str::to_owned)
            .into_iter()
            .collect();
        let in_docker = mission.starts_with(examples());
        if in_docker {
            assert_eq!(checkpoints.len(), 1, "{kind}: no checkpoint in {status:#}");
        }
        for image in checkpoints.iter().filter(|_| in_docker) {
            let listing = std::process::Command::new("docker")
                .args([
                    "run",
                    "--rm",
                    "--network",
                    "none",
                    "--entrypoint",
                    "ls",
                    image,
                    "-A",
                    "/workspace",
                ])
                .output()
                .unwrap();
            let listing = String::from_utf8_lossy(&listing.stdout);
            assert!(listing.contains("repo"), "{kind}: {listing}");
            assert!(!listing.contains(".berth-agent"), "{kind}: {listing}");
            let inspected = std::process::Command::new("docker")
                .args(["image", "inspect", image])
                .output()
                .unwrap();
            let inspected = String::from_utf8_lossy(&inspected.stdout);
            assert!(!inspected.contains(CANARY) && !inspected.contains("berth-gw-"));
            let _ = std::process::Command::new("docker")
                .args(["rmi", image])
                .output();
        }
        home.assert_no_canary_persisted();
    }
    let (samples, inspects, found) = scan.finish();
    assert!(samples > 10, "the argv scan barely ran ({samples} samples)");
    assert!(inspects > 0, "docker inspect never saw a sandbox");
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
        .replace("provider = \"docker\"", "provider = \"bwrap\"");
    std::fs::write(dir.join("mission.toml"), text).unwrap();
    let out = home.run(&["mission", "run", dir.join("mission.toml").to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not forward a loopback port to the host (loopback_forward)"),
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
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    if !agent_image() {
        return;
    }
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
    // The last line says how the mission ended.
    let last = lines.last().unwrap();
    assert_eq!(last["kind"], "mission_finished", "{last}");
    assert_eq!(last["mission"], id.as_str(), "{last}");
    assert_eq!(last["state"]["state"], "succeeded", "{last}");
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
    // The checkpoint image is the mission's artifact; the test removes it.
    let checkpoint = status["mission"]["tasks"][0]["attempts"][1]["status"]["checkpoint"]
        .as_str()
        .unwrap();
    let removed = std::process::Command::new("docker")
        .args(["rmi", checkpoint])
        .output()
        .unwrap();
    assert!(removed.status.success(), "{removed:?}");
}

#[test]
fn an_agent_idle_past_its_limit_is_stopped_and_the_attempt_rejected() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
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
            "provider = \"docker\"\nimage = \"berth/agent-clis:bookworm\"",
            "provider = \"host\"",
        )
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
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
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

/// `berth prompt` in a docker sandbox: the image's CLI, the gateway through the loopback
/// forward, the sandbox still without any network.
#[test]
fn berth_prompt_in_a_docker_sandbox_reaches_the_gateway_and_nothing_else() {
    if !agent_image() {
        return;
    }
    let home = Home::new();
    let (code, doc) = home.json(&["create", "-p", "docker", "--image", AGENT_IMAGE]);
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let script = examples().join("../gateway/hello.toml");
    let out = home
        .command(
            "tester",
            &[
                "--json",
                "prompt",
                &id,
                "--harness",
                "claude-code",
                "--script",
                script.to_str().unwrap(),
                "Create hello.txt containing hi",
            ],
        )
        .env("ANTHROPIC_API_KEY", CANARY)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["kind"], "prompt_finished");
    assert!(last["rejected"].is_null(), "{last}");
    let cat = home.run(&["exec", &id, "--", "cat", "hello.txt"]);
    assert_eq!(String::from_utf8_lossy(&cat.stdout), "hi");
    // The forward is gone with the run, and the sandbox never had a network.
    let probe = home.run(&[
        "exec",
        &id,
        "--",
        "bash",
        "-c",
        "exec 3<>/dev/tcp/127.0.0.1/47800 || echo closed; ls /sys/class/net",
    ]);
    assert_eq!(String::from_utf8_lossy(&probe.stdout), "closed\nlo\n");
    let out = home.run(&["destroy", &id]);
    assert!(out.status.success());
    home.assert_no_canary_persisted();
}

/// Subscription logins (Codex's `auth.json`, Claude Code's `.credentials.json`): named in
/// `$BERTH_HOME/logins.toml`, staged into the docker sandbox for the agent run only, used by
/// the real CLI (its key header passes through the mission's gateway to an upstream that
/// accepts only that login), refreshed by the run and written back to the operator's file;
/// nothing of it is left in the checkpoint image or in Berth's store and logs — though the
/// agent prints the file into its conversation (the session record is masked too).
#[test]
fn subscription_logins_are_leased_staged_for_the_run_and_written_back() {
    /// A login value of no token shape: only a scan for the login's own values finds it.
    const REFRESH: &str = "refresh-4f1c9a77e2b84d0c-do-not-keep";
    /// The value the run "refreshes" into the login (unknown to Berth until it reads it back).
    const REFRESHED: &str = "refreshed-77e2b84d0c4f1c9a-new";
    use std::io::BufRead;
    if !agent_image() {
        return;
    }
    let home = Home::new();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::create_dir_all(dir.join("m/repo")).unwrap();
    std::fs::write(dir.join("m/repo/a.txt"), "a\n").unwrap();
    // The run "refreshes" the login it finds in the CLI's home.
    std::fs::write(
        dir.join("m/model.toml"),
        r#"schema_version = 1
[[step]]
shell = "if [ -f .hostile ]; then printf '{\"planted\":\"plain-words-the-agent-chose\"}' > \"$CODEX_HOME/auth.json\"; echo plain-words-the-agent-chose; else for f in \"${CODEX_HOME:-/none}/auth.json\" \"${CLAUDE_CONFIG_DIR:-/none}/.credentials.json\"; do [ -f \"$f\" ] && sed -i 's/^{/{\"refreshed\":\"refreshed-77e2b84d0c4f1c9a-new\",/' \"$f\" && cat \"$f\"; done; fi; printf ok > logged.txt"
[[step]]
text = "done"
"#,
    )
    .unwrap();
    // The "vendor": a scripted gateway that accepts only its own token — the login's key.
    // Killed when the test ends, whether it passes or not.
    let mut upstream = common::RunningCli::from(
        home.command(
            "tester",
            &[
                "--json",
                "gateway",
                "--script",
                dir.join("m/model.toml").to_str().unwrap(),
                "--journal",
                dir.join("upstream.jsonl").to_str().unwrap(),
            ],
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let mut announced = String::new();
    let mut lines = std::io::BufReader::new(upstream.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        announced.push_str(&line);
        if line == "}" {
            break;
        }
    }
    let announced: Value = serde_json::from_str(&announced).unwrap();
    let (origin, login_key) = (
        announced["listening"].as_str().unwrap().to_owned(),
        announced["token"].as_str().unwrap().to_owned(),
    );
    let expires = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 86_400)
        * 1000;
    let files = [
        (
            "codex",
            "sub-codex",
            dir.join("codex-auth.json"),
            format!(r#"{{"auth_mode":"apikey","OPENAI_API_KEY":"{login_key}"}}"#),
        ),
        (
            "claude-code",
            "sub-claude",
            dir.join("claude-credentials.json"),
            format!(
                r#"{{"claudeAiOauth":{{"accessToken":"{login_key}","refreshToken":"{REFRESH}","expiresAt":{expires},"scopes":["user:inference"]}}}}"#
            ),
        ),
    ];
    let mut config = String::from("schema_version = 1\n");
    for (kind, name, path, content) in &files {
        std::fs::write(path, content).unwrap();
        config.push_str(&format!(
            "[logins.{name}]\nharness = \"{kind}\"\nfile = \"{}\"\n",
            path.display()
        ));
    }
    let logins = home.path().join("logins.toml");
    std::fs::write(&logins, config).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&logins, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    for (kind, name, path, _) in &files {
        let mission = dir.join(format!("m/{kind}.toml"));
        std::fs::write(
            &mission,
            format!(
                r#"schema_version = 1
name = "login-{kind}"
[repository]
path = "repo"
base = "snapshot"
[sandbox]
provider = "docker"
image = "{AGENT_IMAGE}"
[harness]
kind = "{kind}"
model = "scripted"
login = "{name}"
[harness.gateway]
proxy = "{origin}"
[[tasks]]
id = "t"
instructions = "log it"
max_attempts = 1
agent_timeout = "120s"
[tasks.validator]
command = "test \"$(cat logged.txt)\" = ok && mkdir -p .berth && echo pass > .berth/verdict"
timeout = "60s"
evidence = [".berth/verdict"]
"#
            ),
        )
        .unwrap();
        let (code, doc) = home.json(&["mission", "run", mission.to_str().unwrap()]);
        assert_eq!(code, 0, "{kind}: {doc:#}");
        // Written back: the operator's file is the refreshed one, still private.
        let now = std::fs::read_to_string(path).unwrap();
        assert!(
            now.starts_with(&format!(r#"{{"refreshed":"{REFRESHED}","#)),
            "{kind}: {now}"
        );
        {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(std::fs::metadata(path).unwrap().mode() & 0o777, 0o600);
        }
        // Gone from the sandbox before the checkpoint.
        let checkpoint = doc["mission"]["tasks"][0]["attempts"][0]["status"]["checkpoint"]
            .as_str()
            .unwrap_or_else(|| panic!("{doc:#}"))
            .to_owned();
        let listing = std::process::Command::new("docker")
            .args(["run", "--rm", "--network", "none", "--entrypoint", "ls"])
            .args([checkpoint.as_str(), "-A", "/workspace"])
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&listing.stdout);
        assert!(listing.contains("repo"), "{kind}: {listing}");
        assert!(!listing.contains(".berth-agent") && !listing.contains(".berth-login"));
        let _ = std::process::Command::new("docker")
            .args(["rmi", checkpoint.as_str()])
            .output();
    }
    // A login file the run leaves that is not taken as the login (its keys are not the
    // staged one's) does not choose what is masked: the words it holds stay readable in the
    // attempt's logs.
    std::fs::create_dir_all(dir.join("m/hostile")).unwrap();
    std::fs::write(dir.join("m/hostile/a.txt"), "a\n").unwrap();
    std::fs::write(dir.join("m/hostile/.hostile"), "").unwrap();
    let text = std::fs::read_to_string(dir.join("m/codex.toml"))
        .unwrap()
        .replace("path = \"repo\"", "path = \"hostile\"")
        .replace("name = \"login-codex\"", "name = \"login-hostile\"");
    std::fs::write(dir.join("m/hostile.toml"), text).unwrap();
    let before = std::fs::read(&files[0].2).unwrap();
    let (code, doc) = home.json(&[
        "mission",
        "run",
        dir.join("m/hostile.toml").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(
        std::fs::read(&files[0].2).unwrap(),
        before,
        "the operator's login stays"
    );
    // Its checkpoint image is the mission's artifact; the test removes it.
    if let Some(checkpoint) =
        doc["mission"]["tasks"][0]["attempts"][0]["status"]["checkpoint"].as_str()
    {
        let _ = std::process::Command::new("docker")
            .args(["rmi", checkpoint])
            .output();
    }
    let id = doc["mission"]["id"].as_str().unwrap();
    let log = home
        .path()
        .join(format!("missions/{id}/attempts/t-1/agent.jsonl"));
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("plain-words-the-agent-chose"), "{log}");

    // An unknown login is refused at registration, before anything is durable.
    let text = std::fs::read_to_string(dir.join("m/codex.toml"))
        .unwrap()
        .replace("login = \"sub-codex\"", "login = \"nobody\"");
    std::fs::write(dir.join("m/nobody.toml"), text).unwrap();
    let out = home.run(&[
        "mission",
        "run",
        dir.join("m/nobody.toml").to_str().unwrap(),
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no login `nobody`"));
    let _ = upstream.kill();
    let _ = upstream.wait();
    // The login's values are nowhere in Berth's home (store, journals, logs, session
    // records), though the agent printed them; the session records hold the masks.
    for secret in [login_key.as_str(), REFRESH, REFRESHED] {
        let holding = berth_testkit::files_holding(home.path(), secret.as_bytes());
        assert!(holding.is_empty(), "a login value is in {holding:?}");
    }
    let masked_records =
        berth_testkit::files_holding(home.path(), "*".repeat(REFRESH.len()).as_bytes())
            .iter()
            .filter(|path| path.ends_with("session.tar"))
            .count();
    assert_eq!(
        masked_records, 2,
        "both agents' conversations hold the printed login"
    );
}

/// An agent CLI that cannot be found is no verdict on the attempt: its agent never ran, and
/// every later attempt would fail the same way. The run stops (exit 14) naming what to install,
/// nothing is recorded, and a resume that finds the CLI runs the mission as if nothing happened
/// (before, each attempt was rejected in turn and the mission FAILED without an agent running).
#[test]
fn an_agent_cli_not_found_stops_the_run_and_resume_goes_on() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let mission = host_example("claude-code", scratch.path());
    let home = Home::new();
    let empty = tempfile::tempdir().unwrap();
    let out = home
        .command("tester", &["mission", "run", mission.to_str().unwrap()])
        .env("BERTH_AGENT_BIN_DIR", empty.path())
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(14), "{stderr}");
    assert!(stderr.contains("before its agent ran"), "{stderr}");
    assert!(stderr.contains("scripts/install-agent-clis"), "{stderr}");
    let (_, list, _) = run_json(&home, &bin, &["mission", "list"]);
    let id = list["missions"][0]["id"].as_str().unwrap().to_owned();
    let (_, status, _) = run_json(&home, &bin, &["mission", "status", &id]);
    let attempts = status["mission"]["tasks"][0]["attempts"]
        .as_array()
        .unwrap();
    assert_eq!(attempts.len(), 1, "{status:#}");
    assert_eq!(attempts[0]["status"]["status"], "in_progress", "{status:#}");
    // Why it stopped outlives the run's output: `mission status` says so, text and JSON.
    assert_eq!(status["stopped"]["stop"], "before_agent", "{status:#}");
    assert_eq!(
        status["stopped"]["attempt"], attempts[0]["key"],
        "{status:#}"
    );
    assert!(
        status["stopped"]["reason"]
            .as_str()
            .unwrap()
            .contains("was found neither in BERTH_AGENT_BIN_DIR nor on PATH"),
        "{status:#}"
    );
    let text = home.run(&["mission", "status", &id]);
    let said = String::from_utf8_lossy(&text.stdout);
    assert!(
        said.contains("the last run stopped before the agent of") && said.contains("resume"),
        "{said}"
    );
    let (code, doc, stderr) = run_json(&home, &bin, &["mission", "resume", &id]);
    assert_eq!(code, 0, "{doc:#}\n{stderr}");
    let (_, status, _) = run_json(&home, &bin, &["mission", "status", &id]);
    assert!(status["stopped"].is_null(), "{status:#}");
    let attempts = status["mission"]["tasks"][0]["attempts"]
        .as_array()
        .unwrap();
    // The example's own course: wrong first (rejected by the validator), right next.
    assert_eq!(attempts.len(), 2, "{status:#}");
    assert!(attempts[0]["status"]["reason"]
        .as_str()
        .unwrap()
        .contains("validator"));
    assert_eq!(attempts[1]["status"]["status"], "accepted", "{status:#}");
}
