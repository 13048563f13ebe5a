//! Building a conformance subject from the factory, as users get providers.

use berth_conformance::Subject;
use berth_factory::{Environment, ProviderConfig, Registry};

/// A run id unique to one test: tests in a binary run in parallel, and each sweeps its own run.
pub fn run_id(tag: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!("{tag}{}x{n}", std::process::id())
}

/// The provider `id` from the builtin registry, or `None` when `skip_var` is set and the
/// provider cannot be constructed or reached (printed). Without `skip_var`, failure panics.
pub async fn subject(
    id: &str,
    image: Option<String>,
    skip_var: &str,
    tag: &str,
) -> Option<(Subject, tempfile::TempDir)> {
    let state = tempfile::Builder::new()
        .prefix("berth-test-conformance-")
        .tempdir()
        .unwrap();
    let env = Environment::from_vars(std::env::vars());
    let config = ProviderConfig {
        state_dir: state.path().to_owned(),
        // The reaper/entry helper as users get it.
        reaper: Some(berth_testkit::supervisor_binary()),
        env,
    };
    let registry = Registry::builtin().unwrap();
    let manifest = registry.manifest(id).unwrap().clone();
    let constructed = registry.construct(id, &config);
    let provider = match constructed {
        Ok(provider) => provider,
        Err(err) if std::env::var_os(skip_var).is_some() => {
            eprintln!("SKIPPED ({skip_var} set): {err}");
            return None;
        }
        Err(err) => panic!("{err} (set {skip_var}=1 to skip explicitly)"),
    };
    // A provider that constructs lazily (docker) must also answer.
    if let Err(err) = provider
        .observe(&berth_contract::NativeId("cf-probe".into()))
        .await
    {
        if std::env::var_os(skip_var).is_some() {
            eprintln!("SKIPPED ({skip_var} set): {err}");
            return None;
        }
        panic!("{err} (set {skip_var}=1 to skip explicitly)");
    }
    Some((Subject::new(provider, manifest, image, run_id(tag)), state))
}
