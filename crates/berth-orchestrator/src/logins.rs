//! Subscription logins (Codex's `auth.json`, Claude Code's `.credentials.json`) for users
//! without an API key.
//!
//! A login is named in Berth's configuration, `$BERTH_HOME/logins.toml` (mode 0600, never in a
//! mission file, which names it only):
//!
//! ```toml
//! schema_version = 1
//! [logins.work-claude]
//! harness = "claude-code"
//! file = "/home/me/.claude/.credentials.json"
//! ```
//!
//! Its refresh token rotates, so copies cannot fan out: an attempt holds an exclusive lease
//! (a lock on `state/logins/NAME.lock`) from staging to write-back. The file is staged into the
//! sandbox only for the agent run; afterwards the file as the run left it (a refreshed token)
//! is read back, bounded, and written back over the configured file — only if it is still a
//! JSON object with the original's top-level keys, and only if the configured file did not
//! change meanwhile (otherwise it is kept beside it as `FILE.berth-refreshed`). The agent's
//! home, login included, is then removed from the sandbox before capture, validators and
//! snapshots.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_harness::Harness;
use serde::Deserialize;

/// The configuration file, in `BERTH_HOME`.
pub const LOGINS_FILE: &str = "logins.toml";

/// The configuration's schema version.
pub const LOGINS_SCHEMA_VERSION: u32 = 1;

/// The largest login file staged or written back.
pub const MAX_LOGIN_BYTES: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginsFile {
    schema_version: u32,
    #[serde(default)]
    logins: BTreeMap<String, LoginEntry>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginEntry {
    harness: String,
    file: PathBuf,
}

/// A configured login, found and checked.
#[derive(Debug, Clone)]
pub struct Login {
    /// Its name.
    pub name: String,
    /// The CLI it signs in.
    pub harness: Harness,
    /// The operator's file.
    pub file: PathBuf,
}

/// Finds login `name` for `harness` in `home`'s configuration.
pub fn find(home: &Path, name: &str, harness: Harness) -> Result<Login, String> {
    let path = home.join(LOGINS_FILE);
    let text = read_private(&path)?;
    let file: LoginsFile = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if file.schema_version != LOGINS_SCHEMA_VERSION {
        return Err(format!(
            "{}: schema_version {} (this berth reads {LOGINS_SCHEMA_VERSION})",
            path.display(),
            file.schema_version
        ));
    }
    let entry = file
        .logins
        .get(name)
        .ok_or_else(|| format!("no login `{name}` in {}", path.display()))?;
    if entry.harness != harness.as_str() {
        return Err(format!(
            "login `{name}` is for `{}`, not `{}`",
            entry.harness,
            harness.as_str()
        ));
    }
    if harness.login_file().is_none() {
        return Err(format!(
            "`{}` takes no subscription login",
            harness.as_str()
        ));
    }
    if !entry.file.is_absolute() {
        return Err(format!("login `{name}`: `file` must be an absolute path"));
    }
    Ok(Login {
        name: name.to_owned(),
        harness,
        file: entry.file.clone(),
    })
}

/// Reads the configuration, refusing one that others can read.
fn read_private(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is readable by others (mode {:o}); chmod 600 it",
            path.display(),
            meta.mode() & 0o777
        ));
    }
    if meta.len() > MAX_LOGIN_BYTES as u64 {
        return Err(format!("{} is too large", path.display()));
    }
    // Opened without blocking and checked regular (a FIFO put there would hang the run), and
    // bounded again on the opened file.
    let bytes = berth_files::read_regular(path, MAX_LOGIN_BYTES as u64)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8", path.display()))
}

/// An attempt's exclusive hold on a login; released when dropped.
#[derive(Debug)]
pub struct Lease {
    login: Login,
    _lock: File,
    /// The file as staged.
    staged: Vec<u8>,
}

/// What became of a login after the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteBack {
    /// The run left the file as it was staged.
    Unchanged,
    /// A refreshed file was written over the configured one.
    Written,
    /// A refreshed file was kept at this path instead (the reason says why).
    KeptBeside(PathBuf, String),
    /// Nothing was written back (the reason says why).
    Refused(String),
}

impl Lease {
    /// Takes the lease on `login` (waiting at most `wait` for another attempt to give it back)
    /// and reads the file to stage.
    pub async fn take(home: &Path, login: Login, wait: Duration) -> Result<Lease, String> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        // In Berth's private state directory (0700).
        let dir = home.join("state").join("logins");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(dir.join(format!("{}.lock", login.name)))
            .map_err(|e| format!("the lease on login `{}`: {e}", login.name))?;
        let deadline = Instant::now() + wait;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(format!(
                        "login `{}` stayed leased to another attempt for {wait:?}",
                        login.name
                    ))
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(format!("the lease on login `{}`: {e}", login.name))
                }
            }
        }
        let staged = read_bounded(&login.file)?;
        Ok(Lease {
            login,
            _lock: lock,
            staged,
        })
    }

    /// The bytes to stage.
    pub fn staged(&self) -> &[u8] {
        &self.staged
    }

    /// The login's name.
    pub fn name(&self) -> &str {
        &self.login.name
    }

    /// Writes back `returned` (the file as the run left it, from the sandbox: untrusted).
    pub fn write_back(&self, returned: &[u8]) -> WriteBack {
        if returned == self.staged.as_slice() {
            return WriteBack::Unchanged;
        }
        if returned.len() > MAX_LOGIN_BYTES {
            return WriteBack::Refused(format!(
                "the returned file exceeds {MAX_LOGIN_BYTES} bytes"
            ));
        }
        let keys = |bytes: &[u8]| -> Option<Vec<String>> {
            match serde_json::from_slice::<serde_json::Value>(bytes).ok()? {
                serde_json::Value::Object(map) => Some(map.keys().cloned().collect()),
                _ => None,
            }
        };
        let (Some(before), Some(after)) = (keys(&self.staged), keys(returned)) else {
            return WriteBack::Refused(
                "the returned file is not a JSON object like the staged one".into(),
            );
        };
        if !before.iter().all(|k| after.contains(k)) {
            return WriteBack::Refused(
                "the returned file lacks top-level keys the staged one had".into(),
            );
        }
        // Compare-and-swap: only over the very file that was staged.
        let current = read_bounded(&self.login.file).ok();
        if current.as_deref() != Some(self.staged.as_slice()) {
            let beside = sibling(&self.login.file, "berth-refreshed");
            return match write_atomically(&beside, returned) {
                Ok(()) => WriteBack::KeptBeside(
                    beside,
                    "the configured file changed on the host during the run".into(),
                ),
                Err(e) => WriteBack::Refused(e),
            };
        }
        match write_atomically(&self.login.file, returned) {
            Ok(()) => WriteBack::Written,
            Err(e) => WriteBack::Refused(e),
        }
    }
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_LOGIN_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() > MAX_LOGIN_BYTES {
        return Err(format!(
            "{} exceeds {MAX_LOGIN_BYTES} bytes; not a login file",
            path.display()
        ));
    }
    Ok(bytes)
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}"));
    path.with_file_name(name)
}

/// Writes `bytes` to `path` (0600) through a temporary file in the same directory and a
/// rename, so a crash leaves either the old file or the new one.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    berth_files::write_replacing(path, bytes, 0o600)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(mode: u32) -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let login = dir.path().join("auth.json");
        std::fs::write(
            &login,
            br#"{"tokens":{"refresh_token":"r1"},"last_refresh":"a"}"#,
        )
        .unwrap();
        let config = dir.path().join(LOGINS_FILE);
        std::fs::write(
            &config,
            format!(
                "schema_version = 1\n[logins.mine]\nharness = \"codex\"\nfile = \"{}\"\n",
                login.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, login)
    }

    #[test]
    fn a_readable_configuration_or_a_wrong_harness_is_refused() {
        let (dir, _) = setup(0o644);
        let err = find(dir.path(), "mine", Harness::Codex).unwrap_err();
        assert!(err.contains("readable by others"), "{err}");
        let (dir, _) = setup(0o600);
        let err = find(dir.path(), "mine", Harness::ClaudeCode).unwrap_err();
        assert!(err.contains("is for `codex`"), "{err}");
        let err = find(dir.path(), "other", Harness::Codex).unwrap_err();
        assert!(err.contains("no login `other`"), "{err}");
        assert!(find(dir.path(), "mine", Harness::Codex).is_ok());
    }

    /// A logins configuration that is a FIFO (private mode, so past the mode check) is
    /// refused at once: reading it used to block the run forever, deaf to SIGTERM.
    #[test]
    fn a_configuration_that_is_a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join(LOGINS_FILE);
        berth_testkit::make_fifo(&config);
        let home = dir.path().to_owned();
        let err = berth_testkit::at_once("reading a FIFO configuration", move || {
            find(&home, "mine", Harness::Codex)
        })
        .unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[tokio::test]
    async fn one_attempt_at_a_time_and_write_back_only_what_fits() {
        let (dir, file) = setup(0o600);
        let login = find(dir.path(), "mine", Harness::Codex).unwrap();
        let lease = Lease::take(dir.path(), login.clone(), Duration::from_secs(1))
            .await
            .unwrap();
        // A second attempt waits, then gives up with a clear reason.
        let err = Lease::take(dir.path(), login.clone(), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(err.contains("stayed leased"), "{err}");

        assert_eq!(lease.write_back(lease.staged()), WriteBack::Unchanged);
        assert!(matches!(
            lease.write_back(b"not json"),
            WriteBack::Refused(_)
        ));
        assert!(matches!(
            lease.write_back(br#"{"other":1}"#),
            WriteBack::Refused(_)
        ));
        let refreshed = br#"{"tokens":{"refresh_token":"r2"},"last_refresh":"b"}"#;
        assert_eq!(lease.write_back(refreshed), WriteBack::Written);
        assert_eq!(std::fs::read(&file).unwrap(), refreshed);
        {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o600);
        }
        drop(lease);

        // The file changed on the host during the run: the refreshed one is kept beside it.
        let lease = Lease::take(dir.path(), login, Duration::from_secs(1))
            .await
            .unwrap();
        std::fs::write(&file, br#"{"tokens":{},"last_refresh":"host"}"#).unwrap();
        match lease.write_back(br#"{"tokens":{"refresh_token":"r3"},"last_refresh":"c"}"#) {
            WriteBack::KeptBeside(path, _) => {
                assert!(std::fs::read_to_string(path).unwrap().contains("r3"));
            }
            other => panic!("{other:?}"),
        }
        assert!(std::fs::read_to_string(&file).unwrap().contains("host"));
    }
}
