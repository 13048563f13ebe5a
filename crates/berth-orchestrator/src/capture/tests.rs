use super::*;

/// The sandbox's warnings are kept as its report: bounded in number and length, control
/// characters escaped, tar's closing summary dropped.
#[test]
fn the_sandboxs_warnings_are_kept_bounded_and_escaped() {
    let mut stderr = b"tar: notes.txt: Cannot open: Permission denied\n\
        warning: could not open directory 'locked/': Permission denied\n\
        tar: Exiting with failure status due to previous errors\n\n\
        \x1b[31mred\x07\n"
        .to_vec();
    stderr.extend(std::iter::repeat_n(b'x', 1000));
    stderr.push(b'\n');
    for n in 0..40 {
        stderr.extend(format!("line {n}\n").bytes());
    }
    let warnings = sandbox_warnings(&stderr);
    assert_eq!(warnings.len(), MAX_WARNINGS + 1, "{warnings:#?}");
    assert_eq!(
        warnings[0],
        "the sandbox reported: tar: notes.txt: Cannot open: Permission denied"
    );
    assert!(warnings[1].contains("could not open directory 'locked/'"));
    assert_eq!(warnings[2], "the sandbox reported: \\u{1b}[31mred\\u{7}");
    assert!(warnings[3].ends_with("xxx…") && warnings[3].len() < 400);
    assert_eq!(warnings[MAX_WARNINGS], "the sandbox reported 24 more lines");
    assert!(sandbox_warnings(b"").is_empty());
}

fn archive(entries: &[(&[u8], tar::EntryType, u32, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, kind, mode, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(*kind);
        header.set_mode(*mode);
        if *kind == tar::EntryType::Symlink {
            header.set_size(0);
            builder
                .append_link(
                    &mut header,
                    std::str::from_utf8(path).unwrap(),
                    std::str::from_utf8(data).unwrap(),
                )
                .unwrap();
        } else {
            header.set_size(data.len() as u64);
            // Raw names, including hostile ones the builder would refuse.
            let name = &mut header.as_old_mut().name;
            name[..path.len()].copy_from_slice(path);
            header.set_cksum();
            builder.append(&header, *data).unwrap();
        }
    }
    builder.into_inner().unwrap()
}

#[test]
fn hostile_entries_are_left_out_and_named() {
    use tar::EntryType::*;
    let tar = archive(&[
        (b"ok.txt", Regular, 0o644, b"good"),
        (b"./run.sh", Regular, 0o755, b"#!/bin/sh"),
        (b".git/hooks/pre-commit", Regular, 0o755, b"evil"),
        (b"sub/.GIT", Regular, 0o644, b"gitdir: /evil"),
        (b"sub/.git. ", Regular, 0o644, b"x"),
        (b"../escape", Regular, 0o644, b"x"),
        (b"/etc/passwd", Regular, 0o644, b"x"),
        (b"a/../b", Regular, 0o644, b"x"),
        (b"dev", Char, 0o644, b""),
        (b"fifo", Fifo, 0o644, b""),
        (b"link", Symlink, 0o777, b"ok.txt"),
    ]);
    let capture = parse(&tar).unwrap();
    let paths: Vec<_> = capture
        .files
        .keys()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    assert_eq!(paths, ["link", "ok.txt", "run.sh"]);
    assert_eq!(capture.files[&b"run.sh"[..]].mode, "100755");
    assert_eq!(capture.files[&b"ok.txt"[..]].mode, "100644");
    assert_eq!(
        capture.files[&b"link"[..]],
        CapturedFile {
            mode: "120000",
            data: b"ok.txt".to_vec()
        }
    );
    assert_eq!(capture.skipped.len(), 8, "{:?}", capture.skipped);
}

#[test]
fn oversized_and_garbage_archives_are_errors() {
    assert!(parse(&vec![0u8; LIMIT + 1])
        .unwrap_err()
        .contains("larger than"));
    assert!(parse(
        b"not a tar archive at all, just some bytes that go on and on"
            .repeat(20)
            .as_slice()
    )
    .is_err());
}

#[test]
fn quoting_keeps_every_byte() {
    assert_eq!(
        quote(b"a \"b\"\\\n\xff"),
        b"\"a \\\"b\\\"\\\\\\012\\377\"".to_vec()
    );
}

#[test]
fn commit_ids_have_one_shape() {
    assert!(is_commit_id(&"a".repeat(40)));
    assert!(!is_commit_id("HEAD; echo INJECTED"));
    assert!(!is_commit_id(&"g".repeat(40)));
}

/// A task's bundle names only `HEAD`; a work repository that lacks the task's commit (made
/// again from the base) still gets it from that bundle when the next task commits on it.
/// It fails when the bundle's `HEAD` is not fetched.
#[test]
fn a_commit_on_a_parent_only_a_head_bundle_holds() {
    use tar::EntryType::Regular;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    std::fs::create_dir_all(&source).unwrap();
    git(&source, &["init", "-q", "-b", "main"]).unwrap();
    std::fs::write(source.join("README"), "base\n").unwrap();
    git(&source, &["add", "README"]).unwrap();
    git(
        &source,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "base",
        ],
    )
    .unwrap();
    let base = git(&source, &["rev-parse", "HEAD"]).unwrap();
    let base_bundle = dir.path().join("base.bundle");
    git(
        &source,
        &[
            "bundle",
            "create",
            "-q",
            &base_bundle.to_string_lossy(),
            "--all",
        ],
    )
    .unwrap();
    let capture = |text: &[u8]| parse(&archive(&[(b"README", Regular, 0o644, text)])).unwrap();

    let first = dir.path().join("first");
    std::fs::create_dir_all(&first).unwrap();
    let repo = work_repo(&first, &base_bundle).unwrap();
    let one = commit(
        &repo,
        &base_bundle,
        "refs/heads/berth/a",
        &base,
        "one",
        &capture(b"one\n"),
    )
    .unwrap();
    let task_bundle = dir.path().join("task.bundle");
    bundle(&repo, "refs/heads/berth/a", &task_bundle).unwrap();
    let heads = git(
        dir.path(),
        &["bundle", "list-heads", &task_bundle.to_string_lossy()],
    )
    .unwrap();
    assert_eq!(heads, format!("{one} HEAD"));

    // A repository made from the base alone: the parent comes from the task's bundle.
    let second = dir.path().join("second");
    std::fs::create_dir_all(&second).unwrap();
    let repo = work_repo(&second, &base_bundle).unwrap();
    let two = commit(
        &repo,
        &task_bundle,
        "refs/heads/berth/b",
        &one,
        "two",
        &capture(b"two\n"),
    )
    .unwrap();
    assert_eq!(git(&repo, &["rev-parse", &format!("{two}^")]).unwrap(), one);
}

/// A repository with `files` (path, bytes) committed or left untracked as given.
fn repository(files: &[(&str, Vec<u8>, bool)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["init", "-q", "-b", "main"]).unwrap();
    for (path, bytes, tracked) in files {
        let at = dir.path().join(path);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(&at, bytes).unwrap();
        if *tracked {
            git(dir.path(), &["add", path]).unwrap();
        }
    }
    dir
}

/// `sh -c SCRIPT` in `repo` with `TMPDIR` set to `tmp`, in a process group of its own.
fn capture_command(repo: &Path, tmp: &Path) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new("sh");
    command
        .args(["-c", SCRIPT])
        .current_dir(repo)
        .env("TMPDIR", tmp)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    command
}

#[test]
fn the_capture_archives_what_git_would_commit() {
    let repo = repository(&[
        ("tracked.txt", b"t\n".to_vec(), true),
        ("dir/untracked.txt", b"u\n".to_vec(), false),
        (".gitignore", b"ignored.txt\n".to_vec(), false),
        ("ignored.txt", b"i\n".to_vec(), false),
    ]);
    let tmp = tempfile::tempdir().unwrap();
    let out = capture_command(repo.path(), tmp.path()).output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let capture = parse(&out.stdout).unwrap();
    let paths: Vec<_> = capture
        .files
        .keys()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    assert_eq!(paths, [".gitignore", "dir/untracked.txt", "tracked.txt"]);
    assert_eq!(capture.files[&b"dir/untracked.txt"[..]].data, b"u\n");

    // No longer a repository: git's failure is the script's, whatever tar made of it.
    std::fs::remove_dir_all(repo.path().join(".git")).unwrap();
    let out = capture_command(repo.path(), tmp.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(91));
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

/// A capture SIGKILLed while tar is writing (its reader stopped reading) leaves no file
/// behind: there is none to leave. (The script made its list with `mktemp` once; killed,
/// its `rm` never ran, and the host provider's `/tmp` is the host's.)
#[test]
fn a_killed_capture_leaves_no_file_behind() {
    use std::io::Read;
    let repo = repository(&[("big.bin", vec![7u8; 8 << 20], false)]);
    let tmp = tempfile::tempdir().unwrap();
    let mut child = capture_command(repo.path(), tmp.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The archive has begun, so the list is made; tar now blocks on the full pipe.
    let mut first = [0u8; 512];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    assert_eq!(&first[..7], b"big.bin");
    let group = format!("-{}", child.id());
    let killed = std::process::Command::new("kill")
        .args(["-KILL", "--", &group])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(!status.success());
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind in TMPDIR: {left:?}");
    let mut in_repo: Vec<_> = std::fs::read_dir(repo.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    in_repo.sort();
    assert_eq!(in_repo, [".git", "big.bin"]);
}
