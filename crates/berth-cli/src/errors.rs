//! Turning errors into exit codes, kinds and "what to do next" hints.

use berth_contract::{ErrorKind, ProviderError};
use berth_factory::{FactoryError, FallbackError};
use berth_ledger::LedgerError;
use berth_manifest::ManifestError;
use berth_store::StoreError;

/// Documented exit codes (see README, "Exit codes").
pub mod code {
    /// Success.
    pub const OK: i32 = 0;
    /// Internal error (a bug or a panic; cleanup still ran).
    pub const INTERNAL: i32 = 1;
    // 2 is clap's usage error.
    /// Not found.
    pub const NOT_FOUND: i32 = 3;
    /// The provider does not support the capability.
    pub const UNSUPPORTED: i32 = 4;
    /// Invalid input.
    pub const INVALID: i32 = 5;
    /// Unavailable, capacity, quota, rate-limited.
    pub const UNAVAILABLE: i32 = 6;
    /// Credentials missing or rejected.
    pub const AUTH: i32 = 7;
    /// Conflict.
    pub const CONFLICT: i32 = 8;
    /// Timed out waiting for the provider.
    pub const TIMEOUT: i32 = 9;
    /// Cleanup incomplete.
    pub const CLEANUP_INCOMPLETE: i32 = 10;
    /// Refused: not provably yours.
    pub const REFUSED: i32 = 11;
    /// A conformance clause failed, or the catalog claims more than its evidence.
    pub const VERIFICATION_FAILED: i32 = 12;
    /// The sandbox interfered with Berth's control channel (its supervisor was impersonated).
    pub const TAMPERED: i32 = 13;
    /// This host (or this build) lacks a piece the provider needs; the message names it.
    pub const SETUP: i32 = 14;
    /// exec/run: berth itself failed (the command's codes pass through otherwise).
    pub const EXEC_FAILED: i32 = 125;
    /// `exec`/`run`: the command exists but cannot be executed (as `docker exec`).
    pub const COMMAND_NOT_EXECUTABLE: i32 = 126;
    /// `exec`/`run`: no such command in the sandbox (as `docker exec`).
    pub const COMMAND_NOT_FOUND: i32 = 127;
    /// Stopped by SIGINT (128 + 2, as a shell reports it).
    pub const INTERRUPTED: i32 = 130;
    /// Stopped by SIGTERM (128 + 15).
    pub const TERMINATED: i32 = 143;
}

/// A user-facing error.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Failure {
    /// Machine-readable kind.
    pub kind: &'static str,
    /// Exit code.
    pub exit_code: i32,
    /// The full cause chain, `: `-joined.
    pub message: String,
    /// What to do next.
    pub hint: Option<String>,
}

/// An error raised by the CLI itself with a chosen classification.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    /// Kind.
    pub kind: &'static str,
    /// Exit code.
    pub exit_code: i32,
    /// Message.
    pub message: String,
    /// Hint.
    pub hint: Option<String>,
}

impl CliError {
    /// A not-found error with a hint.
    pub fn not_found(message: impl Into<String>, hint: &str) -> Self {
        CliError {
            kind: "not_found",
            exit_code: code::NOT_FOUND,
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    /// A setup error (this host lacks something the command needs) with the fix as the hint.
    pub fn setup(message: impl Into<String>, hint: &str) -> Self {
        CliError {
            kind: ErrorKind::Setup.as_str(),
            exit_code: code::SETUP,
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    /// An invalid-input error with a hint.
    pub fn invalid(message: impl Into<String>, hint: &str) -> Self {
        CliError {
            kind: "invalid_request",
            exit_code: code::INVALID,
            message: message.into(),
            hint: Some(hint.into()),
        }
    }
}

fn for_kind(kind: ErrorKind) -> (&'static str, i32, &'static str) {
    match kind {
        ErrorKind::Auth => (
            kind.as_str(),
            code::AUTH,
            "check the provider's credential variables (`berth providers`)",
        ),
        ErrorKind::Quota
        | ErrorKind::Capacity
        | ErrorKind::Unavailable
        | ErrorKind::RateLimited => (
            kind.as_str(),
            code::UNAVAILABLE,
            // `--fallback` is a flag of `create` only; a local provider's capacity is its disk
            // (the host provider says so for ENOSPC and EDQUOT).
            "the provider is unavailable, at capacity or out of quota (a local one: its disk may \
             be full); retry later, or give `create` a provider to fall back to with \
             `--fallback` (a mission: `sandbox.fallback`)",
        ),
        ErrorKind::InvalidRequest => (kind.as_str(), code::INVALID, "fix the request and retry"),
        ErrorKind::NotFound => (
            kind.as_str(),
            code::NOT_FOUND,
            "`berth list` shows your sandboxes",
        ),
        ErrorKind::Conflict => (
            kind.as_str(),
            code::CONFLICT,
            // Most conflicts are a sandbox in the wrong state for the request (an exec on a
            // stopped or suspended one), not a race: name the verbs that change its state.
            "`berth status ID` shows the sandbox's state: `berth start` brings back a stopped \
             one, `berth resume` a suspended one; if another change is under way, let it \
             settle and retry",
        ),
        ErrorKind::Unsupported => (
            kind.as_str(),
            code::UNSUPPORTED,
            "`berth providers` shows which provider supports it",
        ),
        ErrorKind::TimeoutClient | ErrorKind::TimeoutServer => (
            kind.as_str(),
            code::TIMEOUT,
            "retry; the operation may still have happened, so check `berth status`",
        ),
        ErrorKind::Provider5xx => (kind.as_str(), code::UNAVAILABLE, "retry later"),
        ErrorKind::Tampered => (
            kind.as_str(),
            code::TAMPERED,
            "the sandbox is compromised: `berth destroy` it",
        ),
        ErrorKind::Setup => (
            kind.as_str(),
            code::SETUP,
            "install or configure what the message names, then run the command again \
             (scripts/setup-substrates installs Docker and bubblewrap)",
        ),
        _ => (
            kind.as_str(),
            code::INTERNAL,
            "see the message; report it if it looks like a bug",
        ),
    }
}

/// Classifies an error by the first typed cause in its chain.
pub fn classify(err: &anyhow::Error) -> Failure {
    // A wrapper that names its context repeats its source's text (`ledger store: query
    // failed`); a cause already said by the one before it is not said twice.
    let mut said: Vec<String> = Vec::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !said.last().is_some_and(|last| last.ends_with(&text)) {
            said.push(text);
        }
    }
    let message = bounded(said.join(": "));
    let (kind, exit_code, hint) = classify_chain(err);
    Failure {
        kind,
        exit_code,
        message,
        hint,
    }
}

/// The most of an error message shown: its start and its end.
const MESSAGE_HEAD: usize = 6 * 1024;
const MESSAGE_TAIL: usize = 2 * 1024;

/// `message` cut to its first and last few kilobytes when longer. Messages echo values given
/// by the user, a file or a sandbox (ids, paths, a provider's reply), which can be any size;
/// what is cut is said, with its size.
fn bounded(message: String) -> String {
    if message.len() <= MESSAGE_HEAD + MESSAGE_TAIL {
        return message;
    }
    // Char boundaries are at most 3 bytes apart.
    let head_end = (0..=MESSAGE_HEAD)
        .rev()
        .find(|&i| message.is_char_boundary(i))
        .unwrap_or(0);
    let tail_start = (message.len() - MESSAGE_TAIL..message.len())
        .find(|&i| message.is_char_boundary(i))
        .unwrap_or(message.len());
    format!(
        "{} …[{} bytes not shown]… {}",
        &message[..head_end],
        tail_start - head_end,
        &message[tail_start..]
    )
}

const FOREIGN_HINT: &str = "berth only touches resources labelled for this owner (BERTH_OWNER)";

type Classified = (&'static str, i32, Option<String>);

fn classify_chain(err: &anyhow::Error) -> Classified {
    err.chain()
        .find_map(classify_one)
        .unwrap_or(("internal", code::INTERNAL, None))
}

/// A move's or a checkpoint's failure: what a person does next differs by step.
fn classify_move(e: &berth_portable::PortableError) -> Option<Classified> {
    use berth_portable::PortableError as M;
    let (kind, exit_code, hint) = match e {
        M::Provider(inner) => return classify_one(inner),
        M::Ledger(inner) => return classify_one(inner),
        // The cause decides; the message already says what became of the target.
        M::Abandoned { cause, .. } => return classify_move(cause),
        M::Workspace(_) => (
            "invalid_request",
            code::INVALID,
            "the source's own `tar` archives its workspace (at most 256 MiB, 200 000 entries); \
             nothing was changed",
        ),
        M::Restore(_) => (
            "setup",
            code::SETUP,
            "the target needs `tar` in its image and room for the workspace; the source is kept",
        ),
        M::NotVerified { .. } => (
            "verification_failed",
            code::VERIFICATION_FAILED,
            "the source (sandbox or checkpoint) is kept; the paths named are what the new sandbox \
             changed or lacked",
        ),
        M::SourceChanged { .. } => (
            "conflict",
            code::CONFLICT,
            "stop what still writes in the source's workspace, then move again; the source is kept",
        ),
        M::SourceNotRemoved { source_id, .. } => {
            return Some((
                "cleanup_incomplete",
                code::CLEANUP_INCOMPLETE,
                Some(format!(
                    "the move is done; `berth move {source_id} --to …` again or `berth destroy \
                     {source_id}` finishes removing the source"
                )),
            ))
        }
        M::Objects(inner) => {
            use berth_artifacts::ArtifactError as A;
            match inner {
                A::NotFound(_) => (
                    "not_found",
                    code::NOT_FOUND,
                    "`berth checkpoints` lists this owner's checkpoints",
                ),
                A::Invalid(_) => (
                    "invalid_request",
                    code::INVALID,
                    "the checkpoint store holds an object no checkpoint can be; the message \
                     names it",
                ),
                A::Storage(_) => (
                    "unavailable",
                    code::UNAVAILABLE,
                    "the object store (`$BERTH_HOME/artifacts`, or the bucket BERTH_ARTIFACTS_URL \
                     names) did not answer as asked; retry once it does",
                ),
                _ => (
                    "internal",
                    code::INTERNAL,
                    "the checkpoint store holds something it should not; the message names it",
                ),
            }
        }
        M::NoCheckpoint { .. } => (
            "not_found",
            code::NOT_FOUND,
            "`berth checkpoints` lists this owner's checkpoints",
        ),
        M::NoSession { .. } => (
            "not_found",
            code::NOT_FOUND,
            "`berth sessions` lists this owner's agent sessions",
        ),
        M::Busy { .. } => (
            "conflict",
            code::CONFLICT,
            "wait for that move to end (or stop it), then run this one again",
        ),
        M::SessionBusy { .. } => (
            "conflict",
            code::CONFLICT,
            "wait for that `berth prompt` to end, then delete the session again (a claim a \
             killed one left is cleared once 2 minutes old)",
        ),
        M::NotMovable { .. } => (
            "conflict",
            code::CONFLICT,
            "`berth status ID` and `berth ledger list` show what it is",
        ),
        _ => (
            "internal",
            code::INTERNAL,
            "the move's record under the Berth home could not be used; the message names it",
        ),
    };
    Some((kind, exit_code, Some(hint.into())))
}

fn from_kind(kind: ErrorKind) -> Classified {
    let (name, code, hint) = for_kind(kind);
    (name, code, Some(hint.into()))
}

/// Classifies one error if its type is known; `None` lets the chain's next cause decide (every
/// library wrapper keeps its inner error as its `source`, so the typed cause is always in the
/// chain).
fn classify_one(cause: &(dyn std::error::Error + 'static)) -> Option<Classified> {
    if let Some(e) = cause.downcast_ref::<CliError>() {
        return Some((e.kind, e.exit_code, e.hint.clone()));
    }
    if let Some(e) = cause.downcast_ref::<ProviderError>() {
        if let ProviderError::NotStarted { failure, .. } = e {
            use berth_contract::StartFailure;
            return Some(match failure {
                StartFailure::NotFound => (
                    "command_not_found",
                    code::COMMAND_NOT_FOUND,
                    Some(
                        "no such program in the sandbox: check its name and the sandbox's PATH"
                            .into(),
                    ),
                ),
                StartFailure::NotExecutable => (
                    "command_not_executable",
                    code::COMMAND_NOT_EXECUTABLE,
                    Some(
                        "the program exists in the sandbox but cannot be executed (permissions?)"
                            .into(),
                    ),
                ),
                _ => (
                    "command_not_started",
                    code::EXEC_FAILED,
                    Some("the command did not start in the sandbox; see the message".into()),
                ),
            });
        }
        // An unclassified wrapper around a typed cause (a ledger failure in the fallback loop)
        // lets that cause decide, when it can.
        if e.kind() == ErrorKind::Unknown {
            let mut inner = std::error::Error::source(e);
            while let Some(cause) = inner {
                if let Some(classified) = classify_one(cause) {
                    return Some(classified);
                }
                inner = cause.source();
            }
        }
        return Some(from_kind(e.kind()));
    }
    if let Some(e) = cause.downcast_ref::<LedgerError>() {
        return match e {
            LedgerError::Foreign { .. } => {
                Some(("refused", code::REFUSED, Some(FOREIGN_HINT.into())))
            }
            // Store, factory and provider errors are the `source` of this one; the chain
            // reaches them next.
            _ => None,
        };
    }
    if let Some(e) = cause.downcast_ref::<berth_portable::PortableError>() {
        return classify_move(e);
    }
    if let Some(e) = cause.downcast_ref::<FallbackError>() {
        return match e {
            FallbackError::Exhausted { .. } => Some((
                "unavailable",
                code::UNAVAILABLE,
                Some("every provider in the fallback list is unavailable; retry later".into()),
            )),
            _ => None,
        };
    }
    if let Some(e) = cause.downcast_ref::<FactoryError>() {
        return Some(match e {
            FactoryError::UnknownProvider { .. } | FactoryError::NoAdapter { .. } => (
                "not_found",
                code::NOT_FOUND,
                Some("`berth providers` lists the providers this build can run".into()),
            ),
            FactoryError::MissingCredential { variable, .. } => (
                "auth",
                code::AUTH,
                Some(format!(
                    "export {variable} in the environment berth runs in"
                )),
            ),
            FactoryError::Construct { source, .. } => from_kind(source.kind()),
            FactoryError::Manifest(_) => (
                "invalid_request",
                code::INVALID,
                Some(
                    "fix the manifest; its format is schemas/provider-manifest.schema.json".into(),
                ),
            ),
            _ => (
                "invalid_request",
                code::INVALID,
                Some("the provider's manifest and adapter disagree; fix the manifest".into()),
            ),
        });
    }
    if let Some(e) = cause.downcast_ref::<berth_orchestrator::OrchestratorError>() {
        use berth_orchestrator::OrchestratorError as O;
        return match e {
            O::Foreign { .. } => Some((
                "refused",
                code::REFUSED,
                Some(FOREIGN_HINT.into()),
            )),
            O::ArtifactCredential { variable } => Some((
                "auth",
                code::AUTH,
                Some(format!(
                    "export {variable} in the environment berth runs in, or unset \
                     BERTH_ARTIFACTS_URL to keep bundles under BERTH_HOME/artifacts"
                )),
            )),
            O::ArtifactConfig(_) => Some((
                "invalid_request",
                code::INVALID,
                Some(
                    "fix BERTH_ARTIFACTS_URL (`s3://BUCKET[/PREFIX]`) and BERTH_ARTIFACTS_ENDPOINT, \
                     or unset BERTH_ARTIFACTS_URL to keep bundles under BERTH_HOME/artifacts"
                        .into(),
                ),
            )),
            O::ArtifactDir(_) => Some((
                ErrorKind::Setup.as_str(),
                code::SETUP,
                Some(
                    "BERTH_HOME/artifacts could not be made or opened: check the disk and \
                     permissions under BERTH_HOME, or set BERTH_HOME elsewhere"
                        .into(),
                ),
            )),
            // No verdict on the attempt: the kind and code are the provider's, the way on is
            // the mission's resume.
            O::Interrupted(stopped) => {
                let (mission, kind) = (&stopped.mission, stopped.source.kind());
                let (name, code, _) = for_kind(kind);
                Some((
                    name,
                    code,
                    Some(format!(
                        "the provider failed for now ({name}): the attempt was not judged and \
                         nothing was recorded for this step; once the provider answers again, \
                         `berth mission resume {mission}` runs the step again"
                    )),
                ))
            }
            O::BeforeAgent(stopped) => Some((
                ErrorKind::Setup.as_str(),
                code::SETUP,
                Some(format!(
                    "the attempt was not judged and nothing was recorded; fix what the message \
                     names (an image without git, a full disk, an agent CLI not installed, a \
                     login), then `berth mission resume {m}` goes on (a failed staging is redone \
                     in a fresh sandbox) — or `berth mission cancel {m}`",
                    m = stopped.mission
                )),
            )),
            // Berth's own git and files on this host (the mission's work repository, its
            // bundles) report a full disk only as text: `strerror(ENOSPC)`.
            O::Repository(message) if message.contains("No space left on device") => Some((
                ErrorKind::Setup.as_str(),
                code::SETUP,
                Some(
                    "the disk under BERTH_HOME is full: free some space or set BERTH_HOME \
                     elsewhere, then run the command again (`berth mission resume ID` continues \
                     a mission that was registered)"
                        .into(),
                ),
            )),
            O::File(_) | O::Repository(_) | O::Unreadable(_) => Some((
                "invalid_request",
                code::INVALID,
                Some("fix the mission file (`berth schema mission` shows its format)".into()),
            )),
            O::Unsupported(_) => Some((
                "unsupported",
                code::UNSUPPORTED,
                Some("see README, Missions, for what missions support today".into()),
            )),
            O::Leased(_) | O::LeaseLost(_) | O::Conflict(_) => Some((
                "conflict",
                code::CONFLICT,
                Some(
                    "another runner is driving this mission; `berth mission status` shows its \
                     progress (stop that run, Ctrl-C, before cancelling the mission)"
                        .into(),
                ),
            )),
            O::Finished { mission, .. } => Some((
                "conflict",
                code::CONFLICT,
                Some(format!("`berth mission status {mission}` shows how it ended")),
            )),
            O::UnknownProvider(_) => Some((
                "invalid_request",
                code::INVALID,
                Some("`berth providers` lists the providers this build has".into()),
            )),
            _ => None,
        };
    }
    if let Some(berth_bench::BenchError::Invalid(_)) = cause.downcast_ref() {
        return Some((
            "invalid_request",
            code::INVALID,
            Some("fix the request and retry".into()),
        ));
    }
    if let Some(berth_verify::VerifyError::NoAdapter(_)) = cause.downcast_ref() {
        return Some((
            "invalid_request",
            code::INVALID,
            Some("`berth providers` lists the providers this build has adapters for".into()),
        ));
    }
    if let Some(e) = cause.downcast_ref::<berth_scaffold::ScaffoldError>() {
        return match e {
            berth_scaffold::ScaffoldError::Write { .. } => None,
            _ => Some((
                "invalid_request",
                code::INVALID,
                Some("the message says what to change".into()),
            )),
        };
    }
    if cause.downcast_ref::<ManifestError>().is_some() {
        return Some((
            "invalid_request",
            code::INVALID,
            Some("fix the manifest; its format is schemas/provider-manifest.schema.json".into()),
        ));
    }
    if let Some(e) = cause.downcast_ref::<StoreError>() {
        if e.is_storage_failure() {
            return Some((
                ErrorKind::Setup.as_str(),
                code::SETUP,
                Some(
                    "SQLite could not write the store's files under BERTH_HOME: its disk is full \
                     or failing (`df` shows its free space). Free some space or set BERTH_HOME \
                     elsewhere, then run the command again; a failed write changed nothing in \
                     the store"
                        .into(),
                ),
            ));
        }
        return match e {
            StoreError::NotFound(record, _) => {
                use berth_store::Record;
                let hint = match record {
                    Record::LedgerEntry => {
                        "`berth list` shows your sandboxes, `berth ledger list` every entry"
                    }
                    Record::Mission => "`berth mission list` shows your missions",
                    Record::Bundle => "`berth artifacts query` lists the published bundles",
                };
                Some(("not_found", code::NOT_FOUND, Some(hint.into())))
            }
            StoreError::RunLock { dir, .. } => Some((
                ErrorKind::Setup.as_str(),
                code::SETUP,
                Some(format!(
                    "{} must be a directory you can write (Berth makes it on first use): move \
                     whatever is there away and run the command again",
                    dir.display()
                )),
            )),
            StoreError::SweptWhileMade(_) => Some((
                "conflict",
                code::CONFLICT,
                Some(
                    "a sweep (`berth ledger sweep`, `gc`, or this run's own cleanup) took it \
                     while it was being made; what was made is destroyed again; make it again"
                        .into(),
                ),
            )),
            _ => None,
        };
    }
    None
}

#[cfg(test)]
#[path = "errors_tests.rs"]
mod tests;
