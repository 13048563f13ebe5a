//! Live tests of the bwrap provider against the real `bwrap` binary, including escape tests.
//! They fail when bubblewrap is missing; set `BERTH_SKIP_BWRAP=1` to skip them explicitly.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use berth_contract::{
    CreateRequest, DestroyOutcome, ErrorKind, ExecOutput, ExecRequest, ExitStatus, Labels,
    NativeId, NetworkMode, Provider, ProviderExt, SandboxName,
};
use berth_provider_bwrap::{BwrapConfig, BwrapProvider};
use berth_testkit::marked_processes;

struct Fixture {
    state: tempfile::TempDir,
    bwrap: BwrapProvider,
}

fn fixture() -> Option<Fixture> {
    let state = tempfile::Builder::new()
        .prefix("berth-test-bwrap-")
        .tempdir()
        .unwrap();
    // bwrap's own PID namespace ends every process with the command; the helper binary is
    // needed only to enter sandboxes unprivileged when the tests run as root.
    let config = BwrapConfig {
        kill_grace: Duration::from_millis(300),
        reaper: Some(berth_testkit::supervisor_binary()),
    };
    match berth_provider_bwrap::new(state.path(), config) {
        Ok(bwrap) => Some(Fixture { state, bwrap }),
        Err(err) if std::env::var_os("BERTH_SKIP_BWRAP").is_some() => {
            eprintln!("SKIPPED (BERTH_SKIP_BWRAP set): {err}");
            None
        }
        Err(err) => {
            panic!("{err}; these tests need bubblewrap (set BERTH_SKIP_BWRAP=1 to skip explicitly)")
        }
    }
}

fn request(name: &str, network: NetworkMode) -> CreateRequest {
    let mut req = CreateRequest::new(
        SandboxName(name.into()),
        Labels {
            owner: "tester".into(),
            run_id: "run".into(),
            ledger_token: format!("tok-{name}"),
            expires_at_unix: None,
        },
    );
    req.network = network;
    req
}

async fn create(f: &Fixture, name: &str) -> NativeId {
    f.bwrap
        .create(&request(name, NetworkMode::None))
        .await
        .unwrap()
        .native_id
}

async fn sh(f: &Fixture, id: &NativeId, line: &str) -> ExecOutput {
    f.bwrap.exec(id, &ExecRequest::shell(line)).await.unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The sandbox's records of commands that may have left processes behind (the provider's
/// documented state layout: `sandboxes/<name>/running/`).
fn running_records(f: &Fixture, id: &NativeId) -> usize {
    std::fs::read_dir(f.state.path().join("sandboxes").join(&id.0).join("running"))
        .unwrap()
        .count()
}

fn wait_no_marked(sandbox: &str) -> bool {
    berth_testkit::wait_unmarked(sandbox, Duration::from_secs(5))
}

#[tokio::test]
async fn exec_runs_in_workspace_with_separate_streams_and_clean_env() {
    let Some(f) = fixture() else { return };
    let id = create(&f, "bx-bw-exec").await;
    let out = sh(
        &f,
        &id,
        "echo out; echo err >&2; pwd; echo HOME=$HOME; env | grep -c CARGO; exit 7",
    )
    .await;
    assert_eq!(out.status, ExitStatus::Exited { code: 7 });
    assert_eq!(text(&out.stdout), "out\n/workspace\nHOME=/workspace\n0\n");
    assert_eq!(text(out.stderr.as_deref().unwrap()), "err\n");
    let argv = f
        .bwrap
        .exec(&id, &ExecRequest::argv(["printf", "%s|", "a b", "$HOME"]))
        .await
        .unwrap();
    assert_eq!(text(&argv.stdout), "a b|$HOME|");
    let sub = f
        .bwrap
        .exec(&id, &ExecRequest::shell("mkdir -p d && cd d && pwd"))
        .await
        .unwrap();
    assert_eq!(text(&sub.stdout), "/workspace/d\n");
    let in_dir = f
        .bwrap
        .exec(&id, &ExecRequest::shell("pwd").with_cwd("/workspace/d"))
        .await
        .unwrap();
    assert_eq!(text(&in_dir.stdout), "/workspace/d\n");
    assert!(matches!(
        f.bwrap.destroy(&id).await.unwrap(),
        DestroyOutcome::VerifiedGone {
            already_absent: false
        }
    ));
}

#[tokio::test]
async fn escape_cannot_see_host_processes() {
    let Some(f) = fixture() else { return };
    let id = create(&f, "bx-bw-pid").await;
    let out = sh(&f, &id, "ls /proc | grep -c '^[0-9]'").await;
    let count: usize = text(&out.stdout).trim().parse().unwrap();
    // bwrap's init, the shell, ls and grep: nothing of the host's.
    assert!(count <= 5, "sandbox sees {count} processes");
    let host_count = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .count();
    assert!(host_count > count, "the host has {host_count} processes");
    let host_pid = std::process::id();
    let probe = sh(
        &f,
        &id,
        &format!("test -e /proc/{host_pid} && echo visible || echo hidden"),
    )
    .await;
    assert_eq!(text(&probe.stdout), "hidden\n");
    f.bwrap.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn escape_cannot_write_outside_the_workspace() {
    let Some(f) = fixture() else { return };
    let id = create(&f, "bx-bw-write").await;
    let marker = format!("berth-escape-{}", std::process::id());
    let out = sh(
        &f,
        &id,
        &format!(
            "touch /usr/{marker} 2>&1; echo x > /etc/{marker}; echo y > /{marker}; \
             echo z > /workspace/../{marker}; echo ok > /workspace/inside"
        ),
    )
    .await;
    assert!(
        text(&out.stdout).contains("Read-only file system"),
        "{}",
        text(&out.stdout)
    );
    for path in [
        format!("/usr/{marker}"),
        format!("/etc/{marker}"),
        format!("/{marker}"),
    ] {
        assert!(
            !std::path::Path::new(&path).exists(),
            "{path} reached the host"
        );
    }
    let ws = f.bwrap.workspace_dir(&id).unwrap();
    assert_eq!(std::fs::read_to_string(ws.join("inside")).unwrap(), "ok\n");
    assert!(!ws.parent().unwrap().join(&marker).exists());
    f.bwrap.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn escape_cannot_reach_host_loopback_without_network() {
    let Some(f) = fixture() else { return };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        "bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo connected || echo refused"
    );
    let id = create(&f, "bx-bw-net").await;
    let isolated = sh(&f, &id, &probe).await;
    assert_eq!(text(&isolated.stdout), "refused\n");
    let links = sh(
        &f,
        &id,
        "ls /sys/class/net 2>/dev/null || cat /proc/net/dev",
    )
    .await;
    assert!(!text(&links.stdout).contains("eth0"));
    // `bridge` would claim a network of the sandbox's own, which bwrap cannot give: refused.
    let bridge = f
        .bwrap
        .create(&request("bx-bw-net-bridge", NetworkMode::Bridge))
        .await
        .unwrap_err();
    assert_eq!(bridge.kind(), ErrorKind::Unsupported, "{bridge}");
    // `host` says what it is, and the same probe connects: the test can tell the difference.
    let open = f
        .bwrap
        .create(&request("bx-bw-net-open", NetworkMode::Host))
        .await
        .unwrap()
        .native_id;
    let connected = sh(&f, &open, &probe).await;
    assert_eq!(text(&connected.stdout), "connected\n");
    f.bwrap.destroy(&id).await.unwrap();
    f.bwrap.destroy(&open).await.unwrap();
}

#[tokio::test]
async fn escape_cannot_read_shadow() {
    let Some(f) = fixture() else { return };
    let id = create(&f, "bx-bw-shadow").await;
    let out = sh(&f, &id, "cat /etc/shadow").await;
    assert_ne!(out.status, ExitStatus::Exited { code: 0 });
    assert!(text(out.stderr.as_deref().unwrap()).contains("No such file"));
    let files = f.bwrap.require_files().unwrap();
    for path in ["/etc/shadow", "../../etc/shadow"] {
        let err = files.read(&id, path).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{path}");
    }
    f.bwrap.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn timeout_kills_everything_and_nothing_outlives_an_exec() {
    let Some(f) = fixture() else { return };
    let id = create(&f, "bx-bw-timeout").await;
    let started = Instant::now();
    let out = f
        .bwrap
        .exec(
            &id,
            &ExecRequest::shell("trap '' TERM; sleep 60 & sleep 60")
                .with_timeout(Duration::from_millis(400)),
        )
        .await
        .unwrap();
    assert_eq!(out.status, ExitStatus::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(wait_no_marked(&id.0), "processes survived the timeout");
    // The reaper answers only once everything the exec started is gone, so the exec keeps no
    // record of it and destroy need not search the process table.
    assert_eq!(
        running_records(&f, &id),
        0,
        "a record of the timed-out exec"
    );
    let started = Instant::now();
    let bg = sh(&f, &id, "sleep 300 & echo started").await;
    assert_eq!(text(&bg.stdout), "started\n");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Gone already when the exec returns, not some time later (bwrap alone reports the
    // command's exit before its namespace's other processes are killed).
    assert_eq!(
        marked_processes(&id.0),
        Vec::<u32>::new(),
        "a background process outlived the exec"
    );
    // Leaving the group does not help: the sandbox's PID namespace ends with the command.
    let daemon = sh(
        &f,
        &id,
        "setsid sh -c 'exec sleep 300' </dev/null >/dev/null 2>&1 & echo started",
    )
    .await;
    assert_eq!(text(&daemon.stdout), "started\n");
    assert_eq!(
        marked_processes(&id.0),
        Vec::<u32>::new(),
        "a setsid child outlived the exec"
    );
    assert_eq!(running_records(&f, &id), 0, "records of contained execs");
    f.bwrap.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn env_values_never_reach_argv() {
    let Some(f) = fixture() else { return };
    let id = create(&f, "bx-bw-env").await;
    let canary = format!("canary-{}-bwrap", std::process::id());
    let req = ExecRequest::shell("test \"$TOKEN\" = \"$EXPECTED\" && sleep 1 && echo same")
        .with_env("TOKEN", canary.clone())
        .with_env("EXPECTED", canary.clone());
    let exec = f.bwrap.exec(&id, &req);
    let scan = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .any(|cmdline| {
                cmdline
                    .windows(canary.len())
                    .any(|w| w == canary.as_bytes())
            })
    };
    let (out, leaked) = tokio::join!(exec, scan);
    assert_eq!(text(&out.unwrap().stdout), "same\n");
    assert!(!leaked, "an env value appeared in a process's argv");
    f.bwrap.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn files_snapshot_and_fork_go_through_the_workspace() {
    let Some(f) = fixture() else { return };
    let id = create(&f, "bx-bw-files").await;
    let files = f.bwrap.require_files().unwrap();
    let blob: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    files
        .write(&id, "/workspace/data/blob", &blob)
        .await
        .unwrap();
    assert_eq!(files.read(&id, "data/blob").await.unwrap(), blob);
    let seen = sh(&f, &id, "wc -c < /workspace/data/blob").await;
    assert_eq!(text(&seen.stdout).trim(), "10000");
    let snap = f
        .bwrap
        .require_snapshots()
        .unwrap()
        .snapshot(&id)
        .await
        .unwrap();
    sh(&f, &id, "echo later > data/later").await;
    let restored = f
        .bwrap
        .require_snapshots()
        .unwrap()
        .restore(&snap, &request("bx-bw-restored", NetworkMode::None))
        .await
        .unwrap()
        .native_id;
    let check = sh(&f, &restored, "ls data").await;
    assert_eq!(text(&check.stdout), "blob\n");
    let forked = f
        .bwrap
        .require_fork()
        .unwrap()
        .fork(&id, &request("bx-bw-fork", NetworkMode::None))
        .await
        .unwrap()
        .native_id;
    assert_eq!(
        text(&sh(&f, &forked, "ls data").await.stdout),
        "blob\nlater\n"
    );
    for id in [id, restored, forked] {
        f.bwrap.destroy(&id).await.unwrap();
    }
}

#[tokio::test]
async fn missing_program_is_an_error_not_an_exit_code() {
    let Some(f) = fixture() else { return };
    let id = create(&f, "bx-bw-missing").await;
    let err = f
        .bwrap
        .exec(&id, &ExecRequest::argv(["no-such-program-4711"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().starts_with("provider `bwrap`"), "{err}");
    assert!(f.bwrap.require_stop_start().is_err());
    assert!(f.bwrap.require_detached().is_err());
    f.bwrap.destroy(&id).await.unwrap();
}

/// Run as root, a sandbox's user is not root: its ids map to an unprivileged host user, it has
/// no capabilities, and what it writes belongs to that user — as do files Berth writes for it.
#[tokio::test]
async fn sandbox_user_is_unprivileged_even_when_berth_is_root() {
    let Some(f) = fixture() else { return };
    let id = create(&f, "bx-bw-uid").await;
    let out = sh(
        &f,
        &id,
        "id -u; grep -E '^(CapEff|CapPrm|CapBnd)' /proc/self/status; touch made-inside",
    )
    .await;
    let seen = text(&out.stdout);
    assert_eq!(out.status, ExitStatus::Exited { code: 0 }, "{seen}");
    for line in seen.lines().skip(1) {
        assert!(
            line.ends_with("0000000000000000"),
            "capabilities left: {line}"
        );
    }
    let ws = f.bwrap.workspace_dir(&id).unwrap();
    use std::os::unix::fs::MetadataExt;
    let inside = std::fs::metadata(ws.join("made-inside")).unwrap();
    if my_uid() == 0 {
        assert_eq!(seen.lines().next(), Some("65534"), "{seen}");
        assert_eq!(
            inside.uid(),
            berth_provider_bwrap::SANDBOX_USER,
            "a sandbox file is owned by host root"
        );
        // Berth's own writes are the sandbox user's too, so the sandbox can change them.
        f.bwrap
            .require_files()
            .unwrap()
            .write(&id, "deep/by-berth", b"x")
            .await
            .unwrap();
        assert_eq!(
            std::fs::metadata(ws.join("deep/by-berth")).unwrap().uid(),
            berth_provider_bwrap::SANDBOX_USER
        );
        let edit = sh(&f, &id, "echo y >> deep/by-berth && cat deep/by-berth").await;
        assert_eq!(text(&edit.stdout), "xy\n");
        // The workspace mount the sandbox gets is nosuid,nodev.
        let mounts = sh(&f, &id, "grep ' /workspace ' /proc/self/mountinfo").await;
        let mounts = text(&mounts.stdout);
        assert!(
            mounts.contains("nosuid") && mounts.contains("nodev"),
            "{mounts}"
        );
    } else {
        assert_eq!(inside.uid(), my_uid(), "files belong to the calling user");
    }
    f.bwrap.destroy(&id).await.unwrap();
}

/// This test process's uid (the owner of its /proc entry).
fn my_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid()
}

/// Execs keep starting while the sandbox is destroyed: the one in flight is found and killed
/// (reaper, bwrap and the sandbox's processes: as root the reaper runs as the sandbox's user),
/// later ones fail to start, and nothing is left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execs_racing_a_destroy_leave_nothing_running() {
    let Some(f) = fixture() else { return };
    let f = std::sync::Arc::new(f);
    for round in 0..4u64 {
        let name = format!("bx-bw-race-{round}");
        let id = create(&f, &name).await;
        let (g, racing) = (f.clone(), id.clone());
        let runner = tokio::spawn(async move {
            let line = "setsid sleep 300 </dev/null >/dev/null 2>&1 & sleep 300";
            let mut started = 0;
            while g
                .bwrap
                .exec(&racing, &ExecRequest::shell(line))
                .await
                .is_ok()
            {
                started += 1;
            }
            started
        });
        tokio::time::sleep(Duration::from_millis(30 + round * 20)).await;
        assert!(matches!(
            f.bwrap.destroy(&id).await.unwrap(),
            DestroyOutcome::VerifiedGone { .. }
        ));
        let after = tokio::time::timeout(Duration::from_secs(20), runner)
            .await
            .expect("an exec outlived its sandbox's destroy")
            .unwrap();
        assert!(after <= 1, "execs ran after the destroy: {after}");
        assert!(wait_no_marked(&name), "round {round}: processes left");
    }
}
