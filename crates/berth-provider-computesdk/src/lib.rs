//! Berth's bridge to ComputeSDK providers (`computesdk:<vendor>`).
//!
//! ComputeSDK (MIT, TypeScript) wraps some fifty sandbox vendors behind one create / get /
//! list / destroy / runCommand / filesystem surface. This adapter drives it through a pinned
//! Node sidecar (`bridge/computesdk`, [`sidecar`]) and keeps Berth's semantics above it — the
//! decision and its evidence are in `docs/decisions/computesdk.md`:
//!
//! - **The core only**: create, observe, buffered exec, destroy. Everything ComputeSDK emulates
//!   (streaming through a daemon it injects, background commands via `nohup … &`, string-only
//!   files with paths spliced into shell lines) is not implemented, so every optional
//!   capability answers `Unsupported`.
//! - **No fabricated exit codes**: ComputeSDK's adapters report their own failures as exit code
//!   127; a 127 is therefore `Unknown` with the reason, never a made-up "command not found".
//! - **Destroy is verified** through the provider's own `getById`, and only where that call
//!   tells "not found" apart from a failure ([`Vendor::absence_is_authoritative`]); elsewhere
//!   destroy is `Accepted` and absence stays unproven.
//! - **Deadlines are enforced, or not claimed**: a vendor that runs inside the sidecar
//!   (`just-bash`) is stopped by killing the sidecar, which ends every sandbox it holds; a
//!   remote vendor's late answer is `Unknown`.
//! - **Labels only where they are proof**: ComputeSDK reports no metadata back, so a sandbox
//!   shows Berth's labels only when this bridge process created it (the sidecar's own record);
//!   one it did not make shows none, and the ledger will not touch it.
//! - **Errors are classified here** from the status and message the sidecar reports (auth,
//!   quota, rate limit, capacity, unavailable), and masked of the credentials' values.

mod classify;
mod command;
pub mod sidecar;
mod vendors;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine as _;
use berth_contract::{
    CanonicalState, CreateRequest, Created, DestroyOutcome, ErrorKind, ExecOutput, ExecRequest,
    ExitStatus, NativeId, NetworkMode, Observation, Provider, ProviderError, Result,
};
use serde_json::{json, Value};

pub use classify::classify;
pub use command::command_line;
use command::with_cwd;
use sidecar::{Failure, Launch, Sidecar};
pub use vendors::{vendor, Vendor, VENDORS};

/// How long a create, get, list or destroy may take before Berth gives up on it.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(180);

/// How to reach the sidecar.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    /// The `node` program.
    pub node: PathBuf,
    /// The bridge directory (`sidecar.mjs`, `node_modules`).
    pub dir: PathBuf,
    /// The sidecar's whole environment: PATH and the manifest's variables that are set.
    pub env: Vec<(String, String)>,
    /// Values to mask in anything the sidecar says (the secret credentials).
    pub secrets: Vec<String>,
}

/// The bridge directory of the source tree this build came from.
pub fn default_bridge_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bridge/computesdk"
    ))
}

/// A ComputeSDK provider behind the bridge.
pub struct ComputeSdk {
    id: String,
    vendor: Vendor,
    launch: Launch,
    secrets: Vec<String>,
    sidecar: tokio::sync::Mutex<Option<Arc<Sidecar>>>,
}

impl std::fmt::Debug for ComputeSdk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputeSdk")
            .field("id", &self.id)
            .field("launch", &self.launch)
            .finish()
    }
}

/// The bridged provider `provider_id` (`computesdk:<vendor>`). Starts nothing until first use.
pub fn new(provider_id: &str, config: BridgeConfig) -> Result<ComputeSdk> {
    let vendor = vendor(provider_id).ok_or_else(|| {
        ProviderError::new(
            ErrorKind::Setup,
            provider_id,
            format!(
                "not a ComputeSDK provider this build bridges (known: {})",
                VENDORS.map(|v| format!("computesdk:{}", v.name)).join(", ")
            ),
        )
    })?;
    Ok(ComputeSdk {
        id: provider_id.to_owned(),
        vendor,
        launch: Launch {
            node: config.node,
            dir: config.dir,
            vendor: vendor.name.to_owned(),
            env: config.env,
        },
        secrets: config
            .secrets
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect(),
        sidecar: tokio::sync::Mutex::new(None),
    })
}

/// Masks known secret values and token shapes in text the sidecar produced.
pub(crate) fn mask(text: &str, secrets: &[String]) -> String {
    let redactor = berth_redact::Redactor::new(secrets.iter().cloned());
    let mut bytes = text.as_bytes().to_vec();
    redactor.redact(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

impl ComputeSdk {
    /// The running sidecar, started on first use (and again after it died).
    async fn sidecar(&self) -> Result<Arc<Sidecar>> {
        let mut slot = self.sidecar.lock().await;
        if let Some(sidecar) = slot.as_ref().filter(|s| s.alive()) {
            return Ok(sidecar.clone());
        }
        let started = Sidecar::start(&self.launch, &self.secrets)
            .await
            .map_err(|f| self.error("starting the bridge", f))?;
        let started = Arc::new(started);
        *slot = Some(started.clone());
        Ok(started)
    }

    /// Kills the sidecar (the only way to stop a command an in-process vendor runs).
    async fn restart_sidecar(&self) {
        if let Some(sidecar) = self.sidecar.lock().await.take() {
            sidecar.kill();
        }
    }

    /// The process id of the running sidecar, if any (for tests and diagnostics).
    pub async fn sidecar_pid(&self) -> Option<u32> {
        self.sidecar.lock().await.as_ref().and_then(|s| s.pid())
    }

    /// The package versions the sidecar reported (`computesdk`, the vendor package), starting
    /// it if needed.
    pub async fn packages(&self) -> Result<Vec<(String, String)>> {
        Ok(self.sidecar().await?.packages.clone())
    }

    /// A control call (create, get, list, destroy), bounded by [`CONTROL_TIMEOUT`]: a vendor
    /// that never answers is a client timeout, not a hang.
    async fn call(&self, op: &str, args: Value) -> Result<Value> {
        let sidecar = self.sidecar().await?;
        match tokio::time::timeout(CONTROL_TIMEOUT, sidecar.call(op, args)).await {
            Ok(reply) => reply.map_err(|f| self.error(op, f)),
            Err(_) => Err(ProviderError::new(
                ErrorKind::TimeoutClient,
                &self.id,
                format!("{op}: no answer from ComputeSDK within {CONTROL_TIMEOUT:?}"),
            )),
        }
    }

    fn error(&self, op: &str, failure: Failure) -> ProviderError {
        match failure {
            Failure::Setup(message) => ProviderError::new(
                ErrorKind::Setup,
                &self.id,
                mask(&format!("{op}: {message}"), &self.secrets),
            ),
            Failure::Lost(message) => ProviderError::new(
                ErrorKind::Unavailable,
                &self.id,
                mask(&format!("{op}: {message}"), &self.secrets),
            ),
            Failure::Vendor(error) => {
                let kind = classify(&error);
                let message = mask(&error.message, &self.secrets);
                ProviderError::new(kind, &self.id, format!("{op}: {message}"))
            }
        }
    }

    /// Whether ComputeSDK finds the sandbox: `Some(false)` only when absence is proven.
    async fn found(&self, id: &NativeId) -> Result<Option<bool>> {
        Ok(self.look_up(id).await?.map(|(found, _)| found))
    }

    /// [`Self::found`], with the labels of a sandbox this bridge process created (ComputeSDK
    /// reports no metadata back; the sidecar's record of what it was asked to create is the
    /// only proof of ownership, and it exists only for sandboxes it made).
    async fn look_up(&self, id: &NativeId) -> Result<Option<(bool, BTreeMap<String, String>)>> {
        let reply = self.call("get", json!({"sandbox_id": id.0})).await?;
        let found = reply["found"].as_bool().unwrap_or(false);
        let labels = reply["created_here_with_labels"]
            .as_object()
            .map(|map| {
                map.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(if found {
            Some((true, labels))
        } else if self.vendor.absence_is_authoritative {
            Some((false, labels))
        } else {
            None
        })
    }

    fn unproven_absence(&self) -> String {
        format!(
            "ComputeSDK's {} adapter returns null from getById for any failure, so \"not found\" \
             is not proof of absence",
            self.vendor.name
        )
    }

    fn exit_status(&self, code: Option<i64>, stderr: &[u8]) -> ExitStatus {
        match code {
            Some(127) => ExitStatus::Unknown {
                reason: format!(
                    "exit code 127, which ComputeSDK's {} adapter also reports for its own \
                     failures (stderr: {})",
                    self.vendor.name,
                    first_line(stderr)
                ),
            },
            Some(code) if (0..=255).contains(&code) => ExitStatus::Exited { code: code as i32 },
            Some(code) => ExitStatus::Unknown {
                reason: format!("ComputeSDK reported exit code {code}"),
            },
            None => ExitStatus::Unknown {
                reason: "ComputeSDK reported no exit code".into(),
            },
        }
    }
}

fn network_name(mode: NetworkMode) -> &'static str {
    match mode {
        NetworkMode::None => "none",
        NetworkMode::Bridge => "bridge",
        NetworkMode::Host => "host",
    }
}

fn first_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().next().unwrap_or("").trim();
    let mut cut: String = line.chars().take(200).collect();
    if cut.is_empty() {
        cut = "empty".into();
    }
    cut
}

/// An output stream of an exec reply; a reply without it is a broken protocol, not empty
/// output.
fn decode(reply: &Value, stream: &str) -> Option<Vec<u8>> {
    reply[stream]
        .as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
}

#[async_trait]
impl Provider for ComputeSdk {
    fn id(&self) -> &str {
        &self.id
    }

    async fn create(&self, req: &CreateRequest) -> Result<Created> {
        // No network (Berth's default) goes to the vendor as its own option; outbound network
        // only where the vendor has one; the host's network never.
        let available = match req.network {
            NetworkMode::None => true,
            NetworkMode::Bridge => self.vendor.network_bridge,
            NetworkMode::Host => false,
        };
        if !available {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                &self.id,
                format!(
                    "network `{}` is not available through ComputeSDK's {} adapter (it offers {})",
                    network_name(req.network),
                    self.vendor.name,
                    if self.vendor.network_bridge {
                        "`none` and `bridge`"
                    } else {
                        "`none` only"
                    }
                ),
            ));
        }
        if req.image.is_some() && !self.vendor.images {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                &self.id,
                format!(
                    "ComputeSDK's {} adapter has no images; create it without one",
                    self.vendor.name
                ),
            ));
        }
        if req.resources != Default::default() {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                &self.id,
                "resource limits are not passed through ComputeSDK's common interface",
            ));
        }
        let metadata: BTreeMap<String, String> = req.labels.to_map(&req.name.0);
        let reply = self
            .call(
                "create",
                json!({
                    "name": req.name.0,
                    "metadata": metadata,
                    "image": req.image,
                    "network": network_name(req.network),
                }),
            )
            .await?;
        // The id comes from the vendor: it is stored, printed and sent back, so only plain
        // identifier characters are accepted.
        let native = reply["sandbox_id"].as_str().unwrap_or_default();
        let plain = native
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
        if native.is_empty() || native.len() > 256 || !plain {
            // Leave nothing behind that Berth cannot name (the id only travels inside JSON).
            if !native.is_empty() {
                let _ = self.call("destroy", json!({"sandbox_id": native})).await;
            }
            return Err(ProviderError::new(
                ErrorKind::Unknown,
                &self.id,
                "create: ComputeSDK returned no usable sandbox id",
            ));
        }
        Ok(Created {
            native_id: NativeId(native.to_owned()),
            raw_state: "created".into(),
        })
    }

    async fn observe(&self, id: &NativeId) -> Result<Observation> {
        match self.look_up(id).await? {
            Some((true, labels)) => Ok(Observation::Present {
                state: if self.vendor.found_means_running {
                    CanonicalState::Running
                } else {
                    CanonicalState::Unknown
                },
                raw: "found".into(),
                soft_deleted: false,
                labels,
            }),
            Some((false, _)) => Ok(Observation::Absent),
            None => Err(ProviderError::new(
                ErrorKind::Unknown,
                &self.id,
                format!("observe: not found, unproven: {}", self.unproven_absence()),
            )),
        }
    }

    async fn exec(&self, id: &NativeId, req: &ExecRequest) -> Result<ExecOutput> {
        berth_contract::check_command(&req.command)
            .and_then(|()| berth_contract::check_env(&req.env))
            .map_err(|m| ProviderError::new(ErrorKind::InvalidRequest, &self.id, m))?;
        let mut env = req.env.clone();
        env.insert("BERTH_SANDBOX".into(), id.0.clone());
        let (command, cwd) = with_cwd(&req.command, req.cwd.as_deref(), &mut env);
        let args = json!({
            "sandbox_id": id.0,
            "command": command,
            "cwd": cwd,
            "env": env,
            "timeout_ms": req.timeout.map(|t| t.as_millis() as u64),
            // Bounded so a reply always fits the line limit Berth reads with.
            "max_output_bytes": req.max_output_bytes.min(berth_contract::DEFAULT_MAX_OUTPUT_BYTES),
        });
        let started = Instant::now();
        let sidecar = self.sidecar().await?;
        let call = sidecar.call("exec", args);
        // A remote vendor gets the deadline itself and a grace period to answer.
        let wait = req.timeout.map(|t| {
            if self.vendor.in_process {
                t
            } else {
                t + Duration::from_secs(10)
            }
        });
        let reply = match wait {
            Some(wait) => match tokio::time::timeout(wait, call).await {
                Ok(reply) => reply,
                Err(_) if self.vendor.in_process => {
                    // The interpreter runs inside the sidecar: killing it is what stops the
                    // command (and every sandbox it held, which the manifest says).
                    drop(sidecar);
                    self.restart_sidecar().await;
                    return Ok(ExecOutput {
                        status: ExitStatus::TimedOut,
                        stdout: Vec::new(),
                        stderr: Some(Vec::new()),
                        stdout_total: 0,
                        stderr_total: Some(0),
                        duration: started.elapsed(),
                    });
                }
                Err(_) => {
                    return Ok(ExecOutput {
                        status: ExitStatus::Unknown {
                            reason: format!(
                                "no answer from {} by the deadline; whether the command was \
                                 stopped is not known",
                                self.vendor.name
                            ),
                        },
                        stdout: Vec::new(),
                        stderr: Some(Vec::new()),
                        stdout_total: 0,
                        stderr_total: Some(0),
                        duration: started.elapsed(),
                    })
                }
            },
            None => call.await,
        };
        let reply = reply.map_err(|f| self.error("exec", f))?;
        let (Some(stdout), Some(stderr)) = (decode(&reply, "stdout"), decode(&reply, "stderr"))
        else {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                &self.id,
                "exec: the ComputeSDK bridge sent a reply without its output (protocol broken)",
            ));
        };
        let mut status = self.exit_status(reply["exit_code"].as_i64(), &stderr);
        if let Some(timeout) = req.timeout {
            if started.elapsed() >= timeout && !self.vendor.in_process {
                status = ExitStatus::Unknown {
                    reason: format!(
                        "the deadline passed before {} answered ({status}); whether it stopped \
                         the command is not known",
                        self.vendor.name
                    ),
                };
            }
        }
        Ok(ExecOutput {
            status,
            stdout_total: reply["stdout_total"]
                .as_u64()
                .unwrap_or(stdout.len() as u64),
            stderr_total: Some(
                reply["stderr_total"]
                    .as_u64()
                    .unwrap_or(stderr.len() as u64),
            ),
            stdout,
            stderr: Some(stderr),
            duration: started.elapsed(),
        })
    }

    async fn destroy(&self, id: &NativeId) -> Result<DestroyOutcome> {
        if self.found(id).await? == Some(false) {
            return Ok(DestroyOutcome::VerifiedGone {
                already_absent: true,
            });
        }
        self.call("destroy", json!({"sandbox_id": id.0})).await?;
        // ComputeSDK's destroy swallows errors in several adapters: only the provider's own
        // answer afterwards says whether it worked.
        Ok(match self.found(id).await? {
            Some(false) => DestroyOutcome::VerifiedGone {
                already_absent: false,
            },
            Some(true) => DestroyOutcome::Accepted {
                raw_state: "still found after destroy".into(),
            },
            None => DestroyOutcome::Accepted {
                raw_state: format!("unverified: {}", self.unproven_absence()),
            },
        })
    }
}

#[cfg(test)]
mod tests;
