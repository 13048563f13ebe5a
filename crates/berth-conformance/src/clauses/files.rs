//! Clauses of the files group: a binary round trip (whole, streamed out and streamed in, with
//! the refusals a write owes) and hostile paths.

use super::*;

pub(super) async fn files_round_trip(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let files = s.provider.require_files().map_err(|e| fail("files", e))?;
        let blob: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        files
            .write(&id, "cf/dir/blob.bin", &blob)
            .await
            .map_err(|e| fail("write", e))?;
        let back = files
            .read(&id, "cf/dir/blob.bin")
            .await
            .map_err(|e| fail("read", e))?;
        check!(
            back == blob,
            "binary round trip changed {} bytes",
            back.iter().zip(&blob).filter(|(a, b)| a != b).count()
        );
        let seen = sh(s, &id, "wc -c < cf/dir/blob.bin").await?;
        check!(
            text(&seen.stdout).trim() == "100000",
            "exec sees {:?} bytes",
            text(&seen.stdout).trim()
        );
        let listing = files
            .list(&id, "cf/dir")
            .await
            .map_err(|e| fail("list", e))?;
        check!(
            listing
                .iter()
                .any(|e| e.name == "blob.bin" && e.size == 100_000),
            "listing {listing:?}"
        );
        // The same bytes copied as they are read (how `cp` takes a file of any size).
        #[derive(Clone, Default)]
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Shared {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let copy = Shared::default();
        let (_, copied) = files
            .read_to(&id, "cf/dir/blob.bin", Box::new(copy.clone()))
            .await
            .map_err(|e| fail("read_to", e))?;
        let copied_bytes = copy.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        check!(
            copied == 100_000 && copied_bytes == blob,
            "a streamed copy gave {copied} bytes, {} unlike the file",
            copied_bytes
                .iter()
                .zip(&blob)
                .filter(|(a, b)| a != b)
                .count()
        );
        // And written as it is read (how `cp` puts a file of any size in).
        let source = |bytes: Vec<u8>, len: u64| berth_contract::FileSource {
            reader: Box::new(std::io::Cursor::new(bytes)),
            len,
        };
        files
            .write_from(&id, "cf/dir/streamed.bin", source(blob.clone(), 100_000))
            .await
            .map_err(|e| fail("write_from", e))?;
        let back = files
            .read(&id, "cf/dir/streamed.bin")
            .await
            .map_err(|e| fail("read streamed", e))?;
        check!(
            back == blob,
            "a streamed write read back {} bytes unlike it",
            back.len()
        );
        // A source that ends before its length changes nothing.
        let short = files
            .write_from(&id, "cf/dir/streamed.bin", source(b"short".to_vec(), 10))
            .await;
        refused("a source shorter than its length", short)?;
        let kept = files
            .read(&id, "cf/dir/streamed.bin")
            .await
            .map_err(|e| fail("read after a short source", e))?;
        check!(
            kept == blob,
            "a short source changed the file ({} bytes)",
            kept.len()
        );
        // A file is never written over a directory.
        let onto_dir = files.write(&id, "cf/dir", b"x").await;
        refused("writing a file onto a directory", onto_dir)?;
        let names: Vec<String> = files
            .list(&id, "cf/dir")
            .await
            .map_err(|e| fail("list after refusals", e))?
            .into_iter()
            .map(|e| e.name)
            .collect();
        check!(
            names == ["blob.bin", "streamed.bin"],
            "after the refused writes the directory holds {names:?}"
        );
        Ok(vec![
            "streamed copy identical".into(),
            "streamed write identical; short source and directory refused".into(),
        ])
    })
    .await
}

pub(super) async fn files_hostile(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let files = s.provider.require_files().map_err(|e| fail("files", e))?;
        for path in ["../../etc/passwd", "a/../../../etc/shadow"] {
            refused(&format!("reading `{path}`"), files.read(&id, path).await)?;
            refused(
                &format!("writing `{path}`"),
                files.write(&id, path, b"x").await,
            )?;
            let source = berth_contract::FileSource {
                reader: Box::new(std::io::Cursor::new(b"x".to_vec())),
                len: 1,
            };
            refused(
                &format!("a streamed write to `{path}`"),
                files.write_from(&id, path, source).await,
            )?;
            match files.read_to(&id, path, Box::new(std::io::sink())).await {
                Err(e) if e.kind() == ErrorKind::InvalidRequest => {}
                Err(e) => {
                    return Err(format!(
                        "copying `{path}` answered {e}, not invalid_request"
                    ))
                }
                Ok((_, n)) => return Err(format!("copying `{path}` copied {n} bytes")),
            }
        }
        Ok(vec![])
    })
    .await
}

/// An answer that must be `invalid_request` (a hostile path, a short source, a file onto a
/// directory); anything else fails the clause, said as `what` answered it.
fn refused<T: std::fmt::Debug>(
    what: &str,
    answer: berth_contract::Result<T>,
) -> Result<(), String> {
    match answer {
        Err(e) if e.kind() == ErrorKind::InvalidRequest => Ok(()),
        other => Err(format!("{what} answered {other:?}, not invalid_request")),
    }
}
