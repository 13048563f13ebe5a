//! Mission rows. The store keeps the authority's record and its event log in one transaction;
//! the rules live in `berth-mission`.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::StoreError;

/// A stored mission.
#[derive(Debug, Clone, Serialize)]
pub struct MissionRow {
    /// Mission id.
    pub id: String,
    /// Mission name.
    pub name: String,
    /// Owner.
    pub owner: String,
    /// The mission's spec (JSON), as the service wrote it.
    pub spec_json: String,
    /// The authority's record (JSON).
    pub record_json: String,
    /// `running`, `succeeded` or `failed`.
    pub state: String,
    /// Events applied so far.
    pub seq: i64,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A durable fact about an attempt.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptFact {
    /// Attempt key.
    pub attempt_key: String,
    /// What kind of fact (`agent`, `validator`, `sandbox`, …).
    pub kind: String,
    /// Details (JSON).
    pub detail_json: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// The record changed underneath (another process applied an event first).
#[derive(Debug, thiserror::Error)]
#[error("mission `{mission}` moved on (expected event {expected}); reload and retry")]
pub struct Conflict {
    /// Mission.
    pub mission: String,
    /// The sequence number the writer expected.
    pub expected: i64,
}

/// A mission's lease is held by another runner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mission `{mission}` is being run by {holder} (lease until {expires_at})")]
pub struct LeaseHeld {
    /// Mission.
    pub mission: String,
    /// Who holds it.
    pub holder: String,
    /// When the lease lapses unless renewed.
    pub expires_at: String,
}

/// What the mission service needs from durable storage. The SQLite [`crate::Store`] implements it
/// (in `sqlite/`); a
/// PostgreSQL backend implements the same contract:
///
/// - `mission_append` is atomic: the events (one or more, numbered in order), the new record
///   and the facts land together or not at all, and only if the mission is still at `expected_seq` (a stale writer gets
///   [`Conflict`] and changes nothing);
/// - a committed append survives a crash of the process; after a crash of the machine, the
///   log may have lost a suffix of `running` appends (never a registration or a final state),
///   which is the state of an earlier process crash — steps are repeatable;
/// - reads see every committed append.
#[async_trait::async_trait]
pub trait MissionStore: Send + Sync + std::fmt::Debug {
    /// Records a new mission at sequence 0.
    async fn mission_insert(
        &self,
        id: &str,
        name: &str,
        owner: &str,
        spec_json: &str,
        record_json: &str,
        state: &str,
    ) -> Result<(), StoreError>;
    /// Takes the mission's lease for `holder` until `now + ttl` when it is free, lapsed, or
    /// held by `steal_from` (a holder the caller proved dead). Returns the new fencing token.
    async fn mission_lease_acquire(
        &self,
        id: &str,
        holder: &str,
        ttl: std::time::Duration,
        steal_from: Option<&str>,
    ) -> Result<Result<i64, LeaseHeld>, StoreError>;
    /// Extends a lease still held with `fence`; false when it was lost.
    async fn mission_lease_renew(
        &self,
        id: &str,
        fence: i64,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError>;
    /// Gives the lease up (no-op when `fence` no longer holds it).
    async fn mission_lease_release(&self, id: &str, fence: i64) -> Result<(), StoreError>;
    /// Who holds the mission's lease now, if anyone does and it has not lapsed (`NotFound`
    /// for an unknown mission).
    async fn mission_lease_holder(&self, id: &str) -> Result<Option<LeaseHeld>, StoreError>;
    /// Appends events with the record they produced and their facts (see the trait contract),
    /// returning the last event's sequence number. With a fence, the append succeeds only while
    /// that fence still holds the lease.
    #[allow(clippy::too_many_arguments)] // one atomic write: its inputs travel together
    async fn mission_append(
        &self,
        id: &str,
        expected_seq: i64,
        fence: Option<i64>,
        events_json: &[String],
        record_json: &str,
        state: &str,
        facts: &[(&str, &str, String)],
    ) -> Result<Result<i64, Conflict>, StoreError>;
    /// One mission.
    async fn mission_get(&self, id: &str) -> Result<MissionRow, StoreError>;
    /// An owner's missions, newest first.
    async fn mission_list(&self, owner: &str) -> Result<Vec<MissionRow>, StoreError>;
    /// A mission's event log, in order.
    async fn mission_events(
        &self,
        id: &str,
    ) -> Result<Vec<(i64, String, DateTime<Utc>)>, StoreError>;
    /// A mission's attempt facts, in order.
    async fn attempt_facts(&self, mission: &str) -> Result<Vec<AttemptFact>, StoreError>;
    /// Records a fact about an attempt without an event (what a run met that is no verdict: why
    /// it stopped), only while `fence` holds the mission's lease; false when it no longer does.
    async fn attempt_fact_add(
        &self,
        mission: &str,
        fence: i64,
        attempt_key: &str,
        kind: &str,
        detail_json: &str,
    ) -> Result<bool, StoreError>;
}
