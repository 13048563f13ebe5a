//! The object store: immutable objects, written create-if-absent and verified on read.

use std::path::Path;
use std::sync::Arc;

use object_store::{
    path::Path as ObjectPath, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};

use crate::ArtifactError;

/// An S3-compatible object store.
#[derive(Clone)]
pub struct S3Config {
    /// `s3://BUCKET[/PREFIX]`.
    pub url: String,
    /// An endpoint other than AWS's (`http://127.0.0.1:8333`).
    pub endpoint: Option<String>,
    /// Region (`us-east-1` for most S3-compatible servers).
    pub region: String,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("url", &self.url)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &"[redacted]")
            .field("secret_access_key", &"[redacted]")
            .finish()
    }
}

/// Where bundles' objects live.
#[derive(Debug, Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    /// The directory, when the store is local (its writes stage through `KEY#N` files).
    local_root: Option<std::path::PathBuf>,
    /// What it is, for messages (`file:///…`).
    pub location: String,
}

fn path(key: &str) -> Result<ObjectPath, ArtifactError> {
    ObjectPath::parse(key).map_err(|e| ArtifactError::Invalid(format!("object key `{key}`: {e}")))
}

fn storage(what: &str, e: object_store::Error) -> ArtifactError {
    ArtifactError::Storage(format!("{what}: {e}"))
}

impl Objects {
    /// A local directory (created 0700 when missing).
    pub fn local(root: &Path) -> Result<Objects, ArtifactError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(|e| ArtifactError::Storage(format!("{}: {e}", root.display())))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(root)
            .map_err(|e| storage("open the local object store", e))?;
        Ok(Objects {
            store: Arc::new(store),
            local_root: Some(root.to_owned()),
            location: format!("file://{}", root.display()),
        })
    }

    /// An S3-compatible bucket (`s3://BUCKET[/PREFIX]`), with create-if-absent puts
    /// (`If-None-Match: *`). Credentials are values the caller read from the variables the
    /// configuration names; they are never printed or stored.
    pub fn s3(config: &S3Config) -> Result<Objects, ArtifactError> {
        use object_store::aws::AmazonS3Builder;
        let rest = config.url.strip_prefix("s3://").ok_or_else(|| {
            ArtifactError::Invalid(format!("`{}` is not an s3:// URL", config.url))
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(ArtifactError::Invalid(format!(
                "`{}` names no bucket",
                config.url
            )));
        }
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key);
        if let Some(endpoint) = &config.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        // The client's TLS needs a process-wide crypto provider (see Cargo.toml): ring, installed
        // once (a second install only reports that one is there).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = builder
            .build()
            .map_err(|e| storage("configure the S3 object store", e))?;
        let location = match &config.endpoint {
            Some(endpoint) => format!("{} at {endpoint}", config.url),
            None => config.url.clone(),
        };
        let prefix = prefix.trim_matches('/');
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            Arc::new(store)
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(
                store,
                prefix.to_owned(),
            ))
        };
        Ok(Objects {
            store,
            local_root: None,
            location,
        })
    }

    /// Any `object_store` backend (S3-compatible, in memory for tests).
    pub fn from_store(store: Arc<dyn ObjectStore>, location: String) -> Objects {
        Objects {
            store,
            local_root: None,
            location,
        }
    }

    /// Writes `bytes` under `key` unless an object is there already; an object already there
    /// must hash to `blake3_hex` (a replay), or this is an error and nothing is overwritten.
    pub async fn put_if_absent(
        &self,
        key: &str,
        bytes: bytes::Bytes,
        blake3_hex: &str,
    ) -> Result<(), ArtifactError> {
        let at = path(key)?;
        let options = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&at, PutPayload::from(bytes), options)
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                self.get_verified(key, blake3_hex).await.map(|_| ())
            }
            Err(e) => Err(storage(&format!("write {key}"), e)),
        }
    }

    /// Writes `bytes` under `key` only if no object is there: whether this call made it (an
    /// object already there is left as it is). Atomic in both stores (a local link; S3's
    /// `If-None-Match: *`), so of many writers of one key exactly one is told `true`.
    pub async fn create_new(&self, key: &str, bytes: bytes::Bytes) -> Result<bool, ArtifactError> {
        let options = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&path(key)?, PutPayload::from(bytes), options)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(storage(&format!("write {key}"), e)),
        }
    }

    /// Removes what a killed local write left: the staging file `KEY#N` the local store writes
    /// before linking it to `KEY`. One is removed when `KEY` is complete beside it (that write
    /// finished, or another did), or when it is older than `stale` (its writer is long gone);
    /// a younger one may belong to a write in progress and stays. Symlinks are never followed.
    /// Only keys under `under` (`""`: all). The keys removed (S3 stages nothing: none).
    pub fn remove_stale_staging(
        &self,
        under: &str,
        stale: std::time::Duration,
    ) -> Result<Vec<String>, ArtifactError> {
        let Some(root) = &self.local_root else {
            return Ok(Vec::new());
        };
        let mut removed = Vec::new();
        let mut dirs = vec![root.join(path(under)?.as_ref())];
        while let Some(dir) = dirs.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ArtifactError::Storage(format!("{}: {e}", dir.display()))),
            };
            for entry in entries.flatten() {
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                let path = entry.path();
                if kind.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if !kind.is_file() {
                    continue;
                }
                let name = entry.file_name();
                let Some((base, n)) = name.to_str().and_then(|n| n.rsplit_once('#')) else {
                    continue;
                };
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    continue;
                }
                let complete = std::fs::symlink_metadata(dir.join(base)).is_ok_and(|m| m.is_file());
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().unwrap_or_default() >= stale);
                if (complete || old) && std::fs::remove_file(&path).is_ok() {
                    removed.push(
                        path.strip_prefix(root)
                            .unwrap_or(&path)
                            .to_string_lossy()
                            .into_owned(),
                    );
                }
            }
        }
        removed.sort();
        Ok(removed)
    }

    /// Reads `key` and checks it hashes to `blake3_hex`.
    pub async fn get_verified(
        &self,
        key: &str,
        blake3_hex: &str,
    ) -> Result<Vec<u8>, ArtifactError> {
        let bytes = self.get(key).await?;
        let found = blake3::hash(&bytes).to_hex().to_string();
        if found != blake3_hex {
            return Err(ArtifactError::Corrupt(format!(
                "object {key} in {} hashes to {found}, not {blake3_hex}",
                self.location
            )));
        }
        Ok(bytes)
    }

    /// Reads `key` as it is (`NotFound` when absent).
    pub async fn get(&self, key: &str) -> Result<Vec<u8>, ArtifactError> {
        match self.store.get(&path(key)?).await {
            Ok(found) => found
                .bytes()
                .await
                .map(|b| b.to_vec())
                .map_err(|e| storage(&format!("read {key}"), e)),
            Err(object_store::Error::NotFound { .. }) => Err(ArtifactError::NotFound(format!(
                "object {key} in {}",
                self.location
            ))),
            Err(e) => Err(storage(&format!("read {key}"), e)),
        }
    }

    /// Writes `bytes` under `key`, replacing what is there (a record that changes, unlike the
    /// content-addressed objects [`Objects::put_if_absent`] writes).
    pub async fn put_overwrite(&self, key: &str, bytes: bytes::Bytes) -> Result<(), ArtifactError> {
        let options = PutOptions {
            mode: PutMode::Overwrite,
            ..Default::default()
        };
        self.store
            .put_opts(&path(key)?, PutPayload::from(bytes), options)
            .await
            .map(|_| ())
            .map_err(|e| storage(&format!("write {key}"), e))
    }

    /// Reads `key`, refusing one larger than `max` bytes before reading it; never more than the
    /// size it had when asked (`NotFound` when absent). Whoever else can write the store
    /// decides how large an object is.
    pub async fn get_bounded(&self, key: &str, max: u64) -> Result<Vec<u8>, ArtifactError> {
        let at = path(key)?;
        let size = match self.store.head(&at).await {
            Ok(meta) => meta.size,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(ArtifactError::NotFound(format!(
                    "object {key} in {}",
                    self.location
                )))
            }
            Err(e) => return Err(storage(&format!("read {key}"), e)),
        };
        if size > max {
            return Err(ArtifactError::Invalid(format!(
                "object {key} in {} holds {size} bytes, more than the {max} it may",
                self.location
            )));
        }
        if size == 0 {
            return Ok(Vec::new());
        }
        self.store
            .get_range(&at, 0..size)
            .await
            .map(|b| b.to_vec())
            .map_err(|e| storage(&format!("read {key}"), e))
    }

    /// Deletes `key`; whether it was there.
    pub async fn delete(&self, key: &str) -> Result<bool, ArtifactError> {
        let at = path(key)?;
        match self.store.head(&at).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(storage(&format!("find {key}"), e)),
        }
        match self.store.delete(&at).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(true),
            Err(e) => Err(storage(&format!("delete {key}"), e)),
        }
    }

    /// Every object under `prefix` with when it was last written, by key.
    pub async fn listed(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, std::time::SystemTime)>, ArtifactError> {
        use futures::StreamExt;
        let mut listed = self.store.list(Some(&path(prefix)?));
        let mut found = Vec::new();
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(|e| storage("list objects", e))?;
            found.push((meta.location.to_string(), meta.last_modified.into()));
        }
        found.sort();
        Ok(found)
    }

    /// Every key under `prefix`.
    pub async fn keys(&self, prefix: &str) -> Result<Vec<String>, ArtifactError> {
        use futures::StreamExt;
        let mut listed = self.store.list(Some(&path(prefix)?));
        let mut keys = Vec::new();
        while let Some(meta) = listed.next().await {
            keys.push(
                meta.map_err(|e| storage("list objects", e))?
                    .location
                    .to_string(),
            );
        }
        keys.sort();
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Records that change are replaced whole; reads are bounded before they start; a delete
    /// says whether there was something to delete.
    #[tokio::test]
    async fn overwrite_bounded_read_delete_and_listing() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::local(dir.path()).unwrap();
        objects
            .put_overwrite("a/record.json", bytes::Bytes::from_static(b"first"))
            .await
            .unwrap();
        objects
            .put_overwrite("a/record.json", bytes::Bytes::from_static(b"second!"))
            .await
            .unwrap();
        assert_eq!(
            objects.get_bounded("a/record.json", 7).await.unwrap(),
            b"second!"
        );
        assert!(matches!(
            objects.get_bounded("a/record.json", 6).await,
            Err(ArtifactError::Invalid(_))
        ));
        assert!(matches!(
            objects.get_bounded("a/none", 6).await,
            Err(ArtifactError::NotFound(_))
        ));
        let listed = objects.listed("a").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].0, "a/record.json");
        assert!(objects.delete("a/record.json").await.unwrap());
        assert!(!objects.delete("a/record.json").await.unwrap());
        assert!(objects.listed("a").await.unwrap().is_empty());
    }

    /// reqwest carries no crypto provider of its own in this build (ring is installed by
    /// `Objects::s3`): an https endpoint must get a TLS handshake, not a panic or plain HTTP.
    #[tokio::test]
    async fn an_https_endpoint_gets_a_tls_handshake() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut record = [0u8; 3];
            socket.read_exact(&mut record).await.unwrap();
            record
        });
        let objects = Objects::s3(&S3Config {
            url: "s3://bucket".into(),
            endpoint: Some(format!("https://127.0.0.1:{port}")),
            region: "us-east-1".into(),
            access_key_id: "id".into(),
            secret_access_key: "key".into(),
        })
        .unwrap();
        let client = tokio::spawn(async move { objects.get("any").await });
        let record = tokio::time::timeout(std::time::Duration::from_secs(20), server)
            .await
            .expect("the client connects within 20 s")
            .unwrap();
        // A TLS record: handshake (22), protocol version 3.x.
        assert_eq!(record[..2], [22, 3], "not a TLS handshake: {record:?}");
        client.abort();
    }
}
