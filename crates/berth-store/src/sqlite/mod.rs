//! The SQLite driver: the embedded default backend of every store contract.

mod ledger;
mod missions;
