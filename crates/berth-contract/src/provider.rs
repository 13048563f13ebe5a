//! The [`Provider`] trait: a small required core plus optional capability groups.
//!
//! An optional group is reachable only through its accessor (`files()`, `snapshots()`, …),
//! which returns `None` when the adapter does not implement it. There are no throwing stubs:
//! [`ProviderExt`] turns a `None` into a typed [`ProviderError::Unsupported`] naming the
//! capability, and [`implemented_capabilities`] derives what an adapter implements from the
//! same accessors, so the two can never disagree.

use std::collections::BTreeMap;
use std::fmt::Debug;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{
    Capability, CapabilitySet, CreateRequest, Created, DestroyOutcome, ExecOutput, ExecRequest,
    ExecSummary, ExitStatus, LabelFilter, NativeId, Observation, OutputSink, ProviderError, Result,
    Transition,
};

mod files;
pub use files::*;

/// A sandbox provider.
///
/// # Contract
///
/// - **create** makes exactly one sandbox named from `req.name`, carrying every label in
///   `req.labels`, and returns once it is ready for exec (or fails). A failed create leaves
///   nothing behind, or leaves something `observe` and `destroy` can find by the same name.
/// - **observe** never guesses: `Absent` only when the provider positively says so; an
///   unmapped state is [`CanonicalState::Unknown`](crate::CanonicalState::Unknown) with the raw
///   state kept. Labels are reported when the provider can report them.
/// - **exec** runs one command and returns its [`ExitStatus`] with stdout and stderr kept
///   separate where the provider separates them. On timeout the provider kills the command's
///   whole process tree inside the sandbox before returning [`ExitStatus::TimedOut`]. A
///   transport failure is an error, never a fabricated exit code.
/// - **destroy** is idempotent: destroying an absent sandbox is `VerifiedGone { already_absent:
///   true }`. It either converges (kills what runs, removes the resource, observes it absent)
///   and returns `VerifiedGone`, or returns `Accepted` so the ledger keeps checking.
/// - Errors are classified ([`ErrorKind`](crate::ErrorKind)) in one place per adapter; secret
///   values never appear in messages.
#[async_trait]
pub trait Provider: Send + Sync + Debug {
    /// The provider id (`host`, `docker`, …), equal to its manifest id.
    fn id(&self) -> &str;

    /// Creates a sandbox. See the trait contract.
    async fn create(&self, req: &CreateRequest) -> Result<Created>;

    /// Observes a sandbox. See the trait contract.
    async fn observe(&self, id: &NativeId) -> Result<Observation>;

    /// Runs a command to completion with buffered output. See the trait contract.
    async fn exec(&self, id: &NativeId, req: &ExecRequest) -> Result<ExecOutput>;

    /// Destroys a sandbox, idempotently. See the trait contract.
    async fn destroy(&self, id: &NativeId) -> Result<DestroyOutcome>;

    /// Streaming exec, when implemented.
    fn streaming(&self) -> Option<&dyn StreamingExec> {
        None
    }
    /// Detached exec and kill, when implemented.
    fn detached(&self) -> Option<&dyn DetachedExec> {
        None
    }
    /// File operations, when implemented.
    fn files(&self) -> Option<&dyn Files> {
        None
    }
    /// Cold stop/start, when implemented.
    fn stop_start(&self) -> Option<&dyn StopStart> {
        None
    }
    /// Suspend/resume with memory, when implemented.
    fn suspend_resume(&self) -> Option<&dyn SuspendResume> {
        None
    }
    /// Filesystem snapshots, when implemented.
    fn snapshots(&self) -> Option<&dyn Snapshots> {
        None
    }
    /// Memory snapshots, when implemented.
    fn memory_snapshots(&self) -> Option<&dyn MemorySnapshots> {
        None
    }
    /// Fork, when implemented.
    fn fork(&self) -> Option<&dyn Fork> {
        None
    }
    /// Listing by label, when implemented.
    fn listing(&self) -> Option<&dyn Listing> {
        None
    }
    /// SSH / port access, when implemented.
    fn access(&self) -> Option<&dyn Access> {
        None
    }
    /// Provider-enforced TTL, when implemented.
    fn ttl(&self) -> Option<&dyn Ttl> {
        None
    }
    /// Loopback forwarding into the host, when implemented.
    fn loopback_forward(&self) -> Option<&dyn LoopbackForward> {
        None
    }

    /// Removes what killed calls of this provider left behind that no ledger row names and
    /// nothing will ever name again (docker: an image a killed snapshot or fork's commit
    /// finished after its key or fork was gone), and says what it removed, one line each; an
    /// error when anything could not be removed (naming what was). `berth gc` and `berth
    /// ledger sweep` call it for every provider built in and set up. The default is for
    /// providers whose calls leave nothing outside what their rows name.
    async fn remove_residue(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

/// The capabilities an adapter implements, derived from its accessors.
pub fn implemented_capabilities(provider: &dyn Provider) -> CapabilitySet {
    Capability::ALL
        .into_iter()
        .filter(|capability| match capability {
            Capability::ExecStreaming => provider.streaming().is_some(),
            Capability::ExecDetached => provider.detached().is_some(),
            Capability::Files => provider.files().is_some(),
            Capability::StopStart => provider.stop_start().is_some(),
            Capability::SuspendResume => provider.suspend_resume().is_some(),
            Capability::FilesystemSnapshot => provider.snapshots().is_some(),
            Capability::MemorySnapshot => provider.memory_snapshots().is_some(),
            Capability::Fork => provider.fork().is_some(),
            Capability::Listing => provider.listing().is_some(),
            Capability::Access => provider.access().is_some(),
            Capability::Ttl => provider.ttl().is_some(),
            Capability::LoopbackForward => provider.loopback_forward().is_some(),
        })
        .collect()
}

/// Streaming exec.
///
/// # Contract
/// Chunks reach the sink while the command runs, per stream in order. Same timeout and
/// exit-status rules as [`Provider::exec`].
#[async_trait]
pub trait StreamingExec: Send + Sync {
    /// Runs a command, delivering output to `sink` as it arrives.
    async fn exec_streaming(
        &self,
        id: &NativeId,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<ExecSummary>;
}

/// Connections made inside a sandbox to a loopback port, handed to the caller on the host.
///
/// # Contract
/// `forward_loopback` returns once the sandbox listens on `127.0.0.1:port` (in its own network
/// namespace; nothing is opened on the host's network). Each connection a process in the
/// sandbox makes to it arrives through [`ForwardedPort::accept`] as a stream on the host, bytes
/// passed through unchanged both ways. Dropping the [`ForwardedPort`] stops the listening; a
/// sandbox that is paused or gone ends it with an error. No network access is granted.
#[async_trait]
pub trait LoopbackForward: Send + Sync {
    /// Starts listening on the sandbox's loopback `port`.
    async fn forward_loopback(&self, id: &NativeId, port: u16) -> Result<Box<dyn ForwardedPort>>;
}

/// A listening forward (see [`LoopbackForward`]).
#[async_trait]
pub trait ForwardedPort: Send {
    /// The next connection made inside the sandbox, as a connected stream on the host.
    async fn accept(&mut self) -> Result<std::os::unix::net::UnixStream>;
}

/// A detached process started in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessHandle(pub String);

/// The state of a detached process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "process", rename_all = "snake_case")]
pub enum ProcessStatus {
    /// Still running.
    Running,
    /// Finished.
    Finished {
        /// How it ended.
        status: ExitStatus,
    },
}

/// Where to read a detached process's output from: a byte offset into each stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputOffsets {
    /// Into its stdout.
    pub stdout: u64,
    /// Into its stderr.
    pub stderr: u64,
}

/// A piece of a detached process's output, read from [`OutputOffsets`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputChunk {
    /// Stdout from its offset on, at most the bytes asked for.
    pub stdout: Vec<u8>,
    /// Stderr from its offset on, at most the bytes asked for.
    pub stderr: Vec<u8>,
    /// How many bytes stdout held when it was read. Below the offset: it was rewritten (read
    /// again from 0).
    pub stdout_size: u64,
    /// How many bytes stderr held when it was read.
    pub stderr_size: u64,
    /// How many bytes the process wrote to stdout beyond what the sandbox keeps of it (they
    /// are gone); `None`: unknown (the provider cannot say, e.g. for a stopped sandbox).
    pub stdout_dropped: Option<u64>,
    /// The same for stderr.
    pub stderr_dropped: Option<u64>,
}

/// The most a provider returns of one stream in one [`DetachedExec::output`] call, whatever is
/// asked: a caller reads a long output piece by piece.
pub const MAX_OUTPUT_CHUNK: usize = 4 << 20;

/// Detached exec and kill.
///
/// # Contract
/// `spawn` returns once the process runs; it outlives the call. `kill` kills its whole process
/// group and is idempotent.
#[async_trait]
pub trait DetachedExec: Send + Sync {
    /// Starts a process.
    async fn spawn(&self, id: &NativeId, req: &ExecRequest) -> Result<ProcessHandle>;
    /// Polls a process.
    async fn status(&self, id: &NativeId, process: &ProcessHandle) -> Result<ProcessStatus>;
    /// Kills a process's group.
    async fn kill(&self, id: &NativeId, process: &ProcessHandle) -> Result<()>;
    /// Handles of the processes started with `spawn` whose output the sandbox still holds
    /// (a handle may outlive what can be polled: see the provider's manifest).
    async fn list(&self, id: &NativeId) -> Result<Vec<ProcessHandle>>;
    /// What the process has written so far from `from` on: at most `max` bytes (and at most
    /// [`MAX_OUTPUT_CHUNK`]) of each stream, with each stream's whole size, so output of any
    /// length is read in bounded pieces and a follower reads only what is new.
    async fn output(
        &self,
        id: &NativeId,
        process: &ProcessHandle,
        from: OutputOffsets,
        max: usize,
    ) -> Result<OutputChunk>;
}

/// Cold stop/start.
///
/// # Contract
/// `stop`: processes gone, filesystem kept. `start`: ready for exec again. Each returns
/// `Settled` only when the target state was observed.
#[async_trait]
pub trait StopStart: Send + Sync {
    /// Stops.
    async fn stop(&self, id: &NativeId) -> Result<Transition>;
    /// Starts.
    async fn start(&self, id: &NativeId) -> Result<Transition>;
}

/// Suspend/resume with memory kept.
///
/// # Contract
/// `resume` returns processes to where they were. Same settle rule as [`StopStart`].
#[async_trait]
pub trait SuspendResume: Send + Sync {
    /// Suspends.
    async fn suspend(&self, id: &NativeId) -> Result<Transition>;
    /// Resumes.
    async fn resume(&self, id: &NativeId) -> Result<Transition>;
}

/// How a snapshot is identified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotHandleKind {
    /// A name the caller chose.
    Named,
    /// An id the provider chose.
    Opaque,
    /// A content digest.
    Digest,
}

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRef {
    /// The handle, e.g. `sha256:…`.
    pub handle: String,
    /// What kind of handle it is.
    pub kind: SnapshotHandleKind,
    /// Size in bytes, when known.
    pub size_bytes: Option<u64>,
}

/// Filesystem snapshots.
///
/// # Contract
/// `snapshot` captures the filesystem without destroying the sandbox; `restore` creates a new
/// sandbox from it (same rules as `create`); `delete` is idempotent.
#[async_trait]
pub trait Snapshots: Send + Sync {
    /// Captures a snapshot.
    async fn snapshot(&self, id: &NativeId) -> Result<SnapshotRef>;
    /// Captures a snapshot under `key` (letters, digits, `-`, `_`, `.`; at most 100 bytes),
    /// replacing any earlier snapshot this provider took under the same key. A caller that
    /// was interrupted after a snapshot but before it recorded the handle retries with the
    /// same key and leaves no duplicate behind.
    async fn snapshot_keyed(&self, id: &NativeId, key: &str) -> Result<SnapshotRef>;
    /// Deletes the snapshot `key` names, if any (idempotent). Lets a caller that recorded the
    /// key before the snapshot existed remove it without ever having learned its handle.
    async fn delete_keyed(&self, key: &str) -> Result<()>;
    /// Creates a new sandbox from a snapshot.
    async fn restore(&self, snapshot: &SnapshotRef, req: &CreateRequest) -> Result<Created>;
    /// Deletes a snapshot.
    async fn delete_snapshot(&self, snapshot: &SnapshotRef) -> Result<()>;
}

/// Checks a snapshot key (see [`Snapshots::snapshot_keyed`]).
pub fn check_snapshot_key(key: &str) -> std::result::Result<(), String> {
    let ok = !key.is_empty()
        && key.len() <= 100
        && !key.starts_with(['.', '-'])
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{}` is not a snapshot key (letters, digits, `-`, `_`, `.`; at most 100 bytes)",
            key.escape_debug()
        ))
    }
}

/// Memory snapshots (processes included).
#[async_trait]
pub trait MemorySnapshots: Send + Sync {
    /// Captures memory and filesystem.
    async fn snapshot_memory(&self, id: &NativeId) -> Result<SnapshotRef>;
    /// Creates a running sandbox from it.
    async fn restore_memory(&self, snapshot: &SnapshotRef, req: &CreateRequest) -> Result<Created>;
}

/// Fork.
///
/// # Contract
/// Creates a new sandbox whose filesystem equals the source's at the time of the call; the
/// source keeps running unchanged.
#[async_trait]
pub trait Fork: Send + Sync {
    /// Forks `id` into a new sandbox described by `req`.
    async fn fork(&self, id: &NativeId, req: &CreateRequest) -> Result<Created>;
}

/// One listed sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed {
    /// Native id.
    pub native_id: NativeId,
    /// What observe would say.
    pub observation: Observation,
}

/// Listing.
///
/// # Contract
/// Complete (all pages), filtered by label, soft-deleted rows excluded.
#[async_trait]
pub trait Listing: Send + Sync {
    /// Lists sandboxes passing `filter`.
    async fn list(&self, filter: &LabelFilter) -> Result<Vec<Listed>>;

    /// Who else can put sandboxes where this listing looks.
    fn scope(&self) -> ListingScope {
        ListingScope::Shared
    }
}

/// Who else can put sandboxes where a [`Listing`] looks — what a labelled sandbox without a
/// ledger row can be.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListingScope {
    /// Other Berth homes, other tools, anyone with the provider's credentials: a labelled
    /// sandbox without a row may be someone else's (or carry a forged label).
    #[default]
    Shared,
    /// Only this provider instance, in state private to one Berth home (host and bwrap: its
    /// `state/` directory, mode 0700): everything listed was made by this home.
    ThisHome,
}

/// What an interactive terminal runs (`berth ssh`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyRequest {
    /// Program and arguments (non-empty).
    pub argv: Vec<String>,
    /// Extra environment variables (`TERM`, the caller's `--env`), on top of the sandbox's
    /// documented environment.
    pub env: BTreeMap<String, String>,
    /// Initial window width.
    pub cols: u16,
    /// Initial window height.
    pub rows: u16,
}

/// Interactive access: a terminal in the sandbox and connections to its ports.
///
/// # Contract
/// - `open_pty` starts `req.argv` on a new pseudo-terminal in the sandbox (its controlling
///   terminal, so Ctrl-C typed into it signals the sandbox's foreground process) and returns a
///   stream carrying the supervisor's terminal frames (`berth_supervisor::pty`: keystrokes and
///   window sizes in, the screen and one exit frame out). The exit frame carries the command's
///   own status, never a made-up one. Hanging up ends the command's process group.
/// - `connect_port` returns a stream connected to `127.0.0.1:port` as the sandbox sees it (its
///   own network namespace, so it works with network `none`), bytes passed through unchanged
///   both ways; nothing listening is a [`ErrorKind::Unavailable`](crate::ErrorKind) error
///   naming the port. Nothing is opened on the host's network.
#[async_trait]
pub trait Access: Send + Sync {
    /// Opens a terminal session.
    async fn open_pty(
        &self,
        id: &NativeId,
        req: &PtyRequest,
    ) -> Result<std::os::unix::net::UnixStream>;
    /// Connects to a port inside the sandbox.
    async fn connect_port(
        &self,
        id: &NativeId,
        port: u16,
    ) -> Result<std::os::unix::net::UnixStream>;
}

/// Provider-enforced TTL.
///
/// # Contract
/// After `expires_at_unix` the provider destroys the sandbox by itself, but never during an
/// active exec.
#[async_trait]
pub trait Ttl: Send + Sync {
    /// Sets the expiry.
    async fn set_ttl(&self, id: &NativeId, expires_at_unix: i64) -> Result<()>;
}

/// Shorthands that turn a missing capability into a typed `Unsupported` error.
pub trait ProviderExt: Provider {
    /// Streaming exec or `Unsupported`.
    fn require_streaming(&self) -> Result<&dyn StreamingExec> {
        self.streaming()
            .ok_or_else(|| ProviderError::unsupported(Capability::ExecStreaming, self.id()))
    }
    /// Files or `Unsupported`.
    fn require_files(&self) -> Result<&dyn Files> {
        self.files()
            .ok_or_else(|| ProviderError::unsupported(Capability::Files, self.id()))
    }
    /// Filesystem snapshots or `Unsupported`.
    fn require_snapshots(&self) -> Result<&dyn Snapshots> {
        self.snapshots()
            .ok_or_else(|| ProviderError::unsupported(Capability::FilesystemSnapshot, self.id()))
    }
    /// Fork or `Unsupported`.
    fn require_fork(&self) -> Result<&dyn Fork> {
        self.fork()
            .ok_or_else(|| ProviderError::unsupported(Capability::Fork, self.id()))
    }
    /// Listing or `Unsupported`.
    fn require_listing(&self) -> Result<&dyn Listing> {
        self.listing()
            .ok_or_else(|| ProviderError::unsupported(Capability::Listing, self.id()))
    }
    /// Stop/start or `Unsupported`.
    fn require_stop_start(&self) -> Result<&dyn StopStart> {
        self.stop_start()
            .ok_or_else(|| ProviderError::unsupported(Capability::StopStart, self.id()))
    }
    /// Suspend/resume or `Unsupported`.
    fn require_suspend_resume(&self) -> Result<&dyn SuspendResume> {
        self.suspend_resume()
            .ok_or_else(|| ProviderError::unsupported(Capability::SuspendResume, self.id()))
    }
    /// Loopback forwarding or `Unsupported`.
    fn require_loopback_forward(&self) -> Result<&dyn LoopbackForward> {
        self.loopback_forward()
            .ok_or_else(|| ProviderError::unsupported(Capability::LoopbackForward, self.id()))
    }

    /// Detached exec or `Unsupported`.
    fn require_detached(&self) -> Result<&dyn DetachedExec> {
        self.detached()
            .ok_or_else(|| ProviderError::unsupported(Capability::ExecDetached, self.id()))
    }

    /// Interactive access or `Unsupported`.
    fn require_access(&self) -> Result<&dyn Access> {
        self.access()
            .ok_or_else(|| ProviderError::unsupported(Capability::Access, self.id()))
    }
}

impl<P: Provider + ?Sized> ProviderExt for P {}

/// Finds the adapter for a provider id: the factory's registry bound to a configuration. The
/// ledger sweeps through it, so the ledger (and everything that uses it, like the conformance
/// kit) never depends on the factory or on any adapter.
pub trait ProviderLookup: Send + Sync {
    /// Provider `id`, constructed. An id this build cannot construct is an error whose kind
    /// says why (not found, auth, setup…).
    fn provider(&self, id: &str) -> Result<std::sync::Arc<dyn Provider>>;
}
