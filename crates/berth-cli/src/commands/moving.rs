//! `berth move`: the workspace to a new sandbox on another provider (see berth-portable).

use anyhow::Result;
use berth_contract::DestroyOutcome;
use berth_portable::{MoveRequest, Phase};
use serde_json::json;

use crate::app::App;
use crate::cli::MoveArgs;
use crate::duration;
use crate::errors::code;
use crate::human::printable;
use crate::output::emit;

/// `BERTH_FAULT=kill-in-move:PHASE` (`term-in-move:PHASE`): SIGKILL (SIGTERM) this process
/// once the move has passed PHASE (crash and interruption tests).
fn crash_after(phase: Phase) {
    use nix::sys::signal::Signal;
    let Ok(fault) = std::env::var("BERTH_FAULT") else {
        return;
    };
    let signal = match fault.split_once(':') {
        Some(("kill-in-move", at)) if at == phase.as_str() => Signal::SIGKILL,
        Some(("term-in-move", at)) if at == phase.as_str() => Signal::SIGTERM,
        _ => return,
    };
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), signal);
}

/// `berth move ID --to PROVIDER`.
pub async fn move_sandbox(app: &App, args: MoveArgs) -> Result<i32> {
    let ttl = duration::parse(&args.shape.ttl.ttl)?;
    // A source already gone is still asked about: its move's record says where it went.
    let source = match app.ledger.row(&args.id).await {
        Ok(row) => row,
        Err(_) => app.row(&args.id).await?.0,
    };
    let target = app.provider(&args.to)?;
    let lookup = app.registry.bind(&app.provider_config);
    let records = app.config.state_dir().join("moves");
    let shape = args.shape;
    let (image, network, resources) = (shape.image, shape.network.mode(), shape.limits.resources());
    let progress = crate::human::Progress::new(app.json);
    let mut on_phase = |phase: Phase| {
        progress.show(&format!("move {}: {}", source.berth_id, phase.as_str()));
        crash_after(phase);
    };
    let moved = berth_portable::move_sandbox(
        MoveRequest {
            ledger: &app.ledger,
            providers: &lookup,
            records: &records,
            source: &source,
            target,
            ttl: Some(ttl),
            prepare: Box::new(move |req| {
                req.image = image;
                req.network = network;
                req.resources = resources;
            }),
        },
        &mut on_phase,
    )
    .await;
    progress.clear();
    let moved = moved?;
    let verified_gone = matches!(moved.source_teardown, DestroyOutcome::VerifiedGone { .. });
    if app.json {
        emit("move", json!({ "move": moved }));
    } else {
        outln!("{}", moved.target.berth_id);
        for line in &moved.removed_leftovers {
            errln!("removed {line}, the unverified target of an earlier move cut short");
        }
        let already_gone = matches!(
            moved.source_teardown,
            DestroyOutcome::VerifiedGone {
                already_absent: true
            }
        );
        if moved.finished_earlier_move && already_gone {
            errln!(
                "{} was already moved to {} ({}) by an earlier `berth move`",
                moved.source,
                moved.target.berth_id,
                moved.target.provider
            );
        } else if moved.finished_earlier_move {
            errln!(
                "{} was moved to {} ({}) by an earlier `berth move` that was cut short after \
                 verifying it; finished removing the source",
                moved.source,
                moved.target.berth_id,
                moved.target.provider
            );
        } else if let Some(counts) = moved.counts {
            errln!(
                "moved {} → {} ({}): {} files, {} directories, {} symlinks, {} bytes; verified \
                 {} in {:.0} ms",
                moved.source,
                moved.target.berth_id,
                moved.target.provider,
                counts.files,
                counts.dirs,
                counts.symlinks,
                counts.bytes,
                moved.checkpoint,
                moved.times.to_resumable_ms
            );
        }
        for line in &moved.not_carried {
            errln!("not carried: {}", printable(line, false));
        }
        if verified_gone {
            errln!("{}: destroyed (verified gone)", moved.source);
        } else {
            errln!(
                "{}: destroy accepted, not yet verified; `berth ledger sweep` will check again",
                moved.source
            );
        }
    }
    Ok(if verified_gone {
        code::OK
    } else {
        code::CLEANUP_INCOMPLETE
    })
}

/// This owner's checkpoints, in Berth's object store (the artifacts': `$BERTH_HOME/artifacts`,
/// or the S3-compatible bucket `BERTH_ARTIFACTS_URL` names).
fn checkpoint_store(app: &App) -> Result<berth_portable::CheckpointStore> {
    let objects = app.objects()?;
    Ok(berth_portable::CheckpointStore::new(
        objects,
        app.ledger.owner(),
    ))
}

/// `berth checkpoint ID [--ttl D]`.
pub async fn checkpoint(app: &App, id: &str, ttl: Option<&str>) -> Result<i32> {
    let retention = ttl.map(duration::parse).transpose()?;
    let (row, provider, native) = app.sandbox(id).await?;
    let progress = crate::human::Progress::new(app.json);
    progress.show(&format!("checkpoint {id}: reading its workspace"));
    let stored = berth_portable::take_checkpoint(
        &checkpoint_store(app)?,
        provider.as_ref(),
        &row.berth_id,
        &native,
        retention,
    )
    .await;
    progress.clear();
    let stored = stored?;
    if app.json {
        emit("checkpoint", json!({ "checkpoint": stored }));
    } else {
        outln!("{}", stored.id);
        errln!(
            "{} files, {} directories, {} symlinks, {} bytes{}; `berth restore {} --provider P` \
             makes a sandbox of it, `berth destroy {}` deletes it",
            stored.counts.files,
            stored.counts.dirs,
            stored.counts.symlinks,
            stored.counts.bytes,
            stored
                .expires_at
                .map(|t| format!(", kept until {}", t.format("%Y-%m-%d %H:%M UTC")))
                .unwrap_or_default(),
            stored.id,
            stored.id
        );
        for line in &stored.not_carried {
            errln!("not carried: {}", printable(line, false));
        }
    }
    Ok(code::OK)
}

/// `berth checkpoints`.
pub async fn checkpoints(app: &App) -> Result<i32> {
    let stored = checkpoint_store(app)?.list().await?;
    if app.json {
        emit("checkpoints", json!({ "checkpoints": stored }));
        return Ok(code::OK);
    }
    if stored.is_empty() {
        outln!("no checkpoints for owner {}", app.ledger.owner());
        return Ok(code::OK);
    }
    let mut table =
        crate::human::Table::new(&["ID", "SOURCE", "FILES", "BYTES", "TAKEN", "KEPT UNTIL"]);
    for c in &stored {
        table.row([
            c.id.clone(),
            format!("{} ({})", c.source, c.source_provider),
            c.counts.files.to_string(),
            c.counts.bytes.to_string(),
            c.created_at.format("%Y-%m-%d %H:%M").to_string(),
            c.expires_at
                .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
                .unwrap_or_else(|| "deleted".into()),
        ]);
    }
    out!(
        "{}",
        table.render(crate::human::colour_on_stdout(&app.config))
    );
    Ok(code::OK)
}

/// `berth restore ws-… --provider P`.
pub async fn restore_checkpoint(
    app: &App,
    id: &str,
    provider_id: &str,
    image: Option<String>,
    ttl: &str,
) -> Result<i32> {
    let ttl = duration::parse(ttl)?;
    let target = app.provider(provider_id)?;
    let restored = berth_portable::restore_checkpoint(
        &app.ledger,
        &checkpoint_store(app)?,
        id,
        target,
        Some(ttl),
        |req| req.image = image,
    )
    .await?;
    if app.json {
        // The shape of a restore from a snapshot: `sandbox` first, then what it came from.
        emit(
            "restore",
            json!({ "sandbox": restored.sandbox, "checkpoint": restored.checkpoint, "counts": restored.counts }),
        );
    } else {
        outln!("{}", restored.sandbox.berth_id);
        errln!(
            "{} from {}: {} files, {} bytes, verified",
            restored.sandbox.berth_id,
            restored.checkpoint,
            restored.counts.files,
            restored.counts.bytes
        );
    }
    Ok(code::OK)
}

/// `berth destroy ws-…`: deletes a stored checkpoint.
pub async fn delete_checkpoint(app: &App, id: &str) -> Result<bool> {
    Ok(checkpoint_store(app)?.delete(id).await?)
}

/// What `berth gc` deletes of this owner's checkpoints, and what a crash left of an agent
/// session (the same object store).
pub async fn collect_checkpoints(app: &App) -> Result<Vec<berth_portable::Collected>> {
    let mut collected = checkpoint_store(app)?.gc(chrono::Utc::now()).await?;
    collected.extend(super::prompt::session_store(app)?.gc().await?);
    Ok(collected)
}
