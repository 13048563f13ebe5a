//! Berth's conformance suite: one reusable set of clauses that runs against any provider.
//!
//! Clauses are chosen from the provider's *declared* capabilities: a capability declared
//! `supported` or `unknown` runs its clauses; one declared `unsupported` makes them
//! not-applicable and adds an `unsupported.<capability>` clause asserting that the adapter really
//! answers `Unsupported`. Every clause is graded on its own:
//!
//! - `pass` — it ran and every assertion held;
//! - `fail` — it ran and an assertion failed (the diagnostics say which);
//! - `not_applicable` — the capability is declared unsupported;
//! - `unverified` — the clause exists but this suite cannot exercise it (the reason is given).
//!
//! Each clause creates its own sandboxes, named from the run id, and destroys them whatever the
//! outcome. A canary secret is planted in exec environments; clauses check it never shows up in
//! observations, listings or errors.

mod clauses;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use berth_contract::{Capability, CreateRequest, Labels, Provider, SandboxName, Support};
use berth_manifest::ProviderManifest;
use serde::{Deserialize, Serialize};

pub use clauses::CLAUSES;

/// The owner label conformance sandboxes carry unless the runner sets its own.
pub const OWNER: &str = "berth-conformance";

/// How one clause came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grade {
    /// Ran; every assertion held.
    Pass,
    /// Ran; an assertion failed.
    Fail,
    /// The capability is declared unsupported.
    NotApplicable,
    /// Not exercised by this suite; the diagnostics say why.
    Unverified,
}

/// One clause's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClauseResult {
    /// Clause id, e.g. `core.exec_exit_codes`.
    pub clause: String,
    /// The capability it proves (`None` for the required core).
    pub capability: Option<Capability>,
    /// The grade.
    pub grade: Grade,
    /// What happened, never containing secret values.
    pub diagnostics: Vec<String>,
    /// Wall time.
    pub duration_ms: f64,
}

/// What the suite runs against.
#[derive(Debug, Clone)]
pub struct Subject {
    /// The provider.
    pub provider: Arc<dyn Provider>,
    /// Its manifest (declared capabilities).
    pub manifest: ProviderManifest,
    /// Image for providers that need one.
    pub image: Option<String>,
    /// Run id: sandbox names and labels derive from it.
    pub run: String,
    /// Owner label on the sandboxes the suite creates for itself.
    pub owner: String,
    counter: Arc<AtomicU32>,
}

impl Subject {
    /// A subject; `run` must be short and made of `[a-z0-9-]`.
    pub fn new(
        provider: Arc<dyn Provider>,
        manifest: ProviderManifest,
        image: Option<String>,
        run: impl Into<String>,
    ) -> Subject {
        Subject {
            provider,
            manifest,
            image,
            run: run.into(),
            owner: OWNER.to_owned(),
            counter: Arc::default(),
        }
    }

    /// Labels the suite's own sandboxes with `owner` (so a killed run is found by that owner's
    /// sweep).
    pub fn with_owner(mut self, owner: impl Into<String>) -> Subject {
        self.owner = owner.into();
        self
    }

    /// A create request for a fresh sandbox of this run, owned by `owner`.
    pub fn request_for(&self, owner: &str) -> CreateRequest {
        let n = self.counter.fetch_add(1, Ordering::SeqCst);
        let name = format!("cf-{}-{n}", self.run);
        let mut req = CreateRequest::new(
            SandboxName(name.clone()),
            Labels {
                owner: owner.to_owned(),
                run_id: self.run.clone(),
                ledger_token: format!("cf-{name}"),
                expires_at_unix: None,
            },
        );
        req.image = self.image.clone();
        req
    }

    /// The declared support of a capability.
    pub fn declared(&self, capability: Capability) -> Support {
        self.manifest.support(capability)
    }
}

/// Runs one clause by id.
pub async fn run_clause(subject: &Subject, id: &str) -> ClauseResult {
    let clause = CLAUSES
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no conformance clause `{id}`"));
    let started = Instant::now();
    let (grade, diagnostics) = match clause.capability {
        Some(capability) if subject.declared(capability) == Support::Unsupported => (
            Grade::NotApplicable,
            vec![format!("`{capability}` is declared unsupported")],
        ),
        None if clause.id == "isolation.default_walls"
            && subject.manifest.isolation.walls.is_none() =>
        {
            (
                Grade::NotApplicable,
                vec!["the manifest declares no default walls".into()],
            )
        }
        _ => match (clause.run)(subject).await {
            clauses::Outcome::Pass(notes) => (Grade::Pass, notes),
            clauses::Outcome::Fail(why) => (Grade::Fail, vec![why]),
            clauses::Outcome::Unverified(why) => (Grade::Unverified, vec![why]),
        },
    };
    ClauseResult {
        clause: clause.id.to_owned(),
        capability: clause.capability,
        grade,
        diagnostics,
        duration_ms: started.elapsed().as_secs_f64() * 1000.0,
    }
}

/// Runs every clause, in order.
pub async fn run_all(subject: &Subject) -> Vec<ClauseResult> {
    let mut results = Vec::new();
    for clause in CLAUSES {
        results.push(run_clause(subject, clause.id).await);
    }
    results
}

/// Destroys whatever this run left behind (used by test harnesses after a panic).
pub async fn sweep_run(subject: &Subject) {
    if let Some(listing) = subject.provider.listing() {
        let filter = berth_contract::LabelFilter {
            owner: None,
            run_id: Some(subject.run.clone()),
        };
        if let Ok(listed) = listing.list(&filter).await {
            for item in listed {
                let _ = subject.provider.destroy(&item.native_id).await;
            }
        }
    }
}

/// Generates one `#[tokio::test]` per clause of the suite for a provider, plus a test that fails
/// when the suite gains a clause the list does not cover. `$subject` is an async expression
/// yielding `Option<(Subject, guard)>` (`None` = skipped explicitly, with a printed reason); the
/// guard (e.g. a temp dir) is dropped when the test ends.
#[macro_export]
macro_rules! all_conformance_tests {
    ($subject:expr) => {
        $crate::conformance_tests! {
            $subject;
            create_ready_exec => "core.create_ready_exec",
            exec_quoting_pipes_home => "core.exec_quoting_pipes_home",
            exec_timeout_kills => "core.exec_timeout_kills",
            destroy_twice_verified_gone => "core.destroy_twice_verified_gone",
            secret_canary_absent => "core.secret_canary_absent",
            default_walls => "isolation.default_walls",
            streaming_chunks => "exec_streaming.chunks",
            detached_spawn_status_kill => "exec_detached.spawn_status_kill",
            loopback_forward_round_trip_only => "loopback_forward.round_trip_only",
            access_terminal_and_ports => "access.terminal_and_ports",
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
    };
}

/// Generates one `#[tokio::test]` per listed clause (see [`all_conformance_tests!`] for every
/// clause, which is what providers use).
#[macro_export]
macro_rules! conformance_tests {
    ($subject:expr; $($name:ident => $id:literal),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let Some((subject, guard)) = $subject.await else { return };
                let result = $crate::run_clause(&subject, $id).await;
                $crate::sweep_run(&subject).await;
                drop(guard);
                assert!(
                    matches!(result.grade, $crate::Grade::Pass | $crate::Grade::NotApplicable),
                    "clause {} graded {:?}: {:?}",
                    result.clause,
                    result.grade,
                    result.diagnostics
                );
            }
        )*
        #[test]
        fn every_clause_has_a_test() {
            let covered: Vec<&str> = vec![$($id),*];
            for clause in $crate::CLAUSES {
                assert!(covered.contains(&clause.id), "no test for clause {}", clause.id);
            }
        }
    };
}
