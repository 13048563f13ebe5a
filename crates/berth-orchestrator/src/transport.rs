//! Moving a repository into a sandbox and its workspace out again.
//!
//! Two ways, chosen by what the provider really offers:
//!
//! - **Bytes** (a provider with the file API: host, bwrap, docker): the input travels as a git
//!   bundle written through the file API and is cloned in the sandbox (`repo/` is a git
//!   checkout); the workspace comes back as a tar archive of the files the sandbox's git selects.
//! - **Text** (a provider whose files and output are text, not bytes: the ComputeSDK bridge):
//!   the input is the commit's tree as a tar archive Berth builds from git's objects on the host,
//!   carried as base64 in the environment of a few exec calls and unpacked with the sandbox's
//!   `base64` and `tar` (`repo/` is a plain tree: no `.git`, and no git needed in the sandbox);
//!   the workspace comes back as base64 of a tar archive of every file under `repo/` (with no
//!   git there, no ignore rules apply). The staged tree is read back and compared with the
//!   commit, file by file and mode by mode: a provider that does not keep bytes, symlinks or
//!   executable bits exactly fails staging with the files it changed, so the validator never
//!   judges a tree other than the one that is committed.
//!
//! Nothing from the sandbox or the repository is spliced into a command line: the scripts are
//! constants, and the data travels in environment variables.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use berth_contract::{ExecRequest, NativeId, Provider, ProviderExt};

use crate::capture::{self, Capture, CapturedFile};
use crate::hostgit::{git_with_input, Transport};
use crate::pipeline::{tail, Failure};
use crate::OrchestratorError;

/// Whether `provider` moves files as bytes (its file API) — otherwise the text transport.
pub(crate) fn carries_bytes(provider: &dyn Provider) -> bool {
    provider.files().is_some()
}

/// How the provider's sandboxes get the repository, as a mission's facts record it.
pub(crate) fn name(provider: &dyn Provider) -> &'static str {
    if carries_bytes(provider) {
        "bytes: git bundle through the file API"
    } else {
        "text: base64 over exec, tree read back and compared"
    }
}

/// The staging command: `.berth-input.bundle` checked out at `$BERTH_COMMIT` as `repo/`.
pub const STAGE_SCRIPT: &str = "rm -rf repo && git clone -q .berth-input.bundle repo && git -C repo checkout -q --detach \"$BERTH_COMMIT\" && rm -f .berth-input.bundle";

/// Text staging, first call: starts an empty encoded archive (whatever an earlier try left).
pub const TEXT_BEGIN_SCRIPT: &str = "rm -rf repo .berth-input.b64 && : > .berth-input.b64";
/// Text staging, once per chunk: appends `$BERTH_CHUNK` (base64) to the encoded archive.
pub const TEXT_CHUNK_SCRIPT: &str = "printf '%s' \"$BERTH_CHUNK\" >> .berth-input.b64";
/// Text staging, last call: decodes and unpacks the archive as `repo/`.
pub const TEXT_UNPACK_SCRIPT: &str = "mkdir repo && base64 -d .berth-input.b64 > .berth-input.tar && tar -xf .berth-input.tar -C repo && rm -f .berth-input.b64 .berth-input.tar";
/// Text capture (run in `repo/`): every file as a tar archive, in base64 on stdout. The
/// archive is written beside `repo/` first so tar's own failure is the script's status.
pub const TEXT_CAPTURE_SCRIPT: &str =
    "tar -cf ../.berth-capture.tar . || { s=$?; rm -f ../.berth-capture.tar; exit $s; }
base64 -w0 ../.berth-capture.tar; s=$?; rm -f ../.berth-capture.tar; exit $s";
/// Whether `$BERTH_EVIDENCE` exists (run in `repo/`).
pub const TEXT_EVIDENCE_SCRIPT: &str = "[ -e \"$BERTH_EVIDENCE\" ]";

/// Base64 carried per exec call (bytes of text): well under what the bridge's protocol line
/// carries, and a few calls for a typical repository.
const CHUNK: usize = 512 * 1024;

/// The largest tree the text transport carries: its archive, in base64, must come back in one
/// exec's output, which the bridge bounds at [`berth_contract::DEFAULT_MAX_OUTPUT_BYTES`].
pub(crate) const TEXT_LIMIT: usize = berth_contract::DEFAULT_MAX_OUTPUT_BYTES / 4 * 3 - 64 * 1024;

/// Stages `commit` as `repo/` in the sandbox, by the transport the provider offers. `bundle`
/// holds the commit (bytes); `work_repo` gives Berth's work repository holding it (text; the
/// byte path never opens it).
pub(crate) async fn stage(
    provider: &dyn Provider,
    id: &NativeId,
    bundle: &Path,
    work_repo: impl FnOnce() -> Result<PathBuf, OrchestratorError>,
    commit: &str,
) -> Result<(), Failure> {
    if !capture::is_commit_id(commit) {
        return Err(format!("`{}` is not a commit id", commit.escape_debug()).into());
    }
    if carries_bytes(provider) {
        stage_bundle(provider, id, bundle, commit).await
    } else {
        let tree = work_repo()
            .and_then(|repo| tree_of(&repo, commit))
            .map_err(|e| e.to_string())?;
        stage_text(provider, id, &tree).await
    }
}

async fn stage_bundle(
    provider: &dyn Provider,
    id: &NativeId,
    bundle: &Path,
    commit: &str,
) -> Result<(), Failure> {
    let bytes =
        std::fs::read(bundle).map_err(|e| format!("cannot read {}: {e}", bundle.display()))?;
    provider
        .require_files()
        .map_err(|e| e.to_string())?
        .write(id, ".berth-input.bundle", &bytes)
        .await
        .map_err(|e| Failure::of("staging: cannot write the input bundle", e))?;
    let req = ExecRequest::shell(STAGE_SCRIPT)
        .with_env("BERTH_COMMIT", commit)
        .with_timeout(Duration::from_secs(600));
    run(provider, id, req, "staging").await
}

/// Runs one staging command; its failure in words.
async fn run(
    provider: &dyn Provider,
    id: &NativeId,
    req: ExecRequest,
    what: &str,
) -> Result<(), Failure> {
    let out = provider
        .exec(id, &req)
        .await
        .map_err(|e| Failure::of(format_args!("{what} could not run"), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            out.status,
            tail(out.stderr.as_deref().unwrap_or_default()).trim()
        )
        .into())
    }
}

/// Text staging of `tree`, then the check that the sandbox holds exactly that tree.
async fn stage_text(provider: &dyn Provider, id: &NativeId, tree: &Capture) -> Result<(), Failure> {
    let archive = tar_of(tree).map_err(|e| format!("cannot build the input archive: {e}"))?;
    if archive.len() > TEXT_LIMIT {
        return Err(format!(
            "the repository's tree is {} KiB as an archive; this provider's text transport \
             carries at most {} KiB",
            archive.len() >> 10,
            TEXT_LIMIT >> 10
        )
        .into());
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(&archive);
    let timeout = Duration::from_secs(120);
    run(
        provider,
        id,
        ExecRequest::shell(TEXT_BEGIN_SCRIPT).with_timeout(timeout),
        "staging",
    )
    .await?;
    // Base64 is ASCII: splitting it anywhere keeps every chunk a valid string.
    for chunk in encoded.as_bytes().chunks(CHUNK) {
        let chunk = std::str::from_utf8(chunk).expect("base64 is ASCII");
        let req = ExecRequest::shell(TEXT_CHUNK_SCRIPT)
            .with_env("BERTH_CHUNK", chunk)
            .with_timeout(timeout);
        run(provider, id, req, "staging").await?;
    }
    run(
        provider,
        id,
        ExecRequest::shell(TEXT_UNPACK_SCRIPT).with_timeout(Duration::from_secs(600)),
        "staging",
    )
    .await?;
    let staged = read_tree(provider, id).await?;
    let changed = differences(tree, &staged);
    if changed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "staging failed: the sandbox did not keep the repository's tree exactly ({} of {} \
             files differ: {}); this provider's filesystem does not keep them as they are",
            changed.len(),
            tree.files.len(),
            shown(&changed)
        )
        .into())
    }
}

fn shown(changed: &[String]) -> String {
    let mut text = changed
        .iter()
        .take(5)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if changed.len() > 5 {
        text.push_str(&format!("; and {} more", changed.len() - 5));
    }
    text
}

/// Reads `repo/` back by the text transport, parsed with capture's strict rules.
pub(crate) async fn read_tree(provider: &dyn Provider, id: &NativeId) -> Result<Capture, Failure> {
    let encoded = read_encoded(provider, id).await?;
    let archive = decode(&encoded)?;
    Ok(capture::parse(&archive)?)
}

/// The workspace's archive, base64, from the text capture script.
async fn read_encoded(provider: &dyn Provider, id: &NativeId) -> Result<Vec<u8>, Failure> {
    let out = in_workspace(
        provider,
        id,
        TEXT_CAPTURE_SCRIPT,
        berth_contract::DEFAULT_MAX_OUTPUT_BYTES,
        "read",
    )
    .await?;
    if out.stdout_truncated() {
        return Err(format!(
            "the workspace is larger than this provider's text transport carries ({} KiB as an \
             archive at most)",
            TEXT_LIMIT >> 10
        )
        .into());
    }
    Ok(out.stdout)
}

/// Runs a capture script in `repo/`; its output, or why the workspace could not be `what`.
async fn in_workspace(
    provider: &dyn Provider,
    id: &NativeId,
    script: &str,
    max_output_bytes: usize,
    what: &str,
) -> Result<berth_contract::ExecOutput, Failure> {
    let mut req = ExecRequest::shell(script)
        .with_cwd("repo")
        .with_timeout(Duration::from_secs(600));
    req.max_output_bytes = max_output_bytes;
    let out = provider
        .exec(id, &req)
        .await
        .map_err(|e| Failure::of(format_args!("the workspace could not be {what}"), e))?;
    if !out.status.success() {
        return Err(format!(
            "the workspace could not be {what} ({}): {}",
            out.status,
            tail(out.stderr.as_deref().unwrap_or_default()).trim()
        )
        .into());
    }
    Ok(out)
}

/// Base64 from the sandbox (hostile: anything but base64 and whitespace is refused).
fn decode(encoded: &[u8]) -> Result<Vec<u8>, String> {
    let trimmed: Vec<u8> = encoded
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(&trimmed)
        .map_err(|e| format!("the workspace did not come back as base64: {e}"))
}

/// Captures the agent's workspace: its archive as capture parses it.
pub(crate) async fn capture_workspace(
    provider: &dyn Provider,
    id: &NativeId,
) -> Result<Capture, Failure> {
    if !carries_bytes(provider) {
        return read_tree(provider, id).await;
    }
    let out = in_workspace(
        provider,
        id,
        capture::SCRIPT,
        capture::LIMIT + 1,
        "captured",
    )
    .await?;
    let mut capture = capture::parse(&out.stdout)?;
    capture.skipped.extend(capture::sandbox_warnings(
        out.stderr.as_deref().unwrap_or_default(),
    ));
    Ok(capture)
}

/// Whether the validator's evidence file `evidence` (relative to `repo/`) exists. Absent, not a
/// regular file or a path the provider refuses is no evidence; a provider that cannot say for
/// now stops the run (absence is not assumed).
pub(crate) async fn evidence_present(
    provider: &dyn Provider,
    id: &NativeId,
    evidence: &str,
) -> Result<bool, Failure> {
    let found = match provider.files() {
        Some(files) => files
            .read(id, &format!("repo/{evidence}"))
            .await
            .map(|_| true),
        None => {
            let req = ExecRequest::shell(TEXT_EVIDENCE_SCRIPT)
                .with_cwd("repo")
                .with_env("BERTH_EVIDENCE", evidence)
                .with_timeout(Duration::from_secs(60));
            provider
                .exec(id, &req)
                .await
                .map(|out| out.status.success())
        }
    };
    match found {
        Ok(present) => Ok(present),
        Err(source) if source.retryable() => Err(Failure::Retry {
            doing: format!("checking the validator's evidence `{evidence}`"),
            source,
        }),
        Err(_) => Ok(false),
    }
}

/// The tree of `commit` in Berth's repository `repo`: every file with its mode, read from git's
/// objects — no checkout, so no attributes, filters or export rules of the repository apply.
/// Submodules (gitlinks) are not files and are left out, as a capture leaves them out.
pub(crate) fn tree_of(repo: &Path, commit: &str) -> Result<Capture, OrchestratorError> {
    let listing = git_with_input(
        repo,
        Transport::None,
        &["ls-tree", "-r", "-z", "-l", "--full-tree", commit],
        None,
    )?;
    let mut entries = Vec::new();
    let mut total = 0usize;
    for record in listing.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let bad = || {
            OrchestratorError::Repository(format!(
                "unexpected git ls-tree output: {}",
                String::from_utf8_lossy(record).escape_debug()
            ))
        };
        let tab = record.iter().position(|b| *b == b'\t').ok_or_else(bad)?;
        let (meta, path) = (&record[..tab], &record[tab + 1..]);
        let meta = std::str::from_utf8(meta).map_err(|_| bad())?;
        let fields: Vec<&str> = meta.split_whitespace().collect();
        let [mode, kind, object, size] = fields[..] else {
            return Err(bad());
        };
        let mode = match (mode, kind) {
            ("100644", "blob") => "100644",
            ("100755", "blob") => "100755",
            ("120000", "blob") => "120000",
            (_, "commit") => continue,
            _ => return Err(bad()),
        };
        total += size.parse::<usize>().map_err(|_| bad())?;
        if total > TEXT_LIMIT {
            return Err(OrchestratorError::Repository(format!(
                "the repository's tree is larger than this provider's text transport carries \
                 ({} KiB)",
                TEXT_LIMIT >> 10
            )));
        }
        entries.push((path.to_vec(), mode, object.to_owned()));
    }
    let request: String = entries.iter().map(|(_, _, o)| format!("{o}\n")).collect();
    let objects = git_with_input(
        repo,
        Transport::None,
        &["cat-file", "--batch"],
        Some(request.as_bytes()),
    )?;
    let mut reader = &objects[..];
    let mut tree = Capture::default();
    for (path, mode, object) in entries {
        let data = next_object(&mut reader, &object)?;
        tree.files.insert(path, CapturedFile { mode, data });
    }
    Ok(tree)
}

/// One `<oid> blob <size>\n<bytes>\n` record of `git cat-file --batch`.
fn next_object(reader: &mut &[u8], object: &str) -> Result<Vec<u8>, OrchestratorError> {
    let bad = || OrchestratorError::Repository(format!("git cat-file did not return {object}"));
    let newline = reader.iter().position(|b| *b == b'\n').ok_or_else(bad)?;
    let header = std::str::from_utf8(&reader[..newline]).map_err(|_| bad())?;
    let mut fields = header.split(' ');
    if fields.next() != Some(object) || fields.next() != Some("blob") {
        return Err(bad());
    }
    let size: usize = fields.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    *reader = &reader[newline + 1..];
    let mut data = vec![0; size];
    reader.read_exact(&mut data).map_err(|_| bad())?;
    let mut end = [0u8; 1];
    reader.read_exact(&mut end).map_err(|_| bad())?;
    Ok(data)
}

/// `tree` as a tar archive: regular files 0644 or 0755, symlinks, fixed owner and time.
pub(crate) fn tar_of(tree: &Capture) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, file) in &tree.files {
        let path = Path::new(std::ffi::OsStr::from_bytes(path));
        let mut header = tar::Header::new_gnu();
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        if file.mode == "120000" {
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_mode(0o777);
            header.set_size(0);
            let target = Path::new(std::ffi::OsStr::from_bytes(&file.data));
            builder.append_link(&mut header, path, target)?;
        } else {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(if file.mode == "100755" { 0o755 } else { 0o644 });
            header.set_size(file.data.len() as u64);
            builder.append_data(&mut header, path, &file.data[..])?;
        }
    }
    builder.into_inner()
}

/// What differs between the tree staged and the tree read back, one line per file.
pub(crate) fn differences(expected: &Capture, found: &Capture) -> Vec<String> {
    let name = |path: &[u8]| format!("`{}`", String::from_utf8_lossy(path).escape_debug());
    let mut changed = Vec::new();
    for (path, want) in &expected.files {
        match found.files.get(path) {
            None => changed.push(format!("{} missing", name(path))),
            Some(got) if got.mode != want.mode => changed.push(format!(
                "{} mode {} became {}",
                name(path),
                want.mode,
                got.mode
            )),
            Some(got) if got.data != want.data => {
                changed.push(format!("{} content changed", name(path)))
            }
            Some(_) => {}
        }
    }
    for path in found.files.keys() {
        if !expected.files.contains_key(path) {
            changed.push(format!("{} appeared", name(path)));
        }
    }
    for skipped in &found.skipped {
        changed.push(format!("read back unusable: {skipped}"));
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// The tree comes from git's objects: a repository's export rules (`export-ignore`,
    /// `export-subst`) change nothing, modes and symlinks are kept, and the archive built from
    /// it parses back (with capture's own rules) to the same tree, long paths included.
    #[test]
    fn the_staged_tree_is_the_commit_s_objects_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        git(repo, &["init", "-q"]);
        std::fs::write(
            repo.join(".gitattributes"),
            "hidden.txt export-ignore\nsubst.txt export-subst\n",
        )
        .unwrap();
        std::fs::write(repo.join("hidden.txt"), "kept\n").unwrap();
        std::fs::write(repo.join("subst.txt"), "$Format:%H$\n").unwrap();
        let long = format!("{}/{}", "d".repeat(80), "f".repeat(120));
        std::fs::create_dir_all(repo.join(&long).parent().unwrap()).unwrap();
        std::fs::write(repo.join(&long), [0u8, 255, 10, 13]).unwrap();
        std::fs::write(repo.join("run.sh"), "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(repo.join("run.sh"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::os::unix::fs::symlink("hidden.txt", repo.join("link")).unwrap();
        git(repo, &["add", "-A"]);
        git(repo, &["commit", "-qm", "c"]);
        let commit = git(repo, &["rev-parse", "HEAD"]);

        let tree = tree_of(repo, &commit).unwrap();
        let file = |p: &str| tree.files.get(p.as_bytes()).unwrap();
        assert_eq!(file("hidden.txt").data, b"kept\n");
        assert_eq!(file("subst.txt").data, b"$Format:%H$\n");
        assert_eq!(file("run.sh").mode, "100755");
        assert_eq!(
            (file("link").mode, &file("link").data[..]),
            ("120000", &b"hidden.txt"[..])
        );
        assert_eq!(file(&long).data, [0u8, 255, 10, 13]);
        assert_eq!(tree.files.len(), 6);

        let back = capture::parse(&tar_of(&tree).unwrap()).unwrap();
        assert!(
            differences(&tree, &back).is_empty(),
            "{:?}",
            differences(&tree, &back)
        );
    }

    #[test]
    fn differences_name_every_file_that_changed() {
        let file = |mode, data: &[u8]| CapturedFile {
            mode,
            data: data.to_vec(),
        };
        let mut staged = Capture::default();
        staged.files.insert(b"same".to_vec(), file("100644", b"x"));
        staged.files.insert(b"text".to_vec(), file("100644", b"a"));
        staged
            .files
            .insert(b"link".to_vec(), file("120000", b"same"));
        staged.files.insert(b"gone".to_vec(), file("100644", b""));
        let mut back = Capture::default();
        back.files.insert(b"same".to_vec(), file("100644", b"x"));
        back.files.insert(b"text".to_vec(), file("100644", b"b"));
        back.files.insert(b"link".to_vec(), file("100644", b"x"));
        back.files.insert(b"new".to_vec(), file("100644", b""));
        back.skipped
            .push("dev: Char entries are not committed".into());
        let changed = differences(&staged, &back);
        assert_eq!(
            changed,
            [
                "`gone` missing",
                "`link` mode 120000 became 100644",
                "`text` content changed",
                "`new` appeared",
                "read back unusable: dev: Char entries are not committed",
            ]
        );
        assert!(differences(&staged, &staged).is_empty());
    }

    /// What comes back from a sandbox is hostile: only base64 (and line breaks) decodes.
    #[test]
    fn only_base64_comes_back() {
        assert_eq!(decode(b"aGk=\n").unwrap(), b"hi");
        assert_eq!(decode(b"aG\nk=").unwrap(), b"hi");
        assert!(decode(b"aGk=;rm -rf /").is_err());
        assert!(decode(&[0xff, 0xfe]).is_err());
    }
}
