//! The conformance suite against the live `docker` provider: one test per clause.

mod common;

berth_conformance::all_conformance_tests!(common::subject(
    "docker",
    Some(std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth/agent:bookworm".into())),
    "BERTH_SKIP_DOCKER",
    "do"
));
