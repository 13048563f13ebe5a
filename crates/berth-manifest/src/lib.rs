//! Provider manifests: what a provider is, how to reach it, and what it declares it can do.
//!
//! A manifest is TOML with a `schema_version`. It names credential environment variables (never
//! values), declares every [`Capability`] tri-state, and states in words what lifecycle verbs
//! really mean on this provider. The factory reconciles the declaration with the adapter when it
//! constructs one; the evidence gate (later) decides what may be advertised as verified.
//!
//! - [`ProviderManifest`] and its parts — the format.
//! - [`parse`] / [`load_dir`] — reading and validating, with errors that name file and line.
//! - [`json_schema`] — the published JSON Schema, kept in sync with `schemas/` by a test.
//! - [`embedded`] — the manifests compiled into this build.

mod embedded;
mod model;

use std::path::{Path, PathBuf};

pub use embedded::{embedded, parse_embedded};
pub use model::{
    Credential, CredentialKind, ImageModel, Isolation, IsolationClass, Lifecycle, Pricing,
    PricingConfidence, Provenance, ProviderManifest, Verification, Walls, SCHEMA_VERSION,
};

use berth_contract::Capability;

/// A manifest could not be read or is invalid. Messages name the file and, for syntax errors,
/// the line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The file could not be read.
    #[error("cannot read manifest {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown/missing fields.
    #[error("manifest {origin} is not valid: {message}")]
    Syntax {
        /// File name or `embedded:<id>`.
        origin: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The manifest's schema version is not one this Berth reads.
    #[error("manifest {origin} has schema_version {found}; this berth reads schema_version {SCHEMA_VERSION}")]
    SchemaVersion {
        /// File name or `embedded:<id>`.
        origin: String,
        /// The version found.
        found: u32,
    },
    /// A field parsed but breaks a rule.
    #[error("manifest {origin}: field `{field}` {problem}")]
    Invalid {
        /// File name or `embedded:<id>`.
        origin: String,
        /// The offending field.
        field: String,
        /// What is wrong, as a fragment.
        problem: String,
    },
    /// Two manifests declare the same id.
    #[error("provider id `{id}` is declared twice ({first} and {second})")]
    Duplicate {
        /// The id.
        id: String,
        /// The first origin.
        first: String,
        /// The second origin.
        second: String,
    },
}

/// Parses and validates one manifest. `origin` names it in errors.
pub fn parse(origin: &str, text: &str) -> Result<ProviderManifest, ManifestError> {
    #[derive(serde::Deserialize)]
    struct VersionProbe {
        schema_version: Option<u32>,
    }
    // Read the version first so a future-format file gets a version error, not a field error.
    if let Ok(VersionProbe {
        schema_version: Some(found),
    }) = toml::from_str::<VersionProbe>(text)
    {
        if found != SCHEMA_VERSION {
            return Err(ManifestError::SchemaVersion {
                origin: origin.to_owned(),
                found,
            });
        }
    }
    let manifest: ProviderManifest = toml::from_str(text).map_err(|err| ManifestError::Syntax {
        origin: origin.to_owned(),
        message: err.to_string().trim_end().to_owned(),
    })?;
    manifest.validate(origin)?;
    Ok(manifest)
}

/// The largest manifest file read (the built-in ones are a few kB).
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// A manifest file's text: a regular file (a FIFO named `*.toml` would block the read for
/// ever), at most [`MAX_MANIFEST_BYTES`].
fn read_manifest(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_MANIFEST_BYTES} bytes"
        )));
    }
    Ok(text)
}

/// Loads every `*.toml` in `dir`, sorted by file name. Duplicate ids are an error.
pub fn load_dir(dir: &Path) -> Result<Vec<ProviderManifest>, ManifestError> {
    let read_err = |source| ManifestError::Read {
        path: dir.to_owned(),
        source,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    paths.sort();
    let mut manifests: Vec<(String, ProviderManifest)> = Vec::new();
    for path in paths {
        let text = read_manifest(&path).map_err(|source| ManifestError::Read {
            path: path.clone(),
            source,
        })?;
        let origin = path.display().to_string();
        let manifest = parse(&origin, &text)?;
        if let Some((first, _)) = manifests.iter().find(|(_, m)| m.id == manifest.id) {
            return Err(ManifestError::Duplicate {
                id: manifest.id,
                first: first.clone(),
                second: origin,
            });
        }
        manifests.push((origin, manifest));
    }
    Ok(manifests.into_iter().map(|(_, m)| m).collect())
}

/// The JSON Schema of the manifest format, pretty-printed with a trailing newline.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(ProviderManifest);
    let mut text = serde_json::to_string_pretty(&schema).expect("schema serializes");
    text.push('\n');
    text
}

impl ProviderManifest {
    /// The secret credentials construction requires: without them there can be no live
    /// evidence, so the catalog gate reports UNKNOWN naming them instead of failing.
    pub fn required_secrets(&self) -> impl Iterator<Item = &str> {
        self.credentials
            .iter()
            .filter(|c| c.required && c.kind == CredentialKind::Secret)
            .map(|c| c.name.as_str())
    }
}

impl ProviderManifest {
    fn validate(&self, origin: &str) -> Result<(), ManifestError> {
        let invalid = |field: &str, problem: String| ManifestError::Invalid {
            origin: origin.to_owned(),
            field: field.to_owned(),
            problem,
        };
        if !is_provider_id(&self.id) {
            return Err(invalid(
                "id",
                format!(
                    "is `{}`; use lowercase letters, digits and `-`, starting with a letter \
                     (a bridged provider: `bridge:vendor`, each part so)",
                    self.id
                ),
            ));
        }
        if self.display_name.trim().is_empty() {
            return Err(invalid("display_name", "is empty".into()));
        }
        for capability in Capability::ALL {
            if !self.capabilities.contains_key(&capability) {
                return Err(invalid(
                    "capabilities",
                    format!(
                        "does not declare `{capability}`; declare every capability as \
                         \"supported\", \"unsupported\" or \"unknown\""
                    ),
                ));
            }
        }
        for (index, credential) in self.credentials.iter().enumerate() {
            if !is_env_name(&credential.name) {
                return Err(invalid(
                    &format!("credentials[{index}].name"),
                    format!(
                        "is `{}`, not an environment variable name (A-Z, 0-9, _); manifests \
                         name variables, never values",
                        credential.name
                    ),
                ));
            }
        }
        if self.isolation.statement.trim().is_empty() {
            return Err(invalid(
                "isolation.statement",
                "is empty; say plainly what this provider isolates".into(),
            ));
        }
        Ok(())
    }
}

/// A provider id: a slug (`docker`), or `bridge:vendor` for a provider reached through a bridge
/// (`computesdk:e2b`).
pub fn is_provider_id(id: &str) -> bool {
    match id.split_once(':') {
        Some((bridge, vendor)) => is_slug(bridge) && is_slug(vendor),
        None => is_slug(id),
    }
}

/// The file stem a provider's manifest and evidence record use: the id with `:` as `.`
/// (`computesdk:e2b` → `computesdk.e2b.toml`, `computesdk.e2b.json`), no colon in file names.
pub fn file_stem(id: &str) -> String {
    id.replacen(':', ".", 1)
}

/// The provider id a manifest or evidence file stem stands for (the inverse of [`file_stem`]).
pub fn id_from_file_stem(stem: &str) -> String {
    stem.replacen('.', ":", 1)
}

fn is_slug(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('A'..='Z' | '_'))
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests;
