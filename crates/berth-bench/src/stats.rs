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
    /// The median's 95% interval.
    pub(crate) median_interval_ms: Interval,
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
    let mut ms = millis(samples);
    let at = |ms: &mut Vec<f64>, p: f64| percentile(ms, p).unwrap_or(f64::NAN);
    Summary {
        n: ms.len(),
        median_interval_ms: median_interval(&ms),
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
    /// The ratio's 95% interval (percentile bootstrap of both samples).
    pub(crate) ratio_interval: Interval,
    pub(crate) overhead_median_ms: f64,
    /// The overhead's 95% interval, in milliseconds.
    pub(crate) overhead_interval_ms: Interval,
}

fn millis(samples: &[Duration]) -> Vec<f64> {
    samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect()
}

pub(crate) fn compare(berth: &mut [Duration], raw: &mut [Duration]) -> Comparison {
    let (b, r) = (millis(berth), millis(raw));
    let median_of = |s: &mut [f64]| median(s).unwrap_or(f64::NAN);
    // One resampling serves both figures (each is a function of the two medians).
    let [ratio_interval, overhead_interval_ms] = bootstrap(&[&b, &r], |s| {
        let (left, right) = s.split_at_mut(1);
        let (berth, raw) = (median_of(&mut left[0]), median_of(&mut right[0]));
        [berth / raw, berth - raw]
    });
    let berth = summarize(berth);
    let raw = summarize(raw);
    Comparison {
        ratio_median: berth.median_ms / raw.median_ms,
        ratio_interval,
        overhead_median_ms: berth.median_ms - raw.median_ms,
        overhead_interval_ms,
        berth,
        raw,
    }
}

/// A 95% interval: where the figure would fall in 95 of 100 runs like this one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Interval {
    pub(crate) low: f64,
    pub(crate) high: f64,
}

/// Resamples per interval: enough for stable 2.5% and 97.5% points.
const RESAMPLES: usize = 2000;

/// The 95% intervals of the `N` figures `statistic` computes over `samples`, by the percentile
/// bootstrap: each sample is drawn again with replacement, `RESAMPLES` times, and each figure's
/// 2.5th and 97.5th percentiles are its interval (figures of the same samples share one
/// resampling). The generator's seed is fixed, so the same samples always give the same
/// intervals. Samples with fewer than two values give intervals of NaN (unknown).
pub(crate) fn bootstrap<const N: usize>(
    samples: &[&[f64]],
    statistic: impl Fn(&mut [Vec<f64>]) -> [f64; N],
) -> [Interval; N] {
    let unknown = Interval {
        low: f64::NAN,
        high: f64::NAN,
    };
    if samples.iter().any(|s| s.len() < 2) {
        return [unknown; N];
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |below: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % below as u64) as usize
    };
    let mut drawn: Vec<Vec<f64>> = samples
        .iter()
        .map(|s| Vec::with_capacity(s.len()))
        .collect();
    let mut figures: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(RESAMPLES));
    for _ in 0..RESAMPLES {
        for (into, from) in drawn.iter_mut().zip(samples) {
            into.clear();
            into.extend((0..from.len()).map(|_| from[next(from.len())]));
        }
        for (kept, figure) in figures.iter_mut().zip(statistic(&mut drawn)) {
            kept.push(figure);
        }
    }
    figures.map(|mut figures| Interval {
        low: percentile(&mut figures, 0.025).unwrap_or(f64::NAN),
        high: percentile(&mut figures, 0.975).unwrap_or(f64::NAN),
    })
}

/// The 95% interval of the median of one sample (paired differences, for instance).
pub(crate) fn median_interval(sample: &[f64]) -> Interval {
    let [interval] = bootstrap(&[sample], |s| [median(&mut s[0]).unwrap_or(f64::NAN)]);
    interval
}

/// A target's verdict, as sure as the run can make it: met only when the figure's whole 95%
/// interval lies within the target, NOT met only when it lies wholly beyond it; otherwise this
/// run cannot tell (its noise is wider than the distance to the target), and says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verdict {
    Met,
    NotMet,
    Undecided,
}

impl Verdict {
    /// For a target of at most `target`.
    pub(crate) fn at_most(interval: Interval, target: f64) -> Verdict {
        if interval.high <= target {
            Verdict::Met
        } else if interval.low > target {
            Verdict::NotMet
        } else {
            Verdict::Undecided
        }
    }

    /// For a target of at least `target`.
    pub(crate) fn at_least(interval: Interval, target: f64) -> Verdict {
        if interval.low >= target {
            Verdict::Met
        } else if interval.high < target {
            Verdict::NotMet
        } else {
            Verdict::Undecided
        }
    }

    /// `true`/`false` when decided; `None` (JSON null) when this run cannot tell.
    pub(crate) fn met(self) -> Option<bool> {
        match self {
            Verdict::Met => Some(true),
            Verdict::NotMet => Some(false),
            Verdict::Undecided => None,
        }
    }

    /// For people: `met`, `NOT met`, or why it is undecided, with the interval (`unit` after
    /// each bound: ` ms`, `x`).
    pub(crate) fn describe(self, interval: Interval, unit: &str) -> String {
        let bounds = format!(
            "95% interval {:.2}{unit} to {:.2}{unit}",
            interval.low, interval.high
        );
        match self {
            Verdict::Met => format!("met ({bounds})"),
            Verdict::NotMet => format!("NOT met ({bounds})"),
            Verdict::Undecided => {
                if interval.low.is_nan() {
                    "UNDECIDED (too few samples for an interval)".to_owned()
                } else {
                    format!("UNDECIDED: the {bounds} spans the target")
                }
            }
        }
    }
}

#[cfg(test)]
mod interval_tests {
    use super::*;

    /// The interval contains the figure, narrows as samples grow, and the verdict goes three
    /// ways; these can fail (a constant interval or a verdict that ignores it would not pass).
    #[test]
    fn intervals_narrow_with_samples_and_verdicts_go_three_ways() {
        // A spread sample around 10: 5.0, 5.1, …, 14.9, in a scrambled order.
        let spread = |n: usize| -> Vec<f64> {
            (0..n)
                .map(|i| 5.0 + 10.0 * ((i * 37) % n) as f64 / n as f64)
                .collect()
        };
        let few = median_interval(&spread(10));
        let many = median_interval(&spread(400));
        assert!(few.low <= 10.0 && 10.0 <= few.high, "{few:?}");
        assert!(many.low <= 10.1 && 9.9 <= many.high, "{many:?}");
        assert!(
            many.high - many.low < (few.high - few.low) / 2.0,
            "{few:?} {many:?}"
        );
        assert_eq!(Verdict::at_most(many, 12.0), Verdict::Met);
        assert_eq!(Verdict::at_most(many, 8.0), Verdict::NotMet);
        assert_eq!(Verdict::at_most(few, 10.0), Verdict::Undecided);
        assert_eq!(Verdict::at_least(many, 8.0), Verdict::Met);
        assert_eq!(Verdict::at_least(many, 12.0), Verdict::NotMet);
        assert_eq!(Verdict::at_least(few, 10.0), Verdict::Undecided);
        assert_eq!(Verdict::Undecided.met(), None);
        assert_eq!(
            Verdict::at_most(median_interval(&[1.0]), 5.0),
            Verdict::Undecided
        );
        // The same samples give the same interval (a report can be checked from its samples).
        assert_eq!(median_interval(&spread(50)), median_interval(&spread(50)));
    }

    /// A comparison's intervals bracket its point figures.
    #[test]
    fn a_comparison_brackets_its_figures() {
        let ms = |v: f64| Duration::from_secs_f64(v / 1000.0);
        let mut berth: Vec<Duration> = (0..100).map(|i| ms(3.0 + (i % 10) as f64 * 0.1)).collect();
        let mut raw: Vec<Duration> = (0..100).map(|i| ms(2.0 + (i % 7) as f64 * 0.1)).collect();
        let c = compare(&mut berth, &mut raw);
        assert!(c.ratio_interval.low <= c.ratio_median && c.ratio_median <= c.ratio_interval.high);
        assert!(
            c.overhead_interval_ms.low <= c.overhead_median_ms
                && c.overhead_median_ms <= c.overhead_interval_ms.high
        );
        assert!(c.overhead_interval_ms.low > 0.5, "{c:?}");
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
