//! A bundle: an attempt's files, redacted, content-addressed, described by its manifest.
//!
//! Identity is deterministic: each file's id is its BLAKE3 (SHA-256 recorded beside it for
//! other tools), the bundle's content id hashes the sorted (path, BLAKE3) list, and the bundle
//! id hashes the attempt key, the content id and the attempt's outcome — so rebuilding the
//! same attempt's bundle after a crash yields the same ids. The manifest holds no wall-clock
//! time for the same reason (the claim row records when it was published).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::redact::Redactor;
use crate::ArtifactError;

/// The manifest's schema name.
pub const MANIFEST_SCHEMA: &str = "berth.bundle/v1";
/// The manifest's schema version.
pub const MANIFEST_SCHEMA_VERSION: u32 = 1;
/// The manifest's path in its bundle.
pub const MANIFEST_PATH: &str = "manifest.json";
/// The largest file a bundle takes.
pub const MAX_FILE_BYTES: usize = 256 << 20;

/// A file to put in a bundle.
#[derive(Debug, Clone)]
pub struct BundleFile {
    /// Its path in the bundle (relative, `/`-separated, no `..`).
    pub path: String,
    /// MIME type.
    pub mime: String,
    /// Content.
    pub bytes: Vec<u8>,
    /// Compressed or otherwise opaque to the scanner (a git bundle): withheld when any file of
    /// the bundle needed redaction, since the same secret could hide inside it.
    pub opaque: bool,
    /// The file's size when only its first bytes are given (a log over the size limit); the
    /// manifest says so.
    pub truncated_from: Option<u64>,
}

/// What an attempt amounted to, as the bundle records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Lifecycle {
    /// `accepted` or `rejected`.
    pub outcome: String,
    /// Why it was rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The commit it was judged at (when the workspace was captured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The mission's base commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
    /// The restorable checkpoint (accepted attempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

/// Everything about an attempt a bundle is built from.
#[derive(Debug, Clone)]
pub struct BundleInput {
    /// Mission id.
    pub mission: String,
    /// Task id.
    pub task: String,
    /// Attempt key.
    pub attempt_key: String,
    /// Attempt ordinal.
    pub ordinal: u32,
    /// Outcome.
    pub lifecycle: Lifecycle,
    /// How long the bundle is kept (`forever` unless configured).
    pub retention: String,
    /// Token usage, when known (from the gateway's journal).
    pub usage: Option<serde_json::Value>,
    /// Files the caller could not include, and why (e.g. a git bundle over the size limit:
    /// cut short it would be corrupt).
    pub withheld: Vec<Withheld>,
    /// The files.
    pub files: Vec<BundleFile>,
}

/// One file as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ManifestFile {
    /// Path in the bundle.
    pub path: String,
    /// MIME type.
    pub mime: String,
    /// Size in bytes (after redaction).
    pub size: u64,
    /// BLAKE3, hex (the content id).
    pub blake3: String,
    /// SHA-256, hex.
    pub sha256: String,
    /// Secrets masked in it.
    pub redactions: u64,
    /// Where its object is (`cas/blake3/XX/HASH`).
    pub object_key: String,
    /// The original size when only the first bytes were kept (a log over the size limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_from: Option<u64>,
}

/// A file left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Withheld {
    /// Path it would have had.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// `manifest.json`: what a bundle holds, readable without Berth's database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Manifest {
    /// [`MANIFEST_SCHEMA`].
    pub schema: String,
    /// [`MANIFEST_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Deterministic bundle id (`bd-…`).
    pub bundle_id: String,
    /// BLAKE3 over the sorted (path, BLAKE3) list.
    pub content_id: String,
    /// Mission id.
    pub mission: String,
    /// Task id.
    pub task: String,
    /// Attempt key.
    pub attempt_key: String,
    /// Attempt ordinal.
    pub ordinal: u32,
    /// Whether the attempt was accepted.
    pub accepted: bool,
    /// Outcome, commit, checkpoint.
    pub lifecycle: Lifecycle,
    /// Retention.
    pub retention: String,
    /// Token usage, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<serde_json::Value>,
    /// The files, sorted by path.
    pub files: Vec<ManifestFile>,
    /// Files left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub withheld: Vec<Withheld>,
    /// Secrets masked across the bundle's files (withheld ones included).
    pub redactions: u64,
}

/// A built bundle: its manifest and the objects to write.
#[derive(Debug, Clone)]
pub struct Bundle {
    /// The manifest.
    pub manifest: Manifest,
    /// The manifest as published (canonical JSON).
    pub manifest_bytes: Vec<u8>,
    /// (object key, bytes) of every listed file.
    pub objects: Vec<(String, bytes::Bytes)>,
}

/// The object key of content with this BLAKE3.
pub fn object_key(blake3_hex: &str) -> String {
    format!("cas/blake3/{}/{blake3_hex}", &blake3_hex[..2])
}

/// Where a bundle's manifest is kept, by bundle id.
pub fn manifest_key(bundle_id: &str) -> String {
    format!("bundles/{bundle_id}/{MANIFEST_PATH}")
}

fn check_path(path: &str) -> Result<(), ArtifactError> {
    let bad = path.is_empty()
        || path.len() > 512
        || path.starts_with('/')
        || path.contains('\\')
        || path.contains('\0')
        || path == MANIFEST_PATH
        || path
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..");
    if bad {
        return Err(ArtifactError::Invalid(format!(
            "`{}` is not a bundle path (relative, `/`-separated, no `..`, not `{MANIFEST_PATH}`)",
            path.escape_debug()
        )));
    }
    Ok(())
}

/// Below this many bytes in all, threads cost more than they save.
const PARALLEL_FROM_BYTES: usize = 8 << 20;

/// `work` applied to every file, results in the files' order; spread over the available cores
/// (each worker takes the next file not yet taken) when the bundle is large.
fn for_each_file<R: Send>(
    files: &mut [BundleFile],
    work: impl Fn(&mut BundleFile) -> R + Sync,
) -> Vec<R> {
    let total: usize = files.iter().map(|f| f.bytes.len()).sum();
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
        .min(files.len());
    if total < PARALLEL_FROM_BYTES || workers < 2 {
        return files.iter_mut().map(work).collect();
    }
    let slots: Vec<std::sync::Mutex<(&mut BundleFile, Option<R>)>> = files
        .iter_mut()
        .map(|f| std::sync::Mutex::new((f, None)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(slot) = slots.get(n) else { break };
                let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
                let result = work(slot.0);
                slot.1 = Some(result);
            });
        }
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .1
                .expect("every file was worked on")
        })
        .collect()
}

/// Builds a bundle: redacts every file, hashes it, lists it.
pub fn build(input: BundleInput, redactor: &Redactor) -> Result<Bundle, ArtifactError> {
    let mut files = input.files;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    for pair in files.windows(2) {
        if pair[0].path == pair[1].path {
            return Err(ArtifactError::Invalid(format!(
                "`{}` twice in one bundle",
                pair[0].path
            )));
        }
    }
    for file in &files {
        check_path(&file.path)?;
        if file.bytes.len() > MAX_FILE_BYTES {
            return Err(ArtifactError::Invalid(format!(
                "`{}` exceeds {MAX_FILE_BYTES} bytes",
                file.path
            )));
        }
    }
    // Masking and hashing are per file: spread over the cores.
    // An archive (an agent's session record) keeps its databases' logs readable.
    let masks = for_each_file(&mut files, |file| {
        if file.mime == "application/x-tar" {
            crate::redact_archive(redactor, &mut file.bytes) as u64
        } else {
            redactor.redact(&mut file.bytes) as u64
        }
    });
    let total_masked: u64 = masks.iter().sum();
    let hashes = for_each_file(&mut files, |file| {
        if file.opaque && total_masked > 0 {
            return None;
        }
        Some((
            blake3::hash(&file.bytes).to_hex().to_string(),
            hex::encode(sha2::Sha256::digest(&file.bytes)),
        ))
    });
    let (mut listed, mut withheld, mut objects) = (Vec::new(), input.withheld, Vec::new());
    for ((file, masked), hashed) in files.into_iter().zip(masks).zip(hashes) {
        let Some((blake3_hex, sha256_hex)) = hashed else {
            withheld.push(Withheld {
                path: file.path,
                reason: "secrets were masked in this bundle and this file is opaque to the \
                         scanner (compressed): it may hold them too"
                    .into(),
            });
            continue;
        };
        let key = object_key(&blake3_hex);
        listed.push(ManifestFile {
            path: file.path,
            mime: file.mime,
            size: file.bytes.len() as u64,
            blake3: blake3_hex,
            sha256: sha256_hex,
            redactions: masked,
            object_key: key.clone(),
            truncated_from: file.truncated_from,
        });
        objects.push((key, bytes::Bytes::from(file.bytes)));
    }
    let mut content = blake3::Hasher::new();
    for file in &listed {
        content.update(file.path.as_bytes());
        content.update(b"\0");
        content.update(file.blake3.as_bytes());
        content.update(b"\n");
    }
    let content_id = content.finalize().to_hex().to_string();
    let mut identity = blake3::Hasher::new();
    identity.update(MANIFEST_SCHEMA.as_bytes());
    identity.update(b"\0");
    identity.update(input.attempt_key.as_bytes());
    identity.update(b"\0");
    identity.update(content_id.as_bytes());
    identity.update(b"\0");
    identity.update(
        serde_json::to_string(&input.lifecycle)
            .expect("lifecycle serializes")
            .as_bytes(),
    );
    let bundle_id = format!("bd-{}", &identity.finalize().to_hex()[..32]);
    let redactions = total_masked;
    let mut manifest = Manifest {
        schema: MANIFEST_SCHEMA.into(),
        schema_version: MANIFEST_SCHEMA_VERSION,
        bundle_id,
        content_id,
        mission: input.mission,
        task: input.task,
        attempt_key: input.attempt_key,
        ordinal: input.ordinal,
        accepted: input.lifecycle.outcome == "accepted",
        lifecycle: input.lifecycle,
        retention: input.retention,
        usage: input.usage,
        files: listed,
        withheld,
        redactions,
    };
    // The manifest is scanned like every other byte (a reason or usage could carry a secret).
    let mut manifest_bytes = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
    let masked = redactor.redact(&mut manifest_bytes) as u64;
    if masked > 0 {
        manifest.redactions += masked;
        manifest_bytes = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
        redactor.redact(&mut manifest_bytes);
        manifest = serde_json::from_slice(&manifest_bytes).map_err(|e| {
            ArtifactError::Invalid(format!("the redacted manifest does not parse: {e}"))
        })?;
    }
    Ok(Bundle {
        manifest,
        manifest_bytes,
        objects,
    })
}

/// The JSON Schema of `manifest.json` (`berth schema bundle`).
pub fn json_schema() -> String {
    let mut text = serde_json::to_string_pretty(&schemars::schema_for!(Manifest)).expect("schema");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(files: Vec<BundleFile>) -> BundleInput {
        BundleInput {
            mission: "ms-1".into(),
            task: "fix".into(),
            attempt_key: "at-1".into(),
            ordinal: 1,
            lifecycle: Lifecycle {
                outcome: "accepted".into(),
                reason: None,
                commit: Some("c".repeat(40)),
                base_commit: Some("b".repeat(40)),
                checkpoint: Some("sha256:x".into()),
            },
            retention: "forever".into(),
            usage: None,
            withheld: Vec::new(),
            files,
        }
    }

    fn file(path: &str, text: &str, opaque: bool) -> BundleFile {
        BundleFile {
            path: path.into(),
            mime: "text/plain".into(),
            bytes: text.as_bytes().to_vec(),
            opaque,
            truncated_from: None,
        }
    }

    #[test]
    fn ids_are_deterministic_and_follow_content_and_outcome() {
        let r = Redactor::default();
        let a = build(
            input(vec![file("b.txt", "2", false), file("a.txt", "1", false)]),
            &r,
        )
        .unwrap();
        let b = build(
            input(vec![file("a.txt", "1", false), file("b.txt", "2", false)]),
            &r,
        )
        .unwrap();
        assert_eq!(a.manifest.bundle_id, b.manifest.bundle_id);
        assert_eq!(a.manifest_bytes, b.manifest_bytes);
        assert_eq!(a.manifest.files[0].path, "a.txt");
        let c = build(
            input(vec![file("a.txt", "1!", false), file("b.txt", "2", false)]),
            &r,
        )
        .unwrap();
        assert_ne!(a.manifest.bundle_id, c.manifest.bundle_id);
        let mut rejected = input(vec![file("a.txt", "1", false), file("b.txt", "2", false)]);
        rejected.lifecycle.outcome = "rejected".into();
        let d = build(rejected, &r).unwrap();
        assert_ne!(a.manifest.bundle_id, d.manifest.bundle_id);
        assert!(!d.manifest.accepted);
        assert_eq!(
            a.manifest.files[0].object_key,
            object_key(&a.manifest.files[0].blake3)
        );
        assert_eq!(a.manifest.files[0].sha256.len(), 64);
    }

    #[test]
    fn secrets_are_masked_counted_and_opaque_files_withheld() {
        let r = Redactor::new(["canary-9f2c1e-do-not-leak".to_owned()]);
        let built = build(
            input(vec![
                file("log.jsonl", "{\"k\":\"canary-9f2c1e-do-not-leak\"}", false),
                file("work.bundle", "PACK...", true),
            ]),
            &r,
        )
        .unwrap();
        assert_eq!(built.manifest.redactions, 1);
        assert_eq!(built.manifest.files.len(), 1);
        assert_eq!(built.manifest.withheld[0].path, "work.bundle");
        for (_, bytes) in &built.objects {
            assert!(!String::from_utf8_lossy(bytes).contains("canary"));
        }
        assert!(!String::from_utf8_lossy(&built.manifest_bytes).contains("canary"));
    }

    #[test]
    fn published_manifest_schema_is_in_sync() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../schemas/bundle-manifest.schema.json");
        let generated = json_schema();
        if std::env::var_os("BERTH_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        assert!(
            std::fs::read_to_string(&path).unwrap_or_default() == generated,
            "schemas/bundle-manifest.schema.json is out of date; run BERTH_BLESS=1 cargo test -p berth-artifacts"
        );
    }

    #[test]
    fn hostile_paths_and_duplicates_are_refused() {
        let r = Redactor::default();
        for path in [
            "../x",
            "/etc/passwd",
            "a//b",
            "a/./b",
            "",
            "manifest.json",
            "a\\b",
        ] {
            assert!(
                build(input(vec![file(path, "x", false)]), &r).is_err(),
                "{path:?}"
            );
        }
        assert!(build(
            input(vec![file("a", "1", false), file("a", "2", false)]),
            &r
        )
        .is_err());
    }

    #[test]
    fn a_cut_log_and_a_file_left_out_are_said_in_the_manifest() {
        let mut cut = file("logs/agent.jsonl", "first bytes only", false);
        cut.truncated_from = Some(1 << 30);
        let mut with = input(vec![cut, file("patch.diff", "+x\n", false)]);
        with.withheld.push(Withheld {
            path: "repo.bundle".into(),
            reason: "over the limit".into(),
        });
        let built = build(with, &Redactor::default()).unwrap();
        let manifest: serde_json::Value = serde_json::from_slice(&built.manifest_bytes).unwrap();
        let files = manifest["files"].as_array().unwrap();
        let log = files
            .iter()
            .find(|f| f["path"] == "logs/agent.jsonl")
            .unwrap();
        assert_eq!(log["truncated_from"], 1u64 << 30);
        assert_eq!(log["size"], "first bytes only".len());
        let patch = files.iter().find(|f| f["path"] == "patch.diff").unwrap();
        assert!(patch.get("truncated_from").is_none(), "{patch}");
        assert_eq!(manifest["withheld"][0]["path"], "repo.bundle");
    }
}
