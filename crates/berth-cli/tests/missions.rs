//! Missions end to end through the `berth` binary on the host provider: the bundled example,
//! crash recovery at every durable boundary (SIGKILL, then `mission resume`), and validator
//! cases (pass, fail, vacuous pass, timeout, tampering after the freeze).

use serde_json::Value;
use std::process::Command;
mod missions_support;

use missions_support::*;

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
    assert_clean_ledger(home.path(), 2, 0);
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

    // Another owner neither sees nor runs it (a resume would have recorded its sandboxes under
    // the wrong owner; before, status, resume and watch all went ahead).
    for verb in ["status", "resume", "watch"] {
        let out = berth(home.path(), &["mission", verb, &id])
            .env("BERTH_OWNER", "someone-else")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(11), "{verb}: {stderr}");
        assert!(
            stderr.contains("belongs to owner `mission-tester`") && stderr.contains("BERTH_OWNER"),
            "{verb}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{verb}");
    }
    assert_example_succeeded(home.path(), &id);
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
        assert_clean_ledger(home.path(), 1, 0);
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
    assert_clean_ledger(home.path(), 1, 0);
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

    // A NUL byte where a command is made: refused with its field and line, nothing registered
    // (before, the mission was stored and every attempt failed to run).
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/fix-the-test/mission.toml");
    let text = std::fs::read_to_string(example).unwrap();
    let nul = dir.join("nul.toml");
    std::fs::write(
        &nul,
        text.replacen("sh .agent/agent.sh", "sh .agent/agent.sh\\u0000", 1),
    )
    .unwrap();
    let out = run(home.path(), &["mission", "run", nul.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nul.toml:20: `harness.command` contains a NUL byte"),
        "{stderr}"
    );
    let list = run(home.path(), &["--json", "mission", "list"]);
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(list["missions"], serde_json::json!([]), "{list}");

    // An unknown mission id is a missing mission, with where to list them (it was "no ledger
    // entry" with a hint about sandboxes).
    for verb in ["status", "resume"] {
        let out = run(home.path(), &["--json", "mission", verb, "ms-nope"]);
        assert_eq!(out.status.code(), Some(3), "{verb}");
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["error"]["message"], "no mission `ms-nope`", "{doc}");
        assert_eq!(
            doc["error"]["hint"], "`berth mission list` shows your missions",
            "{doc}"
        );
    }
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
        // The upstream's HEAD moves on to another branch: the mission still starts at trunk.
        vec!["checkout", "-q", "-b", "later"],
        vec![
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@l",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "LATER",
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
    // The task's bundle: the accepted commit on trunk, not on `later`.
    let bundle = home
        .path()
        .join("missions")
        .join(&id)
        .join("fix-add.bundle");
    let heads = Command::new("git")
        .args(["-C", home.path().to_str().unwrap(), "bundle", "list-heads"])
        .arg(&bundle)
        .output()
        .unwrap();
    let heads = String::from_utf8_lossy(&heads.stdout);
    assert_eq!(heads.lines().count(), 1, "{heads}");
    assert!(heads.trim_end().ends_with(" HEAD"), "{heads}");
    let clone = home.path().join("final");
    assert!(Command::new("git")
        .args(["clone", "-q"])
        .arg(&bundle)
        .arg(&clone)
        .status()
        .unwrap()
        .success());
    let subjects = Command::new("git")
        .arg("-C")
        .arg(&clone)
        .args(["log", "--format=%s"])
        .output()
        .unwrap();
    let subjects = String::from_utf8_lossy(&subjects.stdout);
    assert!(subjects.contains("upstream"), "{subjects}");
    assert!(!subjects.contains("LATER"), "{subjects}");
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

/// An agent that writes a secret the run was handed (here the artifact store's key, in
/// Berth's environment) into the workspace: the attempt is rejected at capture, naming the
/// file, and nothing of it is committed — the value is in no file of Berth's home (before, the
/// attempt's patch and the validator's checkout held it, and the attempt could be accepted).
#[test]
fn a_secret_written_into_the_workspace_is_never_committed() {
    const SECRET: &str = "s3-secret-7c1e9a4b2d6f8e0a-canary";
    // An agent writing the value in two halves: its script (in the base) does not hold it.
    let leaking = |dir: &std::path::Path| {
        write_mission(
            dir,
            &format!(
                "mkdir -p notes && printf 'key=%s%s\\n' '{}' '{}' > notes/leak.txt\n",
                &SECRET[..10],
                &SECRET[10..]
            ),
            "echo ok > .berth-out",
            "10s",
            "\".berth-out\"",
            1,
        )
    };
    let home = home();
    let file = leaking(home.path());
    let out = berth(home.path(), &["mission", "run", file.to_str().unwrap()])
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .output()
        .unwrap();
    let (_, reason, doc) = first_reason(home.path());
    assert_eq!(out.status.code(), Some(12), "{doc}");
    assert_eq!(doc["mission"]["state"]["state"], "failed", "{doc}");
    assert!(
        reason.contains("holds a secret value") && reason.contains("notes/leak.txt"),
        "{reason}"
    );
    // The attempt's sandbox is gone; no validator ran.
    let (_, ledger) = json(home.path(), &["ledger", "list", "--all"]);
    let rows = ledger["entries"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{ledger}");
    assert_eq!(rows[0]["state"], "verified_gone", "{ledger}");
    let holding = berth_testkit::files_holding(home.path(), SECRET.as_bytes());
    assert!(holding.is_empty(), "the secret is in {holding:?}");

    // The control: the same agent without the value in Berth's environment is accepted.
    let home = missions_support::home();
    let file = leaking(home.path());
    let out = run(home.path(), &["mission", "run", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
