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

    let peak = peak_mib();
    assert!(peak < 200, "the process's memory peaked at {peak} MiB");
    f.docker.destroy(&id).await.unwrap();
}
