//! Core clauses: create → ready → exec, quoting, timeouts, destroy, secrets.

use super::*;

pub(super) async fn create_ready_exec(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let observed = s
            .provider
            .observe(&id)
            .await
            .map_err(|e| fail("observe", e))?;
        check!(
            matches!(
                observed,
                Observation::Present {
                    state: CanonicalState::Running,
                    ..
                }
            ),
            "a created sandbox observes as {observed:?}, not running"
        );
        let zero = sh(s, &id, "echo out; echo err >&2").await?;
        check!(
            zero.status == ExitStatus::Exited { code: 0 },
            "exit 0 came back as {}",
            zero.status
        );
        check!(
            text(&zero.stdout) == "out\n",
            "stdout {:?}",
            text(&zero.stdout)
        );
        check!(
            zero.stderr.as_deref().map(text).as_deref() == Some("err\n"),
            "stderr {:?} (None means merged)",
            zero.stderr.as_deref().map(text)
        );
        let seven = sh(s, &id, "exit 7").await?;
        check!(
            seven.status == ExitStatus::Exited { code: 7 },
            "exit 7 came back as {}",
            seven.status
        );
        Ok(vec![format!("exec round trip {:?}", zero.duration)])
    })
    .await
}

pub(super) async fn exec_quoting_pipes_home(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let argv = s
            .provider
            .exec(
                &id,
                &ExecRequest::argv(["printf", "%s|", "a b", "$HOME", "'q'"]),
            )
            .await
            .map_err(|e| fail("argv exec", e))?;
        check!(
            text(&argv.stdout) == "a b|$HOME|'q'|",
            "argv quoting gave {:?}",
            text(&argv.stdout)
        );
        let pipe = sh(s, &id, "printf 'b\\na\\n' | sort | tr -d '\\n'").await?;
        check!(
            text(&pipe.stdout) == "ab",
            "pipes gave {:?}",
            text(&pipe.stdout)
        );
        let home = sh(
            s,
            &id,
            "test -n \"$HOME\" && test -d \"$HOME\" && cd && pwd",
        )
        .await?;
        check!(
            home.status.success(),
            "$HOME is unset or not a directory: {}",
            home.status
        );
        // No process argument can hold a NUL: the request is refused and nothing runs (a
        // runtime that swaps the argument for a placeholder runs something else instead).
        for (what, req) in [
            (
                "an argument",
                ExecRequest::argv(["sh", "-c", "touch cf-nul", "a\0b"]),
            ),
            ("a shell line", ExecRequest::shell("touch cf-nul\0")),
        ] {
            match s.provider.exec(&id, &req).await {
                Err(e) if e.kind() == ErrorKind::InvalidRequest => {}
                Err(e) => return Err(format!("a NUL in {what} answered {e}, not invalid_request")),
                Ok(out) => {
                    return Err(format!(
                        "a NUL in {what} ran ({}), not invalid_request",
                        out.status
                    ))
                }
            }
        }
        let ran = sh(s, &id, "test -e cf-nul").await?;
        check!(
            !ran.status.success(),
            "a command with a NUL byte ran anyway"
        );
        Ok(vec![format!("HOME={}", text(&home.stdout).trim())])
    })
    .await
}

pub(super) async fn exec_timeout_kills(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        // A child that ignores SIGTERM would write the marker after 2 s if it survived.
        let started = Instant::now();
        let out = s
            .provider
            .exec(
                &id,
                &ExecRequest::shell(
                    "trap '' TERM; (sleep 2; echo survived > cf-survivor) & sleep 30",
                )
                .with_timeout(Duration::from_millis(500)),
            )
            .await
            .map_err(|e| fail("exec with timeout", e))?;
        let took = started.elapsed();
        check!(
            out.status == ExitStatus::TimedOut,
            "status {} instead of timed_out",
            out.status
        );
        check!(
            took < Duration::from_secs(15),
            "timed-out exec took {took:?}"
        );
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let left = sh(s, &id, "cat cf-survivor 2>/dev/null || echo none").await?;
        check!(
            text(&left.stdout) == "none\n",
            "a child outlived the timeout: {:?}",
            text(&left.stdout)
        );
        Ok(vec![format!("timed out after {took:?}")])
    })
    .await
}

pub(super) async fn destroy_twice_verified_gone(s: &Subject) -> Outcome {
    let id = match create(s, &s.owner).await {
        Ok(id) => id,
        Err(why) => return Outcome::Fail(why),
    };
    let step = async {
        let first = s
            .provider
            .destroy(&id)
            .await
            .map_err(|e| fail("destroy", e))?;
        let observed = s
            .provider
            .observe(&id)
            .await
            .map_err(|e| fail("observe", e))?;
        check!(
            observed.is_gone(),
            "after destroy ({first:?}) observe says {observed:?}"
        );
        let second = s
            .provider
            .destroy(&id)
            .await
            .map_err(|e| fail("second destroy", e))?;
        check!(
            second
                == DestroyOutcome::VerifiedGone {
                    already_absent: true
                },
            "second destroy answered {second:?}"
        );
        Ok(vec![format!("first destroy: {first:?}")])
    }
    .await;
    discard(s, &[&id]).await;
    verdict(step)
}

pub(super) const CANARY: &str = "berth-canary-7c1e9b-never-persist";

pub(super) async fn secret_canary_absent(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let req = ExecRequest::shell("test \"$CF_TOKEN\" = \"$CF_EXPECT\"")
            .with_env("CF_TOKEN", CANARY)
            .with_env("CF_EXPECT", CANARY);
        check!(
            !format!("{req:?}").contains(CANARY),
            "the request's Debug shows the secret"
        );
        let out = s
            .provider
            .exec(&id, &req)
            .await
            .map_err(|e| fail("exec", e))?;
        check!(
            out.status.success(),
            "the secret did not reach the command: {}",
            out.status
        );
        let mut seen = format!("{out:?}");
        seen.push_str(&format!("{:?}", s.provider.observe(&id).await));
        if let Some(listing) = s.provider.listing() {
            seen.push_str(&format!(
                "{:?}",
                listing.list(&LabelFilter::default()).await
            ));
        }
        let missing = NativeId(format!("cf-{}-absent", s.run));
        seen.push_str(&format!("{:?}", s.provider.exec(&missing, &req).await));
        check!(
            !seen.contains(CANARY),
            "the canary secret appeared in results, observations or errors"
        );
        Ok(vec![])
    })
    .await
}
