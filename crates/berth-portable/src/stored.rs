//! Checkpoints kept by Berth: a workspace stored apart from any provider, restorable on any of
//! them (`berth checkpoint ID`, `berth restore ws-… --provider P`).
//!
//! The backend is a local directory under Berth's state, one per owner: `ws-HEX.tar` (the
//! archive Berth rebuilt) and `ws-HEX.json` (its record), where HEX is the checkpoint's manifest
//! digest — the same workspace is one checkpoint. Each is written under a temporary name in that
//! directory, flushed, then renamed, so a crash leaves either nothing under the final names or
//! a temporary file; only Berth writes there, so a listing finds everything a crash left, and
//! `gc` removes it (with expired checkpoints). A read checks the archive against its name with
//! the same strict rules a sandbox's archive meets: a file changed on disk is refused.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_contract::{CreateRequest, NativeId, Provider, ProviderExt};
use berth_ledger::{Ledger, Tracked};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::checkpoint::{parse_as, Checkpoint, Counts, Keep};
use crate::PortableError;

/// The schema of a checkpoint's record.
pub const CHECKPOINT_SCHEMA: &str = "berth.checkpoint/v1";
/// A checkpoint id's prefix.
pub const CHECKPOINT_PREFIX: &str = "ws-";
/// How old a temporary file must be before `gc` takes it for a crash's leftover.
const ORPHAN_AFTER: Duration = Duration::from_secs(120);
/// The largest record read back.
const MAX_RECORD_BYTES: u64 = 1 << 20;

/// A stored checkpoint's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredCheckpoint {
    /// [`CHECKPOINT_SCHEMA`].
    pub schema: String,
    /// `ws-` and the manifest digest's hex.
    pub id: String,
    /// The manifest digest (`sha256:…`).
    pub digest: String,
    /// The sandbox it was taken from, and its provider.
    pub source: String,
    /// The source's provider.
    pub source_provider: String,
    /// When it was taken (RFC 3339).
    pub created_at: DateTime<Utc>,
    /// When `gc` may delete it; `None`: kept until deleted.
    pub expires_at: Option<DateTime<Utc>>,
    /// What it holds.
    pub counts: Counts,
    /// What the workspace had that it does not carry.
    pub not_carried: Vec<String>,
    /// Size of the stored archive.
    pub archive_bytes: u64,
}

/// One owner's checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
}

/// What `gc` removed, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Collected {
    /// The file or checkpoint.
    pub name: String,
    /// Why it went.
    pub reason: String,
}

fn io_error(path: &Path, err: impl std::fmt::Display) -> PortableError {
    PortableError::Record {
        path: path.display().to_string(),
        message: err.to_string(),
    }
}

impl CheckpointStore {
    /// The checkpoints of `owner` under `root` (Berth's state directory for them). Owners are
    /// kept apart by a digest of their name: any owner string is a safe directory name then.
    pub fn new(root: &Path, owner: &str) -> CheckpointStore {
        let hashed = hex::encode(&Sha256::digest(owner.as_bytes())[..12]);
        CheckpointStore {
            dir: root.join(hashed),
        }
    }

    /// The id's hex, or why it is no checkpoint id (it becomes a file name).
    fn hex_of(id: &str) -> Result<&str, PortableError> {
        match id.strip_prefix(CHECKPOINT_PREFIX) {
            Some(hex)
                if hex.len() == 64
                    && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
            {
                Ok(hex)
            }
            _ => Err(PortableError::NoCheckpoint {
                id: id.escape_debug().to_string(),
                reason: "not a checkpoint id (`ws-` and 64 lowercase hex digits)".into(),
            }),
        }
    }

    fn paths(&self, hex: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("ws-{hex}.tar")),
            self.dir.join(format!("ws-{hex}.json")),
        )
    }

    /// Stores `checkpoint` (its rebuilt `archive`) taken from `source`; the same workspace
    /// stored before is the same checkpoint, its expiry extended to the later of the two.
    pub fn put(
        &self,
        checkpoint: &Checkpoint,
        archive: &[u8],
        source: (&str, &str),
        retention: Option<Duration>,
    ) -> Result<StoredCheckpoint, PortableError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| io_error(&self.dir, e))?;
        let digest = checkpoint.digest();
        let hex = digest.trim_start_matches("sha256:").to_owned();
        let (tar_path, record_path) = self.paths(&hex);
        let now = Utc::now();
        let mut expires_at = retention.map(|r| now + r);
        if let Ok(earlier) = self.record(&hex) {
            expires_at = match (earlier.expires_at, expires_at) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        let record = StoredCheckpoint {
            schema: CHECKPOINT_SCHEMA.into(),
            id: format!("{CHECKPOINT_PREFIX}{hex}"),
            digest,
            source: source.0.to_owned(),
            source_provider: source.1.to_owned(),
            created_at: now,
            expires_at,
            counts: checkpoint.counts(),
            not_carried: checkpoint.not_carried.clone(),
            archive_bytes: archive.len() as u64,
        };
        // The archive first: a record always names an archive that is whole.
        self.write_whole(&tar_path, archive)?;
        let json = serde_json::to_vec_pretty(&record).map_err(|e| io_error(&record_path, e))?;
        self.write_whole(&record_path, &json)?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error(&self.dir, e))?;
        Ok(record)
    }

    fn write_whole(&self, path: &Path, bytes: &[u8]) -> Result<(), PortableError> {
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).expect("the OS random source works");
        let temp = self.dir.join(format!(".tmp-{}", hex::encode(nonce)));
        let written = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            std::fs::rename(&temp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written.map_err(|e| io_error(path, e))
    }

    fn record(&self, hex: &str) -> Result<StoredCheckpoint, PortableError> {
        let (_, record_path) = self.paths(hex);
        let bytes = read_bounded(&record_path, MAX_RECORD_BYTES)?;
        let record: StoredCheckpoint = serde_json::from_slice(&bytes)
            .map_err(|e| io_error(&record_path, format!("not a checkpoint record: {e}")))?;
        if record.schema != CHECKPOINT_SCHEMA || record.id != format!("{CHECKPOINT_PREFIX}{hex}") {
            return Err(io_error(
                &record_path,
                "a record of another schema or checkpoint",
            ));
        }
        Ok(record)
    }

    /// A stored checkpoint, read and checked: its archive must be the workspace its id names.
    pub fn get(&self, id: &str) -> Result<(StoredCheckpoint, Checkpoint), PortableError> {
        let hex = Self::hex_of(id)?;
        let record = match self.record(hex) {
            Ok(record) => record,
            Err(_) if !self.paths(hex).1.exists() => {
                return Err(PortableError::NoCheckpoint {
                    id: id.to_owned(),
                    reason: "no such checkpoint of this owner".into(),
                })
            }
            Err(e) => return Err(e),
        };
        let (tar_path, _) = self.paths(hex);
        let bytes = read_bounded(&tar_path, crate::LIMIT as u64 + (64 << 20))?;
        let checkpoint = parse_as(&bytes, Keep::Archive)?;
        if checkpoint.digest() != record.digest {
            return Err(io_error(
                &tar_path,
                format!(
                    "holds {}, not the checkpoint its name says",
                    checkpoint.digest()
                ),
            ));
        }
        Ok((record, checkpoint))
    }

    /// This owner's checkpoints, oldest first.
    pub fn list(&self) -> Result<Vec<StoredCheckpoint>, PortableError> {
        let mut found = Vec::new();
        for hex in self.ids()? {
            if let Ok(record) = self.record(&hex) {
                found.push(record);
            }
        }
        found.sort_by_key(|r| r.created_at);
        Ok(found)
    }

    fn ids(&self) -> Result<Vec<String>, PortableError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error(&self.dir, e)),
        };
        let mut ids = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(hex) = name
                .strip_suffix(".tar")
                .and_then(|id| Self::hex_of(id).ok())
            {
                ids.push(hex.to_owned());
            }
        }
        Ok(ids)
    }

    /// Deletes a checkpoint (record first: what remains of a crash is an archive `gc` takes).
    /// Whether it existed.
    pub fn delete(&self, id: &str) -> Result<bool, PortableError> {
        let hex = Self::hex_of(id)?;
        let (tar_path, record_path) = self.paths(hex);
        let mut existed = false;
        for path in [record_path, tar_path] {
            match std::fs::remove_file(&path) {
                Ok(()) => existed = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&path, e)),
            }
        }
        Ok(existed)
    }

    /// Deletes expired checkpoints, and what a crash left: temporary files and archives without
    /// a record, once they are [`ORPHAN_AFTER`] old (a `put` under way writes them).
    pub fn gc(&self, now: DateTime<Utc>) -> Result<Vec<Collected>, PortableError> {
        let mut collected = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(collected),
            Err(e) => return Err(io_error(&self.dir, e)),
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .map(|t| t.elapsed().unwrap_or_default() >= ORPHAN_AFTER)
                .unwrap_or(false);
            let hex = name
                .strip_suffix(".tar")
                .and_then(|id| Self::hex_of(id).ok())
                .map(str::to_owned);
            let reason = match hex {
                None if name.starts_with(".tmp-") && old => {
                    Some("half-written by a crash".to_owned())
                }
                Some(hex) => match self.record(&hex) {
                    Ok(record) if record.expires_at.is_some_and(|t| t <= now) => {
                        Some("past its retention".to_owned())
                    }
                    Err(_) if old => Some("no record (a crash between the two writes)".to_owned()),
                    _ => None,
                },
                None => None,
            };
            if let Some(reason) = reason {
                let id = name.trim_end_matches(".tar").to_owned();
                if name.starts_with(".tmp-") {
                    let _ = std::fs::remove_file(entry.path());
                } else {
                    self.delete(&id)?;
                }
                collected.push(Collected { name: id, reason });
            }
        }
        Ok(collected)
    }
}

fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, PortableError> {
    let file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(io_error(path, format!("larger than {limit} bytes")));
    }
    Ok(bytes)
}

/// A sandbox made from a stored checkpoint.
#[derive(Debug, Serialize)]
pub struct Restored {
    /// The checkpoint.
    pub checkpoint: String,
    /// The new sandbox.
    pub sandbox: Tracked,
    /// What it holds.
    pub counts: Counts,
}

/// Takes a checkpoint of sandbox `native` (ledger id `source`) on `provider` into `store`.
pub async fn take_checkpoint(
    store: &CheckpointStore,
    provider: &dyn Provider,
    source: &str,
    native: &NativeId,
    retention: Option<Duration>,
) -> Result<StoredCheckpoint, PortableError> {
    provider.require_files()?;
    let mut checkpoint = Checkpoint::read(provider, native).await?;
    let archive = std::mem::take(&mut checkpoint.archive);
    store.put(&checkpoint, &archive, (source, provider.id()), retention)
}

/// Makes a sandbox on `target` from stored checkpoint `id`, under the ledger (origin
/// `checkpoint:ID`), and verifies it holds exactly the checkpoint; a sandbox that does not is
/// removed and the error says how it differed.
pub async fn restore_checkpoint(
    ledger: &Ledger,
    store: &CheckpointStore,
    id: &str,
    target: std::sync::Arc<dyn Provider>,
    ttl: Option<Duration>,
    prepare: impl FnOnce(&mut CreateRequest),
) -> Result<Restored, PortableError> {
    let (record, mut checkpoint) = store.get(id)?;
    target.require_files()?;
    let archive = std::mem::take(&mut checkpoint.archive);
    let maker = target.clone();
    let tracked = ledger
        .create_tracked(
            target.as_ref(),
            &format!("checkpoint:{id}"),
            ttl,
            prepare,
            |create| async move { maker.create(&create).await },
        )
        .await?;
    let native = NativeId(tracked.native_id.clone());
    let restored = async {
        crate::restore::unpack(target.as_ref(), &native, &checkpoint, archive).await?;
        crate::restore::verify(target.as_ref(), &native, &checkpoint).await
    }
    .await;
    if let Err(cause) = restored {
        return Err(
            crate::moving::abandon(ledger, target.as_ref(), &record.id, &tracked, cause).await,
        );
    }
    Ok(Restored {
        checkpoint: record.id,
        sandbox: tracked,
        counts: checkpoint.counts(),
    })
}
