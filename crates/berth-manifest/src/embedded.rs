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
