//! `berth bench PROVIDER…`: the lifecycle benchmark.
//!
//! Per iteration it records phase offsets from the request — create returned, ready (observe
//! says running), first exec ok, destroy called, destroy returned, verified gone (observe says
//! absent) — the error class of a failure, and the cleanup outcome (verified_gone /
//! accepted_not_verified / failed / leaked). Every sandbox goes through the ledger, so a killed
//! run leaves nothing `berth ledger sweep` cannot find. A reuse probe plants a token in the first
//! sandbox and checks no later sandbox sees it. Summaries are median / p95 / p99 and the success
//! rate; every figure is a measurement or `UNKNOWN(reason)`, never zero. The JSON keeps
//! ComputeSDK's benchmark result fields (`provider`, `mode`, `iterations[].ttiMs`,
//! `summary.ttiMs`, `successRate`, `concurrency`, `staggerDelayMs`, `wallClockMs`) and adds
//! Berth's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::fmt::Write as _;

use crate::{BenchContext, Report, Result};

/// What to measure (`berth bench P…`).
#[derive(Debug, Clone)]
pub struct LifecycleOptions {
    /// Providers, side by side.
    pub providers: Vec<String>,
    /// Iterations per provider (default 10).
    pub iterations: Option<usize>,
    /// Image for providers that need one.
    pub image: Option<String>,
    /// `sequential`, `burst` or `staggered`.
    pub mode: String,
    /// How many run at once in burst and staggered modes.
    pub concurrency: usize,
    /// Delay between launches in staggered mode.
    pub stagger_ms: u64,
    /// Also write the results JSON here.
    pub out: Option<std::path::PathBuf>,
}
use berth_contract::{DestroyOutcome, ExecRequest, NativeId, Observation, Provider};
use serde::Serialize;
use serde_json::{json, Value};

const PHASES: [&str; 6] = [
    "create_returned",
    "ready",
    "first_exec_ok",
    "destroy_called",
    "destroy_returned",
    "verified_gone",
];

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Iteration {
    /// Time to interactive: request → first exec ok (ComputeSDK's ttiMs); null when not reached.
    tti_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_class: Option<String>,
    /// Offsets from the request, in ms; a phase not reached is absent.
    phases: BTreeMap<&'static str, f64>,
    cleanup: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox_id: Option<String>,
    /// Whether this sandbox saw the reuse probe's token (it must not).
    #[serde(skip_serializing_if = "Option::is_none")]
    reused: Option<bool>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One create → ready → first exec → destroy → verified-gone iteration.
async fn iterate(
    ctx: BenchContext,
    provider: Arc<dyn Provider>,
    image: Option<String>,
    probe: Option<String>,
) -> Iteration {
    let started = Instant::now();
    let mut phases = BTreeMap::new();
    let mut failure: Option<(String, String)> = None;
    let create = {
        let provider = provider.clone();
        ctx.ledger
            .create_tracked(
                provider.as_ref(),
                "bench",
                Some(Duration::from_secs(3600)),
                |req| req.image = image,
                |req| {
                    let provider = provider.clone();
                    async move { provider.create(&req).await }
                },
            )
            .await
    };
    let tracked = match create {
        Ok(tracked) => tracked,
        Err(err) => {
            let class = match &err {
                berth_ledger::LedgerError::Provider { source, .. } => {
                    source.kind().as_str().to_owned()
                }
                _ => "unknown".into(),
            };
            return Iteration {
                tti_ms: None,
                error: Some(format!("create: {err}")),
                error_class: Some(class),
                phases,
                cleanup: "failed",
                sandbox_id: None,
                reused: None,
            };
        }
    };
    phases.insert("create_returned", ms(started.elapsed()));
    let id = NativeId(tracked.native_id.clone());
    match provider.observe(&id).await {
        Ok(Observation::Present {
            state: berth_contract::CanonicalState::Running,
            ..
        }) => {
            phases.insert("ready", ms(started.elapsed()));
        }
        Ok(other) => {
            failure = Some((
                "unknown".into(),
                format!("not ready after create: {other:?}"),
            ))
        }
        Err(e) => failure = Some((e.kind().as_str().into(), format!("observe: {e}"))),
    }
    let mut reused = None;
    if failure.is_none() {
        match provider.exec(&id, &ExecRequest::argv(["true"])).await {
            Ok(out) if out.status.success() => {
                phases.insert("first_exec_ok", ms(started.elapsed()));
            }
            Ok(out) => failure = Some(("unknown".into(), format!("first exec: {}", out.status))),
            Err(e) => failure = Some((e.kind().as_str().into(), format!("first exec: {e}"))),
        }
        if let Some(token) = &probe {
            // The probe file lives in the workspace; a fresh sandbox must not have it.
            let check = format!(
                "if [ -e .berth-reuse-probe ]; then cat .berth-reuse-probe; fi; echo {token} > .berth-reuse-probe"
            );
            if let Ok(out) = provider.exec(&id, &ExecRequest::shell(check)).await {
                reused = Some(String::from_utf8_lossy(&out.stdout).contains(token.as_str()));
            }
        }
    }
    phases.insert("destroy_called", ms(started.elapsed()));
    let cleanup = match ctx.ledger.row(&tracked.berth_id).await {
        Ok(row) => match ctx.ledger.destroy_row(provider.as_ref(), &row).await {
            Ok(DestroyOutcome::VerifiedGone { .. }) => {
                phases.insert("destroy_returned", ms(started.elapsed()));
                match provider.observe(&id).await {
                    Ok(Observation::Absent) => {
                        phases.insert("verified_gone", ms(started.elapsed()));
                        "verified_gone"
                    }
                    _ => "leaked",
                }
            }
            Ok(DestroyOutcome::Accepted { .. }) => {
                phases.insert("destroy_returned", ms(started.elapsed()));
                "accepted_not_verified"
            }
            Err(e) => {
                failure.get_or_insert(("unknown".into(), format!("destroy: {e}")));
                match provider.observe(&id).await {
                    Ok(Observation::Absent) => "failed",
                    _ => "leaked",
                }
            }
        },
        Err(e) => {
            failure.get_or_insert(("unknown".into(), format!("ledger: {e}")));
            "failed"
        }
    };
    Iteration {
        tti_ms: phases.get("first_exec_ok").copied(),
        error_class: failure.as_ref().map(|f| f.0.clone()),
        error: failure.map(|f| f.1),
        phases,
        cleanup,
        sandbox_id: Some(tracked.berth_id),
        reused,
    }
}

/// median / p95 / p99 (nearest rank), or UNKNOWN with the reason.
fn summary(mut samples: Vec<f64>, what: &str) -> Value {
    if samples.is_empty() {
        return json!(format!("UNKNOWN(no iteration reached {what})"));
    }
    let mut rank = |p: f64| crate::stats::percentile(&mut samples, p);
    json!({ "median": rank(0.5), "p95": rank(0.95), "p99": rank(0.99), "n": samples.len() })
}

async fn run_provider(
    ctx: &BenchContext,
    id: &str,
    args: &LifecycleOptions,
    iterations: usize,
) -> Value {
    let provider = match ctx.provider(id) {
        Ok(provider) => provider,
        Err(err) => {
            return json!({ "provider": id, "mode": args.mode, "skipped": true, "skipReason": err.to_string() })
        }
    };
    let probe_token = format!("probe-{}", ctx.ledger.run_id());
    let started = Instant::now();
    let mut results: Vec<Iteration> = Vec::new();
    // The first iteration plants the probe; the rest check it.
    let first = iterate(
        ctx.clone(),
        provider.clone(),
        args.image.clone(),
        Some(probe_token.clone()),
    )
    .await;
    results.push(first);
    let concurrency = match args.mode.as_str() {
        "sequential" => 1,
        _ => args.concurrency.max(1),
    };
    let mut remaining = iterations.saturating_sub(1);
    while remaining > 0 {
        ctx.progress.say(&format!(
            "bench {id} ({}): {}/{iterations} iterations",
            args.mode,
            iterations - remaining
        ));
        let batch = remaining.min(concurrency);
        let mut set = tokio::task::JoinSet::new();
        for n in 0..batch {
            if args.mode == "staggered" && n > 0 {
                tokio::time::sleep(Duration::from_millis(args.stagger_ms)).await;
            }
            set.spawn(iterate(
                ctx.clone(),
                provider.clone(),
                args.image.clone(),
                Some(probe_token.clone()),
            ));
        }
        while let Some(done) = set.join_next().await {
            match done {
                Ok(iteration) => results.push(iteration),
                Err(e) => results.push(Iteration {
                    tti_ms: None,
                    error: Some(format!("iteration task failed: {e}")),
                    error_class: Some("unknown".into()),
                    phases: BTreeMap::new(),
                    cleanup: "failed",
                    sandbox_id: None,
                    reused: None,
                }),
            }
        }
        remaining -= batch;
    }
    let wall = ms(started.elapsed());
    let ok = results
        .iter()
        .filter(|r| r.error.is_none() && r.cleanup == "verified_gone")
        .count();
    let mut phase_summaries = serde_json::Map::new();
    for phase in PHASES {
        let samples: Vec<f64> = results
            .iter()
            .filter_map(|r| r.phases.get(phase).copied())
            .collect();
        phase_summaries.insert(phase.to_owned(), summary(samples, phase));
    }
    let checked: Vec<bool> = results.iter().skip(1).filter_map(|r| r.reused).collect();
    let mut cleanup = BTreeMap::<&str, usize>::new();
    for r in &results {
        *cleanup.entry(r.cleanup).or_default() += 1;
    }
    json!({
        "provider": id,
        "mode": args.mode,
        "concurrency": concurrency,
        "staggerDelayMs": (args.mode == "staggered").then_some(args.stagger_ms),
        "iterations": results,
        "summary": {
            "ttiMs": summary(results.iter().filter_map(|r| r.tti_ms).collect(), "first exec"),
            "phasesMs": phase_summaries,
        },
        "successRate": ok as f64 / results.len() as f64,
        "wallClockMs": wall,
        "cleanup": cleanup,
        "reuseProbe": if checked.is_empty() {
            json!("UNKNOWN(only one sandbox was created)")
        } else {
            json!({ "checked": checked.len(), "reused": checked.iter().filter(|r| **r).count() })
        },
    })
}

fn cell(value: &Value) -> String {
    match value {
        Value::Object(s) => format!(
            "{:.1} / {:.1} / {:.1}",
            s["median"].as_f64().unwrap_or(f64::NAN),
            s["p95"].as_f64().unwrap_or(f64::NAN),
            s["p99"].as_f64().unwrap_or(f64::NAN)
        ),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `berth bench PROVIDER…`.
pub async fn bench(ctx: BenchContext, args: LifecycleOptions) -> Result<Report> {
    let iterations = args.iterations.unwrap_or(10).max(1);
    let mut results = Vec::new();
    for id in &args.providers {
        results.push(run_provider(&ctx, id, &args, iterations).await);
    }
    let doc = json!({
        "version": "berth.bench/v1",
        "timestamp": chrono::Utc::now().to_rfc3339(),
        "environment": {
            "runtime": format!("berth {}", env!("CARGO_PKG_VERSION")),
            "platform": std::env::consts::OS,
            "arch": std::env::consts::ARCH,
        },
        "config": { "iterations": iterations, "mode": args.mode },
        "results": results,
    });
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&doc)? + "\n")?;
    }
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{:<10} {:<10} {:>4} {:>8}  {:<28} {:<28} {:<10} reuse",
        "provider",
        "mode",
        "n",
        "success",
        "tti ms (p50/p95/p99)",
        "verified gone ms (p50/p95/p99)",
        "cleanup"
    );
    for r in doc["results"].as_array().expect("results") {
        if r["skipped"] == true {
            let _ = writeln!(
                text,
                "{:<10} skipped: {}",
                r["provider"].as_str().unwrap_or(""),
                r["skipReason"].as_str().unwrap_or("")
            );
            continue;
        }
        let _ = writeln!(
            text,
            "{:<10} {:<10} {:>4} {:>7.0}%  {:<28} {:<28} {:<10} {}",
            r["provider"].as_str().unwrap_or(""),
            r["mode"].as_str().unwrap_or(""),
            r["iterations"].as_array().map(Vec::len).unwrap_or(0),
            r["successRate"].as_f64().unwrap_or(0.0) * 100.0,
            cell(&r["summary"]["ttiMs"]),
            cell(&r["summary"]["phasesMs"]["verified_gone"]),
            r["cleanup"]
                .as_object()
                .map(|c| c
                    .iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(","))
                .unwrap_or_default(),
            match &r["reuseProbe"] {
                Value::Object(p) => format!("{}/{} reused", p["reused"], p["checked"]),
                other => cell(other),
            }
        );
    }
    Ok(Report { json: doc, text })
}
