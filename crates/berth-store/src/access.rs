//! API access: bearer tokens for `berth serve` (stored as SHA-256 hashes, never the token) and
//! the audit log of mutating requests. The rules (scopes, owner isolation) live in the server;
//! this contract stores and fetches.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::StoreError;

/// A stored token (its hash stays in the store).
#[derive(Debug, Clone, Serialize)]
pub struct ApiToken {
    /// Public id (`tk-…`), what listings and the audit log name.
    pub id: String,
    /// The owner whose sandboxes, missions and ledger the token reaches.
    pub owner: String,
    /// `read`, `exec` or `admin`.
    pub scope: String,
    /// A label for people.
    pub name: String,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// One audited request.
#[derive(Debug, Clone, Serialize)]
pub struct AuditRow {
    /// Order of arrival.
    pub seq: i64,
    /// When it was answered.
    pub at: DateTime<Utc>,
    /// The token that made it.
    pub token_id: String,
    /// Its owner.
    pub owner: String,
    /// HTTP method.
    pub method: String,
    /// The route's template (`/v1/sandboxes/{id}`), never a query or body.
    pub route: String,
    /// The sandbox or mission acted on, when there is one.
    pub target: Option<String>,
    /// HTTP status.
    pub status: i64,
    /// The result's kind: `ok` or an error kind.
    pub outcome: String,
}

/// A request to audit.
#[derive(Debug, Clone)]
pub struct NewAudit {
    /// The token that made it.
    pub token_id: String,
    /// Its owner.
    pub owner: String,
    /// HTTP method.
    pub method: String,
    /// The route's template.
    pub route: String,
    /// The sandbox or mission acted on.
    pub target: Option<String>,
    /// HTTP status.
    pub status: u16,
    /// `ok` or an error kind.
    pub outcome: String,
}

/// The access store contract.
#[async_trait]
pub trait AccessStore: Send + Sync {
    /// Records a token by its hash.
    async fn token_create(
        &self,
        id: &str,
        token_hash: &str,
        owner: &str,
        scope: &str,
        name: &str,
    ) -> Result<ApiToken, StoreError>;
    /// The unrevoked token with this hash.
    async fn token_by_hash(&self, token_hash: &str) -> Result<Option<ApiToken>, StoreError>;
    /// Revokes a token; `false` when no unrevoked token has this id.
    async fn token_revoke(&self, id: &str) -> Result<bool, StoreError>;
    /// Every token (revoked ones too), newest first.
    async fn token_list(&self) -> Result<Vec<ApiToken>, StoreError>;
    /// Appends to the audit log.
    async fn audit_append(&self, row: &NewAudit) -> Result<(), StoreError>;
    /// The audit log of `owner` (every owner when `None`), oldest first.
    async fn audit_list(&self, owner: Option<&str>) -> Result<Vec<AuditRow>, StoreError>;
}
