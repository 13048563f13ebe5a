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
mod capture;
pub mod follow;
mod hostgit;
pub mod logins;
mod memory;
mod pipeline;
pub mod publication;
mod steps;
mod transport;

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
}

/// Reads a mission file: a regular file of at most [`berth_mission::file::MAX_FILE_BYTES`]
/// (a FIFO, device or directory is refused without blocking).
fn read_mission_file(path: &Path) -> Result<String, OrchestratorError> {
    let shown = path.display();
    let fail = |why: String| OrchestratorError::Unreadable(format!("cannot read {shown}: {why}"));
    let bytes = berth_files::read_regular(path, berth_mission::file::MAX_FILE_BYTES).map_err(
        |e| match e {
            berth_files::ReadError::TooLarge { max } => fail(format!(
                "larger than {max} bytes, the limit for mission files"
            )),
            other => fail(other.to_string()),
        },
    )?;
    String::from_utf8(bytes).map_err(|_| fail("not UTF-8 text".into()))
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

/// The repository directory a mission file names, resolved (symlinks followed) and — unless
/// `allow_outside` — required to be the mission file's directory or beneath it.
fn confined_path(
    file_path: &Path,
    path: &str,
    allow_outside: bool,
) -> Result<PathBuf, OrchestratorError> {
    let resolved = confined(file_path, path, allow_outside, "repository.path")?;
    if !resolved.is_dir() {
        return Err(OrchestratorError::Repository(format!(
            "{} is not a directory",
            resolved.display()
        )));
    }
    Ok(resolved)
}

/// A path a mission file names (`field`), resolved (symlinks followed) and — unless
/// `allow_outside` — required to be the mission file's directory or beneath it.
fn confined(
    file_path: &Path,
    path: &str,
    allow_outside: bool,
    field: &str,
) -> Result<PathBuf, OrchestratorError> {
    let base = file_path.parent().unwrap_or(Path::new("."));
    let base = if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base
    };
    let shown = |e: std::io::Error, what: &Path| {
        OrchestratorError::Repository(format!("cannot resolve {}: {e}", what.display()))
    };
    let joined = base.join(path);
    let resolved = joined.canonicalize().map_err(|e| shown(e, &joined))?;
    let root = base.canonicalize().map_err(|e| shown(e, base))?;
    if !allow_outside && !resolved.starts_with(&root) {
        return Err(OrchestratorError::Unreadable(format!(
            "{field} `{}` resolves to {}, outside the mission file's directory {}; \
             a mission reads only what it ships with unless you pass --allow-outside-path",
            path.escape_debug(),
            resolved.display(),
            root.display()
        )));
    }
    Ok(resolved)
}

fn new_mission_id(name: &str) -> String {
    let mut buf = [0u8; 4];
    getrandom::fill(&mut buf).expect("OS randomness");
    format!("ms-{name}-{}", hex::encode(buf))
}

fn state_name(state: &MissionState) -> &'static str {
    match state {
        MissionState::Running => "running",
        MissionState::Succeeded => "succeeded",
        MissionState::Failed { .. } => "failed",
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

    /// Registers a mission from its file: resolves the base commit, bundles the repository,
    /// and records the initial state. Nothing runs yet.
    ///
    /// Every field is checked (including that each provider exists in this build) before
    /// anything is written; a registration that fails leaves no directory behind.
    pub async fn create(&self, file_path: &Path) -> Result<String, OrchestratorError> {
        self.create_with(file_path, false).await
    }

    /// [`Orchestrator::create`], where `allow_outside` lets `repository.path` name a directory
    /// outside the mission file's own (by default it must resolve, symlinks followed, to the
    /// mission file's directory or beneath it: a mission file reads only what it ships with).
    pub async fn create_with(
        &self,
        file_path: &Path,
        allow_outside: bool,
    ) -> Result<String, OrchestratorError> {
        let text = read_mission_file(file_path)?;
        let file = berth_mission::file::parse(&file_path.display().to_string(), &text)?;
        for provider in std::iter::once(&file.sandbox.provider).chain(&file.sandbox.fallback) {
            if !self.registry.has_adapter(provider) {
                return Err(OrchestratorError::UnknownProvider(provider.clone()));
            }
        }
        let model_script = agents::register_check(&file, self.registry, self.home, |path| {
            let path = confined(file_path, path, allow_outside, "harness.gateway.script")?;
            read_mission_file(&path)
        })?;
        let id = new_mission_id(&file.name);
        let dir = self.mission_dir(&id);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                OrchestratorError::Repository(format!("cannot create {}: {e}", dir.display()))
            })?;
        let registered = self
            .register(file_path, file, model_script, &id, &dir, allow_outside)
            .await;
        if registered.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        registered
    }

    async fn register(
        &self,
        file_path: &Path,
        file: berth_mission::file::MissionFile,
        model_script: Option<String>,
        id: &str,
        dir: &Path,
        allow_outside: bool,
    ) -> Result<String, OrchestratorError> {
        let (id, dir) = (id.to_owned(), dir.to_owned());
        let mut source = match (&file.repository.path, &file.repository.url) {
            (Some(path), _) => confined_path(file_path, path, allow_outside)?,
            // A URL is cloned once, when the mission is registered; attempts never touch it.
            (None, Some(url)) => {
                if file.repository.base == "snapshot" {
                    return Err(OrchestratorError::Unsupported(
                        "base = \"snapshot\" with a git URL; name a commit, branch or tag".into(),
                    ));
                }
                let scheme = scheme_of(url).ok_or_else(|| {
                    OrchestratorError::Unsupported(format!(
                        "repository URL `{url}`: missions fetch over file://, https://, http://, \
                         ssh:// (or user@host:path) and git:// only"
                    ))
                })?;
                let clone = dir.join("clone");
                git_over(
                    &dir,
                    Transport::Scheme(scheme),
                    &[
                        "clone",
                        "--quiet",
                        "--mirror",
                        "--",
                        url,
                        &clone.to_string_lossy(),
                    ],
                )?;
                clone
            }
            (None, None) => unreachable!("validated"),
        };
        // `base = "snapshot"`: the directory's current files become the base commit of a fresh
        // repository (for plain directories and examples). Otherwise the path's repository is
        // mirrored into one Berth owns first: Berth's git never runs in a user's repository.
        if file.repository.base != "snapshot" && file.repository.path.is_some() {
            let mirror = dir.join("clone");
            git_over(
                &dir,
                Transport::Scheme("file"),
                &[
                    "clone",
                    "--quiet",
                    "--mirror",
                    "--no-local",
                    "--",
                    &source.to_string_lossy(),
                    &mirror.to_string_lossy(),
                ],
            )?;
            source = mirror;
        }
        if file.repository.base == "snapshot" {
            let copy = dir.join("source");
            copy_tree(&source, &copy).map_err(|e| {
                OrchestratorError::Repository(format!("cannot copy {}: {e}", source.display()))
            })?;
            git(&copy, &["init", "-q", "-b", "main"])?;
            git(&copy, &["add", "-A"])?;
            git(
                &copy,
                &[
                    "-c",
                    "user.name=berth",
                    "-c",
                    "user.email=berth@localhost",
                    "commit",
                    "-q",
                    "-m",
                    "berth: mission base",
                ],
            )?;
            source = copy;
        }
        let base = if file.repository.base == "snapshot" {
            "HEAD"
        } else {
            file.repository.base.as_str()
        };
        let base_commit = git(
            &source,
            &["rev-parse", "--verify", &format!("{base}^{{commit}}")],
        )?;
        // The base commit and its history, as the bundle's only ref (`HEAD`): a sandbox gets a
        // checkout of it, never the source's other branches, and a clone makes no branch of
        // its own (each one cost a staging about 4 ms). `source` is Berth's own repository.
        if base != "HEAD" {
            git(&source, &["update-ref", "--no-deref", "HEAD", &base_commit])?;
        }
        let base_bundle = dir.join("base.bundle");
        git(
            &source,
            &[
                "bundle",
                "create",
                "-q",
                &base_bundle.to_string_lossy(),
                "HEAD",
            ],
        )?;
        // The mission's own repository, where attempts are committed on the host.
        capture::work_repo(&dir, &base_bundle)?;
        let record = MissionRecord::new(
            &id,
            file.tasks
                .iter()
                .map(|t| (t.id.clone(), t.max_attempts, t.validator.evidence.clone()))
                .collect(),
        );
        let spec = MissionSpec {
            spec_version: SPEC_VERSION,
            file,
            base_commit,
            base_bundle,
            model_script,
        };
        self.store
            .mission_insert(
                &id,
                &spec.file.name,
                self.ledger.owner(),
                &serde_json::to_string(&spec).expect("spec serializes"),
                &serde_json::to_string(&record).expect("record serializes"),
                state_name(&record.state),
            )
            .await?;
        Ok(id)
    }

    /// Loads a mission: its spec, record and sequence number.
    pub async fn load(
        &self,
        id: &str,
    ) -> Result<(MissionSpec, MissionRecord, i64), OrchestratorError> {
        let row = self.store.mission_get(id).await?;
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
            Some(Event::Start { .. }) | None => String::new(),
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
            let (spec, record, seq) = self.load(id).await?;
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
        self.lease.0.store(0, std::sync::atomic::Ordering::SeqCst);
        self.last_stored.forget();
        let released = self.store.mission_lease_release(id, fence).await;
        let state = outcome?;
        released?;
        Ok(state)
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
