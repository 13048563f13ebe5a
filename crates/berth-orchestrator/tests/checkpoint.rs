//! A provider without snapshots gets a workspace checkpoint (a git bundle), not an error.
//! The provider is the real host adapter behind a decorator that withholds its snapshot
//! capability, declared so in its manifest (the factory reconciles the two).

use std::sync::Arc;

use async_trait::async_trait;
use berth_contract::{
    CreateRequest, Created, DestroyOutcome, ExecOutput, ExecRequest, Files, Fork, Listing,
    NativeId, Observation, Provider, Result, StreamingExec,
};
use berth_factory::{Environment, ProviderConfig, Registry};
use berth_ledger::Ledger;
use berth_mission::authority::{AttemptStatus, MissionState};
use berth_orchestrator::Orchestrator;
use berth_store::Store;

#[derive(Debug)]
struct WithoutSnapshots(berth_provider_host::HostProvider);

#[async_trait]
impl Provider for WithoutSnapshots {
    fn id(&self) -> &str {
        "nosnap"
    }
    async fn create(&self, req: &CreateRequest) -> Result<Created> {
        self.0.create(req).await
    }
    async fn observe(&self, id: &NativeId) -> Result<Observation> {
        self.0.observe(id).await
    }
    async fn exec(&self, id: &NativeId, req: &ExecRequest) -> Result<ExecOutput> {
        self.0.exec(id, req).await
    }
    async fn destroy(&self, id: &NativeId) -> Result<DestroyOutcome> {
        self.0.destroy(id).await
    }
    fn streaming(&self) -> Option<&dyn StreamingExec> {
        Provider::streaming(&self.0)
    }
    fn files(&self) -> Option<&dyn Files> {
        Provider::files(&self.0)
    }
    fn fork(&self) -> Option<&dyn Fork> {
        Provider::fork(&self.0)
    }
    fn listing(&self) -> Option<&dyn Listing> {
        Provider::listing(&self.0)
    }
    fn access(&self) -> Option<&dyn berth_contract::Access> {
        Provider::access(&self.0)
    }
}

#[tokio::test]
async fn providers_without_snapshots_checkpoint_the_workspace() {
    let home = tempfile::Builder::new()
        .prefix("berth-test-orch-")
        .tempdir()
        .unwrap();
    let (_, host_text) = berth_manifest::embedded()
        .iter()
        .find(|(o, _)| o.ends_with("host.toml"))
        .unwrap();
    let text = host_text
        .replacen("id = \"host\"", "id = \"nosnap\"", 1)
        .replacen(
            "filesystem_snapshot = \"supported\"",
            "filesystem_snapshot = \"unsupported\"",
            1,
        );
    let mut registry = Registry::with_manifests([berth_manifest::parse("nosnap", &text).unwrap()]);
    registry.register("nosnap", |_, config| {
        let host = berth_provider_host::new(config.state_dir.join("nosnap"), Default::default())?;
        Ok(Arc::new(WithoutSnapshots(host)))
    });
    let config = ProviderConfig {
        state_dir: home.path().join("state"),
        env: Environment::empty(),
        reaper: None,
    };
    let store = Store::open(&home.path().join("berth.db")).await.unwrap();
    let ledger = Ledger::new(store.clone(), "orch-tester", "run-1");
    let orch = Orchestrator {
        store: &store,
        ledger: &ledger,
        registry: &registry,
        config: &config,
        home: home.path(),
        boundary: None,
        lease: Default::default(),
        gateways: Default::default(),
        settled: Default::default(),
        last_stored: Default::default(),
        providers: Default::default(),
    };
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/fix-the-test");
    let mission_text = std::fs::read_to_string(example.join("mission.toml"))
        .unwrap()
        .replace("provider = \"host\"", "provider = \"nosnap\"");
    let dir = home.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(example.join("repo"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::write(dir.join("mission.toml"), mission_text).unwrap();

    let id = orch.create(&dir.join("mission.toml")).await.unwrap();
    let state = orch.run(&id, &mut |_| {}).await.unwrap();
    assert_eq!(state, MissionState::Succeeded);
    let (_, record, _) = orch.load(&id).await.unwrap();
    match &record.tasks[0].attempts[1].status {
        AttemptStatus::Accepted {
            checkpoint: Some(checkpoint),
            finalized: true,
            ..
        } => {
            let path = checkpoint
                .strip_prefix("bundle:")
                .expect("a workspace checkpoint");
            let clone = home.path().join("restored");
            let ok = std::process::Command::new("git")
                .args(["clone", "-q", path])
                .arg(&clone)
                .status()
                .unwrap();
            assert!(ok.success(), "the checkpoint restores");
            assert!(std::fs::read_to_string(clone.join("calc.py"))
                .unwrap()
                .contains("a + b"));
        }
        other => panic!("{other:?}"),
    }
}
