//! The attempt's named steps: one per durable phase, each ending in one transaction.

use std::sync::Arc;

use berth_contract::{ExecRequest, Provider, SandboxName};
use berth_mission::authority::{
    AttemptKey, AttemptRecord, AttemptStatus, Event, MissionRecord, Phase,
};
use berth_mission::file::{parse_duration, Task};
use serde_json::json;

use crate::pipeline::*;
use crate::{capture, transport, MissionSpec, Orchestrator, OrchestratorError};

/// A needed sandbox that is provably gone rejects the attempt, with the reason; one the
/// provider cannot see for now stops the run.
macro_rules! or_fail {
    ($attempt:expr, $found:expr) => {
        match $found {
            Ok(id) => id,
            Err(failure) => return $attempt.fail(failure).await,
        }
    };
}

/// One attempt at one step: what every step reads.
pub(crate) struct Attempt<'a, 'o> {
    pub(crate) orch: &'a Orchestrator<'o>,
    pub(crate) spec: &'a MissionSpec,
    pub(crate) record: &'a MissionRecord,
    pub(crate) seq: i64,
    pub(crate) key: &'a AttemptKey,
    pub(crate) index: usize,
    pub(crate) task: &'a Task,
    pub(crate) attempt: &'a AttemptRecord,
    /// The provider the attempt uses (its sandbox's, or the mission's before one exists).
    pub(crate) provider: Arc<dyn Provider>,
    /// The attempt's main sandbox name.
    pub(crate) main: SandboxName,
    /// The candidate whose sandbox the attempt holds, if any.
    pub(crate) placed: Option<(String, SandboxName)>,
}

impl Attempt<'_, '_> {
    pub(crate) async fn reject(&self, reason: String) -> Result<Step, OrchestratorError> {
        reject(
            self.orch,
            self.spec,
            self.record,
            self.seq,
            self.key,
            reason,
        )
        .await
    }

    /// Rejects the attempt, or stops the run when the step met a retryable provider error
    /// (nothing recorded: resume runs the step again).
    pub(crate) async fn fail(&self, failure: Failure) -> Result<Step, OrchestratorError> {
        match failure {
            Failure::Reject(reason) => self.reject(reason).await,
            Failure::Retry { doing, source } => Err(self.interrupted(doing, source)),
            Failure::Fallback(source) => self.reject(source.to_string()).await,
        }
    }

    /// The run stops: what the attempt's agent needs could not be set up (`reason`).
    pub(crate) fn before_agent(&self, reason: String) -> OrchestratorError {
        OrchestratorError::BeforeAgent(Box::new(crate::BeforeAgent {
            mission: self.record.id.clone(),
            attempt: self.key.0.clone(),
            reason,
        }))
    }

    /// The run stops: `doing` met the provider's retryable error `source`.
    pub(crate) fn interrupted(
        &self,
        doing: String,
        source: berth_contract::ProviderError,
    ) -> OrchestratorError {
        OrchestratorError::Interrupted(Box::new(crate::Interrupted {
            mission: self.record.id.clone(),
            attempt: self.key.0.clone(),
            doing,
            source,
        }))
    }

    /// Stores the step's event with its facts, in one transaction.
    pub(crate) async fn reached(
        &self,
        phase: Phase,
        what: String,
        kind: &'static str,
        detail: serde_json::Value,
    ) -> Result<Step, OrchestratorError> {
        let event = Event::Reached {
            key: self.key.clone(),
            phase,
        };
        self.orch
            .commit_event(
                &self.record.id,
                self.record,
                self.seq,
                &event,
                &[(kind, detail)],
            )
            .await?;
        Ok(Step::Advanced {
            key: self.key.clone(),
            what,
        })
    }

    /// Makes (or adopts) the sandbox and stages the input: one durable step — adoption by name
    /// makes the sandbox half repeatable and staging starts from scratch, so a crash in between
    /// costs no event.
    pub(crate) async fn stage_sandbox(&self) -> Result<Step, OrchestratorError> {
        let orch = self.orch;
        let spec = self.spec;
        let record = self.record;
        let seq = self.seq;
        let key = self.key;
        let index = self.index;
        let task = self.task;
        let mission = &self.record.id;
        let provider = &self.provider;
        let main = &self.main;
        // A sandbox a crash left half-made (intent recorded, absent or still creating) holds
        // nothing yet: it is destroyed, its name retired, and the attempt places again —
        // the crash costs no attempt.
        let mut placed = self.placed.clone();
        if let Some((_, name)) = &placed {
            if let Ok(row) = orch.ledger.row(&name.0).await {
                if !is_ready(provider.as_ref(), &row).await {
                    let doing = format!("removing the interrupted sandbox `{}`", name.0);
                    or_fail!(self, retire(orch, provider.as_ref(), &row, doing).await?);
                    placed = None;
                }
            }
        }
        let (provider, main, id, skipped) = if placed.is_none() {
            match choose(orch, spec, task, mission, key).await? {
                Ok(chosen) => chosen,
                Err(failure) => return self.fail(failure).await,
            }
        } else {
            let id = or_fail!(self, existing(orch, provider.as_ref(), main).await?);
            (provider.clone(), main.clone(), id, Vec::new())
        };
        let (bundle, commit) = input_of(orch, spec, record, index);
        let work_repo = || capture::work_repo(&orch.mission_dir(mission), &spec.base_bundle);
        let staged = transport::stage(provider.as_ref(), &id, &bundle, work_repo, &commit).await;
        match staged {
            Ok(()) => {
                let event = Event::Reached {
                    key: key.clone(),
                    phase: Phase::Staged,
                };
                let facts = [
                    (
                        "sandbox",
                        json!({
                            "sandbox": main.0.clone(),
                            "native_id": id.0,
                            "provider": provider.id(),
                            "fallback_skipped": skipped,
                        }),
                    ),
                    (
                        "stage",
                        json!({
                            "commit": commit,
                            "transport": transport::name(provider.as_ref()),
                        }),
                    ),
                ];
                orch.commit_event(mission, record, seq, &event, &facts)
                    .await?;
                Ok(Step::Advanced {
                    key: key.clone(),
                    what: format!(
                        "sandbox {} ready, repository staged at {}",
                        main,
                        &commit[..12.min(commit.len())]
                    ),
                })
            }
            // Staging runs before the agent: its failure (no git in the image, a full disk in
            // the sandbox, a tree the transport cannot carry) is no verdict on the attempt,
            // and every later attempt would meet it. The sandbox goes — resume makes a fresh
            // one, from an image fixed meanwhile — and the run stops with nothing recorded.
            Err(Failure::Reject(reason)) => {
                match orch.ledger.row(&main.0).await {
                    Ok(row) => {
                        let doing = format!("removing sandbox `{main}` after staging failed");
                        or_fail!(self, retire(orch, provider.as_ref(), &row, doing).await?);
                    }
                    Err(berth_ledger::LedgerError::Store(e))
                        if !matches!(e, berth_store::StoreError::NotFound(..)) =>
                    {
                        return Err(e.into())
                    }
                    // No row of ours: nothing to remove.
                    Err(_) => {}
                }
                Err(self.before_agent(reason))
            }
            Err(failure) => self.fail(failure).await,
        }
    }

    /// Runs the agent (the harness command) in the staged repository.
    pub(crate) async fn run_agent(&self) -> Result<Step, OrchestratorError> {
        let orch = self.orch;
        let spec = self.spec;
        let task = self.task;
        let attempt = self.attempt;
        let provider = &self.provider;
        let main = &self.main;
        if let Some(harness) = crate::agents::harness_of(&spec.file) {
            return self.run_agent_cli(harness).await;
        }
        let id = or_fail!(self, existing(orch, provider.as_ref(), main).await?);
        let timeout = parse_duration(&task.agent_timeout).expect("validated");
        let command = spec.file.harness.command.clone().expect("validated");
        let req = ExecRequest::shell(command)
            .with_cwd("repo")
            .with_timeout(timeout)
            .with_env("BERTH_TASK", task.id.clone())
            .with_env("BERTH_INSTRUCTIONS", task.instructions.clone())
            .with_env("BERTH_ATTEMPT", attempt.ordinal.to_string());
        match provider.exec(&id, &req).await {
            Ok(out) => {
                self.reached(
                    Phase::AgentStopped,
                    format!("agent {}", out.status),
                    "agent",
                    output_json(&out, &crate::publication::redactor(orch, spec)),
                )
                .await
            }
            Err(e) => self.fail(Failure::of("the agent could not run", e)).await,
        }
    }

    /// Captures the workspace as data and commits it on the host.
    pub(crate) async fn capture(&self) -> Result<Step, OrchestratorError> {
        let orch = self.orch;
        let spec = self.spec;
        let record = self.record;
        let key = self.key;
        let index = self.index;
        let task = self.task;
        let attempt = self.attempt;
        let mission = &self.record.id;
        let provider = &self.provider;
        let main = &self.main;
        // The workspace leaves the agent's sandbox as data and is committed on the host;
        // the validator judges exactly that commit, in a clean sandbox.
        let main_id = or_fail!(self, existing(orch, provider.as_ref(), main).await?);
        let captured = match transport::capture_workspace(provider.as_ref(), &main_id).await {
            Ok(captured) => captured,
            Err(failure) => return self.fail(failure).await,
        };
        // A secret the run was handed (a login's value, the gateway's credential, the artifact
        // store's keys) written into the workspace would be committed, bundled, judged and
        // checkpointed: the attempt is rejected instead, and nothing of it is committed.
        let handed = crate::publication::mission_secrets(&orch.config.env, orch.home, spec);
        if let Some(path) = captured.first_holding(&handed) {
            let mut path = path.to_vec();
            berth_artifacts::Redactor::new(handed.iter().cloned()).redact(&mut path);
            return self
                .reject(format!(
                    "the workspace holds a secret value this run was handed, in `{}`: \
                     nothing of the attempt is committed",
                    String::from_utf8_lossy(&path).escape_debug()
                ))
                .await;
        }
        let (input, parent) = input_of(orch, spec, record, index);
        let repo = capture::work_repo(&orch.mission_dir(mission), &spec.base_bundle)?;
        let commit = capture::commit(
            &repo,
            &input,
            &attempt_ref(key),
            &parent,
            &format!("berth: {} (attempt {})", task.id, attempt.ordinal),
            &captured,
        )?;
        // The patch the attempt's artifacts carry, made now beside the bundle (two git
        // processes at once) rather than as a step of its own at publication.
        let patch = capture::start_patch(&repo, &spec.base_commit, &attempt_ref(key))?;
        let bundle = attempt_bundle(orch, mission, task, attempt.ordinal);
        let bytes = capture::bundle(&repo, &attempt_ref(key), &bundle);
        let patched = capture::write_patch(
            patch,
            &attempt_patch(orch, mission, task, attempt.ordinal, &commit),
        );
        let bytes = bytes?;
        patched?;
        // What was left out names files of the workspace, and the sandbox's own words: masked
        // like every other byte of the sandbox's that becomes durable.
        let redactor = crate::publication::redactor(orch, spec);
        let skipped: Vec<String> = captured
            .skipped
            .iter()
            .map(|why| {
                let mut bytes = why.clone().into_bytes();
                redactor.redact(&mut bytes);
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .collect();
        let left_out = match skipped.len() {
            0 => String::new(),
            n => format!(" ({n} notes on what was left out: `berth mission status`)"),
        };
        self.reached(
            Phase::Frozen,
            format!(
                "workspace captured: {} files, commit {}{left_out}",
                captured.files.len(),
                &commit[..12]
            ),
            "capture",
            json!({
                "commit": commit,
                "files": captured.files.len(),
                "bytes": captured.bytes(),
                "skipped": skipped,
                "bundle": bundle,
                "bundle_bytes": bytes,
            }),
        )
        .await
    }

    /// Records the commit the validator judged (computed on the host at capture).
    pub(crate) async fn record_commit(&self) -> Result<Step, OrchestratorError> {
        let orch = self.orch;
        let spec = self.spec;
        let record = self.record;
        let seq = self.seq;
        let key = self.key;
        let mission = &self.record.id;
        // The commit the validator judged, computed on the host at capture.
        let repo = capture::work_repo(&orch.mission_dir(mission), &spec.base_bundle)?;
        let commit = capture::resolve(&repo, &attempt_ref(key))?;
        orch.commit_event(
            mission,
            record,
            seq,
            &Event::Committed {
                key: key.clone(),
                commit: commit.clone(),
            },
            &[("commit", json!({ "commit": commit }))],
        )
        .await?;
        Ok(Step::Advanced {
            key: key.clone(),
            what: format!("committed {}", &commit[..12.min(commit.len())]),
        })
    }

    /// Checkpoints the accepted attempt and finalizes it, in one transaction.
    pub(crate) async fn checkpoint(&self) -> Result<Step, OrchestratorError> {
        let orch = self.orch;
        let spec = self.spec;
        let record = self.record;
        let seq = self.seq;
        let key = self.key;
        let task = self.task;
        let attempt = self.attempt;
        let mission = &self.record.id;
        let provider = &self.provider;
        let main = &self.main;
        let id = or_fail!(self, existing(orch, provider.as_ref(), main).await?);
        // A provider snapshot where the provider has one; otherwise a workspace snapshot: the
        // repository exported as a git bundle under the mission directory.
        let (checkpoint, detail) = match provider.snapshots() {
            Some(_) => {
                // A ledger row keyed by the attempt, recorded before the snapshot: a
                // checkpoint a crash interrupted is replaced, never duplicated, and the
                // snapshot is deleted once the mission is over and its retention passed.
                let snap = orch
                    .ledger
                    .snapshot_tracked(
                        provider.as_ref(),
                        &id,
                        &format!("ck-{}", key.0.trim_start_matches("at-")),
                        &mission_origin(mission, "checkpoint"),
                        Some(CHECKPOINT_RETENTION),
                    )
                    .await
                    .map_err(|e| match e {
                        berth_ledger::LedgerError::Provider { source, .. }
                            if source.retryable() =>
                        {
                            self.interrupted("taking the checkpoint".into(), source)
                        }
                        e => OrchestratorError::Repository(format!("checkpoint failed: {e}")),
                    })?;
                (snap.handle.clone(), json!({ "snapshot": snap }))
            }
            // The captured commit's bundle, written on the host at capture.
            None => {
                let path = attempt_bundle(orch, mission, task, attempt.ordinal);
                (
                    format!("bundle:{}", path.display()),
                    json!({ "workspace_bundle": path }),
                )
            }
        };
        // Finalizing is local (the bundle made at capture, copied): it lands in the same
        // transaction as the checkpoint.
        let path = orch
            .mission_dir(mission)
            .join(format!("{}.bundle", task.id));
        let bytes = final_bundle(orch, spec, mission, task, attempt.ordinal, key, &path)?;
        // The finalization gate: the attempt's artifact bundle is indexed first.
        let commit = match &attempt.status {
            AttemptStatus::Accepted {
                commit: Some(commit),
                ..
            } => commit.clone(),
            other => {
                return Err(OrchestratorError::Corrupt(format!(
                    "checkpoint of an attempt that is {other:?}"
                )))
            }
        };
        let (bundle, published) = crate::publication::publish_attempt(
            orch,
            spec,
            mission,
            task,
            attempt,
            crate::publication::accepted(spec, &commit, &checkpoint),
        )
        .await?;
        orch.commit_events(
            mission,
            record,
            seq,
            &[
                Event::Checkpointed {
                    key: key.clone(),
                    checkpoint: checkpoint.clone(),
                },
                Event::Published {
                    key: key.clone(),
                    bundle: bundle.clone(),
                },
                Event::Finalized { key: key.clone() },
            ],
            &[
                ("checkpoint", detail),
                ("artifacts", published),
                ("finalize", json!({ "bundle": path, "bytes": bytes })),
            ],
        )
        .await?;
        teardown(orch, spec, key, spec.file.sandbox.keep, Recheck::OpenOnly).await;
        Ok(Step::Advanced {
            key: key.clone(),
            what: format!(
                "checkpoint {checkpoint}; finalized, task `{}` done",
                task.id
            ),
        })
    }

    /// Writes the task's final bundle and tears the attempt down.
    pub(crate) async fn finalize(&self) -> Result<Step, OrchestratorError> {
        let orch = self.orch;
        let spec = self.spec;
        let record = self.record;
        let seq = self.seq;
        let key = self.key;
        let task = self.task;
        let attempt = self.attempt;
        let mission = &self.record.id;
        let path = orch
            .mission_dir(mission)
            .join(format!("{}.bundle", task.id));
        let bytes = final_bundle(orch, spec, mission, task, attempt.ordinal, key, &path)?;
        let AttemptStatus::Accepted {
            commit: Some(commit),
            checkpoint: Some(checkpoint),
            bundle,
            ..
        } = &attempt.status
        else {
            return Err(OrchestratorError::Corrupt(format!(
                "finalizing an attempt that is {:?}",
                attempt.status
            )));
        };
        let mut events = Vec::new();
        let mut facts = Vec::new();
        if bundle.is_none() {
            let (bundle, published) = crate::publication::publish_attempt(
                orch,
                spec,
                mission,
                task,
                attempt,
                crate::publication::accepted(spec, commit, checkpoint),
            )
            .await?;
            events.push(Event::Published {
                key: key.clone(),
                bundle,
            });
            facts.push(("artifacts", published));
        }
        events.push(Event::Finalized { key: key.clone() });
        facts.push(("finalize", json!({ "bundle": path, "bytes": bytes })));
        orch.commit_events(mission, record, seq, &events, &facts)
            .await?;
        teardown(orch, spec, key, spec.file.sandbox.keep, Recheck::OpenOnly).await;
        Ok(Step::Advanced {
            key: key.clone(),
            what: format!("finalized; task `{}` done", task.id),
        })
    }
}
