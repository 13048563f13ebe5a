//! [`LocalProvider`]: the provider machinery shared by local adapters whose sandboxes are a
//! workspace directory on this machine (`host`, `bwrap`). A [`Launcher`] decides how a command
//! is started (directly, or inside bubblewrap); everything else — metadata, confined files,
//! content-addressed snapshots, fork, listing, process-group exec, destroy — lives here once.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use berth_contract::{
    CanonicalState, Command, CreateRequest, Created, DestroyOutcome, ErrorKind, ExecOutput,
    ExecRequest, ExecSummary, ExitStatus, FileEntry, Files, Fork, LabelFilter, Listed, Listing,
    NativeId, NetworkMode, Observation, OutputSink, Provider, ProviderError, Result, SnapshotRef,
    Snapshots, StreamingExec,
};

use crate::classify::io_error;
use crate::layout::{self, Layout, SandboxMeta, SandboxPhase};
use crate::{archive, confine, process, PROVIDER_ID};

mod contract;

/// What a launcher needs to start one command.
#[derive(Debug)]
pub struct LaunchContext<'a> {
    /// Berth's sandbox name.
    pub sandbox: &'a str,
    /// The workspace directory on the host.
    pub workspace: &'a Path,
    /// The working directory as the command sees it.
    pub cwd_in_sandbox: &'a str,
    /// What to run.
    pub command: &'a Command,
    /// The sandbox's network mode.
    pub network: NetworkMode,
    /// The command runs on a terminal Berth allocated for `berth ssh` (its controlling
    /// terminal): a launcher must not start a session of its own around it.
    pub terminal: bool,
}

/// How a local adapter starts commands.
pub trait Launcher: Send + Sync + fmt::Debug + 'static {
    /// The provider id.
    fn id(&self) -> &'static str;

    /// Where the workspace appears inside the sandbox (`/workspace` for bwrap); `None` when
    /// commands see the host path.
    fn workspace_alias(&self) -> Option<&'static str>;

    /// The program and arguments to spawn. The runner then clears the environment, sets the
    /// documented variables, pipes stdout/stderr and puts the process in a new group.
    fn command(&self, ctx: &LaunchContext<'_>) -> Result<tokio::process::Command>;

    /// The unprivileged (uid, gid) the sandbox's processes run as when they must not run as
    /// Berth's own user (bwrap when Berth is root): the workspace and everything the file API
    /// writes into it belong to them. `None`: Berth's own user.
    fn workspace_owner(&self) -> Option<(u32, u32)> {
        None
    }

    /// Refuses a network mode this launcher cannot give a sandbox (checked at create).
    fn check_network(&self, _network: NetworkMode) -> Result<()> {
        Ok(())
    }

    /// Whether this launcher can run a command on a terminal (`berth ssh`) and reach the
    /// sandbox's loopback ports (`berth port`).
    fn interactive(&self) -> bool {
        false
    }

    /// The binary with the `__pty` helper mode, when the launcher keeps one of its own (the
    /// local config's reaper is used first).
    fn terminal_helper(&self) -> Option<&Path> {
        None
    }

    /// How `argv` runs on a terminal inside the sandbox (a launcher whose own process would
    /// share the terminal's foreground group wraps the command so Ctrl-C reaches only it).
    fn terminal_argv(&self, argv: Vec<String>) -> Vec<String> {
        argv
    }

    /// Whether the sandbox's loopback is this machine's (`host`, and bwrap with network
    /// `host`); otherwise every command has a network namespace of its own that ends with it,
    /// and no port of the sandbox can be listening for a later connection.
    fn shares_host_loopback(&self, network: NetworkMode) -> bool {
        network == NetworkMode::Host
    }

    /// Turns a finished process into the command's result. Launchers that wrap the command
    /// (bwrap) use it to tell their own start-up failures from the command's exit.
    fn interpret(&self, finished: process::Finished) -> Result<process::Finished> {
        Ok(finished)
    }
}

/// Tunables of a local provider.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// How long a timed-out process group gets between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// A program that runs commands under the per-exec reaper (`PROGRAM __reap ARGV…`; see
    /// `berth_supervisor::reaper`): with it, nothing a command starts outlives the exec, even
    /// after `setsid`, and a caller that dies takes its command's whole tree with it. Without
    /// it, only the command's process group is killed.
    pub reaper: Option<PathBuf>,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            kill_grace: Duration::from_millis(500),
            reaper: None,
        }
    }
}

/// A local provider, rooted at a state directory.
#[derive(Debug, Clone)]
pub struct LocalProvider<L: Launcher> {
    layout: Layout,
    config: LocalConfig,
    launcher: L,
}

impl<L: Launcher> LocalProvider<L> {
    /// A provider keeping its sandboxes and snapshots under `state_dir`.
    pub fn new(state_dir: impl Into<PathBuf>, config: LocalConfig, launcher: L) -> Result<Self> {
        let layout = Layout::new(state_dir.into());
        layout
            .ensure()
            .map_err(|e| io_error("create state dir", e).with_provider(launcher.id()))?;
        Ok(LocalProvider {
            layout,
            config,
            launcher,
        })
    }

    /// The workspace directory of a sandbox on the host (for tests and diagnostics).
    pub fn workspace_dir(&self, id: &NativeId) -> Result<PathBuf> {
        Ok(self
            .layout
            .workspace(&layout::checked_name(&id.0).map_err(|e| self.own(e))?))
    }

    pub(crate) fn config(&self) -> &LocalConfig {
        &self.config
    }

    /// Records a command about to start in the sandbox ([`Layout::command_started`]).
    pub(crate) fn command_started(&self, id: &NativeId) -> Result<layout::CommandMark> {
        self.layout.command_started(&layout::checked_name(&id.0)?)
    }

    /// The name, host-side workspace and network of a ready sandbox.
    pub(crate) fn ready_named(&self, id: &NativeId) -> Result<(String, PathBuf, NetworkMode)> {
        let meta = self.ready(id)?;
        let workspace = self.layout.workspace(&meta.name);
        Ok((meta.name.to_string(), workspace, meta.network))
    }

    pub(crate) fn launcher(&self) -> &L {
        &self.launcher
    }

    /// Where the workspace appears to commands (`HOME`).
    pub(crate) fn home_in_sandbox(&self, workspace: &Path) -> String {
        match self.launcher.workspace_alias() {
            Some(alias) => alias.to_owned(),
            None => workspace.to_string_lossy().into_owned(),
        }
    }

    /// Errors from the shared machinery carry a placeholder id; name this provider instead.
    pub(crate) fn own(&self, err: ProviderError) -> ProviderError {
        err.with_provider(self.launcher.id())
    }

    /// Maps a path as the sandbox sees it to one relative to the workspace.
    fn sandbox_path<'p>(&self, path: &'p str) -> &'p str {
        match self.launcher.workspace_alias() {
            Some(alias) => match path.strip_prefix(alias) {
                Some("") => ".",
                Some(rest) if rest.starts_with('/') => rest.trim_start_matches('/'),
                _ => path,
            },
            None => path,
        }
    }

    fn ready(&self, id: &NativeId) -> Result<SandboxMeta> {
        let name = layout::checked_name(&id.0)?;
        match self.layout.read_meta(&name)? {
            Some(meta) if meta.phase == SandboxPhase::Ready => Ok(meta),
            Some(meta) => Err(ProviderError::new(
                ErrorKind::Conflict,
                PROVIDER_ID,
                format!("sandbox `{name}` is {}, not ready", meta.phase.as_str()),
            )),
            None => Err(not_found(&name)),
        }
    }

    fn ready_workspace(&self, id: &NativeId) -> Result<PathBuf> {
        let meta = self.ready(id)?;
        Ok(self.layout.workspace(&meta.name))
    }

    async fn run(
        &self,
        id: &NativeId,
        req: &ExecRequest,
        sink: process::Sink<'_>,
    ) -> Result<process::Finished> {
        // Refused before anything is recorded or built: std would swap an argument holding a
        // NUL for a placeholder and run that.
        berth_contract::check_command(&req.command)
            .and_then(|()| berth_contract::check_env(&req.env))
            .map_err(|m| ProviderError::new(ErrorKind::InvalidRequest, PROVIDER_ID, m))?;
        // Recorded before the readiness check: a destroy that has already renamed the sandbox
        // away (and so found no running command) makes that check fail, and one that renames it
        // after this finds the record.
        let mark = self.command_started(id);
        let meta = self.ready(id)?;
        let mark = mark?;
        let workspace = self.layout.workspace(&meta.name);
        let (cwd, relative) = match &req.cwd {
            None => (workspace.clone(), String::new()),
            Some(path) => {
                let relative = self.sandbox_path(path);
                let inside = confine::Workspace::open(&workspace)?.directory(relative)?;
                (
                    workspace.join(&inside),
                    inside.to_string_lossy().into_owned(),
                )
            }
        };
        let home = match self.launcher.workspace_alias() {
            Some(alias) => alias.to_owned(),
            None => workspace.to_string_lossy().into_owned(),
        };
        let cwd_in_sandbox = match self.launcher.workspace_alias() {
            Some(alias) if relative.is_empty() => alias.to_owned(),
            Some(alias) => format!("{alias}/{relative}"),
            None => cwd.to_string_lossy().into_owned(),
        };
        let command = self.launcher.command(&LaunchContext {
            sandbox: &meta.name,
            workspace: &workspace,
            cwd_in_sandbox: &cwd_in_sandbox,
            command: &req.command,
            network: meta.network,
            terminal: false,
        })?;
        let finished = process::run(
            command,
            process::Spec {
                sandbox: &meta.name,
                home: &home,
                cwd: &cwd,
                req,
                kill_grace: self.config.kill_grace,
                reaper: self.config.reaper.as_deref(),
            },
            sink,
        )
        .await;
        if finished.as_ref().is_ok_and(|f| f.contained) {
            mark.contained();
        }
        // A destroy that ran meanwhile killed the command and its reaper: say so, rather than
        // report a reaper that vanished as if it were a fault of Berth's.
        let destroyed = || !self.layout.sandbox(&meta.name).exists();
        let finished = match finished {
            Err(err) if destroyed() => {
                return Err(ProviderError::new(
                    ErrorKind::NotFound,
                    PROVIDER_ID,
                    format!(
                        "sandbox `{}` was destroyed while the command was starting ({})",
                        meta.name,
                        err.message()
                    ),
                ))
            }
            Ok(mut finished) => {
                if let ExitStatus::Unknown { reason } = &finished.status {
                    if destroyed() {
                        finished.status = ExitStatus::Unknown {
                            reason: format!(
                                "sandbox `{}` was destroyed while the command ran: {reason}",
                                meta.name
                            ),
                        };
                    }
                }
                finished
            }
            Err(err) => return Err(err),
        };
        self.launcher.interpret(finished)
    }

    /// Creates the sandbox directory, optionally filled from an archive.
    async fn create_from(
        &self,
        req: &CreateRequest,
        archive: Option<std::fs::File>,
    ) -> Result<Created> {
        let name = layout::checked_name(&req.name.0)?;
        self.launcher.check_network(req.network)?;
        // Limits this provider cannot enforce are refused, never silently dropped.
        if req.resources != berth_contract::Resources::default() {
            return Err(ProviderError::new(
                ErrorKind::Unsupported,
                PROVIDER_ID,
                "resource limits (cpus, memory, pids) are not enforced by this provider; use \
                 docker, or leave them unset",
            ));
        }
        let layout = self.layout.clone();
        let labels = req.labels.to_map(&name);
        let extra = req.extra_labels.clone();
        let network = req.network;
        let owner = self.launcher.workspace_owner();
        blocking(move || {
            layout.create_sandbox(
                &name,
                labels,
                extra,
                network,
                owner,
                |workspace| match archive {
                    Some(archive) => archive::unpack(archive, workspace, owner),
                    None => Ok(()),
                },
            )
        })
        .await?;
        Ok(Created {
            native_id: NativeId(req.name.0.clone()),
            raw_state: SandboxPhase::Ready.as_str().to_owned(),
        })
    }

    async fn observe_inner(&self, id: &NativeId) -> Result<Observation> {
        let name = layout::checked_name(&id.0)?;
        if !self.layout.sandbox(&name).exists() {
            return Ok(Observation::Absent);
        }
        Ok(match self.layout.read_meta(&name) {
            Ok(Some(meta)) => observation(&meta),
            // The directory exists but its metadata is missing or unreadable (a crash during
            // create or destroy): present, state unknown, raw reason kept.
            Ok(None) => Observation::Present {
                state: CanonicalState::Unknown,
                raw: "no-metadata".into(),
                soft_deleted: false,
                labels: Default::default(),
            },
            Err(err) => Observation::Present {
                state: CanonicalState::Unknown,
                raw: format!("metadata-unreadable: {}", err.message()),
                soft_deleted: false,
                labels: Default::default(),
            },
        })
    }

    async fn destroy_inner(&self, id: &NativeId) -> Result<DestroyOutcome> {
        let name = layout::checked_name(&id.0)?;
        let already_absent = !self.layout.sandbox(&name).exists();
        let layout = self.layout.clone();
        // Also what an interrupted create or removal left under hidden names. A sandbox
        // without (readable) metadata is still destroyed.
        blocking(move || {
            layout.remove_sandbox(&name, |removed| {
                // Renamed away first, so no command can start in it any more; the process table
                // is searched only when one may have left something: one still running, or one
                // whose reaper never reported it contained.
                if Layout::may_have_processes(removed) {
                    process::kill_leftovers(&name, &Layout::workspace_in(removed));
                }
            })
        })
        .await?;
        if already_absent {
            return Ok(DestroyOutcome::VerifiedGone {
                already_absent: true,
            });
        }
        match self.observe_inner(id).await? {
            Observation::Absent => Ok(DestroyOutcome::VerifiedGone {
                already_absent: false,
            }),
            Observation::Present { raw, .. } => Ok(DestroyOutcome::Accepted { raw_state: raw }),
        }
    }

    async fn read_inner(&self, id: &NativeId, path: &str) -> Result<Vec<u8>> {
        let workspace = self.ready_workspace(id)?;
        let path = self.sandbox_path(path).to_owned();
        blocking(move || confine::Workspace::open(&workspace)?.read(&path)).await
    }

    async fn read_to_inner(
        &self,
        id: &NativeId,
        path: &str,
        sink: berth_contract::FileSink,
    ) -> Result<(berth_contract::FileSink, u64)> {
        let workspace = self.ready_workspace(id)?;
        let path = self.sandbox_path(path).to_owned();
        blocking(move || confine::Workspace::open(&workspace)?.read_to(&path, sink)).await
    }

    async fn write_inner(&self, id: &NativeId, path: &str, bytes: &[u8]) -> Result<()> {
        let workspace = self.ready_workspace(id)?;
        let path = self.sandbox_path(path).to_owned();
        let bytes = bytes.to_vec();
        let owner = self.launcher.workspace_owner();
        blocking(move || {
            confine::Workspace::open(&workspace)?
                .owned_by(owner)
                .write(&path, &bytes)
        })
        .await
    }

    async fn write_from_inner(
        &self,
        id: &NativeId,
        path: &str,
        source: berth_contract::FileSource,
    ) -> Result<()> {
        let workspace = self.ready_workspace(id)?;
        let path = self.sandbox_path(path).to_owned();
        let owner = self.launcher.workspace_owner();
        let berth_contract::FileSource { mut reader, len } = source;
        blocking(move || {
            confine::Workspace::open(&workspace)?
                .owned_by(owner)
                .write_from(&path, &mut reader, len)
        })
        .await
    }

    async fn list_inner(&self, id: &NativeId, path: &str) -> Result<Vec<FileEntry>> {
        let workspace = self.ready_workspace(id)?;
        let path = self.sandbox_path(path).to_owned();
        blocking(move || confine::Workspace::open(&workspace)?.list(&path)).await
    }

    async fn snapshot_inner(&self, id: &NativeId) -> Result<SnapshotRef> {
        let workspace = self.ready_workspace(id)?;
        let store = self.layout.snapshots();
        blocking(move || archive::snapshot(&workspace, &store)).await
    }

    async fn restore_inner(&self, snapshot: &SnapshotRef, req: &CreateRequest) -> Result<Created> {
        let store = self.layout.snapshots();
        let handle = snapshot.handle.clone();
        let file = blocking(move || {
            let path = archive::verified_path(&store, &handle)?;
            std::fs::File::open(path).map_err(|e| io_error("open archive", e))
        })
        .await?;
        self.create_from(req, Some(file)).await
    }

    async fn delete_snapshot_inner(&self, snapshot: &SnapshotRef) -> Result<()> {
        let path = archive::path_for(&self.layout.snapshots(), &snapshot.handle)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(io_error("delete snapshot", err)),
        }
    }

    async fn fork_inner(&self, id: &NativeId, req: &CreateRequest) -> Result<Created> {
        let workspace = self.ready_workspace(id)?;
        let scratch = self.layout.scratch();
        // A private archive, not a stored snapshot: fork leaves no snapshot behind.
        let temp = blocking(move || archive::to_temp_file(&workspace, &scratch)).await?;
        self.create_from(req, Some(temp)).await
    }

    async fn list_sandboxes(&self, filter: &LabelFilter) -> Result<Vec<Listed>> {
        let layout = self.layout.clone();
        let metas = blocking(move || layout.all_meta()).await?;
        Ok(metas
            .into_iter()
            .filter(|meta| filter.matches(&meta.labels))
            .map(|meta| Listed {
                native_id: NativeId(meta.name.clone()),
                observation: observation(&meta),
            })
            .collect())
    }
}

fn observation(meta: &SandboxMeta) -> Observation {
    let state = match meta.phase {
        SandboxPhase::Creating => CanonicalState::Creating,
        SandboxPhase::Ready => CanonicalState::Running,
        // Removal started but did not finish: not gone, and nothing canonical fits.
        SandboxPhase::Destroying => CanonicalState::Unknown,
    };
    Observation::Present {
        state,
        raw: meta.phase.as_str().to_owned(),
        soft_deleted: false,
        labels: meta.labels.clone(),
    }
}

fn not_found(name: &str) -> ProviderError {
    ProviderError::new(
        ErrorKind::NotFound,
        PROVIDER_ID,
        format!("no sandbox `{name}`"),
    )
}

fn join_error(err: tokio::task::JoinError) -> ProviderError {
    ProviderError::new(ErrorKind::Unknown, PROVIDER_ID, "background task failed").with_source(err)
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(join_error)?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(phase: SandboxPhase) -> SandboxMeta {
        SandboxMeta {
            schema_version: 1,
            name: "bx-1".into(),
            phase,
            labels: [("berth.owner".to_owned(), "alice".to_owned())].into(),
            extra_labels: Default::default(),
            network: NetworkMode::None,
        }
    }

    #[test]
    fn phases_map_to_canonical_states_with_raw_kept() {
        let cases = [
            (SandboxPhase::Creating, CanonicalState::Creating, "creating"),
            (SandboxPhase::Ready, CanonicalState::Running, "ready"),
            // Half-destroyed is not gone and not running: unknown, raw kept.
            (
                SandboxPhase::Destroying,
                CanonicalState::Unknown,
                "destroying",
            ),
        ];
        for (phase, canonical, raw_name) in cases {
            match observation(&meta(phase)) {
                Observation::Present {
                    state,
                    raw,
                    soft_deleted,
                    labels,
                } => {
                    assert_eq!(state, canonical);
                    assert_eq!(raw, raw_name);
                    assert!(!soft_deleted);
                    assert_eq!(labels.get("berth.owner").unwrap(), "alice");
                }
                Observation::Absent => panic!("present sandbox observed absent"),
            }
        }
    }
}
