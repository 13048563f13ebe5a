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
//! reports as a start-up failure, never as the command's exit code.

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

/// Runs the helper (see the module docs); returns only on failure.
pub fn run(args: &[OsString]) -> i32 {
    let [uid, gid, workspace, mountpoint, dashes, program, rest @ ..] = args else {
        return fail("usage", "UID GID WORKSPACE MOUNTPOINT -- PROGRAM ARGS…");
    };
    if dashes != "--" {
        return fail("usage", "expected `--` before the program");
    }
    let (Some(uid), Some(gid)) = (
        uid.to_str().and_then(|u| u.parse::<u32>().ok()),
        gid.to_str().and_then(|g| g.parse::<u32>().ok()),
    ) else {
        return fail("usage", "UID and GID must be numbers");
    };
    if uid == 0 || gid == 0 {
        return fail("usage", "refusing to enter as root");
    }
    if let Err(err) = unshare(CloneFlags::CLONE_NEWNS) {
        return fail("new mount namespace", err);
    }
    // Nothing mounted from here on propagates back to the host.
    if let Err(err) = mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    ) {
        return fail("make mounts private", err);
    }
    if let Err(err) = mount(
        Some(workspace.as_os_str()),
        mountpoint.as_os_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    ) {
        return fail("bind the workspace", err);
    }
    if let Err(err) = mount(
        None::<&str>,
        mountpoint.as_os_str(),
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    ) {
        return fail("make the workspace nosuid,nodev", err);
    }
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    if let Err(err) = setgroups(&[]) {
        return fail("drop supplementary groups", err);
    }
    if let Err(err) = setresgid(gid, gid, gid) {
        return fail("set group ids", err);
    }
    // Leaving uid 0 for all three ids clears every capability set.
    if let Err(err) = setresuid(uid, uid, uid) {
        return fail("set user ids", err);
    }
    let err = Command::new(program).args(rest).exec();
    fail(&format!("start {}", program.to_string_lossy()), err)
}
