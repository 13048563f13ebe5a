//! The S3 path, live against a real S3-compatible server (SeaweedFS, started by
//! `scripts/setup-substrates`; `BERTH_TEST_S3_ENDPOINT` names it): create-if-absent puts
//! (a replay is accepted, different bytes under an existing key are refused and nothing is
//! overwritten), verified reads, publication resumed after a crash at every step, reconcile.
//! Set `BERTH_SKIP_S3=1` to skip explicitly; a missing server otherwise fails the test.

use std::sync::Arc;

use berth_artifacts::{
    build, publish, read_file, reconcile, BundleFile, BundleInput, Lifecycle, Objects, PublishStep,
    Redactor, S3Config,
};
use berth_store::{ArtifactQuery, ArtifactStore, PublicationState, Store};

fn s3(prefix: &str) -> Option<Objects> {
    let Ok(endpoint) = std::env::var("BERTH_TEST_S3_ENDPOINT") else {
        if std::env::var("BERTH_SKIP_S3").as_deref() == Ok("1") {
            eprintln!("SKIPPED: no S3 server (BERTH_SKIP_S3=1)");
            return None;
        }
        panic!("BERTH_TEST_S3_ENDPOINT is not set: run scripts/test (it starts SeaweedFS), or BERTH_SKIP_S3=1");
    };
    let bucket = std::env::var("BERTH_TEST_S3_BUCKET").unwrap_or_else(|_| "artifacts".into());
    Some(
        Objects::s3(&S3Config {
            url: format!("s3://{bucket}/{prefix}"),
            endpoint: Some(endpoint),
            region: "us-east-1".into(),
            access_key_id: std::env::var("BERTH_TEST_S3_KEY_ID").unwrap_or_else(|_| "test".into()),
            secret_access_key: std::env::var("BERTH_TEST_S3_SECRET")
                .unwrap_or_else(|_| "testsecret".into()),
        })
        .unwrap(),
    )
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test-{name}-{}-{nanos}", std::process::id())
}

fn input(marker: &str) -> BundleInput {
    BundleInput {
        mission: "ms-s3".into(),
        task: "t".into(),
        attempt_key: format!("at-{marker}"),
        ordinal: 1,
        lifecycle: Lifecycle {
            outcome: "accepted".into(),
            reason: None,
            commit: Some("c".repeat(40)),
            base_commit: None,
            checkpoint: Some("sha256:cp".into()),
        },
        retention: "forever".into(),
        usage: None,
        withheld: Vec::new(),
        files: vec![
            BundleFile {
                path: "patch.diff".into(),
                mime: "text/x-diff".into(),
                bytes: format!("+{marker}\n").into_bytes(),
                opaque: false,
                truncated_from: None,
            },
            BundleFile {
                path: "logs/big.bin".into(),
                mime: "application/octet-stream".into(),
                bytes: (0..(3 << 20)).map(|i| (i % 251) as u8).collect(),
                opaque: false,
                truncated_from: None,
            },
        ],
    }
}

#[tokio::test]
async fn create_if_absent_puts_and_verified_reads() {
    let Some(objects) = s3(&unique("puts")) else {
        return;
    };
    let hash = berth_artifacts::content_id(b"one");
    let key = format!("cas/blake3/{}/{hash}", &hash[..2]);
    objects
        .put_if_absent(&key, bytes::Bytes::from_static(b"one"), &hash)
        .await
        .unwrap();
    // A replay of the same bytes is accepted.
    objects
        .put_if_absent(&key, bytes::Bytes::from_static(b"one"), &hash)
        .await
        .unwrap();
    // Different bytes under the same key: refused, and the object is not overwritten.
    let err = objects
        .put_if_absent(
            &key,
            bytes::Bytes::from_static(b"two"),
            &berth_artifacts::content_id(b"two"),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("corrupt"), "{err}");
    assert_eq!(objects.get_verified(&key, &hash).await.unwrap(), b"one");
    assert!(objects
        .get_verified(&key, &berth_artifacts::content_id(b"two"))
        .await
        .is_err());
    assert_eq!(objects.keys("cas").await.unwrap(), vec![key]);
}

#[tokio::test]
async fn publication_on_s3_resumes_after_a_crash_at_every_step() {
    let prefix = unique("publish");
    let Some(objects) = s3(&prefix) else { return };
    let bundle = build(input(&prefix), &Redactor::default()).unwrap();
    let steps = bundle.objects.len() + 4;
    for stop_after in 0..steps {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("b.db")).await.unwrap());
        let (s, o, b) = (store.clone(), objects.clone(), bundle.clone());
        let _ = tokio::spawn(async move {
            let mut seen = 0;
            publish(s.as_ref(), &o, &b, &mut |_step: PublishStep| {
                if seen == stop_after {
                    panic!("simulated crash");
                }
                seen += 1;
            })
            .await
        })
        .await;
        let done = publish(store.as_ref(), &objects, &bundle, &mut |_| {})
            .await
            .unwrap();
        assert_eq!(done.state, PublicationState::Indexed);
        let rows = store.artifacts(&ArtifactQuery::default()).await.unwrap();
        assert_eq!(rows.len(), bundle.manifest.files.len() + 1);
        let big = read_file(store.as_ref(), &objects, &done.bundle_id, "logs/big.bin")
            .await
            .unwrap();
        assert_eq!(big.len(), 3 << 20);
        let reconciled = reconcile(store.as_ref(), &objects, std::time::Duration::ZERO)
            .await
            .unwrap();
        assert!(reconciled.orphans.is_empty(), "{reconciled:?}");
    }
    // One copy of each object under the prefix: the files and the manifest.
    let mut keys = objects.keys("cas").await.unwrap();
    keys.extend(objects.keys("bundles").await.unwrap());
    assert_eq!(keys.len(), bundle.objects.len() + 1, "{keys:?}");
}
