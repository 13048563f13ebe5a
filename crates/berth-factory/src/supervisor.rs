//! The in-sandbox supervisor (and per-exec reaper) this build carries, written out on first
//! use so that installing Berth is one step.

use std::path::PathBuf;

use berth_contract::ProviderError;

use crate::ProviderConfig;

/// The static supervisor this build carries (built by this crate's build script; empty when
/// that build failed, which the build reported as a warning).
const EMBEDDED_SUPERVISOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/berth-supervisor"));

/// The in-sandbox supervisor (and per-exec reaper) providers use: `BERTH_SUPERVISOR` when set,
/// else the one this build carries, written once under `state_dir/bin` (named by its digest, so
/// a new build writes its own). Installing Berth is one step: nothing else has to be built.
pub fn supervisor(config: &ProviderConfig) -> Result<PathBuf, ProviderError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let setup = |message: String| {
        ProviderError::new(berth_contract::ErrorKind::Setup, "supervisor", message)
    };
    if let Some(path) = config.env.get("BERTH_SUPERVISOR").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(setup(format!(
                "BERTH_SUPERVISOR `{}` is not a file; unset it to use the supervisor this \
                 berth carries, or build one with scripts/build-supervisor",
                path.display()
            )))
        };
    }
    if EMBEDDED_SUPERVISOR.is_empty() {
        return Err(setup(
            "this berth was built without its supervisor (the static build failed; see the \
             build's warnings — a static glibc, Debian's libc6-dev, is needed); set \
             BERTH_SUPERVISOR to one built with scripts/build-supervisor"
                .into(),
        ));
    }
    let digest = env!("BERTH_EMBEDDED_SUPERVISOR_SHA256");
    let dir = config.state_dir.join("bin");
    let path = dir.join(format!("berth-supervisor-{}", &digest[..16]));
    if std::fs::symlink_metadata(&path)
        .is_ok_and(|m| m.is_file() && m.len() == EMBEDDED_SUPERVISOR.len() as u64)
    {
        return Ok(path);
    }
    let cannot =
        |what: &str, e: std::io::Error| setup(format!("cannot {what} {}: {e}", path.display()));
    std::fs::create_dir_all(&dir).map_err(|e| cannot("create the directory of", e))?;
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    // Concurrent first uses each write their own file and rename it into place.
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce)
        .map_err(|e| cannot("name", std::io::Error::other(e.to_string())))?;
    let partial = dir.join(format!(".partial-{}", hex::encode(nonce)));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(&partial)
        .and_then(|mut file| {
            file.write_all(EMBEDDED_SUPERVISOR)?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&partial, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(cannot("write", e));
    }
    Ok(path)
}
