//! Publication: claim (durable, before any external write) → objects written create-if-absent
//! and verified → `uploaded` → index rows → `indexed`. Every step repeats harmlessly, so a
//! crash anywhere is finished by publishing the same bundle again or by [`reconcile`].

use std::time::Duration;

use berth_store::{
    ArtifactRow, ArtifactStore, NewPublication, PublicationRow, PublicationState, StoreError,
};
use serde::Serialize;

use crate::bundle::{manifest_key, Bundle, Manifest, MANIFEST_PATH, MANIFEST_SCHEMA_VERSION};
use crate::objects::Objects;
use crate::ArtifactError;

/// A durable step of publication, for crash tests (called after each one completes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishStep {
    /// The claim is durable.
    Claimed,
    /// One object is written (the index of the object).
    Wrote(usize),
    /// Every object is verified and the claim is `uploaded`.
    Uploaded,
    /// The index rows are written and the claim is `indexed`.
    Indexed,
}

/// Object writes in flight at once.
pub const WRITES_IN_FLIGHT: usize = 8;

fn store_err(e: StoreError) -> ArtifactError {
    ArtifactError::Store(e.to_string())
}

/// The index rows of a bundle, the manifest's own among them.
fn index_rows(manifest: &Manifest, manifest_bytes: &[u8]) -> Vec<ArtifactRow> {
    let row =
        |path: &str, mime: &str, size: u64, blake3: &str, sha256: &str, key: &str| ArtifactRow {
            bundle_id: manifest.bundle_id.clone(),
            path: path.to_owned(),
            mission_id: manifest.mission.clone(),
            task_id: manifest.task.clone(),
            attempt_key: manifest.attempt_key.clone(),
            accepted: manifest.accepted,
            mime: mime.to_owned(),
            size,
            blake3: blake3.to_owned(),
            sha256: sha256.to_owned(),
            object_key: key.to_owned(),
        };
    let mut rows: Vec<ArtifactRow> = manifest
        .files
        .iter()
        .map(|f| {
            row(
                &f.path,
                &f.mime,
                f.size,
                &f.blake3,
                &f.sha256,
                &f.object_key,
            )
        })
        .collect();
    use sha2::Digest;
    rows.push(row(
        MANIFEST_PATH,
        "application/json",
        manifest_bytes.len() as u64,
        &blake3::hash(manifest_bytes).to_hex(),
        &hex::encode(sha2::Sha256::digest(manifest_bytes)),
        &manifest_key(&manifest.bundle_id),
    ));
    rows
}

/// Publishes `bundle` (see the module). Returns the claim as it ends: `indexed`, or an error
/// with the claim left for a retry or [`reconcile`].
pub async fn publish(
    store: &dyn ArtifactStore,
    objects: &Objects,
    bundle: &Bundle,
    step: &mut (dyn FnMut(PublishStep) + Send),
) -> Result<PublicationRow, ArtifactError> {
    let manifest = &bundle.manifest;
    let manifest_json = String::from_utf8(bundle.manifest_bytes.clone())
        .map_err(|_| ArtifactError::Invalid("the manifest is not UTF-8".into()))?;
    let claim = store
        .publication_claim(&NewPublication {
            bundle_id: manifest.bundle_id.clone(),
            schema_version: MANIFEST_SCHEMA_VERSION,
            mission_id: manifest.mission.clone(),
            task_id: manifest.task.clone(),
            attempt_key: manifest.attempt_key.clone(),
            accepted: manifest.accepted,
            manifest_json,
        })
        .await
        .map_err(store_err)?;
    step(PublishStep::Claimed);
    if claim.manifest_json.as_bytes() != bundle.manifest_bytes.as_slice() {
        return Err(ArtifactError::Corrupt(format!(
            "bundle {} was claimed with a different manifest",
            manifest.bundle_id
        )));
    }
    match claim.state {
        PublicationState::Indexed => return Ok(claim),
        PublicationState::Expired => {
            return Err(ArtifactError::Expired(manifest.bundle_id.clone()));
        }
        PublicationState::Pending => {
            // Several writes in flight: each is a blocking write on the local backend, a
            // request on S3.
            use futures::StreamExt;
            let puts: Vec<_> = bundle
                .objects
                .iter()
                .map(|(key, bytes)| {
                    let hash = key.rsplit('/').next().unwrap_or_default();
                    objects.put_if_absent(key, bytes.clone(), hash)
                })
                .collect();
            let mut writes = futures::stream::iter(puts).buffer_unordered(WRITES_IN_FLIGHT);
            let mut written = 0;
            while let Some(result) = writes.next().await {
                result?;
                step(PublishStep::Wrote(written));
                written += 1;
            }
            drop(writes);
            let manifest_hash = blake3::hash(&bundle.manifest_bytes).to_hex().to_string();
            objects
                .put_if_absent(
                    &manifest_key(&manifest.bundle_id),
                    bytes::Bytes::from(bundle.manifest_bytes.clone()),
                    &manifest_hash,
                )
                .await?;
            step(PublishStep::Wrote(bundle.objects.len()));
            store
                .publication_advance(
                    &manifest.bundle_id,
                    PublicationState::Pending,
                    PublicationState::Uploaded,
                    None,
                )
                .await
                .map_err(store_err)?;
            step(PublishStep::Uploaded);
        }
        PublicationState::Uploaded => {}
    }
    store
        .publication_index(
            &manifest.bundle_id,
            &index_rows(manifest, &bundle.manifest_bytes),
        )
        .await
        .map_err(store_err)?;
    step(PublishStep::Indexed);
    let done = store
        .publication_get(&manifest.bundle_id)
        .await
        .map_err(store_err)?;
    match done.state {
        PublicationState::Indexed => Ok(done),
        other => Err(ArtifactError::Storage(format!(
            "bundle {} ended {other:?}, not indexed",
            manifest.bundle_id
        ))),
    }
}

/// What [`reconcile`] did.
#[derive(Debug, Default, Serialize)]
pub struct Reconciled {
    /// Claims finished (every object was there): now indexed.
    pub finished: Vec<String>,
    /// Claims whose objects are missing, older than the retry window: now expired.
    pub expired: Vec<String>,
    /// Claims whose objects are missing, still within the window (their attempt's publication
    /// will write them when its mission resumes).
    pub waiting: Vec<String>,
    /// Objects no claim names (left in place; reported).
    pub orphans: Vec<String>,
    /// Staging files killed local writes left, removed (see [`Objects::remove_stale_staging`]).
    pub staging_removed: Vec<String>,
}

/// Finishes or expires interrupted claims and reports orphan objects.
pub async fn reconcile(
    store: &dyn ArtifactStore,
    objects: &Objects,
    retry_window: Duration,
) -> Result<Reconciled, ArtifactError> {
    let mut done = Reconciled {
        staging_removed: objects.remove_stale_staging("", retry_window)?,
        ..Default::default()
    };
    let claims = store.publications(None).await.map_err(store_err)?;
    let mut named = std::collections::BTreeSet::new();
    for claim in &claims {
        let manifest: Manifest = serde_json::from_str(&claim.manifest_json).map_err(|e| {
            ArtifactError::Corrupt(format!("claim {}: manifest: {e}", claim.bundle_id))
        })?;
        named.insert(manifest_key(&manifest.bundle_id));
        for file in &manifest.files {
            named.insert(file.object_key.clone());
        }
        if !matches!(
            claim.state,
            PublicationState::Pending | PublicationState::Uploaded
        ) {
            continue;
        }
        if claim.state == PublicationState::Pending {
            let mut complete = true;
            for file in &manifest.files {
                match objects.get_verified(&file.object_key, &file.blake3).await {
                    Ok(_) => {}
                    Err(ArtifactError::NotFound(_)) => complete = false,
                    Err(e) => return Err(e),
                }
            }
            let manifest_bytes = claim.manifest_json.as_bytes();
            let manifest_hash = blake3::hash(manifest_bytes).to_hex().to_string();
            if complete {
                objects
                    .put_if_absent(
                        &manifest_key(&claim.bundle_id),
                        bytes::Bytes::copy_from_slice(manifest_bytes),
                        &manifest_hash,
                    )
                    .await?;
                store
                    .publication_advance(
                        &claim.bundle_id,
                        PublicationState::Pending,
                        PublicationState::Uploaded,
                        None,
                    )
                    .await
                    .map_err(store_err)?;
            } else {
                let age = chrono::Utc::now() - claim.created_at;
                if age.to_std().unwrap_or_default() >= retry_window {
                    store
                        .publication_advance(
                            &claim.bundle_id,
                            PublicationState::Pending,
                            PublicationState::Expired,
                            Some("objects missing after the retry window"),
                        )
                        .await
                        .map_err(store_err)?;
                    done.expired.push(claim.bundle_id.clone());
                } else {
                    done.waiting.push(claim.bundle_id.clone());
                }
                continue;
            }
        }
        store
            .publication_index(
                &claim.bundle_id,
                &index_rows(&manifest, claim.manifest_json.as_bytes()),
            )
            .await
            .map_err(store_err)?;
        done.finished.push(claim.bundle_id.clone());
    }
    for prefix in ["cas", "bundles"] {
        for key in objects.keys(prefix).await? {
            if !named.contains(&key) {
                done.orphans.push(key);
            }
        }
    }
    Ok(done)
}
