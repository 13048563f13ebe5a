//! Docker provider, live: walls, limits and network modes, a tampered control channel, an
//! unreachable engine, secrets kept out of the container config, races and duplicates.

use berth_contract::{DestroyOutcome, ErrorKind, ExecRequest, NativeId, Provider, ProviderExt};
use berth_provider_docker::{DockerConfig, DockerProvider};
use berth_testkit::{image_exists, load_untagged_image};
use std::path::PathBuf;
use std::time::{Duration, Instant};
mod docker_support;

use docker_support::*;

#[tokio::test]
async fn exec_env_values_stay_out_of_container_config_and_argv() {
    let Some(f) = fixture("env").await else {
        return;
    };
    let id = f.create("bx-dk-env").await;
    let canary = format!("canary-{}-docker", std::process::id());
    let out = f
        .docker
        .exec(
            &id,
            &ExecRequest::shell("test \"$TOKEN\" = \"$EXPECT\" && echo same")
                .with_env("TOKEN", canary.clone())
                .with_env("EXPECT", canary.clone()),
        )
        .await
        .unwrap();
    assert_eq!(text(&out.stdout), "same\n");
    let inspect = std::process::Command::new("docker")
        .args(["inspect", &id.0])
        .output()
        .unwrap();
    assert!(inspect.status.success());
    assert!(
        !text(&inspect.stdout).contains(&canary),
        "secret in container config"
    );
    f.docker.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn limits_and_network_modes_reach_the_engine() {
    let Some(f) = fixture("limits").await else {
        return;
    };
    let mut req = f.request("bx-dk-limits");
    req.resources = berth_contract::Resources {
        cpus: Some(0.5),
        memory_mib: Some(256),
        pids: Some(64),
    };
    req.network = berth_contract::NetworkMode::Bridge;
    let id = f.docker.create(&req).await.unwrap().native_id;
    let inspect = std::process::Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.PidsLimit}} {{.HostConfig.NetworkMode}} {{.HostConfig.Init}}",
            &id.0,
        ])
        .output()
        .unwrap();
    assert_eq!(
        text(&inspect.stdout).trim(),
        "500000000 268435456 64 bridge true"
    );
    let links = f.sh(&id, "ls /sys/class/net").await;
    assert!(
        text(&links.stdout).contains("eth0"),
        "bridge gives an interface"
    );
    f.docker.destroy(&id).await.unwrap();
}

/// A sandbox that forks without end stops at its walls (issue 9: a bounded fork bomb reached
/// 4,088 host processes when no pids limit was set), cannot make device nodes, and setuid
/// binaries grant nothing.
#[tokio::test]
async fn default_walls_stop_a_fork_bomb_and_mknod() {
    let Some(f) = fixture("walls").await else {
        return;
    };
    let id = f.create("bx-dk-walls").await;
    let bomb = f
        .sh(
            &id,
            // The subshell dies at its first failed fork; its children stay until the exec ends.
            "(i=0; while [ $i -lt 1500 ]; do sleep 30 & i=$((i+1)); done) 2>/dev/null; \
             set -- /proc/[0-9]*; echo $#",
        )
        .await;
    let running: u64 = text(&bomb.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{bomb:?}"));
    assert!(
        running <= berth_provider_docker::DEFAULT_PIDS_LIMIT,
        "{running} processes ran in one sandbox"
    );
    assert!(running > 500, "the loop ran ({running} processes)");
    let mknod = f.sh(&id, "mknod /tmp/blk b 7 0").await;
    assert!(!mknod.status.success(), "mknod succeeded without CAP_MKNOD");
    let nnp = f.sh(&id, "grep NoNewPrivs /proc/self/status").await;
    assert!(text(&nnp.stdout).contains('1'), "{}", text(&nnp.stdout));
    // Nothing executable or special comes back through a mount (issue 9: a setuid-root copy
    // of `id` appeared on the host): the socket directory is a nosuid,nodev,noexec tmpfs, and
    // nothing written there reaches the host's state directory.
    if f.docker_private_run() {
        let mount = f.sh(&id, "grep ' /run/berth ' /proc/self/mountinfo").await;
        let line = text(&mount.stdout);
        for flag in ["nosuid", "nodev", "noexec"] {
            assert!(line.contains(flag), "/run/berth lacks {flag}: {line}");
        }
        let planted = f
            .sh(
                &id,
                "cp /bin/true /run/berth/suid && chmod u+s /run/berth/suid && /run/berth/suid",
            )
            .await;
        assert!(!planted.status.success(), "a binary ran from /run/berth");
        let on_host = std::process::Command::new("find")
            .arg(f._state.path())
            .args(["-name", "suid"])
            .output()
            .unwrap();
        assert!(on_host.stdout.is_empty(), "{}", text(&on_host.stdout));
    }
    f.docker.destroy(&id).await.unwrap();
}

/// The supervisor's socket lives in a directory the sandbox can write. A sandbox that replaces
/// it — a symlink to another sandbox's socket (path from its mount table), a symlink to a host
/// listener, or a listener of its own that answers every exec with "all tests passed", exit 0 —
/// gets nothing: the peer is not the pinned supervisor, so nothing is sent (no command, no
/// secret) and the exec is a `tampered` error, not a result, and returns at once.
#[tokio::test]
async fn a_replaced_supervisor_socket_receives_nothing_and_lies_about_nothing() {
    let Some(f) = fixture("socket").await else {
        return;
    };
    let victim = f.create("bx-dk-victim").await;
    let attacker = f.create("bx-dk-attacker").await;
    let canary = "CANARY-9f31c7d2e8";
    let mut secret_exec = ExecRequest::shell("touch /tmp/ran-here; echo \"$API_TOKEN\"");
    secret_exec = secret_exec.with_env("API_TOKEN", canary);

    // 1. A symlink to the other sandbox's socket, its host path learned from the mount table.
    let mountinfo = f
        .sh(&attacker, "grep ' /run/berth ' /proc/self/mountinfo")
        .await;
    assert!(mountinfo.status.success(), "the run dir is a mount");
    // The victim's socket as the host reaches it (bound directory or its /proc root).
    let pid = std::process::Command::new("docker")
        .args(["inspect", "--format", "{{.State.Pid}}", &victim.0])
        .output()
        .unwrap();
    let bound = f._state.path().join(&victim.0).join("run/s.sock");
    let victim_socket = if bound.exists() {
        bound
    } else {
        PathBuf::from(format!(
            "/proc/{}/root/run/berth/s.sock",
            text(&pid.stdout).trim()
        ))
    };
    assert!(victim_socket.exists(), "{}", victim_socket.display());
    let relink = f
        .docker
        .exec(
            &attacker,
            &ExecRequest::argv([
                "ln",
                "-sf",
                &victim_socket.to_string_lossy(),
                "/run/berth/s.sock",
            ]),
        )
        .await;
    // The link replaced the socket before the answer came back: the reply may be lost.
    let _ = relink;
    let refused = f.docker.exec(&attacker, &secret_exec).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Tampered, "{refused}");
    assert!(!refused.to_string().contains(canary));
    let ran = f
        .sh(&victim, "test -e /tmp/ran-here && echo yes || echo no")
        .await;
    assert_eq!(
        text(&ran.stdout),
        "no\n",
        "the other sandbox ran the command"
    );

    // 2. A symlink to a host listener.
    let host_dir = tempfile::tempdir().unwrap();
    let host_socket = host_dir.path().join("l.sock");
    let listener = std::os::unix::net::UnixListener::bind(&host_socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    let third = f.create("bx-dk-third").await;
    let _ = f
        .docker
        .exec(
            &third,
            &ExecRequest::argv([
                "ln",
                "-sf",
                &host_socket.to_string_lossy(),
                "/run/berth/s.sock",
            ]),
        )
        .await;
    let refused = f.docker.exec(&third, &secret_exec).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Tampered, "{refused}");
    if let Ok((mut conn, _)) = listener.accept() {
        use std::io::Read;
        conn.set_nonblocking(false).unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut got = Vec::new();
        let _ = conn.read_to_end(&mut got);
        assert!(
            got.is_empty(),
            "the host listener received {:?}",
            text(&got)
        );
    }

    // 3. A listener of the sandbox's own that lies (and one that would never answer).
    let fake = r#"import socket, os, struct, json
p = '/run/berth/s.sock'
os.unlink(p)
s = socket.socket(socket.AF_UNIX); s.bind(p); s.listen(8)
open('/tmp/listening', 'w').close()
while True:
    c, _ = s.accept(); c.recv(65536)
    out = b'all tests passed\n'
    c.sendall(bytes([1]) + struct.pack('>I', len(out)) + out)
    e = json.dumps({'status': 'exited', 'code': 0}).encode()
    c.sendall(bytes([3]) + struct.pack('>I', len(e)) + e); c.close()
"#;
    let liar = f.create("bx-dk-liar").await;
    f.docker
        .require_files()
        .unwrap()
        .write(&liar, "/tmp/fake.py", fake.as_bytes())
        .await
        .unwrap();
    f.docker
        .require_detached()
        .unwrap()
        .spawn(&liar, &ExecRequest::argv(["python3", "/tmp/fake.py"]))
        .await
        .unwrap();
    // Wait for the impersonator to listen (it says so in a file, read through the Engine's
    // archive API, not the socket it replaced); a fixed wait lost this race under load.
    let files = f.docker.require_files().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while files.read(&liar, "/tmp/listening").await.is_err() {
        assert!(Instant::now() < deadline, "the impersonator never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let lie = f
        .docker
        .exec(
            &liar,
            &ExecRequest::argv(["false"]).with_timeout(Duration::from_secs(2)),
        )
        .await;
    match lie {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Tampered, "{e}"),
        Ok(out) => panic!("an impersonated supervisor's answer was taken as the result: {out:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    for id in [&victim, &attacker, &third, &liar] {
        f.docker.destroy(id).await.unwrap();
    }
}

#[tokio::test]
async fn an_unreachable_engine_is_unavailable_not_absent() {
    let state = tempfile::tempdir().unwrap();
    let docker = DockerProvider::new(DockerConfig::new(
        state.path().to_owned(),
        PathBuf::from("/nonexistent/docker.sock"),
        supervisor(),
    ))
    .unwrap();
    let err = docker
        .observe(&NativeId("bx-any".into()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("not reachable"), "{err}");
}

/// A keyed snapshot taken again (a checkpoint retried after a crash) replaces the earlier
/// image instead of leaving a duplicate; a fork's image is removed with the fork, even when
/// only its name is known.
#[tokio::test]
async fn keyed_snapshots_and_fork_images_leave_no_duplicates() {
    let Some(f) = fixture("keyed").await else {
        return;
    };
    let id = f.create("bx-dk-keyed").await;
    let snapshots = f.docker.require_snapshots().unwrap();
    let key = format!("ck-test-{}", std::process::id());
    let first = snapshots.snapshot_keyed(&id, &key).await.unwrap();
    let second = snapshots.snapshot_keyed(&id, &key).await.unwrap();
    assert_ne!(first.handle, second.handle);
    assert!(
        !image_exists(&first.handle),
        "the replaced snapshot image was left behind"
    );
    assert!(image_exists(&second.handle));
    snapshots.delete_snapshot(&second).await.unwrap();
    assert!(!image_exists(&second.handle));

    let fork_req = f.request("bx-dk-keyed-fork");
    let fork_name = fork_req.name.0.clone();
    let fork = f
        .docker
        .require_fork()
        .unwrap()
        .fork(&id, &fork_req)
        .await
        .unwrap();
    let fork_image = format!("berth-snapshot:fork-{fork_name}");
    assert!(image_exists(&fork_image));
    f.docker.destroy(&fork.native_id).await.unwrap();
    assert!(
        !image_exists(&fork_image),
        "the fork's image outlived the fork"
    );
    // A crash between the fork's commit and its container leaves only the image: destroying
    // the fork by name (what the ledger row knows) removes it.
    let orphan = std::process::Command::new("docker")
        .args(["tag", "berth/agent:bookworm", &fork_image])
        .status()
        .unwrap();
    assert!(orphan.success());
    f.docker.destroy(&NativeId(fork_name)).await.unwrap();
    assert!(
        !image_exists(&fork_image),
        "destroy by name left the fork image"
    );
    f.docker.destroy(&id).await.unwrap();
}

/// Whether the engine has `container` paused (a commit under way pauses it).
async fn paused(container: &str) -> bool {
    let out = tokio::process::Command::new("docker")
        .args(["inspect", "-f", "{{.State.Paused}}", container])
        .output()
        .await
        .unwrap();
    text(&out.stdout).trim() == "true"
}

/// Untagged images the engine holds that are bigger than `bytes` (a commit of this test's
/// data, since no other test writes that much).
fn big_untagged_images(bytes: u64) -> Vec<String> {
    let ids = std::process::Command::new("docker")
        .args(["images", "-aq", "--no-trunc", "--filter", "dangling=true"])
        .output()
        .unwrap();
    text(&ids.stdout)
        .split_whitespace()
        .filter(|id| {
            let size = std::process::Command::new("docker")
                .args(["image", "inspect", "-f", "{{.Size}}", id])
                .output()
                .unwrap();
            text(&size.stdout).trim().parse::<u64>().unwrap_or(0) > bytes
        })
        .map(str::to_owned)
        .collect()
}

/// A checkpoint whose caller was killed mid-commit: the engine finishes that commit on its
/// own, after Berth has retried. The abandoned image must neither take the key's tag from the
/// retried snapshot nor outlive the key's deletion. (Before, the engine tagged it when it was
/// done: one of the two images was left behind, tagged or untagged.)
#[tokio::test]
async fn a_commit_whose_caller_was_killed_neither_takes_the_key_nor_outlives_it() {
    let Some(f) = fixture("abandoned").await else {
        return;
    };
    let id = f.create("bx-dk-abandoned").await;
    // Enough new data that a commit is still under way when its caller goes.
    let wrote = f
        .sh(&id, "head -c 300000000 /dev/urandom > /workspace/big")
        .await;
    assert!(wrote.status.success(), "{:?}", wrote.status);
    let base = std::process::Command::new("docker")
        .args(["image", "inspect", "-f", "{{.Size}}", &image()])
        .output()
        .unwrap();
    let big = text(&base.stdout).trim().parse::<u64>().unwrap() + 250_000_000;
    let leftover_before = big_untagged_images(big);
    let snapshots = f.docker.require_snapshots().unwrap();
    let key = format!("ck-abandoned-{}", std::process::id());
    // The caller is dropped (its connection closed) once the engine has paused the container.
    tokio::select! {
        taken = snapshots.snapshot_keyed(&id, &key) => panic!("the commit ended before its caller could be killed: {taken:?}"),
        () = async { while !paused(&id.0).await { tokio::time::sleep(Duration::from_millis(10)).await } } => {}
    }
    // The retry, while the abandoned commit goes on.
    let retried = snapshots.snapshot_keyed(&id, &key).await.unwrap();
    // The abandoned commit is over when the engine unpauses the container.
    let started = Instant::now();
    while paused(&id.0).await {
        assert!(started.elapsed() < Duration::from_secs(120), "still paused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tagged = std::process::Command::new("docker")
        .args(["image", "inspect", "-f", "{{.Id}}"])
        .arg(format!("berth-snapshot:key-{key}"))
        .output()
        .unwrap();
    assert_eq!(
        text(&tagged.stdout).trim(),
        retried.handle,
        "the key's tag names another image than the retried snapshot"
    );
    snapshots.delete_keyed(&key).await.unwrap();
    let left: Vec<String> = big_untagged_images(big)
        .into_iter()
        .filter(|i| !leftover_before.contains(i))
        .collect();
    let _ = std::process::Command::new("docker")
        .arg("rmi")
        .args(&left)
        .output();
    assert!(
        left.is_empty(),
        "the abandoned commit's image outlived the key: {left:?}"
    );
    f.docker.destroy(&id).await.unwrap();
}

/// The time now, as RFC 3339 in UTC.
fn utc_now() -> String {
    let now = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    text(&now.stdout).trim().to_owned()
}

/// Held by the tests that load old untagged images and then look for them: each one's
/// housekeeping would remove the other's.
static HOUSEKEEPING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What a killed commit left untagged for a key or a fork (the engine finished it after the
/// key was deleted) is removed by the next keyed snapshot, key deletion or fork removal once it
/// is 2 minutes old; a fresh one (its call may be about to tag it) and a plain snapshot (a
/// user's restore names it by digest) are left alone.
#[tokio::test]
async fn abandoned_commits_are_removed_by_later_housekeeping() {
    let Some(f) = fixture("housekeeping").await else {
        return;
    };
    let _alone = HOUSEKEEPING.lock().await;
    let dir = tempfile::Builder::new()
        .prefix("berth-test-abandoned-")
        .tempdir()
        .unwrap();
    let run = std::process::id();
    let now = utc_now();
    let old_key = load_untagged_image(
        dir.path(),
        "2026-01-01T00:00:00Z",
        &format!("key:ck-gone-{run}"),
    );
    let old_fork = load_untagged_image(
        dir.path(),
        "2026-01-01T00:00:01Z",
        &format!("fork:bx-gone-{run}"),
    );
    let old_snapshot = load_untagged_image(dir.path(), "2026-01-01T00:00:02Z", "snapshot");
    let fresh_key = load_untagged_image(dir.path(), &now, &format!("key:ck-fresh-{run}"));
    for image in [&old_key, &old_fork, &old_snapshot, &fresh_key] {
        assert!(image_exists(image), "{image} was not loaded");
    }
    let snapshots = f.docker.require_snapshots().unwrap();
    snapshots
        .delete_keyed(&format!("ck-other-{run}"))
        .await
        .unwrap();
    let left: Vec<bool> = [&old_key, &old_fork, &old_snapshot, &fresh_key]
        .iter()
        .map(|image| image_exists(image))
        .collect();
    let _ = std::process::Command::new("docker")
        .args(["rmi", &old_key, &old_fork, &old_snapshot, &fresh_key])
        .output();
    assert_eq!(
        left,
        [false, false, true, true],
        "left: old key image, old fork image, old plain snapshot, fresh key image"
    );
}

/// `remove_residue` (what `berth gc` asks every provider) removes an abandoned commit and says
/// which, and nothing else: a fresh untagged image and an old plain snapshot stay.
#[tokio::test]
async fn residue_removal_names_the_abandoned_commits_it_removed() {
    let Some(f) = fixture("residue").await else {
        return;
    };
    let _alone = HOUSEKEEPING.lock().await;
    let dir = tempfile::Builder::new()
        .prefix("berth-test-residue-")
        .tempdir()
        .unwrap();
    let run = std::process::id();
    let old_snapshot = load_untagged_image(
        dir.path(),
        "2026-01-01T00:00:03Z",
        &format!("snapshot-{run}"),
    );
    let fresh_fork = load_untagged_image(
        dir.path(),
        &utc_now(),
        &format!("fork:bx-fresh-residue-{run}"),
    );
    // Any other test's docker destroy also clears abandoned commits, so one may take ours
    // first: the report must name it in one of a few tries, and never name what stays.
    let mut named = false;
    for attempt in 0..5 {
        let old_key = load_untagged_image(
            dir.path(),
            &format!("2026-01-01T00:01:0{attempt}Z"),
            &format!("key:ck-residue-{run}"),
        );
        let report = f.docker.remove_residue().await.unwrap();
        assert!(
            !image_exists(&old_key),
            "{old_key} stayed; report {report:?}"
        );
        for line in &report {
            assert!(
                !line.contains(&old_snapshot) && !line.contains(&fresh_fork),
                "{line}"
            );
        }
        if let Some(line) = report.iter().find(|line| line.contains(&old_key)) {
            assert!(
                line.contains(&format!("`key:ck-residue-{run}`")),
                "the report does not say what the image was made for: {line}"
            );
            named = true;
            break;
        }
    }
    let kept = [image_exists(&old_snapshot), image_exists(&fresh_fork)];
    let _ = std::process::Command::new("docker")
        .args(["rmi", &old_snapshot, &fresh_fork])
        .output();
    assert!(named, "no report named the abandoned commit it removed");
    assert_eq!(
        kept,
        [true, true],
        "kept: old plain snapshot, fresh fork image"
    );
}

/// Two housekeepings at once (two `berth gc`, or a gc beside a destroy) both succeed: an image
/// the other removed first is gone, not a failure — the engine can say so with a 500
/// ("unrecognized image ID"), which failed a `remove_residue` in CI.
#[tokio::test]
async fn racing_housekeepings_both_succeed_and_remove_everything() {
    let Some(f) = fixture("racing-residue").await else {
        return;
    };
    let _alone = HOUSEKEEPING.lock().await;
    let dir = tempfile::Builder::new()
        .prefix("berth-test-racing-residue-")
        .tempdir()
        .unwrap();
    let run = std::process::id();
    for round in 0..4 {
        let images: Vec<String> = (0..6)
            .map(|n| {
                load_untagged_image(
                    dir.path(),
                    &format!("2026-01-01T00:0{round}:0{n}Z"),
                    &format!("key:ck-racing-{run}-{round}-{n}"),
                )
            })
            .collect();
        let (a, b) = tokio::join!(f.docker.remove_residue(), f.docker.remove_residue());
        let (a, b) = (a.unwrap(), b.unwrap());
        for image in &images {
            assert!(!image_exists(image), "round {round}: {image} stayed");
        }
        // Each image is reported once, by whichever call removed it.
        let reported = images
            .iter()
            .filter(|image| a.iter().chain(&b).any(|line| line.contains(image.as_str())))
            .count();
        assert!(reported <= images.len(), "{a:?} {b:?}");
    }
}

/// A directory the sandbox filled with more names than a listing may hold is refused at the
/// limit; one at the limit is listed whole.
#[tokio::test]
async fn a_listing_holds_at_most_max_list_entries() {
    let Some(f) = fixture("wide").await else {
        return;
    };
    let id = f.create("bx-dk-wide").await;
    let max = berth_contract::MAX_LIST_ENTRIES;
    let made = f
        .sh(
            &id,
            &format!("mkdir wide && cd wide && seq 1 {max} | xargs touch && mkdir -p ../deep/d && cd ../deep/d && seq 1 {max} | xargs touch && touch ../../deep/x"),
        )
        .await;
    assert!(made.status.success(), "{:?}", made.status);
    let files = f.docker.require_files().unwrap();
    assert_eq!(files.list(&id, "wide").await.unwrap().len(), max);
    // Many names below a directory's children are not its entries.
    assert_eq!(files.list(&id, "deep").await.unwrap().len(), 2);
    let more = f.sh(&id, "touch wide/one-more").await;
    assert!(more.status.success());
    let err = files.list(&id, "wide").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(
        err.to_string()
            .contains("`wide` holds more than the file API's limit of 100000 entries"),
        "{err}"
    );
    f.docker.destroy(&id).await.unwrap();
}

/// Destroys racing each other (a caller killed mid-destroy, then a sweep): the engine answers
/// "removal already in progress" to all but one; every caller still ends verified gone.
#[tokio::test]
async fn racing_destroys_all_end_verified_gone() {
    let Some(f) = fixture("racing-destroy").await else {
        return;
    };
    for round in 0..3 {
        let id = f.create(&format!("bx-dk-race-{round}")).await;
        let outcomes = futures_join((0..4).map(|_| {
            let docker = f.docker.clone();
            let id = id.clone();
            tokio::spawn(async move { docker.destroy(&id).await })
        }))
        .await;
        for outcome in outcomes {
            assert!(
                matches!(outcome, Ok(DestroyOutcome::VerifiedGone { .. })),
                "round {round}: {outcome:?}"
            );
        }
    }
}
