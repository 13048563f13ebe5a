//! create / list / status / snapshot / fork / restore / destroy.

use anyhow::Result;
use berth_contract::{DestroyOutcome, Observation, Provider, ProviderExt, SnapshotRef};
use berth_ledger::Tracked;
use serde_json::json;

use crate::app::App;
use crate::cli::CreateArgs;
use crate::duration;
use crate::errors::code;
use crate::output::emit;

fn print_tracked(app: &App, command: &str, tracked: &Tracked, extra: serde_json::Value) {
    if app.json {
        let mut fields = json!({ "sandbox": tracked });
        if let (Some(map), serde_json::Value::Object(extra)) = (fields.as_object_mut(), extra) {
            map.extend(extra);
        }
        emit(command, fields);
    } else {
        outln!("{}", tracked.berth_id);
    }
}

/// `berth create`.
pub async fn create(app: &App, args: CreateArgs) -> Result<i32> {
    let ttl = duration::parse(&args.shape.ttl.ttl)?;
    let mut order = vec![args.provider.clone()];
    order.extend(args.fallback.iter().cloned());
    let image = args.shape.image.clone();
    let network = args.shape.network.mode();
    let resources = args.shape.limits.resources();
    // A ledger failure is Berth's, not the provider's: the loop stops on it (it is no fallback
    // reason), and the user is told what failed, not that the provider did.
    let ledger_failure = std::sync::Mutex::new(None);
    let ledger_failure_slot = &ledger_failure;
    let fallback = app
        .registry
        .with_fallback(&order, &app.provider_config, |provider| {
            let image = image.clone();
            let resources = resources.clone();
            async move {
                app.ledger
                    .create_tracked(
                        provider.as_ref(),
                        "create",
                        Some(ttl),
                        |req| {
                            req.image = image;
                            req.network = network;
                            req.resources = resources;
                        },
                        |req| {
                            let provider = provider.clone();
                            async move { provider.create(&req).await }
                        },
                    )
                    .await
                    .map_err(|err| match err {
                        berth_ledger::LedgerError::Provider { source, .. } => source,
                        other => {
                            let stop = berth_contract::ProviderError::new(
                                berth_contract::ErrorKind::Unknown,
                                provider.id(),
                                format!("ledger: {other}"),
                            );
                            *ledger_failure_slot.lock().expect("not poisoned") = Some(other);
                            stop
                        }
                    })
            }
        })
        .await;
    let fallback = match fallback {
        Err(berth_factory::FallbackError::Stopped { skipped, .. })
            if ledger_failure.lock().expect("not poisoned").is_some() =>
        {
            report_skipped(&skipped);
            let failure = ledger_failure.into_inner().expect("not poisoned");
            return Err(failure.expect("checked above").into());
        }
        other => other?,
    };
    report_skipped(&fallback.skipped);
    print_tracked(
        app,
        "create",
        &fallback.value,
        json!({ "fallback": fallback.skipped }),
    );
    Ok(code::OK)
}

/// Says on stderr which providers the fallback loop passed over, and why.
fn report_skipped(skipped: &[berth_factory::FallbackStep]) {
    for step in skipped {
        errln!(
            "berth: provider `{}` skipped ({}): {}",
            step.provider,
            step.kind,
            step.message
        );
    }
}

fn observation_json(
    observation: &Result<Observation, berth_contract::ProviderError>,
) -> serde_json::Value {
    match observation {
        Ok(observation) => json!(observation),
        Err(err) => json!({ "presence": "unknown", "reason": err.to_string() }),
    }
}

fn observation_text(observation: &Result<Observation, berth_contract::ProviderError>) -> String {
    let text = match observation {
        Ok(Observation::Absent) => "absent".into(),
        Ok(Observation::Present { state, raw, .. }) => format!("{state} (raw: {raw})"),
        Err(err) => format!("UNKNOWN({err})"),
    };
    // A raw state and an error's text come from the provider, and through it the sandbox.
    crate::human::printable(&text, false).into_owned()
}

/// `berth list`.
pub async fn list(app: &App, all: bool) -> Result<i32> {
    let rows = app.ledger.owned_rows(None, all).await?;
    let mut items = Vec::new();
    // Snapshots are ledger rows too (`berth ledger list` shows them); this lists sandboxes.
    for row in rows
        .into_iter()
        .filter(|r| r.kind == berth_store::ResourceKind::Sandbox)
    {
        let observation = match app.provider(&row.provider) {
            Ok(provider) => provider.observe(&berth_ledger::native_id(&row)).await,
            Err(err) => Err(berth_contract::ProviderError::new(
                berth_contract::ErrorKind::Unavailable,
                &row.provider,
                err.to_string(),
            )),
        };
        items.push((row, observation));
    }
    if app.json {
        let sandboxes: Vec<_> = items
            .iter()
            .map(|(row, obs)| json!({ "ledger": row, "observed": observation_json(obs) }))
            .collect();
        emit("list", json!({ "sandboxes": sandboxes }));
    } else if items.is_empty() {
        outln!("no sandboxes (create one with `berth create`)");
    } else {
        outln!("{:<16} {:<8} {:<18} OBSERVED", "ID", "PROVIDER", "LEDGER");
        for (row, obs) in &items {
            outln!(
                "{:<16} {:<8} {:<18} {}",
                row.berth_id,
                row.provider,
                row.state.as_str(),
                observation_text(obs)
            );
        }
    }
    Ok(code::OK)
}

/// `berth status`.
pub async fn status(app: &App, id: &str) -> Result<i32> {
    let (row, provider, native) = app.sandbox(id).await?;
    let observation = provider.observe(&native).await;
    let forwards = super::access::open_forwards(app, &row.berth_id);
    if app.json {
        let forwards: Vec<_> = forwards
            .iter()
            .map(|f| json!({ "port": f.port, "local": f.local, "pid": f.pid }))
            .collect();
        emit(
            "status",
            json!({ "ledger": row, "observed": observation_json(&observation), "forwards": forwards }),
        );
    } else {
        outln!("id:        {}", row.berth_id);
        outln!("provider:  {}", row.provider);
        outln!("ledger:    {}", row.state);
        outln!("observed:  {}", observation_text(&observation));
        outln!("owner:     {}", row.owner);
        outln!("run:       {}", row.run_id);
        if let Some(expires) = row.expires_at {
            outln!("expires:   {}", expires.to_rfc3339());
        }
        for forward in &forwards {
            outln!(
                "forward:   {} → port {} (berth port, pid {})",
                forward.local,
                forward.port,
                forward.pid
            );
        }
    }
    Ok(code::OK)
}

/// `berth snapshot`.
pub async fn snapshot(app: &App, id: &str, ttl: Option<&str>) -> Result<i32> {
    let retention = ttl.map(duration::parse).transpose()?;
    let (_row, provider, native) = app.sandbox(id).await?;
    // A ledger row, recorded before the snapshot exists: `berth destroy KEY` deletes it, and a
    // sweep or `berth gc` deletes it after its retention (or when a crash left it half-made).
    let key = format!(
        "sn-{}",
        berth_ledger::new_sandbox_name().0.trim_start_matches("bx-")
    );
    let snap = app
        .ledger
        .snapshot_tracked(
            provider.as_ref(),
            &native,
            &key,
            &format!("snapshot of {id}"),
            retention,
        )
        .await?;
    if app.json {
        emit(
            "snapshot",
            json!({ "sandbox": id, "key": key, "snapshot": snap }),
        );
    } else {
        outln!("{}", snap.handle);
        errln!("(ledger row {key}; `berth destroy {key}` deletes it)");
    }
    Ok(code::OK)
}

/// `berth fork`.
pub async fn fork(app: &App, id: &str, ttl: &str) -> Result<i32> {
    let ttl = duration::parse(ttl)?;
    let (_row, provider, native) = app.sandbox(id).await?;
    let fork = provider.require_fork()?;
    let tracked = app
        .ledger
        .create_tracked(
            provider.as_ref(),
            &format!("fork:{id}"),
            Some(ttl),
            |_| {},
            |req| async move { fork.fork(&native, &req).await },
        )
        .await
        .map_err(|e| match e {
            // The fork's own row is named by nothing the user has seen: what is missing is the
            // source.
            berth_ledger::LedgerError::Provider { source, .. }
                if source.kind() == berth_contract::ErrorKind::NotFound =>
            {
                crate::errors::CliError::not_found(
                    format!("cannot fork `{id}`: {source}"),
                    &format!("`berth status {id}` shows whether it is still there"),
                )
                .into()
            }
            other => anyhow::Error::from(other),
        })?;
    print_tracked(app, "fork", &tracked, json!({ "source": id }));
    Ok(code::OK)
}

/// `berth restore`.
pub async fn restore(app: &App, handle: &str, provider_id: &str, ttl: &str) -> Result<i32> {
    let ttl = duration::parse(ttl)?;
    let provider = app.provider(provider_id)?;
    let snapshots = provider.require_snapshots()?;
    let snap = SnapshotRef {
        handle: handle.to_owned(),
        kind: berth_contract::SnapshotHandleKind::Digest,
        size_bytes: None,
    };
    let tracked = app
        .ledger
        .create_tracked(
            provider.as_ref(),
            &format!("restore:{handle}"),
            Some(ttl),
            |_| {},
            |req| async move { snapshots.restore(&snap, &req).await },
        )
        .await?;
    print_tracked(app, "restore", &tracked, json!({ "snapshot": handle }));
    Ok(code::OK)
}

/// `berth destroy`.
pub async fn destroy(app: &App, ids: &[String]) -> Result<i32> {
    let mut results = Vec::new();
    // Of several ids, one that cannot be destroyed (a typo, another owner's, a provider that is
    // down) stops none of the others, as with `docker rm`; each failure is reported and the
    // first one's exit code is the command's. One id fails as any command does.
    let mut failed: Vec<(&String, crate::errors::Failure)> = Vec::new();
    for id in ids {
        let outcome = match destroy_one(app, id).await {
            Ok(outcome) => outcome,
            Err(err) if ids.len() > 1 => {
                let failure = crate::errors::classify(&err);
                if !app.json {
                    crate::output::say_failure(Some(id), &failure);
                }
                failed.push((id, failure));
                continue;
            }
            Err(err) => return Err(err),
        };
        if !app.json {
            match &outcome {
                DestroyOutcome::VerifiedGone { .. } => outln!("{id}: destroyed (verified gone)"),
                DestroyOutcome::Accepted { raw_state } => outln!(
                    "{id}: destroy accepted, not yet verified (raw state {}); \
                     `berth ledger sweep` will check again",
                    crate::human::printable(raw_state, false)
                ),
            }
        }
        results.push(json!({ "id": id, "result": outcome }));
    }
    if app.json {
        let mut doc = json!({ "destroyed": results });
        if !failed.is_empty() {
            doc["failed"] = failed
                .iter()
                .map(|(id, failure)| json!({ "id": id, "error": failure }))
                .collect();
        }
        emit("destroy", doc);
    }
    let all_gone = results
        .iter()
        .all(|r| r["result"]["outcome"] == "verified_gone");
    Ok(match failed.first() {
        Some((_, failure)) => failure.exit_code,
        None if all_gone => code::OK,
        None => code::CLEANUP_INCOMPLETE,
    })
}

async fn destroy_one(app: &App, id: &str) -> Result<DestroyOutcome> {
    let in_ledger = !matches!(
        app.ledger.row(id).await,
        Err(berth_ledger::LedgerError::Store(
            berth_store::StoreError::NotFound(..)
        ))
    );
    // A stored checkpoint or an agent session (never a ledger row's name: the ledger is asked
    // first) is Berth's own record: deleted, and gone once the call returns.
    let kept = if in_ledger {
        None
    } else if id.starts_with(berth_portable::CHECKPOINT_PREFIX) {
        let deleted = super::moving::delete_checkpoint(app, id).await?;
        Some((deleted, "checkpoint", "`berth checkpoints` lists them"))
    } else if id.starts_with(berth_portable::SESSION_PREFIX) {
        let deleted = super::prompt::delete_session(app, id).await?;
        Some((deleted, "agent session", "`berth sessions` lists them"))
    } else {
        None
    };
    if let Some((deleted, what, hint)) = kept {
        return match deleted {
            true => Ok(DestroyOutcome::VerifiedGone {
                already_absent: false,
            }),
            false => Err(crate::errors::CliError::not_found(
                format!("no {what} `{id}` of this owner"),
                hint,
            )
            .into()),
        };
    }
    let (row, provider) = app.row(id).await?;
    let err = match app.ledger.destroy_row(provider.as_ref(), &row).await {
        Ok(outcome) => return Ok(outcome),
        Err(err) => anyhow::Error::new(err),
    };
    // A removal the provider could not finish leaves the row `destroy_failed`: whatever the
    // provider's reason (a file it may not delete is not the request's fault), the sandbox is
    // not verified gone — exit 10, as documented.
    let failed = app
        .ledger
        .row(id)
        .await
        .is_ok_and(|row| row.state == berth_store::LedgerState::DestroyFailed);
    if !failed {
        return Err(err);
    }
    Err(crate::errors::CliError {
        kind: "cleanup_incomplete",
        exit_code: code::CLEANUP_INCOMPLETE,
        message: crate::errors::classify(&err).message,
        hint: Some(format!(
            "`{id}` stays in the ledger as destroy_failed (`berth ledger list`); once what the \
             message names is fixed, `berth destroy {id}` or `berth ledger sweep` tries again"
        )),
    }
    .into())
}

/// Destroys a sandbox this invocation created (used by run/demo/bench).
pub async fn destroy_tracked(
    app: &App,
    provider: &dyn Provider,
    tracked: &Tracked,
) -> Result<DestroyOutcome> {
    let row = app.ledger.row(&tracked.berth_id).await?;
    Ok(app.ledger.destroy_row(provider, &row).await?)
}

/// A power verb.
#[derive(Debug, Clone, Copy)]
pub enum Power {
    Stop,
    Start,
    Suspend,
    Resume,
}

/// `berth stop|start|suspend|resume`: answered by the provider's capability or `Unsupported`.
pub async fn power(app: &App, id: &str, verb: Power) -> Result<i32> {
    let (_row, provider, native) = app.sandbox(id).await?;
    let (name, transition) = match verb {
        Power::Stop => ("stop", provider.require_stop_start()?.stop(&native).await?),
        Power::Start => (
            "start",
            provider.require_stop_start()?.start(&native).await?,
        ),
        Power::Suspend => (
            "suspend",
            provider.require_suspend_resume()?.suspend(&native).await?,
        ),
        Power::Resume => (
            "resume",
            provider.require_suspend_resume()?.resume(&native).await?,
        ),
    };
    if app.json {
        emit(name, json!({ "sandbox": id, "transition": transition }));
    } else {
        let shown = match &transition {
            berth_contract::Transition::Settled { state } => state.as_str().to_owned(),
            berth_contract::Transition::Accepted { raw_state } => format!(
                "accepted, not settled yet (raw state {})",
                crate::human::printable(raw_state, false)
            ),
        };
        outln!("{id}: {shown}");
    }
    Ok(code::OK)
}

#[cfg(test)]
mod tests {
    use berth_contract::{CanonicalState, ErrorKind, Observation, ProviderError};

    /// A raw state and a provider error reach `list` and `status` from the provider (and through
    /// it the sandbox): their control characters are shown, never sent.
    #[test]
    fn an_observation_is_shown_not_sent() {
        let present = Ok(Observation::Present {
            state: CanonicalState::Running,
            raw: "up\x1b]0;owned\x07".into(),
            soft_deleted: false,
            labels: Default::default(),
        });
        let failed = Err(ProviderError::new(
            ErrorKind::Unavailable,
            "observe",
            "no\x1b[2Jreply",
        ));
        for observation in [present, failed] {
            let text = super::observation_text(&observation);
            assert!(!text.chars().any(char::is_control), "{text:?}");
            assert!(text.contains("\\u{1b}"), "{text:?}");
        }
    }
}
