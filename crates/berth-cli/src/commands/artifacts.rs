//! `berth artifacts query | export | show | get | reconcile`: the attempts' published bundles.
//!
//! Only bundles of this owner's missions are shown. `get` verifies the object's hash against
//! the index before writing a byte; with `--json` the file goes to `--out`, never to stdout
//! beside the document.

use std::collections::BTreeSet;

use anyhow::Result;
use berth_artifacts::ArtifactError;
use berth_store::{ArtifactQuery, ArtifactStore, MissionStore, PublicationState};
use serde_json::json;

use crate::app::App;
use crate::cli::{ArtifactFilter, ArtifactsCommand};
use crate::errors::{code, CliError};
use crate::output::emit;

fn artifact_error(e: ArtifactError) -> anyhow::Error {
    match e {
        ArtifactError::NotFound(what) => CliError::not_found(
            format!("not found: {what}"),
            "`berth artifacts query` lists what is published",
        )
        .into(),
        ArtifactError::Invalid(what) => CliError::invalid(what, "see the message").into(),
        ArtifactError::Corrupt(what) => CliError {
            kind: "tampered",
            exit_code: code::TAMPERED,
            message: format!("corrupt artifact: {what}"),
            hint: Some(
                "the stored object does not hash to what the index says; nothing was \
                        written"
                    .into(),
            ),
        }
        .into(),
        other => anyhow::Error::new(other),
    }
}

/// This owner's mission ids.
async fn owned(app: &App) -> Result<BTreeSet<String>> {
    Ok(app
        .ledger
        .store()
        .mission_list(app.ledger.owner())
        .await?
        .into_iter()
        .map(|m| m.id)
        .collect())
}

fn objects(app: &App) -> Result<berth_artifacts::Objects> {
    app.objects()
}

/// This owner's index rows that match `filter`.
async fn matching(app: &App, filter: ArtifactFilter) -> Result<Vec<berth_store::ArtifactRow>> {
    let mine = owned(app).await?;
    Ok(app
        .ledger
        .store()
        .artifacts(&ArtifactQuery {
            mission_id: filter.mission,
            task_id: filter.task,
            attempt_key: filter.attempt,
            bundle_id: filter.bundle,
            accepted: match (filter.accepted, filter.rejected) {
                (true, false) => Some(true),
                (false, true) => Some(false),
                _ => None,
            },
            mime: filter.mime,
            path: filter.path,
        })
        .await?
        .into_iter()
        .filter(|r| mine.contains(&r.mission_id))
        .collect())
}

/// `berth artifacts …`.
pub async fn run(app: &App, command: ArtifactsCommand) -> Result<i32> {
    let store = app.ledger.store();
    match command {
        ArtifactsCommand::Query { filter } => {
            let rows = matching(app, filter).await?;
            if app.json {
                emit("artifacts query", json!({ "artifacts": rows }));
            } else if rows.is_empty() {
                outln!("no artifacts match");
            } else {
                outln!(
                    "{:<37} {:<28} {:<8} {:<26} {:>10}  PATH",
                    "BUNDLE",
                    "ATTEMPT",
                    "ACCEPTED",
                    "MIME",
                    "BYTES"
                );
                for r in &rows {
                    outln!(
                        "{:<37} {:<28} {:<8} {:<26} {:>10}  {}",
                        r.bundle_id,
                        r.attempt_key,
                        if r.accepted { "yes" } else { "no" },
                        r.mime,
                        r.size,
                        r.path
                    );
                }
            }
            Ok(code::OK)
        }
        ArtifactsCommand::Export { parquet, filter } => {
            let rows = matching(app, filter).await?;
            let exported =
                berth_artifacts::export::write_parquet(&rows, &parquet).map_err(|e| match e {
                    ArtifactError::Invalid(what) => {
                        CliError::invalid(what, "name a directory that is not a symlink").into()
                    }
                    e => artifact_error(e),
                })?;
            if app.json {
                emit("artifacts export", json!({ "exported": exported }));
            } else {
                outln!(
                    "wrote {} rows ({} bytes, schema {}) to {}",
                    exported.rows,
                    exported.bytes,
                    exported.schema,
                    exported.path.display()
                );
            }
            Ok(code::OK)
        }
        #[cfg(feature = "iceberg")]
        ArtifactsCommand::Iceberg => {
            use berth_artifacts::iceberg_index::{IcebergIndex, NAMESPACE, TABLE};
            let warehouse = app
                .config
                .home
                .join(berth_orchestrator::publication::ICEBERG_WAREHOUSE);
            let index = IcebergIndex::open(&app.config.database(), &warehouse)
                .await
                .map_err(artifact_error)?;
            let synced = index.sync(store).await.map_err(artifact_error)?;
            let mine = owned(app).await?;
            let rows: Vec<_> = index
                .rows()
                .await
                .map_err(artifact_error)?
                .into_iter()
                .filter(|r| mine.contains(&r.mission_id))
                .collect();
            if app.json {
                emit(
                    "artifacts iceberg",
                    json!({ "table": format!("{NAMESPACE}.{TABLE}"), "warehouse": warehouse, "synced": synced, "artifacts": rows }),
                );
            } else {
                outln!(
                    "{NAMESPACE}.{TABLE} in {}: appended {} rows of {} bundles; {} rows of this \
                     owner's missions read back through the catalog",
                    warehouse.display(),
                    synced.rows,
                    synced.bundles.len(),
                    rows.len()
                );
            }
            Ok(code::OK)
        }
        ArtifactsCommand::Show { bundle } => {
            let claim = match store.publication_get(&bundle).await {
                Ok(claim) if owned(app).await?.contains(&claim.mission_id) => claim,
                _ => {
                    return Err(CliError::not_found(
                        format!("no bundle `{bundle}` among this owner's missions"),
                        "`berth artifacts query` lists them",
                    )
                    .into())
                }
            };
            let manifest: serde_json::Value =
                serde_json::from_str(&claim.manifest_json).unwrap_or(json!(null));
            if app.json {
                emit(
                    "artifacts show",
                    json!({ "bundle": claim.bundle_id, "state": claim.state, "last_error": claim.last_error, "manifest": manifest }),
                );
            } else {
                outln!("{} ({})", claim.bundle_id, claim.state.as_str());
                outln!("{}", serde_json::to_string_pretty(&manifest)?);
            }
            Ok(code::OK)
        }
        ArtifactsCommand::Get { bundle, path, out } => {
            let claim = store.publication_get(&bundle).await.ok();
            let mine = owned(app).await?;
            if !claim.is_some_and(|c| {
                mine.contains(&c.mission_id) && c.state == PublicationState::Indexed
            }) {
                return Err(CliError::not_found(
                    format!("no indexed bundle `{bundle}` among this owner's missions"),
                    "`berth artifacts query` lists them",
                )
                .into());
            }
            let bytes = berth_artifacts::read_file(store, &objects(app)?, &bundle, &path)
                .await
                .map_err(artifact_error)?;
            match (&out, app.json) {
                (Some(file), _) => {
                    use std::io::Write;
                    use std::os::unix::fs::OpenOptionsExt;
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(file)
                        .map_err(|e| {
                            CliError::invalid(
                                format!("cannot create {}: {e}", file.display()),
                                "name a file that does not exist yet",
                            )
                        })?;
                    f.write_all(&bytes)?;
                }
                (None, true) => {
                    return Err(CliError::invalid(
                        "with --json the file's bytes need --out FILE (they never share stdout \
                         with the document)",
                        "berth --json artifacts get BUNDLE PATH --out FILE",
                    )
                    .into())
                }
                (None, false) => crate::output::stdout_write_bytes(&bytes),
            }
            if app.json {
                emit(
                    "artifacts get",
                    json!({ "bundle": bundle, "path": path, "bytes": bytes.len(), "blake3": berth_artifacts::content_id(&bytes), "out": out }),
                );
            }
            Ok(code::OK)
        }
        ArtifactsCommand::Reconcile { retry_window } => {
            let window = crate::duration::parse(&retry_window)?;
            let done = berth_artifacts::reconcile(store, &objects(app)?, window)
                .await
                .map_err(artifact_error)?;
            // With the `iceberg` feature the table catches up with what reconcile finished.
            #[cfg(feature = "iceberg")]
            let iceberg = berth_orchestrator::publication::sync_iceberg(&app.config.home, store)
                .await
                .map_err(artifact_error)?;
            #[cfg(not(feature = "iceberg"))]
            let iceberg: Option<()> = None;
            if app.json {
                emit(
                    "artifacts reconcile",
                    json!({ "reconciled": done, "iceberg": iceberg }),
                );
            } else {
                outln!(
                    "finished {}, expired {}, waiting {}, orphan objects {}",
                    done.finished.len(),
                    done.expired.len(),
                    done.waiting.len(),
                    done.orphans.len()
                );
                for id in &done.waiting {
                    outln!("waiting: {id} (its mission's resume publishes it)");
                }
                for key in &done.orphans {
                    outln!("orphan: {key}");
                }
            }
            Ok(code::OK)
        }
    }
}
