//! Publication against the real SQLite store and a real local object store: idempotent,
//! resumable after a crash at every step (the task dies mid-publication; publishing again or
//! reconciling finishes it with exactly one copy of each object), and reads verify hashes.

use std::sync::Arc;
use std::time::Duration;

use berth_artifacts::{
    build, publish, read_file, reconcile, BundleFile, BundleInput, Lifecycle, Objects, PublishStep,
    Redactor,
};
use berth_store::{ArtifactQuery, ArtifactStore, PublicationState, Store};

const CANARY: &str = "canary-9f2c1e-do-not-leak";

fn input(accepted: bool) -> BundleInput {
    BundleInput {
        mission: "ms-1".into(),
        task: "fix".into(),
        attempt_key: "at-1".into(),
        ordinal: 1,
        lifecycle: Lifecycle {
            outcome: if accepted { "accepted" } else { "rejected" }.into(),
            reason: (!accepted).then(|| "validator exited 1".to_owned()),
            commit: Some("c".repeat(40)),
            base_commit: Some("b".repeat(40)),
            checkpoint: accepted.then(|| "sha256:abc".to_owned()),
        },
        retention: "forever".into(),
        usage: None,
        withheld: Vec::new(),
        files: vec![
            BundleFile {
                path: "patch.diff".into(),
                mime: "text/x-diff".into(),
                bytes: b"--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n".to_vec(),
                opaque: false,
                truncated_from: None,
            },
            BundleFile {
                path: "logs/agent.jsonl".into(),
                mime: "application/x-ndjson".into(),
                bytes: format!("{{\"key\":\"{CANARY}\"}}\n").into_bytes(),
                opaque: false,
                truncated_from: None,
            },
            BundleFile {
                path: "logs/events.jsonl".into(),
                mime: "application/x-ndjson".into(),
                bytes: b"{\"kind\":\"tool_call\"}\n".to_vec(),
                opaque: false,
                truncated_from: None,
            },
        ],
    }
}

async fn setup() -> (tempfile::TempDir, Arc<Store>, Objects) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("berth.db")).await.unwrap());
    let objects = Objects::local(&dir.path().join("artifacts")).unwrap();
    (dir, store, objects)
}

fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[tokio::test]
async fn a_bundle_is_published_once_indexed_and_read_back_verified() {
    let (dir, store, objects) = setup().await;
    let redactor = Redactor::new([CANARY.to_owned()]);
    let bundle = build(input(true), &redactor).unwrap();
    let claim = publish(store.as_ref(), &objects, &bundle, &mut |_| {})
        .await
        .unwrap();
    assert_eq!(claim.state, PublicationState::Indexed);
    // Again: nothing changes, no second copy.
    let again = publish(store.as_ref(), &objects, &bundle, &mut |_| {})
        .await
        .unwrap();
    assert_eq!(again.bundle_id, claim.bundle_id);
    let stored = files_under(&dir.path().join("artifacts"));
    assert_eq!(stored.len(), bundle.objects.len() + 1, "{stored:?}");
    // The canary was masked before anything became durable.
    for path in stored.iter().chain([&dir.path().join("berth.db")]) {
        let bytes = std::fs::read(path).unwrap();
        assert!(
            !bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()),
            "{path:?}"
        );
    }
    assert_eq!(bundle.manifest.redactions, 1);
    // Query by coordinates; read one file back.
    let diffs = store
        .artifacts(&ArtifactQuery {
            mission_id: Some("ms-1".into()),
            accepted: Some(true),
            mime: Some("text/x-diff".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(diffs.len(), 1);
    let patch = read_file(store.as_ref(), &objects, &claim.bundle_id, "patch.diff")
        .await
        .unwrap();
    assert!(patch.starts_with(b"--- a/x"));
    let manifest = read_file(store.as_ref(), &objects, &claim.bundle_id, "manifest.json")
        .await
        .unwrap();
    assert_eq!(manifest, bundle.manifest_bytes);

    // A corrupted object is detected on read, never returned as good.
    let key = &diffs[0].object_key;
    let on_disk = dir.path().join("artifacts").join(key);
    std::fs::write(&on_disk, b"tampered").unwrap();
    let err = read_file(store.as_ref(), &objects, &claim.bundle_id, "patch.diff")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("corrupt"), "{err}");
    // And a replay does not overwrite it silently either.
    let err = publish(
        store.as_ref(),
        &objects,
        &build(input(true), &redactor).unwrap(),
        &mut |_| {},
    )
    .await;
    assert!(err.is_ok(), "an indexed claim is not re-uploaded: {err:?}");
}

/// The publishing task dies right after each step; publishing the same bundle again (what a
/// resumed mission does) finishes it: indexed, complete, one copy of each object.
#[tokio::test]
async fn a_crash_after_any_step_is_finished_by_publishing_again() {
    let redactor = Redactor::new([CANARY.to_owned()]);
    let bundle = build(input(false), &redactor).unwrap();
    let steps = bundle.objects.len() + 4;
    for stop_after in 0..steps {
        let (dir, store, objects) = setup().await;
        let (crash_store, crash_objects, crash_bundle) =
            (store.clone(), objects.clone(), bundle.clone());
        let died = tokio::spawn(async move {
            let mut seen = 0;
            publish(
                crash_store.as_ref(),
                &crash_objects,
                &crash_bundle,
                &mut |_step: PublishStep| {
                    if seen == stop_after {
                        panic!("simulated crash after step {seen}");
                    }
                    seen += 1;
                },
            )
            .await
        })
        .await;
        let crashed = died.is_err();
        let done = publish(store.as_ref(), &objects, &bundle, &mut |_| {})
            .await
            .unwrap();
        assert_eq!(
            done.state,
            PublicationState::Indexed,
            "stop after {stop_after}"
        );
        let rows = store
            .artifacts(&ArtifactQuery {
                bundle_id: Some(done.bundle_id.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(rows.len(), bundle.manifest.files.len() + 1);
        let stored = files_under(&dir.path().join("artifacts"));
        assert_eq!(
            stored.len(),
            bundle.objects.len() + 1,
            "stop after {stop_after}"
        );
        assert!(crashed || stop_after >= steps - 1);
    }
}

/// Reconcile finishes a claim whose objects are all there, leaves one still waiting for its
/// source within the retry window, expires it after, and reports objects no claim names.
#[tokio::test]
async fn reconcile_finishes_waits_expires_and_reports_orphans() {
    let redactor = Redactor::default();
    let (_dir, store, objects) = setup().await;
    let bundle = build(input(true), &redactor).unwrap();
    // Crash right after the last object was written (before `uploaded`).
    let (s, o, b) = (store.clone(), objects.clone(), bundle.clone());
    let last = bundle.objects.len();
    let _ = tokio::spawn(async move {
        publish(s.as_ref(), &o, &b, &mut |step| {
            if step == PublishStep::Wrote(last) {
                panic!("crash");
            }
        })
        .await
    })
    .await;
    // Another claim, with a file no other bundle has, whose objects never got written.
    let mut unique = input(false);
    unique.files.push(BundleFile {
        path: "logs/only-here.txt".into(),
        mime: "text/plain".into(),
        bytes: b"written by nobody".to_vec(),
        opaque: false,
        truncated_from: None,
    });
    let other = build(unique, &redactor).unwrap();
    let (s, o, b) = (store.clone(), objects.clone(), other.clone());
    let _ = tokio::spawn(async move {
        publish(s.as_ref(), &o, &b, &mut |step| {
            if step == PublishStep::Claimed {
                panic!("crash");
            }
        })
        .await
    })
    .await;
    objects
        .put_if_absent(
            "cas/blake3/00/stray",
            bytes::Bytes::from_static(b"x"),
            &blake3::hash(b"x").to_hex(),
        )
        .await
        .unwrap();
    let first = reconcile(store.as_ref(), &objects, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(first.finished, vec![bundle.manifest.bundle_id.clone()]);
    assert_eq!(first.waiting, vec![other.manifest.bundle_id.clone()]);
    assert!(first.expired.is_empty());
    assert!(
        first.orphans.contains(&"cas/blake3/00/stray".to_owned()),
        "{first:?}"
    );
    let second = reconcile(store.as_ref(), &objects, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(second.expired, vec![other.manifest.bundle_id.clone()]);
    assert_eq!(
        store
            .publication_get(&other.manifest.bundle_id)
            .await
            .unwrap()
            .state,
        PublicationState::Expired
    );
    // An expired claim is not published later by accident.
    let err = publish(store.as_ref(), &objects, &other, &mut |_| {}).await;
    assert!(err.is_err());
}

#[tokio::test]
async fn reconcile_removes_what_killed_local_writes_left_staged_and_nothing_else() {
    let (dir, store, objects) = setup().await;
    let bundle = build(input(true), &Redactor::new(Vec::<String>::new())).unwrap();
    publish(store.as_ref(), &objects, &bundle, &mut |_| {})
        .await
        .unwrap();
    let root = dir.path().join("artifacts");
    let (key, _) = &bundle.objects[0];
    // Beside a complete object: a finished write's leftover, removed at once.
    std::fs::write(root.join(format!("{key}#1")), b"partial").unwrap();
    // No object beside it, young: perhaps a write in progress; stays until stale.
    let young = root.join("cas/blake3/00/00ab#2");
    std::fs::create_dir_all(young.parent().unwrap()).unwrap();
    std::fs::write(&young, b"partial").unwrap();
    // Not a staging name, and a symlink with one: never touched.
    std::fs::write(root.join("cas/blake3/00/plain#x"), b"x").unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("cas/blake3/00/link#1")).unwrap();
    let done = reconcile(store.as_ref(), &objects, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(done.staging_removed, vec![format!("{key}#1")]);
    assert!(young.exists() && !root.join(format!("{key}#1")).exists());
    let done = reconcile(store.as_ref(), &objects, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        done.staging_removed,
        vec!["cas/blake3/00/00ab#2".to_owned()]
    );
    assert!(root.join("cas/blake3/00/plain#x").exists());
    assert!(std::fs::symlink_metadata(root.join("cas/blake3/00/link#1")).is_ok());
    assert!(std::fs::read(root.join(key)).is_ok());
}
