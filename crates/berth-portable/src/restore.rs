//! A checkpoint into a sandbox: Berth's own archive written through the file API and unpacked
//! by the sandbox's `tar`, then the sandbox read back and compared — shared by `move` and by a
//! restore from a stored checkpoint.

use std::time::Duration;

use berth_contract::{ExecRequest, FileSource, NativeId, Provider, ProviderExt};

use crate::checkpoint::Checkpoint;
use crate::PortableError;

/// Run in the target's workspace: unpack the checkpoint Berth wrote (`$1`, a name Berth chose)
/// keeping permission bits but not owners, then remove it whatever happened.
const RESTORE_SCRIPT: &str = "tar -x -p -o -f \"$1\"; s=$?; rm -f -- \"$1\"; exit $s";
/// How long the target's `tar` may take.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(600);
/// How many differences an error names.
pub(crate) const SHOWN_DIFFERENCES: usize = 10;

/// Writes `archive` (the rebuilt archive of `checkpoint`) into the sandbox and unpacks it there.
pub(crate) async fn unpack(
    target: &dyn Provider,
    native: &NativeId,
    checkpoint: &Checkpoint,
    archive: Vec<u8>,
) -> Result<(), PortableError> {
    let name = archive_name(checkpoint);
    target
        .require_files()?
        .write_from(
            native,
            &name,
            FileSource {
                len: archive.len() as u64,
                reader: Box::new(std::io::Cursor::new(archive)),
            },
        )
        .await?;
    let unpack =
        ExecRequest::argv(["sh", "-c", RESTORE_SCRIPT, "sh", &name]).with_timeout(RESTORE_TIMEOUT);
    let out = target.exec(native, &unpack).await?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(out.stderr.as_deref().unwrap_or_default());
        let said: String = said.trim().chars().take(500).collect();
        return Err(PortableError::Restore(format!(
            "its `tar` {}: {}",
            out.status,
            said.escape_debug()
        )));
    }
    Ok(())
}

/// Reads the sandbox's workspace back: it must be `checkpoint`, entry for entry.
pub(crate) async fn verify(
    target: &dyn Provider,
    native: &NativeId,
    checkpoint: &Checkpoint,
) -> Result<(), PortableError> {
    let restored = Checkpoint::read_manifest(target, native).await?;
    let differences = checkpoint.differences(&restored, SHOWN_DIFFERENCES);
    if differences.is_empty() {
        Ok(())
    } else {
        Err(PortableError::NotVerified { differences })
    }
}

/// A name for the archive in the target's workspace that no carried path has.
fn archive_name(checkpoint: &Checkpoint) -> String {
    loop {
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).expect("the OS random source works");
        let name = format!(".berth-move-{}.tar", hex::encode(nonce));
        if !checkpoint.entries.contains_key(name.as_bytes()) {
            return name;
        }
    }
}
