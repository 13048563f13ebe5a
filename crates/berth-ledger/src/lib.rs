//! The cleanup ledger: every resource Berth creates, from intent to verified-gone.
//!
//! Invariants:
//! - **Intent before side effect.** The ledger row (state `intent`, with the labels the
//!   resource will carry) is durable before the provider is asked to create, so a crash at any
//!   point leaves a row a sweep can act on.
//! - **Must fire.** A create that fails is followed by a destroy of the same name; a command
//!   that errors, panics or is signalled destroys what its run created ([`Ledger::cleanup_run`]);
//!   a killed command leaves rows that [`Ledger::sweep`] destroys and verifies.
//! - **Must not fire.** Berth destroys a resource only when its ledger row belongs to this owner
//!   *and* the provider reports labels carrying this owner and the row's ledger token. Anything
//!   else is skipped and reported as foreign.
//! - **Gone means observed gone.** A row becomes `verified_gone` only when the provider's
//!   destroy verified it or observe says absent. `Accepted` keeps the row open.

use berth_store::LedgerStore as _;
use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use berth_contract::labels::{LEDGER_TOKEN, OWNER, SANDBOX};
use berth_contract::{
    CreateRequest, Created, DestroyOutcome, LabelFilter, Labels, NativeId, Observation, Provider,
    ProviderError, ProviderExt, ProviderLookup, SandboxName, SnapshotRef,
};
use berth_store::{
    LedgerQuery, LedgerRow, LedgerState, NewLedgerRow, ResourceKind, Store, StoreError,
};
use chrono::{DateTime, Utc};
use serde::Serialize;

/// A ledger operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The provider call failed.
    #[error("sandbox `{berth_id}`")]
    Provider {
        /// Berth's id.
        berth_id: String,
        /// The provider's error.
        #[source]
        source: ProviderError,
    },
    /// The resource is not provably this owner's; Berth will not touch it.
    #[error("refusing to touch sandbox `{berth_id}`: {reason}")]
    Foreign {
        /// Berth's id.
        berth_id: String,
        /// Why ownership is not proven.
        reason: String,
    },
}

/// A sandbox created under the ledger.
#[derive(Debug, Clone, Serialize)]
pub struct Tracked {
    /// Berth's id.
    pub berth_id: String,
    /// Provider id.
    pub provider: String,
    /// What create returned.
    pub native_id: String,
    /// Raw state right after create.
    pub raw_state: String,
}

/// What a sweep did to one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum SweepAction {
    /// Destroyed and verified gone.
    Destroyed,
    /// Already absent; row closed.
    AlreadyGone,
    /// Destroy accepted, not verified; the row stays open.
    Accepted {
        /// Raw state last seen.
        raw_state: String,
    },
    /// Destroy failed; the row stays open.
    Failed {
        /// Error kind.
        kind: String,
        /// Error message.
        message: String,
    },
    /// Not provably ours: untouched.
    SkippedForeign {
        /// Why.
        reason: String,
    },
    /// Ours, and still held (by a running mission, or a snapshot's retention): kept.
    Held {
        /// By what.
        reason: String,
    },
}

/// One line of a sweep report.
#[derive(Debug, Clone, Serialize)]
pub struct SweepEntry {
    /// Berth's id.
    pub berth_id: String,
    /// Provider id.
    pub provider: String,
    /// What happened.
    #[serde(flatten)]
    pub action: SweepAction,
}

/// Which rows a sweep considers.
#[derive(Debug, Clone, Default)]
pub struct SweepScope {
    /// Only this run's rows.
    pub run_id: Option<String>,
    /// Only rows whose expiry has passed.
    pub expired_only: bool,
    /// Also list these providers by owner label to find resources the ledger lost.
    pub discover: Vec<String>,
}

/// The outcome of a sweep.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SweepReport {
    /// Per resource.
    pub entries: Vec<SweepEntry>,
}

impl SweepReport {
    /// Whether every considered resource is now verified gone (foreign ones are not ours and
    /// do not count).
    pub fn complete(&self) -> bool {
        self.entries.iter().all(|e| {
            matches!(
                e.action,
                SweepAction::Destroyed
                    | SweepAction::AlreadyGone
                    | SweepAction::SkippedForeign { .. }
                    | SweepAction::Held { .. }
            )
        })
    }
}

/// The ledger, bound to one owner and one run.
#[derive(Debug, Clone)]
pub struct Ledger {
    store: Store,
    owner: String,
    run_id: String,
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("the OS random source works");
    hex::encode(buf)
}

/// A fresh run id.
pub fn new_run_id() -> String {
    format!("run-{}", random_hex(6))
}

/// A fresh sandbox name.
pub fn new_sandbox_name() -> SandboxName {
    SandboxName(format!("bx-{}", random_hex(6)))
}

impl Ledger {
    /// A ledger for `owner`, recording under `run_id`.
    pub fn new(store: Store, owner: impl Into<String>, run_id: impl Into<String>) -> Self {
        Ledger {
            store,
            owner: owner.into(),
            run_id: run_id.into(),
        }
    }

    /// The owner.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Creates a sandbox under the ledger: records intent, calls `make` with the labelled
    /// request, records the result. On failure the same name is destroyed (best effort) before
    /// the error is returned, and the row says what happened.
    pub async fn create_tracked<F, Fut>(
        &self,
        provider: &dyn Provider,
        origin: &str,
        ttl: Option<Duration>,
        prepare: impl FnOnce(&mut CreateRequest),
        make: F,
    ) -> Result<Tracked, LedgerError>
    where
        F: FnOnce(CreateRequest) -> Fut,
        Fut: Future<Output = Result<Created, ProviderError>>,
    {
        self.create_tracked_as(new_sandbox_name(), provider, origin, ttl, prepare, make)
            .await
    }

    /// [`Ledger::create_tracked`] with a chosen name (e.g. derived from a mission attempt key, so
    /// recovery can find and adopt the sandbox). A name already in the ledger is a store error.
    pub async fn create_tracked_as<F, Fut>(
        &self,
        name: SandboxName,
        provider: &dyn Provider,
        origin: &str,
        ttl: Option<Duration>,
        prepare: impl FnOnce(&mut CreateRequest),
        make: F,
    ) -> Result<Tracked, LedgerError>
    where
        F: FnOnce(CreateRequest) -> Fut,
        Fut: Future<Output = Result<Created, ProviderError>>,
    {
        let expires_at = ttl.map(|ttl| Utc::now() + ttl);
        let labels = Labels {
            owner: self.owner.clone(),
            run_id: self.run_id.clone(),
            ledger_token: random_hex(8),
            expires_at_unix: expires_at.map(|t| t.timestamp()),
        };
        let mut req = CreateRequest::new(name.clone(), labels.clone());
        prepare(&mut req);
        self.store
            .ledger_insert_intent(&NewLedgerRow {
                berth_id: name.0.clone(),
                provider: provider.id().to_owned(),
                owner: labels.owner.clone(),
                run_id: labels.run_id.clone(),
                ledger_token: labels.ledger_token.clone(),
                labels: labels.to_map(&name.0),
                origin: origin.to_owned(),
                kind: Default::default(),
                expires_at,
            })
            .await?;
        match make(req).await {
            Ok(created) => {
                self.store
                    .ledger_mark_created(&name.0, &created.native_id.0)
                    .await?;
                Ok(Tracked {
                    berth_id: name.0,
                    provider: provider.id().to_owned(),
                    native_id: created.native_id.0,
                    raw_state: created.raw_state,
                })
            }
            Err(source) => {
                self.store
                    .ledger_mark_create_failed(&name.0, source.kind().as_str(), &source.to_string())
                    .await?;
                // Must fire: whatever a failed create left behind under this name goes now.
                let row = self.store.ledger_get(&name.0).await?;
                let _ = self.destroy_row(provider, &row).await;
                Err(LedgerError::Provider {
                    berth_id: name.0,
                    source,
                })
            }
        }
    }

    /// This owner's rows, oldest first: all runs or one, open ones or also verified-gone ones.
    pub async fn owned_rows(
        &self,
        run_id: Option<&str>,
        include_gone: bool,
    ) -> Result<Vec<LedgerRow>, LedgerError> {
        Ok(self
            .store
            .ledger_list(&LedgerQuery {
                owner: Some(self.owner.clone()),
                run_id: run_id.map(str::to_owned),
                include_gone,
            })
            .await?)
    }

    /// The row for `berth_id`, which must belong to this owner.
    pub async fn row(&self, berth_id: &str) -> Result<LedgerRow, LedgerError> {
        let row = self.store.ledger_get(berth_id).await?;
        if row.owner != self.owner {
            return Err(LedgerError::Foreign {
                berth_id: berth_id.to_owned(),
                reason: format!("its ledger entry belongs to owner `{}`", row.owner),
            });
        }
        Ok(row)
    }

    /// Destroys the sandbox of a ledger row after proving ownership, and records the outcome.
    pub async fn destroy_row(
        &self,
        provider: &dyn Provider,
        row: &LedgerRow,
    ) -> Result<DestroyOutcome, LedgerError> {
        let provider_err = provider_error(&row.berth_id);
        if row.kind == ResourceKind::Snapshot {
            return self.delete_snapshot_row(provider, row).await;
        }
        let id = native_id(row);
        let observation = provider.observe(&id).await.map_err(provider_err)?;
        if observation.is_gone() {
            self.store
                .ledger_mark_destroy_result(&row.berth_id, LedgerState::VerifiedGone, None)
                .await?;
            return Ok(DestroyOutcome::VerifiedGone {
                already_absent: true,
            });
        }
        if let Some(reason) = foreign_reason(row, &observation, &self.owner) {
            return Err(LedgerError::Foreign {
                berth_id: row.berth_id.clone(),
                reason,
            });
        }
        self.store
            .ledger_mark_destroy_requested(&row.berth_id)
            .await?;
        match provider.destroy(&id).await {
            Ok(outcome) => {
                let state = match outcome {
                    DestroyOutcome::VerifiedGone { .. } => LedgerState::VerifiedGone,
                    DestroyOutcome::Accepted { .. } => LedgerState::DestroyAccepted,
                };
                self.store
                    .ledger_mark_destroy_result(&row.berth_id, state, None)
                    .await?;
                Ok(outcome)
            }
            Err(source) => {
                let kind = source.kind().as_str();
                self.store
                    .ledger_mark_destroy_result(
                        &row.berth_id,
                        LedgerState::DestroyFailed,
                        Some((kind, &source.to_string())),
                    )
                    .await?;
                Err(provider_err(source))
            }
        }
    }

    /// Deletes a snapshot row's snapshot by its key (the row's `berth_id`, unique to this
    /// ledger: random for user snapshots, derived from the attempt for checkpoints), which works
    /// even when a crash came before the handle was recorded.
    async fn delete_snapshot_row(
        &self,
        provider: &dyn Provider,
        row: &LedgerRow,
    ) -> Result<DestroyOutcome, LedgerError> {
        let provider_err = provider_error(&row.berth_id);
        let snapshots = provider.require_snapshots().map_err(provider_err)?;
        self.store
            .ledger_mark_destroy_requested(&row.berth_id)
            .await?;
        match snapshots.delete_keyed(&row.berth_id).await {
            Ok(()) => {
                self.store
                    .ledger_mark_destroy_result(&row.berth_id, LedgerState::VerifiedGone, None)
                    .await?;
                Ok(DestroyOutcome::VerifiedGone {
                    already_absent: false,
                })
            }
            Err(source) => {
                self.store
                    .ledger_mark_destroy_result(
                        &row.berth_id,
                        LedgerState::DestroyFailed,
                        Some((source.kind().as_str(), &source.to_string())),
                    )
                    .await?;
                Err(provider_err(source))
            }
        }
    }

    /// Takes a snapshot of `source` under the ledger: the row (kind `snapshot`, named `key`)
    /// is recorded before the provider is called, and the snapshot is keyed by it, so a crash
    /// at any point leaves a row that a retry completes (same key: no duplicate) or a sweep
    /// deletes. A row already recorded under `key` (an interrupted earlier call) is reused.
    pub async fn snapshot_tracked(
        &self,
        provider: &dyn Provider,
        source: &NativeId,
        key: &str,
        origin: &str,
        retention: Option<Duration>,
    ) -> Result<SnapshotRef, LedgerError> {
        let provider_err = provider_error(key);
        let snapshots = provider.require_snapshots().map_err(provider_err)?;
        berth_contract::check_snapshot_key(key).map_err(|m| {
            provider_err(ProviderError::new(
                berth_contract::ErrorKind::InvalidRequest,
                provider.id(),
                m,
            ))
        })?;
        match self.store.ledger_get(key).await {
            Ok(row) if row.owner == self.owner && row.kind == ResourceKind::Snapshot => {}
            Ok(_) => {
                return Err(LedgerError::Foreign {
                    berth_id: key.to_owned(),
                    reason: "the ledger already has a different resource under this name".into(),
                })
            }
            Err(berth_store::StoreError::NotFound(_)) => {
                let labels = Labels {
                    owner: self.owner.clone(),
                    run_id: self.run_id.clone(),
                    ledger_token: random_hex(8),
                    expires_at_unix: None,
                };
                self.store
                    .ledger_insert_intent(&NewLedgerRow {
                        berth_id: key.to_owned(),
                        provider: provider.id().to_owned(),
                        owner: labels.owner.clone(),
                        run_id: labels.run_id.clone(),
                        ledger_token: labels.ledger_token.clone(),
                        labels: labels.to_map(key),
                        origin: origin.to_owned(),
                        kind: ResourceKind::Snapshot,
                        expires_at: retention.map(|r| Utc::now() + r),
                    })
                    .await?;
            }
            Err(e) => return Err(e.into()),
        }
        match snapshots.snapshot_keyed(source, key).await {
            Ok(snap) => {
                self.store.ledger_mark_created(key, &snap.handle).await?;
                Ok(snap)
            }
            Err(source) => {
                self.store
                    .ledger_mark_create_failed(key, source.kind().as_str(), &source.to_string())
                    .await?;
                // Must fire: whatever the failed call left under the key goes now.
                let _ = snapshots.delete_keyed(key).await;
                Err(provider_err(source))
            }
        }
    }

    /// Destroys everything this run created that is not verified gone (must-fire on error,
    /// panic and signals).
    pub async fn cleanup_run(
        &self,
        providers: &dyn ProviderLookup,
    ) -> Result<SweepReport, LedgerError> {
        self.sweep(
            providers,
            &SweepScope {
                run_id: Some(self.run_id.clone()),
                ..Default::default()
            },
        )
        .await
    }

    /// Destroys and verifies everything this owner created that is not verified gone, within
    /// `scope`. Never touches a resource that does not carry this owner's labels.
    pub async fn sweep(
        &self,
        providers: &dyn ProviderLookup,
        scope: &SweepScope,
    ) -> Result<SweepReport, LedgerError> {
        let mut rows = self.owned_rows(scope.run_id.as_deref(), false).await?;
        let now = Utc::now();
        if scope.expired_only {
            rows.retain(|row| {
                row.expires_at.is_some_and(|t| t <= now) || orphan_snapshot(row, now)
            });
        }
        let mut report = SweepReport::default();
        // What a mission that is still running will adopt on resume is not swept from under
        // it: `berth mission resume` continues with it (a finished mission's rows are swept).
        let mut kept = Vec::new();
        for row in std::mem::take(&mut rows) {
            let held = match self.running_mission_of(&row).await? {
                Some(mission) => Some(format!(
                    "held by mission `{mission}`, which is still running; `berth mission resume {mission}` adopts it"
                )),
                None => snapshot_retention(&row, now),
            };
            match held {
                Some(reason) => kept.push(SweepEntry {
                    berth_id: row.berth_id.clone(),
                    provider: row.provider.clone(),
                    action: SweepAction::Held { reason },
                }),
                None => rows.push(row),
            }
        }
        report.entries.extend(kept);
        for provider_id in &scope.discover {
            report
                .entries
                .extend(self.discover(providers, provider_id).await?);
        }
        let mut constructed: Vec<(String, std::sync::Arc<dyn Provider>)> = Vec::new();
        for row in rows {
            let provider = match constructed.iter().find(|(id, _)| *id == row.provider) {
                Some((_, provider)) => provider.clone(),
                None => {
                    let provider = providers.provider(&row.provider).map_err(|source| {
                        LedgerError::Provider {
                            berth_id: row.berth_id.clone(),
                            source,
                        }
                    })?;
                    constructed.push((row.provider.clone(), provider.clone()));
                    provider
                }
            };
            let action = match self.destroy_row(provider.as_ref(), &row).await {
                Ok(DestroyOutcome::VerifiedGone {
                    already_absent: true,
                }) => SweepAction::AlreadyGone,
                Ok(DestroyOutcome::VerifiedGone { .. }) => SweepAction::Destroyed,
                Ok(DestroyOutcome::Accepted { raw_state }) => SweepAction::Accepted { raw_state },
                Err(LedgerError::Foreign { reason, .. }) => SweepAction::SkippedForeign { reason },
                Err(LedgerError::Provider { source, .. }) => SweepAction::Failed {
                    kind: source.kind().as_str().to_owned(),
                    message: source.to_string(),
                },
                Err(other) => return Err(other),
            };
            report.entries.push(SweepEntry {
                berth_id: row.berth_id,
                provider: row.provider,
                action,
            });
        }
        Ok(report)
    }

    /// The mission a row belongs to (its origin says `mission ID …`), if it is still running.
    async fn running_mission_of(&self, row: &LedgerRow) -> Result<Option<String>, LedgerError> {
        use berth_store::MissionStore;
        let Some(mission) = row
            .origin
            .strip_prefix("mission ")
            .and_then(|rest| rest.split_whitespace().next())
        else {
            return Ok(None);
        };
        match self.store.mission_get(mission).await {
            Ok(found) if found.state == "running" => Ok(Some(mission.to_owned())),
            Ok(_) | Err(berth_store::StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Resources listed under this owner's label that this ledger has no row for. They are
    /// reported, never destroyed: a label can be forged, and another `BERTH_HOME` with the same
    /// owner holds live resources with tokens this store never issued. (Intent is recorded
    /// before every create, so a crash cannot produce a resource without a row.)
    async fn discover(
        &self,
        providers: &dyn ProviderLookup,
        provider_id: &str,
    ) -> Result<Vec<SweepEntry>, LedgerError> {
        let provider = providers
            .provider(provider_id)
            .map_err(|source| LedgerError::Provider {
                berth_id: format!("<listing {provider_id}>"),
                source,
            })?;
        let Some(listing) = provider.listing() else {
            return Ok(Vec::new());
        };
        let listed = listing
            .list(&LabelFilter {
                owner: Some(self.owner.clone()),
                run_id: None,
            })
            .await
            .map_err(|source| LedgerError::Provider {
                berth_id: format!("<listing {provider_id}>"),
                source,
            })?;
        let known: BTreeSet<String> = self
            .owned_rows(None, false)
            .await?
            .into_iter()
            .map(|row| row.ledger_token)
            .collect();
        let mut found = Vec::new();
        for item in listed {
            let Observation::Present { labels, .. } = &item.observation else {
                continue;
            };
            let (Some(owner), Some(token)) = (labels.get(OWNER), labels.get(LEDGER_TOKEN)) else {
                continue;
            };
            if known.contains(token) || owner != &self.owner {
                continue;
            }
            let berth_id = labels
                .get(SANDBOX)
                .cloned()
                .unwrap_or_else(|| item.native_id.0.clone());
            found.push(SweepEntry {
                berth_id,
                provider: provider_id.to_owned(),
                action: SweepAction::SkippedForeign {
                    reason: format!(
                        "labelled with owner `{owner}` but no row in this ledger carries its token \
                         (another BERTH_HOME, or a forged label); not destroyed"
                    ),
                },
            });
        }
        Ok(found)
    }
}

/// Wraps a provider's error with the ledger row it concerns.
fn provider_error(berth_id: &str) -> impl Fn(ProviderError) -> LedgerError + Copy + '_ {
    move |source| LedgerError::Provider {
        berth_id: berth_id.to_owned(),
        source,
    }
}

/// How long an intent-only snapshot row must be left alone before it counts as an orphan (a
/// crash between the intent and the snapshot): a live snapshot call finishes well within it.
const ORPHAN_AFTER: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// A snapshot row whose snapshot never finished (a crash mid-snapshot): nothing holds it.
fn orphan_snapshot(row: &LedgerRow, now: DateTime<Utc>) -> bool {
    row.kind == ResourceKind::Snapshot
        && matches!(row.state, LedgerState::Intent | LedgerState::CreateFailed)
        && row.created_at + ORPHAN_AFTER <= now
}

/// Why a snapshot row is still held by its retention (`None`: it may go).
fn snapshot_retention(row: &LedgerRow, now: DateTime<Utc>) -> Option<String> {
    if row.kind != ResourceKind::Snapshot || orphan_snapshot(row, now) {
        return None;
    }
    match row.expires_at {
        Some(until) if until <= now => None,
        Some(until) => Some(format!("snapshot retained until {until}")),
        None if matches!(row.state, LedgerState::Intent) => {
            Some("snapshot being taken (an orphan after 10 minutes)".into())
        }
        None => {
            Some("snapshot kept until deleted (`berth snapshot --ttl` sets a retention)".into())
        }
    }
}

/// The provider's id for a row's resource. Providers name resources from Berth's id, so an
/// intent row without a native id is still addressable by name.
pub fn native_id(row: &LedgerRow) -> NativeId {
    NativeId(
        row.native_id
            .clone()
            .unwrap_or_else(|| row.berth_id.clone()),
    )
}

/// Why a present resource is not provably ours, or `None` when it is.
fn foreign_reason(row: &LedgerRow, observation: &Observation, owner: &str) -> Option<String> {
    if row.owner != owner {
        return Some(format!("its ledger entry belongs to owner `{}`", row.owner));
    }
    let Observation::Present { labels, .. } = observation else {
        return None;
    };
    if labels.get(OWNER).map(String::as_str) != Some(owner) {
        return Some(match labels.get(OWNER) {
            Some(other) => format!("the resource is labelled for owner `{other}`"),
            None => "the resource carries no berth owner label".to_owned(),
        });
    }
    if labels.get(LEDGER_TOKEN) != Some(&row.ledger_token) {
        return Some("the resource's ledger token does not match its ledger entry".to_owned());
    }
    None
}
