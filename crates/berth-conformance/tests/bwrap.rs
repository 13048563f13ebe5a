//! The conformance suite against the live `bwrap` provider: one test per clause.

mod common;

berth_conformance::all_conformance_tests!(common::subject("bwrap", None, "BERTH_SKIP_BWRAP", "bw"));
