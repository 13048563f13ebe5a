//! The real agent CLIs (OpenCode, Codex, Claude Code, pinned in `agents/package.json`) driven
//! headless against the gateway: its scripted model behind its proxy, so each run also proves
//! the credential stays on the host — the CLI gets only an attempt token, and the credential is
//! in none of its files, its output or the journal.
//!
//! The CLIs come from `agents/node_modules/.bin` (`scripts/install-agent-clis`; CI installs
//! them) or `BERTH_AGENT_BIN_DIR`. Missing CLIs fail the test unless `BERTH_SKIP_AGENT_CLIS=1`
//! says to skip it.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_gateway::{Gateway, GatewayConfig, Journal, Proxy, Script, Upstream};

const SCRIPT: &str = r#"
schema_version = 1
side_text = "Create hello.txt"
[[step]]
shell = "printf hi > hello.txt"
[[step]]
text = "Done: created hello.txt"
"#;

/// Runs `command` (stdin closed, its own process group) with a hard timeout; its output.
fn run(mut command: Command, timeout: Duration) -> (std::process::ExitStatus, String) {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = command.spawn().expect("the CLI starts");
    let group = child.id() as i32;
    let started = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output());
    while !waiter.is_finished() {
        if started.elapsed() > timeout {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = waiter.join().unwrap().unwrap();
    // Nothing of the run may outlive it.
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(group),
        nix::sys::signal::Signal::SIGKILL,
    );
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, text)
}

/// Every regular file under `dir` that contains `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                if let Ok(bytes) = std::fs::read(entry.path()) {
                    if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                        found.push(entry.path());
                    }
                }
            }
        }
    }
    found
}

struct Case {
    cli: &'static str,
    command: fn(&Path, &Path, &str, &str) -> Command,
}

fn opencode(bin: &Path, home: &Path, base: &str, token: &str) -> Command {
    let config = serde_json::json!({
        "provider": { "berth": {
            "npm": "@ai-sdk/openai-compatible", "name": "Berth gateway",
            "options": { "baseURL": format!("{base}/v1"), "apiKey": "{env:BERTH_GATEWAY_TOKEN}" },
            "models": { "scripted": { "name": "Scripted", "tool_call": true } },
        }},
        "model": "berth/scripted", "small_model": "berth/scripted",
        "autoupdate": false, "share": "disabled",
    });
    let mut c = Command::new(bin.join("opencode"));
    c.args(["run", "--auto", "--format", "json", "-m", "berth/scripted"])
        .arg("Create hello.txt containing hi")
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
        .env("OPENCODE_CONFIG_CONTENT", config.to_string())
        .env("BERTH_GATEWAY_TOKEN", token);
    c
}

fn codex(bin: &Path, home: &Path, base: &str, token: &str) -> Command {
    std::fs::create_dir_all(home.join(".codex")).unwrap();
    std::fs::create_dir_all(home.join("tmp")).unwrap();
    let mut c = Command::new(bin.join("codex"));
    c.args([
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "-m",
        "scripted",
        "-c",
        "model_provider=berth",
        "-c",
    ])
    .arg(format!(
        "model_providers.berth={{name=\"Berth gateway\",base_url=\"{base}/v1\",\
         env_key=\"BERTH_GATEWAY_TOKEN\",wire_api=\"responses\",request_max_retries=0,\
         stream_max_retries=0}}"
    ))
    .arg("Create hello.txt containing hi")
    .env("CODEX_HOME", home.join(".codex"))
    .env("TMPDIR", home.join("tmp"))
    .env("BERTH_GATEWAY_TOKEN", token);
    c
}

fn claude(bin: &Path, home: &Path, base: &str, token: &str) -> Command {
    let mut c = Command::new(bin.join("claude"));
    c.args([
        "-p",
        "Create hello.txt containing hi",
        "--model",
        "scripted",
    ])
    .args(["--output-format", "stream-json", "--verbose"])
    .arg("--dangerously-skip-permissions")
    .env("CLAUDE_CONFIG_DIR", home.join(".claude"))
    .env("IS_SANDBOX", "1")
    .env("ANTHROPIC_BASE_URL", base)
    .env("ANTHROPIC_API_KEY", token)
    .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    .env("CLAUDE_CODE_MAX_RETRIES", "1");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_agent_cli_completes_a_scripted_task_through_the_proxy_without_the_credential() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let scratch = tempfile::Builder::new()
        .prefix("berth-test-agent-clis-")
        .tempdir()
        .unwrap();
    // The "real endpoint": the scripted model, whose only accepted key is the credential.
    let upstream = Gateway::new(GatewayConfig {
        upstream: Upstream::Scripted(Arc::new(Script::parse(SCRIPT).unwrap())),
        prices: None,
    });
    let credential = upstream.admit("upstream", scratch.path().join("upstream.jsonl"));
    let upstream_running = upstream.listen(0).await.unwrap();
    let gateway = Gateway::new(GatewayConfig {
        upstream: Upstream::Proxy(Arc::new(
            Proxy::new(&upstream_running.base_url(), credential.expose().to_owned()).unwrap(),
        )),
        prices: None,
    });
    let running = gateway.listen(0).await.unwrap();

    for case in [
        Case {
            cli: "opencode",
            command: opencode,
        },
        Case {
            cli: "codex",
            command: codex,
        },
        Case {
            cli: "claude",
            command: claude,
        },
    ] {
        let home = scratch.path().join(case.cli).join("home");
        let work = scratch.path().join(case.cli).join("work");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let journal = scratch.path().join(format!("{}.jsonl", case.cli));
        let token = gateway.admit(&format!("test:{}:1", case.cli), journal.clone());
        let mut command = (case.command)(&bin, &home, &running.base_url(), token.expose());
        command
            .current_dir(&work)
            .env("HOME", &home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("npm_config_registry", "http://127.0.0.1:9/");
        // Nothing from the test's own environment (no real keys) reaches the CLI.
        let keep: Vec<(std::ffi::OsString, std::ffi::OsString)> = command
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
            .collect();
        command.env_clear().envs(keep);
        let cli = case.cli;
        let (status, output) =
            tokio::task::spawn_blocking(move || run(command, Duration::from_secs(180)))
                .await
                .unwrap();
        gateway.revoke(&token);

        assert_eq!(
            std::fs::read_to_string(work.join("hello.txt"))
                .ok()
                .as_deref(),
            Some("hi"),
            "{cli} did not create hello.txt (exit {status}):\n{output}"
        );
        let entries = Journal::read(&journal).unwrap();
        assert!(
            entries.len() >= 2 && entries.iter().all(|e| e.status == 200),
            "{cli}: journal {entries:#?}"
        );
        assert!(
            entries.iter().any(|e| e.usage.is_some()),
            "{cli}: no usage read from the upstream's answers"
        );
        let secret = credential.expose();
        assert!(
            !output.contains(secret),
            "{cli}: the credential is in its output"
        );
        let leaked = files_containing(&scratch.path().join(cli), secret);
        assert!(leaked.is_empty(), "{cli}: the credential is in {leaked:?}");
        let text = std::fs::read_to_string(&journal).unwrap();
        assert!(
            !text.contains(secret),
            "{cli}: the credential is in the journal"
        );
        eprintln!(
            "{cli}: ok ({} model requests, exit {status})",
            entries.len()
        );
    }
    // The upstream saw every request, each carrying the credential (it accepts nothing else).
    assert!(
        Journal::read(&scratch.path().join("upstream.jsonl"))
            .unwrap()
            .len()
            >= 6
    );
}
