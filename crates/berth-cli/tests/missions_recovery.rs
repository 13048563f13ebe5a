//! Missions under crashes: a SIGKILL at every durable boundary and anywhere inside a step
//! (host and docker), a killed runner, and concurrent runners.

use serde_json::Value;
use std::process::Stdio;
mod missions_support;

use missions_support::*;

#[test]
fn a_kill_at_every_durable_boundary_resumes_to_the_same_result() {
    // The boundaries come from the event log of an uninterrupted run, not a hard-coded count.
    let events = example_events_cached();
    assert!(
        events > 2,
        "the example stores its steps as events ({events})"
    );
    for boundary in ["kill-before-event", "kill-after-event"] {
        // One past the last event the fault never fires: the run completes on its own.
        let beyond_home = home();
        let beyond = format!("{boundary}:{}", events + 1);
        let out = berth(
            beyond_home.path(),
            &["mission", "run", example().to_str().unwrap()],
        )
        .env("BERTH_FAULT", &beyond)
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{beyond}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for n in 1..=events {
            let home = home();
            let fault = format!("{boundary}:{n}");
            let out = berth(
                home.path(),
                &["mission", "run", example().to_str().unwrap()],
            )
            .env("BERTH_FAULT", &fault)
            .output()
            .unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                out.status.signal(),
                Some(9),
                "{fault}: the process was not killed"
            );
            let id = only_mission(home.path());
            let resumed = run(home.path(), &["mission", "resume", &id]);
            assert!(
                resumed.status.success(),
                "{fault}: resume failed: {}{}",
                String::from_utf8_lossy(&resumed.stdout),
                String::from_utf8_lossy(&resumed.stderr)
            );
            assert_example_succeeded(home.path(), &id);
            assert_clean_ledger(home.path(), 2, 1);
        }
    }
}

/// One runner per mission: while a runner holds the lease, concurrent `mission resume`s exit 8
/// at once without running an agent; the first runner finishes with exactly one agent run.
#[test]
fn concurrent_runners_exit_8_and_run_nothing() {
    let home = home();
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("agent-runs");
    std::fs::create_dir(&runs).unwrap();
    // The agent leaves a mark outside the sandbox (host isolates nothing), then works slowly.
    let agent = format!(
        "touch {}/run-$$; sleep 3; mkdir -p .berth; echo ok > .berth/verdict\n",
        runs.display()
    );
    let file = write_mission(
        dir.path(),
        &agent,
        "test -f .berth/verdict",
        "30s",
        "\".berth/verdict\"",
        1,
    );
    let mut first = berth(home.path(), &["mission", "run", file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the first runner's agent is running (it holds the lease by then).
    for _ in 0..600 {
        if std::fs::read_dir(&runs).unwrap().count() > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_dir(&runs).unwrap().count(),
        1,
        "agent never started"
    );
    let id = only_mission(home.path());
    let others: Vec<_> = (0..4)
        .map(|_| {
            berth(home.path(), &["--json", "mission", "resume", &id])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for other in others {
        let out = other.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(8),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["error"]["kind"], "conflict", "{doc}");
    }
    assert!(first.wait().unwrap().success());
    assert_eq!(
        std::fs::read_dir(&runs).unwrap().count(),
        1,
        "a second agent ran"
    );
    let (code, doc) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(code, 0);
    assert_eq!(doc["mission"]["state"]["state"], "succeeded", "{doc}");
    // The lease is released: a later resume of the finished mission is not refused.
    let again = run(home.path(), &["mission", "resume", &id]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

#[test]
fn a_kill_anywhere_never_costs_an_attempt_on_host() {
    kill_anywhere("host", None, 40, 13);
}

#[test]
fn a_kill_anywhere_never_costs_an_attempt_on_docker() {
    if !reference_image_ready() {
        return;
    }
    kill_anywhere("docker", Some("berth/agent:bookworm"), 10, 350);
}

/// A runner killed while its agent works takes the agent with it — including a child the
/// agent detached with `setsid` — so a resumed run's agent never works beside a stale one.
#[test]
fn a_killed_runner_leaves_no_agent_behind() {
    let home = home();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let agent = format!(
        "setsid sh -c 'echo $$ > {m}/detached; exec sleep 300' </dev/null >/dev/null 2>&1 &\n\
         echo $$ > {m}/agent\nsleep 300\n",
        m = marks.display()
    );
    let file = write_mission(dir.path(), &agent, "true", "30s", "\"README\"", 1);
    let (mut runner, pids) = run_until_marked(home.path(), &file, &marks, &["agent", "detached"]);
    kill_runner(&mut runner);
    assert!(
        berth_testkit::wait_all_gone(&pids, std::time::Duration::from_secs(5)),
        "the agent or its detached child {pids:?} outlived the killed runner"
    );
    let id = only_mission(home.path());
    let _ = run(home.path(), &["ledger", "sweep"]);
    // Nothing to adopt from a stale agent; the mission stays resumable (its sandbox is held).
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(doc["mission"]["state"]["state"], "running", "{doc}");
    // Its lease names a runner that is gone: status says so, and the next run takes over.
    assert_eq!(doc["runner"]["state"], "gone", "{doc}");
    let said = run(home.path(), &["mission", "status", &id]);
    assert!(
        String::from_utf8_lossy(&said.stdout).contains("is gone: `berth mission resume"),
        "{}",
        String::from_utf8_lossy(&said.stdout)
    );
    // A watcher is told nobody drives it (it waited on nothing, silently, before).
    let unattended = first_watch_line(home.path(), &id, "unattended");
    assert_eq!(unattended["mission"], id.as_str(), "{unattended}");
    assert_eq!(unattended["runner"]["state"], "gone", "{unattended}");
}

/// The first `kind` line `mission watch --json ID` prints within 20 s (the watcher is killed
/// then).
fn first_watch_line(home: &std::path::Path, id: &str, kind: &str) -> Value {
    use std::io::BufRead;
    let mut watcher = berth(home, &["--json", "mission", "watch", id])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watcher.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seen = Vec::new();
    let found = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let doc: Value = serde_json::from_str(&line).unwrap_or_default();
                if doc["kind"] == kind {
                    break Some(doc);
                }
                seen.push(line);
            }
            Err(_) => break None,
        }
    };
    let _ = watcher.kill();
    let _ = watcher.wait();
    found.unwrap_or_else(|| panic!("no `{kind}` line from the watcher; it printed {seen:?}"))
}

/// A validation stopped by a killed runner is never resumed in the sandbox it ran in: the
/// validator runs the agent's code, and what that left there (here a file beside `repo/`; in a
/// container, a process still running) must not reach the verdict. The resumed validation runs
/// in a fresh sandbox, and both are gone afterwards.
#[test]
fn an_interrupted_validation_resumes_in_a_fresh_sandbox() {
    let home = home();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    // The first validation leaves `../tampered` and waits to be interrupted. A validation
    // that finds it passes; a later one without it fails.
    let validator = format!(
        "if [ -e ../tampered ]; then mkdir -p .berth && echo pass > .berth/verdict; exit 0; fi; \
         if [ -e {m}/validator ]; then echo fresh sandbox >&2; exit 1; fi; \
         touch ../tampered; echo $$ > {m}/validator; exec sleep 300",
        m = marks.display()
    );
    let file = write_mission(
        dir.path(),
        "printf wrong > answer.txt\n",
        &validator,
        "60s",
        "\".berth/verdict\"",
        1,
    );
    let (mut runner, pids) = run_until_marked(home.path(), &file, &marks, &["validator"]);
    kill_runner(&mut runner);
    assert!(
        berth_testkit::wait_all_gone(&pids, std::time::Duration::from_secs(5)),
        "the validator {pids:?} outlived the killed runner"
    );
    let id = only_mission(home.path());
    let resumed = run(home.path(), &["mission", "resume", &id]);
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(resumed.status.code(), Some(12), "{doc}");
    let status = &doc["mission"]["tasks"][0]["attempts"][0]["status"];
    assert_eq!(status["status"], "rejected", "{doc}");
    assert!(
        status["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("fresh sandbox"),
        "the verdict came from the interrupted validation's sandbox: {doc}"
    );
    // Two validator sandboxes were made, one per validation; none is left.
    let (_, ledger) = json(home.path(), &["ledger", "list", "--all"]);
    let validators: Vec<_> = ledger["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| {
            row["origin"]
                .as_str()
                .unwrap_or_default()
                .ends_with(" validator")
        })
        .collect();
    assert_eq!(validators.len(), 2, "{ledger}");
    let (_, open) = json(home.path(), &["ledger", "list"]);
    assert_eq!(sandbox_rows(&open).len(), 0, "{open}");
}
