//! The clauses. Each returns an [`Outcome`]; `check!` turns a false condition into a failure
//! with its message. Every clause destroys the sandboxes it made, whatever happened.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use berth_contract::{
    CanonicalState, Capability, DestroyOutcome, ErrorKind, ExecRequest, ExitStatus, LabelFilter,
    NativeId, Observation, OutputSink, ProcessStatus, ProviderError, ProviderExt, Stream,
    Transition,
};

use crate::Subject;

/// A clause's verdict before grading.
pub(crate) enum Outcome {
    Pass(Vec<String>),
    Fail(String),
    Unverified(String),
}

type Body = for<'a> fn(&'a Subject) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// One clause.
#[derive(Debug)]
pub struct Clause {
    /// Stable id.
    pub id: &'static str,
    /// The capability it proves; `None` for the required core.
    pub capability: Option<Capability>,
    pub(crate) run: Body,
}

macro_rules! clause {
    ($id:literal, $cap:expr, $body:ident) => {
        Clause {
            id: $id,
            capability: $cap,
            run: |s| Box::pin($body(s)),
        }
    };
}

/// Every clause, in run order.
pub static CLAUSES: &[Clause] = &[
    clause!("core.create_ready_exec", None, create_ready_exec),
    clause!(
        "core.exec_quoting_pipes_home",
        None,
        exec_quoting_pipes_home
    ),
    clause!("core.exec_timeout_kills", None, exec_timeout_kills),
    clause!(
        "core.destroy_twice_verified_gone",
        None,
        destroy_twice_verified_gone
    ),
    clause!("core.secret_canary_absent", None, secret_canary_absent),
    clause!("isolation.default_walls", None, default_walls),
    clause!(
        "exec_streaming.chunks",
        Some(Capability::ExecStreaming),
        streaming_chunks
    ),
    clause!(
        "exec_detached.spawn_status_kill",
        Some(Capability::ExecDetached),
        detached
    ),
    clause!(
        "files.round_trip_binary",
        Some(Capability::Files),
        files_round_trip
    ),
    clause!("files.hostile_path", Some(Capability::Files), files_hostile),
    clause!(
        "stop_start.round_trip_settles",
        Some(Capability::StopStart),
        stop_start
    ),
    clause!(
        "suspend_resume.round_trip_settles",
        Some(Capability::SuspendResume),
        suspend_resume
    ),
    clause!(
        "filesystem_snapshot.restore_delete",
        Some(Capability::FilesystemSnapshot),
        snapshot
    ),
    clause!("fork.independent_copy", Some(Capability::Fork), fork),
    clause!(
        "listing.visibility_after_destroy",
        Some(Capability::Listing),
        listing_visibility
    ),
    clause!(
        "listing.must_not_fire_foreign",
        Some(Capability::Listing),
        listing_foreign
    ),
    clause!("teardown.must_fire_on_error", None, must_fire_on_error),
    clause!("teardown.must_fire_on_panic", None, must_fire_on_panic),
    clause!("ttl.fires_when_due", Some(Capability::Ttl), ttl_unexercised),
    clause!(
        "ttl.not_during_exec",
        Some(Capability::Ttl),
        ttl_unexercised
    ),
    clause!("unsupported.answers_unsupported", None, unsupported_paths),
];

macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

type Step<T> = Result<T, String>;

fn fail(context: &str, err: ProviderError) -> String {
    format!("{context}: {err}")
}

async fn create(s: &Subject, owner: &str) -> Step<NativeId> {
    s.provider
        .create(&s.request_for(owner))
        .await
        .map(|c| c.native_id)
        .map_err(|e| fail("create", e))
}

async fn discard(s: &Subject, ids: &[&NativeId]) {
    for id in ids {
        let _ = s.provider.destroy(id).await;
    }
}

async fn sh(s: &Subject, id: &NativeId, line: &str) -> Step<berth_contract::ExecOutput> {
    s.provider
        .exec(id, &ExecRequest::shell(line))
        .await
        .map_err(|e| fail(&format!("exec `{line}`"), e))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn verdict(step: Step<Vec<String>>) -> Outcome {
    match step {
        Ok(notes) => Outcome::Pass(notes),
        Err(why) => Outcome::Fail(why),
    }
}

/// Runs `body` on a fresh sandbox and destroys it afterwards.
async fn on_sandbox<'a, F, Fut>(s: &'a Subject, body: F) -> Outcome
where
    F: FnOnce(NativeId) -> Fut,
    Fut: Future<Output = Step<Vec<String>>> + 'a,
{
    let id = match create(s, &s.owner).await {
        Ok(id) => id,
        Err(why) => return Outcome::Fail(why),
    };
    let result = body(id.clone()).await;
    discard(s, &[&id]).await;
    verdict(result)
}

async fn create_ready_exec(s: &Subject) -> Outcome {
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

async fn exec_quoting_pipes_home(s: &Subject) -> Outcome {
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
        Ok(vec![format!("HOME={}", text(&home.stdout).trim())])
    })
    .await
}

async fn exec_timeout_kills(s: &Subject) -> Outcome {
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

async fn destroy_twice_verified_gone(s: &Subject) -> Outcome {
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

const CANARY: &str = "berth-canary-7c1e9b-never-persist";

async fn secret_canary_absent(s: &Subject) -> Outcome {
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

#[derive(Default)]
struct Chunks(Vec<(Stream, Vec<u8>)>);

impl OutputSink for Chunks {
    fn chunk(&mut self, stream: Stream, bytes: &[u8]) {
        self.0.push((stream, bytes.to_vec()));
    }
}

async fn streaming_chunks(s: &Subject) -> Outcome {
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

async fn detached(s: &Subject) -> Outcome {
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
        loop {
            match detached
                .status(&id, &handle)
                .await
                .map_err(|e| fail("status", e))?
            {
                ProcessStatus::Finished { status } => return Ok(vec![format!("killed: {status}")]),
                ProcessStatus::Running if Instant::now() > until => {
                    return Err("process still running 10 s after kill".into())
                }
                ProcessStatus::Running => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
}

async fn files_round_trip(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let files = s.provider.require_files().map_err(|e| fail("files", e))?;
        let blob: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        files
            .write(&id, "cf/dir/blob.bin", &blob)
            .await
            .map_err(|e| fail("write", e))?;
        let back = files
            .read(&id, "cf/dir/blob.bin")
            .await
            .map_err(|e| fail("read", e))?;
        check!(
            back == blob,
            "binary round trip changed {} bytes",
            back.iter().zip(&blob).filter(|(a, b)| a != b).count()
        );
        let seen = sh(s, &id, "wc -c < cf/dir/blob.bin").await?;
        check!(
            text(&seen.stdout).trim() == "100000",
            "exec sees {:?} bytes",
            text(&seen.stdout).trim()
        );
        let listing = files
            .list(&id, "cf/dir")
            .await
            .map_err(|e| fail("list", e))?;
        check!(
            listing
                .iter()
                .any(|e| e.name == "blob.bin" && e.size == 100_000),
            "listing {listing:?}"
        );
        Ok(vec![])
    })
    .await
}

async fn files_hostile(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let files = s.provider.require_files().map_err(|e| fail("files", e))?;
        for path in ["../../etc/passwd", "a/../../../etc/shadow"] {
            match files.read(&id, path).await {
                Err(e) if e.kind() == ErrorKind::InvalidRequest => {}
                other => {
                    return Err(format!(
                        "reading `{path}` answered {other:?}, not invalid_request"
                    ))
                }
            }
            match files.write(&id, path, b"x").await {
                Err(e) if e.kind() == ErrorKind::InvalidRequest => {}
                other => {
                    return Err(format!(
                        "writing `{path}` answered {other:?}, not invalid_request"
                    ))
                }
            }
        }
        Ok(vec![])
    })
    .await
}

async fn stop_start(s: &Subject) -> Outcome {
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

async fn suspend_resume(s: &Subject) -> Outcome {
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

async fn snapshot(s: &Subject) -> Outcome {
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

async fn fork(s: &Subject) -> Outcome {
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

async fn listing_visibility(s: &Subject) -> Outcome {
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

async fn listing_foreign(s: &Subject) -> Outcome {
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

async fn unsupported_paths(s: &Subject) -> Outcome {
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
            Capability::Access => p
                .access()
                .is_none()
                .then(|| ProviderError::unsupported(capability, p.id())),
            Capability::Ttl => p
                .ttl()
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

/// Linux capability numbers, by name (include/uapi/linux/capability.h).
const CAPABILITY_BITS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The walls the manifest declares are the walls a sandbox has, read from inside it: the
/// bounding capability set, `no_new_privs`, and the cgroup's pids and memory limits (v2 or v1).
async fn default_walls(s: &Subject) -> Outcome {
    let Some(walls) = s.manifest.isolation.walls.clone() else {
        unreachable!("run_clause grades this clause not-applicable without declared walls")
    };
    on_sandbox(s, |id| async move {
        let out = sh(
            s,
            &id,
            "grep -E '^(NoNewPrivs|CapBnd):' /proc/self/status; \
             echo pids $(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max); \
             echo memory $(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)",
        )
        .await?;
        let report = text(&out.stdout);
        let field = |name: &str| {
            report
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let mut expected: u64 = 0;
        for name in &walls.capabilities {
            let bit = CAPABILITY_BITS
                .iter()
                .position(|c| c == name)
                .ok_or_else(|| format!("the manifest names an unknown capability `{name}`"))?;
            expected |= 1 << bit;
        }
        let bounding = u64::from_str_radix(&field("CapBnd:"), 16)
            .map_err(|_| format!("no CapBnd in /proc/self/status: {report:?}"))?;
        let extra: Vec<&str> = (0..CAPABILITY_BITS.len())
            .filter(|b| bounding & !expected & (1 << b) != 0)
            .map(|b| CAPABILITY_BITS[b])
            .collect();
        check!(extra.is_empty(), "capabilities beyond the declared set: {extra:?}");
        check!(
            bounding == expected,
            "bounding set {bounding:#x} lacks declared capabilities ({expected:#x})"
        );
        let nnp = field("NoNewPrivs:");
        check!(
            (nnp == "1") == walls.no_new_privileges,
            "NoNewPrivs is {nnp:?}; the manifest says {}",
            walls.no_new_privileges
        );
        let pids = field("pids ");
        check!(
            pids == walls.pids_limit.to_string(),
            "pids limit is {pids:?}; the manifest says {}",
            walls.pids_limit
        );
        let memory = field("memory ");
        check!(
            memory == (walls.memory_mib * 1024 * 1024).to_string(),
            "memory limit is {memory:?} bytes; the manifest says {} MiB",
            walls.memory_mib
        );
        Ok(vec![format!(
            "capabilities {:?}, no_new_privs {nnp}, pids {pids}, memory {memory}",
            walls.capabilities
        )])
    })
    .await
}

/// No local provider has provider-enforced TTL, so these clauses have never run against a real
/// implementation; until they have, a provider declaring TTL gets `unverified`, never `pass`.
async fn ttl_unexercised(_s: &Subject) -> Outcome {
    Outcome::Unverified(
        "TTL clauses (teardown fires when due; never during an active exec) are not implemented \
         in this suite yet"
            .into(),
    )
}

/// A throwaway ledger (real SQLite in a temp dir) owned by the suite's owner and run.
async fn scratch_ledger(s: &Subject) -> Step<(tempfile::TempDir, berth_ledger::Ledger)> {
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
async fn must_fire_on_error(s: &Subject) -> Outcome {
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
async fn must_fire_on_panic(s: &Subject) -> Outcome {
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
