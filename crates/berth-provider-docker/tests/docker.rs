//! Live tests of the docker provider against a real `dockerd` and the reference image
//! (`scripts/build-agent-image.sh`, or `BERTH_TEST_IMAGE`). They fail when the engine is not
//! reachable; set `BERTH_SKIP_DOCKER=1` to skip them explicitly.

use berth_contract::{
    CanonicalState, DestroyOutcome, ErrorKind, ExecRequest, ExitStatus, FileKind, LabelFilter,
    Observation, Provider, ProviderExt, Transition,
};
use std::time::{Duration, Instant};
mod docker_support;

use docker_support::*;

#[tokio::test]
async fn lifecycle_with_labels_no_network_and_verified_destroy() {
    let Some(f) = fixture("life").await else {
        return;
    };
    let id = f.create("bx-dk-life").await;
    match f.docker.observe(&id).await.unwrap() {
        Observation::Present {
            state, raw, labels, ..
        } => {
            assert_eq!(state, CanonicalState::Running);
            assert_eq!(raw, "running");
            assert_eq!(labels.get("berth.owner").unwrap(), "berth-test");
            assert_eq!(labels.get("berth.ledger").unwrap(), "tok-bx-dk-life");
        }
        other => panic!("{other:?}"),
    }
    let out = f
        .sh(
            &id,
            "echo out; echo err >&2; pwd; echo $HOME; ls /sys/class/net; exit 7",
        )
        .await;
    assert_eq!(out.status, ExitStatus::Exited { code: 7 });
    assert_eq!(text(&out.stdout), "out\n/workspace\n/workspace\nlo\n");
    assert_eq!(text(out.stderr.as_deref().unwrap()), "err\n");
    let argv = f
        .docker
        .exec(&id, &ExecRequest::argv(["printf", "%s|", "a b", "$HOME"]))
        .await
        .unwrap();
    assert_eq!(text(&argv.stdout), "a b|$HOME|");
    let missing = f
        .docker
        .exec(&id, &ExecRequest::argv(["no-such-program-4711"]))
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
    assert_eq!(
        f.docker.destroy(&id).await.unwrap(),
        DestroyOutcome::VerifiedGone {
            already_absent: false
        }
    );
    assert_eq!(f.docker.observe(&id).await.unwrap(), Observation::Absent);
    assert_eq!(
        f.docker.destroy(&id).await.unwrap(),
        DestroyOutcome::VerifiedGone {
            already_absent: true
        }
    );
    let gone = f
        .docker
        .exec(&id, &ExecRequest::shell("true"))
        .await
        .unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound, "{gone}");
}

#[tokio::test]
async fn timeout_kills_the_process_tree_inside_the_container() {
    let Some(f) = fixture("timeout").await else {
        return;
    };
    let id = f.create("bx-dk-timeout").await;
    let started = Instant::now();
    let out = f
        .docker
        .exec(
            &id,
            &ExecRequest::shell("trap '' TERM; sleep 60 & echo $! > /tmp/child; sleep 60")
                .with_timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    assert_eq!(out.status, ExitStatus::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(10));
    let check = f
        .sh(
            &id,
            "sleep 0.2; pid=$(cat /tmp/child); test -d /proc/$pid && echo alive || echo gone",
        )
        .await;
    assert_eq!(text(&check.stdout), "gone\n");
    // A child that left the process group (`setsid`) dies with the timed-out exec too, and one
    // that daemonized from an exec that ended normally dies with that exec.
    let daemon = "setsid sh -c 'echo $$ > /tmp/{f}; exec sleep 60' </dev/null >/dev/null 2>&1 & \
                  while [ ! -s /tmp/{f} ]; do sleep 0.01; done";
    let out = f
        .docker
        .exec(
            &id,
            &ExecRequest::shell(format!("{}; sleep 60", daemon.replace("{f}", "timed")))
                .with_timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    assert_eq!(out.status, ExitStatus::TimedOut);
    let ended = f.sh(&id, &daemon.replace("{f}", "ended")).await;
    assert_eq!(ended.status, ExitStatus::Exited { code: 0 });
    for file in ["timed", "ended"] {
        let check = f
            .sh(
                &id,
                &format!("sleep 0.3; pid=$(cat /tmp/{file}); test -d /proc/$pid && echo alive || echo gone"),
            )
            .await;
        assert_eq!(
            text(&check.stdout),
            "gone\n",
            "setsid child of the {file} exec survived"
        );
    }
    // A caller that gives up mid-exec takes the command with it.
    let leader = ExecRequest::shell("echo $$ > /tmp/leader; sleep 60");
    let slow = f.docker.exec(&id, &leader);
    assert!(tokio::time::timeout(Duration::from_millis(700), slow)
        .await
        .is_err());
    let check = f
        .sh(
            &id,
            "sleep 0.3; pid=$(cat /tmp/leader); test -d /proc/$pid && echo alive || echo gone",
        )
        .await;
    assert_eq!(text(&check.stdout), "gone\n");
    f.docker.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn files_through_the_archive_api_are_binary_safe_and_confined() {
    let Some(f) = fixture("files").await else {
        return;
    };
    let id = f.create("bx-dk-files").await;
    let files = f.docker.require_files().unwrap();
    let blob: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    files.write(&id, "deep/dir/blob.bin", &blob).await.unwrap();
    assert_eq!(
        files
            .read(&id, "/workspace/deep/dir/blob.bin")
            .await
            .unwrap(),
        blob
    );
    let seen = f.sh(&id, "wc -c < deep/dir/blob.bin").await;
    assert_eq!(text(&seen.stdout).trim(), "300000");
    f.sh(&id, "ln -s deep/dir/blob.bin link").await;
    assert_eq!(files.read(&id, "link").await.unwrap(), blob);
    let listing = files.list(&id, ".").await.unwrap();
    let names: Vec<_> = listing.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        names,
        vec![("deep", FileKind::Dir), ("link", FileKind::Symlink)]
    );
    assert!(files
        .read(&id, "/etc/os-release")
        .await
        .unwrap()
        .starts_with(b"PRETTY_NAME"));
    for bad in ["../etc/passwd", "/workspace/../etc/shadow"] {
        let e = files.read(&id, bad).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{bad}");
        let e = files.write(&id, bad, b"x").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{bad}");
    }
    assert_eq!(
        files.read(&id, "nope").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        files.read(&id, "deep").await.unwrap_err().kind(),
        ErrorKind::InvalidRequest
    );
    // A replaced file keeps its permissions (an executable script stays executable, as on host
    // and bwrap; every write made 0644 before); a new file, and one written over a symlink (the
    // link is replaced, its target untouched), is 0644.
    f.sh(&id, "printf old > run.sh && chmod 750 run.sh").await;
    files
        .write(&id, "run.sh", b"#!/bin/sh\necho ran\n")
        .await
        .unwrap();
    files.write(&id, "fresh.txt", b"new").await.unwrap();
    files.write(&id, "link", b"replaced").await.unwrap();
    let seen = f
        .sh(
            &id,
            "stat -c '%n %a %F' run.sh fresh.txt link; ./run.sh; wc -c < deep/dir/blob.bin",
        )
        .await;
    assert_eq!(
        text(&seen.stdout),
        "run.sh 750 regular file\nfresh.txt 644 regular file\nlink 644 regular file\nran\n300000\n"
    );
    f.docker.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn stop_start_is_cold_and_suspend_resume_keeps_processes() {
    let Some(f) = fixture("power").await else {
        return;
    };
    let id = f.create("bx-dk-power").await;
    f.sh(&id, "echo kept > note").await;
    let before = init_start_time(&f, &id).await;

    let suspended = f
        .docker
        .require_suspend_resume()
        .unwrap()
        .suspend(&id)
        .await
        .unwrap();
    assert_eq!(
        suspended,
        Transition::Settled {
            state: CanonicalState::Suspended
        }
    );
    let touch = ExecRequest::shell("touch ran-while-paused");
    let blocked = tokio::time::timeout(Duration::from_secs(10), f.docker.exec(&id, &touch))
        .await
        .expect("exec on a paused sandbox answers promptly")
        .unwrap_err();
    assert_eq!(blocked.kind(), ErrorKind::Conflict, "{blocked}");
    let resumed = f
        .docker
        .require_suspend_resume()
        .unwrap()
        .resume(&id)
        .await
        .unwrap();
    assert_eq!(
        resumed,
        Transition::Settled {
            state: CanonicalState::Running
        }
    );
    assert_eq!(
        init_start_time(&f, &id).await,
        before,
        "pause/unpause keeps processes"
    );
    let ran = f
        .sh(
            &id,
            "sleep 0.3; test -e ran-while-paused && echo ran || echo never",
        )
        .await;
    assert_eq!(
        text(&ran.stdout),
        "never\n",
        "a refused exec must not run after resume"
    );

    let stopped = f
        .docker
        .require_stop_start()
        .unwrap()
        .stop(&id)
        .await
        .unwrap();
    assert_eq!(
        stopped,
        Transition::Settled {
            state: CanonicalState::Stopped
        }
    );
    let refused = f
        .docker
        .exec(&id, &ExecRequest::shell("true"))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Conflict, "{refused}");
    let started = f
        .docker
        .require_stop_start()
        .unwrap()
        .start(&id)
        .await
        .unwrap();
    assert_eq!(
        started,
        Transition::Settled {
            state: CanonicalState::Running
        }
    );
    assert_ne!(
        init_start_time(&f, &id).await,
        before,
        "stop/start restarts processes"
    );
    assert_eq!(
        text(&f.sh(&id, "cat note").await.stdout),
        "kept\n",
        "filesystem kept"
    );
    f.docker.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn snapshot_restore_and_fork_through_commit() {
    let Some(f) = fixture("snap").await else {
        return;
    };
    let id = f.create("bx-dk-src").await;
    f.sh(&id, "echo v1 > state; git init -q repo && echo ok")
        .await;
    let snaps = f.docker.require_snapshots().unwrap();
    let snap = snaps.snapshot(&id).await.unwrap();
    assert!(snap.handle.starts_with("sha256:"), "{}", snap.handle);
    f.sh(&id, "echo v2 > state").await;
    let restored = snaps
        .restore(&snap, &f.request("bx-dk-restored"))
        .await
        .unwrap()
        .native_id;
    assert_eq!(
        text(
            &f.sh(&restored, "cat state; test -d repo/.git && echo git")
                .await
                .stdout
        ),
        "v1\ngit\n"
    );
    let forked = f
        .docker
        .require_fork()
        .unwrap()
        .fork(&id, &f.request("bx-dk-fork"))
        .await
        .unwrap()
        .native_id;
    assert_eq!(text(&f.sh(&forked, "cat state").await.stdout), "v2\n");
    f.sh(&forked, "echo mine > state").await;
    assert_eq!(text(&f.sh(&id, "cat state").await.stdout), "v2\n");
    for sandbox in [&id, &restored, &forked] {
        f.docker.destroy(sandbox).await.unwrap();
    }
    snaps.delete_snapshot(&snap).await.unwrap();
    snaps.delete_snapshot(&snap).await.unwrap();
    let err = snaps
        .restore(&snap, &f.request("bx-dk-never"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

#[tokio::test]
async fn listing_sees_only_labelled_containers_and_missing_images_are_never_pulled() {
    let Some(f) = fixture("list").await else {
        return;
    };
    let id = f.create("bx-dk-list").await;
    let listed = f
        .docker
        .require_listing()
        .unwrap()
        .list(&LabelFilter {
            owner: Some("berth-test".into()),
            run_id: Some(f.run.clone()),
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].native_id, id);
    f.docker.destroy(&id).await.unwrap();
    let after = f
        .docker
        .require_listing()
        .unwrap()
        .list(&LabelFilter {
            owner: None,
            run_id: Some(f.run.clone()),
        })
        .await
        .unwrap();
    assert!(after.is_empty(), "destroyed container still listed");

    let mut req = f.request("bx-dk-noimage");
    req.image = Some("berth/definitely-missing:never".into());
    let err = f.docker.create(&req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("never pulls"), "{err}");
    req.image = None;
    assert_eq!(
        f.docker.create(&req).await.unwrap_err().kind(),
        ErrorKind::InvalidRequest
    );
}

#[tokio::test]
async fn detached_processes_run_on_and_are_killed_by_group() {
    use berth_contract::ProcessStatus;
    let Some(f) = fixture("detached").await else {
        return;
    };
    let id = f.create("bx-dk-detached").await;
    let detached = f.docker.require_detached().unwrap();
    let handle = detached
        .spawn(
            &id,
            &ExecRequest::shell("echo started; sleep 60 & echo $! > /tmp/bg; sleep 60"),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        detached.status(&id, &handle).await.unwrap(),
        ProcessStatus::Running
    );
    let log = f
        .docker
        .require_files()
        .unwrap()
        .read(&id, &format!("/var/tmp/berth-procs/{}.out", handle.0))
        .await
        .unwrap();
    assert_eq!(text(&log), "started\n");
    detached.kill(&id, &handle).await.unwrap();
    detached.kill(&id, &handle).await.unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match detached.status(&id, &handle).await.unwrap() {
            ProcessStatus::Finished { status } => {
                assert_eq!(status, ExitStatus::Signalled { signal: 9 });
                break;
            }
            ProcessStatus::Running => assert!(Instant::now() < until, "still running"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bg = f
        .sh(
            &id,
            "sleep 0.2; test -d /proc/$(cat /tmp/bg) && echo alive || echo gone",
        )
        .await;
    assert_eq!(text(&bg.stdout), "gone\n", "kill takes the whole group");
    let timed = detached
        .spawn(
            &id,
            &ExecRequest::shell("true").with_timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert_eq!(timed.kind(), ErrorKind::InvalidRequest);
    f.docker
        .require_stop_start()
        .unwrap()
        .stop(&id)
        .await
        .unwrap();
    f.docker
        .require_stop_start()
        .unwrap()
        .start(&id)
        .await
        .unwrap();
    let forgotten = detached.status(&id, &handle).await.unwrap_err();
    assert_eq!(forgotten.kind(), ErrorKind::NotFound, "{forgotten}");
    f.docker.destroy(&id).await.unwrap();
}

/// The loopback forward: a busy port is a conflict, two connections made at once each reach
/// the host separately, and a dropped forward stops listening inside the sandbox.
#[tokio::test]
async fn loopback_forward_conflicts_concurrency_and_stop() {
    let Some(f) = fixture("forward").await else {
        return;
    };
    let id = f.create("bx-dk-forward").await;
    let forward = f.docker.require_loopback_forward().unwrap();
    let mut port = forward.forward_loopback(&id, 47_811).await.unwrap();
    let busy = forward.forward_loopback(&id, 47_811).await.err().unwrap();
    assert_eq!(busy.kind(), ErrorKind::Conflict, "{busy}");
    let zero = forward.forward_loopback(&id, 0).await.err().unwrap();
    assert_eq!(zero.kind(), ErrorKind::InvalidRequest, "{zero}");

    // Two clients at once; the host answers each with what it read, upper-cased.
    let host = tokio::spawn(async move {
        let mut served = Vec::new();
        for _ in 0..2 {
            let stream = port.accept().await.unwrap();
            served.push(tokio::task::spawn_blocking(move || {
                use std::io::{Read, Write};
                let mut stream = stream;
                let mut got = [0u8; 3];
                stream.read_exact(&mut got).unwrap();
                stream.write_all(&got.to_ascii_uppercase()).unwrap();
                got
            }));
        }
        let mut got = Vec::new();
        for s in served {
            got.push(s.await.unwrap());
        }
        got.sort();
        (port, got)
    });
    let bash = |script: &str| ExecRequest::argv(["bash", "-c", script]);
    let out = f
        .docker
        .exec(
            &id,
            &bash(
                "for w in abc xyz; do (exec 3<>/dev/tcp/127.0.0.1/47811; printf $w >&3; \
                 head -c 3 <&3 > /tmp/$w) & done; wait; cat /tmp/abc /tmp/xyz",
            ),
        )
        .await
        .unwrap();
    assert_eq!(text(&out.stdout), "ABCXYZ", "{out:?}");
    let (port, got) = tokio::time::timeout(Duration::from_secs(20), host)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, vec![*b"abc", *b"xyz"]);

    // Dropped: the port closes inside the sandbox (within a moment) and can be opened again.
    drop(port);
    let mut closed = false;
    for _ in 0..50 {
        let probe = f
            .docker
            .exec(&id, &bash("exec 3<>/dev/tcp/127.0.0.1/47811"))
            .await
            .unwrap();
        if !probe.status.success() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        closed,
        "the port still accepts after its forward was dropped"
    );
    let again = forward.forward_loopback(&id, 47_811).await;
    assert!(again.is_ok(), "{:?}", again.err());
    drop(again);
    f.docker.destroy(&id).await.unwrap();
}

/// A sandbox that opens connection after connection gets at most 64 through at once: the rest
/// are closed inside the sandbox, so it cannot pile up host sockets or supervisor threads.
#[tokio::test]
async fn loopback_forward_caps_open_connections() {
    let Some(f) = fixture("forward-cap").await else {
        return;
    };
    let id = f.create("bx-dk-forward-cap").await;
    let forward = f.docker.require_loopback_forward().unwrap();
    let mut port = forward.forward_loopback(&id, 47_812).await.unwrap();
    let request = ExecRequest::argv([
        "bash",
        "-c",
        "for i in $(seq 80); do (exec 3<>/dev/tcp/127.0.0.1/47812 && sleep 6) & done; wait",
    ])
    .with_timeout(Duration::from_secs(30));
    let host = async {
        let mut held = Vec::new();
        while let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(3), port.accept()).await
        {
            held.push(stream);
        }
        held.len()
    };
    let (client, reached) = tokio::join!(f.docker.exec(&id, &request), host);
    client.unwrap();
    assert_eq!(reached, 64, "connections that reached the host");
    drop(port);
    f.docker.destroy(&id).await.unwrap();
}
