//! `berth bench bridge [VENDOR]`: what the ComputeSDK bridge adds over the same ComputeSDK
//! provider driven directly from Node, measured in the same run.
//!
//! - **Per exec** (target ≤ +3 ms): `true` in one sandbox — Berth's adapter (request to the
//!   sidecar over stdio, `runCommand`, reply, decoding) against `bench-direct.mjs` calling
//!   `sandbox.runCommand('true')` with the same one-variable environment. Labelled: Berth's
//!   overhead over the mechanism it drives.
//! - **Per cycle**: create → exec → destroy. Berth's destroy also *verifies* (a `getById` before
//!   and after), which the direct cycle does not do: the difference is the bridge plus that
//!   verification, and is labelled so. The ledger is not in either (measured elsewhere).
//!
//! Rounds alternate (Node, Berth, Node, Berth) and the samples are pooled, so drift in the
//! machine's speed lands on both sides.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use berth_contract::{CreateRequest, DestroyOutcome, ExecRequest, Labels, SandboxName};
use serde_json::{json, Value};

use crate::stats::{compare, Comparison};
use crate::{bail, BenchContext, BenchError, Report, Result, WithContext};

/// Target: the bridge adds at most this much per exec (median).
const EXEC_TARGET_MS: f64 = 3.0;
const ROUNDS: usize = 2;

fn labels() -> Labels {
    Labels {
        owner: "bench@bridge".into(),
        run_id: format!("bench-bridge-{}", std::process::id()),
        ledger_token: "bench".into(),
        expires_at_unix: None,
    }
}

fn request(n: usize) -> CreateRequest {
    CreateRequest::new(SandboxName(format!("bx-bench-bridge-{n}")), labels())
}

async fn berth_round(
    provider: &dyn berth_contract::Provider,
    iterations: usize,
    exec: &mut Vec<Duration>,
    cycle: &mut Vec<Duration>,
) -> Result<()> {
    let id = provider.create(&request(0)).await?.native_id;
    let req = ExecRequest::shell("true");
    let measured = async {
        provider.exec(&id, &req).await?;
        for _ in 0..iterations {
            let start = Instant::now();
            let out = provider.exec(&id, &req).await?;
            exec.push(start.elapsed());
            if !out.status.success() {
                bail!("`true` through the bridge ended {}", out.status);
            }
        }
        Ok::<_, BenchError>(())
    }
    .await;
    provider.destroy(&id).await?;
    measured?;
    for n in 0..iterations {
        let start = Instant::now();
        let id = provider.create(&request(n + 1)).await?.native_id;
        let out = provider.exec(&id, &req).await?;
        let gone = provider.destroy(&id).await?;
        cycle.push(start.elapsed());
        if !out.status.success() {
            bail!("`true` through the bridge ended {}", out.status);
        }
        if !matches!(gone, DestroyOutcome::VerifiedGone { .. }) {
            bail!("destroy through the bridge was not verified: {gone:?}");
        }
    }
    Ok(())
}

async fn node_round(
    bridge: &berth_provider_computesdk::BridgeConfig,
    vendor: &str,
    iterations: usize,
    exec: &mut Vec<Duration>,
    cycle: &mut Vec<Duration>,
) -> Result<()> {
    let out = tokio::process::Command::new(&bridge.node)
        .arg(bridge.dir.join("bench-direct.mjs"))
        .arg(vendor)
        .arg(iterations.to_string())
        .current_dir(&bridge.dir)
        .env_clear()
        .envs(bridge.env.iter().map(|(k, v)| (k, v)))
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "the direct Node baseline failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        );
    }
    let doc: Value = serde_json::from_slice(&out.stdout)?;
    let samples = |key: &str| -> Result<Vec<Duration>> {
        doc[key]
            .as_array()
            .filter(|a| a.len() == iterations)
            .ok_or_else(|| BenchError::Failed(format!("the Node baseline gave no `{key}`")))?
            .iter()
            .map(|v| {
                v.as_f64()
                    .filter(|ms| ms.is_finite() && *ms >= 0.0)
                    .map(|ms| Duration::from_secs_f64(ms / 1000.0))
                    .ok_or_else(|| BenchError::Failed(format!("a bad `{key}` sample: {v}")))
            })
            .collect()
    };
    exec.extend(samples("exec_ms")?);
    cycle.extend(samples("cycle_ms")?);
    Ok(())
}

/// Runs the benchmark for `computesdk:<vendor>`.
pub async fn bench(
    ctx: &BenchContext,
    vendor: Option<&str>,
    iterations: Option<usize>,
) -> Result<Report> {
    let vendor = vendor.unwrap_or("just-bash");
    let id = format!("computesdk:{vendor}");
    // The measured sandboxes bypass the ledger (its cost is measured elsewhere), which is only
    // safe where they cannot outlive this process.
    match berth_provider_computesdk::vendor(&id) {
        Some(v) if v.in_process => {}
        Some(_) => bail!(
            "`berth bench bridge` measures only vendors whose sandboxes end with the sidecar \
             (just-bash): it creates sandboxes outside the ledger"
        ),
        None => bail!("`{id}` is not a ComputeSDK provider this build bridges"),
    }
    let iterations = iterations.unwrap_or(200).max(ROUNDS) / ROUNDS;
    let provider = ctx.provider(&id)?;
    let bridge = ctx.registry.computesdk_bridge(&id, &ctx.provider_config)?;
    let (mut berth_exec, mut berth_cycle, mut node_exec, mut node_cycle) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        ctx.progress
            .say(&format!("bridge {id}: round {}/{ROUNDS}", round + 1));
        node_round(&bridge, vendor, iterations, &mut node_exec, &mut node_cycle)
            .await
            .context("the direct Node baseline")?;
        berth_round(
            provider.as_ref(),
            iterations,
            &mut berth_exec,
            &mut berth_cycle,
        )
        .await
        .context("Berth through the bridge")?;
    }
    let exec = compare(&mut berth_exec, &mut node_exec);
    let cycle = compare(&mut berth_cycle, &mut node_cycle);
    let verdict = crate::stats::Verdict::at_most(exec.overhead_interval_ms, EXEC_TARGET_MS);
    let json = json!({
        "schema": "berth.bench.bridge/v1",
        "provider": id,
        "iterations": iterations * ROUNDS,
        "baseline": "the same ComputeSDK provider driven directly from Node (bridge/computesdk/bench-direct.mjs), same run, rounds alternating",
        "exec": {
            "label": "Berth's overhead over the mechanism it drives: `true` through the sidecar vs runCommand('true') in Node",
            "comparison": exec,
            "target_overhead_ms": EXEC_TARGET_MS,
            "meets_target": verdict.met(),
            "verdict": verdict,
        },
        "cycle": {
            "label": "create → exec → destroy; Berth's destroy also verifies absence (getById before and after), the direct cycle does not",
            "comparison": cycle,
        },
    });
    let mut text = String::new();
    let line = |text: &mut String, name: &str, c: &Comparison| {
        let _ = writeln!(
            text,
            "  {name:<6} berth {:>7.3} ms  node direct {:>7.3} ms  (+{:.3} ms, {:.2}x; p95 {:.3} vs {:.3})",
            c.berth.median_ms,
            c.raw.median_ms,
            c.overhead_median_ms,
            c.ratio_median,
            c.berth.p95_ms,
            c.raw.p95_ms
        );
    };
    let _ = writeln!(
        text,
        "bridge {id}: {} samples each, medians; baseline: the same ComputeSDK provider driven from Node, same run",
        iterations * ROUNDS
    );
    line(&mut text, "exec", &exec);
    line(&mut text, "cycle", &cycle);
    let _ = writeln!(
        text,
        "  exec overhead target <= +{EXEC_TARGET_MS} ms: {}",
        verdict.describe(exec.overhead_interval_ms, " ms")
    );
    let _ = writeln!(
        text,
        "  (the cycle's difference includes Berth's verifying getById before and after destroy)"
    );
    Ok(Report { json, text })
}
