//! Files through the Engine's archive API, every path resolved and checked first.

use super::*;
use bytes::{Buf, Bytes};
use http_body_util::BodyExt;

/// What an archive's first entry says a path is.
enum First {
    File(Vec<u8>),
    Copied(u64),
    Directory,
    Symlink(PathBuf),
    Other(tar::EntryType),
    TooLarge,
}

/// What a read does with a regular file's entry: keep it (bounded), or copy it into a sink.
enum Take {
    Bytes,
    Into(Option<berth_contract::FileSink>),
}

impl DockerProvider {
    /// Reads the file at `path` (a final symlink followed a few times, inside the container's
    /// filesystem): its bytes, or with a sink, copied into it as they arrive.
    async fn read_file(
        &self,
        id: &NativeId,
        path: &str,
        mut take: Take,
    ) -> Result<(First, Option<berth_contract::FileSink>)> {
        let mut full = container_path(path)?;
        for _ in 0..8 {
            // Only the first entry is read: a directory's archive, or a file over the limit,
            // is given up at its header, never fetched.
            let full_shown = full.display().to_string();
            let (first, back) = self
                .archive(id, &full, move |archive| {
                    let mut entries = archive
                        .entries()
                        .map_err(|e| io_err("read the archive", e))?;
                    let mut entry = match entries.next() {
                        Some(entry) => entry.map_err(|e| io_err("read the archive", e))?,
                        None => return Err(err(ErrorKind::Unknown, "an empty archive")),
                    };
                    let first = match (entry.header().entry_type(), &mut take) {
                        (
                            tar::EntryType::Regular | tar::EntryType::Continuous,
                            Take::Into(sink),
                        ) => {
                            let Some(sink) = sink.as_mut() else {
                                return Err(err(ErrorKind::Unknown, "a copy without its sink"));
                            };
                            First::Copied(copy_whole_entry(&mut entry, sink, &full_shown)?)
                        }
                        (tar::EntryType::Regular | tar::EntryType::Continuous, Take::Bytes) => {
                            if entry.size() > berth_contract::MAX_FILE_READ_BYTES {
                                return Ok((First::TooLarge, take));
                            }
                            let mut bytes = Vec::new();
                            (&mut entry)
                                .take(berth_contract::MAX_FILE_READ_BYTES)
                                .read_to_end(&mut bytes)
                                .map_err(|e| io_err("read the archive", e))?;
                            First::File(bytes)
                        }
                        (tar::EntryType::Directory, _) => First::Directory,
                        (tar::EntryType::Symlink, _) => First::Symlink(
                            entry
                                .link_name()
                                .map_err(|e| io_err("read the archive", e))?
                                .ok_or_else(|| err(ErrorKind::Unknown, "symlink without target"))?
                                .into_owned(),
                        ),
                        (other, _) => First::Other(other),
                    };
                    Ok((first, take))
                })
                .await?;
            take = back;
            let sink = match &mut take {
                Take::Into(sink) => sink.take(),
                Take::Bytes => None,
            };
            match first {
                First::File(_) | First::Copied(_) => return Ok((first, sink)),
                First::TooLarge => return Err(berth_contract::file_too_large(PROVIDER_ID, path)),
                First::Directory => {
                    return Err(err(
                        ErrorKind::InvalidRequest,
                        format!("`{path}` is a directory, not a file"),
                    ))
                }
                First::Symlink(target) => {
                    full = full.parent().unwrap_or(Path::new("/")).join(target);
                    if full.components().any(|c| c == Component::ParentDir) {
                        // Let the engine resolve `..` inside the container's root.
                        full = full.components().collect();
                    }
                    if let Take::Into(slot) = &mut take {
                        *slot = sink;
                    }
                }
                First::Other(other) => {
                    return Err(err(
                        ErrorKind::InvalidRequest,
                        format!("`{path}` is not a regular file ({other:?})"),
                    ))
                }
            }
        }
        Err(err(
            ErrorKind::InvalidRequest,
            format!("`{path}`: too many levels of symlinks"),
        ))
    }
}

/// Copies a file's archive entry into `sink` as it arrives, all of it: an archive cut short
/// (the engine went away mid-stream) is an error, never a shorter file.
fn copy_whole_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    sink: &mut berth_contract::FileSink,
    shown: &str,
) -> Result<u64> {
    let size = entry.size();
    let copied = berth_contract::copy_into_sink(entry, sink, PROVIDER_ID, |e| {
        io_err("read the archive", e)
    })?;
    if copied != size {
        return Err(err(
            ErrorKind::Unavailable,
            format!("the engine's archive of `{shown}` ended after {copied} of its {size} bytes"),
        ));
    }
    Ok(copied)
}

#[async_trait]
impl Files for DockerProvider {
    async fn read(&self, id: &NativeId, path: &str) -> Result<Vec<u8>> {
        match self.read_file(id, path, Take::Bytes).await? {
            (First::File(bytes), _) => Ok(bytes),
            _ => Err(err(ErrorKind::Unknown, "a read ended without the file")),
        }
    }

    async fn read_to(
        &self,
        id: &NativeId,
        path: &str,
        sink: berth_contract::FileSink,
    ) -> Result<(berth_contract::FileSink, u64)> {
        match self.read_file(id, path, Take::Into(Some(sink))).await? {
            (First::Copied(n), Some(sink)) => Ok((sink, n)),
            _ => Err(err(ErrorKind::Unknown, "a copy ended without the file")),
        }
    }

    async fn write(&self, id: &NativeId, path: &str, bytes: &[u8]) -> Result<()> {
        // The same way as a streamed write: a directory at `path` is refused, never replaced by
        // the file (the archive alone replaced it, tree and all).
        let source = berth_contract::FileSource {
            reader: Box::new(std::io::Cursor::new(bytes.to_vec())),
            len: bytes.len() as u64,
        };
        self.write_streamed(id, path, source).await
    }

    async fn write_from(
        &self,
        id: &NativeId,
        path: &str,
        source: berth_contract::FileSource,
    ) -> Result<()> {
        self.write_streamed(id, path, source).await
    }

    async fn list(&self, id: &NativeId, path: &str) -> Result<Vec<FileEntry>> {
        let full = container_path(path)?;
        let shown = path.to_owned();
        // The engine archives the whole tree: it is read as it arrives, headers kept, contents
        // skipped, so a large tree costs time, never memory.
        let mut entries = self
            .archive(id, &full, move |archive| {
                let mut entries = Vec::new();
                for entry in archive
                    .entries()
                    .map_err(|e| io_err("read the archive", e))?
                {
                    let entry = entry.map_err(|e| io_err("read the archive", e))?;
                    let entry_path = entry
                        .path()
                        .map_err(|e| io_err("read the archive", e))?
                        .into_owned();
                    // Entries are `<dir name>/<child>…`; keep direct children only.
                    let parts: Vec<_> = entry_path.components().collect();
                    if parts.len() != 2 {
                        if parts.len() == 1
                            && entry.header().entry_type() != tar::EntryType::Directory
                        {
                            return Err(err(
                                ErrorKind::InvalidRequest,
                                format!("`{shown}` is not a directory"),
                            ));
                        }
                        continue;
                    }
                    if entries.len() == berth_contract::MAX_LIST_ENTRIES {
                        return Err(berth_contract::too_many_entries(PROVIDER_ID, &shown));
                    }
                    let kind = match entry.header().entry_type() {
                        tar::EntryType::Regular | tar::EntryType::Continuous => FileKind::File,
                        tar::EntryType::Directory => FileKind::Dir,
                        tar::EntryType::Symlink => FileKind::Symlink,
                        _ => FileKind::Other,
                    };
                    entries.push(FileEntry {
                        name: parts[1].as_os_str().to_string_lossy().into_owned(),
                        kind,
                        size: if kind == FileKind::File {
                            entry.header().size().unwrap_or(0)
                        } else {
                            0
                        },
                    });
                }
                Ok(entries)
            })
            .await?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }
}

impl DockerProvider {
    /// Reads the engine's archive of `path` as it arrives, handing it to `parse` on a blocking
    /// thread. What `parse` leaves unread is never fetched: the connection is dropped.
    async fn archive<T: Send + 'static>(
        &self,
        id: &NativeId,
        path: &Path,
        parse: impl FnOnce(&mut tar::Archive<BodyReader>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let uri = format!(
            "/containers/{}/archive?path={}",
            path_name(&id.0)?,
            query_escape(&path.to_string_lossy())
        );
        let (status, body) = self.engine.open(Method::GET, &uri).await?;
        if status == StatusCode::NOT_FOUND {
            return Err(err(
                ErrorKind::NotFound,
                format!("`{}` does not exist in sandbox `{}`", path.display(), id.0),
            ));
        }
        if !status.is_success() {
            let said = engine::collect_limited(body, 64 * 1024).await?;
            return Err(engine::classify(&uri, status, &said.unwrap_or_default()));
        }
        let (chunks, rx) = tokio::sync::mpsc::channel(8);
        let pump = tokio::spawn(async move {
            let mut body = body;
            while let Some(frame) = body.frame().await {
                let chunk = match frame {
                    Ok(frame) => match frame.into_data() {
                        Ok(data) => Ok(data),
                        Err(_) => continue,
                    },
                    Err(e) => Err(std::io::Error::other(e)),
                };
                let failed = chunk.is_err();
                if chunks.send(chunk).await.is_err() || failed {
                    return;
                }
            }
        });
        let reader = BodyReader {
            chunks: rx,
            current: Bytes::new(),
        };
        let parsed =
            tokio::task::spawn_blocking(move || parse(&mut tar::Archive::new(reader))).await;
        pump.abort();
        parsed.map_err(|e| {
            err(
                ErrorKind::Unknown,
                format!("reading the archive failed: {e}"),
            )
        })?
    }
}

/// A body arriving on another task, read as a blocking [`Read`].
struct BodyReader {
    chunks: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
    current: Bytes,
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.current = chunk?,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive that ends before its entry's bytes do is an error, not a shorter copy.
    #[test]
    fn a_copy_cut_short_is_an_error_not_a_shorter_file() {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(100);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, "f", &[7u8; 100][..])
            .unwrap();
        let whole = builder.into_inner().unwrap();
        let copy = |archive: &[u8]| {
            let mut archive = tar::Archive::new(archive);
            let mut entries = archive.entries().unwrap();
            let mut entry = entries.next().unwrap().unwrap();
            let mut sink: berth_contract::FileSink = Box::new(std::io::sink());
            copy_whole_entry(&mut entry, &mut sink, "/f")
        };
        assert_eq!(copy(&whole).unwrap(), 100);
        // The header (512 bytes) and 40 of the 100 bytes.
        let err = copy(&whole[..552]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert!(
            err.to_string().contains("ended after 40 of its 100 bytes"),
            "{err}"
        );
    }
}
