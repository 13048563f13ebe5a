//! `berth verify PROVIDER` as a library: the conformance suite, a runner-level must-fire clause
//! (SIGTERM of a `berth run`) and a short lifecycle measurement, live, written as a sealed (or
//! signed) evidence record. The CLI parses arguments and prints; everything else is here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_conformance::{Grade, Subject};
use berth_contract::{DestroyOutcome, ExecRequest, Observation};
use berth_evidence::{
    ClauseEvidence, Environment, EvidenceRecord, Metric, Provenance, EVIDENCE_SCHEMA,
};
use berth_factory::{FactoryError, ProviderConfig, Registry};
use berth_ledger::Ledger;
use berth_store::LedgerStore as _;
use chrono::Utc;

/// What verification reads.
#[derive(Debug, Clone, Copy)]
pub struct VerifyContext<'a> {
    /// Providers.
    pub registry: &'a Registry,
    /// Their configuration.
    pub provider_config: &'a ProviderConfig,
    /// The ledger (the must-fire clause reads the runner's rows from its store).
    pub ledger: &'a Ledger,
    /// `BERTH_HOME` (the runner under test shares it).
    pub home: &'a Path,
    /// The `berth` executable (the must-fire clause runs `berth run` and terminates it).
    pub berth: &'a Path,
}

/// What to verify.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// The provider.
    pub provider: String,
    /// Image for providers that need one.
    pub image: Option<String>,
    /// Directory for the record (default `$BERTH_HOME/evidence`).
    pub out: Option<PathBuf>,
    /// Lifecycle iterations.
    pub iterations: usize,
}

/// A finished verification.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The record as written.
    pub record: EvidenceRecord,
    /// Where it was written.
    pub path: PathBuf,
    /// How many clauses failed.
    pub failed: usize,
    /// How many of those the manifest declares known failures
    /// (`[verification] known_failures`).
    pub known_failed: usize,
}

/// Verification could not run or its record could not be written (a failed clause is not an
/// error: it is in the record).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The provider cannot be verified by this build.
    #[error("no adapter source hash for `{0}`: only providers with an adapter in this build can be verified")]
    NoAdapter(String),
    /// The provider could not be constructed.
    #[error("{0}")]
    Factory(#[from] FactoryError),
    /// The record could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn grade(grade: Grade) -> berth_evidence::Grade {
    match grade {
        Grade::Pass => berth_evidence::Grade::Pass,
        Grade::Fail => berth_evidence::Grade::Fail,
        Grade::NotApplicable => berth_evidence::Grade::NotApplicable,
        Grade::Unverified => berth_evidence::Grade::Unverified,
    }
}

fn summary(samples: &mut [Duration], what: &str) -> Metric {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    match (
        berth_evidence::median(&mut ms),
        berth_evidence::percentile(&mut ms, 0.95),
    ) {
        (Some(median_ms), Some(p95_ms)) => Metric::Measured {
            median_ms,
            p95_ms,
            n: ms.len(),
        },
        _ => Metric::Unknown {
            reason: format!("no successful {what} sample"),
        },
    }
}

/// create → first exec → destroy → observe gone, per phase. A phase that did not happen is
/// UNKNOWN with the reason, never zero.
async fn lifecycle(subject: &Subject, iterations: usize) -> BTreeMap<String, Metric> {
    let (mut create, mut first_exec, mut destroy, mut gone) = (vec![], vec![], vec![], vec![]);
    let mut problems: Vec<String> = Vec::new();
    for _ in 0..iterations {
        let t0 = Instant::now();
        let created = match subject
            .provider
            .create(&subject.request_for(&subject.owner))
            .await
        {
            Ok(created) => created,
            Err(e) => {
                problems.push(format!("create: {e}"));
                continue;
            }
        };
        create.push(t0.elapsed());
        let id = created.native_id;
        let t1 = Instant::now();
        match subject
            .provider
            .exec(&id, &ExecRequest::argv(["true"]))
            .await
        {
            Ok(out) if out.status.success() => first_exec.push(t1.elapsed()),
            Ok(out) => problems.push(format!("first exec: {}", out.status)),
            Err(e) => problems.push(format!("first exec: {e}")),
        }
        let t2 = Instant::now();
        match subject.provider.destroy(&id).await {
            Ok(DestroyOutcome::VerifiedGone { .. }) => {
                destroy.push(t2.elapsed());
                // The provider verified it; observe once more, as the ledger would.
                if let Ok(Observation::Absent) = subject.provider.observe(&id).await {
                    gone.push(t2.elapsed());
                } else {
                    problems.push("observe after verified destroy did not say absent".into());
                }
            }
            Ok(DestroyOutcome::Accepted { raw_state }) => {
                destroy.push(t2.elapsed());
                problems.push(format!("destroy accepted, not verified (raw {raw_state})"));
            }
            Err(e) => problems.push(format!("destroy: {e}")),
        }
    }
    let mut metrics = BTreeMap::new();
    metrics.insert("create_ms".into(), summary(&mut create, "create"));
    metrics.insert(
        "first_exec_ms".into(),
        summary(&mut first_exec, "first exec"),
    );
    metrics.insert("destroy_ms".into(), summary(&mut destroy, "destroy"));
    metrics.insert(
        "verified_gone_ms".into(),
        summary(&mut gone, "verified-gone"),
    );
    metrics.insert(
        "lifecycle_success_rate".into(),
        if iterations == 0 {
            Metric::Unknown {
                reason: "no iterations".into(),
            }
        } else {
            Metric::Ratio {
                successes: gone.len(),
                n: iterations,
            }
        },
    );
    if !problems.is_empty() {
        metrics.insert(
            "lifecycle_problems".into(),
            Metric::Unknown {
                reason: problems.join("; "),
            },
        );
    }
    metrics
}

/// Runs every clause (reporting each to `progress` as it is graded), measures the lifecycle,
/// and writes the record — signed with `sign_key`, else sealed (which the gate treats as
/// UNKNOWN).
pub async fn verify(
    ctx: VerifyContext<'_>,
    args: &VerifyOptions,
    sign_key: Option<&ed25519_dalek::SigningKey>,
    progress: &mut (dyn FnMut(&ClauseEvidence) + Send),
) -> Result<Verified, VerifyError> {
    let provider = ctx
        .registry
        .construct(&args.provider, ctx.provider_config)?;
    let manifest = ctx.registry.manifest(&args.provider)?.clone();
    let source_hash = berth_factory::adapter_source_hash(&args.provider)
        .ok_or_else(|| VerifyError::NoAdapter(args.provider.clone()))?;
    let run = format!("v{}", &ctx.ledger.run_id()["run-".len()..]);
    let subject = Subject::new(provider, manifest.clone(), args.image.clone(), run.clone())
        .with_owner(ctx.ledger.owner());
    let started_at = Utc::now();
    let mut clauses = Vec::new();
    for clause in berth_conformance::CLAUSES {
        let result = berth_conformance::run_clause(&subject, clause.id).await;
        let evidence = ClauseEvidence {
            clause: result.clause,
            capability: result.capability.map(|c| c.as_str().to_owned()),
            grade: grade(result.grade),
            diagnostics: result.diagnostics,
            duration_ms: result.duration_ms,
        };
        progress(&evidence);
        clauses.push(evidence);
    }
    let sigterm = must_fire_on_sigterm(ctx, args).await;
    progress(&sigterm);
    clauses.push(sigterm);
    let metrics = lifecycle(&subject, args.iterations).await;
    berth_conformance::sweep_run(&subject).await;
    let record = EvidenceRecord {
        schema: EVIDENCE_SCHEMA.into(),
        provider: manifest.id.clone(),
        adapter_version: manifest.adapter_version.clone(),
        adapter_source_hash: source_hash.to_owned(),
        conformance_kit_hash: berth_factory::conformance_kit_hash().to_owned(),
        provenance: Provenance {
            source: manifest.provenance.source.clone(),
            pinned: manifest.provenance.pinned.clone(),
            observed: berth_factory::observed_provenance(&manifest.id, ctx.provider_config).await,
        },
        environment: Environment {
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|k| k.trim().to_owned())
                .unwrap_or_else(|_| "UNKNOWN(no /proc/sys/kernel/osrelease)".into()),
            berth_version: env!("CARGO_PKG_VERSION").into(),
        },
        run_id: run,
        started_at,
        finished_at: Utc::now(),
        clauses,
        metrics,
        content_hash: String::new(),
        signature: None,
    };
    let record = match sign_key {
        Some(key) => record.sign(key),
        None => record.seal(),
    };
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| ctx.home.join("evidence"));
    std::fs::create_dir_all(&dir).map_err(|source| VerifyError::Write {
        path: dir.clone(),
        source,
    })?;
    let path = dir.join(format!("{}.json", berth_manifest::file_stem(&manifest.id)));
    let text = serde_json::to_string_pretty(&record).expect("a record serializes");
    // Whole or not at all: a record cut short by a crash would throw away the one before.
    berth_files::write_replacing(&path, (text + "\n").as_bytes(), 0o644).map_err(|source| {
        VerifyError::Write {
            path: path.clone(),
            source,
        }
    })?;
    let failing: Vec<&str> = record
        .clauses
        .iter()
        .filter(|c| c.grade == berth_evidence::Grade::Fail)
        .map(|c| c.clause.as_str())
        .collect();
    let failed = failing.len();
    let known_failed = failing
        .iter()
        .filter(|id| manifest.verification.known_failures.contains_key(**id))
        .count();
    Ok(Verified {
        record,
        path,
        failed,
        known_failed,
    })
}

/// The id of the runner-level must-fire clause `berth verify` adds to the library's clauses.
pub const SIGTERM_CLAUSE: &str = "teardown.must_fire_on_sigterm";

/// Must-fire under SIGTERM of the runner: a `berth run` holding a sandbox of this provider is
/// terminated; it must exit 143 having destroyed the sandbox (ledger verified gone, provider
/// says absent).
async fn must_fire_on_sigterm(ctx: VerifyContext<'_>, args: &VerifyOptions) -> ClauseEvidence {
    let started = Instant::now();
    let outcome = sigterm_check(ctx, args).await;
    ClauseEvidence {
        clause: SIGTERM_CLAUSE.into(),
        capability: None,
        grade: if outcome.is_ok() {
            berth_evidence::Grade::Pass
        } else {
            berth_evidence::Grade::Fail
        },
        diagnostics: match outcome {
            Ok(note) => vec![note],
            Err(why) => vec![why],
        },
        duration_ms: started.elapsed().as_secs_f64() * 1000.0,
    }
}

async fn sigterm_check(ctx: VerifyContext<'_>, args: &VerifyOptions) -> Result<String, String> {
    let owner = format!("{}-verify-sigterm", ctx.ledger.owner());
    let mut cmd = std::process::Command::new(ctx.berth);
    cmd.args(["run", "-p", &args.provider]);
    if let Some(image) = &args.image {
        cmd.args(["--image", image]);
    }
    cmd.args(["--", "sleep", "60"])
        .env("BERTH_HOME", ctx.home)
        .env("BERTH_OWNER", &owner)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start berth run: {e}"))?;
    let store = ctx.ledger.store();
    let query = berth_store::LedgerQuery {
        owner: Some(owner.clone()),
        run_id: None,
        include_gone: true,
    };
    let until = Instant::now() + Duration::from_secs(60);
    let row = loop {
        let rows = store.ledger_list(&query).await.map_err(|e| e.to_string())?;
        if let Some(row) = rows
            .into_iter()
            .find(|r| r.state == berth_store::LedgerState::Created)
        {
            break row;
        }
        if Instant::now() > until {
            let _ = child.kill();
            return Err("the runner never recorded a created sandbox".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Let the command start inside the sandbox, then terminate the runner.
    tokio::time::sleep(Duration::from_millis(300)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .map_err(|e| format!("cannot signal the runner: {e}"))?;
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    if status.code() != Some(143) {
        return Err(format!("the runner exited {status:?}, not 143"));
    }
    let after = store
        .ledger_get(&row.berth_id)
        .await
        .map_err(|e| e.to_string())?;
    if after.state != berth_store::LedgerState::VerifiedGone {
        return Err(format!("after SIGTERM the ledger row is {}", after.state));
    }
    let provider = ctx
        .registry
        .construct(&args.provider, ctx.provider_config)
        .map_err(|e| e.to_string())?;
    let seen = provider
        .observe(&berth_ledger::native_id(&after))
        .await
        .map_err(|e| e.to_string())?;
    if !matches!(seen, Observation::Absent) {
        return Err(format!("after SIGTERM the provider still reports {seen:?}"));
    }
    Ok(format!(
        "runner exited 143; {} verified gone",
        after.berth_id
    ))
}
