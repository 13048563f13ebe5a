//! End-to-end tests of the `berth` binary on docker: the user path, SIGKILL and foreign
//! containers, names that would change an engine URL, detached processes, and installing with
//! the supervisor berth carries.

use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
mod common;

use common::*;

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
    // The hint names the verb that brings it back (it said "wait for the other change to
    // settle", as if the state would change by itself).
    let hint = doc["error"]["hint"].as_str().unwrap_or_default();
    assert!(hint.contains("`berth resume`"), "{doc}");
    // For people: the state it settled in, in words (not Rust's debug form).
    let out = home.run_as(&me, &["resume", &id]);
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), format!("{id}: running\n"))
    );
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

/// `cp` into a docker sandbox killed midway (SIGKILL: nothing of Berth's runs after it) leaves
/// the destination as it was, and the part of the upload the engine had unpacked beside it is
/// gone before the sandbox's next exec sees it. Before, a `.berth-upload-*` file of tens of MiB
/// stayed there for the agent (and a mission's `git add`) to find.
#[test]
fn docker_cp_killed_midway_leaves_nothing_the_next_exec_sees() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    let me = format!("kim-{}", std::process::id());
    let (code, doc) = home.json_as(&me, &["create", "-p", "docker", "--image", &test_image()]);
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let sh = |line: &str| home.run_as(&me, &["exec", &id, "-c", line]);
    assert!(sh("mkdir in && echo old > in/kept").status.success());
    let local = big_sparse_file(&home);
    for name in ["kept", "new"] {
        killed_midway(
            &home,
            &me,
            &["cp", local.to_str().unwrap(), &format!("{id}:in/{name}")],
        );
        let out = sh("ls -A in; cat in/kept");
        assert_eq!(
            text(&out.stdout),
            "kept\nold\n",
            "{name}: {}",
            text(&out.stderr)
        );
    }
    // What the records were kept in goes with the sandbox.
    let (code, doc) = home.json_as(&me, &["destroy", &id]);
    assert_eq!(code, 0, "{doc}");
    assert!(!home.path().join("state/docker").join(&id).exists());
}

/// `berth gc` removes what a killed snapshot or fork left in the engine that no row names (its
/// commit finished untagged after its row was gone: before, only a later docker destroy or
/// snapshot removed it) and says so, entry by entry; with the engine unreachable, gc still
/// succeeds and says that what is left there is unknown.
#[test]
fn gc_removes_what_killed_commits_left_and_says_so() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    let me = format!("gwen-{}", std::process::id());
    let made_for = format!("fork:bx-gone-{me}");
    // Another test's docker destroy clears abandoned commits too and may take ours first: gc
    // must name it in one of a few tries.
    let mut named = false;
    for attempt in 0..5 {
        let image = berth_testkit::load_untagged_image(
            home.path(),
            &format!("2026-01-01T00:02:0{attempt}Z"),
            &made_for,
        );
        let (code, doc) = home.json_as(&me, &["gc"]);
        assert_eq!(code, 0, "{doc}");
        assert_eq!(doc["complete"], true, "{doc}");
        assert!(
            !berth_testkit::image_exists(&image),
            "gc left {image}: {doc}"
        );
        let entries = doc["entries"].as_array().unwrap();
        if let Some(entry) = entries
            .iter()
            .find(|e| e["what"].as_str().is_some_and(|w| w.contains(&image)))
        {
            assert_eq!(entry["action"], "residue_removed", "{doc}");
            assert_eq!(entry["provider"], "docker", "{doc}");
            assert_eq!(entry["berth_id"], "<residue>", "{doc}");
            named = true;
            break;
        }
    }
    assert!(named, "gc never named the abandoned commit it removed");

    let out = home
        .command(&me, &["--json", "gc"])
        .env(
            "DOCKER_HOST",
            format!("unix://{}/no-engine.sock", home.path().display()),
        )
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{doc}");
    let unknown = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["provider"] == "docker")
        .unwrap_or_else(|| panic!("nothing said of docker: {doc}"));
    assert_eq!(unknown["action"], "residue_unknown", "{doc}");
    assert_eq!(unknown["kind"], "unavailable", "{doc}");
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
    // Its supervisor counts what it would drop past what it keeps (1 GiB of each stream).
    assert_eq!(doc["stdout_dropped_bytes"], 0, "{doc}");
    let (code, _) = home.json(&["kill", &id, &sleeper]);
    assert_eq!(code, 0);
    // A process that ended is killed with what it left in its group (before: "killed", and
    // the background sleep lived on).
    let (code, doc) = home.json(&["exec", &id, "--detach", "-c", "sleep 301 & echo started"]);
    assert_eq!(code, 0, "{doc}");
    let background = doc["handle"].as_str().unwrap().to_owned();
    let sleeping = || {
        let out = home.sh(&id, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '");
        text(&out.stdout).contains("sleep 301")
    };
    wait_for("the background sleep", &sleeping);
    let (code, _) = home.json(&["kill", &id, &background]);
    assert_eq!(code, 0);
    wait_for("the background sleep to be killed", || !sleeping());
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
    logs_of_any_length_are_read_in_pieces(&home, &id);
    // `cp` out streams a file past the whole-file read limit as the archive arrives.
    const BIG: u64 = (256 << 20) + 12345;
    let out = home.run(&["exec", &id, "--", "truncate", "-s", &BIG.to_string(), "big"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let copy = home.path().join("big.copy");
    let (code, doc) = home.json(&["cp", &format!("{id}:big"), copy.to_str().unwrap()]);
    assert_eq!((code, &doc["bytes"]), (0, &Value::from(BIG)), "{doc}");
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), BIG);
    // And `cp` in streams it back, with a mark at its end, into a directory not yet made.
    {
        use std::io::{Seek, Write};
        let mut file = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
        file.seek(std::io::SeekFrom::Start(BIG)).unwrap();
        file.write_all(b"end").unwrap();
    }
    let (code, doc) = home.json(&["cp", copy.to_str().unwrap(), &format!("{id}:data/up.bin")]);
    assert_eq!((code, &doc["bytes"]), (0, &Value::from(BIG + 3)), "{doc}");
    let out = home.sh(&id, "stat -c %s data/up.bin; tail -c 3 data/up.bin");
    assert_eq!(text(&out.stdout), format!("{}\nend", BIG + 3));
    std::fs::remove_file(&copy).unwrap();
    home.run(&["exec", &id, "--", "rm", "-r", "big", "data"]);
    // A file copied onto a directory is refused and the directory keeps its tree (before: the
    // archive replaced `tree`, `sub/f` and all, exit 0); nothing of the copy is left.
    a_file_onto_a_directory_changes_nothing(&home, &id);
    // Between providers: out of the container into a host sandbox, and back under a new name.
    let host = home.create("tester");
    let (code, doc) = home.json(&[
        "cp",
        &format!("{id}:onto/tree/sub/f"),
        &format!("{host}:from/f"),
    ]);
    assert_eq!(code, 0, "{doc}");
    let (code, doc) = home.json(&["cp", &format!("{host}:from/f"), &format!("{id}:back.txt")]);
    assert_eq!(code, 0, "{doc}");
    let out = home.run(&["exec", &id, "--", "cat", "back.txt"]);
    assert_eq!(text(&out.stdout), "precious\n");
    home.run(&["exec", &id, "--", "rm", "back.txt"]);
    home.json(&["destroy", &host]);
    // Stopped, it has no supervisor to ask: its output files are read through the engine.
    let (code, doc) = home.json(&["stop", &id]);
    assert_eq!(code, 0, "{doc}");
    let out = home.run(&["exec", &id, "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let said = text(&out.stderr);
    assert!(
        said.contains("is exited") && said.contains("`berth start`"),
        "{said}"
    );
    let out = home.run(&["logs", &id, &first]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "one\nthree\n");
    // What was dropped was counted by the supervisor, which is not running: unknown.
    let (_, doc) = home.json(&["logs", &id, &first]);
    assert_eq!(doc["stdout_dropped_bytes"], Value::Null, "{doc}");
    let (code, doc) = home.json(&["destroy", &id]);
    assert_eq!(code, 0, "{doc}");
}

/// Output longer than a file read may hold (256 MiB) is printed whole by `berth logs`, piece
/// by piece (before: "larger than the file API's limit"); `--json` holds the first 16 MiB of
/// each stream and says how much there is.
fn logs_of_any_length_are_read_in_pieces(home: &Home, id: &str) {
    const LONG: u64 = 270_000_000;
    let (code, doc) = home.json(&[
        "exec",
        id,
        "--detach",
        "-c",
        &format!("head -c {LONG} /dev/zero | tr '\\0' a; echo done >&2"),
    ]);
    assert_eq!(code, 0, "{doc}");
    let long = doc["handle"].as_str().unwrap().to_owned();
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, doc) = home.json(&["ps", id]);
        let finished = doc["processes"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["handle"] == long.as_str()))
            .is_some_and(|p| p["status"]["state"] == "finished");
        if finished {
            break;
        }
        assert!(Instant::now() < until, "the writer did not finish: {doc}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut child = home
        .command("tester", &["logs", id, &long])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (mut total, mut others) = (0u64, 0u64);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut stdout, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
        others += buf[..n].iter().filter(|b| **b != b'a').count() as u64;
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!((total, others), (LONG, 0));
    assert_eq!(text(&out.stderr), "done\n");
    let (code, doc) = home.json(&["logs", id, &long]);
    assert_eq!(code, 0);
    assert_eq!(doc["stdout_bytes"], LONG);
    assert_eq!(doc["stdout_truncated"], true);
    assert_eq!(
        doc["stdout"].as_str().map(str::len),
        Some(berth_contract::DEFAULT_MAX_OUTPUT_BYTES)
    );
    assert_eq!(
        (&doc["stderr"], &doc["stderr_truncated"]),
        (&Value::from("done\n"), &Value::from(false))
    );
}

/// A sandbox at its process limit says so, and detached processes cost it half as much as
/// before. Each detached process is one process and one supervisor thread (before: two
/// threads), so a limit of 64 holds over twenty-five; the one that no longer fits is refused
/// with the sandbox's processes and threads against its limit (before: "Resource temporarily
/// unavailable (os error 11)" and nothing else). Requests at once at the limit are refused the
/// same way, the supervisor staying (before: a connection no thread could be made for ended it).
#[test]
fn a_sandbox_at_its_process_limit_says_so() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    let id = home.create_docker(&["--pids", "64"]);
    let mut started = 0;
    let refusal = loop {
        let (code, doc) = home.json(&["exec", &id, "--detach", "--", "sleep", "300"]);
        if code != 0 {
            break doc;
        }
        started += 1;
        assert!(started < 64, "never refused under a limit of 64");
    };
    let message = refusal["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("of its limit 64)"), "{refusal}");
    assert!(
        started >= 26,
        "only {started} detached processes under a limit of 64"
    );
    // Requests at once at the limit: each runs or is refused saying why, and the supervisor
    // stays (no thread for a connection panicked it, and the container exited with it).
    let at_once: Vec<_> = (0..12)
        .map(|_| {
            home.command("tester", &["--json", "exec", &id, "--", "true"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in at_once {
        let out = child.wait_with_output().unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let said = doc["error"]["message"].as_str().unwrap_or_default();
        assert!(
            out.status.success() || said.contains("of its limit 64)"),
            "{doc}"
        );
    }
    let (code, listed) = home.json(&["ps", &id]);
    assert_eq!(code, 0, "the supervisor is gone: {listed}");
    let (code, doc) = home.json(&["destroy", &id]);
    assert_eq!(code, 0, "{doc}");
}

/// `berth ls` on docker: the same listing as on host (`tests/cli.rs`).
#[test]
fn ls_lists_a_docker_directory_and_never_follows_a_link() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    let id = home.create_docker(&[]);
    assert_ls_lists_and_never_follows_a_link(&home, &id);
}
