//! The SQLite artifact store: [`ArtifactStore`] for [`Store`].

use sqlx::Row;

use super::{now, q, ts};
use crate::artifacts::{
    ArtifactQuery, ArtifactRow, ArtifactStore, NewPublication, PublicationRow, PublicationState,
};
use crate::{Record, Store, StoreError};

fn corrupt(field: &str) -> impl Fn(sqlx::Error) -> StoreError + '_ {
    move |e| StoreError::Corrupt(format!("{field}: {e}"))
}

fn publication(r: sqlx::sqlite::SqliteRow) -> Result<PublicationRow, StoreError> {
    let text = |n: &str| r.try_get::<String, _>(n).map_err(corrupt(n));
    let state = text("state")?;
    Ok(PublicationRow {
        bundle_id: text("bundle_id")?,
        schema_version: r
            .try_get::<i64, _>("schema_version")
            .map_err(corrupt("schema_version"))? as u32,
        mission_id: text("mission_id")?,
        task_id: text("task_id")?,
        attempt_key: text("attempt_key")?,
        accepted: r
            .try_get::<i64, _>("accepted")
            .map_err(corrupt("accepted"))?
            != 0,
        state: PublicationState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("publication state `{state}`")))?,
        manifest_json: text("manifest_json")?,
        last_error: r
            .try_get::<Option<String>, _>("last_error")
            .map_err(corrupt("last_error"))?,
        created_at: ts(&text("created_at")?)?,
        updated_at: ts(&text("updated_at")?)?,
    })
}

fn artifact(r: sqlx::sqlite::SqliteRow) -> Result<ArtifactRow, StoreError> {
    let text = |n: &str| r.try_get::<String, _>(n).map_err(corrupt(n));
    Ok(ArtifactRow {
        bundle_id: text("bundle_id")?,
        path: text("path")?,
        mission_id: text("mission_id")?,
        task_id: text("task_id")?,
        attempt_key: text("attempt_key")?,
        accepted: r
            .try_get::<i64, _>("accepted")
            .map_err(corrupt("accepted"))?
            != 0,
        mime: text("mime")?,
        size: r.try_get::<i64, _>("size").map_err(corrupt("size"))? as u64,
        blake3: text("blake3")?,
        sha256: text("sha256")?,
        object_key: text("object_key")?,
    })
}

#[async_trait::async_trait]
impl ArtifactStore for Store {
    async fn publication_claim(&self, new: &NewPublication) -> Result<PublicationRow, StoreError> {
        let at = now();
        // In-process, like the other statements of a mission's step (see `sqlite::direct`).
        self.direct().run("claim publication", |conn| {
            conn.prepare_cached(
                "INSERT INTO publications (bundle_id, schema_version, mission_id, task_id, \
                 attempt_key, accepted, state, manifest_json, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?) ON CONFLICT (bundle_id) DO NOTHING",
            )?
            .execute(rusqlite::params![
                new.bundle_id,
                i64::from(new.schema_version),
                new.mission_id,
                new.task_id,
                new.attempt_key,
                i64::from(new.accepted),
                new.manifest_json,
                at,
                at,
            ])
        })?;
        self.publication_get(&new.bundle_id).await
    }

    async fn publication_advance(
        &self,
        bundle_id: &str,
        from: PublicationState,
        to: PublicationState,
        error: Option<&str>,
    ) -> Result<bool, StoreError> {
        let changed = self.direct().run("advance publication", |conn| {
            conn.prepare_cached(
                "UPDATE publications SET state = ?, last_error = ?, updated_at = ? \
                 WHERE bundle_id = ? AND state = ?",
            )?
            .execute(rusqlite::params![
                to.as_str(),
                error,
                now(),
                bundle_id,
                from.as_str()
            ])
        })?;
        Ok(changed == 1)
    }

    async fn publication_index(
        &self,
        bundle_id: &str,
        rows: &[ArtifactRow],
    ) -> Result<bool, StoreError> {
        if let Some(row) = rows.iter().find(|r| r.bundle_id != bundle_id) {
            return Err(StoreError::Invalid(format!(
                "index row for bundle `{}` under `{bundle_id}`",
                row.bundle_id
            )));
        }
        let at = now();
        // In-process (see `sqlite::direct`): one statement per row costs microseconds here.
        self.direct().run("write index rows", |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let moved = tx
                .prepare_cached(
                    "UPDATE publications SET state = 'indexed', last_error = NULL, updated_at = ? \
                     WHERE bundle_id = ? AND state = 'uploaded'",
                )?
                .execute(rusqlite::params![at, bundle_id])?;
            if moved != 1 {
                // Dropped: rolled back.
                return Ok(false);
            }
            {
                let mut insert = tx.prepare_cached(
                    "INSERT INTO artifacts (bundle_id, path, mission_id, task_id, attempt_key, \
                     accepted, mime, size, blake3, sha256, object_key, indexed_at) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                     ON CONFLICT (bundle_id, path) DO NOTHING",
                )?;
                for row in rows {
                    insert.execute(rusqlite::params![
                        row.bundle_id,
                        row.path,
                        row.mission_id,
                        row.task_id,
                        row.attempt_key,
                        i64::from(row.accepted),
                        row.mime,
                        row.size as i64,
                        row.blake3,
                        row.sha256,
                        row.object_key,
                        at,
                    ])?;
                }
            }
            tx.commit()?;
            Ok(true)
        })
    }

    async fn publication_get(&self, bundle_id: &str) -> Result<PublicationRow, StoreError> {
        // In-process: a claim and a publication's last step read it back.
        let found = self.direct().run("read publication", |conn| {
            use rusqlite::OptionalExtension;
            conn.prepare_cached(
                "SELECT bundle_id, schema_version, mission_id, task_id, attempt_key, accepted, \
                 state, manifest_json, last_error, created_at, updated_at \
                 FROM publications WHERE bundle_id = ?",
            )?
            .query_row([bundle_id], |r| {
                Ok((
                    (
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, i64>(5)?,
                    ),
                    (
                        r.get::<_, String>(6)?,
                        r.get::<_, String>(7)?,
                        r.get::<_, Option<String>>(8)?,
                        r.get::<_, String>(9)?,
                        r.get::<_, String>(10)?,
                    ),
                ))
            })
            .optional()
        })?;
        let Some((
            (bundle_id, schema_version, mission_id, task_id, attempt_key, accepted),
            (state, manifest_json, last_error, created_at, updated_at),
        )) = found
        else {
            return Err(StoreError::NotFound(Record::Bundle, bundle_id.to_owned()));
        };
        Ok(PublicationRow {
            bundle_id,
            schema_version: u32::try_from(schema_version)
                .map_err(|_| StoreError::Corrupt(format!("schema_version {schema_version}")))?,
            mission_id,
            task_id,
            attempt_key,
            accepted: accepted != 0,
            state: PublicationState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("publication state `{state}`")))?,
            manifest_json,
            last_error,
            created_at: ts(&created_at)?,
            updated_at: ts(&updated_at)?,
        })
    }

    async fn publications(
        &self,
        state: Option<PublicationState>,
    ) -> Result<Vec<PublicationRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM publications WHERE (?1 IS NULL OR state = ?1) \
             ORDER BY created_at, bundle_id",
        )
        .bind(state.map(PublicationState::as_str))
        .fetch_all(self.pool())
        .await
        .map_err(q("list publications"))?;
        rows.into_iter().map(publication).collect()
    }

    async fn artifacts(&self, query: &ArtifactQuery) -> Result<Vec<ArtifactRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM artifacts WHERE (?1 IS NULL OR mission_id = ?1) \
             AND (?2 IS NULL OR task_id = ?2) AND (?3 IS NULL OR attempt_key = ?3) \
             AND (?4 IS NULL OR bundle_id = ?4) AND (?5 IS NULL OR accepted = ?5) \
             AND (?6 IS NULL OR mime = ?6) AND (?7 IS NULL OR path = ?7) \
             ORDER BY mission_id, task_id, attempt_key, path",
        )
        .bind(&query.mission_id)
        .bind(&query.task_id)
        .bind(&query.attempt_key)
        .bind(&query.bundle_id)
        .bind(query.accepted.map(i64::from))
        .bind(&query.mime)
        .bind(&query.path)
        .fetch_all(self.pool())
        .await
        .map_err(q("query artifacts"))?;
        rows.into_iter().map(artifact).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("b.db")).await.unwrap();
        (dir, store)
    }

    fn claim(id: &str) -> NewPublication {
        NewPublication {
            bundle_id: id.into(),
            schema_version: 1,
            mission_id: "m".into(),
            task_id: "t".into(),
            attempt_key: "at-1".into(),
            accepted: true,
            manifest_json: "{}".into(),
        }
    }

    fn row(id: &str, path: &str, mime: &str) -> ArtifactRow {
        ArtifactRow {
            bundle_id: id.into(),
            path: path.into(),
            mission_id: "m".into(),
            task_id: "t".into(),
            attempt_key: "at-1".into(),
            accepted: true,
            mime: mime.into(),
            size: 3,
            blake3: "b".into(),
            sha256: "s".into(),
            object_key: format!("cas/{path}"),
        }
    }

    #[tokio::test]
    async fn claims_are_idempotent_and_move_only_forward_from_the_named_state() {
        let (_dir, store) = store().await;
        let first = store.publication_claim(&claim("b1")).await.unwrap();
        assert_eq!(first.state, PublicationState::Pending);
        let mut again = claim("b1");
        again.manifest_json = "{\"changed\":true}".into();
        let second = store.publication_claim(&again).await.unwrap();
        assert_eq!(
            second.manifest_json, "{}",
            "an existing claim is returned unchanged"
        );
        // Indexing before upload changes nothing.
        assert!(!store
            .publication_index("b1", &[row("b1", "patch.diff", "text/x-diff")])
            .await
            .unwrap());
        assert!(store
            .artifacts(&ArtifactQuery::default())
            .await
            .unwrap()
            .is_empty());
        use PublicationState::*;
        assert!(!store
            .publication_advance("b1", Uploaded, Indexed, None)
            .await
            .unwrap());
        assert!(store
            .publication_advance("b1", Pending, Uploaded, None)
            .await
            .unwrap());
        let rows = [
            row("b1", "patch.diff", "text/x-diff"),
            row("b1", "manifest.json", "application/json"),
        ];
        assert!(store.publication_index("b1", &rows).await.unwrap());
        assert!(!store.publication_index("b1", &rows).await.unwrap());
        assert_eq!(
            store.publication_get("b1").await.unwrap().state,
            PublicationState::Indexed
        );
        let diffs = store
            .artifacts(&ArtifactQuery {
                mission_id: Some("m".into()),
                accepted: Some(true),
                mime: Some("text/x-diff".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(diffs, vec![rows[0].clone()]);
        assert!(store
            .artifacts(&ArtifactQuery {
                accepted: Some(false),
                ..Default::default()
            })
            .await
            .unwrap()
            .is_empty());
        assert_eq!(store.publications(Some(Indexed)).await.unwrap().len(), 1);
        assert!(store.publications(Some(Pending)).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_large_bundle_is_indexed_whole_or_not_at_all() {
        let (_dir, store) = store().await;
        use PublicationState::*;
        store.publication_claim(&claim("big")).await.unwrap();
        store
            .publication_advance("big", Pending, Uploaded, None)
            .await
            .unwrap();
        // Many rows, and one row of another bundle: nothing written.
        let mut rows: Vec<ArtifactRow> = (0..515)
            .map(|n| row("big", &format!("f/{n:05}"), "text/plain"))
            .collect();
        rows.push(row("other", "x", "text/plain"));
        assert!(store.publication_index("big", &rows).await.is_err());
        assert!(store
            .artifacts(&ArtifactQuery::default())
            .await
            .unwrap()
            .is_empty());
        assert_eq!(store.publication_get("big").await.unwrap().state, Uploaded);
        rows.pop();
        assert!(store.publication_index("big", &rows).await.unwrap());
        let mut read = store.artifacts(&ArtifactQuery::default()).await.unwrap();
        read.sort_by(|a, b| a.path.cmp(&b.path));
        assert_eq!(read, rows);
    }
}
