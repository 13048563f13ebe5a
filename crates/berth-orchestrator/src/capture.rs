//! An attempt's workspace leaves its sandbox as data, and is committed on the host.
//!
//! The sandbox is hostile: it only ever produces bytes (a tar archive of the files its own git
//! selects — the selection is the agent's to make, like any edit). Berth reads the archive with
//! strict rules (regular files and symlinks only, no `.git` component, no `..`, bounded), builds
//! the commit in a repository it owns with `git fast-import` (no worktree, no hooks, no
//! repository config), and computes the commit id there. The validator then judges a checkout of
//! exactly that commit in a clean sandbox; nothing the sandbox prints becomes a commit id or a
//! command line.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::hostgit::{git, git_with_input, spawn_git, RunningGit, Transport};
use crate::OrchestratorError;

/// Run in the attempt's repository (`sh -c`, a constant: nothing is interpolated). Writes a tar
/// archive of the files git would commit (tracked and untracked, ignores honoured; deleted
/// files are skipped) to stdout. A workspace that is no longer a git repository fails (91).
///
/// git's list goes straight into tar through a pipe, never through a file: a capture killed
/// part-way (a timeout, a cancelled attempt) leaves nothing behind, and the host provider's
/// `/tmp` is the host's. POSIX `sh` has no `pipefail`, so git's own status comes back on
/// descriptor 3 (the command substitution) while tar writes the archive to descriptor 4 (the
/// script's stdout): a failed listing is never a complete-looking archive with status 0.
pub const SCRIPT: &str = "exec 4>&1
g=$( { { git ls-files -z --cached --others --exclude-standard 3>&- 4>&-; echo $? >&3; } | tar --null --no-recursion --ignore-failed-read --hard-dereference -T - -cf - 3>&- >&4 4>&-; } 3>&1 )
t=$?
[ $t -le 1 ] || exit $t
[ \"$g\" = 0 ] || exit 91";

/// The largest archive a capture accepts (bytes).
pub(crate) const LIMIT: usize = 256 << 20;
/// The most entries a capture accepts.
const MAX_ENTRIES: usize = 100_000;
/// The longest path accepted (bytes).
const MAX_PATH: usize = 4096;

/// One file of a capture, as git will store it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CapturedFile {
    /// `100644`, `100755` or `120000` (symlink; `data` is its target).
    pub mode: &'static str,
    pub data: Vec<u8>,
}

/// A workspace's files, by path (sorted), and what was left out and why.
#[derive(Debug, Default)]
pub(crate) struct Capture {
    pub files: BTreeMap<Vec<u8>, CapturedFile>,
    pub skipped: Vec<String>,
}

impl Capture {
    /// Total bytes of file content.
    pub fn bytes(&self) -> usize {
        self.files.values().map(|f| f.data.len()).sum()
    }

    /// The path of the first file whose content (a symlink's target) or path holds one of
    /// `secrets` (values of [`berth_artifacts::redact::MIN_SECRET_LEN`] bytes or more).
    pub fn first_holding(&self, secrets: &[String]) -> Option<&[u8]> {
        let finders: Vec<memchr::memmem::Finder<'_>> = secrets
            .iter()
            .filter(|s| s.len() >= berth_artifacts::redact::MIN_SECRET_LEN)
            .map(|s| memchr::memmem::Finder::new(s.as_bytes()))
            .collect();
        self.files.iter().find_map(|(path, file)| {
            finders
                .iter()
                .any(|f| f.find(&file.data).is_some() || f.find(path).is_some())
                .then_some(path.as_slice())
        })
    }
}

/// The path git stores for an archive entry, or why it is left out.
fn repository_path(raw: &[u8]) -> Result<Vec<u8>, String> {
    let shown = || String::from_utf8_lossy(raw).escape_debug().to_string();
    if raw.len() > MAX_PATH {
        return Err(format!(
            "{}…: path longer than {MAX_PATH} bytes",
            &shown()[..64]
        ));
    }
    if raw.first() == Some(&b'/') {
        return Err(format!("{}: absolute path", shown()));
    }
    let mut parts: Vec<&[u8]> = Vec::new();
    for (i, part) in raw.split(|b| *b == b'/').enumerate() {
        match part {
            b"" => continue,
            b"." if i == 0 => continue,
            b"." | b".." => return Err(format!("{}: `.` or `..` inside the path", shown())),
            _ => {}
        }
        // `.git` in any case, and the spellings some filesystems treat as `.git`.
        let trimmed = {
            let mut end = part.len();
            while end > 0 && matches!(part[end - 1], b' ' | b'.') {
                end -= 1;
            }
            &part[..end]
        };
        if trimmed.eq_ignore_ascii_case(b".git") || part.eq_ignore_ascii_case(b"git~1") {
            return Err(format!("{}: a `.git` entry is never committed", shown()));
        }
        parts.push(part);
    }
    if parts.is_empty() {
        return Err(format!("{}: names no file", shown()));
    }
    Ok(parts.join(&b'/'))
}

/// What the sandbox's git or tar said while listing and archiving the workspace: a file they
/// cannot read (mode 000, a path past `PATH_MAX`) is left out of the archive with only a
/// warning, so these lines say what the capture lacks. The sandbox wrote them: the first
/// [`MAX_WARNINGS`] lines, each cut and shown escaped, are kept as its report, not a fact.
pub(crate) fn sandbox_warnings(stderr: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(&stderr[..stderr.len().min(64 << 10)]);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| {
            !line.is_empty() && *line != "tar: Exiting with failure status due to previous errors"
        })
        .collect();
    let mut warnings: Vec<String> = lines
        .iter()
        .take(MAX_WARNINGS)
        .map(|line| {
            let mut shown = String::new();
            for c in line.chars().take(300) {
                if c.is_control() {
                    shown.extend(c.escape_debug());
                } else {
                    shown.push(c);
                }
            }
            let cut = if line.chars().nth(300).is_some() {
                "…"
            } else {
                ""
            };
            format!("the sandbox reported: {shown}{cut}")
        })
        .collect();
    if lines.len() > MAX_WARNINGS {
        warnings.push(format!(
            "the sandbox reported {} more lines",
            lines.len() - MAX_WARNINGS
        ));
    }
    warnings
}

/// The most lines of the sandbox's own warnings a capture keeps.
const MAX_WARNINGS: usize = 20;

/// Reads a capture archive. Directories are implied by their files; hard links, devices,
/// fifos and other entry types are left out (named in `skipped`).
pub(crate) fn parse(archive: &[u8]) -> Result<Capture, String> {
    if archive.len() > LIMIT {
        return Err(format!(
            "the workspace is larger than {} MiB, the limit for a capture",
            LIMIT >> 20
        ));
    }
    let mut capture = Capture::default();
    let mut archive = tar::Archive::new(archive);
    let entries = archive
        .entries()
        .map_err(|e| format!("unreadable capture archive: {e}"))?;
    for (n, entry) in entries.enumerate() {
        if n >= MAX_ENTRIES {
            return Err(format!(
                "the workspace has more than {MAX_ENTRIES} entries, the limit for a capture"
            ));
        }
        let mut entry = entry.map_err(|e| format!("unreadable capture archive: {e}"))?;
        let kind = entry.header().entry_type();
        let raw = entry.path_bytes().into_owned();
        if kind == tar::EntryType::Directory {
            continue;
        }
        let path = match repository_path(&raw) {
            Ok(path) => path,
            Err(why) => {
                capture.skipped.push(why);
                continue;
            }
        };
        let file = match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let executable = entry.header().mode().unwrap_or(0) & 0o100 != 0;
                let mut data = Vec::new();
                entry
                    .read_to_end(&mut data)
                    .map_err(|e| format!("unreadable capture archive: {e}"))?;
                CapturedFile {
                    mode: if executable { "100755" } else { "100644" },
                    data,
                }
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name_bytes().map(|t| t.into_owned());
                match target {
                    Some(target) if !target.is_empty() && target.len() <= MAX_PATH => {
                        CapturedFile {
                            mode: "120000",
                            data: target,
                        }
                    }
                    _ => {
                        capture.skipped.push(format!(
                            "{}: symlink without a usable target",
                            String::from_utf8_lossy(&raw).escape_debug()
                        ));
                        continue;
                    }
                }
            }
            other => {
                capture.skipped.push(format!(
                    "{}: {other:?} entries are not committed",
                    String::from_utf8_lossy(&raw).escape_debug()
                ));
                continue;
            }
        };
        capture.files.insert(path, file);
    }
    Ok(capture)
}

/// A path in fast-import's C-style quoting (every byte outside printable ASCII as octal).
fn quote(path: &[u8]) -> Vec<u8> {
    let mut out = vec![b'"'];
    for &b in path {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x20..=0x7e => out.push(b),
            _ => out.extend_from_slice(format!("\\{b:03o}").as_bytes()),
        }
    }
    out.push(b'"');
    out
}

/// The fast-import stream that makes `refname` a commit of exactly `capture` on `parent`.
/// Deterministic (fixed identity and date): the same tree on the same parent is the same id.
fn import_stream(refname: &str, parent: &str, message: &str, capture: &Capture) -> Vec<u8> {
    let mut out = Vec::with_capacity(capture.bytes() + 4096);
    out.extend_from_slice(
        format!(
            "commit {refname}\nmark :1\ncommitter berth <berth@localhost> 0 +0000\ndata {}\n{message}\nfrom {parent}\ndeleteall\n",
            message.len()
        )
        .as_bytes(),
    );
    for (path, file) in &capture.files {
        out.extend_from_slice(format!("M {} inline ", file.mode).as_bytes());
        out.extend_from_slice(&quote(path));
        out.extend_from_slice(format!("\ndata {}\n", file.data.len()).as_bytes());
        out.extend_from_slice(&file.data);
        out.push(b'\n');
    }
    out.extend_from_slice(b"done\n");
    out
}

/// A full commit id (hex, 40 or 64 digits) — the only shape a commit id takes anywhere it is
/// used later.
pub(crate) fn is_commit_id(value: &str) -> bool {
    matches!(value.len(), 40 | 64) && value.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `value` as a commit id Berth computed, or a corrupt-state error naming it.
fn require_commit_id(value: &str) -> Result<(), OrchestratorError> {
    if is_commit_id(value) {
        Ok(())
    } else {
        Err(OrchestratorError::Corrupt(format!(
            "`{}` is not a commit id",
            value.escape_debug()
        )))
    }
}

/// The mission's own repository (bare, created by Berth under the mission directory) holding
/// the base and every captured attempt. Made on first use from the base bundle.
pub(crate) fn work_repo(
    mission_dir: &Path,
    base_bundle: &Path,
) -> Result<PathBuf, OrchestratorError> {
    let repo = mission_dir.join("work.git");
    if repo.join("HEAD").is_file() {
        return Ok(repo);
    }
    let mut nonce = [0u8; 4];
    getrandom::fill(&mut nonce).expect("OS randomness");
    let temp = mission_dir.join(format!(".work.git.{}", hex::encode(nonce)));
    let made = (|| {
        git(
            mission_dir,
            &["init", "-q", "--bare", "--", &temp.to_string_lossy()],
        )?;
        fetch_bundle(&temp, base_bundle, &["+HEAD:refs/imported/HEAD"])?;
        std::fs::rename(&temp, &repo).map_err(|e| {
            OrchestratorError::Repository(format!("cannot create {}: {e}", repo.display()))
        })
    })();
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&temp);
        // Another tick may have made it meanwhile.
        if repo.join("HEAD").is_file() {
            return Ok(repo);
        }
    }
    made.map(|()| repo)
}

/// Fetches every branch of `bundle` into `repo`, and `also` (refspecs: a task's bundle names
/// only its `HEAD`).
fn fetch_bundle(repo: &Path, bundle: &Path, also: &[&str]) -> Result<(), OrchestratorError> {
    let bundle = bundle.to_string_lossy();
    let mut args = vec![
        "fetch",
        "-q",
        "--no-tags",
        "--",
        &bundle,
        "+refs/*:refs/imported/*",
    ];
    args.extend_from_slice(also);
    git_with_input(repo, Transport::Scheme("file"), &args, None).map(|_| ())
}

/// Commits `capture` as a child of `parent` at `refname` in `repo` and returns the commit id.
/// `input` is a bundle holding `parent`, fetched first when the repository lacks it.
pub(crate) fn commit(
    repo: &Path,
    input: &Path,
    refname: &str,
    parent: &str,
    message: &str,
    capture: &Capture,
) -> Result<String, OrchestratorError> {
    require_commit_id(parent)?;
    let stream = import_stream(refname, parent, message, capture);
    let marks = repo.join(format!("import-marks-{}", std::process::id()));
    let marks_arg = format!("--export-marks={}", marks.display());
    let import = || {
        git_with_input(
            repo,
            Transport::None,
            &["fast-import", "--quiet", "--force", "--done", &marks_arg],
            Some(&stream),
        )
    };
    // The parent is normally here already (the base, or the previous task's commit); when it
    // is not (a repository made before it existed), the input bundle brings it.
    if import().is_err() {
        fetch_bundle(repo, input, &["+HEAD:refs/imported/input-HEAD"])?;
        import()?;
    }
    let exported = std::fs::read_to_string(&marks);
    let _ = std::fs::remove_file(&marks);
    let exported = exported.map_err(|e| {
        OrchestratorError::Repository(format!("git fast-import left no marks: {e}"))
    })?;
    let id = exported
        .lines()
        .find_map(|l| l.strip_prefix(":1 "))
        .unwrap_or_default()
        .trim()
        .to_owned();
    if !is_commit_id(&id) {
        return Err(OrchestratorError::Repository(format!(
            "git fast-import reported `{}` for {refname}",
            id.escape_debug()
        )));
    }
    Ok(id)
}

/// The commit `refname` points at in `repo` (made by [`commit`]): the loose ref fast-import
/// wrote (Berth's own repository, so no `git` process for it), else git's answer (a packed ref).
pub(crate) fn resolve(repo: &Path, refname: &str) -> Result<String, OrchestratorError> {
    if let Ok(text) = std::fs::read_to_string(repo.join(refname)) {
        let id = text.trim_end_matches('\n');
        if is_commit_id(id) {
            return Ok(id.to_owned());
        }
    }
    git(
        repo,
        &["rev-parse", "--verify", &format!("{refname}^{{commit}}")],
    )
}

/// Copies a finished bundle to `path` (mode 0600, atomically).
pub(crate) fn copy_bundle(from: &Path, path: &Path) -> Result<u64, OrchestratorError> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |e: std::io::Error| {
        OrchestratorError::Repository(format!("cannot write {}: {e}", path.display()))
    };
    let temp = path.with_extension("bundle.partial");
    let size = std::fs::copy(from, &temp).map_err(fail)?;
    std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
    std::fs::rename(&temp, path).map_err(fail)?;
    Ok(size)
}

/// Writes a bundle of `refname`'s commit with its whole history, as the bundle's only ref,
/// `HEAD` (a plain `git clone` checks it out, detached), to `path`, mode 0600, atomically.
/// Returns its size. No branch: cloning a bundle that names one also makes a local branch, a
/// remote-tracking ref and their configuration, which made each staging about 4 ms slower.
pub(crate) fn bundle(repo: &Path, refname: &str, path: &Path) -> Result<u64, OrchestratorError> {
    use std::os::unix::fs::PermissionsExt;
    let temp = path.with_extension("bundle.partial");
    let _ = std::fs::remove_file(&temp);
    // One runner per mission (the lease), so moving the work repository's HEAD is safe; it is
    // Berth's own repository, so the symbolic ref is written directly (atomically).
    let head = repo.join("HEAD.berth-partial");
    std::fs::write(&head, format!("ref: {refname}\n"))
        .and_then(|()| std::fs::rename(&head, repo.join("HEAD")))
        .map_err(|e| {
            OrchestratorError::Repository(format!("cannot point HEAD at {refname}: {e}"))
        })?;
    git(
        repo,
        &["bundle", "create", "-q", &temp.to_string_lossy(), "HEAD"],
    )?;
    let fail = |e: std::io::Error| {
        OrchestratorError::Repository(format!("cannot write {}: {e}", path.display()))
    };
    std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
    let size = std::fs::metadata(&temp).map_err(fail)?.len();
    std::fs::rename(&temp, path).map_err(fail)?;
    Ok(size)
}

/// Starts `git diff` of `refname` against the mission's `base` (the attempt's patch, binary
/// changes included), running beside the caller's other work on the same repository.
pub(crate) fn start_patch(
    repo: &Path,
    base: &str,
    refname: &str,
) -> Result<RunningGit, OrchestratorError> {
    require_commit_id(base)?;
    spawn_git(
        repo,
        Transport::None,
        &[
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--binary",
            base,
            refname,
            "--",
        ],
        None,
    )
}

/// Writes the patch `running` produces to `path`, mode 0600, atomically: git's exact bytes
/// (every changed line, trailing whitespace included).
pub(crate) fn write_patch(running: RunningGit, path: &Path) -> Result<(), OrchestratorError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let patch = running.finish()?;
    let temp = path.with_extension("patch.partial");
    let fail = |e: std::io::Error| {
        OrchestratorError::Repository(format!("cannot write {}: {e}", path.display()))
    };
    let _ = std::fs::remove_file(&temp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .and_then(|mut f| f.write_all(&patch))
        .map_err(fail)?;
    std::fs::rename(&temp, path).map_err(fail)
}

#[cfg(test)]
mod tests;
