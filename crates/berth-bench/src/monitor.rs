//! `berth bench monitor PROVIDER…`: how long a line an agent writes in its sandbox takes to
//! reach a watcher as a normalized event.
//!
//! A stand-in agent in the sandbox prints stream-json lines (Claude Code's shape), each carrying
//! the sandbox clock's nanoseconds at the moment it was written, every 20 ms. The lines go the
//! way a mission's agent output goes — streamed exec → the attempt's raw log and normalized
//! events (`berth_orchestrator::AgentLogs`) — and a watcher follows `events.jsonl` exactly as
//! `berth attempt watch` does (`follow::Follower`, polled every `POLL_INTERVAL`). Latency = the
//! watcher's clock when it reads the event − the time in the line. Sandboxes share the host's
//! clock (same kernel). Target: p95 < 100 ms.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use berth_contract::{ExecRequest, NativeId};
use berth_harness::Harness;
use berth_orchestrator::follow::{Follower, POLL_INTERVAL};
use berth_orchestrator::AgentLogs;
use serde_json::{json, Value};

use crate::stats::percentile;
use crate::{berth_create_tracked, destroy_tracked, BenchContext, BenchError, Report, Result};

/// The target: p95 below this many milliseconds.
const P95_TARGET_MS: f64 = 100.0;

/// Lines the stand-in agent writes.
const LINES: usize = 100;

/// The stand-in agent: one assistant text event every 20 ms, its text the write time in ns.
const AGENT: &str = r#"i=0; while [ $i -lt "$LINES" ]; do printf '{"type":"assistant","message":{"content":[{"type":"text","text":"%s"}]},"session_id":"bench"}\n' "$(date +%s%N)"; i=$((i+1)); sleep 0.02; done"#;

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

async fn measure(ctx: &BenchContext, provider_id: &str, image: Option<&str>) -> Result<Vec<f64>> {
    let provider = ctx.provider(provider_id)?;
    let tracked = berth_create_tracked(ctx, &provider, image).await?;
    let scratch = tempfile::Builder::new()
        .prefix("berth-bench-monitor-")
        .tempdir_in(&ctx.home)?;
    let measured = async {
        let streaming = provider.streaming().ok_or_else(|| {
            BenchError::Invalid(format!("{provider_id} has no streaming exec to follow"))
        })?;
        // Masking as a mission does (one known value and the token shapes).
        let redactor = berth_artifacts::Redactor::new(["bench-known-secret-value".to_owned()]);
        let mut logs = AgentLogs::open(scratch.path(), Harness::ClaudeCode, "bench", redactor)?;
        let done = Arc::new(AtomicBool::new(false));
        let watcher = {
            let done = done.clone();
            let path = scratch.path().join("events.jsonl");
            tokio::spawn(async move {
                let mut follower = Follower::new(&path);
                let mut latencies = Vec::new();
                loop {
                    let finished = done.load(Ordering::SeqCst);
                    let polled = follower.poll()?;
                    let seen = now_ns();
                    for line in polled.lines {
                        let event: Value = serde_json::from_str(&line)
                            .map_err(|e| BenchError::Invalid(e.to_string()))?;
                        if let Some(written) = event["data"]["text"]
                            .as_str()
                            .and_then(|t| t.parse::<u128>().ok())
                        {
                            latencies.push(seen.saturating_sub(written) as f64 / 1e6);
                        }
                    }
                    if finished {
                        return Ok::<_, BenchError>(latencies);
                    }
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
            })
        };
        let req = ExecRequest::shell(AGENT).with_env("LINES", LINES.to_string());
        let summary = streaming
            .exec_streaming(&NativeId(tracked.native_id.clone()), &req, &mut logs)
            .await;
        let (events, _) = logs.finish()?;
        done.store(true, Ordering::SeqCst);
        let latencies = watcher
            .await
            .map_err(|e| BenchError::Invalid(e.to_string()))??;
        let summary = summary?;
        if !summary.status.success() || events.len() != LINES || latencies.len() != LINES {
            return Err(BenchError::Invalid(format!(
                "the stand-in agent on {provider_id} ended {} with {} events, {} seen by the watcher",
                summary.status,
                events.len(),
                latencies.len()
            )));
        }
        Ok(latencies)
    }
    .await;
    destroy_tracked(ctx, provider.as_ref(), &tracked).await?;
    measured
}

/// `berth bench monitor PROVIDER… [--image IMAGE]`.
pub async fn bench(
    ctx: &BenchContext,
    providers: &[String],
    image: Option<&str>,
) -> Result<Report> {
    if providers.is_empty() {
        return Err(BenchError::Invalid(
            "name the providers to measure: `berth bench monitor host docker --image …`".into(),
        ));
    }
    let mut results = serde_json::Map::new();
    let mut text = String::new();
    let _ = writeln!(
        text,
        "-- monitor latency: a line written in the sandbox → the normalized event at a watcher \
         ({LINES} lines, watcher polls every {} ms)",
        POLL_INTERVAL.as_millis()
    );
    for provider in providers {
        ctx.progress.say(&format!("bench monitor: {provider}"));
        let mut latencies = measure(ctx, provider, image).await?;
        let p50 = percentile(&mut latencies, 0.5).unwrap_or(f64::NAN);
        let p95 = percentile(&mut latencies, 0.95).unwrap_or(f64::NAN);
        let max = latencies.iter().copied().fold(f64::NAN, f64::max);
        let met = p95 < P95_TARGET_MS;
        let _ = writeln!(
            text,
            "{provider:<8} p50 {p50:>6.1} ms  p95 {p95:>6.1} ms  max {max:>6.1} ms (n={})  target p95 < {P95_TARGET_MS} ms: {}",
            latencies.len(),
            if met { "met" } else { "NOT met" }
        );
        results.insert(
            provider.clone(),
            json!({ "p50_ms": p50, "p95_ms": p95, "max_ms": max, "n": latencies.len(),
                    "target": { "p95_below_ms": P95_TARGET_MS, "met": met } }),
        );
    }
    Ok(Report {
        json: json!({
            "measurement": "monitor_latency",
            "providers": results,
            "notes": "a stand-in agent writes stream-json lines carrying their write time; they go through streamed exec, the attempt's raw log and normalized events, and a watcher following events.jsonl by (identity, offset) as `berth attempt watch` does",
        }),
        text,
    })
}
