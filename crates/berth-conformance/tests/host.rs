//! The conformance suite against the live `host` provider: one test per clause.

mod common;

berth_conformance::conformance_tests! {
    common::subject("host", None, "BERTH_SKIP_NOTHING", "ho");
    create_ready_exec => "core.create_ready_exec",
    exec_quoting_pipes_home => "core.exec_quoting_pipes_home",
    exec_timeout_kills => "core.exec_timeout_kills",
    destroy_twice_verified_gone => "core.destroy_twice_verified_gone",
    secret_canary_absent => "core.secret_canary_absent",
    streaming_chunks => "exec_streaming.chunks",
    detached_spawn_status_kill => "exec_detached.spawn_status_kill",
    files_round_trip_binary => "files.round_trip_binary",
    files_hostile_path => "files.hostile_path",
    stop_start_round_trip => "stop_start.round_trip_settles",
    suspend_resume_round_trip => "suspend_resume.round_trip_settles",
    snapshot_restore_delete => "filesystem_snapshot.restore_delete",
    fork_independent_copy => "fork.independent_copy",
    listing_visibility_after_destroy => "listing.visibility_after_destroy",
    listing_must_not_fire_foreign => "listing.must_not_fire_foreign",
    must_fire_on_error => "teardown.must_fire_on_error",
    must_fire_on_panic => "teardown.must_fire_on_panic",
    ttl_fires_when_due => "ttl.fires_when_due",
    ttl_not_during_exec => "ttl.not_during_exec",
    unsupported_answers_unsupported => "unsupported.answers_unsupported",
}
