//! `berth bench resume PROVIDER [HARNESS]`: what going on with an agent's conversation in
//! another sandbox costs.
//!
//! Each round starts a conversation in one sandbox of PROVIDER (`berth prompt`, untimed) and
//! then measures, alternating which goes first, two whole `berth prompt` processes doing the
//! same scripted work (one command, one final answer) in two more sandboxes of PROVIDER:
//!
//! - **resumed** — `berth prompt B --resume as-…`: the conversation's record staged and unpacked
//!   in B, the CLI loading it and going on (the scripted model answers the second turn's step
//!   only if the first turn's history arrives; checked: turn 2 of the same session);
//! - **fresh** (Berth's own mechanism without the session) — `berth prompt A --harness H`: a new
//!   conversation.
//!
//! Both take the CLI's session record out of their sandbox and store it. The ratio resumed /
//! fresh is what continuity costs a turn, measured as the CLI as a whole process; there is no
//! target. Every sandbox goes through the ledger and is verified gone; every session made is
//! deleted.

use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_contract::Provider;
use berth_ledger::Tracked;
use serde_json::{json, Value};

use crate::stats::{compare, Comparison};
use crate::{
    bail, berth_create_tracked, destroy_tracked, BenchContext, BenchError, Report, Result,
};

/// Two turns, each one command and one final answer.
const SCRIPT: &str = "schema_version = 1\n\
    [[step]]\nshell = \"printf one > one.txt\"\n[[step]]\ntext = \"Done: one\"\n\
    [[step]]\nshell = \"printf two > two.txt\"\n[[step]]\ntext = \"Done: two\"\n";
/// Default rounds.
const ROUNDS: usize = 5;

/// `berth --json prompt …`: how long the process took, and its final document, checked.
async fn prompt(ctx: &BenchContext, args: &[&str]) -> Result<(Duration, Value)> {
    let started = Instant::now();
    let out = tokio::process::Command::new(&ctx.berth)
        .args(["--json", "prompt"])
        .args(args)
        .env("BERTH_HOME", &ctx.home)
        .env("BERTH_OWNER", ctx.ledger.owner())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .await?;
    let took = started.elapsed();
    let last = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or(Value::Null);
    if !out.status.success() || !last["rejected"].is_null() || !last["session"].is_string() {
        bail!(
            "`berth prompt {}` did not finish a kept turn: {last}",
            args.join(" ")
        );
    }
    Ok((took, last))
}

async fn forget(ctx: &BenchContext, session: &Value) -> Result<()> {
    let Some(id) = session.as_str() else {
        return Ok(());
    };
    let status = tokio::process::Command::new(&ctx.berth)
        .args(["destroy", id])
        .env("BERTH_HOME", &ctx.home)
        .env("BERTH_OWNER", ctx.ledger.owner())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await?;
    if !status.success() {
        bail!("`berth destroy {id}` exited {status}");
    }
    Ok(())
}

/// One round: (resumed, fresh).
async fn round(
    ctx: &BenchContext,
    provider: &Arc<dyn Provider>,
    harness: &str,
    script: &str,
    image: Option<&str>,
    resumed_first: bool,
) -> Result<(Duration, Duration)> {
    let mut made: Vec<Tracked> = Vec::new();
    for _ in 0..3 {
        made.push(berth_create_tracked(ctx, provider, image).await?);
    }
    let [start, a, b] = [0, 1, 2].map(|i| made[i].berth_id.clone());
    let measured = async {
        let (_, first) = prompt(
            ctx,
            &[&start, "--harness", harness, "--script", script, "one"],
        )
        .await?;
        let session = first["session"].as_str().unwrap_or_default().to_owned();
        let resume_args = [b.as_str(), "--resume", &session, "--script", script, "two"];
        let fresh_args = [a.as_str(), "--harness", harness, "--script", script, "one"];
        let (resumed, fresh) = if resumed_first {
            let r = prompt(ctx, &resume_args).await?;
            (r, prompt(ctx, &fresh_args).await?)
        } else {
            let f = prompt(ctx, &fresh_args).await?;
            (prompt(ctx, &resume_args).await?, f)
        };
        if resumed.1["session"] != first["session"] || resumed.1["turn"] != 2 {
            bail!(
                "the resumed turn did not go on with the conversation: {}",
                resumed.1
            );
        }
        forget(ctx, &first["session"]).await?;
        forget(ctx, &fresh.1["session"]).await?;
        Ok((resumed.0, fresh.0))
    }
    .await;
    for tracked in &made {
        destroy_tracked(ctx, provider.as_ref(), tracked).await?;
    }
    measured
}

/// `berth bench resume PROVIDER [HARNESS] [--image IMAGE] [--iterations N]`.
pub async fn bench(
    ctx: &BenchContext,
    args: &[String],
    image: Option<&str>,
    rounds: Option<usize>,
) -> Result<Report> {
    let (provider_id, harness) = match args {
        [p] => (p.as_str(), "codex"),
        [p, h] if ["opencode", "codex", "claude-code"].contains(&h.as_str()) => {
            (p.as_str(), h.as_str())
        }
        _ => {
            return Err(BenchError::Invalid(
                "name a provider and optionally a harness: `berth bench resume host [codex]` \
                 (opencode, codex or claude-code)"
                    .into(),
            ))
        }
    };
    let rounds = rounds.unwrap_or(ROUNDS).max(2);
    let provider = ctx.provider(provider_id)?;
    let scratch = tempfile::Builder::new()
        .prefix("berth-bench-resume-")
        .tempdir_in(&ctx.home)?;
    let script = scratch.path().join("model.toml");
    std::fs::write(&script, SCRIPT)?;
    // Passed to `berth prompt` as an argument.
    let script = script.to_str().ok_or_else(|| {
        BenchError::Invalid(format!(
            "the scratch path {} is not UTF-8 (set BERTH_HOME to a UTF-8 path)",
            script.display()
        ))
    })?;
    let (mut resumed, mut fresh) = (Vec::new(), Vec::new());
    for n in 0..rounds {
        ctx.progress.say(&format!(
            "bench resume {provider_id} ({harness}): round {}/{rounds}",
            n + 1
        ));
        let (r, f) = round(ctx, &provider, harness, script, image, n % 2 == 0).await?;
        resumed.push(r);
        fresh.push(f);
    }
    let c: Comparison = compare(&mut resumed, &mut fresh);
    let mut text = String::new();
    let _ = writeln!(
        text,
        "-- resume {provider_id} ({harness}): {rounds} rounds, resumed and fresh alternating"
    );
    let _ = writeln!(
        text,
        "{:<34} resumed {:>8.1} ms  fresh {:>8.1} ms  {:.2}× [{:.2}, {:.2}]",
        "a turn, `berth prompt` as a process",
        c.berth.median_ms,
        c.raw.median_ms,
        c.ratio_median,
        c.ratio_interval.low,
        c.ratio_interval.high
    );
    let _ = writeln!(
        text,
        "(Baseline: Berth's own mechanism without the session — a fresh conversation doing the \
         same scripted work in a sandbox of the same provider; both are the CLI as a whole \
         process and both keep their session. No target: the ratio is what continuity costs a \
         turn — staging and unpacking the record, rebinding it, the CLI loading it.)"
    );
    Ok(Report {
        json: json!({
            "measurement": "resume",
            "provider": provider_id,
            "harness": harness,
            "rounds": rounds,
            "turn": c,
            "baseline": "own mechanism without the session: a fresh conversation, same scripted work, same provider; both the CLI as a whole process",
            "target": null,
        }),
        text,
    })
}
