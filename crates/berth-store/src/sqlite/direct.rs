//! SQLite called in-process, for the schema check at open and the statements made at every
//! step (ledger intents, marks and reads, mission appends, loads and leases, artifact claims,
//! index and reads).
//!
//! sqlx runs each statement of a connection on that connection's own thread: every statement is
//! a round trip between threads. On the CI machine kind that round trip measured 85–140 µs per
//! statement (a mission append of five statements: 330–640 µs), against 4 µs for a read and
//! 15 µs for a write transaction made in-process. This connection is rusqlite over the same
//! SQLite library sqlx links, opened on first use on a database file that already exists (a
//! new one is created and migrated through the pool first).

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use rusqlite::Connection;

use crate::StoreError;

/// One in-process connection, shared by the store's clones (statements are microseconds, so
/// callers take turns).
#[derive(Debug)]
pub(crate) struct Direct {
    path: PathBuf,
    conn: OnceLock<Mutex<Connection>>,
}

impl Direct {
    pub(crate) fn new(path: PathBuf) -> Direct {
        Direct {
            path,
            conn: OnceLock::new(),
        }
    }

    /// The database file.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    fn open(&self) -> Result<&Mutex<Connection>, StoreError> {
        if let Some(conn) = self.conn.get() {
            return Ok(conn);
        }
        let fail = |source| StoreError::Direct {
            what: "open the store in-process",
            source,
        };
        // Never creates the file: the pool does, and migrates it (WAL is a property of the
        // file; a file not yet migrated fails the schema check and goes through the pool).
        let conn = Connection::open_with_flags(
            &self.path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(fail)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(fail)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(fail)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(fail)?;
        let _ = self.conn.set(Mutex::new(conn));
        Ok(self.conn.get().expect("just set"))
    }

    /// Runs `work` on the connection. A statement may wait for another process's write lock
    /// (up to the busy timeout), so on a multi-threaded runtime the wait is announced to it.
    pub(crate) fn run<T>(
        &self,
        what: &'static str,
        work: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let call = || {
            let conn = self.open()?;
            let mut conn = conn.lock().map_err(|_| {
                StoreError::Corrupt("the in-process connection was poisoned".into())
            })?;
            work(&mut conn).map_err(|source| StoreError::Direct { what, source })
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(call)
            }
            _ => call(),
        }
    }

    /// Runs `work` with its commits flushed to disk before they return (`synchronous=FULL`:
    /// they survive power loss) when `power_loss` says so, else at the connection's `NORMAL`.
    pub(crate) fn run_durable<T>(
        &self,
        power_loss: bool,
        what: &'static str,
        work: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        self.run(what, |conn| {
            if power_loss {
                conn.pragma_update(None, "synchronous", "FULL")?;
            }
            let done = work(conn);
            if power_loss {
                conn.pragma_update(None, "synchronous", "NORMAL")?;
            }
            done
        })
    }
}
