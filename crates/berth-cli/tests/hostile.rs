//! Attacks from inside the agent's sandbox on what a mission accepts and commits (issue 9):
//! hooks the agent installs, a git that lies, tools replaced outside the workspace. Each ran
//! against the old pipeline (commit made inside the agent's sandbox, validator on a fork of it)
//! and changed the outcome; the validator now judges exactly the commit Berth builds on the
//! host, in a clean sandbox.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod missions_support;

/// `berth ARGS` as `owner` with `BERTH_HOME` = `home` (any bytes), not yet run.
fn berth_command(home: &std::ffi::OsStr, owner: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.args(args)
        .env("BERTH_HOME", home)
        .env("BERTH_OWNER", owner)
        .env_remove("BERTH_FAULT")
        .stdin(Stdio::null());
    cmd
}

fn berth(home: &Path, owner: &str, args: &[&str]) -> Output {
    berth_command(home.as_os_str(), owner, args)
        .output()
        .unwrap()
}

fn status(home: &Path, owner: &str) -> Value {
    let list = berth(home, owner, &["--json", "mission", "list"]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let id = list["missions"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no mission registered: {list}"))
        .to_owned();
    let out = berth(home, owner, &["--json", "mission", "status", &id]);
    let mut doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["id"] = Value::String(id);
    doc
}

struct Case<'a> {
    provider: &'a str,
    agent: &'a str,
    /// `[tasks.validator]` lines after `timeout`.
    validator: &'a str,
    tasks: usize,
    attempts: u32,
}

/// Writes a mission (repository `repo/` with `.agent/agent.sh`) and returns its file.
fn mission(dir: &Path, case: &Case<'_>) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir_all(repo.join(".agent")).unwrap();
    std::fs::write(repo.join("README"), "case\n").unwrap();
    std::fs::write(repo.join(".agent/agent.sh"), case.agent).unwrap();
    let image = match case.provider {
        "docker" => "image = \"berth/agent:bookworm\"\n",
        _ => "",
    };
    let mut text = format!(
        "schema_version = 1\nname = \"hostile\"\n[repository]\npath = \"repo\"\nbase = \"snapshot\"\n\
         [sandbox]\nprovider = \"{}\"\n{image}[harness]\nkind = \"script\"\ncommand = \"sh .agent/agent.sh\"\n",
        case.provider
    );
    for n in 0..case.tasks {
        text.push_str(&format!(
            "[[tasks]]\nid = \"t{n}\"\ninstructions = \"do it\"\nmax_attempts = {}\nagent_timeout = \"60s\"\n\
             [tasks.validator]\ntimeout = \"60s\"\nevidence = [\".berth-out\"]\n{}\n",
            case.attempts, case.validator
        ));
    }
    let file = dir.join("mission.toml");
    std::fs::write(&file, text).unwrap();
    file
}

/// The file `path` of the commit a task's bundle holds, read on the host with git.
fn committed_file(bundle: &Path, path: &str) -> (String, String) {
    let scratch = tempfile::tempdir().unwrap();
    let clone = scratch.path().join("c");
    let ok = Command::new("git")
        .args(["-c", "core.hooksPath=/dev/null", "clone", "-q"])
        .arg(bundle)
        .arg(&clone)
        .status()
        .unwrap();
    assert!(ok.success(), "the bundle {} clones", bundle.display());
    let head = Command::new("git")
        .arg("-C")
        .arg(&clone)
        .args(["rev-parse", "HEAD"])
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&head.stdout).trim().to_owned(),
        std::fs::read_to_string(clone.join(path)).unwrap_or_default(),
    )
}

/// Removes a docker test's checkpoints and containers when it ends, failed or not.
struct DockerCleanup<'a>(&'a Path, &'a str);

impl Drop for DockerCleanup<'_> {
    fn drop(&mut self) {
        let ledger = berth(self.0, self.1, &["--json", "ledger", "list", "--all"]);
        let ledger: Value = serde_json::from_slice(&ledger.stdout).unwrap_or_default();
        for row in ledger["entries"].as_array().into_iter().flatten() {
            if let (Some(key), true) = (row["berth_id"].as_str(), row["state"] != "verified_gone") {
                let _ = berth(self.0, self.1, &["destroy", key]);
            }
        }
    }
}

/// No container of `owner` is left (the mission verified its sandboxes gone; the
/// [`DockerCleanup`] guard deletes the checkpoints when the test ends).
fn assert_no_containers(owner: &str) {
    let left = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=berth.owner={owner}"),
        ])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "containers left behind");
}

/// Runs the mission in `file` to its end and returns its status document; panics, with both
/// outputs and the document, unless it succeeded.
fn run_to_success(home: &Path, owner: &str, file: &Path) -> Value {
    let out = berth(home, owner, &["mission", "run", file.to_str().unwrap()]);
    let doc = status(home, owner);
    assert!(
        out.status.success(),
        "{}{} {doc}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    doc
}

/// The agent installs a pre-commit hook that rewrites the validated answer, and a `git` that
/// answers `rev-parse` with a shell injection. The committed tree is the validated one and the
/// recorded commit id is the one Berth computed.
fn hook_and_lying_git(provider: &str) {
    let home = tempfile::Builder::new()
        .prefix("berth-test-hostile-")
        .tempdir()
        .unwrap();
    let owner = format!("hostile-hook-{provider}-{}", std::process::id());
    let _cleanup = DockerCleanup(home.path(), &owner);
    let wrapper = if provider == "docker" {
        // Only inside a container: a git earlier on PATH that lies about rev-parse.
        "mkdir -p /usr/local/bin\nprintf '#!/bin/sh\\nif [ \"$1\" = rev-parse ]; then echo \"HEAD; touch /workspace/INJECTED ; :\"; exit 0; fi\\nexec /usr/bin/git \"$@\"\\n' > /usr/local/bin/git\nchmod +x /usr/local/bin/git\n"
    } else {
        ""
    };
    let agent = format!(
        "echo good > answer.txt\nprintf '#!/bin/sh\\necho EVIL-UNVALIDATED > answer.txt\\n' > .git/hooks/pre-commit\nchmod +x .git/hooks/pre-commit\n{wrapper}"
    );
    let file = mission(
        home.path(),
        &Case {
            provider,
            agent: &agent,
            validator: "command = \"test ! -e ../INJECTED && test \\\"$(cat answer.txt)\\\" = good && echo ok > .berth-out\"",
            tasks: 2,
            attempts: 1,
        },
    );
    let doc = run_to_success(home.path(), &owner, &file);
    let dir = home
        .path()
        .join("missions")
        .join(doc["id"].as_str().unwrap());
    for (n, task) in doc["mission"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let recorded = task["attempts"][0]["status"]["commit"].as_str().unwrap();
        assert!(
            recorded.len() == 40 && recorded.bytes().all(|b| b.is_ascii_hexdigit()),
            "task {n}: the recorded commit is not a commit id: {recorded:?}"
        );
        let (head, answer) = committed_file(&dir.join(format!("t{n}.bundle")), "answer.txt");
        assert_eq!(
            head, recorded,
            "task {n}: the bundle holds the recorded commit"
        );
        assert_eq!(
            answer, "good\n",
            "task {n}: the committed answer is the validated one"
        );
    }
    if provider == "docker" {
        assert_no_containers(&owner);
    }
}

#[test]
fn agent_hooks_cannot_change_the_commit_on_host() {
    hook_and_lying_git("host");
}

#[test]
fn agent_hooks_and_a_lying_git_cannot_change_the_commit_on_docker() {
    if missions_support::reference_image_ready() {
        hook_and_lying_git("docker");
    }
}

/// Attempt 1 writes a wrong answer and replaces `grep` with `exit 0`, preloads a library
/// everywhere and leaves a mark outside the workspace; the validator runs in a clean sandbox
/// (after its setup command), so attempt 1 is rejected and attempt 2 (the right answer)
/// accepted.
#[test]
fn the_validator_runs_on_a_clean_system_on_docker() {
    if !missions_support::reference_image_ready() {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("berth-test-hostile-")
        .tempdir()
        .unwrap();
    let owner = format!("hostile-clean-{}", std::process::id());
    let _cleanup = DockerCleanup(home.path(), &owner);
    let agent = "if [ \"$BERTH_ATTEMPT\" = 1 ]; then\n  echo bad > answer.txt\n  printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/grep\n  echo /nonexistent/evil.so > /etc/ld.so.preload\n  touch /tmp/agent-was-here\nelse\n  echo good > answer.txt\nfi\n";
    let file = mission(
        home.path(),
        &Case {
            provider: "docker",
            agent,
            // The setup runs first in the validator's sandbox: none of the agent's system there.
            validator: "setup = \"test ! -e /tmp/agent-was-here && test ! -e /etc/ld.so.preload\"\ncommand = \"grep -qx good answer.txt && echo ok > .berth-out\"",
            tasks: 1,
            attempts: 2,
        },
    );
    let doc = run_to_success(home.path(), &owner, &file);
    let attempts = doc["mission"]["tasks"][0]["attempts"].as_array().unwrap();
    assert_eq!(
        attempts[0]["status"]["status"], "rejected",
        "the cheat was accepted: {doc}"
    );
    let reason = attempts[0]["status"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("validator exited with code 1"),
        "{reason}"
    );
    assert_eq!(attempts[1]["status"]["status"], "accepted", "{doc}");
    assert_no_containers(&owner);
}

/// A workspace that is no longer a repository, or has entries git does not store, is captured
/// or refused with a reason — never committed from the sandbox's say-so.
#[test]
fn a_workspace_without_a_repository_is_rejected_with_a_reason() {
    let home = tempfile::Builder::new()
        .prefix("berth-test-hostile-")
        .tempdir()
        .unwrap();
    let owner = "hostile-nogit";
    let file = mission(
        home.path(),
        &Case {
            provider: "host",
            agent: "rm -rf .git\necho good > answer.txt\n",
            validator: "command = \"echo ok > .berth-out\"",
            tasks: 1,
            attempts: 1,
        },
    );
    let out = berth(
        home.path(),
        owner,
        &["mission", "run", file.to_str().unwrap()],
    );
    assert!(!out.status.success());
    let doc = status(home.path(), owner);
    let reason = doc["mission"]["tasks"][0]["attempts"][0]["status"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("could not be captured"),
        "reason: {reason:?} in {doc}"
    );
}

/// A file the sandbox's own git or tar cannot read (mode 000 in a bwrap sandbox, whose user
/// has no override) is not in the capture, and the capture says so: the sandbox's warnings are
/// kept with what was left out, instead of the file vanishing from the commit unremarked.
#[test]
fn what_the_sandbox_could_not_archive_is_named_not_dropped_unremarked() {
    let home = tempfile::Builder::new()
        .prefix("berth-test-hostile-")
        .tempdir()
        .unwrap();
    let owner = "hostile-unreadable";
    let file = mission(
        home.path(),
        &Case {
            provider: "bwrap",
            agent: "echo kept > answer.txt\necho work > unreadable.txt\nchmod 000 unreadable.txt\n",
            validator: "command = \"echo ok > .berth-out\"",
            tasks: 1,
            attempts: 1,
        },
    );
    let out = berth(
        home.path(),
        owner,
        &["mission", "run", file.to_str().unwrap()],
    );
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("notes on what was left out"),
        "the progress line says something was left out: {shown}"
    );
    let doc = status(home.path(), owner);
    let capture = doc["facts"]
        .as_array()
        .unwrap_or_else(|| panic!("{doc}"))
        .iter()
        .find(|e| e["kind"] == "capture")
        .expect("a capture event");
    let skipped: Vec<&str> = capture["detail"]["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    assert!(
        skipped
            .iter()
            .any(|s| s.contains("unreadable.txt") && s.starts_with("the sandbox reported:")),
        "{capture}"
    );
    let bundle = capture["detail"]["bundle"].as_str().unwrap();
    assert_eq!(committed_file(Path::new(bundle), "answer.txt").1, "kept\n");
    assert_eq!(
        committed_file(Path::new(bundle), "unreadable.txt").1,
        "",
        "not committed"
    );
}

/// Berth's own parts of a home — `state/`, `missions/`, the store — are private.
fn berths_own_parts_are_private(home: &Path) {
    assert_eq!(mode(&home.join("state")), 0o700);
    assert_eq!(mode(&home.join("missions")), 0o700);
    assert_eq!(mode(&home.join("berth.db")), 0o600);
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `repository.path` reads only what the mission file ships with: `../…/etc` and a symlink
/// leading out are refused before anything is copied (issue 9: `/etc`, `shadow` included, was
/// staged into the sandbox and a world-readable bundle); `--allow-outside-path` lets an
/// operator name a sibling on purpose.
#[test]
fn a_mission_reads_nothing_outside_its_directory_unless_allowed() {
    let home = tempfile::Builder::new()
        .prefix("berth-test-hostile-")
        .tempdir()
        .unwrap();
    let owner = "hostile-paths";
    let dir = tempfile::tempdir().unwrap();
    let file = mission(
        dir.path(),
        &Case {
            provider: "host",
            agent: "echo good > answer.txt\n",
            validator: "command = \"echo ok > .berth-out\"",
            tasks: 1,
            attempts: 1,
        },
    );
    let text = std::fs::read_to_string(&file).unwrap();
    for (name, path) in [
        ("dotdot", "../../../../../../../../etc".to_owned()),
        ("link", "link".to_owned()),
    ] {
        std::os::unix::fs::symlink("/etc", dir.path().join("link")).ok();
        let hostile = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &hostile,
            text.replace("path = \"repo\"", &format!("path = {path:?}")),
        )
        .unwrap();
        let out = berth(
            home.path(),
            owner,
            &["mission", "run", hostile.to_str().unwrap()],
        );
        assert_eq!(
            out.status.code(),
            Some(5),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("outside the mission file's directory"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let missions = home.path().join("missions");
        let left = std::fs::read_dir(&missions).map(|d| d.count()).unwrap_or(0);
        assert_eq!(left, 0, "{name}: a refused mission left files");
    }
    // A sibling directory, named on purpose.
    let elsewhere = tempfile::tempdir().unwrap();
    let inner = elsewhere.path().join("m");
    std::fs::create_dir(&inner).unwrap();
    let sibling = inner.join("mission.toml");
    std::fs::write(
        &sibling,
        text.replace(
            "path = \"repo\"",
            &format!("path = {:?}", dir.path().join("repo")),
        ),
    )
    .unwrap();
    let out = berth(
        home.path(),
        owner,
        &["mission", "run", sibling.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(5));
    let out = berth(
        home.path(),
        owner,
        &[
            "mission",
            "run",
            "--allow-outside-path",
            sibling.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What a mission keeps is private to its owner.
    assert_eq!(
        mode(&home.path().join("missions")),
        0o700,
        "BERTH_HOME/missions"
    );
    let doc = status(home.path(), owner);
    let dir = home
        .path()
        .join("missions")
        .join(doc["id"].as_str().unwrap());
    assert_eq!(mode(&dir), 0o700, "the mission directory");
    assert_eq!(mode(&dir.join("t0.bundle")), 0o600, "the accepted bundle");
}

/// A mission never writes into the user's repository: with `base = "snapshot"` on a git
/// worktree, the user's branch gets no commit and the uncommitted file stays uncommitted.
#[test]
fn a_mission_never_commits_into_the_users_repository() {
    let home = tempfile::Builder::new()
        .prefix("berth-test-hostile-")
        .tempdir()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = mission(
        dir.path(),
        &Case {
            provider: "host",
            agent: "echo good > answer.txt\n",
            validator: "command = \"echo ok > .berth-out\"",
            tasks: 1,
            attempts: 1,
        },
    );
    let repo = dir.path().join("repo");
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["-c", "user.name=u", "-c", "user.email=u@x"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "README"]);
    git(&["commit", "-q", "-m", "user"]);
    std::fs::write(repo.join("uncommitted.txt"), "mine\n").unwrap();
    let before = (git(&["rev-parse", "HEAD"]), git(&["status", "--porcelain"]));
    run_to_success(home.path(), "hostile-worktree", &file);
    let after = (git(&["rev-parse", "HEAD"]), git(&["status", "--porcelain"]));
    assert_eq!(before, after, "the mission changed the user's repository");
}

/// What Berth keeps is private to its user: a new `BERTH_HOME` is mode 0700; in a shared
/// one (open to others, holding someone else's files) that directory is left as it is but
/// Berth's own parts — `state/`, `missions/`, the store — are made private.
#[test]
fn berth_home_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(shared.path().join("someone-elses.txt"), "x").unwrap();
    let out = berth(shared.path(), "hostile-home", &["list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        mode(shared.path()),
        0o755,
        "a directory that is not Berth's was changed"
    );
    berths_own_parts_are_private(shared.path());
    // Opened up later (by hand, a copy, a umask): made private again at the next start.
    for (path, open) in [("state", 0o755), ("missions", 0o777), ("berth.db", 0o644)] {
        std::fs::set_permissions(
            shared.path().join(path),
            std::fs::Permissions::from_mode(open),
        )
        .unwrap();
    }
    let out = berth(shared.path(), "hostile-home", &["list"]);
    assert!(out.status.success());
    assert_eq!(
        mode(shared.path()),
        0o755,
        "a shared directory was closed once Berth's store was in it"
    );
    berths_own_parts_are_private(shared.path());
    let fresh = shared.path().join("new/home");
    let out = berth(&fresh, "hostile-home", &["list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&fresh), 0o700);
}

/// The caller's environment is not Berth's to trust: a variable that is not UTF-8 is no crash
/// (it was a panic, exit 101, in every command), and a `BERTH_HOME` that is not UTF-8, or is
/// relative, still names one place — reached from any working directory (a relative home
/// made `exec` fail: the reaper was looked up from the command's own directory).
#[test]
fn odd_environments_and_relative_homes_work() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let home = tempfile::tempdir().unwrap();
    let out = berth_command(home.path().as_os_str(), "tester", &["list"])
        .env(OsStr::from_bytes(b"WEIRD"), OsStr::from_bytes(b"\xff\xfe"))
        .env(OsStr::from_bytes(b"ODD\xffNAME"), "x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let base = tempfile::tempdir().unwrap();
    let (a, b) = (base.path().join("a"), base.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let in_dir = |dir: &std::path::Path, berth_home: &OsStr, args: &[&str]| {
        berth_command(berth_home, "tester", args)
            .current_dir(dir)
            .output()
            .unwrap()
    };
    // A home whose path is not UTF-8 (SQLite takes only UTF-8 file names): a setup error
    // naming BERTH_HOME, and nothing made.
    let odd = OsStr::from_bytes(b"h\xffome");
    let out = in_dir(&a, odd, &["create", "-p", "host"]);
    assert_eq!(out.status.code(), Some(14), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("BERTH_HOME"),
        "{}",
        text(&out.stderr)
    );
    assert!(!a.join(std::path::Path::new(odd)).exists());
    for name in [OsStr::new("home"), OsStr::new("other home")] {
        let out = in_dir(&a, name, &["--json", "create", "-p", "host"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let id = doc["sandbox"]["berth_id"].as_str().unwrap().to_owned();
        let out = in_dir(&a, name, &["exec", &id, "--", "true"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        // The same home named relative to another directory.
        let mut from_b = b"../a/".to_vec();
        from_b.extend_from_slice(name.as_bytes());
        let out = in_dir(&b, OsStr::from_bytes(&from_b), &["exec", &id, "--", "true"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let out = in_dir(&b, OsStr::from_bytes(&from_b), &["destroy", &id]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(a
            .join(std::path::Path::new(name))
            .join("berth.db")
            .is_file());
    }
}

/// Names and text in an error are shown, not obeyed: argv is often model-written, and a command
/// name carrying terminal escape sequences (retitle the window, clear the screen) reaches stderr
/// escaped — the error still names it, and the exit code is still `docker exec`'s 127.
#[test]
fn escape_sequences_in_an_error_are_shown_not_sent() {
    let home = tempfile::tempdir().unwrap();
    let owner = "hostile-escapes";
    let created = berth(home.path(), owner, &["--json", "create", "-p", "host"]);
    let created: Value = serde_json::from_slice(&created.stdout).unwrap();
    let id = created["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let out = berth(
        home.path(),
        owner,
        &["exec", &id, "--", "no-such\x1b]0;owned\x07\x1b[2J"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{stderr}");
    assert!(
        !out.stderr.iter().any(|b| *b == 0x1b || *b == 0x07),
        "a control character reached the terminal: {stderr:?}"
    );
    assert!(
        stderr.contains("no-such\\u{1b}]0;owned\\u{7}\\u{1b}[2J"),
        "{stderr}"
    );
    let gone = berth(home.path(), owner, &["destroy", &id]);
    assert!(gone.status.success());
}

/// A resource's labels are the provider's to report and, on host, the sandbox's to rewrite
/// (its metadata sits beside its workspace). A sweep that finds one labelled for another owner
/// leaves it alone and says whose it claims to be, with control characters shown, not sent.
#[test]
fn a_relabelled_sandbox_is_swept_as_foreign_and_its_label_shown_not_sent() {
    let home = tempfile::tempdir().unwrap();
    let owner = "hostile-labels";
    let created = berth(home.path(), owner, &["--json", "create", "-p", "host"]);
    let created: Value = serde_json::from_slice(&created.stdout).unwrap();
    let id = created["sandbox"]["berth_id"].as_str().unwrap().to_owned();
    let meta = home
        .path()
        .join("state/host/sandboxes")
        .join(&id)
        .join("sandbox.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    doc["labels"]["berth.owner"] = Value::from("evil\x1b]0;owned\x07");
    std::fs::write(&meta, serde_json::to_vec(&doc).unwrap()).unwrap();

    let out = berth(home.path(), owner, &["ledger", "sweep"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.stdout
            .iter()
            .chain(&out.stderr)
            .any(|b| *b == 0x1b || *b == 0x07),
        "a control character reached the terminal: {stdout:?}"
    );
    assert!(
        stdout.contains(
            "skipped, not ours: the resource is labelled for owner `evil\\u{1b}]0;owned\\u{7}`"
        ),
        "{stdout}"
    );
    assert!(home.path().join("state/host/sandboxes").join(&id).is_dir());
    // Put back as it was, it is ours again and goes.
    doc["labels"]["berth.owner"] = Value::from(owner);
    std::fs::write(&meta, serde_json::to_vec(&doc).unwrap()).unwrap();
    assert!(berth(home.path(), owner, &["destroy", &id])
        .status
        .success());
}
