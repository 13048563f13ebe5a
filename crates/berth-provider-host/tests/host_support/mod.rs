//! Helpers shared by host.rs and the files split from it.
#![allow(dead_code)] // each test binary uses its own subset

use berth_contract::{
    CreateRequest, ExecRequest, Labels, NativeId, OutputSink, Provider, SandboxName, Stream,
};
use berth_provider_host::{HostConfig, HostProvider};
use std::path::Path;
use std::time::Duration;

pub struct Fixture {
    pub _state: tempfile::TempDir,
    pub host: HostProvider,
}

pub fn fixture() -> Fixture {
    fixture_with(Some(berth_testkit::supervisor_binary()))
}

pub fn fixture_with(reaper: Option<std::path::PathBuf>) -> Fixture {
    let state = tempfile::Builder::new()
        .prefix("berth-test-host-")
        .tempdir()
        .unwrap();
    let host = berth_provider_host::new(
        state.path(),
        HostConfig {
            kill_grace: Duration::from_millis(300),
            reaper,
        },
    )
    .unwrap();
    Fixture {
        _state: state,
        host,
    }
}

pub fn request(name: &str, owner: &str) -> CreateRequest {
    CreateRequest::new(
        SandboxName(name.into()),
        Labels {
            owner: owner.into(),
            run_id: "run-test".into(),
            ledger_token: format!("tok-{name}"),
            expires_at_unix: None,
        },
    )
}

pub async fn create(host: &HostProvider, name: &str) -> NativeId {
    host.create(&request(name, "tester"))
        .await
        .unwrap()
        .native_id
}

pub async fn sh(host: &HostProvider, id: &NativeId, line: &str) -> berth_contract::ExecOutput {
    host.exec(id, &ExecRequest::shell(line)).await.unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn wait_gone(pid: i32) -> bool {
    berth_testkit::wait_all_gone(&[pid], Duration::from_secs(5))
}

pub fn read_pid(host: &HostProvider, id: &NativeId, file: &str) -> i32 {
    let path = host.workspace_dir(id).unwrap().join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

pub async fn sh_err(
    host: &HostProvider,
    id: &NativeId,
    line: &str,
) -> berth_contract::ProviderError {
    host.exec(id, &ExecRequest::shell(line)).await.unwrap_err()
}

#[derive(Default)]
pub struct Recorder(pub Vec<(Stream, Vec<u8>)>);

impl OutputSink for Recorder {
    fn chunk(&mut self, stream: Stream, bytes: &[u8]) {
        self.0.push((stream, bytes.to_vec()));
    }
}

/// Swaps `ws/d` (a directory) and `ws/s` (a symlink to a host directory) with
/// `renameat2(RENAME_EXCHANGE)` as fast as it can until `stop` is set — what a process in the
/// sandbox can do while the operator runs `berth cp`.
pub fn exchange_loop(ws: &Path, stop: &std::sync::atomic::AtomicBool) -> u64 {
    let mut swaps = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            ws.join("d").as_path(),
            rustix::fs::CWD,
            ws.join("s").as_path(),
            rustix::fs::RenameFlags::EXCHANGE,
        )
        .unwrap();
        swaps += 1;
    }
    swaps
}
