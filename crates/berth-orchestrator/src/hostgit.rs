//! Git on the host, hardened: only in repositories Berth created, never running a
//! repository's hooks, fsmonitor or config.

use std::io::Write;
use std::path::Path;

use crate::OrchestratorError;

/// The transports a git command on the host may use: none, unless a step names one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Transport<'a> {
    None,
    /// The scheme of the mission's repository URL (`file`, `https`, `ssh`, …).
    Scheme(&'a str),
}

/// The transport a repository URL needs; `None` for a scheme missions do not fetch over.
pub(crate) fn scheme_of(url: &str) -> Option<&'static str> {
    let lower = url.to_ascii_lowercase();
    for (prefix, scheme) in [
        ("file://", "file"),
        ("https://", "https"),
        ("http://", "http"),
        ("ssh://", "ssh"),
        ("git://", "git"),
    ] {
        if lower.starts_with(prefix) {
            return Some(scheme);
        }
    }
    // scp-like `user@host:path`
    let (before, _) = url.split_once(':')?;
    (!before.is_empty() && !before.contains('/') && !url.contains("::")).then_some("ssh")
}

/// Runs git on the host, hardened: repositories come from anyone, so no system or global
/// config, no hooks (`core.hooksPath=/dev/null`), no fsmonitor, no prompts, and no transport
/// except the one the step names (`protocol.allow=never` otherwise). Berth only ever runs it
/// in repositories it created; user paths and URLs come after `--`.
pub(crate) fn git(dir: &Path, args: &[&str]) -> Result<String, OrchestratorError> {
    git_over(dir, Transport::None, args)
}

pub(crate) fn git_over(
    dir: &Path,
    transport: Transport<'_>,
    args: &[&str],
) -> Result<String, OrchestratorError> {
    let out = git_with_input(dir, transport, args, None)?;
    Ok(String::from_utf8_lossy(&out).trim().to_owned())
}

/// Runs hardened git with `input` on its stdin (none: stdin is closed); returns its stdout.
pub(crate) fn git_with_input(
    dir: &Path,
    transport: Transport<'_>,
    args: &[&str],
    input: Option<&[u8]>,
) -> Result<Vec<u8>, OrchestratorError> {
    spawn_git(dir, transport, args, input)?.finish()
}

/// Git's absolute path, found once on this process's `PATH` (absolute entries only; the
/// first regular, executable `git`). A command whose environment sets `PATH` and whose program
/// is a bare name is started with `fork` (the standard library must search the new `PATH`
/// itself): for a process the size of `berth` that copy cost more than the rest of the spawn.
/// Named by its path, git is started with `posix_spawn`. Not found: the bare name, whose
/// start then fails as it always did.
fn git_program() -> &'static std::ffi::OsStr {
    static GIT: std::sync::OnceLock<std::ffi::OsString> = std::sync::OnceLock::new();
    GIT.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .filter(|dir| dir.is_absolute())
            .map(|dir| dir.join("git"))
            .find(|git| {
                std::fs::metadata(git)
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
            .map_or_else(|| "git".into(), Into::into)
    })
}

/// A hardened git process started by [`spawn_git`], running beside the caller until
/// [`RunningGit::finish`].
pub(crate) struct RunningGit {
    child: std::process::Child,
    feeder: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    what: String,
}

/// Starts hardened git (see [`git_over`]) and returns without waiting for it, so independent
/// git work on Berth's own repository can run at once.
pub(crate) fn spawn_git(
    dir: &Path,
    transport: Transport<'_>,
    args: &[&str],
    input: Option<&[u8]>,
) -> Result<RunningGit, OrchestratorError> {
    let mut cmd = std::process::Command::new(git_program());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", "/nonexistent")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
            // Berth's own repositories are short-lived and small: no background maintenance
            // process after a step, and an import is kept as one pack (not unpacked into loose
            // objects by a second process).
            "-c",
            "maintenance.auto=false",
            "-c",
            "gc.auto=0",
            "-c",
            "fastimport.unpackLimit=1",
        ])
        .args(["-c", "protocol.allow=never"]);
    if let Transport::Scheme(scheme) = transport {
        cmd.arg("-c").arg(format!("protocol.{scheme}.allow=always"));
    }
    cmd.arg("-C")
        .arg(dir)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdin(match input {
            Some(_) => std::process::Stdio::piped(),
            None => std::process::Stdio::null(),
        });
    let mut child = cmd.spawn().map_err(cannot_run)?;
    // stdin is written from another thread so a large input cannot deadlock against output.
    let feeder = match (input, child.stdin.take()) {
        (Some(bytes), Some(mut stdin)) => {
            let bytes = bytes.to_vec();
            Some(std::thread::spawn(move || stdin.write_all(&bytes)))
        }
        _ => None,
    };
    Ok(RunningGit {
        child,
        feeder,
        what: format!("git {} in {}", args.join(" "), dir.display()),
    })
}

fn cannot_run(e: std::io::Error) -> OrchestratorError {
    OrchestratorError::Repository(format!("cannot run git: {e}"))
}

impl RunningGit {
    /// Waits for the process; its stdout, or its failure with its stderr.
    pub(crate) fn finish(self) -> Result<Vec<u8>, OrchestratorError> {
        let out = self.child.wait_with_output().map_err(cannot_run)?;
        if let Some(feeder) = self.feeder {
            let _ = feeder.join();
        }
        if !out.status.success() {
            return Err(OrchestratorError::Repository(format!(
                "{}: {}",
                self.what,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(out.stdout)
    }
}

/// Copies a source tree, never a `.git` entry of any type or case (a `.git` *file* —
/// `gitdir: …`, a worktree — would make the copy's repository someone else's, hooks and config
/// included). Symlinks are copied as links (never followed); fifos, sockets and devices are
/// left out (a fifo would block the copy forever).
pub(crate) fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry
            .file_name()
            .as_encoded_bytes()
            .eq_ignore_ascii_case(b".git")
        {
            continue;
        }
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Git is started by its absolute path (so with `posix_spawn`, not a `fork` of Berth), the
    /// same git a `PATH` search finds, and it runs.
    #[test]
    fn git_is_named_by_the_path_a_search_finds() {
        let program = Path::new(git_program());
        assert!(program.is_absolute(), "{}", program.display());
        let which = std::process::Command::new("sh")
            .args(["-c", "command -v git"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&which.stdout).trim(),
            program.to_str().unwrap()
        );
        let dir = tempfile::tempdir().unwrap();
        let version = git(dir.path(), &["--version"]).unwrap();
        assert!(version.starts_with("git version"), "{version}");
    }
}
