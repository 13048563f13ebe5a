//! The `docker` provider: one container per sandbox, driven through the Docker Engine API over
//! its Unix socket, with exec served by Berth's in-container supervisor.
//!
//! - Create: the image must already be present (Berth never pulls and never substitutes an
//!   image); the container gets Berth's labels, resource limits, network `none` unless asked,
//!   docker's init as PID 1 (it reaps orphans) and the supervisor as its main process, bound
//!   read-only from the host, listening on a socket in `/run/berth` (a `nosuid,nodev,noexec`
//!   tmpfs reached through `/proc/<pid>/root` when Berth runs as root; see
//!   [`DockerConfig::private_run`]). Ready = the supervisor answers; its identity is then pinned
//!   and checked (`SO_PEERCRED`) on every connection. Default walls: [`DEFAULT_PIDS_LIMIT`],
//!   [`DEFAULT_MEMORY_MIB`], `no-new-privileges`, [`KEPT_CAPABILITIES`] only.
//! - Exec goes through the supervisor (a raw `docker exec` round trip costs ~85 ms here; the
//!   supervisor answers in about a millisecond), which runs each command in its own process
//!   group and kills the whole group on timeout — a timed-out `docker exec` would keep running.
//! - Files go through the archive API (tar put/get), snapshots through commit (image digest),
//!   stop/start are cold (processes gone, filesystem kept), suspend/resume are pause/unpause
//!   (cgroup freezer, memory kept).
//! - Destroy force-removes at once (no stop timeout) and verifies the container is gone.
//!
//! Engine failures are classified in one place (`engine::classify`).

pub mod engine;
mod supervise;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_contract::{
    CanonicalState, Command, CreateRequest, Created, DestroyOutcome, DetachedExec, ErrorKind,
    ExecOutput, ExecRequest, ExecSummary, ExitStatus, FileEntry, FileKind, Files, Fork,
    LabelFilter, Listed, Listing, NativeId, NetworkMode, Observation, OutputSink, ProcessHandle,
    ProcessStatus, Provider, ProviderError, Result, SnapshotHandleKind, SnapshotRef, Snapshots,
    StopStart, StreamingExec, SuspendResume, Transition,
};
use berth_supervisor::{Exit, Request, PROTOCOL_VERSION};
use hyper::{Method, StatusCode};
use serde::Deserialize;

pub use engine::Engine;

/// The provider id.
pub const PROVIDER_ID: &str = "docker";
/// Where the workspace lives inside the container (the default working directory).
pub const WORKSPACE: &str = "/workspace";
/// Where the supervisor binary is mounted in the container.
const SUPERVISOR_IN_CONTAINER: &str = "/usr/local/bin/berth-supervisor";
/// The directory holding the supervisor's socket inside the container.
const RUN_DIR_IN_CONTAINER: &str = "/run/berth";
/// The supervisor's socket in it.
const SOCKET_NAME: &str = "s.sock";
/// Label naming the committed image a fork was made from (removed with the fork).
const FORK_IMAGE_LABEL: &str = "berth.fork-image";
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Slack beyond timeout + grace before the client stops waiting for the supervisor's answer.
const CLIENT_DEADLINE_MARGIN: Duration = Duration::from_secs(10);
/// The walls every container gets unless a request sets its own limits: a fork bomb or a
/// runaway build stops at the container, not the host.
pub const DEFAULT_PIDS_LIMIT: u64 = 1024;
/// Memory limit (MiB) when a request sets none; swap is not added on top.
pub const DEFAULT_MEMORY_MIB: u64 = 4096;
/// The capabilities a container keeps (everything else — MKNOD, NET_RAW, SETFCAP, SYS_CHROOT,
/// AUDIT_WRITE, FSETID, SETPCAP, … — is dropped): enough to install packages and manage files.
pub const KEPT_CAPABILITIES: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "KILL",
    "SETGID",
    "SETUID",
    "NET_BIND_SERVICE",
];
/// Unix socket paths are limited to 108 bytes.
const MAX_SOCKET_PATH: usize = 107;

/// Settings of the docker provider.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// Per-sandbox host directories (supervisor sockets) live here.
    pub state_dir: PathBuf,
    /// The engine's socket.
    pub socket: PathBuf,
    /// The supervisor binary on the host (bound into every container).
    pub supervisor: PathBuf,
    /// How long create waits for the supervisor to answer.
    pub ready_timeout: Duration,
    /// SIGTERM → SIGKILL grace for timed-out commands.
    pub kill_grace: Duration,
    /// Seconds `stop` gives processes before the engine kills them.
    pub stop_timeout_secs: u32,
    /// Where the supervisor's socket lives. `true` (the default when Berth runs as root): on a
    /// tmpfs inside the container (`nosuid,nodev,noexec`), reached from the host through
    /// `/proc/<supervisor>/root` — nothing of the host is writable from inside, no host path
    /// shows in the container's mount table, and a symlink planted there resolves inside the
    /// container. `false` (a non-root user, who cannot enter another user's `/proc/PID/root`):
    /// a per-sandbox host directory bind-mounted at `/run/berth`, which Docker cannot mount
    /// `nosuid,nodev`; it lives under the private state directory (0700), and the supervisor's
    /// pinned identity is checked either way.
    pub private_run: bool,
}

impl DockerConfig {
    /// Defaults for everything but the paths.
    pub fn new(state_dir: PathBuf, socket: PathBuf, supervisor: PathBuf) -> Self {
        DockerConfig {
            state_dir,
            socket,
            supervisor,
            ready_timeout: Duration::from_secs(60),
            kill_grace: Duration::from_millis(500),
            stop_timeout_secs: 5,
            private_run: effective_uid() == Some(0),
        }
    }
}

/// Whether an ELF executable asks for a dynamic loader (has a `PT_INTERP` program header).
/// Static and static-pie binaries do not; anything that is not a 64-bit little-endian ELF is
/// an error.
fn dynamic_interpreter(path: &Path) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned());
    let mut file = std::fs::File::open(path)?;
    let mut header = [0u8; 64];
    file.read_exact(&mut header)?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF executable"));
    }
    let phoff = u64::from_le_bytes(header[0x20..0x28].try_into().expect("8 bytes"));
    let phentsize = u16::from_le_bytes([header[0x36], header[0x37]]) as u64;
    let phnum = u16::from_le_bytes([header[0x38], header[0x39]]) as u64;
    if phentsize < 4 || phnum > 256 {
        return Err(bad("implausible program headers"));
    }
    for n in 0..phnum {
        file.seek(SeekFrom::Start(phoff + n * phentsize))?;
        let mut kind = [0u8; 4];
        file.read_exact(&mut kind)?;
        if u32::from_le_bytes(kind) == 3 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// This process's effective uid, from `/proc/self/status`.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The docker provider.
#[derive(Debug, Clone)]
pub struct DockerProvider {
    engine: Engine,
    config: DockerConfig,
}

fn err(kind: ErrorKind, message: impl Into<String>) -> ProviderError {
    ProviderError::new(kind, PROVIDER_ID, message)
}

fn io_err(what: &str, source: std::io::Error) -> ProviderError {
    err(ErrorKind::Unknown, format!("cannot {what}")).with_source(source)
}

#[derive(Debug, Deserialize)]
struct Inspect {
    #[serde(rename = "State")]
    state: InspectState,
    #[serde(rename = "Config")]
    config: InspectConfig,
}

#[derive(Debug, Deserialize)]
struct InspectState {
    #[serde(rename = "Status")]
    status: String,
    #[serde(rename = "Paused", default)]
    paused: bool,
    /// The host pid of the container's init (0 when not running).
    #[serde(rename = "Pid", default)]
    pid: u32,
}

#[derive(Debug, Deserialize)]
struct InspectConfig {
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

/// Maps Docker's state to the canonical one; the raw state is kept beside it.
pub fn canonical_state(status: &str, paused: bool) -> CanonicalState {
    match (status, paused) {
        (_, true) | ("paused", _) => CanonicalState::Suspended,
        ("created", _) => CanonicalState::Creating,
        ("running", _) => CanonicalState::Running,
        ("restarting", _) => CanonicalState::Unknown,
        ("removing", _) => CanonicalState::Stopping,
        ("exited", _) => CanonicalState::Stopped,
        ("dead", _) => CanonicalState::Failed,
        _ => CanonicalState::Unknown,
    }
}

fn raw_state(status: &str, paused: bool) -> String {
    if paused && status != "paused" {
        format!("{status}+paused")
    } else {
        status.to_owned()
    }
}

/// Resolves a sandbox path: relative paths are under `/workspace`; `..` is refused.
fn container_path(path: &str) -> Result<PathBuf> {
    if path.contains('\0') {
        return Err(err(
            ErrorKind::InvalidRequest,
            format!("path `{path}` contains a NUL byte"),
        ));
    }
    let raw = Path::new(path);
    // The limits of the container's filesystem, checked here: a name it cannot hold is the
    // caller's mistake, not an engine failure.
    if path.len() > 4096 || raw.components().any(|c| c.as_os_str().len() > 255) {
        return Err(err(
            ErrorKind::InvalidRequest,
            format!(
                "path `{}…` has a name that is too long (at most 255 bytes a name, 4096 in all)",
                path.chars().take(40).collect::<String>()
            ),
        ));
    }
    if raw.components().any(|c| c == Component::ParentDir) {
        return Err(err(
            ErrorKind::InvalidRequest,
            format!("path `{path}` contains `..`; docker sandbox paths are absolute or relative to {WORKSPACE}"),
        ));
    }
    let full = if raw.is_absolute() {
        raw.to_owned()
    } else {
        Path::new(WORKSPACE).join(raw)
    };
    Ok(full
        .components()
        .filter(|c| *c != Component::CurDir)
        .collect())
}

/// An image reference, image id or container name/id made safe for an Engine API URL path.
/// Anything that could change the path (`..`, `.`, empty segments, a leading `/`, bytes
/// outside the reference alphabet) is refused, not escaped: such a name is invalid input.
fn path_name(value: &str) -> Result<String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"._-/:@+".contains(&b);
    let well_formed = !value.is_empty()
        && value.len() <= 512
        && value.bytes().all(allowed)
        && !value.starts_with(['/', '-', '.'])
        && value
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    if !well_formed {
        return Err(err(
            ErrorKind::InvalidRequest,
            format!(
                "`{}` is not an image or container name (letters, digits, `.`, `_`, `-`, `/`, `:`, `@`; no `..` or empty segments)",
                value.escape_debug()
            ),
        ));
    }
    Ok(query_escape(value))
}

fn query_escape(value: &str) -> String {
    let mut out = String::new();
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

impl DockerProvider {
    /// A provider for the engine at `config.socket`. Checks the supervisor binary exists; the
    /// engine itself is first contacted (and its API version negotiated) by the first call.
    pub fn new(config: DockerConfig) -> Result<DockerProvider> {
        if !config.supervisor.is_file() {
            return Err(err(
                ErrorKind::Setup,
                format!(
                    "supervisor binary {} not found",
                    config.supervisor.display()
                ),
            ));
        }
        match dynamic_interpreter(&config.supervisor) {
            Ok(false) => {}
            Ok(true) => {
                return Err(err(
                    ErrorKind::Setup,
                    format!(
                        "supervisor binary {} is dynamically linked: inside a sandbox it would \
                         load the sandbox's own libraries (and its /etc/ld.so.preload); build the \
                         static one with scripts/build-supervisor and point BERTH_SUPERVISOR at it (or unset \
                         it: berth carries a static one)",
                        config.supervisor.display()
                    ),
                ))
            }
            Err(e) => return Err(io_err("read the supervisor binary", e)),
        }
        std::fs::create_dir_all(&config.state_dir)
            .map_err(|e| io_err("create the docker state dir", e))?;
        let engine = Engine::new(&config.socket);
        Ok(DockerProvider { engine, config })
    }

    /// The engine client (for benchmarks that measure the raw API).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// For benchmarks: the socket of `id`'s supervisor, as the host reaches it.
    pub async fn supervisor_socket(&self, id: &NativeId) -> Result<PathBuf> {
        Ok(self.channel(&id.0).await?.0)
    }

    /// For benchmarks: runs `argv` through the supervisor at `socket` the way [`Provider::exec`]
    /// does — the same request, environment and frames — but with none of its checks (no
    /// ping, no peer credentials, no pinned identity): Berth's own mechanism, bare. Fails
    /// unless the command exits 0.
    pub async fn bare_exec(&self, socket: &Path, argv: &[&str]) -> Result<()> {
        let (argv, cwd, env) = prepare(&ExecRequest::argv(argv.iter().copied()))?;
        let request = Request::Exec {
            v: PROTOCOL_VERSION,
            argv,
            cwd,
            env,
            timeout_ms: None,
            grace_ms: self.config.kill_grace.as_millis() as u64,
        };
        match supervise::bare_exec(socket, &request).await {
            Ok(supervise::Outcome::Exit(Exit::Exited { code: 0 })) => Ok(()),
            Ok(other) => Err(err(
                ErrorKind::Unknown,
                format!("bare exec ended {other:?}"),
            )),
            Err(e) => Err(io_err("reach the supervisor", e)),
        }
    }

    fn run_dir(&self, name: &str) -> Result<PathBuf> {
        if name.is_empty()
            || name.starts_with('.')
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(err(
                ErrorKind::InvalidRequest,
                format!("`{name}` is not a valid docker sandbox id"),
            ));
        }
        Ok(self.config.state_dir.join(name))
    }

    /// The supervisor's socket as the host reaches it; `pid` is a process in the container
    /// (its init while starting, the pinned supervisor after).
    fn socket(&self, name: &str, pid: u32) -> Result<PathBuf> {
        let socket = if self.config.private_run {
            PathBuf::from(format!(
                "/proc/{pid}/root{RUN_DIR_IN_CONTAINER}/{SOCKET_NAME}"
            ))
        } else {
            self.run_dir(name)?.join("run").join(SOCKET_NAME)
        };
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(err(
                ErrorKind::InvalidRequest,
                format!(
                    "supervisor socket path {} is longer than a Unix socket allows; use a \
                     shorter BERTH_HOME",
                    socket.display()
                ),
            ));
        }
        Ok(socket)
    }

    async fn inspect(&self, id: &str) -> Result<Option<Inspect>> {
        let path = format!("/containers/{}/json", path_name(id)?);
        let response = self.engine.request(Method::GET, &path, None).await?;
        if response.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = engine::ok(&path, response)?;
        serde_json::from_slice(&response.body)
            .map(Some)
            .map_err(|e| err(ErrorKind::Unknown, "unexpected inspect answer").with_source(e))
    }

    async fn image_present(&self, image: &str) -> Result<()> {
        let path = format!("/images/{}/json", path_name(image)?);
        let response = self.engine.request(Method::GET, &path, None).await?;
        if response.status == StatusCode::NOT_FOUND {
            return Err(err(
                ErrorKind::NotFound,
                format!(
                    "image `{image}` is not present on the engine; berth never pulls or \
                     substitutes images: build it (scripts/build-agent-image.sh) or pull it yourself"
                ),
            ));
        }
        engine::ok(&path, response).map(|_| ())
    }

    /// Waits until the supervisor answers, failing early (with the container's log tail) if
    /// the container stops.
    /// At ready, the supervisor's identity (pid and start time, as the host sees it) is pinned
    /// in the sandbox's host state directory, which the container cannot see: from then on,
    /// only that process is trusted to serve the socket. While the container starts nothing but
    /// init and the supervisor runs in it, so the listener must be a child of the container's
    /// init.
    async fn wait_ready(&self, name: &str) -> Result<()> {
        let started = Instant::now();
        let init = match self.inspect(name).await? {
            Some(info) if info.state.pid > 0 => info.state.pid,
            Some(info) => {
                return Err(err(
                    ErrorKind::Unknown,
                    format!(
                        "container `{name}` has no running init (state {})",
                        info.state.status
                    ),
                ))
            }
            None => {
                return Err(err(
                    ErrorKind::NotFound,
                    format!("container `{name}` vanished during start"),
                ))
            }
        };
        let socket = self.socket(name, init)?;
        let mut checks = 0u32;
        loop {
            if let Ok(peer) = supervise::ping(&socket, &supervise::Expect::ChildOf(init)).await {
                return self.pin(name, &peer);
            }
            checks += 1;
            if checks.is_multiple_of(25) {
                match self.inspect(name).await? {
                    Some(info) if info.state.status == "running" => {}
                    Some(info) => {
                        let logs = self.log_tail(name).await;
                        return Err(err(
                            ErrorKind::Unknown,
                            format!(
                                "container stopped before the supervisor was ready (state {}): {logs}",
                                info.state.status
                            ),
                        ));
                    }
                    None => {
                        return Err(err(
                            ErrorKind::NotFound,
                            format!("container `{name}` vanished during start"),
                        ))
                    }
                }
            }
            if started.elapsed() > self.config.ready_timeout {
                return Err(err(
                    ErrorKind::TimeoutClient,
                    format!(
                        "supervisor in `{name}` did not answer within {:?}",
                        self.config.ready_timeout
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn pin_path(&self, name: &str) -> Result<PathBuf> {
        Ok(self.run_dir(name)?.join("supervisor.peer"))
    }

    fn pin(&self, name: &str, peer: &supervise::Peer) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.pin_path(name)?;
        let temp = path.with_extension("peer.new");
        let _ = std::fs::remove_file(&temp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(|e| io_err("record the supervisor's identity", e))?;
        file.write_all(&serde_json::to_vec(peer).expect("peer serializes"))
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&temp, &path))
            .map_err(|e| io_err("record the supervisor's identity", e))
    }

    /// The socket of the supervisor pinned at the sandbox's last start, and who must serve it.
    async fn channel(&self, name: &str) -> Result<(PathBuf, supervise::Expect)> {
        let path = self.pin_path(name)?;
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) => {
                return Err(match self.inspect(name).await? {
                    None => err(ErrorKind::NotFound, format!("no sandbox `{name}`")),
                    Some(_) => err(
                        ErrorKind::Unavailable,
                        format!(
                            "no recorded supervisor identity for `{name}` (not started with \
                             this state directory?)"
                        ),
                    )
                    .with_source(e),
                })
            }
        };
        let peer: supervise::Peer = serde_json::from_slice(&bytes).map_err(|e| {
            err(ErrorKind::Unknown, "unreadable supervisor identity").with_source(e)
        })?;
        Ok((
            self.socket(name, peer.pid)?,
            supervise::Expect::Pinned(peer),
        ))
    }

    async fn log_tail(&self, name: &str) -> String {
        let path = format!(
            "/containers/{}/logs?stdout=1&stderr=1&tail=20",
            path_name(name).unwrap_or_else(|_| "invalid-name".into())
        );
        match self.engine.request(Method::GET, &path, None).await {
            Ok(response) => String::from_utf8_lossy(&demux_logs(&response.body))
                .trim()
                .to_owned(),
            Err(e) => format!("(logs unavailable: {e})"),
        }
    }

    async fn create_container(
        &self,
        req: &CreateRequest,
        image: &str,
        extra_labels: BTreeMap<String, String>,
    ) -> Result<Created> {
        let name = req.name.0.as_str();
        // Checks the socket path fits (bind mode) before anything is created.
        self.socket(name, 1)?;
        let state = self.run_dir(name)?;
        let run = state.join("run");
        {
            use std::os::unix::fs::DirBuilderExt;
            let mut dirs = std::fs::DirBuilder::new();
            dirs.recursive(true).mode(0o700);
            dirs.create(if self.config.private_run {
                &state
            } else {
                &run
            })
            .map_err(|e| io_err("create the supervisor directory", e))?;
        }
        let mut labels = req.labels.to_map(name);
        labels.extend(req.extra_labels.clone());
        labels.extend(extra_labels);
        let supervisor_bind = format!(
            "{}:{SUPERVISOR_IN_CONTAINER}:ro",
            self.config.supervisor.display()
        );
        let mut host_config = serde_json::json!({
            "Init": true,
            "NetworkMode": match req.network { NetworkMode::None => "none", NetworkMode::Bridge => "bridge", NetworkMode::Host => "host" },
        });
        if self.config.private_run {
            host_config["Binds"] = serde_json::json!([supervisor_bind]);
            host_config["Tmpfs"] = serde_json::json!({
                RUN_DIR_IN_CONTAINER: "rw,nosuid,nodev,noexec,size=64m,mode=0755"
            });
        } else {
            host_config["Binds"] = serde_json::json!([
                supervisor_bind,
                format!("{}:{RUN_DIR_IN_CONTAINER}", run.display()),
            ]);
        }
        if let Some(cpus) = req.resources.cpus {
            host_config["NanoCpus"] = serde_json::json!((cpus * 1e9) as i64);
        }
        let memory = req.resources.memory_mib.unwrap_or(DEFAULT_MEMORY_MIB) * 1024 * 1024;
        host_config["Memory"] = serde_json::json!(memory);
        host_config["MemorySwap"] = serde_json::json!(memory);
        host_config["PidsLimit"] =
            serde_json::json!(req.resources.pids.unwrap_or(DEFAULT_PIDS_LIMIT));
        host_config["SecurityOpt"] = serde_json::json!(["no-new-privileges"]);
        host_config["CapDrop"] = serde_json::json!(["ALL"]);
        host_config["CapAdd"] = serde_json::json!(KEPT_CAPABILITIES);
        let socket_in_container = format!("{RUN_DIR_IN_CONTAINER}/{SOCKET_NAME}");
        let body = serde_json::json!({
            "Image": image,
            "Cmd": [SUPERVISOR_IN_CONTAINER, "serve", "--socket", socket_in_container],
            "Entrypoint": serde_json::Value::Null,
            "WorkingDir": WORKSPACE,
            "Labels": labels,
            "HostConfig": host_config,
        });
        let _created: serde_json::Value = self
            .engine
            .json(
                Method::POST,
                &format!("/containers/create?name={}", query_escape(name)),
                Some(body),
            )
            .await?;
        self.engine
            .expect(
                Method::POST,
                &format!("/containers/{}/start", path_name(name)?),
                None,
                &[StatusCode::NOT_MODIFIED],
            )
            .await?;
        self.wait_ready(name).await?;
        Ok(Created {
            native_id: NativeId(name.to_owned()),
            raw_state: "running".into(),
        })
    }

    async fn run(
        &self,
        id: &NativeId,
        req: &ExecRequest,
        mut on_chunk: impl FnMut(berth_contract::Stream, &[u8]),
    ) -> Result<(ExitStatus, Duration)> {
        let (argv, cwd, env) = prepare(req)?;
        let request = Request::Exec {
            v: PROTOCOL_VERSION,
            argv,
            cwd,
            env,
            timeout_ms: req.timeout.map(|t| t.as_millis() as u64),
            grace_ms: self.config.kill_grace.as_millis() as u64,
        };
        // No separate ping: the supervisor acknowledges the request before running it, within
        // a deadline, and drops it if the caller has gone (a paused container).
        let (socket, expect) = self.channel(&id.0).await?;
        let started = Instant::now();
        let exchange = supervise::exec(&socket, &expect, &request, &mut on_chunk);
        // The supervisor enforces the timeout; this deadline only catches a supervisor that
        // cannot (container paused or frozen mid-exec). Dropping the exchange hangs up, and the
        // supervisor kills the command's group as soon as it runs again.
        let outcome = match req.timeout {
            Some(timeout) => {
                let deadline = timeout + self.config.kill_grace + CLIENT_DEADLINE_MARGIN;
                match tokio::time::timeout(deadline, exchange).await {
                    Ok(result) => result,
                    Err(_) => Ok(supervise::Outcome::Lost(format!(
                        "no exit reported within {deadline:?} (container paused or frozen?)"
                    ))),
                }
            }
            None => exchange.await,
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(connect) => return Err(self.unreachable_supervisor(id, connect).await),
        };
        let took = started.elapsed();
        let status = match outcome {
            supervise::Outcome::Exit(Exit::Exited { code }) => ExitStatus::Exited { code },
            supervise::Outcome::Exit(Exit::Signalled { signal }) => {
                ExitStatus::Signalled { signal }
            }
            supervise::Outcome::Exit(Exit::TimedOut) => ExitStatus::TimedOut,
            supervise::Outcome::Exit(Exit::SpawnFailed { kind, message }) => {
                return Err(spawn_error(&kind, message))
            }
            supervise::Outcome::Exit(Exit::BadRequest { message }) => {
                return Err(err(
                    ErrorKind::InvalidRequest,
                    format!("supervisor refused the request: {message}"),
                ))
            }
            supervise::Outcome::Lost(reason)
            | supervise::Outcome::Exit(Exit::Unknown { reason }) => ExitStatus::Unknown { reason },
            supervise::Outcome::Exit(other) => ExitStatus::Unknown {
                reason: format!("supervisor answered exec with {other:?}"),
            },
        };
        Ok((status, took))
    }

    /// One single-answer request to the supervisor of `id`.
    async fn call(&self, id: &NativeId, request: &Request) -> Result<Exit> {
        let (socket, expect) = self.channel(&id.0).await?;
        match supervise::call(&socket, &expect, request).await {
            Ok(supervise::Outcome::Exit(exit)) => Ok(exit),
            Ok(supervise::Outcome::Lost(reason)) => Err(err(ErrorKind::Unavailable, reason)),
            Err(connect) => Err(self.unreachable_supervisor(id, connect).await),
        }
    }

    /// Explains why the supervisor cannot be reached, from the container's state.
    async fn unreachable_supervisor(
        &self,
        id: &NativeId,
        connect: std::io::Error,
    ) -> ProviderError {
        if connect.kind() == std::io::ErrorKind::PermissionDenied {
            return err(
                ErrorKind::Tampered,
                format!("sandbox `{}`: {connect}; destroy it", id.0),
            );
        }
        match self.inspect(&id.0).await {
            Ok(None) => err(ErrorKind::NotFound, format!("no sandbox `{}`", id.0)),
            Ok(Some(info)) if info.state.paused || info.state.status != "running" => err(
                ErrorKind::Conflict,
                format!(
                    "sandbox `{}` is {}; start or resume it before exec",
                    id.0,
                    raw_state(&info.state.status, info.state.paused)
                ),
            ),
            Ok(Some(_)) => err(
                ErrorKind::Unavailable,
                format!("the supervisor in `{}` does not answer", id.0),
            )
            .with_source(connect),
            Err(e) => e,
        }
    }

    async fn settle(&self, id: &NativeId, want: CanonicalState) -> Result<Transition> {
        match self.inspect(&id.0).await? {
            None => Err(err(ErrorKind::NotFound, format!("no sandbox `{}`", id.0))),
            Some(info) => {
                let state = canonical_state(&info.state.status, info.state.paused);
                Ok(if state == want {
                    Transition::Settled { state }
                } else {
                    Transition::Accepted {
                        raw_state: raw_state(&info.state.status, info.state.paused),
                    }
                })
            }
        }
    }

    async fn commit(&self, id: &NativeId, tag: &str) -> Result<String> {
        #[derive(Deserialize)]
        struct Committed {
            #[serde(rename = "Id")]
            id: String,
        }
        let committed: Committed = self
            .engine
            .json(
                Method::POST,
                &format!(
                    "/commit?container={}&repo=berth-snapshot&tag={}&pause=true",
                    query_escape(&id.0),
                    query_escape(tag)
                ),
                Some(serde_json::json!({})),
            )
            .await?;
        Ok(committed.id)
    }

    async fn archive_get(&self, id: &NativeId, path: &Path) -> Result<Vec<u8>> {
        let uri = format!(
            "/containers/{}/archive?path={}",
            path_name(&id.0)?,
            query_escape(&path.to_string_lossy())
        );
        let response = self.engine.request(Method::GET, &uri, None).await?;
        if response.status == StatusCode::NOT_FOUND {
            return Err(err(
                ErrorKind::NotFound,
                format!("`{}` does not exist in sandbox `{}`", path.display(), id.0),
            ));
        }
        Ok(engine::ok(&uri, response)?.body.to_vec())
    }
}

/// The argv, working directory and complete environment the supervisor runs a request with.
fn prepare(req: &ExecRequest) -> Result<(Vec<String>, String, BTreeMap<String, String>)> {
    let argv = match &req.command {
        Command::Argv(argv) if argv.is_empty() => {
            return Err(err(ErrorKind::InvalidRequest, "empty argv: nothing to run"))
        }
        Command::Argv(argv) => argv.clone(),
        Command::Shell(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
    };
    let cwd = match &req.cwd {
        None => WORKSPACE.to_owned(),
        Some(cwd) => container_path(cwd)?.to_string_lossy().into_owned(),
    };
    let mut env = BTreeMap::from([
        ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
        ("HOME".to_owned(), WORKSPACE.to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
    ]);
    berth_contract::check_env(&req.env).map_err(|m| err(ErrorKind::InvalidRequest, m))?;
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok((argv, cwd, env))
}

fn spawn_error(kind: &str, message: String) -> ProviderError {
    ProviderError::not_started(
        berth_contract::StartFailure::from_wire(kind),
        PROVIDER_ID,
        message,
    )
}

/// Strips the 8-byte multiplexing headers of a non-TTY log stream.
fn demux_logs(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while raw.len() >= 8 {
        let len = u32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]) as usize;
        let end = (8 + len).min(raw.len());
        out.extend_from_slice(&raw[8..end]);
        raw = &raw[end..];
    }
    out
}

#[async_trait]
impl Provider for DockerProvider {
    fn id(&self) -> &str {
        PROVIDER_ID
    }

    async fn create(&self, req: &CreateRequest) -> Result<Created> {
        let image = req.image.as_deref().ok_or_else(|| {
            err(
                ErrorKind::InvalidRequest,
                "a docker sandbox needs an image (e.g. --image berth/agent:bookworm); berth never \
                 picks one for you",
            )
        })?;
        self.image_present(image).await?;
        self.create_container(req, image, BTreeMap::new()).await
    }

    async fn observe(&self, id: &NativeId) -> Result<Observation> {
        Ok(match self.inspect(&id.0).await? {
            None => Observation::Absent,
            Some(info) => {
                let mut state = canonical_state(&info.state.status, info.state.paused);
                let mut raw = raw_state(&info.state.status, info.state.paused);
                // Running but never pinned: a create or start was interrupted before the
                // supervisor answered. It is not ready (and will not be trusted later).
                if state == CanonicalState::Running && !self.pin_path(&id.0)?.is_file() {
                    state = CanonicalState::Creating;
                    raw = format!("{raw} (supervisor not pinned yet)");
                }
                Observation::Present {
                    state,
                    raw,
                    soft_deleted: false,
                    labels: info.config.labels.unwrap_or_default(),
                }
            }
        })
    }

    async fn exec(&self, id: &NativeId, req: &ExecRequest) -> Result<ExecOutput> {
        let cap = req.max_output_bytes;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let (mut stdout_total, mut stderr_total) = (0u64, 0u64);
        let (status, duration) = self
            .run(id, req, |stream, bytes| {
                let (kept, total) = match stream {
                    berth_contract::Stream::Stdout => (&mut stdout, &mut stdout_total),
                    berth_contract::Stream::Stderr => (&mut stderr, &mut stderr_total),
                };
                *total += bytes.len() as u64;
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
            })
            .await?;
        Ok(ExecOutput {
            status,
            stdout,
            stderr: Some(stderr),
            stdout_total,
            stderr_total: Some(stderr_total),
            duration,
        })
    }

    async fn destroy(&self, id: &NativeId) -> Result<DestroyOutcome> {
        let labels = match self.inspect(&id.0).await? {
            None => {
                self.remove_fork_image(&id.0).await?;
                let _ = std::fs::remove_dir_all(self.run_dir(&id.0)?);
                return Ok(DestroyOutcome::VerifiedGone {
                    already_absent: true,
                });
            }
            Some(info) => info.config.labels.unwrap_or_default(),
        };
        let removed = self
            .engine
            .expect(
                Method::DELETE,
                &format!("/containers/{}?force=true&v=true", path_name(&id.0)?),
                None,
                &[StatusCode::NOT_FOUND],
            )
            .await;
        match removed {
            Ok(_) => {}
            // "Removal already in progress": a caller that died mid-destroy left the engine
            // removing it. Wait (bounded) for that removal to finish rather than fail.
            Err(e) if e.kind() == ErrorKind::Conflict => {
                let until = Instant::now() + Duration::from_secs(15);
                while Instant::now() < until && self.inspect(&id.0).await?.is_some() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(e) => return Err(e),
        }
        if let Some(image) = labels.get(FORK_IMAGE_LABEL) {
            // The fork's private image; another container may still use it (then 409: kept).
            let _ = self
                .engine
                .request(
                    Method::DELETE,
                    &format!("/images/{}", path_name(image)?),
                    None,
                )
                .await;
        }
        self.remove_fork_image(&id.0).await?;
        let _ = std::fs::remove_dir_all(self.run_dir(&id.0)?);
        match self.inspect(&id.0).await? {
            None => Ok(DestroyOutcome::VerifiedGone {
                already_absent: false,
            }),
            Some(info) => Ok(DestroyOutcome::Accepted {
                raw_state: raw_state(&info.state.status, info.state.paused),
            }),
        }
    }

    fn streaming(&self) -> Option<&dyn StreamingExec> {
        Some(self)
    }
    fn detached(&self) -> Option<&dyn DetachedExec> {
        Some(self)
    }
    fn files(&self) -> Option<&dyn Files> {
        Some(self)
    }
    fn stop_start(&self) -> Option<&dyn StopStart> {
        Some(self)
    }
    fn suspend_resume(&self) -> Option<&dyn SuspendResume> {
        Some(self)
    }
    fn snapshots(&self) -> Option<&dyn Snapshots> {
        Some(self)
    }
    fn fork(&self) -> Option<&dyn Fork> {
        Some(self)
    }
    fn listing(&self) -> Option<&dyn Listing> {
        Some(self)
    }
}

#[async_trait]
impl StreamingExec for DockerProvider {
    async fn exec_streaming(
        &self,
        id: &NativeId,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<ExecSummary> {
        let (mut stdout_total, mut stderr_total) = (0u64, 0u64);
        let (status, duration) = self
            .run(id, req, |stream, bytes| {
                match stream {
                    berth_contract::Stream::Stdout => stdout_total += bytes.len() as u64,
                    berth_contract::Stream::Stderr => stderr_total += bytes.len() as u64,
                }
                sink.chunk(stream, bytes);
            })
            .await?;
        Ok(ExecSummary {
            status,
            stdout_total,
            stderr_total: Some(stderr_total),
            duration,
        })
    }
}

/// Where detached processes' output files go, inside the container's own filesystem (readable
/// with the files API; the engine's archive API does not see tmpfs mounts).
pub const PROCESS_LOGS: &str = "/var/tmp/berth-procs";

#[async_trait]
impl DetachedExec for DockerProvider {
    async fn spawn(&self, id: &NativeId, req: &ExecRequest) -> Result<ProcessHandle> {
        if req.timeout.is_some() {
            return Err(err(
                ErrorKind::InvalidRequest,
                "a detached process takes no timeout; kill it when it is done",
            ));
        }
        let (argv, cwd, env) = prepare(req)?;
        let request = Request::Spawn {
            v: PROTOCOL_VERSION,
            argv,
            cwd,
            env,
            log_dir: PROCESS_LOGS.into(),
        };
        match self.call(id, &request).await? {
            Exit::Started { process } => Ok(ProcessHandle(process)),
            Exit::SpawnFailed { kind, message } => Err(spawn_error(&kind, message)),
            other => Err(err(
                ErrorKind::Unknown,
                format!("supervisor answered spawn with {other:?}"),
            )),
        }
    }

    async fn status(&self, id: &NativeId, process: &ProcessHandle) -> Result<ProcessStatus> {
        let request = Request::Status {
            v: PROTOCOL_VERSION,
            process: process.0.clone(),
        };
        match self.call(id, &request).await? {
            Exit::Running => Ok(ProcessStatus::Running),
            Exit::Exited { code } => Ok(ProcessStatus::Finished {
                status: ExitStatus::Exited { code },
            }),
            Exit::Signalled { signal } => Ok(ProcessStatus::Finished {
                status: ExitStatus::Signalled { signal },
            }),
            Exit::UnknownProcess { process } => Err(unknown_process(id, &process)),
            other => Ok(ProcessStatus::Finished {
                status: ExitStatus::Unknown {
                    reason: format!("supervisor reported {other:?}"),
                },
            }),
        }
    }

    async fn kill(&self, id: &NativeId, process: &ProcessHandle) -> Result<()> {
        let request = Request::Kill {
            v: PROTOCOL_VERSION,
            process: process.0.clone(),
            signal: 9,
        };
        match self.call(id, &request).await? {
            Exit::Exited { code: 0 } => Ok(()),
            Exit::UnknownProcess { process } => Err(unknown_process(id, &process)),
            other => Err(err(
                ErrorKind::Unknown,
                format!("supervisor answered kill with {other:?}"),
            )),
        }
    }

    async fn list(&self, id: &NativeId) -> Result<Vec<ProcessHandle>> {
        let entries = match Files::list(self, id, PROCESS_LOGS).await {
            Ok(entries) => entries,
            // Nothing was ever spawned here.
            Err(e) if e.kind() == ErrorKind::NotFound && self.inspect(&id.0).await?.is_some() => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e),
        };
        Ok(entries
            .into_iter()
            .filter(|e| e.kind == FileKind::File)
            .filter_map(|e| e.name.strip_suffix(".out").map(str::to_owned))
            .filter(|h| process_handle_ok(h))
            .map(ProcessHandle)
            .collect())
    }

    async fn output(&self, id: &NativeId, process: &ProcessHandle) -> Result<(Vec<u8>, Vec<u8>)> {
        if !process_handle_ok(&process.0) {
            return Err(err(
                ErrorKind::InvalidRequest,
                format!("`{}` is not a process handle", process.0.escape_debug()),
            ));
        }
        let read = |stream: &'static str| async move {
            let path = format!("{PROCESS_LOGS}/{}.{stream}", process.0);
            match Files::read(self, id, &path).await {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            }
        };
        let Some(stdout) = read("out").await? else {
            return Err(unknown_process(id, &process.0));
        };
        let stderr = read("err").await?.unwrap_or_default();
        Ok((stdout, stderr))
    }
}

/// Handles are the supervisor's own (`p1`, `p2`, …); anything else never reaches a path.
fn process_handle_ok(handle: &str) -> bool {
    !handle.is_empty()
        && handle.len() <= 32
        && handle
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn unknown_process(id: &NativeId, process: &str) -> ProviderError {
    err(
        ErrorKind::NotFound,
        format!(
            "no process `{process}` in sandbox `{}` (handles do not survive a stop/start)",
            id.0
        ),
    )
}

#[async_trait]
impl Files for DockerProvider {
    async fn read(&self, id: &NativeId, path: &str) -> Result<Vec<u8>> {
        let mut full = container_path(path)?;
        // Follow a final symlink a few times, inside the container's filesystem.
        for _ in 0..8 {
            let tar = self.archive_get(id, &full).await?;
            let mut archive = tar::Archive::new(&tar[..]);
            let mut entries = archive
                .entries()
                .map_err(|e| io_err("read the archive", e))?;
            let mut entry = match entries.next() {
                Some(entry) => entry.map_err(|e| io_err("read the archive", e))?,
                None => {
                    return Err(err(
                        ErrorKind::Unknown,
                        format!("empty archive for `{path}`"),
                    ))
                }
            };
            match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let mut bytes = Vec::new();
                    entry
                        .read_to_end(&mut bytes)
                        .map_err(|e| io_err("read the archive", e))?;
                    return Ok(bytes);
                }
                tar::EntryType::Directory => {
                    return Err(err(
                        ErrorKind::InvalidRequest,
                        format!("`{path}` is a directory, not a file"),
                    ))
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(|e| io_err("read the archive", e))?
                        .ok_or_else(|| err(ErrorKind::Unknown, "symlink without target"))?
                        .into_owned();
                    full = full.parent().unwrap_or(Path::new("/")).join(target);
                    if full.components().any(|c| c == Component::ParentDir) {
                        // Let the engine resolve `..` inside the container's root.
                        full = full.components().collect();
                    }
                }
                other => {
                    return Err(err(
                        ErrorKind::InvalidRequest,
                        format!("`{path}` is not a regular file ({other:?})"),
                    ))
                }
            }
        }
        Err(err(
            ErrorKind::InvalidRequest,
            format!("`{path}`: too many levels of symlinks"),
        ))
    }

    async fn write(&self, id: &NativeId, path: &str, bytes: &[u8]) -> Result<()> {
        let full = container_path(path)?;
        let (Some(parent), Some(name)) = (full.parent(), full.file_name()) else {
            return Err(err(
                ErrorKind::InvalidRequest,
                format!("`{path}` names no file"),
            ));
        };
        // Parents first, through the supervisor, so the archive never rewrites an existing
        // directory's mode.
        let mkdir = ExecRequest::argv(["mkdir", "-p", "--", &parent.to_string_lossy()]);
        let made = self.exec(id, &mkdir).await?;
        if !made.status.success() {
            return Err(err(
                ErrorKind::InvalidRequest,
                format!(
                    "cannot create `{}`: {}",
                    parent.display(),
                    String::from_utf8_lossy(made.stderr.as_deref().unwrap_or_default()).trim()
                ),
            ));
        }
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        );
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, name, bytes)
            .map_err(|e| io_err("build the archive", e))?;
        let tar = builder
            .into_inner()
            .map_err(|e| io_err("build the archive", e))?;
        self.engine
            .expect(
                Method::PUT,
                &format!(
                    "/containers/{}/archive?path={}",
                    path_name(&id.0)?,
                    query_escape(&parent.to_string_lossy())
                ),
                Some(("application/x-tar", tar)),
                &[],
            )
            .await?;
        Ok(())
    }

    async fn list(&self, id: &NativeId, path: &str) -> Result<Vec<FileEntry>> {
        let full = container_path(path)?;
        let tar = self.archive_get(id, &full).await?;
        let mut archive = tar::Archive::new(&tar[..]);
        let mut entries = Vec::new();
        for entry in archive
            .entries()
            .map_err(|e| io_err("read the archive", e))?
        {
            let entry = entry.map_err(|e| io_err("read the archive", e))?;
            let entry_path = entry
                .path()
                .map_err(|e| io_err("read the archive", e))?
                .into_owned();
            // Entries are `<dir name>/<child>…`; keep direct children only.
            let parts: Vec<_> = entry_path.components().collect();
            if parts.len() != 2 {
                if parts.len() == 1 && entry.header().entry_type() != tar::EntryType::Directory {
                    return Err(err(
                        ErrorKind::InvalidRequest,
                        format!("`{path}` is not a directory"),
                    ));
                }
                continue;
            }
            let kind = match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => FileKind::File,
                tar::EntryType::Directory => FileKind::Dir,
                tar::EntryType::Symlink => FileKind::Symlink,
                _ => FileKind::Other,
            };
            entries.push(FileEntry {
                name: parts[1].as_os_str().to_string_lossy().into_owned(),
                kind,
                size: if kind == FileKind::File {
                    entry.header().size().unwrap_or(0)
                } else {
                    0
                },
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }
}

#[async_trait]
impl StopStart for DockerProvider {
    async fn stop(&self, id: &NativeId) -> Result<Transition> {
        self.engine
            .expect(
                Method::POST,
                &format!(
                    "/containers/{}/stop?t={}",
                    path_name(&id.0)?,
                    self.config.stop_timeout_secs
                ),
                None,
                &[StatusCode::NOT_MODIFIED],
            )
            .await?;
        self.settle(id, CanonicalState::Stopped).await
    }

    async fn start(&self, id: &NativeId) -> Result<Transition> {
        // The supervisor starts anew; until it answers, nothing is trusted.
        let _ = std::fs::remove_file(self.pin_path(&id.0)?);
        self.engine
            .expect(
                Method::POST,
                &format!("/containers/{}/start", path_name(&id.0)?),
                None,
                &[StatusCode::NOT_MODIFIED],
            )
            .await?;
        self.wait_ready(&id.0).await?;
        self.settle(id, CanonicalState::Running).await
    }
}

#[async_trait]
impl SuspendResume for DockerProvider {
    async fn suspend(&self, id: &NativeId) -> Result<Transition> {
        self.engine
            .expect(
                Method::POST,
                &format!("/containers/{}/pause", path_name(&id.0)?),
                None,
                &[],
            )
            .await?;
        self.settle(id, CanonicalState::Suspended).await
    }

    async fn resume(&self, id: &NativeId) -> Result<Transition> {
        self.engine
            .expect(
                Method::POST,
                &format!("/containers/{}/unpause", path_name(&id.0)?),
                None,
                &[],
            )
            .await?;
        self.settle(id, CanonicalState::Running).await
    }
}

/// The tag (in the `berth-snapshot` repository) of the image a fork named `fork` starts from.
fn fork_image_tag(fork: &str) -> String {
    format!("fork-{fork}")
}

impl DockerProvider {
    /// Removes the fork image named after `fork`, if there is one (404: none; 409: a
    /// container still uses it, and it stays).
    async fn remove_fork_image(&self, fork: &str) -> Result<()> {
        let reference = format!("berth-snapshot:{}", fork_image_tag(fork));
        self.engine
            .expect(
                Method::DELETE,
                &format!("/images/{}", path_name(&reference)?),
                None,
                &[StatusCode::NOT_FOUND, StatusCode::CONFLICT],
            )
            .await
            .map(|_| ())
    }
}

fn snapshot_tag(id: &NativeId) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{}-{millis}", id.0)
}

impl DockerProvider {
    /// The image a tag in the `berth-snapshot` repository names now, if any.
    async fn tagged_image(&self, tag: &str) -> Result<Option<String>> {
        #[derive(Deserialize)]
        struct ImageId {
            #[serde(rename = "Id")]
            id: String,
        }
        let reference = format!("berth-snapshot:{tag}");
        let path = format!("/images/{}/json", path_name(&reference)?);
        let response = self.engine.request(Method::GET, &path, None).await?;
        if response.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = engine::ok(&path, response)?;
        let found: ImageId = serde_json::from_slice(&response.body)
            .map_err(|e| err(ErrorKind::Unknown, "unexpected image answer").with_source(e))?;
        Ok(Some(found.id))
    }

    async fn snapshot_ref(&self, image: String) -> Result<SnapshotRef> {
        #[derive(Deserialize)]
        struct ImageInfo {
            #[serde(rename = "Size")]
            size: Option<u64>,
        }
        let size = self
            .engine
            .json::<ImageInfo>(
                Method::GET,
                &format!("/images/{}/json", path_name(&image)?),
                None,
            )
            .await
            .ok()
            .and_then(|i| i.size);
        Ok(SnapshotRef {
            handle: image,
            kind: SnapshotHandleKind::Digest,
            size_bytes: size,
        })
    }
}

#[async_trait]
impl Snapshots for DockerProvider {
    async fn snapshot_keyed(&self, id: &NativeId, key: &str) -> Result<SnapshotRef> {
        berth_contract::check_snapshot_key(key).map_err(|m| err(ErrorKind::InvalidRequest, m))?;
        let tag = format!("key-{key}");
        // The image the key named before (an interrupted earlier call): replaced, then removed.
        let earlier = self.tagged_image(&tag).await?;
        let image = self.commit(id, &tag).await?;
        if let Some(earlier) = earlier.filter(|e| *e != image) {
            let _ = self
                .engine
                .request(
                    Method::DELETE,
                    &format!("/images/{}", path_name(&earlier)?),
                    None,
                )
                .await;
        }
        self.snapshot_ref(image).await
    }

    async fn delete_keyed(&self, key: &str) -> Result<()> {
        berth_contract::check_snapshot_key(key).map_err(|m| err(ErrorKind::InvalidRequest, m))?;
        let Some(image) = self.tagged_image(&format!("key-{key}")).await? else {
            return Ok(());
        };
        // By id, so the image goes, not just the tag (409: a container still uses it).
        self.engine
            .expect(
                Method::DELETE,
                &format!("/images/{}", path_name(&image)?),
                None,
                &[StatusCode::NOT_FOUND],
            )
            .await
            .map(|_| ())
    }

    async fn snapshot(&self, id: &NativeId) -> Result<SnapshotRef> {
        let image = self.commit(id, &snapshot_tag(id)).await?;
        self.snapshot_ref(image).await
    }

    async fn restore(&self, snapshot: &SnapshotRef, req: &CreateRequest) -> Result<Created> {
        self.image_present(&snapshot.handle).await?;
        self.create_container(req, &snapshot.handle, BTreeMap::new())
            .await
    }

    async fn delete_snapshot(&self, snapshot: &SnapshotRef) -> Result<()> {
        self.engine
            .expect(
                Method::DELETE,
                &format!("/images/{}", path_name(&snapshot.handle)?),
                None,
                &[StatusCode::NOT_FOUND],
            )
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl Fork for DockerProvider {
    async fn fork(&self, id: &NativeId, req: &CreateRequest) -> Result<Created> {
        // The fork's image is named after the fork, so the fork's own ledger row (recorded
        // before this call) covers it: destroying the fork by name removes the image even when
        // a crash came between the commit and the container. A leftover from such a crash is
        // removed first, so a retried fork never strands an untagged image.
        let tag = fork_image_tag(&req.name.0);
        self.remove_fork_image(&req.name.0).await?;
        let image = self.commit(id, &tag).await?;
        let labels = BTreeMap::from([(FORK_IMAGE_LABEL.to_owned(), image.clone())]);
        match self.create_container(req, &image, labels).await {
            Ok(created) => Ok(created),
            Err(e) => {
                let _ = self
                    .engine
                    .request(
                        Method::DELETE,
                        &format!("/images/{}", path_name(&image)?),
                        None,
                    )
                    .await;
                Err(e)
            }
        }
    }
}

#[async_trait]
impl Listing for DockerProvider {
    async fn list(&self, filter: &LabelFilter) -> Result<Vec<Listed>> {
        let mut labels = vec![berth_contract::labels::OWNER.to_owned()];
        if let Some(owner) = &filter.owner {
            labels[0] = format!("{}={owner}", berth_contract::labels::OWNER);
        }
        if let Some(run) = &filter.run_id {
            labels.push(format!("{}={run}", berth_contract::labels::RUN));
        }
        let filters = serde_json::json!({ "label": labels }).to_string();
        #[derive(Deserialize)]
        struct Summary {
            #[serde(rename = "Names", default)]
            names: Vec<String>,
            #[serde(rename = "State", default)]
            state: String,
            #[serde(rename = "Labels", default)]
            labels: Option<BTreeMap<String, String>>,
        }
        let containers: Vec<Summary> = self
            .engine
            .json(
                Method::GET,
                &format!(
                    "/containers/json?all=true&filters={}",
                    query_escape(&filters)
                ),
                None,
            )
            .await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let name = c.names.first()?.trim_start_matches('/').to_owned();
                let labels = c.labels.unwrap_or_default();
                filter.matches(&labels).then(|| Listed {
                    native_id: NativeId(name),
                    observation: Observation::Present {
                        state: canonical_state(&c.state, false),
                        raw: c.state.clone(),
                        soft_deleted: false,
                        labels,
                    },
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_map_with_paused_first() {
        assert_eq!(canonical_state("running", false), CanonicalState::Running);
        assert_eq!(canonical_state("running", true), CanonicalState::Suspended);
        assert_eq!(canonical_state("paused", false), CanonicalState::Suspended);
        assert_eq!(canonical_state("exited", false), CanonicalState::Stopped);
        assert_eq!(canonical_state("created", false), CanonicalState::Creating);
        assert_eq!(canonical_state("dead", false), CanonicalState::Failed);
        assert_eq!(canonical_state("removing", false), CanonicalState::Stopping);
        assert_eq!(
            canonical_state("zombie-ish", false),
            CanonicalState::Unknown
        );
        assert_eq!(raw_state("running", true), "running+paused");
    }

    #[test]
    fn container_paths_stay_rooted_and_refuse_dot_dot() {
        assert_eq!(
            container_path("a/b").unwrap(),
            PathBuf::from("/workspace/a/b")
        );
        assert_eq!(
            container_path("./a").unwrap(),
            PathBuf::from("/workspace/a")
        );
        assert_eq!(
            container_path("/etc/hosts").unwrap(),
            PathBuf::from("/etc/hosts")
        );
        let long = "n".repeat(300);
        for bad in [
            "../x",
            "a/../../b",
            "/workspace/../etc/shadow",
            "a\0b",
            long.as_str(),
        ] {
            assert_eq!(
                container_path(bad).unwrap_err().kind(),
                ErrorKind::InvalidRequest,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn dynamically_linked_supervisors_are_told_apart() {
        // /bin/sh is dynamically linked on every machine this builds on.
        assert!(super::dynamic_interpreter(Path::new("/bin/sh")).unwrap());
        let not_elf = std::env::temp_dir().join(format!("berth-not-elf-{}", std::process::id()));
        std::fs::write(&not_elf, [0u8; 80]).unwrap();
        assert!(super::dynamic_interpreter(&not_elf).is_err());
        std::fs::remove_file(&not_elf).unwrap();
        if let Some(path) = std::env::var_os("BERTH_SUPERVISOR") {
            assert!(
                !super::dynamic_interpreter(Path::new(&path)).unwrap(),
                "scripts/build-supervisor builds it static"
            );
        }
    }

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(query_escape("/work space/a&b"), "/work%20space/a%26b");
        for bad in [
            "../../x", "a/../b", "/abs", "a//b", ".", "x?y", "a b", "", "-rm",
        ] {
            let refused = path_name(bad).unwrap_err();
            assert_eq!(refused.kind(), ErrorKind::InvalidRequest, "{bad}");
        }
        for good in [
            "berth/agent:bookworm",
            "sha256:0cf72f01",
            "bx-1a2b",
            "r.io/a/b@sha256:ab",
        ] {
            assert!(path_name(good).is_ok(), "{good}");
        }
        assert_eq!(
            query_escape("{\"label\":[\"a=b\"]}"),
            "%7B%22label%22%3A%5B%22a%3Db%22%5D%7D"
        );
    }

    #[test]
    fn log_frames_are_demultiplexed() {
        let mut raw = vec![1, 0, 0, 0, 0, 0, 0, 3];
        raw.extend_from_slice(b"abc");
        raw.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 2]);
        raw.extend_from_slice(b"de");
        assert_eq!(demux_logs(&raw), b"abcde");
    }
}
