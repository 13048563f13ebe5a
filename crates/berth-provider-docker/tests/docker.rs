//! Live tests of the docker provider against a real `dockerd` and the reference image
//! (`scripts/build-agent-image.sh`, or `BERTH_TEST_IMAGE`). They fail when the engine is not
//! reachable; set `BERTH_SKIP_DOCKER=1` to skip them explicitly.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use berth_contract::{
    CanonicalState, CreateRequest, DestroyOutcome, ErrorKind, ExecOutput, ExecRequest, ExitStatus,
    FileKind, LabelFilter, Labels, NativeId, Observation, Provider, ProviderExt, SandboxName,
    Transition,
};
use berth_provider_docker::{DockerConfig, DockerProvider};

fn image() -> String {
    std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth/agent:bookworm".into())
}

fn supervisor() -> PathBuf {
    // scripts/test builds the static supervisor and names it here.
    if let Some(path) = std::env::var_os("BERTH_SUPERVISOR") {
        return PathBuf::from(path);
    }
    // Otherwise: integration tests live in target/<profile>/deps, and cargo builds workspace
    // binaries into target/<profile> before running tests.
    let exe = std::env::current_exe().unwrap();
    let candidate = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("berth-supervisor");
    if !candidate.is_file() {
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "berth-supervisor"])
            .status()
            .unwrap();
        assert!(status.success(), "cannot build berth-supervisor");
    }
    candidate
}

struct Fixture {
    _state: tempfile::TempDir,
    docker: DockerProvider,
    run: String,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Leave nothing running, whatever the test did.
        let ids = std::process::Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=berth.run={}", self.run),
            ])
            .output();
        if let Ok(ids) = ids {
            let ids = String::from_utf8_lossy(&ids.stdout);
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let _ = std::process::Command::new("docker")
                    .arg("rm")
                    .arg("-f")
                    .args(&ids)
                    .output();
            }
        }
    }
}

async fn fixture(test: &str) -> Option<Fixture> {
    let state = tempfile::Builder::new()
        .prefix("berth-test-docker-")
        .tempdir()
        .unwrap();
    let config = DockerConfig {
        kill_grace: Duration::from_millis(300),
        ..DockerConfig::new(
            state.path().to_owned(),
            PathBuf::from("/var/run/docker.sock"),
            supervisor(),
        )
    };
    let ready = match DockerProvider::new(config) {
        Ok(docker) => docker.engine().versions().await.map(|_| docker),
        Err(err) => Err(err),
    };
    match ready {
        Ok(docker) => Some(Fixture {
            _state: state,
            docker,
            run: format!("test-{test}-{}", std::process::id()),
        }),
        Err(err) if std::env::var_os("BERTH_SKIP_DOCKER").is_some() => {
            eprintln!("SKIPPED (BERTH_SKIP_DOCKER set): {err}");
            None
        }
        Err(err) => panic!("{err}; these tests need a running dockerd (set BERTH_SKIP_DOCKER=1 to skip explicitly)"),
    }
}

impl Fixture {
    fn docker_private_run(&self) -> bool {
        DockerConfig::new(PathBuf::new(), PathBuf::new(), PathBuf::new()).private_run
    }

    fn request(&self, name: &str) -> CreateRequest {
        let mut req = CreateRequest::new(
            SandboxName(format!("{name}-{}", std::process::id())),
            Labels {
                owner: "berth-test".into(),
                run_id: self.run.clone(),
                ledger_token: format!("tok-{name}"),
                expires_at_unix: None,
            },
        );
        req.image = Some(image());
        req
    }

    async fn create(&self, name: &str) -> NativeId {
        self.docker
            .create(&self.request(name))
            .await
            .unwrap()
            .native_id
    }

    async fn sh(&self, id: &NativeId, line: &str) -> ExecOutput {
        self.docker
            .exec(id, &ExecRequest::shell(line))
            .await
            .unwrap()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

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
    f.docker.destroy(&id).await.unwrap();
}

async fn init_start_time(f: &Fixture, id: &NativeId) -> String {
    text(&f.sh(id, "cut -d' ' -f22 /proc/1/stat").await.stdout)
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
    tokio::time::sleep(Duration::from_millis(500)).await;
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
    let image_exists = |image: &str| {
        std::process::Command::new("docker")
            .args(["image", "inspect", image])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
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

async fn futures_join<T>(handles: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for handle in handles.collect::<Vec<_>>() {
        out.push(handle.await.unwrap());
    }
    out
}
