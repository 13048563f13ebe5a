//! SQLite implementation of [`AccessStore`].

use async_trait::async_trait;
use sqlx::Row;

use super::{now, q, ts};
use crate::access::{AccessStore, ApiToken, AuditRow, NewAudit};
use crate::{Store, StoreError};

fn token(row: &sqlx::sqlite::SqliteRow) -> Result<ApiToken, StoreError> {
    let revoked: Option<String> = row.get("revoked_at");
    Ok(ApiToken {
        id: row.get("id"),
        owner: row.get("owner"),
        scope: row.get("scope"),
        name: row.get("name"),
        created_at: ts(&row.get::<String, _>("created_at"))?,
        revoked_at: revoked.as_deref().map(ts).transpose()?,
    })
}

#[async_trait]
impl AccessStore for Store {
    async fn token_create(
        &self,
        id: &str,
        token_hash: &str,
        owner: &str,
        scope: &str,
        name: &str,
    ) -> Result<ApiToken, StoreError> {
        sqlx::query(
            "INSERT INTO api_tokens (id, token_hash, owner, scope, name, created_at) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(token_hash)
        .bind(owner)
        .bind(scope)
        .bind(name)
        .bind(now())
        // A credential must survive power loss once it has been handed out.
        .execute(self.durable())
        .await
        .map_err(q("create token"))?;
        let row = sqlx::query("SELECT * FROM api_tokens WHERE id = ?")
            .bind(id)
            .fetch_one(self.pool())
            .await
            .map_err(q("read token"))?;
        token(&row)
    }

    async fn token_by_hash(&self, token_hash: &str) -> Result<Option<ApiToken>, StoreError> {
        let row =
            sqlx::query("SELECT * FROM api_tokens WHERE token_hash = ? AND revoked_at IS NULL")
                .bind(token_hash)
                .fetch_optional(self.pool())
                .await
                .map_err(q("find token"))?;
        row.as_ref().map(token).transpose()
    }

    async fn token_revoke(&self, id: &str) -> Result<bool, StoreError> {
        let done =
            sqlx::query("UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL")
                .bind(now())
                .bind(id)
                // A revocation must not be undone by a power loss.
                .execute(self.durable())
                .await
                .map_err(q("revoke token"))?;
        Ok(done.rows_affected() == 1)
    }

    async fn token_list(&self) -> Result<Vec<ApiToken>, StoreError> {
        let rows = sqlx::query("SELECT * FROM api_tokens ORDER BY created_at DESC, id")
            .fetch_all(self.pool())
            .await
            .map_err(q("list tokens"))?;
        rows.iter().map(token).collect()
    }

    async fn audit_append(&self, row: &NewAudit) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO audit_log (at, token_id, owner, method, route, target, status, outcome) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(now())
        .bind(&row.token_id)
        .bind(&row.owner)
        .bind(&row.method)
        .bind(&row.route)
        .bind(&row.target)
        .bind(i64::from(row.status))
        .bind(&row.outcome)
        .execute(self.pool())
        .await
        .map_err(q("append to the audit log"))?;
        Ok(())
    }

    async fn audit_list(&self, owner: Option<&str>) -> Result<Vec<AuditRow>, StoreError> {
        let rows =
            sqlx::query("SELECT * FROM audit_log WHERE (?1 IS NULL OR owner = ?1) ORDER BY seq")
                .bind(owner)
                .fetch_all(self.pool())
                .await
                .map_err(q("read the audit log"))?;
        rows.iter()
            .map(|row| {
                Ok(AuditRow {
                    seq: row.get("seq"),
                    at: ts(&row.get::<String, _>("at"))?,
                    token_id: row.get("token_id"),
                    owner: row.get("owner"),
                    method: row.get("method"),
                    route: row.get("route"),
                    target: row.get("target"),
                    status: row.get("status"),
                    outcome: row.get("outcome"),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tokens_are_found_by_hash_until_revoked_and_the_audit_log_filters_by_owner() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).await.unwrap();
        let made = store
            .token_create("tk-1", "hash-1", "alice", "read", "ci")
            .await
            .unwrap();
        assert_eq!(made.owner, "alice");
        assert!(store.token_by_hash("hash-1").await.unwrap().is_some());
        assert!(store.token_by_hash("hash-2").await.unwrap().is_none());
        assert!(store.token_revoke("tk-1").await.unwrap());
        assert!(!store.token_revoke("tk-1").await.unwrap(), "revoked twice");
        assert!(store.token_by_hash("hash-1").await.unwrap().is_none());
        assert!(store.token_list().await.unwrap()[0].revoked_at.is_some());
        for owner in ["alice", "bob"] {
            store
                .audit_append(&NewAudit {
                    token_id: "tk-1".into(),
                    owner: owner.into(),
                    method: "POST".into(),
                    route: "/v1/sandboxes".into(),
                    target: None,
                    status: 200,
                    outcome: "ok".into(),
                })
                .await
                .unwrap();
        }
        assert_eq!(store.audit_list(Some("bob")).await.unwrap().len(), 1);
        assert_eq!(store.audit_list(None).await.unwrap().len(), 2);
    }
}
