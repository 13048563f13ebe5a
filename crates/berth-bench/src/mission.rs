//! `berth mission bench`: the mission control plane, measured.
//!
//! Overhead per attempt = a no-op attempt through the mission pipeline (authority, durable
//! events and facts, ledger rows, recovery checks) minus the same provider operations done
//! directly — create, write the repository bundle, stage, run `true`, the capture archive, a
//! commit and its bundle (in the sandbox, where a hand-rolled script makes them; the pipeline
//! makes them on the host), a second sandbox for the validator staged with that bundle, the
//! validator and its evidence, a snapshot, the attempt's files copied into a directory with
//! their checksums (the pipeline publishes its artifact bundle), destroy both — measured in
//! the same run on the host
//! provider. The same is measured in a mission of several tasks, where an attempt shares the
//! mission's own work (its work repository, lease and final state) with the others: the
//! mission's wall time minus as many raw attempts, per task. Throughput is accepted attempts per second with N missions running
//! at once, every step committed (intents at SQLite `synchronous=FULL`, steps at `NORMAL`; see
//! `berth-store`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::fmt::Write as _;

use crate::stats::Verdict;
use crate::{bail, BenchContext, Report, Result, WithContext};
use berth_contract::{ExecRequest, NativeId, Provider, ProviderExt};
use berth_mission::authority::MissionState;
use serde_json::json;

/// The control-plane target (issue 10): at most 5 ms per attempt (median).
const TARGET_OVERHEAD_MS: f64 = 5.0;

/// The phases of one accepted attempt, as the pipeline steps through them (one durable step
/// each) and as the raw path does the same provider work: claiming it; making the sandbox and
/// staging the repository; the agent; capturing the workspace and committing it; the validator
/// in a fresh sandbox staged with that commit, and removing that sandbox; the checkpoint, the
/// attempt's evidence and removing its sandbox; the mission's end.
const PHASES: [&str; 7] = [
    "claim",
    "stage",
    "agent",
    "capture",
    "validate",
    "checkpoint",
    "finish",
];

/// Tasks in the several-task mission: its per-mission work (the work repository, the lease,
/// the final state) is shared by this many attempts, as in a real mission.
const TASKS_PER_MISSION: usize = 5;

fn write_fixture(dir: &Path, tasks: usize) -> Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir.join("repo"))?;
    std::fs::write(dir.join("repo/README"), "bench\n")?;
    let mut text = String::from(
        r#"schema_version = 1
name = "bench"
[repository]
path = "repo"
base = "snapshot"
[sandbox]
provider = "host"
[harness]
kind = "script"
command = "true"
"#,
    );
    for n in 0..tasks {
        let _ = write!(
            text,
            r#"
[[tasks]]
id = "noop{n}"
instructions = "nothing"
max_attempts = 1
agent_timeout = "30s"
[tasks.validator]
command = "echo ok > .berth-out"
timeout = "30s"
evidence = [".berth-out"]
"#
        );
    }
    let file = dir.join(format!("mission-{tasks}.toml"));
    std::fs::write(&file, text)?;
    Ok(file)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Median and p95 of at least one sample.
fn median(samples: &mut [f64]) -> f64 {
    crate::stats::median(samples).unwrap_or(f64::NAN)
}

fn p95(samples: &mut [f64]) -> f64 {
    crate::stats::percentile(samples, 0.95).unwrap_or(f64::NAN)
}

async fn sh(provider: &dyn Provider, id: &NativeId, line: &str, cwd: Option<&str>) -> Result<()> {
    let mut req = ExecRequest::shell(line);
    req.cwd = cwd.map(str::to_owned);
    let out = provider.exec(id, &req).await?;
    if !out.status.success() {
        bail!("`{line}`: {}", out.status);
    }
    Ok(())
}

/// The pipeline's own staging command: clone the bundle, check out `commit`.
async fn stage(provider: &dyn Provider, id: &NativeId, commit: &str) -> Result<()> {
    let req = ExecRequest::shell(berth_orchestrator::STAGE_SCRIPT).with_env("BERTH_COMMIT", commit);
    let out = provider.exec(id, &req).await?;
    if !out.status.success() {
        bail!("staging: {}", out.status);
    }
    Ok(())
}

/// The provider operations of one attempt, without the control plane: the whole, and each
/// phase of [`PHASES`].
async fn raw_attempt(
    ctx: &BenchContext,
    provider: &Arc<dyn Provider>,
    bundle: &[u8],
    base: &str,
    evidence: &Path,
    n: usize,
) -> Result<(Duration, Vec<f64>)> {
    let started = Instant::now();
    let mut laps = Laps::new(started);
    laps.lap(); // claim: nothing to do without a control plane
    let labels = berth_contract::Labels {
        owner: ctx.ledger.owner().to_owned(),
        run_id: ctx.ledger.run_id().to_owned(),
        ledger_token: format!("raw-{n}"),
        expires_at_unix: None,
    };
    let name = format!("bx-rawbench-{}-{n}", std::process::id());
    let req = berth_contract::CreateRequest::new(
        berth_contract::SandboxName(name.clone()),
        labels.clone(),
    );
    let id = provider.create(&req).await?.native_id;
    let files = provider.require_files()?;
    files.write(&id, ".berth-input.bundle", bundle).await?;
    stage(provider.as_ref(), &id, base).await?;
    laps.lap();
    sh(provider.as_ref(), &id, "true", Some("repo")).await?;
    laps.lap();
    // The capture: the same archive exec the pipeline runs.
    let mut capture = ExecRequest::shell(berth_orchestrator::CAPTURE_SCRIPT);
    capture.cwd = Some("repo".into());
    capture.max_output_bytes = 256 << 20;
    let out = provider.exec(&id, &capture).await?;
    if !out.status.success() {
        bail!("capture: {}", out.status);
    }
    let captured = out.stdout;
    // The commit and its bundle, done where a hand-rolled script does them (in the sandbox);
    // the pipeline does the same work on the host.
    let mut commit = ExecRequest::shell(
        "git add -A && git -c user.name=b -c user.email=b@l commit -q --allow-empty -m x && git bundle create -q ../.berth-output.bundle HEAD && git rev-parse HEAD",
    );
    commit.cwd = Some("repo".into());
    let out = provider.exec(&id, &commit).await?;
    if !out.status.success() {
        bail!("commit: {}", out.status);
    }
    let made = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let committed = files.read(&id, ".berth-output.bundle").await?;
    laps.lap();
    // The validator's clean sandbox, staged with the commit.
    let frozen_req = berth_contract::CreateRequest::new(
        berth_contract::SandboxName(format!("{name}-v")),
        labels,
    );
    let frozen = provider.create(&frozen_req).await?.native_id;
    files
        .write(&frozen, ".berth-input.bundle", &committed)
        .await?;
    stage(provider.as_ref(), &frozen, &made).await?;
    sh(
        provider.as_ref(),
        &frozen,
        "echo ok > .berth-out",
        Some("repo"),
    )
    .await?;
    let verdict = files.read(&frozen, "repo/.berth-out").await?;
    // Removed once judged, as the pipeline does.
    provider.destroy(&frozen).await?;
    laps.lap();
    provider.require_snapshots()?.snapshot(&id).await?;
    // The attempt's evidence kept the way a script would: the files copied into a directory
    // with their checksums (the pipeline publishes a bundle: redacted, hashed, indexed).
    let kept = evidence.join(format!("attempt-{n}"));
    std::fs::create_dir_all(&kept)?;
    let mut sums = String::new();
    for (name, bytes) in [
        ("capture.tar", captured.as_slice()),
        ("repo.bundle", committed.as_slice()),
        ("verdict", verdict.as_slice()),
    ] {
        std::fs::write(kept.join(name), bytes)?;
        use sha2::Digest;
        let _ = writeln!(sums, "{}  {name}", hex::encode(sha2::Sha256::digest(bytes)));
    }
    std::fs::write(kept.join("SHA256SUMS"), sums)?;
    provider.destroy(&id).await?;
    laps.lap();
    laps.lap(); // finish: nothing to do without a control plane
    Ok((started.elapsed(), laps.phases))
}

/// Phase durations in milliseconds, each from the end of the one before.
struct Laps {
    last: Instant,
    phases: Vec<f64>,
}

impl Laps {
    fn new(started: Instant) -> Self {
        Laps {
            last: started,
            phases: Vec::new(),
        }
    }

    fn lap(&mut self) {
        let now = Instant::now();
        self.phases.push(ms(now - self.last));
        self.last = now;
    }
}

/// One mission through the pipeline, one accepted attempt per task. Registration (bundling the
/// repository) is not part of an attempt and is not timed.
/// Returns the whole and the time of each step the runner reports (for one task: the phases of
/// [`PHASES`]).
async fn mission_run(ctx: &BenchContext, file: &Path) -> Result<(Duration, Vec<f64>)> {
    let orch = crate::orchestrator(ctx);
    let id = orch.create(file).await?;
    let started = Instant::now();
    let mut laps = Laps::new(started);
    let state = orch.run(&id, &mut |_| laps.lap()).await?;
    if state != MissionState::Succeeded {
        bail!("bench mission {id} ended {state:?}");
    }
    Ok((started.elapsed(), laps.phases))
}

/// `berth mission bench`.
pub async fn bench(ctx: BenchContext, attempts: usize, concurrency: Vec<usize>) -> Result<Report> {
    let attempts = attempts.max(3);
    let scratch = tempfile::Builder::new()
        .prefix("berth-mission-bench-")
        .tempdir_in(&ctx.home)?;
    let file = write_fixture(scratch.path(), 1)?;
    let several = write_fixture(scratch.path(), TASKS_PER_MISSION)?;
    let provider = ctx.provider("host")?;
    // The raw path stages the same kind of bundle the mission makes.
    let probe = crate::orchestrator(&ctx).create(&file).await?;
    let (spec, _, _) = crate::orchestrator(&ctx).load(&probe).await?;
    let bundle = std::fs::read(&spec.base_bundle).context("read the bench bundle")?;
    let base = spec.base_commit.clone();
    let evidence = scratch.path().join("raw-evidence");

    let (mut raw, mut through) = (Vec::new(), Vec::new());
    // Per phase: each pair's difference, and each side.
    let mut phase_pairs = vec![Vec::new(); PHASES.len()];
    let mut phase_sides = vec![(Vec::new(), Vec::new()); PHASES.len()];
    for n in 0..attempts {
        ctx.progress
            .say(&format!("mission bench: paired attempts {n}/{attempts}"));
        // Which of the pair goes first alternates, so neither always follows the other.
        let raw_first = n % 2 == 0;
        let mut raw_run = None;
        if raw_first {
            raw_run = Some(raw_attempt(&ctx, &provider, &bundle, &base, &evidence, n).await?);
        }
        let (mission, mission_phases) = mission_run(&ctx, &file).await?;
        if !raw_first {
            raw_run = Some(raw_attempt(&ctx, &provider, &bundle, &base, &evidence, n).await?);
        }
        let (raw_whole, raw_phases) = raw_run.expect("run on one side of the mission");
        raw.push(ms(raw_whole));
        through.push(ms(mission));
        if mission_phases.len() == PHASES.len() && raw_phases.len() == PHASES.len() {
            for (i, (m, r)) in mission_phases.iter().zip(&raw_phases).enumerate() {
                phase_pairs[i].push(m - r);
                phase_sides[i].0.push(*m);
                phase_sides[i].1.push(*r);
            }
        }
    }
    let phases: Vec<serde_json::Value> = PHASES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            json!({
                "phase": name,
                "mission_ms_median": median(&mut phase_sides[i].0),
                "raw_ms_median": median(&mut phase_sides[i].1),
                "overhead_ms_median": median(&mut phase_pairs[i]),
                "n": phase_pairs[i].len(),
            })
        })
        .collect();
    // The overhead is the median of each pair's difference
    // (robust to the machine's drift during the run, unlike a difference of two medians).
    let mut pairs: Vec<f64> = through.iter().zip(&raw).map(|(m, r)| m - r).collect();
    let overhead_interval = crate::stats::median_interval(&pairs);
    let overhead = median(&mut pairs);
    let verdict = Verdict::at_most(overhead_interval, TARGET_OVERHEAD_MS);

    // The same in a mission of several tasks: (the mission's wall time − as many raw attempts)
    // ÷ tasks, paired per round.
    let rounds = (attempts / TASKS_PER_MISSION).max(2);
    let mut shared = Vec::new();
    for round in 0..rounds {
        ctx.progress.say(&format!(
            "mission bench: {TASKS_PER_MISSION}-task missions {round}/{rounds}"
        ));
        // As many raw attempts as the mission has tasks, in milliseconds.
        let raw_batch = || async {
            let mut total = 0.0;
            for n in 0..TASKS_PER_MISSION {
                let tag = 1000 + round * 100 + n;
                total += ms(raw_attempt(&ctx, &provider, &bundle, &base, &evidence, tag)
                    .await?
                    .0);
            }
            Ok::<f64, crate::BenchError>(total)
        };
        let (mission, raws) = if round % 2 == 0 {
            let raws = raw_batch().await?;
            (ms(mission_run(&ctx, &several).await?.0), raws)
        } else {
            let mission = ms(mission_run(&ctx, &several).await?.0);
            (mission, raw_batch().await?)
        };
        shared.push((mission - raws) / TASKS_PER_MISSION as f64);
    }
    let shared_interval = crate::stats::median_interval(&shared);
    let overhead_shared = median(&mut shared);
    let shared_verdict = Verdict::at_most(shared_interval, TARGET_OVERHEAD_MS);

    let mut levels = Vec::new();
    for level in concurrency.into_iter().filter(|c| *c > 0) {
        let total = attempts.max(level);
        ctx.progress.say(&format!(
            "mission bench: throughput at concurrency {level} ({total} attempts)"
        ));
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        let mut launched = 0;
        let mut failures = 0;
        while launched < total || !set.is_empty() {
            while launched < total && set.len() < level {
                let ctx = ctx.clone();
                let file = file.clone();
                set.spawn(async move { mission_run(&ctx, &file).await.map(|(whole, _)| whole) });
                launched += 1;
            }
            if let Some(done) = set.join_next().await {
                if !matches!(done, Ok(Ok(_))) {
                    failures += 1;
                }
            }
        }
        let wall = started.elapsed().as_secs_f64();
        levels.push(json!({
            "concurrency": level,
            "attempts": total,
            "accepted": total - failures,
            "failed": failures,
            "wall_s": wall,
            "accepted_per_s": (total - failures) as f64 / wall,
        }));
    }
    let doc = json!({
        "provider": "host",
        "attempt_ms": { "mission_median": median(&mut through.clone()), "mission_p95": p95(&mut through.clone()), "raw_median": median(&mut raw.clone()), "raw_p95": p95(&mut raw.clone()), "n": attempts },
        "control_plane_overhead_ms_median": overhead,
        "control_plane_overhead_ms_interval": overhead_interval,
        "overhead_statistic": "median of paired differences (each mission attempt minus the raw attempt paired with it; which runs first alternates)",
        "phases": phases,
        "phases_note": "one accepted attempt's steps as the runner reports them, against the raw path's same provider work; medians of paired differences per phase (they need not add up to the whole's median)",
        "target_overhead_ms": TARGET_OVERHEAD_MS,
        "meets_target": verdict.met(),
        "verdict": verdict,
        "verdict_rule": "judged on the 95% interval of the median (percentile bootstrap): met only when the whole interval is within the target, not met only when it is wholly beyond; otherwise null (this run cannot tell)",
        "several_tasks": {
            "tasks_per_mission": TASKS_PER_MISSION,
            "missions": rounds,
            "control_plane_overhead_ms_per_attempt_median": overhead_shared,
            "control_plane_overhead_ms_per_attempt_interval": shared_interval,
            "meets_target": shared_verdict.met(),
            "verdict": shared_verdict,
            "statistic": "per round: (the mission's wall time minus as many raw attempts) / tasks; median over rounds",
        },
        "throughput": levels,
    });
    let mut text = String::new();
    {
        let _ = writeln!(
            text,
            "attempt (no-op agent, host): mission median {:.1} ms p95 {:.1} | raw provider ops median {:.1} ms p95 {:.1} (n={attempts})",
            doc["attempt_ms"]["mission_median"].as_f64().unwrap_or(f64::NAN),
            doc["attempt_ms"]["mission_p95"].as_f64().unwrap_or(f64::NAN),
            doc["attempt_ms"]["raw_median"].as_f64().unwrap_or(f64::NAN),
            doc["attempt_ms"]["raw_p95"].as_f64().unwrap_or(f64::NAN),
        );
        let _ = writeln!(
            text,
            "control-plane overhead per attempt (median of paired differences): {overhead:.1} ms — target ≤ {TARGET_OVERHEAD_MS} ms: {}",
            verdict.describe(overhead_interval, " ms")
        );
        let _ = writeln!(
            text,
            "  per phase (medians; overhead = median of paired differences): {}",
            doc["phases"]
                .as_array()
                .map(|phases| phases
                    .iter()
                    .map(|p| format!(
                        "{} {:.1} vs {:.1} ({:+.1})",
                        p["phase"].as_str().unwrap_or("?"),
                        p["mission_ms_median"].as_f64().unwrap_or(f64::NAN),
                        p["raw_ms_median"].as_f64().unwrap_or(f64::NAN),
                        p["overhead_ms_median"].as_f64().unwrap_or(f64::NAN)
                    ))
                    .collect::<Vec<_>>()
                    .join("; "))
                .unwrap_or_default()
        );
        let _ = writeln!(
            text,
            "control-plane overhead per attempt in a {TASKS_PER_MISSION}-task mission (its per-mission work shared): {overhead_shared:.1} ms — target ≤ {TARGET_OVERHEAD_MS} ms: {}",
            shared_verdict.describe(shared_interval, " ms")
        );
        for level in &levels {
            let _ = writeln!(
                text,
                "concurrency {:>3}: {} attempts, {} accepted, {:.1} accepted attempts/s",
                level["concurrency"],
                level["attempts"],
                level["accepted"],
                level["accepted_per_s"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(Report { json: doc, text })
}
