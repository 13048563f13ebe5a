//! The index as an Apache Iceberg table (feature `iceberg`), against the real SQLite store: the
//! SQL catalog lives in the store's database, every INDEXED bundle is appended exactly once, and
//! the rows read back through the catalog equal the store's index — also when several syncs run
//! at once, when a sync is repeated, and after the catalog is reopened by another process.
#![cfg(feature = "iceberg")]

use std::sync::Arc;

use berth_artifacts::iceberg_index::IcebergIndex;
use berth_artifacts::{build, publish, BundleFile, BundleInput, Lifecycle, Objects, Redactor};
use berth_store::{ArtifactQuery, ArtifactRow, ArtifactStore, Store};

fn input(attempt: usize) -> BundleInput {
    BundleInput {
        mission: "ms-1".into(),
        task: "fix".into(),
        attempt_key: format!("at-{attempt}"),
        ordinal: attempt as u32,
        lifecycle: Lifecycle {
            outcome: if attempt.is_multiple_of(2) {
                "accepted"
            } else {
                "rejected"
            }
            .into(),
            reason: None,
            commit: None,
            base_commit: None,
            checkpoint: None,
        },
        retention: "forever".into(),
        usage: None,
        withheld: Vec::new(),
        files: vec![BundleFile {
            path: "patch.diff".into(),
            mime: "text/x-diff".into(),
            bytes: format!("+attempt {attempt}\n").into_bytes(),
            opaque: false,
            truncated_from: None,
        }],
    }
}

fn sorted(mut rows: Vec<ArtifactRow>) -> Vec<ArtifactRow> {
    rows.sort_by(|a, b| (&a.bundle_id, &a.path).cmp(&(&b.bundle_id, &b.path)));
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexed_bundles_are_appended_once_and_read_back_through_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("berth.db");
    let store = Arc::new(Store::open(&db).await.unwrap());
    let objects = Objects::local(&dir.path().join("artifacts")).unwrap();
    let warehouse = dir.path().join("iceberg");
    let redactor = Redactor::new(Vec::<String>::new());

    let index = IcebergIndex::open(&db, &warehouse).await.unwrap();
    assert!(index.rows().await.unwrap().is_empty());
    assert_eq!(index.sync(store.as_ref()).await.unwrap().rows, 0);

    for attempt in 1..=2 {
        let bundle = build(input(attempt), &redactor).unwrap();
        publish(store.as_ref(), &objects, &bundle, &mut |_| {})
            .await
            .unwrap();
    }
    let first = index.sync(store.as_ref()).await.unwrap();
    assert_eq!(first.bundles.len(), 2);
    assert!(first.snapshot_id.is_some());
    let expected = sorted(store.artifacts(&ArtifactQuery::default()).await.unwrap());
    assert_eq!(first.rows, expected.len());
    assert_eq!(sorted(index.rows().await.unwrap()), expected);
    // Nothing new: nothing appended.
    assert_eq!(index.sync(store.as_ref()).await.unwrap().rows, 0);

    // Two more bundles, then three syncs at once (two catalogs, as two processes would have):
    // each bundle is appended by exactly one of them.
    for attempt in 3..=4 {
        let bundle = build(input(attempt), &redactor).unwrap();
        publish(store.as_ref(), &objects, &bundle, &mut |_| {})
            .await
            .unwrap();
    }
    let other = IcebergIndex::open(&db, &warehouse).await.unwrap();
    let (a, b, c) = tokio::join!(
        index.sync(store.as_ref()),
        other.sync(store.as_ref()),
        index.sync(store.as_ref())
    );
    let appended: Vec<String> = [a.unwrap(), b.unwrap(), c.unwrap()]
        .into_iter()
        .flat_map(|s| s.bundles)
        .collect();
    assert_eq!(appended.len(), 2, "{appended:?}");
    let expected = sorted(store.artifacts(&ArtifactQuery::default()).await.unwrap());
    assert_eq!(sorted(other.rows().await.unwrap()), expected);
    assert_eq!(other.bundles().await.unwrap().len(), 4);

    // The catalog is in the store's own database.
    drop((index, other));
    let reopened = IcebergIndex::open(&db, &warehouse).await.unwrap();
    assert_eq!(sorted(reopened.rows().await.unwrap()), expected);
    let conn = catalog_rows(&db).await;
    assert_eq!(conn, 1, "one Iceberg table registered in berth.db");
}

/// Rows of the catalog's own table in the store's database, read with the store's driver.
async fn catalog_rows(db: &std::path::Path) -> i64 {
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite:{}", db.display()))
        .await
        .unwrap();
    sqlx::query_scalar("SELECT count(*) FROM iceberg_tables WHERE table_name = 'artifacts'")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}
