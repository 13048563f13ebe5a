//! The SQLite driver: the embedded default backend of every store contract.

mod artifacts;
mod ledger;
mod missions;
