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
