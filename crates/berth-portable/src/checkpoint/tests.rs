use super::*;

/// Raw archive bytes with entries written exactly as given (no checks of the builder's own:
/// a hostile sandbox writes what it likes).
/// One raw entry: path, type, content, link target, mode.
type RawEntry<'a> = (&'a [u8], tar::EntryType, &'a [u8], Option<&'a [u8]>, u32);

fn raw(entries: &[RawEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (path, kind, data, link, mode) in entries {
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..path.len()].copy_from_slice(path);
        if let Some(link) = link {
            header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        }
        header.set_entry_type(*kind);
        header.set_mode(*mode);
        header.set_size(data.len() as u64);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

use tar::EntryType::{Directory as D, Fifo, Link as H, Regular as F, Symlink as L};

fn refused(archive: &[u8]) -> String {
    match parse(archive) {
        Ok(c) => panic!(
            "accepted: {:?}",
            c.entries.keys().map(|k| shown(k)).collect::<Vec<_>>()
        ),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_workspace_round_trips_through_the_rebuilt_archive() {
    let archive = raw(&[
        (b"./", D, b"", None, 0o755),
        (b"./bin/", D, b"", None, 0o750),
        (b"./bin/run", F, b"#!/bin/sh\necho hi\n", None, 0o755),
        (b"./notes", F, b"\x00\xffbytes", None, 0o600),
        (b"./latest", L, b"", Some(b"bin/run"), 0o777),
        (b"./outside", L, b"", Some(b"/etc/passwd"), 0o777),
        (b"./copy", H, b"", Some(b"./notes"), 0o600),
        (b"./.git/", D, b"", None, 0o755),
        (b"./.git/HEAD", F, b"ref: refs/heads/main\n", None, 0o644),
    ]);
    let first = parse(&archive).unwrap();
    assert_eq!(first.entries.len(), 8, "{:?}", first.entries.keys());
    assert_eq!(
        first.entries[b"bin/run".as_slice()].mode,
        0o755,
        "permission bits are carried"
    );
    assert_eq!(
        first.entries[b"outside".as_slice()].kind,
        EntryKind::Symlink {
            target: b"/etc/passwd".to_vec()
        },
        "a link is carried as a link, never followed"
    );
    assert_eq!(
        first.entries[b"copy".as_slice()].kind,
        first.entries[b"notes".as_slice()].kind
    );
    assert!(first.not_carried.iter().any(|n| n.contains("hard link")));
    // What a target extracts is Berth's own archive; read back, it is the same checkpoint.
    let again = parse(&first.archive).unwrap();
    assert_eq!(again.entries, first.entries);
    assert_eq!(again.digest(), first.digest());
    assert!(first.differences(&again, 10).is_empty());
    assert_eq!(
        first.counts(),
        Counts {
            files: 4,
            dirs: 2,
            symlinks: 2,
            bytes: 18 + 7 + 7 + 21
        }
    );
}

#[test]
fn a_read_to_compare_applies_the_same_rules_and_holds_nothing() {
    let good = raw(&[
        (b"d/", D, b"", None, 0o755),
        (b"d/f", F, b"content", None, 0o640),
        (b"h", H, b"", Some(b"d/f"), 0o640),
    ]);
    let carried = parse(&good).unwrap();
    let compared = parse_as(&good, Keep::Manifest).unwrap();
    assert_eq!(compared.entries, carried.entries);
    assert_eq!(compared.digest(), carried.digest());
    assert!(compared.archive.is_empty() && !carried.archive.is_empty());
    let bad = raw(&[
        (b"l", L, b"", Some(b"/"), 0o777),
        (b"l/x", F, b"x", None, 0o644),
    ]);
    assert_eq!(
        parse_as(&bad, Keep::Manifest).unwrap_err().to_string(),
        parse(&bad).unwrap_err().to_string()
    );
}

#[test]
fn differences_name_each_path_and_are_bounded() {
    let a = parse(&raw(&[
        (b"a", F, b"1", None, 0o644),
        (b"b", F, b"2", None, 0o644),
        (b"c", F, b"3", None, 0o644),
    ]))
    .unwrap();
    let b = parse(&raw(&[
        (b"a", F, b"1", None, 0o755),
        (b"b", F, b"X", None, 0o644),
        (b"d", D, b"", None, 0o755),
    ]))
    .unwrap();
    assert_eq!(
        a.differences(&b, 10),
        vec![
            "a: mode 755, not 644",
            "b: different content",
            "c: missing",
            "d: not in the checkpoint"
        ]
    );
    assert_eq!(a.differences(&b, 2).last().unwrap(), "and 2 more");
    assert_ne!(a.digest(), b.digest());
}

#[test]
fn archives_no_directory_could_produce_are_refused() {
    for (why, archive) in [
        ("`..`", raw(&[(b"../escape", F, b"x", None, 0o644)])),
        ("`..`", raw(&[(b"a/../../x", F, b"x", None, 0o644)])),
        ("absolute", raw(&[(b"/etc/cron.d/x", F, b"x", None, 0o644)])),
        (
            "not beneath a directory",
            raw(&[
                (b"link", L, b"", Some(b"/etc"), 0o777),
                (b"link/passwd", F, b"x", None, 0o644),
            ]),
        ),
        (
            "not beneath a directory",
            raw(&[(b"file", F, b"x", None, 0o644), (b"file/x", F, b"y", None, 0o644)]),
        ),
        ("not beneath a directory", raw(&[(b"no/parent", F, b"x", None, 0o644)])),
        (
            "appears twice",
            raw(&[(b"a", F, b"x", None, 0o644), (b"a", F, b"y", None, 0o644)]),
        ),
        (
            "not a file archived before it",
            raw(&[
                (b"l", L, b"", Some(b"/etc/shadow"), 0o777),
                (b"h", H, b"", Some(b"l"), 0o644),
            ]),
        ),
        (
            "absolute",
            raw(&[(b"h", H, b"", Some(b"/etc/shadow"), 0o644)]),
        ),
        ("without a usable target", raw(&[(b"l", L, b"", None, 0o777)])),
        ("unreadable", b"not a tar archive at all, but long enough to be read as a header block ..................................................................................................................................................................................................................................................................................................................................................................................................................................................".to_vec()),
    ] {
        let said = refused(&archive);
        assert!(said.contains(why), "{why}: {said}");
        assert!(said.starts_with("the workspace's archive is refused"), "{said}");
    }
}

#[test]
fn special_entries_and_high_bits_are_named_not_carried() {
    let c = parse(&raw(&[
        (b"pipe", Fifo, b"", None, 0o644),
        (b"tool", F, b"x", None, 0o4755),
    ]))
    .unwrap();
    assert_eq!(c.entries.len(), 1);
    assert_eq!(c.entries[b"tool".as_slice()].mode, 0o755);
    assert!(
        c.not_carried.iter().any(|n| n.contains("pipe: a FIFO")),
        "{:?}",
        c.not_carried
    );
    assert!(
        c.not_carried.iter().any(|n| n.contains("setuid")),
        "{:?}",
        c.not_carried
    );
}

#[test]
fn what_is_not_carried_is_named_up_to_a_bound_then_counted() {
    // 300 FIFOs: the list is shown, sent and stored (a stored checkpoint's record is bounded),
    // so a sandbox cannot make it any length.
    let names: Vec<Vec<u8>> = (0..300).map(|i| format!("p{i}").into_bytes()).collect();
    let entries: Vec<RawEntry> = names
        .iter()
        .map(|n| (n.as_slice(), Fifo, &b""[..], None, 0o644))
        .collect();
    let c = parse(&raw(&entries)).unwrap();
    assert_eq!(
        c.not_carried.len(),
        MAX_NOT_CARRIED + 1,
        "{:?}",
        c.not_carried.last()
    );
    assert_eq!(
        c.not_carried.last().unwrap(),
        "and 200 more entries not carried or carried as copies"
    );
}

#[test]
fn hard_links_cannot_multiply_what_is_held() {
    // One 1 MiB file and 300 links to it: 301 MiB held as copies, over the limit.
    let big = vec![7u8; 1 << 20];
    let names: Vec<Vec<u8>> = (0..300).map(|i| format!("h{i}").into_bytes()).collect();
    let mut entries: Vec<RawEntry> = vec![(b"big", F, &big, None, 0o644)];
    for name in &names {
        entries.push((name, H, b"", Some(b"big"), 0o644));
    }
    let said = refused(&raw(&entries));
    assert!(said.contains("more than 256 MiB of content"), "{said}");
}

#[test]
fn the_sandboxs_warnings_are_bounded_and_escaped() {
    let noisy: Vec<u8> = (0..50)
        .flat_map(|i| format!("tar: ./s{i}: socket ignored \x1b[31m\n").into_bytes())
        .collect();
    let lines = sandbox_warnings(&noisy);
    assert_eq!(lines.len(), 21);
    assert!(lines[0].contains("\\u{1b}"), "{}", lines[0]);
    assert_eq!(lines[20], "the sandbox reported 30 more lines");
}
