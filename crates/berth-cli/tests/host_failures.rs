//! What goes wrong on the host, outside any request: the store's disk fills up, a sandbox's
//! directory cannot be removed. Each says what is wrong and what to do, and loses nothing.
//! `berth` runs in a private mount namespace (`unshare`), so the host's own disks and mounts
//! are never touched; the namespace's mounts, and what was in them, go with it.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Runs `script` with `sh -eu` in a new user and mount namespace (root inside maps to the
/// caller), with `BERTH` and `OUT` set. `None` when this host allows no such namespace.
fn in_private_mounts(script: &str, out: &Path) -> Option<std::process::Output> {
    let probe = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "true"])
        .output()
        .ok()?;
    if !probe.status.success() {
        return None;
    }
    Some(
        Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-eu", "-c"])
            .arg(script)
            .env("BERTH", env!("CARGO_BIN_EXE_berth"))
            .env("OUT", out)
            .env("BERTH_OWNER", "disk-tester")
            .env_remove("BERTH_FAULT")
            .output()
            .unwrap(),
    )
}

/// Runs `body` in a private namespace (see [`in_private_mounts`]) after defining
/// `step NAME ARGS…`, which runs `berth --json ARGS…` and keeps its exit code and document
/// in OUT; `body` must run a step named `created` that creates a sandbox. Returns OUT and that
/// sandbox's id; `None` (said on stderr) when the host allows no such namespace.
fn steps(prefix: &str, body: &str) -> Option<(tempfile::TempDir, String)> {
    let out = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let script = format!(
        "step() {{ name=$1; shift; set +e; \"$BERTH\" --json \"$@\" > \"$OUT/$name.json\"; \
         echo $? > \"$OUT/$name.rc\"; set -e; }}\n\
         created_id() {{ sed -n 's/.*\"berth_id\": \"\\(bx-[0-9a-f]*\\)\".*/\\1/p' \
         \"$OUT/created.json\" | head -n 1; }}\n{body}"
    );
    let Some(run) = in_private_mounts(&script, out.path()) else {
        eprintln!("skipped: this host allows no unprivileged user and mount namespace");
        return None;
    };
    assert!(
        run.status.success(),
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let (code, created) = doc(out.path(), "created");
    assert_eq!(code, 0, "{created}");
    let id = created["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    Some((out, id))
}

fn doc(out: &Path, name: &str) -> (i32, Value) {
    let code = std::fs::read_to_string(out.join(format!("{name}.rc"))).unwrap();
    let json = std::fs::read(out.join(format!("{name}.json"))).unwrap();
    let json = serde_json::from_slice(&json)
        .unwrap_or_else(|e| panic!("{name}: {e}: {}", String::from_utf8_lossy(&json)));
    (code.trim().parse().unwrap(), json)
}

/// The store's disk fills up (BERTH_HOME on a 2 MiB tmpfs): every command that must write says
/// so with the fix (a setup error, exit 14), a read either answers or says the same, and
/// nothing recorded before is lost once space is freed.
#[test]
fn a_full_disk_is_a_setup_error_with_the_fix_and_loses_nothing() {
    // Each step's exit code and JSON document land in OUT (outside the tmpfs).
    let body = r#"
        home="$OUT/home"; mkdir "$home"
        mount -t tmpfs -o size=2m,mode=0700 tmpfs "$home"
        export BERTH_HOME="$home/berth"
        step created create -p host
        dd if=/dev/zero of="$home/fill" bs=4k 2>/dev/null || true
        step full-list list
        step full-create create -p host
        BERTH_HOME="$home/fresh" step full-fresh-list list
        rm "$home/fill"
        step freed-list list
        step destroyed destroy "$(created_id)"
    "#;
    let Some((out, id)) = steps("berth-test-disk-", body) else {
        return;
    };

    // With the disk full, what must write says what is wrong and how to fix it (before: exit 1,
    // "internal", "report it if it looks like a bug"): a create (a ledger row), and a read of a
    // store not made yet. A read of the existing store needs new space only when the process
    // before it closed the store (its write-ahead log and shared-memory file removed); one that
    // exits first leaves them, with room to read in. Which of the two happened is a race, so
    // the read may answer — then with the sandbox, and only it — or fail as the others do.
    let (code, list) = doc(out.path(), "full-list");
    if code == 0 {
        assert_eq!(listed_ids(&list), [id.as_str()], "{list}");
    }
    let failed = ["full-create", "full-fresh-list"];
    for step in failed.into_iter().chain((code != 0).then_some("full-list")) {
        let (code, doc) = doc(out.path(), step);
        assert_eq!(code, 14, "{step}: {doc}");
        assert_eq!(doc["error"]["kind"], "setup", "{step}: {doc}");
        let hint = doc["error"]["hint"].as_str().unwrap_or_default();
        assert!(
            hint.contains("disk is full") && hint.contains("BERTH_HOME"),
            "{step}: {doc}"
        );
    }

    // Space freed: the sandbox made before is still there, and only it.
    let (code, list) = doc(out.path(), "freed-list");
    assert_eq!(code, 0, "{list}");
    assert_eq!(listed_ids(&list), [id.as_str()], "{list}");
    let (code, destroyed) = doc(out.path(), "destroyed");
    assert_eq!(code, 0, "{destroyed}");
}

fn listed_ids(list: &Value) -> Vec<&str> {
    list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["ledger"]["berth_id"].as_str())
        .collect()
}

/// A sandbox directory the host provider cannot remove (here a mount inside it: `EBUSY`; a
/// file made immutable gives `EPERM`) is cleanup incomplete, exit 10 as documented, with the
/// row kept as `destroy_failed` and the way to retry — not "invalid request, fix the request"
/// (exit 5) or "internal" (exit 1). Once the obstacle is gone, the same destroy finishes.
#[test]
fn a_sandbox_that_cannot_be_removed_is_cleanup_incomplete_and_kept() {
    let body = r#"
        export BERTH_HOME="$OUT/home"
        step created create -p host
        id=$(created_id)
        stuck="$BERTH_HOME/state/host/sandboxes/$id/workspace/stuck"
        mkdir "$stuck"
        mount -t tmpfs tmpfs "$stuck"
        step blocked destroy "$id"
        step listed ledger list
        umount "$BERTH_HOME/state/host/sandboxes/.destroying-$id/workspace/stuck"
        step retried destroy "$id"
    "#;
    let Some((out, id)) = steps("berth-test-destroy-", body) else {
        return;
    };

    let (code, blocked) = doc(out.path(), "blocked");
    assert_eq!(code, 10, "{blocked}");
    assert_eq!(blocked["error"]["kind"], "cleanup_incomplete", "{blocked}");
    let message = blocked["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("remove sandbox directory"), "{blocked}");
    let hint = blocked["error"]["hint"].as_str().unwrap_or_default();
    assert!(
        hint.contains("destroy_failed") && hint.contains(&format!("berth destroy {id}")),
        "{blocked}"
    );
    let (code, listed) = doc(out.path(), "listed");
    assert_eq!(code, 0, "{listed}");
    let row = listed["entries"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["berth_id"] == id.as_str()))
        .unwrap_or_else(|| panic!("no row for {id}: {listed}"));
    assert_eq!(row["state"], "destroy_failed", "{row}");

    let (code, retried) = doc(out.path(), "retried");
    assert_eq!(code, 0, "{retried}");
    assert_eq!(
        retried["destroyed"][0]["result"]["outcome"], "verified_gone",
        "{retried}"
    );
}
