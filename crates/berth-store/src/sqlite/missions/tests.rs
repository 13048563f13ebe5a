use super::*;

/// A store holding mission `m1` (owner alice) at seq 0, and the directory it lives in.
async fn store_with_m1() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("b.db")).await.unwrap();
    store
        .mission_insert("m1", "demo", "alice", "{}", "{\"v\":0}", "running")
        .await
        .unwrap();
    (dir, store)
}

#[tokio::test]
async fn events_append_atomically_with_optimistic_concurrency() {
    let (_dir, store) = store_with_m1().await;
    let seq = store
        .mission_append(
            "m1",
            0,
            None,
            &["{\"e\":1}".into()],
            "{\"v\":1}",
            "running",
            &[("at-1", "agent", "{}".into())],
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seq, 1);
    // A stale writer loses and changes nothing.
    let stale = store
        .mission_append(
            "m1",
            0,
            None,
            &["{\"e\":2}".into()],
            "{\"v\":2}",
            "running",
            &[("at-1", "lost", "{}".into())],
        )
        .await
        .unwrap();
    assert!(stale.is_err());
    let row = store.mission_get("m1").await.unwrap();
    assert_eq!((row.seq, row.record_json.as_str()), (1, "{\"v\":1}"));
    assert_eq!(store.mission_events("m1").await.unwrap().len(), 1);
    let facts = store.attempt_facts("m1").await.unwrap();
    assert_eq!(facts.len(), 1, "the stale writer's fact was not stored");
    assert_eq!(facts[0].kind, "agent");
    assert_eq!(store.mission_list("alice").await.unwrap().len(), 1);
    assert!(store.mission_list("bob").await.unwrap().is_empty());
}

/// Several events and facts in one append: numbered and read back in the order given.
#[tokio::test]
async fn an_append_keeps_its_events_and_facts_in_order() {
    let (_dir, store) = store_with_m1().await;
    let events: Vec<String> = (1..=3).map(|n| format!("{{\"e\":{n}}}")).collect();
    let facts = [
        ("at-1", "checkpoint", "{\"n\":1}".to_owned()),
        ("at-1", "artifacts", "{\"n\":2}".to_owned()),
        ("at-1", "finalize", "{\"n\":3}".to_owned()),
    ];
    let seq = store
        .mission_append("m1", 0, None, &events, "{\"v\":3}", "running", &facts)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seq, 3);
    let stored = store.mission_events("m1").await.unwrap();
    let stored: Vec<_> = stored
        .iter()
        .map(|(seq, json, _)| (*seq, json.clone()))
        .collect();
    assert_eq!(
        stored,
        [
            (1, events[0].clone()),
            (2, events[1].clone()),
            (3, events[2].clone())
        ]
    );
    let read: Vec<_> = store
        .attempt_facts("m1")
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.kind)
        .collect();
    assert_eq!(read, ["checkpoint", "artifacts", "finalize"]);
}

/// The service sees the store only through the trait a PostgreSQL backend will implement.
#[tokio::test]
async fn the_trait_carries_the_same_contract() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Store::open(&dir.path().join("b.db")).await.unwrap();
    let store: &dyn MissionStore = &sqlite;
    store
        .mission_insert("m", "n", "o", "{}", "{}", "running")
        .await
        .unwrap();
    let first = store
        .mission_append("m", 0, None, &["{}".into()], "{\"a\":1}", "running", &[])
        .await
        .unwrap();
    assert_eq!(first.unwrap(), 1);
    let stale = store
        .mission_append("m", 0, None, &["{}".into()], "{\"a\":2}", "failed", &[])
        .await
        .unwrap();
    assert!(stale.is_err());
    assert_eq!(store.mission_get("m").await.unwrap().state, "running");
    assert_eq!(store.mission_events("m").await.unwrap().len(), 1);
    assert!(matches!(
        store.mission_get("nope").await,
        Err(StoreError::NotFound(..))
    ));
}

#[tokio::test]
async fn a_fact_without_an_event_is_added_only_under_the_lease() {
    use std::time::Duration;
    let (_dir, store) = store_with_m1().await;
    // No lease held: nothing is added.
    assert!(!store
        .attempt_fact_add("m1", 1, "k1", "run_stopped", "{}")
        .await
        .unwrap());
    let ttl = Duration::from_secs(30);
    let fence = store
        .mission_lease_acquire("m1", "a", ttl, None)
        .await
        .unwrap()
        .unwrap();
    assert!(!store
        .attempt_fact_add("m1", fence + 1, "k1", "run_stopped", "{}")
        .await
        .unwrap());
    assert!(store
        .attempt_fact_add("m1", fence, "k1", "run_stopped", "{\"reason\":\"r\"}")
        .await
        .unwrap());
    assert!(!store
        .attempt_fact_add("nope", fence, "k1", "run_stopped", "{}")
        .await
        .unwrap());
    store.mission_lease_release("m1", fence).await.unwrap();
    assert!(!store
        .attempt_fact_add("m1", fence, "k1", "run_stopped", "{}")
        .await
        .unwrap());
    let facts = store.attempt_facts("m1").await.unwrap();
    assert_eq!(facts.len(), 1);
    assert_eq!(
        (facts[0].attempt_key.as_str(), facts[0].kind.as_str()),
        ("k1", "run_stopped")
    );
    // The mission itself did not move: no event, same sequence.
    assert_eq!(store.mission_get("m1").await.unwrap().seq, 0);
}

#[tokio::test]
async fn one_lease_holder_and_a_fenced_out_writer_changes_nothing() {
    use std::time::Duration;
    let (_dir, store) = store_with_m1().await;
    let ttl = Duration::from_secs(30);
    let first = store
        .mission_lease_acquire("m1", "a", ttl, None)
        .await
        .unwrap()
        .unwrap();
    let held = store
        .mission_lease_acquire("m1", "b", ttl, None)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(held.holder, "a");
    // A holder proved dead can be replaced at once; its fence no longer writes.
    let second = store
        .mission_lease_acquire("m1", "b", ttl, Some("a"))
        .await
        .unwrap()
        .unwrap();
    assert!(second > first);
    assert!(!store.mission_lease_renew("m1", first, ttl).await.unwrap());
    let stale = store
        .mission_append(
            "m1",
            0,
            Some(first),
            &["{}".into()],
            "{\"v\":1}",
            "running",
            &[],
        )
        .await
        .unwrap();
    assert!(stale.is_err(), "a fenced-out runner appended");
    let ok = store
        .mission_append(
            "m1",
            0,
            Some(second),
            &["{}".into()],
            "{\"v\":1}",
            "running",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(ok.unwrap(), 1);
    assert!(store.mission_lease_renew("m1", second, ttl).await.unwrap());
    let holder = store.mission_lease_holder("m1").await.unwrap().unwrap();
    assert_eq!(holder.holder, "b");
    store.mission_lease_release("m1", second).await.unwrap();
    assert_eq!(store.mission_lease_holder("m1").await.unwrap(), None);
    assert!(matches!(
        store.mission_lease_holder("m-none").await,
        Err(StoreError::NotFound(Record::Mission, _))
    ));
    // Released: free for the next runner; a lapsed lease is free too.
    let third = store
        .mission_lease_acquire("m1", "c", Duration::from_millis(1), None)
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store.mission_lease_holder("m1").await.unwrap(),
        None,
        "a lapsed lease has no holder"
    );
    let fourth = store
        .mission_lease_acquire("m1", "d", ttl, None)
        .await
        .unwrap()
        .unwrap();
    assert!(fourth > third);
}

/// A lease whose commit fails is not taken, and the caller hears why. The take is an
/// `UPDATE … RETURNING`: SQLite hands back the row before it commits, and an autocommit
/// statement commits when it is reset — where a failure (a full disk; here a deferred
/// foreign key a test trigger breaks) was dropped unseen, so a runner went on with a fence
/// it did not hold and met a "conflict" at its first append.
#[tokio::test]
async fn a_lease_whose_commit_fails_is_an_error_not_a_fence() {
    let (dir, store) = store_with_m1().await;
    let raw = rusqlite::Connection::open(dir.path().join("b.db")).unwrap();
    raw.execute_batch(
        "CREATE TABLE test_parent (id INTEGER PRIMARY KEY);
         CREATE TABLE test_child (parent INTEGER REFERENCES test_parent (id)
             DEFERRABLE INITIALLY DEFERRED);
         CREATE TRIGGER test_lease_fails AFTER UPDATE OF lease_holder ON missions
         BEGIN INSERT INTO test_child VALUES (42); END;",
    )
    .unwrap();
    let taken = store
        .mission_lease_acquire("m1", "runner-a", std::time::Duration::from_secs(30), None)
        .await;
    assert!(matches!(taken, Err(StoreError::Direct { .. })), "{taken:?}");
    let holder: Option<String> = raw
        .query_row(
            "SELECT lease_holder FROM missions WHERE id = 'm1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(holder, None, "the failed take left no lease");
}
