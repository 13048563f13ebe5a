//! Resolving a sandbox path without leaving the workspace.
//!
//! Rule: a host sandbox path is relative to the workspace (an absolute path is accepted only
//! when it already lies inside the workspace). `..` is refused outright. Every existing
//! component is checked with `lstat`; a symlink is followed only if its target stays inside
//! the workspace. The check and the later open are not atomic: a process running in the same
//! sandbox could swap a component in between. The host provider isolates nothing, and its
//! manifest says so; this guards Berth's own file API against mistakes and hostile paths.

use std::io;
use std::path::{Component, Path, PathBuf};

use berth_contract::{ErrorKind, ProviderError, Result};

use crate::classify::io_error;
use crate::PROVIDER_ID;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every component must exist.
    Existing,
    /// Missing parent directories are created; the last component may be missing.
    CreateParents,
}

fn escape(path: &str, why: &str) -> ProviderError {
    ProviderError::new(
        ErrorKind::InvalidRequest,
        PROVIDER_ID,
        format!("path `{path}` {why}; host sandbox paths are relative to the workspace"),
    )
}

/// Resolves `path` inside `workspace`, returning a real path inside it.
pub(crate) fn resolve(workspace: &Path, path: &str, mode: Mode) -> Result<PathBuf> {
    if path.contains('\0') {
        return Err(escape(path, "contains a NUL byte"));
    }
    let root = workspace
        .canonicalize()
        .map_err(|e| io_error("resolve workspace", e))?;
    let requested = Path::new(path);
    let relative = if requested.is_absolute() {
        requested
            .strip_prefix(&root)
            .or_else(|_| requested.strip_prefix(workspace))
            .map_err(|_| escape(path, "is absolute and outside the workspace"))?
    } else {
        requested
    };
    let components: Vec<Component<'_>> = relative.components().collect();
    if components.contains(&Component::ParentDir) {
        return Err(escape(path, "contains `..`"));
    }
    let mut current = root.clone();
    for (index, component) in components.iter().enumerate() {
        let last = index + 1 == components.len();
        match component {
            Component::CurDir => continue,
            Component::ParentDir => return Err(escape(path, "contains `..`")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(escape(path, "is absolute and outside the workspace"))
            }
            Component::Normal(part) => {
                let next = current.join(part);
                match std::fs::symlink_metadata(&next) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        let target = match next.canonicalize() {
                            Ok(target) => target,
                            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                                return Err(escape(path, "goes through a dangling symlink"))
                            }
                            Err(err) => return Err(io_error("resolve symlink", err)),
                        };
                        if !target.starts_with(&root) {
                            return Err(escape(path, "goes through a symlink that leads outside"));
                        }
                        current = target;
                    }
                    Ok(_) => current = next,
                    Err(err) if err.kind() == io::ErrorKind::NotFound => match mode {
                        Mode::CreateParents if last => current = next,
                        Mode::CreateParents => {
                            std::fs::create_dir(&next)
                                .map_err(|e| io_error("create parent directory", e))?;
                            current = next;
                        }
                        Mode::Existing => {
                            return Err(ProviderError::new(
                                ErrorKind::NotFound,
                                PROVIDER_ID,
                                format!("`{path}` does not exist in the workspace"),
                            ))
                        }
                    },
                    Err(err) => return Err(io_error("inspect path", err)),
                }
            }
        }
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn workspace() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        (dir, ws)
    }

    #[test]
    fn plain_relative_paths_resolve_inside() {
        let (_dir, ws) = workspace();
        let got = resolve(&ws, "a/b/c.txt", Mode::CreateParents).unwrap();
        assert_eq!(got, ws.canonicalize().unwrap().join("a/b/c.txt"));
        assert!(ws.join("a/b").is_dir());
        assert_eq!(
            resolve(&ws, ".", Mode::Existing).unwrap(),
            ws.canonicalize().unwrap()
        );
    }

    #[test]
    fn dot_dot_is_refused_even_when_it_would_stay_inside() {
        let (_dir, ws) = workspace();
        std::fs::create_dir(ws.join("a")).unwrap();
        for path in ["../x", "a/../../x", "a/../b"] {
            let err = resolve(&ws, path, Mode::CreateParents).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest);
            assert!(err.to_string().contains("contains `..`"), "{err}");
        }
    }

    #[test]
    fn absolute_outside_is_refused_inside_is_accepted() {
        let (_dir, ws) = workspace();
        let err = resolve(&ws, "/etc/passwd", Mode::Existing).unwrap_err();
        assert!(err.to_string().contains("absolute and outside"), "{err}");
        std::fs::write(ws.join("f"), b"x").unwrap();
        let inside = ws.join("f");
        assert!(resolve(&ws, inside.to_str().unwrap(), Mode::Existing).is_ok());
    }

    #[test]
    fn symlink_escapes_are_refused() {
        let (dir, ws) = workspace();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"s").unwrap();
        symlink(&outside, ws.join("link-dir")).unwrap();
        symlink(outside.join("secret"), ws.join("link-file")).unwrap();
        symlink("/nonexistent/target", ws.join("dangling")).unwrap();
        for path in ["link-dir/secret", "link-file", "link-dir/new.txt"] {
            let err = resolve(&ws, path, Mode::CreateParents).unwrap_err();
            assert!(err.to_string().contains("leads outside"), "{path}: {err}");
        }
        let err = resolve(&ws, "dangling", Mode::CreateParents).unwrap_err();
        assert!(err.to_string().contains("dangling symlink"), "{err}");
        assert!(!outside.join("new.txt").exists());
    }

    #[test]
    fn symlinks_inside_are_followed() {
        let (_dir, ws) = workspace();
        std::fs::create_dir(ws.join("real")).unwrap();
        symlink("real", ws.join("alias")).unwrap();
        let got = resolve(&ws, "alias/file", Mode::CreateParents).unwrap();
        assert_eq!(got, ws.canonicalize().unwrap().join("real/file"));
    }

    #[test]
    fn missing_path_is_not_found() {
        let (_dir, ws) = workspace();
        let err = resolve(&ws, "nope/file", Mode::Existing).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
    }
}
