//! The Berth provider contract.
//!
//! Every sandbox provider (host, docker, bwrap, cloud adapters) implements [`Provider`]. This crate
//! owns the trait, the capability model, canonical lifecycle states, exec results and the error
//! taxonomy. It owns no I/O and no persistence, and depends on no adapter or vendor crate — CI
//! checks that with `cargo tree`.
//!
//! Module map:
//! - [`capability`] — the [`Capability`] enum, tri-state [`Support`], [`CapabilitySet`].
//! - [`state`] — [`CanonicalState`], [`Observation`], [`DestroyOutcome`], [`Transition`].
//! - [`exec`] — [`ExecRequest`], [`ExitStatus`], [`ExecOutput`], [`OutputSink`].
//! - [`error`] — [`ErrorKind`] (retryable or not, fallback or not) and [`ProviderError`].
//! - [`labels`] — the labels every created resource carries ([`Labels`]).
//! - [`spec`] — [`CreateRequest`], [`Created`], ids.
//! - [`provider`] — the [`Provider`] trait, its optional capability groups and [`ProviderExt`].

pub mod capability;
pub mod error;
pub mod exec;
pub mod labels;
pub mod provider;
pub mod spec;
pub mod state;

pub use capability::{Capability, CapabilitySet, Support};
pub use error::{ErrorKind, ProviderError, Result, StartFailure};
pub use exec::{
    check_argv, check_command, check_env, Command, ExecOutput, ExecRequest, ExecSummary,
    ExitStatus, OutputSink, Stream, DEFAULT_MAX_OUTPUT_BYTES, RESERVED_ENV,
};
pub use labels::{LabelFilter, Labels};
pub use provider::{
    check_snapshot_key, copy_exactly, copy_into_sink, file_too_large, implemented_capabilities,
    sink_failed, source_ended, too_many_entries, Access, DetachedExec, FileEntry, FileKind,
    FileSink, FileSource, Files, Fork, ForwardedPort, Listed, Listing, ListingScope,
    LoopbackForward, MemorySnapshots, OutputChunk, OutputOffsets, ProcessHandle, ProcessStatus,
    Provider, ProviderExt, ProviderLookup, PtyRequest, SnapshotHandleKind, SnapshotRef, Snapshots,
    StopStart, StreamingExec, SuspendResume, Ttl, MAX_FILE_READ_BYTES, MAX_HELD_WRITE_BYTES,
    MAX_LIST_ENTRIES, MAX_OUTPUT_CHUNK,
};
pub use spec::{CreateRequest, Created, NativeId, NetworkMode, Resources, SandboxName};
pub use state::{CanonicalState, DestroyOutcome, Observation, Transition};
