//! Integration tests for the host provider: every capability it implements, the ones it does
//! not, and the hostile cases (escaping paths, timeouts, leftovers, huge output).

use std::path::Path;
use std::time::{Duration, Instant};

use berth_contract::{
    implemented_capabilities, CanonicalState, Capability, CreateRequest, DestroyOutcome, ErrorKind,
    ExecRequest, ExitStatus, FileKind, LabelFilter, Labels, NativeId, Observation, OutputSink,
    Provider, ProviderExt, SandboxName, Stream,
};
use berth_provider_host::{HostConfig, HostProvider};

struct Fixture {
    _state: tempfile::TempDir,
    host: HostProvider,
}

fn fixture() -> Fixture {
    fixture_with(Some(berth_testkit::supervisor_binary()))
}

fn fixture_with(reaper: Option<std::path::PathBuf>) -> Fixture {
    let state = tempfile::Builder::new()
        .prefix("berth-test-host-")
        .tempdir()
        .unwrap();
    let host = berth_provider_host::new(
        state.path(),
        HostConfig {
            kill_grace: Duration::from_millis(300),
            reaper,
        },
    )
    .unwrap();
    Fixture {
        _state: state,
        host,
    }
}

fn request(name: &str, owner: &str) -> CreateRequest {
    CreateRequest::new(
        SandboxName(name.into()),
        Labels {
            owner: owner.into(),
            run_id: "run-test".into(),
            ledger_token: format!("tok-{name}"),
            expires_at_unix: None,
        },
    )
}

async fn create(host: &HostProvider, name: &str) -> NativeId {
    host.create(&request(name, "tester"))
        .await
        .unwrap()
        .native_id
}

async fn sh(host: &HostProvider, id: &NativeId, line: &str) -> berth_contract::ExecOutput {
    host.exec(id, &ExecRequest::shell(line)).await.unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

use berth_testkit::process_gone;

fn wait_gone(pid: i32) -> bool {
    berth_testkit::wait_all_gone(&[pid], Duration::from_secs(5))
}

fn read_pid(host: &HostProvider, id: &NativeId, file: &str) -> i32 {
    let path = host.workspace_dir(id).unwrap().join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn lifecycle_create_observe_exec_destroy() {
    let f = fixture();
    let id = create(&f.host, "bx-life").await;
    match f.host.observe(&id).await.unwrap() {
        Observation::Present {
            state,
            raw,
            soft_deleted,
            labels,
        } => {
            assert_eq!(state, CanonicalState::Running);
            assert_eq!(raw, "ready");
            assert!(!soft_deleted);
            assert_eq!(labels.get("berth.owner").unwrap(), "tester");
            assert_eq!(labels.get("berth.ledger").unwrap(), "tok-bx-life");
        }
        other => panic!("expected present, got {other:?}"),
    }

    let ok = sh(&f.host, &id, "echo out; echo err >&2").await;
    assert_eq!(ok.status, ExitStatus::Exited { code: 0 });
    assert_eq!(text(&ok.stdout), "out\n");
    assert_eq!(text(ok.stderr.as_deref().unwrap()), "err\n");

    let seven = sh(&f.host, &id, "echo partial; exit 7").await;
    assert_eq!(seven.status, ExitStatus::Exited { code: 7 });
    assert_eq!(text(&seven.stdout), "partial\n");

    let quoting = f
        .host
        .exec(
            &id,
            &ExecRequest::argv(["printf", "%s|", "a b", "$HOME", "'q'"]),
        )
        .await
        .unwrap();
    assert_eq!(text(&quoting.stdout), "a b|$HOME|'q'|");

    let pipe = sh(&f.host, &id, "printf 'b\\na\\n' | sort | tr -d '\\n'").await;
    assert_eq!(text(&pipe.stdout), "ab");

    let first = f.host.destroy(&id).await.unwrap();
    assert_eq!(
        first,
        DestroyOutcome::VerifiedGone {
            already_absent: false
        }
    );
    assert_eq!(f.host.observe(&id).await.unwrap(), Observation::Absent);
    let second = f.host.destroy(&id).await.unwrap();
    assert_eq!(
        second,
        DestroyOutcome::VerifiedGone {
            already_absent: true
        }
    );
    let err = sh_err(&f.host, &id, "true").await;
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

async fn sh_err(host: &HostProvider, id: &NativeId, line: &str) -> berth_contract::ProviderError {
    host.exec(id, &ExecRequest::shell(line)).await.unwrap_err()
}

#[tokio::test]
async fn home_is_the_workspace_and_env_is_scrubbed() {
    let f = fixture();
    let id = create(&f.host, "bx-env").await;
    let out = f
        .host
        .exec(
            &id,
            &ExecRequest::shell("env; echo HOME_IS=$HOME; pwd").with_env("GIVEN", "yes"),
        )
        .await
        .unwrap();
    let stdout = text(&out.stdout);
    // cargo sets CARGO_* in the test process; none of it may leak into the sandbox.
    assert!(!stdout.contains("CARGO"), "{stdout}");
    assert!(stdout.contains("GIVEN=yes"));
    assert!(stdout.contains("BERTH_SANDBOX=bx-env"));
    let ws = f.host.workspace_dir(&id).unwrap();
    assert!(
        stdout.contains(&format!("HOME_IS={}", ws.display())),
        "{stdout}"
    );

    let reserved = f
        .host
        .exec(
            &id,
            &ExecRequest::shell("true").with_env("BERTH_SANDBOX", "x"),
        )
        .await
        .unwrap_err();
    assert_eq!(reserved.kind(), ErrorKind::InvalidRequest);
    f.host.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn cwd_is_confined() {
    let f = fixture();
    let id = create(&f.host, "bx-cwd").await;
    sh(&f.host, &id, "mkdir -p sub/dir").await;
    let out = f
        .host
        .exec(&id, &ExecRequest::shell("pwd").with_cwd("sub/dir"))
        .await
        .unwrap();
    assert!(text(&out.stdout).trim_end().ends_with("workspace/sub/dir"));
    for (cwd, kind) in [
        ("..", ErrorKind::InvalidRequest),
        ("/tmp", ErrorKind::InvalidRequest),
        ("missing", ErrorKind::NotFound),
    ] {
        let err = f
            .host
            .exec(&id, &ExecRequest::shell("pwd").with_cwd(cwd))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), kind, "{cwd}: {err}");
    }
    f.host.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn timeout_kills_the_whole_group_even_when_sigterm_is_ignored() {
    let f = fixture();
    let id = create(&f.host, "bx-timeout").await;
    let started = Instant::now();
    let out = f
        .host
        .exec(
            &id,
            &ExecRequest::shell(
                "trap '' TERM; sleep 30 & echo $! > child.pid; echo $$ > leader.pid; wait; sleep 30",
            )
            .with_timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status, ExitStatus::TimedOut);
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let child = read_pid(&f.host, &id, "child.pid");
    let leader = read_pid(&f.host, &id, "leader.pid");
    assert!(wait_gone(child), "child {child} survived the timeout");
    assert!(wait_gone(leader), "leader {leader} survived the timeout");
    f.host.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn processes_do_not_outlive_an_exec() {
    let f = fixture();
    let id = create(&f.host, "bx-leftover").await;
    let started = Instant::now();
    let out = sh(&f.host, &id, "sleep 300 & echo $! > bg.pid; echo done").await;
    assert_eq!(out.status, ExitStatus::Exited { code: 0 });
    assert!(started.elapsed() < Duration::from_secs(10));
    let bg = read_pid(&f.host, &id, "bg.pid");
    assert!(wait_gone(bg), "background process {bg} outlived the exec");
    f.host.destroy(&id).await.unwrap();
}

/// `setsid` and double forks leave the process group; under the reaper they still die with
/// their exec — when it ends, and when it times out.
#[tokio::test]
async fn processes_that_left_the_group_die_with_their_exec() {
    let f = fixture();
    let id = create(&f.host, "bx-setsid").await;
    let daemon = "setsid sh -c 'echo $$ > {file}; exec sleep 300' </dev/null >/dev/null 2>&1 & \
                  while [ ! -s {file} ]; do sleep 0.01; done";
    let out = sh(&f.host, &id, &daemon.replace("{file}", "ended.pid")).await;
    assert_eq!(out.status, ExitStatus::Exited { code: 0 });
    let escaped = read_pid(&f.host, &id, "ended.pid");
    assert!(
        wait_gone(escaped),
        "setsid child {escaped} outlived its exec"
    );

    let line = format!("{}; sleep 300", daemon.replace("{file}", "timed.pid"));
    let out = f
        .host
        .exec(
            &id,
            &ExecRequest::shell(line).with_timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    assert_eq!(out.status, ExitStatus::TimedOut);
    let escaped = read_pid(&f.host, &id, "timed.pid");
    assert!(
        wait_gone(escaped),
        "setsid child {escaped} survived the timeout"
    );
    f.host.destroy(&id).await.unwrap();
}

/// Without a reaper (library use), destroy still finds processes that left the group.
#[tokio::test]
async fn destroy_kills_processes_that_left_the_group() {
    let f = fixture_with(None);
    let id = create(&f.host, "bx-escape").await;
    sh(
        &f.host,
        &id,
        "setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' </dev/null >/dev/null 2>&1 & \
         while [ ! -s escaped.pid ]; do sleep 0.01; done",
    )
    .await;
    let escaped = read_pid(&f.host, &id, "escaped.pid");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !process_gone(escaped),
        "setsid child should still run before destroy"
    );
    assert!(matches!(
        f.host.destroy(&id).await.unwrap(),
        DestroyOutcome::VerifiedGone { .. }
    ));
    assert!(wait_gone(escaped), "destroy left process {escaped} running");
}

#[tokio::test]
async fn signalled_and_missing_program_are_not_fabricated_exit_codes() {
    let f = fixture();
    let id = create(&f.host, "bx-signal").await;
    let out = f
        .host
        .exec(&id, &ExecRequest::argv(["sh", "-c", "kill -9 $$"]))
        .await
        .unwrap();
    assert_eq!(out.status, ExitStatus::Signalled { signal: 9 });
    let missing = f
        .host
        .exec(&id, &ExecRequest::argv(["definitely-not-a-program-xyz"]))
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
    assert!(missing.to_string().contains("definitely-not-a-program-xyz"));
    f.host.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn huge_output_is_capped_counted_and_drained() {
    let f = fixture();
    let id = create(&f.host, "bx-huge").await;
    let mut req = ExecRequest::shell("head -c 50000000 /dev/zero; echo tail >&2");
    req.max_output_bytes = 1024 * 1024;
    let out = f.host.exec(&id, &req).await.unwrap();
    assert_eq!(out.status, ExitStatus::Exited { code: 0 });
    assert_eq!(out.stdout.len(), 1024 * 1024);
    assert_eq!(out.stdout_total, 50_000_000);
    assert!(out.stdout_truncated());
    assert_eq!(text(out.stderr.as_deref().unwrap()), "tail\n");
    assert!(!out.stderr_truncated());
    f.host.destroy(&id).await.unwrap();
}

#[derive(Default)]
struct Recorder(Vec<(Stream, Vec<u8>)>);

impl OutputSink for Recorder {
    fn chunk(&mut self, stream: Stream, bytes: &[u8]) {
        self.0.push((stream, bytes.to_vec()));
    }
}

#[tokio::test]
async fn streaming_delivers_chunks_per_stream_as_they_come() {
    let f = fixture();
    let id = create(&f.host, "bx-stream").await;
    let mut recorder = Recorder::default();
    let summary = f
        .host
        .require_streaming()
        .unwrap()
        .exec_streaming(
            &id,
            &ExecRequest::shell("echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three"),
            &mut recorder,
        )
        .await
        .unwrap();
    assert_eq!(summary.status, ExitStatus::Exited { code: 0 });
    assert_eq!(summary.stdout_total, 10);
    assert_eq!(summary.stderr_total, Some(4));
    let joined = |stream| {
        recorder
            .0
            .iter()
            .filter(|(s, _)| *s == stream)
            .flat_map(|(_, b)| b.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(text(&joined(Stream::Stdout)), "one\nthree\n");
    assert_eq!(text(&joined(Stream::Stderr)), "two\n");
    // "one" arrived in its own chunk before "two": output streamed, not buffered to the end.
    assert_eq!(recorder.0[0], (Stream::Stdout, b"one\n".to_vec()));
    f.host.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn files_round_trip_binary_and_list() {
    let f = fixture();
    let id = create(&f.host, "bx-files").await;
    let files = f.host.require_files().unwrap();
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    files
        .write(&id, "deep/dir/blob.bin", &binary)
        .await
        .unwrap();
    assert_eq!(files.read(&id, "deep/dir/blob.bin").await.unwrap(), binary);
    files.write(&id, "./top.txt", b"top").await.unwrap();
    sh(&f.host, &id, "ln -s top.txt link").await;
    let listing = files.list(&id, ".").await.unwrap();
    let names: Vec<_> = listing.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        names,
        vec![
            ("deep", FileKind::Dir),
            ("link", FileKind::Symlink),
            ("top.txt", FileKind::File)
        ]
    );
    // The file API never follows a symlink, even one that stays inside.
    let link_err = files.read(&id, "link").await.unwrap_err();
    assert_eq!(link_err.kind(), ErrorKind::InvalidRequest);
    assert!(link_err.to_string().contains("symlink"), "{link_err}");
    let seen = sh(&f.host, &id, "cat deep/dir/blob.bin | wc -c").await;
    assert_eq!(text(&seen.stdout).trim(), "70000");
    let dir_err = files.read(&id, "deep").await.unwrap_err();
    assert_eq!(dir_err.kind(), ErrorKind::InvalidRequest);
    f.host.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn hostile_paths_are_rejected_with_clear_errors() {
    let f = fixture();
    let id = create(&f.host, "bx-hostile").await;
    let files = f.host.require_files().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"host secret").unwrap();
    sh(
        &f.host,
        &id,
        &format!("ln -s {} escape", outside.path().display()),
    )
    .await;
    let cases = [
        ("../escape.txt", "contains `..`"),
        ("a/../../escape.txt", "contains `..`"),
        ("/etc/passwd", "absolute and outside"),
        ("escape/secret", "symlink"),
        ("escape/new.txt", "symlink"),
    ];
    for (path, why) in cases {
        let read = files.read(&id, path).await.unwrap_err();
        assert_eq!(read.kind(), ErrorKind::InvalidRequest, "{path}");
        assert!(read.to_string().contains(why), "{path}: {read}");
        let write = files.write(&id, path, b"pwned").await.unwrap_err();
        assert_eq!(write.kind(), ErrorKind::InvalidRequest, "{path}");
        let list = files.list(&id, path).await.unwrap_err();
        assert_eq!(list.kind(), ErrorKind::InvalidRequest, "{path}");
    }
    assert!(!outside.path().join("new.txt").exists());
    assert_eq!(
        std::fs::read(outside.path().join("secret")).unwrap(),
        b"host secret"
    );
    let state = f.host.workspace_dir(&id).unwrap();
    assert!(!state.parent().unwrap().join("escape.txt").exists());
    f.host.destroy(&id).await.unwrap();
    assert!(
        outside.path().join("secret").exists(),
        "destroy followed a symlink out"
    );
}

/// Swaps `ws/d` (a directory) and `ws/s` (a symlink to a host directory) with
/// `renameat2(RENAME_EXCHANGE)` as fast as it can until `stop` is set — what a process in the
/// sandbox can do while the operator runs `berth cp`.
fn exchange_loop(ws: &Path, stop: &std::sync::atomic::AtomicBool) -> u64 {
    let mut swaps = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            ws.join("d").as_path(),
            rustix::fs::CWD,
            ws.join("s").as_path(),
            rustix::fs::RenameFlags::EXCHANGE,
        )
        .unwrap();
        swaps += 1;
    }
    swaps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_api_is_race_free_against_a_swapping_sandbox() {
    let f = fixture();
    let id = create(&f.host, "bx-race").await;
    let files = f.host.require_files().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("f"), b"HOST-SECRET").unwrap();
    let ws = f.host.workspace_dir(&id).unwrap();
    std::fs::create_dir(ws.join("d")).unwrap();
    std::fs::write(ws.join("d/f"), b"inside").unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.join("s")).unwrap();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = {
        let (ws, stop) = (ws.clone(), stop.clone());
        std::thread::spawn(move || exchange_loop(&ws, &stop))
    };
    let (mut reads_ok, mut refused) = (0, 0);
    for round in 0..1500 {
        match files.read(&id, "d/f").await {
            Ok(bytes) => {
                assert_eq!(bytes, b"inside", "round {round}: read a host file");
                reads_ok += 1;
            }
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
                refused += 1;
            }
        }
        let _ = files.write(&id, &format!("d/new-{round}"), b"x").await;
        let _ = files.list(&id, "d").await;
        if round % 100 == 0 {
            // Snapshots walk the same tree; they store the link, never what it points at.
            let snapshots = f.host.require_snapshots().unwrap();
            if let Ok(snap) = snapshots.snapshot(&id).await {
                snapshots.delete_snapshot(&snap).await.unwrap();
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = attacker.join().unwrap();
    let leaked: Vec<_> = std::fs::read_dir(outside.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name != "f")
        .collect();
    assert!(
        leaked.is_empty(),
        "wrote into the host directory: {leaked:?}"
    );
    assert_eq!(
        std::fs::read(outside.path().join("f")).unwrap(),
        b"HOST-SECRET"
    );
    assert!(swaps > 1000, "the attacker barely ran ({swaps} swaps)");
    assert!(
        reads_ok > 0 && refused > 0,
        "race not exercised: {reads_ok} ok, {refused} refused"
    );
    f.host.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn special_files_are_refused_not_waited_on() {
    let f = fixture();
    let id = create(&f.host, "bx-fifo").await;
    let files = f.host.require_files().unwrap();
    let made = sh(&f.host, &id, "mkfifo pipe && python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.bind(\"sock\")'").await;
    assert_eq!(
        made.status,
        ExitStatus::Exited { code: 0 },
        "{:?}",
        made.stderr
    );
    for (path, what) in [("pipe", "a FIFO"), ("sock", "a socket")] {
        let read = tokio::time::timeout(Duration::from_secs(10), files.read(&id, path))
            .await
            .expect("reading a special file must not block")
            .unwrap_err();
        assert_eq!(read.kind(), ErrorKind::InvalidRequest, "{read:?}");
        assert!(read.to_string().contains(what), "{read}");
        let write = files.write(&id, path, b"x").await.unwrap_err();
        assert!(write.to_string().contains(what), "{write}");
    }
    f.host.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn snapshot_restore_and_fork_copy_the_filesystem() {
    let f = fixture();
    let id = create(&f.host, "bx-src").await;
    sh(
        &f.host,
        &id,
        "mkdir -p src && echo v1 > src/file && chmod 751 src/file && ln -s src/file link && \
         head -c 100000 /dev/urandom > random.bin",
    )
    .await;
    let snaps = f.host.require_snapshots().unwrap();
    let snap = snaps.snapshot(&id).await.unwrap();
    assert!(snap.handle.starts_with("sha256:"));
    let again = snaps.snapshot(&id).await.unwrap();
    assert_eq!(snap.handle, again.handle, "same tree, same digest");

    sh(&f.host, &id, "echo v2 > src/file").await;
    let restored = snaps
        .restore(&snap, &request("bx-restored", "tester"))
        .await
        .unwrap()
        .native_id;
    let check =
        "cat src/file; stat -c %a src/file; readlink link; sha256sum random.bin | cut -c1-64";
    let from_snapshot = text(&sh(&f.host, &restored, check).await.stdout);
    assert!(
        from_snapshot.starts_with("v1\n751\nsrc/file\n"),
        "{from_snapshot}"
    );
    let source_hash = text(
        &sh(&f.host, &id, "sha256sum random.bin | cut -c1-64")
            .await
            .stdout,
    );
    assert!(from_snapshot.ends_with(&source_hash));

    let forked = f
        .host
        .require_fork()
        .unwrap()
        .fork(&id, &request("bx-fork", "tester"))
        .await
        .unwrap()
        .native_id;
    assert_eq!(
        text(&sh(&f.host, &forked, "cat src/file").await.stdout),
        "v2\n"
    );
    sh(&f.host, &forked, "echo changed > src/file").await;
    assert_eq!(text(&sh(&f.host, &id, "cat src/file").await.stdout), "v2\n");

    snaps.delete_snapshot(&snap).await.unwrap();
    snaps.delete_snapshot(&snap).await.unwrap();
    let gone = snaps
        .restore(&snap, &request("bx-never", "tester"))
        .await
        .unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound);
    for id in [id, restored, forked] {
        f.host.destroy(&id).await.unwrap();
    }
}

#[tokio::test]
async fn tampered_snapshot_is_refused_and_leaves_nothing() {
    let f = fixture();
    let id = create(&f.host, "bx-tamper").await;
    sh(&f.host, &id, "echo data > f").await;
    let snap = f
        .host
        .require_snapshots()
        .unwrap()
        .snapshot(&id)
        .await
        .unwrap();
    let state = f.host.workspace_dir(&id).unwrap();
    let store = state.ancestors().nth(3).unwrap().join("snapshots");
    let file = store.join(format!("{}.tar", &snap.handle["sha256:".len()..]));
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[600] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    let err = f
        .host
        .require_snapshots()
        .unwrap()
        .restore(&snap, &request("bx-tampered", "tester"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("no longer matches its digest"),
        "{err}"
    );
    assert_eq!(
        f.host
            .observe(&NativeId("bx-tampered".into()))
            .await
            .unwrap(),
        Observation::Absent
    );
    f.host.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn listing_filters_by_owner_label() {
    let f = fixture();
    f.host.create(&request("bx-mine", "alice")).await.unwrap();
    f.host.create(&request("bx-theirs", "bob")).await.unwrap();
    let listing = f.host.require_listing().unwrap();
    let mine = listing
        .list(&LabelFilter {
            owner: Some("alice".into()),
            run_id: None,
        })
        .await
        .unwrap();
    let names: Vec<_> = mine.iter().map(|l| l.native_id.0.as_str()).collect();
    assert_eq!(names, vec!["bx-mine"]);
    assert_eq!(
        listing.list(&LabelFilter::default()).await.unwrap().len(),
        2
    );
    f.host.destroy(&NativeId("bx-mine".into())).await.unwrap();
    let after = listing.list(&LabelFilter::default()).await.unwrap();
    assert_eq!(after.len(), 1, "destroyed sandbox still listed");
    f.host.destroy(&NativeId("bx-theirs".into())).await.unwrap();
}

#[tokio::test]
async fn capabilities_match_the_manifest_and_the_rest_answer_unsupported() {
    let f = fixture();
    let implemented = implemented_capabilities(&f.host);
    let listed: Vec<_> = implemented.iter().collect();
    assert_eq!(
        listed,
        vec![
            Capability::ExecStreaming,
            Capability::Files,
            Capability::FilesystemSnapshot,
            Capability::Fork,
            Capability::Listing
        ]
    );
    let err = f.host.require_suspend_resume().map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert_eq!(
        err.to_string(),
        "provider `host` does not support `suspend_resume`"
    );
    assert!(f.host.require_stop_start().is_err());
    assert!(f.host.require_detached().is_err());
}

#[tokio::test]
async fn bad_ids_duplicates_and_half_made_sandboxes() {
    let f = fixture();
    let bad = f
        .host
        .observe(&NativeId("../../etc".into()))
        .await
        .unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidRequest);
    create(&f.host, "bx-dup").await;
    let dup = f
        .host
        .create(&request("bx-dup", "tester"))
        .await
        .unwrap_err();
    assert_eq!(dup.kind(), ErrorKind::Conflict);
    f.host.destroy(&NativeId("bx-dup".into())).await.unwrap();

    // A crash between mkdir and metadata leaves a bare directory: observe says so, destroy
    // removes it.
    let ws = f.host.workspace_dir(&NativeId("bx-half".into())).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    let id = NativeId("bx-half".into());
    match f.host.observe(&id).await.unwrap() {
        Observation::Present { state, raw, .. } => {
            assert_eq!(state, CanonicalState::Unknown);
            assert_eq!(raw, "no-metadata");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        f.host.destroy(&id).await.unwrap(),
        DestroyOutcome::VerifiedGone {
            already_absent: false
        }
    );
    assert!(!Path::new(&ws).exists());
}

#[tokio::test]
async fn destroy_copes_with_read_only_trees() {
    let f = fixture();
    let id = create(&f.host, "bx-ro").await;
    sh(
        &f.host,
        &id,
        "mkdir -p ro/inner && touch ro/inner/f && chmod -R a-w ro",
    )
    .await;
    assert_eq!(
        f.host.destroy(&id).await.unwrap(),
        DestroyOutcome::VerifiedGone {
            already_absent: false
        }
    );
}

/// A keyed snapshot taken again (an interrupted caller retrying) replaces the earlier one:
/// no duplicate is left, and unchanged content keeps its handle.
#[tokio::test]
async fn keyed_snapshots_replace_instead_of_duplicating() {
    let f = fixture();
    let id = create(&f.host, "bx-keyed").await;
    let snapshots = f.host.require_snapshots().unwrap();
    sh(&f.host, &id, "echo one > f").await;
    let first = snapshots.snapshot_keyed(&id, "ck-a").await.unwrap();
    let again = snapshots.snapshot_keyed(&id, "ck-a").await.unwrap();
    assert_eq!(first.handle, again.handle, "unchanged content, same handle");
    sh(&f.host, &id, "echo two > f").await;
    let second = snapshots.snapshot_keyed(&id, "ck-a").await.unwrap();
    assert_ne!(first.handle, second.handle);
    let gone = snapshots
        .restore(&first, &request("bx-keyed-old", "tester"))
        .await
        .unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound, "{gone}");
    let restored = snapshots
        .restore(&second, &request("bx-keyed-new", "tester"))
        .await
        .unwrap();
    let files = f.host.require_files().unwrap();
    assert_eq!(
        files.read(&restored.native_id, "f").await.unwrap(),
        b"two\n"
    );
    let bad = snapshots.snapshot_keyed(&id, "../x").await.unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidRequest);
    f.host.destroy(&restored.native_id).await.unwrap();
    f.host.destroy(&id).await.unwrap();
}
