//! Ledger rows and the store contract every backend implements ([`LedgerStore`]). The
//! SQLite implementation is `crate::sqlite`; [`contract`] is the suite any backend must pass.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::StoreError;

/// Where a ledger row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LedgerState {
    /// Recorded before the provider was asked to create.
    Intent,
    /// The provider returned from create.
    Created,
    /// Create failed; something may still exist.
    CreateFailed,
    /// Destroy was asked for and has not answered yet.
    DestroyRequested,
    /// The provider accepted destroy; gone-ness not yet verified.
    DestroyAccepted,
    /// Destroy failed.
    DestroyFailed,
    /// Observe confirmed the resource gone. Terminal.
    VerifiedGone,
}

impl LedgerState {
    /// Every state.
    pub const ALL: [LedgerState; 7] = [
        LedgerState::Intent,
        LedgerState::Created,
        LedgerState::CreateFailed,
        LedgerState::DestroyRequested,
        LedgerState::DestroyAccepted,
        LedgerState::DestroyFailed,
        LedgerState::VerifiedGone,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            LedgerState::Intent => "intent",
            LedgerState::Created => "created",
            LedgerState::CreateFailed => "create_failed",
            LedgerState::DestroyRequested => "destroy_requested",
            LedgerState::DestroyAccepted => "destroy_accepted",
            LedgerState::DestroyFailed => "destroy_failed",
            LedgerState::VerifiedGone => "verified_gone",
        }
    }
}

impl fmt::Display for LedgerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LedgerState {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, StoreError> {
        LedgerState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown ledger state `{s}`")))
    }
}

/// A row to insert before calling create.
#[derive(Debug, Clone)]
pub struct NewLedgerRow {
    /// Berth's id for the sandbox.
    pub berth_id: String,
    /// Provider id.
    pub provider: String,
    /// Owner label.
    pub owner: String,
    /// Run label.
    pub run_id: String,
    /// Ledger token label.
    pub ledger_token: String,
    /// Every label the resource will carry.
    pub labels: BTreeMap<String, String>,
    /// How it is made: `create`, `fork:<id>`, `restore:<handle>`.
    pub origin: String,
    /// What the row tracks.
    pub kind: ResourceKind,
    /// Expiry.
    pub expires_at: Option<DateTime<Utc>>,
    /// What the intent must survive before the resource may be created.
    pub durability: IntentDurability,
}

/// What an intent row must survive once `ledger_insert_intent` returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentDurability {
    /// Power loss and kernel crashes (flushed to disk before returning): the default, for any
    /// resource a lost row could leave unfindable — a container, a cloud sandbox, a snapshot.
    #[default]
    PowerLoss,
    /// A crash of the Berth process (`kill -9`), not power loss. Enough only where whatever
    /// the resource leaves after power loss is found by listing a place nothing but this Berth
    /// home writes, so a sweep can adopt it without a row (see the ledger's sweep).
    ProcessCrash,
}

/// A stored ledger row.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerRow {
    /// Berth's id for the sandbox.
    pub berth_id: String,
    /// Provider id.
    pub provider: String,
    /// Provider's id, once create returned.
    pub native_id: Option<String>,
    /// Owner label.
    pub owner: String,
    /// Run label.
    pub run_id: String,
    /// Ledger token label.
    pub ledger_token: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// How it was made.
    pub origin: String,
    /// What the row tracks.
    pub kind: ResourceKind,
    /// Expiry.
    pub expires_at: Option<DateTime<Utc>>,
    /// Current state.
    pub state: LedgerState,
    /// When the intent was recorded.
    pub created_at: DateTime<Utc>,
    /// The last sign of life of the call making the resource (a create, fork or snapshot still
    /// under way stamps it about every 30 s; `None`: none since the intent).
    pub alive_at: Option<DateTime<Utc>>,
    /// When create returned.
    pub create_returned_at: Option<DateTime<Utc>>,
    /// When destroy was first requested.
    pub destroy_requested_at: Option<DateTime<Utc>>,
    /// When gone-ness was verified.
    pub verified_gone_at: Option<DateTime<Utc>>,
    /// Kind of the last error.
    pub last_error_kind: Option<String>,
    /// The last error's message (never a secret value).
    pub last_error: Option<String>,
}

/// What a ledger row tracks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceKind {
    /// A sandbox: destroyed through the provider's destroy, proven ours by its labels.
    #[default]
    Sandbox,
    /// A snapshot taken under the row's key (its `berth_id`): deleted by that key.
    Snapshot,
}

impl ResourceKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Sandbox => "sandbox",
            ResourceKind::Snapshot => "snapshot",
        }
    }
}

/// Which rows to list.
#[derive(Debug, Clone, Default)]
pub struct LedgerQuery {
    /// Only this owner's rows.
    pub owner: Option<String>,
    /// Only this run's rows.
    pub run_id: Option<String>,
    /// Include verified-gone rows.
    pub include_gone: bool,
}

/// What the ledger needs from durable storage, typed: rows in, rows out. The SQLite [`crate::Store`]
/// implements it; a PostgreSQL backend is one more implementation passing [`contract`]:
///
/// - an intent is durable when `ledger_insert_intent` returns — across power loss, or across
///   a process crash where the row asks only for [`IntentDurability::ProcessCrash`] — and a
///   second intent under the same `berth_id` is refused;
/// - updates of a row that does not exist fail with [`StoreError::NotFound`] naming it;
/// - `ledger_mark_destroy_requested` keeps the first request time and never moves a verified
///   gone row back;
/// - `ledger_mark_created` never reopens a row a destroy was requested for (a sweep took it
///   while its resource was being made): [`StoreError::SweptWhileMade`], the row unchanged;
/// - `ledger_retire` frees only a verified-gone name (the row is kept as `NAME~TOKEN`);
/// - a ledger token is unique across all rows (it proves a resource is this row's);
/// - `ledger_list` filters by owner and run, hides verified-gone rows unless asked, oldest first;
/// - `store_identity` is fixed for the store's life and differs between stores.
#[async_trait::async_trait]
pub trait LedgerStore: Send + Sync + fmt::Debug {
    /// Records the intent to create, before any provider call.
    async fn ledger_insert_intent(&self, row: &NewLedgerRow) -> Result<(), StoreError>;
    /// Records that create returned `native_id`.
    async fn ledger_mark_created(&self, berth_id: &str, native_id: &str) -> Result<(), StoreError>;
    /// Records that the call making the row's resource is still under way (`alive_at`).
    async fn ledger_mark_alive(&self, berth_id: &str) -> Result<(), StoreError>;
    /// Records a failed create (the resource may still exist; a sweep will check).
    async fn ledger_mark_create_failed(
        &self,
        berth_id: &str,
        kind: &str,
        message: &str,
    ) -> Result<(), StoreError>;
    /// Records that destroy is about to be called (first request time kept).
    async fn ledger_mark_destroy_requested(&self, berth_id: &str) -> Result<(), StoreError>;
    /// Frees a verified-gone name so it can be created again.
    async fn ledger_retire(&self, berth_id: &str) -> Result<(), StoreError>;
    /// Records a destroy outcome (an error's kind and message, never a secret value).
    async fn ledger_mark_destroy_result(
        &self,
        berth_id: &str,
        state: LedgerState,
        error: Option<(&str, &str)>,
    ) -> Result<(), StoreError>;
    /// One row.
    async fn ledger_get(&self, berth_id: &str) -> Result<LedgerRow, StoreError>;
    /// Rows matching `query`, oldest first.
    async fn ledger_list(&self, query: &LedgerQuery) -> Result<Vec<LedgerRow>, StoreError>;
    /// This store's identity: random, fixed when the store was made, the same on every call
    /// and reopen, different for every store.
    async fn store_identity(&self) -> Result<String, StoreError>;
}

/// The suite any [`LedgerStore`] backend must pass, each check against a fresh, empty store
/// from `fresh`. Panics (with what broke) on the first violation.
pub mod contract {
    use std::collections::BTreeMap;
    use std::future::Future;

    use chrono::Utc;

    use super::{LedgerQuery, LedgerState, LedgerStore, NewLedgerRow};
    use crate::StoreError;

    fn new_row(id: &str, owner: &str) -> NewLedgerRow {
        NewLedgerRow {
            berth_id: id.into(),
            provider: "host".into(),
            owner: owner.into(),
            run_id: "run-1".into(),
            ledger_token: format!("tok-{id}"),
            labels: BTreeMap::from([("berth.owner".into(), owner.into())]),
            origin: "create".into(),
            kind: Default::default(),
            expires_at: Some(Utc::now()),
            durability: Default::default(),
        }
    }

    /// Runs every check.
    pub async fn run<S, F, Fut>(fresh: F)
    where
        S: LedgerStore,
        F: Fn() -> Fut,
        Fut: Future<Output = S>,
    {
        row_walks_through_its_states(&fresh().await).await;
        a_swept_row_is_never_reopened_by_its_create(&fresh().await).await;
        list_filters_by_owner_and_hides_gone_rows(&fresh().await).await;
        duplicates_and_missing_rows_are_errors(&fresh().await).await;
        retire_frees_only_verified_gone_names(&fresh().await).await;
        identity_is_fixed_and_distinct(&fresh().await, &fresh().await).await;
        a_process_crash_intent_is_a_row_like_any(&fresh().await).await;
    }

    async fn identity_is_fixed_and_distinct(one: &dyn LedgerStore, other: &dyn LedgerStore) {
        let id = one.store_identity().await.unwrap();
        assert!(!id.is_empty());
        assert_eq!(one.store_identity().await.unwrap(), id);
        assert_ne!(other.store_identity().await.unwrap(), id);
    }

    async fn a_process_crash_intent_is_a_row_like_any(store: &dyn LedgerStore) {
        let mut row = new_row("bx-pc", "alice");
        row.durability = super::IntentDurability::ProcessCrash;
        store.ledger_insert_intent(&row).await.unwrap();
        assert_eq!(
            store.ledger_get("bx-pc").await.unwrap().state,
            LedgerState::Intent
        );
        assert!(store.ledger_insert_intent(&row).await.is_err());
    }

    async fn row_walks_through_its_states(store: &dyn LedgerStore) {
        store
            .ledger_insert_intent(&new_row("bx-1", "alice"))
            .await
            .unwrap();
        let row = store.ledger_get("bx-1").await.unwrap();
        assert_eq!(row.state, LedgerState::Intent);
        assert_eq!(row.alive_at, None, "no sign of life before the first");
        store.ledger_mark_alive("bx-1").await.unwrap();
        let alive_at = store.ledger_get("bx-1").await.unwrap().alive_at;
        assert!(
            alive_at.is_some_and(|t| t >= row.created_at),
            "{alive_at:?}"
        );
        store.ledger_mark_created("bx-1", "native-1").await.unwrap();
        let row = store.ledger_get("bx-1").await.unwrap();
        assert_eq!(row.state, LedgerState::Created);
        assert_eq!(row.native_id.as_deref(), Some("native-1"));
        store.ledger_mark_destroy_requested("bx-1").await.unwrap();
        let first_request = store.ledger_get("bx-1").await.unwrap().destroy_requested_at;
        assert!(first_request.is_some());
        store.ledger_mark_destroy_requested("bx-1").await.unwrap();
        assert_eq!(
            store.ledger_get("bx-1").await.unwrap().destroy_requested_at,
            first_request,
            "first request time is kept"
        );
        store
            .ledger_mark_destroy_result(
                "bx-1",
                LedgerState::DestroyFailed,
                Some(("unavailable", "daemon down")),
            )
            .await
            .unwrap();
        store
            .ledger_mark_destroy_result("bx-1", LedgerState::VerifiedGone, None)
            .await
            .unwrap();
        let row = store.ledger_get("bx-1").await.unwrap();
        assert_eq!(row.state, LedgerState::VerifiedGone);
        assert!(row.verified_gone_at.is_some());
        assert_eq!(
            row.last_error.as_deref(),
            Some("daemon down"),
            "a success keeps the last error"
        );
        assert_eq!(row.labels.get("berth.owner").unwrap(), "alice");
        store.ledger_mark_destroy_requested("bx-1").await.unwrap();
        assert_eq!(
            store.ledger_get("bx-1").await.unwrap().state,
            LedgerState::VerifiedGone,
            "a verified-gone row never moves back"
        );
    }

    async fn a_swept_row_is_never_reopened_by_its_create(store: &dyn LedgerStore) {
        for id in ["bx-swept", "bx-gone"] {
            store
                .ledger_insert_intent(&new_row(id, "alice"))
                .await
                .unwrap();
        }
        store
            .ledger_mark_destroy_requested("bx-swept")
            .await
            .unwrap();
        store
            .ledger_mark_destroy_result("bx-gone", LedgerState::VerifiedGone, None)
            .await
            .unwrap();
        for (id, state) in [
            ("bx-swept", LedgerState::DestroyRequested),
            ("bx-gone", LedgerState::VerifiedGone),
        ] {
            let err = store
                .ledger_mark_created(id, "native-late")
                .await
                .unwrap_err();
            assert!(
                matches!(err, StoreError::SweptWhileMade(ref named) if named == id),
                "{err}"
            );
            let row = store.ledger_get(id).await.unwrap();
            assert_eq!(row.state, state, "{id}: the row moved");
            assert_eq!(row.native_id, None, "{id}: the row took the late native id");
        }
    }

    async fn list_filters_by_owner_and_hides_gone_rows(store: &dyn LedgerStore) {
        for (id, owner) in [("bx-a", "alice"), ("bx-b", "bob"), ("bx-c", "alice")] {
            store
                .ledger_insert_intent(&new_row(id, owner))
                .await
                .unwrap();
        }
        store
            .ledger_mark_destroy_result("bx-c", LedgerState::VerifiedGone, None)
            .await
            .unwrap();
        let alice = LedgerQuery {
            owner: Some("alice".into()),
            ..Default::default()
        };
        let ids: Vec<_> = store
            .ledger_list(&alice)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.berth_id)
            .collect();
        assert_eq!(ids, vec!["bx-a"]);
        let all = LedgerQuery {
            include_gone: true,
            ..Default::default()
        };
        let ids: Vec<_> = store
            .ledger_list(&all)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.berth_id)
            .collect();
        assert_eq!(ids, vec!["bx-a", "bx-b", "bx-c"], "oldest first");
        let other_run = LedgerQuery {
            run_id: Some("run-2".into()),
            include_gone: true,
            ..Default::default()
        };
        assert!(store.ledger_list(&other_run).await.unwrap().is_empty());
    }

    async fn duplicates_and_missing_rows_are_errors(store: &dyn LedgerStore) {
        store
            .ledger_insert_intent(&new_row("bx-a", "alice"))
            .await
            .unwrap();
        assert!(store
            .ledger_insert_intent(&new_row("bx-a", "alice"))
            .await
            .is_err());
        let err = store
            .ledger_mark_created("bx-missing", "n")
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::NotFound(_, ref id) if id == "bx-missing"),
            "{err}"
        );
        let err = store.ledger_mark_alive("bx-missing").await.unwrap_err();
        assert!(
            matches!(err, StoreError::NotFound(_, ref id) if id == "bx-missing"),
            "{err}"
        );
        let err = store.ledger_get("bx-missing").await.unwrap_err();
        assert!(matches!(err, StoreError::NotFound(..)), "{err}");
    }

    async fn retire_frees_only_verified_gone_names(store: &dyn LedgerStore) {
        store
            .ledger_insert_intent(&new_row("bx-r", "alice"))
            .await
            .unwrap();
        assert!(
            matches!(
                store.ledger_retire("bx-r").await,
                Err(StoreError::NotFound(..))
            ),
            "a live name is not freed"
        );
        store
            .ledger_mark_destroy_result("bx-r", LedgerState::VerifiedGone, None)
            .await
            .unwrap();
        store.ledger_retire("bx-r").await.unwrap();
        assert!(matches!(
            store.ledger_get("bx-r").await,
            Err(StoreError::NotFound(..))
        ));
        // The name is free again; every token is unique, so the new row has its own.
        let mut again = new_row("bx-r", "alice");
        assert!(
            store.ledger_insert_intent(&again).await.is_err(),
            "a ledger token is never reused"
        );
        again.ledger_token = "tok-bx-r-2".into();
        store.ledger_insert_intent(&again).await.unwrap();
        let all = LedgerQuery {
            include_gone: true,
            ..Default::default()
        };
        let ids: Vec<_> = store
            .ledger_list(&all)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.berth_id)
            .collect();
        assert_eq!(
            ids,
            vec!["bx-r~tok-bx-r", "bx-r"],
            "history kept under NAME~TOKEN"
        );
    }
}
