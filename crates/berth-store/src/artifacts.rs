//! Artifact publication claims and the artifact index. The store keeps them; the protocol
//! (what may follow what, what an object must hash to) lives in `berth-artifacts`.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::StoreError;

/// Where a publication stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PublicationState {
    /// Claimed; objects may or may not be written yet.
    Pending,
    /// Every object is present and verified.
    Uploaded,
    /// The index rows are written: the bundle counts.
    Indexed,
    /// Given up after its retry window.
    Expired,
}

impl PublicationState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            PublicationState::Pending => "pending",
            PublicationState::Uploaded => "uploaded",
            PublicationState::Indexed => "indexed",
            PublicationState::Expired => "expired",
        }
    }

    /// From the stored name.
    pub fn parse(text: &str) -> Option<PublicationState> {
        [
            PublicationState::Pending,
            PublicationState::Uploaded,
            PublicationState::Indexed,
            PublicationState::Expired,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// A publication to claim.
#[derive(Debug, Clone)]
pub struct NewPublication {
    /// Deterministic bundle id.
    pub bundle_id: String,
    /// The manifest's schema version.
    pub schema_version: u32,
    /// Mission.
    pub mission_id: String,
    /// Task.
    pub task_id: String,
    /// Attempt key.
    pub attempt_key: String,
    /// Whether the attempt was accepted.
    pub accepted: bool,
    /// The manifest (a document `berth-artifacts` reads; opaque here).
    pub manifest_json: String,
}

/// A claimed publication.
#[derive(Debug, Clone, Serialize)]
pub struct PublicationRow {
    /// Bundle id.
    pub bundle_id: String,
    /// The manifest's schema version.
    pub schema_version: u32,
    /// Mission.
    pub mission_id: String,
    /// Task.
    pub task_id: String,
    /// Attempt key.
    pub attempt_key: String,
    /// Whether the attempt was accepted.
    pub accepted: bool,
    /// State.
    pub state: PublicationState,
    /// The manifest.
    pub manifest_json: String,
    /// The last failure, if any.
    pub last_error: Option<String>,
    /// Claimed.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// One indexed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArtifactRow {
    /// Its bundle.
    pub bundle_id: String,
    /// Its path in the bundle.
    pub path: String,
    /// Mission.
    pub mission_id: String,
    /// Task.
    pub task_id: String,
    /// Attempt key.
    pub attempt_key: String,
    /// Whether the attempt was accepted.
    pub accepted: bool,
    /// MIME type.
    pub mime: String,
    /// Size in bytes.
    pub size: u64,
    /// BLAKE3, hex.
    pub blake3: String,
    /// SHA-256, hex.
    pub sha256: String,
    /// Where the object is in the object store.
    pub object_key: String,
}

/// Which index rows to return (every field that is set must match).
#[derive(Debug, Clone, Default)]
pub struct ArtifactQuery {
    /// Mission.
    pub mission_id: Option<String>,
    /// Task.
    pub task_id: Option<String>,
    /// Attempt key.
    pub attempt_key: Option<String>,
    /// Bundle.
    pub bundle_id: Option<String>,
    /// Accepted attempts only (`Some(true)`) or rejected only (`Some(false)`).
    pub accepted: Option<bool>,
    /// MIME type.
    pub mime: Option<String>,
    /// Path in the bundle.
    pub path: Option<String>,
}

/// What artifact publication needs from durable storage. The SQLite [`crate::Store`]
/// implements it (in `sqlite/`); a PostgreSQL backend implements the same contract:
///
/// - `publication_claim` is committed (durable across a crash of the process) when it
///   returns, and idempotent: claiming an existing bundle id returns the existing row
///   unchanged. Not fsync'd like a sandbox intent: a claim a power loss took leaves objects no
///   claim names, which reconcile reports and nothing bills for;
/// - `publication_advance` moves a claim only from the state it names (compare-and-set);
/// - `publication_index` writes every row and moves the claim `uploaded → indexed` in one
///   transaction, or changes nothing;
/// - reads see every committed write.
#[async_trait::async_trait]
pub trait ArtifactStore: Send + Sync + std::fmt::Debug {
    /// Claims a publication (see the contract).
    async fn publication_claim(&self, new: &NewPublication) -> Result<PublicationRow, StoreError>;
    /// Moves a claim from `from` to `to`, recording `error`; false when it was not in `from`.
    async fn publication_advance(
        &self,
        bundle_id: &str,
        from: PublicationState,
        to: PublicationState,
        error: Option<&str>,
    ) -> Result<bool, StoreError>;
    /// Writes the index rows and marks the claim indexed (see the contract); false when the
    /// claim was not `uploaded`.
    async fn publication_index(
        &self,
        bundle_id: &str,
        rows: &[ArtifactRow],
    ) -> Result<bool, StoreError>;
    /// One claim.
    async fn publication_get(&self, bundle_id: &str) -> Result<PublicationRow, StoreError>;
    /// Claims in `state` (all states when `None`), oldest first.
    async fn publications(
        &self,
        state: Option<PublicationState>,
    ) -> Result<Vec<PublicationRow>, StoreError>;
    /// Index rows matching `query`, ordered by mission, task, attempt, path.
    async fn artifacts(&self, query: &ArtifactQuery) -> Result<Vec<ArtifactRow>, StoreError>;
}
