//! `berth verify PROVIDER`: arguments in, each clause's grade on stderr as it is graded, the
//! record's path out. The work is `berth_verify`'s.

use anyhow::Result;
use serde_json::json;

use crate::app::App;
use crate::cli::VerifyArgs;
use crate::errors::code;
use crate::output::emit;

pub use berth_verify::SIGTERM_CLAUSE;

/// `berth verify`.
pub async fn verify(app: &App, args: VerifyArgs) -> Result<i32> {
    let key = match &args.sign_key {
        Some(path) => Some(super::catalog::signing_key(path)?),
        None => None,
    };
    let berth = std::env::current_exe()?;
    let ctx = berth_verify::VerifyContext {
        registry: &app.registry,
        provider_config: &app.provider_config,
        ledger: &app.ledger,
        home: &app.config.home,
        berth: &berth,
    };
    let options = berth_verify::VerifyOptions {
        provider: args.provider.clone(),
        image: args.image.clone(),
        out: args.out.clone(),
        iterations: args.iterations,
    };
    let json = app.json;
    let line = crate::human::Progress::new(json);
    let total = berth_conformance::CLAUSES.len() + 1;
    let mut graded = 0;
    let mut progress = |clause: &berth_evidence::ClauseEvidence| {
        graded += 1;
        if !json {
            line.clear();
            errln!(
                "{:<40} {:<15} {}",
                clause.clause,
                format!("{:?}", clause.grade).to_lowercase(),
                clause.diagnostics.join("; ")
            );
            line.show(&format!(
                "verify {}: {graded}/{total} clauses graded",
                args.provider
            ));
        }
    };
    let done = berth_verify::verify(ctx, &options, key.as_ref(), &mut progress).await?;
    line.clear();
    let (record, path, failed, known) = (&done.record, &done.path, done.failed, done.known_failed);
    if app.json {
        emit(
            "verify",
            json!({ "provider": record.provider, "record": path, "failed_clauses": failed, "known_failures": known, "evidence": record }),
        );
    } else {
        outln!(
            "evidence: {} ({} clauses, {failed} failed{}, content {}, {})",
            path.display(),
            record.clauses.len(),
            if known > 0 {
                format!(" ({known} of them known failures the manifest declares)")
            } else {
                String::new()
            },
            record.content_hash,
            match &record.signature {
                Some(s) => format!("signed by key {}", s.key_id),
                None => "unsigned: the gate will call it UNKNOWN".into(),
            }
        );
    }
    // Exactly the failures the manifest declares are the truth it already tells; anything
    // else fails the run.
    Ok(if failed == known {
        code::OK
    } else {
        code::VERIFICATION_FAILED
    })
}
