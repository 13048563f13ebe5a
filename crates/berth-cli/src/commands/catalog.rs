//! `berth catalog show|check`: what the evidence gate says about every provider.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use berth_evidence::{evaluate, EvidenceRecord, Expectations, Status};
use berth_factory::Registry;
use chrono::Utc;
use serde_json::json;

use crate::cli::CatalogCommand;
use crate::config::Config;
use crate::errors::{code, CliError};
use crate::output::emit;

/// The largest evidence record read; real records are a few KiB.
const MAX_EVIDENCE_BYTES: u64 = 4 * 1024 * 1024;

fn load(dir: &Path, id: &str) -> Result<Option<EvidenceRecord>> {
    use std::io::Read;
    let path = dir.join(format!("{id}.json"));
    let invalid = |why: String| {
        CliError::invalid(
            format!("evidence record {} is not valid: {why}", path.display()),
            "regenerate it with `berth verify`",
        )
    };
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    if !file.metadata()?.is_file() {
        return Err(invalid("not a regular file".into()).into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_EVIDENCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > MAX_EVIDENCE_BYTES {
        return Err(invalid(format!("larger than {MAX_EVIDENCE_BYTES} bytes")).into());
    }
    let record = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    Ok(Some(record))
}

/// One provider's row of the catalog.
struct Row {
    id: String,
    /// The manifest says it was verified (timestamp or evidence pointer set).
    claims_verification: bool,
    capabilities: BTreeMap<String, Status>,
}

fn statuses(registry: &Registry, dir: &Path, only: Option<&str>) -> Result<Vec<Row>> {
    // The library's clauses plus the runner-level must-fire clause `berth verify` adds.
    let clauses: Vec<(&str, Option<&str>)> = berth_conformance::CLAUSES
        .iter()
        .map(|c| (c.id, c.capability.map(|c| c.as_str())))
        .chain(std::iter::once((super::verify::SIGTERM_CLAUSE, None)))
        .collect();
    let mut out = Vec::new();
    for manifest in registry.manifests() {
        if only.is_some_and(|id| id != manifest.id) {
            continue;
        }
        let record = load(dir, &manifest.id)?;
        let expect = Expectations {
            clauses: clauses.clone(),
            adapter_source_hash: berth_factory::adapter_source_hash(&manifest.id),
            now: Utc::now(),
        };
        let claims =
            manifest.verification.verified_at.is_some() || manifest.verification.evidence.is_some();
        out.push(Row {
            id: manifest.id.clone(),
            claims_verification: claims,
            capabilities: evaluate(manifest, record.as_ref(), &expect),
        });
    }
    if let Some(id) = only {
        registry.manifest(id)?;
    }
    Ok(out)
}

/// Runs a catalog subcommand.
pub fn run(config: &Config, json: bool, command: &CatalogCommand) -> Result<i32> {
    let (CatalogCommand::Show { catalog, .. } | CatalogCommand::Check { catalog, .. }) = command;
    let registry = match catalog {
        // Manifests from a directory are validated like the built-in ones; whether an adapter
        // exists is this build's answer (its adapter source hashes).
        Some(dir) => Registry::with_manifests(berth_manifest::load_dir(dir)?),
        None => Registry::builtin()?,
    };
    let default_dir = || config.home.join("evidence");
    match command {
        CatalogCommand::Show {
            provider, evidence, ..
        } => {
            let dir: PathBuf = evidence.clone().unwrap_or_else(default_dir);
            let table = statuses(&registry, &dir, provider.as_deref())?;
            if json {
                let providers: Vec<_> = table
                    .iter()
                    .map(|row| json!({ "id": row.id, "capabilities": row.capabilities }))
                    .collect();
                emit(
                    "catalog show",
                    json!({ "evidence_dir": dir, "providers": providers }),
                );
            } else {
                for row in &table {
                    println!("{}", row.id);
                    for (capability, status) in &row.capabilities {
                        println!("  {capability:<20} {status}");
                    }
                }
            }
            Ok(code::OK)
        }
        CatalogCommand::Check { evidence, .. } => {
            let dir: PathBuf = evidence.clone().unwrap_or_else(default_dir);
            let table = statuses(&registry, &dir, None)?;
            let mut problems = Vec::new();
            for row in &table {
                let id = &row.id;
                for (capability, status) in &row.capabilities {
                    match status {
                        Status::Failed(why) => problems.push(format!(
                            "{id}/{capability}: declared supported but the evidence fails: {why}"
                        )),
                        Status::Unknown(why) if row.claims_verification => problems.push(format!(
                            "{id}/{capability}: the manifest claims verification but the evidence does not prove it: {why}"
                        )),
                        _ => {}
                    }
                }
            }
            if json {
                emit(
                    "catalog check",
                    json!({ "evidence_dir": dir, "ok": problems.is_empty(), "problems": problems }),
                );
            } else if problems.is_empty() {
                println!(
                    "catalog check: ok ({} providers; nothing claims more than its evidence)",
                    table.len()
                );
            } else {
                for problem in &problems {
                    eprintln!("catalog check: {problem}");
                }
            }
            Ok(if problems.is_empty() {
                code::OK
            } else {
                code::VERIFICATION_FAILED
            })
        }
    }
}
