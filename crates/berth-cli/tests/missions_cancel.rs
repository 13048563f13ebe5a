//! `berth mission cancel`: a mission nobody will resume is ended where it stands and its
//! sandboxes removed — they were held for a resume that would never come.

use serde_json::Value;
mod missions_support;

use missions_support::*;

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_cancelled_mission_ends_where_it_stands_and_leaves_no_sandbox() {
    let home = home();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let agent = format!("echo $$ > {}/agent\nexec sleep 300\n", marks.display());
    let file = write_mission(dir.path(), &agent, "true", "30s", "\"README\"", 2);
    let (mut runner, pids) = run_until_marked(home.path(), &file, &marks, &["agent"]);
    let id = only_mission(home.path());

    // A run drives it: cancelling is refused (exit 8) and changes nothing.
    let refused = run(home.path(), &["mission", "cancel", &id]);
    assert_eq!(refused.status.code(), Some(8), "{}", text(&refused));
    assert!(text(&refused).contains("Ctrl-C"), "{}", text(&refused));
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(doc["mission"]["state"]["state"], "running", "{doc}");

    // The run is stopped; its sandbox stays held for a resume.
    kill_runner(&mut runner);
    assert!(berth_testkit::wait_all_gone(
        &pids,
        std::time::Duration::from_secs(5)
    ));
    let (_, open) = json(home.path(), &["ledger", "list"]);
    assert_eq!(sandbox_rows(&open).len(), 1, "{open}");

    // A reason that is not one line of text is refused before anything changes.
    let bad = run(
        home.path(),
        &["mission", "cancel", &id, "--reason", "a\u{1b}[2Jb"],
    );
    assert_eq!(bad.status.code(), Some(5), "{}", text(&bad));

    let (code, cancelled) = json(
        home.path(),
        &["mission", "cancel", &id, "--reason", "wrong base commit"],
    );
    assert_eq!(code, 0, "{cancelled}");
    assert_eq!(cancelled["state"]["state"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["state"]["reason"], "wrong base commit");
    assert_eq!(cancelled["sandboxes"]["verified_gone"], 1, "{cancelled}");
    assert_eq!(cancelled["sandboxes"]["not_removed"], Value::Array(vec![]));

    // Nothing held, nothing on disk; the attempt got no verdict.
    let (_, open) = json(home.path(), &["ledger", "list"]);
    assert_eq!(sandbox_rows(&open).len(), 0, "{open}");
    let dir = home.path().join("state/host/sandboxes");
    assert_eq!(std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0), 0);
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(doc["mission"]["state"]["state"], "cancelled", "{doc}");
    let attempts = doc["mission"]["tasks"][0]["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        1,
        "no attempt was started after the cancel: {doc}"
    );
    assert_eq!(attempts[0]["status"]["status"], "in_progress", "{doc}");
    let (_, listed) = json(home.path(), &["mission", "list"]);
    assert_eq!(listed["missions"][0]["state"], "cancelled", "{listed}");
    let said = run(home.path(), &["mission", "status", &id]);
    assert!(
        text(&said).contains("CANCELLED (wrong base commit)"),
        "{}",
        text(&said)
    );

    // Terminal: a resume runs nothing, a second cancel is refused.
    let resumed = run(home.path(), &["mission", "resume", &id]);
    assert_eq!(resumed.status.code(), Some(8), "{}", text(&resumed));
    assert!(text(&resumed).contains("CANCELLED"), "{}", text(&resumed));
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(
        doc["mission"]["tasks"][0]["attempts"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "{doc}"
    );
    // Cancelling again changes nothing and keeps the first reason.
    let (code, again) = json(
        home.path(),
        &["mission", "cancel", &id, "--reason", "other"],
    );
    assert_eq!(code, 0, "{again}");
    assert_eq!(again["state"]["reason"], "wrong base commit", "{again}");
    let unknown = run(home.path(), &["mission", "cancel", "ms-nope"]);
    assert_eq!(unknown.status.code(), Some(3), "{}", text(&unknown));
}

/// A cancel killed between its event and the teardown leaves a cancelled mission whose
/// sandbox is still there; the next cancel (as any sweep) removes it.
#[test]
fn a_cancel_cut_short_is_finished_by_the_next() {
    let home = home();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let agent = format!("echo $$ > {}/agent\nexec sleep 300\n", marks.display());
    let file = write_mission(dir.path(), &agent, "true", "30s", "\"README\"", 1);
    let (mut runner, _) = run_until_marked(home.path(), &file, &marks, &["agent"]);
    kill_runner(&mut runner);
    let id = only_mission(home.path());
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    let cancel_event = doc["events"].as_i64().unwrap() + 1;
    let killed = berth(home.path(), &["mission", "cancel", &id])
        .env("BERTH_FAULT", format!("kill-after-event:{cancel_event}"))
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(killed.status.signal(), Some(9), "{}", text(&killed));
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(doc["mission"]["state"]["state"], "cancelled", "{doc}");
    let (_, open) = json(home.path(), &["ledger", "list"]);
    assert_eq!(
        sandbox_rows(&open).len(),
        1,
        "the kill came before the teardown: {open}"
    );
    let (code, again) = json(home.path(), &["mission", "cancel", &id]);
    assert_eq!(code, 0, "{again}");
    assert_eq!(again["sandboxes"]["verified_gone"], 1, "{again}");
    let (_, open) = json(home.path(), &["ledger", "list"]);
    assert_eq!(sandbox_rows(&open).len(), 0, "{open}");
}

/// With `keep`, an accepted attempt's sandbox outlives the cancel, named as kept; the attempt
/// in progress loses its own.
#[test]
fn a_cancel_keeps_what_the_mission_file_keeps() {
    let home = home();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    // The first task's agent is done at once; the second's works until it is stopped.
    let agent = format!(
        "if [ -e {m}/first ]; then echo $$ > {m}/agent; exec sleep 300; fi\ntouch {m}/first\n",
        m = marks.display()
    );
    let file = write_mission(dir.path(), &agent, "true", "30s", "\"README\"", 1);
    let text_of = std::fs::read_to_string(&file).unwrap();
    let second = text_of[text_of.find("[[tasks]]").unwrap()..].replace("id = \"t\"", "id = \"t2\"");
    let mission = format!("{text_of}\n{second}")
        .replace("provider = \"host\"", "provider = \"host\"\nkeep = true");
    std::fs::write(&file, mission).unwrap();
    let (mut runner, _) = run_until_marked(home.path(), &file, &marks, &["agent"]);
    kill_runner(&mut runner);
    let id = only_mission(home.path());
    let (_, doc) = json(home.path(), &["mission", "status", &id]);
    assert_eq!(
        doc["mission"]["tasks"][0]["state"]["state"], "done",
        "{doc}"
    );
    let (code, cancelled) = json(home.path(), &["mission", "cancel", &id]);
    assert_eq!(code, 0, "{cancelled}");
    let kept = cancelled["sandboxes"]["kept"].as_array().unwrap();
    assert_eq!(kept.len(), 1, "{cancelled}");
    let first = doc["mission"]["tasks"][0]["attempts"][0]["key"]
        .as_str()
        .unwrap()
        .trim_start_matches("at-");
    assert_eq!(kept[0], format!("bx-{first}"), "{cancelled}");
    assert_eq!(cancelled["sandboxes"]["not_removed"], Value::Array(vec![]));
    let (_, open) = json(home.path(), &["ledger", "list"]);
    let open = sandbox_rows(&open);
    assert_eq!(open.len(), 1, "only the kept one is open: {open:?}");
    let out = run(home.path(), &["destroy", kept[0].as_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    drop_checkpoints(home.path());
}
