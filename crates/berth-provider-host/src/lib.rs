//! The `host` provider: each sandbox is a workspace directory under Berth's state dir, and each
//! exec is a host process group in it. It isolates nothing, and its manifest says so.
//!
//! Module map:
//! - [`HostProvider`] (this file) — the contract: create, observe, exec, destroy and the
//!   capability groups it implements (streaming exec, files, snapshots, fork, listing).
//! - `layout` — where things live under the state dir, and sandbox metadata.
//! - `confine` — resolving sandbox paths without escaping the workspace.
//! - `process` — process-group exec with timeouts, output caps and leftover cleanup.
//! - `archive` — deterministic, content-addressed workspace archives.
//! - `classify` — the one place host I/O errors become [`ErrorKind`]s.

mod archive;
mod classify;
mod confine;
mod layout;
mod process;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use berth_contract::{
    CanonicalState, CreateRequest, Created, DestroyOutcome, ErrorKind, ExecOutput, ExecRequest,
    ExecSummary, FileEntry, FileKind, Files, Fork, LabelFilter, Listed, Listing, NativeId,
    Observation, OutputSink, Provider, ProviderError, Result, SnapshotRef, Snapshots,
    StreamingExec,
};

use crate::classify::io_error;
use crate::layout::{Layout, SandboxMeta, SandboxPhase};

/// The provider id.
pub const PROVIDER_ID: &str = "host";

/// Tunables of the host provider.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// How long a timed-out process group gets between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            kill_grace: Duration::from_millis(500),
        }
    }
}

/// The host provider, rooted at a state directory.
#[derive(Debug, Clone)]
pub struct HostProvider {
    layout: Layout,
    config: HostConfig,
}

impl HostProvider {
    /// A provider keeping its sandboxes and snapshots under `state_dir`.
    pub fn new(state_dir: impl Into<PathBuf>, config: HostConfig) -> Result<Self> {
        let layout = Layout::new(state_dir.into());
        layout
            .ensure()
            .map_err(|e| io_error("create state dir", e))?;
        Ok(HostProvider { layout, config })
    }

    /// The workspace directory of a sandbox (for tests and diagnostics).
    pub fn workspace_dir(&self, id: &NativeId) -> Result<PathBuf> {
        Ok(self.layout.workspace(&layout::checked_name(&id.0)?))
    }

    fn ready_workspace(&self, id: &NativeId) -> Result<PathBuf> {
        let name = layout::checked_name(&id.0)?;
        match self.layout.read_meta(&name)? {
            Some(meta) if meta.phase == SandboxPhase::Ready => Ok(self.layout.workspace(&name)),
            Some(meta) => Err(ProviderError::new(
                ErrorKind::Conflict,
                PROVIDER_ID,
                format!("sandbox `{name}` is {}, not ready", meta.phase.as_str()),
            )),
            None => Err(not_found(&name)),
        }
    }

    async fn run(
        &self,
        id: &NativeId,
        req: &ExecRequest,
        sink: process::Sink<'_>,
    ) -> Result<process::Finished> {
        let workspace = self.ready_workspace(id)?;
        let cwd = match &req.cwd {
            None => workspace.clone(),
            Some(path) => {
                let dir = confine::resolve(&workspace, path, confine::Mode::Existing)?;
                if !dir.is_dir() {
                    return Err(invalid(format!("cwd `{path}` is not a directory")));
                }
                dir
            }
        };
        process::run(
            process::Spec {
                sandbox: &id.0,
                workspace: &workspace,
                cwd: &cwd,
                req,
                kill_grace: self.config.kill_grace,
            },
            sink,
        )
        .await
    }

    /// Creates the sandbox directory, optionally filled from an archive.
    async fn create_from(&self, req: &CreateRequest, archive: Option<PathBuf>) -> Result<Created> {
        let name = layout::checked_name(&req.name.0)?;
        let layout = self.layout.clone();
        let labels = req.labels.to_map(&name);
        let extra = req.extra_labels.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            layout.create_sandbox(&name, labels, extra)?;
            if let Some(archive) = archive {
                let unpacked = archive::unpack(&archive, &layout.workspace(&name));
                if let Err(err) = unpacked {
                    // Leave nothing half-made behind: remove, then report the unpack error.
                    let _ = layout.remove_sandbox(&name);
                    return Err(err);
                }
            }
            layout.set_phase(&name, SandboxPhase::Ready)
        })
        .await
        .map_err(join_error)??;
        Ok(Created {
            native_id: NativeId(req.name.0.clone()),
            raw_state: SandboxPhase::Ready.as_str().to_owned(),
        })
    }
}

#[async_trait]
impl Provider for HostProvider {
    fn id(&self) -> &str {
        PROVIDER_ID
    }

    async fn create(&self, req: &CreateRequest) -> Result<Created> {
        self.create_from(req, None).await
    }

    async fn observe(&self, id: &NativeId) -> Result<Observation> {
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
                raw: format!("metadata-unreadable: {err}"),
                soft_deleted: false,
                labels: Default::default(),
            },
        })
    }

    async fn exec(&self, id: &NativeId, req: &ExecRequest) -> Result<ExecOutput> {
        let finished = self
            .run(id, req, process::Sink::Capture(req.max_output_bytes))
            .await?;
        Ok(finished.into_output())
    }

    async fn destroy(&self, id: &NativeId) -> Result<DestroyOutcome> {
        let name = layout::checked_name(&id.0)?;
        if !self.layout.sandbox(&name).exists() {
            return Ok(DestroyOutcome::VerifiedGone {
                already_absent: true,
            });
        }
        let layout = self.layout.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            // Best effort: a sandbox without metadata is still destroyed.
            let _ = layout.set_phase(&name, SandboxPhase::Destroying);
            process::kill_leftovers(&name, &layout.workspace(&name));
            layout.remove_sandbox(&name)
        })
        .await
        .map_err(join_error)??;
        match self.observe(id).await? {
            Observation::Absent => Ok(DestroyOutcome::VerifiedGone {
                already_absent: false,
            }),
            Observation::Present { raw, .. } => Ok(DestroyOutcome::Accepted { raw_state: raw }),
        }
    }

    fn streaming(&self) -> Option<&dyn StreamingExec> {
        Some(self)
    }
    fn files(&self) -> Option<&dyn Files> {
        Some(self)
    }
    fn snapshots(&self) -> Option<&dyn Snapshots> {
        Some(self)
    }
    fn fork(&self) -> Option<&dyn Fork> {
        Some(self)
    }
    fn listing(&self) -> Option<&dyn Listing> {
        Some(self)
    }
}

#[async_trait]
impl StreamingExec for HostProvider {
    async fn exec_streaming(
        &self,
        id: &NativeId,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<ExecSummary> {
        let finished = self.run(id, req, process::Sink::Stream(sink)).await?;
        Ok(finished.into_summary())
    }
}

#[async_trait]
impl Files for HostProvider {
    async fn read(&self, id: &NativeId, path: &str) -> Result<Vec<u8>> {
        let workspace = self.ready_workspace(id)?;
        let path = path.to_owned();
        blocking(move || {
            let file = confine::resolve(&workspace, &path, confine::Mode::Existing)?;
            if file.is_dir() {
                return Err(invalid(format!("`{path}` is a directory, not a file")));
            }
            std::fs::read(&file).map_err(|e| io_error(&format!("read `{path}`"), e))
        })
        .await
    }

    async fn write(&self, id: &NativeId, path: &str, bytes: &[u8]) -> Result<()> {
        let workspace = self.ready_workspace(id)?;
        let path = path.to_owned();
        let bytes = bytes.to_vec();
        blocking(move || {
            let file = confine::resolve(&workspace, &path, confine::Mode::CreateParents)?;
            if file == workspace || file.is_dir() {
                return Err(invalid(format!("`{path}` is a directory, not a file")));
            }
            std::fs::write(&file, &bytes).map_err(|e| io_error(&format!("write `{path}`"), e))
        })
        .await
    }

    async fn list(&self, id: &NativeId, path: &str) -> Result<Vec<FileEntry>> {
        let workspace = self.ready_workspace(id)?;
        let path = path.to_owned();
        blocking(move || {
            let dir = confine::resolve(&workspace, &path, confine::Mode::Existing)?;
            let listing_error = |e| io_error(&format!("list `{path}`"), e);
            let mut entries = Vec::new();
            for entry in std::fs::read_dir(&dir).map_err(listing_error)? {
                let entry = entry.map_err(listing_error)?;
                let meta = entry.metadata().map_err(listing_error)?;
                let kind = if meta.is_symlink() {
                    FileKind::Symlink
                } else if meta.is_dir() {
                    FileKind::Dir
                } else if meta.is_file() {
                    FileKind::File
                } else {
                    FileKind::Other
                };
                entries.push(FileEntry {
                    name: entry.file_name().to_string_lossy().into_owned(),
                    kind,
                    size: if kind == FileKind::File {
                        meta.len()
                    } else {
                        0
                    },
                });
            }
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(entries)
        })
        .await
    }
}

#[async_trait]
impl Snapshots for HostProvider {
    async fn snapshot(&self, id: &NativeId) -> Result<SnapshotRef> {
        let workspace = self.ready_workspace(id)?;
        let store = self.layout.snapshots();
        blocking(move || archive::snapshot(&workspace, &store)).await
    }

    async fn restore(&self, snapshot: &SnapshotRef, req: &CreateRequest) -> Result<Created> {
        let store = self.layout.snapshots();
        let handle = snapshot.handle.clone();
        let path = blocking(move || archive::verified_path(&store, &handle)).await?;
        self.create_from(req, Some(path)).await
    }

    async fn delete_snapshot(&self, snapshot: &SnapshotRef) -> Result<()> {
        let path = archive::path_for(&self.layout.snapshots(), &snapshot.handle)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(io_error("delete snapshot", err)),
        }
    }
}

#[async_trait]
impl Fork for HostProvider {
    async fn fork(&self, id: &NativeId, req: &CreateRequest) -> Result<Created> {
        let workspace = self.ready_workspace(id)?;
        let scratch = self.layout.scratch();
        // A private archive, not a stored snapshot: fork leaves no snapshot behind.
        let temp = blocking(move || archive::to_temp_file(&workspace, &scratch)).await?;
        self.create_from(req, Some(temp.path().to_owned())).await
    }
}

#[async_trait]
impl Listing for HostProvider {
    async fn list(&self, filter: &LabelFilter) -> Result<Vec<Listed>> {
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

fn invalid(message: String) -> ProviderError {
    ProviderError::new(ErrorKind::InvalidRequest, PROVIDER_ID, message)
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
