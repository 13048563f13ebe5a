//! Manifests compiled into this build: every provider in the in-repo catalog, with or without
//! an adapter (catalog-only providers are listed and gated, never constructed).

/// `(origin, TOML text)` of every embedded manifest.
pub fn embedded() -> &'static [(&'static str, &'static str)] {
    &[
        (
            "catalog/providers/agent37.toml",
            include_str!("../../../catalog/providers/agent37.toml"),
        ),
        (
            "catalog/providers/bwrap.toml",
            include_str!("../../../catalog/providers/bwrap.toml"),
        ),
        (
            "catalog/providers/computesdk.daytona.toml",
            include_str!("../../../catalog/providers/computesdk.daytona.toml"),
        ),
        (
            "catalog/providers/computesdk.e2b.toml",
            include_str!("../../../catalog/providers/computesdk.e2b.toml"),
        ),
        (
            "catalog/providers/computesdk.just-bash.toml",
            include_str!("../../../catalog/providers/computesdk.just-bash.toml"),
        ),
        (
            "catalog/providers/computesdk.modal.toml",
            include_str!("../../../catalog/providers/computesdk.modal.toml"),
        ),
        (
            "catalog/providers/daytona.toml",
            include_str!("../../../catalog/providers/daytona.toml"),
        ),
        (
            "catalog/providers/docker.toml",
            include_str!("../../../catalog/providers/docker.toml"),
        ),
        (
            "catalog/providers/e2b.toml",
            include_str!("../../../catalog/providers/e2b.toml"),
        ),
        (
            "catalog/providers/freestyle.toml",
            include_str!("../../../catalog/providers/freestyle.toml"),
        ),
        (
            "catalog/providers/host.toml",
            include_str!("../../../catalog/providers/host.toml"),
        ),
        (
            "catalog/providers/microsandbox.toml",
            include_str!("../../../catalog/providers/microsandbox.toml"),
        ),
        (
            "catalog/providers/modal.toml",
            include_str!("../../../catalog/providers/modal.toml"),
        ),
    ]
}

/// `(origin, TOML text, the same as JSON)` of every manifest in the catalog at build time (see
/// `build.rs`).
pub(crate) const AS_JSON: &[(&str, &str, &str)] =
    include!(concat!(env!("OUT_DIR"), "/embedded_json.rs"));

/// [`crate::parse`] for an embedded manifest, through its JSON form when one was made from this
/// exact text (the same value, a tenth of the time); any other text, or one whose JSON form does
/// not read as a current manifest, goes through `parse` and gets its errors.
pub fn parse_embedded(
    origin: &str,
    text: &str,
) -> Result<crate::ProviderManifest, crate::ManifestError> {
    let fast = AS_JSON
        .iter()
        .find(|(o, t, _)| *o == origin && *t == text)
        .and_then(|(_, _, json)| serde_json::from_str::<crate::ProviderManifest>(json).ok())
        .filter(|m| m.schema_version == crate::SCHEMA_VERSION);
    match fast {
        Some(manifest) => {
            manifest.validate(origin)?;
            Ok(manifest)
        }
        None => crate::parse(origin, text),
    }
}
