//! `berth demo`: Berth's main job on the embedded default (host provider, SQLite ledger).

use std::time::Instant;

use anyhow::{bail, Result};
use berth_contract::{ExecRequest, NativeId, Provider, ProviderExt};
use berth_ledger::Tracked;
use serde_json::json;

use super::sandbox::destroy_tracked;
use crate::app::App;
use crate::errors::code;
use crate::output::emit;

struct Steps {
    json: bool,
    started: Instant,
    log: Vec<serde_json::Value>,
}

impl Steps {
    fn say(&mut self, step: &str, detail: impl Into<String>) {
        let detail = detail.into();
        let ms = self.started.elapsed().as_secs_f64() * 1000.0;
        if !self.json {
            outln!("[{ms:>8.1} ms] {step:<9} {detail}");
        }
        self.log
            .push(json!({ "step": step, "detail": detail, "at_ms": ms }));
    }
}

async fn sh(provider: &dyn Provider, id: &NativeId, line: &str) -> Result<String> {
    let out = provider.exec(id, &ExecRequest::shell(line)).await?;
    if !out.status.success() {
        bail!(
            "`{line}` {}: {}",
            out.status,
            String::from_utf8_lossy(out.stderr.as_deref().unwrap_or_default())
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
}

async fn tracked_create<F, Fut>(
    app: &App,
    provider: &std::sync::Arc<dyn Provider>,
    origin: &str,
    make: F,
) -> Result<Tracked>
where
    F: FnOnce(berth_contract::CreateRequest) -> Fut,
    Fut: std::future::Future<Output = berth_contract::Result<berth_contract::Created>>,
{
    Ok(app
        .ledger
        .create_tracked(
            provider.as_ref(),
            origin,
            Some(std::time::Duration::from_secs(3600)),
            |_| {},
            make,
        )
        .await?)
}

/// Runs the walkthrough. Every sandbox it creates is destroyed and verified gone before it
/// returns; on failure or a signal, the run's cleanup destroys them.
pub async fn demo(app: &App) -> Result<i32> {
    let mut steps = Steps {
        json: app.json,
        started: Instant::now(),
        log: Vec::new(),
    };
    let provider = app.provider("host")?;
    steps.say(
        "provider",
        "host: plain host processes in a workspace directory (isolates nothing)",
    );

    let first = tracked_create(app, &provider, "create", |req| {
        let provider = provider.clone();
        async move { provider.create(&req).await }
    })
    .await?;
    let id = NativeId(first.native_id.clone());
    steps.say(
        "create",
        format!("{} (ledger: intent → created)", first.berth_id),
    );

    let hello = sh(
        provider.as_ref(),
        &id,
        "echo \"hello from $(basename \"$(dirname \"$PWD\")\")\"",
    )
    .await?;
    steps.say("exec", format!("echo → {hello:?}"));
    let seven = provider.exec(&id, &ExecRequest::shell("exit 7")).await?;
    steps.say("exec", format!("exit 7 → {}", seven.status));

    let files = provider.require_files()?;
    files
        .write(&id, "notes/plan.txt", b"1. reproduce\n2. fix\n3. verify\n")
        .await?;
    let lines = sh(provider.as_ref(), &id, "wc -l < notes/plan.txt").await?;
    steps.say(
        "cp in",
        format!("notes/plan.txt ({lines} lines, counted inside)"),
    );
    sh(provider.as_ref(), &id, "echo 'fixed' > result.txt").await?;
    let result = files.read(&id, "result.txt").await?;
    steps.say(
        "cp out",
        format!(
            "result.txt → {:?}",
            String::from_utf8_lossy(&result).trim_end()
        ),
    );

    let snapshots = provider.require_snapshots()?;
    let snap = snapshots.snapshot(&id).await?;
    steps.say(
        "snapshot",
        format!("{} ({} bytes)", snap.handle, snap.size_bytes.unwrap_or(0)),
    );

    sh(
        provider.as_ref(),
        &id,
        "echo 'changed after snapshot' > result.txt",
    )
    .await?;
    let fork = provider.require_fork()?;
    let forked = tracked_create(app, &provider, &format!("fork:{}", first.berth_id), |req| {
        let id = &id;
        async move { fork.fork(id, &req).await }
    })
    .await?;
    let forked_id = NativeId(forked.native_id.clone());
    let in_fork = sh(provider.as_ref(), &forked_id, "cat result.txt").await?;
    steps.say(
        "fork",
        format!("{} sees result.txt = {in_fork:?}", forked.berth_id),
    );

    let restored = tracked_create(app, &provider, &format!("restore:{}", snap.handle), |req| {
        let snap = &snap;
        async move { snapshots.restore(snap, &req).await }
    })
    .await?;
    let restored_id = NativeId(restored.native_id.clone());
    let in_restore = sh(provider.as_ref(), &restored_id, "cat result.txt").await?;
    steps.say(
        "restore",
        format!(
            "{} sees result.txt = {in_restore:?} (as snapshotted)",
            restored.berth_id
        ),
    );

    for tracked in [&first, &forked, &restored] {
        let outcome = destroy_tracked(app, provider.as_ref(), tracked).await?;
        steps.say("destroy", format!("{} → {outcome:?}", tracked.berth_id));
    }
    snapshots.delete_snapshot(&snap).await?;
    steps.say("snapshot", format!("{} deleted", snap.handle));

    let rows = app
        .ledger
        .owned_rows(Some(app.ledger.run_id()), true)
        .await?;
    if app.json {
        emit(
            "demo",
            json!({ "run_id": app.ledger.run_id(), "steps": steps.log, "ledger": rows }),
        );
    } else {
        outln!("\nledger for run {}:", app.ledger.run_id());
        for row in &rows {
            outln!(
                "  {:<16} {:<28} {:<14} created {} gone {}",
                row.berth_id,
                super::ledger::shorten(&row.origin, 28),
                row.state.as_str(),
                row.created_at.format("%H:%M:%S%.3f"),
                row.verified_gone_at
                    .map(|t| t.format("%H:%M:%S%.3f").to_string())
                    .unwrap_or_else(|| "-".into())
            );
        }
    }
    if rows
        .iter()
        .any(|r| r.state != berth_store::LedgerState::VerifiedGone)
    {
        return Ok(code::CLEANUP_INCOMPLETE);
    }
    Ok(code::OK)
}
