//! `berth bench host`: Berth against the raw substrate, measured in the same run.
//!
//! Samples alternate between the raw operation and Berth's so drift (other load on the machine)
//! hits both alike. Reported: median, p95 (nearest rank), min and sample count, plus the
//! median ratio and overhead.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use berth_contract::{ExecRequest, NativeId, Provider};
use serde::Serialize;
use serde_json::json;

use super::sandbox::destroy_tracked;
use crate::app::App;
use crate::cli::BenchArgs;
use crate::errors::code;
use crate::output::emit;

/// Exec-overhead targets over the raw substrate (median): host 2 ms, bwrap 3 ms.
fn target_overhead_ms(provider: &str) -> f64 {
    match provider {
        "bwrap" => 3.0,
        _ => 2.0,
    }
}

#[derive(Debug, Serialize)]
struct Summary {
    n: usize,
    median_ms: f64,
    p95_ms: f64,
    min_ms: f64,
}

fn summarize(samples: &mut [Duration]) -> Summary {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let rank = |p: f64| ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
    Summary {
        n: samples.len(),
        median_ms: ms(samples[rank(0.5)]),
        p95_ms: ms(samples[rank(0.95)]),
        min_ms: ms(samples[0]),
    }
}

#[derive(Debug, Serialize)]
struct Comparison {
    berth: Summary,
    raw: Summary,
    ratio_median: f64,
    overhead_median_ms: f64,
}

fn compare(berth: &mut [Duration], raw: &mut [Duration]) -> Comparison {
    let berth = summarize(berth);
    let raw = summarize(raw);
    Comparison {
        ratio_median: berth.median_ms / raw.median_ms,
        overhead_median_ms: berth.median_ms - raw.median_ms,
        berth,
        raw,
    }
}

/// The raw substrate for one exec of `true`, as the provider would start it.
#[derive(Debug)]
enum Raw {
    /// `true` spawned directly.
    Spawn,
    /// `bwrap <the provider's exact arguments> -- true`.
    Bwrap(berth_provider_bwrap::Bwrap),
}

impl Raw {
    fn for_provider(id: &str) -> Result<Raw> {
        Ok(match id {
            "bwrap" => Raw::Bwrap(berth_provider_bwrap::Bwrap::locate()?),
            _ => Raw::Spawn,
        })
    }

    fn command(&self, dir: &std::path::Path) -> Command {
        match self {
            Raw::Spawn => Command::new("true"),
            Raw::Bwrap(bwrap) => {
                let ctx = berth_local::LaunchContext {
                    sandbox: "raw",
                    workspace: dir,
                    cwd_in_sandbox: berth_provider_bwrap::WORKSPACE,
                    command: &berth_contract::Command::Argv(vec!["true".into()]),
                    network: berth_contract::NetworkMode::None,
                };
                let mut cmd = Command::new("/usr/bin/bwrap");
                cmd.args(bwrap.arguments(&ctx)).args(["--", "true"]);
                cmd
            }
        }
    }
}

/// The raw substrate for exec: spawn it with piped output and wait.
fn raw_spawn(raw: &Raw, dir: &std::path::Path) -> Result<Duration> {
    let started = Instant::now();
    let out = raw
        .command(dir)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()?;
    let took = started.elapsed();
    if !out.status.success() {
        bail!("raw `true` failed: {:?}", out.status);
    }
    Ok(took)
}

/// The raw substrate for a sandbox cycle: make a directory, spawn `true` in it, remove it.
fn raw_cycle(raw: &Raw, root: &std::path::Path, n: usize) -> Result<Duration> {
    let started = Instant::now();
    let dir = root.join(format!("raw-{n}"));
    std::fs::create_dir(&dir)?;
    raw_spawn(raw, &dir)?;
    std::fs::remove_dir_all(&dir)?;
    Ok(started.elapsed())
}

async fn exec_true(provider: &dyn Provider, id: &NativeId) -> Result<Duration> {
    let started = Instant::now();
    let out = provider.exec(id, &ExecRequest::argv(["true"])).await?;
    let took = started.elapsed();
    if !out.status.success() {
        bail!("berth exec `true` returned {}", out.status);
    }
    Ok(took)
}

/// `berth bench host`.
pub async fn bench(app: &App, args: BenchArgs) -> Result<i32> {
    let iterations = args.iterations.max(5);
    let provider = app.provider(&args.provider)?;
    let raw = Raw::for_provider(&args.provider)?;
    let scratch = tempfile::Builder::new()
        .prefix("berth-bench-raw-")
        .tempdir_in(&app.config.home)?;

    // Exec round trip on one live sandbox.
    let tracked = app
        .ledger
        .create_tracked(
            provider.as_ref(),
            "bench",
            None,
            |_| {},
            |req| {
                let provider = provider.clone();
                async move { provider.create(&req).await }
            },
        )
        .await?;
    let id = NativeId(tracked.native_id.clone());
    for _ in 0..5 {
        exec_true(provider.as_ref(), &id).await?;
        raw_spawn(&raw, scratch.path())?;
    }
    let (mut berth_exec, mut raw_exec) = (Vec::new(), Vec::new());
    for _ in 0..iterations {
        raw_exec.push(raw_spawn(&raw, scratch.path())?);
        berth_exec.push(exec_true(provider.as_ref(), &id).await?);
    }
    destroy_tracked(app, provider.as_ref(), &tracked).await?;

    // Full cycle: create (ledger intent + record) → first exec → destroy (verified gone).
    let cycles = (iterations / 4).max(5);
    let (mut berth_cycle, mut raw_cycles) = (Vec::new(), Vec::new());
    for n in 0..cycles {
        raw_cycles.push(raw_cycle(&raw, scratch.path(), n)?);
        let started = Instant::now();
        let tracked = app
            .ledger
            .create_tracked(
                provider.as_ref(),
                "bench",
                None,
                |_| {},
                |req| {
                    let provider = provider.clone();
                    async move { provider.create(&req).await }
                },
            )
            .await?;
        exec_true(provider.as_ref(), &NativeId(tracked.native_id.clone())).await?;
        destroy_tracked(app, provider.as_ref(), &tracked).await?;
        berth_cycle.push(started.elapsed());
    }

    let exec = compare(&mut berth_exec, &mut raw_exec);
    let cycle = compare(&mut berth_cycle, &mut raw_cycles);
    let target = target_overhead_ms(&args.provider);
    let meets = exec.overhead_median_ms <= target;
    if app.json {
        emit(
            "bench",
            json!({
                "provider": args.provider,
                "exec_round_trip": exec,
                "exec_target_overhead_ms": target,
                "exec_meets_target": meets,
                "create_exec_destroy_cycle": cycle,
                "notes": "raw exec = the provider's own launch of `true` (host: spawn; bwrap: bwrap with the provider's exact arguments) with piped output; raw cycle = mkdir + raw exec + rm. Berth's cycle includes its durable SQLite ledger writes (intent, created, destroy requested, verified gone).",
            }),
        );
    } else {
        let line = |name: &str, c: &Comparison| {
            println!(
                "{name:<28} berth median {:>7.3} ms p95 {:>7.3} ms (n={}) | raw median {:>7.3} ms p95 {:>7.3} ms (n={}) | ratio {:.2}x, overhead {:+.3} ms",
                c.berth.median_ms, c.berth.p95_ms, c.berth.n, c.raw.median_ms, c.raw.p95_ms, c.raw.n,
                c.ratio_median, c.overhead_median_ms
            )
        };
        line("exec `true` round trip", &exec);
        line("create→exec→destroy cycle", &cycle);
        println!(
            "target: exec overhead ≤ {target} ms over the raw substrate (median): {}",
            if meets { "met" } else { "NOT met" }
        );
    }
    Ok(code::OK)
}
