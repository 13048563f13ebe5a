//! Which runs are live. A run that records rows holds an exclusive lock on a file named for it
//! (beside the database: `berth.db.runs/RUN`) for as long as its ledger lives; the kernel drops
//! the lock when the process ends, however it ends. So a sweep from another run can tell, at
//! once and without waiting out a sign-of-life interval, a run still making or using what its
//! rows name (hold it) from a killed one (take it).
//!
//! Locks are `flock`s: per open file, so two ledgers of one process conflict as two processes
//! do, and two ledgers of one run in one process share one claim.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::StoreError;

/// A run's claim to be live: held while any clone of its ledger lives. Dropping the last
/// holder removes the file, then unlocks it.
#[derive(Debug)]
pub struct RunClaim {
    path: PathBuf,
    _locked: File,
}

impl Drop for RunClaim {
    fn drop(&mut self) {
        // Removed while still locked: a sweep that opened it a moment ago then takes a lock on
        // a file of a run that is over, which is what it is.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The claims this process holds, by file: a second ledger of a run already claimed here
/// shares the claim instead of failing to lock its own file.
static CLAIMS: Mutex<BTreeMap<PathBuf, Weak<RunClaim>>> = Mutex::new(BTreeMap::new());

/// The directory of a database's run files.
pub(crate) fn runs_dir(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(".runs");
    PathBuf::from(name)
}

/// A run id as a file name: as it is when it is plainly one (run ids Berth makes are
/// `run-` and hex), else `%` and its bytes in hex.
fn file_name(run_id: &str) -> Result<String, StoreError> {
    let plain = !run_id.is_empty()
        && run_id.len() <= 128
        && !run_id.starts_with(['.', '%'])
        && run_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if plain {
        return Ok(run_id.to_owned());
    }
    if run_id.is_empty() || run_id.len() > 120 {
        return Err(StoreError::Invalid(format!(
            "a run id must be 1 to 120 bytes to be claimed (got {})",
            run_id.len()
        )));
    }
    Ok(format!(
        "%{}",
        run_id
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}

fn io_error(dir: &Path, run_id: &str, source: std::io::Error) -> StoreError {
    StoreError::RunLock {
        run_id: run_id.to_owned(),
        dir: dir.to_owned(),
        error: source,
    }
}

/// Claims `run_id` as live in `dir` (created private if missing) until the claim is dropped.
pub(crate) fn claim(dir: &Path, run_id: &str) -> Result<Arc<RunClaim>, StoreError> {
    let path = dir.join(file_name(run_id)?);
    let mut claims = CLAIMS
        .lock()
        .map_err(|_| StoreError::Corrupt("the run claims were poisoned".into()))?;
    claims.retain(|_, claim| claim.strong_count() > 0);
    if let Some(held) = claims.get(&path).and_then(Weak::upgrade) {
        return Ok(held);
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error(dir, run_id, e)),
    }
    // A sweep removes a file whose lock is free, so between this open and this lock the path
    // may have been unlinked: the lock then holds a file no sweep will ever open. Locked, the
    // path must still name the same file; else try again with a fresh one. (Run ids are
    // random per run, so a lock held for long is never another claim of the same run.)
    let mut attempts = 0;
    let file = loop {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| io_error(dir, run_id, e))?;
        attempts += 1;
        match file.try_lock() {
            Ok(()) => {
                if still_named(&file, &path).map_err(|e| io_error(dir, run_id, e))? {
                    break file;
                }
            }
            // A sweep checking whether the run is live holds a shared lock for a moment.
            Err(TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(TryLockError::Error(e)) => return Err(io_error(dir, run_id, e)),
        }
        if attempts == 200 {
            return Err(io_error(
                dir,
                run_id,
                std::io::Error::other(
                    "its file stayed locked by another process, or kept being removed",
                ),
            ));
        }
    };
    let claim = Arc::new(RunClaim {
        path: path.clone(),
        _locked: file,
    });
    claims.insert(path, Arc::downgrade(&claim));
    Ok(claim)
}

/// Whether `run_id` is claimed live, by this process or any other. A file whose lock is free
/// is a run's that is over (killed): it is removed.
pub(crate) fn is_live(dir: &Path, run_id: &str) -> Result<bool, StoreError> {
    let Ok(name) = file_name(run_id) else {
        // Never claimable, so never live.
        return Ok(false);
    };
    let path = dir.join(name);
    let file = match open_existing(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_error(dir, run_id, e)),
    };
    // Another sweep removing a file holds its lock for a moment: a few tries tell that from a
    // claim, which holds it for as long as its run lives.
    for _ in 0..3 {
        match file.try_lock_shared() {
            Ok(()) => {
                drop(file);
                remove_if_over(&path);
                return Ok(false);
            }
            Err(TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(TryLockError::Error(e)) => return Err(io_error(dir, run_id, e)),
        }
    }
    Ok(true)
}

/// Removes the files of runs that are over (their lock free); returns how many.
pub(crate) fn prune(dir: &Path) -> Result<usize, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_error(dir, "*", e)),
    };
    Ok(entries
        .flatten()
        .filter(|entry| remove_if_over(&entry.path()))
        .count())
}

fn open_existing(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Removes the run file at `path` if no run holds it. The removal holds the file's lock and
/// first checks that `path` still names that file: a file opened a moment ago may since have
/// been removed by another sweep and replaced by a new claim's, which must stay.
fn remove_if_over(path: &Path) -> bool {
    let Ok(file) = open_existing(path) else {
        return false;
    };
    if file.try_lock().is_err() {
        return false;
    }
    // While this lock is held, a claim cannot lock this file, so it makes no new one at
    // `path` (it only does when `path` is gone), and no other removal passes the check.
    still_named(&file, path).unwrap_or(false) && std::fs::remove_file(path).is_ok()
}

/// Whether `path` still names the file `file` opened (false when `path` is gone).
fn still_named(file: &File, path: &Path) -> std::io::Result<bool> {
    let opened = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(named) => Ok((named.dev(), named.ino()) == (opened.dev(), opened.ino())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}
