//! Missions on a provider reached through the ComputeSDK bridge, live: `computesdk:just-bash`
//! (a bash interpreter over an in-memory filesystem, no credentials), whose files and output
//! are text — so the repository travels by the text transport and is read back and compared
//! before the agent or the validator sees it — and fallback between native and bridged
//! providers on the same rules as everywhere.

use serde_json::Value;
use std::path::Path;
mod missions_support;
use missions_support::*;

const BRIDGED: &str = "computesdk:just-bash";

/// A mission whose agent writes `answer.txt` (which its validator checks) and says in
/// `staged-as.txt` whether it found a git checkout or a plain tree; `sandbox` replaces the
/// host.
fn mission(dir: &Path, sandbox: &str) -> std::path::PathBuf {
    let file = write_mission(
        dir,
        "if [ -e .git ]; then printf git > staged-as.txt; else printf tree > staged-as.txt; fi\nprintf right > answer.txt\n",
        "test \"$(cat answer.txt)\" = right && mkdir -p .berth && echo pass > .berth/verdict",
        "60s",
        "\".berth/verdict\"",
        1,
    );
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("provider = \"host\"", sandbox);
    std::fs::write(&file, text).unwrap();
    file
}

fn fact(doc: &Value, kind: &str) -> Value {
    doc["facts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == kind)
        .unwrap_or_else(|| panic!("no `{kind}` fact: {doc}"))["detail"]
        .clone()
}

fn succeeded(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_mission_runs_on_a_bridged_provider_with_the_tree_kept_exactly() {
    if !berth_testkit::computesdk_bridge_installed() {
        return;
    }
    let home = home();
    let dir = home.path().join("m");
    let file = mission(&dir, &format!("provider = \"{BRIDGED}\""));
    // Files the transport must carry exactly: UTF-8, every byte value, and a path longer than
    // a plain tar header holds.
    let repo = dir.join("repo");
    std::fs::write(repo.join("utf8.txt"), "üñí 日本\n").unwrap();
    let every_byte: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    std::fs::write(repo.join("bytes.bin"), &every_byte).unwrap();
    let long = format!("{}/{}.txt", "d".repeat(60), "f".repeat(90));
    std::fs::create_dir_all(repo.join(&long).parent().unwrap()).unwrap();
    std::fs::write(repo.join(&long), "deep\n").unwrap();

    let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
    succeeded(&out);
    let id = only_mission(home.path());
    a_bridged_mission_succeeded(home.path(), &id, &every_byte, &long);
}

fn a_bridged_mission_succeeded(home: &Path, id: &str, every_byte: &[u8], long: &str) {
    let (_, doc) = json(home, &["mission", "status", id]);
    assert_eq!(doc["mission"]["state"]["state"], "succeeded", "{doc}");
    let sandbox = fact(&doc, "sandbox");
    assert_eq!(sandbox["provider"], BRIDGED, "{doc}");
    assert!(
        fact(&doc, "stage")["transport"]
            .as_str()
            .unwrap()
            .starts_with("text:"),
        "{doc}"
    );
    let attempt = &doc["mission"]["tasks"][0]["attempts"][0]["status"];
    assert_eq!(attempt["evidence"][0], ".berth/verdict", "{doc}");

    // The final bundle holds the agent's change and every staged file, byte for byte.
    let bundle = home.join("missions").join(id).join("t.bundle");
    let checkout = tempfile::tempdir().unwrap();
    let clone = std::process::Command::new("git")
        .args(["clone", "-q"])
        .arg(&bundle)
        .arg(checkout.path().join("c"))
        .output()
        .unwrap();
    assert!(
        clone.status.success(),
        "{}",
        String::from_utf8_lossy(&clone.stderr)
    );
    let c = checkout.path().join("c");
    assert_eq!(std::fs::read(c.join("answer.txt")).unwrap(), b"right");
    // The text transport stages a plain tree: no `.git` in the sandbox.
    assert_eq!(std::fs::read(c.join("staged-as.txt")).unwrap(), b"tree");
    assert_eq!(std::fs::read(c.join("bytes.bin")).unwrap(), every_byte);
    assert_eq!(
        std::fs::read_to_string(c.join("utf8.txt")).unwrap(),
        "üñí 日本\n"
    );
    assert_eq!(std::fs::read_to_string(c.join(long)).unwrap(), "deep\n");

    // Agent and validator sandboxes both went through the ledger and are verified gone.
    let (_, ledger) = json(home, &["ledger", "list", "--all"]);
    let rows = sandbox_rows(&ledger);
    assert_eq!(rows.len(), 2, "{ledger}");
    for row in rows {
        assert_eq!(row["provider"], BRIDGED, "{row}");
        assert_eq!(row["state"], "verified_gone", "{row}");
    }
}

/// A tree the provider cannot keep (just-bash turns a symlink into a file and keeps no
/// executable bit) fails staging with the files named: the agent never runs on, and the
/// validator never judges, another tree. No attempt can do better, so none is charged: the run
/// stops (exit 14) and the mission can be cancelled.
#[test]
fn a_tree_the_bridged_provider_changes_is_refused_at_staging() {
    if !berth_testkit::computesdk_bridge_installed() {
        return;
    }
    let home = home();
    let dir = home.path().join("m");
    let file = mission(&dir, &format!("provider = \"{BRIDGED}\""));
    std::os::unix::fs::symlink("README", dir.join("repo/link")).unwrap();
    let tool = dir.join("repo/tool.sh");
    std::fs::write(&tool, "#!/bin/sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(14));
    let id = only_mission(home.path());
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    let status = &doc["mission"]["tasks"][0]["attempts"][0]["status"];
    assert_eq!(status["status"], "in_progress", "no verdict: {doc}");
    let reason = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        reason.contains(&format!("berth mission cancel {id}")),
        "{reason}"
    );
    assert!(
        reason.contains("staging failed")
            && reason.contains("2 of 4 files differ")
            && reason.contains("`link` mode 120000 became 100644")
            && reason.contains("`tool.sh` mode 100755 became 100644"),
        "{reason}"
    );
    let ran_agent = doc["facts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["kind"] == "agent");
    assert!(
        !ran_agent,
        "the agent ran on a tree that was not staged: {doc}"
    );
    let (_, ledger) = json(home.path(), &["ledger", "list", "--all"]);
    for row in sandbox_rows(&ledger) {
        assert_eq!(row["state"], "verified_gone", "{row}");
    }
    let (code, cancelled) = json(home.path(), &["mission", "cancel", &id]);
    assert_eq!(code, 0, "{cancelled}");
}

/// Fallback is one rule for native and bridged providers: an unreachable native provider falls
/// back to a bridged one (which takes no image: the mission's image is not asked of it), and
/// an unreachable bridged one to a native one.
#[test]
fn missions_fall_back_between_native_and_bridged_providers() {
    if !berth_testkit::computesdk_bridge_installed() {
        return;
    }
    // docker unreachable → just-bash.
    let (_home, _, doc) = fall_back(
        &format!(
            "provider = \"docker\"\nimage = \"berth/agent:bookworm\"\nfallback = [\"{BRIDGED}\"]"
        ),
        &[("DOCKER_HOST", "unix:///nonexistent/docker.sock")],
    );
    let sandbox = fact(&doc, "sandbox");
    assert_eq!(sandbox["provider"], BRIDGED, "{doc}");
    let skipped = sandbox["fallback_skipped"][0].as_str().unwrap();
    assert!(
        skipped.starts_with("docker:") && skipped.contains("not reachable"),
        "{skipped}"
    );

    // e2b (bridged) unreachable → host. The key is a canary: it must not be stored anywhere.
    let canary = "e2b_berthcanary7f3a9c1d";
    let (home, out, doc) = fall_back(
        "provider = \"computesdk:e2b\"\nfallback = [\"host\"]",
        &[
            ("E2B_API_KEY", canary),
            ("E2B_API_URL", "http://127.0.0.1:1"),
        ],
    );
    let sandbox = fact(&doc, "sandbox");
    assert_eq!(sandbox["provider"], "host", "{doc}");
    let skipped = sandbox["fallback_skipped"][0].as_str().unwrap();
    assert!(skipped.starts_with("computesdk:e2b:"), "{skipped}");
    assert!(
        fact(&doc, "stage")["transport"]
            .as_str()
            .unwrap()
            .starts_with("bytes:"),
        "{doc}"
    );
    let printed = format!(
        "{}{}{doc}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!printed.contains(canary), "the key leaked: {printed}");
    let holding = berth_testkit::files_holding(home.path(), canary.as_bytes());
    assert!(holding.is_empty(), "the key is in {holding:?}");
}

/// Runs a mission whose sandbox lines are `sandbox` in a new home with `env` set, which must
/// succeed: the home (kept alive), the run's output and `mission status`.
fn fall_back(
    sandbox: &str,
    env: &[(&str, &str)],
) -> (tempfile::TempDir, std::process::Output, Value) {
    let home = home();
    let file = mission(&home.path().join("m"), sandbox);
    let out = berth(home.path(), &["mission", "run", file.to_str().unwrap()])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    succeeded(&out);
    let id = only_mission(home.path());
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    (home, out, doc)
}

/// An agent CLI's login and session are staged as files: an agent harness on a provider
/// without the file API is refused when the mission is created, whether the provider is the
/// mission's or a fallback, and nothing is registered.
#[test]
fn an_agent_harness_on_a_provider_without_files_is_refused_at_creation() {
    let home = home();
    let dir = home.path().join("m");
    let file = mission(&dir, &format!("provider = \"{BRIDGED}\""));
    std::fs::write(dir.join("model.toml"), "").unwrap();
    let agent = std::fs::read_to_string(&file).unwrap().replace(
        "kind = \"script\"\ncommand = \"sh .agent/agent.sh\"",
        "kind = \"opencode\"\nmodel = \"scripted\"\n[harness.gateway]\nscript = \"model.toml\"",
    );
    for sandbox in [
        format!("provider = \"{BRIDGED}\""),
        format!("provider = \"host\"\nfallback = [\"{BRIDGED}\"]"),
    ] {
        let text = agent.replace(&format!("provider = \"{BRIDGED}\""), &sandbox);
        std::fs::write(&file, text).unwrap();
        let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{stderr}");
        assert!(
            stderr.contains(&format!("provider `{BRIDGED}` cannot run an agent harness"))
                && stderr.contains("does not support `files`"),
            "{stderr}"
        );
        let (_, list) = json(home.path(), &["mission", "list"]);
        assert_eq!(list["missions"].as_array().map(Vec::len), Some(0), "{list}");
    }
}
