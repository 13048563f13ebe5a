//! The SQLite driver: the embedded default backend of every store contract.

mod access;
mod artifacts;
pub(crate) mod direct;
mod ledger;
mod missions;

use chrono::{DateTime, SecondsFormat, Utc};

use crate::StoreError;

/// Now, as the mission and artifact tables store times (RFC 3339, milliseconds).
fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A stored RFC 3339 time.
fn ts(text: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(text)
        .map(|d| d.with_timezone(&Utc))
        .map_err(|_| StoreError::Corrupt(format!("timestamp `{text}`")))
}

/// A failed query, saying what was being done.
fn q(what: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Query { what, source }
}
