//! Factory tests: construction, credential contract, capability reconciliation, fallback.
//!
//! Fallback is exercised with a scripted test adapter whose `create` fails with a chosen error
//! kind: the point is the factory's decision logic, which no real local substrate can be made to
//! fail with "capacity" on demand. Positive construction uses the real host adapter.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use berth_contract::{
    Capability, CreateRequest, Created, DestroyOutcome, ErrorKind, ExecOutput, ExecRequest, Labels,
    NativeId, Observation, Provider, ProviderError, SandboxName, Support,
};
use berth_factory::{Environment, FactoryError, FallbackError, ProviderConfig, Registry};
use berth_manifest::ProviderManifest;

fn host_manifest_text() -> &'static str {
    berth_manifest::embedded()
        .iter()
        .find(|(o, _)| o.ends_with("host.toml"))
        .unwrap()
        .1
}

fn host_manifest_with(from: &str, to: &str) -> ProviderManifest {
    let text = host_manifest_text().replacen(from, to, 1);
    assert_ne!(
        text,
        host_manifest_text(),
        "replacement `{from}` did not apply"
    );
    berth_manifest::parse("test", &text).unwrap()
}

fn config() -> (tempfile::TempDir, ProviderConfig) {
    let dir = tempfile::Builder::new()
        .prefix("berth-test-factory-")
        .tempdir()
        .unwrap();
    let config = ProviderConfig {
        state_dir: dir.path().to_owned(),
        env: Environment::empty(),
        reaper: None,
    };
    (dir, config)
}

#[test]
fn builtin_registry_constructs_host() {
    let (_dir, config) = config();
    let registry = Registry::builtin().unwrap();
    let host = registry.construct("host", &config).unwrap();
    assert_eq!(host.id(), "host");
}

#[test]
fn unknown_and_catalog_only_providers_are_clear_errors() {
    let (_dir, config) = config();
    let registry = Registry::builtin().unwrap();
    let err = registry.construct("nope", &config).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown provider `nope` (known: agent37, bwrap, computesdk:daytona, computesdk:e2b, computesdk:just-bash, computesdk:modal, daytona, docker, e2b, freestyle, host, microsandbox, modal)"
    );

    let catalog_only = host_manifest_with("id = \"host\"", "id = \"e2b\"");
    let registry = Registry::with_manifests([catalog_only]);
    let err = registry.construct("e2b", &config).unwrap_err();
    assert!(matches!(err, FactoryError::NoAdapter { .. }), "{err}");
}

/// A bridged cloud provider is constructible, but only with its credential: the error names
/// the variable, never a value.
#[test]
fn bridged_cloud_providers_need_their_credentials() {
    let (_dir, config) = config();
    let registry = Registry::builtin().unwrap();
    assert!(registry.has_adapter("computesdk:e2b"));
    let err = registry.construct("computesdk:e2b", &config).unwrap_err();
    assert!(
        matches!(&err, FactoryError::MissingCredential { variable, .. } if variable == "E2B_API_KEY"),
        "{err}"
    );
    let with_key = ProviderConfig {
        env: config
            .env
            .clone()
            .with("E2B_API_KEY", "e2b_canary_factory_0000"),
        ..config.clone()
    };
    let provider = registry.construct("computesdk:e2b", &with_key).unwrap();
    assert_eq!(provider.id(), "computesdk:e2b");
    assert!(!format!("{provider:?}").contains("e2b_canary_factory"));
    // Constructing starts nothing: the sidecar starts on first use.
    assert!(registry.construct("computesdk:just-bash", &config).is_ok());
}

fn registry_with_host(manifest: ProviderManifest) -> Registry {
    // The real host adapter under a test manifest.
    let mut registry = Registry::with_manifests([manifest]);
    registry.register("host", |_, config| {
        Ok(Arc::new(berth_provider_host::new(
            config.state_dir.join("host"),
            Default::default(),
        )?))
    });
    registry
}

#[test]
fn declared_supported_but_not_implemented_is_a_construction_error() {
    let (_dir, config) = config();
    let manifest = host_manifest_with("stop_start = \"unsupported\"", "stop_start = \"supported\"");
    let err = registry_with_host(manifest)
        .construct("host", &config)
        .unwrap_err();
    match &err {
        FactoryError::CapabilityMismatch {
            capability,
            declared,
            implemented,
            ..
        } => {
            assert_eq!(*capability, Capability::StopStart);
            assert_eq!(*declared, Support::Supported);
            assert!(!implemented);
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("does not implement it"));
}

#[test]
fn implemented_but_declared_unsupported_is_a_construction_error() {
    let (_dir, config) = config();
    let manifest = host_manifest_with("fork = \"supported\"", "fork = \"unsupported\"");
    let err = registry_with_host(manifest)
        .construct("host", &config)
        .unwrap_err();
    assert!(
        matches!(
            err,
            FactoryError::CapabilityMismatch {
                capability: Capability::Fork,
                implemented: true,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unknown_declarations_reconcile_either_way() {
    let (_dir, config) = config();
    let manifest = host_manifest_with("fork = \"supported\"", "fork = \"unknown\"");
    let manifest_text = toml_of(&manifest);
    let manifest = berth_manifest::parse(
        "test",
        &manifest_text.replacen("ttl = \"unsupported\"", "ttl = \"unknown\"", 1),
    )
    .unwrap();
    assert!(registry_with_host(manifest)
        .construct("host", &config)
        .is_ok());
}

fn toml_of(manifest: &ProviderManifest) -> String {
    toml::to_string(manifest).unwrap()
}

const CANARY: &str = "canary-secret-value-93f1";

#[test]
fn missing_credential_names_the_variable_and_never_a_value() {
    let (_dir, config) = config();
    let manifest = host_manifest_with(
        "credentials = []",
        "credentials = [{ name = \"HOST_TEST_TOKEN\", kind = \"secret\", required = true, purpose = \"test token\" }]",
    );
    let registry = registry_with_host(manifest);
    let err = registry.construct("host", &config).unwrap_err();
    assert_eq!(
        err.to_string(),
        "provider `host` needs environment variable `HOST_TEST_TOKEN` (test token); it is not set"
    );
    assert_eq!(
        registry.missing_credentials("host", &config.env),
        vec!["HOST_TEST_TOKEN"]
    );

    let with_secret = ProviderConfig {
        env: Environment::empty().with("HOST_TEST_TOKEN", CANARY),
        ..config
    };
    registry.construct("host", &with_secret).unwrap();
    assert!(registry
        .missing_credentials("host", &with_secret.env)
        .is_empty());
    assert!(
        !format!("{with_secret:?}").contains(CANARY),
        "Debug leaked the secret"
    );
}

/// A provider whose create fails with a chosen kind, counting calls.
#[derive(Debug)]
struct Scripted {
    id: &'static str,
    fail: Option<ErrorKind>,
    calls: Arc<AtomicUsize>,
}

#[async_trait]
impl Provider for Scripted {
    fn id(&self) -> &str {
        self.id
    }
    async fn create(&self, req: &CreateRequest) -> Result<Created, ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.fail {
            Some(ErrorKind::Unsupported) => {
                Err(ProviderError::unsupported(Capability::Fork, self.id))
            }
            Some(kind) => Err(ProviderError::new(
                kind,
                self.id,
                format!("scripted {kind}"),
            )),
            None => Ok(Created {
                native_id: NativeId(req.name.0.clone()),
                raw_state: "ready".into(),
            }),
        }
    }
    async fn observe(&self, _: &NativeId) -> Result<Observation, ProviderError> {
        Ok(Observation::Absent)
    }
    async fn exec(&self, _: &NativeId, _: &ExecRequest) -> Result<ExecOutput, ProviderError> {
        Err(ProviderError::new(
            ErrorKind::NotFound,
            self.id,
            "no sandbox",
        ))
    }
    async fn destroy(&self, _: &NativeId) -> Result<DestroyOutcome, ProviderError> {
        Ok(DestroyOutcome::VerifiedGone {
            already_absent: true,
        })
    }
}

fn scripted_registry(calls: &Arc<AtomicUsize>) -> Registry {
    let all_unsupported = |id: &str| {
        let mut text = host_manifest_text().replacen("id = \"host\"", &format!("id = \"{id}\""), 1);
        for cap in [
            "exec_streaming",
            "files",
            "filesystem_snapshot",
            "fork",
            "listing",
            "access",
        ] {
            text = text.replacen(
                &format!("{cap} = \"supported\""),
                &format!("{cap} = \"unsupported\""),
                1,
            );
        }
        berth_manifest::parse(id, &text).unwrap()
    };
    let ids = [
        "full",
        "quota",
        "down",
        "throttled",
        "nocap",
        "invalid",
        "ok",
    ];
    let mut registry = Registry::with_manifests(ids.map(all_unsupported));
    CALLS.with(|c| *c.borrow_mut() = Some(calls.clone()));
    registry.register("full", |_, _| {
        Ok(scripted("full", Some(ErrorKind::Capacity)))
    });
    registry.register("quota", |_, _| {
        Ok(scripted("quota", Some(ErrorKind::Quota)))
    });
    registry.register("down", |_, _| {
        Ok(scripted("down", Some(ErrorKind::Unavailable)))
    });
    registry.register("throttled", |_, _| {
        Ok(scripted("throttled", Some(ErrorKind::RateLimited)))
    });
    registry.register("nocap", |_, _| {
        Ok(scripted("nocap", Some(ErrorKind::Unsupported)))
    });
    registry.register("invalid", |_, _| {
        Ok(scripted("invalid", Some(ErrorKind::InvalidRequest)))
    });
    registry.register("ok", |_, _| Ok(scripted("ok", None)));
    registry
}

thread_local! {
    static CALLS: std::cell::RefCell<Option<Arc<AtomicUsize>>> = const { std::cell::RefCell::new(None) };
}

fn scripted(id: &'static str, fail: Option<ErrorKind>) -> Arc<dyn Provider> {
    let calls = CALLS.with(|c| c.borrow().clone().unwrap());
    Arc::new(Scripted { id, fail, calls })
}

fn req() -> CreateRequest {
    CreateRequest::new(
        SandboxName("bx-fallback".into()),
        Labels {
            owner: "t".into(),
            run_id: "r".into(),
            ledger_token: "k".into(),
            expires_at_unix: None,
        },
    )
}

async fn run(
    order: &[&str],
) -> (
    Result<berth_factory::Fallback<Created>, FallbackError>,
    usize,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let registry = scripted_registry(&calls);
    let (_dir, config) = config();
    let order: Vec<String> = order.iter().map(|s| s.to_string()).collect();
    let request = req();
    let result = registry
        .with_fallback(&order, &config, |provider| {
            let request = request.clone();
            async move { provider.create(&request).await }
        })
        .await;
    (result, calls.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "current_thread")]
async fn fallback_moves_on_for_capacity_quota_unavailable_rate_limit_and_records_why() {
    let (result, calls) = run(&["full", "quota", "down", "throttled", "ok"]).await;
    let fallback = result.unwrap();
    assert_eq!(fallback.provider.id(), "ok");
    let reasons: Vec<_> = fallback
        .skipped
        .iter()
        .map(|s| (s.provider.as_str(), s.kind))
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("full", ErrorKind::Capacity),
            ("quota", ErrorKind::Quota),
            ("down", ErrorKind::Unavailable),
            ("throttled", ErrorKind::RateLimited)
        ]
    );
    assert_eq!(calls, 5);
}

#[tokio::test(flavor = "current_thread")]
async fn fallback_never_moves_on_for_unsupported() {
    let (result, calls) = run(&["nocap", "ok"]).await;
    match result.unwrap_err() {
        FallbackError::Stopped {
            provider, source, ..
        } => {
            assert_eq!(provider, "nocap");
            assert_eq!(source.kind(), ErrorKind::Unsupported);
        }
        other => panic!("{other}"),
    }
    assert_eq!(calls, 1, "`ok` must not be tried after Unsupported");
}

#[tokio::test(flavor = "current_thread")]
async fn fallback_stops_on_request_errors_and_reports_exhaustion() {
    let (result, calls) = run(&["full", "invalid", "ok"]).await;
    match result.unwrap_err() {
        FallbackError::Stopped {
            provider, skipped, ..
        } => {
            assert_eq!(provider, "invalid");
            assert_eq!(skipped.len(), 1);
        }
        other => panic!("{other}"),
    }
    assert_eq!(calls, 2);

    let (result, _) = run(&["full", "down"]).await;
    let err = result.unwrap_err();
    assert!(
        matches!(err, FallbackError::Exhausted { ref skipped } if skipped.len() == 2),
        "{err}"
    );
    assert!(err.to_string().contains("full (capacity"), "{err}");

    let (result, _) = run(&[]).await;
    assert!(matches!(
        result.unwrap_err(),
        FallbackError::Factory(FactoryError::EmptyFallback)
    ));
}

/// The built-in registry parses a manifest only when it is used, keyed by its file name: every
/// embedded manifest must parse and declare the id its file name gives it, or `manifest(id)`
/// would hand out a different provider's manifest.
#[test]
fn every_embedded_manifest_parses_under_its_file_name() {
    let registry = Registry::builtin().unwrap();
    let all = registry.manifests().unwrap();
    assert_eq!(all.len(), berth_manifest::embedded().len());
    for (origin, _) in berth_manifest::embedded() {
        let stem = origin.rsplit('/').next().unwrap().trim_end_matches(".toml");
        let id = berth_manifest::id_from_file_stem(stem);
        assert_eq!(registry.manifest(&id).unwrap().id, id, "{origin}");
        assert_eq!(berth_manifest::file_stem(&id), stem, "{origin}");
    }
    assert!(matches!(
        registry.manifest("no-such-provider"),
        Err(FactoryError::UnknownProvider { .. })
    ));
}
