//! Entering a bwrap sandbox as an unprivileged user when Berth runs as root.
//!
//! Run as root, bubblewrap maps the sandbox's user to root: files it writes are root's, and a
//! kernel escape lands as root. So as root Berth starts bwrap through this helper instead: it
//! makes a private mount namespace, binds the workspace (`nosuid,nodev`) onto a directory any
//! user can reach — the workspace's own parents (`/root`, a 0700 temp dir) may not be — drops
//! every group, then sets real, effective and saved ids to an unprivileged user (dropping all
//! capabilities) and executes bwrap. bwrap then builds its user namespace from that user: the
//! sandbox's ids map to it, never to root.
//!
//! `PROGRAM __enter UID GID WORKSPACE MOUNTPOINT -- BWRAP ARGS…`. Its own failures are printed
//! as `bwrap: cannot enter the sandbox: …` with exit code 1, which the bwrap adapter already
//! reports as a start-up failure, never as the command's exit code. Under the per-exec reaper
//! the same entry is made by the reaper itself (`__reap_enter`, see [`crate::reaper`]).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};

/// The argument that selects this mode in the binaries that embed it.
pub const ENTER_ARG: &str = "__enter";

fn fail(what: &str, err: impl std::fmt::Display) -> i32 {
    eprintln!("bwrap: cannot enter the sandbox: {what}: {err}");
    1
}

/// A parsed `UID GID WORKSPACE MOUNTPOINT -- PROGRAM ARGS…`: who to become, what to bind, and
/// what to run then.
#[derive(Debug, Clone)]
pub struct Entry {
    uid: Uid,
    gid: Gid,
    workspace: OsString,
    mountpoint: OsString,
    /// The program to run once entered (bwrap).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

impl Entry {
    /// Parses the helper's arguments; refuses root as the user to become.
    pub fn parse(args: &[OsString]) -> Result<Entry, String> {
        let [uid, gid, workspace, mountpoint, dashes, program, rest @ ..] = args else {
            return Err("UID GID WORKSPACE MOUNTPOINT -- PROGRAM ARGS…".into());
        };
        if dashes != "--" {
            return Err("expected `--` before the program".into());
        }
        let (Some(uid), Some(gid)) = (
            uid.to_str().and_then(|u| u.parse::<u32>().ok()),
            gid.to_str().and_then(|g| g.parse::<u32>().ok()),
        ) else {
            return Err("UID and GID must be numbers".into());
        };
        if uid == 0 || gid == 0 {
            return Err("refusing to enter as root".into());
        }
        Ok(Entry {
            uid: Uid::from_raw(uid),
            gid: Gid::from_raw(gid),
            workspace: workspace.clone(),
            mountpoint: mountpoint.clone(),
            program: program.clone(),
            args: rest.to_vec(),
        })
    }

    /// Enters, in this process: a private mount namespace with the workspace bound
    /// (`nosuid,nodev`) at the mount point, no supplementary groups, and real, effective and
    /// saved ids of the unprivileged user (which clears every capability set). On failure,
    /// which step failed and why.
    pub fn enter(&self) -> Result<(), (&'static str, nix::errno::Errno)> {
        unshare(CloneFlags::CLONE_NEWNS).map_err(|e| ("new mount namespace", e))?;
        // Nothing mounted from here on propagates back to the host.
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(|e| ("make mounts private", e))?;
        mount(
            Some(self.workspace.as_os_str()),
            self.mountpoint.as_os_str(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| ("bind the workspace", e))?;
        mount(
            None::<&str>,
            self.mountpoint.as_os_str(),
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            None::<&str>,
        )
        .map_err(|e| ("make the workspace nosuid,nodev", e))?;
        setgroups(&[]).map_err(|e| ("drop supplementary groups", e))?;
        setresgid(self.gid, self.gid, self.gid).map_err(|e| ("set group ids", e))?;
        // Leaving uid 0 for all three ids clears every capability set.
        setresuid(self.uid, self.uid, self.uid).map_err(|e| ("set user ids", e))?;
        Ok(())
    }
}

/// Runs the helper (see the module docs); returns only on failure.
pub fn run(args: &[OsString]) -> i32 {
    let entry = match Entry::parse(args) {
        Ok(entry) => entry,
        Err(usage) => return fail("usage", usage),
    };
    if let Err((what, err)) = entry.enter() {
        return fail(what, err);
    }
    let err = Command::new(&entry.program).args(&entry.args).exec();
    fail(&format!("start {}", entry.program.to_string_lossy()), err)
}
