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

/// The order in which three measurements take their turns in round `round`: each of the six
/// orders in turn. Over six rounds each measurement goes first, second and third equally often
/// and follows each of the others equally often, across round boundaries too. A plain rotation
/// (`(round + turn) % 3`) keeps every measurement's predecessor: the one after the heaviest
/// (an Engine exec leaves the machine busy for a moment) would nearly always pay for it.
pub(crate) fn order_of_three(round: usize) -> [usize; 3] {
    const ORDERS: [[usize; 3]; 6] = [
        [0, 1, 2],
        [1, 2, 0],
        [2, 0, 1],
        [0, 2, 1],
        [2, 1, 0],
        [1, 0, 2],
    ];
    ORDERS[round % ORDERS.len()]
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

#[cfg(test)]
mod order_tests {
    use super::order_of_three;

    /// Over whole cycles, every measurement takes every position equally often and follows
    /// each other one equally often, round boundaries included; a plain rotation fails this.
    #[test]
    fn each_measurement_follows_each_other_equally_often() {
        let sequence: Vec<usize> = (0..60).flat_map(order_of_three).collect();
        let mut follows = [[0usize; 3]; 3];
        for pair in sequence.windows(2) {
            follows[pair[0]][pair[1]] += 1;
        }
        let counts: Vec<usize> = (0..3)
            .flat_map(|a| (0..3).filter(move |b| *b != a).map(move |b| (a, b)))
            .map(|(a, b)| follows[a][b])
            .collect();
        assert!(
            counts.iter().all(|c| c.abs_diff(counts[0]) <= 1),
            "{follows:?}"
        );
        for position in 0..3 {
            let mut firsts = [0usize; 3];
            (0..60).for_each(|r| firsts[order_of_three(r)[position]] += 1);
            assert_eq!(firsts, [20, 20, 20]);
        }
        // The rotation it replaces: the measurement after 0 is 1 two times in three.
        let rotated: Vec<usize> = (0..60)
            .flat_map(|r| (0..3).map(move |t| (r + t) % 3))
            .collect();
        let after_zero = rotated
            .windows(2)
            .filter(|p| p[0] == 0)
            .filter(|p| p[1] == 1)
            .count();
        let other = rotated
            .windows(2)
            .filter(|p| p[0] == 0 && p[1] == 2)
            .count();
        assert!(after_zero > other * 3 / 2, "{after_zero} vs {other}");
    }
}
