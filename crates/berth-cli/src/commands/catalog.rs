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
    let path = dir.join(format!("{}.json", berth_manifest::file_stem(id)));
    let invalid = |why: String| {
        CliError::invalid(
            format!("evidence record {} is not valid: {why}", path.display()),
            "regenerate it with `berth verify`",
        )
    };
    let bytes = match berth_files::read_regular(&path, MAX_EVIDENCE_BYTES) {
        Ok(bytes) => bytes,
        Err(berth_files::ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(berth_files::ReadError::Io(e)) => {
            return Err(e).with_context(|| format!("cannot read {}", path.display()))
        }
        Err(refused) => return Err(invalid(refused.to_string()).into()),
    };
    let record = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    Ok(Some(record))
}

/// Evidence records shipped with this build (`catalog/evidence/`), by provider id.
const SHIPPED: &[(&str, &str)] = &[
    (
        "host",
        include_str!("../../../../catalog/evidence/host.json"),
    ),
    (
        "bwrap",
        include_str!("../../../../catalog/evidence/bwrap.json"),
    ),
    (
        "docker",
        include_str!("../../../../catalog/evidence/docker.json"),
    ),
    (
        "computesdk:just-bash",
        include_str!("../../../../catalog/evidence/computesdk.just-bash.json"),
    ),
];

/// Public keys shipped with this build (`catalog/keys/`): their signatures are trusted.
const SHIPPED_KEYS: &[(&str, &str)] = &[(
    "catalog/keys/berth-catalog.pub",
    include_str!("../../../../catalog/keys/berth-catalog.pub"),
)];

/// Reads a small text file (keys): a regular file of at most 4 KiB.
fn read_small(path: &Path, what: &str) -> Result<String> {
    let invalid = |why: String| CliError::invalid(format!("{what} {}: {why}", path.display()), "");
    let bytes = berth_files::read_regular(path, 4096).map_err(|e| invalid(e.to_string()))?;
    String::from_utf8(bytes).map_err(|_| invalid("not UTF-8 text".into()).into())
}

/// The signing key in `path` (hex seed). Its value is never shown.
pub fn signing_key(path: &Path) -> Result<ed25519_dalek::SigningKey> {
    let text = read_small(path, "signing key")?;
    berth_evidence::signing_key_from_hex(&text).map_err(|why| {
        CliError::invalid(
            format!("signing key {}: {why}", path.display()),
            "make one with `berth catalog keygen FILE`",
        )
        .into()
    })
}

fn trusted_keys(extra: &[PathBuf]) -> Result<Vec<[u8; 32]>> {
    let mut keys = Vec::new();
    for (origin, text) in SHIPPED_KEYS {
        keys.push(
            berth_evidence::public_key_from_hex(text)
                .map_err(|why| anyhow::anyhow!("shipped key {origin}: {why}"))?,
        );
    }
    for path in extra {
        let text = read_small(path, "public key")?;
        keys.push(berth_evidence::public_key_from_hex(&text).map_err(|why| {
            CliError::invalid(format!("public key {}: {why}", path.display()), "")
        })?);
    }
    Ok(keys)
}

/// Where a provider's record came from.
#[derive(Debug, Clone, serde::Serialize)]
struct Origin {
    /// `explicit`, `local` or `shipped`.
    kind: &'static str,
    path: String,
}

/// A provider's record: from `--evidence DIR` only when given; else the local record, else the
/// shipped one.
fn record_for(
    explicit: Option<&Path>,
    local: &Path,
    id: &str,
) -> Result<Option<(EvidenceRecord, Origin)>> {
    let origin = |kind, dir: &Path| Origin {
        kind,
        path: dir
            .join(format!("{}.json", berth_manifest::file_stem(id)))
            .display()
            .to_string(),
    };
    if let Some(dir) = explicit {
        return Ok(load(dir, id)?.map(|r| (r, origin("explicit", dir))));
    }
    if let Some(record) = load(local, id)? {
        return Ok(Some((record, origin("local", local))));
    }
    for (shipped_id, text) in SHIPPED {
        if *shipped_id == id {
            let record = serde_json::from_str(text).with_context(|| {
                format!("the shipped evidence record for `{id}` does not parse")
            })?;
            return Ok(Some((
                record,
                Origin {
                    kind: "shipped",
                    path: format!("catalog/evidence/{}.json", berth_manifest::file_stem(id)),
                },
            )));
        }
    }
    Ok(None)
}

/// One provider's row of the catalog.
struct Row {
    id: String,
    /// The manifest says it was verified (timestamp or evidence pointer set).
    claims_verification: bool,
    /// This build has an adapter for it.
    built_in: bool,
    /// Live proof needs secret credentials (a cloud provider): no record is UNKNOWN, not a
    /// failed check.
    needs_credentials: bool,
    /// Clauses the manifest declares known failures that the record does not show failing.
    stale_known_failures: Vec<String>,
    capabilities: BTreeMap<String, Status>,
    /// The record, summarised, and where it came from.
    evidence: Option<serde_json::Value>,
    /// Capabilities the manifest declares supported (and the core).
    declared: Vec<String>,
}

/// The catalog for people: one table, capabilities down and providers across, then each
/// provider's evidence and the reasons behind its UNKNOWN and FAILED cells.
fn render_catalog(table: &[Row], colour: bool) -> String {
    use crate::human::{Style, Table};
    use std::fmt::Write as _;
    let mut headers = vec!["CAPABILITY"];
    headers.extend(table.iter().map(|row| row.id.as_str()));
    let mut grid = Table::new(&headers);
    let capabilities: std::collections::BTreeSet<&String> = table
        .iter()
        .flat_map(|row| row.capabilities.keys())
        .collect();
    for capability in capabilities {
        let mut cells = vec![(capability.clone(), Style::Plain)];
        for row in table {
            cells.push(match row.capabilities.get(capability) {
                Some(Status::Verified) => ("VERIFIED".into(), Style::Good),
                Some(Status::Failed(_)) => ("FAILED".into(), Style::Bad),
                Some(Status::Unknown(_)) => ("UNKNOWN".into(), Style::Warn),
                Some(Status::Unsupported) => ("UNSUPPORTED".into(), Style::Dim),
                None => ("-".into(), Style::Dim),
            });
        }
        grid.styled_row(cells);
    }
    let mut out = grid.render(colour);
    out.push('\n');
    for row in table {
        let _ = match &row.evidence {
            Some(e) => writeln!(
                out,
                "{}: evidence {} {}, recorded {}, {}, adapter {}, kit {}, signed by {}",
                row.id,
                e["origin"]["kind"].as_str().unwrap_or(""),
                e["origin"]["path"].as_str().unwrap_or(""),
                e["finished_at"].as_str().unwrap_or(""),
                e["observed"].as_str().unwrap_or("no engine reported"),
                e["adapter_source_hash"].as_str().unwrap_or(""),
                e["conformance_kit_hash"].as_str().unwrap_or(""),
                e["signed_by"].as_str().unwrap_or("nobody"),
            ),
            None => writeln!(out, "{}: no evidence record", row.id),
        };
        // Each distinct reason once, with the capabilities it explains.
        let mut reasons: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for (capability, status) in &row.capabilities {
            if let Status::Unknown(why) | Status::Failed(why) = status {
                let label = match status {
                    Status::Failed(_) => format!("FAILED({why})"),
                    _ => format!("UNKNOWN({why})"),
                };
                reasons.entry(label).or_default().push(capability);
            }
        }
        for (reason, capabilities) in reasons {
            let _ = writeln!(out, "  {reason}: {}", capabilities.join(", "));
        }
    }
    out
}

fn statuses(
    registry: &Registry,
    explicit: Option<&Path>,
    local: &Path,
    keys: &[[u8; 32]],
    only: Option<&str>,
) -> Result<Vec<Row>> {
    if let Some(dir) = explicit {
        if !dir.is_dir() {
            return Err(CliError::invalid(
                match dir.symlink_metadata() {
                    Err(_) => format!("evidence directory {} does not exist", dir.display()),
                    Ok(_) => format!("evidence directory {} is not a directory", dir.display()),
                },
                "name a directory `berth verify --out` wrote, or leave --evidence out",
            )
            .into());
        }
    }
    // The library's clauses plus the runner-level must-fire clause `berth verify` adds.
    let clauses: Vec<(&str, Option<&str>)> = berth_conformance::CLAUSES
        .iter()
        .map(|c| (c.id, c.capability.map(|c| c.as_str())))
        .chain(std::iter::once((super::verify::SIGTERM_CLAUSE, None)))
        .collect();
    let mut out = Vec::new();
    for manifest in registry.manifests()? {
        if only.is_some_and(|id| id != manifest.id) {
            continue;
        }
        let found = record_for(explicit, local, &manifest.id)?;
        let source_hash = berth_factory::adapter_source_hash(&manifest.id);
        let expect = Expectations {
            clauses: clauses.clone(),
            adapter_source_hash: source_hash,
            conformance_kit_hash: berth_factory::conformance_kit_hash(),
            now: Utc::now(),
            trusted_keys: keys.to_vec(),
        };
        let claims =
            manifest.verification.verified_at.is_some() || manifest.verification.evidence.is_some();
        let declared = std::iter::once(berth_evidence::CORE.to_owned())
            .chain(
                berth_contract::Capability::ALL
                    .iter()
                    .filter(|c| manifest.support(**c) == berth_contract::Support::Supported)
                    .map(|c| c.as_str().to_owned()),
            )
            .collect();
        out.push(Row {
            id: manifest.id.clone(),
            claims_verification: claims,
            built_in: source_hash.is_some(),
            needs_credentials: manifest.required_secrets().next().is_some(),
            stale_known_failures: found
                .as_ref()
                .map(|(record, _)| berth_evidence::stale_known_failures(manifest, record))
                .unwrap_or_default(),
            capabilities: evaluate(manifest, found.as_ref().map(|(r, _)| r), &expect),
            evidence: found.map(|(record, origin)| {
                json!({
                    "origin": origin,
                    "finished_at": record.finished_at,
                    "observed": record.provenance.observed,
                    "kernel": record.environment.kernel,
                    "adapter_source_hash": record.adapter_source_hash,
                    "conformance_kit_hash": record.conformance_kit_hash,
                    "signed_by": record.signature.as_ref().map(|s| s.key_id.clone()),
                })
            }),
            declared,
        });
    }
    if let Some(id) = only {
        registry.manifest(id)?;
    }
    Ok(out)
}

fn keygen(json: bool, file: &Path) -> Result<i32> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no OS randomness: {e}"))?;
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    let public = key.verifying_key().to_bytes();
    let public_path = PathBuf::from(format!("{}.pub", file.display()));
    // Both files are new (never a symlink followed, never an existing file replaced), and a
    // failure part-way leaves neither behind.
    let create = |path: &Path, mode: u32, text: String| -> Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .with_context(|| format!("cannot create {} (it must not exist)", path.display()))?;
        let written = file
            .write_all(text.as_bytes())
            .and_then(|()| file.sync_all());
        if let Err(e) = written {
            let _ = std::fs::remove_file(path);
            return Err(anyhow::Error::from(e).context(format!("cannot write {}", path.display())));
        }
        Ok(())
    };
    create(file, 0o600, format!("{}\n", hex::encode(seed)))?;
    if let Err(e) = create(&public_path, 0o644, format!("{}\n", hex::encode(public))) {
        let _ = std::fs::remove_file(file);
        return Err(e);
    }
    let id = berth_evidence::key_id(&public);
    if json {
        emit(
            "catalog keygen",
            json!({ "private_key": file, "public_key": public_path, "key_id": id }),
        );
    } else {
        outln!(
            "key {id}: private {} (mode 0600; keep it secret), public {}",
            file.display(),
            public_path.display()
        );
    }
    Ok(code::OK)
}

/// Runs a catalog subcommand.
pub fn run(config: &Config, json: bool, command: &CatalogCommand) -> Result<i32> {
    let source = match command {
        CatalogCommand::Keygen { file } => return keygen(json, file),
        CatalogCommand::Show { source, .. } | CatalogCommand::Check { source } => source,
    };
    let registry = match &source.catalog {
        // Manifests from a directory are validated like the built-in ones; whether an adapter
        // exists is this build's answer (its adapter source hashes).
        Some(dir) => Registry::with_manifests(berth_manifest::load_dir(dir)?),
        None => Registry::builtin()?,
    };
    let keys = trusted_keys(&source.trust_keys)?;
    let local = config.home.join("evidence");
    let explicit = source.evidence.as_deref();
    let shown_dir = explicit.map(Path::to_path_buf).unwrap_or(local.clone());
    match command {
        CatalogCommand::Show { provider, .. } => {
            let table = statuses(&registry, explicit, &local, &keys, provider.as_deref())?;
            if json {
                let providers: Vec<_> = table
                    .iter()
                    .map(|row| {
                        json!({ "id": row.id, "evidence": row.evidence, "capabilities": row.capabilities })
                    })
                    .collect();
                emit(
                    "catalog show",
                    json!({ "evidence_dir": shown_dir, "providers": providers }),
                );
            } else {
                out!(
                    "{}",
                    render_catalog(&table, crate::human::colour_on_stdout(config))
                );
            }
            Ok(code::OK)
        }
        CatalogCommand::Check { .. } => {
            let table = statuses(&registry, explicit, &local, &keys, None)?;
            let mut problems = Vec::new();
            for row in &table {
                let id = &row.id;
                for clause in &row.stale_known_failures {
                    problems.push(format!(
                        "{id}: the manifest declares `{clause}` a known failure, but the evidence does not show it failing; remove it from [verification] known_failures"
                    ));
                }
                for (capability, status) in &row.capabilities {
                    match status {
                        Status::Failed(why) if why.starts_with(berth_evidence::KNOWN_FAILURE) => {}
                        Status::Failed(why) => problems.push(format!(
                            "{id}/{capability}: declared supported but the evidence fails: {why}"
                        )),
                        Status::Unknown(why) if row.claims_verification => problems.push(format!(
                            "{id}/{capability}: the manifest claims verification but the evidence does not prove it: {why}"
                        )),
                        Status::Unknown(why)
                            if row.built_in
                                && row.declared.contains(capability)
                                && !(row.needs_credentials && row.evidence.is_none()) =>
                        {
                            problems.push(format!(
                                "{id}/{capability}: declared supported by an adapter in this build, but not VERIFIED: {why}"
                            ))
                        }
                        _ => {}
                    }
                }
            }
            if json {
                emit(
                    "catalog check",
                    json!({ "evidence_dir": shown_dir, "ok": problems.is_empty(), "problems": problems }),
                );
            } else if problems.is_empty() {
                outln!(
                    "catalog check: ok ({} providers; nothing claims more than its evidence)",
                    table.len()
                );
            } else {
                for problem in &problems {
                    errln!(
                        "catalog check: {}",
                        crate::human::printable(&problem.to_string(), true)
                    );
                }
            }
            Ok(if problems.is_empty() {
                code::OK
            } else {
                code::VERIFICATION_FAILED
            })
        }
        CatalogCommand::Keygen { .. } => unreachable!("handled above"),
    }
}
