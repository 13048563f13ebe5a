//! Providers reached through the ComputeSDK bridge: how the factory builds them from a manifest
//! and an environment snapshot.

use std::path::PathBuf;
use std::sync::Arc;

use berth_contract::{ErrorKind, Provider, ProviderError};
use berth_manifest::ProviderManifest;

use crate::{ProviderConfig, Registry};

/// A ComputeSDK provider through the bridge. The sidecar gets PATH and exactly the variables the
/// manifest names; the secret ones are also what its messages are masked of.
pub(crate) fn construct(
    manifest: &ProviderManifest,
    config: &ProviderConfig,
) -> Result<Arc<dyn Provider>, ProviderError> {
    let provider = berth_provider_computesdk::new(&manifest.id, bridge_config(manifest, config)?)?;
    Ok(Arc::new(provider))
}

pub(crate) fn bridge_config(
    manifest: &ProviderManifest,
    config: &ProviderConfig,
) -> Result<berth_provider_computesdk::BridgeConfig, ProviderError> {
    let path = config
        .env
        .get("PATH")
        .unwrap_or("/usr/local/bin:/usr/bin:/bin")
        .to_owned();
    let node = config
        .env
        .get("BERTH_NODE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("node"))
                .find(|candidate| candidate.is_file())
        })
        .ok_or_else(|| {
            ProviderError::new(
                ErrorKind::Setup,
                &manifest.id,
                "the ComputeSDK bridge needs Node >= 20.18.1: no `node` on PATH (or set BERTH_NODE)",
            )
        })?;
    let dir = config
        .env
        .get("BERTH_COMPUTESDK_BRIDGE")
        .map(PathBuf::from)
        .unwrap_or_else(berth_provider_computesdk::default_bridge_dir);
    let mut env = vec![("PATH".to_owned(), path)];
    let mut secrets = Vec::new();
    for credential in &manifest.credentials {
        if let Some(value) = config.env.get(&credential.name) {
            env.push((credential.name.clone(), value.to_owned()));
            if credential.kind == berth_manifest::CredentialKind::Secret {
                secrets.push(value.to_owned());
            }
        }
    }
    Ok(berth_provider_computesdk::BridgeConfig {
        node,
        dir,
        env,
        secrets,
    })
}

/// The packages the sidecar actually loaded (not what the lock says), for an evidence record.
pub(crate) async fn observed_packages(id: &str, config: &ProviderConfig) -> Option<String> {
    let registry = Registry::builtin().ok()?;
    let manifest = registry.manifest(id).ok()?;
    let bridged = berth_provider_computesdk::new(id, bridge_config(manifest, config).ok()?).ok()?;
    let packages = bridged.packages().await.ok()?;
    Some(
        packages
            .iter()
            .map(|(name, version)| format!("{name} {version}"))
            .collect::<Vec<_>>()
            .join(", "),
    )
}
