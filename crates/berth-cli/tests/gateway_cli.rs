//! `berth gateway` as a user runs it: the scripted model and the proxy, each as a process that
//! prints where it listens and stops cleanly on SIGTERM; the proxy's credential comes from a
//! named variable and appears in no output, argv or journal.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use common::{signal, Home, CANARY};
use serde_json::Value;

/// Starts `berth gateway ARGS --json`; the child and its JSON document.
fn start(home: &Home, args: &[&str], envs: &[(&str, &str)]) -> (Child, Value) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--json")
        .arg("gateway")
        .args(args)
        .env("BERTH_HOME", home.path())
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut doc = String::new();
    while !doc.trim_end().ends_with('}') || doc.trim().is_empty() {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "gateway exited: {doc}"
        );
        doc.push_str(&line);
    }
    (child, serde_json::from_str(&doc).unwrap())
}

/// A blocking HTTP/1.1 POST; the status and body.
fn post(base: &str, path: &str, auth: &str, body: &str) -> (u16, String) {
    let addr = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {auth}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"go"}],"tools":[{"type":"function","function":{"name":"bash","parameters":{"properties":{"command":{"type":"string"}}}}}]}"#;

fn stop(mut child: Child) -> String {
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(0), "gateway exit: {stderr}");
    stderr
}

#[test]
fn the_scripted_gateway_answers_journals_and_stops_on_sigterm() {
    let home = Home::new();
    let script = home.path().join("script.toml");
    std::fs::write(
        &script,
        "schema_version = 1\n[[step]]\nshell = \"printf hi > hello.txt\"\n",
    )
    .unwrap();
    let journal = home.path().join("journal.jsonl");
    let (child, doc) = start(
        &home,
        &[
            "--script",
            script.to_str().unwrap(),
            "--journal",
            journal.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(doc["command"], "gateway");
    let base = doc["listening"].as_str().unwrap().to_owned();
    let token = doc["token"].as_str().unwrap().to_owned();
    let (status, body) = post(&base, "/v1/chat/completions", &token, CHAT);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("printf hi > hello.txt"), "{body}");
    assert_eq!(post(&base, "/v1/chat/completions", "forged", CHAT).0, 401);
    stop(child);
    let lines = std::fs::read_to_string(&journal).unwrap();
    assert_eq!(lines.lines().count(), 1);
    assert!(!lines.contains(&token));
}

#[test]
fn the_proxy_takes_its_credential_by_variable_name_and_never_shows_it() {
    let home = Home::new();
    let script = home.path().join("script.toml");
    std::fs::write(&script, "schema_version = 1\n[[step]]\ntext = \"ok\"\n").unwrap();
    let (upstream, up) = start(&home, &["--script", script.to_str().unwrap()], &[]);
    // The upstream's token plays the real credential; the canary rides along in the variable
    // set (never used as a key) so the scans below also catch an environment dump.
    let credential = up["token"].as_str().unwrap().to_owned();
    let journal = home.path().join("proxy.jsonl");
    let (proxy, doc) = start(
        &home,
        &[
            "--proxy",
            up["listening"].as_str().unwrap(),
            "--credential-env",
            "MODEL_KEY",
            "--journal",
            journal.to_str().unwrap(),
        ],
        &[("MODEL_KEY", &credential), ("CANARY_TOKEN", CANARY)],
    );
    let proxy_pid = proxy.id();
    let argv = std::fs::read(format!("/proc/{proxy_pid}/cmdline")).unwrap();
    assert!(!String::from_utf8_lossy(&argv).contains(&credential));
    let (status, body) = post(
        doc["listening"].as_str().unwrap(),
        "/v1/chat/completions",
        doc["token"].as_str().unwrap(),
        CHAT,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"ok\""), "{body}");
    let stderr = stop(proxy);
    stop(upstream);
    let text = std::fs::read_to_string(&journal).unwrap();
    assert_eq!(text.lines().count(), 1);
    for secret in [credential.as_str(), CANARY] {
        assert!(!text.contains(secret), "journal leaks a secret");
        assert!(!stderr.contains(secret), "stderr leaks a secret");
        assert!(!doc.to_string().contains(secret), "stdout leaks a secret");
    }

    // Without the variable: a clear error, nothing started.
    let out = home.run(&[
        "gateway",
        "--proxy",
        "http://127.0.0.1:9",
        "--credential-env",
        "BERTH_TEST_UNSET_KEY",
    ]);
    assert_eq!(out.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`BERTH_TEST_UNSET_KEY` is not set"));
}

#[test]
fn malformed_scripts_are_refused_before_listening() {
    let home = Home::new();
    let script = home.path().join("bad.toml");
    std::fs::write(&script, "schema_version = 1\n[[step]]\n").unwrap();
    let out = home.run(&["gateway", "--script", script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("name exactly one of"), "{stderr}");
}

#[test]
fn the_gateway_bench_reports_its_overhead_and_unknown_start_up_for_missing_clis() {
    let home = Home::new();
    let empty = home.path().join("no-clis");
    std::fs::create_dir_all(&empty).unwrap();
    let out = home
        .command(
            "tester",
            &["--json", "bench", "gateway", "--iterations", "20"],
        )
        .env("BERTH_AGENT_BIN_DIR", &empty)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["through_gateway"]["n"], 20);
    assert!(doc["overhead_median_ms"].as_f64().unwrap().is_finite());
    assert_eq!(doc["target"]["overhead_median_ms"], 1.0);
    // Judged on the overhead's interval: decided (true/false) or, when this run cannot tell,
    // null — and always the same answer as the verdict it names.
    common::assert_verdict_agrees(&doc["target"]);
    let interval = &doc["target"]["overhead_interval_ms"];
    assert!(interval["low"].as_f64().unwrap() <= interval["high"].as_f64().unwrap());
    for cli in ["opencode", "codex", "claude-code"] {
        let unknown = doc["harness_startup"][cli]["unknown"].as_str().unwrap();
        assert!(unknown.starts_with("UNKNOWN("), "{unknown}");
        assert!(doc["harness_startup"][cli]["median_ms"].is_null());
    }
}

#[test]
fn the_monitor_bench_follows_a_stand_in_agent_and_reports_its_latency() {
    let home = Home::new();
    let out = home.run(&["--json", "bench", "monitor", "host"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let host = &doc["providers"]["host"];
    assert_eq!(host["n"], 100, "{doc:#}");
    let (p50, p95) = (
        host["p50_ms"].as_f64().unwrap(),
        host["p95_ms"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p95, "{doc:#}");
    assert!(host["target"]["met"].is_boolean());
    // Nothing left behind: the sandbox went through the ledger and is gone.
    let (_, ledger) = home.json(&["ledger", "list"]);
    assert!(
        ledger["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["state"] == "verified_gone"),
        "{ledger:#}"
    );
    // Without a provider: a clear error.
    let out = home.run(&["bench", "monitor"]);
    assert_eq!(out.status.code(), Some(5));
}
