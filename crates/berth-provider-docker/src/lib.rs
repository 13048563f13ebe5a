//! The `docker` provider: one container per sandbox, driven through the Docker Engine API over
//! its Unix socket, with exec served by Berth's in-container supervisor.
//!
//! - Create: the image must already be present (Berth never pulls and never substitutes an
//!   image); the container gets Berth's labels, resource limits, network `none` unless asked,
//!   docker's init as PID 1 (it reaps orphans) and the supervisor as its main process, bound
//!   read-only from the host, listening on a socket in `/run/berth` (a `nosuid,nodev,noexec`
//!   tmpfs reached through `/proc/<pid>/root` when Berth runs as root; see
//!   [`DockerConfig::private_run`]). Ready = the supervisor answers; its identity is then pinned
//!   and checked (`SO_PEERCRED`) on every connection. Default walls: [`DEFAULT_PIDS_LIMIT`],
//!   [`DEFAULT_MEMORY_MIB`], `no-new-privileges`, [`KEPT_CAPABILITIES`] only.
//! - Exec goes through the supervisor (a raw `docker exec` round trip costs ~85 ms here; the
//!   supervisor answers in about a millisecond), which runs each command in its own process
//!   group and kills the whole group on timeout — a timed-out `docker exec` would keep running.
//! - Files go through the archive API (tar put/get), snapshots through commit (image digest),
//!   stop/start are cold (processes gone, filesystem kept), suspend/resume are pause/unpause
//!   (cgroup freezer, memory kept).
//! - Destroy force-removes at once (no stop timeout) and verifies the container is gone.
//!
//! Engine failures are classified in one place (`engine::classify`).
//!
//! Modules: `container` (create, ready, observe, remove, exec), `detached`, `files`, `images`
//! (stop/start, pause, snapshots, forks, listing), [`engine`] (the Engine API client) and
//! `supervise` (the supervisor's connection: pinning and peer checks).

mod access;
mod commits;
mod container;
mod detached;
pub mod engine;
mod files;
mod forward;
mod images;
mod supervise;
mod upload;

pub use detached::PROCESS_LOGS;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_contract::{
    CanonicalState, Command, CreateRequest, Created, DestroyOutcome, DetachedExec, ErrorKind,
    ExecOutput, ExecRequest, ExecSummary, ExitStatus, FileEntry, FileKind, Files, Fork,
    LabelFilter, Listed, Listing, NativeId, NetworkMode, Observation, OutputSink, ProcessHandle,
    ProcessStatus, Provider, ProviderError, Result, SnapshotHandleKind, SnapshotRef, Snapshots,
    StopStart, StreamingExec, SuspendResume, Transition,
};
use berth_supervisor::{Exit, Request, PROTOCOL_VERSION};
use hyper::{Method, StatusCode};
use serde::Deserialize;

pub use engine::Engine;

/// The provider id.
pub const PROVIDER_ID: &str = "docker";
/// Where the workspace lives inside the container (the default working directory).
pub const WORKSPACE: &str = "/workspace";
/// Where the supervisor binary is mounted in the container.
const SUPERVISOR_IN_CONTAINER: &str = "/usr/local/bin/berth-supervisor";
/// The directory holding the supervisor's socket inside the container.
const RUN_DIR_IN_CONTAINER: &str = "/run/berth";
/// The supervisor's socket in it.
const SOCKET_NAME: &str = "s.sock";
/// Label naming the committed image a fork was made from (removed with the fork).
const FORK_IMAGE_LABEL: &str = "berth.fork-image";
/// What an image Berth committed was made for: `key:<key>` (a keyed snapshot), `fork:<name>`
/// (a fork's image) or `snapshot`. Set on the image at commit, so every image made for a key or a
/// fork is found and removed with it, even one a killed call's commit finished untagged.
const IMAGE_FOR_LABEL: &str = "berth.image_for";
/// How long after it was made an image committed for a key or a fork may stay untagged before
/// it counts as abandoned (its call tags it within milliseconds).
const ABANDONED_AFTER: Duration = Duration::from_secs(120);
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Slack beyond timeout + grace before the client stops waiting for the supervisor's answer.
const CLIENT_DEADLINE_MARGIN: Duration = Duration::from_secs(10);
/// The walls every container gets unless a request sets its own limits: a fork bomb or a
/// runaway build stops at the container, not the host.
pub const DEFAULT_PIDS_LIMIT: u64 = 1024;
/// Memory limit (MiB) when a request sets none; swap is not added on top.
pub const DEFAULT_MEMORY_MIB: u64 = 4096;
/// The capabilities a container keeps (everything else — MKNOD, NET_RAW, SETFCAP, SYS_CHROOT,
/// AUDIT_WRITE, FSETID, SETPCAP, … — is dropped): enough to install packages and manage files.
pub const KEPT_CAPABILITIES: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "KILL",
    "SETGID",
    "SETUID",
    "NET_BIND_SERVICE",
];
/// Unix socket paths are limited to 108 bytes.
const MAX_SOCKET_PATH: usize = 107;

/// Settings of the docker provider.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// Per-sandbox host directories (supervisor sockets) live here.
    pub state_dir: PathBuf,
    /// The engine's socket.
    pub socket: PathBuf,
    /// The supervisor binary on the host (bound into every container).
    pub supervisor: PathBuf,
    /// How long create waits for the supervisor to answer.
    pub ready_timeout: Duration,
    /// SIGTERM → SIGKILL grace for timed-out commands.
    pub kill_grace: Duration,
    /// Seconds `stop` gives processes before the engine kills them.
    pub stop_timeout_secs: u32,
    /// Where the supervisor's socket lives. `true` (the default when Berth runs as root): on a
    /// tmpfs inside the container (`nosuid,nodev,noexec`), reached from the host through
    /// `/proc/<supervisor>/root` — nothing of the host is writable from inside, no host path
    /// shows in the container's mount table, and a symlink planted there resolves inside the
    /// container. `false` (a non-root user, who cannot enter another user's `/proc/PID/root`):
    /// a per-sandbox host directory bind-mounted at `/run/berth`, which Docker cannot mount
    /// `nosuid,nodev`; it lives under the private state directory (0700), and the supervisor's
    /// pinned identity is checked either way.
    pub private_run: bool,
}

impl DockerConfig {
    /// Defaults for everything but the paths.
    pub fn new(state_dir: PathBuf, socket: PathBuf, supervisor: PathBuf) -> Self {
        DockerConfig {
            state_dir,
            socket,
            supervisor,
            ready_timeout: Duration::from_secs(60),
            kill_grace: Duration::from_millis(500),
            stop_timeout_secs: 5,
            private_run: effective_uid() == Some(0),
        }
    }
}

/// Whether an ELF executable asks for a dynamic loader (has a `PT_INTERP` program header).
/// Static and static-pie binaries do not; anything that is not a 64-bit little-endian ELF is
/// an error.
fn dynamic_interpreter(path: &Path) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned());
    let mut file = std::fs::File::open(path)?;
    let mut header = [0u8; 64];
    file.read_exact(&mut header)?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF executable"));
    }
    let phoff = u64::from_le_bytes(header[0x20..0x28].try_into().expect("8 bytes"));
    let phentsize = u16::from_le_bytes([header[0x36], header[0x37]]) as u64;
    let phnum = u16::from_le_bytes([header[0x38], header[0x39]]) as u64;
    if !(4..=256).contains(&phentsize) || phnum > 256 {
        return Err(bad("implausible program headers"));
    }
    // The whole table in one read (at most 64 KiB): every `berth` command that builds this
    // provider checks its supervisor.
    let mut table = vec![0u8; (phnum * phentsize) as usize];
    file.seek(SeekFrom::Start(phoff))?;
    file.read_exact(&mut table)?;
    Ok(table
        .chunks_exact(phentsize as usize)
        .any(|entry| u32::from_le_bytes(entry[..4].try_into().expect("4 bytes")) == 3))
}

/// This process's effective uid, from `/proc/self/status`.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The docker provider.
#[derive(Debug, Clone)]
pub struct DockerProvider {
    engine: Engine,
    config: DockerConfig,
}

fn err(kind: ErrorKind, message: impl Into<String>) -> ProviderError {
    ProviderError::new(kind, PROVIDER_ID, message)
}

fn io_err(what: &str, source: std::io::Error) -> ProviderError {
    err(ErrorKind::Unknown, format!("cannot {what}")).with_source(source)
}

#[derive(Debug, Deserialize)]
struct Inspect {
    #[serde(rename = "State")]
    state: InspectState,
    #[serde(rename = "Config")]
    config: InspectConfig,
}

#[derive(Debug, Deserialize)]
struct InspectState {
    #[serde(rename = "Status")]
    status: String,
    #[serde(rename = "Paused", default)]
    paused: bool,
    /// The host pid of the container's init (0 when not running).
    #[serde(rename = "Pid", default)]
    pid: u32,
}

#[derive(Debug, Deserialize)]
struct InspectConfig {
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

/// Maps Docker's state to the canonical one; the raw state is kept beside it.
pub fn canonical_state(status: &str, paused: bool) -> CanonicalState {
    match (status, paused) {
        (_, true) | ("paused", _) => CanonicalState::Suspended,
        ("created", _) => CanonicalState::Creating,
        ("running", _) => CanonicalState::Running,
        ("restarting", _) => CanonicalState::Unknown,
        ("removing", _) => CanonicalState::Stopping,
        ("exited", _) => CanonicalState::Stopped,
        ("dead", _) => CanonicalState::Failed,
        _ => CanonicalState::Unknown,
    }
}

fn raw_state(status: &str, paused: bool) -> String {
    if paused && status != "paused" {
        format!("{status}+paused")
    } else {
        status.to_owned()
    }
}

/// Resolves a sandbox path: relative paths are under `/workspace`; `..` is refused.
fn container_path(path: &str) -> Result<PathBuf> {
    if path.contains('\0') {
        return Err(err(
            ErrorKind::InvalidRequest,
            format!("path `{path}` contains a NUL byte"),
        ));
    }
    let raw = Path::new(path);
    // The limits of the container's filesystem, checked here: a name it cannot hold is the
    // caller's mistake, not an engine failure.
    if path.len() > 4096 || raw.components().any(|c| c.as_os_str().len() > 255) {
        return Err(err(
            ErrorKind::InvalidRequest,
            format!(
                "path `{}…` has a name that is too long (at most 255 bytes a name, 4096 in all)",
                path.chars().take(40).collect::<String>()
            ),
        ));
    }
    if raw.components().any(|c| c == Component::ParentDir) {
        return Err(err(
            ErrorKind::InvalidRequest,
            format!("path `{path}` contains `..`; docker sandbox paths are absolute or relative to {WORKSPACE}"),
        ));
    }
    let full = if raw.is_absolute() {
        raw.to_owned()
    } else {
        Path::new(WORKSPACE).join(raw)
    };
    Ok(full
        .components()
        .filter(|c| *c != Component::CurDir)
        .collect())
}

/// An image reference, image id or container name/id made safe for an Engine API URL path.
/// Anything that could change the path (`..`, `.`, empty segments, a leading `/`, bytes
/// outside the reference alphabet) is refused, not escaped: such a name is invalid input.
fn path_name(value: &str) -> Result<String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"._-/:@+".contains(&b);
    let well_formed = !value.is_empty()
        && value.len() <= 512
        && value.bytes().all(allowed)
        && !value.starts_with(['/', '-', '.'])
        && value
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    if !well_formed {
        return Err(err(
            ErrorKind::InvalidRequest,
            format!(
                "`{}` is not an image or container name (letters, digits, `.`, `_`, `-`, `/`, `:`, `@`; no `..` or empty segments)",
                value.escape_debug()
            ),
        ));
    }
    Ok(query_escape(value))
}

fn query_escape(value: &str) -> String {
    let mut out = String::new();
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[async_trait]
impl Provider for DockerProvider {
    fn id(&self) -> &str {
        PROVIDER_ID
    }

    async fn create(&self, req: &CreateRequest) -> Result<Created> {
        let image = req.image.as_deref().ok_or_else(|| {
            err(
                ErrorKind::InvalidRequest,
                "a docker sandbox needs an image (e.g. --image berth/agent:bookworm); berth never \
                 picks one for you",
            )
        })?;
        self.image_present(image).await?;
        self.create_container(req, image, BTreeMap::new()).await
    }

    async fn observe(&self, id: &NativeId) -> Result<Observation> {
        Ok(match self.inspect(&id.0).await? {
            None => Observation::Absent,
            Some(info) => {
                let mut state = canonical_state(&info.state.status, info.state.paused);
                let mut raw = raw_state(&info.state.status, info.state.paused);
                // Running but never pinned: a create or start was interrupted before the
                // supervisor answered. It is not ready (and will not be trusted later).
                if state == CanonicalState::Running && !self.pin_path(&id.0)?.is_file() {
                    state = CanonicalState::Creating;
                    raw = format!("{raw} (supervisor not pinned yet)");
                }
                Observation::Present {
                    state,
                    raw,
                    soft_deleted: false,
                    labels: info.config.labels.unwrap_or_default(),
                }
            }
        })
    }

    async fn exec(&self, id: &NativeId, req: &ExecRequest) -> Result<ExecOutput> {
        self.clear_abandoned_uploads(id).await;
        let cap = req.max_output_bytes;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let (mut stdout_total, mut stderr_total) = (0u64, 0u64);
        let (status, duration) = self
            .run(id, req, |stream, bytes| {
                let (kept, total) = match stream {
                    berth_contract::Stream::Stdout => (&mut stdout, &mut stdout_total),
                    berth_contract::Stream::Stderr => (&mut stderr, &mut stderr_total),
                };
                *total += bytes.len() as u64;
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
            })
            .await?;
        Ok(ExecOutput {
            status,
            stdout,
            stderr: Some(stderr),
            stdout_total,
            stderr_total: Some(stderr_total),
            duration,
        })
    }

    async fn destroy(&self, id: &NativeId) -> Result<DestroyOutcome> {
        let labels = match self.inspect(&id.0).await? {
            None => {
                self.remove_fork_image(&id.0).await?;
                let _ = std::fs::remove_dir_all(self.run_dir(&id.0)?);
                return Ok(DestroyOutcome::VerifiedGone {
                    already_absent: true,
                });
            }
            Some(info) => info.config.labels.unwrap_or_default(),
        };
        let removed = self
            .engine
            .expect(
                Method::DELETE,
                &format!("/containers/{}?force=true&v=true", path_name(&id.0)?),
                None,
                &[StatusCode::NOT_FOUND],
            )
            .await;
        match removed {
            Ok(_) => {}
            // "Removal already in progress": a caller that died mid-destroy left the engine
            // removing it. Wait (bounded) for that removal to finish rather than fail.
            Err(e) if e.kind() == ErrorKind::Conflict => {
                let until = Instant::now() + Duration::from_secs(15);
                while Instant::now() < until && self.inspect(&id.0).await?.is_some() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(e) => return Err(e),
        }
        if let Some(image) = labels.get(FORK_IMAGE_LABEL) {
            // The fork's private image; another container may still use it (then 409: kept).
            let _ = self
                .engine
                .request(
                    Method::DELETE,
                    &format!("/images/{}", path_name(image)?),
                    None,
                )
                .await;
        }
        self.remove_fork_image(&id.0).await?;
        let _ = std::fs::remove_dir_all(self.run_dir(&id.0)?);
        match self.inspect(&id.0).await? {
            None => Ok(DestroyOutcome::VerifiedGone {
                already_absent: false,
            }),
            Some(info) => Ok(DestroyOutcome::Accepted {
                raw_state: raw_state(&info.state.status, info.state.paused),
            }),
        }
    }

    fn streaming(&self) -> Option<&dyn StreamingExec> {
        Some(self)
    }
    fn detached(&self) -> Option<&dyn DetachedExec> {
        Some(self)
    }
    fn files(&self) -> Option<&dyn Files> {
        Some(self)
    }
    fn stop_start(&self) -> Option<&dyn StopStart> {
        Some(self)
    }
    fn suspend_resume(&self) -> Option<&dyn SuspendResume> {
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
    fn loopback_forward(&self) -> Option<&dyn berth_contract::LoopbackForward> {
        Some(self)
    }
    fn access(&self) -> Option<&dyn berth_contract::Access> {
        Some(self)
    }

    async fn remove_residue(&self) -> Result<Vec<String>> {
        let removed = self.remove_abandoned_commits().await?;
        Ok(removed.iter().map(ToString::to_string).collect())
    }
}

#[async_trait]
impl StreamingExec for DockerProvider {
    async fn exec_streaming(
        &self,
        id: &NativeId,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<ExecSummary> {
        self.clear_abandoned_uploads(id).await;
        let (mut stdout_total, mut stderr_total) = (0u64, 0u64);
        let (status, duration) = self
            .run(id, req, |stream, bytes| {
                match stream {
                    berth_contract::Stream::Stdout => stdout_total += bytes.len() as u64,
                    berth_contract::Stream::Stderr => stderr_total += bytes.len() as u64,
                }
                sink.chunk(stream, bytes);
            })
            .await?;
        Ok(ExecSummary {
            status,
            stdout_total,
            stderr_total: Some(stderr_total),
            duration,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::container::demux_logs;
    use super::*;

    #[test]
    fn states_map_with_paused_first() {
        assert_eq!(canonical_state("running", false), CanonicalState::Running);
        assert_eq!(canonical_state("running", true), CanonicalState::Suspended);
        assert_eq!(canonical_state("paused", false), CanonicalState::Suspended);
        assert_eq!(canonical_state("exited", false), CanonicalState::Stopped);
        assert_eq!(canonical_state("created", false), CanonicalState::Creating);
        assert_eq!(canonical_state("dead", false), CanonicalState::Failed);
        assert_eq!(canonical_state("removing", false), CanonicalState::Stopping);
        assert_eq!(
            canonical_state("zombie-ish", false),
            CanonicalState::Unknown
        );
        assert_eq!(raw_state("running", true), "running+paused");
    }

    #[test]
    fn container_paths_stay_rooted_and_refuse_dot_dot() {
        assert_eq!(
            container_path("a/b").unwrap(),
            PathBuf::from("/workspace/a/b")
        );
        assert_eq!(
            container_path("./a").unwrap(),
            PathBuf::from("/workspace/a")
        );
        assert_eq!(
            container_path("/etc/hosts").unwrap(),
            PathBuf::from("/etc/hosts")
        );
        let long = "n".repeat(300);
        for bad in [
            "../x",
            "a/../../b",
            "/workspace/../etc/shadow",
            "a\0b",
            long.as_str(),
        ] {
            assert_eq!(
                container_path(bad).unwrap_err().kind(),
                ErrorKind::InvalidRequest,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn dynamically_linked_supervisors_are_told_apart() {
        // /bin/sh is dynamically linked on every machine this builds on.
        assert!(super::dynamic_interpreter(Path::new("/bin/sh")).unwrap());
        let not_elf = std::env::temp_dir().join(format!("berth-not-elf-{}", std::process::id()));
        std::fs::write(&not_elf, [0u8; 80]).unwrap();
        assert!(super::dynamic_interpreter(&not_elf).is_err());
        // An ELF header whose program headers lie past the end of the file, or are implausible.
        let sh = std::fs::read("/bin/sh").unwrap();
        std::fs::write(&not_elf, &sh[..80]).unwrap();
        assert!(super::dynamic_interpreter(&not_elf).is_err());
        let mut odd = sh[..4096].to_vec();
        odd[0x36..0x38].copy_from_slice(&2u16.to_le_bytes());
        std::fs::write(&not_elf, &odd).unwrap();
        assert!(super::dynamic_interpreter(&not_elf).is_err());
        std::fs::remove_file(&not_elf).unwrap();
        if let Some(path) = std::env::var_os("BERTH_SUPERVISOR") {
            assert!(
                !super::dynamic_interpreter(Path::new(&path)).unwrap(),
                "scripts/build-supervisor builds it static"
            );
        }
    }

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(query_escape("/work space/a&b"), "/work%20space/a%26b");
        for bad in [
            "../../x", "a/../b", "/abs", "a//b", ".", "x?y", "a b", "", "-rm",
        ] {
            let refused = path_name(bad).unwrap_err();
            assert_eq!(refused.kind(), ErrorKind::InvalidRequest, "{bad}");
        }
        for good in [
            "berth/agent:bookworm",
            "sha256:0cf72f01",
            "bx-1a2b",
            "r.io/a/b@sha256:ab",
        ] {
            assert!(path_name(good).is_ok(), "{good}");
        }
        assert_eq!(
            query_escape("{\"label\":[\"a=b\"]}"),
            "%7B%22label%22%3A%5B%22a%3Db%22%5D%7D"
        );
    }

    #[test]
    fn log_frames_are_demultiplexed() {
        let mut raw = vec![1, 0, 0, 0, 0, 0, 0, 3];
        raw.extend_from_slice(b"abc");
        raw.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 2]);
        raw.extend_from_slice(b"de");
        assert_eq!(demux_logs(&raw), b"abcde");
    }
}
