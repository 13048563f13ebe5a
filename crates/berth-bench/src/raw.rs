//! `berth bench PROVIDER --raw`: Berth against its baselines, measured in the same run.
//!
//! Samples interleave Berth and its baselines, each round in another of their possible orders,
//! so drift (other load on the machine) hits all alike and each measurement follows each other
//! equally often (none always follows the heaviest). Reported: median, p95 (nearest rank), min
//! and sample count, plus the median ratio and overhead with their 95% intervals (a target is
//! met or not only when the interval says so; see `stats::Verdict`). Every baseline is
//! labelled for what it is:
//! - **own mechanism** (Berth's overhead): docker exec — the same supervisor request and frames
//!   sent straight to the sandbox's socket, without Berth's checks; cycle — the same adapter
//!   calls without the durable ledger.
//! - **other tools' mechanism** (a comparison): host — `true` spawned directly; bwrap — the same
//!   `bwrap` binary with the provider's exact arguments, run directly; docker — the Engine API's
//!   own exec (create, start, inspect) on a container of the same image, and for the cycle the
//!   raw API sequence create → start → exec → force-delete.
//! - **the CLI as a whole process** (what a user pays): `berth exec ID -- true`, process start
//!   to exit.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::fmt::Write as _;

use crate::{bail, BenchContext, BenchError, Report, Result, WithContext};

/// What to measure (`berth bench P --raw`).
#[derive(Debug, Clone)]
pub struct RawOptions {
    /// Exactly one provider.
    pub providers: Vec<String>,
    /// Samples per measurement (default 200).
    pub iterations: Option<usize>,
    /// Image for providers that need one.
    pub image: Option<String>,
}
use berth_contract::{ExecRequest, NativeId, Provider};
use berth_provider_docker::Engine;
use hyper::Method;
use serde_json::json;

use crate::stats::{compare, Comparison, Verdict};
use crate::{berth_create_tracked, destroy_tracked};

/// Exec targets over the raw substrate (median), from the issues: host ≤ 2 ms over a raw spawn,
/// bwrap ≤ 3 ms over a raw bwrap; docker: an absolute ≤ 5 ms round trip.
fn exec_target(provider: &str) -> (&'static str, f64) {
    match provider {
        "bwrap" => ("overhead_ms", 3.0),
        "docker" => ("round_trip_ms", 5.0),
        _ => ("overhead_ms", 2.0),
    }
}

/// The docker cycle target: create → ready → first exec → destroy within 1.15× the raw API.
const DOCKER_CYCLE_RATIO: f64 = 1.15;
/// Host and bwrap: a cycle within 2 ms of the raw substrate's (mkdir, spawn or bwrap, rm).
const LOCAL_CYCLE_OVERHEAD_MS: f64 = 2.0;
/// Berth's exec over its own bare mechanism (docker: the same supervisor frames): ≤ +1 ms.
const OWN_EXEC_OVERHEAD_MS: f64 = 1.0;
/// Berth's cycle over the same adapter calls without the ledger: ≤ 1.1×.
const OWN_CYCLE_RATIO: f64 = 1.1;
/// `berth exec ID -- true` as a whole process: ≤ 4 ms (median).
const CLI_EXEC_MS: f64 = 4.0;

/// The raw substrate of one provider.
#[derive(Debug)]
enum Raw {
    Spawn,
    Bwrap(berth_provider_bwrap::Bwrap),
    Docker { engine: Engine, image: String },
}

impl Raw {
    fn for_provider(id: &str, image: Option<&str>, ctx: &BenchContext) -> Result<Raw> {
        Ok(match id {
            // bwrap run directly as the calling user (as root: without Berth's unprivileged
            // entry), with the arguments Berth would give it.
            "bwrap" => Raw::Bwrap(berth_provider_bwrap::Bwrap::direct()?),
            "docker" => {
                let image = image.ok_or_else(|| {
                    BenchError::Invalid(
                        "bench docker needs --image (e.g. `berth bench docker --image \
                         berth/agent:bookworm`)"
                            .into(),
                    )
                })?;
                let socket = berth_provider_docker::engine::socket_from_docker_host(
                    ctx.provider_config.env.get("DOCKER_HOST"),
                )?;
                Raw::Docker {
                    engine: Engine::new(&socket),
                    image: image.to_owned(),
                }
            }
            _ => Raw::Spawn,
        })
    }

    fn spawn_command(&self, dir: &std::path::Path) -> Command {
        match self {
            Raw::Bwrap(bwrap) => {
                let ctx = berth_local::LaunchContext {
                    sandbox: "raw",
                    workspace: dir,
                    cwd_in_sandbox: berth_provider_bwrap::WORKSPACE,
                    command: &berth_contract::Command::Argv(vec!["true".into()]),
                    network: berth_contract::NetworkMode::None,
                    terminal: false,
                };
                let mut cmd = Command::new(bwrap.program());
                cmd.args(bwrap.arguments(&ctx)).args(["--", "true"]);
                cmd
            }
            _ => Command::new("true"),
        }
    }

    /// One raw exec of `true` in `target` (a directory, or a container name).
    async fn exec(&self, target: &str) -> Result<Duration> {
        let started = Instant::now();
        match self {
            Raw::Docker { engine, .. } => {
                docker_exec(engine, target).await?;
            }
            _ => {
                let out = self
                    .spawn_command(std::path::Path::new(target))
                    .current_dir(target)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .output()?;
                if !out.status.success() {
                    bail!("raw `true` failed: {:?}", out.status);
                }
            }
        }
        Ok(started.elapsed())
    }

    /// The raw counterpart of a sandbox: a directory, or a plain container of the same image.
    async fn make_target(
        &self,
        root: &std::path::Path,
        n: usize,
        ctx: &BenchContext,
    ) -> Result<String> {
        match self {
            Raw::Docker { engine, image } => {
                let name = format!("berth-bench-raw-{}-{n}", std::process::id());
                // Labelled for this owner, so a killed bench leaves nothing a sweep cannot find.
                let body = json!({
                    "Image": image,
                    "Cmd": ["sleep", "infinity"],
                    "Labels": {
                        "berth.owner": ctx.ledger.owner(),
                        "berth.run": ctx.ledger.run_id(),
                        "berth.ledger": format!("bench-raw-{n}"),
                        "berth.sandbox": name,
                    },
                    "HostConfig": { "Init": true, "NetworkMode": "none" },
                });
                let _: serde_json::Value = engine
                    .json(
                        Method::POST,
                        &format!("/containers/create?name={name}"),
                        Some(body),
                    )
                    .await?;
                engine
                    .expect(
                        Method::POST,
                        &format!("/containers/{name}/start"),
                        None,
                        &[],
                    )
                    .await?;
                Ok(name)
            }
            _ => {
                let dir = root.join(format!("raw-{n}"));
                std::fs::create_dir_all(&dir)?;
                Ok(dir.to_string_lossy().into_owned())
            }
        }
    }

    async fn remove_target(&self, target: &str) -> Result<()> {
        match self {
            Raw::Docker { engine, .. } => {
                engine
                    .expect(
                        Method::DELETE,
                        &format!("/containers/{target}?force=true&v=true"),
                        None,
                        &[hyper::StatusCode::NOT_FOUND],
                    )
                    .await?;
            }
            _ => std::fs::remove_dir_all(target)?,
        }
        Ok(())
    }
}

/// The Engine API's own exec: create, start (output streamed to completion), inspect.
async fn docker_exec(engine: &Engine, container: &str) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Created {
        #[serde(rename = "Id")]
        id: String,
    }
    #[derive(serde::Deserialize)]
    struct Inspected {
        #[serde(rename = "ExitCode")]
        exit_code: Option<i64>,
        #[serde(rename = "Running")]
        running: bool,
    }
    let created: Created = engine
        .json(
            Method::POST,
            &format!("/containers/{container}/exec"),
            Some(json!({ "AttachStdout": true, "AttachStderr": true, "Cmd": ["true"] })),
        )
        .await?;
    engine
        .expect(
            Method::POST,
            &format!("/exec/{}/start", created.id),
            Some((
                "application/json",
                serde_json::to_vec(&json!({ "Detach": false, "Tty": false }))?,
            )),
            &[],
        )
        .await?;
    let inspected: Inspected = engine
        .json(Method::GET, &format!("/exec/{}/json", created.id), None)
        .await?;
    if inspected.running || inspected.exit_code != Some(0) {
        bail!("raw docker exec of `true` did not exit 0");
    }
    Ok(())
}

async fn berth_exec(provider: &dyn Provider, id: &NativeId) -> Result<Duration> {
    let started = Instant::now();
    let out = provider.exec(id, &ExecRequest::argv(["true"])).await?;
    let took = started.elapsed();
    if !out.status.success() {
        bail!("berth exec `true` returned {}", out.status);
    }
    Ok(took)
}

/// `berth bench PROVIDER --raw`.
pub async fn bench(ctx: &BenchContext, args: RawOptions) -> Result<Report> {
    let [provider_id] = args.providers.as_slice() else {
        return Err(BenchError::Invalid(
            "`--raw` measures one provider at a time (e.g. `berth bench host --raw`)".into(),
        ));
    };
    let iterations = args.iterations.unwrap_or(200).max(5);
    let provider = ctx.provider(provider_id)?;
    let raw = Raw::for_provider(provider_id, args.image.as_deref(), ctx)?;
    let scratch = tempfile::Builder::new()
        .prefix("berth-bench-raw-")
        .tempdir_in(&ctx.home)?;
    let image = args.image.as_deref();

    // Exec round trip on one live sandbox and one raw target; docker also against its own bare
    // supervisor exchange; and the CLI as a whole process.
    let tracked = berth_create_tracked(ctx, &provider, image).await?;
    let id = NativeId(tracked.native_id.clone());
    let target = raw.make_target(scratch.path(), 0, ctx).await?;
    let bare = match provider_id.as_str() {
        "docker" => {
            let docker = berth_factory::docker(&ctx.provider_config)?;
            let socket = docker.supervisor_socket(&id).await?;
            Some((docker, socket))
        }
        _ => None,
    };
    let measured = async {
        for _ in 0..5 {
            berth_exec(provider.as_ref(), &id).await?;
            raw.exec(&target).await?;
        }
        let (mut berth, mut raw_samples, mut bare_samples) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..iterations {
            if i % 10 == 0 {
                ctx.progress.say(&format!(
                    "bench {provider_id} --raw: exec samples {i}/{iterations}"
                ));
            }
            // Every order in turn, so no measurement always follows the heaviest one (an
            // Engine exec leaves the machine busy for a moment after it returns).
            for turn in crate::stats::order_of_three(i) {
                match turn {
                    0 => raw_samples.push(raw.exec(&target).await?),
                    1 => berth.push(berth_exec(provider.as_ref(), &id).await?),
                    _ => {
                        if let Some((docker, socket)) = &bare {
                            let started = Instant::now();
                            docker.bare_exec(socket, &["true"]).await?;
                            bare_samples.push(started.elapsed());
                        }
                    }
                }
            }
        }
        let own =
            (!bare_samples.is_empty()).then(|| compare(&mut berth.clone(), &mut bare_samples));
        let cli = cli_exec(
            ctx,
            provider.as_ref(),
            &id,
            &tracked.berth_id,
            (iterations / 4).clamp(5, 50),
        )
        .await?;
        Ok::<_, crate::BenchError>((compare(&mut berth, &mut raw_samples), own, cli))
    }
    .await;
    raw.remove_target(&target).await?;
    destroy_tracked(ctx, provider.as_ref(), &tracked).await?;
    let (exec, own_exec, cli) = measured.context("exec round trip")?;

    // Full cycle: create (durable ledger intent + record) → ready → first exec → destroy
    // (verified gone), against the raw sequence.
    let cycles = (iterations / 4).max(5);
    let (mut berth_cycle, mut raw_cycle, mut bare_cycle) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..cycles {
        ctx.progress
            .say(&format!("bench {provider_id} --raw: cycles {n}/{cycles}"));
        for turn in crate::stats::order_of_three(n) {
            match turn {
                0 => {
                    let started = Instant::now();
                    let target = raw.make_target(scratch.path(), n + 1, ctx).await?;
                    raw.exec(&target).await?;
                    raw.remove_target(&target).await?;
                    raw_cycle.push(started.elapsed());
                }
                1 => {
                    let started = Instant::now();
                    let tracked = berth_create_tracked(ctx, &provider, image).await?;
                    berth_exec(provider.as_ref(), &NativeId(tracked.native_id.clone())).await?;
                    destroy_tracked(ctx, provider.as_ref(), &tracked).await?;
                    berth_cycle.push(started.elapsed());
                }
                _ => bare_cycle.push(bare_cycle_once(ctx, &provider, image, n).await?),
            }
        }
    }
    let cycle = compare(&mut berth_cycle.clone(), &mut raw_cycle);
    let own_cycle = compare(&mut berth_cycle, &mut bare_cycle);

    let (target_kind, target_ms) = exec_target(provider_id);
    let exec_interval = match target_kind {
        "round_trip_ms" => exec.berth.median_interval_ms,
        _ => exec.overhead_interval_ms,
    };
    let exec_verdict = Verdict::at_most(exec_interval, target_ms);
    let cycle_verdict = match provider_id.as_str() {
        "docker" => Verdict::at_most(cycle.ratio_interval, DOCKER_CYCLE_RATIO),
        _ => Verdict::at_most(cycle.overhead_interval_ms, LOCAL_CYCLE_OVERHEAD_MS),
    };
    let own_exec_verdict = own_exec
        .as_ref()
        .map(|c| Verdict::at_most(c.overhead_interval_ms, OWN_EXEC_OVERHEAD_MS));
    let own_cycle_verdict = Verdict::at_most(own_cycle.ratio_interval, OWN_CYCLE_RATIO);
    let CliExec { exec: cli, floor } = cli;
    let cli_verdict = Verdict::at_most(cli.berth.median_interval_ms, CLI_EXEC_MS);
    let doc = json!({
        "provider": provider_id,
        "exec_round_trip": exec,
        "exec_target": { target_kind: target_ms, "met": exec_verdict.met(), "verdict": exec_verdict },
        "create_exec_destroy_cycle": cycle,
        "cycle_target": match provider_id.as_str() {
            "docker" => json!({ "ratio": DOCKER_CYCLE_RATIO, "met": cycle_verdict.met(), "verdict": cycle_verdict }),
            _ => json!({ "overhead_ms": LOCAL_CYCLE_OVERHEAD_MS, "met": cycle_verdict.met(), "verdict": cycle_verdict }),
        },
        "own_mechanism": {
            "exec": own_exec,
            "exec_target": own_exec_verdict.map(|v| json!({ "overhead_ms": OWN_EXEC_OVERHEAD_MS, "met": v.met(), "verdict": v })),
            "cycle": own_cycle,
            "cycle_target": { "ratio": OWN_CYCLE_RATIO, "met": own_cycle_verdict.met(), "verdict": own_cycle_verdict },
        },
        "cli_process": {
            "exec": cli.berth,
            "in_process_exec": cli.raw,
            "startup_ms": cli.overhead_median_ms,
            "binary_floor": floor,
            "target": { "median_ms": CLI_EXEC_MS, "met": cli_verdict.met(), "verdict": cli_verdict },
        },
        "notes": "raw = the mechanism other tools use (host: spawn `true`; bwrap: the same bwrap binary with the provider's exact arguments; docker: Engine API exec create/start/inspect, cycle = API create/start/exec/force-delete): a comparison, not Berth's overhead. own_mechanism = Berth's overhead over its own mechanism (docker exec: the same supervisor frames straight to the socket, no checks; cycle: the same adapter calls without the durable ledger). cli_process = `berth exec ID -- true` as a whole process; startup_ms = its median minus the same exec's in-process median; binary_floor = `berth --version` as a process (the binary starting and exiting, no work: under every berth command); the three sampled in every order in turn in the same run. Every target's verdict is judged on the figure's 95% interval (percentile bootstrap): met only when the whole interval is within the target, not met only when it is wholly beyond; otherwise null (this run cannot tell).",
    });
    let mut text = String::new();
    {
        let line = |name: &str, c: &Comparison| {
            format!(
                "{name:<28} berth median {:>8.3} ms p95 {:>8.3} ms (n={}) | raw median {:>8.3} ms p95 {:>8.3} ms (n={}) | ratio {:.2}x, overhead {:+.3} ms",
                c.berth.median_ms, c.berth.p95_ms, c.berth.n, c.raw.median_ms, c.raw.p95_ms, c.raw.n,
                c.ratio_median, c.overhead_median_ms
            )
        };
        let _ = writeln!(
            text,
            "-- Berth's overhead over its own mechanism (the same work without Berth's layers)"
        );
        if let Some(own) = &own_exec {
            let _ = writeln!(
                text,
                "   (raw = the same supervisor frames sent straight to the socket)"
            );
            let _ = writeln!(text, "{}", line("exec `true` round trip", own));
            let _ = writeln!(
                text,
                "target: exec overhead ≤ {OWN_EXEC_OVERHEAD_MS} ms over the bare supervisor exchange (median): {}",
                own_exec_verdict
                    .map(|v| v.describe(own.overhead_interval_ms, " ms"))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(
            text,
            "   (raw = the same adapter calls without the durable ledger)"
        );
        let _ = writeln!(text, "{}", line("create→exec→destroy cycle", &own_cycle));
        let _ = writeln!(
            text,
            "target: cycle ≤ {OWN_CYCLE_RATIO}× the same calls without the ledger (median): {}",
            own_cycle_verdict.describe(own_cycle.ratio_interval, "x")
        );
        let _ = writeln!(
            text,
            "-- compared with the mechanism other tools use (not Berth's overhead)"
        );
        let _ = writeln!(text, "{}", line("exec `true` round trip", &exec));
        let _ = writeln!(text, "{}", line("create→exec→destroy cycle", &cycle));
        let _ = match target_kind {
            "round_trip_ms" => writeln!(
                text,
                "target: exec round trip ≤ {target_ms} ms (median): {}",
                exec_verdict.describe(exec_interval, " ms")
            ),
            _ => writeln!(
                text,
                "target: exec overhead ≤ {target_ms} ms over the raw substrate (median): {}",
                exec_verdict.describe(exec_interval, " ms")
            ),
        };
        if provider_id == "docker" {
            let _ = writeln!(text, "target: create→first exec→destroy ≤ {DOCKER_CYCLE_RATIO}× the raw API sequence (median): {}", cycle_verdict.describe(cycle.ratio_interval, "x"));
        } else {
            let _ = writeln!(text, "target: create→exec→destroy overhead ≤ {LOCAL_CYCLE_OVERHEAD_MS} ms over the raw substrate's cycle (median): {}", cycle_verdict.describe(cycle.overhead_interval_ms, " ms"));
        }
        let _ = writeln!(text, "-- the CLI as a whole process (what a user pays)");
        let _ = writeln!(
            text,
            "{:<28} median {:>8.3} ms p95 {:>8.3} ms (n={}) | the same exec in-process {:.3} ms: start-up {:+.3} ms",
            "`berth exec ID -- true`", cli.berth.median_ms, cli.berth.p95_ms, cli.berth.n,
            cli.raw.median_ms, cli.overhead_median_ms
        );
        let _ = writeln!(
            text,
            "{:<28} median {:>8.3} ms p95 {:>8.3} ms (n={}) | the binary starting and exiting: start-up beyond it {:+.3} ms",
            "`berth --version`", floor.median_ms, floor.p95_ms, floor.n,
            cli.overhead_median_ms - floor.median_ms
        );
        let _ = writeln!(
            text,
            "target: `berth exec` ≤ {CLI_EXEC_MS} ms as a process (median): {}",
            cli_verdict.describe(cli.berth.median_interval_ms, " ms")
        );
    }
    Ok(Report { json: doc, text })
}

/// `berth exec ID -- true` as a whole process.
struct CliExec {
    /// The process against the same exec in-process (same run): its start-up cost.
    exec: Comparison,
    /// `berth --version` as a process: this binary starting and exiting with no work, the
    /// floor under every `berth` command on this machine.
    floor: crate::stats::Summary,
}

/// `berth exec ID -- true` as a separate process, `n` times (after one warm-up), taking turns
/// in every order with the same exec in-process and with `berth --version` (the binary's
/// floor).
async fn cli_exec(
    ctx: &BenchContext,
    provider: &dyn Provider,
    native: &NativeId,
    berth_id: &str,
    n: usize,
) -> Result<CliExec> {
    let run = |args: &[&str]| -> Result<Duration> {
        let started = Instant::now();
        let status = Command::new(&ctx.berth)
            .env("BERTH_HOME", &ctx.home)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        let took = started.elapsed();
        if !status.success() {
            bail!("`berth {}` exited {status}", args.join(" "));
        }
        Ok(took)
    };
    let exec_args = ["exec", berth_id, "--", "true"];
    run(&exec_args)?;
    run(&["--version"])?;
    let (mut process, mut in_process, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        for turn in crate::stats::order_of_three(i) {
            match turn {
                0 => process.push(run(&exec_args)?),
                1 => in_process.push(berth_exec(provider, native).await?),
                _ => floor.push(run(&["--version"])?),
            }
        }
    }
    Ok(CliExec {
        exec: compare(&mut process, &mut in_process),
        floor: crate::stats::summarize(&mut floor),
    })
}

/// The same adapter calls as Berth's cycle — create, exec `true`, destroy — straight on the
/// adapter, without the ledger's durable rows.
async fn bare_cycle_once(
    ctx: &BenchContext,
    provider: &std::sync::Arc<dyn Provider>,
    image: Option<&str>,
    n: usize,
) -> Result<Duration> {
    let name = format!("bx-bare-{}-{n}", std::process::id());
    let mut req = berth_contract::CreateRequest::new(
        berth_contract::SandboxName(name.clone()),
        berth_contract::Labels {
            owner: ctx.ledger.owner().to_owned(),
            run_id: ctx.ledger.run_id().to_owned(),
            ledger_token: format!("bare-{n}"),
            expires_at_unix: None,
        },
    );
    req.image = image.map(str::to_owned);
    let started = Instant::now();
    let id = provider.create(&req).await?.native_id;
    let ran = provider.exec(&id, &ExecRequest::argv(["true"])).await;
    let destroyed = provider.destroy(&id).await;
    let took = started.elapsed();
    if !ran?.status.success() {
        bail!("bare cycle: `true` failed");
    }
    match destroyed? {
        berth_contract::DestroyOutcome::VerifiedGone { .. } => Ok(took),
        other => bail!("bare cycle: destroy ended {other:?}"),
    }
}
