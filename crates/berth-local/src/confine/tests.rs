//! The confined file API against hostile workspaces.

use super::*;
use std::os::unix::fs::symlink;

fn make_fifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

fn workspace() -> (tempfile::TempDir, PathBuf, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let opened = Workspace::open(&ws).unwrap();
    (dir, ws, opened)
}

#[test]
fn plain_relative_paths_write_and_read_inside() {
    let (_dir, ws, opened) = workspace();
    opened.write("a/b/c.txt", b"hello").unwrap();
    assert_eq!(std::fs::read(ws.join("a/b/c.txt")).unwrap(), b"hello");
    assert_eq!(opened.read("./a/b/c.txt").unwrap(), b"hello");
    let abs = ws.join("a/b/c.txt");
    assert_eq!(opened.read(abs.to_str().unwrap()).unwrap(), b"hello");
    assert_eq!(opened.directory(".").unwrap(), PathBuf::new());
    assert_eq!(opened.directory("a/b").unwrap(), PathBuf::from("a/b"));
}

#[test]
fn dot_dot_and_outside_absolute_paths_are_refused() {
    let (_dir, _ws, opened) = workspace();
    std::fs::create_dir(_ws.join("a")).unwrap();
    for path in ["../x", "a/../../x", "a/../b"] {
        let err = opened.write(path, b"x").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert!(err.to_string().contains("contains `..`"), "{err}");
    }
    let err = opened.read("/etc/passwd").unwrap_err();
    assert!(err.to_string().contains("absolute and outside"), "{err}");
}

/// A directory of more names than a listing may hold is refused, not held in memory.
#[test]
fn a_listing_holds_at_most_max_list_entries() {
    let (_dir, ws, opened) = workspace();
    let wide = ws.join("wide");
    std::fs::create_dir(&wide).unwrap();
    for n in 0..berth_contract::MAX_LIST_ENTRIES {
        std::fs::File::create(wide.join(n.to_string())).unwrap();
    }
    assert_eq!(
        opened.list("wide").unwrap().len(),
        berth_contract::MAX_LIST_ENTRIES
    );
    std::fs::File::create(wide.join("one-more")).unwrap();
    let err = opened.list("wide").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(
        err.to_string()
            .contains("`wide` holds more than the file API's limit of 100000 entries"),
        "{err}"
    );
}

#[test]
fn symlinks_are_never_followed_inside_or_out() {
    let (dir, ws, opened) = workspace();
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"s").unwrap();
    std::fs::create_dir(ws.join("real")).unwrap();
    std::fs::write(ws.join("real/f"), b"inside").unwrap();
    symlink(&outside, ws.join("link-dir")).unwrap();
    symlink(outside.join("secret"), ws.join("link-file")).unwrap();
    symlink("real", ws.join("alias")).unwrap();
    for path in ["link-dir/secret", "link-file", "alias/f"] {
        let err = opened.read(path).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{path}: {err}");
    }
    for path in ["link-dir/new.txt", "alias/new.txt"] {
        let err = opened.write(path, b"x").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{path}: {err}");
    }
    assert!(!outside.join("new.txt").exists());
    // Writing over a symlink replaces the link itself, never its target.
    opened.write("link-file", b"replaced").unwrap();
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"s");
    assert!(!std::fs::symlink_metadata(ws.join("link-file"))
        .unwrap()
        .file_type()
        .is_symlink());
    // A new file: the link's own mode (0777) says nothing about it.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(ws.join("link-file"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
    let listed = opened.list(".").unwrap();
    let alias = listed.iter().find(|e| e.name == "alias").unwrap();
    assert_eq!(alias.kind, FileKind::Symlink);
}

#[test]
fn fifos_are_refused_without_blocking() {
    let (_dir, ws, opened) = workspace();
    make_fifo(&ws.join("fifo"));
    let err = opened.read("fifo").unwrap_err();
    assert!(err.to_string().contains("a FIFO"), "{err}");
    let err = opened.write("fifo", b"x").unwrap_err();
    assert!(err.to_string().contains("a FIFO"), "{err}");
}

#[test]
fn writes_keep_an_existing_mode_and_never_touch_a_hard_link() {
    let (dir, ws, opened) = workspace();
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(ws.join("run.sh"), b"old").unwrap();
    std::fs::set_permissions(ws.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    opened.write("run.sh", b"new").unwrap();
    let meta = std::fs::metadata(ws.join("run.sh")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
    let other = dir.path().join("other");
    std::fs::write(&other, b"keep").unwrap();
    std::fs::hard_link(&other, ws.join("hard")).unwrap();
    opened.write("hard", b"changed").unwrap();
    assert_eq!(std::fs::read(&other).unwrap(), b"keep");
}

/// A streamed write takes exactly its length: a source that ends sooner fails it and the
/// old file keeps its bytes, with nothing left beside it; a longer one is read no further.
#[test]
fn a_streamed_write_is_whole_or_changes_nothing() {
    let (_dir, ws, opened) = workspace();
    opened.write("keep.txt", b"old").unwrap();
    let err = opened
        .write_from("keep.txt", &mut &b"short"[..], 10)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(
        err.to_string().contains("ended after 5 of its 10 bytes"),
        "{err}"
    );
    assert_eq!(std::fs::read(ws.join("keep.txt")).unwrap(), b"old");
    let names: Vec<_> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["keep.txt"]);
    let mut long: &[u8] = b"0123456789";
    opened.write_from("keep.txt", &mut long, 4).unwrap();
    assert_eq!(std::fs::read(ws.join("keep.txt")).unwrap(), b"0123");
    assert_eq!(long, b"456789", "read past its length");
}

/// While its bytes are being written, a new file has no name in the workspace (so a
/// process killed then leaves nothing there); it appears whole, under its own name only.
#[test]
fn a_file_being_written_has_no_name_until_it_is_whole() {
    struct Watching {
        ws: PathBuf,
        left: usize,
        seen: Vec<Vec<std::ffi::OsString>>,
    }
    impl io::Read for Watching {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let mut names: Vec<_> = std::fs::read_dir(&self.ws)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<_>>()?;
            names.sort();
            self.seen.push(names);
            let n = buf.len().min(self.left).min(4096);
            buf[..n].fill(b'x');
            self.left -= n;
            Ok(n)
        }
    }
    let (_dir, ws, opened) = workspace();
    opened.write("old.txt", b"old").unwrap();
    for (name, before) in [
        ("new.bin", &["old.txt"][..]),
        ("old.txt", &["new.bin", "old.txt"]),
    ] {
        let mut source = Watching {
            ws: ws.clone(),
            left: 64 << 10,
            seen: Vec::new(),
        };
        opened.write_from(name, &mut source, 64 << 10).unwrap();
        assert!(
            source.seen.len() >= 16,
            "{name}: {} reads",
            source.seen.len()
        );
        for names in &source.seen {
            assert_eq!(names, before, "{name}: seen while writing");
        }
        assert_eq!(std::fs::read(ws.join(name)).unwrap().len(), 64 << 10);
    }
    let mut names: Vec<_> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["new.bin", "old.txt"]);
}

/// A copy streams a file of any size (here past the whole-file read limit) with a bounded
/// buffer, under the same rules as a read: no symlink followed, no FIFO waited on.
#[test]
fn a_copy_streams_any_size_under_the_read_rules() {
    struct Counting(std::sync::Arc<std::sync::atomic::AtomicU64>);
    impl Write for Counting {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0
                .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let (dir, ws, opened) = workspace();
    let big = MAX_READ_BYTES + (1 << 20);
    std::fs::File::create(ws.join("big"))
        .unwrap()
        .set_len(big)
        .unwrap();
    assert_eq!(
        opened.read("big").unwrap_err().kind(),
        ErrorKind::InvalidRequest
    );
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (_, copied) = opened
        .read_to("big", Box::new(Counting(seen.clone())))
        .unwrap();
    assert_eq!(
        (copied, seen.load(std::sync::atomic::Ordering::Relaxed)),
        (big, big)
    );

    std::fs::write(dir.path().join("secret"), b"s").unwrap();
    symlink(dir.path().join("secret"), ws.join("link")).unwrap();
    let refused = |path: &str| match opened.read_to(path, Box::new(io::sink())) {
        Ok(_) => panic!("`{path}` was copied"),
        Err(err) => err,
    };
    let err = refused("link");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    make_fifo(&ws.join("fifo"));
    let err = refused("fifo");
    assert!(err.to_string().contains("a FIFO"), "{err}");
    let err = refused("../x");
    assert!(err.to_string().contains("contains `..`"), "{err}");
    // A sink that fails ends the copy, said as the destination's failure.
    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from_raw_os_error(28))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let Err(err) = opened.read_to("big", Box::new(Full)) else {
        panic!("a failing sink was not noticed")
    };
    assert!(
        err.to_string().contains("the copy's destination failed"),
        "{err}"
    );
}

#[test]
fn missing_path_is_not_found() {
    let (_dir, _ws, opened) = workspace();
    let err = opened.read("nope/file").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

    /// Any path text: refused, or workspace-relative components with no `..`, no root and
    /// no NUL — never a panic.
    #[test]
    fn sandbox_paths_parse_or_refuse_never_panic(path in "(\\PC|/|\\.|\\.\\.){0,40}") {
        if let Ok(parts) = components(Path::new("/ws"), &path) {
            for part in parts {
                let text = part.to_string_lossy().into_owned();
                proptest::prop_assert!(text != ".." && text != "." && !text.contains('/') && !text.contains('\0'));
            }
        }
    }
}

#[test]
fn overlong_names_are_invalid_input() {
    let (_dir, _ws, opened) = workspace();
    let long = "n".repeat(300);
    assert_eq!(
        opened.write(&long, b"x").unwrap_err().kind(),
        ErrorKind::InvalidRequest
    );
    assert_eq!(
        opened.read(&long).unwrap_err().kind(),
        ErrorKind::InvalidRequest
    );
}
