//! Berth's artifact bundles: every attempt, accepted or rejected, leaves portable evidence that
//! can be read later without Berth's database or the provider.
//!
//! - [`bundle`] — the files of an attempt, redacted, content-addressed (BLAKE3; SHA-256 beside
//!   it), described by `manifest.json` (schema `berth.bundle/v1`); deterministic ids.
//! - [`redact`] — the scanner every published byte goes through.
//! - [`objects`] — the object store (`object_store`; a local directory by default): immutable
//!   objects, written create-if-absent, verified on read.
//! - [`publish`](mod@publish) — the claim protocol over the store's [`berth_store::ArtifactStore`] contract,
//!   and [`publish::reconcile`].
//!
//! Layout in the object store: `cas/blake3/XX/HASH` (content), `bundles/ID/manifest.json`.

mod archive_redaction;
pub mod bundle;
pub mod export;
#[cfg(feature = "iceberg")]
pub mod iceberg_index;
pub mod objects;
pub mod publish;
/// The redaction scanner (the `berth-redact` crate, shared with the gateway and the logs).
pub mod redact {
    pub use berth_redact::*;
}

pub use archive_redaction::redact_archive;
pub use berth_redact::Redactor;
pub use bundle::{build, Bundle, BundleFile, BundleInput, Lifecycle, Manifest};
pub use objects::{Objects, S3Config};
pub use publish::{publish, reconcile, PublishStep, Reconciled};

use berth_store::{ArtifactQuery, ArtifactStore};

/// An artifact operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArtifactError {
    /// The request is malformed (a hostile path, a duplicate file).
    #[error("invalid artifact request: {0}")]
    Invalid(String),
    /// No such bundle, file or object.
    #[error("not found: {0}")]
    NotFound(String),
    /// Stored bytes do not hash to what the manifest says, or a claim disagrees with its
    /// bundle: nothing is returned as if it were good.
    #[error("corrupt artifact: {0}")]
    Corrupt(String),
    /// The object store failed.
    #[error("object store: {0}")]
    Storage(String),
    /// The store failed.
    #[error("store: {0}")]
    Store(String),
    /// Writing or reading an export (Parquet, Iceberg) failed.
    #[error("export: {0}")]
    Export(String),
    /// The claim expired: its bundle will not be indexed.
    #[error("publication of {0} expired")]
    Expired(String),
}

/// The BLAKE3 content id of `bytes` (hex).
pub fn content_id(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Reads one file of an indexed bundle from the object store, verified against its index row.
pub async fn read_file(
    store: &dyn ArtifactStore,
    objects: &Objects,
    bundle_id: &str,
    path: &str,
) -> Result<Vec<u8>, ArtifactError> {
    let rows = store
        .artifacts(&ArtifactQuery {
            bundle_id: Some(bundle_id.to_owned()),
            path: Some(path.to_owned()),
            ..Default::default()
        })
        .await
        .map_err(|e| ArtifactError::Store(e.to_string()))?;
    let row = rows
        .first()
        .ok_or_else(|| ArtifactError::NotFound(format!("`{path}` in bundle {bundle_id}")))?;
    objects.get_verified(&row.object_key, &row.blake3).await
}
