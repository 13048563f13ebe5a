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
}
