//! Helpers Berth's live tests share (a dev-dependency only; nothing here ships).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `berth-supervisor` — the per-exec reaper and bwrap's unprivileged entry: the static build
/// `scripts/test` exports as `BERTH_SUPERVISOR`, or a debug build next to the running test
/// binary (built with cargo when missing).
pub fn supervisor_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("BERTH_SUPERVISOR") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the test binary has a path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps")
        .join("berth-supervisor");
    if !path.is_file() {
        let built = std::process::Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()))
            .args(["build", "-p", "berth-supervisor"])
            .status()
            .expect("cargo runs");
        assert!(built.success(), "cannot build berth-supervisor");
    }
    path
}

/// Waits (at most `limit`) until every file in `names` under `dir` holds a pid; returns them
/// in order, or `None` when they did not all appear.
pub fn wait_for_pids(dir: &Path, names: &[&str], limit: Duration) -> Option<Vec<i32>> {
    let until = Instant::now() + limit;
    loop {
        let pids: Option<Vec<i32>> = names
            .iter()
            .map(|name| {
                std::fs::read_to_string(dir.join(name))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            })
            .collect();
        if pids.is_some() || Instant::now() >= until {
            return pids;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process is gone when /proc has no entry for it or only a zombie awaiting its reaper.
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Waits (at most `limit`) until every pid is gone; true when they all are.
pub fn wait_all_gone(pids: &[i32], limit: Duration) -> bool {
    let until = Instant::now() + limit;
    loop {
        if pids.iter().all(|pid| process_gone(*pid)) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Host pids whose environment carries sandbox `sandbox`'s marker (`BERTH_SANDBOX`, which
/// local providers set on every command), zombies excluded (their environment reads empty).
pub fn marked_processes(sandbox: &str) -> Vec<u32> {
    let marker = format!("BERTH_SANDBOX={sandbox}");
    std::fs::read_dir("/proc")
        .expect("/proc is readable")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|v| v == marker.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// Waits (at most `limit`) until no process carries the sandbox's marker; true when none does.
pub fn wait_unmarked(sandbox: &str, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    loop {
        if marked_processes(sandbox).is_empty() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every regular file under `dir`, symlinks not followed (a whole home scanned for a canary).
pub fn regular_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match entry.file_type() {
            Ok(t) if t.is_dir() => found.extend(regular_files(&entry.path())),
            Ok(t) if t.is_file() => found.push(entry.path()),
            _ => {}
        }
    }
    found
}

/// The regular files under `dir` (as [`regular_files`]) whose bytes hold `needle` — where a
/// planted secret was persisted.
pub fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    regular_files(dir)
        .into_iter()
        .filter(|path| {
            let bytes = std::fs::read(path).unwrap_or_default();
            contains(&bytes, needle)
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether the ComputeSDK bridge is installed (`scripts/install-computesdk-bridge` puts its
/// pinned packages in `bridge/computesdk/node_modules`). `false` only when
/// `BERTH_SKIP_COMPUTESDK` says to skip explicitly; a missing bridge otherwise fails the test.
pub fn computesdk_bridge_installed() -> bool {
    let bridge = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bridge/computesdk/node_modules/computesdk");
    if bridge.is_dir() {
        return true;
    }
    assert!(
        std::env::var_os("BERTH_SKIP_COMPUTESDK").is_some(),
        "the ComputeSDK bridge is not installed: run scripts/install-computesdk-bridge \
         (or set BERTH_SKIP_COMPUTESDK=1 to skip explicitly)"
    );
    false
}

/// Where the pinned agent CLIs are (`BERTH_AGENT_BIN_DIR`, else `agents/node_modules/.bin`
/// from `scripts/install-agent-clis`). `None` only when `BERTH_SKIP_AGENT_CLIS=1` says to skip
/// explicitly; missing CLIs otherwise fail the test.
pub fn agent_cli_dir() -> Option<PathBuf> {
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
        "the agent CLIs are not installed in {}: run scripts/install-agent-clis (or set \
         BERTH_AGENT_BIN_DIR, or BERTH_SKIP_AGENT_CLIS=1 to skip explicitly)",
        dir.display()
    );
}

/// Makes a FIFO (mode 0600) at `path`, with nothing ever opening its other end.
pub fn make_fifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .args(["-m", "600"])
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// `work`'s result, failing the test when it does not return within 5 s: it blocked (on a
/// FIFO with no writer, say). The blocked thread is left behind; the test fails anyway.
pub fn at_once<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (sent, got) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sent.send(work());
    });
    got.recv_timeout(Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("{what} blocked"))
}

/// Loads an untagged image made at `created` (RFC 3339), labelled as Berth labels a commit
/// (`berth.image_for` = `made_for`), as `docker load` of a minimal image archive; returns its id.
pub fn load_untagged_image(dir: &Path, created: &str, made_for: &str) -> String {
    let build = |entries: &[(&str, &[u8])]| {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, bytes) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut header, name, *bytes).unwrap();
        }
        tar.into_inner().unwrap()
    };
    let layer = build(&[("berth-abandoned", created.as_bytes())]);
    std::fs::write(dir.join("layer.tar"), &layer).unwrap();
    let sum = std::process::Command::new("sha256sum")
        .arg(dir.join("layer.tar"))
        .output()
        .unwrap();
    let diff_id = format!(
        "sha256:{}",
        String::from_utf8_lossy(&sum.stdout)
            .split_whitespace()
            .next()
            .unwrap()
    );
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": { "Labels": { "berth.image_for": made_for } },
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
    })
    .to_string();
    let manifest = serde_json::json!([
        { "Config": "config.json", "RepoTags": null, "Layers": ["layer.tar"] }
    ])
    .to_string();
    let archive = build(&[
        ("config.json", config.as_bytes()),
        ("layer.tar", &layer),
        ("manifest.json", manifest.as_bytes()),
    ]);
    std::fs::write(dir.join("image.tar"), archive).unwrap();
    let loaded = std::process::Command::new("docker")
        .args(["load", "-q", "-i"])
        .arg(dir.join("image.tar"))
        .output()
        .unwrap();
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    String::from_utf8_lossy(&loaded.stdout)
        .trim()
        .rsplit(' ')
        .next()
        .unwrap()
        .to_owned()
}

/// Whether the docker engine has `image`.
pub fn image_exists(image: &str) -> bool {
    std::process::Command::new("docker")
        .args(["image", "inspect", image])
        .output()
        .is_ok_and(|o| o.status.success())
}
