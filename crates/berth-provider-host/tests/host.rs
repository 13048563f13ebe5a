//! Integration tests for the host provider: every capability it implements, the ones it does
//! not, and the hostile cases (escaping paths, timeouts, leftovers, huge output).

use berth_contract::{
    implemented_capabilities, CanonicalState, Capability, DestroyOutcome, ErrorKind, ExecRequest,
    ExitStatus, LabelFilter, NativeId, Observation, Provider, ProviderExt, Stream,
};
use berth_testkit::process_gone;
use std::path::Path;
use std::time::{Duration, Instant};
mod host_support;

use host_support::*;

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

/// A process outside the exec (here the test; in life another exec of the same sandbox, as the
/// same user) that opens `/proc/PID/fd/1` of a command holds the exec's output pipe after every
/// process of the exec is gone. The exec still ends when its reaper does, with what its
/// command wrote (before, it waited for the pipe's end for as long as the holder lived).
#[tokio::test]
async fn a_process_outside_the_exec_holding_its_output_pipe_cannot_hold_the_exec_open() {
    let f = fixture();
    let id = create(&f.host, "bx-held-pipe").await;
    let pidfile = f.host.workspace_dir(&id).unwrap().join("cmd.pid");
    let request = ExecRequest::shell("echo before; echo $$ > cmd.pid; sleep 0.5; echo after");
    let exec = f.host.exec(&id, &request);
    let hold = async {
        let until = Instant::now() + Duration::from_secs(5);
        let pid = loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
            {
                break pid;
            }
            assert!(Instant::now() < until, "command never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{pid}/fd/1"))
            .unwrap()
    };
    let (out, held) =
        tokio::time::timeout(Duration::from_secs(15), async { tokio::join!(exec, hold) })
            .await
            .expect("the exec was held open by a pipe held outside it");
    let out = out.unwrap();
    assert_eq!(out.status, ExitStatus::Exited { code: 0 });
    assert_eq!(text(&out.stdout), "before\nafter\n");
    drop(held);
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

/// A reaper that ends without saying whether the command started (here `true` stands in for
/// one killed at its start) fails the exec with that said in words, never Rust's debug form
/// (it read "the reaper did not start `true` (said None)"), and the exec does not run.
#[tokio::test]
async fn a_reaper_that_says_nothing_fails_the_exec_in_words() {
    let f = fixture_with(Some("/bin/true".into()));
    let id = create(&f.host, "bx-silent-reaper").await;
    let err = f
        .host
        .exec(&id, &ExecRequest::shell("echo ran > ran"))
        .await
        .expect_err("nothing confirmed the start");
    let said = err.to_string();
    assert!(
        said.contains("the reaper ended before saying whether `/bin/sh` started"),
        "{said}"
    );
    for debug in ["None", "Some("] {
        assert!(!said.contains(debug), "{said}");
    }
    let ws = f.host.workspace_dir(&id).unwrap();
    assert!(!Path::new(&ws).join("ran").exists());
    f.host.destroy(&id).await.unwrap();
}

/// A sandbox destroyed while its command was starting is said to be, in this provider's name
/// only (it read "provider `host`: … (provider `local`: the reaper ended …)"). A reaper that
/// removes its own sandbox and ends stands in for a destroy racing the start.
#[tokio::test]
async fn a_sandbox_destroyed_at_the_start_is_said_in_the_providers_name() {
    let scripts = tempfile::tempdir().unwrap();
    let reaper = scripts.path().join("reaper-that-destroys");
    std::fs::write(&reaper, "#!/bin/sh\nrm -rf -- \"$(dirname \"$PWD\")\"\n").unwrap();
    std::fs::set_permissions(&reaper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let f = fixture_with(Some(reaper));
    let id = create(&f.host, "bx-destroyed-at-start").await;
    let err = f
        .host
        .exec(&id, &ExecRequest::shell("true"))
        .await
        .expect_err("the sandbox was gone before the command started");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let said = err.to_string();
    assert!(
        said.starts_with("provider `host`: sandbox `bx-destroyed-at-start` was destroyed while the command was starting (the reaper ended"),
        "{said}"
    );
    assert!(!said.contains("`local`"), "{said}");
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

/// Commands still running or never proven contained by their reaper, as destroy sees them.
fn running_marks(f: &Fixture, name: &str) -> usize {
    std::fs::read_dir(f._state.path().join("sandboxes").join(name).join("running"))
        .unwrap()
        .count()
}

/// Destroy searches the process table only while a command may have left something: every
/// exec is recorded before it starts and forgotten once its reaper reports it contained. One
/// that kills its own reaper is never forgotten, and what it left is killed at destroy.
#[tokio::test]
async fn a_command_that_killed_its_reaper_is_searched_for_at_destroy() {
    let f = fixture();
    let id = create(&f.host, "bx-reaperkill").await;
    assert_eq!(running_marks(&f, "bx-reaperkill"), 0);
    sh(&f.host, &id, "true").await;
    sh(&f.host, &id, "sleep 0.01 & echo $! > bg.pid").await;
    assert_eq!(
        running_marks(&f, "bx-reaperkill"),
        0,
        "a contained exec left its mark"
    );
    let out = sh(
        &f.host,
        &id,
        "setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' </dev/null >/dev/null 2>&1 & \
         while [ ! -s escaped.pid ]; do sleep 0.01; done; kill -9 $PPID",
    )
    .await;
    assert!(
        !matches!(out.status, ExitStatus::Exited { code: 0 }),
        "{:?}",
        out.status
    );
    let escaped = read_pid(&f.host, &id, "escaped.pid");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !process_gone(escaped),
        "the escaped process should outlive its killed reaper"
    );
    assert_eq!(running_marks(&f, "bx-reaperkill"), 1);
    assert!(matches!(
        f.host.destroy(&id).await.unwrap(),
        DestroyOutcome::VerifiedGone { .. }
    ));
    assert!(wait_gone(escaped), "destroy left process {escaped} running");
}

/// A sandbox made before commands were recorded (no `running/`) still runs commands, and its
/// destroy always searches the process table.
#[tokio::test]
async fn a_sandbox_without_command_records_still_works_and_is_searched() {
    let f = fixture_with(None);
    let id = create(&f.host, "bx-oldstyle").await;
    std::fs::remove_dir(f._state.path().join("sandboxes/bx-oldstyle/running")).unwrap();
    let out = sh(
        &f.host,
        &id,
        "setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' </dev/null >/dev/null 2>&1 & \
         while [ ! -s escaped.pid ]; do sleep 0.01; done",
    )
    .await;
    assert_eq!(out.status, ExitStatus::Exited { code: 0 });
    let escaped = read_pid(&f.host, &id, "escaped.pid");
    assert!(!process_gone(escaped));
    f.host.destroy(&id).await.unwrap();
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
            Capability::Listing,
            Capability::Access
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

/// Execs keep starting while the sandbox is destroyed: each one either ran before the sandbox
/// was renamed away (destroy then finds and kills it, `setsid` child and all) or fails to
/// start; none is left running, whichever way the race goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execs_racing_a_destroy_leave_nothing_running() {
    let f = fixture();
    for round in 0..8u64 {
        let name = format!("bx-race-{round}");
        let id = create(&f.host, &name).await;
        let host = f.host.clone();
        let racing = id.clone();
        let runner = tokio::spawn(async move {
            let line = "setsid sleep 300 </dev/null >/dev/null 2>&1 & sleep 300";
            let mut started = 0;
            loop {
                match host.exec(&racing, &ExecRequest::shell(line)).await {
                    Ok(_) => started += 1,
                    // The sandbox is gone or going: said so, never as a fault of Berth's.
                    Err(e) => {
                        assert!(
                            matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Conflict),
                            "{e}"
                        );
                        break;
                    }
                }
            }
            started
        });
        tokio::time::sleep(Duration::from_millis(5 + round * 7)).await;
        assert!(matches!(
            f.host.destroy(&id).await.unwrap(),
            DestroyOutcome::VerifiedGone { .. }
        ));
        let after = tokio::time::timeout(Duration::from_secs(20), runner)
            .await
            .expect("an exec outlived its sandbox's destroy")
            .unwrap();
        assert!(after <= 1, "execs ran after the destroy: {after}");
        assert!(
            berth_testkit::wait_unmarked(&name, Duration::from_secs(2)),
            "round {round}: {:?} left running",
            berth_testkit::marked_processes(&name)
        );
        assert!(matches!(
            f.host.observe(&id).await.unwrap(),
            Observation::Absent
        ));
    }
}

/// A command running when its sandbox is destroyed is killed with it; its exec ends saying
/// that the sandbox was destroyed (the command's own status is unknown: it never reported one).
#[tokio::test]
async fn an_exec_whose_sandbox_is_destroyed_says_so() {
    let f = fixture();
    let id = create(&f.host, "bx-destroyed-under").await;
    let host = f.host.clone();
    let running = id.clone();
    let exec = tokio::spawn(async move {
        host.exec(&running, &ExecRequest::shell("echo up > up; sleep 300"))
            .await
    });
    let ws = f.host.workspace_dir(&id).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !Path::new(&ws).join("up").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f.host.destroy(&id).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), exec)
        .await
        .expect("the exec outlived its sandbox")
        .unwrap();
    match out {
        Ok(out) => match out.status {
            ExitStatus::Unknown { reason } => {
                assert!(
                    reason.contains("was destroyed while the command ran"),
                    "{reason}"
                );
                // Said in words (how the reaper ended, what it said), not Rust's debug form.
                for debug in ["ExitStatus(", "None", "Some("] {
                    assert!(!reason.contains(debug), "{reason}");
                }
            }
            other => panic!("status {other:?}"),
        },
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e}"),
    }
}
