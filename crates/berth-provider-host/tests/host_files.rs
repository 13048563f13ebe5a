//! Host provider, live: the file API (binary-safe, confined, race-free against a swapping
//! sandbox, special files refused), snapshots, restore, fork.

use berth_contract::{
    DestroyOutcome, ErrorKind, ExitStatus, FileKind, NativeId, Observation, Provider, ProviderExt,
};
use std::time::Duration;
mod host_support;

use host_support::*;

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
