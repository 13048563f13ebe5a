//! The one percentile helper (it lives with the evidence records' metrics, so every median and
//! p95 Berth reports is computed the same way).

pub use berth_evidence::{median, percentile};
