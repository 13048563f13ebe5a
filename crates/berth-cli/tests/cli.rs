//! End-to-end tests of the `berth` binary on the host provider with a real SQLite ledger:
//! the user path create → exec → cp → snapshot → fork → destroy → ledger, the JSON shapes, exit
//! codes, hostile input, canary secrets, and must-fire / must-not-fire teardown under signals.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const CANARY: &str = "canary-9f2c1e-do-not-leak";

struct Home {
    dir: tempfile::TempDir,
    /// Owners this test acted as; each is swept when the test ends.
    owners: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::Builder::new()
                .prefix("berth-test-cli-")
                .tempdir()
                .unwrap(),
            owners: Default::default(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, owner: &str, args: &[&str]) -> Command {
        self.owners.borrow_mut().insert(owner.to_owned());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.args(args)
            .env("BERTH_HOME", self.path())
            .env("BERTH_OWNER", owner)
            .env("CANARY_TOKEN", CANARY)
            .stdin(Stdio::null());
        cmd
    }

    fn run_as(&self, owner: &str, args: &[&str]) -> Output {
        self.command(owner, args).output().unwrap()
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_as("tester", args)
    }

    fn json_as(&self, owner: &str, args: &[&str]) -> (i32, Value) {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let out = self.run_as(owner, &full);
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{args:?}: not JSON ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(doc["schema"], "berth.cli/v1", "{doc}");
        (out.status.code().unwrap(), doc)
    }

    fn json(&self, args: &[&str]) -> (i32, Value) {
        self.json_as("tester", args)
    }

    fn create(&self, owner: &str) -> String {
        let (code, doc) = self.json_as(owner, &["create"]);
        assert_eq!(code, 0, "{doc}");
        doc["sandbox"]["berth_id"].as_str().unwrap().to_owned()
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.path().join("state/host/sandboxes").join(id)
    }

    fn ledger_state(&self, owner: &str, id: &str) -> String {
        let (_, doc) = self.json_as(owner, &["ledger", "list", "--all"]);
        doc["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["berth_id"] == id)
            .map(|e| e["state"].as_str().unwrap().to_owned())
            .unwrap_or_else(|| panic!("{id} not in ledger: {doc}"))
    }

    /// Every byte Berth persisted: the database files and the provider state.
    fn assert_no_canary_persisted(&self) {
        for entry in walk(self.path()) {
            let bytes = std::fs::read(&entry).unwrap_or_default();
            let hit = bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes());
            assert!(!hit, "canary secret persisted in {}", entry.display());
        }
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        // Leave nothing running: sweep for every owner this test acted as.
        let owners: Vec<String> = self.owners.borrow().iter().cloned().collect();
        for owner in owners {
            let _ = self.run_as(&owner, &["ledger", "sweep"]);
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                out.extend(walk(&path));
            } else if meta.is_file() {
                out.push(path);
            }
        }
    }
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

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
    let (code, doc) = home.json(&["restore", &handle]);
    assert_eq!(code, 0, "{doc}");
    let restored = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let out = home.run(&[
        "exec",
        &restored,
        "-c",
        "test ! -e data/marker && echo clean",
    ]);
    assert_eq!(text(&out.stdout), "clean\n");

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

/// Polls until `check` holds. The ceiling is generous because other tests (a nested cargo
/// build among them) share the machine's two cores; it bounds a hang, it does not time anything.
fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// Starts `berth run -- sh -c 'echo $$ > pid; sleep 60'` and waits until the command runs.
fn start_run(home: &Home) -> (Child, String, i32) {
    let child = home
        .command(
            "tester",
            &["run", "--", "sh", "-c", "echo $$ > pid; exec sleep 60"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sandboxes = home.path().join("state/host/sandboxes");
    let mut found = None;
    wait_for("the run's command to start", || {
        let Ok(entries) = std::fs::read_dir(&sandboxes) else {
            return false;
        };
        for entry in entries.flatten() {
            if let Ok(pid) = std::fs::read_to_string(entry.path().join("workspace/pid")) {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    found = Some((entry.file_name().to_string_lossy().into_owned(), pid));
                    return true;
                }
            }
        }
        false
    });
    let (id, pid) = found.unwrap();
    (child, id, pid)
}

fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
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
    let entry = &doc["entries"][0];
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

#[test]
fn must_not_fire_sweep_leaves_other_owners_alone() {
    let home = Home::new();
    let bobs = home.create("bob");
    let alices = home.create("alice");
    let (code, doc) = home.json_as("alice", &["ledger", "sweep"]);
    assert_eq!(code, 0, "{doc}");
    let swept: Vec<_> = doc["entries"]
        .as_array()
        .unwrap()
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

/// Docker is shared by every test on the machine and sweeps discover by owner label, so each
/// docker test acts as an owner of its own.
///
/// Docker-backed CLI tests need a running engine and the reference image; they fail without
/// them unless `BERTH_SKIP_DOCKER=1` says to skip explicitly.
fn docker_ready() -> bool {
    let engine = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output();
    let image = std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth/agent:bookworm".into());
    let has_image = Command::new("docker")
        .args(["image", "inspect", &image])
        .output();
    let ok = matches!(engine, Ok(ref o) if o.status.success())
        && matches!(has_image, Ok(ref o) if o.status.success());
    if ok {
        return true;
    }
    if std::env::var_os("BERTH_SKIP_DOCKER").is_some() {
        eprintln!("SKIPPED (BERTH_SKIP_DOCKER set): no docker engine or image {image}");
        return false;
    }
    panic!("docker engine or image {image} missing; run scripts/test (or set BERTH_SKIP_DOCKER=1 to skip explicitly)");
}

fn test_image() -> String {
    std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth/agent:bookworm".into())
}

fn container_exists(name: &str) -> bool {
    Command::new("docker")
        .args(["inspect", "--format", "{{.State.Status}}", name])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

struct ForeignContainer(String);

impl Drop for ForeignContainer {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

fn foreign_container(name: &str, labels: &[&str]) -> ForeignContainer {
    let mut cmd = Command::new("docker");
    cmd.args(["run", "-d", "--name", name, "--network", "none"]);
    for label in labels {
        cmd.args(["--label", label]);
    }
    cmd.args([&test_image(), "sleep", "300"]);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    ForeignContainer(name.to_owned())
}

/// Installing is one step: with no `BERTH_SUPERVISOR`, `berth` writes out the static supervisor
/// it carries (under its state directory) and docker works with any image.
#[test]
fn docker_works_with_the_supervisor_berth_carries() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    let me = format!("tester-carried-{}", std::process::id());
    let run = |args: &[&str]| {
        let mut cmd = home.command(&me, args);
        cmd.env_remove("BERTH_SUPERVISOR");
        cmd.output().unwrap()
    };
    let image = test_image();
    let out = run(&[
        "run",
        "-p",
        "docker",
        "--image",
        &image,
        "--",
        "sh",
        "-c",
        "echo carried",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "carried");
    let written: Vec<_> = std::fs::read_dir(home.path().join("state/bin"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    let supervisor = &written[0];
    assert!(supervisor
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("berth-supervisor-"));
    let headers = Command::new("readelf")
        .arg("-l")
        .arg(supervisor)
        .output()
        .unwrap();
    assert!(headers.status.success());
    assert!(
        !text(&headers.stdout).contains("INTERP"),
        "the carried supervisor is static"
    );
    // The second use reuses it.
    let again = run(&["run", "-p", "docker", "--image", &image, "--", "true"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(
        std::fs::read_dir(home.path().join("state/bin"))
            .unwrap()
            .count(),
        1
    );
}

/// A missing piece of setup is a setup error (exit 14) naming the fix, never "retry later".
#[test]
fn a_missing_supervisor_is_a_setup_error_with_the_fix() {
    let home = Home::new();
    let mut cmd = home.command(
        "tester",
        &["--json", "create", "-p", "docker", "--image", "x"],
    );
    cmd.env("BERTH_SUPERVISOR", home.path().join("no-such-supervisor"));
    let out = cmd.output().unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(14), "{doc}");
    assert_eq!(doc["error"]["kind"], "setup", "{doc}");
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(message.contains("BERTH_SUPERVISOR"), "{message}");
    let hint = doc["error"]["hint"].as_str().unwrap();
    assert!(!hint.contains("retry later"), "{hint}");
    assert!(hint.contains("install or configure"), "{hint}");
}

#[test]
fn docker_sigkill_leaves_a_sweepable_container_and_foreign_ones_survive() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    let pid = std::process::id();
    let unlabelled = foreign_container(&format!("berth-test-foreign-{pid}"), &[]);
    let other_owner = foreign_container(
        &format!("berth-test-other-owner-{pid}"),
        &["berth.owner=someone-else", "berth.ledger=x", "berth.run=x"],
    );
    let image = test_image();
    let log = home.path().join("run.stderr");
    let mut child = home
        .command(
            "dave-sigkill",
            &[
                "run", "-p", "docker", "--image", &image, "--", "sleep", "60",
            ],
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(120);
    let id = loop {
        // A runner that already ended will never record the sandbox: fail with what it said.
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "berth run ended early ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let (_, doc) = home.json_as("dave-sigkill", &["ledger", "list", "--all"]);
        if let Some(entry) = doc["entries"].as_array().and_then(|e| e.first()) {
            if entry["state"] == "created" {
                break entry["berth_id"].as_str().unwrap().to_owned();
            }
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!(
                "no created docker sandbox after 120 s; ledger: {doc}; runner said: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Let the command start inside the container, then kill berth outright.
    std::thread::sleep(Duration::from_millis(300));
    signal(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    assert!(
        container_exists(&id),
        "the container outlived berth, as SIGKILL allows"
    );

    let (code, doc) = home.json_as("dave-sigkill", &["ledger", "sweep"]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["complete"], true, "{doc}");
    assert!(!container_exists(&id), "sweep left {id} behind");
    assert_eq!(home.ledger_state("dave-sigkill", &id), "verified_gone");
    assert!(
        container_exists(&unlabelled.0),
        "sweep touched a container without berth labels"
    );
    assert!(
        container_exists(&other_owner.0),
        "sweep touched another owner's container"
    );
    // A second sweep as another owner, with discovery, still leaves them alone.
    let (code, _) = home.json_as("bob", &["ledger", "sweep"]);
    assert_eq!(code, 0);
    assert!(container_exists(&unlabelled.0) && container_exists(&other_owner.0));
}

#[test]
fn docker_user_path_through_the_cli() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    let me = format!("erin-{}", std::process::id());
    let (code, doc) = home.json_as(&me, &["create", "-p", "docker", "--image", &test_image()]);
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let out = home.run_as(&me, &["exec", &id, "-c", "echo hi; echo oops >&2; exit 3"]);
    assert_eq!(
        (out.status.code(), text(&out.stdout), text(&out.stderr)),
        (Some(3), "hi\n".into(), "oops\n".into())
    );
    let local = home.path().join("in.txt");
    std::fs::write(&local, b"payload").unwrap();
    assert!(home
        .run_as(
            &me,
            &["cp", local.to_str().unwrap(), &format!("{id}:sub/in.txt")]
        )
        .status
        .success());
    assert_eq!(
        text(
            &home
                .run_as(&me, &["cp", &format!("{id}:/workspace/sub/in.txt"), "-"])
                .stdout
        ),
        "payload"
    );
    let (code, doc) = home.json_as(&me, &["suspend", &id]);
    assert_eq!(
        (code, &doc["transition"]["state"]),
        (0, &Value::from("suspended")),
        "{doc}"
    );
    let (code, doc) = home.json_as(&me, &["exec", &id, "--", "true"]);
    assert_eq!(
        (code, &doc["error"]["kind"]),
        (125, &Value::from("conflict")),
        "{doc}"
    );
    assert_eq!(home.json_as(&me, &["resume", &id]).0, 0);
    let (code, doc) = home.json_as(&me, &["fork", &id]);
    assert_eq!(code, 0, "{doc}");
    let fork = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    assert_eq!(
        text(
            &home
                .run_as(&me, &["exec", &fork, "--", "cat", "sub/in.txt"])
                .stdout
        ),
        "payload"
    );
    let (code, doc) = home.json_as(&me, &["destroy", &id, &fork]);
    assert_eq!(code, 0, "{doc}");
    assert!(!container_exists(&id) && !container_exists(&fork));
}

#[test]
fn verify_writes_evidence_and_the_gate_reads_it_honestly() {
    let home = Home::new();
    let evidence = home.path().join("evidence");
    let key = home.path().join("signing.key");
    let (code, doc) = home.json(&["catalog", "keygen", key.to_str().unwrap()]);
    assert_eq!(code, 0, "{doc}");
    let public = format!("{}.pub", key.display());
    let (code, doc) = home.json(&[
        "verify",
        "host",
        "--out",
        evidence.to_str().unwrap(),
        "--sign-key",
        key.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["failed_clauses"], 0);
    let seed = std::fs::read_to_string(&key).unwrap();
    assert!(
        !doc.to_string().contains(seed.trim()),
        "the private key was printed"
    );
    let record_path = evidence.join("host.json");
    let show = |extra: &[&str]| {
        let mut args = vec![
            "catalog",
            "show",
            "host",
            "--evidence",
            evidence.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        home.json(&args).1
    };
    let check = || {
        home.json(&[
            "catalog",
            "check",
            "--evidence",
            evidence.to_str().unwrap(),
            "--trust-key",
            &public,
        ])
    };
    let doc = show(&["--trust-key", &public]);
    let caps = &doc["providers"][0]["capabilities"];
    assert_eq!(caps["core"]["status"], "VERIFIED", "{doc}");
    assert_eq!(caps["files"]["status"], "VERIFIED");
    assert_eq!(caps["suspend_resume"]["status"], "UNSUPPORTED");
    assert_eq!(
        doc["providers"][0]["evidence"]["origin"]["kind"],
        "explicit"
    );
    // Signed by a key nobody trusts: UNKNOWN, with the reason.
    let doc = show(&[]);
    let reason = doc["providers"][0]["capabilities"]["core"]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("not trusted here"), "{reason}");
    // Providers without a record stay UNKNOWN, never verified.
    let (_, doc) = home.json(&[
        "catalog",
        "show",
        "docker",
        "--evidence",
        evidence.to_str().unwrap(),
    ]);
    assert_eq!(
        doc["providers"][0]["capabilities"]["core"]["reason"],
        "no evidence record"
    );
    // Built-in adapters whose supported capabilities are not VERIFIED fail the check.
    let (code, doc) = check();
    assert_eq!(code, 12, "{doc}");
    let problems = doc["problems"].to_string();
    assert!(
        problems.contains(
            "bwrap/core: declared supported by an adapter in this build, but not VERIFIED"
        ),
        "{problems}"
    );
    assert!(!problems.contains("host/"), "{problems}");
    // A missing evidence directory is an error, not "ok".
    let (code, doc) = home.json(&["catalog", "check", "--evidence", "/nonexistent"]);
    assert_eq!(code, 5, "{doc}");

    // Tampering: flip a grade without resealing → UNKNOWN, with the reason.
    let text = std::fs::read_to_string(&record_path).unwrap();
    let mut record: berth_evidence::EvidenceRecord = serde_json::from_str(&text).unwrap();
    let files = record
        .clauses
        .iter_mut()
        .find(|c| c.clause == "files.round_trip_binary")
        .unwrap();
    files.grade = berth_evidence::Grade::Fail;
    files.diagnostics = vec!["injected failure".into()];
    std::fs::write(&record_path, serde_json::to_string(&record).unwrap()).unwrap();
    let doc = show(&["--trust-key", &public]);
    let reason = doc["providers"][0]["capabilities"]["files"]["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("content hash does not match"), "{reason}");
    // Resealed without the key: unsigned, so UNKNOWN.
    std::fs::write(
        &record_path,
        serde_json::to_string(&record.clone().seal()).unwrap(),
    )
    .unwrap();
    let doc = show(&["--trust-key", &public]);
    let reason = doc["providers"][0]["capabilities"]["files"]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("not signed"), "{reason}");

    // A signed failing record: FAILED, and `catalog check` fails with exit 12.
    let signing = berth_evidence::signing_key_from_hex(&seed).unwrap();
    std::fs::write(
        &record_path,
        serde_json::to_string(&record.sign(&signing)).unwrap(),
    )
    .unwrap();
    let doc = show(&["--trust-key", &public]);
    assert_eq!(
        doc["providers"][0]["capabilities"]["files"]["status"],
        "FAILED"
    );
    let (code, doc) = check();
    assert_eq!(code, 12, "{doc}");
    assert!(doc["problems"].to_string().contains("host/files"), "{doc}");
}

/// The evidence shipped with this build proves it: a fresh `BERTH_HOME` sees host, bwrap and
/// docker VERIFIED from the signed records in `catalog/evidence/`, with when, where and which
/// adapter build. (After an adapter changes, this fails until `scripts/refresh-evidence`.)
#[test]
fn shipped_evidence_verifies_this_build() {
    let home = Home::new();
    let (code, doc) = home.json(&["catalog", "show"]);
    assert_eq!(code, 0, "{doc}");
    for id in ["host", "bwrap", "docker"] {
        let row = doc["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap();
        assert_eq!(
            row["capabilities"]["core"]["status"], "VERIFIED",
            "{id}: {row}"
        );
        assert_eq!(row["evidence"]["origin"]["kind"], "shipped", "{row}");
        assert!(row["evidence"]["finished_at"].is_string());
        assert!(row["evidence"]["signed_by"].is_string());
    }
    let (code, doc) = home.json(&["catalog", "check"]);
    assert_eq!(
        code, 0,
        "scripts/refresh-evidence, then commit catalog/evidence/: {doc}"
    );
}

#[test]
fn lifecycle_bench_reports_phases_cleanup_and_unknowns_never_zero() {
    let home = Home::new();
    let out = home.path().join("bench.json");
    let (code, doc) = home.json(&[
        "bench",
        "host",
        "e2b",
        "--iterations",
        "3",
        "--mode",
        "staggered",
        "--stagger-ms",
        "20",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{doc}");
    let host = &doc["results"][0];
    assert_eq!(host["provider"], "host");
    assert_eq!(host["mode"], "staggered");
    assert_eq!(host["staggerDelayMs"], 20);
    assert_eq!(host["successRate"], 1.0);
    assert_eq!(host["iterations"].as_array().unwrap().len(), 3);
    for iteration in host["iterations"].as_array().unwrap() {
        assert_eq!(iteration["cleanup"], "verified_gone");
        let phases = iteration["phases"].as_object().unwrap();
        for phase in [
            "create_returned",
            "ready",
            "first_exec_ok",
            "destroy_called",
            "destroy_returned",
            "verified_gone",
        ] {
            assert!(
                phases[phase].as_f64().unwrap() > 0.0,
                "{phase} must be measured: {iteration}"
            );
        }
        assert_eq!(iteration["ttiMs"], phases["first_exec_ok"]);
    }
    assert_eq!(host["summary"]["ttiMs"]["n"], 3);
    assert_eq!(host["reuseProbe"]["reused"], 0);
    // A catalog-only provider is skipped with its reason, not reported as zeros.
    let e2b = &doc["results"][1];
    assert_eq!(e2b["skipped"], true);
    assert!(e2b["skipReason"].as_str().unwrap().contains("no adapter"));
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(written["results"][0]["provider"], "host");
    let (_, ledger) = home.json(&["ledger", "list"]);
    assert!(
        ledger["entries"].as_array().unwrap().is_empty(),
        "bench left sandboxes: {ledger}"
    );
}

#[test]
fn provider_scaffold_compiles_passes_its_tests_and_the_catalog_check() {
    let home = Home::new();
    let root = home.path().join("checkout");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let (code, doc) = home.json(&[
        "provider",
        "new",
        "acme-cloud",
        "--root",
        root.to_str().unwrap(),
        "--berth-source",
        repo.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{doc}");
    let krate = root.join("crates/berth-provider-acme-cloud");
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        "tests/conformance.rs",
        "CHECKLIST.md",
    ] {
        assert!(krate.join(file).is_file(), "{file} not generated");
    }
    // Never overwrite.
    let (code, doc) = home.json(&[
        "provider",
        "new",
        "acme-cloud",
        "--root",
        root.to_str().unwrap(),
        "--berth-source",
        repo.to_str().unwrap(),
    ]);
    assert_eq!(code, 5, "{doc}");
    let (code, _) = home.json(&[
        "provider",
        "new",
        "Bad_Name",
        "--root",
        root.to_str().unwrap(),
        "--berth-source",
        repo.to_str().unwrap(),
    ]);
    assert_eq!(code, 5);

    // It builds, resolving the same dependency versions as Berth. Its conformance tests fail
    // while the adapter is unwritten, and pass only when skipped explicitly, saying so.
    std::fs::copy(repo.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    // `nice`: the nested build must not starve the tests running beside it.
    let cargo_test = |skip: bool| {
        let mut cmd = Command::new("nice");
        cmd.args([
            "-n",
            "19",
            env!("CARGO"),
            "test",
            "--quiet",
            "--",
            "--nocapture",
        ])
        .current_dir(&krate)
        .env("CARGO_TARGET_DIR", repo.join("target/scaffold-check"))
        .env_remove("BERTH_SKIP_ACME_CLOUD");
        if skip {
            cmd.env("BERTH_SKIP_ACME_CLOUD", "1");
        }
        cmd.output().unwrap()
    };
    let skipped = cargo_test(true);
    assert!(
        skipped.status.success(),
        "generated crate failed: {}{}",
        text(&skipped.stdout),
        text(&skipped.stderr)
    );
    assert!(
        text(&skipped.stderr).contains("SKIPPED (BERTH_SKIP_ACME_CLOUD set)"),
        "{}",
        text(&skipped.stderr)
    );
    let unskipped = cargo_test(false);
    assert!(
        !unskipped.status.success(),
        "an unwritten adapter's conformance tests passed without being skipped: {}",
        text(&unskipped.stdout)
    );

    // The catalog accepts its manifest and reports it honestly: nothing verified.
    let catalog = root.join("catalog/providers");
    let (code, doc) = home.json(&["catalog", "check", "--catalog", catalog.to_str().unwrap()]);
    assert_eq!(code, 0, "{doc}");
    let (_, doc) = home.json(&["catalog", "show", "--catalog", catalog.to_str().unwrap()]);
    let caps = &doc["providers"][0]["capabilities"];
    assert_eq!(caps["core"]["status"], "UNKNOWN");
    assert_eq!(caps["files"]["status"], "UNSUPPORTED");
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

#[test]
fn docker_names_that_would_change_an_engine_url_are_refused() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    for image in ["../../x", "a/../../containers/json", "/abs"] {
        let (code, doc) = home.json_as(
            "tester-docker-names",
            &["create", "-p", "docker", "--image", image],
        );
        assert_eq!(code, 5, "{image}: {doc}");
        assert_eq!(doc["error"]["kind"], "invalid_request", "{doc}");
    }
    // Invalid input is 5 on docker as everywhere: over-long names and a spoofed sandbox marker.
    let owner = "tester-docker-names";
    let (code, doc) = home.json_as(owner, &["create", "-p", "docker", "--image", &test_image()]);
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let long = "n".repeat(300);
    for args in [
        vec![
            "cp".to_owned(),
            format!("{id}:{long}"),
            home.path().join("copied").display().to_string(),
        ],
        vec![
            "cp".to_owned(),
            "/dev/null".to_owned(),
            format!("{id}:{long}"),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, doc) = home.json_as(owner, &args);
        assert_eq!(code, 5, "{args:?}: {doc}");
    }
    let (code, doc) = home.json_as(
        owner,
        &["exec", &id, "--env", "BERTH_SANDBOX=bx-other", "--", "true"],
    );
    assert_eq!(code, 125, "{doc}");
    assert_eq!(doc["error"]["kind"], "invalid_request", "{doc}");
    home.run_as(owner, &["destroy", &id]);
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

/// The CLI contract: a command missing from the sandbox exits 127 (126 when not executable),
/// naming it, on host and docker; `--json` never shares stdout with file bytes; what docker
/// supports for detached processes the CLI reaches (`exec --detach`, `ps`, `logs`, `kill`), and
/// host, which does not, answers unsupported (4).
#[test]
fn the_cli_reaches_detached_processes_and_reports_missing_commands_like_docker_exec() {
    let home = Home::new();
    let host = home.create("tester");
    let out = home.run(&["exec", &host, "--", "no-such-command-xyz"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains("no-such-command-xyz"),
        "{}",
        text(&out.stderr)
    );
    home.run(&["exec", &host, "-c", "printf '#!/bin/sh\\n' > plain.sh"]);
    let out = home.run(&["exec", &host, "--", "./plain.sh"]);
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
    let (code, doc) = home.json(&["cp", &format!("{host}:plain.sh"), "-"]);
    assert_eq!(code, 5, "{doc}");
    let (code, doc) = home.json(&["exec", &host, "--detach", "--", "sleep", "1"]);
    assert_eq!(code, 4, "{doc}");
    home.json(&["destroy", &host]);
    if !docker_ready() {
        return;
    }
    let (code, doc) = home.json(&["create", "-p", "docker", "--image", &test_image()]);
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let out = home.run(&["exec", &id, "--", "no-such-command-xyz"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    let (code, doc) = home.json(&[
        "exec",
        &id,
        "--detach",
        "-c",
        "echo one; echo two >&2; sleep 0.5; echo three",
    ]);
    assert_eq!(code, 0, "{doc}");
    let first = doc["handle"].as_str().unwrap().to_owned();
    let (_, doc) = home.json(&["exec", &id, "--detach", "--", "sleep", "300"]);
    let sleeper = doc["handle"].as_str().unwrap().to_owned();
    let (_, doc) = home.json(&["ps", &id]);
    let handles: Vec<&str> = doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["handle"].as_str().unwrap())
        .collect();
    assert!(
        handles.contains(&first.as_str()) && handles.contains(&sleeper.as_str()),
        "{doc}"
    );
    let out = home.run(&["logs", "--follow", &id, &first]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "one\nthree\n");
    assert_eq!(text(&out.stderr), "two\n");
    let (_, doc) = home.json(&["logs", &id, &first]);
    assert_eq!(doc["status"]["exit_code"], 0, "{doc}");
    let (code, _) = home.json(&["kill", &id, &sleeper]);
    assert_eq!(code, 0);
    let (_, doc) = home.json(&["ps", &id]);
    let state = doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["handle"] == sleeper.as_str())
        .map(|p| p["status"]["state"].clone());
    assert_eq!(state, Some(Value::from("finished")), "{doc}");
    let (code, _) = home.json(&["logs", &id, "../../etc/passwd"]);
    assert_eq!(code, 5);
    let (code, doc) = home.json(&["destroy", &id]);
    assert_eq!(code, 0, "{doc}");
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

fn which(program: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|candidate| candidate.is_file())
        })
        .ok_or(())
}
