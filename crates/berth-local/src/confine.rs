//! Sandbox paths, resolved beneath an opened workspace directory handle.
//!
//! A process inside the sandbox can rename, swap (`renameat2(RENAME_EXCHANGE)`) or replace any
//! path component at any moment, so nothing here checks a path and later opens it. Every open
//! goes through `openat2` relative to the workspace's directory handle with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`: the kernel refuses, atomically,
//! any resolution that would leave the workspace, follow a symlink or cross a mount. Symlinks in
//! the workspace are therefore never followed by the file API (listing shows them; archives
//! store them as links). Only regular files are read or replaced: a FIFO, socket or device is
//! refused before any blocking open, and reads are bounded.
//!
//! Path rules: relative to the workspace (an absolute path is accepted only when it already
//! lies inside the workspace, as the host sees it); `..` is refused outright.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use berth_contract::{ErrorKind, FileEntry, FileKind, ProviderError, Result};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

use crate::classify::io_error;
use crate::newfile::NewFile;
use crate::PROVIDER_ID;

/// The most the file API reads into memory from one sandbox file.
pub const MAX_READ_BYTES: u64 = berth_contract::MAX_FILE_READ_BYTES;

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_XDEV)
    .union(ResolveFlags::NO_MAGICLINKS);

fn invalid(path: &str, why: &str) -> ProviderError {
    ProviderError::new(
        ErrorKind::InvalidRequest,
        PROVIDER_ID,
        format!("path `{path}` {why}; sandbox paths are relative to the workspace"),
    )
}

/// Classifies a resolution error for `path` (as the caller wrote it).
fn resolve_error(path: &str, what: &str, err: rustix::io::Errno) -> ProviderError {
    use rustix::io::Errno;
    match err {
        Errno::LOOP => invalid(
            path,
            "goes through a symlink, which the file API never follows",
        ),
        Errno::XDEV => invalid(path, "leads outside the workspace"),
        Errno::NOENT => ProviderError::new(
            ErrorKind::NotFound,
            PROVIDER_ID,
            format!("`{path}` does not exist in the workspace"),
        ),
        Errno::NOTDIR => invalid(path, "goes through something that is not a directory"),
        Errno::NAMETOOLONG => invalid(path, "has a name that is too long"),
        Errno::ISDIR => invalid(path, "is a directory, not a file"),
        other => io_error(&format!("{what} `{path}`"), io::Error::from(other)),
    }
}

/// A sandbox path checked for shape (no NUL, no `..`, inside the workspace when absolute) and
/// turned into workspace-relative components. Empty means the workspace itself.
pub(crate) fn components(workspace: &Path, path: &str) -> Result<Vec<PathBuf>> {
    if path.contains('\0') {
        return Err(invalid(path, "contains a NUL byte"));
    }
    let requested = Path::new(path);
    let relative = if requested.is_absolute() {
        let canonical = workspace.canonicalize().ok();
        requested
            .strip_prefix(workspace)
            .ok()
            .or_else(|| {
                canonical
                    .as_deref()
                    .and_then(|c| requested.strip_prefix(c).ok())
            })
            .ok_or_else(|| invalid(path, "is absolute and outside the workspace"))?
    } else {
        requested
    };
    let mut parts = Vec::new();
    for component in relative.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => return Err(invalid(path, "contains `..`")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(invalid(path, "is absolute and outside the workspace"))
            }
            Component::Normal(part) => parts.push(PathBuf::from(part)),
        }
    }
    Ok(parts)
}

/// An opened workspace: every operation resolves beneath this handle.
#[derive(Debug)]
pub(crate) struct Workspace {
    root: OwnedFd,
    host_path: PathBuf,
    /// Who owns what the file API creates (the sandbox's unprivileged user when Berth runs as
    /// root); `None`: whoever Berth runs as.
    owner: Option<(u32, u32)>,
}

/// Gives `fd` to `owner` (uid, gid), when there is one.
pub(crate) fn give(fd: impl AsFd, owner: Option<(u32, u32)>) -> rustix::io::Result<()> {
    match owner {
        Some((uid, gid)) => rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        ),
        None => Ok(()),
    }
}

pub(crate) fn open_beneath(
    dir: impl AsFd,
    name: &Path,
    flags: OFlags,
) -> rustix::io::Result<OwnedFd> {
    // The kernel answers EAGAIN when a rename raced the resolution; trying again is safe
    // because every attempt is confined the same way.
    // openat2 refuses a mode unless the open may create.
    let mode = if flags.contains(OFlags::CREATE) {
        Mode::from_raw_mode(0o600)
    } else {
        Mode::empty()
    };
    // openat2 refuses anything but these beside O_PATH.
    let extra = if flags.contains(OFlags::PATH) {
        OFlags::CLOEXEC | OFlags::NOFOLLOW
    } else {
        OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY
    };
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(dir.as_fd(), name, flags | extra, mode, RESOLVE) {
            Err(rustix::io::Errno::AGAIN) if tries < 64 => tries += 1,
            other => return other,
        }
    }
}

fn join(parts: &[PathBuf]) -> PathBuf {
    if parts.is_empty() {
        PathBuf::from(".")
    } else {
        parts.iter().collect()
    }
}

impl Workspace {
    /// Opens the workspace directory of a sandbox (a host path Berth made).
    pub(crate) fn open(host_path: &Path) -> Result<Self> {
        let root = rustix::fs::open(
            host_path,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| io_error("open workspace", io::Error::from(e)))?;
        Ok(Workspace {
            root,
            host_path: host_path.to_owned(),
            owner: None,
        })
    }

    /// What the file API creates belongs to `owner`.
    pub(crate) fn owned_by(mut self, owner: Option<(u32, u32)>) -> Self {
        self.owner = owner;
        self
    }

    pub(crate) fn root(&self) -> &OwnedFd {
        &self.root
    }

    /// Whether the directory opened is still the one at its host path (not renamed away, as
    /// destroy does first, nor replaced).
    pub(crate) fn still_at_its_path(&self) -> bool {
        let (Ok(opened), Ok(named)) = (
            rustix::fs::fstat(&self.root),
            rustix::fs::lstat(&self.host_path),
        ) else {
            return false;
        };
        (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)
    }

    /// Opens a directory beneath the workspace. With `create`, missing directories are made
    /// one component at a time, each beneath the one opened before.
    pub(crate) fn open_dir(&self, shown: &str, parts: &[PathBuf], create: bool) -> Result<OwnedFd> {
        let flags = OFlags::DIRECTORY | OFlags::RDONLY;
        if !create {
            return open_beneath(&self.root, &join(parts), flags)
                .map_err(|e| resolve_error(shown, "open", e));
        }
        let mut current = open_beneath(&self.root, Path::new("."), flags)
            .map_err(|e| resolve_error(shown, "open", e))?;
        for part in parts {
            current = match open_beneath(&current, part, flags) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => {
                    let made = match rustix::fs::mkdirat(
                        &current,
                        part.as_path(),
                        Mode::from_raw_mode(0o755),
                    ) {
                        Ok(()) => true,
                        Err(rustix::io::Errno::EXIST) => false,
                        Err(e) => return Err(resolve_error(shown, "create directory", e)),
                    };
                    let dir = open_beneath(&current, part, flags)
                        .map_err(|e| resolve_error(shown, "open", e))?;
                    if made {
                        give(&dir, self.owner)
                            .map_err(|e| resolve_error(shown, "give directory", e))?;
                    }
                    dir
                }
                Err(e) => return Err(resolve_error(shown, "open", e)),
            };
        }
        Ok(current)
    }

    /// Checks that `path` names a directory in the workspace; returns it relative to the
    /// workspace (empty for the workspace itself).
    pub(crate) fn directory(&self, path: &str) -> Result<PathBuf> {
        let parts = components(&self.host_path, path)?;
        self.open_dir(path, &parts, false)?;
        Ok(parts.iter().collect())
    }

    /// Reads a regular file, at most [`MAX_READ_BYTES`].
    pub(crate) fn read(&self, path: &str) -> Result<Vec<u8>> {
        let (file, size) = self.open_regular(path)?;
        let mut bytes = Vec::with_capacity(size.min(1 << 20) as usize);
        file.take(MAX_READ_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(&format!("read `{path}`"), e))?;
        if bytes.len() as u64 > MAX_READ_BYTES {
            return Err(berth_contract::file_too_large(PROVIDER_ID, path));
        }
        Ok(bytes)
    }

    /// Copies a regular file into `sink` as it is read, whatever its size.
    pub(crate) fn read_to(
        &self,
        path: &str,
        mut sink: berth_contract::FileSink,
    ) -> Result<(berth_contract::FileSink, u64)> {
        let (mut file, _) = self.open_regular(path)?;
        let copied = berth_contract::copy_into_sink(&mut file, &mut sink, PROVIDER_ID, |e| {
            io_error(&format!("read `{path}`"), e)
        })?;
        Ok((sink, copied))
    }

    /// Opens a regular file for reading, with its size; anything else is refused without
    /// blocking.
    fn open_regular(&self, path: &str) -> Result<(std::fs::File, u64)> {
        let parts = components(&self.host_path, path)?;
        if parts.is_empty() {
            return Err(invalid(path, "is the workspace directory, not a file"));
        }
        // O_NONBLOCK: opening a FIFO must not wait for a writer; the type is checked on the
        // opened handle, so what is checked is what is read.
        let target = join(&parts);
        let fd = match open_beneath(&self.root, &target, OFlags::RDONLY | OFlags::NONBLOCK) {
            Ok(fd) => fd,
            // Sockets (and devices without a driver) cannot be opened for reading; name what
            // it is from a path-only handle.
            Err(err @ (rustix::io::Errno::NXIO | rustix::io::Errno::NODEV)) => {
                let kind = open_beneath(&self.root, &target, OFlags::PATH)
                    .and_then(rustix::fs::fstat)
                    .map(|stat| FileType::from_raw_mode(stat.st_mode))
                    .map_err(|_| resolve_error(path, "open", err))?;
                return Err(special(path, kind));
            }
            Err(err) => return Err(resolve_error(path, "open", err)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(|e| resolve_error(path, "inspect", e))?;
        require_regular(path, FileType::from_raw_mode(stat.st_mode))?;
        Ok((std::fs::File::from(fd), stat.st_size.max(0) as u64))
    }

    /// Replaces a regular file (or creates it, with missing parent directories). The bytes go
    /// to a new file beneath the same directory handle, put in place under the old name only
    /// once whole: nothing is ever written through an existing inode (a hard link) or a
    /// symlink. The new file has no name until it is whole (`O_TMPFILE`), so a write killed
    /// midway leaves nothing in the workspace (see [`NewFile`]).
    pub(crate) fn write(&self, path: &str, bytes: &[u8]) -> Result<()> {
        self.write_from(path, &mut &bytes[..], bytes.len() as u64)
    }

    /// [`Workspace::write`] with exactly `len` bytes read from `from` as they are written;
    /// the old name keeps what it had unless all of them were.
    pub(crate) fn write_from(&self, path: &str, from: &mut dyn io::Read, len: u64) -> Result<()> {
        let mut parts = components(&self.host_path, path)?;
        let Some(name) = parts.pop() else {
            return Err(invalid(path, "is the workspace directory, not a file"));
        };
        let parent = self.open_dir(path, &parts, true)?;
        // A replaced file keeps its permissions; a new one (also one replacing a symlink, whose
        // own mode says nothing) gets 0644.
        let (mode, existed) =
            match rustix::fs::statat(&parent, name.as_path(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                    FileType::Directory => return Err(invalid(path, "is a directory, not a file")),
                    FileType::RegularFile => (Mode::from_raw_mode(stat.st_mode & 0o777), true),
                    FileType::Symlink => (Mode::from_raw_mode(0o644), true),
                    kind => return Err(special(path, kind)),
                },
                Err(rustix::io::Errno::NOENT) => (Mode::from_raw_mode(0o644), false),
                Err(e) => return Err(resolve_error(path, "inspect", e)),
            };
        let new = NewFile::create(&parent).map_err(|e| resolve_error(path, "create", e))?;
        let failed = |e: io::Error| io_error(&format!("write `{path}`"), e);
        let written = (|| -> Result<()> {
            give(&new.fd, self.owner).map_err(|e| failed(e.into()))?;
            rustix::fs::fchmod(&new.fd, mode).map_err(|e| failed(e.into()))?;
            let mut file = std::fs::File::from(new.fd.try_clone().map_err(failed)?);
            berth_contract::copy_exactly(from, &mut file, len, PROVIDER_ID, path, failed)?;
            file.flush().map_err(failed)
        })();
        match written {
            Ok(()) => new
                .place(&parent, &name, existed)
                .map_err(|e| resolve_error(path, "replace", e)),
            Err(e) => {
                new.discard(&parent);
                Err(e)
            }
        }
    }

    /// Lists a directory; symlinks are reported as symlinks, never followed.
    pub(crate) fn list(&self, path: &str) -> Result<Vec<FileEntry>> {
        let parts = components(&self.host_path, path)?;
        let dir = self.open_dir(path, &parts, false)?;
        let mut entries = Vec::new();
        let listing =
            rustix::fs::Dir::read_from(&dir).map_err(|e| resolve_error(path, "list", e))?;
        for entry in listing {
            let entry = entry.map_err(|e| resolve_error(path, "list", e))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if entries.len() == berth_contract::MAX_LIST_ENTRIES {
                return Err(berth_contract::too_many_entries(PROVIDER_ID, path));
            }
            let stat = match rustix::fs::statat(&dir, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
            {
                Ok(stat) => stat,
                // Removed between readdir and stat: it is not there any more.
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(resolve_error(path, "list", e)),
            };
            let kind = match FileType::from_raw_mode(stat.st_mode) {
                FileType::Symlink => FileKind::Symlink,
                FileType::Directory => FileKind::Dir,
                FileType::RegularFile => FileKind::File,
                _ => FileKind::Other,
            };
            entries.push(FileEntry {
                name: String::from_utf8_lossy(name).into_owned(),
                kind,
                size: if kind == FileKind::File {
                    stat.st_size.max(0) as u64
                } else {
                    0
                },
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }
}

/// A fresh name in the same directory, short whatever the final name's length.
pub(crate) fn temp_name() -> PathBuf {
    let mut random = [0u8; 8];
    let _ = getrandom::fill(&mut random);
    PathBuf::from(format!(".berth-write-{}", hex::encode(random)))
}

pub(crate) fn require_regular(path: &str, kind: FileType) -> Result<()> {
    match kind {
        FileType::RegularFile => Ok(()),
        FileType::Directory => Err(invalid(path, "is a directory, not a file")),
        other => Err(special(path, other)),
    }
}

fn special(path: &str, kind: FileType) -> ProviderError {
    let what = match kind {
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Symlink => "a symlink",
        _ => "not a regular file",
    };
    ProviderError::new(
        ErrorKind::InvalidRequest,
        PROVIDER_ID,
        format!("`{path}` is {what}; the file API reads and writes regular files only"),
    )
}

#[cfg(test)]
mod tests;
