//! Deterministic, content-addressed workspace archives.
//!
//! Entries are written in sorted order with uid/gid 0 and no user names, so the same tree
//! (names, contents, modes, mtimes, symlink targets) always gives the same bytes and the same
//! sha256 handle. Symlinks are stored as links, never followed. Sockets and FIFOs are skipped.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use berth_contract::{ErrorKind, ProviderError, Result, SnapshotHandleKind, SnapshotRef};
use sha2::{Digest, Sha256};

use crate::classify::io_error;
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

/// Writes the archive of `root` to `out`; returns (hex sha256, byte length).
fn write_archive(root: &Path, out: &File) -> io::Result<(String, u64)> {
    let mut builder = tar::Builder::new(HashingWriter {
        inner: io::BufWriter::new(out),
        hasher: Sha256::new(),
        len: 0,
    });
    builder.follow_symlinks(false);
    append_tree(&mut builder, root, Path::new(""))?;
    let mut writer = builder.into_inner()?;
    writer.flush()?;
    Ok((hex::encode(writer.hasher.finalize()), writer.len))
}

fn header_for(meta: &std::fs::Metadata, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(meta.mode() & 0o7777);
    header.set_mtime(meta.mtime().max(0) as u64);
    header.set_uid(0);
    header.set_gid(0);
    header.set_size(size);
    header
}

fn append_tree<W: Write>(builder: &mut tar::Builder<W>, root: &Path, rel: &Path) -> io::Result<()> {
    let mut names: Vec<_> = std::fs::read_dir(root.join(rel))?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort();
    for name in names {
        let rel_path = rel.join(&name);
        let full = root.join(&rel_path);
        let meta = std::fs::symlink_metadata(&full)?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            let mut header = header_for(&meta, tar::EntryType::Symlink, 0);
            builder.append_link(&mut header, &rel_path, std::fs::read_link(&full)?)?;
        } else if kind.is_dir() {
            let mut header = header_for(&meta, tar::EntryType::Directory, 0);
            builder.append_data(&mut header, &rel_path, io::empty())?;
            append_tree(builder, root, &rel_path)?;
        } else if kind.is_file() {
            let mut header = header_for(&meta, tar::EntryType::Regular, meta.len());
            builder.append_data(&mut header, &rel_path, File::open(&full)?)?;
        }
    }
    Ok(())
}

/// Archives `workspace` into the content-addressed `store`.
pub(crate) fn snapshot(workspace: &Path, store: &Path) -> Result<SnapshotRef> {
    let temp =
        tempfile::NamedTempFile::new_in(store).map_err(|e| io_error("create snapshot file", e))?;
    let (digest, size) =
        write_archive(workspace, temp.as_file()).map_err(|e| io_error("archive workspace", e))?;
    let path = store.join(format!("{digest}.tar"));
    if !path.exists() {
        temp.persist(&path)
            .map_err(|e| io_error("store snapshot", e.error))?;
    }
    Ok(SnapshotRef {
        handle: format!("{PREFIX}{digest}"),
        kind: SnapshotHandleKind::Digest,
        size_bytes: Some(size),
    })
}

/// Archives `workspace` into a temporary file under `scratch` (removed when dropped).
pub(crate) fn to_temp_file(workspace: &Path, scratch: &Path) -> Result<tempfile::NamedTempFile> {
    let temp = tempfile::NamedTempFile::new_in(scratch)
        .map_err(|e| io_error("create scratch archive", e))?;
    write_archive(workspace, temp.as_file()).map_err(|e| io_error("archive workspace", e))?;
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
pub(crate) fn unpack(archive: &Path, dest: &Path) -> Result<()> {
    let file = File::open(archive).map_err(|e| io_error("open archive", e))?;
    let mut archive = tar::Archive::new(io::BufReader::new(file));
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    archive
        .unpack(dest)
        .map_err(|e| io_error("unpack archive", e))
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
