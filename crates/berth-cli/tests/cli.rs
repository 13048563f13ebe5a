//! End-to-end tests of the `berth` binary on the host provider with a real SQLite ledger:
//! the user path create → exec → cp → snapshot → fork → destroy → ledger, the JSON shapes, exit
//! codes, hostile input, canary secrets, and must-fire / must-not-fire teardown under signals.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
mod common;

use common::*;

#[test]
fn user_path_create_exec_cp_snapshot_fork_destroy_ledger() {
    let home = Home::new();
    let id = home.create("tester");
    assert!(id.starts_with("bx-"));
    assert!(home.sandbox_dir(&id).is_dir());

    // exec: streams separate, exit code passed through.
    let out = home.run(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n");
    let (code, doc) = home.json(&["exec", &id, "-c", "printf '%s' \"$HOME\" | wc -c"]);
    assert_eq!(code, 0);
    assert_eq!(doc["command"], "exec");
    assert_eq!(doc["status"]["status"], "exited");
    assert_eq!(doc["status"]["code"], 0);
    assert_eq!(doc["stdout_truncated"], false);
    assert!(doc.get("stdout_base64").is_none(), "{doc}");
    // Output that is not UTF-8 is never silently changed: the exact bytes come beside the text.
    let (code, doc) = home.json(&[
        "exec",
        &id,
        "-c",
        "printf 'a\\377\\000b'; printf '\\376' >&2",
    ]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["stdout"], "a\u{fffd}\u{0}b", "{doc}");
    assert_eq!(doc["stdout_base64"], "Yf8AYg==", "{doc}");
    assert_eq!(doc["stderr_base64"], "/g==", "{doc}");

    // cp in and out, binary-safe.
    let local = home.path().join("blob.bin");
    let blob: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    std::fs::write(&local, &blob).unwrap();
    let (code, doc) = home.json(&[
        "cp",
        local.to_str().unwrap(),
        &format!("{id}:data/blob.bin"),
    ]);
    assert_eq!((code, doc["bytes"].as_u64()), (0, Some(100_000)), "{doc}");
    let back = home.path().join("back.bin");
    let out = home.run(&["cp", &format!("{id}:data/blob.bin"), back.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(&back).unwrap(), blob);

    // snapshot, then change, then fork and restore.
    let (code, doc) = home.json(&["snapshot", &id]);
    assert_eq!(code, 0, "{doc}");
    let handle = doc["snapshot"]["handle"].as_str().unwrap().to_owned();
    assert!(
        handle.starts_with("sha256:") && handle.len() == 71,
        "{handle}"
    );
    assert_eq!(doc["snapshot"]["kind"], "digest");
    // The snapshot is a ledger row, named by its key, recorded before it existed.
    let snapshot_key = doc["key"].as_str().unwrap().to_owned();
    assert_eq!(home.ledger_state("tester", &snapshot_key), "created");
    home.run(&["exec", &id, "-c", "echo after > data/marker"]);
    let (code, doc) = home.json(&["fork", &id]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["source"], id.as_str());
    let fork = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let out = home.run(&[
        "exec",
        &fork,
        "-c",
        "cat data/marker && wc -c < data/blob.bin",
    ]);
    assert_eq!(text(&out.stdout), "after\n100000\n");
    // `-p`, as `create` and `run` take it.
    let (code, doc) = home.json(&["restore", "-p", "host", &handle]);
    assert_eq!(code, 0, "{doc}");
    let restored = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let out = home.run(&[
        "exec",
        &restored,
        "-c",
        "test ! -e data/marker && echo clean",
    ]);
    assert_eq!(text(&out.stdout), "clean\n");
    // A fork of a sandbox that vanished out of band names that sandbox, not the fork's row.
    let vanished = home.json(&["create"]).1["sandbox"]["berth_id"]
        .as_str()
        .unwrap()
        .to_owned();
    std::fs::remove_dir_all(home.sandbox_dir(&vanished)).unwrap();
    let (code, doc) = home.json(&["fork", &vanished]);
    assert_eq!(code, 3, "{doc}");
    assert_eq!(doc["error"]["kind"], "not_found", "{doc}");
    let message = doc["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!("cannot fork `{vanished}`: ")),
        "{doc}"
    );
    assert!(
        doc["error"]["hint"]
            .as_str()
            .is_some_and(|h| h.contains(&format!("berth status {vanished}"))),
        "{doc}"
    );
    home.json(&["destroy", &vanished]);
    // A missing file is not_found with a hint about the path, not about the sandbox list.
    let copied = home.path().join("missing-copy");
    let (code, doc) = home.json(&[
        "cp",
        &format!("{restored}:data/marker"),
        copied.to_str().unwrap(),
    ]);
    assert_eq!(code, 3, "{doc}");
    assert_eq!(doc["error"]["kind"], "not_found", "{doc}");
    let hint = doc["error"]["hint"].as_str().unwrap_or_default();
    assert!(
        hint.contains("relative to the sandbox's workspace") && hint.contains(&restored),
        "{doc}"
    );
    assert!(!copied.exists());

    // list and status show observed state beside the ledger.
    let (_, doc) = home.json(&["list"]);
    let listed = doc["sandboxes"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{doc}");
    assert!(listed.iter().all(|s| s["observed"]["state"] == "running"));
    let (_, doc) = home.json(&["status", &fork]);
    assert_eq!(doc["ledger"]["origin"], format!("fork:{id}"));
    assert_eq!(doc["observed"]["raw"], "ready");

    // destroy verifies; the ledger shows it; destroyed ids are not found any more.
    let (code, doc) = home.json(&["destroy", &id, &fork, &restored]);
    assert_eq!(code, 0, "{doc}");
    for entry in doc["destroyed"].as_array().unwrap() {
        assert_eq!(entry["result"]["outcome"], "verified_gone");
    }
    for sandbox in [&id, &fork, &restored] {
        assert!(!home.sandbox_dir(sandbox).exists());
        assert_eq!(home.ledger_state("tester", sandbox), "verified_gone");
    }
    let (code, doc) = home.json(&["exec", &id, "--", "true"]);
    assert_eq!(
        code, 125,
        "berth's own failure in exec is 125, not a command code"
    );
    assert_eq!(doc["error"]["kind"], "not_found");
    // A snapshot without retention is held: gc keeps it; `berth destroy KEY` deletes it.
    let (code, doc) = home.json(&["gc"]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(home.ledger_state("tester", &snapshot_key), "created");
    let archive = home
        .path()
        .join("state/host/snapshots")
        .join(format!("{}.tar", handle.trim_start_matches("sha256:")));
    assert!(archive.is_file());
    let (code, doc) = home.json(&["destroy", &snapshot_key]);
    assert_eq!(code, 0, "{doc}");
    assert!(!archive.exists(), "the snapshot's archive outlived its row");
    let (_, doc) = home.json(&["ledger", "list"]);
    assert!(doc["entries"].as_array().unwrap().is_empty(), "{doc}");
}

/// Snapshots are ledger rows with retention: after it, `berth gc` deletes them; a snapshot
/// key is not a sandbox.
#[test]
fn gc_deletes_snapshots_past_their_retention_and_nothing_held() {
    let home = Home::new();
    let id = home.create("tester");
    home.run(&["exec", &id, "-c", "echo one > f"]);
    let (code, short) = home.json(&["snapshot", &id, "--ttl", "1ms"]);
    assert_eq!(code, 0, "{short}");
    home.run(&["exec", &id, "-c", "echo two > f"]);
    let (code, kept) = home.json(&["snapshot", &id]);
    assert_eq!(code, 0, "{kept}");
    let archive = |doc: &Value| {
        home.path().join("state/host/snapshots").join(format!(
            "{}.tar",
            doc["snapshot"]["handle"]
                .as_str()
                .unwrap()
                .trim_start_matches("sha256:")
        ))
    };
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (code, doc) = home.json(&["gc"]);
    assert_eq!(code, 0, "{doc}");
    assert!(
        !archive(&short).exists(),
        "gc kept an expired snapshot: {doc}"
    );
    assert!(archive(&kept).exists(), "gc deleted a held snapshot: {doc}");
    let short_key = short["key"].as_str().unwrap();
    assert_eq!(home.ledger_state("tester", short_key), "verified_gone");
    // The sandbox itself has the default 24h TTL: gc leaves it.
    assert!(home.sandbox_dir(&id).exists());
    let key = kept["key"].as_str().unwrap();
    let (code, doc) = home.json(&["exec", key, "--", "true"]);
    assert_eq!(code, 125, "{doc}");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is a snapshot"),
        "{doc}"
    );
    home.run(&["destroy", key, &id]);
}

#[test]
fn exit_codes_timeouts_and_errors_are_documented_values() {
    let home = Home::new();
    let id = home.create("tester");
    let started = Instant::now();
    let out = home.run(&[
        "exec",
        &id,
        "--timeout",
        "300ms",
        "-c",
        "trap '' TERM; sleep 30",
    ]);
    assert_eq!(out.status.code(), Some(124));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(text(&out.stderr).contains("timed out"));
    let (code, doc) = home.json(&["exec", &id, "--timeout", "200ms", "-c", "sleep 5"]);
    assert_eq!(
        (code, &doc["status"]["status"]),
        (124, &Value::from("timed_out"))
    );
    let out = home.run(&["exec", &id, "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(137));

    // Unsupported verbs name the capability and exit 4.
    for (verb, capability) in [("stop", "stop_start"), ("suspend", "suspend_resume")] {
        let (code, doc) = home.json(&[verb, &id]);
        assert_eq!(code, 4, "{doc}");
        assert_eq!(doc["error"]["kind"], "unsupported");
        let message = doc["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("does not support `{capability}`")),
            "{message}"
        );
    }
    // Hostile paths: invalid input, exit 5, nothing written outside.
    for remote in ["../escape", "/etc/passwd", "a/../../b"] {
        let sink = home.path().join("copied");
        let (code, doc) = home.json(&["cp", &format!("{id}:{remote}"), sink.to_str().unwrap()]);
        assert_eq!(code, 5, "{remote}: {doc}");
        assert_eq!(doc["error"]["kind"], "invalid_request");
    }
    home.run(&["exec", &id, "-c", "ln -s /etc etc-link"]);
    let sink = home.path().join("copied");
    let (code, doc) = home.json(&[
        "cp",
        &format!("{id}:etc-link/hostname"),
        sink.to_str().unwrap(),
    ]);
    assert_eq!(code, 5, "{doc}");
    assert!(doc["error"]["message"]
        .as_str()
        .unwrap()
        .contains("symlink"));
    // Unknown things: not found, with a hint.
    let (code, doc) = home.json(&["status", "bx-nope"]);
    assert_eq!(code, 3);
    assert!(doc["error"]["hint"]
        .as_str()
        .unwrap()
        .contains("berth list"));
    let (code, doc) = home.json(&["create", "--provider", "teleport"]);
    assert_eq!(code, 3, "{doc}");
    assert!(doc["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown provider `teleport`"));
    let (code, _) = home.json(&["create", "--ttl", "soon"]);
    assert_eq!(code, 5);
    let out = home.run(&["exec", &id]);
    assert_eq!(out.status.code(), Some(125), "nothing to run");
    assert!(text(&out.stderr).contains("nothing to run"));
    let out = home.run(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "clap usage error");
}

#[test]
fn huge_output_streams_through_and_json_reports_truncation_honestly() {
    let home = Home::new();
    let id = home.create("tester");
    let out = home.run(&["exec", &id, "-c", "head -c 30000000 /dev/zero"]);
    assert!(out.status.success());
    assert_eq!(
        out.stdout.len(),
        30_000_000,
        "streamed exec passes everything through"
    );
    let (code, doc) = home.json(&["exec", &id, "-c", "head -c 20000000 /dev/zero | tr '\\0' x"]);
    assert_eq!(code, 0);
    assert_eq!(doc["stdout_bytes"], 20_000_000);
    assert_eq!(doc["stdout_truncated"], true);
    assert_eq!(doc["stdout"].as_str().unwrap().len(), 16 * 1024 * 1024);
}

#[test]
fn canary_secret_passed_by_name_is_never_persisted_or_printed() {
    let home = Home::new();
    let id = home.create("tester");
    // `--env NAME` takes the value from berth's environment: not in argv.
    let out = home.run(&[
        "exec",
        &id,
        "--env",
        "CANARY_TOKEN",
        "--",
        "sh",
        "-c",
        "test \"$CANARY_TOKEN\" = canary-9f2c1e-do-not-leak && echo received",
    ]);
    assert_eq!(text(&out.stdout), "received\n", "{}", text(&out.stderr));
    // Berth's own environment is scrubbed from commands that did not ask for it.
    let out = home.run(&["exec", &id, "--", "env"]);
    assert!(!text(&out.stdout).contains(CANARY));
    // Errors that involve the variable name the variable, not the value.
    let out = home.run(&["exec", &id, "--env", "NOT_SET_ANYWHERE", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("NOT_SET_ANYWHERE"));
    for args in [
        vec!["snapshot", id.as_str()],
        vec!["fork", id.as_str()],
        vec!["list"],
        vec!["ledger", "list", "--all"],
        vec!["--json", "status", id.as_str()],
        vec!["demo"],
    ] {
        let out = home.run(&args);
        assert!(!text(&out.stdout).contains(CANARY) && !text(&out.stderr).contains(CANARY));
    }
    home.assert_no_canary_persisted();
}

#[test]
fn must_fire_sigterm_and_sigint_destroy_what_the_run_created() {
    for (sig, code) in [
        (nix::sys::signal::Signal::SIGTERM, 143),
        (nix::sys::signal::Signal::SIGINT, 130),
    ] {
        let home = Home::new();
        let (mut child, id, pid) = start_run(&home);
        signal(&child, sig);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(code), "{sig}");
        assert!(
            !home.sandbox_dir(&id).exists(),
            "{sig}: sandbox left behind"
        );
        assert_eq!(home.ledger_state("tester", &id), "verified_gone");
        wait_for("the command's process to die", || !process_alive(pid));
    }
}

/// A sweep's entries about resources, without the providers it could not list.
fn swept_entries(doc: &Value) -> Vec<Value> {
    doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] != "not_listed")
        .cloned()
        .collect()
}

#[test]
fn must_fire_sigkill_leaves_it_sweepable_and_sweep_verifies() {
    let home = Home::new();
    let (mut child, id, pid) = start_run(&home);
    signal(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    assert_eq!(
        home.ledger_state("tester", &id),
        "created",
        "recorded before it was used"
    );
    assert!(home.sandbox_dir(&id).exists());
    let (code, doc) = home.json(&["ledger", "sweep"]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["complete"], true);
    // (Whether docker is there to be listed is the machine's; only the sandbox is asserted.)
    let entry = swept_entries(&doc)[0].clone();
    assert_eq!(
        (entry["berth_id"].as_str(), entry["action"].as_str()),
        (Some(id.as_str()), Some("destroyed"))
    );
    assert!(!home.sandbox_dir(&id).exists());
    assert_eq!(home.ledger_state("tester", &id), "verified_gone");
    wait_for("the orphaned command to be killed by destroy", || {
        !process_alive(pid)
    });
}

/// An operator's `ledger sweep` while a `berth run` is running holds the run's sandbox (its run
/// is live) instead of destroying it under the command; the run ends when its command does and
/// removes the sandbox itself. Before, the sweep destroyed the sandbox and killed the command.
#[test]
fn a_sweep_holds_the_sandbox_of_a_run_still_running() {
    let home = Home::new();
    let (child, id, pid) = start_run_of(
        &home,
        "while [ ! -e go ]; do sleep 0.05; done; echo finished",
        Stdio::piped(),
    );
    let (code, doc) = home.json(&["ledger", "sweep"]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["complete"], true, "{doc}");
    let entries = swept_entries(&doc);
    assert_eq!(entries.len(), 1, "{doc}");
    assert_eq!(entries[0]["berth_id"], id.as_str());
    assert_eq!(entries[0]["action"], "held", "{doc}");
    assert!(
        entries[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("still live")),
        "{doc}"
    );
    assert!(process_alive(pid), "the run's command was killed");
    // The ledger's listing says which rows belong to a run still live, and which do not.
    let other = home.create("tester");
    let run_live = |berth_id: &str| {
        let (code, listed) = home.json(&["ledger", "list", "--all"]);
        assert_eq!(code, 0, "{listed}");
        listed["entries"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["berth_id"] == berth_id))
            .map(|e| e["run_live"].clone())
            .unwrap_or_else(|| panic!("{berth_id} not listed: {listed}"))
    };
    assert_eq!(run_live(&id), true);
    assert_eq!(run_live(&other), false);
    let out = home.run(&["ledger", "list"]);
    assert!(out.status.success(), "{out:?}");
    let table = text(&out.stdout);
    let row_of = |berth_id: &str| {
        table
            .lines()
            .find(|l| l.starts_with(berth_id))
            .unwrap_or_else(|| panic!("{berth_id} not in:\n{table}"))
            .split_whitespace()
            .nth(4)
            .map(str::to_owned)
    };
    assert!(
        table.lines().next().is_some_and(|h| h.contains(" RUN ")),
        "{table}"
    );
    assert_eq!(row_of(&id).as_deref(), Some("live"), "{table}");
    assert_eq!(row_of(&other).as_deref(), Some("over"), "{table}");
    std::fs::write(home.sandbox_dir(&id).join("workspace/go"), b"").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout).trim(), "finished");
    assert_eq!(home.ledger_state("tester", &id), "verified_gone");
    assert!(!home.sandbox_dir(&id).exists());
    assert_eq!(run_live(&id), false);
}

/// Where a run cannot be claimed live (`berth.db.runs` is not a directory), a create is a setup
/// error naming the path and makes nothing; a sweep from another run does not destroy what a
/// run left there (it cannot tell whether that run is live) and says the sweep is incomplete.
#[test]
fn a_run_that_cannot_be_claimed_live_makes_nothing_and_is_not_swept_blind() {
    let home = Home::new();
    let id = home.create("tester");
    let runs = home.path().join("berth.db.runs");
    std::fs::remove_dir(&runs).unwrap();
    std::fs::write(&runs, b"not a directory").unwrap();
    let (code, doc) = home.json(&["create"]);
    assert_eq!(code, 14, "{doc}");
    assert_eq!(doc["error"]["kind"], "setup", "{doc}");
    // Berth's own failure, said as such: the provider was never called, so it is not "the
    // provider failed".
    let message = doc["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("cannot claim or check run `")
            && message.contains(&format!("as live in {}: ", runs.display())),
        "{doc}"
    );
    assert!(!message.contains("provider `host`"), "{doc}");
    assert!(
        doc["error"]["hint"]
            .as_str()
            .is_some_and(|h| h.contains(&format!("{} must be a directory", runs.display()))),
        "{doc}"
    );
    let (_, listed) = home.json(&["ledger", "list"]);
    assert_eq!(
        listed["entries"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    // Whether its run is live is unknown, and the listing says why rather than guess.
    assert_eq!(listed["entries"][0]["run_live"], serde_json::Value::Null);
    assert!(
        listed["entries"][0]["run_live_unknown"]
            .as_str()
            .is_some_and(|r| r.contains("Not a directory")),
        "{listed}"
    );
    let (code, doc) = home.json(&["ledger", "sweep"]);
    assert_eq!(code, 10, "{doc}");
    assert_eq!(doc["complete"], false, "{doc}");
    let entries = swept_entries(&doc);
    assert_eq!(entries.len(), 1, "{doc}");
    assert_eq!(
        (entries[0]["action"].as_str(), entries[0]["kind"].as_str()),
        (Some("failed"), Some("setup")),
        "{doc}"
    );
    assert!(home.sandbox_dir(&id).exists());
    std::fs::remove_file(&runs).unwrap();
    let (code, doc) = home.json(&["ledger", "sweep"]);
    assert_eq!(code, 0, "{doc}");
    assert!(!home.sandbox_dir(&id).exists());
}

/// A sweep on a machine whose docker engine is not there (no socket at DOCKER_HOST) still
/// sweeps the rest: the docker listing is reported as not listed, the host sandbox is destroyed
/// and verified, and the exit is 0 — nothing of ours is left unverified. Before, the listing's
/// error ended the sweep with nothing swept.
#[test]
fn a_sweep_goes_on_when_docker_cannot_be_listed() {
    let home = Home::new();
    let id = home.create("tester");
    let missing = home.path().join("no-docker.sock");
    let out = home
        .command("tester", &["--json", "ledger", "sweep"])
        .env("DOCKER_HOST", format!("unix://{}", missing.display()))
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", text(&out.stdout), text(&out.stderr)));
    assert_eq!(out.status.code(), Some(0), "{doc}");
    assert_eq!(doc["complete"], true, "{doc}");
    let action = |berth_id: &str| {
        doc["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["berth_id"] == berth_id)
            .unwrap_or_else(|| panic!("no entry for {berth_id}: {doc}"))
            .clone()
    };
    assert_eq!(action(&id)["action"], "destroyed", "{doc}");
    let docker = action("<listing docker>");
    assert_eq!(
        (docker["action"].as_str(), docker["kind"].as_str()),
        (Some("not_listed"), Some("unavailable")),
        "{doc}"
    );
    assert!(!home.sandbox_dir(&id).exists());
    assert_eq!(home.ledger_state("tester", &id), "verified_gone");
    // People are told what the sweep could not see.
    let out = home
        .command("tester", &["ledger", "sweep"])
        .env("DOCKER_HOST", format!("unix://{}", missing.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let said = text(&out.stdout);
    assert!(
        said.contains("docker not listed (unavailable)") && said.contains("is unknown"),
        "{said}"
    );
}

/// `berth destroy A B C` where one id cannot be destroyed (a typo here; another owner's, or a
/// provider that is down, alike) destroys the others all the same, as `docker rm` does, reports
/// the one, and exits with its code. Before, the first failure ended the command and the ids
/// after it were left running.
#[test]
fn destroy_of_several_goes_on_past_one_that_fails() {
    let home = Home::new();
    let first = home.create("tester");
    let last = home.create("tester");
    let (code, doc) = home.json(&["destroy", &first, "bx-no-such-one", &last]);
    assert_eq!(code, 3, "not found, the failure's own code: {doc}");
    let destroyed: Vec<_> = doc["destroyed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["id"].as_str().unwrap(),
                d["result"]["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        destroyed,
        vec![
            (first.as_str(), "verified_gone"),
            (last.as_str(), "verified_gone")
        ],
        "{doc}"
    );
    assert_eq!(doc["failed"][0]["id"], "bx-no-such-one", "{doc}");
    assert_eq!(doc["failed"][0]["error"]["kind"], "not_found", "{doc}");
    for id in [&first, &last] {
        assert!(!home.sandbox_dir(id).exists());
        assert_eq!(home.ledger_state("tester", id), "verified_gone");
    }
    // For people: each failure on stderr, named; each destroyed id on stdout.
    let again = home.create("tester");
    let out = home.run(&["destroy", "bx-no-such-one", &again]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("berth: error: bx-no-such-one: "),
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains(&format!("{again}: destroyed (verified gone)")));
    assert!(!home.sandbox_dir(&again).exists());
}

#[test]
fn must_not_fire_sweep_leaves_other_owners_alone() {
    let home = Home::new();
    let bobs = home.create("bob");
    let alices = home.create("alice");
    let (code, doc) = home.json_as("alice", &["ledger", "sweep"]);
    assert_eq!(code, 0, "{doc}");
    let swept: Vec<_> = swept_entries(&doc)
        .iter()
        .map(|e| e["berth_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(swept, vec![alices.clone()]);
    assert!(
        home.sandbox_dir(&bobs).exists(),
        "bob's sandbox was touched"
    );
    assert!(!home.sandbox_dir(&alices).exists());
    // Alice cannot destroy or even address bob's sandbox.
    let (code, doc) = home.json_as("alice", &["destroy", &bobs]);
    assert_eq!(code, 11, "{doc}");
    assert_eq!(doc["error"]["kind"], "refused");
    assert!(home.sandbox_dir(&bobs).exists());
}

#[test]
fn a_failing_run_destroys_its_sandbox() {
    let home = Home::new();
    let out = home.run(&["run", "--", "definitely-not-a-program-4711"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    let (_, doc) = home.json(&["ledger", "list", "--all"]);
    let entries = doc["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["state"], "verified_gone");
}

#[test]
fn must_fire_on_panic_and_error_after_create() {
    for (fault, code) in [("panic-after-create", 1), ("error-after-create", 125)] {
        let home = Home::new();
        let out = home
            .command("tester", &["run", "--", "true"])
            .env("BERTH_FAULT", fault)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{fault}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("cleaned up 1 sandbox"),
            "{}",
            text(&out.stderr)
        );
        let (_, doc) = home.json(&["ledger", "list", "--all"]);
        let entries = doc["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{fault}");
        assert_eq!(entries[0]["state"], "verified_gone", "{fault}");
    }
    let home = Home::new();
    let out = home
        .command("tester", &["list"])
        .env("BERTH_FAULT", "sometimes")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("not a fault point"));
}

#[test]
fn demo_is_the_main_job_and_leaves_nothing() {
    let home = Home::new();
    let (code, doc) = home.json(&["demo"]);
    assert_eq!(code, 0, "{doc}");
    let steps: Vec<_> = doc["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap().to_owned())
        .collect();
    for step in [
        "create", "exec", "cp in", "cp out", "snapshot", "fork", "restore", "destroy",
    ] {
        assert!(
            steps.iter().any(|s| s == step),
            "missing step {step}: {steps:?}"
        );
    }
    let ledger = doc["ledger"].as_array().unwrap();
    assert_eq!(ledger.len(), 3);
    assert!(ledger.iter().all(|r| r["state"] == "verified_gone"));
    let leftover = std::fs::read_dir(home.path().join("state/host/sandboxes"))
        .unwrap()
        .count();
    assert_eq!(leftover, 0);
}

#[test]
fn providers_and_schema_are_machine_readable() {
    let home = Home::new();
    let (code, doc) = home.json(&["providers"]);
    assert_eq!(code, 0);
    let providers = doc["providers"].as_array().unwrap();
    let host = providers.iter().find(|p| p["id"] == "host").unwrap();
    let bwrap = providers.iter().find(|p| p["id"] == "bwrap").unwrap();
    assert_eq!(bwrap["isolation"], "namespace");
    assert_eq!(bwrap["capabilities"]["exec_detached"], "unsupported");
    assert_eq!(host["id"], "host");
    assert_eq!(host["isolation"], "none");
    assert_eq!(host["adapter_built_in"], true);
    assert_eq!(host["capabilities"]["files"], "supported");
    assert_eq!(host["capabilities"]["suspend_resume"], "unsupported");
    let out = home.run(&["schema", "manifest"]);
    let published = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas/provider-manifest.schema.json"),
    )
    .unwrap();
    assert_eq!(text(&out.stdout), published);
}

/// Hostile or absurd input anywhere a user can type it: a typed refusal with exit 5 and
/// nothing persisted, never a panic, a hang or an unbounded read.
#[test]
fn hostile_input_is_invalid_input_everywhere_and_leaves_nothing() {
    let home = Home::new();
    let id = home.create("tester");
    let refused = |args: &[&str], needle: &str| {
        let (code, doc) = home.json(args);
        // exec passes the command's codes through, so berth's own failures there are 125.
        let expected = if args[0] == "exec" { 125 } else { 5 };
        assert_eq!(code, expected, "{args:?}: {doc}");
        assert_eq!(doc["error"]["kind"], "invalid_request", "{args:?}: {doc}");
        let message = doc["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{args:?}: {message}");
    };
    refused(
        &[
            "exec",
            &id,
            "--timeout",
            "99999999999999999999",
            "--",
            "true",
        ],
        "not a duration",
    );
    refused(&["create", "--ttl", "300000000d"], "not a duration");
    refused(
        &["exec", &id, "--env", "A B=1", "--", "true"],
        "not a valid variable name",
    );
    refused(
        &["exec", &id, "--env", "BERTH_SANDBOX=bx-other", "--", "true"],
        "reserved",
    );
    let long = "n".repeat(300);
    refused(&["cp", "-", &format!("{id}:{long}")], "too long");
    let sink = home.path().join("copied");
    refused(
        &["cp", &format!("{id}:{long}"), sink.to_str().unwrap()],
        "too long",
    );

    // Mission files: unbounded sources, unknown providers and hostile fallbacks are refused
    // before anything is durable.
    refused(&["mission", "run", "/dev/zero"], "not a regular file");
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/fix-the-test/mission.toml"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("repo")).unwrap();
    let cases = [
        (
            example.replace("provider = \"host\"", "provider = \"nope\""),
            "no adapter",
        ),
        (
            example.replace("fallback = []", "fallback = [\"nope\", \"../x\"]"),
            "not a provider id",
        ),
        (
            example.replace(
                "agent_timeout = \"60s\"",
                "agent_timeout = \"99999999999999999999h\"",
            ),
            "not a duration",
        ),
        (
            example.replace(
                "instructions = \"",
                &format!("instructions = \"{}", "x".repeat(300_000)),
            ),
            "too large",
        ),
    ];
    for (text, needle) in cases {
        let file = dir.path().join("mission.toml");
        std::fs::write(&file, text).unwrap();
        refused(&["mission", "run", file.to_str().unwrap()], needle);
    }
    let missions = home.path().join("missions");
    let left = std::fs::read_dir(&missions).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "a refused registration left a directory behind");
    let (_, listed) = home.json(&["mission", "list"]);
    assert_eq!(
        listed["missions"].as_array().map(Vec::len).unwrap_or(0),
        0,
        "{listed}"
    );

    // Evidence: binary garbage and unknown keys are invalid input, not a verdict.
    let evidence = dir.path().join("evidence");
    std::fs::create_dir(&evidence).unwrap();
    std::fs::write(evidence.join("host.json"), [0xffu8, 0xfe, 0, 1, 2, 3]).unwrap();
    refused(
        &["catalog", "show", "--evidence", evidence.to_str().unwrap()],
        "not valid",
    );
    home.run(&["destroy", &id]);
}

/// A `berth exec` killed with SIGKILL takes its command's whole tree with it on host —
/// including a child that left the process group with `setsid`.
#[test]
fn a_killed_exec_takes_its_command_tree_with_it() {
    let home = Home::new();
    let id = home.create("tester");
    let ws = home.sandbox_dir(&id).join("workspace");
    let mut exec = home
        .command(
            "tester",
            &[
                "exec",
                &id,
                "-c",
                "setsid sh -c 'echo $$ > daemon.pid; exec sleep 300' </dev/null >/dev/null 2>&1 & \
                 echo $$ > leader.pid; sleep 300",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids =
        berth_testkit::wait_for_pids(&ws, &["leader.pid", "daemon.pid"], Duration::from_secs(10))
            .expect("the command never started");
    exec.kill().unwrap();
    exec.wait().unwrap();
    assert!(
        berth_testkit::wait_all_gone(&pids, Duration::from_secs(5)),
        "leader or setsid daemon {pids:?} outlived a SIGKILLed exec"
    );
    home.run(&["destroy", &id]);
}

#[test]
fn completions_cover_every_verb() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        for verb in ["exec", "ps", "logs", "kill", "mission", "catalog"] {
            assert!(text(&out.stdout).contains(verb), "{shell} lacks {verb}");
        }
    }
}

/// A `BERTH_HOME` that is a file is a setup error naming the fix (it was exit 1, "internal").
#[test]
fn a_berth_home_that_is_a_file_is_a_setup_error() {
    let home = Home::new();
    let file = home.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["--json", "list"])
        .env("BERTH_HOME", &file)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(14), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["kind"], "setup");
    assert!(
        doc["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("BERTH_HOME"),
        "{doc}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"x", "the file was changed");
}

/// A file a user names that is a FIFO or a device is refused at once as invalid input: the
/// `cp` out of a sandbox streams a file of any size — past the 256 MiB a whole-file read may
/// hold (before: "larger than the file API's limit") — to a file or stdout, and a copy that
/// fails leaves the destination as it was.
#[test]
fn cp_out_of_a_sandbox_streams_any_size_and_a_failed_copy_changes_nothing() {
    let home = Home::new();
    let id = home.create("tester");
    const BIG: u64 = (256 << 20) + 12345;
    let out = home.run(&["exec", &id, "--", "truncate", "-s", &BIG.to_string(), "big"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let copy = home.path().join("big.copy");
    let (code, doc) = home.json(&["cp", &format!("{id}:big"), copy.to_str().unwrap()]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["bytes"], BIG);
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), BIG);
    std::fs::remove_file(&copy).unwrap();
    let mut child = home
        .command("tester", &["cp", &format!("{id}:big"), "-"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut streamed = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut stdout = child.stdout.take().unwrap();
    loop {
        let n = std::io::Read::read(&mut stdout, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert!(buf[..n].iter().all(|b| *b == 0));
        streamed += n as u64;
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(streamed, BIG);
    // A reader that goes away ends the copy, not the command.
    let piped = std::process::Command::new("sh")
        .arg("-c")
        .arg("\"$BERTH\" cp \"$FROM\" - | head -c 10 | wc -c")
        .env("BERTH", env!("CARGO_BIN_EXE_berth"))
        .env("FROM", format!("{id}:big"))
        .env("BERTH_HOME", home.path())
        .env("BERTH_OWNER", "tester")
        .output()
        .unwrap();
    assert_eq!(text(&piped.stdout).trim(), "10", "{}", text(&piped.stderr));
    // A copy that fails (no such file) leaves what was there.
    let kept = home.path().join("kept.txt");
    std::fs::write(&kept, b"precious").unwrap();
    let (code, doc) = home.json(&["cp", &format!("{id}:missing"), kept.to_str().unwrap()]);
    assert_eq!(code, 3, "{doc}");
    assert_eq!(std::fs::read(&kept).unwrap(), b"precious");
    // A directory as the destination is refused before anything is copied.
    let (code, doc) = home.json(&["cp", &format!("{id}:big"), home.path().to_str().unwrap()]);
    assert_eq!(code, 5, "{doc}");
}

/// `cp` into a sandbox streams a file of any size — past the 1 GiB it held in memory before
/// ("holds more than 1073741824 bytes, the limit for `cp`") — from a file, stdin or another
/// sandbox; a copy onto a directory is refused and leaves it as it was.
#[test]
fn cp_into_a_sandbox_streams_any_size_and_a_failed_copy_changes_nothing() {
    use std::io::{Seek, Write};
    let home = Home::new();
    let id = home.create("tester");
    const BIG: u64 = (1 << 30) + 7;
    let local = home.path().join("big.local");
    {
        let mut file = std::fs::File::create(&local).unwrap();
        file.seek(std::io::SeekFrom::Start(BIG - 3)).unwrap();
        file.write_all(b"end").unwrap();
    }
    let (code, doc) = home.json(&["cp", local.to_str().unwrap(), &format!("{id}:in/big")]);
    assert_eq!(
        (code, &doc["bytes"]),
        (0, &serde_json::Value::from(BIG)),
        "{doc}"
    );
    std::fs::remove_file(&local).unwrap();
    let out = home.sh(&id, "stat -c %s in/big; tail -c 3 in/big");
    assert_eq!(
        text(&out.stdout),
        format!("{BIG}\nend"),
        "{}",
        text(&out.stderr)
    );
    home.run(&["exec", &id, "--", "rm", "in/big"]);
    // From stdin, streamed the same way.
    let mut child = home
        .command("tester", &["cp", "-", &format!("{id}:in/piped")])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for _ in 0..3 {
        stdin.write_all(&[b'p'; 1 << 20]).unwrap();
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
    let out = home.sh(&id, "tr -d p < in/piped | wc -c; wc -c < in/piped");
    assert_eq!(
        text(&out.stdout).split_whitespace().collect::<Vec<_>>(),
        ["0", "3145728"]
    );
    // Onto a directory: refused, the directory and what it holds untouched.
    a_file_onto_a_directory_changes_nothing(&home, &id);
    // From one sandbox to another (before: "cp needs exactly one side as ID:path").
    let other = home.create("tester");
    let (code, doc) = home.json(&[
        "cp",
        &format!("{id}:onto/tree/sub/f"),
        &format!("{other}:got/f"),
    ]);
    assert_eq!(
        (code, &doc["bytes"]),
        (0, &serde_json::Value::from(9)),
        "{doc}"
    );
    let out = home.run(&["exec", &other, "--", "cat", "got/f"]);
    assert_eq!(text(&out.stdout), "precious\n");
    // A missing source is the source's `not_found`, and the destination gets nothing.
    let (code, doc) = home.json(&["cp", &format!("{id}:missing"), &format!("{other}:got/f")]);
    assert_eq!(code, 3, "{doc}");
    let out = home.run(&["exec", &other, "--", "cat", "got/f"]);
    assert_eq!(text(&out.stdout), "precious\n");
    let (code, doc) = home.json(&["cp", "./a", "./b"]);
    assert_eq!(code, 5, "{doc}");
}

/// `cp` into a sandbox killed midway (SIGKILL: nothing of Berth's runs after it) leaves the
/// destination as it was and nothing beside it. Before, the bytes went to a `.berth-write-*`
/// file beside the destination, which such a kill left in the workspace for the agent (and a
/// mission's `git add`) to find.
#[test]
fn cp_into_a_sandbox_killed_midway_leaves_nothing_behind() {
    let home = Home::new();
    let id = home.create("tester");
    home.sh(&id, "mkdir in && echo old > in/kept");
    let local = big_sparse_file(&home);
    for name in ["kept", "new"] {
        killed_midway(
            &home,
            "tester",
            &["cp", local.to_str().unwrap(), &format!("{id}:in/{name}")],
        );
        let out = home.sh(&id, "ls -A in; cat in/kept");
        assert_eq!(
            text(&out.stdout),
            "kept\nold\n",
            "{name}: {}",
            text(&out.stderr)
        );
    }
}

/// `cp` out of a sandbox never leaves the local destination part old, part new — not while it
/// runs, so not when it is killed at any moment either. Before, the copy was spooled, then
/// written into the destination: for the second or so that took on 1 GiB, the destination was
/// cut short (its old contents gone), and a kill then left it so. Now the whole spool takes the
/// destination's place by a rename. Watched here at every millisecond of the copy.
#[test]
fn cp_out_of_a_sandbox_never_shows_a_partial_destination() {
    const BIG: u64 = 1 << 30;
    let home = Home::new();
    let id = home.create("tester");
    let made = home.sh(&id, &format!("truncate -s {BIG} big"));
    assert!(made.status.success(), "{}", text(&made.stderr));
    let dest = home.path().join("dest");
    std::fs::write(&dest, b"old").unwrap();
    let mut child = home
        .command(
            "tester",
            &["cp", &format!("{id}:big"), dest.to_str().unwrap()],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if let Ok(meta) = std::fs::metadata(&dest) {
            seen.insert(meta.len());
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "cp did not end"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    seen.insert(std::fs::metadata(&dest).unwrap().len());
    let partial: Vec<_> = seen
        .iter()
        .filter(|len| **len != 3 && **len != BIG)
        .collect();
    assert!(
        partial.is_empty(),
        "the destination was seen {} times cut short (first {:?} bytes), not only with its old \
         3 or all {BIG}",
        partial.len(),
        partial.first()
    );
    let left: Vec<_> = std::fs::read_dir(home.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("dest") && n != "dest")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A snapshot or a fork killed midway (SIGKILL while it archives 4 GiB) leaves no partial
/// archive in Berth's state: before, each left a `.tmp*` file of its size (69 and 73 MiB seen)
/// in the snapshot store or the scratch directory, which nothing ever removed. Their ledger rows
/// stay as intents for `gc`.
#[test]
fn a_snapshot_or_fork_killed_midway_leaves_no_partial_archive() {
    let home = Home::new();
    let id = home.create("tester");
    assert!(home.sh(&id, "truncate -s 4G big").status.success());
    let state = home.path().join("state/host");
    for op in ["snapshot", "fork"] {
        killed_midway(&home, "tester", &[op, &id]);
        let mut left: Vec<_> = ["snapshots", "scratch"]
            .iter()
            .flat_map(|dir| std::fs::read_dir(state.join(dir)).unwrap())
            .map(|e| e.unwrap().path())
            .filter(|p| !p.ends_with("keys"))
            .collect();
        left.sort();
        assert!(left.is_empty(), "{op} left {left:?}");
    }
}

/// FIFO's `open` used to block forever (`mission run FIFO` and `cp ID:f FIFO` hung, deaf to
/// SIGTERM) and `/dev/zero` never ends. Each command must answer within seconds.
#[test]
fn named_files_that_are_fifos_or_devices_are_refused_at_once() {
    let home = Home::new();
    let id = home.create("tester");
    let fifo = home.path().join("named.fifo");
    berth_testkit::make_fifo(&fifo);
    let fifo = fifo.to_str().unwrap();
    let target = format!("{id}:copied");
    home.run(&["exec", &id, "--", "sh", "-c", "echo hi > copied"]);
    for args in [
        vec!["mission", "run", fifo],
        vec!["gateway", "--script", fifo],
        vec!["cp", fifo, &target],
        vec!["cp", "/dev/zero", &target],
        // As a destination too: the FIFO's open blocked just the same.
        vec!["cp", &target, fifo],
    ] {
        let mut child = home
            .command("tester", &args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > std::time::Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{args:?} blocked on a file that is not regular");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(5), "{args:?}: {stderr}");
        assert!(stderr.contains("not a regular file"), "{args:?}: {stderr}");
    }
    home.run(&["destroy", &id]);
}

/// `berth ARGS` whose stdout's read end is closed before it writes: every write gets EPIPE.
fn with_stdout_closed(home: &Home, args: &[&str]) -> std::process::Output {
    let mut child = home
        .command("tester", args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

/// `berth ARGS` whose stdout is `/dev/full`: every write fails with ENOSPC.
fn with_stdout_full(home: &Home, args: &[&str]) -> std::process::Output {
    home.command("tester", args)
        .stdout(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .output()
        .unwrap()
}

/// A reader that goes away (`berth … | head`) ends the output, not the command: no panic, the
/// command finishes its work and its cleanup and exits with its own status; a stdout that
/// cannot be written for another reason (a full disk) is said on stderr and exits 1.
#[test]
fn a_closed_stdout_ends_the_output_not_the_command() {
    let home = Home::new();
    for _ in 0..3 {
        home.create("tester");
    }
    for args in [
        vec!["--json", "ledger", "list"],
        vec!["ledger", "list"],
        vec!["completions", "bash"],
        // A command streaming 4 MB to the closed pipe, then exiting 3: Berth keeps it running
        // to its end, reports its status, and destroys the sandbox it made.
        vec![
            "run",
            "-p",
            "host",
            "--",
            "sh",
            "-c",
            "head -c 4000000 /dev/zero; exit 3",
        ],
    ] {
        let out = with_stdout_closed(&home, &args);
        let expected = if args[0] == "run" { 3 } else { 0 };
        assert_eq!(
            out.status.code(),
            Some(expected),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            !text(&out.stderr).contains("panicked"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // Both stdout and stderr closed (`2>&1 | head`): an error still exits with its own code
    // (3, not found), not a panic's (101 before).
    let mut child = home
        .command("tester", &["destroy", "bx-no-such-sandbox"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    drop(child.stderr.take());
    assert_eq!(child.wait().unwrap().code(), Some(3));
    let (_, ledger) = home.json(&["ledger", "list"]);
    let live = ledger["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["state"] != "verified_gone")
        .count();
    assert_eq!(live, 3, "the run's sandbox was left: {ledger}");

    let full = with_stdout_full(&home, &["--json", "ledger", "list"]);
    assert_eq!(full.status.code(), Some(1), "{}", text(&full.stderr));
    assert!(
        text(&full.stderr).contains("cannot write to stdout"),
        "{}",
        text(&full.stderr)
    );
}

/// A new API token is printed once and stored only as its hash: one that never reached stdout
/// (a closed pipe, a full disk) is revoked and the command fails, instead of exiting 0 and
/// leaving a live token nobody holds. One printed is live.
#[test]
fn a_token_that_cannot_be_shown_is_revoked() {
    let home = Home::new();
    let create = [
        "token", "create", "--owner", "ci@team", "--scope", "read", "--name", "t",
    ];
    let json_create: Vec<&str> = ["--json"].iter().chain(create.iter()).copied().collect();
    for args in [&create[..], &json_create[..]] {
        let out = with_stdout_closed(&home, args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}",
            text(&out.stderr)
        );
        // With --json the error is a document on stdout, which is gone too.
        if args[0] != "--json" {
            assert!(
                text(&out.stderr).contains("was revoked"),
                "{}",
                text(&out.stderr)
            );
        }
    }
    // A stdout that is /dev/null (or closed when berth started, which the runtime turns into
    // /dev/null) would swallow it: refused before any token exists.
    for null in [
        Stdio::null(),
        Stdio::from(std::fs::File::open("/dev/null").unwrap()),
    ] {
        let out = home
            .command("tester", &create)
            .stdout(null)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("/dev/null"),
            "{}",
            text(&out.stderr)
        );
    }
    let full = with_stdout_full(&home, &create);
    assert_eq!(full.status.code(), Some(1), "{}", text(&full.stderr));
    let (code, listed) = home.json(&["token", "list"]);
    assert_eq!(code, 0, "{listed}");
    let tokens = listed["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 3, "{listed}");
    assert!(
        tokens.iter().all(|t| !t["revoked_at"].is_null()),
        "a token nobody saw is live: {listed}"
    );
    let (code, shown) = home.json(&create);
    assert_eq!(code, 0, "{shown}");
    assert!(shown["token"].as_str().is_some_and(|t| !t.is_empty()));
    let (_, listed) = home.json(&["token", "list"]);
    let live = listed["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["revoked_at"].is_null())
        .count();
    assert_eq!(live, 1, "{listed}");
}

/// `bench host --raw`: every target carries its verdict judged on the figure's 95% interval —
/// the interval brackets the median it belongs to, and `met` is true, false or (when the run
/// cannot tell) null, always agreeing with the verdict named beside it. Nothing is left.
#[test]
fn raw_bench_verdicts_follow_their_intervals() {
    let home = Home::new();
    let (code, doc) = home.json(&["bench", "host", "--raw", "--iterations", "8"]);
    assert_eq!(code, 0, "{doc}");
    assert_verdict_agrees(&doc["exec_target"]);
    assert_verdict_agrees(&doc["cycle_target"]);
    assert_eq!(doc["cycle_target"]["overhead_ms"], 2.0);
    assert_verdict_agrees(&doc["own_mechanism"]["cycle_target"]);
    assert_verdict_agrees(&doc["cli_process"]["target"]);
    let brackets = |figure: &Value, interval: &Value| {
        let (low, high) = (
            interval["low"].as_f64().unwrap(),
            interval["high"].as_f64().unwrap(),
        );
        let figure = figure.as_f64().unwrap();
        assert!(
            low <= figure && figure <= high,
            "{figure} outside {interval}"
        );
    };
    let cycle = &doc["own_mechanism"]["cycle"];
    brackets(&cycle["ratio_median"], &cycle["ratio_interval"]);
    brackets(&cycle["overhead_median_ms"], &cycle["overhead_interval_ms"]);
    let exec = &doc["exec_round_trip"];
    brackets(
        &exec["berth"]["median_ms"],
        &exec["berth"]["median_interval_ms"],
    );
    let (_, listed) = home.json(&["ledger", "list"]);
    let live = listed["rows"].as_array().map(|rows| {
        rows.iter()
            .filter(|r| r["state"] != "verified_gone")
            .count()
    });
    assert_eq!(live.unwrap_or(0), 0, "{listed}");
}

/// Colour and progress are for terminals: a pipe (every `Command::output` here) and `--json`
/// get neither; a pseudo-terminal (`script`) gets colour unless `NO_COLOR` is set.
#[test]
fn colour_and_progress_only_on_a_terminal() {
    let home = Home::new();
    let id = home.create("tester");
    let escape = |bytes: &[u8]| bytes.contains(&0x1b) || bytes.contains(&b'\r');
    for args in [
        vec!["ledger", "list"],
        vec!["catalog", "show"],
        vec!["--json", "ledger", "list"],
        vec!["bench", "host", "--iterations", "2"],
    ] {
        let out = home.run(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(
            !escape(&out.stdout) && !escape(&out.stderr),
            "{args:?} wrote escapes into a pipe"
        );
    }
    let listed = text(&home.run(&["ledger", "list"]).stdout);
    let header = listed.lines().next().unwrap();
    assert!(
        header.starts_with("BERTH ID") && header.contains("STATE"),
        "{listed}"
    );
    assert!(listed
        .lines()
        .any(|l| l.starts_with(&id) && l.contains("created")));

    let Ok(script) = which("script") else {
        panic!("`script` (util-linux) is needed to test terminal output");
    };
    let on_terminal = |no_color: bool| {
        let mut cmd = Command::new(&script);
        cmd.args([
            "-qec",
            &format!("{} ledger list", env!("CARGO_BIN_EXE_berth")),
            "/dev/null",
        ])
        .env("BERTH_HOME", home.path())
        .env("BERTH_OWNER", "tester")
        .env("TERM", "xterm")
        .stdin(Stdio::null());
        if no_color {
            cmd.env("NO_COLOR", "1");
        } else {
            cmd.env_remove("NO_COLOR");
        }
        text(&cmd.output().unwrap().stdout)
    };
    let coloured = on_terminal(false);
    assert!(coloured.contains("\x1b[32mcreated\x1b[0m"), "{coloured:?}");
    assert!(!on_terminal(true).contains('\x1b'), "NO_COLOR is honoured");
    home.run(&["destroy", &id]);
}

/// A bridged provider through the CLI, as a user runs it: the command's output and exit code
/// pass through, a 127 (which ComputeSDK also uses for its own failures) is 125 with the reason
/// on stderr, and the sandbox ends verified gone in the ledger.
#[test]
fn computesdk_just_bash_runs_through_the_cli_and_never_fakes_not_found() {
    if !berth_testkit::computesdk_bridge_installed() {
        return;
    }
    let home = Home::new();
    let out = home.run(&[
        "run",
        "-p",
        "computesdk:just-bash",
        "--",
        "sh",
        "-c",
        "echo hello | tr a-z A-Z; exit 4",
    ]);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(out.stdout, b"HELLO\n");

    let out = home.run(&["run", "-p", "computesdk:just-bash", "--", "no-such-cmd"]);
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("command not found") && stderr.contains("unknown (exit code 127"),
        "{stderr}"
    );
    let (_, ledger) = home.json(&["ledger", "list", "--all"]);
    let rows = ledger["entries"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{ledger}");
    assert!(
        rows.iter().all(|r| r["state"] == "verified_gone"),
        "{ledger}"
    );
}

/// `berth ls` on host (docker: `tests/cli_docker.rs`; its containers would show up in this
/// binary's sweeps as another home's).
#[test]
fn ls_lists_a_directory_and_never_follows_a_link() {
    let home = Home::new();
    let id = home.create("tester");
    assert_ls_lists_and_never_follows_a_link(&home, &id);
}
