//! Must-fire teardown through a scratch ledger: on error and on panic.

use super::*;

/// A throwaway ledger (real SQLite in a temp dir) owned by the suite's owner and run.
pub(super) async fn scratch_ledger(s: &Subject) -> Step<(tempfile::TempDir, berth_ledger::Ledger)> {
    let dir = tempfile::Builder::new()
        .prefix("berth-conformance-ledger-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let store = berth_store::Store::open(&dir.path().join("ledger.db"))
        .await
        .map_err(|e| format!("ledger store: {e}"))?;
    Ok((
        dir,
        berth_ledger::Ledger::new(store, s.owner.clone(), s.run.clone()),
    ))
}

/// A create that fails after the resource exists: the ledger must destroy what was made.
pub(super) async fn must_fire_on_error(s: &Subject) -> Outcome {
    let step = async {
        let (_dir, ledger) = scratch_ledger(s).await?;
        let provider = s.provider.clone();
        let image = s.image.clone();
        let made = std::sync::Mutex::new(None);
        let result = ledger
            .create_tracked(
                provider.as_ref(),
                "conformance",
                None,
                |r| r.image = image,
                |req| {
                    *made.lock().expect("not poisoned") = Some(req.name.0.clone());
                    let provider = provider.clone();
                    async move {
                        provider.create(&req).await?;
                        Err(ProviderError::new(
                            ErrorKind::Capacity,
                            provider.id(),
                            "injected failure after create",
                        ))
                    }
                },
            )
            .await;
        check!(result.is_err(), "the injected failure was swallowed");
        let name = made
            .lock()
            .expect("not poisoned")
            .clone()
            .ok_or("create was never attempted")?;
        let seen = s
            .provider
            .observe(&NativeId(name.clone()))
            .await
            .map_err(|e| fail("observe", e))?;
        check!(
            seen.is_gone(),
            "after a failed create the sandbox is still there: {seen:?}"
        );
        let row = ledger
            .row(&name)
            .await
            .map_err(|e| format!("ledger: {e}"))?;
        check!(
            row.state == berth_store::LedgerState::VerifiedGone,
            "ledger row is {} instead of verified_gone",
            row.state
        );
        Ok(vec![])
    };
    verdict(step.await)
}

/// A runner that panics while holding a sandbox: its run's cleanup must destroy it.
pub(super) async fn must_fire_on_panic(s: &Subject) -> Outcome {
    let step = async {
        let (_dir, ledger) = scratch_ledger(s).await?;
        let task = {
            let ledger = ledger.clone();
            let provider = s.provider.clone();
            let image = s.image.clone();
            tokio::spawn(async move {
                let created = ledger
                    .create_tracked(
                        provider.as_ref(),
                        "conformance",
                        None,
                        |r| r.image = image,
                        |req| {
                            let provider = provider.clone();
                            async move { provider.create(&req).await }
                        },
                    )
                    .await;
                if created.is_ok() {
                    panic!("injected panic while holding a sandbox");
                }
                created.map(|_| ())
            })
        };
        let joined = task.await;
        check!(
            joined.as_ref().is_err_and(|e| e.is_panic()),
            "the runner did not panic: {joined:?}"
        );
        // The must-fire path: everything this run created and did not hand over is destroyed.
        let rows = ledger
            .owned_rows(Some(&s.run), false)
            .await
            .map_err(|e| format!("ledger: {e}"))?;
        check!(
            rows.len() == 1,
            "expected the one sandbox of the panicked run, found {}",
            rows.len()
        );
        for row in &rows {
            ledger
                .destroy_row(s.provider.as_ref(), row)
                .await
                .map_err(|e| format!("cleanup: {e}"))?;
            let seen = s
                .provider
                .observe(&berth_ledger::native_id(row))
                .await
                .map_err(|e| fail("observe", e))?;
            check!(seen.is_gone(), "cleanup left the sandbox: {seen:?}");
        }
        let open = ledger
            .owned_rows(Some(&s.run), false)
            .await
            .map_err(|e| format!("ledger: {e}"))?;
        check!(
            open.is_empty(),
            "{} ledger rows still open after cleanup",
            open.len()
        );
        Ok(vec![])
    };
    verdict(step.await)
}
