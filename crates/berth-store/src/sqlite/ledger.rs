//! The SQLite ledger: [`LedgerStore`] for [`Store`].

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::Row;

use crate::ledger::{
    IntentDurability, LedgerQuery, LedgerRow, LedgerState, LedgerStore, NewLedgerRow, ResourceKind,
};
use crate::{Record, Store, StoreError};

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn parse_ts(field: &str, text: Option<String>) -> Result<Option<DateTime<Utc>>, StoreError> {
    text.map(|t| {
        DateTime::parse_from_rfc3339(&t)
            .map(|d| d.with_timezone(&Utc))
            .map_err(|_| StoreError::Corrupt(format!("{field} `{t}` is not RFC 3339")))
    })
    .transpose()
}

fn query_err(what: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Query { what, source }
}

fn row_to_ledger(row: sqlx::sqlite::SqliteRow) -> Result<LedgerRow, StoreError> {
    ledger_row(|name| {
        row.try_get::<Option<String>, _>(name)
            .map_err(|e| StoreError::Corrupt(format!("{name}: {e}")))
    })
}

/// A row read in-process (see `sqlite::direct`).
fn direct_row_to_ledger(row: &rusqlite::Row<'_>) -> Result<LedgerRow, StoreError> {
    ledger_row(|name| {
        row.get::<_, Option<String>>(name)
            .map_err(|e| StoreError::Corrupt(format!("{name}: {e}")))
    })
}

/// A ledger row from its columns, whichever driver read them (`opt`: a text column by name).
fn ledger_row(
    opt: impl Fn(&str) -> Result<Option<String>, StoreError>,
) -> Result<LedgerRow, StoreError> {
    let get = |name: &str| -> Result<String, StoreError> {
        opt(name)?.ok_or_else(|| StoreError::Corrupt(format!("{name}: NULL")))
    };
    let labels: BTreeMap<String, String> = serde_json::from_str(&get("labels_json")?)
        .map_err(|e| StoreError::Corrupt(format!("labels_json: {e}")))?;
    Ok(LedgerRow {
        berth_id: get("berth_id")?,
        provider: get("provider")?,
        native_id: opt("native_id")?,
        owner: get("owner")?,
        run_id: get("run_id")?,
        ledger_token: get("ledger_token")?,
        labels,
        origin: get("origin")?,
        kind: match get("kind")?.as_str() {
            "snapshot" => ResourceKind::Snapshot,
            "sandbox" => ResourceKind::Sandbox,
            other => return Err(StoreError::Corrupt(format!("kind `{other}`"))),
        },
        expires_at: parse_ts("expires_at", opt("expires_at")?)?,
        state: get("state")?.parse()?,
        created_at: parse_ts("created_at", Some(get("created_at")?))?.expect("some in, some out"),
        alive_at: parse_ts("alive_at", opt("alive_at")?)?,
        create_returned_at: parse_ts("create_returned_at", opt("create_returned_at")?)?,
        destroy_requested_at: parse_ts("destroy_requested_at", opt("destroy_requested_at")?)?,
        verified_gone_at: parse_ts("verified_gone_at", opt("verified_gone_at")?)?,
        last_error_kind: opt("last_error_kind")?,
        last_error: opt("last_error")?,
    })
}

#[async_trait::async_trait]
impl LedgerStore for Store {
    /// Records the intent to create, before any provider call. Durable when this returns:
    /// through a `synchronous=FULL` connection (power loss), or a `NORMAL` one where the row
    /// asks only to survive a process crash.
    async fn ledger_insert_intent(&self, row: &NewLedgerRow) -> Result<(), StoreError> {
        let now = ts(Utc::now());
        let labels = serde_json::to_string(&row.labels).expect("labels serialize");
        let full = row.durability == IntentDurability::PowerLoss;
        // In-process: every sandbox a mission makes starts here (see `sqlite::direct`).
        self.direct()
            .run_durable(full, "record create intent", |conn| {
                conn.prepare_cached(
                    "INSERT INTO ledger (berth_id, provider, owner, run_id, ledger_token, \
                     labels_json, origin, kind, expires_at, state, created_at, updated_at) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'intent', ?, ?)",
                )
                .and_then(|mut insert| {
                    insert.execute(rusqlite::params![
                        row.berth_id,
                        row.provider,
                        row.owner,
                        row.run_id,
                        row.ledger_token,
                        labels,
                        row.origin,
                        row.kind.as_str(),
                        row.expires_at.map(ts),
                        now,
                        now,
                    ])
                })
                .map(|_| ())
            })
    }

    /// Records that create returned `native_id`.
    async fn ledger_mark_created(&self, berth_id: &str, native_id: &str) -> Result<(), StoreError> {
        let now = ts(Utc::now());
        // A row a sweep has taken is never reopened (its sandbox would outlive a row that
        // says it is gone).
        let marked = self
            .update(
                "record create result",
                "UPDATE ledger SET state = 'created', native_id = ?, create_returned_at = ?, \
                 updated_at = ? WHERE destroy_requested_at IS NULL \
                 AND state != 'verified_gone' AND berth_id = ?",
                &[Some(native_id), Some(&now), Some(&now), Some(berth_id)],
            )
            .await;
        match marked {
            Err(StoreError::NotFound(..)) if self.ledger_get(berth_id).await.is_ok() => {
                Err(StoreError::SweptWhileMade(berth_id.to_owned()))
            }
            other => other,
        }
    }

    /// Records that the call making the row's resource is still under way.
    async fn ledger_mark_alive(&self, berth_id: &str) -> Result<(), StoreError> {
        let now = ts(Utc::now());
        self.update(
            "record a sign of life",
            "UPDATE ledger SET alive_at = ? WHERE berth_id = ?",
            &[Some(&now), Some(berth_id)],
        )
        .await
    }

    /// Records a failed create (the resource may still exist; a sweep will check).
    async fn ledger_mark_create_failed(
        &self,
        berth_id: &str,
        kind: &str,
        message: &str,
    ) -> Result<(), StoreError> {
        let now = ts(Utc::now());
        self.update(
            "record create failure",
            "UPDATE ledger SET state = 'create_failed', create_returned_at = ?, \
             last_error_kind = ?, last_error = ?, updated_at = ? WHERE berth_id = ?",
            &[
                Some(&now),
                Some(kind),
                Some(message),
                Some(&now),
                Some(berth_id),
            ],
        )
        .await
    }

    /// Records that destroy is about to be called (first request time kept).
    async fn ledger_mark_destroy_requested(&self, berth_id: &str) -> Result<(), StoreError> {
        let now = ts(Utc::now());
        self.update(
            "record destroy request",
            "UPDATE ledger SET state = CASE WHEN state = 'verified_gone' THEN state \
             ELSE 'destroy_requested' END, \
             destroy_requested_at = COALESCE(destroy_requested_at, ?), updated_at = ? \
             WHERE berth_id = ?",
            &[Some(&now), Some(&now), Some(berth_id)],
        )
        .await
    }

    /// Frees a name whose resource is verified gone, so it can be created again: the row keeps
    /// its history under `NAME~TOKEN`. Fails with `NotFound` unless the row is verified gone.
    async fn ledger_retire(&self, berth_id: &str) -> Result<(), StoreError> {
        let now = ts(Utc::now());
        self.update(
            "retire ledger row",
            "UPDATE ledger SET berth_id = berth_id || '~' || ledger_token, updated_at = ? \
             WHERE state = 'verified_gone' AND berth_id = ?",
            &[Some(&now), Some(berth_id)],
        )
        .await
    }

    /// Records a destroy outcome.
    async fn ledger_mark_destroy_result(
        &self,
        berth_id: &str,
        state: LedgerState,
        error: Option<(&str, &str)>,
    ) -> Result<(), StoreError> {
        let now = ts(Utc::now());
        let gone_at = (state == LedgerState::VerifiedGone).then(|| now.clone());
        self.update(
            "record destroy result",
            // A success keeps the last error (e.g. why create failed) for the record.
            "UPDATE ledger SET state = ?, verified_gone_at = COALESCE(verified_gone_at, ?), \
             last_error_kind = COALESCE(?, last_error_kind), \
             last_error = COALESCE(?, last_error), updated_at = ? WHERE berth_id = ?",
            &[
                Some(state.as_str()),
                gone_at.as_deref(),
                error.map(|e| e.0),
                error.map(|e| e.1),
                Some(&now),
                Some(berth_id),
            ],
        )
        .await
    }

    /// One row.
    async fn ledger_get(&self, berth_id: &str) -> Result<LedgerRow, StoreError> {
        let found = self.direct().run("read ledger entry", |conn| {
            let mut select = conn.prepare_cached("SELECT * FROM ledger WHERE berth_id = ?")?;
            let mut rows = select.query([berth_id])?;
            Ok(rows.next()?.map(direct_row_to_ledger))
        })?;
        found.ok_or_else(|| StoreError::NotFound(Record::LedgerEntry, berth_id.to_owned()))?
    }

    /// Read once per process: it never changes.
    async fn store_identity(&self) -> Result<String, StoreError> {
        self.identity().await
    }

    /// Rows matching `query`, oldest first.
    async fn ledger_list(&self, query: &LedgerQuery) -> Result<Vec<LedgerRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM ledger WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR run_id = ?2) \
             AND (?3 OR state != 'verified_gone') ORDER BY created_at, berth_id",
        )
        .bind(&query.owner)
        .bind(&query.run_id)
        .bind(query.include_gone)
        .fetch_all(self.pool())
        .await
        .map_err(query_err("list ledger"))?;
        rows.into_iter().map(row_to_ledger).collect()
    }
}

impl Store {
    async fn identity(&self) -> Result<String, StoreError> {
        let found = self
            .identity
            // In-process: a `berth create` would otherwise start sqlx's connection just for it.
            .get_or_try_init(|| async {
                self.direct().run("read the store's identity", |conn| {
                    conn.prepare_cached("SELECT id FROM store_identity WHERE singleton = 1")?
                        .query_row([], |row| row.get::<_, String>(0))
                })
            })
            .await?;
        Ok(found.clone())
    }

    async fn update(
        &self,
        what: &'static str,
        sql: &str,
        binds: &[Option<&str>],
    ) -> Result<(), StoreError> {
        // In-process: each sandbox's life is several of these (see `sqlite::direct`).
        let changed = self.direct().run(what, |conn| {
            conn.prepare_cached(sql)?
                .execute(rusqlite::params_from_iter(binds))
        })?;
        if changed == 0 {
            let id = binds.last().copied().flatten().unwrap_or_default();
            return Err(StoreError::NotFound(Record::LedgerEntry, id.to_owned()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::contract;

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

    /// The SQLite store passes the backend contract.
    #[tokio::test]
    async fn sqlite_passes_the_ledger_store_contract() {
        let dirs = std::sync::Mutex::new(Vec::new());
        contract::run(|| async {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(&dir.path().join("berth.db")).await.unwrap();
            dirs.lock().unwrap().push(dir);
            store
        })
        .await;
    }

    #[tokio::test]
    async fn rows_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("berth.db");
        let store = Store::open(&path).await.unwrap();
        store
            .ledger_insert_intent(&new_row("bx-a", "alice"))
            .await
            .unwrap();
        store.close().await;
        let reopened = Store::open(&path).await.unwrap();
        assert_eq!(
            reopened.ledger_get("bx-a").await.unwrap().state,
            LedgerState::Intent
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_first_opens_all_migrate_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("berth.db");
        let mut opens = Vec::new();
        for _ in 0..8 {
            let path = path.clone();
            opens.push(tokio::spawn(
                async move { Store::open(&path).await.map(|_| ()) },
            ));
        }
        for open in opens {
            open.await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn a_newer_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("berth.db");
        let store = Store::open(&path).await.unwrap();
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (9999, 'from the future', 1, x'00', 0)",
        )
        .execute(store.pool())
        .await
        .unwrap();
        store.close().await;
        let err = Store::open(&path).await.unwrap_err();
        assert!(matches!(err, StoreError::Migrate { .. }), "{err}");
    }
}
