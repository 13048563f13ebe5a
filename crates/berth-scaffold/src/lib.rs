//! `berth provider new NAME` as a library: the one path for adding a provider starts here.
//!
//! Generates, under `crates/berth-provider-NAME/`: a compiling adapter whose core answers a
//! typed "not implemented yet" error and whose optional capabilities are all absent (so they
//! answer `Unsupported`), conformance wiring that runs the shared suite once the adapter is live,
//! and `CHECKLIST.md`; plus `catalog/providers/NAME.toml` declaring every capability
//! `unsupported` and carrying no verification — UNKNOWN in the catalog until evidence exists.
//! Existing files are never overwritten.

use std::path::{Path, PathBuf};

/// The scaffold could not be written (nothing existing is ever overwritten).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScaffoldError {
    /// Not a provider id.
    #[error("`{0}` is not a provider id: use lowercase letters, digits and `-`, starting with a letter (e.g. `my-cloud`)")]
    InvalidName(String),
    /// Neither a Berth checkout nor a `berth_source` to depend on.
    #[error("{0} is not a Berth checkout: run it at the top of the Berth repository, or pass the Berth source path")]
    NotACheckout(PathBuf),
    /// A file the scaffold would write exists.
    #[error("{0} already exists; berth never overwrites it (pick another provider name or remove the old files)")]
    Exists(PathBuf),
    /// Writing failed.
    #[error("cannot write {path}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Scaffolded {
    /// Every file, in the order written.
    pub written: Vec<PathBuf>,
    /// The checklist to work through next.
    pub checklist: PathBuf,
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && name.len() <= 40
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn type_name(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect::<String>()
        + "Provider"
}

fn env_prefix(name: &str) -> String {
    name.to_ascii_uppercase().replace('-', "_")
}

fn cargo_toml(name: &str, berth_source: Option<&Path>) -> String {
    let deps = match berth_source {
        None => "async-trait.workspace = true\nberth-contract.workspace = true\n\n[dev-dependencies]\nberth-conformance.workspace = true\nberth-manifest.workspace = true\ntokio.workspace = true\n".to_owned(),
        Some(src) => format!(
            "async-trait = \"0.1\"\nberth-contract = {{ path = \"{0}/crates/berth-contract\" }}\n\n[dev-dependencies]\nberth-conformance = {{ path = \"{0}/crates/berth-conformance\" }}\nberth-manifest = {{ path = \"{0}/crates/berth-manifest\" }}\ntokio = {{ version = \"1\", features = [\"rt-multi-thread\", \"macros\"] }}\n",
            src.display()
        ),
    };
    let package = match berth_source {
        None => "version.workspace = true\nedition.workspace = true\nlicense.workspace = true"
            .to_owned(),
        Some(_) => "version = \"0.1.0\"\nedition = \"2021\"\nlicense = \"Apache-2.0\"".to_owned(),
    };
    let tail = match berth_source {
        None => "\n[lints]\nworkspace = true\n",
        // Outside a Berth checkout the crate is its own workspace.
        Some(_) => "\n[workspace]\n",
    };
    format!(
        "[package]\nname = \"berth-provider-{name}\"\ndescription = \"The Berth `{name}` provider (scaffolded; not implemented yet).\"\n{package}\n\n[dependencies]\n{deps}{tail}"
    )
}

fn lib_rs(name: &str) -> String {
    let ty = type_name(name);
    format!(
        r#"//! The `{name}` provider — scaffolded by `berth provider new`.
//!
//! Until each method is written, the core answers a typed error saying so, and every optional
//! capability is absent (so callers get `Unsupported` naming it). Work through CHECKLIST.md.
//! Keep the vendor's API details in this crate and classify its errors in one place.

use async_trait::async_trait;
use berth_contract::{{
    CreateRequest, Created, DestroyOutcome, ErrorKind, ExecOutput, ExecRequest, NativeId,
    Observation, Provider, ProviderError, Result,
}};

/// The provider id (equal to the manifest id).
pub const PROVIDER_ID: &str = "{name}";

/// The `{name}` adapter.
#[derive(Debug, Default)]
pub struct {ty} {{}}

impl {ty} {{
    /// A new adapter. Read credentials from the factory's environment snapshot, by the names
    /// the manifest declares — never from argv, never logged.
    pub fn new() -> Self {{
        {ty} {{}}
    }}
}}

fn not_yet(what: &str) -> ProviderError {{
    ProviderError::new(
        ErrorKind::Unknown,
        PROVIDER_ID,
        format!("the {name} adapter does not implement {{what}} yet"),
    )
}}

#[async_trait]
impl Provider for {ty} {{
    fn id(&self) -> &str {{
        PROVIDER_ID
    }}

    async fn create(&self, _req: &CreateRequest) -> Result<Created> {{
        Err(not_yet("create"))
    }}

    async fn observe(&self, _id: &NativeId) -> Result<Observation> {{
        Err(not_yet("observe"))
    }}

    async fn exec(&self, _id: &NativeId, _req: &ExecRequest) -> Result<ExecOutput> {{
        Err(not_yet("exec"))
    }}

    async fn destroy(&self, _id: &NativeId) -> Result<DestroyOutcome> {{
        Err(not_yet("destroy"))
    }}
}}

#[cfg(test)]
mod tests {{
    use super::*;

    #[tokio::test]
    async fn unwritten_core_says_so_and_capabilities_are_unsupported() {{
        let provider = {ty}::new();
        let err = provider.observe(&NativeId("x".into())).await.unwrap_err();
        assert!(err.to_string().contains("does not implement observe yet"));
        assert!(berth_contract::implemented_capabilities(&provider).iter().next().is_none());
    }}
}}
"#
    )
}

fn conformance_rs(name: &str) -> String {
    let ty = type_name(name);
    let var = format!("BERTH_SKIP_{}", env_prefix(name));
    format!(
        r#"//! The shared conformance suite against the live `{name}` provider: one test per clause.
//! It runs (with the credentials the manifest names) and fails while the adapter cannot pass
//! it; `{var}=1` skips it explicitly, and each test then prints SKIPPED with the reason.

use std::sync::Arc;

use berth_conformance::Subject;

async fn subject() -> Option<(Subject, ())> {{
    if std::env::var_os("{var}").is_some() {{
        eprintln!("SKIPPED ({var} set): the conformance suite did not run against live {name}");
        return None;
    }}
    let text = include_str!("../../../catalog/providers/{name}.toml");
    let manifest = berth_manifest::parse("{name}.toml", text).expect("manifest is valid");
    let provider = Arc::new(berth_provider_{snake}::{ty}::new());
    Some((Subject::new(provider, manifest, None, format!("{short}{{}}", std::process::id())), ()))
}}

berth_conformance::all_conformance_tests!(subject());
"#,
        snake = name.replace('-', "_"),
        short = name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(6)
            .collect::<String>(),
    )
}

fn manifest_toml(name: &str) -> String {
    let caps = [
        "exec_streaming",
        "exec_detached",
        "files",
        "stop_start",
        "suspend_resume",
        "filesystem_snapshot",
        "memory_snapshot",
        "fork",
        "listing",
        "access",
        "ttl",
        "loopback_forward",
    ]
    .iter()
    .map(|c| format!("{c} = \"unsupported\""))
    .collect::<Vec<_>>()
    .join("\n");
    format!(
        r#"# Berth provider manifest. Format: schemas/provider-manifest.schema.json
# Scaffolded by `berth provider new {name}`: every capability is unsupported until the adapter
# implements it (the factory checks), and nothing is verified until `berth verify {name}` says so.
schema_version = 1
id = "{name}"
display_name = "{name}"
summary = "TODO: one sentence on what {name} is."
adapter_version = "0.1.0"
# Names of the environment variables the adapter reads; never values.
credentials = [
  {{ name = "{env}_API_KEY", kind = "secret", required = true, purpose = "{name} API key" }},
]
regions = []

[isolation]
class = "vm"
technology = "TODO: what isolates a {name} sandbox"
statement = "Not established: fill in from the provider's documentation, then prove it with the conformance suite."

[provenance]
source = "TODO: API spec or SDK this adapter follows"
pinned = "TODO: API version or commit"
docs = []

[capabilities]
{caps}

[lifecycle]
create = "Not implemented yet."
exec = "Not implemented yet."
stop = "Not implemented yet."
suspend = "Not implemented yet."
snapshot = "Not implemented yet."
destroy = "Not implemented yet."

[images]
model = "unknown"
known = []

[pricing]
source = "not researched yet"
confidence = "unknown"
summary = "UNKNOWN"

[verification]
"#,
        env = env_prefix(name)
    )
}

fn checklist(name: &str) -> String {
    format!(
        r#"# Adding the `{name}` provider — checklist

The one path: scaffold → implement → conformance → `berth verify` → evidence → catalog.

- [ ] Manifest `catalog/providers/{name}.toml`: summary, isolation statement, pinned provenance,
      credential variable names (never values), lifecycle semantics in words, regions, images,
      pricing with source and confidence. Declare a capability `supported` only once the adapter
      implements it — the factory refuses to construct a mismatch.
- [ ] Adapter `src/lib.rs`: create (labelled with every `berth.*` label; named from Berth's id so
      an intent row can find it), observe (raw state kept, unmapped = unknown), exec (separate
      streams, real exit status, timeout kills the process tree), destroy (idempotent, verified
      gone or Accepted). One module classifies the vendor's errors into `ErrorKind`.
- [ ] Optional capabilities: implement the trait, return `Some(self)` from its accessor, declare it.
- [ ] Register in `crates/berth-factory` behind a `{name}` feature, add the manifest to
      `crates/berth-manifest/src/embedded.rs`, and add the crate to `.ci/check-architecture`'s view
      (adapters may depend only on the contract).
- [ ] Ledger integration comes with registration: every `berth` verb and `berth ledger sweep`
      then track the provider's sandboxes; implement `listing` so sweeps can discover lost ones.
- [ ] Conformance: `tests/conformance.rs` runs the shared suite against the live provider and
      fails until the adapter passes it; `BERTH_SKIP_{env}=1` skips it explicitly (say so wherever
      you do). Offline, test against recorded request/response fixtures.
- [ ] Benchmark: `berth bench {name}` (lifecycle, side by side with others) works once registered.
- [ ] Evidence: `berth verify {name}` writes a sealed record; `berth catalog show {name}` reads it;
      `berth catalog check` must pass. The status stays UNKNOWN until a live, passing record exists.
- [ ] Docs: README status table and provider section, ARCHITECTURE.md crate list.
"#,
        env = env_prefix(name)
    )
}

fn write_new(path: &Path, text: &str, written: &mut Vec<PathBuf>) -> Result<(), ScaffoldError> {
    if path.exists() {
        return Err(ScaffoldError::Exists(path.to_owned()));
    }
    let fail = |at: &Path| {
        let at = at.to_owned();
        move |source| ScaffoldError::Write { path: at, source }
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(fail(parent))?;
    }
    // create_new: a file that appeared since the check is still never overwritten.
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => ScaffoldError::Exists(path.to_owned()),
            _ => ScaffoldError::Write {
                path: path.to_owned(),
                source: e,
            },
        })?;
    written.push(path.to_owned());
    Ok(())
}

/// Writes a new provider `name` under `root` (a Berth checkout, or any directory when
/// `berth_source` names one for the generated crate to depend on).
pub fn new_provider(
    name: &str,
    root: &Path,
    berth_source: Option<&Path>,
) -> Result<Scaffolded, ScaffoldError> {
    if !valid_name(name) {
        return Err(ScaffoldError::InvalidName(name.to_owned()));
    }
    let in_checkout = root.join("crates/berth-contract").is_dir();
    if !in_checkout && berth_source.is_none() {
        return Err(ScaffoldError::NotACheckout(root.to_owned()));
    }
    let source = if in_checkout { None } else { berth_source };
    let krate = root.join(format!("crates/berth-provider-{name}"));
    let mut written = Vec::new();
    write_new(
        &krate.join("Cargo.toml"),
        &cargo_toml(name, source),
        &mut written,
    )?;
    write_new(&krate.join("src/lib.rs"), &lib_rs(name), &mut written)?;
    write_new(
        &krate.join("tests/conformance.rs"),
        &conformance_rs(name),
        &mut written,
    )?;
    write_new(&krate.join("CHECKLIST.md"), &checklist(name), &mut written)?;
    write_new(
        &root.join(format!("catalog/providers/{name}.toml")),
        &manifest_toml(name),
        &mut written,
    )?;
    Ok(Scaffolded {
        written,
        checklist: krate.join("CHECKLIST.md"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_types() {
        assert!(valid_name("my-cloud2"));
        for bad in ["", "My", "1x", "a_b", "../x"] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert_eq!(type_name("my-cloud"), "MyCloudProvider");
        assert_eq!(env_prefix("my-cloud"), "MY_CLOUD");
        let manifest = manifest_toml("my-cloud");
        let parsed = berth_manifest::parse("generated", &manifest).unwrap();
        assert_eq!(parsed.id, "my-cloud");
    }
}
