//! The files group of the contract: reading, copying out, writing (whole or streamed) and
//! listing a sandbox's files, with the bounds every provider keeps.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{NativeId, ProviderError, Result};

/// Kind of a file entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else.
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The entry's name within the directory.
    pub name: String,
    /// Its kind.
    pub kind: FileKind,
    /// Size in bytes (files only).
    pub size: u64,
}

/// The largest file [`Files::read`] returns (256 MiB): a sandbox decides how large its files
/// are, and a read holds the whole file in memory.
pub const MAX_FILE_READ_BYTES: u64 = 256 * 1024 * 1024;

/// A read refused for passing [`MAX_FILE_READ_BYTES`], in the same words from every provider.
pub fn file_too_large(provider: &str, path: &str) -> ProviderError {
    ProviderError::new(
        crate::ErrorKind::InvalidRequest,
        provider,
        format!(
            "`{path}` is larger than the file API's limit of {} MiB",
            MAX_FILE_READ_BYTES >> 20
        ),
    )
}

/// Where [`Files::read_to`] puts a file's bytes as they are read (a local file, stdout).
pub type FileSink = Box<dyn std::io::Write + Send>;

/// A copy ended because its sink refused a write (the disk is full, the reader went away).
pub fn sink_failed(provider: &str, err: std::io::Error) -> ProviderError {
    ProviderError::new(
        crate::ErrorKind::Unknown,
        provider,
        format!("the copy's destination failed: {err}"),
    )
    .with_source(err)
}

/// Copies `from` into `sink` through a bounded buffer until `from` ends; returns the bytes
/// copied. A failing read is named by `read_failed`, a failing sink by [`sink_failed`].
pub fn copy_into_sink(
    from: &mut impl std::io::Read,
    sink: &mut FileSink,
    provider: &str,
    read_failed: impl Fn(std::io::Error) -> ProviderError,
) -> Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(copied),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_failed(e)),
        };
        sink.write_all(&buf[..n])
            .map_err(|e| sink_failed(provider, e))?;
        copied += n as u64;
    }
}

/// What [`Files::write_from`] copies into a sandbox: exactly `len` bytes read from `reader` (a
/// file opened on the host, a spooled stdin).
pub struct FileSource {
    /// Where the bytes come from; read in bounded pieces, never past `len`.
    pub reader: Box<dyn std::io::Read + Send>,
    /// How many bytes the file has. A reader that ends sooner fails the write.
    pub len: u64,
}

impl std::fmt::Debug for FileSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSource")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// The largest source the default [`Files::write_from`] takes (1 GiB): it holds the whole
/// file in memory. Providers that stream take any size.
pub const MAX_HELD_WRITE_BYTES: u64 = 1 << 30;

/// A write whose source ended before its declared length, in the same words from every
/// provider.
pub fn source_ended(provider: &str, path: &str, copied: u64, len: u64) -> ProviderError {
    ProviderError::new(
        crate::ErrorKind::InvalidRequest,
        provider,
        format!(
            "the source for `{path}` ended after {copied} of its {len} bytes (it changed while \
             it was copied); nothing was written"
        ),
    )
}

/// Copies exactly `len` bytes of `from` into `into` through a bounded buffer. A source that
/// ends sooner is [`source_ended`]; a failing read or write is named by `io_failed`.
pub fn copy_exactly(
    from: &mut dyn std::io::Read,
    into: &mut dyn std::io::Write,
    len: u64,
    provider: &str,
    path: &str,
    io_failed: impl Fn(std::io::Error) -> ProviderError,
) -> Result<()> {
    let mut buf = vec![0u8; (1 << 20).min(len.max(1)) as usize];
    let mut copied = 0u64;
    while copied < len {
        let want = buf.len().min((len - copied) as usize);
        let n = match from.read(&mut buf[..want]) {
            Ok(0) => return Err(source_ended(provider, path, copied, len)),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_failed(e)),
        };
        into.write_all(&buf[..n]).map_err(&io_failed)?;
        copied += n as u64;
    }
    Ok(())
}

/// The most entries [`Files::list`] returns for one directory (100 000): a sandbox decides how
/// many names a directory holds (millions cost it one `xargs touch`), and a listing holds each.
pub const MAX_LIST_ENTRIES: usize = 100_000;

/// A listing refused for passing [`MAX_LIST_ENTRIES`], in the same words from every provider.
pub fn too_many_entries(provider: &str, path: &str) -> ProviderError {
    ProviderError::new(
        crate::ErrorKind::InvalidRequest,
        provider,
        format!(
            "`{path}` holds more than the file API's limit of {MAX_LIST_ENTRIES} entries; list a \
             subdirectory, or count them with exec"
        ),
    )
}

/// File operations.
///
/// # Contract
/// Binary-safe. Paths are interpreted by the provider's documented rule and confined to the
/// sandbox: `..` escapes, absolute paths outside the sandbox and symlinks leading out are
/// rejected with [`ErrorKind::InvalidRequest`](crate::ErrorKind::InvalidRequest).
#[async_trait]
pub trait Files: Send + Sync {
    /// Reads a whole file, at most [`MAX_FILE_READ_BYTES`] (a larger one is
    /// `InvalidRequest`, found without holding more than that).
    async fn read(&self, id: &NativeId, path: &str) -> Result<Vec<u8>>;
    /// Copies a whole regular file into `sink` as it is read, whatever its size, holding no
    /// more than a buffer; gives the sink back with the number of bytes copied. The same file
    /// as [`Files::read`] (same path rules, same refusals). A write to the sink that fails
    /// ends the copy with an error of kind `Unknown`; the sink's owner knows why.
    ///
    /// The default reads the file whole, so it keeps [`Files::read`]'s bound.
    async fn read_to(
        &self,
        id: &NativeId,
        path: &str,
        mut sink: FileSink,
    ) -> Result<(FileSink, u64)> {
        let bytes = self.read(id, path).await?;
        sink.write_all(&bytes)
            .map_err(|e| sink_failed("files", e))?;
        Ok((sink, bytes.len() as u64))
    }
    /// Writes a whole file, creating parent directories. A directory at `path` is refused
    /// (`InvalidRequest`), never replaced.
    async fn write(&self, id: &NativeId, path: &str, bytes: &[u8]) -> Result<()>;
    /// [`Files::write`] with the bytes read from `source` as they are written, whatever its
    /// size: the file appears whole under its name, or the write fails and the name keeps
    /// what it had (a source that ends before its length is [`source_ended`]).
    ///
    /// The default reads the source whole, so it takes at most [`MAX_HELD_WRITE_BYTES`].
    async fn write_from(&self, id: &NativeId, path: &str, source: FileSource) -> Result<()> {
        if source.len > MAX_HELD_WRITE_BYTES {
            return Err(ProviderError::new(
                crate::ErrorKind::InvalidRequest,
                "files",
                format!(
                    "{} bytes for `{path}` is more than this provider's limit of {} MiB for \
                     one write",
                    source.len,
                    MAX_HELD_WRITE_BYTES >> 20
                ),
            ));
        }
        let FileSource { mut reader, len } = source;
        let mut bytes = Vec::with_capacity(len as usize);
        copy_exactly(&mut reader, &mut bytes, len, "files", path, |e| {
            ProviderError::new(
                crate::ErrorKind::InvalidRequest,
                "files",
                format!("cannot read the source for `{path}`: {e}"),
            )
            .with_source(e)
        })?;
        self.write(id, path, &bytes).await
    }
    /// Lists a directory, sorted by name: at most [`MAX_LIST_ENTRIES`] (more is
    /// `InvalidRequest`, found without holding more than that).
    async fn list(&self, id: &NativeId, path: &str) -> Result<Vec<FileEntry>>;
}
