//! `move`: checkpoint → create on the target → restore → verify → destroy the source.
//!
//! The commit point is durable: once the target is verified, a record naming it is written
//! (and flushed) before the source's destroy is asked for. Cut short before that record, a
//! move leaves the source as it was and a target the next move of the same source removes
//! (its ledger origin is `move:SOURCE`); cut short after it, the next move finishes the
//! source's teardown and reports the recorded target. Until the source is destroyed, nothing
//! of it is changed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_contract::{CreateRequest, DestroyOutcome, Provider, ProviderExt, ProviderLookup};
use berth_ledger::{Ledger, Tracked};
use berth_store::{LedgerRow, LedgerState, ResourceKind};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{Checkpoint, Counts};
use crate::PortableError;

/// The schema of a move record.
pub const RECORD_SCHEMA: &str = "berth.move/v1";

/// The largest move record read back.
const MAX_RECORD_BYTES: u64 = 64 << 10;

/// What a move is asked to do.
pub struct MoveRequest<'a> {
    /// The ledger the source is in and the target goes into.
    pub ledger: &'a Ledger,
    /// Resolves a ledger row's provider (the source's, a leftover target's).
    pub providers: &'a dyn ProviderLookup,
    /// The directory holding move records and locks (Berth's state, private).
    pub records: &'a Path,
    /// The source sandbox's ledger row.
    pub source: &'a LedgerRow,
    /// The provider to move to.
    pub target: Arc<dyn Provider>,
    /// The target's time to live.
    pub ttl: Option<Duration>,
    /// Shapes the target's create request (image, network, limits).
    pub prepare: Box<dyn FnOnce(&mut CreateRequest) + Send + Sync + 'a>,
}

impl std::fmt::Debug for MoveRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoveRequest")
            .field("source", &self.source.berth_id)
            .field("target", &self.target.id())
            .finish_non_exhaustive()
    }
}

/// A durable step of a move, reported as it is passed (progress, and the crash tests' kill
/// points).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The source's workspace is read.
    Checkpointed,
    /// The target exists (its ledger row says so).
    TargetCreated,
    /// The checkpoint is unpacked in the target.
    Restored,
    /// The target matches the checkpoint and the source has not changed: the record is
    /// written, the move committed.
    Committed,
    /// The source's teardown is done.
    SourceDestroyed,
}

impl Phase {
    /// The name used in progress lines and `BERTH_FAULT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Checkpointed => "checkpointed",
            Phase::TargetCreated => "target-created",
            Phase::Restored => "restored",
            Phase::Committed => "committed",
            Phase::SourceDestroyed => "source-destroyed",
        }
    }
}

/// Wall time of each step, in milliseconds.
#[derive(Debug, Default, Clone, Serialize)]
pub struct PhaseTimes {
    /// Reading the source's workspace.
    pub checkpoint_ms: f64,
    /// Creating the target.
    pub create_ms: f64,
    /// Writing and unpacking the checkpoint in the target.
    pub restore_ms: f64,
    /// Reading the target back and the source again, and comparing.
    pub verify_ms: f64,
    /// Destroying the source.
    pub destroy_ms: f64,
    /// From the start until the target was verified: when work can resume there.
    pub to_resumable_ms: f64,
    /// The whole move.
    pub total_ms: f64,
}

/// The durable record of a committed move (`<records>/<source>.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MoveRecord {
    /// [`RECORD_SCHEMA`].
    pub schema: String,
    /// The source sandbox.
    pub source: String,
    /// Its provider.
    pub source_provider: String,
    /// The verified target.
    pub target: String,
    /// Its provider.
    pub target_provider: String,
    /// The checkpoint's digest.
    pub checkpoint: String,
    /// When the target was verified (RFC 3339).
    pub verified_at: String,
}

/// A finished move.
#[derive(Debug, Serialize)]
pub struct Moved {
    /// The source (destroyed, or being destroyed: see `source_teardown`).
    pub source: String,
    /// The target.
    pub target: Tracked,
    /// The checkpoint's digest (also the target's verified content).
    pub checkpoint: String,
    /// What the checkpoint carried (`None` when finishing a move committed earlier).
    pub counts: Option<Counts>,
    /// What it did not carry, and why.
    pub not_carried: Vec<String>,
    /// How the source's teardown ended.
    pub source_teardown: DestroyOutcome,
    /// Targets of earlier moves of this source that were cut short before their commit,
    /// removed first.
    pub removed_leftovers: Vec<String>,
    /// This run finished a move committed by an earlier one (cut short after its commit).
    pub finished_earlier_move: bool,
    /// Wall times.
    pub times: PhaseTimes,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Moves the workspace of `req.source` to a new sandbox on `req.target`; see the module.
pub async fn move_sandbox(
    req: MoveRequest<'_>,
    phase: &mut (dyn FnMut(Phase) + Send),
) -> Result<Moved, PortableError> {
    let started = Instant::now();
    let source_id = req.source.berth_id.clone();
    check_record_name(&source_id)?;
    std::fs::create_dir_all(req.records).map_err(|e| record_error(req.records, e))?;
    let _lock = lock(req.records, &source_id)?;
    // Read again under the lock: another move may have finished meanwhile.
    let source_row = req.ledger.row(&source_id).await?;
    let record_path = req.records.join(format!("{source_id}.json"));
    if let Some(record) = read_record(&record_path)? {
        check_record(&record_path, &record, &source_id)?;
        let target_row = req.ledger.row(&record.target).await?;
        match (target_row.state, source_row.state) {
            (LedgerState::Created, _) => {
                return finish_committed(&req, &source_row, &target_row, record, started, phase)
                    .await
            }
            (_, LedgerState::VerifiedGone) => {
                return Err(not_movable(
                    &source_id,
                    &format!(
                        "it was moved to `{}` ({}), which is {} since",
                        record.target, record.target_provider, target_row.state
                    ),
                ))
            }
            // The recorded target is gone and the source whole (the target was removed
            // before the source was): the record is stale, and the source moves again.
            (_, LedgerState::Created) => {
                std::fs::remove_file(&record_path).map_err(|e| record_error(&record_path, e))?
            }
            (target_state, source_state) => {
                return Err(PortableError::Record {
                    path: record_path.display().to_string(),
                    message: format!(
                        "it names target `{}`, which is {target_state}, and the source is \
                         {source_state}: nothing was done",
                        record.target
                    ),
                })
            }
        }
    }
    if source_row.kind != ResourceKind::Sandbox {
        return Err(not_movable(&source_id, "it is a snapshot, not a sandbox"));
    }
    if let Some(mission) = source_row
        .origin
        .strip_prefix("mission ")
        .and_then(|rest| rest.split_whitespace().next())
    {
        // A mission adopts its sandboxes by name on resume and judges what they hold: one
        // moved from under it would be lost to it, or judged after a change it did not make.
        return Err(not_movable(
            &source_id,
            &format!("it belongs to mission `{mission}`, which manages its own sandboxes"),
        ));
    }
    if source_row.state != LedgerState::Created {
        return Err(not_movable(
            &source_id,
            &format!("its ledger state is {}", source_row.state),
        ));
    }
    let source = req.providers.provider(&source_row.provider)?;
    let source_native = berth_ledger::native_id(&source_row);
    source.require_files()?;
    req.target.require_files()?;
    let removed_leftovers = remove_leftovers(&req, &source_id).await?;

    let mut times = PhaseTimes::default();
    let at = Instant::now();
    let mut checkpoint = Checkpoint::read(source.as_ref(), &source_native).await?;
    let archive = std::mem::take(&mut checkpoint.archive);
    checkpoint
        .not_carried
        .extend(running_processes(source.as_ref(), &source_native).await);
    times.checkpoint_ms = ms(at);
    phase(Phase::Checkpointed);

    let at = Instant::now();
    let target_provider = req.target.clone();
    let target = req
        .ledger
        .create_tracked(
            req.target.as_ref(),
            &format!("move:{source_id}"),
            req.ttl,
            req.prepare,
            |create| async move { target_provider.create(&create).await },
        )
        .await?;
    times.create_ms = ms(at);
    phase(Phase::TargetCreated);

    let verified = restore_and_verify(
        source.as_ref(),
        &source_native,
        req.target.as_ref(),
        &target,
        (&checkpoint, archive),
        &mut times,
        phase,
    )
    .await;
    if let Err(cause) = verified {
        return Err(abandon(req.ledger, req.target.as_ref(), &source_id, &target, cause).await);
    }
    let record = MoveRecord {
        schema: RECORD_SCHEMA.into(),
        source: source_id.clone(),
        source_provider: source_row.provider.clone(),
        target: target.berth_id.clone(),
        target_provider: target.provider.clone(),
        checkpoint: checkpoint.digest(),
        verified_at: chrono::Utc::now().to_rfc3339(),
    };
    if let Err(err) = write_record(&record_path, &record) {
        // A record that may be in place names this target: it must not be removed then.
        let _ = std::fs::remove_file(&record_path);
        if record_path.exists() {
            req.ledger.hand_over(&target.berth_id);
            return Err(err);
        }
        return Err(abandon(req.ledger, req.target.as_ref(), &source_id, &target, err).await);
    }
    // From here the target may be the only copy: this run's cleanup after a failure or a
    // signal keeps it.
    req.ledger.hand_over(&target.berth_id);
    times.to_resumable_ms = ms(started);
    phase(Phase::Committed);

    let at = Instant::now();
    let source_teardown = req
        .ledger
        .destroy_row(source.as_ref(), &source_row)
        .await
        .map_err(|cause| PortableError::SourceNotRemoved {
            source_id: source_id.clone(),
            target: target.berth_id.clone(),
            cause: Box::new(cause),
        })?;
    times.destroy_ms = ms(at);
    phase(Phase::SourceDestroyed);
    times.total_ms = ms(started);
    Ok(Moved {
        source: source_id,
        target,
        checkpoint: record.checkpoint,
        counts: Some(checkpoint.counts()),
        not_carried: checkpoint.not_carried,
        source_teardown,
        removed_leftovers,
        finished_earlier_move: false,
        times,
    })
}

/// The source's detached processes still running, named: a move carries files, never
/// processes, and they end with the source.
async fn running_processes(
    source: &dyn Provider,
    native: &berth_contract::NativeId,
) -> Vec<String> {
    let Some(detached) = source.detached() else {
        return Vec::new();
    };
    let handles = match detached.list(native).await {
        Ok(handles) => handles,
        Err(e) => {
            return vec![format!(
                "whether processes run in the source is unknown: {e}"
            )]
        }
    };
    let mut running = Vec::new();
    for handle in handles {
        match detached.status(native, &handle).await {
            Ok(berth_contract::ProcessStatus::Running) => running.push(format!(
                "process {}: running in the source; a move carries no process (it ends with the \
                 source)",
                handle.0.escape_debug()
            )),
            Ok(_) => {}
            Err(e) => running.push(format!(
                "process {}: whether it runs is unknown ({e}); a move carries no process",
                handle.0.escape_debug()
            )),
        }
    }
    running
}

/// Unpacks the checkpoint in the target, reads the target back and the source again: both must
/// be the checkpoint.
async fn restore_and_verify(
    source: &dyn Provider,
    source_native: &berth_contract::NativeId,
    target: &dyn Provider,
    tracked: &Tracked,
    (checkpoint, archive): (&Checkpoint, Vec<u8>),
    times: &mut PhaseTimes,
    phase: &mut (dyn FnMut(Phase) + Send),
) -> Result<(), PortableError> {
    let native = berth_contract::NativeId(tracked.native_id.clone());
    let at = Instant::now();
    crate::restore::unpack(target, &native, checkpoint, archive).await?;
    times.restore_ms = ms(at);
    phase(Phase::Restored);

    let at = Instant::now();
    crate::restore::verify(target, &native, checkpoint).await?;
    let again = Checkpoint::read_manifest(source, source_native).await?;
    let differences = checkpoint.differences(&again, crate::restore::SHOWN_DIFFERENCES);
    if !differences.is_empty() {
        return Err(PortableError::SourceChanged { differences });
    }
    times.verify_ms = ms(at);
    Ok(())
}

/// Removes the sandbox a failed move (or restore) made; the error says what became of it.
pub(crate) async fn abandon(
    ledger: &Ledger,
    provider: &dyn Provider,
    source_id: &str,
    target: &Tracked,
    cause: PortableError,
) -> PortableError {
    let removed = match ledger.row(&target.berth_id).await {
        Ok(row) => ledger.destroy_row(provider, &row).await,
        Err(err) => Err(err),
    };
    let (teardown, target_removed) = match removed {
        Ok(DestroyOutcome::VerifiedGone { .. }) => ("was removed (verified gone)".to_owned(), true),
        Ok(DestroyOutcome::Accepted { .. }) => (
            "was asked to go and is not yet verified gone (`berth ledger sweep` checks again)"
                .to_owned(),
            false,
        ),
        Err(err) => (
            format!("could not be removed ({err}); `berth ledger sweep` tries again"),
            false,
        ),
    };
    PortableError::Abandoned {
        source_id: source_id.to_owned(),
        target: target.berth_id.clone(),
        teardown,
        target_removed,
        cause: Box::new(cause),
    }
}

/// Targets of earlier moves of `source_id` cut short before their commit: never verified,
/// they go before a new one is made.
async fn remove_leftovers(
    req: &MoveRequest<'_>,
    source_id: &str,
) -> Result<Vec<String>, PortableError> {
    let origin = format!("move:{source_id}");
    let mut removed = Vec::new();
    for row in req.ledger.owned_rows(None, false).await? {
        if row.origin != origin || row.kind != ResourceKind::Sandbox {
            continue;
        }
        let provider = req.providers.provider(&row.provider)?;
        req.ledger.destroy_row(provider.as_ref(), &row).await?;
        removed.push(row.berth_id);
    }
    Ok(removed)
}

/// A record is of this schema and of this source.
fn check_record(path: &Path, record: &MoveRecord, source_id: &str) -> Result<(), PortableError> {
    if record.schema == RECORD_SCHEMA && record.source == source_id {
        return Ok(());
    }
    Err(PortableError::Record {
        path: path.display().to_string(),
        message: format!(
            "schema `{}` for source `{}`, expected {RECORD_SCHEMA} for `{source_id}`",
            record.schema.escape_debug(),
            record.source.escape_debug(),
        ),
    })
}

/// A move committed earlier (its target alive) and cut short before its source's teardown
/// finished: finish it.
async fn finish_committed(
    req: &MoveRequest<'_>,
    source_row: &LedgerRow,
    target_row: &LedgerRow,
    record: MoveRecord,
    started: Instant,
    phase: &mut (dyn FnMut(Phase) + Send),
) -> Result<Moved, PortableError> {
    let source = req.providers.provider(&source_row.provider)?;
    let at = Instant::now();
    let source_teardown = match source_row.state {
        LedgerState::VerifiedGone => DestroyOutcome::VerifiedGone {
            already_absent: true,
        },
        _ => req.ledger.destroy_row(source.as_ref(), source_row).await?,
    };
    phase(Phase::SourceDestroyed);
    Ok(Moved {
        source: record.source,
        target: Tracked {
            berth_id: target_row.berth_id.clone(),
            provider: target_row.provider.clone(),
            native_id: berth_ledger::native_id(target_row).0,
            raw_state: target_row.state.to_string(),
        },
        checkpoint: record.checkpoint,
        counts: None,
        not_carried: Vec::new(),
        source_teardown,
        removed_leftovers: Vec::new(),
        finished_earlier_move: true,
        times: PhaseTimes {
            destroy_ms: ms(at),
            total_ms: ms(started),
            ..Default::default()
        },
    })
}

fn not_movable(source_id: &str, reason: &str) -> PortableError {
    PortableError::NotMovable {
        source_id: source_id.to_owned(),
        reason: reason.to_owned(),
    }
}

fn record_error(path: &Path, err: impl std::fmt::Display) -> PortableError {
    PortableError::Record {
        path: path.display().to_string(),
        message: err.to_string(),
    }
}

/// A ledger id is Berth's own, but it becomes a file name here: only plain names pass.
fn check_record_name(id: &str) -> Result<(), PortableError> {
    let plain = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'));
    if plain {
        Ok(())
    } else {
        Err(not_movable(id, "its id is not a plain name"))
    }
}

/// One move of a source at a time: an exclusive lock the process holds (a killed move frees
/// it).
fn lock(records: &Path, source_id: &str) -> Result<std::fs::File, PortableError> {
    let path = records.join(format!("{source_id}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| record_error(&path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(PortableError::Busy {
            source_id: source_id.to_owned(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(record_error(&path, e)),
    }
}

fn read_record(path: &Path) -> Result<Option<MoveRecord>, PortableError> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(record_error(path, e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| record_error(path, e))?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(record_error(path, "larger than a move record can be"));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| record_error(path, format!("not a move record: {e}")))
}

/// Writes the record whole under its name and flushes it (file and directory) before the
/// source's destroy may be asked for.
fn write_record(path: &Path, record: &MoveRecord) -> Result<(), PortableError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let temp: PathBuf = path.with_extension("json.tmp");
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(&serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    written.map_err(|e| record_error(path, e))
}
