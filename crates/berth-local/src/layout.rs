//! Where the host provider keeps things, and sandbox metadata.
//!
//! ```text
//! <state>/sandboxes/<name>/sandbox.json   metadata (schema_version, labels, phase)
//! <state>/sandboxes/<name>/workspace/     the sandbox's files
//! <state>/snapshots/<sha256>.tar          content-addressed workspace archives
//! <state>/scratch/                        temporary archives (fork)
//! ```

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use berth_contract::{ErrorKind, NetworkMode, ProviderError, Result};
use serde::{Deserialize, Serialize};

use crate::classify::io_error;
use crate::PROVIDER_ID;

const META_SCHEMA_VERSION: u32 = 1;
const WORKSPACE_DIR: &str = "workspace";
const META_FILE: &str = "sandbox.json";
/// One file per command started in the sandbox that has not yet been proven to have left
/// nothing behind (see [`Layout::command_started`]).
const RUNNING_DIR: &str = "running";

/// Lifecycle phase recorded in metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SandboxPhase {
    Creating,
    Ready,
    Destroying,
}

impl SandboxPhase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SandboxPhase::Creating => "creating",
            SandboxPhase::Ready => "ready",
            SandboxPhase::Destroying => "destroying",
        }
    }
}

/// `sandbox.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SandboxMeta {
    pub(crate) schema_version: u32,
    pub(crate) name: String,
    pub(crate) phase: SandboxPhase,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) extra_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) network: NetworkMode,
}

#[derive(Debug, Clone)]
pub(crate) struct Layout {
    root: PathBuf,
}

/// Sandbox names become directory names: only `[A-Za-z0-9._-]`, no leading dot, so an id can
/// never name a path outside the sandboxes directory.
pub(crate) fn checked_name(name: &str) -> Result<String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(name.to_owned())
    } else {
        Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            PROVIDER_ID,
            format!("`{name}` is not a valid sandbox id (use letters, digits, `-`, `_`, `.`)"),
        ))
    }
}

impl Layout {
    pub(crate) fn new(root: PathBuf) -> Self {
        Layout { root }
    }

    pub(crate) fn ensure(&self) -> io::Result<()> {
        std::fs::create_dir_all(self.root.join("sandboxes"))?;
        std::fs::create_dir_all(self.snapshots())?;
        std::fs::create_dir_all(self.scratch())
    }

    pub(crate) fn sandbox(&self, name: &str) -> PathBuf {
        self.root.join("sandboxes").join(name)
    }

    pub(crate) fn workspace(&self, name: &str) -> PathBuf {
        Self::workspace_in(&self.sandbox(name))
    }

    /// The workspace of a sandbox directory (wherever it is now: named, or being removed).
    pub(crate) fn workspace_in(sandbox_dir: &Path) -> PathBuf {
        sandbox_dir.join(WORKSPACE_DIR)
    }

    pub(crate) fn snapshots(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    pub(crate) fn scratch(&self) -> PathBuf {
        self.root.join("scratch")
    }

    /// Where a sandbox is assembled before it gets its name: hidden, so listings skip it.
    pub(crate) fn staging(&self, name: &str) -> PathBuf {
        self.root
            .join("sandboxes")
            .join(format!(".creating-{name}"))
    }

    /// Makes the sandbox (failing with `Conflict` if the name is taken), ready. The directory
    /// is assembled under a hidden staging name — workspace, labelled metadata, then `fill`'s
    /// content (an archive unpacked into the workspace) — and only then renamed (without
    /// replacing) to its name, so a sandbox directory never exists without Berth's labels or
    /// with half its content, whenever the process dies. A staging directory left by a crash is
    /// removed by the next create or destroy of the name.
    pub(crate) fn create_sandbox(
        &self,
        name: &str,
        labels: BTreeMap<String, String>,
        extra_labels: BTreeMap<String, String>,
        network: NetworkMode,
        owner: Option<(u32, u32)>,
        fill: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<()> {
        let conflict = || {
            ProviderError::new(
                ErrorKind::Conflict,
                PROVIDER_ID,
                format!("a sandbox named `{name}` already exists"),
            )
        };
        if self.sandbox(name).exists() {
            return Err(conflict());
        }
        let staging = self.staging(name);
        force_remove_dir(&staging).map_err(|e| io_error("remove stale staging directory", e))?;
        std::fs::create_dir(&staging).map_err(|e| io_error("create sandbox directory", e))?;
        let assembled = (|| {
            let workspace = staging.join(WORKSPACE_DIR);
            std::fs::create_dir(&workspace)
                .map_err(|e| io_error("create workspace directory", e))?;
            std::fs::create_dir(staging.join(RUNNING_DIR))
                .map_err(|e| io_error("create sandbox directory", e))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&workspace, Some(uid), Some(gid))
                    .map_err(|e| io_error("give the workspace to the sandbox's user", e))?;
            }
            write_meta_in(
                &staging,
                &SandboxMeta {
                    schema_version: META_SCHEMA_VERSION,
                    name: name.to_owned(),
                    phase: SandboxPhase::Ready,
                    labels,
                    extra_labels,
                    network,
                },
            )?;
            fill(&workspace)?;
            match rustix::fs::renameat_with(
                rustix::fs::CWD,
                staging.as_path(),
                rustix::fs::CWD,
                self.sandbox(name).as_path(),
                rustix::fs::RenameFlags::NOREPLACE,
            ) {
                Ok(()) => Ok(()),
                Err(rustix::io::Errno::EXIST | rustix::io::Errno::NOTEMPTY) => Err(conflict()),
                Err(e) => Err(io_error("name the sandbox directory", e.into())),
            }
        })();
        if assembled.is_err() {
            let _ = force_remove_dir(&staging);
        }
        assembled
    }

    /// Records, before it starts, that a command is about to run in the sandbox: the file
    /// stays until [`CommandMark::contained`] proves nothing it started is left. Destroy
    /// searches the process table for leftovers only while such a file exists, or in a sandbox
    /// made before these files were kept (no `running/`: nothing is recorded, and destroy
    /// always searches).
    pub(crate) fn command_started(&self, name: &str) -> Result<CommandMark> {
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).expect("the OS random source works");
        let running = self.sandbox(name).join(RUNNING_DIR);
        let path = running.join(hex::encode(nonce));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(_) => Ok(CommandMark(Some(path))),
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.sandbox(name).is_dir() => {
                Ok(CommandMark(None))
            }
            Err(e) => Err(io_error("record a command as running", e)),
        }
    }

    /// Whether a process started in the sandbox may still be alive.
    pub(crate) fn may_have_processes(sandbox_dir: &Path) -> bool {
        match std::fs::read_dir(sandbox_dir.join(RUNNING_DIR)) {
            Ok(mut entries) => entries.next().is_some(),
            Err(_) => true,
        }
    }

    pub(crate) fn read_meta(&self, name: &str) -> Result<Option<SandboxMeta>> {
        let path = self.sandbox(name).join(META_FILE);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(io_error("read sandbox metadata", err)),
        };
        let meta: SandboxMeta = serde_json::from_slice(&text).map_err(|err| {
            ProviderError::new(
                ErrorKind::Unknown,
                PROVIDER_ID,
                format!("sandbox metadata {} is corrupt", path.display()),
            )
            .with_source(err)
        })?;
        if meta.schema_version != META_SCHEMA_VERSION {
            return Err(ProviderError::new(
                ErrorKind::Unknown,
                PROVIDER_ID,
                format!(
                    "sandbox metadata {} has schema_version {}; this berth reads {}",
                    path.display(),
                    meta.schema_version,
                    META_SCHEMA_VERSION
                ),
            ));
        }
        Ok(Some(meta))
    }

    /// Where a sandbox goes while it is being removed: hidden, so it is absent at once.
    fn removing(&self, name: &str) -> PathBuf {
        self.root
            .join("sandboxes")
            .join(format!(".destroying-{name}"))
    }

    /// Removes a sandbox: first renamed out of its name (atomic: from then on it is absent, no
    /// command can start in it, and a crash mid-removal never leaves a half-deleted sandbox
    /// without its labels), then `before_delete` is given the renamed directory (to end what
    /// its commands left running), then it is deleted. Leftovers of an earlier interrupted
    /// create or removal of the name go too.
    pub(crate) fn remove_sandbox(
        &self,
        name: &str,
        before_delete: impl FnOnce(&Path),
    ) -> Result<()> {
        let removing = self.removing(name);
        let fail = |e| io_error("remove sandbox directory", e);
        force_remove_dir(&self.staging(name)).map_err(fail)?;
        force_remove_dir(&removing).map_err(fail)?;
        match std::fs::rename(self.sandbox(name), &removing) {
            Ok(()) => before_delete(&removing),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(fail(err)),
        }
        force_remove_dir(&removing).map_err(fail)
    }

    pub(crate) fn all_meta(&self) -> Result<Vec<SandboxMeta>> {
        let dir = self.root.join("sandboxes");
        let mut metas = Vec::new();
        let entries = std::fs::read_dir(&dir).map_err(|e| io_error("list sandboxes", e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io_error("list sandboxes", e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if checked_name(&name).is_err() {
                continue;
            }
            // Unreadable metadata is skipped here; observe reports it per sandbox.
            if let Ok(Some(meta)) = self.read_meta(&name) {
                metas.push(meta);
            }
        }
        metas.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(metas)
    }
}

/// A command recorded as running (see [`Layout::command_started`]); `None` in a sandbox that
/// keeps no records.
#[derive(Debug)]
pub(crate) struct CommandMark(Option<PathBuf>);

impl CommandMark {
    /// Nothing the command started is left: forget it.
    pub(crate) fn contained(self) {
        if let Some(path) = self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn write_meta_in(dir: &Path, meta: &SandboxMeta) -> Result<()> {
    let text = serde_json::to_vec_pretty(meta).expect("metadata serializes");
    let temp = dir.join(".sandbox.json.tmp");
    std::fs::write(&temp, text).map_err(|e| io_error("write sandbox metadata", e))?;
    std::fs::rename(&temp, dir.join(META_FILE)).map_err(|e| io_error("write sandbox metadata", e))
}

/// `remove_dir_all` that also copes with directories a command made read-only.
pub(crate) fn force_remove_dir(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(dir);
            match std::fs::remove_dir_all(dir) {
                Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
    }
}

fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            make_writable(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_directory_never_exists_without_its_labels() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().to_owned());
        layout.ensure().unwrap();
        // A create that died mid-way left a staging directory (no metadata yet): it is not a
        // sandbox, listings skip it, and the next create of the name replaces it.
        std::fs::create_dir_all(layout.staging("bx-1").join("workspace")).unwrap();
        assert!(layout.all_meta().unwrap().is_empty());
        assert!(!layout.sandbox("bx-1").exists());
        let labels = BTreeMap::from([("berth.owner".to_owned(), "alice".to_owned())]);
        let create = |name: &str, fill: &dyn Fn(&Path) -> Result<()>| {
            layout.create_sandbox(
                name,
                labels.clone(),
                BTreeMap::new(),
                NetworkMode::None,
                None,
                fill,
            )
        };
        // The content is filled in before the name appears, with the labels already there.
        create("bx-1", &|workspace| {
            assert!(!layout.sandbox("bx-1").exists());
            let meta: SandboxMeta = serde_json::from_slice(
                &std::fs::read(layout.staging("bx-1").join(META_FILE)).unwrap(),
            )
            .unwrap();
            assert_eq!(
                meta.labels.get("berth.owner").map(String::as_str),
                Some("alice")
            );
            std::fs::write(workspace.join("f"), b"content").unwrap();
            Ok(())
        })
        .unwrap();
        let meta = layout.read_meta("bx-1").unwrap().unwrap();
        assert_eq!(meta.labels, labels);
        assert_eq!(meta.phase, SandboxPhase::Ready);
        assert_eq!(
            std::fs::read(layout.workspace("bx-1").join("f")).unwrap(),
            b"content"
        );
        assert!(!layout.staging("bx-1").exists());
        let again = create("bx-1", &|_| Ok(())).unwrap_err();
        assert_eq!(again.kind(), ErrorKind::Conflict);
        // A fill that fails leaves nothing behind, and its error is the one reported.
        let failed = create("bx-2", &|_| {
            Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                PROVIDER_ID,
                "bad archive",
            ))
        })
        .unwrap_err();
        assert_eq!(failed.kind(), ErrorKind::InvalidRequest);
        assert!(!layout.staging("bx-2").exists() && !layout.sandbox("bx-2").exists());
        // Removal renames the sandbox away before anything else: absent by its name while
        // `before_delete` sees it, content and all.
        let mut seen = None;
        layout
            .remove_sandbox("bx-1", |removed| {
                assert!(!layout.sandbox("bx-1").exists());
                seen = std::fs::read(Layout::workspace_in(removed).join("f")).ok();
            })
            .unwrap();
        assert_eq!(seen.as_deref(), Some(&b"content"[..]));
        assert!(!layout.removing("bx-1").exists());
        // Destroy removes a leftover staging directory too (nothing to hand `before_delete`).
        std::fs::create_dir_all(layout.staging("bx-1")).unwrap();
        layout
            .remove_sandbox("bx-1", |_| panic!("no sandbox was there"))
            .unwrap();
        assert!(!layout.staging("bx-1").exists() && !layout.sandbox("bx-1").exists());
    }

    #[test]
    fn names_cannot_escape() {
        for bad in ["", "..", "../x", "a/b", ".hidden", "/abs", "a b", "a\0b"] {
            assert!(checked_name(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["bx-0123abcd", "my_box.1"] {
            assert!(checked_name(good).is_ok(), "{good:?} rejected");
        }
    }
}
