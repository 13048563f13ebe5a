//! Docker provider, live: the file API holds a bounded amount of memory whatever the sandbox's
//! files are. A test binary of its own, so its process's peak memory is this test's alone.

use berth_contract::{ErrorKind, FileKind, Provider, ProviderExt};
mod docker_support;

use docker_support::*;

/// The process's peak resident memory, in MiB.
fn peak_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024
}

/// Sparse files cost the sandbox nothing; read whole they would cost the host its memory. A
/// file over the file API's limit is refused at its archive header, a directory read is refused
/// at its first entry, and a listing reads the engine's archive as it arrives: 540 MB of files
/// are refused and listed with the process's peak memory below 200 MiB (each archive was
/// collected whole before: the peak passed 300 MiB).
#[tokio::test]
async fn large_files_are_refused_and_listed_without_being_held() {
    let Some(f) = fixture("bounded").await else {
        return;
    };
    let id = f.create("bx-dk-bounded").await;
    let made = f
        .sh(
            &id,
            "truncate -s 300M big && mkdir wide && truncate -s 120M wide/a wide/b \
             && echo small > wide/d",
        )
        .await;
    assert!(made.status.success(), "{}", text(&made.stdout));
    let files = f.docker.require_files().unwrap();

    let refused = |read: berth_contract::Result<Vec<u8>>| match read {
        Ok(bytes) => panic!("read {} bytes, not refused", bytes.len()),
        Err(e) => e,
    };
    let e = refused(files.read(&id, "big").await);
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert!(
        e.to_string()
            .contains("`big` is larger than the file API's limit of 256 MiB"),
        "{e}"
    );
    let e = refused(files.read(&id, "wide").await);
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert!(e.to_string().contains("is a directory"), "{e}");

    let listed = files.list(&id, "wide").await.unwrap();
    let seen: Vec<_> = listed
        .iter()
        .map(|e| (e.name.as_str(), e.kind, e.size))
        .collect();
    assert_eq!(
        seen,
        [
            ("a", FileKind::File, 120 << 20),
            ("b", FileKind::File, 120 << 20),
            ("d", FileKind::File, 6),
        ]
    );
    assert_eq!(files.read(&id, "wide/d").await.unwrap(), b"small\n");

    // A write of any size streams: 600 MB go in with the same bounded peak (the whole-file
    // write held the bytes and their archive: 1.2 GB).
    const UP: u64 = 600_000_007;
    let source = berth_contract::FileSource {
        reader: Box::new(Alphabet { at: 0, len: UP }),
        len: UP,
    };
    files.write_from(&id, "up/big.txt", source).await.unwrap();
    let seen = f
        .sh(
            &id,
            "stat -c %s up/big.txt; head -c 28 up/big.txt; echo; tail -c 5 up/big.txt",
        )
        .await;
    let expected_tail: String = (UP - 5..UP)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    assert_eq!(
        text(&seen.stdout),
        format!("{UP}\nabcdefghijklmnopqrstuvwxyzab\n{expected_tail}")
    );
    // A source that ends before its length fails the write and changes nothing: the old file
    // keeps its bytes and no part of the upload is left beside it.
    files.write(&id, "up/keep.txt", b"old").await.unwrap();
    let short = berth_contract::FileSource {
        reader: Box::new(Alphabet {
            at: 0,
            len: 3 << 20,
        }),
        len: 10 << 20,
    };
    let e = files
        .write_from(&id, "up/keep.txt", short)
        .await
        .expect_err("a short source was written");
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert!(
        e.to_string()
            .contains("ended after 3145728 of its 10485760 bytes"),
        "{e}"
    );
    assert_eq!(files.read(&id, "up/keep.txt").await.unwrap(), b"old");
    // A directory is not replaced by a file.
    let onto_dir = berth_contract::FileSource {
        reader: Box::new(Alphabet { at: 0, len: 4 }),
        len: 4,
    };
    let e = files
        .write_from(&id, "wide", onto_dir)
        .await
        .expect_err("a directory was replaced");
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    let names = |listed: Vec<berth_contract::FileEntry>| -> Vec<String> {
        listed.into_iter().map(|e| e.name).collect()
    };
    assert_eq!(
        names(files.list(&id, "up").await.unwrap()),
        ["big.txt", "keep.txt"]
    );
    assert_eq!(
        names(files.list(&id, "wide").await.unwrap()),
        ["a", "b", "d"]
    );
    assert!(
        !names(files.list(&id, ".").await.unwrap())
            .iter()
            .any(|n| n.starts_with(".berth-upload-")),
        "an upload was left behind"
    );

    let peak = peak_mib();
    assert!(peak < 200, "the process's memory peaked at {peak} MiB");
    f.docker.destroy(&id).await.unwrap();
}

/// A source that ends before its length, however small, leaves nothing behind: the engine may
/// still be unpacking the cut-short upload when the write has failed here (a 5-byte part was
/// found beside the file after the failed write had removed it: the engine wrote it after the
/// `rm`). A listing is made under the engine's container lock, so it sees such a late part.
#[tokio::test]
async fn a_cut_short_upload_leaves_nothing_behind() {
    let Some(f) = fixture("cutshort").await else {
        return;
    };
    let id = f.create("bx-dk-cutshort").await;
    let files = f.docker.require_files().unwrap();
    files.write(&id, "cut/keep.txt", b"old").await.unwrap();
    for round in 0..25 {
        let short = berth_contract::FileSource {
            reader: Box::new(&b"short"[..]),
            len: 10,
        };
        let e = files
            .write_from(&id, "cut/keep.txt", short)
            .await
            .expect_err("a short source was written");
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        let listed: Vec<String> = files
            .list(&id, "cut")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(listed, ["keep.txt"], "round {round}");
    }
    assert_eq!(files.read(&id, "cut/keep.txt").await.unwrap(), b"old");
    f.docker.destroy(&id).await.unwrap();
}

/// `len` bytes of the alphabet over and over, made as they are read (no file, no memory).
struct Alphabet {
    at: u64,
    len: u64,
}

impl std::io::Read for Alphabet {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min((self.len - self.at) as usize);
        for (i, byte) in buf[..n].iter_mut().enumerate() {
            *byte = b'a' + ((self.at + i as u64) % 26) as u8;
        }
        self.at += n as u64;
        Ok(n)
    }
}
