//! `berth bench gateway`: what the model gateway costs per request, and how long each agent
//! CLI takes from process start to its first model request.
//!
//! - **Gateway overhead** (Berth's overhead over its own mechanism): the same streamed Chat
//!   Completions request sent to the scripted model directly and through the gateway's proxy in
//!   front of it (token check, credential swap, journal line with usage), over kept-alive
//!   connections, alternating which goes first; the overhead is the median of the paired
//!   differences. Target: ≤ 1 ms at the median.
//! - **Harness start-up** (reported, no target): each installed agent CLI launched the way a
//!   mission launches it (`berth_harness::launch`), from process start to the first request the
//!   gateway journals. A CLI that is not installed is reported UNKNOWN with the reason, never 0.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_gateway::{Gateway, GatewayConfig, Journal, Proxy, Script, Upstream};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::json;

use crate::stats::{median, summarize};
use crate::{BenchContext, BenchError, Report, Result};

/// The gateway-overhead target, milliseconds at the median.
const OVERHEAD_TARGET_MS: f64 = 1.0;

const SCRIPT: &str = r#"schema_version = 1
side_text = "Benchmark"
[[step]]
shell = "printf hi > hello.txt"
[[step]]
text = "Done"
"#;

/// A kept-alive HTTP/1.1 connection to a gateway.
struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    authority: String,
    auth: String,
}

impl Client {
    async fn connect(base: &str, token: &str) -> Result<Client> {
        let authority = base.trim_start_matches("http://").to_owned();
        let stream = tokio::net::TcpStream::connect(&authority).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| BenchError::Invalid(format!("gateway handshake: {e}")))?;
        tokio::spawn(connection);
        Ok(Client {
            sender,
            authority,
            auth: format!("Bearer {token}"),
        })
    }

    /// One streamed request, to the end of its body.
    async fn request(&mut self, body: &Bytes) -> Result<Duration> {
        let started = Instant::now();
        let request = hyper::Request::post("/v1/chat/completions")
            .header("host", &self.authority)
            .header("authorization", &self.auth)
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .map_err(|e| BenchError::Invalid(e.to_string()))?;
        self.sender
            .ready()
            .await
            .map_err(|e| BenchError::Invalid(format!("gateway connection: {e}")))?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| BenchError::Invalid(format!("gateway request: {e}")))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| BenchError::Invalid(format!("gateway body: {e}")))?
            .to_bytes();
        let took = started.elapsed();
        if !status.is_success() || !bytes.ends_with(b"data: [DONE]\n\n") {
            return Err(BenchError::Invalid(format!(
                "gateway answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            )));
        }
        Ok(took)
    }
}

/// A Chat Completions request the size of a small agent turn (a 16 KiB prompt, two tools).
fn request_body() -> Bytes {
    let prompt = "Fix the failing test in the repository. ".repeat(410);
    Bytes::from(
        json!({
            "model": "scripted", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "system", "content": "Working directory: /workspace/repo\n"},
                         {"role": "user", "content": prompt}],
            "tools": [
                {"type": "function", "function": {"name": "bash", "parameters": {"properties": {"command": {"type": "string"}}}}},
                {"type": "function", "function": {"name": "write", "parameters": {"properties": {"filePath": {}, "content": {}}}}},
            ],
        })
        .to_string(),
    )
}

/// Process start → first journaled request, for one launch of `harness`.
async fn startup_once(
    harness: berth_harness::Harness,
    bin: &Path,
    gateway: &Gateway,
    base: &str,
    scratch: &Path,
    n: usize,
) -> Result<f64> {
    let dir = scratch.join(format!("{}-{n}", harness.as_str()));
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo)?;
    let journal = dir.join("gateway.jsonl");
    let token = gateway.admit(&format!("bench:{}:{n}", harness.as_str()), journal.clone());
    let launched_ms = berth_gateway_now_ms();
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(berth_harness::launch(harness))
        .current_dir(&repo)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &dir)
        .env(berth_harness::vars::BIN, bin)
        .env(berth_harness::vars::GATEWAY_URL, base)
        .env(berth_harness::vars::GATEWAY_TOKEN, token.expose())
        .env(berth_harness::vars::MODEL, "scripted")
        .env(berth_harness::vars::INSTRUCTIONS, "Create hello.txt")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .process_group(0)
        .spawn()?;
    let status = tokio::time::timeout(Duration::from_secs(180), child.wait()).await;
    gateway.revoke(&token);
    let status = match status {
        Ok(status) => status?,
        Err(_) => {
            return Err(BenchError::Invalid(format!(
                "{} did not finish within 180 s",
                harness.as_str()
            )))
        }
    };
    let first = Journal::read(&journal)
        .ok()
        .and_then(|entries| entries.iter().map(|e| e.at_unix_ms).min())
        .ok_or_else(|| {
            BenchError::Invalid(format!(
                "{} made no model request (exit {status})",
                harness.as_str()
            ))
        })?;
    Ok(first.saturating_sub(launched_ms) as f64)
}

fn berth_gateway_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `berth bench gateway [--iterations N]`.
pub async fn bench(ctx: &BenchContext, iterations: Option<usize>) -> Result<Report> {
    let iterations = iterations.unwrap_or(500).max(20);
    let scratch = tempfile::Builder::new()
        .prefix("berth-bench-gateway-")
        .tempdir_in(&ctx.home)?;
    let script = Arc::new(Script::parse(SCRIPT).expect("the bench script parses"));
    let upstream = Gateway::new(GatewayConfig {
        upstream: Upstream::Scripted(script.clone()),
        prices: None,
    });
    let credential = upstream.admit("bench-upstream", scratch.path().join("upstream.jsonl"));
    let upstream_running = upstream
        .listen(0)
        .await
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
    let proxy = Gateway::new(GatewayConfig {
        upstream: Upstream::Proxy(Arc::new(
            Proxy::new(&upstream_running.base_url(), credential.expose().to_owned())
                .map_err(|e| BenchError::Invalid(e.to_string()))?,
        )),
        prices: None,
    });
    let token = proxy.admit("bench", scratch.path().join("proxy.jsonl"));
    let proxy_running = proxy
        .listen(0)
        .await
        .map_err(|e| BenchError::Invalid(e.to_string()))?;

    let body = request_body();
    let mut direct = Client::connect(&upstream_running.base_url(), credential.expose()).await?;
    let mut through = Client::connect(&proxy_running.base_url(), token.expose()).await?;
    for _ in 0..10 {
        direct.request(&body).await?;
        through.request(&body).await?;
    }
    let (mut direct_samples, mut gateway_samples, mut paired) =
        (Vec::new(), Vec::new(), Vec::new());
    for i in 0..iterations {
        if i % 100 == 0 {
            ctx.progress
                .say(&format!("bench gateway: requests {i}/{iterations}"));
        }
        let (d, g) = if i % 2 == 0 {
            let d = direct.request(&body).await?;
            (d, through.request(&body).await?)
        } else {
            let g = through.request(&body).await?;
            (direct.request(&body).await?, g)
        };
        paired.push((g.as_secs_f64() - d.as_secs_f64()) * 1000.0);
        direct_samples.push(d);
        gateway_samples.push(g);
    }
    let direct = summarize(&mut direct_samples);
    let through = summarize(&mut gateway_samples);
    let overhead_interval = crate::stats::median_interval(&paired);
    let overhead = median(&mut paired).unwrap_or(f64::NAN);
    let verdict = crate::stats::Verdict::at_most(overhead_interval, OVERHEAD_TARGET_MS);

    // Harness start-up, against the scripted model through a gateway of its own.
    let scripted = Gateway::new(GatewayConfig {
        upstream: Upstream::Scripted(script),
        prices: None,
    });
    let scripted_running = scripted
        .listen(0)
        .await
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
    let mut startup = serde_json::Map::new();
    let mut startup_text = String::new();
    for harness in berth_harness::Harness::ALL {
        let found = berth_orchestrator::agent_bin_dir(
            &ctx.provider_config.env,
            berth_orchestrator::GatewayReach::SharedLoopback,
            harness,
        );
        let Ok(bin) = found.map(PathBuf::from) else {
            let why = format!(
                "UNKNOWN(`{}` not installed: set BERTH_AGENT_BIN_DIR)",
                harness.program()
            );
            let _ = writeln!(startup_text, "{:<12} {why}", harness.as_str());
            startup.insert(harness.as_str().into(), json!({ "unknown": why }));
            continue;
        };
        ctx.progress
            .say(&format!("bench gateway: {} start-up", harness.as_str()));
        let mut samples = Vec::new();
        for n in 0..3 {
            samples.push(
                startup_once(
                    harness,
                    &bin,
                    &scripted,
                    &scripted_running.base_url(),
                    scratch.path(),
                    n,
                )
                .await?,
            );
        }
        let mid = median(&mut samples.clone()).unwrap_or(f64::NAN);
        let _ = writeln!(
            startup_text,
            "{:<12} process start → first model request: median {mid:.0} ms (n=3: {:?})",
            harness.as_str(),
            samples.iter().map(|s| s.round() as u64).collect::<Vec<_>>()
        );
        startup.insert(
            harness.as_str().into(),
            json!({ "median_ms": mid, "samples_ms": samples, "version": harness.pinned().1 }),
        );
    }

    let doc = json!({
        "measurement": "gateway",
        "request": "streamed Chat Completions, 16 KiB prompt, kept-alive connections",
        "direct": direct,
        "through_gateway": through,
        "overhead_median_ms": overhead,
        "target": { "overhead_median_ms": OVERHEAD_TARGET_MS, "met": verdict.met(), "verdict": verdict, "overhead_interval_ms": overhead_interval },
        "harness_startup": startup,
        "notes": "direct = the scripted model called itself; through_gateway = the gateway's proxy in front of it (token check, credential swap, journal line): Berth's overhead over its own mechanism, paired samples in alternating order. harness_startup = process start to the first journaled model request, launched as a mission launches it, host, no sandbox.",
    });
    let mut text = String::new();
    let _ = writeln!(
        text,
        "-- the model gateway: its overhead over the scripted model called directly (same run)"
    );
    let _ = writeln!(
        text,
        "direct        median {:>7.3} ms  p95 {:>7.3} ms  (n={})",
        direct.median_ms, direct.p95_ms, direct.n
    );
    let _ = writeln!(
        text,
        "via gateway   median {:>7.3} ms  p95 {:>7.3} ms  (n={})",
        through.median_ms, through.p95_ms, through.n
    );
    let _ = writeln!(
        text,
        "target: overhead ≤ {OVERHEAD_TARGET_MS} ms at the median (paired): {overhead:+.3} ms — {}",
        verdict.describe(overhead_interval, " ms")
    );
    let _ = writeln!(
        text,
        "-- harness start-up (process start → first model request; reported)"
    );
    text.push_str(&startup_text);
    Ok(Report { json: doc, text })
}
