//! Labels carried by every resource Berth creates. Teardown destroys only what carries this
//! owner's labels (must-not-fire); the ledger token ties a resource to its ledger row.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Label key: who created the resource.
pub const OWNER: &str = "berth.owner";
/// Label key: the run (command invocation or mission) that created it.
pub const RUN: &str = "berth.run";
/// Label key: the ledger row's token.
pub const LEDGER_TOKEN: &str = "berth.ledger";
/// Label key: expiry, unix seconds.
pub const EXPIRES: &str = "berth.expires";
/// Label key: Berth's id for the sandbox.
pub const SANDBOX: &str = "berth.sandbox";

/// The labels on one Berth resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Labels {
    /// Owner identity (e.g. `alice@build-7`).
    pub owner: String,
    /// Run id of the invocation that created it.
    pub run_id: String,
    /// Ledger token of its ledger row.
    pub ledger_token: String,
    /// Expiry as unix seconds, when one was set.
    pub expires_at_unix: Option<i64>,
}

impl Labels {
    /// The flat key/value form providers attach to resources.
    pub fn to_map(&self, sandbox: &str) -> BTreeMap<String, String> {
        let mut map = BTreeMap::new();
        map.insert(OWNER.to_owned(), self.owner.clone());
        map.insert(RUN.to_owned(), self.run_id.clone());
        map.insert(LEDGER_TOKEN.to_owned(), self.ledger_token.clone());
        map.insert(SANDBOX.to_owned(), sandbox.to_owned());
        if let Some(expires) = self.expires_at_unix {
            map.insert(EXPIRES.to_owned(), expires.to_string());
        }
        map
    }

    /// Reads labels back from the flat form; `None` when owner, run or token is missing.
    pub fn from_map(map: &BTreeMap<String, String>) -> Option<Labels> {
        Some(Labels {
            owner: map.get(OWNER)?.clone(),
            run_id: map.get(RUN)?.clone(),
            ledger_token: map.get(LEDGER_TOKEN)?.clone(),
            expires_at_unix: map.get(EXPIRES).and_then(|v| v.parse().ok()),
        })
    }
}

/// A filter for listing: every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelFilter {
    /// Only resources with this owner.
    pub owner: Option<String>,
    /// Only resources from this run.
    pub run_id: Option<String>,
}

impl LabelFilter {
    /// Whether a resource's labels pass the filter. Resources without Berth labels never pass
    /// a filter that sets a field.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let field = |key: &str, want: &Option<String>| match want {
            None => true,
            Some(want) => labels.get(key) == Some(want),
        };
        field(OWNER, &self.owner) && field(RUN, &self.run_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Labels {
        Labels {
            owner: "alice".into(),
            run_id: "run-1".into(),
            ledger_token: "tok".into(),
            expires_at_unix: Some(1_800_000_000),
        }
    }

    #[test]
    fn map_round_trip() {
        let map = labels().to_map("bx-1");
        assert_eq!(map.get(SANDBOX).unwrap(), "bx-1");
        assert_eq!(Labels::from_map(&map), Some(labels()));
    }

    #[test]
    fn filter_requires_every_set_field() {
        let map = labels().to_map("bx-1");
        assert!(LabelFilter::default().matches(&map));
        let mine = LabelFilter {
            owner: Some("alice".into()),
            run_id: None,
        };
        assert!(mine.matches(&map));
        let other = LabelFilter {
            owner: Some("mallory".into()),
            run_id: None,
        };
        assert!(!other.matches(&map));
        assert!(!mine.matches(&BTreeMap::new()), "unlabelled never matches");
    }
}
