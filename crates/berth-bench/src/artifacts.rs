//! `berth bench artifacts`: publishing a large bundle against copying the same bytes raw.
//!
//! A bundle of 1,000 files (200 MB in all, incompressible) is published to the local object
//! store — redacted, hashed (BLAKE3 and SHA-256), written create-if-absent, claimed and indexed
//! in a real store — and the same bytes are written raw to a directory (one `write` per file,
//! what `cp -r` does), in the same run, alternating which goes first. Throughput is bytes over
//! wall time; the target is the publication at ≥ 0.7× the raw copy. Hashing throughput is
//! reported on its own, and the S3 backend's figures beside them when `BERTH_ARTIFACTS_URL`
//! names a bucket (else UNKNOWN with the reason).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::stats::Verdict;
use crate::{BenchContext, BenchError, Report, Result};
use berth_artifacts::{build, publish, BundleFile, BundleInput, Lifecycle, Objects, Redactor};

/// Files in the bundle.
const FILES: usize = 1000;
/// Bytes in all.
const TOTAL: usize = 200 << 20;
/// The target: publication throughput at least this fraction of the raw copy's.
const TARGET_RATIO: f64 = 0.7;

fn files(round: usize) -> Vec<BundleFile> {
    let each = TOTAL / FILES;
    // Incompressible, distinct per round (so no object is already there from a prior round).
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (round as u64).wrapping_mul(0xa076_1d64_78bd_642f);
    (0..FILES)
        .map(|n| {
            let mut bytes = Vec::with_capacity(each);
            while bytes.len() < each {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.extend_from_slice(&state.to_le_bytes());
            }
            bytes.truncate(each);
            BundleFile {
                path: format!("data/{n:04}.bin"),
                mime: "application/octet-stream".into(),
                bytes,
                opaque: false,
                truncated_from: None,
            }
        })
        .collect()
}

fn input(round: usize, files: Vec<BundleFile>) -> BundleInput {
    BundleInput {
        mission: "bench".into(),
        task: "publish".into(),
        attempt_key: format!("at-bench-{round}"),
        ordinal: 1,
        lifecycle: Lifecycle {
            outcome: "accepted".into(),
            reason: None,
            commit: None,
            base_commit: None,
            checkpoint: None,
        },
        retention: "bench".into(),
        usage: None,
        withheld: Vec::new(),
        files,
    }
}

fn mb_per_s(bytes: usize, took: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / took.as_secs_f64()
}

async fn publish_once(
    store: &berth_store::Store,
    objects: &Objects,
    round: usize,
    files: Vec<BundleFile>,
) -> Result<Duration> {
    let started = Instant::now();
    let bundle = build(input(round, files), &Redactor::new(Vec::<String>::new()))
        .map_err(|e| BenchError::Failed(e.to_string()))?;
    publish(store, objects, &bundle, &mut |_| {})
        .await
        .map_err(|e| BenchError::Failed(e.to_string()))?;
    Ok(started.elapsed())
}

/// Flushes every dirty page to disk (`sync(1)`), untimed.
fn settle() -> Result<()> {
    let status = std::process::Command::new("sync").status()?;
    if !status.success() {
        return Err(BenchError::Failed(format!("sync exited {status}")));
    }
    Ok(())
}

fn raw_copy(dir: &std::path::Path, files: &[BundleFile]) -> Result<Duration> {
    let started = Instant::now();
    std::fs::create_dir_all(dir.join("data"))?;
    for file in files {
        std::fs::write(dir.join(&file.path), &file.bytes)?;
    }
    Ok(started.elapsed())
}

/// The same raw writes spread over as many threads as publication keeps writes in flight: the
/// fastest plain copy, so publication's own parallelism is not what the ratio measures.
fn raw_copy_parallel(dir: &std::path::Path, files: &[BundleFile]) -> Result<Duration> {
    let started = Instant::now();
    std::fs::create_dir_all(dir.join("data"))?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..berth_artifacts::publish::WRITES_IN_FLIGHT {
            scope.spawn(|| loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(file) = files.get(n) else { break };
                if let Err(e) = std::fs::write(dir.join(&file.path), &file.bytes) {
                    *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                    break;
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e.into());
    }
    Ok(started.elapsed())
}

/// `berth bench artifacts`.
pub async fn bench(ctx: &BenchContext, rounds: usize) -> Result<Report> {
    let rounds = rounds.clamp(1, 10);
    let scratch = tempfile::Builder::new()
        .prefix("berth-bench-artifacts-")
        .tempdir_in(&ctx.home)?;
    let store = berth_store::Store::open(&scratch.path().join("bench.db"))
        .await
        .map_err(|e| BenchError::Failed(e.to_string()))?;
    let s3 = match ctx.provider_config.env.get("BERTH_ARTIFACTS_URL") {
        Some(url) if url.starts_with("s3://") => Some(
            berth_orchestrator::publication::objects(&ctx.home, &ctx.provider_config.env)
                .map_err(|e| BenchError::Failed(e.to_string()))?,
        ),
        _ => None,
    };
    let (mut published, mut raw, mut s3_took) = (Vec::new(), Vec::new(), Vec::new());
    let (mut hashing, mut raw_parallel) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        ctx.progress
            .say(&format!("bench artifacts: round {}/{rounds}", round + 1));
        let data = files(round);
        // Hashing alone (BLAKE3 and SHA-256 over every byte).
        let started = Instant::now();
        for file in &data {
            use sha2::Digest;
            let _ = berth_artifacts::content_id(&file.bytes);
            let _ = sha2::Sha256::digest(&file.bytes);
        }
        hashing.push(started.elapsed());
        // A round's objects are removed with its copies: three rounds of 200 MB kept to the end
        // are disk a CI machine may not have.
        let objects_dir = scratch.path().join(format!("objects-{round}"));
        let local = Objects::local(&objects_dir).map_err(|e| BenchError::Failed(e.to_string()))?;
        let copy_dir = scratch.path().join(format!("raw-{round}"));
        let parallel_dir = scratch.path().join(format!("raw-parallel-{round}"));
        // The three take turns in every order. Each timed run starts with no dirty pages left
        // by the one before (the kernel's write-back of 200 MB would otherwise land on the next).
        for turn in crate::stats::order_of_three(round) {
            settle()?;
            match turn {
                0 => raw.push(raw_copy(&copy_dir, &data)?),
                1 => raw_parallel.push(raw_copy_parallel(&parallel_dir, &data)?),
                _ => published.push(publish_once(&store, &local, round, data.clone()).await?),
            }
        }
        if let Some(s3) = &s3 {
            s3_took.push(publish_once(&store, s3, round + 1000, data).await?);
        }
        let _ = std::fs::remove_dir_all(&copy_dir);
        let _ = std::fs::remove_dir_all(&parallel_dir);
        let _ = std::fs::remove_dir_all(&objects_dir);
        settle()?;
    }
    // Nearest rank, as every other median Berth reports.
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len().div_ceil(2) - 1]
    };
    let (p, r, h) = (
        median(&mut published),
        median(&mut raw),
        median(&mut hashing),
    );
    let rp = median(&mut raw_parallel);
    let (p_rate, seq_rate, par_rate, h_rate) = (
        mb_per_s(TOTAL, p),
        mb_per_s(TOTAL, r),
        mb_per_s(TOTAL, rp),
        mb_per_s(TOTAL, h),
    );
    // The baseline is the faster of the two plain copies.
    let (r_rate, baseline) = if par_rate > seq_rate {
        (par_rate, "raw_copy_parallel")
    } else {
        (seq_rate, "raw_copy")
    };
    let ratio = p_rate / r_rate;
    // Throughput ratios (a copy's time over publication's), with their 95% intervals over the
    // rounds; few rounds make wide intervals, and the verdict then says undecided.
    let secs = |v: &[Duration]| v.iter().map(Duration::as_secs_f64).collect::<Vec<_>>();
    let (p_s, r_s, rp_s) = (secs(&published), secs(&raw), secs(&raw_parallel));
    let throughput_ratio = |copy: &[f64]| {
        let [interval] = crate::stats::bootstrap(&[&p_s, copy], |s| {
            let (left, right) = s.split_at_mut(1);
            [crate::stats::median(&mut right[0]).unwrap_or(f64::NAN)
                / crate::stats::median(&mut left[0]).unwrap_or(f64::NAN)]
        });
        interval
    };
    let one_thread_interval = throughput_ratio(&r_s);
    let interval = if baseline == "raw_copy" {
        one_thread_interval
    } else {
        throughput_ratio(&rp_s)
    };
    let verdict = Verdict::at_least(interval, TARGET_RATIO);
    let one_thread_verdict = Verdict::at_least(one_thread_interval, TARGET_RATIO);
    let s3_doc = match s3_took.is_empty() {
        false => {
            let t = median(&mut s3_took);
            json!({ "median_s": t.as_secs_f64(), "mb_per_s": mb_per_s(TOTAL, t) })
        }
        true => json!({ "unknown": "BERTH_ARTIFACTS_URL names no s3:// bucket in this run" }),
    };
    let doc = json!({
        "files": FILES,
        "bytes": TOTAL,
        "rounds": rounds,
        "publish_local": { "median_s": p.as_secs_f64(), "mb_per_s": p_rate },
        "raw_copy": { "median_s": r.as_secs_f64(), "mb_per_s": seq_rate },
        "raw_copy_parallel": { "median_s": rp.as_secs_f64(), "mb_per_s": par_rate, "writers": berth_artifacts::publish::WRITES_IN_FLIGHT },
        "baseline": baseline,
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "ratio_interval": interval,
        "meets_target": verdict.met(),
        "verdict": verdict,
        "ratio_vs_one_thread_copy": p_rate / seq_rate,
        "ratio_vs_one_thread_copy_interval": one_thread_interval,
        "meets_target_vs_one_thread_copy": one_thread_verdict.met(),
        "verdict_vs_one_thread_copy": one_thread_verdict,
        "hashing_blake3_and_sha256": { "median_s": h.as_secs_f64(), "mb_per_s": h_rate },
        "publish_s3": s3_doc,
        "notes": "publish = redact + BLAKE3 + SHA-256 (over the cores) + create-if-absent writes (8 in flight) + claim + index (a real SQLite store); raw_copy = the same bytes written to a directory, one write per file, one thread (what cp -r does); raw_copy_parallel = the same writes over 8 threads; the ratio is against the faster of the two (a comparison with a plain copy, which does none of publication's work); hashing = BLAKE3 + SHA-256 on one core",
    });
    let mut text = String::new();
    let _ = writeln!(
        text,
        "-- artifact publication: {FILES} files, {} MB (median of {rounds} rounds)",
        TOTAL >> 20
    );
    let _ = writeln!(
        text,
        "publish (local object store)  {p_rate:8.1} MB/s | raw copy of the same bytes {seq_rate:8.1} MB/s (one thread), {par_rate:8.1} MB/s ({} threads) | ratio {ratio:.2}x over the faster",
        berth_artifacts::publish::WRITES_IN_FLIGHT
    );
    let _ = writeln!(
        text,
        "target: publication ≥ {TARGET_RATIO}× a raw copy's throughput: against the faster copy ({baseline}) {:.2}x {}; against the one-thread copy (cp -r) {:.2}x {}",
        ratio,
        verdict.describe(interval, "x"),
        p_rate / seq_rate,
        one_thread_verdict.describe(one_thread_interval, "x")
    );
    let _ = writeln!(
        text,
        "hashing (BLAKE3 + SHA-256, one core) {h_rate:8.1} MB/s"
    );
    match doc["publish_s3"]["mb_per_s"].as_f64() {
        Some(rate) => {
            let _ = writeln!(text, "publish (S3 backend)          {rate:8.1} MB/s");
        }
        None => {
            let _ = writeln!(
                text,
                "publish (S3 backend)          UNKNOWN({})",
                doc["publish_s3"]["unknown"].as_str().unwrap_or_default()
            );
        }
    }
    Ok(Report { json: doc, text })
}
