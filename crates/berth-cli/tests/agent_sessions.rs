//! Agent sessions (`berth prompt --resume as-…`): a real agent CLI's conversation kept by Berth
//! and continued in another sandbox, on another provider, after `berth move`.
//!
//! The proof is the scripted model: it answers the step at (tool results + turns already
//! answered) of the conversation it is sent, so a CLI that carried the first turn's history
//! runs the second turn's command (`two.txt`), and one that did not starts over (`one.txt`).
//! The docker sandboxes come from `berth/agent-clis:bookworm` (the gateway through the
//! supervisor's loopback forward); host runs use `agents/node_modules/.bin`. Missing CLIs or
//! image fail the tests unless `BERTH_SKIP_AGENT_CLIS=1` says to skip them.

mod common;

use std::path::{Path, PathBuf};

use common::{agent_image, Home, AGENT_IMAGE, CANARY};
use serde_json::Value;

/// Two turns, each a command and a final answer.
const TWO_TURNS: &str = r#"schema_version = 1
[[step]]
shell = "printf one > one.txt"
[[step]]
text = "Done: one"
[[step]]
shell = "printf two > two.txt"
[[step]]
text = "Done: two"
"#;

fn script(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("model.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `berth --json prompt …` as `owner`, with the scripted model's keys as canaries.
fn prompt_command(home: &Home, owner: &str, bin: &Path, args: &[&str]) -> std::process::Command {
    let mut full = vec!["--json", "prompt"];
    full.extend_from_slice(args);
    let mut command = home.command(owner, &full);
    command
        .env("BERTH_AGENT_BIN_DIR", bin)
        .env("OPENAI_API_KEY", CANARY)
        .env("ANTHROPIC_API_KEY", CANARY);
    command
}

/// A finished `berth --json prompt`: exit code, the final document, everything it printed.
fn finished(out: std::process::Output) -> (i32, Value, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), last, stdout + &stderr)
}

/// `berth --json prompt …` as `owner`: exit code and the final document.
fn prompt(home: &Home, owner: &str, bin: &Path, args: &[&str]) -> (i32, Value, String) {
    finished(prompt_command(home, owner, bin, args).output().unwrap())
}

/// Session `id` as `berth sessions` lists it.
fn listed_session(home: &Home, id: &str) -> Value {
    let (code, listed) = home.json(&["sessions"]);
    assert_eq!(code, 0, "{listed}");
    listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("{id} not listed: {listed}"))
        .clone()
}

/// The workspace's names, and that nothing of the agent's home is left beside it.
fn workspace(home: &Home, id: &str) -> String {
    let out = home.sh(
        id,
        "ls -A; for h in ../.berth-agent*; do [ ! -e \"$h\" ] || echo HOME-LEFT; done",
    );
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    common::text(&out.stdout)
}

#[test]
fn an_agent_session_goes_on_in_another_sandbox_on_another_provider() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    if !agent_image() {
        return;
    }
    let home = Home::new();
    let model = script(home.path(), TWO_TURNS);
    let model = model.to_str().unwrap();
    for harness in ["codex", "claude-code", "opencode"] {
        let id = home.create("tester");
        let (code, first, all) = prompt(
            &home,
            "tester",
            &bin,
            &[&id, "--harness", harness, "--script", model, "make one"],
        );
        assert_eq!(code, 0, "{harness}: {all}");
        let session = first["session"].as_str().unwrap_or_else(|| panic!("{all}"));
        assert!(session.starts_with("as-"), "{first}");
        assert_eq!(first["turn"], 1, "{first}");
        assert_eq!(workspace(&home, &id), "one.txt\n", "{harness}");

        // The workspace to docker; the conversation goes on there.
        let (code, moved) = home.json(&["move", &id, "--to", "docker", "--image", AGENT_IMAGE]);
        assert_eq!(code, 0, "{moved}");
        let target = moved["move"]["target"]["berth_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let (code, second, all) = prompt(
            &home,
            "tester",
            &bin,
            &[&target, "--resume", session, "--script", model, "make two"],
        );
        assert_eq!(code, 0, "{harness}: {all}");
        assert_eq!(second["session"], session, "{second}");
        assert_eq!(second["turn"], 2, "{second}");
        assert!(second["forked_from"].is_null(), "{second}");
        assert_eq!(
            second["session_id"], first["session_id"],
            "{harness}: the CLI went on with its own conversation"
        );
        // The second turn's command ran (the history was carried); the staged archive and the
        // agent's home are gone.
        assert_eq!(workspace(&home, &target), "one.txt\ntwo.txt\n", "{harness}");

        let kept = listed_session(&home, session);
        assert_eq!(kept["harness"], harness);
        assert_eq!(kept["turns"], 2);
        let history = kept["history"].as_array().unwrap();
        assert_eq!(history[0]["provider"], "host");
        assert_eq!(history[1]["provider"], "docker");
        assert_eq!(history[1]["sandbox"], target.as_str());
        assert!(home.run(&["destroy", &target]).status.success());
    }

    // The control: the same script without --resume starts over.
    let fresh = home.create("tester");
    let (code, doc, all) = prompt(
        &home,
        "tester",
        &bin,
        &[&fresh, "--harness", "codex", "--script", model, "again"],
    );
    assert_eq!(code, 0, "{all}");
    assert_eq!(doc["turn"], 1);
    assert_eq!(workspace(&home, &fresh), "one.txt\n");
    home.assert_no_canary_persisted();

    // A deleted session is gone for good.
    let session = doc["session"].as_str().unwrap().to_owned();
    let out = home.run(&["destroy", &session]);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let (code, _, all) = prompt(
        &home,
        "tester",
        &bin,
        &[&fresh, "--resume", &session, "--script", model, "x"],
    );
    assert_eq!(code, 3, "{all}");
    assert!(all.contains("no such session"), "{all}");
}

/// What a resume cannot go on with is refused before anything runs; a session record that
/// cannot be kept leaves the session as it was; two turns of one session at once keep both.
#[test]
fn resuming_refuses_what_it_cannot_go_on_with_and_loses_no_turn() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let home = Home::new();
    let model = script(home.path(), TWO_TURNS);
    let model = model.to_str().unwrap();
    let id = home.create("tester");
    let (code, first, all) = prompt(
        &home,
        "tester",
        &bin,
        &[&id, "--harness", "codex", "--script", model, "one"],
    );
    assert_eq!(code, 0, "{all}");
    let session = first["session"].as_str().unwrap().to_owned();
    let prompts = home.path().join("state/prompts");
    let runs = || std::fs::read_dir(&prompts).unwrap().count();
    let before = runs();

    for (args, code, says) in [
        (
            vec!["--resume", "as-../../etc/passwd"],
            3,
            "not a session id",
        ),
        (vec!["--resume", "ws-0123"], 3, "not a session id"),
        (
            vec!["--resume", &session, "--harness", "claude-code"],
            5,
            "is a codex session",
        ),
    ] {
        let mut full = vec![id.as_str(), "--script", model, "x"];
        full.extend(args.iter().copied());
        let (got, _, all) = prompt(&home, "tester", &bin, &full);
        assert_eq!(got, code, "{args:?}: {all}");
        assert!(all.contains(says), "{args:?}: {all}");
    }
    // Another owner's session is no session of theirs.
    let theirs = home.create("mallory");
    let (got, _, all) = prompt(
        &home,
        "mallory",
        &bin,
        &[&theirs, "--resume", &session, "--script", model, "x"],
    );
    assert_eq!(got, 3, "{all}");
    assert_eq!(runs(), before, "nothing ran");

    // The agent's second turn makes its session record larger than Berth keeps, or plants a
    // link in it (the next run's CLI, on any provider, would write through it): the turn's
    // work stands, the session stays at turn 1, and the home is gone all the same.
    for (name, planted, says) in [
        (
            "bloat",
            "head -c 70000000 /dev/zero > \\\"$CODEX_HOME/sessions/bloat\\\"",
            "larger than 64 MiB",
        ),
        (
            "linked",
            "ln -s / \\\"$CODEX_HOME/sessions/escape\\\"",
            "symbolic link",
        ),
    ] {
        let planting = home.path().join(format!("{name}.toml"));
        std::fs::write(
            &planting,
            TWO_TURNS.replace(
                "printf two > two.txt",
                &format!("{planted}; printf two > two.txt"),
            ),
        )
        .unwrap();
        let (code, doc, all) = prompt(
            &home,
            "tester",
            &bin,
            &[
                &id,
                "--resume",
                &session,
                "--script",
                planting.to_str().unwrap(),
                "two",
            ],
        );
        assert_eq!(code, 0, "{name}: {all}");
        assert!(doc["session"].is_null(), "{name}: {doc}");
        assert!(
            doc["session_not_kept"].as_str().unwrap().contains(says),
            "{name}: {doc}"
        );
        assert_eq!(workspace(&home, &id), "one.txt\ntwo.txt\n", "{name}");
        let (_, listed) = home.json(&["sessions"]);
        assert_eq!(listed["sessions"][0]["turns"], 1, "{name}: {listed}");
    }

    // Two turns of the same session at once, in two sandboxes: one goes on, the other is kept
    // as a fork of it; neither is lost.
    let other = home.create("tester");
    let start = |sandbox: &str| {
        home.command(
            "tester",
            &[
                "--json", "prompt", sandbox, "--resume", &session, "--script", model, "two",
            ],
        )
        .env("BERTH_AGENT_BIN_DIR", &bin)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (a, b) = (start(&id), start(&other));
    let mut docs = Vec::new();
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", common::text(&out.stderr));
        let last = common::text(&out.stdout).lines().last().unwrap().to_owned();
        docs.push(serde_json::from_str::<Value>(&last).unwrap());
    }
    let advanced: Vec<&Value> = docs.iter().filter(|d| d["session"] == session).collect();
    let forked: Vec<&Value> = docs
        .iter()
        .filter(|d| d["forked_from"] == session)
        .collect();
    assert_eq!((advanced.len(), forked.len()), (1, 1), "{docs:?}");
    assert!(
        forked[0]["fork_reason"]
            .as_str()
            .unwrap()
            .contains("claimed its next turn first"),
        "{docs:?}"
    );
    let (_, listed) = home.json(&["sessions"]);
    let turns: Vec<&Value> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["turns"])
        .collect();
    assert_eq!(turns, [&Value::from(2), &Value::from(2)], "{listed}");
}

/// Sessions live in Berth's object store: with an S3-compatible bucket, a session started from
/// one Berth home (one machine) is listed and resumed from another with the same bucket and
/// owner; deleting it leaves nothing under the bucket's prefix.
#[test]
fn a_session_in_a_shared_bucket_is_resumed_from_another_berth_home() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let Some((env, objects)) = common::s3_env("sessions") else {
        return;
    };
    let (here, there) = (Home::new(), Home::new());
    let model = script(here.path(), TWO_TURNS);
    let model = model.to_str().unwrap();
    let with_bucket = |home: &Home, args: &[&str]| {
        let mut cmd = home.command("tester", args);
        cmd.env("BERTH_AGENT_BIN_DIR", &bin);
        for (name, value) in &env {
            cmd.env(name, value);
        }
        let out = cmd.output().unwrap();
        let stdout = common::text(&out.stdout);
        // One document (pretty), or events a line each with the document last.
        let last = serde_json::from_str(&stdout)
            .ok()
            .or_else(|| {
                stdout
                    .lines()
                    .last()
                    .and_then(|l| serde_json::from_str(l).ok())
            })
            .unwrap_or(Value::Null);
        (out.status.code(), last, stdout + &common::text(&out.stderr))
    };
    let id = here.create("tester");
    let (code, first, all) = with_bucket(
        &here,
        &[
            "--json",
            "prompt",
            &id,
            "--harness",
            "codex",
            "--script",
            model,
            "one",
        ],
    );
    assert_eq!(code, Some(0), "{all}");
    let session = first["session"].as_str().unwrap().to_owned();

    let elsewhere = there.create("tester");
    let (code, listed, all) = with_bucket(&there, &["--json", "sessions"]);
    assert_eq!(code, Some(0), "{all}");
    assert_eq!(listed["sessions"][0]["id"], session.as_str(), "{listed}");
    let (code, second, all) = with_bucket(
        &there,
        &[
            "--json", "prompt", &elsewhere, "--resume", &session, "--script", model, "two",
        ],
    );
    assert_eq!(code, Some(0), "{all}");
    assert_eq!(
        (second["session"].as_str(), second["turn"].as_u64()),
        (Some(session.as_str()), Some(2))
    );
    assert_eq!(workspace(&there, &elsewhere), "two.txt\n");

    // The turn's claim is create-only in the bucket too: a second writer of it is refused.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stored = rt.block_on(objects.listed("sessions")).unwrap();
    let claim = stored
        .iter()
        .map(|(key, _)| key)
        .find(|key| key.ends_with(".turn-00000002.claim"))
        .unwrap_or_else(|| panic!("{stored:?}"));
    assert!(!rt
        .block_on(objects.create_new(claim, b"another writer".to_vec().into()))
        .unwrap());

    let (code, _, all) = with_bucket(&here, &["destroy", &session]);
    assert_eq!(code, Some(0), "{all}");
    let left = rt.block_on(objects.listed("sessions")).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// `berth bench resume`: the resumed turn checked to go on with its conversation, both figures,
/// nothing left (no sandbox, no session).
#[test]
fn the_resume_benchmark_reports_its_ratio_and_leaves_nothing() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let home = Home::new();
    let out = home
        .command(
            "bencher",
            &["--json", "bench", "resume", "host", "--iterations", "2"],
        )
        .env("BERTH_AGENT_BIN_DIR", &bin)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["harness"], "codex", "{doc}");
    assert_eq!(doc["turn"]["berth"]["n"], 2, "{doc}");
    assert_eq!(doc["turn"]["raw"]["n"], 2, "{doc}");
    let ratio = doc["turn"]["ratio_median"].as_f64().unwrap();
    assert!(ratio.is_finite() && ratio > 0.0, "{doc}");
    assert!(
        doc["baseline"]
            .as_str()
            .unwrap()
            .contains("without the session"),
        "{doc}"
    );
    assert!(doc["target"].is_null(), "{doc}");
    let (_, open) = home.json_as("bencher", &["ledger", "list"]);
    assert_eq!(open["entries"], Value::Array(vec![]), "{open}");
    let (_, sessions) = home.json_as("bencher", &["sessions"]);
    assert_eq!(sessions["sessions"], Value::Array(vec![]), "{sessions}");
    let out = home.run_as("bencher", &["bench", "resume", "host", "cursor"]);
    assert_eq!(out.status.code(), Some(5), "{}", common::text(&out.stderr));
}

/// A mission attempt's conversation becomes an agent session (`berth attempt session KEY`) and
/// goes on in another sandbox: the CLI that ran the attempt is asked again, with its history.
#[test]
fn a_mission_attempts_conversation_goes_on_as_an_agent_session() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let home = Home::new();
    let dir = home.path().join("m");
    std::fs::create_dir_all(dir.join("repo")).unwrap();
    std::fs::write(dir.join("repo/a.txt"), "a\n").unwrap();
    script(&dir, TWO_TURNS);
    std::fs::write(
        dir.join("mission.toml"),
        r#"schema_version = 1
name = "attempt-to-session"
[repository]
path = "repo"
base = "snapshot"
[sandbox]
provider = "host"
[harness]
kind = "codex"
model = "scripted"
[harness.gateway]
script = "model.toml"
[[tasks]]
id = "one"
instructions = "Write one.txt"
max_attempts = 1
agent_timeout = "120s"
[tasks.validator]
command = "test -f one.txt && mkdir -p .berth && echo pass > .berth/verdict"
timeout = "30s"
evidence = [".berth/verdict"]
"#,
    )
    .unwrap();
    let run = |args: &[&str]| {
        home.command("tester", args)
            .env("BERTH_AGENT_BIN_DIR", &bin)
            .output()
            .unwrap()
    };
    let out = run(&[
        "--json",
        "mission",
        "run",
        dir.join("mission.toml").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let (_, listed) = home.json(&["mission", "list"]);
    let mission = listed["missions"][0]["id"].as_str().unwrap().to_owned();
    let (_, status) = home.json(&["mission", "status", &mission]);
    let key = status["mission"]["tasks"][0]["attempts"][0]["key"]
        .as_str()
        .unwrap_or_else(|| panic!("{status}"))
        .to_owned();

    let (code, kept) = home.json(&["attempt", "session", &key]);
    assert_eq!(code, 0, "{kept}");
    let session = kept["session"]["id"].as_str().unwrap().to_owned();
    assert_eq!(kept["session"]["harness"], "codex");
    assert!(
        kept["session"]["origin"].as_str().unwrap().contains(&key),
        "{kept}"
    );
    let sandbox = home.create("tester");
    let (code, doc, all) = prompt(
        &home,
        "tester",
        &bin,
        &[
            &sandbox,
            "--resume",
            &session,
            "--script",
            dir.join("model.toml").to_str().unwrap(),
            "two",
        ],
    );
    assert_eq!(code, 0, "{all}");
    assert_eq!(
        (doc["session"].as_str(), doc["turn"].as_u64()),
        (Some(session.as_str()), Some(2))
    );
    assert_eq!(workspace(&home, &sandbox), "two.txt\n");

    let (code, missing) = home.json(&["attempt", "session", "at-0000"]);
    assert_eq!(code, 3, "{missing}");
}

/// SIGKILL while a turn's session is being kept, after each durable step: the session stays
/// readable — at its previous turn (killed once the conversation is out of the sandbox, once
/// the agent's home is gone, after the claim or the archive) or at the new one (after the
/// record). The next prompt in that sandbox keeps the killed turn first (the
/// conversation waited beside its logs; its claim is its own run's), then goes on after it;
/// after `berth gc`, no archive is left that no record names.
#[test]
fn a_prompt_killed_while_saving_its_session_loses_no_turn() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let home = Home::new();
    let mut many = String::from("schema_version = 1\n");
    for n in 1..=8 {
        many.push_str(&format!(
            "[[step]]\nshell = \"printf {n} > {n}.txt\"\n[[step]]\ntext = \"Done: {n}\"\n"
        ));
    }
    let model = script(home.path(), &many);
    let model = model.to_str().unwrap();
    let sessions_dir = home.path().join("artifacts/sessions");
    let age_everything = || {
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        for path in common::walk(&sessions_dir) {
            if path.is_file() {
                std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_modified(old)
                    .unwrap();
            }
        }
    };
    for step in ["taken", "home-removed", "claimed", "archived", "recorded"] {
        let id = home.create("tester");
        let (code, first, all) = prompt(
            &home,
            "tester",
            &bin,
            &[&id, "--harness", "codex", "--script", model, "one"],
        );
        assert_eq!(code, 0, "{all}");
        let session = first["session"].as_str().unwrap().to_owned();
        let out = home
            .command(
                "tester",
                &[
                    "--json", "prompt", &id, "--resume", &session, "--script", model, "two",
                ],
            )
            .env("BERTH_AGENT_BIN_DIR", &bin)
            .env("BERTH_FAULT", format!("kill-in-session:{step}"))
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(9), "{step}: {out:?}");

        let kept = listed_session(&home, &session);
        let saved = step == "recorded";
        assert_eq!(kept["turns"], if saved { 2 } else { 1 }, "{step}: {kept}");

        // The next prompt here keeps the killed turn first (or finds it kept, after the
        // record), and goes on after it.
        let (code, next, all) = prompt(
            &home,
            "tester",
            &bin,
            &[&id, "--resume", &session, "--script", model, "three"],
        );
        assert_eq!(code, 0, "{step}: {all}");
        let recovered = if saved {
            format!("its turn was kept in {session} before the kill")
        } else {
            format!("its turn is kept as {session} (turn 2)")
        };
        assert!(all.contains(&recovered), "{step}: {all}");
        assert_eq!(
            (next["session"].as_str(), next["turn"].as_u64()),
            (Some(session.as_str()), Some(3)),
            "{step}: {next}"
        );
        let turn2 = &listed_session(&home, &session)["history"][1];
        assert_eq!(
            turn2["rejected"]
                .as_str()
                .is_some_and(|r| r.starts_with("interrupted")),
            !saved,
            "{step}: {turn2}"
        );

        // Once old, gc takes what the kill left; the session goes on again.
        age_everything();
        let out = home.run_as("tester", &["gc"]);
        assert!(
            out.status.success(),
            "{step}: {}",
            common::text(&out.stderr)
        );
        let (code, again, all) = prompt(
            &home,
            "tester",
            &bin,
            &[&id, "--resume", &session, "--script", model, "four"],
        );
        assert_eq!(code, 0, "{step}: {all}");
        assert_eq!(again["session"], session.as_str(), "{step}: {again}");
        assert_eq!(again["turn"], 4, "{step}: {again}");
    }
    // Every archive left is one a record names.
    age_everything();
    let out = home.run_as("tester", &["gc"]);
    assert!(out.status.success());
    let (_, listed) = home.json(&["sessions"]);
    let records = listed["sessions"].as_array().unwrap().len();
    let archives = common::walk(&sessions_dir)
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "tar"))
        .count();
    assert_eq!(archives, records, "{listed}");
}

/// `berth-gw-` and the hex of a gateway token (48 digits; 32 are enough to be one).
fn holds_gateway_token(bytes: &[u8]) -> bool {
    let prefix = b"berth-gw-";
    bytes
        .windows(prefix.len() + 32)
        .any(|w| w.starts_with(prefix) && w[prefix.len()..].iter().all(u8::is_ascii_hexdigit))
}

/// A hostile agent prints the run's gateway token (its tool reads it from the agent CLI's
/// environment) into its conversation. The token is in nothing Berth keeps or prints — the
/// events on stdout, the prompt's logs, the session record — where the masks are (the agent
/// did print it), and the masked conversation still goes on. Before, the logs, stdout and the
/// session archive in the store held it whole.
#[test]
fn what_an_agent_prints_of_its_token_is_masked_in_everything_kept() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let home = Home::new();
    let model = script(
        home.path(),
        r#"schema_version = 1
[[step]]
shell = "for p in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$p\"; done 2>/dev/null | grep -m1 -o 'BERTH_GATEWAY_TOKEN=.*'"
[[step]]
text = "Done: leaked"
[[step]]
shell = "printf two > two.txt"
[[step]]
text = "Done: two"
"#,
    );
    let model = model.to_str().unwrap();
    for harness in ["codex", "claude-code", "opencode"] {
        let id = home.create("tester");
        let (code, first, all) = prompt(
            &home,
            "tester",
            &bin,
            &[&id, "--harness", harness, "--script", model, "print it"],
        );
        assert_eq!(code, 0, "{harness}: {all}");
        assert!(!holds_gateway_token(all.as_bytes()), "{harness}: {all}");
        // The agent did print it: masked where it was.
        assert!(
            all.contains("BERTH_GATEWAY_TOKEN=berth-gw-***")
                || all.contains("BERTH_GATEWAY_TOKEN=*********"),
            "{harness}: the tool's output is not in the events: {all}"
        );
        let session = first["session"].as_str().unwrap_or_else(|| panic!("{all}"));
        let kept = listed_session(&home, session);
        let notes = kept["not_carried"].to_string();
        assert!(notes.contains("masked"), "{harness}: {kept}");

        // The masked conversation goes on.
        let (code, second, all) = prompt(
            &home,
            "tester",
            &bin,
            &[&id, "--resume", session, "--script", model, "go on"],
        );
        assert_eq!(code, 0, "{harness}: {all}");
        assert_eq!(second["turn"], 2, "{second}");
        assert_eq!(second["session_id"], first["session_id"], "{harness}");
        assert_eq!(workspace(&home, &id), "two.txt\n", "{harness}");
        assert!(home.run(&["destroy", &id]).status.success());
    }
    for entry in common::walk(home.path()) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !holds_gateway_token(&bytes),
            "a gateway token is in {}",
            entry.display()
        );
    }
}

/// Two prompts at once in one sandbox: each run has its own agent home, so neither wipes the
/// other's at its start nor takes it as its own session record at its end. Both turns are kept
/// as two sessions, each the conversation its CLI named, and each goes on. Before, the second
/// run's start removed the first's home: the first ended with "the agent CLI left no session
/// record" (or kept the other's conversation).
#[test]
fn two_prompts_at_once_in_one_sandbox_keep_their_own_sessions() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let home = Home::new();
    let model = script(
        home.path(),
        r#"schema_version = 1
[[step]]
shell = "sleep 3"
[[step]]
text = "Done: slept"
[[step]]
shell = "true"
[[step]]
text = "Done: again"
"#,
    );
    let model = model.to_str().unwrap();
    let id = home.create("tester");
    let one = common::RunningCli::from(
        prompt_command(
            &home,
            "tester",
            &bin,
            &[&id, "--harness", "codex", "--script", model, "one"],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap(),
    );
    // The second starts while the first's agent runs its command.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let second = prompt(
        &home,
        "tester",
        &bin,
        &[&id, "--harness", "codex", "--script", model, "two"],
    );
    let first = finished(one.wait_with_output().unwrap());
    let mut sessions = Vec::new();
    for (code, doc, all) in [first, second] {
        assert_eq!(code, 0, "{all}");
        assert!(doc["session_not_kept"].is_null(), "{doc}");
        sessions.push((
            doc["session"].as_str().unwrap().to_owned(),
            doc["session_id"].as_str().unwrap().to_owned(),
        ));
    }
    assert_ne!(sessions[0].1, sessions[1].1, "two conversations");
    for (session, cli_session) in &sessions {
        let (code, doc, all) = prompt(
            &home,
            "tester",
            &bin,
            &[&id, "--resume", session, "--script", model, "go on"],
        );
        assert_eq!(code, 0, "{all}");
        assert_eq!(doc["turn"], 2, "{doc}");
        assert_eq!(
            doc["session_id"].as_str(),
            Some(cli_session.as_str()),
            "{doc}"
        );
    }
    assert_eq!(workspace(&home, &id), "");
}

/// A session archive staged by a run killed before it started is removed by a later run in
/// the same directory once ten minutes old; a fresh one (a run starting now) stays. Before, it
/// stayed in the workspace for good (and went with it into captures and moves).
#[test]
fn a_staged_archive_a_killed_run_left_is_cleared_once_old() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let home = Home::new();
    let model = script(home.path(), TWO_TURNS);
    let id = home.create("tester");
    let planted = home.sh(
        &id,
        "printf x > .berth-session-1-old.tar && touch -d '@1000000000' .berth-session-1-old.tar \
         && printf y > .berth-session-2-new.tar",
    );
    assert!(
        planted.status.success(),
        "{}",
        common::text(&planted.stderr)
    );
    let (code, _, all) = prompt(
        &home,
        "tester",
        &bin,
        &[
            &id,
            "--harness",
            "codex",
            "--script",
            model.to_str().unwrap(),
            "make one",
        ],
    );
    assert_eq!(code, 0, "{all}");
    assert_eq!(workspace(&home, &id), ".berth-session-2-new.tar\none.txt\n");
}

/// `berth prompt` interrupted (SIGINT) while its agent runs a long command: the agent is
/// stopped, and the turn so far is kept — the session, its turn marked interrupted, the exit
/// not fabricated — so the conversation goes on with `--resume`. Exit 130. Before, the signal
/// ended `berth` at once and the conversation of that run was lost (its home left behind).
#[test]
fn an_interrupted_prompt_keeps_its_turn_and_goes_on() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let home = Home::new();
    let model = script(
        home.path(),
        r#"schema_version = 1
[[step]]
shell = "sleep 60"
[[step]]
shell = "printf two > two.txt"
[[step]]
text = "Done: two"
"#,
    );
    let model = model.to_str().unwrap();
    let id = home.create("tester");
    let started = std::time::Instant::now();
    let (mut running, lines, mut printed) = prompt_in_a_command(
        &home,
        &bin,
        &[&id, "--harness", "codex", "--script", model, "wait"],
    );
    // The agent is in its command: interrupt berth as a terminal's Ctrl-C would.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(running.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    for line in lines {
        printed.push_str(&line.unwrap());
        printed.push('\n');
    }
    let status = running.wait().unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(45),
        "{printed}"
    );
    assert_eq!(status.code(), Some(130), "{printed}");
    let last: Value = serde_json::from_str(printed.lines().last().unwrap()).unwrap();
    assert_eq!(last["kind"], "prompt_finished", "{printed}");
    assert_eq!(last["exit"]["status"], "unknown", "{last}");
    assert!(
        last["rejected"]
            .as_str()
            .unwrap_or_default()
            .starts_with("interrupted"),
        "{last}"
    );
    let session = last["session"]
        .as_str()
        .unwrap_or_else(|| panic!("{printed}"));
    assert_eq!(last["turn"], 1, "{last}");
    assert_eq!(workspace(&home, &id), "", "the agent's home was collected");

    let (code, next, all) = prompt(
        &home,
        "tester",
        &bin,
        &[&id, "--resume", session, "--script", model, "go on"],
    );
    assert!(code == 0 || code == 12, "{all}");
    assert_eq!(next["session"], session, "{next}");
    assert_eq!(next["turn"], 2, "{next}");
    assert_eq!(next["session_id"], last["session_id"], "{next}");
}

/// A `berth --json prompt …` under way, once its agent is in its first command (half a
/// second into it): the process, the rest of its stdout, and what it printed so far.
fn prompt_in_a_command(
    home: &Home,
    bin: &Path,
    args: &[&str],
) -> (
    common::RunningCli,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    String,
) {
    use std::io::BufRead;
    let mut running = common::RunningCli::from(
        prompt_command(home, "tester", bin, args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufReader::new(running.stdout.take().unwrap()).lines();
    let mut printed = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        printed.push_str(&line);
        printed.push('\n');
        if line.contains("\"kind\":\"tool_call\"") {
            break;
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    (running, lines, printed)
}

/// SIGKILL of `berth prompt` while its agent runs (a crash, the OOM killer): the run's record,
/// written before it began, outlives it. `berth sessions` lists it as not kept yet; the next
/// `berth prompt` in that sandbox keeps its turn before its own (which follows it), and `berth
/// gc` keeps another's. The agent's home goes from the sandbox each time; a live run's record
/// is left alone.
#[test]
fn a_killed_prompts_turn_is_kept_by_the_next_prompt_and_by_gc() {
    let Some(bin) = berth_testkit::agent_cli_dir() else {
        return;
    };
    let home = Home::new();
    let finishing = script(
        home.path(),
        "schema_version = 1\n[[step]]\nshell = \"printf one > one.txt\"\n[[step]]\ntext = \"Done\"\n",
    );
    let finishing = finishing.to_str().unwrap();
    let waiting = home.path().join("waiting.toml");
    std::fs::write(
        &waiting,
        // Stateless, the model answers by the tool results already in a request; its one step
        // repeats, so every turn resumed with it is in this command.
        "schema_version = 1\n[[step]]\nshell = \"sleep 60\"\n",
    )
    .unwrap();
    let waiting = waiting.to_str().unwrap();
    let id = home.create("tester");
    let (code, first, all) = prompt(
        &home,
        "tester",
        &bin,
        &[&id, "--harness", "codex", "--script", finishing, "one"],
    );
    assert_eq!(code, 0, "{all}");
    let session = first["session"].as_str().unwrap().to_owned();
    let killed_runs = |home: &Home| {
        let (code, doc) = home.json(&["sessions"]);
        assert_eq!(code, 0, "{doc}");
        doc["killed_runs"].as_array().unwrap().clone()
    };

    let (mut running, _lines, _) = prompt_in_a_command(
        &home,
        &bin,
        &[&id, "--resume", &session, "--script", waiting, "two"],
    );
    // While it lives, its record is no one else's to take.
    let (_, swept) = home.json(&["gc"]);
    assert_eq!(swept["prompts"], serde_json::json!([]), "{swept}");
    assert_eq!(killed_runs(&home), Vec::<Value>::new());
    running.kill().unwrap();
    running.wait().unwrap();
    let waiting_runs = killed_runs(&home);
    assert_eq!(waiting_runs.len(), 1, "{waiting_runs:?}");
    assert_eq!(waiting_runs[0]["sandbox"], id.as_str());
    assert_eq!(waiting_runs[0]["resumed"], session.as_str());
    assert!(workspace(&home, &id).contains("HOME-LEFT"));

    // The next prompt here keeps the killed turn first, then goes on after it.
    let (code, next, all) = prompt(
        &home,
        "tester",
        &bin,
        &[&id, "--resume", &session, "--script", finishing, "three"],
    );
    // 12: its model's step is text alone (the conversation holds a tool result already).
    assert!(code == 0 || code == 12, "{all}");
    assert!(
        all.contains(&format!("its turn is kept as {session} (turn 2)")),
        "{all}"
    );
    assert_eq!(next["session"], session.as_str(), "{next}");
    assert_eq!(next["turn"], 3, "{next}");
    assert_eq!(next["session_id"], first["session_id"], "{next}");
    let kept = listed_session(&home, &session);
    let turn2 = &kept["history"][1];
    assert_eq!(turn2["turn"], 2, "{kept}");
    assert!(
        turn2["rejected"]
            .as_str()
            .unwrap_or_default()
            .starts_with("interrupted: the berth process running this turn was killed"),
        "{kept}"
    );
    assert!(
        turn2["exit"].as_str().unwrap().starts_with("unknown"),
        "{kept}"
    );
    assert_eq!(turn2["tool_calls"], 1, "{kept}");
    assert_eq!(killed_runs(&home), Vec::<Value>::new());
    let left = workspace(&home, &id);
    assert!(
        !left.contains("HOME-LEFT") && !left.contains(".berth-session-"),
        "{left}"
    );

    // Killed again, `berth gc` keeps the turn.
    let (mut running, _lines, _) = prompt_in_a_command(
        &home,
        &bin,
        &[&id, "--resume", &session, "--script", waiting, "four"],
    );
    running.kill().unwrap();
    running.wait().unwrap();
    let (code, swept) = home.json(&["gc"]);
    assert_eq!(code, 0, "{swept}");
    let prompts = swept["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 1, "{swept}");
    assert_eq!(prompts[0]["outcome"], "kept", "{swept}");
    assert_eq!(prompts[0]["session"], session.as_str(), "{swept}");
    assert_eq!(prompts[0]["turn"], 4, "{swept}");
    assert_eq!(listed_session(&home, &session)["turns"], 4);
    assert_eq!(killed_runs(&home), Vec::<Value>::new());
    assert!(!workspace(&home, &id).contains("HOME-LEFT"));

    // Killed, then its logs removed: which conversation its CLI was in is unknown (its events
    // named it), so nothing is kept — said so, and the agent's home goes all the same.
    let (mut running, _lines, _) = prompt_in_a_command(
        &home,
        &bin,
        &[
            &id,
            "--resume",
            &session,
            "--script",
            waiting,
            "four and a half",
        ],
    );
    running.kill().unwrap();
    running.wait().unwrap();
    let newest_logs = std::fs::read_dir(home.path().join("state/prompts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(&id))
        .max()
        .unwrap();
    std::fs::remove_dir_all(newest_logs).unwrap();
    let (code, swept) = home.json(&["gc"]);
    assert_eq!(code, 0, "{swept}");
    assert_eq!(swept["prompts"][0]["outcome"], "not_kept", "{swept}");
    assert!(
        swept["prompts"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("named no session id"),
        "{swept}"
    );
    assert_eq!(listed_session(&home, &session)["turns"], 4);
    assert!(!workspace(&home, &id).contains("HOME-LEFT"));

    // Killed, then its sandbox destroyed: nothing to keep, said so; the session is as it was.
    let (mut running, _lines, _) = prompt_in_a_command(
        &home,
        &bin,
        &[&id, "--resume", &session, "--script", waiting, "five"],
    );
    running.kill().unwrap();
    running.wait().unwrap();
    let (code, destroyed) = home.json(&["destroy", &id]);
    assert_eq!(code, 0, "{destroyed}");
    // A record that is not one (garbage in Berth's state) is reported, kept, and makes the
    // collection incomplete.
    let running_dir = home.path().join("state/prompts/running");
    std::fs::write(running_dir.join("1-00000000.json"), "{ not json").unwrap();
    let (code, swept) = home.json(&["gc"]);
    assert_eq!(code, 10, "{swept}");
    let prompts = swept["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 2, "{swept}");
    assert_eq!(prompts[0]["outcome"], "waiting", "{swept}");
    assert!(
        prompts[0]["reason"]
            .as_str()
            .unwrap()
            .contains("unreadable"),
        "{swept}"
    );
    assert_eq!(prompts[1]["outcome"], "not_kept", "{swept}");
    assert!(
        prompts[1]["reason"]
            .as_str()
            .unwrap()
            .contains("sandbox is gone"),
        "{swept}"
    );
    assert_eq!(listed_session(&home, &session)["turns"], 4);
    std::fs::remove_file(running_dir.join("1-00000000.json")).unwrap();
    assert_eq!(killed_runs(&home), Vec::<Value>::new());
}
