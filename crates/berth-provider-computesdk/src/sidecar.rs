//! The Node sidecar and its protocol (`berth.computesdk-bridge/1`): one JSON object per line on
//! stdio, a hello line first, then one reply per request id, in any order.
//!
//! The process starts on first use, with an environment of exactly what the provider's
//! manifest names (credentials are never in argv), and ends with its owner: dropped, it is
//! killed; if Berth dies, its stdin closes and it exits. Its stderr is kept as a bounded,
//! redacted tail for error messages.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;

/// The protocol this build speaks.
pub const PROTOCOL: &str = "berth.computesdk-bridge/1";

/// The longest line Berth reads from the sidecar: two capped output streams in base64 plus
/// framing (the sidecar caps each stream at the request's `max_output_bytes`).
const MAX_LINE: usize = 48 * 1024 * 1024;
/// How much of the sidecar's stderr is kept for error messages.
const STDERR_TAIL: usize = 4096;
/// How long the sidecar may take to say hello (Node start-up plus loading the vendor SDK).
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start the sidecar.
#[derive(Clone)]
pub struct Launch {
    /// The `node` program.
    pub node: PathBuf,
    /// `bridge/computesdk` (holds `sidecar.mjs` and `node_modules`).
    pub dir: PathBuf,
    /// The ComputeSDK provider name (`just-bash`, `e2b`, …).
    pub vendor: String,
    /// The whole environment of the process: PATH and the variables the manifest names.
    pub env: Vec<(String, String)>,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("node", &self.node)
            .field("dir", &self.dir)
            .field("vendor", &self.vendor)
            .field(
                "env_names",
                &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// What went wrong talking to the sidecar.
#[derive(Debug)]
pub enum Failure {
    /// The sidecar could not be started or does not speak this protocol (setup).
    Setup(String),
    /// The sidecar died or broke the protocol mid-request.
    Lost(String),
    /// The ComputeSDK call threw.
    Vendor(VendorError),
}

/// An error a ComputeSDK call threw, as the sidecar describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct VendorError {
    /// The JavaScript error's name.
    pub name: String,
    /// Its message (at most 4 KiB; masked before use).
    pub message: String,
    /// An HTTP status, when the error carried one.
    pub status: Option<u16>,
    /// A Node/system error code (`ECONNREFUSED`), or the bridge's own (`BERTH_NOT_FOUND`).
    pub code: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Reply {
    id: Option<u64>,
    ok: Option<Value>,
    err: Option<VendorError>,
}

#[derive(Debug, Deserialize)]
struct Hello {
    hello: String,
    #[serde(default)]
    error: Option<VendorError>,
    #[serde(default)]
    packages: serde_json::Map<String, Value>,
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, Failure>>>>>;

/// A running sidecar.
pub struct Sidecar {
    child: Mutex<Option<Child>>,
    stdin: tokio::sync::Mutex<ChildStdin>,
    pending: Pending,
    next_id: AtomicU64,
    stderr_tail: Arc<Mutex<VecDeque<u8>>>,
    /// Package versions the sidecar reported (`computesdk`, the vendor package).
    pub packages: Vec<(String, String)>,
}

impl std::fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sidecar")
            .field("packages", &self.packages)
            .finish()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Sidecar {
    /// Starts the sidecar and waits for its hello.
    pub async fn start(launch: &Launch, secrets: &[String]) -> Result<Sidecar, Failure> {
        let script = launch.dir.join("sidecar.mjs");
        if !launch.dir.join("node_modules/computesdk").is_dir() {
            return Err(Failure::Setup(format!(
                "the ComputeSDK bridge's packages are not installed in {} (run \
                 scripts/install-computesdk-bridge, or set BERTH_COMPUTESDK_BRIDGE to a \
                 directory where they are)",
                launch.dir.display()
            )));
        }
        let mut child = Command::new(&launch.node)
            .arg(&script)
            .arg(&launch.vendor)
            .current_dir(&launch.dir)
            .env_clear()
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                Failure::Setup(format!(
                    "cannot start `{}` for the ComputeSDK bridge: {e} (install Node >= 20.18.1)",
                    launch.node.display()
                ))
            })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        tokio::spawn(keep_tail(stderr, stderr_tail.clone()));

        let mut lines = BufReader::new(stdout);
        let hello = tokio::time::timeout(HELLO_TIMEOUT, read_line(&mut lines)).await;
        let tail = |tail: &Arc<Mutex<VecDeque<u8>>>| masked_tail(tail, secrets);
        let hello: Hello = match hello {
            Ok(Ok(Some(line))) => serde_json::from_slice(&line).map_err(|e| {
                Failure::Setup(format!("the ComputeSDK bridge did not say hello: {e}"))
            })?,
            Ok(Ok(None)) => {
                let _ = child.wait().await;
                return Err(Failure::Setup(format!(
                    "the ComputeSDK bridge exited before saying hello: {}",
                    tail(&stderr_tail)
                )));
            }
            Ok(Err(e)) => return Err(Failure::Setup(format!("the ComputeSDK bridge: {e}"))),
            Err(_) => {
                return Err(Failure::Setup(format!(
                    "the ComputeSDK bridge did not say hello within {HELLO_TIMEOUT:?}"
                )))
            }
        };
        if hello.hello != PROTOCOL {
            return Err(Failure::Setup(format!(
                "the ComputeSDK bridge speaks `{}`, this build speaks `{PROTOCOL}` (reinstall \
                 the bridge from this source tree)",
                hello.hello
            )));
        }
        if let Some(error) = hello.error {
            return Err(Failure::Vendor(error));
        }
        let packages = hello
            .packages
            .into_iter()
            .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_owned()))
            .collect();
        let pending: Pending = Arc::default();
        tokio::spawn(dispatch(
            lines,
            pending.clone(),
            stderr_tail.clone(),
            secrets.to_vec(),
        ));
        Ok(Sidecar {
            child: Mutex::new(Some(child)),
            stdin: tokio::sync::Mutex::new(stdin),
            pending,
            next_id: AtomicU64::new(1),
            stderr_tail,
            packages,
        })
    }

    /// Sends one request and waits for its reply.
    pub async fn call(&self, op: &str, args: Value) -> Result<Value, Failure> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending").insert(id, tx);
        let mut line = serde_json::to_vec(&serde_json::json!({"id": id, "op": op, "args": args}))
            .expect("a JSON value serializes");
        line.push(b'\n');
        let written = {
            let mut stdin = self.stdin.lock().await;
            match stdin.write_all(&line).await {
                Ok(()) => stdin.flush().await,
                Err(e) => Err(e),
            }
        };
        if let Err(e) = written {
            self.pending.lock().expect("pending").remove(&id);
            return Err(Failure::Lost(format!(
                "cannot write to the ComputeSDK bridge: {e}"
            )));
        }
        rx.await.unwrap_or_else(|_| {
            Err(Failure::Lost(
                "the ComputeSDK bridge stopped answering".into(),
            ))
        })
    }

    /// Whether the process is still running.
    pub fn alive(&self) -> bool {
        let mut child = self.child.lock().expect("child");
        matches!(child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Kills the process (and with it whatever runs inside it).
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().expect("child").take() {
            let _ = child.start_kill();
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .expect("child")
            .as_ref()
            .and_then(Child::id)
    }

    /// The last bytes the sidecar wrote to stderr, masked.
    pub fn stderr_tail(&self, secrets: &[String]) -> String {
        masked_tail(&self.stderr_tail, secrets)
    }
}

/// Reads one line of at most [`MAX_LINE`] bytes; `None` at end of stream.
async fn read_line<R: AsyncBufRead + Unpin>(reader: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let read = (&mut *reader)
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') && line.len() > MAX_LINE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a line from the ComputeSDK bridge is longer than {MAX_LINE} bytes"),
        ));
    }
    Ok(Some(line))
}

async fn dispatch<R: AsyncBufRead + Unpin>(
    mut lines: R,
    pending: Pending,
    stderr_tail: Arc<Mutex<VecDeque<u8>>>,
    secrets: Vec<String>,
) {
    let reason = loop {
        match read_line(&mut lines).await {
            Ok(Some(line)) => {
                let Ok(reply) = serde_json::from_slice::<Reply>(&line) else {
                    break "the ComputeSDK bridge broke the protocol (a line that is not a reply)"
                        .to_owned();
                };
                let Some(id) = reply.id else {
                    break format!(
                        "the ComputeSDK bridge refused a request: {}",
                        reply.err.map(|e| e.message).unwrap_or_default()
                    );
                };
                let Some(waiter) = pending.lock().expect("pending").remove(&id) else {
                    continue;
                };
                let result = match (reply.ok, reply.err) {
                    (_, Some(err)) => Err(Failure::Vendor(err)),
                    (Some(ok), None) => Ok(ok),
                    (None, None) => Err(Failure::Lost("an empty reply".into())),
                };
                let _ = waiter.send(result);
            }
            Ok(None) => break "the ComputeSDK bridge exited".to_owned(),
            Err(e) => break format!("reading the ComputeSDK bridge: {e}"),
        }
    };
    // Let the stderr reader catch up with what the process wrote before it ended.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let tail = masked_tail(&stderr_tail, &secrets);
    let message = if tail.is_empty() {
        reason
    } else {
        format!("{reason}: {tail}")
    };
    for (_, waiter) in pending.lock().expect("pending").drain() {
        let _ = waiter.send(Err(Failure::Lost(message.clone())));
    }
}

async fn keep_tail(mut stderr: tokio::process::ChildStderr, tail: Arc<Mutex<VecDeque<u8>>>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let mut tail = tail.lock().expect("tail");
        tail.extend(&buf[..n]);
        let excess = tail.len().saturating_sub(STDERR_TAIL);
        tail.drain(..excess);
    }
}

fn masked_tail(tail: &Arc<Mutex<VecDeque<u8>>>, secrets: &[String]) -> String {
    let bytes: Vec<u8> = tail.lock().expect("tail").iter().copied().collect();
    crate::mask(&String::from_utf8_lossy(&bytes), secrets)
        .trim()
        .to_owned()
}
