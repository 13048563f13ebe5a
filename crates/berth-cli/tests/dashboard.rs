//! The web dashboard in a real headless Chromium (Debian's `chromium` and `chromedriver`),
//! driven over WebDriver from Rust: sign in with a token, see the example mission's rejected
//! and accepted attempts, follow a running mission's events live until they end, and look at
//! the ledger, the catalog and a benchmark chart. Each page's screenshot is written under
//! `target/tmp/dashboard-screenshots/` for review.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

mod common;

use common::*;

/// The WebDriver element key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn browser_ready() -> bool {
    if Path::new("/usr/bin/chromium").exists() && which("chromedriver").is_ok() {
        return true;
    }
    if std::env::var_os("BERTH_SKIP_BROWSER").is_some() {
        eprintln!("SKIPPED (BERTH_SKIP_BROWSER set): no chromium/chromedriver");
        return false;
    }
    panic!(
        "chromium and chromedriver missing; run scripts/test (Debian packages chromium, \
         chromium-driver), or set BERTH_SKIP_BROWSER=1 to skip explicitly"
    );
}

/// A plain HTTP/1.1 JSON request (connection closed after).
fn http_json(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
    cookie: Option<&str>,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(cookie) = cookie {
        request.push_str(&format!("Cookie: {cookie}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    stream.write_all(request.as_bytes()).unwrap();
    // Read the head, then exactly the body it announces: a server may keep the connection
    // open whatever the request said.
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let lower = head.to_ascii_lowercase();
    let length = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let body = if let Some(length) = length {
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).unwrap();
        String::from_utf8_lossy(&body).into_owned()
    } else if lower.contains("transfer-encoding: chunked") {
        let mut body = String::new();
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0u8; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            body.push_str(&String::from_utf8_lossy(&chunk[..size]));
        }
        body
    } else {
        let mut body = String::new();
        reader.read_to_string(&mut body).unwrap();
        body
    };
    (status, body)
}

/// chromedriver and one browser session, both ended on drop.
struct Browser {
    driver: Child,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let addr = format!("127.0.0.1:{port}");
        wait_for("chromedriver", || TcpStream::connect(&addr).is_ok());
        let profile = tempfile::Builder::new()
            .prefix("berth-test-chromium-")
            .tempdir()
            .unwrap();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                         "--no-first-run", "--disable-background-networking",
                         "--disable-component-update", "--disable-sync",
                         "--window-size=1280,1000",
                         format!("--user-data-dir={}", profile.path().display())],
            },
        }}});
        let (status, body) = http_json(&addr, "POST", "/session", Some(&capabilities), None);
        let doc: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let session = doc["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session ({status}): {body}"))
            .to_owned();
        Browser {
            driver,
            addr,
            session,
            _profile: profile,
        }
    }

    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, text) = http_json(
            &self.addr,
            method,
            &format!("/session/{}{path}", self.session),
            body.as_ref(),
            None,
        );
        let doc: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert_eq!(status, 200, "WebDriver {method} {path}: {text}");
        doc["value"].clone()
    }

    fn open(&self, url: &str) {
        self.command("POST", "/url", Some(json!({ "url": url })));
    }

    fn script(&self, script: &str) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    fn find(&self, css: &str) -> String {
        let found = self.command(
            "POST",
            "/element",
            Some(json!({ "using": "css selector", "value": css })),
        );
        found[ELEMENT].as_str().unwrap().to_owned()
    }

    fn wait_until(&self, what: &str, script: &str) {
        let started = Instant::now();
        while self.script(script) != Value::Bool(true) {
            if started.elapsed() > Duration::from_secs(60) {
                let page = self.script("return document.body.innerText");
                panic!("the page never showed {what}:\n{page}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.command("GET", "/screenshot", None);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = http_json(
            &self.addr,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
            None,
        );
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        // Whatever of the browser outlived its driver (a session that could not be deleted)
        // is found by its own profile directory and killed: the suite leaves nothing running.
        let profile = self._profile.path().to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&profile) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

fn example_mission() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/fix-the-test/mission.toml")
}

/// A mission whose agent takes a while, so its events can be watched arriving.
fn slow_mission(home: &Home) -> PathBuf {
    let dir = home.path().join("slow");
    std::fs::create_dir_all(dir.join("repo")).unwrap();
    std::fs::write(dir.join("repo/README"), "slow\n").unwrap();
    let file = dir.join("mission.toml");
    std::fs::write(
        &file,
        r#"schema_version = 1
name = "slow"
[repository]
path = "repo"
base = "snapshot"
[sandbox]
provider = "host"
[harness]
kind = "script"
command = "sleep 3 && echo done > out.txt"
[[tasks]]
id = "wait"
instructions = "take your time"
max_attempts = 1
agent_timeout = "60s"
[tasks.validator]
command = "test -f out.txt"
timeout = "30s"
evidence = ["out.txt"]
"#,
    )
    .unwrap();
    file
}

#[test]
fn the_dashboard_in_a_real_browser() {
    if !browser_ready() {
        return;
    }
    let home = Home::new();
    // The example mission: rejected first, accepted second.
    let (code, doc) = home.json_as(
        "alice",
        &["mission", "run", &example_mission().to_string_lossy()],
    );
    assert_eq!(code, 0, "{doc}");
    let (_, list) = home.json_as("alice", &["mission", "list"]);
    let example = list["missions"][0]["id"].as_str().unwrap().to_owned();
    // A benchmark record to chart.
    let bench_dir = home.path().join("bench");
    std::fs::create_dir_all(&bench_dir).unwrap();
    let record = bench_dir.join("host.json");
    let out = home.run_as(
        "alice",
        &[
            "bench",
            "host",
            "--iterations",
            "3",
            "--out",
            &record.to_string_lossy(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (code, doc) = home.json(&["token", "create", "--owner", "alice", "--scope", "read"]);
    assert_eq!(code, 0, "{doc}");
    let token = doc["token"].as_str().unwrap().to_owned();
    let served = serve(&home);
    let base = format!("http://{}", served.addr);
    let browser = Browser::start();

    // Unsigned, the dashboard asks for a token.
    browser.open(&format!("{base}/ui"));
    browser.wait_until(
        "the login form",
        "return !!document.getElementById('token')",
    );
    browser.screenshot("login");
    let field = browser.find("#token");
    browser.command(
        "POST",
        &format!("/element/{field}/value"),
        Some(json!({ "text": token })),
    );
    let button = browser.find("#signin");
    browser.command("POST", &format!("/element/{button}/click"), Some(json!({})));
    browser.wait_until(
        "the missions table",
        &format!("return document.body.innerText.includes('{example}')"),
    );
    browser.screenshot("missions");

    // The example mission: its rejected and its accepted attempt, with reasons.
    browser.open(&format!("{base}/ui/missions/{example}"));
    browser.wait_until(
        "both verdicts",
        "return document.querySelectorAll('tr.attempt[data-verdict=rejected]').length >= 1 \
         && document.querySelectorAll('tr.attempt[data-verdict=accepted]').length >= 1",
    );
    browser.wait_until(
        "the finished event log",
        "return document.getElementById('live').textContent === 'ended' \
         && document.getElementById('events').textContent.includes('#1 ')",
    );
    browser.screenshot("mission-example");

    // A running mission, followed live: events arrive while it runs, then the stream ends.
    let mut running = home
        .command(
            "alice",
            &["mission", "run", &slow_mission(&home).to_string_lossy()],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut slow = String::new();
    wait_for("the slow mission to register", || {
        let (_, list) = home.json_as("alice", &["mission", "list"]);
        match list["missions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "slow")
        {
            Some(m) => {
                slow = m["id"].as_str().unwrap().to_owned();
                true
            }
            None => false,
        }
    });
    browser.open(&format!("{base}/ui/missions/{slow}"));
    browser.wait_until(
        "live events while the mission runs",
        "return document.getElementById('live').textContent === 'live'",
    );
    let seen_live =
        browser.script("return document.getElementById('events').textContent.split('\\n').length");
    browser.screenshot("mission-live");
    browser.wait_until(
        "the end of the live stream",
        "return document.getElementById('live').textContent === 'ended'",
    );
    let seen_end =
        browser.script("return document.getElementById('events').textContent.split('\\n').length");
    assert!(
        seen_end.as_u64() > seen_live.as_u64(),
        "no event arrived after the page opened ({seen_live} then {seen_end})"
    );
    assert!(running.wait().unwrap().success());

    // A cancelled mission shows why, as text: the reason is whatever its canceller wrote.
    let stuck = slow_mission(&home);
    let text = std::fs::read_to_string(&stuck)
        .unwrap()
        .replace("name = \"slow\"", "name = \"stuck\"")
        .replace("sleep 3 && echo done > out.txt", "sleep 300");
    std::fs::write(&stuck, text).unwrap();
    let mut runner = home
        .command("alice", &["mission", "run", &stuck.to_string_lossy()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stuck_id = std::cell::RefCell::new(None);
    wait_for("the stuck mission's agent to start", || {
        let (_, list) = home.json_as("alice", &["mission", "list"]);
        let Some(id) = list["missions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "stuck")
            .and_then(|m| m["id"].as_str().map(str::to_owned))
        else {
            return false;
        };
        let (_, doc) = home.json_as("alice", &["mission", "status", &id]);
        let staged = doc["mission"]["tasks"][0]["attempts"][0]["status"]["phase"] == "staged";
        *stuck_id.borrow_mut() = Some(id);
        staged
    });
    runner.kill().unwrap();
    runner.wait().unwrap();
    let stuck_id = stuck_id.into_inner().unwrap();
    let reason = "<img src=x onerror=\"document.title='owned'\">";
    let (code, doc) = home.json_as(
        "alice",
        &["mission", "cancel", &stuck_id, "--reason", reason],
    );
    assert_eq!(code, 0, "{doc}");
    browser.open(&format!("{base}/ui/missions/{stuck_id}"));
    browser.wait_until(
        "the cancelled mission",
        "return document.getElementById('mission-state').textContent === 'cancelled'",
    );
    let shown = browser.script("return document.getElementById('mission-reason').textContent");
    assert_eq!(shown, json!(reason));
    let images = browser.script("return document.querySelectorAll('img').length");
    assert_eq!(images, json!(0), "the reason became markup");
    browser.screenshot("mission-cancelled");

    // Ledger, catalog, benchmarks.
    browser.open(&format!("{base}/ui/ledger"));
    browser.wait_until("the ledger", "return !!document.getElementById('ledger')");
    // Each row says whether its run is still live; this owner's runs here are all over.
    let runs = browser.script(
        "return [...document.querySelectorAll('#ledger tr')].slice(1) \
         .map(r => r.children[4].className)",
    );
    let runs = runs.as_array().cloned().unwrap_or_default();
    assert!(
        !runs.is_empty() && runs.iter().all(|c| c == "over"),
        "run column: {runs:?}"
    );
    browser.screenshot("ledger");
    browser.open(&format!("{base}/ui/catalog"));
    browser.wait_until(
        "verified capabilities and their signed evidence",
        "return document.querySelectorAll('#catalog td.VERIFIED').length > 0 \
         && document.body.innerText.includes('signed by')",
    );
    browser.screenshot("catalog");
    browser.open(&format!("{base}/ui/bench"));
    browser.wait_until(
        "a benchmark chart",
        "return document.querySelectorAll('svg.chart rect.bar').length > 0",
    );
    browser.screenshot("bench");

    // The session cookie reads, but can never mutate.
    let cookie = format!("berth_session={token}");
    let addr = base.trim_start_matches("http://");
    let (status, _) = http_json(addr, "GET", "/v1/sandboxes", None, Some(&cookie));
    assert_eq!(status, 200);
    let (status, _) = http_json(
        addr,
        "POST",
        "/v1/sandboxes",
        Some(&json!({})),
        Some(&cookie),
    );
    assert_eq!(status, 401, "a cookie must not authorize a mutation");
}
