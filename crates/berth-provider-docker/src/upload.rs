//! Writing a file of any size into the container: its archive is sent to the Engine as it is
//! read, under a temporary name beside the destination, and renamed over the destination only
//! once the engine has taken all of it — so a failed write leaves the destination as it was.
//!
//! The temporary is recorded before the upload starts (see [`UploadRecord`]): one left by a
//! `berth` killed midway is removed before the sandbox's next exec or write.

use super::*;
use bytes::Bytes;

/// How much of the source one piece of the archive carries.
const PIECE: usize = 1 << 20;

/// The name an upload has until it is whole.
fn upload_name() -> String {
    let mut nonce = [0u8; 8];
    // The name only has to be unlikely to meet another upload's; a clock-derived one will do
    // when the random source fails.
    if getrandom::fill(&mut nonce).is_err() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nonce = (now ^ u64::from(std::process::id())).to_le_bytes();
    }
    let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    format!(".berth-upload-{hex}")
}

/// Where uploads in progress are recorded, in the sandbox's run directory on this machine.
const UPLOADS_DIR: &str = "uploads";
/// A record not yet complete (its writer had not locked and named it): left alone this long.
const UNFINISHED_RECORD_GRACE: Duration = Duration::from_secs(60);

/// An upload in progress, recorded before its first byte is sent: a file in the sandbox's run
/// directory naming the temporary's path in the container, locked by the writing process for as
/// long as it writes. A record that can be locked is one whose writer is gone (the kernel drops
/// a killed process's locks), so its temporary is left over and is removed.
struct UploadRecord {
    path: PathBuf,
    _locked: std::fs::File,
}

impl UploadRecord {
    /// Records `temp` (the upload's path in the container) under `dir`.
    fn create(dir: &Path, name: &str, temp: &Path) -> std::io::Result<UploadRecord> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let path = dir.join(name.trim_start_matches('.'));
        let unfinished = path.with_extension("new");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&unfinished)?;
        file.lock()?;
        file.write_all(temp.as_os_str().as_encoded_bytes())?;
        // Named only once locked and whole: a reader never sees it unlocked while its writer lives.
        std::fs::rename(&unfinished, &path)?;
        Ok(UploadRecord {
            path,
            _locked: file,
        })
    }

    /// The upload is over (placed, or its temporary removed): the record goes.
    fn finish(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The temporaries of uploads whose writers are gone, recorded under `dir`, with their records;
/// the records stay locked (by the returned files) until dropped.
fn abandoned_uploads(dir: &Path) -> Vec<(PathBuf, PathBuf, std::fs::File)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut abandoned = Vec::new();
    for entry in entries.flatten() {
        let record = entry.path();
        let Ok(file) = std::fs::File::open(&record) else {
            continue;
        };
        if file.try_lock().is_err() {
            continue;
        }
        if record.extension().is_some_and(|e| e == "new") {
            // Its writer may be between creating and locking it: only an old one goes.
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > UNFINISHED_RECORD_GRACE);
            if old {
                let _ = std::fs::remove_file(&record);
            }
            continue;
        }
        // Berth wrote it: a path in the container, well under a page.
        let mut temp = Vec::new();
        if (&file).take(4096).read_to_end(&mut temp).is_err() {
            continue;
        }
        let temp = PathBuf::from(String::from_utf8_lossy(&temp).into_owned());
        let is_upload = temp.is_absolute()
            && temp
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".berth-upload-"));
        if !is_upload {
            let _ = std::fs::remove_file(&record);
            continue;
        }
        abandoned.push((temp, record, file));
    }
    abandoned
}

/// The tar header of one regular file named `name` of `len` bytes with permissions `mode`.
fn file_header(name: &str, len: u64, mode: u32) -> std::io::Result<tar::Header> {
    let mut header = tar::Header::new_gnu();
    header.set_path(name)?;
    header.set_size(len);
    header.set_mode(mode);
    header.set_mtime(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    );
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    Ok(header)
}

/// The archive's length: header, contents padded to a block, two empty blocks.
fn archive_len(len: u64) -> u64 {
    512 + len.div_ceil(512) * 512 + 1024
}

/// Why the producer stopped early.
enum Stopped {
    /// The source failed or ended short: the write's error.
    Source(ProviderError),
    /// The request went away (the engine refused or closed): its answer says why.
    Request,
}

/// Reads `source` and sends the archive of one file named `name` through `pieces`.
fn produce(
    name: &str,
    path: &str,
    mode: u32,
    source: berth_contract::FileSource,
    pieces: &tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
) -> std::result::Result<(), Stopped> {
    let berth_contract::FileSource { mut reader, len } = source;
    let send = |piece: Vec<u8>| {
        pieces
            .blocking_send(Ok(Bytes::from(piece)))
            .map_err(|_| Stopped::Request)
    };
    let header = file_header(name, len, mode)
        .map_err(|e| Stopped::Source(io_err("build the archive", e)))?;
    send(header.as_bytes().to_vec())?;
    let mut copied = 0u64;
    while copied < len {
        let want = PIECE.min((len - copied) as usize);
        let mut piece = vec![0u8; want];
        let n = loop {
            match reader.read(&mut piece) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let message = format!("cannot read the source for `{path}`: {e}");
                    return Err(Stopped::Source(
                        err(ErrorKind::InvalidRequest, message).with_source(e),
                    ));
                }
            }
        };
        if n == 0 {
            return Err(Stopped::Source(berth_contract::source_ended(
                PROVIDER_ID,
                path,
                copied,
                len,
            )));
        }
        piece.truncate(n);
        copied += n as u64;
        send(piece)?;
    }
    let padding = (len.div_ceil(512) * 512 - len) as usize;
    send(vec![0u8; padding + 1024])
}

impl DockerProvider {
    /// Runs one of the image's file tools (`mkdir`, `mv`) through the supervisor; a failure is
    /// the request's, said as `failed` with the tool's own words.
    async fn run_tool(&self, id: &NativeId, argv: &[&str], failed: String) -> Result<()> {
        let (status, stderr) = self.exec_tool(id, argv).await?;
        if status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&stderr);
        Err(err(
            ErrorKind::InvalidRequest,
            format!("{failed}: {}", said.trim()),
        ))
    }

    /// One of Berth's own commands in the container, with its status and (some of) its
    /// stderr: not a user's exec, so it does not first clear abandoned uploads.
    async fn exec_tool(&self, id: &NativeId, argv: &[&str]) -> Result<(ExitStatus, Vec<u8>)> {
        let mut stderr = Vec::new();
        let (status, _) = self
            .run(
                id,
                &ExecRequest::argv(argv.iter().copied()),
                |stream, bytes| {
                    if stream == berth_contract::Stream::Stderr && stderr.len() < 64 << 10 {
                        stderr.extend_from_slice(bytes);
                    }
                },
            )
            .await?;
        Ok((status, stderr))
    }

    /// The sandbox's record of uploads in progress.
    fn uploads_dir(&self, id: &NativeId) -> Result<PathBuf> {
        Ok(self.run_dir(&id.0)?.join(UPLOADS_DIR))
    }

    /// Removes the temporaries of uploads whose `berth` was killed before it could (see
    /// [`UploadRecord`]). Nothing recorded costs one failed directory open.
    pub(crate) async fn clear_abandoned_uploads(&self, id: &NativeId) {
        let Ok(dir) = self.uploads_dir(id) else {
            return;
        };
        for (temp, record, _locked) in abandoned_uploads(&dir) {
            if self.remove_upload(id, &temp, true).await {
                let _ = std::fs::remove_file(record);
            }
        }
    }

    /// Creates `parent` and its missing parents through the supervisor, so an archive never
    /// rewrites an existing directory's mode.
    async fn make_parent(&self, id: &NativeId, parent: &Path) -> Result<()> {
        let parent = parent.to_string_lossy();
        let failed = format!("cannot create `{parent}`");
        self.run_tool(id, &["mkdir", "-p", "--", &parent], failed)
            .await
    }

    /// [`Files::write_from`]: see the module docs.
    pub(crate) async fn write_streamed(
        &self,
        id: &NativeId,
        path: &str,
        source: berth_contract::FileSource,
    ) -> Result<()> {
        let full = container_path(path)?;
        let (Some(parent), Some(_)) = (full.parent(), full.file_name()) else {
            return Err(err(
                ErrorKind::InvalidRequest,
                format!("`{path}` names no file"),
            ));
        };
        self.clear_abandoned_uploads(id).await;
        self.make_parent(id, parent).await?;
        // A replaced file keeps its permissions, as on host and bwrap; a new one (also one
        // replacing a symlink, which the rename replaces, not follows) gets 0644.
        let mode = self
            .engine
            .stat_path(&path_name(&id.0)?, &full.to_string_lossy())
            .await?
            .and_then(|stat| stat.regular_permissions())
            .unwrap_or(0o644);
        let name = upload_name();
        let temp = parent.join(&name);
        let record = UploadRecord::create(&self.uploads_dir(id)?, &name, &temp)
            .map_err(|e| io_err("record the upload", e))?;
        let (pieces, body) = engine::ChannelBody::new(archive_len(source.len));
        let producer = {
            let (name, path) = (name.clone(), path.to_owned());
            tokio::task::spawn_blocking(move || {
                let produced = produce(&name, &path, mode, source, &pieces);
                if let Err(Stopped::Source(_)) = &produced {
                    // Ends the request: the engine sees an archive cut short.
                    let _ = pieces.blocking_send(Err(std::io::Error::other("source failed")));
                }
                produced
            })
        };
        let sent = self
            .engine
            .request_streamed(
                Method::PUT,
                &format!(
                    "/containers/{}/archive?path={}",
                    path_name(&id.0)?,
                    query_escape(&parent.to_string_lossy())
                ),
                "application/x-tar",
                body,
            )
            .await;
        let produced = producer.await.map_err(|e| {
            err(
                ErrorKind::Unknown,
                format!("the archive's producer failed: {e}"),
            )
        });
        let taken = match (produced, sent) {
            (Ok(Err(Stopped::Source(source_failed))), _) => Err(source_failed),
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(Ok(())), Ok(response)) => engine::ok("archive", response).map(|_| ()),
            // The engine answered before it took the whole archive: an error answer says why;
            // a success would be for part of the file, which is never put in place.
            (Ok(Err(Stopped::Request)), Ok(response)) => {
                engine::ok("archive", response).and_then(|_| {
                    Err(err(
                        ErrorKind::Unknown,
                        format!("the engine answered before it took all of `{path}`"),
                    ))
                })
            }
        };
        let cut_short = taken.is_err();
        let placed = match taken {
            Ok(()) => self.rename_over(id, &temp, &full).await,
            Err(e) => Err(e),
        };
        let over = match placed {
            Ok(()) => true,
            // Whatever part of the upload the engine unpacked goes; the destination was never
            // touched.
            Err(_) => self.remove_upload(id, &temp, cut_short).await,
        };
        if over {
            record.finish();
        }
        placed
    }

    /// Removes an upload's temporary. One `cut_short` may still be being unpacked by the engine
    /// when its request has failed here (seen: a 5-byte part written after its `rm`). The
    /// engine unpacks under the container's lock, and answers a stat of a path under the same
    /// lock, so a stat first waits for the unpacking; it is made again after the `rm`, in case
    /// the unpacking took the lock only after the first.
    ///
    /// Whether it is gone (else its record stays, for a later try).
    async fn remove_upload(&self, id: &NativeId, temp: &Path, cut_short: bool) -> bool {
        let temp_arg = temp.to_string_lossy();
        let remove = ["rm", "-f", "--", &temp_arg];
        let Ok(name) = path_name(&id.0) else {
            return false;
        };
        let stat = format!(
            "/containers/{name}/archive?path={}",
            query_escape(&temp.to_string_lossy())
        );
        let present = || async {
            match self.engine.request(Method::HEAD, &stat, None).await {
                Ok(answer) => answer.status != StatusCode::NOT_FOUND,
                Err(_) => true,
            }
        };
        if cut_short {
            let _ = present().await;
        }
        let removed = |ran: Result<(ExitStatus, Vec<u8>)>| ran.is_ok_and(|(s, _)| s.success());
        let mut gone = removed(self.exec_tool(id, &remove).await);
        if cut_short && present().await {
            gone = removed(self.exec_tool(id, &remove).await);
        }
        gone
    }

    /// Renames the whole upload `temp` over `full` (never into it: `-T` refuses a directory).
    async fn rename_over(&self, id: &NativeId, temp: &Path, full: &Path) -> Result<()> {
        let (temp, full) = (temp.to_string_lossy(), full.to_string_lossy());
        let failed = format!("cannot put the copy at `{full}`");
        self.run_tool(id, &["mv", "-f", "-T", "--", &temp, &full], failed)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the producer on its own thread (as `spawn_blocking` would) and collects what it
    /// sends, as the request body would carry it.
    fn archive_of(name: &str, bytes: Vec<u8>, len: u64) -> (Vec<u8>, bool) {
        let (pieces, mut received) = tokio::sync::mpsc::channel(4);
        let name = name.to_owned();
        let producer = std::thread::spawn(move || {
            let source = berth_contract::FileSource {
                reader: Box::new(std::io::Cursor::new(bytes)),
                len,
            };
            produce(&name, "f", 0o644, source, &pieces)
        });
        let mut body = Vec::new();
        while let Some(piece) = received.blocking_recv() {
            body.extend_from_slice(&piece.expect("a piece"));
        }
        let whole = matches!(producer.join().expect("the producer ran"), Ok(()));
        (body, whole)
    }

    /// What is sent is a tar archive another reader takes: one regular file under the upload's
    /// name, with the source's bytes, exactly as long as the body declares.
    #[test]
    fn the_streamed_archive_is_one_whole_file_of_its_declared_length() {
        for len in [0u64, 1, 511, 512, 513, (3 << 20) + 5] {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let (body, whole) = archive_of(".berth-upload-x", bytes.clone(), len);
            assert!(whole, "{len}");
            assert_eq!(body.len() as u64, archive_len(len), "{len}");
            let mut archive = tar::Archive::new(body.as_slice());
            let mut entries = archive.entries().expect("entries");
            let mut entry = entries.next().expect("one entry").expect("an entry");
            assert_eq!(entry.header().entry_type(), tar::EntryType::Regular);
            assert_eq!(
                entry.path().expect("a path").to_str(),
                Some(".berth-upload-x")
            );
            let mut content = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut content).expect("content");
            assert!(content == bytes, "{len}: the content differs");
            drop(entry);
            assert!(entries.next().is_none(), "{len}: more than one entry");
        }
        // A source shorter than its length stops the archive short and says so.
        let (body, whole) = archive_of(".berth-upload-x", vec![7; 100], 1000);
        assert!(!whole);
        assert!((body.len() as u64) < archive_len(1000));
        assert_ne!(upload_name(), upload_name());
    }
}
