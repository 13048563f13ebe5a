//! `berth bench move FROM TO`: what a move costs, and what its checks cost.
//!
//! Each round makes two sandboxes of FROM holding the same kind of workspace (201 random files
//! in nested directories, 4.8 MiB: [`WORKSPACE`]; made before the clock starts) and measures,
//! alternating which goes first:
//!
//! - **move** — `berth_portable::move_sandbox` to TO, as `berth move` runs it: until the target
//!   is verified (when work can resume there) and until the source is verified gone.
//! - **unchecked** (Berth's own mechanism without its checks) — the same steps with the same
//!   ledger rows: the source's `tar` output taken as the sandbox wrote it, the target created
//!   under the ledger, the bytes written and unpacked there, the source destroyed — no parsing
//!   or rebuilding of the archive, no read-back of the target or the source, no record.
//!
//! Both then run one command in the target that reads the workspace (`cksum` of every file),
//! timed from the start: time to resumed useful execution. The ratio move / unchecked is what
//! the checks cost; there is no target (the checks are what a move is for). Every sandbox goes
//! through the ledger and is verified gone.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_contract::{ExecRequest, FileSource, NativeId, Provider, ProviderExt};
use berth_ledger::Tracked;
use serde_json::json;

use crate::stats::{compare, Comparison};
use crate::{
    bail, berth_create_tracked, destroy_tracked, BenchContext, BenchError, Report, Result,
};

/// The workspace each source gets before the clock starts: 200 files of 4 KiB and one of 4 MiB.
pub const WORKSPACE: &str =
    "mkdir -p a/b c && head -c 819200 /dev/urandom | split -b 4096 - a/b/f \
     && head -c 4194304 /dev/urandom > c/big";
/// The first useful command in the target: it reads every file of the workspace.
const RESUME: &str = "find . -type f -exec cksum {} + > /dev/null";
/// Default rounds.
const ROUNDS: usize = 5;

struct Round {
    move_total: Duration,
    move_to_resumable: Duration,
    move_to_resumed: Duration,
    unchecked_total: Duration,
    unchecked_to_resumed: Duration,
}

async fn source(
    ctx: &BenchContext,
    provider: &Arc<dyn Provider>,
    image: Option<&str>,
) -> Result<Tracked> {
    let tracked = berth_create_tracked(ctx, provider, image).await?;
    let out = provider
        .exec(
            &NativeId(tracked.native_id.clone()),
            &ExecRequest::shell(WORKSPACE),
        )
        .await?;
    if !out.status.success() {
        bail!(
            "making the workspace in {} ended {}",
            provider.id(),
            out.status
        );
    }
    Ok(tracked)
}

/// Runs [`RESUME`] in the target; the time from `started`.
async fn resumed(provider: &dyn Provider, native: &str, started: Instant) -> Result<Duration> {
    let out = provider
        .exec(&NativeId(native.to_owned()), &ExecRequest::shell(RESUME))
        .await?;
    let took = started.elapsed();
    if !out.status.success() {
        bail!(
            "the first command in the moved sandbox ended {}",
            out.status
        );
    }
    Ok(took)
}

async fn measured_move(
    ctx: &BenchContext,
    from: &Arc<dyn Provider>,
    to: &Arc<dyn Provider>,
    image: Option<&str>,
) -> Result<(Duration, Duration, Duration)> {
    let src = source(ctx, from, image).await?;
    let row = ctx.ledger.row(&src.berth_id).await?;
    let records = tempfile::Builder::new()
        .prefix("berth-bench-move-")
        .tempdir_in(&ctx.home)?;
    let image_for_target = image.map(str::to_owned);
    let started = Instant::now();
    let moved = berth_portable::move_sandbox(
        berth_portable::MoveRequest {
            ledger: &ctx.ledger,
            providers: &ctx.registry.bind(&ctx.provider_config),
            records: records.path(),
            source: &row,
            target: to.clone(),
            ttl: None,
            prepare: Box::new(move |req| req.image = image_for_target),
        },
        &mut |_| {},
    )
    .await
    .map_err(|e| BenchError::Failed(format!("move: {e}")))?;
    let total = started.elapsed();
    let to_resumed = resumed(to.as_ref(), &moved.target.native_id, started).await?;
    destroy_tracked(ctx, to.as_ref(), &moved.target).await?;
    Ok((
        total,
        Duration::from_secs_f64(moved.times.to_resumable_ms / 1e3),
        to_resumed,
    ))
}

async fn measured_unchecked(
    ctx: &BenchContext,
    from: &Arc<dyn Provider>,
    to: &Arc<dyn Provider>,
    image: Option<&str>,
) -> Result<(Duration, Duration)> {
    let src = source(ctx, from, image).await?;
    let src_native = NativeId(src.native_id.clone());
    let started = Instant::now();
    let mut req = ExecRequest::shell(berth_portable::ARCHIVE_SCRIPT);
    req.max_output_bytes = berth_portable::LIMIT + 1;
    let archive = from.exec(&src_native, &req).await?;
    if !archive.status.success() {
        bail!("unchecked: the source's tar ended {}", archive.status);
    }
    let target = berth_create_tracked(ctx, to, image).await?;
    let native = NativeId(target.native_id.clone());
    let len = archive.stdout.len() as u64;
    to.require_files()?
        .write_from(
            &native,
            ".bench.tar",
            FileSource {
                reader: Box::new(std::io::Cursor::new(archive.stdout)),
                len,
            },
        )
        .await?;
    let unpack = to
        .exec(
            &native,
            &ExecRequest::shell("tar -x -p -o -f .bench.tar; s=$?; rm -f .bench.tar; exit $s"),
        )
        .await?;
    if !unpack.status.success() {
        bail!("unchecked: the target's tar ended {}", unpack.status);
    }
    destroy_tracked(ctx, from.as_ref(), &src).await?;
    let total = started.elapsed();
    let to_resumed = resumed(to.as_ref(), &target.native_id, started).await?;
    destroy_tracked(ctx, to.as_ref(), &target).await?;
    Ok((total, to_resumed))
}

/// `berth bench move FROM TO [--image IMAGE] [--iterations N]`.
pub async fn bench(
    ctx: &BenchContext,
    providers: &[String],
    image: Option<&str>,
    rounds: Option<usize>,
) -> Result<Report> {
    let [from_id, to_id] = providers else {
        return Err(BenchError::Invalid(
            "name the two providers: `berth bench move FROM TO` (e.g. `host bwrap`)".into(),
        ));
    };
    let rounds = rounds.unwrap_or(ROUNDS).max(2);
    let (from, to) = (ctx.provider(from_id)?, ctx.provider(to_id)?);
    let mut samples = Vec::new();
    for round in 0..rounds {
        ctx.progress.say(&format!(
            "bench move {from_id} → {to_id}: round {}/{rounds}",
            round + 1
        ));
        let (moved, unchecked) = if round % 2 == 0 {
            let m = measured_move(ctx, &from, &to, image).await?;
            (m, measured_unchecked(ctx, &from, &to, image).await?)
        } else {
            let u = measured_unchecked(ctx, &from, &to, image).await?;
            (measured_move(ctx, &from, &to, image).await?, u)
        };
        samples.push(Round {
            move_total: moved.0,
            move_to_resumable: moved.1,
            move_to_resumed: moved.2,
            unchecked_total: unchecked.0,
            unchecked_to_resumed: unchecked.1,
        });
    }
    let pick = |f: fn(&Round) -> Duration| samples.iter().map(f).collect::<Vec<_>>();
    let total = compare(
        &mut pick(|r| r.move_total),
        &mut pick(|r| r.unchecked_total),
    );
    let to_resumed = compare(
        &mut pick(|r| r.move_to_resumed),
        &mut pick(|r| r.unchecked_to_resumed),
    );
    let to_resumable = crate::stats::summarize(&mut pick(|r| r.move_to_resumable));
    let mut text = String::new();
    let _ = writeln!(
        text,
        "-- move {from_id} → {to_id}: a 4.8 MiB workspace of 201 files, {rounds} rounds, move \
         and unchecked alternating"
    );
    let line = |text: &mut String, what: &str, c: &Comparison| {
        let _ = writeln!(
            text,
            "{what:<34} move {:>8.1} ms  unchecked {:>8.1} ms  {:.2}× [{:.2}, {:.2}]",
            c.berth.median_ms,
            c.raw.median_ms,
            c.ratio_median,
            c.ratio_interval.low,
            c.ratio_interval.high
        );
    };
    line(&mut text, "source verified gone", &total);
    line(&mut text, "first command in the target done", &to_resumed);
    let _ = writeln!(
        text,
        "(move: target verified after {:.1} ms, median. Baseline: Berth's own mechanism without \
         its checks — the same steps and ledger rows, the archive taken as the source wrote it, \
         nothing read back, no record. No target: the ratio is what the checks cost.)",
        to_resumable.median_ms
    );
    Ok(Report {
        json: json!({
            "measurement": "move",
            "from": from_id,
            "to": to_id,
            "rounds": rounds,
            "workspace": { "files": 201, "bytes": 819_200 + 4_194_304, "made_by": WORKSPACE },
            "source_verified_gone": total,
            "first_command_in_target": to_resumed,
            "move_target_verified": to_resumable,
            "baseline": "own mechanism without its checks: the same steps and ledger rows, the source's archive unparsed, no read-back of target or source, no record",
            "target": null,
        }),
        text,
    })
}
