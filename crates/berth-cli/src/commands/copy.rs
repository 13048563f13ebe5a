//! `berth cp`: files into, out of and between sandboxes, streamed whatever their size.

use std::io::Write;

use anyhow::Result;
use berth_contract::ProviderExt;
use serde_json::json;

use crate::app::App;
use crate::errors::{code, CliError};
use crate::output::emit;

/// A local file `cp` could not read or write: an I/O failure as itself under `io_context`, a
/// refused one (not a regular file, too large) as invalid input.
fn local_file_error(
    e: berth_files::ReadError,
    io_context: String,
    refused_as: String,
    hint: &str,
) -> anyhow::Error {
    match e {
        berth_files::ReadError::Io(io) => anyhow::Error::new(io).context(io_context),
        refused => CliError::invalid(format!("{refused_as}: {refused}"), hint).into(),
    }
}

enum Endpoint<'a> {
    Sandbox { id: &'a str, path: &'a str },
    Local(&'a str),
}

fn endpoint(text: &str) -> Endpoint<'_> {
    // `bx-…:path` is a sandbox; anything with a `/` before the first `:` is a local path.
    match text.split_once(':') {
        Some((id, path)) if !id.is_empty() && !id.contains('/') => Endpoint::Sandbox { id, path },
        _ => Endpoint::Local(text),
    }
}

/// A file read's `not_found` with a hint about the file, not the sandbox list (the sandbox's
/// row was found; what is missing is most likely the path).
fn missing_file(e: berth_contract::ProviderError, id: &str) -> anyhow::Error {
    if e.kind() != berth_contract::ErrorKind::NotFound {
        return e.into();
    }
    CliError::not_found(
        e.to_string(),
        &format!(
            "paths are relative to the sandbox's workspace: `berth ls {id}` shows what is \
             there; `berth status {id}` shows whether the sandbox still is"
        ),
    )
    .into()
}

/// A file copied to stdout as it arrives; once the reader is gone, the copy stops.
struct StdoutSink;

impl Write for StdoutSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        crate::output::stdout_write_bytes(bytes);
        if crate::output::stdout_gone() {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A local file a copy goes to, keeping the first write error for the caller to report as
/// its own (the provider only knows that the destination failed).
struct RecordingSink {
    file: std::fs::File,
    failed: std::sync::Arc<std::sync::Mutex<Option<std::io::Error>>>,
}

impl Write for RecordingSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.file.write(bytes).inspect_err(|e| {
            let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            failed.get_or_insert(std::io::Error::new(e.kind(), e.to_string()));
        })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// A copy out of sandbox `id` into `spool` (an anonymous file), rewound, with its length. A
/// failure of the spool is said by `cannot_spool`, as the caller's own.
async fn spool_out_of(
    app: &App,
    id: &str,
    path: &str,
    spool: std::fs::File,
    cannot_spool: impl Fn(berth_files::ReadError) -> anyhow::Error,
) -> Result<(std::fs::File, u64)> {
    let (_row, provider, native) = app.sandbox(id).await?;
    let failed = std::sync::Arc::new(std::sync::Mutex::new(None));
    let sink = Box::new(RecordingSink {
        file: spool.try_clone().map_err(|e| cannot_spool(e.into()))?,
        failed: failed.clone(),
    });
    let copied = match provider.require_files()?.read_to(&native, path, sink).await {
        Ok((_, copied)) => copied,
        Err(e) => {
            return Err(
                match failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    Some(local) => cannot_spool(local.into()),
                    None => missing_file(e, id),
                },
            )
        }
    };
    let mut spool = spool;
    std::io::Seek::rewind(&mut spool).map_err(|e| cannot_spool(e.into()))?;
    Ok((spool, copied))
}

/// A copy of `len` bytes of `file` into sandbox `id` at `path`, streamed.
async fn copy_into(app: &App, id: &str, path: &str, file: std::fs::File, len: u64) -> Result<()> {
    let (_row, provider, native) = app.sandbox(id).await?;
    let source = berth_contract::FileSource {
        reader: Box::new(file),
        len,
    };
    Ok(provider
        .require_files()?
        .write_from(&native, path, source)
        .await?)
}

/// `berth cp`: out of a sandbox, into one, or from one sandbox to another (on any providers),
/// each streamed whatever the size.
pub async fn cp(app: &App, source: &str, destination: &str) -> Result<i32> {
    if app.json && destination == "-" {
        return Err(CliError::invalid(
            "with --json, stdout carries the JSON document; the file's bytes cannot share it",
            "copy to a file (`berth --json cp ID:path ./file`), or leave out --json to stream the bytes",
        )
        .into());
    }
    let bytes =
        match (endpoint(source), endpoint(destination)) {
            (Endpoint::Sandbox { id, path }, Endpoint::Local("-")) => {
                let (_row, provider, native) = app.sandbox(id).await?;
                // As it arrives, whatever its size; a reader that goes away ends the copy.
                let sink = Box::new(StdoutSink);
                match provider.require_files()?.read_to(&native, path, sink).await {
                    Ok((_, copied)) => copied,
                    Err(_) if crate::output::stdout_gone() => 0,
                    Err(e) => return Err(missing_file(e, id)),
                }
            }
            (Endpoint::Sandbox { id, path }, Endpoint::Local(local)) => {
                let cannot_write = |e| {
                    local_file_error(
                        e,
                        format!("cannot write {local}"),
                        format!("cannot copy to {local}"),
                        "`cp` writes one regular file (or `-` for stdout)",
                    )
                };
                let destination = std::path::Path::new(local);
                // Refused before anything is copied, as it would be after.
                if std::fs::metadata(destination).is_ok_and(|m| !m.is_file()) {
                    return Err(cannot_write(berth_files::ReadError::NotRegular));
                }
                // Spooled first, beside the destination (anonymous: nothing is left behind if
                // berth dies), then put in its place whole: a copy that fails or is killed
                // halfway leaves the destination as it was.
                let spool = tempfile::tempfile_in(berth_files::replacement_dir(destination))
                    .or_else(|_| tempfile::tempfile())
                    .map_err(|e| cannot_write(e.into()))?;
                let (spool, copied) = spool_out_of(app, id, path, spool, cannot_write).await?;
                berth_files::replace_regular_with(destination, spool).map_err(cannot_write)?;
                copied
            }
            (Endpoint::Local(local), Endpoint::Sandbox { id, path }) => {
                let cannot_read = |e| {
                    local_file_error(
                        e,
                        format!("cannot read {local}"),
                        format!("cannot copy {local}"),
                        "`cp` copies one regular file (or `-` for stdin)",
                    )
                };
                // Streamed whatever its size. Stdin is spooled first (anonymous: nothing is left
                // behind), since a copy declares its length before its first byte.
                let (file, len) = if local == "-" {
                    let mut spool = tempfile::tempfile().map_err(|e| cannot_read(e.into()))?;
                    let len = std::io::copy(&mut std::io::stdin().lock(), &mut spool)
                        .map_err(|e| cannot_read(e.into()))?;
                    std::io::Seek::rewind(&mut spool).map_err(|e| cannot_read(e.into()))?;
                    (spool, len)
                } else {
                    berth_files::open_regular(std::path::Path::new(local)).map_err(cannot_read)?
                };
                copy_into(app, id, path, file, len).await?;
                len
            }
            (
                Endpoint::Sandbox {
                    id: from,
                    path: from_path,
                },
                Endpoint::Sandbox {
                    id: to,
                    path: to_path,
                },
            ) => {
                // Through an anonymous spool on this machine: the two may be on different
                // providers, and neither reaches the other.
                let cannot_spool = |e| {
                    local_file_error(
                        e,
                        "cannot hold the copy on this machine".into(),
                        "cannot hold the copy on this machine".into(),
                        "free space where temporary files go (TMPDIR)",
                    )
                };
                let spool = tempfile::tempfile().map_err(|e| cannot_spool(e.into()))?;
                let (spool, len) = spool_out_of(app, from, from_path, spool, cannot_spool).await?;
                copy_into(app, to, to_path, spool, len).await?;
                len
            }
            (Endpoint::Local(_), Endpoint::Local(_)) => return Err(CliError::invalid(
                "cp needs at least one side as ID:path",
                "e.g. `berth cp ./notes.txt bx-1234:notes.txt`, `berth cp bx-1234:out.txt -` or \
                 `berth cp bx-1234:out.txt bx-5678:in.txt`",
            )
            .into()),
        };
    if app.json {
        emit(
            "cp",
            json!({ "from": source, "to": destination, "bytes": bytes }),
        );
    } else if destination != "-" {
        errln!("copied {bytes} bytes");
    }
    Ok(code::OK)
}

/// The most of one file the HTTP API carries in a document (base64 in JSON, held in memory);
/// a larger one goes through `berth cp`, streamed.
pub const API_FILE_MAX: u64 = 8 << 20;

/// A sink into memory that refuses what passes [`API_FILE_MAX`], and says that it did.
struct HeldSink {
    held: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    over: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Write for HeldSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if (held.len() + bytes.len()) as u64 > API_FILE_MAX {
            self.over.store(true, std::sync::atomic::Ordering::Relaxed);
            return Err(std::io::Error::other("over the API's file limit"));
        }
        held.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn too_large_for_the_api(path: &str, id: &str) -> anyhow::Error {
    CliError::invalid(
        format!(
            "`{}` is larger than {} MiB, the most one API document carries",
            path.escape_debug(),
            API_FILE_MAX >> 20
        ),
        &format!("copy it with `berth cp {id}:PATH FILE`, streamed at any size"),
    )
    .into()
}

/// The HTTP API's file read: the document `file read` with the file's bytes in base64 (the
/// same path rules and refusals as `cp`; at most [`API_FILE_MAX`]).
pub async fn api_read(app: &App, id: &str, path: &str) -> Result<i32> {
    use base64::Engine as _;
    let (_row, provider, native) = app.sandbox(id).await?;
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let over = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sink = Box::new(HeldSink {
        held: held.clone(),
        over: over.clone(),
    });
    if let Err(e) = provider.require_files()?.read_to(&native, path, sink).await {
        if over.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(too_large_for_the_api(path, id));
        }
        return Err(missing_file(e, id));
    }
    let bytes = std::mem::take(&mut *held.lock().unwrap_or_else(|p| p.into_inner()));
    emit(
        "file read",
        json!({
            "sandbox": id,
            "path": path,
            "bytes": bytes.len(),
            "content_base64": base64::engine::general_purpose::STANDARD.encode(&bytes),
        }),
    );
    Ok(code::OK)
}

/// The HTTP API's file write: `bytes` as the whole file at `path` (the same path rules and
/// refusals as `cp`; the file appears whole or keeps what it had).
pub async fn api_write(app: &App, id: &str, path: &str, bytes: Vec<u8>) -> Result<i32> {
    let len = bytes.len() as u64;
    if len > API_FILE_MAX {
        return Err(too_large_for_the_api(path, id));
    }
    let (_row, provider, native) = app.sandbox(id).await?;
    let source = berth_contract::FileSource {
        reader: Box::new(std::io::Cursor::new(bytes)),
        len,
    };
    provider
        .require_files()?
        .write_from(&native, path, source)
        .await?;
    emit(
        "file write",
        json!({ "sandbox": id, "path": path, "bytes": len }),
    );
    Ok(code::OK)
}

/// `berth ls ID[:path]`: a directory of a sandbox, sorted by name (at most the file API's
/// listing bound); names come from the sandbox, so a terminal gets them escaped.
pub async fn ls(app: &App, id: &str, path: &str) -> Result<i32> {
    let (_row, provider, native) = app.sandbox(id).await?;
    let entries = provider
        .require_files()?
        .list(&native, path)
        .await
        .map_err(|e| missing_file(e, id))?;
    if app.json {
        emit(
            "ls",
            json!({ "sandbox": id, "path": path, "entries": entries }),
        );
        return Ok(code::OK);
    }
    for entry in &entries {
        let kind = match entry.kind {
            berth_contract::FileKind::File => "file",
            berth_contract::FileKind::Dir => "dir",
            berth_contract::FileKind::Symlink => "symlink",
            berth_contract::FileKind::Other => "other",
        };
        outln!(
            "{kind:<8} {:>12}  {}",
            entry.size,
            crate::human::printable(&entry.name, true)
        );
    }
    Ok(code::OK)
}
