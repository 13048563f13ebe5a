//! Portable workspaces: a sandbox's workspace read as a [`Checkpoint`] with strict rules;
//! [`move_sandbox`] — checkpoint → create on the target → restore → verify → destroy the
//! source — with every sandbox under the ledger and the move's commit point durable; and
//! checkpoints kept apart from any provider ([`CheckpointStore`], in Berth's object store),
//! restorable on any of them ([`restore_checkpoint`]); and agent sessions kept the same way
//! ([`SessionStore`]): a CLI's own session record with Berth's continuity state, resumable in
//! any sandbox.
//!
//! What a move carries is the workspace (the sandbox's working directory: directories, regular
//! files with their permission bits, symlinks). It does not carry running processes, files
//! outside the workspace, owners, setuid bits, extended attributes or device nodes; what a
//! checkpoint leaves out is listed in [`Moved::not_carried`], never dropped silently.
//!
//! Authority: this family owns the move's steps and its record, and the stored checkpoints'
//! layout and lifecycle; sandboxes stay the ledger's (created with `create_tracked`, removed
//! with `destroy_row`), objects the artifacts' store's, providers are handed in.

mod checkpoint;
mod moving;
mod restore;
mod sessions;
mod stored;

pub use checkpoint::{Checkpoint, Counts, Entry, EntryKind, ARCHIVE_SCRIPT, LIMIT, MAX_ENTRIES};
pub use moving::{move_sandbox, MoveRecord, MoveRequest, Moved, Phase, PhaseTimes, RECORD_SCHEMA};
pub use sessions::{
    AgentSession, SaveStep, Saved, SessionArchive, SessionStore, SessionTurn, MAX_SESSION_ARCHIVE,
    SESSION_PREFIX, SESSION_SCHEMA,
};
pub use stored::{
    restore_checkpoint, take_checkpoint, CheckpointStore, Collected, Restored, StoredCheckpoint,
    CHECKPOINT_PREFIX, CHECKPOINT_SCHEMA,
};

use berth_contract::ProviderError;
use berth_ledger::LedgerError;

/// Why a move, a checkpoint or a restore from one did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PortableError {
    /// A provider failed or lacks what a move needs (its kind says which).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The object store holding checkpoints failed (or holds something it should not).
    #[error("checkpoint store: {0}")]
    Objects(#[from] berth_artifacts::ArtifactError),
    /// The source's workspace cannot be carried as it is (too large, an archive that cannot
    /// come from a directory, the sandbox's `tar` failed or is missing).
    #[error("{0}")]
    Workspace(String),
    /// The target could not unpack the checkpoint.
    #[error("the target could not restore the checkpoint: {0}")]
    Restore(String),
    /// The target's workspace is not the checkpoint.
    #[error("the target's workspace is not the checkpoint: {}", .differences.join("; "))]
    NotVerified {
        /// How it differs, one line per path (bounded).
        differences: Vec<String>,
    },
    /// The source's workspace changed while it was moved (something still writes there).
    #[error("the source changed while it was moved: {}", .differences.join("; "))]
    SourceChanged {
        /// How it differs from the checkpoint (bounded).
        differences: Vec<String>,
    },
    /// Another move of the same source is under way.
    #[error("another `berth move` of `{source_id}` is under way")]
    Busy {
        /// The source.
        source_id: String,
    },
    /// The source is no sandbox that can be moved (being destroyed, gone, a snapshot).
    #[error("`{source_id}` cannot be moved: {reason}")]
    NotMovable {
        /// The source.
        source_id: String,
        /// Why.
        reason: String,
    },
    /// A durable record (a move's, a stored checkpoint's) could not be read or written, or is
    /// not what its name says.
    #[error("record {path}: {message}")]
    Record {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
    /// The move is done — the target verified, the record written — but the source could not
    /// be removed.
    #[error("the workspace is in `{target}`, moved and verified, but the source `{source_id}` could not be removed")]
    SourceNotRemoved {
        /// The source, still in the ledger.
        source_id: String,
        /// The verified target.
        target: String,
        /// Why the source's teardown failed.
        #[source]
        cause: Box<LedgerError>,
    },
    /// A turn of the agent session is being saved: it cannot be deleted under it.
    #[error("a turn of session `{id}` is being saved (it claimed turn {turn}); it cannot be deleted under it")]
    SessionBusy {
        /// The session.
        id: String,
        /// The turn claimed.
        turn: u64,
    },
    /// No such agent session (or not an id of one).
    #[error("session `{id}`: {reason}")]
    NoSession {
        /// The id asked for (escaped).
        id: String,
        /// Why.
        reason: String,
    },
    /// No such stored checkpoint (or not an id of one).
    #[error("checkpoint `{id}`: {reason}")]
    NoCheckpoint {
        /// The id asked for (escaped).
        id: String,
        /// Why.
        reason: String,
    },
    /// The move (or restore) stopped after its new sandbox was made: that sandbox was removed
    /// (or says why not), the source is as it was.
    #[error("stopped with `{source_id}` kept as it was; the new sandbox `{target}` {teardown}")]
    Abandoned {
        /// The source (a sandbox, or a stored checkpoint), untouched.
        source_id: String,
        /// The sandbox made for the move or restore.
        target: String,
        /// What happened to the target: "was removed (verified gone)", or why not.
        teardown: String,
        /// Whether the target is verified gone.
        target_removed: bool,
        /// Why the move stopped.
        #[source]
        cause: Box<PortableError>,
    },
}
