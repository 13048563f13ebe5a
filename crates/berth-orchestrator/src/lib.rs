//! The mission service: durable ticks over the mission authority.
//!
//! A tick loads the mission's record from the store, asks the authority what comes next
//! ([`berth_mission::authority::next`]) and performs exactly one step of the attempt pipeline:
//!
//! claim → sandbox (created under the ledger, named from the attempt key, adopted on recovery) →
//! stage the repository at its base commit → run the harness under a timeout (its whole process
//! group ends with it) → capture (the workspace leaves the sandbox as a tar archive and is
//! committed on the host; see `capture`) → run the validator in a clean sandbox holding a
//! checkout of that commit and check its declared evidence → record the commit → checkpoint
//! (provider snapshot) → finalize (the commit's bundle, written on the host) → teardown.
//!
//! Each step's result is an authority event appended to the store in one transaction with the
//! record it produces; a crash between a side effect and its event repeats at most that step,
//! which is written to be repeatable (adoption by name, idempotent commits and exports). Model
//! (agent) execution is therefore at-least-once, never silently skipped.

mod agents;
mod attempt_files;
mod cancel;
mod capture;
pub mod follow;
mod hostgit;
pub mod logins;
mod memory;
mod pipeline;
pub mod publication;
mod registration;
mod steps;
mod transport;
mod validation;

use hostgit::{copy_tree, git, git_over, scheme_of, Transport};

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use berth_factory::{ProviderConfig, Registry};
use berth_ledger::Ledger;
use berth_mission::authority::{self, Event, MissionRecord, MissionState, Next};
use berth_mission::file::MissionFile;
use berth_store::MissionStore;
use serde::{Deserialize, Serialize};

pub use agents::{
    agent_bin_dir, link_gateway, AgentLogs, AttemptLogs, GatewayLink, GatewayReach, Gateways,
    AGENT_BIN_DIR_VAR, IMAGE_AGENT_BIN_DIR, SANDBOX_GATEWAY_PORT,
};
pub use cancel::{NotRemoved, Teardown};
pub use capture::SCRIPT as CAPTURE_SCRIPT;
pub use memory::{LastStored, MissionLease, Providers, SettledAttempts};
pub use pipeline::Step;
pub use transport::STAGE_SCRIPT;

/// Schema version of the mission spec stored beside the record.
pub const SPEC_VERSION: u32 = 1;

/// A mission failed to run (not: a mission failed — that is a mission state).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OrchestratorError {
    /// The mission file is invalid.
    #[error("{0}")]
    File(#[from] berth_mission::file::MissionFileError),
    /// The repository could not be read.
    #[error("repository: {0}")]
    Repository(String),
    /// The mission asks for something missions do not support yet.
    #[error("not supported yet: {0}")]
    Unsupported(String),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] berth_store::StoreError),
    /// The authority refused a transition (a bug in the pipeline, or a concurrent writer).
    #[error("{0}")]
    Authority(#[from] authority::AuthorityError),
    /// Another process changed the mission concurrently.
    #[error("{0}")]
    Conflict(#[from] berth_store::Conflict),
    /// A provider could not be constructed.
    #[error("{0}")]
    Factory(#[from] berth_factory::FactoryError),
    /// A stored record could not be read.
    #[error("stored mission is unreadable: {0}")]
    Corrupt(String),
    /// Another runner holds the mission's lease.
    #[error("{0}")]
    Leased(#[from] berth_store::LeaseHeld),
    /// This runner's lease was taken over (it stopped renewing in time); it stops at once.
    #[error("mission `{0}`: this runner lost its lease to another runner and stopped")]
    LeaseLost(String),
    /// The mission file names a provider this build has no adapter for.
    #[error("provider `{0}` has no adapter in this build (see `berth providers`)")]
    UnknownProvider(String),
    /// The mission file could not be read (missing, not a regular file, too large).
    #[error("{0}")]
    Unreadable(String),
    /// `BERTH_ARTIFACTS_URL` names an S3 bucket but a credential it needs is not set.
    #[error("BERTH_ARTIFACTS_URL is set but `{variable}` (the S3 credential it needs) is not")]
    ArtifactCredential {
        /// The variable to set.
        variable: String,
    },
    /// The S3 artifact store `BERTH_ARTIFACTS_URL` (and the variables beside it) describe is
    /// malformed.
    #[error("artifact store: {0}")]
    ArtifactConfig(String),
    /// The local artifact store (`$BERTH_HOME/artifacts`) could not be opened.
    #[error("artifact store: {0}")]
    ArtifactDir(String),
    /// A provider call a step needed failed for now: see [`Interrupted`].
    #[error(transparent)]
    Interrupted(Box<Interrupted>),
    /// The attempt could not be set up for its agent: see [`BeforeAgent`].
    #[error(transparent)]
    BeforeAgent(Box<BeforeAgent>),
    /// The mission has finished: there is nothing to cancel.
    #[error("mission `{mission}` has already finished ({state}): there is nothing to cancel")]
    Finished {
        /// The mission.
        mission: String,
        /// How it finished.
        state: &'static str,
    },
    /// The mission belongs to another owner: this orchestrator neither shows nor runs it (its
    /// sandboxes would be recorded under the wrong owner).
    #[error("mission `{mission}` belongs to owner `{owner}`")]
    Foreign {
        /// The mission.
        mission: String,
        /// Its owner.
        owner: String,
    },
}

/// A provider call a step needed failed in a way the provider calls retryable (its daemon
/// unreachable, a timeout, no capacity): no verdict on the attempt, so none is recorded. The
/// run stopped with the attempt where it was; `berth mission resume` runs the step again.
#[derive(Debug, thiserror::Error)]
#[error("mission `{mission}` stopped at attempt `{attempt}`, {doing}")]
pub struct Interrupted {
    /// The mission.
    pub mission: String,
    /// The attempt whose step could not finish.
    pub attempt: String,
    /// What the step was doing.
    pub doing: String,
    /// The provider's error.
    #[source]
    pub source: berth_contract::ProviderError,
}

/// What an attempt's agent needs could not be set up — the repository staged (no git in the
/// image, a full disk in the sandbox, a tree the transport cannot keep), the agent CLI found,
/// the model gateway reached, the login leased and staged: no verdict on the attempt (its
/// agent never ran, and every later attempt would meet the same), so none is recorded. A
/// sandbox whose staging failed was removed; `berth mission resume` goes on once the cause is
/// fixed.
#[derive(Debug, thiserror::Error)]
#[error("mission `{mission}` stopped at attempt `{attempt}`, before its agent ran: {reason}")]
pub struct BeforeAgent {
    /// The mission.
    pub mission: String,
    /// The attempt whose agent could not start.
    pub attempt: String,
    /// What failed.
    pub reason: String,
}

/// Who is driving a mission now. A running mission without a runner stays where it is until
/// `berth mission resume` (after a crash, or a run stopped by a provider that failed for now).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Runner {
    /// No runner holds its lease: nothing is driving it.
    None,
    /// A runner holds its lease until `expires_at` (renewed while it works).
    Holding {
        /// The runner (`host H pid P start S`).
        holder: String,
        /// When the lease lapses unless renewed.
        expires_at: String,
    },
    /// The holder was a process on this host that is gone; the next run takes over at once.
    Gone {
        /// The runner that held it.
        holder: String,
        /// When its lease lapses.
        expires_at: String,
    },
}

/// What is stored beside the authority's record: the mission file plus what was resolved when
/// the mission started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MissionSpec {
    /// [`SPEC_VERSION`].
    pub spec_version: u32,
    /// The mission file as parsed.
    pub file: MissionFile,
    /// The base commit, resolved from `repository.base`.
    pub base_commit: String,
    /// The repository bundle the first task starts from.
    pub base_bundle: PathBuf,
    /// An agent harness's scripted model, as read when the mission was registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_script: Option<String>,
}

/// Runs missions for one owner.
#[derive(Debug)]
pub struct Orchestrator<'a> {
    /// Durable mission state (SQLite by default; any [`MissionStore`]).
    pub store: &'a dyn MissionStore,
    /// The ledger (every sandbox goes through it).
    pub ledger: &'a Ledger,
    /// Providers.
    pub registry: &'a Registry,
    /// Provider configuration.
    pub config: &'a ProviderConfig,
    /// Where mission artifacts (bundles) live: `<home>/missions/<id>/`.
    pub home: &'a Path,
    /// Called at every durable boundary (before and after each event is stored). Tests use it
    /// to kill the process at each boundary and prove `resume` completes the mission.
    pub boundary: Option<fn(Boundary)>,
    /// The fencing token of the mission lease [`Orchestrator::run`] holds (0: none held).
    pub lease: MissionLease,
    /// The model gateways of agent-CLI missions, one per mission, started on first use.
    pub gateways: Gateways,
    /// Attempts whose sandboxes this orchestrator has seen verified gone (or kept): every tick
    /// reconciles finished attempts, and these need it no more.
    pub settled: SettledAttempts,
    /// The mission state this orchestrator last stored under its lease, so a tick need not
    /// read it back.
    pub last_stored: LastStored,
    /// The providers this orchestrator has constructed, one instance each for its whole run.
    pub providers: Providers,
}

/// How long a runner's lease lasts without renewal; it renews at a third of this.
pub const LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// This process as a lease holder: host, pid and the pid's start time (so a reused pid is not
/// mistaken for the runner that died).
fn this_runner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let pid = std::process::id();
    format!(
        "host {} pid {pid} start {}",
        host.trim(),
        process_start(pid).unwrap_or_default()
    )
}

fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime); fields after the command's closing parenthesis start at 3.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// True when `holder` names a runner on this host whose process is gone (or whose pid now
/// belongs to a different process). Runners on other hosts are never presumed dead.
fn runner_is_dead(holder: &str) -> bool {
    let ours = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let parts: Vec<&str> = holder.split(' ').collect();
    let ["host", host, "pid", pid, "start", start] = parts.as_slice() else {
        return false;
    };
    if *host != ours.trim() {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    process_start(pid).as_deref() != Some(*start)
}

/// A durable step boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// The side effect happened; event number `n` is about to be stored.
    BeforeEvent(i64),
    /// Event number `n` is durable; the next side effect has not started.
    AfterEvent(i64),
    /// The `n`th durable step of artifact publication in this process (1-based: a claim, an
    /// object written, `uploaded`, `indexed`) has just completed.
    Publication(u64),
}

fn state_name(state: &MissionState) -> &'static str {
    match state {
        MissionState::Running => "running",
        MissionState::Succeeded => "succeeded",
        MissionState::Failed { .. } => "failed",
        MissionState::Cancelled { .. } => "cancelled",
    }
}

impl Orchestrator<'_> {
    /// This orchestrator's instance of provider `id` (see [`Providers`]).
    pub(crate) fn provider(
        &self,
        id: &str,
    ) -> Result<std::sync::Arc<dyn berth_contract::Provider>, OrchestratorError> {
        Ok(self.providers.get(id, self.registry, self.config)?)
    }

    /// The directory of a mission's artifacts.
    pub fn mission_dir(&self, id: &str) -> PathBuf {
        self.home.join("missions").join(id)
    }

    /// Mission `id`'s row, if it is this owner's.
    async fn owned(&self, id: &str) -> Result<berth_store::MissionRow, OrchestratorError> {
        let row = self.store.mission_get(id).await?;
        if row.owner != self.ledger.owner() {
            return Err(OrchestratorError::Foreign {
                mission: id.to_owned(),
                owner: row.owner,
            });
        }
        Ok(row)
    }

    /// Who is driving one of this owner's missions now, as its lease says.
    pub async fn runner(&self, id: &str) -> Result<Runner, OrchestratorError> {
        self.owned(id).await?;
        Ok(match self.store.mission_lease_holder(id).await? {
            None => Runner::None,
            Some(held) if runner_is_dead(&held.holder) => Runner::Gone {
                holder: held.holder,
                expires_at: held.expires_at,
            },
            Some(held) => Runner::Holding {
                holder: held.holder,
                expires_at: held.expires_at,
            },
        })
    }

    /// Loads one of this owner's missions: its spec, record and sequence number.
    pub async fn load(
        &self,
        id: &str,
    ) -> Result<(MissionSpec, MissionRecord, i64), OrchestratorError> {
        let row = self.owned(id).await?;
        let spec: MissionSpec = serde_json::from_str(&row.spec_json)
            .map_err(|e| OrchestratorError::Corrupt(e.to_string()))?;
        if spec.spec_version != SPEC_VERSION {
            return Err(OrchestratorError::Corrupt(format!(
                "mission spec version {} (this berth reads {SPEC_VERSION})",
                spec.spec_version
            )));
        }
        let record: MissionRecord = serde_json::from_str(&row.record_json)
            .map_err(|e| OrchestratorError::Corrupt(e.to_string()))?;
        Ok((spec, record, row.seq))
    }

    /// Applies an event through the authority and stores it with the new record, atomically.
    pub(crate) async fn commit_event(
        &self,
        id: &str,
        record: &MissionRecord,
        seq: i64,
        event: &Event,
        facts: &[(&str, serde_json::Value)],
    ) -> Result<(MissionRecord, i64), OrchestratorError> {
        self.commit_events(id, record, seq, std::slice::from_ref(event), facts)
            .await
    }

    /// Applies events in order through the authority and stores them, the record they produce
    /// and the facts in one transaction: one durable commit for a step that decides several
    /// things at once. The crash boundaries are before and after that commit, for every event.
    pub(crate) async fn commit_events(
        &self,
        id: &str,
        record: &MissionRecord,
        seq: i64,
        events: &[Event],
        facts: &[(&str, serde_json::Value)],
    ) -> Result<(MissionRecord, i64), OrchestratorError> {
        let mut next = record.clone();
        for event in events {
            next = authority::apply(&next, event)?;
        }
        let count = events.len() as i64;
        if let Some(hook) = self.boundary {
            (1..=count).for_each(|n| hook(Boundary::BeforeEvent(seq + n)));
        }
        let key = match events.first() {
            Some(Event::Start { .. } | Event::Cancel { .. }) | None => String::new(),
            Some(
                Event::Reached { key, .. }
                | Event::ValidatorPassed { key, .. }
                | Event::Rejected { key, .. }
                | Event::Committed { key, .. }
                | Event::Checkpointed { key, .. }
                | Event::Published { key, .. }
                | Event::Finalized { key },
            ) => key.0.clone(),
        };
        let facts: Vec<(&str, &str, String)> = facts
            .iter()
            .map(|(kind, detail)| (key.as_str(), *kind, detail.to_string()))
            .collect();
        let events_json: Vec<String> = events
            .iter()
            .map(|e| serde_json::to_string(e).expect("event serializes"))
            .collect();
        let appended = self
            .store
            .mission_append(
                id,
                seq,
                self.lease.fence(),
                &events_json,
                &serde_json::to_string(&next).expect("record serializes"),
                state_name(&next.state),
                &facts,
            )
            .await;
        let appended: Result<i64, OrchestratorError> = match appended {
            Ok(Ok(new_seq)) => Ok(new_seq),
            Ok(Err(conflict)) => Err(conflict.into()),
            Err(store) => Err(store.into()),
        };
        self.last_stored.appended(
            id,
            self.lease.fence(),
            appended.as_ref().ok().map(|new_seq| (&next, *new_seq)),
        );
        let new_seq = appended?;
        if let Some(hook) = self.boundary {
            (seq + 1..=new_seq).for_each(|n| hook(Boundary::AfterEvent(n)));
        }
        Ok((next, new_seq))
    }

    /// One tick: at most one new agent submission, or one recovery/reconciliation/finalization
    /// step. Returns what it did.
    pub async fn tick(&self, id: &str) -> Result<Step, OrchestratorError> {
        let fence = self.lease.fence();
        let (spec, record, seq) = match self.last_stored.get(id, fence) {
            Some(stored) => stored,
            None => {
                let (spec, record, seq) = self.load(id).await?;
                let spec = std::sync::Arc::new(spec);
                self.last_stored.loaded(id, fence, &spec, &record, seq);
                (spec, record, seq)
            }
        };
        pipeline::reconcile(self, &spec, &record).await?;
        match authority::next(&record) {
            Next::Finished(state) => Ok(Step::Finished(state)),
            Next::Start { task, key } => {
                let inputs = pipeline::inputs(&spec, &task);
                self.commit_event(
                    id,
                    &record,
                    seq,
                    &Event::Start {
                        task: task.clone(),
                        inputs,
                    },
                    &[],
                )
                .await?;
                self.settled.claimed(&key);
                Ok(Step::Claimed { task, key })
            }
            Next::Continue { key, status } => {
                pipeline::advance(self, &spec, &record, seq, &key, &status).await
            }
        }
    }

    /// Ticks until the mission finishes, reporting every step, as the mission's only runner:
    /// it takes the mission lease first (another live runner: [`OrchestratorError::Leased`]
    /// before anything runs; a runner on this host that died: taken over at once), renews it
    /// while it works, appends every event under its fencing token, and releases it at the end.
    pub async fn run(
        &self,
        id: &str,
        progress: &mut (dyn FnMut(&Step) + Send),
    ) -> Result<MissionState, OrchestratorError> {
        self.drive(id, None, progress).await
    }

    /// [`Orchestrator::run`], or with `cancel` its [`Orchestrator::cancel`].
    pub(crate) async fn drive(
        &self,
        id: &str,
        cancel: Option<&str>,
        progress: &mut (dyn FnMut(&Step) + Send),
    ) -> Result<MissionState, OrchestratorError> {
        // Another owner's mission is refused before its lease is touched (its spec and record
        // are read once the lease is held).
        self.owned(id).await?;
        let me = this_runner();
        let fence = match self
            .store
            .mission_lease_acquire(id, &me, LEASE_TTL, None)
            .await?
        {
            Ok(fence) => fence,
            Err(held) if runner_is_dead(&held.holder) => {
                self.store
                    .mission_lease_acquire(id, &me, LEASE_TTL, Some(&held.holder))
                    .await??
            }
            Err(held) => return Err(held.into()),
        };
        self.lease
            .0
            .store(fence, std::sync::atomic::Ordering::SeqCst);
        let keep = async {
            loop {
                tokio::time::sleep(LEASE_TTL / 3).await;
                if !self.store.mission_lease_renew(id, fence, LEASE_TTL).await? {
                    return Err(OrchestratorError::LeaseLost(id.to_owned()));
                }
            }
        };
        let work = async {
            // Evidence a crash left unpublished (a rejected attempt's bundle) goes first.
            let (spec, mut record, mut seq) = self.load(id).await?;
            // A cancelled mission is cancelled again as a no-op: the ticks below finish a
            // teardown a crash cut short.
            match (cancel, &record.state) {
                (None, _) | (Some(_), MissionState::Cancelled { .. }) => {}
                (Some(reason), MissionState::Running) => {
                    let event = Event::Cancel {
                        reason: reason.to_owned(),
                    };
                    (record, seq) = self.commit_event(id, &record, seq, &event, &[]).await?;
                }
                (Some(_), state) => {
                    return Err(OrchestratorError::Finished {
                        mission: id.to_owned(),
                        state: state_name(state),
                    })
                }
            }
            // Publication appends no event: the first tick starts from this state.
            let spec = std::sync::Arc::new(spec);
            self.last_stored
                .loaded(id, self.lease.fence(), &spec, &record, seq);
            publication::republish_rejected(self, &spec, &record).await;
            self.run_ticks(id, progress).await
        };
        let outcome = tokio::select! {
            done = work => done,
            lost = keep => lost,
        };
        if let Err(stop) = &outcome {
            self.note_stop(id, fence, stop).await;
        }
        self.lease.0.store(0, std::sync::atomic::Ordering::SeqCst);
        self.last_stored.forget();
        let released = self.store.mission_lease_release(id, fence).await;
        let state = outcome?;
        released?;
        Ok(state)
    }

    /// Why a run stopped with its attempt in progress, as a fact of that attempt (kind
    /// `run_stopped`; no event: it is no verdict), so `mission status` can say so after the
    /// run's own output is gone. Best effort: the stop is reported to the caller regardless.
    async fn note_stop(&self, id: &str, fence: i64, stop: &OrchestratorError) {
        let (attempt, detail) = match stop {
            OrchestratorError::BeforeAgent(stopped) => (
                &stopped.attempt,
                serde_json::json!({ "stop": "before_agent", "reason": stopped.reason }),
            ),
            OrchestratorError::Interrupted(stopped) => (
                &stopped.attempt,
                serde_json::json!({
                    "stop": "interrupted",
                    "reason": format!("{}: {}", stopped.doing, stopped.source),
                    "error_kind": stopped.source.kind().as_str(),
                }),
            ),
            _ => return,
        };
        // The reason may quote the sandbox's own words: masked as every durable byte is, or
        // not kept when the mission's secrets cannot be known.
        let Ok((spec, _, _)) = self.load(id).await else {
            return;
        };
        let mut bytes = detail.to_string().into_bytes();
        publication::redactor(self, &spec).redact(&mut bytes);
        let detail = String::from_utf8_lossy(&bytes);
        // A store that cannot take it fails the next command too; the caller has the stop.
        let _ = self
            .store
            .attempt_fact_add(id, fence, attempt, "run_stopped", &detail)
            .await;
    }

    async fn run_ticks(
        &self,
        id: &str,
        progress: &mut (dyn FnMut(&Step) + Send),
    ) -> Result<MissionState, OrchestratorError> {
        loop {
            let step = self.tick(id).await?;
            progress(&step);
            if let Step::Finished(state) = step {
                return Ok(state);
            }
        }
    }
}
