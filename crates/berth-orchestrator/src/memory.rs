//! What a mission runner keeps in memory between ticks: the attempts it settled and claimed,
//! its lease's fencing token, and the mission state it last stored under that lease.

use std::sync::Arc;

use berth_contract::Provider;
use berth_mission::authority::{AttemptKey, MissionRecord};

use crate::MissionSpec;

/// Attempts an orchestrator has torn down completely (see [`crate::Orchestrator::settled`]), and those
/// it claimed itself (no other runner ever worked on them).
#[derive(Debug, Default)]
pub struct SettledAttempts(std::sync::Mutex<Attempts>);

#[derive(Debug, Default)]
struct Attempts {
    settled: std::collections::HashSet<String>,
    claimed_here: std::collections::HashSet<String>,
}

impl SettledAttempts {
    pub(crate) fn contains(&self, key: &AttemptKey) -> bool {
        self.0.lock().is_ok_and(|a| a.settled.contains(&key.0))
    }

    pub(crate) fn settle(&self, key: &AttemptKey) {
        if let Ok(mut a) = self.0.lock() {
            a.settled.insert(key.0.clone());
        }
    }

    pub(crate) fn claimed(&self, key: &AttemptKey) {
        if let Ok(mut a) = self.0.lock() {
            a.claimed_here.insert(key.0.clone());
        }
    }

    pub(crate) fn claimed_here(&self, key: &AttemptKey) -> bool {
        self.0.lock().is_ok_and(|a| a.claimed_here.contains(&key.0))
    }
}

/// The fencing token of a held mission lease; events are appended under it.
#[derive(Debug, Default)]
pub struct MissionLease(pub(crate) std::sync::atomic::AtomicI64);

impl MissionLease {
    pub(crate) fn fence(&self) -> Option<i64> {
        Some(self.0.load(std::sync::atomic::Ordering::SeqCst)).filter(|f| *f > 0)
    }
}

/// The mission state an orchestrator last stored while holding the mission's lease. As the
/// mission's only writer it knows that what it appended is what the store holds, so the next
/// tick starts from it instead of reading and parsing the record again. It is used only under
/// the fence it was stored with: a lease released, lost or taken again, or an append that
/// failed, sends the next tick to the store.
#[derive(Debug, Default)]
pub struct LastStored(std::sync::Mutex<Option<Stored>>);

#[derive(Debug)]
struct Stored {
    mission: String,
    fence: i64,
    spec: Arc<MissionSpec>,
    record: MissionRecord,
    seq: i64,
}

impl LastStored {
    pub(crate) fn get(
        &self,
        mission: &str,
        fence: Option<i64>,
    ) -> Option<(Arc<MissionSpec>, MissionRecord, i64)> {
        let held = self.0.lock().ok()?;
        let stored = held.as_ref()?;
        (Some(stored.fence) == fence && stored.mission == mission)
            .then(|| (stored.spec.clone(), stored.record.clone(), stored.seq))
    }

    pub(crate) fn loaded(
        &self,
        mission: &str,
        fence: Option<i64>,
        spec: &Arc<MissionSpec>,
        record: &MissionRecord,
        seq: i64,
    ) {
        if let (Ok(mut held), Some(fence)) = (self.0.lock(), fence) {
            *held = Some(Stored {
                mission: mission.to_owned(),
                fence,
                spec: spec.clone(),
                record: record.clone(),
                seq,
            });
        }
    }

    /// After an append: the new state if it follows the one held, else nothing (`None`: the
    /// append failed).
    pub(crate) fn appended(
        &self,
        mission: &str,
        fence: Option<i64>,
        next: Option<(&MissionRecord, i64)>,
    ) {
        let Ok(mut held) = self.0.lock() else { return };
        match (held.as_mut(), next) {
            (Some(stored), Some((record, seq)))
                if stored.mission == mission && Some(stored.fence) == fence =>
            {
                stored.record = record.clone();
                stored.seq = seq;
            }
            _ => *held = None,
        }
    }

    pub(crate) fn forget(&self) {
        if let Ok(mut held) = self.0.lock() {
            *held = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SPEC_VERSION;

    fn spec() -> Arc<MissionSpec> {
        let file = berth_mission::file::parse(
            "m.toml",
            r#"schema_version = 1
name = "m"
[repository]
path = "repo"
base = "snapshot"
[sandbox]
provider = "host"
[harness]
kind = "script"
command = "true"
[[tasks]]
id = "t"
instructions = "i"
max_attempts = 1
agent_timeout = "30s"
[tasks.validator]
command = "true"
timeout = "30s"
evidence = ["e"]
"#,
        )
        .unwrap();
        Arc::new(MissionSpec {
            spec_version: SPEC_VERSION,
            file,
            base_commit: "0".repeat(40),
            base_bundle: "base.bundle".into(),
            model_script: None,
        })
    }

    /// What a runner stored is used only by the same mission under the same fence, follows
    /// each append, and is dropped by a failed append, another mission's append or no lease.
    #[test]
    fn the_last_stored_state_is_used_only_under_its_fence() {
        let last = LastStored::default();
        let record = MissionRecord::new("m1", vec![("t".into(), 1, vec![])]);
        last.loaded("m1", None, &spec(), &record, 3);
        assert!(last.get("m1", None).is_none(), "kept without a lease");
        last.loaded("m1", Some(7), &spec(), &record, 3);
        assert_eq!(last.get("m1", Some(7)).map(|s| s.2), Some(3));
        assert!(last.get("m1", Some(8)).is_none(), "another fence");
        assert!(last.get("m2", Some(7)).is_none(), "another mission");
        last.appended("m1", Some(7), Some((&record, 4)));
        assert_eq!(last.get("m1", Some(7)).map(|s| s.2), Some(4));
        last.appended("m1", Some(7), None);
        assert!(last.get("m1", Some(7)).is_none(), "a failed append forgets");
        last.loaded("m1", Some(7), &spec(), &record, 4);
        last.appended("m1", Some(9), Some((&record, 5)));
        assert!(
            last.get("m1", Some(7)).is_none(),
            "an append under another fence forgets"
        );
        last.loaded("m1", Some(7), &spec(), &record, 5);
        last.forget();
        assert!(last.get("m1", Some(7)).is_none());
    }
}

/// The providers a runner has constructed: one instance per provider id for as long as the
/// runner lives. A bridged provider's sandboxes live in the bridge process its instance
/// started (just-bash's are in that process's memory), so an instance made again for each step
/// would find none of them; and constructing once is cheaper.
#[derive(Default)]
pub struct Providers(std::sync::Mutex<std::collections::BTreeMap<String, Arc<dyn Provider>>>);

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self
            .0
            .lock()
            .map(|held| held.keys().cloned().collect())
            .unwrap_or_default();
        f.debug_tuple("Providers").field(&ids).finish()
    }
}

impl Providers {
    /// The runner's instance of provider `id`, constructed on first use.
    pub(crate) fn get(
        &self,
        id: &str,
        registry: &berth_factory::Registry,
        config: &berth_factory::ProviderConfig,
    ) -> Result<Arc<dyn Provider>, berth_factory::FactoryError> {
        let mut held = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(provider) = held.get(id) {
            return Ok(provider.clone());
        }
        let provider = registry.construct(id, config)?;
        held.insert(id.to_owned(), provider.clone());
        Ok(provider)
    }
}
