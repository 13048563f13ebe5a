//! Checkpoints kept by Berth: a workspace stored apart from any provider, restorable on any of
//! them (`berth checkpoint ID`, `berth restore ws-… --provider P`).
//!
//! The backend is Berth's object store (the artifacts family's: a local directory by default,
//! an S3-compatible bucket for many machines), under `checkpoints/OWNER/`, where OWNER is a
//! digest of the owner's name: `ws-HEX.tar` (the archive Berth rebuilt) and `ws-HEX.json` (its
//! record), HEX being the checkpoint's manifest digest — the same workspace is one checkpoint.
//! Each object appears whole or not at all (the store's own guarantee), the archive before its
//! record; a crash leaves at most an archive without a record (or a local store's staging
//! file), which `gc` removes once it is old, with expired checkpoints. Everyone who can write
//! the store is untrusted: every read is bounded, and an archive is checked against its id with
//! the strict rules a sandbox's archive meets.

use std::time::{Duration, SystemTime};

use berth_artifacts::{ArtifactError, Objects};
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
/// How old an archive without a record must be before `gc` takes it for a crash's leftover.
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
    /// The sandbox it was taken from.
    pub source: String,
    /// The source's provider.
    pub source_provider: String,
    /// When it was taken.
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

/// One owner's checkpoints in an object store.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    objects: Objects,
    prefix: String,
}

/// What `gc` removed, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Collected {
    /// The checkpoint or object.
    pub name: String,
    /// Why it went.
    pub reason: String,
}

fn not_found(id: &str) -> PortableError {
    PortableError::NoCheckpoint {
        id: id.to_owned(),
        reason: "no such checkpoint of this owner".into(),
    }
}

impl CheckpointStore {
    /// The checkpoints of `owner` in `objects`. Owners are kept apart by a digest of their
    /// name: any owner string makes a safe key then.
    pub fn new(objects: Objects, owner: &str) -> CheckpointStore {
        let hashed = hex::encode(&Sha256::digest(owner.as_bytes())[..12]);
        CheckpointStore {
            objects,
            prefix: format!("checkpoints/{hashed}"),
        }
    }

    /// The id's hex, or why it is no checkpoint id (it becomes an object key).
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

    fn keys(&self, hex: &str) -> (String, String) {
        (
            format!("{}/ws-{hex}.tar", self.prefix),
            format!("{}/ws-{hex}.json", self.prefix),
        )
    }

    /// Stores `checkpoint` (its rebuilt `archive`) taken from `source` (sandbox, provider);
    /// the same workspace stored before is the same checkpoint, its expiry the later of the two.
    pub async fn put(
        &self,
        checkpoint: &Checkpoint,
        archive: Vec<u8>,
        source: (&str, &str),
        retention: Option<Duration>,
    ) -> Result<StoredCheckpoint, PortableError> {
        let digest = checkpoint.digest();
        let hex = digest.trim_start_matches("sha256:").to_owned();
        let (tar_key, record_key) = self.keys(&hex);
        let now = Utc::now();
        let mut expires_at = retention.map(|r| now + r);
        if let Ok(earlier) = self.record(&hex).await {
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
        self.objects.put_overwrite(&tar_key, archive.into()).await?;
        let json = serde_json::to_vec_pretty(&record).map_err(|e| PortableError::Record {
            path: record_key.clone(),
            message: e.to_string(),
        })?;
        self.objects.put_overwrite(&record_key, json.into()).await?;
        Ok(record)
    }

    async fn record(&self, hex: &str) -> Result<StoredCheckpoint, PortableError> {
        let (_, record_key) = self.keys(hex);
        let bytes = self
            .objects
            .get_bounded(&record_key, MAX_RECORD_BYTES)
            .await?;
        let corrupt = |message: String| PortableError::Record {
            path: format!("{} in {}", record_key, self.objects.location),
            message,
        };
        let record: StoredCheckpoint = serde_json::from_slice(&bytes)
            .map_err(|e| corrupt(format!("not a checkpoint record: {e}")))?;
        if record.schema != CHECKPOINT_SCHEMA || record.id != format!("{CHECKPOINT_PREFIX}{hex}") {
            return Err(corrupt("a record of another schema or checkpoint".into()));
        }
        Ok(record)
    }

    /// A stored checkpoint, read and checked: its archive must be the workspace its id names.
    pub async fn get(&self, id: &str) -> Result<(StoredCheckpoint, Checkpoint), PortableError> {
        let hex = Self::hex_of(id)?;
        let record = match self.record(hex).await {
            Err(PortableError::Objects(ArtifactError::NotFound(_))) => return Err(not_found(id)),
            other => other?,
        };
        let (tar_key, _) = self.keys(hex);
        let bytes = match self
            .objects
            .get_bounded(&tar_key, crate::LIMIT as u64 + (64 << 20))
            .await
        {
            Err(ArtifactError::NotFound(_)) => return Err(not_found(id)),
            other => other?,
        };
        let checkpoint = parse_as(&bytes, Keep::Archive)?;
        if checkpoint.digest() != record.digest {
            return Err(PortableError::Record {
                path: format!("{} in {}", tar_key, self.objects.location),
                message: format!(
                    "holds {}, not the checkpoint its name says",
                    checkpoint.digest()
                ),
            });
        }
        Ok((record, checkpoint))
    }

    /// The hex of every stored archive (a key that is no checkpoint's is passed over), with
    /// when it was written, and of every record.
    async fn stored(&self) -> Result<Vec<(String, &'static str, SystemTime)>, PortableError> {
        let mut found = Vec::new();
        for (key, written) in self.objects.listed(&self.prefix).await? {
            let name = key.rsplit('/').next().unwrap_or_default();
            for kind in ["tar", "json"] {
                if let Some(hex) = name
                    .strip_suffix(&format!(".{kind}"))
                    .and_then(|id| Self::hex_of(id).ok())
                {
                    found.push((hex.to_owned(), kind, written));
                }
            }
        }
        Ok(found)
    }

    /// This owner's checkpoints, oldest first (a record that cannot be read is passed over).
    pub async fn list(&self) -> Result<Vec<StoredCheckpoint>, PortableError> {
        let mut found = Vec::new();
        for (hex, kind, _) in self.stored().await? {
            if kind == "json" {
                if let Ok(record) = self.record(&hex).await {
                    found.push(record);
                }
            }
        }
        found.sort_by_key(|r| r.created_at);
        Ok(found)
    }

    /// Deletes a checkpoint, record first (what remains of a crash is an archive `gc` takes).
    /// Whether it existed.
    pub async fn delete(&self, id: &str) -> Result<bool, PortableError> {
        let hex = Self::hex_of(id)?;
        let (tar_key, record_key) = self.keys(hex);
        let record = self.objects.delete(&record_key).await?;
        let archive = self.objects.delete(&tar_key).await?;
        Ok(record || archive)
    }

    /// Deletes expired checkpoints, and what a crash left: an archive without a record, or a
    /// local store's staging file, once two minutes old (a `put` under way writes them).
    pub async fn gc(&self, now: DateTime<Utc>) -> Result<Vec<Collected>, PortableError> {
        let mut collected = Vec::new();
        let stored = self.stored().await?;
        let archived: std::collections::BTreeSet<&str> = stored
            .iter()
            .filter(|(_, kind, _)| *kind == "tar")
            .map(|(hex, _, _)| hex.as_str())
            .collect();
        let mut deleted = std::collections::BTreeSet::new();
        for (hex, kind, written) in &stored {
            if deleted.contains(hex) {
                continue;
            }
            let id = format!("{CHECKPOINT_PREFIX}{hex}");
            let old = written.elapsed().unwrap_or_default() >= ORPHAN_AFTER;
            let reason = match (*kind, self.record(hex).await) {
                ("json", Ok(record)) if record.expires_at.is_some_and(|t| t <= now) => {
                    "past its retention"
                }
                ("json", _) if old && !archived.contains(hex.as_str()) => {
                    "a record without its archive"
                }
                ("tar", Err(_)) if old => "an archive without its record (a crash between them)",
                _ => continue,
            };
            self.delete(&id).await?;
            deleted.insert(hex.clone());
            collected.push(Collected {
                name: id,
                reason: reason.into(),
            });
        }
        for staged in self
            .objects
            .remove_stale_staging(&self.prefix, ORPHAN_AFTER)?
        {
            collected.push(Collected {
                name: staged,
                reason: "half-written by a crash".into(),
            });
        }
        Ok(collected)
    }
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
    store
        .put(&checkpoint, archive, (source, provider.id()), retention)
        .await
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
    let (record, mut checkpoint) = store.get(id).await?;
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
