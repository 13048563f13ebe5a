//! Evidence records and the evidence gate.
//!
//! An [`EvidenceRecord`] is what `berth verify` writes after running the conformance suite and a
//! short lifecycle measurement against a live provider: which adapter (version and source hash),
//! where (environment fingerprint), when, every clause's grade with diagnostics, metrics that are
//! measurements or `UNKNOWN(reason)` — never zero — and a content hash over all of it.
//!
//! The gate ([`evaluate`]) is the only place a provider/capability becomes VERIFIED: a passing,
//! fresh, untampered record for this adapter build, signed (ed25519) by a key the caller trusts.
//! A failing clause makes it FAILED; anything missing, stale, altered, unsigned, signed by an
//! unknown key or for another build leaves it UNKNOWN with the reason; a capability the
//! manifest declares unsupported is UNSUPPORTED.

use std::collections::BTreeMap;
use std::fmt;

use berth_contract::{Capability, Support};
use berth_manifest::ProviderManifest;
use chrono::{DateTime, Duration, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The record format's schema tag.
pub const EVIDENCE_SCHEMA: &str = "berth.evidence/v3";
/// How old a record may be and still verify.
pub const MAX_AGE_DAYS: i64 = 30;
/// The pseudo-capability name of the required core (create, observe, exec, destroy).
pub const CORE: &str = "core";

/// A clause's grade as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Grade {
    /// Ran; every assertion held.
    Pass,
    /// Ran; an assertion failed.
    Fail,
    /// Declared unsupported.
    NotApplicable,
    /// Not exercised.
    Unverified,
}

/// One clause's evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClauseEvidence {
    /// Clause id.
    pub clause: String,
    /// The capability it proves; `None` for the core.
    pub capability: Option<String>,
    /// The grade.
    pub grade: Grade,
    /// What happened.
    pub diagnostics: Vec<String>,
    /// Wall time.
    pub duration_ms: f64,
}

/// A measurement, or why there is none. Never a made-up zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Metric {
    /// Measured.
    Measured {
        /// Median in milliseconds.
        median_ms: f64,
        /// p95 (nearest rank) in milliseconds.
        p95_ms: f64,
        /// Samples.
        n: usize,
    },
    /// A success ratio.
    Ratio {
        /// Successes.
        successes: usize,
        /// Attempts.
        n: usize,
    },
    /// Not measured.
    Unknown {
        /// Why.
        reason: String,
    },
}

/// Where the adapter's knowledge of the provider came from, for this run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// Manifest provenance source.
    pub source: String,
    /// Manifest provenance pin.
    pub pinned: String,
    /// What the provider reported about itself (e.g. engine and API version), if anything.
    pub observed: Option<String>,
}

/// The machine the evidence was produced on (no secrets, no user names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Environment {
    /// `linux`.
    pub os: String,
    /// `x86_64`.
    pub arch: String,
    /// Kernel release.
    pub kernel: String,
    /// The berth version that ran the suite.
    pub berth_version: String,
}

/// One evidence record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvidenceRecord {
    /// [`EVIDENCE_SCHEMA`].
    pub schema: String,
    /// Provider id.
    pub provider: String,
    /// Adapter version (from the manifest).
    pub adapter_version: String,
    /// Hash of the adapter's source, `sha256:…`.
    pub adapter_source_hash: String,
    /// Hash of the conformance kit that graded the clauses (its clauses and runner), `sha256:…`.
    pub conformance_kit_hash: String,
    /// Provenance.
    pub provenance: Provenance,
    /// Environment fingerprint.
    pub environment: Environment,
    /// Run id.
    pub run_id: String,
    /// RFC 3339.
    pub started_at: DateTime<Utc>,
    /// RFC 3339.
    pub finished_at: DateTime<Utc>,
    /// Every clause.
    pub clauses: Vec<ClauseEvidence>,
    /// Lifecycle metrics by name.
    pub metrics: BTreeMap<String, Metric>,
    /// `sha256:` of the record's canonical JSON with this field empty and no signature.
    pub content_hash: String,
    /// The signer's ed25519 signature over `content_hash`, when signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<RecordSignature>,
}

/// An ed25519 signature over a record's `content_hash` (its UTF-8 bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordSignature {
    /// [`key_id`] of the signing key's public half.
    pub key_id: String,
    /// The 64-byte signature, hex.
    pub ed25519: String,
}

/// A public key's short id: the first 16 hex digits of its SHA-256.
pub fn key_id(public: &[u8; 32]) -> String {
    hex::encode(&Sha256::digest(public)[..8])
}

/// A signing key from its file text: the 32-byte seed in hex (surrounding whitespace ignored).
pub fn signing_key_from_hex(text: &str) -> Result<ed25519_dalek::SigningKey, String> {
    let bytes = hex::decode(text.trim()).map_err(|_| "not hex".to_owned())?;
    let seed: [u8; 32] = bytes
        .try_into()
        .map_err(|_| "not 32 bytes (64 hex digits)".to_owned())?;
    Ok(ed25519_dalek::SigningKey::from_bytes(&seed))
}

/// A public key from its file text: 32 bytes in hex.
pub fn public_key_from_hex(text: &str) -> Result<[u8; 32], String> {
    let bytes = hex::decode(text.trim()).map_err(|_| "not hex".to_owned())?;
    let key: [u8; 32] = bytes
        .try_into()
        .map_err(|_| "not 32 bytes (64 hex digits)".to_owned())?;
    ed25519_dalek::VerifyingKey::from_bytes(&key).map_err(|_| "not an ed25519 public key")?;
    Ok(key)
}

impl EvidenceRecord {
    /// The hash the record should carry: sha256 of its JSON with `content_hash` empty.
    pub fn compute_hash(&self) -> String {
        let mut unsealed = self.clone();
        unsealed.content_hash = String::new();
        unsealed.signature = None;
        let bytes = serde_json::to_vec(&unsealed).expect("record serializes");
        format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
    }

    /// Sets `content_hash` (and drops any signature: it signed other content).
    pub fn seal(mut self) -> Self {
        self.content_hash = self.compute_hash();
        self.signature = None;
        self
    }

    /// Seals the record and signs its content hash.
    pub fn sign(self, key: &ed25519_dalek::SigningKey) -> Self {
        use ed25519_dalek::Signer;
        let mut sealed = self.seal();
        let signature = key.sign(sealed.content_hash.as_bytes());
        sealed.signature = Some(RecordSignature {
            key_id: key_id(&key.verifying_key().to_bytes()),
            ed25519: hex::encode(signature.to_bytes()),
        });
        sealed
    }

    /// Why the signature does not make this record trusted by `keys`, if it does not.
    pub fn signature_problem(&self, keys: &[[u8; 32]]) -> Option<String> {
        let Some(signature) = &self.signature else {
            return Some("the record is not signed".into());
        };
        let Some(key) = keys.iter().find(|k| key_id(k) == signature.key_id) else {
            return Some(format!(
                "signed by key {}, which is not trusted here",
                signature.key_id
            ));
        };
        let verifying = match ed25519_dalek::VerifyingKey::from_bytes(key) {
            Ok(verifying) => verifying,
            Err(_) => return Some("a trusted key is not an ed25519 key".into()),
        };
        let bytes: Option<[u8; 64]> = hex::decode(&signature.ed25519)
            .ok()
            .and_then(|b| b.try_into().ok());
        let Some(bytes) = bytes else {
            return Some("the signature is malformed".into());
        };
        let parsed = ed25519_dalek::Signature::from_bytes(&bytes);
        match verifying.verify_strict(self.content_hash.as_bytes(), &parsed) {
            Ok(()) => None,
            Err(_) => Some(format!(
                "the signature by key {} does not verify",
                signature.key_id
            )),
        }
    }
}

/// The JSON Schema of evidence records.
pub fn json_schema() -> String {
    let mut text =
        serde_json::to_string_pretty(&schemars::schema_for!(EvidenceRecord)).expect("schema");
    text.push('\n');
    text
}

/// A provider/capability's catalog status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(
    tag = "status",
    content = "reason",
    rename_all = "SCREAMING_SNAKE_CASE"
)]
pub enum Status {
    /// A passing, fresh record for this adapter build proves it.
    Verified,
    /// The latest record shows a failing clause.
    Failed(String),
    /// Not proven; the reason says why.
    Unknown(String),
    /// Declared unsupported.
    Unsupported,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Verified => f.write_str("VERIFIED"),
            Status::Failed(why) => write!(f, "FAILED({why})"),
            Status::Unknown(why) => write!(f, "UNKNOWN({why})"),
            Status::Unsupported => f.write_str("UNSUPPORTED"),
        }
    }
}

/// What the gate expects a record to contain: clause ids with the capability each proves.
#[derive(Debug, Clone)]
pub struct Expectations<'a> {
    /// `(clause id, capability name or None for core)`.
    pub clauses: Vec<(&'a str, Option<&'a str>)>,
    /// This build's adapter source hash; `None` when this build has no adapter for the
    /// provider (catalog only), which leaves everything it may support UNKNOWN.
    pub adapter_source_hash: Option<&'a str>,
    /// This build's conformance kit hash: a record another kit graded proves nothing about this
    /// kit's clauses.
    pub conformance_kit_hash: &'a str,
    /// Evaluation time.
    pub now: DateTime<Utc>,
    /// Public keys whose signatures are trusted (ed25519, 32 bytes).
    pub trusted_keys: Vec<[u8; 32]>,
}

/// The record-level reason nothing in it can be trusted, if any.
fn record_problem(
    manifest: &ProviderManifest,
    record: &EvidenceRecord,
    expect: &Expectations<'_>,
) -> Option<String> {
    if record.schema != EVIDENCE_SCHEMA {
        return Some(format!(
            "record schema `{}` is not {EVIDENCE_SCHEMA}",
            record.schema
        ));
    }
    if record.content_hash != record.compute_hash() {
        return Some(
            "record content hash does not match its content (altered after sealing)".into(),
        );
    }
    if let Some(problem) = record.signature_problem(&expect.trusted_keys) {
        return Some(problem);
    }
    if record.provider != manifest.id {
        return Some(format!("record is for provider `{}`", record.provider));
    }
    if let Some(expected) = expect.adapter_source_hash {
        if record.adapter_source_hash != expected {
            return Some(format!(
                "record is for adapter source {}, this build is {expected}",
                record.adapter_source_hash
            ));
        }
    }
    if record.conformance_kit_hash != expect.conformance_kit_hash {
        return Some(format!(
            "record was graded by conformance kit {}, this build's is {}",
            record.conformance_kit_hash, expect.conformance_kit_hash
        ));
    }
    if record.adapter_version != manifest.adapter_version {
        return Some(format!(
            "record is for adapter version {}, the manifest says {}",
            record.adapter_version, manifest.adapter_version
        ));
    }
    let age = expect.now - record.finished_at;
    if age > Duration::days(MAX_AGE_DAYS) {
        return Some(format!(
            "stale: recorded {}, more than {MAX_AGE_DAYS} days ago",
            record.finished_at.to_rfc3339()
        ));
    }
    None
}

/// The status of the core and of every capability.
pub fn evaluate(
    manifest: &ProviderManifest,
    record: Option<&EvidenceRecord>,
    expect: &Expectations<'_>,
) -> BTreeMap<String, Status> {
    let mut out = BTreeMap::new();
    let names = std::iter::once((CORE.to_owned(), None)).chain(
        Capability::ALL
            .iter()
            .map(|c| (c.as_str().to_owned(), Some(*c))),
    );
    for (name, capability) in names {
        if let Some(c) = capability {
            if manifest.support(c) == Support::Unsupported {
                out.insert(name, Status::Unsupported);
                continue;
            }
        }
        let status = match (record, expect.adapter_source_hash) {
            (_, None) => Status::Unknown("no adapter in this build".into()),
            (None, Some(_)) => Status::Unknown(missing_record(manifest)),
            (Some(record), Some(_)) => match record_problem(manifest, record, expect) {
                Some(problem) => Status::Unknown(problem),
                None => capability_status(manifest, &name, record, expect),
            },
        };
        out.insert(name, status);
    }
    out
}

/// Why there is no record: for a provider whose live proof needs credentials, which ones.
fn missing_record(manifest: &ProviderManifest) -> String {
    let needed: Vec<&str> = manifest.required_secrets().collect();
    if needed.is_empty() {
        "no evidence record".into()
    } else {
        format!("no live evidence: needs {}", needed.join(" and "))
    }
}

/// The conformance clause that checks a manifest's declared default walls; without declared
/// walls it is not applicable, and that is consistent with the manifest.
pub const WALLS_CLAUSE: &str = "isolation.default_walls";

fn capability_status(
    manifest: &ProviderManifest,
    name: &str,
    record: &EvidenceRecord,
    expect: &Expectations<'_>,
) -> Status {
    let wanted = |cap: Option<&str>| match cap {
        None => name == CORE,
        Some(cap) => cap == name,
    };
    let expected: Vec<&str> = expect
        .clauses
        .iter()
        .filter(|(_, cap)| wanted(*cap))
        .map(|(id, _)| *id)
        .collect();
    if expected.is_empty() {
        return Status::Unknown(format!("no conformance clause covers `{name}` yet"));
    }
    let mut known = Vec::new();
    for id in &expected {
        let Some(clause) = record.clauses.iter().find(|c| c.clause == *id) else {
            return Status::Unknown(format!("clause `{id}` missing from the record"));
        };
        match clause.grade {
            Grade::Pass => {}
            Grade::Fail => match manifest.verification.known_failures.get(*id) {
                Some(reason) => known.push(format!("`{id}`: {reason}")),
                None => {
                    return Status::Failed(format!(
                        "clause `{id}` failed: {}",
                        clause.diagnostics.join("; ")
                    ))
                }
            },
            Grade::Unverified => {
                return Status::Unknown(format!(
                    "clause `{id}` unverified: {}",
                    clause.diagnostics.join("; ")
                ))
            }
            Grade::NotApplicable if *id == WALLS_CLAUSE && manifest.isolation.walls.is_none() => {}
            Grade::NotApplicable => {
                return Status::Unknown(format!(
                    "clause `{id}` was not applicable when recorded (declared unsupported then)"
                ))
            }
        }
    }
    if known.is_empty() {
        Status::Verified
    } else {
        Status::Failed(format!("{KNOWN_FAILURE}{}", known.join("; ")))
    }
}

/// How a FAILED status caused only by failures the manifest declares begins.
pub const KNOWN_FAILURE: &str = "known failure, as the manifest declares: ";

/// Declared known failures the record does not show failing: the declaration is stale.
pub fn stale_known_failures(manifest: &ProviderManifest, record: &EvidenceRecord) -> Vec<String> {
    manifest
        .verification
        .known_failures
        .keys()
        .filter(|id| {
            !record
                .clauses
                .iter()
                .any(|c| &c.clause == *id && c.grade == Grade::Fail)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests;

// The one percentile helper: every median and p95 Berth reports (evidence metrics,
// benchmarks) is nearest rank on sorted samples.

/// The `p`-th percentile (0 < p ≤ 1) of `samples` by nearest rank; `None` when there are none.
/// Sorts in place.
pub fn percentile(samples: &mut [f64], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    Some(samples[rank - 1])
}

/// The median (nearest rank); `None` when there are no samples.
pub fn median(samples: &mut [f64]) -> Option<f64> {
    percentile(samples, 0.5)
}

#[cfg(test)]
mod percentile_tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut s = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(median(&mut s), Some(3.0));
        assert_eq!(percentile(&mut s, 0.95), Some(5.0));
        assert_eq!(percentile(&mut s, 0.2), Some(1.0));
        let mut hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut hundred, 0.95), Some(95.0));
        assert_eq!(percentile(&mut hundred, 0.99), Some(99.0));
        assert_eq!(median(&mut []), None);
    }
}
