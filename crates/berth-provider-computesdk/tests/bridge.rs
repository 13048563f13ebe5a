//! The bridge against real ComputeSDK packages: `@computesdk/just-bash` live (a local
//! interpreter, no credentials), `@computesdk/e2b` against a local server answering with the
//! fixtures in `tests/fixtures/e2b.json` (E2B_API_URL points the vendor SDK at it).
//!
//! Needs `scripts/install-computesdk-bridge` (the test command runs it); without the packages
//! every test fails unless BERTH_SKIP_COMPUTESDK is set.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_contract::{
    CreateRequest, DestroyOutcome, ErrorKind, ExecRequest, ExitStatus, Labels, NativeId,
    NetworkMode, Observation, Provider, ProviderExt, SandboxName,
};
use berth_provider_computesdk::{BridgeConfig, ComputeSdk};

const CANARY: &str = "e2b_canary0f1e2d3c4b5a69788796a5b4c3d";

fn installed() -> bool {
    berth_testkit::computesdk_bridge_installed()
}

fn path() -> String {
    std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
}

fn provider(id: &str, env: Vec<(String, String)>, secrets: Vec<String>) -> ComputeSdk {
    let mut full = vec![("PATH".to_owned(), path())];
    full.extend(env);
    berth_provider_computesdk::new(
        id,
        BridgeConfig {
            node: "node".into(),
            dir: berth_provider_computesdk::default_bridge_dir(),
            env: full,
            secrets,
        },
    )
    .unwrap()
}

fn request(network: NetworkMode) -> CreateRequest {
    let labels = Labels {
        owner: "test@computesdk".into(),
        run_id: "run-1".into(),
        ledger_token: "tok".into(),
        expires_at_unix: None,
    };
    let mut req = CreateRequest::new(SandboxName("bx-csdk-test".into()), labels);
    req.network = network;
    req
}

/// A just-bash provider of its own (its own sidecar) and one sandbox in it.
async fn just_bash_sandbox() -> (ComputeSdk, NativeId) {
    let p = provider("computesdk:just-bash", vec![], vec![]);
    let id = p
        .create(&request(NetworkMode::None))
        .await
        .unwrap()
        .native_id;
    (p, id)
}

#[tokio::test]
async fn just_bash_round_trip_through_the_bridge() {
    if !installed() {
        return;
    }
    let (p, id) = just_bash_sandbox().await;
    // Labels are reported for a sandbox this bridge process created (the ledger's ownership
    // proof); a fresh bridge process would not find it at all (just-bash lives in the sidecar).
    match p.observe(&id).await.unwrap() {
        Observation::Present { labels, .. } => {
            assert_eq!(
                labels,
                request(NetworkMode::None).labels.to_map("bx-csdk-test")
            )
        }
        other => panic!("{other:?}"),
    }
    let other = provider("computesdk:just-bash", vec![], vec![]);
    assert_eq!(other.observe(&id).await.unwrap(), Observation::Absent);

    // Argv is quoted for the shell line ComputeSDK takes; stdout and stderr stay apart.
    let out = p
        .exec(
            &id,
            &ExecRequest::argv(["printf", "%s|", "it's", "$HOME", "a b", "`id`"]),
        )
        .await
        .unwrap();
    assert_eq!(out.status, ExitStatus::Exited { code: 0 });
    assert_eq!(out.stdout, b"it's|$HOME|a b|`id`|");

    let out = p
        .exec(
            &id,
            &ExecRequest::shell("echo out; echo err >&2; printf %s \"$GREETING\"; exit 3")
                .with_env("GREETING", "hello"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, ExitStatus::Exited { code: 3 });
    assert_eq!(out.stdout, b"out\nhello");
    assert_eq!(out.stderr.as_deref(), Some(&b"err\n"[..]));

    // State persists between execs of one sandbox.
    p.exec(&id, &ExecRequest::shell("echo kept > note.txt"))
        .await
        .unwrap();
    let out = p
        .exec(&id, &ExecRequest::shell("cat note.txt"))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"kept\n");

    // 127 is never passed off as a real "command not found": ComputeSDK uses it for its own
    // failures too.
    let out = p
        .exec(&id, &ExecRequest::shell("no-such-command-here"))
        .await
        .unwrap();
    match out.status {
        ExitStatus::Unknown { reason } => assert!(reason.contains("127"), "{reason}"),
        other => panic!("{other:?}"),
    }

    // Output beyond the cap is counted, not returned.
    let mut big = ExecRequest::shell("for i in $(seq 1 2000); do echo 0123456789; done");
    big.max_output_bytes = 1000;
    let out = p.exec(&id, &big).await.unwrap();
    assert_eq!(out.stdout.len(), 1000);
    assert_eq!(out.stdout_total, 22_000);
    assert!(out.stdout_truncated());

    // Optional capabilities answer Unsupported, never a stub.
    assert_eq!(
        p.require_files().err().map(|e| e.kind()),
        Some(ErrorKind::Unsupported)
    );

    // Destroy is verified through the provider's own getById, and idempotent.
    assert_eq!(
        p.destroy(&id).await.unwrap(),
        DestroyOutcome::VerifiedGone {
            already_absent: false
        }
    );
    assert_eq!(p.observe(&id).await.unwrap(), Observation::Absent);
    assert_eq!(
        p.destroy(&id).await.unwrap(),
        DestroyOutcome::VerifiedGone {
            already_absent: true
        }
    );
    let err = p.exec(&id, &ExecRequest::shell("true")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}

#[tokio::test]
async fn just_bash_refuses_what_it_cannot_do() {
    if !installed() {
        return;
    }
    let p = provider("computesdk:just-bash", vec![], vec![]);
    let err = p.create(&request(NetworkMode::Host)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    // just-bash has no images: a requested one is refused, never silently ignored.
    let mut imaged = request(NetworkMode::None);
    imaged.image = Some("ubuntu:24.04".into());
    let err = p.create(&imaged).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    let mut limited = request(NetworkMode::None);
    limited.resources.memory_mib = Some(256);
    let err = p.create(&limited).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    // just-bash has no network to give; nothing bridged gets the host's (refused before
    // anything is sent).
    let err = p.create(&request(NetworkMode::Bridge)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    let e2b = provider(
        "computesdk:e2b",
        vec![("E2B_API_KEY".into(), CANARY.into())],
        vec![CANARY.into()],
    );
    let err = e2b.create(&request(NetworkMode::Host)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(err.to_string().contains("`none` and `bridge`"), "{err}");
}

/// The deadline is enforced by killing the sidecar the interpreter runs in: the status is
/// TimedOut only because the command is dead, and the sandbox ends with it (what the manifest
/// says and the evidence records as a known failure).
#[tokio::test]
async fn just_bash_deadline_kills_the_bridge_and_its_sandboxes() {
    if !installed() {
        return;
    }
    let (p, id) = just_bash_sandbox().await;
    let pid = p.sidecar_pid().await.unwrap();
    let out = p
        .exec(
            &id,
            &ExecRequest::shell("sleep 30; echo late").with_timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    assert_eq!(out.status, ExitStatus::TimedOut);
    assert!(out.duration < Duration::from_secs(5), "{:?}", out.duration);
    assert!(
        berth_testkit::wait_all_gone(&[pid as i32], Duration::from_secs(2)),
        "the sidecar {pid} still runs"
    );
    // A new sidecar starts on demand; the old sandbox is positively gone.
    assert_eq!(p.observe(&id).await.unwrap(), Observation::Absent);
    assert_ne!(p.sidecar_pid().await, Some(pid));
}

/// A minimal HTTP server answering every request with one fixture response, recording what
/// it received (head and body).
fn fixture_server(status: u16, body: String) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            let mut length = 0usize;
            let mut chunked = false;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
                head.push_str(&line);
                if line == "\r\n" {
                    break;
                }
            }
            let mut received = Vec::new();
            if chunked {
                loop {
                    let mut size = String::new();
                    if reader.read_line(&mut size).unwrap_or(0) == 0 {
                        break;
                    }
                    let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                    let mut chunk = vec![0; n + 2];
                    let _ = reader.read_exact(&mut chunk);
                    if n == 0 {
                        break;
                    }
                    received.extend_from_slice(&chunk[..n]);
                }
            } else {
                received = vec![0; length];
                let _ = reader.read_exact(&mut received);
            }
            head.push_str(&String::from_utf8_lossy(&received));
            log.lock().unwrap().push(head);
            let reply = format!(
                "HTTP/1.1 {status} Fixture\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    (url, seen)
}

fn proc_cmdlines() -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(bytes) = std::fs::read(entry.path().join("cmdline")) {
            all.push_str(&String::from_utf8_lossy(&bytes));
            all.push('\n');
        }
    }
    all
}

/// Every fixture of a vendor maps onto the Berth error class it must, the canary key reaches
/// the vendor's API (so it was really used) and nowhere else: not argv, not the error.
async fn fixtures_map_errors_and_keep_the_key_out_of_sight(fixtures: &str) {
    let fixtures: serde_json::Value = serde_json::from_str(fixtures).unwrap();
    let vendor = fixtures["vendor"].as_str().unwrap();
    let canary = fixtures["canary"].as_str().unwrap();
    let key_var = fixtures["key_var"].as_str().unwrap();
    let url_var = fixtures["url_var"].as_str().unwrap();
    let expected_request = fixtures["request"].as_str().unwrap();
    for case in fixtures["cases"].as_array().unwrap() {
        let status = case["status"].as_u64().unwrap() as u16;
        let (url, seen) = fixture_server(status, case["body"].to_string());
        let p = provider(
            &format!("computesdk:{vendor}"),
            vec![(key_var.into(), canary.into()), (url_var.into(), url)],
            vec![canary.into()],
        );
        // Berth's default: no network, sent as the vendor's own option; the image goes as the
        // option the vendor's adapter boots from.
        let mut req = request(NetworkMode::None);
        req.image = Some("berth-fixture-image".into());
        let create = p.create(&req);
        tokio::pin!(create);
        // While the request is in flight, the key is in no process's argv.
        let err = loop {
            tokio::select! {
                result = &mut create => break result.unwrap_err(),
                _ = tokio::time::sleep(Duration::from_millis(20)) => {
                    assert!(!proc_cmdlines().contains(canary), "the key is in a process's argv");
                }
            }
        };
        let kind = serde_json::to_value(err.kind()).unwrap();
        assert_eq!(
            kind, case["kind"],
            "{vendor} HTTP {status} {}: {err}",
            case["body"]
        );
        assert!(!err.to_string().contains(canary), "{err}");
        let requests = seen.lock().unwrap().clone();
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with(expected_request) && r.contains(canary)),
            "the vendor SDK never sent the key: {requests:?}"
        );
        assert!(
            requests.iter().any(|r| r.contains("berth-fixture-image")),
            "the image never reached the vendor: {requests:?}"
        );
        let no_network = fixtures["no_network_on_the_wire"].as_str().unwrap();
        assert!(
            requests
                .iter()
                .any(|r| r.replace(' ', "").contains(no_network)),
            "no `{no_network}` in what the vendor SDK sent: {requests:?}"
        );
    }
}

#[tokio::test]
async fn e2b_fixtures_map_errors_and_keep_the_key_out_of_sight() {
    if installed() {
        fixtures_map_errors_and_keep_the_key_out_of_sight(include_str!("fixtures/e2b.json")).await;
    }
}

#[tokio::test]
async fn daytona_fixtures_map_errors_and_keep_the_key_out_of_sight() {
    if installed() {
        fixtures_map_errors_and_keep_the_key_out_of_sight(include_str!("fixtures/daytona.json"))
            .await;
    }
}

/// Without the key, construction-time checks are the factory's; the adapter itself reports
/// ComputeSDK's own complaint as an auth error, masked.
#[tokio::test]
async fn e2b_with_a_malformed_key_is_an_auth_error_that_never_echoes_it() {
    if !installed() {
        return;
    }
    let bad = "not-an-e2b-key-canary-5a5a5a5a";
    let p = provider(
        "computesdk:e2b",
        vec![("E2B_API_KEY".into(), bad.into())],
        vec![bad.into()],
    );
    let err = p.create(&request(NetworkMode::None)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!err.to_string().contains(bad), "{err}");
}

/// The sidecar ends with its owner, and a missing installation is a setup error naming the fix.
#[tokio::test]
async fn the_sidecar_ends_with_the_provider_and_setup_errors_name_the_fix() {
    if !installed() {
        return;
    }
    let (p, _id) = just_bash_sandbox().await;
    let pid = p.sidecar_pid().await.unwrap();
    drop(p);
    assert!(
        berth_testkit::wait_all_gone(&[pid as i32], Duration::from_secs(2)),
        "the sidecar {pid} outlived its provider"
    );

    let empty = tempfile::tempdir().unwrap();
    let p = berth_provider_computesdk::new(
        "computesdk:just-bash",
        BridgeConfig {
            node: "node".into(),
            dir: empty.path().to_owned(),
            env: vec![("PATH".into(), path())],
            secrets: vec![],
        },
    )
    .unwrap();
    let err = p.observe(&NativeId("x".into())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Setup, "{err}");
    assert!(
        err.to_string().contains("install-computesdk-bridge"),
        "{err}"
    );
}

/// Hostile and concurrent use: requests in flight at once each get their own reply; values with
/// quotes, newlines and `$(…)` arrive as data; output beyond the default cap is counted and
/// bounded; a sidecar killed mid-exec is an `unavailable` error (never an exit code) and the
/// next call starts a new one.
#[tokio::test]
async fn concurrent_hostile_and_killed_mid_exec() {
    if !installed() {
        return;
    }
    let (p, id) = just_bash_sandbox().await;
    let p = Arc::new(p);

    let mut tasks = Vec::new();
    for n in 0..24 {
        let (p, id) = (p.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            let out = p
                .exec(
                    &id,
                    &ExecRequest::shell(format!("echo {n}; exit {}", n % 5)),
                )
                .await
                .unwrap();
            (n, out)
        }));
    }
    for task in tasks {
        let (n, out) = task.await.unwrap();
        assert_eq!(out.stdout, format!("{n}\n").into_bytes());
        assert_eq!(out.status, ExitStatus::Exited { code: n % 5 });
    }

    let hostile = "a'b\"c\n$(touch pwned)`touch pwned2`\\ é \u{1F600}";
    let out = p
        .exec(
            &id,
            &ExecRequest::shell("printf %s \"$V\"; ls pwned pwned2 2>/dev/null")
                .with_env("V", hostile),
        )
        .await
        .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), hostile);

    let mut big =
        ExecRequest::shell("i=0; while [ $i -lt 400 ]; do printf '%050000d' 0; i=$((i+1)); done");
    big.max_output_bytes = 64 * 1024 * 1024; // more than the bridge allows: capped at 16 MiB
    let out = p.exec(&id, &big).await.unwrap();
    assert_eq!(out.stdout_total, 20_000_000);
    assert_eq!(out.stdout.len(), berth_contract::DEFAULT_MAX_OUTPUT_BYTES);

    let pid = p.sidecar_pid().await.unwrap();
    let running = {
        let (p, id) = (p.clone(), id.clone());
        tokio::spawn(async move { p.exec(&id, &ExecRequest::shell("sleep 20")).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
    let err = running.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // The sandbox lived in the killed process: a new one answers that it is gone.
    assert_eq!(p.observe(&id).await.unwrap(), Observation::Absent);
    assert_ne!(p.sidecar_pid().await, Some(pid));
}
