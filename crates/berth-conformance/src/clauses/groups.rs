//! Clauses of the optional capability groups: streaming, detached, stop/start,
//! suspend/resume, snapshots, fork, listing, loopback forwarding, and `unsupported` answers.

use super::*;

#[derive(Default)]
pub(super) struct Chunks(Vec<(Stream, Vec<u8>)>);

impl OutputSink for Chunks {
    fn chunk(&mut self, stream: Stream, bytes: &[u8]) {
        self.0.push((stream, bytes.to_vec()));
    }
}

pub(super) async fn streaming_chunks(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let streaming = s
            .provider
            .require_streaming()
            .map_err(|e| fail("streaming", e))?;
        let mut chunks = Chunks::default();
        let summary = streaming
            .exec_streaming(
                &id,
                &ExecRequest::shell("echo one; sleep 0.3; echo two >&2; echo three"),
                &mut chunks,
            )
            .await
            .map_err(|e| fail("streaming exec", e))?;
        check!(summary.status.success(), "status {}", summary.status);
        let joined = |want: Stream| -> Vec<u8> {
            chunks
                .0
                .iter()
                .filter(|(s, _)| *s == want)
                .flat_map(|(_, b)| b.clone())
                .collect()
        };
        check!(
            joined(Stream::Stdout) == b"one\nthree\n",
            "stdout {:?}",
            text(&joined(Stream::Stdout))
        );
        check!(
            joined(Stream::Stderr) == b"two\n",
            "stderr {:?}",
            text(&joined(Stream::Stderr))
        );
        check!(
            chunks.0.first().map(|(s, b)| (*s, b.as_slice()))
                == Some((Stream::Stdout, b"one\n".as_slice())),
            "the first chunk was not delivered before the command finished"
        );
        Ok(vec![format!("{} chunks", chunks.0.len())])
    })
    .await
}

pub(super) async fn detached(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let detached = s
            .provider
            .require_detached()
            .map_err(|e| fail("detached", e))?;
        let handle = detached
            .spawn(&id, &ExecRequest::shell("sleep 30"))
            .await
            .map_err(|e| fail("spawn", e))?;
        let status = detached
            .status(&id, &handle)
            .await
            .map_err(|e| fail("status", e))?;
        check!(
            status == ProcessStatus::Running,
            "a sleeping process reports {status:?}"
        );
        detached
            .kill(&id, &handle)
            .await
            .map_err(|e| fail("kill", e))?;
        detached
            .kill(&id, &handle)
            .await
            .map_err(|e| fail("second kill", e))?;
        let until = Instant::now() + Duration::from_secs(10);
        let killed = finished(
            detached,
            &id,
            &handle,
            until,
            "process still running 10 s after kill",
        )
        .await?;
        // Output is read in pieces from any offset, each stream's size said.
        let writer = detached
            .spawn(
                &id,
                &ExecRequest::shell("printf 0123456789; printf oops >&2"),
            )
            .await
            .map_err(|e| fail("spawn", e))?;
        finished(
            detached,
            &id,
            &writer,
            until,
            "a process printing 14 bytes still runs after 10 s",
        )
        .await?;
        let piece = |stdout, stderr, max| {
            let from = berth_contract::OutputOffsets { stdout, stderr };
            detached.output(&id, &writer, from, max)
        };
        let first = piece(0, 0, 4).await.map_err(|e| fail("output", e))?;
        let rest = piece(8, 3, 100).await.map_err(|e| fail("output", e))?;
        let got = |c: &berth_contract::OutputChunk| {
            (
                c.stdout.clone(),
                c.stderr.clone(),
                c.stdout_size,
                c.stderr_size,
            )
        };
        check!(
            got(&first) == (b"0123".to_vec(), b"oops".to_vec(), 10, 4)
                && got(&rest) == (b"89".to_vec(), b"s".to_vec(), 10, 4),
            "pieces of `0123456789` / `oops`: {:?} from 0 (max 4), {:?} from 8/3",
            got(&first),
            got(&rest)
        );
        Ok(vec![
            format!("killed: {killed}"),
            "output read in pieces".into(),
        ])
    })
    .await
}

/// Polls a detached process until it finishes, at most until `until`: how it ended, or `late`.
async fn finished(
    detached: &dyn berth_contract::DetachedExec,
    id: &NativeId,
    handle: &berth_contract::ProcessHandle,
    until: Instant,
    late: &str,
) -> Result<berth_contract::ExitStatus, String> {
    loop {
        match detached
            .status(id, handle)
            .await
            .map_err(|e| fail("status", e))?
        {
            ProcessStatus::Finished { status } => return Ok(status),
            ProcessStatus::Running if Instant::now() > until => return Err(late.into()),
            ProcessStatus::Running => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

pub(super) async fn stop_start(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let power = s
            .provider
            .require_stop_start()
            .map_err(|e| fail("stop_start", e))?;
        sh(s, &id, "echo kept > cf-note").await?;
        let stopped = power.stop(&id).await.map_err(|e| fail("stop", e))?;
        check!(
            stopped
                == Transition::Settled {
                    state: CanonicalState::Stopped
                },
            "stop: {stopped:?}"
        );
        let started = power.start(&id).await.map_err(|e| fail("start", e))?;
        check!(
            started
                == Transition::Settled {
                    state: CanonicalState::Running
                },
            "start: {started:?}"
        );
        let kept = sh(s, &id, "cat cf-note").await?;
        check!(
            text(&kept.stdout) == "kept\n",
            "filesystem not kept across stop/start"
        );
        Ok(vec![])
    })
    .await
}

pub(super) async fn suspend_resume(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let power = s
            .provider
            .require_suspend_resume()
            .map_err(|e| fail("suspend_resume", e))?;
        let suspended = power.suspend(&id).await.map_err(|e| fail("suspend", e))?;
        check!(
            suspended
                == Transition::Settled {
                    state: CanonicalState::Suspended
                },
            "suspend: {suspended:?}"
        );
        let resumed = power.resume(&id).await.map_err(|e| fail("resume", e))?;
        check!(
            resumed
                == Transition::Settled {
                    state: CanonicalState::Running
                },
            "resume: {resumed:?}"
        );
        let after = sh(s, &id, "true").await?;
        check!(
            after.status.success(),
            "exec after resume: {}",
            after.status
        );
        Ok(vec![])
    })
    .await
}

pub(super) async fn snapshot(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let snaps = s
            .provider
            .require_snapshots()
            .map_err(|e| fail("snapshots", e))?;
        sh(s, &id, "echo v1 > cf-state").await?;
        let snap = snaps.snapshot(&id).await.map_err(|e| fail("snapshot", e))?;
        sh(s, &id, "echo v2 > cf-state").await?;
        let restored = snaps
            .restore(&snap, &s.request_for(&s.owner))
            .await
            .map_err(|e| fail("restore", e))?
            .native_id;
        let content = sh(s, &restored, "cat cf-state").await;
        discard(s, &[&restored]).await;
        check!(
            text(&content?.stdout) == "v1\n",
            "restore did not bring back the snapshotted file"
        );
        snaps
            .delete_snapshot(&snap)
            .await
            .map_err(|e| fail("delete snapshot", e))?;
        snaps
            .delete_snapshot(&snap)
            .await
            .map_err(|e| fail("delete snapshot twice", e))?;
        Ok(vec![format!("handle {} ({:?})", snap.handle, snap.kind)])
    })
    .await
}

pub(super) async fn fork(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let fork = s.provider.require_fork().map_err(|e| fail("fork", e))?;
        sh(s, &id, "echo original > cf-state").await?;
        let copy = fork
            .fork(&id, &s.request_for(&s.owner))
            .await
            .map_err(|e| fail("fork", e))?
            .native_id;
        let checked = async {
            let seen = sh(s, &copy, "cat cf-state; echo changed > cf-state").await?;
            check!(
                text(&seen.stdout) == "original\n",
                "fork sees {:?}",
                text(&seen.stdout)
            );
            let source = sh(s, &id, "cat cf-state").await?;
            check!(
                text(&source.stdout) == "original\n",
                "changing the fork changed the source"
            );
            Ok(vec![])
        }
        .await;
        discard(s, &[&copy]).await;
        checked
    })
    .await
}

pub(super) async fn listing_visibility(s: &Subject) -> Outcome {
    let listing = match s.provider.require_listing() {
        Ok(listing) => listing,
        Err(e) => return Outcome::Fail(fail("listing", e)),
    };
    let id = match create(s, &s.owner).await {
        Ok(id) => id,
        Err(why) => return Outcome::Fail(why),
    };
    let filter = LabelFilter {
        owner: Some(s.owner.clone()),
        run_id: Some(s.run.clone()),
    };
    let step = async {
        let before = listing.list(&filter).await.map_err(|e| fail("list", e))?;
        check!(
            before.iter().any(|l| l.native_id == id),
            "a live sandbox is not listed"
        );
        s.provider
            .destroy(&id)
            .await
            .map_err(|e| fail("destroy", e))?;
        let after = listing.list(&filter).await.map_err(|e| fail("list", e))?;
        check!(
            !after.iter().any(|l| l.native_id == id),
            "a destroyed sandbox is still listed"
        );
        Ok(vec![])
    }
    .await;
    discard(s, &[&id]).await;
    verdict(step)
}

pub(super) async fn listing_foreign(s: &Subject) -> Outcome {
    let listing = match s.provider.require_listing() {
        Ok(listing) => listing,
        Err(e) => return Outcome::Fail(fail("listing", e)),
    };
    let (mine, foreign) = match (
        create(s, &s.owner).await,
        create(s, "cf-someone-else").await,
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            for id in [a.as_ref().ok(), b.as_ref().ok()].into_iter().flatten() {
                let _ = s.provider.destroy(id).await;
            }
            return Outcome::Fail("could not create the two sandboxes".into());
        }
    };
    let step = async {
        let listed = listing
            .list(&LabelFilter {
                owner: Some(s.owner.clone()),
                run_id: None,
            })
            .await
            .map_err(|e| fail("list", e))?;
        check!(
            listed.iter().any(|l| l.native_id == mine),
            "own sandbox missing from the owner's listing"
        );
        check!(
            !listed.iter().any(|l| l.native_id == foreign),
            "another owner's sandbox is in this owner's listing"
        );
        s.provider
            .destroy(&mine)
            .await
            .map_err(|e| fail("destroy", e))?;
        let foreign_seen = s
            .provider
            .observe(&foreign)
            .await
            .map_err(|e| fail("observe", e))?;
        check!(
            !foreign_seen.is_gone(),
            "destroying one sandbox took another owner's with it"
        );
        Ok(vec![])
    }
    .await;
    discard(s, &[&mine, &foreign]).await;
    verdict(step)
}

/// The sandbox's loopback port reaches the caller and nothing else: bytes round-trip through a
/// connection made inside the sandbox, and an address outside still cannot be reached.
pub(super) async fn loopback_forward(s: &Subject) -> Outcome {
    const PORT: u16 = 47_700;
    on_sandbox(s, |id| async move {
        let forward = s
            .provider
            .require_loopback_forward()
            .map_err(|e| fail("loopback_forward", e))?;
        let mut port = forward
            .forward_loopback(&id, PORT)
            .await
            .map_err(|e| fail("forward_loopback", e))?;
        let host = tokio::spawn(async move {
            let stream = port.accept().await.map_err(|e| fail("accept", e))?;
            tokio::task::spawn_blocking(move || {
                use std::io::{Read, Write};
                let mut stream = stream;
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .map_err(|e| e.to_string())?;
                let mut got = [0u8; 4];
                stream.read_exact(&mut got).map_err(|e| e.to_string())?;
                stream.write_all(b"pong").map_err(|e| e.to_string())?;
                Ok::<_, String>(got)
            })
            .await
            .map_err(|e| e.to_string())?
        });
        let client = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{PORT} && printf ping >&3 && head -c 4 <&3"
        );
        let out = s
            .provider
            .exec(
                &id,
                &ExecRequest::argv(["bash", "-c", client.as_str()])
                    .with_timeout(Duration::from_secs(20)),
            )
            .await
            .map_err(|e| fail("exec the client", e))?;
        let got = match tokio::time::timeout(Duration::from_secs(20), host).await {
            Ok(Ok(result)) => result?,
            Ok(Err(join)) => return Err(format!("the host side panicked: {join}")),
            Err(_) => return Err("no connection reached the host within 20 s".into()),
        };
        check!(&got == b"ping", "the host read {:?}, not \"ping\"", got);
        check!(
            out.stdout == b"pong",
            "the sandbox read {:?} (exit {}; stderr {:?})",
            String::from_utf8_lossy(&out.stdout),
            out.status,
            String::from_utf8_lossy(out.stderr.as_deref().unwrap_or_default())
        );
        // A forward is not a network: an outside address stays unreachable.
        let outside = s
            .provider
            .exec(
                &id,
                &ExecRequest::argv(["bash", "-c", "exec 3<>/dev/tcp/192.0.2.1/80"])
                    .with_timeout(Duration::from_secs(10)),
            )
            .await
            .map_err(|e| fail("exec the outside probe", e))?;
        check!(
            !outside.status.success(),
            "a connection to 192.0.2.1:80 succeeded from a sandbox with a forward"
        );
        Ok(vec![format!(
            "127.0.0.1:{PORT} in the sandbox reached the host (ping/pong); 192.0.2.1:80 did not ({})",
            outside.status
        )])
    })
    .await
}

pub(super) async fn unsupported_paths(s: &Subject) -> Outcome {
    let p = s.provider.as_ref();
    let mut notes = Vec::new();
    for capability in Capability::ALL {
        if s.declared(capability) != berth_contract::Support::Unsupported {
            continue;
        }
        let answer: Option<ProviderError> = match capability {
            Capability::ExecStreaming => p.require_streaming().err(),
            Capability::ExecDetached => p.require_detached().err(),
            Capability::Files => p.require_files().err(),
            Capability::StopStart => p.require_stop_start().err(),
            Capability::SuspendResume => p.require_suspend_resume().err(),
            Capability::FilesystemSnapshot => p.require_snapshots().err(),
            Capability::Fork => p.require_fork().err(),
            Capability::Listing => p.require_listing().err(),
            // No `require_*` shorthand: the accessor itself must be empty.
            Capability::MemorySnapshot => p
                .memory_snapshots()
                .is_none()
                .then(|| ProviderError::unsupported(capability, p.id())),
            Capability::Access => p.require_access().err(),
            Capability::Ttl => p
                .ttl()
                .is_none()
                .then(|| ProviderError::unsupported(capability, p.id())),
            Capability::LoopbackForward => p
                .loopback_forward()
                .is_none()
                .then(|| ProviderError::unsupported(capability, p.id())),
            _ => None,
        };
        match answer {
            Some(e) if e.kind() == ErrorKind::Unsupported => {
                notes.push(format!("{capability}: unsupported"))
            }
            _ => {
                return Outcome::Fail(format!(
                    "`{capability}` is declared unsupported but the adapter offers it"
                ))
            }
        }
    }
    Outcome::Pass(notes)
}
