//! The validation step: the validator runs in a clean sandbox holding a checkout of exactly
//! the captured commit, and its declared evidence is checked.

use berth_contract::{ExecRequest, ExitStatus};
use berth_mission::authority::{AttemptStatus, Event};
use berth_mission::file::parse_duration;
use berth_store::LedgerState;
use serde_json::json;

use crate::pipeline::*;
use crate::steps::Attempt;
use crate::{capture, transport, OrchestratorError};

impl Attempt<'_, '_> {
    /// Runs the validator on exactly the captured commit, in a clean sandbox.
    pub(crate) async fn validate(&self) -> Result<Step, OrchestratorError> {
        let orch = self.orch;
        let spec = self.spec;
        let record = self.record;
        let seq = self.seq;
        let key = self.key;
        let index = self.index;
        let task = self.task;
        let attempt = self.attempt;
        let mission = &self.record.id;
        let provider = &self.provider;
        let main = &self.main;
        // A fresh sandbox from the mission's image, holding a checkout of the captured
        // commit and nothing else of the agent's. One this step made before (a crash, or a
        // provider lost mid-validation, stopped it) is never judged in again: the validator
        // runs the agent's code, and what an interrupted run left there (a file outside
        // `repo/`, a process still running) must not reach the verdict. It is destroyed and
        // the next generation made; that costs no attempt, up to MAX_FREEZES generations.
        let rows = frozen_rows(orch, main).await?;
        let frozen = frozen_gen(main, rows.len() + 1);
        if let Some(row) = rows.last() {
            if rows.len() >= MAX_FREEZES {
                let why = format!(
                    "the validation was interrupted {MAX_FREEZES} times, each in a fresh sandbox"
                );
                return self.reject(why).await;
            }
            if row.state != LedgerState::VerifiedGone {
                if let Err(e) = orch.ledger.destroy_row(provider.as_ref(), row).await {
                    let doing = format!(
                        "removing the interrupted validator's sandbox `{}`",
                        row.berth_id
                    );
                    return self.fail(removal_failed(doing, e)?).await;
                }
            }
        }
        let frozen = match ensure(orch, provider, spec, mission, task, &frozen, true).await? {
            Ok(id) => id,
            // No fallback for the validator: it runs where the attempt ran.
            Err(Failure::Reject(reason)) => {
                return self
                    .reject(format!("the validator's sandbox: {reason}"))
                    .await;
            }
            Err(Failure::Fallback(source)) => {
                return self
                    .reject(format!("the validator's sandbox: {source}"))
                    .await;
            }
            Err(failure) => return self.fail(failure).await,
        };
        let repo = capture::work_repo(&orch.mission_dir(mission), &spec.base_bundle)?;
        let commit = capture::resolve(&repo, &attempt_ref(key))?;
        let bundle = attempt_bundle(orch, mission, task, attempt.ordinal);
        match transport::stage(
            provider.as_ref(),
            &frozen,
            &bundle,
            || Ok(repo.clone()),
            &commit,
        )
        .await
        {
            Ok(()) => {}
            Err(Failure::Reject(why)) => return self.reject(format!("validator {why}")).await,
            Err(failure) => return self.fail(failure).await,
        }
        let timeout = parse_duration(&task.validator.timeout).expect("validated");
        if let Some(setup) = &task.validator.setup {
            let req = ExecRequest::shell(setup.clone())
                .with_cwd("repo")
                .with_timeout(timeout);
            let why = match provider.exec(&frozen, &req).await {
                Ok(out) if out.status.success() => None,
                Ok(out) => Some(Failure::Reject(format!(
                    "validator setup {}: {}",
                    out.status,
                    tail(out.stderr.as_deref().unwrap_or_default()).trim()
                ))),
                Err(e) => Some(Failure::of("validator setup could not run", e)),
            };
            if let Some(failure) = why {
                return self.fail(failure).await;
            }
        }
        let req = ExecRequest::shell(task.validator.command.clone())
            .with_cwd("repo")
            .with_timeout(timeout);
        let out = match provider.exec(&frozen, &req).await {
            Ok(out) => out,
            Err(e) => {
                return self
                    .fail(Failure::of("the validator could not run", e))
                    .await
            }
        };
        let redactor = crate::publication::redactor(orch, self.spec);
        let validator_fact = output_json(&out, &redactor);
        let event = match &out.status {
            ExitStatus::Exited { code: 0 } => {
                let mut present = Vec::new();
                for evidence in &task.validator.evidence {
                    match transport::evidence_present(provider.as_ref(), &frozen, evidence).await {
                        Ok(true) => present.push(evidence.clone()),
                        Ok(false) => {}
                        Err(failure) => return self.fail(failure).await,
                    }
                }
                Event::ValidatorPassed {
                    key: key.clone(),
                    evidence: present,
                }
            }
            ExitStatus::TimedOut => Event::Rejected {
                key: key.clone(),
                reason: format!("validator timed out after {}", task.validator.timeout),
            },
            other => Event::Rejected {
                key: key.clone(),
                reason: format!(
                    "validator {other}: {}",
                    redacted_tail(out.stderr.as_deref().unwrap_or_default(), &redactor)
                        .lines()
                        .last()
                        .unwrap_or("")
                ),
            },
        };
        // An accepted attempt's commit is the one just judged: recorded in the same
        // transaction as the verdict (one durable commit, not two).
        let accepted = matches!(event, Event::ValidatorPassed { .. })
            && berth_mission::authority::apply(record, &event).is_ok_and(|next| {
                next.tasks[index]
                    .attempts
                    .iter()
                    .any(|a| &a.key == key && matches!(a.status, AttemptStatus::Accepted { .. }))
            });
        let (events, facts) = match event {
            Event::ValidatorPassed { .. } if accepted => (
                vec![
                    event,
                    Event::Committed {
                        key: key.clone(),
                        commit: commit.clone(),
                    },
                ],
                vec![
                    ("validator", validator_fact),
                    ("commit", json!({ "commit": commit })),
                ],
            ),
            other => (vec![other], vec![("validator", validator_fact)]),
        };
        let (next, _) = orch
            .commit_events(mission, record, seq, &events, &facts)
            .await?;
        // The frozen copy has served its purpose.
        if let Ok(row) = orch.ledger.row(&frozen.0).await {
            let _ = orch.ledger.destroy_row(provider.as_ref(), &row).await;
        }
        let status = &next.tasks[index]
            .attempts
            .iter()
            .find(|a| &a.key == key)
            .expect("attempt")
            .status;
        match status {
            AttemptStatus::Rejected { reason } => {
                crate::publication::publish_rejected(orch, spec, &next, key, reason).await;
                teardown(orch, spec, key, false, Recheck::OpenOnly).await;
                Ok(Step::Rejected {
                    key: key.clone(),
                    reason: reason.clone(),
                })
            }
            _ => Ok(Step::Advanced {
                key: key.clone(),
                what: "validator accepted".into(),
            }),
        }
    }
}
