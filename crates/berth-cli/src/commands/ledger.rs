//! `berth ledger list|sweep`.

use anyhow::Result;
use berth_ledger::{SweepAction, SweepEntry, SweepScope};
use berth_store::LedgerState;
use serde_json::json;

use crate::app::App;
use crate::errors::code;
use crate::output::emit;

/// `berth ledger list`.
pub async fn list(app: &App, all: bool) -> Result<i32> {
    let rows = app.ledger.owned_rows(None, all).await?;
    // Whether each row's run is still live in a berth process (a sweep from another run holds
    // a live run's unexpired rows): asked once per run.
    let mut runs: std::collections::BTreeMap<&str, Result<bool, String>> = Default::default();
    for row in &rows {
        runs.entry(row.run_id.as_str()).or_insert_with(|| {
            app.ledger
                .store()
                .run_is_live(&row.run_id)
                .map_err(|e| e.to_string())
        });
    }
    if app.json {
        let entries: Vec<serde_json::Value> = rows
            .iter()
            .map(|row| {
                let mut entry = json!(row);
                if let Some(map) = entry.as_object_mut() {
                    match &runs[row.run_id.as_str()] {
                        Ok(live) => {
                            map.insert("run_live".into(), json!(live));
                        }
                        Err(reason) => {
                            map.insert("run_live".into(), serde_json::Value::Null);
                            map.insert("run_live_unknown".into(), json!(reason));
                        }
                    }
                }
                entry
            })
            .collect();
        emit(
            "ledger list",
            json!({ "owner": app.ledger.owner(), "entries": entries }),
        );
        return Ok(code::OK);
    }
    if rows.is_empty() {
        outln!(
            "ledger: nothing open for owner {}{}",
            app.ledger.owner(),
            if all {
                ""
            } else {
                " (--all shows closed entries)"
            }
        );
    }
    if rows.is_empty() {
        return Ok(code::OK);
    }
    use crate::human::{Style, Table};
    let mut table = Table::new(&[
        "BERTH ID",
        "PROVIDER",
        "KIND",
        "STATE",
        "RUN",
        "ORIGIN",
        "CREATED",
        "EXPIRES",
        "LAST ERROR",
    ]);
    for row in &rows {
        let style = match row.state {
            LedgerState::Created => Style::Good,
            LedgerState::VerifiedGone => Style::Dim,
            LedgerState::CreateFailed | LedgerState::DestroyFailed => Style::Bad,
            _ => Style::Warn,
        };
        table.styled_row(vec![
            (row.berth_id.clone(), Style::Plain),
            (row.provider.clone(), Style::Plain),
            (row.kind.as_str().to_owned(), Style::Plain),
            (row.state.as_str().to_owned(), style),
            match &runs[row.run_id.as_str()] {
                Ok(true) => ("live".to_owned(), Style::Good),
                Ok(false) => ("over".to_owned(), Style::Dim),
                Err(_) => ("UNKNOWN".to_owned(), Style::Warn),
            },
            (shorten(&row.origin, 26), Style::Plain),
            (
                row.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                Style::Plain,
            ),
            (
                row.expires_at
                    .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
                    .unwrap_or_else(|| "-".into()),
                Style::Plain,
            ),
            (
                row.last_error_kind.clone().unwrap_or_else(|| "-".into()),
                if row.last_error_kind.is_some() {
                    Style::Bad
                } else {
                    Style::Plain
                },
            ),
        ]);
    }
    out!(
        "{}",
        table.render(crate::human::colour_on_stdout(&app.config))
    );
    Ok(code::OK)
}

/// `berth ledger sweep` (and `berth gc`: expired rows only, no listing). Both also remove
/// what killed calls left that no row names, on every provider built in and set up here.
pub async fn sweep(app: &App, run: Option<String>, expired: bool, discover: bool) -> Result<i32> {
    let here: Vec<String> = app
        .registry
        .manifests()?
        .into_iter()
        .map(|m| m.id.clone())
        .filter(|id| {
            app.registry.has_adapter(id)
                && app
                    .registry
                    .missing_credentials(id, &app.provider_config.env)
                    .is_empty()
        })
        .collect();
    let discover = if discover { here.clone() } else { Vec::new() };
    // `gc` keeps what killed `berth prompt` runs left of their turns first: their sandboxes
    // may be among what it destroys.
    let prompts = if expired {
        super::prompt::recover_killed_runs(app, "berth gc", |_| true).await
    } else {
        Vec::new()
    };
    let prompts_waiting = prompts
        .iter()
        .any(|p| matches!(p.outcome, super::prompt::RecoveredOutcome::Waiting { .. }));
    let report = app
        .ledger
        .sweep(
            &app.registry.bind(&app.provider_config),
            &SweepScope {
                run_id: run,
                expired_only: expired,
                discover,
                residue: here,
            },
        )
        .await?;
    // `gc` also deletes this owner's checkpoints past their retention and what a crash left of
    // one; a sweep keeps checkpoints (they are kept until deleted or expired, as snapshots).
    // A checkpoint store that cannot be asked (an S3 bucket away) stops nothing of the rest:
    // it is said, and the collection is incomplete.
    let (checkpoints, checkpoints_failed) = if expired {
        match super::moving::collect_checkpoints(app).await {
            Ok(collected) => (collected, None),
            Err(err) => (Vec::new(), Some(crate::errors::classify(&err))),
        }
    } else {
        (Vec::new(), None)
    };
    if app.json {
        emit(
            "ledger sweep",
            json!({ "owner": app.ledger.owner(), "complete": report.complete() && checkpoints_failed.is_none() && !prompts_waiting, "entries": report.entries, "checkpoints": checkpoints, "checkpoints_failed": checkpoints_failed, "prompts": prompts }),
        );
    } else {
        if report.entries.is_empty()
            && checkpoints.is_empty()
            && checkpoints_failed.is_none()
            && prompts.is_empty()
        {
            outln!("sweep: nothing to do for owner {}", app.ledger.owner());
        }
        for recovered in &prompts {
            outln!("{}", recovered.line());
        }
        for entry in &report.entries {
            outln!("{}", sweep_line(entry));
        }
        for collected in &checkpoints {
            outln!("{}: deleted ({})", collected.name, collected.reason);
        }
        if let Some(failed) = &checkpoints_failed {
            outln!(
                "checkpoints: not collected ({}): {}",
                failed.kind,
                crate::human::printable(&failed.message, false)
            );
        }
    }
    Ok(
        if report.complete() && checkpoints_failed.is_none() && !prompts_waiting {
            code::OK
        } else {
            code::CLEANUP_INCOMPLETE
        },
    )
}

/// One sweep entry for people: id, provider, what happened. The provider's messages and an
/// observed resource's labels (in a foreign one's reason) are shown, never sent.
pub(crate) fn sweep_line(entry: &SweepEntry) -> String {
    let what = match &entry.action {
        SweepAction::Destroyed => "destroyed, verified gone".to_owned(),
        SweepAction::AlreadyGone => "already gone".to_owned(),
        SweepAction::Accepted { raw_state } => {
            format!("destroy accepted, not verified (raw {raw_state})")
        }
        SweepAction::Failed { kind, message } => format!("FAILED ({kind}): {message}"),
        SweepAction::SkippedForeign { reason } => format!("skipped, not ours: {reason}"),
        SweepAction::Held { reason } => format!("kept: {reason}"),
        SweepAction::Adopted { reason } => format!("adopted: {reason}"),
        SweepAction::ResidueRemoved { what } => format!("removed: {what}"),
        SweepAction::ResidueUnknown { kind, message } => {
            format!("not asked ({kind}): {message}; whether killed calls left anything is unknown")
        }
        SweepAction::NotListed { kind, message } => format!(
            "not listed ({kind}): {message}; what it holds under your label without a row is \
             unknown"
        ),
    };
    let line = format!("{:<16} {:<6} {what}", entry.berth_id, entry.provider);
    crate::human::printable(&line, false).into_owned()
}

pub(super) fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let kept: String = text.chars().take(max - 1).collect();
        format!("{kept}…")
    }
}
