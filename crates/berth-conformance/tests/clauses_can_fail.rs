//! Clauses that can only pass prove nothing: these run clauses against a real host provider
//! whose manifest lies, and the clauses must fail.

mod common;

use berth_conformance::{run_clause, Grade};

async fn lying_host(
    edit: impl FnOnce(&mut berth_manifest::ProviderManifest),
) -> (berth_conformance::Subject, tempfile::TempDir) {
    let (subject, state) = common::subject("host", None, "BERTH_SKIP_HOST", "li")
        .await
        .expect("the host provider always constructs");
    let mut manifest = subject.manifest.clone();
    edit(&mut manifest);
    let lying = berth_conformance::Subject::new(
        subject.provider.clone(),
        manifest,
        None,
        common::run_id("li"),
    );
    (lying, state)
}

/// The host adapter offers fork; a manifest that declares it unsupported is caught.
#[tokio::test]
async fn a_capability_declared_unsupported_but_offered_fails() {
    let (subject, _state) = lying_host(|m| {
        m.capabilities.insert(
            berth_contract::Capability::Fork,
            berth_contract::Support::Unsupported,
        );
    })
    .await;
    let result = run_clause(&subject, "unsupported.answers_unsupported").await;
    assert_eq!(result.grade, Grade::Fail, "{:?}", result.diagnostics);
    assert!(
        result.diagnostics[0].contains("fork"),
        "{:?}",
        result.diagnostics
    );
}

/// The host provider has no pids or memory limit and keeps its capabilities; a manifest that
/// declares docker's walls for it is caught.
#[tokio::test]
async fn walls_a_provider_does_not_have_fail() {
    let (subject, _state) = lying_host(|m| {
        m.isolation.walls = Some(berth_manifest::Walls {
            pids_limit: 1024,
            memory_mib: 4096,
            no_new_privileges: true,
            capabilities: vec!["CHOWN".into()],
        });
    })
    .await;
    let result = run_clause(&subject, "isolation.default_walls").await;
    assert_eq!(result.grade, Grade::Fail, "{:?}", result.diagnostics);
}
