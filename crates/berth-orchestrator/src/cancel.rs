//! Cancelling a mission: ended where it stands, its sandboxes removed, and a report of what
//! became of each.

use berth_mission::authority::{AttemptStatus, MissionState};
use berth_store::{LedgerQuery, LedgerState, LedgerStore as _, ResourceKind};
use serde::Serialize;

use crate::pipeline::{candidates, main_name, mission_origin};
use crate::{Orchestrator, OrchestratorError};

/// What became of a cancelled mission's sandboxes.
#[derive(Debug, Default, Serialize)]
pub struct Teardown {
    /// Sandboxes verified gone (this cancel's, and any removed before it).
    pub verified_gone: usize,
    /// Accepted attempts' sandboxes kept because the mission file says `keep`.
    pub kept: Vec<String>,
    /// Sandboxes not removed yet; `berth ledger sweep` removes them (the mission no longer
    /// holds them).
    pub not_removed: Vec<NotRemoved>,
}

/// A sandbox a cancel could not remove.
#[derive(Debug, Serialize)]
pub struct NotRemoved {
    /// Its name.
    pub sandbox: String,
    /// The last error removing it, if one was recorded.
    pub error: Option<String>,
}

impl Orchestrator<'_> {
    /// Ends a running mission where it stands ([`berth_mission::authority::Event::Cancel`])
    /// and removes every sandbox its attempts hold (an accepted attempt's is kept when the
    /// mission file says `keep`), as the mission's runner: a live runner holding it is
    /// [`OrchestratorError::Leased`], and a mission that succeeded or failed is
    /// [`OrchestratorError::Finished`]; a cancelled one is cancelled again (its teardown
    /// finished, the first reason kept). Checkpoints stay, under their retention; evidence
    /// already published stays.
    pub async fn cancel(
        &self,
        id: &str,
        reason: &str,
    ) -> Result<(MissionState, Teardown), OrchestratorError> {
        let state = self.drive(id, Some(reason), &mut |_| {}).await?;
        let (spec, record, _) = self.load(id).await?;
        let keep = spec.file.sandbox.keep;
        let choices = candidates(&spec).len();
        let accepted: Vec<String> = record
            .tasks
            .iter()
            .flat_map(|task| &task.attempts)
            .filter(|attempt| matches!(attempt.status, AttemptStatus::Accepted { .. }))
            .flat_map(|attempt| (0..choices).map(|c| main_name(&attempt.key, c).0))
            .collect();
        let query = LedgerQuery {
            owner: Some(self.ledger.owner().to_owned()),
            run_id: None,
            include_gone: true,
        };
        let ours = [
            mission_origin(id, "attempt"),
            mission_origin(id, "validator"),
        ];
        let mut report = Teardown::default();
        for row in self.ledger.store().ledger_list(&query).await? {
            if row.kind != ResourceKind::Sandbox || !ours.contains(&row.origin) {
                continue;
            }
            if row.state == LedgerState::VerifiedGone {
                report.verified_gone += 1;
            } else if keep && accepted.contains(&row.berth_id) {
                report.kept.push(row.berth_id);
            } else {
                report.not_removed.push(NotRemoved {
                    sandbox: row.berth_id,
                    error: row.last_error,
                });
            }
        }
        Ok((state, report))
    }
}
