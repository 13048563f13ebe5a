//! The `bwrap` provider: each exec is one bubblewrap invocation over the sandbox's workspace.
//!
//! The sandbox sees the host's `/usr` (and the few `/etc` files programs need) read-only, its
//! workspace read-write at `/workspace`, and private `/tmp`, `/proc` and `/dev`. It runs in new
//! user, pid, ipc, uts and cgroup namespaces, and a new network namespace (loopback only) unless
//! the sandbox was created with network access. The environment is cleared. bwrap dies with
//! Berth (`--die-with-parent`), and bwrap's own init is pid 1 of the new pid namespace and exits
//! with the command, so the kernel kills every other process of the exec then: processes never
//! outlive an exec, and the manifest says so (detached exec is unsupported). bwrap itself
//! reports the command's exit before that killing is over, so each exec also runs under Berth's
//! per-exec reaper, which answers only once the namespace is empty.
//!
//! Environment values reach the command through bwrap's own (scrubbed) environment, never its
//! argv, so they are not visible in `/proc/*/cmdline`.

use std::path::{Path, PathBuf};

use berth_contract::{Command, ErrorKind, NetworkMode, ProviderError, Result};
use berth_local::{Finished, LaunchContext, Launcher, LocalProvider};

pub use berth_local::LocalConfig as BwrapConfig;

/// The provider id.
pub const PROVIDER_ID: &str = "bwrap";

/// Where the workspace appears inside the sandbox.
pub const WORKSPACE: &str = "/workspace";

/// Starts commands inside bubblewrap.
#[derive(Debug, Clone)]
pub struct Bwrap {
    program: PathBuf,
    /// When Berth runs as root: the helper that enters the sandbox as [`SANDBOX_USER`] (see
    /// `berth_supervisor::enter`), run as `HELPER __enter …`.
    enter: Option<PathBuf>,
    /// The helper binary (`berth` or `berth-supervisor`), which also starts `berth ssh`'s
    /// terminal sessions (`__pty`).
    helper: Option<PathBuf>,
}

/// The unprivileged user (and group) bwrap sandboxes run as when Berth runs as root, so that
/// the sandbox's ids never map to root: `nobody`.
pub const SANDBOX_USER: u32 = 65534;

/// Where the helper binds the workspace in its private mount namespace, for bwrap (running as
/// [`SANDBOX_USER`]) to reach it whatever the permissions of the workspace's parents.
const ENTRY_MOUNT: &str = "/mnt";

/// `/etc` entries bound read-only when present: what dynamic linking, TLS and user lookup need.
/// `/etc/shadow` and everything else stay out.
const ETC_ALWAYS: &[&str] = &[
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
];
/// Bound only when the sandbox has network access.
const ETC_NETWORK: &[&str] = &["/etc/resolv.conf", "/etc/hosts"];

impl Bwrap {
    /// bwrap found in the usual places, run directly as whoever calls it (no unprivileged
    /// entry even as root): the baseline benchmarks compare Berth against.
    pub fn direct() -> Result<Bwrap> {
        Self::find(None)
    }

    /// Finds `bwrap` in the usual places. As root, `helper` (a program that understands
    /// `__enter`: `berth` or `berth-supervisor`) is required: bwrap is never run as root.
    pub fn locate(helper: Option<PathBuf>) -> Result<Bwrap> {
        let terminal_helper = helper.clone();
        let enter = if rustix::process::geteuid().is_root() {
            let helper = helper.ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::Setup,
                    PROVIDER_ID,
                    "running as root, bwrap sandboxes are entered as an unprivileged user \
                     through Berth's helper, and none is configured (run through `berth`, or \
                     set BERTH_SUPERVISOR)",
                )
            })?;
            if !Path::new(ENTRY_MOUNT).is_dir() {
                return Err(ProviderError::new(
                    ErrorKind::Setup,
                    PROVIDER_ID,
                    format!("{ENTRY_MOUNT} does not exist; the root helper binds workspaces there"),
                ));
            }
            Some(helper)
        } else {
            None
        };
        let mut bwrap = Self::find(enter)?;
        bwrap.helper = terminal_helper;
        Ok(bwrap)
    }

    /// The bwrap binary this launcher runs (benchmarks run the same one).
    pub fn program(&self) -> &Path {
        &self.program
    }

    fn find(enter: Option<PathBuf>) -> Result<Bwrap> {
        let on_path = std::env::var_os("PATH")
            .map(|path| {
                std::env::split_paths(&path)
                    .filter(|dir| dir.is_absolute())
                    .map(|dir| dir.join("bwrap"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        ["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"]
            .iter()
            .map(PathBuf::from)
            .chain(on_path)
            .find(|p| p.is_file())
            .map(|program| Bwrap {
                program,
                enter,
                helper: None,
            })
            .ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::Setup,
                    PROVIDER_ID,
                    "bubblewrap is not installed (no bwrap in /usr/bin, /usr/local/bin, /bin or \
                     on PATH); install the `bubblewrap` package",
                )
            })
    }

    /// The bwrap arguments up to (not including) the command.
    pub fn arguments(&self, ctx: &LaunchContext<'_>) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| args.extend(items.iter().map(|s| s.to_string()));
        push(&["--ro-bind", "/usr", "/usr"]);
        for dir in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            if Path::new("/usr").join(dir).exists() {
                push(&["--symlink", &format!("usr/{dir}"), &format!("/{dir}")]);
            }
        }
        // bwrap has no network of its own to give: `host` shares the host's (loopback
        // services included); anything else gets a private, empty network namespace.
        let network = ctx.network == NetworkMode::Host;
        for etc in ETC_ALWAYS
            .iter()
            .chain(if network { ETC_NETWORK } else { &[] })
        {
            push(&["--ro-bind-try", etc, etc]);
        }
        push(&["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
        // As root, the helper has bound the workspace at ENTRY_MOUNT for bwrap to reach.
        let workspace = match self.enter {
            Some(_) => ENTRY_MOUNT.into(),
            None => ctx.workspace.to_string_lossy(),
        };
        push(&[
            "--bind",
            &workspace,
            WORKSPACE,
            "--chdir",
            ctx.cwd_in_sandbox,
        ]);
        push(&[
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "berth",
            "--die-with-parent",
        ]);
        // A new session keeps the sandbox away from the caller's terminal (TIOCSTI). A
        // terminal session's terminal is one Berth allocated for it alone, and the sandbox must
        // keep it as its controlling terminal (Ctrl-C, job control).
        if !ctx.terminal {
            push(&["--new-session"]);
        }
        if !network {
            push(&["--unshare-net"]);
        }
        args
    }
}

impl Launcher for Bwrap {
    fn id(&self) -> &'static str {
        PROVIDER_ID
    }

    fn workspace_alias(&self) -> Option<&'static str> {
        Some(WORKSPACE)
    }

    fn workspace_owner(&self) -> Option<(u32, u32)> {
        self.enter.as_ref().map(|_| (SANDBOX_USER, SANDBOX_USER))
    }

    fn command(&self, ctx: &LaunchContext<'_>) -> Result<tokio::process::Command> {
        let mut cmd = match &self.enter {
            Some(helper) => {
                let id = SANDBOX_USER.to_string();
                let mut cmd = tokio::process::Command::new(helper);
                cmd.arg(berth_supervisor::enter::ENTER_ARG)
                    .args([id.as_str(), id.as_str()])
                    .arg(ctx.workspace)
                    .args([ENTRY_MOUNT, "--"])
                    .arg(&self.program);
                cmd
            }
            None => tokio::process::Command::new(&self.program),
        };
        cmd.args(self.arguments(ctx)).arg("--");
        match ctx.command {
            Command::Argv(argv) if argv.is_empty() => {
                return Err(ProviderError::new(
                    ErrorKind::InvalidRequest,
                    PROVIDER_ID,
                    "empty argv: nothing to run",
                ))
            }
            Command::Argv(argv) => cmd.args(argv),
            Command::Shell(line) => cmd.args(["/bin/sh", "-c", line]),
        };
        Ok(cmd)
    }

    fn interactive(&self) -> bool {
        true
    }

    fn terminal_helper(&self) -> Option<&Path> {
        self.helper.as_deref()
    }

    /// bwrap's own process holds the terminal's foreground group: a job-control shell moves
    /// the command into a group of its own and gives it the terminal, so Ctrl-C reaches the
    /// command and never bwrap (whose death would end the session). The `exit` after the
    /// command keeps bash from replacing itself with it (which would skip the job).
    fn terminal_argv(&self, argv: Vec<String>) -> Vec<String> {
        let mut wrapped: Vec<String> = ["bash", "-c", "set -m; \"$@\"; exit $?", "berth"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        wrapped.extend(argv);
        wrapped
    }

    fn check_network(&self, network: NetworkMode) -> Result<()> {
        match network {
            NetworkMode::None | NetworkMode::Host => Ok(()),
            NetworkMode::Bridge => Err(ProviderError::new(
                ErrorKind::Unsupported,
                PROVIDER_ID,
                "bwrap has no network of its own to give a sandbox: use `--network none` \
                 (private, loopback only) or `--network host` (the host's network, loopback \
                 services included — no network isolation)",
            )),
        }
    }

    /// bwrap reports its own failures (mount setup, exec of a missing program) on stderr with a
    /// `bwrap: ` prefix and exit code 1. Those are errors, not the command's exit code.
    fn interpret(&self, finished: Finished) -> Result<Finished> {
        let from_bwrap = finished.stderr_head.starts_with(b"bwrap: ")
            && finished.status == berth_contract::ExitStatus::Exited { code: 1 };
        if !from_bwrap {
            return Ok(finished);
        }
        let line = String::from_utf8_lossy(&finished.stderr_head);
        let line = line.lines().next().unwrap_or_default().to_owned();
        let failure = if line.contains("execvp") && line.contains("No such file") {
            berth_contract::StartFailure::NotFound
        } else if line.contains("execvp") && line.contains("Permission denied") {
            berth_contract::StartFailure::NotExecutable
        } else {
            berth_contract::StartFailure::Other
        };
        Err(ProviderError::not_started(
            failure,
            PROVIDER_ID,
            format!("bubblewrap could not start the command: {line}"),
        ))
    }
}

/// The bwrap provider.
pub type BwrapProvider = LocalProvider<Bwrap>;

/// A bwrap provider keeping its sandboxes under `state_dir`.
///
/// `config.reaper` names the helper program (`berth` or `berth-supervisor`). It enters
/// sandboxes unprivileged when Berth runs as root, and every exec runs under it as the per-exec
/// reaper: bwrap reports the command's exit as soon as it happens, while the rest of the exec's
/// PID namespace is killed after that, on the kernel's time. The reaper (the subreaper that
/// bwrap's orphaned init falls to) reports only once all of it is gone, so an exec that
/// returns has left nothing, and destroy need not search the process table for it.
pub fn new(state_dir: impl Into<PathBuf>, config: BwrapConfig) -> Result<BwrapProvider> {
    let launcher = Bwrap::locate(config.reaper.clone())?;
    LocalProvider::new(state_dir, config, launcher)
}
