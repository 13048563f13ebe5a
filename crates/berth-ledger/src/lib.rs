//! The cleanup ledger: every resource Berth creates, from intent to verified-gone.
//!
//! Invariants:
//! - **Intent before side effect.** The ledger row (state `intent`, with the labels the
//!   resource will carry) is durable before the provider is asked to create, so a crash at any
//!   point leaves a row a sweep can act on — flushed to disk, except where a sweep can find
//!   the resource without it ([`intent_durability`]).
//! - **Must fire.** A create that fails is followed by a destroy of the same name; a command
//!   that errors, panics or is signalled destroys what its run created ([`Ledger::cleanup_run`]);
//!   a killed command leaves rows that [`Ledger::sweep`] destroys and verifies.
//! - **Must not fire.** Berth destroys a resource only when its ledger row belongs to this owner
//!   *and* the provider reports labels carrying this owner and the row's ledger token. Anything
//!   else is skipped and reported as foreign.
//! - **A live run's rows are its own.** A run claims itself live (a lock its process holds,
//!   which the kernel drops however the process ends) before its first intent; a sweep from
//!   another run holds that run's unexpired rows instead of destroying them from under it, and
//!   takes a killed run's rows at once.
//! - **Gone means observed gone.** A row becomes `verified_gone` only when the provider's
//!   destroy verified it or observe says absent. `Accepted` keeps the row open.

use std::future::Future;
use std::time::Duration;

mod sweep;

pub use sweep::{SweepAction, SweepEntry, SweepReport, SweepScope, RESIDUE};

use berth_contract::labels::{LEDGER_TOKEN, OWNER};
use berth_contract::{
    CreateRequest, Created, DestroyOutcome, Labels, ListingScope, NativeId, Observation, Provider,
    ProviderError, ProviderExt, SandboxName, SnapshotRef,
};
use berth_store::LedgerStore as _;
use berth_store::{
    IntentDurability, LedgerQuery, LedgerRow, LedgerState, NewLedgerRow, ResourceKind, Store,
    StoreError,
};
use chrono::Utc;
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

/// The ledger, bound to one owner and one run.
#[derive(Debug, Clone)]
pub struct Ledger {
    store: Store,
    owner: String,
    run_id: String,
    sign_of_life_every: Duration,
    /// This run's claim to be live, taken before its first intent and shared by the clones.
    claim: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<berth_store::RunClaim>>>,
    /// Sandboxes this run made and handed over to their user ([`Ledger::hand_over`]), shared
    /// by the clones.
    handed_over: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
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

/// What a sandbox's intent row must survive before `provider` may create it. Flushing to disk
/// (power loss) is the rule. A provider whose listing shows only what this Berth home made
/// (host, bwrap) needs less: power loss ends its sandboxes' processes, and the directory left
/// behind is listed, so a sweep adopts it even if the row was lost — the intent need only
/// survive a crash of the process (`kill -9`), which costs no flush.
pub fn intent_durability(provider: &dyn Provider) -> IntentDurability {
    match provider.listing().map(|listing| listing.scope()) {
        Some(ListingScope::ThisHome) => IntentDurability::ProcessCrash,
        Some(ListingScope::Shared) | None => IntentDurability::PowerLoss,
    }
}

impl Ledger {
    /// A ledger for `owner`, recording under `run_id`.
    pub fn new(store: Store, owner: impl Into<String>, run_id: impl Into<String>) -> Self {
        Ledger {
            store,
            owner: owner.into(),
            run_id: run_id.into(),
            sign_of_life_every: SIGN_OF_LIFE_EVERY,
            claim: Default::default(),
            handed_over: Default::default(),
        }
    }

    /// Hands a sandbox this run made over to its user: this run's must-fire cleanup
    /// ([`Ledger::cleanup_run`], on a failure or a signal later in the run) keeps it, as it
    /// keeps what a command returned. A sweep asked for by name still removes it. Used where
    /// the sandbox becomes the only copy of something before the run ends (a committed move's
    /// target, once its source may be destroyed).
    pub fn hand_over(&self, berth_id: &str) {
        self.handed_over
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(berth_id.to_owned());
    }

    fn is_handed_over(&self, berth_id: &str) -> bool {
        self.handed_over
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(berth_id)
    }

    /// This ledger with its calls' signs of life every `every` instead of about every 30 s
    /// (tests: to watch a slow create stay alive without waiting minutes).
    pub fn with_sign_of_life_every(mut self, every: Duration) -> Self {
        self.sign_of_life_every = every;
        self
    }

    /// Runs `call` (the provider call making `berth_id`'s resource) while stamping the row's
    /// sign of life, so a sweep never takes a slow create for one a crash abandoned. The stamps
    /// stop with the call: when it returns, or when a crash or a dropped future ends it.
    async fn while_alive<T>(&self, berth_id: &str, call: impl Future<Output = T>) -> T {
        let stamps = async {
            let mut every = tokio::time::interval_at(
                tokio::time::Instant::now() + self.sign_of_life_every,
                self.sign_of_life_every,
            );
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                // A stamp that fails costs at worst an early sweep of a slow create; the call
                // itself goes on.
                if let Err(e) = self.store.ledger_mark_alive(berth_id).await {
                    tracing::warn!(berth_id, error = %e, "cannot record that a create is alive");
                }
            }
        };
        tokio::select! {
            done = call => done,
            () = stamps => unreachable!("the stamps go on until the call ends"),
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

    /// Claims this run live, once (before its first intent: a sweep that sees the row then
    /// sees the claim).
    fn claim_run(&self) -> Result<(), LedgerError> {
        if self.claim.get().is_none() {
            let claim = self.store.claim_run(&self.run_id)?;
            let _ = self.claim.set(claim);
        }
        Ok(())
    }

    /// A fresh ledger token: this store's identity, then random. The prefix tells a sweep
    /// which labelled sandboxes without a row this store made.
    async fn new_token(&self) -> Result<String, LedgerError> {
        Ok(format!(
            "{}{}",
            self.store.store_identity().await?,
            random_hex(8)
        ))
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
            ledger_token: self.new_token().await?,
            expires_at_unix: expires_at.map(|t| t.timestamp()),
        };
        let mut req = CreateRequest::new(name.clone(), labels.clone());
        prepare(&mut req);
        self.claim_run()?;
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
                durability: intent_durability(provider),
            })
            .await?;
        match self.while_alive(&name.0, make(req)).await {
            Ok(created) => {
                let marked = self
                    .store
                    .ledger_mark_created(&name.0, &created.native_id.0)
                    .await;
                if let Err(StoreError::SweptWhileMade(_)) = marked {
                    // A sweep took the row before the sandbox existed: what was made goes now,
                    // or the row says why it could not (and the next sweep tries again).
                    if let Err(source) = provider.destroy(&created.native_id).await {
                        let row = self.store.ledger_get(&name.0).await?;
                        let _ = self.destroy_failed(&row, source).await?;
                    }
                }
                marked?;
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
            // The sandbox is gone, but what its provider keeps beside it may not be: a fork
            // killed after its image was committed and before its container was made leaves
            // the image. Destroy is idempotent; on an absent sandbox it removes that residue.
            if let Err(source) = provider.destroy(&id).await {
                if source.kind() != berth_contract::ErrorKind::NotFound {
                    return Err(self.destroy_failed(row, source).await?);
                }
            }
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
            Err(source) => Err(self.destroy_failed(row, source).await?),
        }
    }

    /// Records a failed destroy on the row and gives the error to return.
    async fn destroy_failed(
        &self,
        row: &LedgerRow,
        source: ProviderError,
    ) -> Result<LedgerError, LedgerError> {
        self.store
            .ledger_mark_destroy_result(
                &row.berth_id,
                LedgerState::DestroyFailed,
                Some((source.kind().as_str(), &source.to_string())),
            )
            .await?;
        Ok(provider_error(&row.berth_id)(source))
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
            Err(source) => Err(self.destroy_failed(row, source).await?),
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
        let mut existing = self.store.ledger_get(key).await;
        if let Ok(row) = &existing {
            if row.owner == self.owner
                && row.kind == ResourceKind::Snapshot
                && (row.destroy_requested_at.is_some() || row.state == LedgerState::VerifiedGone)
            {
                // Taken before and deleted (or being deleted) since: its deletion is finished,
                // the name freed (its history kept under `KEY~TOKEN`), and the snapshot gets a
                // row of its own, never a reopened one.
                if row.state != LedgerState::VerifiedGone {
                    self.delete_snapshot_row(provider, row).await?;
                }
                self.store.ledger_retire(key).await?;
                existing = Err(StoreError::NotFound(
                    berth_store::Record::LedgerEntry,
                    key.to_owned(),
                ));
            }
        }
        match existing {
            Ok(row) if row.owner == self.owner && row.kind == ResourceKind::Snapshot => {}
            Ok(_) => {
                return Err(LedgerError::Foreign {
                    berth_id: key.to_owned(),
                    reason: "the ledger already has a different resource under this name".into(),
                })
            }
            Err(StoreError::NotFound(..)) => {
                let labels = Labels {
                    owner: self.owner.clone(),
                    run_id: self.run_id.clone(),
                    ledger_token: self.new_token().await?,
                    expires_at_unix: None,
                };
                self.claim_run()?;
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
                        // A snapshot is not found by any listing: a lost row would leak it.
                        durability: IntentDurability::PowerLoss,
                    })
                    .await?;
            }
            Err(e) => return Err(e.into()),
        }
        match self
            .while_alive(key, snapshots.snapshot_keyed(source, key))
            .await
        {
            Ok(snap) => {
                let marked = self.store.ledger_mark_created(key, &snap.handle).await;
                if let Err(StoreError::SweptWhileMade(_)) = marked {
                    // Deleted by a sweep while it was being taken: it goes again now.
                    if let Err(source) = snapshots.delete_keyed(key).await {
                        let row = self.store.ledger_get(key).await?;
                        let _ = self.destroy_failed(&row, source).await?;
                    }
                }
                marked?;
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
}

/// Wraps a provider's error with the ledger row it concerns.
fn provider_error(berth_id: &str) -> impl Fn(ProviderError) -> LedgerError + Copy + '_ {
    move |source| LedgerError::Provider {
        berth_id: berth_id.to_owned(),
        source,
    }
}

/// How often a create, fork or snapshot under way stamps its row's sign of life.
const SIGN_OF_LIFE_EVERY: Duration = Duration::from_secs(30);

/// How long after its last sign of life (or its intent, if none) a row still at `intent` counts
/// as half-made by a crash between the intent and the result: four missed stamps. A live call
/// stamps however long it takes.
pub(crate) const ORPHAN_AFTER: chrono::TimeDelta = chrono::TimeDelta::minutes(2);

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
