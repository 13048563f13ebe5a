//! Sweeping: destroying and verifying what this owner's rows name, leaving what a running
//! mission, a live run or a snapshot's retention still holds, and reporting labelled resources
//! no row names.

use std::collections::BTreeSet;

use berth_contract::labels::{EXPIRES, LEDGER_TOKEN, OWNER, RUN, SANDBOX};
use berth_contract::{
    DestroyOutcome, LabelFilter, ListingScope, Observation, Provider, ProviderLookup,
};
use berth_store::LedgerStore as _;
use berth_store::{
    IntentDurability, LedgerRow, LedgerState, NewLedgerRow, ResourceKind, StoreError,
};
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::{Ledger, LedgerError, ORPHAN_AFTER};

/// A provider error as a sweep entry says it: its kind's name and its message.
fn kind_and_message(source: &berth_contract::ProviderError) -> (String, String) {
    (source.kind().as_str().to_owned(), source.to_string())
}

/// A provider a sweep built for its rows, or what its rows get when it cannot be built.
type Constructed = Result<std::sync::Arc<dyn Provider>, SweepAction>;

/// The name a sweep entry gives what no row names ([`SweepAction::ResidueRemoved`]).
pub const RESIDUE: &str = "<residue>";

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
    /// Ours, and still held (by a running mission, a run still live in some process, or a
    /// snapshot's retention): kept.
    Held {
        /// By what.
        reason: String,
    },
    /// Found by listing with this owner's label and no row, where only this Berth home makes
    /// sandboxes (its intent was lost to a power failure): recorded now, then swept like any
    /// row in scope.
    Adopted {
        /// Why it is provably ours.
        reason: String,
    },
    /// Something a killed call left that no row named (an image a killed commit finished
    /// untagged), removed ([`Provider::remove_residue`]).
    ResidueRemoved {
        /// What it was.
        what: String,
    },
    /// Whether killed calls left anything on the provider is unknown: it could not be asked
    /// (not running, not reachable) or could not remove it.
    ResidueUnknown {
        /// Error kind.
        kind: String,
        /// Error message.
        message: String,
    },
    /// The provider could not be listed (not reachable, not set up): whatever it holds under
    /// this owner's label without a row is unknown. The rows are swept all the same; this
    /// entry names no resource of ours, so it does not make the sweep incomplete.
    NotListed {
        /// Error kind.
        kind: String,
        /// Why.
        message: String,
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
    /// Also remove what killed calls left on these providers that no row names
    /// ([`Provider::remove_residue`]).
    pub residue: Vec<String>,
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
                    | SweepAction::Adopted { .. }
                    | SweepAction::ResidueRemoved { .. }
                    | SweepAction::ResidueUnknown { .. }
                    | SweepAction::NotListed { .. }
            )
        })
    }
}

impl Ledger {
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
        let mut report = SweepReport::default();
        // Listing first: a sandbox it adopts gets a row, which the sweep below then considers.
        // One provider that cannot be listed (docker not running) must not stop the rest, nor
        // the rows below: it is reported, and the sweep goes on.
        for provider_id in &scope.discover {
            match self.discover(providers, provider_id).await {
                Ok(found) => report.entries.extend(found),
                Err(LedgerError::Provider { source, .. }) => {
                    let (kind, message) = kind_and_message(&source);
                    report.entries.push(SweepEntry {
                        berth_id: format!("<listing {provider_id}>"),
                        provider: provider_id.clone(),
                        action: SweepAction::NotListed { kind, message },
                    })
                }
                Err(other) => return Err(other),
            }
        }
        // Files of runs that are over (killed: nothing removed them) go first; tidying only,
        // so a failure stops nothing (a row whose run cannot be checked is not destroyed,
        // below).
        if let Err(e) = self.store.prune_runs() {
            tracing::warn!(error = %e, "cannot tidy the files of runs that are over");
        }
        let mut rows = self.owned_rows(scope.run_id.as_deref(), false).await?;
        let now = Utc::now();
        if scope.expired_only {
            rows.retain(|row| row.expires_at.is_some_and(|t| t <= now) || half_made(row, now));
        }
        // What a mission that is still running will adopt on resume is not swept from under
        // it: `berth mission resume` continues with it (a finished mission's rows are swept).
        let mut kept = Vec::new();
        for row in std::mem::take(&mut rows) {
            let own_cleanup = scope.run_id.as_deref() == Some(self.run_id.as_str());
            if own_cleanup && self.is_handed_over(&row.berth_id) {
                kept.push(SweepEntry {
                    berth_id: row.berth_id.clone(),
                    provider: row.provider.clone(),
                    action: SweepAction::Held {
                        reason: "handed over by this run (the target of a committed move); \
                                 `berth destroy` removes it"
                            .into(),
                    },
                });
                continue;
            }
            let kept_as = match self.running_mission_of(&row).await? {
                Some(mission) => Some(SweepAction::Held {
                    reason: format!(
                        "held by mission `{mission}`, which is still running; `berth mission resume {mission}` adopts it"
                    ),
                }),
                None => self.kept_for_its_run(&row, now).or_else(|| {
                    snapshot_retention(&row, now).map(|reason| SweepAction::Held { reason })
                }),
            };
            match kept_as {
                Some(action) => kept.push(SweepEntry {
                    berth_id: row.berth_id.clone(),
                    provider: row.provider.clone(),
                    action,
                }),
                None => rows.push(row),
            }
        }
        report.entries.extend(kept);
        // Each provider constructed once; one that cannot be (not set up, not built in) fails
        // its own rows, never another provider's: a must-fire cleanup sweeps what it can.
        let mut constructed: Vec<(String, Constructed)> = Vec::new();
        for row in rows {
            let provider = match constructed.iter().find(|(id, _)| *id == row.provider) {
                Some((_, provider)) => provider.clone(),
                None => {
                    let provider = providers.provider(&row.provider).map_err(|source| {
                        let (kind, message) = kind_and_message(&source);
                        SweepAction::Failed { kind, message }
                    });
                    constructed.push((row.provider.clone(), provider.clone()));
                    provider
                }
            };
            let provider = match provider {
                Ok(provider) => provider,
                Err(cannot) => {
                    report.entries.push(SweepEntry {
                        berth_id: row.berth_id,
                        provider: row.provider,
                        action: cannot,
                    });
                    continue;
                }
            };
            let action = match self.destroy_row(provider.as_ref(), &row).await {
                Ok(DestroyOutcome::VerifiedGone {
                    already_absent: true,
                }) => SweepAction::AlreadyGone,
                Ok(DestroyOutcome::VerifiedGone { .. }) => SweepAction::Destroyed,
                Ok(DestroyOutcome::Accepted { raw_state }) => SweepAction::Accepted { raw_state },
                Err(LedgerError::Foreign { reason, .. }) => SweepAction::SkippedForeign { reason },
                Err(LedgerError::Provider { source, .. }) => {
                    let (kind, message) = kind_and_message(&source);
                    SweepAction::Failed { kind, message }
                }
                Err(other) => return Err(other),
            };
            report.entries.push(SweepEntry {
                berth_id: row.berth_id,
                provider: row.provider,
                action,
            });
        }
        // Last, what killed calls left that no row names.
        for provider_id in &scope.residue {
            report
                .entries
                .extend(self.remove_residue(providers, provider_id).await);
        }
        Ok(report)
    }

    /// What [`Provider::remove_residue`] removed from `provider_id`, an entry each, or why
    /// what is left there is unknown (a provider not running or not reachable: like one that
    /// cannot be listed, it names no resource of ours).
    async fn remove_residue(
        &self,
        providers: &dyn ProviderLookup,
        provider_id: &str,
    ) -> Vec<SweepEntry> {
        let entry = |action| SweepEntry {
            berth_id: RESIDUE.to_owned(),
            provider: provider_id.to_owned(),
            action,
        };
        let removed = match providers.provider(provider_id) {
            Ok(provider) => provider.remove_residue().await,
            Err(e) => Err(e),
        };
        match removed {
            Ok(removed) => removed
                .into_iter()
                .map(|what| entry(SweepAction::ResidueRemoved { what }))
                .collect(),
            Err(source) => {
                let (kind, message) = kind_and_message(&source);
                vec![entry(SweepAction::ResidueUnknown { kind, message })]
            }
        }
    }

    /// A row kept for its run: held while the run is still live in some process (this one or
    /// another: it is making or using what the row names and removes it when done); not
    /// destroyed, and reported as a failure, when whether it is live cannot be told. Never this
    /// ledger's own run (its cleanup is this sweep), never a row past its expiry.
    fn kept_for_its_run(&self, row: &LedgerRow, now: DateTime<Utc>) -> Option<SweepAction> {
        if row.run_id == self.run_id || row.expires_at.is_some_and(|t| t <= now) {
            return None;
        }
        match self.store.run_is_live(&row.run_id) {
            Ok(false) => None,
            Ok(true) => Some(SweepAction::Held {
                reason: format!(
                    "its run `{}` is still live in a berth process, which removes it when done; a sweep after that process ends or is killed takes it",
                    row.run_id
                ),
            }),
            // Unknown is not "over": destroying a sandbox its command may be using is the
            // mistake this check exists to prevent; the row stays open, the sweep incomplete.
            Err(e) => Some(SweepAction::Failed {
                kind: "setup".into(),
                message: format!("not destroyed: whether its run is still live is unknown: {e}"),
            }),
        }
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
            Ok(_) | Err(berth_store::StoreError::NotFound(..)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Resources listed under this owner's label that this ledger has no row for. Where the
    /// listing is shared they are reported, never destroyed: a label can be forged, and another
    /// `BERTH_HOME` with the same owner holds live resources with tokens this store never
    /// issued. (An intent flushed before every such create means a crash cannot produce one.)
    /// Where only this home makes sandboxes ([`ListingScope::ThisHome`]) and the token starts
    /// with this store's identity, such a sandbox is this store's, left by a power failure
    /// that took its unflushed intent: it is adopted — a row recorded from its labels — and
    /// swept like any other.
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
        // Adoptable: listed where only this home makes sandboxes, with a token this store
        // issued (another store pointed at the same state would have its own identity).
        let identity = self.store.store_identity().await?;
        let this_home = listing.scope() == ListingScope::ThisHome;
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
            // Local providers name a sandbox by its Berth id: a label saying otherwise was not
            // written by this store, and is never made a row's name.
            if this_home && token.starts_with(&identity) && berth_id == item.native_id.0 {
                found.push(
                    self.adopt(provider_id, &item.native_id, berth_id, labels)
                        .await?,
                );
                continue;
            }
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

impl Ledger {
    /// Records a row for a sandbox found in this home's own listing without one.
    async fn adopt(
        &self,
        provider_id: &str,
        native_id: &berth_contract::NativeId,
        berth_id: String,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<SweepEntry, LedgerError> {
        let token = labels.get(LEDGER_TOKEN).cloned().unwrap_or_default();
        let row = NewLedgerRow {
            berth_id: berth_id.clone(),
            provider: provider_id.to_owned(),
            owner: self.owner.clone(),
            run_id: labels
                .get(RUN)
                .cloned()
                .unwrap_or_else(|| self.run_id.clone()),
            ledger_token: token,
            labels: labels.clone(),
            origin: "adopted by sweep".into(),
            kind: ResourceKind::Sandbox,
            expires_at: labels
                .get(EXPIRES)
                .and_then(|t| t.parse::<i64>().ok())
                .and_then(|t| DateTime::from_timestamp(t, 0)),
            durability: IntentDurability::ProcessCrash,
        };
        let action = match self.store.ledger_get(&berth_id).await {
            // A row of this name with another token: not provably the same sandbox.
            Ok(_) => SweepAction::SkippedForeign {
                reason: "its name is taken in this ledger by a row with another token; not \
                         adopted"
                    .into(),
            },
            Err(StoreError::NotFound(..)) => {
                self.store.ledger_insert_intent(&row).await?;
                self.store
                    .ledger_mark_created(&berth_id, &native_id.0)
                    .await?;
                SweepAction::Adopted {
                    reason: format!(
                        "labelled with owner `{}` and a token this store issued, in \
                         {provider_id}'s state private to this Berth home, without a row (its \
                         intent was lost, as to a power failure): recorded",
                        self.owner
                    ),
                }
            }
            Err(other) => return Err(other.into()),
        };
        Ok(SweepEntry {
            berth_id,
            provider: provider_id.to_owned(),
            action,
        })
    }
}

/// A row whose create, fork or snapshot never finished (a crash between the intent and the
/// result) and whose call has shown no sign of life for [`ORPHAN_AFTER`]: nothing is making
/// it, nothing holds it. A killed `berth fork` otherwise left a running sandbox until its TTL;
/// a slow one keeps stamping its row and is left alone however long it takes.
fn half_made(row: &LedgerRow, now: DateTime<Utc>) -> bool {
    let last_sign_of_life = row
        .alive_at
        .map_or(row.created_at, |t| t.max(row.created_at));
    matches!(row.state, LedgerState::Intent | LedgerState::CreateFailed)
        && last_sign_of_life + ORPHAN_AFTER <= now
}

/// Why a snapshot row is still held by its retention (`None`: it may go).
fn snapshot_retention(row: &LedgerRow, now: DateTime<Utc>) -> Option<String> {
    if row.kind != ResourceKind::Snapshot || half_made(row, now) {
        return None;
    }
    match row.expires_at {
        Some(until) if until <= now => None,
        Some(until) => Some(format!("snapshot retained until {until}")),
        None if matches!(row.state, LedgerState::Intent) => {
            Some("snapshot being taken (an orphan 2 minutes after its last sign of life)".into())
        }
        None => {
            Some("snapshot kept until deleted (`berth snapshot --ttl` sets a retention)".into())
        }
    }
}
