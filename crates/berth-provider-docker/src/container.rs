//! Creating, readying, observing and removing the container, and exec through its supervisor.

use super::*;

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

    pub(crate) fn run_dir(&self, name: &str) -> Result<PathBuf> {
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
    pub(crate) fn socket(&self, name: &str, pid: u32) -> Result<PathBuf> {
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

    pub(crate) async fn inspect(&self, id: &str) -> Result<Option<Inspect>> {
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

    pub(crate) async fn image_present(&self, image: &str) -> Result<()> {
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
    pub(crate) async fn wait_ready(&self, name: &str) -> Result<()> {
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

    pub(crate) fn pin_path(&self, name: &str) -> Result<PathBuf> {
        Ok(self.run_dir(name)?.join("supervisor.peer"))
    }

    pub(crate) fn pin(&self, name: &str, peer: &supervise::Peer) -> Result<()> {
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
    pub(crate) async fn channel(&self, name: &str) -> Result<(PathBuf, supervise::Expect)> {
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

    pub(crate) async fn log_tail(&self, name: &str) -> String {
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

    pub(crate) async fn create_container(
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

    pub(crate) async fn run(
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
    pub(crate) async fn call(&self, id: &NativeId, request: &Request) -> Result<Exit> {
        let (socket, expect) = self.channel(&id.0).await?;
        match supervise::call(&socket, &expect, request).await {
            Ok(supervise::Outcome::Exit(exit)) => Ok(exit),
            Ok(supervise::Outcome::Lost(reason)) => Err(err(ErrorKind::Unavailable, reason)),
            Err(connect) => Err(self.unreachable_supervisor(id, connect).await),
        }
    }

    /// Explains why the supervisor cannot be reached, from the container's state.
    pub(crate) async fn unreachable_supervisor(
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

    pub(crate) async fn settle(&self, id: &NativeId, want: CanonicalState) -> Result<Transition> {
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
}

/// The argv, working directory and complete environment the supervisor runs a request with.
pub(crate) fn prepare(
    req: &ExecRequest,
) -> Result<(Vec<String>, String, BTreeMap<String, String>)> {
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
    berth_contract::check_command(&req.command)
        .and_then(|()| berth_contract::check_env(&req.env))
        .map_err(|m| err(ErrorKind::InvalidRequest, m))?;
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok((argv, cwd, env))
}

pub(crate) fn spawn_error(kind: &str, message: String) -> ProviderError {
    ProviderError::not_started(
        berth_contract::StartFailure::from_wire(kind),
        PROVIDER_ID,
        message,
    )
}

/// Strips the 8-byte multiplexing headers of a non-TTY log stream.
pub(crate) fn demux_logs(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while raw.len() >= 8 {
        let len = u32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]) as usize;
        let end = (8 + len).min(raw.len());
        out.extend_from_slice(&raw[8..end]);
        raw = &raw[end..];
    }
    out
}
