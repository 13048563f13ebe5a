//! Berth's provider factory: a registry of manifests and the adapters compiled into this build.
//!
//! Construction is the one place where a manifest meets an adapter:
//! 1. the manifest must exist (`UnknownProvider`) and an adapter must be compiled in
//!    (`NoAdapter` — catalog-only providers are listed but not constructible);
//! 2. every required credential variable must be set — the error names the variable, never a
//!    value;
//! 3. the adapter is built and its implemented capabilities are reconciled with the declared
//!    ones: `supported` must be implemented, `unsupported` must not be, `unknown` may be either.
//!
//! [`Registry::with_fallback`] runs an operation over an ordered list of providers and moves
//! on only for errors whose kind allows fallback (capacity, quota, rate limit, unavailable) — never for
//! `Unsupported` — recording every step.
//!
//! This crate owns no provisioning policy and reads no environment itself: callers pass an
//! [`Environment`] snapshot.

#[cfg(feature = "computesdk")]
#[cfg(test)]
mod adapter_sources;
mod computesdk;
mod env;
mod supervisor;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use berth_contract::{
    implemented_capabilities, Capability, ErrorKind, Provider, ProviderError, Support,
};
use berth_manifest::{ManifestError, ProviderManifest};

pub use env::Environment;
pub use supervisor::supervisor;

/// What an adapter constructor receives.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// Berth's state directory; each provider gets `state_dir/<id>`.
    pub state_dir: PathBuf,
    /// The environment snapshot (credentials are read from here by name).
    pub env: Environment,
    /// A program that runs a command under Berth's per-exec reaper when called as
    /// `PROGRAM __reap ARGV…` (the `berth` binary itself), used by host and bwrap only when
    /// there is no supervisor ([`supervisor`]: `BERTH_SUPERVISOR` or the one this build
    /// carries, which starts faster); `None` then means process groups only.
    pub reaper: Option<PathBuf>,
}

/// Builds an adapter.
pub type Constructor =
    fn(&ProviderManifest, &ProviderConfig) -> Result<Arc<dyn Provider>, ProviderError>;

/// Why a provider could not be constructed or selected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FactoryError {
    /// No manifest has this id.
    #[error("unknown provider `{id}` (known: {known})")]
    UnknownProvider {
        /// The id asked for.
        id: String,
        /// Known ids, comma-separated.
        known: String,
    },
    /// The manifest exists but no adapter for it is compiled into this build.
    #[error("provider `{id}` is in the catalog but this build has no adapter for it")]
    NoAdapter {
        /// The id.
        id: String,
    },
    /// A required credential variable is not set.
    #[error(
        "provider `{provider}` needs environment variable `{variable}` ({purpose}); it is not set"
    )]
    MissingCredential {
        /// The provider.
        provider: String,
        /// The variable's name.
        variable: String,
        /// What it is for.
        purpose: String,
    },
    /// The manifest and the adapter disagree about a capability.
    #[error("provider `{provider}`: manifest declares `{capability}` {declared:?} but the adapter {}", if *.implemented { "implements it" } else { "does not implement it" })]
    CapabilityMismatch {
        /// The provider.
        provider: String,
        /// The capability.
        capability: Capability,
        /// What the manifest says.
        declared: Support,
        /// Whether the adapter implements it.
        implemented: bool,
    },
    /// The adapter reports a different id than its manifest.
    #[error("adapter for manifest `{manifest}` reports id `{adapter}`")]
    IdMismatch {
        /// Manifest id.
        manifest: String,
        /// Adapter id.
        adapter: String,
    },
    /// A manifest is invalid.
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    /// The adapter's constructor failed.
    #[error("cannot construct provider `{provider}`")]
    Construct {
        /// The provider.
        provider: String,
        /// Why.
        #[source]
        source: ProviderError,
    },
    /// The fallback list was empty.
    #[error("no provider to try: the fallback list is empty")]
    EmptyFallback,
}

/// One step of a fallback run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FallbackStep {
    /// The provider tried.
    pub provider: String,
    /// The error kind that made Berth move on.
    pub kind: ErrorKind,
    /// The error message.
    pub message: String,
}

/// The result of a fallback run: which provider answered, what it returned, and why earlier
/// providers were passed over.
#[derive(Debug)]
pub struct Fallback<T> {
    /// The provider that succeeded.
    pub provider: Arc<dyn Provider>,
    /// Its result.
    pub value: T,
    /// Providers passed over, in order, with the reason.
    pub skipped: Vec<FallbackStep>,
}

/// A fallback run that did not succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FallbackError {
    /// A provider could not be constructed (configuration errors never trigger fallback).
    #[error("{0}")]
    Factory(#[from] FactoryError),
    /// A provider failed with an error that does not allow fallback.
    #[error("provider `{provider}` failed (not a fallback reason: {})", .source.kind())]
    Stopped {
        /// The provider.
        provider: String,
        /// Its error.
        #[source]
        source: ProviderError,
        /// Providers passed over before it.
        skipped: Vec<FallbackStep>,
    },
    /// Every provider failed with a fallback-eligible error.
    #[error("every provider failed: {}", describe(.skipped))]
    Exhausted {
        /// Each provider's failure.
        skipped: Vec<FallbackStep>,
    },
}

fn describe(steps: &[FallbackStep]) -> String {
    steps
        .iter()
        .map(|s| format!("{} ({}: {})", s.provider, s.kind, s.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Manifests plus the adapters compiled into this build.
pub struct Registry {
    manifests: BTreeMap<String, Entry>,
    constructors: BTreeMap<String, Constructor>,
}

/// A manifest, parsed on first use: a command that touches one provider (`berth exec`) parses
/// one manifest, not the whole catalog.
struct Entry {
    source: Option<(&'static str, &'static str)>,
    parsed: std::sync::OnceLock<ProviderManifest>,
}

impl Entry {
    fn get(&self) -> Result<&ProviderManifest, ManifestError> {
        if let Some(manifest) = self.parsed.get() {
            return Ok(manifest);
        }
        let (origin, text) = self
            .source
            .expect("an entry without a parsed manifest has a source");
        let _ = self
            .parsed
            .set(berth_manifest::parse_embedded(origin, text)?);
        Ok(self.parsed.get().expect("just set"))
    }
}

/// The id an embedded manifest declares: its file name (a test checks they agree).
fn embedded_id(origin: &str) -> String {
    berth_manifest::id_from_file_stem(
        origin
            .rsplit('/')
            .next()
            .unwrap_or(origin)
            .trim_end_matches(".toml"),
    )
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("manifests", &self.manifests.keys().collect::<Vec<_>>())
            .field("adapters", &self.constructors.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Registry {
    /// The embedded manifests and the adapters enabled by this crate's features.
    pub fn builtin() -> Result<Self, FactoryError> {
        let mut registry = Registry {
            manifests: berth_manifest::embedded()
                .iter()
                .map(|&(origin, text)| {
                    let entry = Entry {
                        source: Some((origin, text)),
                        parsed: std::sync::OnceLock::new(),
                    };
                    (embedded_id(origin), entry)
                })
                .collect(),
            constructors: BTreeMap::new(),
        };
        #[cfg(feature = "host")]
        registry.register("host", construct_host);
        #[cfg(feature = "bwrap")]
        registry.register("bwrap", construct_bwrap);
        #[cfg(feature = "docker")]
        registry.register("docker", construct_docker);
        #[cfg(feature = "computesdk")]
        for vendor in berth_provider_computesdk::VENDORS {
            registry.register(
                &format!("computesdk:{}", vendor.name),
                computesdk::construct,
            );
        }
        Ok(registry)
    }

    /// A registry of these manifests and no adapters.
    pub fn with_manifests(manifests: impl IntoIterator<Item = ProviderManifest>) -> Self {
        Registry {
            manifests: manifests
                .into_iter()
                .map(|m| {
                    let id = m.id.clone();
                    let entry = Entry {
                        source: None,
                        parsed: std::sync::OnceLock::from(m),
                    };
                    (id, entry)
                })
                .collect(),
            constructors: BTreeMap::new(),
        }
    }

    /// Registers an adapter constructor for a manifest id.
    pub fn register(&mut self, id: &str, constructor: Constructor) {
        self.constructors.insert(id.to_owned(), constructor);
    }

    /// Every manifest, by id.
    pub fn manifests(&self) -> Result<Vec<&ProviderManifest>, FactoryError> {
        self.manifests
            .values()
            .map(|entry| entry.get().map_err(FactoryError::from))
            .collect()
    }

    /// One manifest.
    pub fn manifest(&self, id: &str) -> Result<&ProviderManifest, FactoryError> {
        let entry = self
            .manifests
            .get(id)
            .ok_or_else(|| FactoryError::UnknownProvider {
                id: id.to_owned(),
                known: self
                    .manifests
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        Ok(entry.get()?)
    }

    /// This registry with a configuration: what the ledger sweeps through.
    pub fn bind<'a>(&'a self, config: &'a ProviderConfig) -> Bound<'a> {
        Bound {
            registry: self,
            config,
        }
    }

    /// Whether this build has an adapter for `id`.
    pub fn has_adapter(&self, id: &str) -> bool {
        self.constructors.contains_key(id)
    }

    /// How the bridged provider `id` reaches its sidecar under `config` (node, the bridge
    /// directory, the sidecar's environment): what a benchmark needs to drive the same
    /// ComputeSDK packages directly.
    #[cfg(feature = "computesdk")]
    pub fn computesdk_bridge(
        &self,
        id: &str,
        config: &ProviderConfig,
    ) -> Result<berth_provider_computesdk::BridgeConfig, FactoryError> {
        let manifest = self.manifest(id)?;
        computesdk::bridge_config(manifest, config).map_err(|source| FactoryError::Construct {
            provider: id.to_owned(),
            source,
        })
    }

    /// The credential variables `id` needs that `env` lacks.
    pub fn missing_credentials(&self, id: &str, env: &Environment) -> Vec<String> {
        self.manifest(id)
            .ok()
            .map(|m| {
                m.required_env()
                    .filter(|name| !env.is_set(name))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Constructs provider `id`: manifest, credentials, adapter, reconciliation.
    pub fn construct(
        &self,
        id: &str,
        config: &ProviderConfig,
    ) -> Result<Arc<dyn Provider>, FactoryError> {
        let manifest = self.manifest(id)?;
        let constructor = self
            .constructors
            .get(id)
            .ok_or_else(|| FactoryError::NoAdapter { id: id.to_owned() })?;
        if let Some(credential) = manifest
            .credentials
            .iter()
            .find(|c| c.required && !config.env.is_set(&c.name))
        {
            return Err(FactoryError::MissingCredential {
                provider: id.to_owned(),
                variable: credential.name.clone(),
                purpose: credential.purpose.clone(),
            });
        }
        let provider = constructor(manifest, config).map_err(|source| FactoryError::Construct {
            provider: id.to_owned(),
            source,
        })?;
        reconcile(manifest, provider.as_ref())?;
        Ok(provider)
    }

    /// Runs `operation` on each provider of `order` until one succeeds. Moves on only when the
    /// error's kind allows fallback; every skip is recorded with its reason.
    pub async fn with_fallback<T, F, Fut>(
        &self,
        order: &[String],
        config: &ProviderConfig,
        mut operation: F,
    ) -> Result<Fallback<T>, FallbackError>
    where
        F: FnMut(Arc<dyn Provider>) -> Fut,
        Fut: Future<Output = Result<T, ProviderError>>,
    {
        if order.is_empty() {
            return Err(FactoryError::EmptyFallback.into());
        }
        let mut skipped = Vec::new();
        for id in order {
            let provider = self.construct(id, config)?;
            match operation(provider.clone()).await {
                Ok(value) => {
                    return Ok(Fallback {
                        provider,
                        value,
                        skipped,
                    })
                }
                Err(err) if err.kind().allows_fallback() => {
                    tracing::warn!(provider = %id, kind = %err.kind(), "falling back: {err}");
                    skipped.push(FallbackStep {
                        provider: id.clone(),
                        kind: err.kind(),
                        message: err.to_string(),
                    });
                }
                Err(source) => {
                    return Err(FallbackError::Stopped {
                        provider: id.clone(),
                        source,
                        skipped,
                    })
                }
            }
        }
        Err(FallbackError::Exhausted { skipped })
    }
}

/// The sha256 of an adapter's source as compiled into this build (for evidence binding), or
/// `None` for providers without an adapter here.
pub fn adapter_source_hash(id: &str) -> Option<&'static str> {
    match id {
        "host" => Some(env!("BERTH_SOURCE_HOST")),
        "bwrap" => Some(env!("BERTH_SOURCE_BWRAP")),
        "docker" => Some(env!("BERTH_SOURCE_DOCKER")),
        #[cfg(feature = "computesdk")]
        id if berth_provider_computesdk::vendor(id).is_some() => {
            Some(env!("BERTH_SOURCE_COMPUTESDK"))
        }
        _ => None,
    }
}

/// The sha256 of the conformance kit as compiled into this build (its clauses and the runner
/// that grades them): an evidence record made by another kit does not prove this one's clauses.
pub fn conformance_kit_hash() -> &'static str {
    env!("BERTH_SOURCE_KIT")
}

/// Checks declared capabilities against what the adapter implements.
pub fn reconcile(manifest: &ProviderManifest, provider: &dyn Provider) -> Result<(), FactoryError> {
    if provider.id() != manifest.id {
        return Err(FactoryError::IdMismatch {
            manifest: manifest.id.clone(),
            adapter: provider.id().to_owned(),
        });
    }
    let implemented = implemented_capabilities(provider);
    for capability in Capability::ALL {
        let declared = manifest.support(capability);
        let has = implemented.contains(capability);
        let agrees = match declared {
            Support::Supported => has,
            Support::Unsupported => !has,
            Support::Unknown => true,
        };
        if !agrees {
            return Err(FactoryError::CapabilityMismatch {
                provider: manifest.id.clone(),
                capability,
                declared,
                implemented: has,
            });
        }
    }
    Ok(())
}

#[cfg(feature = "host")]
fn construct_host(
    _manifest: &ProviderManifest,
    config: &ProviderConfig,
) -> Result<Arc<dyn Provider>, ProviderError> {
    let provider = berth_provider_host::new(
        config.state_dir.join("host"),
        berth_provider_host::HostConfig {
            reaper: reaper(config),
            ..Default::default()
        },
    )?;
    Ok(Arc::new(provider))
}

/// The per-exec reaper local providers run commands under: the supervisor when there is one,
/// else the configured fallback. Resolved here, when a local provider is built, so commands
/// that never run one (`list`, `catalog`) never touch the supervisor file.
#[cfg(any(feature = "host", feature = "bwrap"))]
fn reaper(config: &ProviderConfig) -> Option<PathBuf> {
    supervisor(config).ok().or_else(|| config.reaper.clone())
}

#[cfg(feature = "bwrap")]
fn construct_bwrap(
    _manifest: &ProviderManifest,
    config: &ProviderConfig,
) -> Result<Arc<dyn Provider>, ProviderError> {
    let provider = berth_provider_bwrap::new(
        config.state_dir.join("bwrap"),
        berth_provider_bwrap::BwrapConfig {
            reaper: reaper(config),
            ..Default::default()
        },
    )?;
    Ok(Arc::new(provider))
}

#[cfg(feature = "docker")]
fn construct_docker(
    _manifest: &ProviderManifest,
    config: &ProviderConfig,
) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(docker(config)?))
}

/// The docker adapter as `construct` builds it, typed (benchmarks reach its bare mechanism).
#[cfg(feature = "docker")]
pub fn docker(
    config: &ProviderConfig,
) -> Result<berth_provider_docker::DockerProvider, ProviderError> {
    use berth_provider_docker::{engine, DockerConfig, DockerProvider};
    let socket = engine::socket_from_docker_host(config.env.get("DOCKER_HOST"))?;
    let supervisor = supervisor(config)?;
    DockerProvider::new(DockerConfig::new(
        config.state_dir.join("docker"),
        socket,
        supervisor,
    ))
}

/// A registry bound to a configuration ([`Registry::bind`]).
#[derive(Debug, Clone, Copy)]
pub struct Bound<'a> {
    registry: &'a Registry,
    config: &'a ProviderConfig,
}

impl berth_contract::ProviderLookup for Bound<'_> {
    fn provider(&self, id: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        use berth_contract::ErrorKind;
        self.registry.construct(id, self.config).map_err(|e| {
            let kind = match &e {
                FactoryError::Construct { source, .. } => source.kind(),
                FactoryError::MissingCredential { .. } => ErrorKind::Auth,
                FactoryError::UnknownProvider { .. } | FactoryError::NoAdapter { .. } => {
                    ErrorKind::NotFound
                }
                _ => ErrorKind::InvalidRequest,
            };
            ProviderError::new(kind, id, "cannot construct the provider").with_source(e)
        })
    }
}

/// What a provider's substrate reports about itself, where this build can ask (the docker
/// engine's version and the negotiated API version); `None` elsewhere or when it cannot answer.
pub async fn observed_provenance(id: &str, config: &ProviderConfig) -> Option<String> {
    #[cfg(feature = "docker")]
    if id == "docker" {
        let socket =
            berth_provider_docker::engine::socket_from_docker_host(config.env.get("DOCKER_HOST"))
                .ok()?;
        let (api, engine) = berth_provider_docker::Engine::new(&socket)
            .versions()
            .await
            .ok()?;
        return Some(format!("docker engine {engine}, API {api} negotiated"));
    }
    #[cfg(feature = "computesdk")]
    if berth_provider_computesdk::vendor(id).is_some() {
        return computesdk::observed_packages(id, config).await;
    }
    let _ = (id, config);
    None
}
