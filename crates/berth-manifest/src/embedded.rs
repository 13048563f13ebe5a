//! Manifests compiled into this build: the catalog files of the adapters this Berth ships.

/// `(origin, TOML text)` of every embedded manifest.
pub fn embedded() -> &'static [(&'static str, &'static str)] {
    &[
        (
            "catalog/providers/bwrap.toml",
            include_str!("../../../catalog/providers/bwrap.toml"),
        ),
        (
            "catalog/providers/docker.toml",
            include_str!("../../../catalog/providers/docker.toml"),
        ),
        (
            "catalog/providers/host.toml",
            include_str!("../../../catalog/providers/host.toml"),
        ),
    ]
}
