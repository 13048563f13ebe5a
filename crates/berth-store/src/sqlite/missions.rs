//! The SQLite mission store: [`MissionStore`] for [`Store`].

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{now, q, ts};
use crate::missions::{AttemptFact, Conflict, LeaseHeld, MissionRow, MissionStore};
use crate::{Record, Store, StoreError};

fn row(r: sqlx::sqlite::SqliteRow) -> Result<MissionRow, StoreError> {
    let get = |n: &str| {
        r.try_get::<String, _>(n)
            .map_err(|e| StoreError::Corrupt(format!("{n}: {e}")))
    };
    Ok(MissionRow {
        id: get("id")?,
        name: get("name")?,
        owner: get("owner")?,
        spec_json: get("spec_json")?,
        record_json: get("record_json")?,
        state: get("state")?,
        seq: r
            .try_get("seq")
            .map_err(|e| StoreError::Corrupt(format!("seq: {e}")))?,
        created_at: ts(&get("created_at")?)?,
        updated_at: ts(&get("updated_at")?)?,
    })
}

/// One append, in one immediate transaction: the record moves on only from `expected_seq` and
/// under `fence` (when one is given), and its events and facts land with it.
#[allow(clippy::too_many_arguments)] // the append's parts travel together
fn append(
    conn: &mut rusqlite::Connection,
    id: &str,
    expected_seq: i64,
    fence: Option<i64>,
    events_json: &[String],
    record_json: &str,
    state: &str,
    facts: &[(&str, &str, String)],
    at: &str,
) -> rusqlite::Result<Result<i64, Conflict>> {
    let count = events_json.len() as i64;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let updated = tx
        .prepare_cached(
            "UPDATE missions SET record_json = ?1, state = ?2, seq = seq + ?3, updated_at = ?4 \
             WHERE id = ?5 AND seq = ?6 AND (?7 IS NULL OR (lease_fence = ?7 AND lease_holder IS NOT NULL))",
        )?
        .execute(rusqlite::params![record_json, state, count, at, id, expected_seq, fence])?;
    if updated == 0 {
        // Dropping the transaction rolls it back.
        return Ok(Err(Conflict {
            mission: id.to_owned(),
            expected: expected_seq,
        }));
    }
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO mission_events (mission_id, seq, event_json, at) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (n, event_json) in (1..).zip(events_json) {
            insert.execute(rusqlite::params![id, expected_seq + n, event_json, at])?;
        }
        let mut fact = tx.prepare_cached(
            "INSERT INTO attempt_facts (mission_id, attempt_key, kind, detail_json, at) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for (attempt_key, kind, detail_json) in facts {
            fact.execute(rusqlite::params![id, attempt_key, kind, detail_json, at])?;
        }
    }
    tx.commit()?;
    Ok(Ok(expected_seq + count))
}

#[async_trait::async_trait]
impl MissionStore for Store {
    /// Records a new mission.
    async fn mission_insert(
        &self,
        id: &str,
        name: &str,
        owner: &str,
        spec_json: &str,
        record_json: &str,
        state: &str,
    ) -> Result<(), StoreError> {
        let at = now();
        sqlx::query(
            "INSERT INTO missions (id, name, owner, spec_json, record_json, state, seq, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)",
        )
        .bind(id)
        .bind(name)
        .bind(owner)
        .bind(spec_json)
        .bind(record_json)
        .bind(state)
        .bind(&at)
        .bind(&at)
        .execute(self.durable())
        .await
        .map_err(q("record mission"))?;
        Ok(())
    }

    /// Appends one event, the record it produced and the attempt facts that explain it, in one
    /// transaction, if the mission is still at `expected_seq` (optimistic concurrency). Returns
    /// the new sequence number.
    async fn mission_lease_acquire(
        &self,
        id: &str,
        holder: &str,
        ttl: std::time::Duration,
        steal_from: Option<&str>,
    ) -> Result<Result<i64, LeaseHeld>, StoreError> {
        let now = Utc::now();
        let until = now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
        let fmt = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        // In-process, like every statement a runner makes (see `sqlite::direct`): the take
        // and, when it fails, the read of who holds it. In a transaction of its own: an
        // `UPDATE … RETURNING` yields its row before it commits, and an autocommit statement
        // commits when it is reset, which reports no error — a commit that failed (a full
        // disk) would hand back a fence never stored.
        let taken = self.direct().run("take mission lease", |conn| {
            use rusqlite::OptionalExtension;
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let fence = tx
                .prepare_cached(
                    "UPDATE missions SET lease_holder = ?, lease_fence = lease_fence + 1, \
                     lease_expires_at = ? \
                     WHERE id = ? AND (lease_holder IS NULL OR lease_expires_at < ? OR lease_holder = ?) \
                     RETURNING lease_fence",
                )?
                .query_row(
                    rusqlite::params![
                        holder,
                        fmt(until),
                        id,
                        fmt(now),
                        steal_from.unwrap_or("\u{0}")
                    ],
                    |r| r.get::<_, i64>(0),
                )
                .optional()?;
            if let Some(fence) = fence {
                tx.commit()?;
                return Ok(Ok(fence));
            }
            let held = tx
                .prepare_cached("SELECT lease_holder, lease_expires_at FROM missions WHERE id = ?")?
                .query_row([id], |r| {
                    Ok((
                        r.get::<_, Option<String>>(0)?,
                        r.get::<_, Option<String>>(1)?,
                    ))
                })
                .optional()?;
            Ok(Err(held))
        })?;
        match taken {
            Ok(fence) => Ok(Ok(fence)),
            Err(None) => Err(StoreError::NotFound(Record::Mission, id.to_owned())),
            Err(Some((holder, expires_at))) => Ok(Err(LeaseHeld {
                mission: id.to_owned(),
                holder: holder.unwrap_or_default(),
                expires_at: expires_at.unwrap_or_default(),
            })),
        }
    }

    async fn mission_lease_renew(
        &self,
        id: &str,
        fence: i64,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let until = Utc::now() + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
        let renewed = self.direct().run("renew mission lease", |conn| {
            conn.prepare_cached(
                "UPDATE missions SET lease_expires_at = ? \
                 WHERE id = ? AND lease_fence = ? AND lease_holder IS NOT NULL",
            )?
            .execute(rusqlite::params![
                until.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                id,
                fence
            ])
        })?;
        Ok(renewed == 1)
    }

    async fn mission_lease_release(&self, id: &str, fence: i64) -> Result<(), StoreError> {
        self.direct().run("release mission lease", |conn| {
            conn.prepare_cached(
                "UPDATE missions SET lease_holder = NULL, lease_expires_at = NULL \
                 WHERE id = ? AND lease_fence = ?",
            )?
            .execute(rusqlite::params![id, fence])
        })?;
        Ok(())
    }

    async fn mission_lease_holder(&self, id: &str) -> Result<Option<LeaseHeld>, StoreError> {
        let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let held = self.direct().run("read mission lease", |conn| {
            use rusqlite::OptionalExtension;
            conn.prepare_cached("SELECT lease_holder, lease_expires_at FROM missions WHERE id = ?")?
                .query_row([id], |r| {
                    Ok((
                        r.get::<_, Option<String>>(0)?,
                        r.get::<_, Option<String>>(1)?,
                    ))
                })
                .optional()
        })?;
        match held {
            None => Err(StoreError::NotFound(Record::Mission, id.to_owned())),
            // Times are stored in one RFC 3339 form (UTC, microseconds): they order as text.
            Some((Some(holder), Some(expires_at))) if expires_at >= now => Ok(Some(LeaseHeld {
                mission: id.to_owned(),
                holder,
                expires_at,
            })),
            Some(_) => Ok(None),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn mission_append(
        &self,
        id: &str,
        expected_seq: i64,
        fence: Option<i64>,
        events_json: &[String],
        record_json: &str,
        state: &str,
        facts: &[(&str, &str, String)],
    ) -> Result<Result<i64, Conflict>, StoreError> {
        let count = events_json.len() as i64;
        if count == 0 {
            return Err(StoreError::Invalid(
                "an append needs at least one event".into(),
            ));
        }
        let at = now();
        // A mission's final state is what its runner reports to the user: it survives power
        // loss. Steps before it are repeatable (see the crate's durability note).
        let durable = !matches!(state, "running");
        // In-process: a runner appends at every step (see `sqlite::direct`).
        self.direct()
            .run_durable(durable, "append mission event", |conn| {
                append(
                    conn,
                    id,
                    expected_seq,
                    fence,
                    events_json,
                    record_json,
                    state,
                    facts,
                    &at,
                )
            })
    }

    /// One mission.
    async fn mission_get(&self, id: &str) -> Result<MissionRow, StoreError> {
        // In-process: a runner's first load, and every load after its lease changed hands.
        let found = self.direct().run("read mission", |conn| {
            use rusqlite::OptionalExtension;
            conn.prepare_cached(
                "SELECT id, name, owner, spec_json, record_json, state, seq, created_at, \
                 updated_at FROM missions WHERE id = ?",
            )?
            .query_row([id], |r| {
                Ok((
                    [
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, String>(5)?,
                    ],
                    r.get::<_, i64>(6)?,
                    [r.get::<_, String>(7)?, r.get::<_, String>(8)?],
                ))
            })
            .optional()
        })?;
        let Some(([id, name, owner, spec_json, record_json, state], seq, [created, updated])) =
            found
        else {
            return Err(StoreError::NotFound(Record::Mission, id.to_owned()));
        };
        Ok(MissionRow {
            id,
            name,
            owner,
            spec_json,
            record_json,
            state,
            seq,
            created_at: ts(&created)?,
            updated_at: ts(&updated)?,
        })
    }

    /// This owner's missions, newest first.
    async fn mission_list(&self, owner: &str) -> Result<Vec<MissionRow>, StoreError> {
        sqlx::query("SELECT * FROM missions WHERE owner = ? ORDER BY created_at DESC, id")
            .bind(owner)
            .fetch_all(self.pool())
            .await
            .map_err(q("list missions"))?
            .into_iter()
            .map(row)
            .collect()
    }

    /// The event log of a mission, in order.
    async fn mission_events(
        &self,
        id: &str,
    ) -> Result<Vec<(i64, String, DateTime<Utc>)>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, event_json, at FROM mission_events WHERE mission_id = ? ORDER BY seq",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await
        .map_err(q("read mission events"))?;
        rows.into_iter()
            .map(|r| {
                let at: String = r
                    .try_get("at")
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                Ok((
                    r.try_get("seq")
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                    r.try_get("event_json")
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                    ts(&at)?,
                ))
            })
            .collect()
    }

    /// Every fact of a mission's attempts, in order.
    async fn attempt_fact_add(
        &self,
        mission: &str,
        fence: i64,
        attempt_key: &str,
        kind: &str,
        detail_json: &str,
    ) -> Result<bool, StoreError> {
        let at = now();
        let added = self.direct().run("add an attempt fact", |conn| {
            conn.prepare_cached(
                "INSERT INTO attempt_facts (mission_id, attempt_key, kind, detail_json, at) \
                 SELECT id, ?2, ?3, ?4, ?5 FROM missions \
                 WHERE id = ?1 AND lease_fence = ?6 AND lease_holder IS NOT NULL",
            )?
            .execute(rusqlite::params![
                mission,
                attempt_key,
                kind,
                detail_json,
                at,
                fence
            ])
        })?;
        Ok(added == 1)
    }

    async fn attempt_facts(&self, mission: &str) -> Result<Vec<AttemptFact>, StoreError> {
        let rows = sqlx::query("SELECT attempt_key, kind, detail_json, at FROM attempt_facts WHERE mission_id = ? ORDER BY rowid")
            .bind(mission)
            .fetch_all(self.pool())
            .await
            .map_err(q("read attempt facts"))?;
        rows.into_iter()
            .map(|r| {
                let get = |n: &str| {
                    r.try_get::<String, _>(n)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))
                };
                Ok(AttemptFact {
                    attempt_key: get("attempt_key")?,
                    kind: get("kind")?,
                    detail_json: get("detail_json")?,
                    at: ts(&get("at")?)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
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
}
