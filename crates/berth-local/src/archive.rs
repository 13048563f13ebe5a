//! Deterministic, content-addressed workspace archives.
//!
//! Entries are written in sorted order with uid/gid 0 and no user names, so the same tree
//! (names, contents, modes, mtimes, symlink targets) always gives the same bytes and the same
//! sha256 handle. Symlinks are stored as links, never followed. Sockets and FIFOs are skipped.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use berth_contract::{ErrorKind, ProviderError, Result, SnapshotHandleKind, SnapshotRef};
use sha2::{Digest, Sha256};

use crate::classify::io_error;
use crate::confine::Workspace;
use crate::newfile::{open_state_dir, NewFile};
use crate::PROVIDER_ID;

const PREFIX: &str = "sha256:";

struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    len: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes the archive of the workspace to `out`; returns (hex sha256, byte length).
fn write_archive(root: &Workspace, out: &File) -> Result<(String, u64)> {
    let mut builder = tar::Builder::new(HashingWriter {
        inner: io::BufWriter::new(out),
        hasher: Sha256::new(),
        len: 0,
    });
    builder.follow_symlinks(false);
    let top = rustix::fs::openat(
        root.root(),
        ".",
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error("open workspace", e.into()))?;
    let walked = append_tree(&mut builder, &top, Path::new(""));
    // A destroy renames the sandbox away before it deletes anything, so a workspace still at
    // its path now was not being deleted under the walk: the archive is not a destroy's
    // half-deleted tree (which would otherwise pass for a whole fork or snapshot), and a walk
    // that failed because of one says so rather than "changed".
    if !root.still_at_its_path() {
        return Err(ProviderError::new(
            ErrorKind::NotFound,
            PROVIDER_ID,
            "the sandbox was destroyed while its workspace was being archived",
        ));
    }
    walked?;
    let archive_error = |e| io_error("write archive", e);
    let mut writer = builder.into_inner().map_err(archive_error)?;
    writer.flush().map_err(archive_error)?;
    Ok((hex::encode(writer.hasher.finalize()), writer.len))
}

/// Yields exactly `left` bytes or fails: a file that shrinks while it is archived must not
/// produce an entry shorter than its header says.
struct ExactReader<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for ExactReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.left > 0 && !buf.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn header_for(stat: &rustix::fs::Stat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(stat.st_mode & 0o7777);
    header.set_mtime(stat.st_mtime.max(0) as u64);
    header.set_uid(0);
    header.set_gid(0);
    header.set_size(size);
    header
}

fn changed(rel: &Path) -> ProviderError {
    ProviderError::new(
        ErrorKind::Conflict,
        PROVIDER_ID,
        format!(
            "`{}` changed while the workspace was being archived; try again when the sandbox is quiet",
            rel.display()
        ),
    )
}

/// Archives the directory open at `dir` (workspace-relative `rel`). Every entry is opened
/// beneath its parent's handle without following symlinks, and its type is taken from the
/// opened handle, so a sandbox swapping names meanwhile cannot make Berth read outside the
/// workspace: at worst the snapshot fails with a conflict.
fn append_tree<W: Write>(builder: &mut tar::Builder<W>, dir: &OwnedFd, rel: &Path) -> Result<()> {
    let list_error =
        |e: rustix::io::Errno| io_error(&format!("list `{}`", rel.display()), e.into());
    let mut names: Vec<std::ffi::CString> = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir).map_err(list_error)? {
        let entry = entry.map_err(list_error)?;
        let name = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    names.sort();
    for name in names {
        let rel_path = rel.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
        let stat = match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(_) => return Err(changed(&rel_path)),
        };
        let archive_error = |e| io_error("write archive", e);
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, name.as_c_str(), Vec::new())
                    .map_err(|_| changed(&rel_path))?;
                let mut header = header_for(&stat, tar::EntryType::Symlink, 0);
                builder
                    .append_link(
                        &mut header,
                        &rel_path,
                        std::ffi::OsStr::from_bytes(target.to_bytes()),
                    )
                    .map_err(archive_error)?;
            }
            FileType::Directory => {
                let child = rustix::fs::openat(
                    dir,
                    name.as_c_str(),
                    OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|_| changed(&rel_path))?;
                let mut header = header_for(&stat, tar::EntryType::Directory, 0);
                builder
                    .append_data(&mut header, &rel_path, io::empty())
                    .map_err(archive_error)?;
                append_tree(builder, &child, &rel_path)?;
            }
            FileType::RegularFile => {
                let fd = rustix::fs::openat(
                    dir,
                    name.as_c_str(),
                    OFlags::RDONLY
                        | OFlags::NOFOLLOW
                        | OFlags::NONBLOCK
                        | OFlags::CLOEXEC
                        | OFlags::NOCTTY,
                    Mode::empty(),
                )
                .map_err(|_| changed(&rel_path))?;
                let opened = rustix::fs::fstat(&fd).map_err(|_| changed(&rel_path))?;
                if FileType::from_raw_mode(opened.st_mode) != FileType::RegularFile
                    || opened.st_ino != stat.st_ino
                {
                    return Err(changed(&rel_path));
                }
                let size = opened.st_size.max(0) as u64;
                let mut header = header_for(&opened, tar::EntryType::Regular, size);
                // Exactly `size` bytes, or the entry would not match its header.
                let content = ExactReader {
                    inner: File::from(fd).take(size),
                    left: size,
                };
                builder
                    .append_data(&mut header, &rel_path, content)
                    .map_err(|_| changed(&rel_path))?;
            }
            // Sockets, FIFOs and devices are not workspace content.
            _ => {}
        }
    }
    Ok(())
}

/// Archives `workspace` into the content-addressed `store`. The archive has no name until it
/// is whole (see [`NewFile`]): a snapshot killed midway leaves nothing in the store.
pub(crate) fn snapshot(workspace: &Path, store: &Path) -> Result<SnapshotRef> {
    let workspace = Workspace::open(workspace)?;
    let dir = open_state_dir(store).map_err(|e| io_error("open the snapshot store", e))?;
    let new = NewFile::create(&dir).map_err(|e| io_error("create snapshot file", e.into()))?;
    let written = new
        .fd
        .try_clone()
        .map_err(|e| io_error("create snapshot file", e))
        .and_then(|fd| write_archive(&workspace, &File::from(fd)));
    let (digest, size) = match written {
        Ok(done) => done,
        Err(e) => {
            new.discard(&dir);
            return Err(e);
        }
    };
    let name = format!("{digest}.tar");
    if store.join(&name).exists() {
        // The same content is stored already.
        new.discard(&dir);
    } else {
        new.place(&dir, Path::new(&name), false)
            .map_err(|e| io_error("store snapshot", e.into()))?;
    }
    Ok(SnapshotRef {
        handle: format!("{PREFIX}{digest}"),
        kind: SnapshotHandleKind::Digest,
        size_bytes: Some(size),
    })
}

/// Points `key` at the stored snapshot `handle` (the archive is content-addressed, so the
/// same workspace gives the same handle). The snapshot the key named before is deleted unless
/// another key still names it: retrying a keyed snapshot never leaves a duplicate.
fn read_key(path: &Path) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    (text.len() <= 128).then(|| String::from_utf8_lossy(&text).trim().to_owned())
}

/// Deletes the archive `handle` unless a key in `keys` still names it.
fn delete_unless_named(store: &Path, keys: &Path, handle: &str) -> Result<()> {
    let still_named = std::fs::read_dir(keys)
        .map_err(|e| io_error("list snapshot keys", e))?
        .flatten()
        .any(|entry| read_key(&entry.path()).as_deref() == Some(handle));
    if !still_named {
        if let Ok(path) = path_for(store, handle) {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("delete snapshot", e)),
            }
        }
    }
    Ok(())
}

/// Deletes the snapshot `key` names, and the key (idempotent).
pub(crate) fn delete_named(store: &Path, key: &str) -> Result<()> {
    let keys = store.join("keys");
    let Some(handle) = read_key(&keys.join(key)) else {
        return Ok(());
    };
    match std::fs::remove_file(keys.join(key)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error("delete snapshot key", e)),
    }
    delete_unless_named(store, &keys, &handle)
}

pub(crate) fn name_snapshot(store: &Path, key: &str, handle: &str) -> Result<()> {
    let keys = store.join("keys");
    std::fs::create_dir_all(&keys).map_err(|e| io_error("create snapshot key index", e))?;
    let earlier = read_key(&keys.join(key));
    let failed = |e: io::Error| io_error("write snapshot key", e);
    let dir = open_state_dir(&keys).map_err(failed)?;
    let new = NewFile::create(&dir).map_err(|e| failed(e.into()))?;
    let written = new
        .fd
        .try_clone()
        .and_then(|fd| File::from(fd).write_all(handle.as_bytes()));
    if let Err(e) = written {
        new.discard(&dir);
        return Err(failed(e));
    }
    new.place(&dir, Path::new(key), keys.join(key).exists())
        .map_err(|e| failed(e.into()))?;
    match earlier.filter(|e| e != handle) {
        Some(earlier) => delete_unless_named(store, &keys, &earlier),
        None => Ok(()),
    }
}

/// Archives `workspace` into an unnamed file under `scratch` (gone with its handle, also when
/// the process is killed), rewound for reading.
pub(crate) fn to_temp_file(workspace: &Path, scratch: &Path) -> Result<File> {
    let workspace = Workspace::open(workspace)?;
    let failed = |e| io_error("create scratch archive", e);
    let mut temp = tempfile::tempfile_in(scratch).map_err(failed)?;
    write_archive(&workspace, &temp)?;
    io::Seek::rewind(&mut temp).map_err(failed)?;
    Ok(temp)
}

fn parse_handle(handle: &str) -> Result<&str> {
    let digest = handle.strip_prefix(PREFIX).unwrap_or("");
    if digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        Ok(digest)
    } else {
        Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            PROVIDER_ID,
            format!("`{handle}` is not a host snapshot handle (expected sha256:<64 hex digits>)"),
        ))
    }
}

/// The stored archive's path for a handle (which may not exist).
pub(crate) fn path_for(store: &Path, handle: &str) -> Result<PathBuf> {
    Ok(store.join(format!("{}.tar", parse_handle(handle)?)))
}

/// The stored archive's path, after checking it exists and its content still hashes to the
/// handle.
pub(crate) fn verified_path(store: &Path, handle: &str) -> Result<PathBuf> {
    let digest = parse_handle(handle)?;
    let path = store.join(format!("{digest}.tar"));
    let mut file = File::open(&path).map_err(|err| {
        if err.kind() == io::ErrorKind::NotFound {
            ProviderError::new(
                ErrorKind::NotFound,
                PROVIDER_ID,
                format!("no snapshot `{handle}`"),
            )
        } else {
            io_error("open snapshot", err)
        }
    })?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| io_error("read snapshot", e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    if hex::encode(hasher.finalize()) != digest {
        return Err(ProviderError::new(
            ErrorKind::Unknown,
            PROVIDER_ID,
            format!("snapshot `{handle}` no longer matches its digest (corrupt or tampered); refusing to restore it"),
        ));
    }
    Ok(path)
}

/// Unpacks an archive into `dest`. The tar reader refuses entries that would land outside
/// `dest` (`..`, absolute paths, writes through symlinks).
pub(crate) fn unpack(archive: File, dest: &Path, owner: Option<(u32, u32)>) -> Result<()> {
    let mut archive = tar::Archive::new(io::BufReader::new(archive));
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    archive
        .unpack(dest)
        .map_err(|e| io_error("unpack archive", e))?;
    if let Some((uid, gid)) = owner {
        // Nothing runs in the new sandbox yet, so the tree cannot change under this walk.
        give_tree(dest, uid, gid)
            .map_err(|e| io_error("give the workspace to the sandbox's user", e))?;
    }
    Ok(())
}

/// `lchown -R`: symlinks themselves, never what they point at.
fn give_tree(dir: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            give_tree(&path, uid, gid)?;
        } else {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_tree_gives_same_digest() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(ws.join("sub/a.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink("sub/a.txt", ws.join("link")).unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap();
        let first = snapshot(&ws, &store).unwrap();
        let second = snapshot(&ws, &store).unwrap();
        assert_eq!(first, second);
        std::fs::write(ws.join("sub/a.txt"), b"hellp").unwrap();
        let third = snapshot(&ws, &store).unwrap();
        assert_ne!(first.handle, third.handle);
    }

    /// Destroy renames a sandbox away before deleting it: a workspace archived while that
    /// happened is refused, not passed off as the whole tree.
    #[test]
    fn a_workspace_renamed_away_during_the_archive_is_not_archived() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(ws.join("sub/a.txt"), b"hello").unwrap();
        let opened = Workspace::open(&ws).unwrap();
        let sink = tempfile::tempfile().unwrap();
        write_archive(&opened, &sink).unwrap();
        std::fs::rename(&ws, dir.path().join(".destroying-ws")).unwrap();
        std::fs::remove_file(dir.path().join(".destroying-ws/sub/a.txt")).unwrap();
        let err = write_archive(&opened, &sink).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
        assert!(err.to_string().contains("destroyed"), "{err}");
        // Another directory put at the path is not the one that was walked.
        std::fs::create_dir(&ws).unwrap();
        assert!(write_archive(&opened, &sink).is_err());
    }

    #[test]
    fn malformed_handles_are_rejected() {
        let store = Path::new("/nonexistent");
        for bad in [
            "",
            "sha256:",
            "md5:abc",
            "sha256:../../etc/passwd",
            &format!("sha256:{}", "A".repeat(64)),
        ] {
            let err = path_for(store, bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{bad}");
        }
    }
}
