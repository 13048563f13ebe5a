//! Reading a local file a user names: mission files, gateway scripts and price tables,
//! evidence records, provider manifests, files copied into a sandbox.
//!
//! A path can name anything: a FIFO (whose `open` blocks until a writer appears — forever, and
//! deaf to SIGTERM while the thread is stuck in it), a character device (`/dev/zero` never
//! ends), a directory, or a huge file. [`read_regular`] opens without blocking
//! (`O_NONBLOCK | O_NOCTTY`), refuses anything but a regular file and reads at most a bound
//! ([`read_bounded`], which also bounds a stream such as stdin). [`write_regular`] is the same
//! for a file a user names as a destination: a FIFO there would block the `open` just the same.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Why a file was not read (or written).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Opening or reading failed (missing, no permission, …).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A FIFO, socket, device or directory.
    #[error("not a regular file")]
    NotRegular,
    /// More bytes than the caller allows.
    #[error("larger than {max} bytes")]
    TooLarge {
        /// The caller's bound.
        max: u64,
    },
}

/// Opens `path` with `options` without ever blocking in `open` (a FIFO with no writer, or no
/// reader) or making a terminal the controlling one. For a regular file O_NONBLOCK changes
/// nothing.
fn open_nonblocking(options: &mut std::fs::OpenOptions, path: &Path) -> std::io::Result<File> {
    let flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
    options.custom_flags(flags.bits() as i32).open(path)
}

/// Refuses an opened file that is not a regular file (checked on the file, so a path swapped
/// after the open changes nothing).
fn regular(file: File) -> Result<File, ReadError> {
    match file.metadata()?.is_file() {
        true => Ok(file),
        false => Err(ReadError::NotRegular),
    }
}

/// The regular file at `path`, opened for reading, with its length (anything else is refused
/// without blocking).
pub fn open_regular(path: &Path) -> Result<(File, u64), ReadError> {
    let file = regular(open_nonblocking(
        std::fs::OpenOptions::new().read(true),
        path,
    )?)?;
    let len = file.metadata()?.len();
    Ok((file, len))
}

/// The bytes of the regular file at `path`, at most `max` of them.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let file = open_nonblocking(std::fs::OpenOptions::new().read(true), path)?;
    read_bounded(regular(file)?, max)
}

/// At most `max` bytes of `reader` (a file, stdin); more is [`ReadError::TooLarge`].
pub fn read_bounded(reader: impl Read, max: u64) -> Result<Vec<u8>, ReadError> {
    let mut bytes = Vec::new();
    reader.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge { max });
    }
    Ok(bytes)
}

/// Writes `bytes` to `path`, creating or truncating a regular file there; a FIFO, device or
/// directory is refused without blocking (a FIFO with no reader fails the non-blocking open;
/// one with a reader, or a device, is refused before a byte is written).
pub fn write_regular(path: &Path, bytes: &[u8]) -> Result<(), ReadError> {
    write_regular_from(path, bytes).map(|_| ())
}

/// [`write_regular`] with the bytes read from `reader` (a spooled copy, say); returns how
/// many were written.
pub fn write_regular_from(path: &Path, mut reader: impl Read) -> Result<u64, ReadError> {
    let opened = open_nonblocking(
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true),
        path,
    );
    let file = match opened {
        Ok(file) => file,
        // ENXIO: a FIFO nobody reads; EISDIR: a directory.
        Err(_) if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) => {
            return Err(ReadError::NotRegular)
        }
        Err(e) => return Err(e.into()),
    };
    let mut file = regular(file)?;
    Ok(std::io::copy(&mut reader, &mut file)?)
}

/// Writes `bytes` to `path` through a temporary file beside it (created with `mode`), flushed
/// to disk and renamed over `path`: a crash at any moment leaves the old file or the new one,
/// never part of either, and nothing beside it but for a kill between the write and the
/// rename.
pub fn write_replacing(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".berth-tmp-{}", std::process::id()));
    let temporary = path.with_file_name(name);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Puts all of `spool` in place of the regular file at `path` (or creates it), so that `path`
/// is at every moment either what it was or the whole copy — also when the process is killed
/// midway. `spool` is an unnamed file (`tempfile::tempfile_in`) in the directory of the file
/// `path` names (see [`replacement_dir`]); it is linked there under a temporary name and renamed
/// over the file. A symlink at `path` is followed, as `cp` does: its target is replaced. The
/// file keeps its permission bits (not setuid or setgid) and, as root, its owner; a new one
/// gets 0666 less the umask.
/// Where the spool cannot be linked (another filesystem, no `/proc`), its bytes are copied into
/// the file instead, as [`write_regular_from`] does. Returns the bytes in place.
pub fn replace_regular_with(path: &Path, spool: File) -> Result<u64, ReadError> {
    use std::os::unix::fs::MetadataExt;
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let (mode, owner) = match std::fs::metadata(&target) {
        Ok(meta) if !meta.is_file() => return Err(ReadError::NotRegular),
        // Permission bits only: bytes from a sandbox never inherit a setuid or setgid bit.
        Ok(meta) => (meta.mode() & 0o777, Some((meta.uid(), meta.gid()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (0o666 & !umask(), None),
        Err(e) => return Err(e.into()),
    };
    let Some(name) = target.file_name() else {
        return Err(ReadError::NotRegular);
    };
    let mut temp = std::ffi::OsString::from(".");
    temp.push(name);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    temp.push(format!(".berth-cp-{}-{nanos}", std::process::id()));
    let temp = Path::new(&temp);
    let dir = rustix::fs::open(
        parent_dir(&target),
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    );
    let Ok(dir) = dir else {
        return write_regular_from(path, spool);
    };
    if link_unnamed(&spool, &dir, temp).is_err() {
        return write_regular_from(path, spool);
    }
    let prepared = (|| -> std::io::Result<u64> {
        rustix::fs::fchmod(&spool, rustix::fs::Mode::from_raw_mode(mode))?;
        if let Some((uid, gid)) = owner.filter(|_| rustix::process::geteuid().is_root()) {
            rustix::fs::fchown(
                &spool,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            )?;
        }
        Ok(spool.metadata()?.len())
    })();
    let len = match prepared {
        Ok(len) => len,
        Err(e) => {
            let _ = rustix::fs::unlinkat(&dir, temp, rustix::fs::AtFlags::empty());
            return Err(e.into());
        }
    };
    rename_or_remove(&dir, temp, Path::new(name)).map_err(std::io::Error::from)?;
    Ok(len)
}

/// Links the unnamed file `file` (made with `O_TMPFILE`, without `O_EXCL`) into the directory
/// `dir` as `name`, through `/proc/self/fd` (a link by the handle itself, `AT_EMPTY_PATH`, needs
/// a capability Berth may not have). Fails, changing nothing, when `name` exists.
pub fn link_unnamed(file: impl AsFd, dir: impl AsFd, name: &Path) -> rustix::io::Result<()> {
    let by_proc = format!("/proc/self/fd/{}", file.as_fd().as_raw_fd());
    rustix::fs::linkat(
        rustix::fs::CWD,
        by_proc.as_str(),
        dir,
        name,
        rustix::fs::AtFlags::SYMLINK_FOLLOW,
    )
}

/// Renames `temp` over `name` in the directory `dir`; a rename that fails removes `temp`.
pub fn rename_or_remove(dir: impl AsFd, temp: &Path, name: &Path) -> rustix::io::Result<()> {
    let renamed = rustix::fs::renameat(&dir, temp, &dir, name);
    if renamed.is_err() {
        let _ = rustix::fs::unlinkat(&dir, temp, rustix::fs::AtFlags::empty());
    }
    renamed
}

/// Where the spool for [`replace_regular_with`] goes: the directory of the file `path` names
/// (through a symlink), `.` for a bare name.
pub fn replacement_dir(path: &Path) -> std::path::PathBuf {
    parent_dir(&std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned()))
}

/// The directory `target` is in, `.` for a bare name.
fn parent_dir(target: &Path) -> std::path::PathBuf {
    match target.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => std::path::PathBuf::from("."),
    }
}

/// The process's umask, from `/proc/self/status` (reading it with umask(2) would change it for
/// every thread meanwhile); 022 when it cannot be read.
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Umask:"))?;
            u32::from_str_radix(line.split_whitespace().nth(1)?, 8).ok()
        })
        .unwrap_or(0o022)
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_testkit::{at_once, make_fifo};

    /// Each kind of path a user can name: read, or refused at once with the reason — a FIFO
    /// with no writer must not block (it did: `mission run FIFO` hung, deaf to SIGTERM).
    #[test]
    fn only_bounded_regular_files_are_read_and_nothing_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"hello").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"hello");
        assert!(matches!(
            read_regular(&file, 4),
            Err(ReadError::TooLarge { max: 4 })
        ));

        let fifo = dir.path().join("fifo");
        make_fifo(&fifo);
        let fifo_path = fifo.clone();
        let result = at_once("reading a FIFO with no writer", move || {
            read_regular(&fifo_path, 10).map(|_| ())
        });
        assert!(matches!(result, Err(ReadError::NotRegular)), "{result:?}");

        for refused in [Path::new("/dev/zero"), dir.path()] {
            assert!(
                matches!(read_regular(refused, 10), Err(ReadError::NotRegular)),
                "{}",
                refused.display()
            );
        }
        assert!(matches!(
            read_regular(&dir.path().join("missing"), 10),
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound
        ));

        // As a destination: a regular file is created or replaced; a FIFO (no reader), a
        // device or a directory is refused, at once.
        write_regular(&file, b"new").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        let result = at_once("writing to a FIFO with no reader", move || {
            write_regular(&fifo, b"x")
        });
        assert!(matches!(result, Err(ReadError::NotRegular)), "{result:?}");
        for refused in [Path::new("/dev/null"), dir.path()] {
            assert!(
                matches!(write_regular(refused, b"x"), Err(ReadError::NotRegular)),
                "{}",
                refused.display()
            );
        }
    }

    /// A spool as `cp` makes one: unnamed, in `dir`, holding `bytes`, rewound.
    fn spool(dir: &Path, bytes: &[u8]) -> File {
        use std::io::{Seek, Write};
        let mut spool = tempfile::tempfile_in(dir).unwrap();
        spool.write_all(bytes).unwrap();
        spool.rewind().unwrap();
        spool
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// The copy replaces the file by a rename, never by rewriting it: the old inode is never
    /// written (so a process killed midway cannot leave it half old, half new), the file keeps
    /// its permissions, a symlink's target is replaced (the link stays), and nothing is left
    /// beside it.
    #[test]
    fn a_copy_takes_the_files_place_whole() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dest");
        std::fs::write(&file, b"old contents").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o750)).unwrap();
        let held = File::open(&file).unwrap();
        let old_inode = held.metadata().unwrap().ino();
        assert_eq!(
            replace_regular_with(&file, spool(dir.path(), b"new")).unwrap(),
            3
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        let meta = std::fs::metadata(&file).unwrap();
        assert_ne!(meta.ino(), old_inode, "written into the old file");
        assert_eq!(meta.mode() & 0o777, 0o750);
        assert_eq!(std::io::read_to_string(&held).unwrap(), "old contents");
        // A setuid file's new contents (from a sandbox) do not keep the bit.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o4755)).unwrap();
        replace_regular_with(&file, spool(dir.path(), b"new")).unwrap();
        let mode = std::fs::metadata(&file).unwrap().mode();
        assert_eq!(mode & 0o7777, 0o755);

        std::os::unix::fs::symlink("dest", dir.path().join("link")).unwrap();
        replace_regular_with(&dir.path().join("link"), spool(dir.path(), b"via link")).unwrap();
        assert!(std::fs::symlink_metadata(dir.path().join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&file).unwrap(), b"via link");

        let fresh = dir.path().join("fresh");
        replace_regular_with(&fresh, spool(dir.path(), b"x")).unwrap();
        assert_eq!(std::fs::read(&fresh).unwrap(), b"x");
        assert_eq!(names(dir.path()), ["dest", "fresh", "link"]);
        // A directory is refused and untouched.
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(matches!(
            replace_regular_with(&sub, spool(dir.path(), b"x")),
            Err(ReadError::NotRegular)
        ));
        assert!(sub.is_dir());
    }

    /// A replacing write leaves the old file or the new one: never written into (a reader of
    /// the old file keeps its bytes), created with the given mode, nothing left beside it.
    #[test]
    fn a_replacing_write_never_touches_the_old_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("record.json");
        write_replacing(&file, b"first", 0o600).unwrap();
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let held = File::open(&file).unwrap();
        write_replacing(&file, b"second", 0o600).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"second");
        assert_eq!(std::io::read_to_string(&held).unwrap(), "first");
        assert_eq!(names(dir.path()), ["record.json"]);
    }
}
