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
mod tests;
