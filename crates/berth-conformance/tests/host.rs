//! The conformance suite against the live `host` provider: one test per clause.

mod common;

berth_conformance::all_conformance_tests!(common::subject(
    "host",
    None,
    "BERTH_SKIP_NOTHING",
    "ho"
));
