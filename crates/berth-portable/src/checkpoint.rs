//! A sandbox's workspace as a checkpoint: what its own `tar` wrote, read on the host with
//! strict rules, kept as a manifest (path → kind, permission bits, content digest or link
//! target) and as a clean archive Berth wrote itself.
//!
//! The sandbox is hostile. Berth never extracts what it sent: every path is checked (relative,
//! no `.` or `..` inside, bounded), every entry's parent must be a directory the archive
//! created before it (so nothing lands beneath a symlink or a file), each path appears once,
//! sizes and counts are bounded, and only directories, regular files and symlinks are
//! carried. The archive a target extracts is built from that manifest, never copied through.

use std::collections::BTreeMap;
use std::io::Read;
use std::rc::Rc;
use std::time::Duration;

use berth_contract::{ExecRequest, NativeId, Provider};
use sha2::{Digest, Sha256};

use crate::PortableError;

/// Run in the sandbox's workspace (its default working directory), a constant: the whole
/// workspace as a tar archive on stdout. Hard links are archived as links (resolved here).
pub const ARCHIVE_SCRIPT: &str = "exec tar -c -f - .";

/// The largest workspace a checkpoint takes (bytes of archive): the archive is held in memory
/// twice (as read, and as rebuilt).
pub const LIMIT: usize = 256 << 20;
/// The most entries a checkpoint takes.
pub const MAX_ENTRIES: usize = 200_000;
/// The most entries a checkpoint names as not carried (the rest are counted).
const MAX_NOT_CARRIED: usize = 100;
/// The longest path (bytes).
const MAX_PATH: usize = 4096;
/// The longest name of one path component (bytes).
const MAX_NAME: usize = 255;
/// How long the sandbox's `tar` may take.
const ARCHIVE_TIMEOUT: Duration = Duration::from_secs(600);

/// What one entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file: its SHA-256 and size.
    File {
        /// SHA-256 of the content.
        sha256: [u8; 32],
        /// Bytes.
        size: u64,
    },
    /// A symbolic link and its target (never followed).
    Symlink {
        /// The target, as the link holds it.
        target: Vec<u8>,
    },
}

/// One entry of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What it is.
    pub kind: EntryKind,
    /// Permission bits (`0o777`; 0 for a symlink).
    pub mode: u32,
}

/// A workspace read from a sandbox.
#[derive(Debug)]
pub struct Checkpoint {
    /// Every carried entry by path (bytes, `/`-separated, relative, sorted).
    pub entries: BTreeMap<Vec<u8>, Entry>,
    /// What is not carried, and why (entries of other kinds, bits a move drops, the sandbox's
    /// own warnings) — shown, never silently dropped.
    pub not_carried: Vec<String>,
    /// The archive a target extracts: built by Berth from the entries above.
    pub archive: Vec<u8>,
}

impl Checkpoint {
    /// Reads the workspace of sandbox `id` through `provider`'s exec.
    pub async fn read(provider: &dyn Provider, id: &NativeId) -> Result<Checkpoint, PortableError> {
        Self::read_as(provider, id, Keep::Archive).await
    }

    /// [`Checkpoint::read`] for comparison only: the same rules, the manifest alone (no archive
    /// is rebuilt, no content held).
    pub async fn read_manifest(
        provider: &dyn Provider,
        id: &NativeId,
    ) -> Result<Checkpoint, PortableError> {
        Self::read_as(provider, id, Keep::Manifest).await
    }

    async fn read_as(
        provider: &dyn Provider,
        id: &NativeId,
        keep: Keep,
    ) -> Result<Checkpoint, PortableError> {
        let mut req = ExecRequest::shell(ARCHIVE_SCRIPT).with_timeout(ARCHIVE_TIMEOUT);
        req.max_output_bytes = LIMIT + 1;
        let out = provider.exec(id, &req).await?;
        if out.stdout_truncated() || out.stdout.len() > LIMIT {
            return Err(PortableError::Workspace(format!(
                "the workspace is larger than {} MiB, the limit for a move",
                LIMIT >> 20
            )));
        }
        let stderr = out.stderr.as_deref().unwrap_or_default();
        if !out.status.success() {
            return Err(PortableError::Workspace(format!(
                "the sandbox's `tar` could not archive its workspace ({}){}",
                out.status,
                first_line(stderr)
            )));
        }
        let mut checkpoint = parse_as(&out.stdout, keep)?;
        checkpoint.not_carried.extend(sandbox_warnings(stderr));
        Ok(checkpoint)
    }

    /// The checkpoint's identity: SHA-256 of its manifest in a canonical encoding.
    pub fn digest(&self) -> String {
        let mut hash = Sha256::new();
        for (path, entry) in &self.entries {
            hash.update((path.len() as u64).to_be_bytes());
            hash.update(path);
            hash.update(entry.mode.to_be_bytes());
            match &entry.kind {
                EntryKind::Dir => hash.update(b"d"),
                EntryKind::File { sha256, size } => {
                    hash.update(b"f");
                    hash.update(size.to_be_bytes());
                    hash.update(sha256);
                }
                EntryKind::Symlink { target } => {
                    hash.update(b"l");
                    hash.update((target.len() as u64).to_be_bytes());
                    hash.update(target);
                }
            }
        }
        format!("sha256:{}", hex::encode(hash.finalize()))
    }

    /// Files, directories, symlinks and content bytes.
    pub fn counts(&self) -> Counts {
        let mut counts = Counts::default();
        for entry in self.entries.values() {
            match &entry.kind {
                EntryKind::Dir => counts.dirs += 1,
                EntryKind::File { size, .. } => {
                    counts.files += 1;
                    counts.bytes += size;
                }
                EntryKind::Symlink { .. } => counts.symlinks += 1,
            }
        }
        counts
    }

    /// How `other` differs from this checkpoint, one line per path (at most `limit` lines, then
    /// how many more); empty when they are the same.
    pub fn differences(&self, other: &Checkpoint, limit: usize) -> Vec<String> {
        let mut lines = Vec::new();
        let mut more = 0usize;
        let mut say = |line: String| {
            if lines.len() < limit {
                lines.push(line);
            } else {
                more += 1;
            }
        };
        for (path, entry) in &self.entries {
            match other.entries.get(path) {
                None => say(format!("{}: missing", shown(path))),
                Some(found) if found != entry => {
                    say(format!("{}: {}", shown(path), what_differs(entry, found)))
                }
                Some(_) => {}
            }
        }
        for path in other.entries.keys() {
            if !self.entries.contains_key(path) {
                say(format!("{}: not in the checkpoint", shown(path)));
            }
        }
        if more > 0 {
            lines.push(format!("and {more} more"));
        }
        lines
    }
}

/// Entry counts of a checkpoint.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Regular files.
    pub files: u64,
    /// Directories (the workspace itself not counted).
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Bytes of file content.
    pub bytes: u64,
}

fn what_differs(want: &Entry, found: &Entry) -> String {
    match (&want.kind, &found.kind) {
        (EntryKind::File { .. }, EntryKind::File { .. })
        | (EntryKind::Dir, EntryKind::Dir)
        | (EntryKind::Symlink { .. }, EntryKind::Symlink { .. })
            if want.kind == found.kind =>
        {
            format!("mode {:o}, not {:o}", found.mode, want.mode)
        }
        (EntryKind::File { .. }, EntryKind::File { .. }) => "different content".into(),
        (EntryKind::Symlink { .. }, EntryKind::Symlink { .. }) => "different link target".into(),
        _ => "a different kind of entry".into(),
    }
}

/// A path from a sandbox, shown escaped and cut.
pub(crate) fn shown(path: &[u8]) -> String {
    let text = String::from_utf8_lossy(path);
    let mut out: String = text
        .chars()
        .take(200)
        .collect::<String>()
        .escape_debug()
        .to_string();
    if text.chars().nth(200).is_some() {
        out.push('…');
    }
    out
}

fn first_line(stderr: &[u8]) -> String {
    sandbox_warnings(stderr)
        .into_iter()
        .next()
        .map(|line| format!(": {line}"))
        .unwrap_or_default()
}

/// The sandbox's own warnings (the first few lines of its `tar`'s stderr, each cut and shown
/// escaped): a socket `tar` ignored is only a warning there.
fn sandbox_warnings(stderr: &[u8]) -> Vec<String> {
    const MAX_LINES: usize = 20;
    let text = String::from_utf8_lossy(&stderr[..stderr.len().min(64 << 10)]);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    let mut out: Vec<String> = lines
        .iter()
        .take(MAX_LINES)
        .map(|line| format!("the sandbox reported: {}", shown(line.as_bytes())))
        .collect();
    if lines.len() > MAX_LINES {
        out.push(format!(
            "the sandbox reported {} more lines",
            lines.len() - MAX_LINES
        ));
    }
    out
}

/// An archive path as the manifest keeps it, or why it can never come from archiving a
/// directory (`None` for the workspace itself).
fn manifest_path(raw: &[u8]) -> Result<Option<Vec<u8>>, String> {
    if raw.len() > MAX_PATH {
        return Err(format!("a path longer than {MAX_PATH} bytes"));
    }
    if raw.first() == Some(&b'/') {
        return Err(format!("`{}`: an absolute path", shown(raw)));
    }
    let mut parts: Vec<&[u8]> = Vec::new();
    for (i, part) in raw.split(|b| *b == b'/').enumerate() {
        match part {
            b"" => continue,
            b"." if i == 0 => continue,
            b"." | b".." => return Err(format!("`{}`: `.` or `..` inside the path", shown(raw))),
            _ if part.len() > MAX_NAME => {
                return Err(format!(
                    "`{}`: a name longer than {MAX_NAME} bytes",
                    shown(raw)
                ))
            }
            _ if part.contains(&0) => return Err(format!("`{}`: a NUL in the path", shown(raw))),
            _ => parts.push(part),
        }
    }
    Ok((!parts.is_empty()).then(|| parts.join(&b'/')))
}

fn parent(path: &[u8]) -> Option<&[u8]> {
    path.iter().rposition(|b| *b == b'/').map(|at| &path[..at])
}

/// Reads an archive the sandbox wrote (and rebuilds it, for a checkpoint). Malformed or impossible archives (a
/// path escaping, an entry beneath something that is not a directory, a path twice) fail the
/// whole checkpoint: they cannot come from archiving a directory.
#[cfg(test)]
fn parse(archive: &[u8]) -> Result<Checkpoint, PortableError> {
    parse_as(archive, Keep::Archive)
}

/// What a read keeps besides the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// The rebuilt archive (a checkpoint to restore).
    Archive,
    /// Nothing (a read to compare): the same rules, no content held.
    Manifest,
}

pub(crate) fn parse_as(archive: &[u8], keep: Keep) -> Result<Checkpoint, PortableError> {
    let bad = |why: String| {
        PortableError::Workspace(format!("the workspace's archive is refused: {why}"))
    };
    if archive.len() > LIMIT {
        return Err(bad(format!("larger than {} MiB", LIMIT >> 20)));
    }
    let mut entries: BTreeMap<Vec<u8>, Entry> = BTreeMap::new();
    // Content by path; a hard link shares its file's bytes (the rebuilt archive copies them).
    let mut contents: BTreeMap<Vec<u8>, (Rc<Vec<u8>>, u64)> = BTreeMap::new();
    // What is not carried, named one by one up to a bound (a sandbox decides how many FIFOs
    // it holds, and the list is shown, sent and stored), then counted.
    let mut not_carried = Vec::new();
    let mut unnamed = 0usize;
    let mut note = |line: String| {
        if not_carried.len() < MAX_NOT_CARRIED {
            not_carried.push(line);
        } else {
            unnamed += 1;
        }
    };
    let mut high_bits = 0usize;
    let mut held = 0u64;
    let mut reader = tar::Archive::new(archive);
    let iter = reader
        .entries()
        .map_err(|e| bad(format!("unreadable: {e}")))?;
    for (n, entry) in iter.enumerate() {
        if n >= MAX_ENTRIES {
            return Err(bad(format!("more than {MAX_ENTRIES} entries")));
        }
        let mut entry = entry.map_err(|e| bad(format!("unreadable: {e}")))?;
        let kind = entry.header().entry_type();
        let raw = entry.path_bytes().into_owned();
        let Some(path) = manifest_path(&raw).map_err(&bad)? else {
            if kind.is_dir() {
                continue; // the workspace itself
            }
            return Err(bad(format!("`{}` names no entry", shown(&raw))));
        };
        if entries.contains_key(&path) {
            return Err(bad(format!("`{}` appears twice", shown(&path))));
        }
        if let Some(parent) = parent(&path) {
            if entries.get(parent).map(|e| &e.kind) != Some(&EntryKind::Dir) {
                return Err(bad(format!(
                    "`{}` is not beneath a directory the archive made before it",
                    shown(&path)
                )));
            }
        }
        let raw_mode = entry.header().mode().unwrap_or(0);
        let mtime = entry.header().mtime().unwrap_or(0);
        let carried = match kind {
            tar::EntryType::Directory => Entry {
                kind: EntryKind::Dir,
                mode: raw_mode & 0o777,
            },
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let mut data = Vec::new();
                entry
                    .read_to_end(&mut data)
                    .map_err(|e| bad(format!("unreadable: {e}")))?;
                let entry = file_entry(&data, raw_mode);
                if keep == Keep::Manifest {
                    data = Vec::new();
                }
                contents.insert(path.clone(), (Rc::new(data), mtime));
                entry
            }
            tar::EntryType::Link => {
                // A hard link names a file archived before it; carried as a copy of it.
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let target = manifest_path(&target).map_err(&bad)?.unwrap_or_default();
                let linked = match entries.get(&target).map(|e| &e.kind) {
                    Some(kind @ EntryKind::File { .. }) => kind.clone(),
                    _ => EntryKind::Dir,
                };
                let Some((data, _)) = contents
                    .get(&target)
                    .filter(|_| linked != EntryKind::Dir)
                    .cloned()
                else {
                    return Err(bad(format!(
                        "`{}` links to `{}`, not a file archived before it",
                        shown(&path),
                        shown(&target)
                    )));
                };
                note(format!(
                    "{}: a hard link to {}, carried as a copy",
                    shown(&path),
                    shown(&target)
                ));
                contents.insert(path.clone(), (data, mtime));
                Entry {
                    kind: linked,
                    mode: raw_mode & 0o777,
                }
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if target.is_empty() || target.len() > MAX_PATH || target.contains(&0) {
                    return Err(bad(format!(
                        "`{}`: a symlink without a usable target",
                        shown(&path)
                    )));
                }
                contents.insert(path.clone(), (Rc::default(), mtime));
                Entry {
                    kind: EntryKind::Symlink { target },
                    mode: 0,
                }
            }
            other => {
                note(format!(
                    "{}: a {} is not carried",
                    shown(&path),
                    kind_name(other)
                ));
                continue;
            }
        };
        if let EntryKind::File { size, .. } = &carried.kind {
            // Hard links are carried as copies: what is held is bounded, not only what was read.
            held += size;
            if held > LIMIT as u64 {
                return Err(bad(format!("more than {} MiB of content", LIMIT >> 20)));
            }
        }
        if raw_mode & 0o7000 != 0 && !matches!(carried.kind, EntryKind::Symlink { .. }) {
            high_bits += 1;
        }
        if kind == tar::EntryType::Directory {
            contents.insert(path.clone(), (Rc::default(), mtime));
        }
        entries.insert(path, carried);
    }
    if unnamed > 0 {
        not_carried.push(format!(
            "and {unnamed} more entries not carried or carried as copies"
        ));
    }
    if high_bits > 0 {
        not_carried.push(format!(
            "setuid, setgid and sticky bits of {high_bits} entries (a move carries permission bits 0777)"
        ));
    }
    let archive = match keep {
        Keep::Archive => {
            rebuild(&entries, &contents).map_err(|e| bad(format!("cannot rebuild: {e}")))?
        }
        Keep::Manifest => Vec::new(),
    };
    Ok(Checkpoint {
        entries,
        not_carried,
        archive,
    })
}

fn file_entry(data: &[u8], raw_mode: u32) -> Entry {
    Entry {
        kind: EntryKind::File {
            sha256: Sha256::digest(data).into(),
            size: data.len() as u64,
        },
        mode: raw_mode & 0o777,
    }
}

fn kind_name(kind: tar::EntryType) -> &'static str {
    match kind {
        tar::EntryType::Fifo => "FIFO",
        tar::EntryType::Char => "character device",
        tar::EntryType::Block => "block device",
        _ => "special entry",
    }
}

/// The archive a target extracts, written by Berth: parents before children (the manifest is
/// sorted by bytes, and `a` sorts before `a/…`), owner 0, the source's times.
fn rebuild(
    entries: &BTreeMap<Vec<u8>, Entry>,
    contents: &BTreeMap<Vec<u8>, (Rc<Vec<u8>>, u64)>,
) -> std::io::Result<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let mut builder = tar::Builder::new(Vec::new());
    for (path, entry) in entries {
        let (data, mtime) = contents
            .get(path)
            .map(|(d, m)| (d.as_slice(), *m))
            .unwrap_or((&[], 0));
        let name = std::path::Path::new(std::ffi::OsStr::from_bytes(path));
        let mut header = tar::Header::new_gnu();
        header.set_mtime(mtime);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mode(entry.mode);
        match &entry.kind {
            EntryKind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, name, std::io::empty())?;
            }
            EntryKind::File { .. } => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, name, data)?;
            }
            EntryKind::Symlink { target } => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                let target = std::path::Path::new(std::ffi::OsStr::from_bytes(target));
                builder.append_link(&mut header, name, target)?;
            }
        }
    }
    builder.into_inner()
}

#[cfg(test)]
#[path = "checkpoint/tests.rs"]
mod tests;
