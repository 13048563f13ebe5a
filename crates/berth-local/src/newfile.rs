//! A file written whole before it has a name: unnamed (`O_TMPFILE`) in its directory while
//! its bytes are written, linked under its name only once whole. A process killed while writing
//! leaves nothing behind (the kernel frees an unnamed file with its last handle).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::{Errno, Result};

use crate::confine::{open_beneath, temp_name};

/// A file being written beneath a directory handle: unnamed where the filesystem allows; else
/// under a `.berth-write-*` name (which a kill while writing leaves).
pub(crate) struct NewFile {
    pub(crate) fd: OwnedFd,
    /// The name it has while being written, when it could not be unnamed.
    temp: Option<PathBuf>,
}

impl NewFile {
    /// A new, empty file (mode 0600) in the directory `parent`.
    pub(crate) fn create(parent: impl AsFd) -> Result<NewFile> {
        if linkable_by_proc() {
            // "." of the directory handle is that directory: nothing is resolved.
            match rustix::fs::openat(
                &parent,
                ".",
                OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => return Ok(NewFile { fd, temp: None }),
                // The filesystem has no unnamed files: a named one instead.
                Err(Errno::OPNOTSUPP | Errno::ISDIR) => {}
                Err(e) => return Err(e),
            }
        }
        let temp = temp_name();
        let fd = open_beneath(
            &parent,
            &temp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        )?;
        Ok(NewFile {
            fd,
            temp: Some(temp),
        })
    }

    /// Puts the whole file under `name` in `parent`. A new name is linked at once (atomic: it
    /// fails, and nothing changes, if the name appeared meanwhile — then it is replaced like an
    /// old one). An old name is replaced by a rename from a temporary name: a kill between that
    /// link and the rename is the one moment a `.berth-write-*` name can be left.
    pub(crate) fn place(self, parent: impl AsFd, name: &Path, existed: bool) -> Result<()> {
        let temp = match self.temp {
            Some(temp) => temp,
            None => {
                if !existed {
                    match berth_files::link_unnamed(&self.fd, &parent, name) {
                        Ok(()) => return Ok(()),
                        Err(Errno::EXIST) => {}
                        Err(e) => return Err(e),
                    }
                }
                let temp = temp_name();
                berth_files::link_unnamed(&self.fd, &parent, &temp)?;
                temp
            }
        };
        berth_files::rename_or_remove(&parent, &temp, name)
    }

    /// Drops a file that will not be placed (an unnamed one goes with its handle).
    pub(crate) fn discard(self, parent: impl AsFd) {
        if let Some(temp) = &self.temp {
            let _ = rustix::fs::unlinkat(&parent, temp, AtFlags::empty());
        }
    }
}

/// Whether an unnamed file can be given a name (through `/proc/self/fd`, see
/// [`berth_files::link_unnamed`]).
fn linkable_by_proc() -> bool {
    static PROC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PROC.get_or_init(|| Path::new("/proc/self/fd").is_dir())
}

/// Opens the directory `dir` of Berth's own state (not a sandbox's: its path is trusted) as a
/// handle for [`NewFile`].
pub(crate) fn open_state_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        dir,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}
