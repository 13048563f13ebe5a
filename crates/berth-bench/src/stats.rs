//! The one percentile helper (it lives with the evidence records' metrics, so every median and
//! p95 Berth reports is computed the same way).

pub use berth_evidence::{median, percentile};

use std::time::Duration;

use serde::Serialize;

/// Median, p95 and minimum of a sample, in milliseconds.
#[derive(Debug, Serialize)]
pub(crate) struct Summary {
    pub(crate) n: usize,
    pub(crate) median_ms: f64,
    pub(crate) p95_ms: f64,
    pub(crate) min_ms: f64,
}

pub(crate) fn summarize(samples: &mut [Duration]) -> Summary {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    let at = |ms: &mut Vec<f64>, p: f64| percentile(ms, p).unwrap_or(f64::NAN);
    Summary {
        n: ms.len(),
        median_ms: at(&mut ms, 0.5),
        p95_ms: at(&mut ms, 0.95),
        min_ms: ms.first().copied().unwrap_or(f64::NAN),
    }
}

/// Berth against a baseline, sampled in the same run.
#[derive(Debug, Serialize)]
pub(crate) struct Comparison {
    pub(crate) berth: Summary,
    pub(crate) raw: Summary,
    pub(crate) ratio_median: f64,
    pub(crate) overhead_median_ms: f64,
}

pub(crate) fn compare(berth: &mut [Duration], raw: &mut [Duration]) -> Comparison {
    let berth = summarize(berth);
    let raw = summarize(raw);
    Comparison {
        ratio_median: berth.median_ms / raw.median_ms,
        overhead_median_ms: berth.median_ms - raw.median_ms,
        berth,
        raw,
    }
}
