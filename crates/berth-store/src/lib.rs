//! Berth's durable state. SQLite is the embedded default: WAL journal, schema managed by
//! versioned migrations in `migrations/`.
//!
//! Durability is tiered by what a lost row would cost. An **intent** — a row written before
//! the thing it names exists (a sandbox or snapshot about to be created, a mission being
//! registered, a mission's final state) — is committed with `synchronous=FULL`: it survives
//! power loss, so nothing Berth makes can exist unrecorded. The one exception asks for it
//! ([`IntentDurability::ProcessCrash`]): a sandbox of a provider whose listing shows only what
//! this Berth home made (host, bwrap: directories under its private state). Power loss ends
//! such a sandbox's processes, and what is left is found by that listing and adopted by a sweep
//! — so its intent needs to survive only a process crash. Every other write (what happened
//! after an intent: created, destroyed, a mission step) is committed with WAL
//! `synchronous=NORMAL`: durable across process crashes (`kill -9`), and after power loss or a
//! kernel crash the log loses at most a suffix of such writes — the same state as a crash a
//! moment earlier, which recovery already handles (rows are re-observed, steps are
//! repeatable). A FULL commit flushes the whole WAL, so order is never lost. This crate stores
//! and fetches; the rules about what a row may become live in the families that own them (the
//! ledger crate for ledger rows).
//!
//! - [`Store`] — opening, migrating, schema version.
//! - [`ledger`] — ledger rows ([`LedgerRow`], [`LedgerState`], [`NewLedgerRow`]), the typed
//!   [`LedgerStore`] contract and its test suite ([`ledger::contract`]); SQLite implements it
//!   in `sqlite/`.
//! - [`missions`] — mission records, their event log and attempt facts ([`MissionRow`]).
//! - [`artifacts`] — artifact publication claims and the artifact index ([`ArtifactStore`]).
//! - [`access`] — `berth serve`'s bearer tokens (hashed) and audit log ([`AccessStore`]).

pub mod access;
pub mod artifacts;
pub mod ledger;
pub mod missions;
mod runs;
mod sqlite;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

pub use access::{AccessStore, ApiToken, AuditRow, NewAudit};
pub use artifacts::{
    ArtifactQuery, ArtifactRow, ArtifactStore, NewPublication, PublicationRow, PublicationState,
};
pub use ledger::{
    IntentDurability, LedgerQuery, LedgerRow, LedgerState, LedgerStore, NewLedgerRow, ResourceKind,
};
pub use missions::{AttemptFact, Conflict, LeaseHeld, MissionRow, MissionStore};
pub use runs::RunClaim;

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be opened or created.
    #[error("cannot open store {path}")]
    Open {
        /// The database file.
        path: String,
        /// Why.
        #[source]
        source: sqlx::Error,
    },
    /// A migration failed (or the database is newer than this Berth).
    #[error("cannot migrate store {path} to this berth's schema")]
    Migrate {
        /// The database file.
        path: String,
        /// Why.
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    /// The migration lock could not be taken.
    #[error("cannot take the store's migration lock")]
    Lock(#[source] std::io::Error),
    /// A query failed.
    #[error("store query failed: {what}")]
    Query {
        /// What was being done.
        what: &'static str,
        /// Why.
        #[source]
        source: sqlx::Error,
    },
    /// A statement made in-process (the mission runner's hot path) failed.
    #[error("store query failed: {what}")]
    Direct {
        /// What was being done.
        what: &'static str,
        /// Why.
        #[source]
        source: rusqlite::Error,
    },
    /// A row holds a value this Berth cannot read.
    #[error("store row is corrupt: {0}")]
    Corrupt(String),
    /// No such record: what kind (a mission id is not a ledger entry's) and the id asked for.
    #[error("no {0} `{1}`")]
    NotFound(Record, String),
    /// A create, fork or snapshot returned after a sweep had already taken its row (destroy
    /// requested or verified gone): the row is not reopened; what was made is the caller's to
    /// remove.
    #[error("ledger entry `{0}` was swept while its resource was being made")]
    SweptWhileMade(String),
    /// A run's liveness file could not be made, locked or read.
    #[error("cannot claim or check run `{run_id}` as live in {}: {error}", .dir.display())]
    RunLock {
        /// The run (`*`: the directory as a whole).
        run_id: String,
        /// The directory of run files.
        dir: PathBuf,
        /// Why (said in the message, not as a source: a create's ledger failure reaches the
        /// user through a provider error's message).
        error: std::io::Error,
    },
    /// The caller asked for something the contract does not allow (a bug in the caller).
    #[error("invalid store request: {0}")]
    Invalid(String),
}

/// The kinds of record a lookup can miss ([`StoreError::NotFound`]), so a caller names the one
/// the user asked for and where to list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// A cleanup-ledger row (a sandbox or a snapshot).
    LedgerEntry,
    /// A mission.
    Mission,
    /// An artifact bundle's publication.
    Bundle,
}

impl std::fmt::Display for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Record::LedgerEntry => "ledger entry",
            Record::Mission => "mission",
            Record::Bundle => "artifact bundle",
        })
    }
}

impl StoreError {
    /// Whether SQLite could not write or grow the store's files (`SQLITE_FULL` or an
    /// `SQLITE_IOERR_*`): the disk is full or failing — a condition of the host, not a bug.
    /// SQLite rolls such a transaction back, so the store holds what it held before.
    pub fn is_storage_failure(&self) -> bool {
        const SQLITE_IOERR: i32 = 10;
        const SQLITE_FULL: i32 = 13;
        let from_sqlx = |e: &sqlx::Error| match e {
            sqlx::Error::Database(e) => e.code().and_then(|code| code.parse::<i32>().ok()),
            _ => None,
        };
        let code = match self {
            StoreError::Open { source, .. } | StoreError::Query { source, .. } => from_sqlx(source),
            StoreError::Migrate {
                source:
                    sqlx::migrate::MigrateError::Execute(source)
                    | sqlx::migrate::MigrateError::ExecuteMigration(source, _),
                ..
            } => from_sqlx(source),
            StoreError::Direct {
                source: rusqlite::Error::SqliteFailure(e, _),
                ..
            } => Some(e.extended_code),
            _ => None,
        };
        // The primary result code is the low byte of an extended one.
        code.is_some_and(|code| matches!(code & 0xff, SQLITE_IOERR | SQLITE_FULL))
    }
}

/// The durable store.
#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
    /// Intents: the same database through connections with `synchronous=FULL`, opened on first
    /// use (a read-only command never pays for them).
    durable: SqlitePool,
    /// The store's identity, read on first use.
    identity: std::sync::Arc<tokio::sync::OnceCell<String>>,
    /// The same database in-process, for the statements made at every step (see
    /// [`sqlite::direct`]).
    direct: std::sync::Arc<sqlite::direct::Direct>,
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

impl Store {
    /// Opens (creating if missing) the SQLite database at `path` and migrates it.
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        let shown = path.display().to_string();
        let options = SqliteConnectOptions::from_str("sqlite://")
            .map_err(|source| StoreError::Open {
                path: shown.clone(),
                source,
            })?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let durable = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_lazy_with(options.clone().synchronous(SqliteSynchronous::Full));
        // Most opens find the schema current: a read-only check in-process, with no lock, no
        // write transaction, no fsync and no connection thread (a short-lived CLI process pays
        // for each); the pool then connects on its first query, which a command that only
        // reads a ledger row never makes.
        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            let direct = sqlite::direct::Direct::new(path.to_owned());
            if schema_is_current(&direct) {
                return Ok(Store {
                    pool: SqlitePoolOptions::new()
                        .max_connections(4)
                        .connect_lazy_with(options),
                    durable,
                    identity: Default::default(),
                    direct: std::sync::Arc::new(direct),
                });
            }
        }
        // Two processes opening a new database at once would race on switching it to WAL and on
        // the first migration (one would fail): opening and migrating run under an exclusive
        // lock on a sidecar file.
        let lock_path = path.with_extension("migrate.lock");
        let lock = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)?;
            file.lock()?;
            Ok(file)
        })
        .await
        .map_err(|e| StoreError::Lock(std::io::Error::other(e)))?
        .map_err(StoreError::Lock)?;
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|source| StoreError::Open {
                path: shown.clone(),
                source,
            })?;
        let migrated = MIGRATOR.run(&pool).await;
        drop(lock);
        migrated.map_err(|source| StoreError::Migrate {
            path: shown,
            source,
        })?;
        Ok(Store {
            pool,
            durable,
            identity: Default::default(),
            direct: std::sync::Arc::new(sqlite::direct::Direct::new(path.to_owned())),
        })
    }

    /// The schema version: the newest applied migration.
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar::<_, i64>(
            "SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations WHERE success = 1",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(|source| StoreError::Query {
            what: "read schema version",
            source,
        })
    }

    /// The newest schema version this build knows.
    pub fn latest_schema_version() -> i64 {
        MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// Claims `run_id` live until the claim is dropped (a lock the kernel drops with the
    /// process): a sweep from another run then holds this run's rows instead of taking them.
    /// One claim per run per process; claiming a run this process already claimed returns the
    /// same claim.
    pub fn claim_run(&self, run_id: &str) -> Result<std::sync::Arc<RunClaim>, StoreError> {
        runs::claim(&runs::runs_dir(self.direct.path()), run_id)
    }

    /// Whether `run_id` is claimed live by a running process (this one or another).
    pub fn run_is_live(&self, run_id: &str) -> Result<bool, StoreError> {
        runs::is_live(&runs::runs_dir(self.direct.path()), run_id)
    }

    /// Removes the liveness files of runs that are over (a killed process leaves its file,
    /// unlocked); returns how many.
    pub fn prune_runs(&self) -> Result<usize, StoreError> {
        runs::prune(&runs::runs_dir(self.direct.path()))
    }

    /// Closes the pools, flushing the WAL.
    pub async fn close(&self) {
        self.pool.close().await;
        self.durable.close().await;
    }

    /// Connections for writes a crash a moment earlier would equal (`synchronous=NORMAL`).
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The database in-process (see [`sqlite::direct`]).
    pub(crate) fn direct(&self) -> &sqlite::direct::Direct {
        &self.direct
    }

    /// Connections for intents (`synchronous=FULL`: survives power loss when the commit
    /// returns, and flushes every earlier write with it).
    pub(crate) fn durable(&self) -> &SqlitePool {
        &self.durable
    }
}

/// Every migration this build knows is applied, successfully, with the same checksum — what
/// `MIGRATOR.run` would find before doing nothing.
fn schema_is_current(direct: &sqlite::direct::Direct) -> bool {
    let applied = direct.run("read the schema version", |conn| {
        conn.prepare(
            "SELECT version, checksum FROM _sqlx_migrations WHERE success = 1 ORDER BY version",
        )?
        .query_map([], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Vec<u8>>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()
    });
    let Ok(applied) = applied else {
        return false;
    };
    let known: Vec<_> = MIGRATOR.iter().collect();
    applied.len() == known.len()
        && applied
            .iter()
            .zip(known)
            .all(|((version, checksum), m)| *version == m.version && checksum[..] == m.checksum[..])
}

#[cfg(test)]
mod durability_tests {
    use super::*;

    /// Intents go through FULL connections, everything else through NORMAL ones (WAL both).
    #[tokio::test]
    async fn intents_are_full_and_steps_are_normal() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("berth.db")).await.unwrap();
        let level = |pool: &SqlitePool| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>("PRAGMA synchronous")
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(level(store.durable()).await, 2, "FULL");
        assert_eq!(level(store.pool()).await, 1, "NORMAL");
        // In-process: FULL only while a power-loss write runs, NORMAL again after it.
        let direct = |full: bool| {
            store
                .direct()
                .run_durable(full, "test", |conn| {
                    conn.query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0))
                })
                .unwrap()
        };
        assert_eq!(direct(true), 2);
        assert_eq!(direct(false), 1);
        assert_eq!(direct(true), 2);
        assert_eq!(direct(false), 1);
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(store.durable())
            .await
            .unwrap();
        assert_eq!(mode, "wal");
    }
}
