//! The manifest format. Field order here is the order in the TOML files.

use std::collections::BTreeMap;

use berth_contract::{Capability, Support};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The manifest schema version this Berth reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// One provider's manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderManifest {
    /// Must equal [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Provider id, e.g. `host`.
    pub id: String,
    /// Human name.
    pub display_name: String,
    /// One sentence on what it is.
    pub summary: String,
    /// The adapter crate's version this manifest describes.
    pub adapter_version: String,
    /// What the provider isolates, in plain words.
    pub isolation: Isolation,
    /// Where the adapter's knowledge of the provider comes from, pinned.
    pub provenance: Provenance,
    /// Environment variables the adapter reads (names only).
    #[serde(default)]
    pub credentials: Vec<Credential>,
    /// Every capability, declared tri-state.
    pub capabilities: BTreeMap<Capability, Support>,
    /// What lifecycle verbs really mean on this provider.
    pub lifecycle: Lifecycle,
    /// Regions the provider offers (empty for local providers).
    #[serde(default)]
    pub regions: Vec<String>,
    /// How images/templates work.
    pub images: ImageModel,
    /// Pricing, with its source and confidence.
    pub pricing: Pricing,
    /// When this manifest's claims were last verified, and by which evidence.
    #[serde(default)]
    pub verification: Verification,
}

impl ProviderManifest {
    /// The declared support for a capability (`Unknown` if absent, which validation forbids).
    pub fn support(&self, capability: Capability) -> Support {
        self.capabilities
            .get(&capability)
            .copied()
            .unwrap_or(Support::Unknown)
    }

    /// Names of the credentials that must be set.
    pub fn required_env(&self) -> impl Iterator<Item = &str> {
        self.credentials
            .iter()
            .filter(|c| c.required)
            .map(|c| c.name.as_str())
    }
}

/// Isolation class, strongest last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IsolationClass {
    /// Nothing is isolated.
    None,
    /// Linux namespaces.
    Namespace,
    /// A container runtime.
    Container,
    /// A user-space kernel (gVisor).
    UserspaceKernel,
    /// A micro-VM.
    Microvm,
    /// A full VM.
    Vm,
}

/// What the provider isolates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Isolation {
    /// The class.
    pub class: IsolationClass,
    /// The technology, e.g. `bubblewrap`, `firecracker`.
    pub technology: String,
    /// Plain statement of what is and is not isolated.
    pub statement: String,
    /// The limits every sandbox gets unless a request sets its own; the conformance suite
    /// checks them from inside a sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walls: Option<Walls>,
}

/// Default walls of a sandbox, as seen from inside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Walls {
    /// Most processes at once.
    pub pids_limit: u64,
    /// Memory limit in MiB.
    pub memory_mib: u64,
    /// `no_new_privs` is set: setuid binaries grant nothing.
    pub no_new_privileges: bool,
    /// The Linux capabilities kept in the bounding set (names without `CAP_`); every other
    /// one is dropped.
    pub capabilities: Vec<String>,
}

/// Where the adapter's knowledge comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// Source of truth: a crate path, an API spec, an SDK.
    pub source: String,
    /// The pinned version: API version, commit, or `workspace` for in-repo adapters.
    pub pinned: String,
    /// Documentation consulted.
    #[serde(default)]
    pub docs: Vec<String>,
}

/// Whether a variable holds a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CredentialKind {
    /// A secret: its value is never printed, logged or stored.
    Secret,
    /// A plain setting (region, endpoint).
    Variable,
}

/// One environment variable the adapter reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// The variable's name.
    pub name: String,
    /// Secret or plain.
    pub kind: CredentialKind,
    /// Whether construction fails without it.
    pub required: bool,
    /// What it is for.
    pub purpose: String,
}

/// What lifecycle verbs really mean here, in words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    /// What create/ready means.
    pub create: String,
    /// What exec does with processes, timeouts and output.
    pub exec: String,
    /// What stop means (or why it is unsupported).
    pub stop: String,
    /// What suspend means (or why it is unsupported).
    pub suspend: String,
    /// What a snapshot captures and how it is identified.
    pub snapshot: String,
    /// What destroy does and how gone-ness is verified.
    pub destroy: String,
}

/// How images or templates work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageModel {
    /// `none`, `image`, `template`, …
    pub model: String,
    /// Known images or templates.
    #[serde(default)]
    pub known: Vec<String>,
}

/// How sure a price is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PricingConfidence {
    /// From a published price list, as of the source's date.
    Exact,
    /// Derived or approximated.
    Estimated,
    /// Not known.
    Unknown,
}

/// Pricing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    /// Where the figure comes from.
    pub source: String,
    /// How sure it is.
    pub confidence: PricingConfidence,
    /// The figure in words (e.g. `$0.000014 per vCPU-second`), or why there is none.
    pub summary: String,
}

/// Verification timestamps and evidence pointers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Verification {
    /// RFC 3339 time of the last verification run, if any.
    pub verified_at: Option<String>,
    /// Path or id of the evidence record, if any.
    pub evidence: Option<String>,
    /// Conformance clauses this adapter is known to fail, each with the reason. The gate still
    /// reports them FAILED; `catalog check` accepts exactly these failures (and fails when one
    /// of them starts passing, so the declaration cannot go stale).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub known_failures: std::collections::BTreeMap<String, String>,
}
