//! Ledger tests against the real host provider and a real SQLite store.

use std::os::unix::process::CommandExt as _;
use std::sync::Arc;

use berth_contract::{
    CreateRequest, ErrorKind, Labels, NativeId, Observation, Provider, ProviderError, ProviderExt,
    SandboxName,
};
use berth_factory::{Environment, ProviderConfig, Registry};
use berth_ledger::{Ledger, LedgerError, SweepAction, SweepScope};
use berth_store::LedgerStore as _;
use berth_store::{LedgerState, NewLedgerRow, Store};

struct World {
    _dir: tempfile::TempDir,
    config: ProviderConfig,
    registry: Registry,
    host: Arc<dyn Provider>,
    db: std::path::PathBuf,
}

async fn world() -> World {
    let dir = tempfile::Builder::new()
        .prefix("berth-test-ledger-")
        .tempdir()
        .unwrap();
    let config = ProviderConfig {
        state_dir: dir.path().join("state"),
        env: Environment::empty(),
        reaper: None,
    };
    let registry = Registry::builtin().unwrap();
    let host = registry.construct("host", &config).unwrap();
    let db = dir.path().join("berth.db");
    World {
        _dir: dir,
        config,
        registry,
        host,
        db,
    }
}

async fn ledger(world: &World, owner: &str, run: &str) -> Ledger {
    Ledger::new(Store::open(&world.db).await.unwrap(), owner, run)
}

/// A sweep that also lists the host provider by owner label.
fn discovering_host() -> SweepScope {
    SweepScope {
        discover: vec!["host".into()],
        ..Default::default()
    }
}

async fn create(ledger: &Ledger, host: &Arc<dyn Provider>) -> String {
    let provider = host.clone();
    ledger
        .create_tracked(
            host.as_ref(),
            "create",
            None,
            |_| {},
            |req| async move { provider.create(&req).await },
        )
        .await
        .unwrap()
        .berth_id
}

async fn present(host: &Arc<dyn Provider>, id: &str) -> bool {
    matches!(
        host.observe(&NativeId(id.into())).await.unwrap(),
        Observation::Present { .. }
    )
}

/// A row written straight into the store, as created: `provider` and `native` are whatever
/// the test claims (a forged row, a provider that is not there).
async fn created_row(ledger: &Ledger, run: &str, provider: &str, berth_id: &str, native: &str) {
    ledger
        .store()
        .ledger_insert_intent(&NewLedgerRow {
            berth_id: berth_id.into(),
            provider: provider.into(),
            owner: ledger.owner().into(),
            run_id: run.into(),
            ledger_token: format!("token-{berth_id}"),
            labels: Default::default(),
            origin: "create".into(),
            kind: Default::default(),
            expires_at: None,
            durability: Default::default(),
        })
        .await
        .unwrap();
    ledger
        .store()
        .ledger_mark_created(berth_id, native)
        .await
        .unwrap();
}

#[tokio::test]
async fn create_records_intent_then_result_and_destroy_verifies() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    let id = create(&alice, &w.host).await;
    let row = alice.row(&id).await.unwrap();
    assert_eq!(row.state, LedgerState::Created);
    assert_eq!(row.native_id.as_deref(), Some(id.as_str()));
    assert_eq!(row.labels.get("berth.owner").unwrap(), "alice");
    assert_eq!(row.labels.get("berth.run").unwrap(), "run-a");
    assert_eq!(row.labels.get("berth.ledger").unwrap(), &row.ledger_token);
    alice.destroy_row(w.host.as_ref(), &row).await.unwrap();
    let row = alice.row(&id).await.unwrap();
    assert_eq!(row.state, LedgerState::VerifiedGone);
    assert!(row.destroy_requested_at.is_some() && row.verified_gone_at.is_some());
    assert!(!present(&w.host, &id).await);
}

#[tokio::test]
async fn failed_create_is_recorded_and_its_leftover_destroyed() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    let provider = w.host.clone();
    let made = std::sync::Mutex::new(None);
    let err = alice
        .create_tracked(
            w.host.as_ref(),
            "create",
            None,
            |_| {},
            |req| {
                *made.lock().unwrap() = Some(req.name.0.clone());
                async move {
                    // The sandbox exists, then the composite operation fails.
                    provider.create(&req).await?;
                    Err(ProviderError::new(
                        ErrorKind::Capacity,
                        "host",
                        "no room for the rest",
                    ))
                }
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LedgerError::Provider { .. }), "{err}");
    let id = made.lock().unwrap().clone().unwrap();
    assert!(
        !present(&w.host, &id).await,
        "must-fire: leftover destroyed"
    );
    let row = alice.row(&id).await.unwrap();
    assert_eq!(row.state, LedgerState::VerifiedGone);
    assert_eq!(row.last_error_kind.as_deref(), Some("capacity"));
}

#[tokio::test]
async fn sweep_destroys_everything_of_this_owner_and_nothing_else() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    let bob = ledger(&w, "bob", "run-b").await;
    let a1 = create(&alice, &w.host).await;
    let a2 = create(&alice, &w.host).await;
    let b1 = create(&bob, &w.host).await;
    let report = alice
        .sweep(&w.registry.bind(&w.config), &SweepScope::default())
        .await
        .unwrap();
    assert!(report.complete());
    let mut swept: Vec<_> = report.entries.iter().map(|e| e.berth_id.clone()).collect();
    swept.sort();
    let mut expected = vec![a1.clone(), a2.clone()];
    expected.sort();
    assert_eq!(swept, expected);
    assert!(report
        .entries
        .iter()
        .all(|e| e.action == SweepAction::Destroyed));
    assert!(!present(&w.host, &a1).await && !present(&w.host, &a2).await);
    assert!(
        present(&w.host, &b1).await,
        "must-not-fire: bob's sandbox survives"
    );
    let again = alice
        .sweep(&w.registry.bind(&w.config), &SweepScope::default())
        .await
        .unwrap();
    assert!(again.entries.is_empty(), "verified-gone rows are closed");
    bob.sweep(&w.registry.bind(&w.config), &SweepScope::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_forged_row_pointing_at_a_foreign_resource_is_refused() {
    let w = world().await;
    let bob = ledger(&w, "bob", "run-b").await;
    let victim = create(&bob, &w.host).await;
    let alice = ledger(&w, "alice", "run-a").await;
    // A row that claims bob's sandbox for alice (a corrupted or hand-edited ledger).
    created_row(&alice, "run-a", "host", "bx-forged", &victim).await;
    let report = alice
        .sweep(&w.registry.bind(&w.config), &SweepScope::default())
        .await
        .unwrap();
    assert_eq!(report.entries.len(), 1);
    match &report.entries[0].action {
        SweepAction::SkippedForeign { reason } => {
            assert!(reason.contains("labelled for owner `bob`"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(present(&w.host, &victim).await, "must-not-fire");
    let err = alice.row(&victim).await.unwrap_err();
    assert!(err.to_string().contains("belongs to owner `bob`"), "{err}");
    bob.sweep(&w.registry.bind(&w.config), &SweepScope::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn sandboxes_without_berth_labels_survive_discovery() {
    let w = world().await;
    // Created outside the ledger, labelled for someone else.
    w.host
        .create(&CreateRequest::new(
            SandboxName("bx-outsider".into()),
            Labels {
                owner: "someone-else".into(),
                run_id: "x".into(),
                ledger_token: "x".into(),
                expires_at_unix: None,
            },
        ))
        .await
        .unwrap();
    let alice = ledger(&w, "alice", "run-a").await;
    let report = alice
        .sweep(&w.registry.bind(&w.config), &discovering_host())
        .await
        .unwrap();
    assert!(report.entries.is_empty(), "{report:?}");
    assert!(present(&w.host, "bx-outsider").await);
}

/// Another store with the same owner (a second `BERTH_HOME`, or a forged owner label with an
/// invented token): discovery reports the sandbox and never destroys it — only what a row of
/// this store names is destroyed.
#[tokio::test]
async fn discovery_never_destroys_what_no_row_of_this_store_names() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    let live = create(&alice, &w.host).await;
    let other_home = Ledger::new(
        Store::open(&w.db.with_file_name("other-home.db"))
            .await
            .unwrap(),
        "alice",
        "run-z",
    );
    let plain = other_home
        .sweep(&w.registry.bind(&w.config), &SweepScope::default())
        .await
        .unwrap();
    assert!(plain.entries.is_empty());
    let report = other_home
        .sweep(&w.registry.bind(&w.config), &discovering_host())
        .await
        .unwrap();
    assert_eq!(report.entries.len(), 1);
    assert_eq!(report.entries[0].berth_id, live);
    assert!(
        matches!(&report.entries[0].action, SweepAction::SkippedForeign { reason } if reason.contains("no row in this ledger")),
        "{:?}",
        report.entries[0].action
    );
    assert!(
        other_home.row(&live).await.is_err(),
        "discovery wrote a row"
    );
    assert!(
        present(&w.host, &live).await,
        "another home's live sandbox was destroyed"
    );
    // Its own ledger still destroys it.
    alice
        .cleanup_run(&w.registry.bind(&w.config))
        .await
        .unwrap();
    assert!(!present(&w.host, &live).await);
}

#[tokio::test]
async fn cleanup_run_touches_only_this_run() {
    let w = world().await;
    let first = ledger(&w, "alice", "run-1").await;
    let second = ledger(&w, "alice", "run-2").await;
    let keep = create(&first, &w.host).await;
    let drop = create(&second, &w.host).await;
    let report = second
        .cleanup_run(&w.registry.bind(&w.config))
        .await
        .unwrap();
    assert_eq!(report.entries.len(), 1);
    assert!(!present(&w.host, &drop).await);
    assert!(present(&w.host, &keep).await);
    first
        .cleanup_run(&w.registry.bind(&w.config))
        .await
        .unwrap();
}

/// What a run hands over is kept by its own must-fire cleanup (reported as held), and still
/// removed by a sweep asked for by this owner.
#[tokio::test]
async fn cleanup_run_keeps_what_the_run_handed_over() {
    let w = world().await;
    let run = ledger(&w, "alice", "run-1").await;
    let handed = create(&run, &w.host).await;
    let made = create(&run, &w.host).await;
    run.clone().hand_over(&handed);
    let report = run.cleanup_run(&w.registry.bind(&w.config)).await.unwrap();
    assert!(present(&w.host, &handed).await);
    assert!(!present(&w.host, &made).await);
    let held = report
        .entries
        .iter()
        .find(|e| e.berth_id == handed)
        .unwrap();
    assert!(
        matches!(&held.action, SweepAction::Held { reason } if reason.contains("handed over")),
        "{held:?}"
    );
    drop(run); // the run is over: its rows are no longer held for it
    let other = ledger(&w, "alice", "run-2").await;
    other
        .sweep(&w.registry.bind(&w.config), &SweepScope::default())
        .await
        .unwrap();
    assert!(!present(&w.host, &handed).await);
}

/// Snapshots are ledger rows named by their key: a snapshot whose handle was never recorded
/// (a crash between the provider's answer and the store) is still deleted by its key, and a
/// retried tracked snapshot reuses the row instead of making a duplicate.
#[tokio::test]
async fn snapshot_rows_are_deleted_by_key_even_without_a_handle() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    let sandbox = create(&alice, &w.host).await;
    let source = berth_ledger::native_id(&alice.row(&sandbox).await.unwrap());
    let snapshots = w.host.require_snapshots().unwrap();
    let archives = || {
        std::fs::read_dir(w.config.state_dir.join("host/snapshots"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".tar"))
                    .count()
            })
            .unwrap_or(0)
    };
    // The crash: the row says intent, the provider made the snapshot under the key.
    alice
        .store()
        .ledger_insert_intent(&NewLedgerRow {
            berth_id: "sn-crashed".into(),
            provider: "host".into(),
            owner: "alice".into(),
            run_id: "run-a".into(),
            ledger_token: "tok-sn-crashed".into(),
            labels: Default::default(),
            origin: "snapshot".into(),
            kind: berth_store::ResourceKind::Snapshot,
            expires_at: None,
            durability: Default::default(),
        })
        .await
        .unwrap();
    snapshots
        .snapshot_keyed(&source, "sn-crashed")
        .await
        .unwrap();
    assert_eq!(archives(), 1);
    let row = alice.row("sn-crashed").await.unwrap();
    assert!(row.native_id.is_none(), "the handle was never recorded");
    alice.destroy_row(w.host.as_ref(), &row).await.unwrap();
    assert_eq!(archives(), 0, "the key did not find the snapshot");
    assert_eq!(
        alice.row("sn-crashed").await.unwrap().state,
        berth_store::LedgerState::VerifiedGone
    );

    // Tracked: the retry after an interrupted call reuses the row; one snapshot either way.
    let first = alice
        .snapshot_tracked(w.host.as_ref(), &source, "sn-tracked", "test", None)
        .await
        .unwrap();
    let again = alice
        .snapshot_tracked(w.host.as_ref(), &source, "sn-tracked", "test", None)
        .await
        .unwrap();
    assert_eq!(first.handle, again.handle);
    assert_eq!(archives(), 1);
    // Held without retention: a sweep keeps it.
    let report = alice
        .sweep(&w.registry.bind(&w.config), &SweepScope::default())
        .await
        .unwrap();
    let kept = report
        .entries
        .iter()
        .find(|e| e.berth_id == "sn-tracked")
        .unwrap();
    assert!(
        matches!(kept.action, SweepAction::Held { .. }),
        "{:?}",
        kept.action
    );
    assert_eq!(archives(), 1);
    let row = alice.row("sn-tracked").await.unwrap();
    alice.destroy_row(w.host.as_ref(), &row).await.unwrap();
    assert_eq!(archives(), 0);
    // Taken again under a key whose snapshot was deleted: a row of its own, open, while the
    // deleted one keeps its history under a retired name. (The sweep took the source.)
    let sandbox = create(&alice, &w.host).await;
    let source = berth_ledger::native_id(&alice.row(&sandbox).await.unwrap());
    let anew = alice
        .snapshot_tracked(w.host.as_ref(), &source, "sn-tracked", "test", None)
        .await
        .unwrap();
    let row = alice.row("sn-tracked").await.unwrap();
    assert_eq!(row.state, berth_store::LedgerState::Created);
    assert_eq!(row.native_id.as_deref(), Some(anew.handle.as_str()));
    assert_eq!(row.verified_gone_at, None, "a deleted row was reopened");
    let history = alice.owned_rows(None, true).await.unwrap();
    assert!(
        history.iter().any(|r| r.berth_id.starts_with("sn-tracked~")
            && r.state == berth_store::LedgerState::VerifiedGone),
        "{history:?}"
    );
    // A deletion that was requested and never finished (a crash mid-delete): taking the key
    // again finishes it first, then gives the new snapshot a row of its own.
    alice
        .store()
        .ledger_mark_destroy_requested("sn-tracked")
        .await
        .unwrap();
    let after_crash = alice
        .snapshot_tracked(w.host.as_ref(), &source, "sn-tracked", "test", None)
        .await
        .unwrap();
    let row = alice.row("sn-tracked").await.unwrap();
    assert_eq!(row.state, berth_store::LedgerState::Created);
    assert_eq!(row.destroy_requested_at, None);
    assert_eq!(row.native_id.as_deref(), Some(after_crash.handle.as_str()));
    assert_eq!(archives(), 1);
    alice.destroy_row(w.host.as_ref(), &row).await.unwrap();
    assert_eq!(archives(), 0);
    let source_row = alice.row(&sandbox).await.unwrap();
    alice
        .destroy_row(w.host.as_ref(), &source_row)
        .await
        .unwrap();
}

/// A power failure can take an intent that was only safe against a process crash (host and
/// bwrap intents are not flushed): the sandbox directory it leaves carries this store's token
/// but has no row. Discovery adopts it — records a row — and the sweep destroys it.
#[tokio::test]
async fn discovery_adopts_this_stores_sandbox_whose_row_was_lost() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    let identity = alice.store().store_identity().await.unwrap();
    // What create leaves when its row never reached the disk.
    w.host
        .create(&CreateRequest::new(
            SandboxName("bx-lost".into()),
            Labels {
                owner: "alice".into(),
                run_id: "run-gone".into(),
                ledger_token: format!("{identity}0123456789abcdef"),
                expires_at_unix: None,
            },
        ))
        .await
        .unwrap();
    assert!(alice.row("bx-lost").await.is_err());
    let report = alice
        .sweep(&w.registry.bind(&w.config), &discovering_host())
        .await
        .unwrap();
    let actions: Vec<_> = report
        .entries
        .iter()
        .filter(|e| e.berth_id == "bx-lost")
        .map(|e| &e.action)
        .collect();
    assert!(
        matches!(
            actions.as_slice(),
            [SweepAction::Adopted { .. }, SweepAction::Destroyed]
        ),
        "{report:?}"
    );
    assert!(!present(&w.host, "bx-lost").await);
    let row = alice.row("bx-lost").await.unwrap();
    assert_eq!(row.state, LedgerState::VerifiedGone);
    assert_eq!(row.origin, "adopted by sweep");
    assert_eq!(row.run_id, "run-gone");
}

/// A create or fork killed after its sandbox exists and before the result was recorded leaves
/// an `intent` row and a live sandbox. `gc` (the expired-only sweep) destroys it once the row
/// is older than any live create, and leaves a fresh intent alone: a create may be under way.
#[tokio::test]
async fn gc_destroys_a_sandbox_a_crash_left_at_intent_and_spares_a_fresh_one() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    // The crash: the sandbox is made, then the call never returns (its future is dropped, as
    // a killed process drops everything after the side effect).
    let crashed = |ledger: Ledger| {
        let provider = w.host.clone();
        let host = w.host.clone();
        let made = Arc::new(std::sync::Mutex::new(None));
        let seen = made.clone();
        async move {
            let call = ledger.create_tracked(
                host.as_ref(),
                "fork:bx-source",
                None,
                |_| {},
                move |req| async move {
                    *seen.lock().unwrap() = Some(req.name.0.clone());
                    provider.create(&req).await?;
                    std::future::pending().await
                },
            );
            let _ = tokio::time::timeout(std::time::Duration::from_millis(500), call).await;
            let id = made.lock().unwrap().clone().expect("the create started");
            id
        }
    };
    let old = crashed(ledger(&w, "alice", "run-a").await).await;
    let fresh = crashed(ledger(&w, "alice", "run-a").await).await;
    for id in [&old, &fresh] {
        assert_eq!(alice.row(id).await.unwrap().state, LedgerState::Intent);
        assert!(
            present(&w.host, id).await,
            "{id}: the crash left it running"
        );
    }
    // Ten minutes pass for one of them.
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", w.db.display()))
        .await
        .unwrap();
    let long_ago = (chrono::Utc::now() - chrono::TimeDelta::minutes(11))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    sqlx::query("UPDATE ledger SET created_at = ?1 WHERE berth_id = ?2")
        .bind(&long_ago)
        .bind(&old)
        .execute(&db)
        .await
        .unwrap();
    db.close().await;
    let gc = SweepScope {
        expired_only: true,
        ..Default::default()
    };
    let report = alice.sweep(&w.registry.bind(&w.config), &gc).await.unwrap();
    let swept: Vec<_> = report.entries.iter().map(|e| &e.berth_id).collect();
    assert_eq!(swept, vec![&old], "{report:?}");
    assert_eq!(report.entries[0].action, SweepAction::Destroyed);
    assert!(
        !present(&w.host, &old).await,
        "the half-made sandbox is gone"
    );
    assert_eq!(
        alice.row(&old).await.unwrap().state,
        LedgerState::VerifiedGone
    );
    assert!(
        present(&w.host, &fresh).await,
        "a fresh intent may be a live create"
    );
    alice
        .sweep(&w.registry.bind(&w.config), &SweepScope::default())
        .await
        .unwrap();
    assert!(!present(&w.host, &fresh).await);
}

/// A create, fork or snapshot that takes long (a large fork, a docker commit) is not taken
/// for one a crash abandoned: while the call runs it stamps its row's sign of life, and `gc`
/// leaves it alone however old its intent; it completes with its row at `created`.
#[tokio::test]
async fn gc_spares_a_slow_create_that_is_still_under_way() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    let slow = ledger(&w, "alice", "run-a")
        .await
        .with_sign_of_life_every(std::time::Duration::from_millis(50));
    let (started, on_start) = tokio::sync::oneshot::channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let released = release.clone();
    let (host, provider) = (w.host.clone(), w.host.clone());
    let creating = tokio::spawn(async move {
        slow.create_tracked(
            host.as_ref(),
            "fork:bx-big",
            None,
            |_| {},
            move |req| async move {
                let created = provider.create(&req).await?;
                started.send(req.name.0.clone()).unwrap();
                released.notified().await;
                Ok(created)
            },
        )
        .await
    });
    let id = on_start.await.unwrap();
    // Its intent and every sign of life so far are eleven minutes old, as if it had been
    // forking all that time; the call goes on stamping.
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", w.db.display()))
        .await
        .unwrap();
    let long_ago = (chrono::Utc::now() - chrono::TimeDelta::minutes(11))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    sqlx::query("UPDATE ledger SET created_at = ?1, alive_at = ?1 WHERE berth_id = ?2")
        .bind(&long_ago)
        .bind(&id)
        .execute(&db)
        .await
        .unwrap();
    db.close().await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let gc = SweepScope {
        expired_only: true,
        ..Default::default()
    };
    let report = alice.sweep(&w.registry.bind(&w.config), &gc).await.unwrap();
    assert!(
        report.entries.is_empty(),
        "gc swept a create still under way: {report:?}"
    );
    assert!(present(&w.host, &id).await, "{id}: destroyed mid-create");
    release.notify_one();
    let tracked = creating.await.unwrap().unwrap();
    assert_eq!(tracked.berth_id, id);
    let row = alice.row(&id).await.unwrap();
    assert_eq!(row.state, LedgerState::Created);
    assert_eq!(row.verified_gone_at, None);
    alice.destroy_row(w.host.as_ref(), &row).await.unwrap();
    assert!(!present(&w.host, &id).await);
}

/// A sweep that takes a row while its sandbox is being made (an operator's full sweep from
/// another process, or the run's own cleanup) is never undone by the create returning
/// afterwards: the row stays gone, the late create fails naming why, and what it made is
/// destroyed, not left running under a row that says it is gone. (It used to be marked
/// `created` with `verified_gone_at` set, and its sandbox outlived every later sweep.)
#[tokio::test]
async fn a_create_that_returns_after_its_row_was_swept_leaves_nothing_behind() {
    let w = world().await;
    let creator = ledger(&w, "alice", "run-a").await;
    let operator = ledger(&w, "alice", "run-operator").await;
    // Another run's sweep holds a live run's rows (the next test) until they expire; this
    // run's own cleanup takes them at once.
    for own_cleanup in [false, true] {
        let ttl = (!own_cleanup).then_some(std::time::Duration::from_millis(1));
        // A create that waits, before it makes anything, until it is let go.
        let (started, on_start) = tokio::sync::oneshot::channel();
        let release = Arc::new(tokio::sync::Notify::new());
        let released = release.clone();
        let (host, provider) = (w.host.clone(), w.host.clone());
        let slow = ledger(&w, "alice", "run-a").await;
        let creating = tokio::spawn(async move {
            slow.create_tracked(
                host.as_ref(),
                "create",
                ttl,
                |_| {},
                move |req| async move {
                    started.send(req.name.0.clone()).unwrap();
                    released.notified().await;
                    provider.create(&req).await
                },
            )
            .await
        });
        let id = on_start.await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let providers = w.registry.bind(&w.config);
        let report = if own_cleanup {
            creator.cleanup_run(&providers).await.unwrap()
        } else {
            operator
                .sweep(&providers, &SweepScope::default())
                .await
                .unwrap()
        };
        assert_eq!(report.entries.len(), 1, "{report:?}");
        assert_eq!(report.entries[0].action, SweepAction::AlreadyGone);
        release.notify_one();
        let late = creating.await.unwrap().unwrap_err();
        assert!(
            matches!(late, LedgerError::Store(berth_store::StoreError::SweptWhileMade(ref named)) if *named == id),
            "{late}"
        );
        let row = creator.row(&id).await.unwrap();
        assert_eq!(
            row.state,
            LedgerState::VerifiedGone,
            "the swept row was reopened"
        );
        assert!(
            !present(&w.host, &id).await,
            "{id}: made after its row was swept, and left running"
        );
    }
}

/// A sweep from another run holds what a run still live is making or using — in this process
/// (a create under way, then the sandbox it made) or in another (a process holding the run's
/// lock) — and takes it once that run is over or killed. Before, an operator's full sweep
/// destroyed a `berth run`'s sandbox from under its command and failed a create under way.
#[tokio::test]
async fn a_sweep_holds_a_live_runs_rows_and_takes_them_once_it_is_over() {
    let w = world().await;
    let operator = ledger(&w, "alice", "run-operator").await;
    let providers = w.registry.bind(&w.config);
    let held_by_live_run = |report: &berth_ledger::SweepReport, id: &str, run: &str| {
        assert_eq!(report.entries.len(), 1, "{report:?}");
        assert_eq!(report.entries[0].berth_id, id);
        assert!(
            matches!(&report.entries[0].action, SweepAction::Held { reason } if reason.contains(&format!("run `{run}` is still live"))),
            "{report:?}"
        );
    };

    // A create under way in this process: held, and it completes.
    let (started, on_start) = tokio::sync::oneshot::channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let released = release.clone();
    let (host, provider) = (w.host.clone(), w.host.clone());
    let live = ledger(&w, "alice", "run-live").await;
    let creating = tokio::spawn(async move {
        let made = live
            .create_tracked(
                host.as_ref(),
                "create",
                None,
                |_| {},
                move |req| async move {
                    started.send(req.name.0.clone()).unwrap();
                    released.notified().await;
                    provider.create(&req).await
                },
            )
            .await;
        (live, made)
    });
    let id = on_start.await.unwrap();
    let report = operator
        .sweep(&providers, &SweepScope::default())
        .await
        .unwrap();
    held_by_live_run(&report, &id, "run-live");
    assert!(report.complete(), "held is not incomplete");
    release.notify_one();
    let (live, made) = creating.await.unwrap();
    assert_eq!(made.unwrap().berth_id, id, "the create under way completed");
    assert_eq!(operator.row(&id).await.unwrap().state, LedgerState::Created);
    // Made, and its run still live (a `berth run` whose command is running): still held.
    let report = operator
        .sweep(&providers, &SweepScope::default())
        .await
        .unwrap();
    held_by_live_run(&report, &id, "run-live");
    assert!(present(&w.host, &id).await);
    // The run is over: taken.
    drop(live);
    let report = operator
        .sweep(&providers, &SweepScope::default())
        .await
        .unwrap();
    assert_eq!(report.entries.len(), 1, "{report:?}");
    assert_eq!(report.entries[0].action, SweepAction::Destroyed);
    assert!(!present(&w.host, &id).await);

    // A run live in another process: held until that process is killed.
    let other = ledger(&w, "alice", "run-other").await;
    let id = create(&other, &w.host).await;
    drop(other);
    let runs = w.db.with_file_name("berth.db.runs");
    // `-o`: the lock is flock's own, not inherited by `sleep`; its own process group, so the
    // kill below takes `sleep` too.
    let mut holder = std::process::Command::new("flock")
        .arg("-o")
        .arg(runs.join("run-other"))
        .args(["sleep", "60"])
        .process_group(0)
        .spawn()
        .expect("flock(1) from util-linux");
    let lock = runs.join("run-other");
    let mut waited = 0;
    let held = || {
        !std::process::Command::new("flock")
            .arg("-n")
            .arg(&lock)
            .arg("true")
            .status()
            .unwrap()
            .success()
    };
    while !held() {
        assert!(waited < 500, "flock never took {}", lock.display());
        std::thread::sleep(std::time::Duration::from_millis(10));
        waited += 1;
    }
    let report = operator
        .sweep(&providers, &SweepScope::default())
        .await
        .unwrap();
    held_by_live_run(&report, &id, "run-other");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", holder.id())])
        .status()
        .unwrap();
    assert!(killed.success());
    holder.wait().unwrap();
    let report = operator
        .sweep(&providers, &SweepScope::default())
        .await
        .unwrap();
    assert_eq!(report.entries.len(), 1, "{report:?}");
    assert_eq!(
        report.entries[0].action,
        SweepAction::Destroyed,
        "a killed run's rows are taken at once"
    );
    assert!(!present(&w.host, &id).await);
    assert!(!lock.exists(), "the killed run's file is removed");
}

/// A run's claim is one per process: a second ledger of the same run shares it, and it ends
/// when the last holder is dropped. A run id that is no plain file name is claimed under an
/// encoded name, never a path.
#[tokio::test]
async fn run_claims_are_shared_within_a_process_and_end_with_the_last_holder() {
    let w = world().await;
    let store = Store::open(&w.db).await.unwrap();
    let first = store.claim_run("run-shared").unwrap();
    let second = store.claim_run("run-shared").unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    assert!(store.run_is_live("run-shared").unwrap());
    drop(first);
    assert!(
        store.run_is_live("run-shared").unwrap(),
        "one holder is left"
    );
    drop(second);
    assert!(!store.run_is_live("run-shared").unwrap());
    let hostile = store.claim_run("../../escape").unwrap();
    assert!(store.run_is_live("../../escape").unwrap());
    assert!(!w
        .db
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("escape")
        .exists());
    let names: Vec<_> = std::fs::read_dir(w.db.with_file_name("berth.db.runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["%2e2e2f2e2e2f657363617065".to_string()]);
    drop(hostile);
    assert!(
        store.claim_run(&"r".repeat(200)).is_err(),
        "too long to name"
    );
}

/// A create killed mid-fill leaves no sandbox (the provider assembles it under a hidden
/// staging name) but leaves the half-copied tree; a fork killed after its image leaves the
/// image. Destroying the row of a sandbox observed gone still calls the provider's
/// (idempotent) destroy, which removes that residue.
#[tokio::test]
async fn destroying_a_row_whose_sandbox_never_appeared_removes_what_its_create_left() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    let sandboxes = w.config.state_dir.join("host/sandboxes");
    let staged = Arc::new(std::sync::Mutex::new(None));
    let seen = staged.clone();
    let dir = sandboxes.clone();
    let call = alice.create_tracked(
        w.host.as_ref(),
        "fork:bx-source",
        None,
        |_| {},
        move |req| async move {
            // What the host provider has made when a crash comes mid-copy.
            let staging = dir.join(format!(".creating-{}", req.name.0));
            std::fs::create_dir_all(staging.join("workspace")).unwrap();
            std::fs::write(staging.join("workspace/half-copied"), vec![7u8; 4096]).unwrap();
            *seen.lock().unwrap() = Some((req.name.0.clone(), staging));
            std::future::pending().await
        },
    );
    let _ = tokio::time::timeout(std::time::Duration::from_millis(300), call).await;
    let (id, staging) = staged.lock().unwrap().clone().expect("the create started");
    assert!(staging.exists());
    assert!(!present(&w.host, &id).await, "no sandbox was ever made");
    let row = alice.row(&id).await.unwrap();
    assert_eq!(row.state, LedgerState::Intent);
    let outcome = alice.destroy_row(w.host.as_ref(), &row).await.unwrap();
    assert_eq!(
        outcome,
        berth_contract::DestroyOutcome::VerifiedGone {
            already_absent: true
        }
    );
    assert!(!staging.exists(), "the half-copied tree was left behind");
    assert_eq!(
        alice.row(&id).await.unwrap().state,
        LedgerState::VerifiedGone
    );
}

/// The durability an intent asks for follows the provider's listing: host's shows only this
/// home's sandboxes (no flush needed); docker's is shared (flushed).
#[tokio::test]
async fn intents_are_flushed_unless_the_listing_is_this_homes() {
    use berth_store::IntentDurability;
    let w = world().await;
    assert_eq!(
        berth_ledger::intent_durability(w.host.as_ref()),
        IntentDurability::ProcessCrash
    );
    let docker = w.registry.construct("docker", &w.config).unwrap();
    assert_eq!(
        berth_ledger::intent_durability(docker.as_ref()),
        IntentDurability::PowerLoss
    );
    // A ledger token starts with the store's identity.
    let alice = ledger(&w, "alice", "run-a").await;
    let id = create(&alice, &w.host).await;
    let identity = alice.store().store_identity().await.unwrap();
    assert!(alice
        .row(&id)
        .await
        .unwrap()
        .ledger_token
        .starts_with(&identity));
    alice
        .cleanup_run(&w.registry.bind(&w.config))
        .await
        .unwrap();
}

/// Adoption takes nothing on a label's word beyond ownership: a sandbox whose `berth.sandbox`
/// label names another sandbox (a row that exists, or a path) is reported, not adopted, and a
/// token without this store's identity is another store's.
#[tokio::test]
async fn adoption_refuses_a_label_naming_another_sandbox_or_another_stores_token() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    let identity = alice.store().store_identity().await.unwrap();
    let live = create(&alice, &w.host).await;
    let planted = CreateRequest::new(
        SandboxName("bx-planted".into()),
        Labels {
            owner: "alice".into(),
            run_id: "run-x".into(),
            ledger_token: format!("{identity}fedcba9876543210"),
            expires_at_unix: None,
        },
    );
    w.host.create(&planted).await.unwrap();
    // Its metadata rewritten to claim a name with no row.
    let meta = w
        .config
        .state_dir
        .join("host/sandboxes/bx-planted/sandbox.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    json["labels"]["berth.sandbox"] = serde_json::Value::String("bx-ghost".into());
    std::fs::write(&meta, serde_json::to_vec(&json).unwrap()).unwrap();
    w.host
        .create(&CreateRequest::new(
            SandboxName("bx-other-store".into()),
            Labels {
                owner: "alice".into(),
                run_id: "run-y".into(),
                ledger_token: "0000000000000000aaaaaaaaaaaaaaaa".into(),
                expires_at_unix: None,
            },
        ))
        .await
        .unwrap();
    let report = alice
        .sweep(
            &w.registry.bind(&w.config),
            &SweepScope {
                run_id: Some("run-none".into()),
                ..discovering_host()
            },
        )
        .await
        .unwrap();
    assert!(
        report
            .entries
            .iter()
            .all(|e| !matches!(e.action, SweepAction::Adopted { .. })),
        "{report:?}"
    );
    assert!(present(&w.host, "bx-other-store").await);
    assert!(alice.row("bx-other-store").await.is_err());
    assert!(present(&w.host, "bx-planted").await);
    assert!(alice.row("bx-ghost").await.is_err());
    assert_eq!(alice.row(&live).await.unwrap().state, LedgerState::Created);
    alice
        .cleanup_run(&w.registry.bind(&w.config))
        .await
        .unwrap();
    for name in ["bx-planted", "bx-other-store"] {
        w.host.destroy(&NativeId(name.into())).await.unwrap();
    }
}

/// Providers as a machine without a reachable docker engine has them: host works, docker
/// answers `unavailable` to every call (construction here; listing in the CLI's case).
struct DockerDown<'a>(&'a World);

impl berth_contract::ProviderLookup for DockerDown<'_> {
    fn provider(&self, id: &str) -> berth_contract::Result<Arc<dyn Provider>> {
        if id == "docker" {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                "docker",
                "docker engine not reachable",
            ));
        }
        self.0.registry.bind(&self.0.config).provider(id)
    }
}

/// One provider that cannot be listed or constructed does not stop a sweep: the rest is
/// destroyed and verified, the unreachable listing and row are reported, and the sweep is
/// incomplete only for the row it could not verify. (Before: the first unreachable provider
/// failed the whole sweep, so `berth ledger sweep` swept nothing on a machine without docker
/// running, and a must-fire cleanup left the host's sandboxes behind.)
#[tokio::test]
async fn an_unreachable_provider_does_not_stop_the_sweep() {
    let w = world().await;
    let alice = ledger(&w, "alice", "run-a").await;
    let on_host = create(&alice, &w.host).await;
    created_row(&alice, "run-a", "docker", "bx-on-docker", "container-id").await;
    let report = alice
        .sweep(
            &DockerDown(&w),
            &SweepScope {
                discover: vec!["docker".into(), "host".into()],
                ..Default::default()
            },
        )
        .await
        .expect("the sweep runs to the end");
    let action = |id: &str| {
        report
            .entries
            .iter()
            .find(|e| e.berth_id == id)
            .map(|e| e.action.clone())
            .unwrap_or_else(|| panic!("no entry for {id}: {:?}", report.entries))
    };
    assert_eq!(action(&on_host), SweepAction::Destroyed);
    assert!(!present(&w.host, &on_host).await);
    assert!(
        matches!(action("<listing docker>"), SweepAction::NotListed { kind, .. } if kind == "unavailable")
    );
    assert!(
        matches!(action("bx-on-docker"), SweepAction::Failed { kind, .. } if kind == "unavailable")
    );
    assert!(!report.complete(), "the docker row is not verified gone");
    assert_eq!(
        alice
            .store()
            .ledger_get("bx-on-docker")
            .await
            .unwrap()
            .state,
        LedgerState::Created,
        "its row stays open for the next sweep"
    );

    // The must-fire cleanup of a run: the host sandbox goes even though the docker row fails.
    let run = ledger(&w, "alice", "run-b").await;
    created_row(&run, "run-b", "docker", "bx-also-on-docker", "container-id").await;
    let on_host = create(&run, &w.host).await;
    let report = run.cleanup_run(&DockerDown(&w)).await.unwrap();
    assert_eq!(report.entries.len(), 2, "{:?}", report.entries);
    assert!(!present(&w.host, &on_host).await);
    assert!(!report.complete());

    // Only the listing is unreachable: nothing of ours is left unverified, so it is complete.
    let bob = Ledger::new(Store::open(&w.db).await.unwrap(), "bob", "run-c");
    let report = bob
        .sweep(
            &DockerDown(&w),
            &SweepScope {
                discover: vec!["docker".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(report.complete(), "{:?}", report.entries);
    assert!(matches!(
        report.entries.as_slice(),
        [entry] if matches!(entry.action, SweepAction::NotListed { .. })
    ));
}

/// A claim races the sweeps that remove the files of runs that are over: whatever the
/// interleaving, a run just claimed is live (its lock is on the file its name leads to, never
/// on one a sweep unlinked between the claim's open and its lock).
#[tokio::test]
async fn a_claim_racing_sweeps_that_tidy_run_files_is_always_live() {
    let w = world().await;
    let store = Store::open(&w.db).await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pruners: Vec<_> = (0..2)
        .map(|_| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    store.prune_runs().unwrap();
                }
            })
        })
        .collect();
    let mut held = Vec::new();
    let mut lost = 0;
    for n in 0..1000 {
        let run = format!("run-race-{n}");
        held.push(store.claim_run(&run).unwrap());
        if !store.run_is_live(&run).unwrap() {
            lost += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for pruner in pruners {
        pruner.join().unwrap();
    }
    assert_eq!(lost, 0, "claimed runs that a sweep would take as over");
}
