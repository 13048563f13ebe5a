//! Helpers shared by docker.rs and the files split from it.
#![allow(dead_code)] // each test binary uses its own subset

use berth_contract::{
    CreateRequest, ExecOutput, ExecRequest, Labels, NativeId, Provider, SandboxName,
};
use berth_provider_docker::{DockerConfig, DockerProvider};
use std::path::PathBuf;
use std::time::Duration;

pub fn image() -> String {
    std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth/agent:bookworm".into())
}

pub fn supervisor() -> PathBuf {
    // scripts/test builds the static supervisor and names it here.
    if let Some(path) = std::env::var_os("BERTH_SUPERVISOR") {
        return PathBuf::from(path);
    }
    // Otherwise: integration tests live in target/<profile>/deps, and cargo builds workspace
    // binaries into target/<profile> before running tests.
    let exe = std::env::current_exe().unwrap();
    let candidate = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("berth-supervisor");
    if !candidate.is_file() {
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "berth-supervisor"])
            .status()
            .unwrap();
        assert!(status.success(), "cannot build berth-supervisor");
    }
    candidate
}

pub struct Fixture {
    pub _state: tempfile::TempDir,
    pub docker: DockerProvider,
    pub run: String,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Leave nothing running, whatever the test did.
        let ids = std::process::Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=berth.run={}", self.run),
            ])
            .output();
        if let Ok(ids) = ids {
            let ids = String::from_utf8_lossy(&ids.stdout);
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let _ = std::process::Command::new("docker")
                    .arg("rm")
                    .arg("-f")
                    .args(&ids)
                    .output();
            }
        }
    }
}

pub async fn fixture(test: &str) -> Option<Fixture> {
    let state = tempfile::Builder::new()
        .prefix("berth-test-docker-")
        .tempdir()
        .unwrap();
    let config = DockerConfig {
        kill_grace: Duration::from_millis(300),
        ..DockerConfig::new(
            state.path().to_owned(),
            PathBuf::from("/var/run/docker.sock"),
            supervisor(),
        )
    };
    let ready = match DockerProvider::new(config) {
        Ok(docker) => docker.engine().versions().await.map(|_| docker),
        Err(err) => Err(err),
    };
    match ready {
        Ok(docker) => Some(Fixture {
            _state: state,
            docker,
            run: format!("test-{test}-{}", std::process::id()),
        }),
        Err(err) if std::env::var_os("BERTH_SKIP_DOCKER").is_some() => {
            eprintln!("SKIPPED (BERTH_SKIP_DOCKER set): {err}");
            None
        }
        Err(err) => panic!("{err}; these tests need a running dockerd (set BERTH_SKIP_DOCKER=1 to skip explicitly)"),
    }
}

impl Fixture {
    pub fn docker_private_run(&self) -> bool {
        DockerConfig::new(PathBuf::new(), PathBuf::new(), PathBuf::new()).private_run
    }

    pub fn request(&self, name: &str) -> CreateRequest {
        let mut req = CreateRequest::new(
            SandboxName(format!("{name}-{}", std::process::id())),
            Labels {
                owner: "berth-test".into(),
                run_id: self.run.clone(),
                ledger_token: format!("tok-{name}"),
                expires_at_unix: None,
            },
        );
        req.image = Some(image());
        req
    }

    pub async fn create(&self, name: &str) -> NativeId {
        self.docker
            .create(&self.request(name))
            .await
            .unwrap()
            .native_id
    }

    pub async fn sh(&self, id: &NativeId, line: &str) -> ExecOutput {
        self.docker
            .exec(id, &ExecRequest::shell(line))
            .await
            .unwrap()
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub async fn init_start_time(f: &Fixture, id: &NativeId) -> String {
    text(&f.sh(id, "cut -d' ' -f22 /proc/1/stat").await.stdout)
}

pub async fn futures_join<T>(handles: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for handle in handles.collect::<Vec<_>>() {
        out.push(handle.await.unwrap());
    }
    out
}
