//! `berth move` end to end on real providers: host and bwrap here, docker where its engine is
//! (a hostile `tar` in the source, a target image that is not empty, a target without `tar`),
//! kills at each durable step, a source still written, two moves of one source at once.

use serde_json::Value;
use std::process::Stdio;
mod common;
mod missions_support;

use common::*;

/// The workspace every move test starts from: modes, nesting, links in and out, all 256 byte
/// values, a hard link, a FIFO, a `.git` directory and an empty directory.
const POPULATE: &str = "mkdir -p src/deep empty .git && printf '#!/bin/sh\\necho ran\\n' > run.sh \
    && chmod 755 run.sh && echo secret > src/deep/private && chmod 600 src/deep/private \
    && ln -s src/deep/private inside && ln -s /etc/passwd outside && mkfifo pipe \
    && ln src/deep/private hard && echo 'ref: refs/heads/main' > .git/HEAD \
    && i=0; while [ $i -lt 256 ]; do printf \"\\\\$(printf %o $i)\"; i=$((i+1)); done > bytes";

/// What a populated workspace looks like from inside, as one line per entry.
const DESCRIBE: &str =
    "for f in run.sh src src/deep src/deep/private hard empty .git/HEAD bytes; do \
    printf '%s %s\\n' \"$f\" \"$(stat -c %a \"$f\")\"; done; readlink inside; readlink outside; \
    cksum < bytes; ./run.sh; [ -e pipe ] && echo pipe-here || echo no-pipe";

fn describe(home: &Home, owner: &str, id: &str) -> String {
    let out = home.run_as(owner, &["exec", id, "--", "sh", "-c", DESCRIBE]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

fn populated(home: &Home, owner: &str, provider: &str) -> String {
    let (code, doc) = home.json_as(owner, &["create", "-p", provider]);
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let out = home.run_as(owner, &["exec", &id, "--", "sh", "-c", POPULATE]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    id
}

/// The owner's sandboxes not verified gone: (id, origin).
fn open_rows(home: &Home, owner: &str) -> Vec<(String, String)> {
    let (_, doc) = home.json_as(owner, &["ledger", "list"]);
    doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "sandbox")
        .map(|e| {
            (
                e["berth_id"].as_str().unwrap().to_owned(),
                e["origin"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn moved(home: &Home, owner: &str, args: &[&str]) -> Value {
    let mut full = vec!["move"];
    full.extend_from_slice(args);
    let (code, doc) = home.json_as(owner, &full);
    assert_eq!(code, 0, "{doc}");
    doc["move"].clone()
}

#[test]
fn a_workspace_moves_to_bwrap_and_back_whole_and_the_source_goes() {
    let home = Home::new();
    let me = "mover";
    let source = populated(&home, me, "host");
    let before = describe(&home, me, &source);
    assert!(
        before.contains("pipe-here") && before.contains("ran"),
        "{before}"
    );

    let there = moved(&home, me, &["--to", "bwrap", &source]);
    let target = there["target"]["berth_id"].as_str().unwrap().to_owned();
    assert_eq!(there["target"]["provider"], "bwrap");
    assert_eq!(
        there["counts"],
        serde_json::json!({"files": 5, "dirs": 4, "symlinks": 2, "bytes": 19 + 7 + 7 + 21 + 256})
    );
    let not_carried: Vec<&str> = there["not_carried"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        not_carried.iter().any(|n| n.starts_with("pipe: a FIFO")),
        "{not_carried:?}"
    );
    assert!(
        not_carried.iter().any(|n| n.contains("hard link")),
        "{not_carried:?}"
    );
    assert_eq!(there["source_teardown"]["outcome"], "verified_gone");
    assert_eq!(home.ledger_state(me, &source), "verified_gone");
    assert_eq!(
        open_rows(&home, me),
        vec![(target.clone(), format!("move:{source}"))]
    );
    // Inside the target: everything but the FIFO, modes and links as they were.
    let after = describe(&home, me, &target);
    assert_eq!(after, before.replace("pipe-here", "no-pipe"));

    // Back to the host: the same checkpoint, by digest, from another provider's `tar`.
    let back = moved(&home, me, &["--to", "host", &target]);
    assert_eq!(back["checkpoint"], there["checkpoint"]);
    let home_again = back["target"]["berth_id"].as_str().unwrap();
    assert_eq!(describe(&home, me, home_again), after);
    assert_eq!(open_rows(&home, me).len(), 1);
    // A move of a source already moved says so and changes nothing.
    let again = home.run_as(me, &["move", "--to", "host", &target]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout).trim(), home_again);
    assert!(
        text(&again.stderr).contains("already moved"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(open_rows(&home, me).len(), 1);
}

/// `berth move` killed after `phase` (`BERTH_FAULT=kill-in-move:PHASE`).
fn killed_after(home: &Home, owner: &str, phase: &str, source: &str) {
    let out = home
        .command(owner, &["move", "--to", "host", source])
        .env("BERTH_FAULT", format!("kill-in-move:{phase}"))
        .output()
        .unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "not killed after {phase}: {}",
        text(&out.stderr)
    );
}

#[test]
fn a_move_killed_before_its_commit_keeps_the_source_and_the_next_removes_its_target() {
    for phase in ["target-created", "restored"] {
        let home = Home::new();
        let me = "mover";
        let source = populated(&home, me, "host");
        let before = describe(&home, me, &source);
        killed_after(&home, me, phase, &source);
        let rows = open_rows(&home, me);
        assert_eq!(rows.len(), 2, "{phase}: {rows:?}");
        let (half_made, origin) = rows.iter().find(|r| r.0 != source).unwrap().clone();
        assert_eq!(origin, format!("move:{source}"));
        assert_eq!(
            describe(&home, me, &source),
            before,
            "{phase}: the source is untouched"
        );

        let out = home.run_as(me, &["move", "--to", "host", &source]);
        assert!(out.status.success(), "{phase}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(&format!("removed {half_made}, the unverified target")),
            "{phase}: {}",
            text(&out.stderr)
        );
        let target = text(&out.stdout).trim().to_owned();
        assert_ne!(target, half_made);
        assert_eq!(home.ledger_state(me, &half_made), "verified_gone");
        assert_eq!(home.ledger_state(me, &source), "verified_gone");
        assert_eq!(
            open_rows(&home, me),
            vec![(target, format!("move:{source}"))]
        );
    }
}

#[test]
fn a_move_killed_after_its_commit_is_finished_by_the_next_not_made_again() {
    let home = Home::new();
    let me = "mover";
    let source = populated(&home, me, "host");
    let before = describe(&home, me, &source);
    killed_after(&home, me, "committed", &source);
    let rows = open_rows(&home, me);
    let (target, _) = rows.iter().find(|r| r.0 != source).unwrap().clone();
    assert_eq!(rows.len(), 2, "{rows:?}");
    // Asked again, even for another provider: the verified target is the answer.
    let out = home.run_as(me, &["move", "--to", "bwrap", &source]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), target);
    assert!(
        text(&out.stderr).contains("cut short after verifying it; finished removing the source"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(home.ledger_state(me, &source), "verified_gone");
    assert_eq!(
        open_rows(&home, me),
        vec![(target.clone(), format!("move:{source}"))]
    );
    assert_eq!(
        describe(&home, me, &target),
        before.replace("pipe-here", "no-pipe")
    );
}

/// A writer in the source while it is moved: the move is refused (the source read again after
/// the target was verified differs, or the sandbox's own `tar` saw a file change under it), the
/// source kept, no target left. The writer is a thread of this test; on a loaded machine it may
/// not run at all while a move (tens of milliseconds) is under way — then nothing changed, the
/// move is right to go through, and the test tries again with a new source (at most 5 times).
#[test]
fn a_source_still_being_written_is_not_moved() {
    let home = Home::new();
    let me = "mover";
    for attempt in 1..=5 {
        let source = populated(&home, me, "host");
        let workspace = home.sandbox_dir(&source).join("workspace");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    // Gone: the move went through (see above).
                    if std::fs::write(workspace.join("log"), n.to_string()).is_err() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            })
        };
        let out = home.run_as(me, &["--json", "move", "--to", "host", &source]);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let code = out.status.code().unwrap();
        if code == 0 && attempt < 5 {
            eprintln!("attempt {attempt}: the writer did not run during the move; again");
            let target = doc["move"]["target"]["berth_id"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(home.run_as(me, &["destroy", &target]).status.success());
            continue;
        }
        // Caught when the source is read again after the target was verified (8), or by the
        // sandbox's own `tar` reading a file that changed under it (5).
        assert!(code == 8 || code == 5, "{code}: {doc}");
        if code == 8 {
            let message = doc["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("the source changed while it was moved"),
                "{message}"
            );
            assert!(message.contains("was removed (verified gone)"), "{message}");
        }
        assert_eq!(
            open_rows(&home, me),
            vec![(source.clone(), "create".to_owned())]
        );
        assert!(describe(&home, me, &source).contains("pipe-here"));
        return;
    }
}

#[test]
fn two_moves_of_one_source_at_once_make_one_target() {
    let home = Home::new();
    let me = "mover";
    let source = populated(&home, me, "host");
    let children: Vec<_> = (0..2)
        .map(|_| {
            home.command(me, &["move", "--to", "host", &source])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let codes: Vec<i32> = outs.iter().map(|o| o.status.code().unwrap()).collect();
    assert!(codes.iter().all(|c| *c == 0 || *c == 8), "{codes:?}");
    assert!(codes.contains(&0), "{codes:?}");
    for out in outs.iter().filter(|o| o.status.code() == Some(8)) {
        assert!(
            text(&out.stderr).contains("under way"),
            "{}",
            text(&out.stderr)
        );
    }
    let rows = open_rows(&home, me);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(home.ledger_state(me, &source), "verified_gone");
}

#[test]
fn what_cannot_be_moved_is_refused_before_anything_is_made() {
    let home = Home::new();
    let me = "mover";
    let source = populated(&home, me, "host");
    // No such provider, no such sandbox, a snapshot: clear errors, nothing made.
    let out = home.run_as(me, &["move", "--to", "nowhere", &source]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let out = home.run_as(me, &["move", "--to", "host", "bx-000000000000"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    // Another owner's sandbox is not this owner's to move.
    let out = home.run_as("someone-else", &["move", "--to", "host", &source]);
    assert_eq!(out.status.code(), Some(11), "{}", text(&out.stderr));
    // More than a move carries: refused by size before any target exists.
    let big = home.run_as(
        me,
        &[
            "exec",
            &source,
            "--",
            "sh",
            "-c",
            "head -c 300000000 /dev/zero > big",
        ],
    );
    assert!(big.status.success(), "{}", text(&big.stderr));
    let out = home.run_as(me, &["move", "--to", "host", &source]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("larger than 256 MiB"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(open_rows(&home, me), vec![(source, "create".to_owned())]);
}

/// A docker sandbox whose own `tar` (first on its PATH) prints `archive`, an archive its real
/// `tar` made from a crafted tree: what a root agent can do.
fn lying_source(home: &Home, owner: &str, craft: &str) -> String {
    let image = test_image();
    let (code, doc) = home.json_as(owner, &["create", "-p", "docker", "--image", &image]);
    assert_eq!(code, 0, "{doc}");
    let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let script = format!(
        "set -e; echo precious > keep; mkdir -p /tmp/e && cd /tmp/e && {craft}; \
         printf '#!/bin/sh\\ncat /tmp/evil.tar\\n' > /usr/local/bin/tar; chmod 755 /usr/local/bin/tar"
    );
    let out = home.run_as(owner, &["exec", &id, "--", "sh", "-c", &script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    id
}

#[test]
fn a_source_whose_tar_lies_moves_nothing() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    let me = format!("mover-lying-{}", std::process::id());
    for (craft, why) in [
        (
            // A link to /etc, then a file through it.
            "ln -s /etc link && /usr/bin/tar -cf /tmp/evil.tar link && rm link && mkdir link \
             && echo x > link/passwd && /usr/bin/tar -rf /tmp/evil.tar link/passwd",
            "is not beneath a directory the archive made before it",
        ),
        (
            "/usr/bin/tar -cPf /tmp/evil.tar /etc/hostname",
            "an absolute path",
        ),
        ("echo not-an-archive > /tmp/evil.tar", "refused"),
    ] {
        let source = lying_source(&home, &me, craft);
        let out = home.run_as(&me, &["move", "--to", "host", &source]);
        assert_eq!(out.status.code(), Some(5), "{craft}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(why),
            "{craft}: {}",
            text(&out.stderr)
        );
        // Nothing was made, the source is as it was.
        assert_eq!(
            open_rows(&home, &me),
            vec![(source.clone(), "create".to_owned())]
        );
        let kept = home.run_as(&me, &["exec", &source, "--", "cat", "keep"]);
        assert_eq!(text(&kept.stdout), "precious\n");
        let out = home.run_as(&me, &["destroy", &source]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

#[test]
fn a_target_that_is_not_the_checkpoint_is_removed_and_the_source_kept() {
    if !docker_ready() {
        return;
    }
    let home = Home::new();
    let me = format!("mover-target-{}", std::process::id());
    let source = populated(&home, &me, "host");
    let before = describe(&home, &me, &source);
    let image = TestImage("berth-test/move-target:latest");

    // An image whose workspace is not empty: the target is not the checkpoint.
    image.build("RUN mkdir -p /workspace && echo stale > /workspace/stale");
    let out = home.run_as(
        &me,
        &["move", "--to", "docker", "--image", image.0, &source],
    );
    assert_eq!(out.status.code(), Some(12), "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains("stale: not in the checkpoint"), "{said}");
    assert!(said.contains("was removed (verified gone)"), "{said}");
    assert_eq!(
        open_rows(&home, &me),
        vec![(source.clone(), "create".to_owned())]
    );

    // An image without `tar`: the target cannot restore; a setup error, the target removed.
    image.build("RUN rm -f /bin/tar /usr/bin/tar");
    let out = home.run_as(
        &me,
        &["move", "--to", "docker", "--image", image.0, &source],
    );
    assert_eq!(out.status.code(), Some(14), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("could not restore"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        open_rows(&home, &me),
        vec![(source.clone(), "create".to_owned())]
    );
    assert_eq!(describe(&home, &me, &source), before);

    // The reference image: there and back, whole.
    let there = moved(
        &home,
        &me,
        &["--to", "docker", "--image", &test_image(), &source],
    );
    let target = there["target"]["berth_id"].as_str().unwrap().to_owned();
    let expected = before.replace("pipe-here", "no-pipe");
    assert_eq!(describe(&home, &me, &target), expected);
    // A process running there is named as not carried (processes never are).
    let out = home.run_as(&me, &["exec", "-d", &target, "--", "sleep", "300"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let handle = text(&out.stdout).trim().to_owned();
    let back = moved(&home, &me, &["--to", "host", &target]);
    assert!(
        back["not_carried"]
            .to_string()
            .contains(&format!("process {handle}: running in the source")),
        "{back}"
    );
    assert_eq!(back["checkpoint"], there["checkpoint"]);
    let last = back["target"]["berth_id"].as_str().unwrap();
    assert_eq!(describe(&home, &me, last), expected);
    assert_eq!(open_rows(&home, &me).len(), 1);
}

#[test]
fn a_move_interrupted_after_its_commit_keeps_the_target_its_cleanup_would_take() {
    let home = Home::new();
    let me = "mover";
    let source = populated(&home, me, "host");
    let before = describe(&home, me, &source);
    // SIGTERM once the record is written: the run's must-fire cleanup removes what the run
    // made — but not the target that may now be the only copy.
    let out = home
        .command(me, &["move", "--to", "host", &source])
        .env("BERTH_FAULT", "term-in-move:committed")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("handed over"),
        "{}",
        text(&out.stderr)
    );
    let rows = open_rows(&home, me);
    let target = rows
        .iter()
        .find(|r| r.1 == format!("move:{source}"))
        .unwrap_or_else(|| panic!("the target was swept: {rows:?}"))
        .0
        .clone();
    assert_eq!(
        describe(&home, me, &target),
        before.replace("pipe-here", "no-pipe")
    );
    let out = home.run_as(me, &["move", "--to", "host", &source]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), target);
    assert_eq!(home.ledger_state(me, &source), "verified_gone");
    assert_eq!(
        open_rows(&home, me),
        vec![(target, format!("move:{source}"))]
    );
}

/// `berth bench move`: both measurements in the same run, the baseline labelled, every sandbox
/// verified gone; a request that names no pair is refused.
#[test]
fn the_move_benchmark_reports_both_figures_and_leaves_nothing() {
    let home = Home::new();
    let me = "bencher";
    let (code, doc) = home.json_as(me, &["bench", "move", "host", "bwrap", "--iterations", "2"]);
    assert_eq!(code, 0, "{doc}");
    for figure in ["source_verified_gone", "first_command_in_target"] {
        let c = &doc[figure];
        assert_eq!(c["berth"]["n"], 2, "{doc}");
        assert_eq!(c["raw"]["n"], 2, "{doc}");
        let ratio = c["ratio_median"].as_f64().unwrap();
        assert!(ratio.is_finite() && ratio > 0.0, "{doc}");
    }
    assert!(
        doc["baseline"]
            .as_str()
            .unwrap()
            .contains("without its checks"),
        "{doc}"
    );
    assert!(doc["target"].is_null(), "{doc}");
    assert!(
        open_rows(&home, me).is_empty(),
        "{:?}",
        open_rows(&home, me)
    );
    let out = home.run_as(me, &["bench", "move", "host"]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("name the two providers"),
        "{}",
        text(&out.stderr)
    );
}

/// A mission's sandbox is the mission's: it adopts it by name on resume and judges what it
/// holds, so a move is refused and changes nothing.
#[test]
fn a_missions_sandbox_is_not_moved() {
    let home = Home::new();
    let marks = home.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let agent = format!("echo $$ > {}/agent; exec sleep 300\n", marks.display());
    let file = missions_support::write_mission(home.path(), &agent, "true", "30s", "\"README\"", 1);
    let mission = mission_left_running(&home, "alice", &file, &marks);
    let rows = open_rows(&home, "alice");
    let (sandbox, origin) = rows
        .iter()
        .find(|r| r.1.starts_with("mission "))
        .unwrap_or_else(|| panic!("{rows:?}"))
        .clone();
    let out = home.run_as("alice", &["move", "--to", "host", &sandbox]);
    assert_eq!(out.status.code(), Some(8), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("belongs to mission"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(open_rows(&home, "alice"), rows, "{origin}");
    let out = home.run_as("alice", &["mission", "cancel", &mission]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A record never lets a source go for a target that is gone: a move committed, its target
/// then destroyed by hand before the source was, moves the source again; a source moved whose
/// target was destroyed since says so.
#[test]
fn a_record_whose_target_is_gone_never_costs_the_source() {
    let home = Home::new();
    let me = "mover";
    let source = populated(&home, me, "host");
    let before = describe(&home, me, &source);
    killed_after(&home, me, "committed", &source);
    let (first_target, _) = open_rows(&home, me)
        .into_iter()
        .find(|r| r.0 != source)
        .unwrap();
    let out = home.run_as(me, &["destroy", &first_target]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The source is whole and its record stale: it moves again.
    let out = home.run_as(me, &["move", "--to", "host", &source]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let target = text(&out.stdout).trim().to_owned();
    assert_ne!(target, first_target);
    assert_eq!(
        describe(&home, me, &target),
        before.replace("pipe-here", "no-pipe")
    );
    assert_eq!(home.ledger_state(me, &source), "verified_gone");
    // Moved, and its target destroyed since: said, exit 8, nothing made.
    let out = home.run_as(me, &["destroy", &target]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = home.run_as(me, &["move", "--to", "host", &source]);
    assert_eq!(out.status.code(), Some(8), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!(
            "it was moved to `{target}` (host), which is verified_gone since"
        )),
        "{}",
        text(&out.stderr)
    );
    assert!(open_rows(&home, me).is_empty());
}

/// The first and the last steps: killed after the checkpoint, nothing was made and the next
/// move starts clean; killed after the source's teardown, the move is done and the next says
/// so.
#[test]
fn a_move_killed_at_its_first_or_last_step_needs_nothing_undone() {
    let home = Home::new();
    let me = "mover";
    let source = populated(&home, me, "host");
    killed_after(&home, me, "checkpointed", &source);
    assert_eq!(
        open_rows(&home, me),
        vec![(source.clone(), "create".to_owned())]
    );
    killed_after(&home, me, "source-destroyed", &source);
    let rows = open_rows(&home, me);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (target, origin) = rows[0].clone();
    assert_eq!(origin, format!("move:{source}"));
    assert_eq!(home.ledger_state(me, &source), "verified_gone");
    let out = home.run_as(me, &["move", "--to", "host", &source]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), target);
    assert!(
        text(&out.stderr).contains("already moved"),
        "{}",
        text(&out.stderr)
    );
}

fn checkpoint_of(home: &Home, owner: &str, id: &str, extra: &[&str]) -> Value {
    let mut args = vec!["checkpoint", id];
    args.extend_from_slice(extra);
    let (code, doc) = home.json_as(owner, &args);
    assert_eq!(code, 0, "{doc}");
    doc["checkpoint"].clone()
}

fn restored(home: &Home, owner: &str, args: &[&str]) -> String {
    let mut full = vec!["restore"];
    full.extend_from_slice(args);
    let (code, doc) = home.json_as(owner, &full);
    assert_eq!(code, 0, "{doc}");
    assert!(
        doc["checkpoint"].as_str().unwrap().starts_with("ws-"),
        "{doc}"
    );
    doc["sandbox"]["berth_id"].as_str().unwrap().to_owned()
}

/// A checkpoint outlives its sandbox and its provider: restored on bwrap and on the host, whole;
/// the same workspace is the same checkpoint; another owner cannot reach it; a stored archive
/// changed on disk is refused before anything is made.
#[test]
fn a_checkpoint_is_restored_on_any_provider_whole() {
    let home = Home::new();
    let me = "keeper";
    let source = populated(&home, me, "host");
    let expected = describe(&home, me, &source).replace("pipe-here", "no-pipe");
    let stored = checkpoint_of(&home, me, &source, &[]);
    let id = stored["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("ws-") && id.len() == 67, "{stored}");
    assert!(stored["expires_at"].is_null(), "{stored}");
    assert!(
        stored["not_carried"].to_string().contains("FIFO"),
        "{stored}"
    );
    // The same content is the same checkpoint.
    assert_eq!(checkpoint_of(&home, me, &source, &[])["id"], id.as_str());
    let out = home.run_as(me, &["destroy", &source]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    for provider in ["bwrap", "host"] {
        let sandbox = restored(&home, me, &[&id, "--provider", provider]);
        assert_eq!(describe(&home, me, &sandbox), expected, "{provider}");
        let rows = open_rows(&home, me);
        assert!(
            rows.contains(&(sandbox.clone(), format!("checkpoint:{id}"))),
            "{rows:?}"
        );
    }
    let (_, listed) = home.json_as(me, &["checkpoints"]);
    assert_eq!(
        listed["checkpoints"].as_array().unwrap().len(),
        1,
        "{listed}"
    );

    // Another owner sees none of it.
    let (_, theirs) = home.json_as("other", &["checkpoints"]);
    assert_eq!(
        theirs["checkpoints"].as_array().unwrap().len(),
        0,
        "{theirs}"
    );
    for args in [vec!["restore", &id, "-p", "host"], vec!["destroy", &id]] {
        let out = home.run_as("other", &args);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // Ids that are no checkpoint's: refused, nothing touched.
    for bad in ["ws-../../etc/passwd", "ws-", "ws-ABC"] {
        let out = home.run_as(me, &["restore", bad, "-p", "host"]);
        assert_eq!(out.status.code(), Some(3), "{bad}: {}", text(&out.stderr));
    }
    let out = home.run_as(me, &["restore", "sha256:00", "-p", "host", "--image", "x"]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));

    // A stored archive changed on disk: refused, no sandbox made.
    let stored_tar = walk(home.path())
        .into_iter()
        .find(|p| p.file_name().unwrap().to_string_lossy() == format!("{id}.tar"))
        .unwrap();
    let mut bytes = std::fs::read(&stored_tar).unwrap();
    let at = bytes.windows(7).position(|w| w == b"secret\n").unwrap();
    bytes[at] = b'S';
    std::fs::write(&stored_tar, &bytes).unwrap();
    let before = open_rows(&home, me);
    let out = home.run_as(me, &["restore", &id, "-p", "host"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not the checkpoint its name says"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(open_rows(&home, me), before);
    // Deleted by its id; then gone.
    let out = home.run_as(me, &["destroy", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = home.run_as(me, &["destroy", &id]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
}

/// `berth gc` deletes checkpoints past their retention and what a crash left of one (a
/// temporary file, an archive without its record) once it is old, never a fresh one.
#[test]
fn gc_deletes_expired_checkpoints_and_what_a_crash_left() {
    let home = Home::new();
    let me = "keeper";
    let source = populated(&home, me, "host");
    let kept = checkpoint_of(&home, me, &source, &[]);
    let out = home.run_as(me, &["exec", &source, "--", "sh", "-c", "echo more > more"]);
    assert!(out.status.success());
    let expiring = checkpoint_of(&home, me, &source, &["--ttl", "1s"]);
    let dir = walk(home.path())
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "tar"))
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
    let plant = |name: &str, aged: bool| {
        let path = dir.join(name);
        std::fs::write(&path, b"partial").unwrap();
        if aged {
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        path
    };
    // What a crash leaves: the local store's staging file of an object (old: taken; under
    // way: kept), an archive without its record, a record without its archive.
    let staged = format!("ws-{}.tar#1", "cd".repeat(32));
    let orphan_staging = plant(&staged, true);
    let fresh_staging = plant(&format!("ws-{}.tar#2", "ef".repeat(32)), false);
    let lone = format!("ws-{}", "ab".repeat(32));
    let lone_tar = plant(&format!("{lone}.tar"), true);
    let bare = format!("ws-{}", "12".repeat(32));
    let bare_record = plant(&format!("{bare}.json"), true);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (code, doc) = home.json_as(me, &["gc"]);
    assert_eq!(code, 0, "{doc}");
    let collected: Vec<&str> = doc["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(collected.len(), 4, "{doc}");
    for name in [expiring["id"].as_str().unwrap(), &lone, &bare] {
        assert!(collected.contains(&name), "{name}: {doc}");
    }
    assert!(collected.iter().any(|c| c.ends_with(&staged)), "{doc}");
    // A checkpoint store that cannot be asked stops nothing else: said, exit 10.
    let out = home
        .command(me, &["gc"])
        .env("BERTH_ARTIFACTS_URL", "s3://artifacts/nowhere")
        .env("BERTH_ARTIFACTS_KEY_ID_VAR", "BERTH_TEST_NO_SUCH_VARIABLE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(10), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("checkpoints: not collected (auth)"),
        "{}",
        text(&out.stdout)
    );
    assert!(!orphan_staging.exists() && !lone_tar.exists() && !bare_record.exists());
    assert!(fresh_staging.exists(), "a write under way is never taken");
    let (_, listed) = home.json_as(me, &["checkpoints"]);
    let ids: Vec<&Value> = listed["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["id"])
        .collect();
    assert_eq!(ids, vec![&kept["id"]], "{listed}");
}

/// Checkpoints in an S3-compatible bucket are another machine's too: taken from one Berth home,
/// listed and restored from another; what else writes the bucket is untrusted (an archive
/// replaced, a record too large: refused, nothing made); expiry collected there too.
#[test]
fn checkpoints_in_s3_are_restored_from_another_home() {
    let Some((env, objects)) = common::s3_env("moving") else {
        return;
    };
    let run = |home: &Home, args: &[&str]| -> (i32, Value, String) {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let out = home
            .command("keeper", &full)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        let doc = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code().unwrap(), doc, text(&out.stderr))
    };
    let here = Home::new();
    let there = Home::new();
    let source = populated(&here, "keeper", "host");
    let expected = describe(&here, "keeper", &source).replace("pipe-here", "no-pipe");
    let (code, doc, said) = run(&here, &["checkpoint", &source]);
    assert_eq!(code, 0, "{said}");
    let id = doc["checkpoint"]["id"].as_str().unwrap().to_owned();
    // Nothing of it on this machine's disk: it is in the bucket.
    assert!(!walk(here.path())
        .iter()
        .any(|p| p.to_string_lossy().contains(&id)));

    let (_, listed, said) = run(&there, &["checkpoints"]);
    assert_eq!(listed["checkpoints"][0]["id"], id.as_str(), "{said}");
    let (code, doc, said) = run(&there, &["restore", &id, "-p", "host"]);
    assert_eq!(code, 0, "{said}");
    let sandbox = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    assert_eq!(describe(&there, "keeper", &sandbox), expected);

    // Whoever else writes the bucket: a replaced archive, an oversized record.
    let keys = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(objects.keys("checkpoints"))
        .unwrap();
    let tar_key = keys.iter().find(|k| k.ends_with(".tar")).unwrap().clone();
    let record_key = keys.iter().find(|k| k.ends_with(".json")).unwrap().clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(objects.put_overwrite(&tar_key, vec![b'x'; 4096].into()))
        .unwrap();
    let before = open_rows(&there, "keeper");
    let (code, doc, _) = run(&there, &["restore", &id, "-p", "host"]);
    assert_eq!(code, 5, "{doc}");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("archive is refused"),
        "{doc}"
    );
    rt.block_on(objects.put_overwrite(&record_key, vec![b' '; 2 << 20].into()))
        .unwrap();
    let (code, doc, _) = run(&there, &["restore", &id, "-p", "host"]);
    assert_eq!(code, 5, "{doc}");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("more than the"),
        "{doc}"
    );
    assert_eq!(open_rows(&there, "keeper"), before);

    // Expiry is collected in the bucket too.
    let out = here.run_as(
        "keeper",
        &["exec", &source, "--", "sh", "-c", "echo more > more"],
    );
    assert!(out.status.success());
    let (code, doc, said) = run(&here, &["checkpoint", &source, "--ttl", "1s"]);
    assert_eq!(code, 0, "{said}");
    let expiring = doc["checkpoint"]["id"].as_str().unwrap().to_owned();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (code, doc, said) = run(&there, &["gc"]);
    assert_eq!(code, 0, "{said}");
    assert!(doc["checkpoints"].to_string().contains(&expiring), "{doc}");
    let (code, _, said) = run(&here, &["destroy", &id]);
    assert_eq!(code, 0, "{said}");
    let left = rt.block_on(objects.keys("checkpoints")).unwrap();
    assert!(left.is_empty(), "{left:?}");
}
