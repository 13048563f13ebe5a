//! Files through the Engine's archive API, every path resolved and checked first.

use super::*;

#[async_trait]
impl Files for DockerProvider {
    async fn read(&self, id: &NativeId, path: &str) -> Result<Vec<u8>> {
        let mut full = container_path(path)?;
        // Follow a final symlink a few times, inside the container's filesystem.
        for _ in 0..8 {
            let tar = self.archive_get(id, &full).await?;
            let mut archive = tar::Archive::new(&tar[..]);
            let mut entries = archive
                .entries()
                .map_err(|e| io_err("read the archive", e))?;
            let mut entry = match entries.next() {
                Some(entry) => entry.map_err(|e| io_err("read the archive", e))?,
                None => {
                    return Err(err(
                        ErrorKind::Unknown,
                        format!("empty archive for `{path}`"),
                    ))
                }
            };
            match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let mut bytes = Vec::new();
                    entry
                        .read_to_end(&mut bytes)
                        .map_err(|e| io_err("read the archive", e))?;
                    return Ok(bytes);
                }
                tar::EntryType::Directory => {
                    return Err(err(
                        ErrorKind::InvalidRequest,
                        format!("`{path}` is a directory, not a file"),
                    ))
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(|e| io_err("read the archive", e))?
                        .ok_or_else(|| err(ErrorKind::Unknown, "symlink without target"))?
                        .into_owned();
                    full = full.parent().unwrap_or(Path::new("/")).join(target);
                    if full.components().any(|c| c == Component::ParentDir) {
                        // Let the engine resolve `..` inside the container's root.
                        full = full.components().collect();
                    }
                }
                other => {
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

    async fn write(&self, id: &NativeId, path: &str, bytes: &[u8]) -> Result<()> {
        let full = container_path(path)?;
        let (Some(parent), Some(name)) = (full.parent(), full.file_name()) else {
            return Err(err(
                ErrorKind::InvalidRequest,
                format!("`{path}` names no file"),
            ));
        };
        // Parents first, through the supervisor, so the archive never rewrites an existing
        // directory's mode.
        let mkdir = ExecRequest::argv(["mkdir", "-p", "--", &parent.to_string_lossy()]);
        let made = self.exec(id, &mkdir).await?;
        if !made.status.success() {
            return Err(err(
                ErrorKind::InvalidRequest,
                format!(
                    "cannot create `{}`: {}",
                    parent.display(),
                    String::from_utf8_lossy(made.stderr.as_deref().unwrap_or_default()).trim()
                ),
            ));
        }
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        );
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, name, bytes)
            .map_err(|e| io_err("build the archive", e))?;
        let tar = builder
            .into_inner()
            .map_err(|e| io_err("build the archive", e))?;
        self.engine
            .expect(
                Method::PUT,
                &format!(
                    "/containers/{}/archive?path={}",
                    path_name(&id.0)?,
                    query_escape(&parent.to_string_lossy())
                ),
                Some(("application/x-tar", tar)),
                &[],
            )
            .await?;
        Ok(())
    }

    async fn list(&self, id: &NativeId, path: &str) -> Result<Vec<FileEntry>> {
        let full = container_path(path)?;
        let tar = self.archive_get(id, &full).await?;
        let mut archive = tar::Archive::new(&tar[..]);
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
                if parts.len() == 1 && entry.header().entry_type() != tar::EntryType::Directory {
                    return Err(err(
                        ErrorKind::InvalidRequest,
                        format!("`{path}` is not a directory"),
                    ));
                }
                continue;
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
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }
}
