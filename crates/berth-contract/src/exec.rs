//! Exec requests and results. Exit status is never fabricated: a transport failure is an error,
//! not exit code 127, and merged streams are `stderr: None`, not an empty stderr.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default cap on captured bytes per stream in buffered exec (16 MiB). Output beyond it is
/// counted, drained and dropped, and the result says it was truncated.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// An argument vector, run without a shell.
    Argv(Vec<String>),
    /// A shell command line, run with `sh -c`.
    Shell(String),
}

/// One command to run in a sandbox.
///
/// `env` values may be secrets: they are passed to the process environment only, and `Debug`
/// prints names, never values.
#[derive(Clone)]
pub struct ExecRequest {
    /// The command.
    pub command: Command,
    /// Working directory inside the sandbox; the provider's default when `None`.
    pub cwd: Option<String>,
    /// Extra environment for this command.
    pub env: BTreeMap<String, String>,
    /// Client deadline; on expiry the provider kills the command's whole process tree.
    pub timeout: Option<Duration>,
    /// Cap on captured bytes per stream (buffered exec).
    pub max_output_bytes: usize,
}

/// Environment variables Berth sets itself in every sandbox command; a request cannot set them.
pub const RESERVED_ENV: &[&str] = &["BERTH_SANDBOX"];

/// Checks a request's environment: names are `[A-Za-z_][A-Za-z0-9_]*`, not reserved; values
/// carry no NUL byte. The error names the variable, never its value (it may be a secret).
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    for (name, value) in env {
        let mut chars = name.chars();
        let well_formed = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && name.len() <= 256;
        if !well_formed {
            return Err(format!(
                "`{}` is not a valid variable name (letters, digits and `_`, not starting with a digit)",
                name.escape_debug()
            ));
        }
        if RESERVED_ENV.contains(&name.as_str()) {
            return Err(format!("`{name}` is reserved by berth"));
        }
        if value.contains('\0') {
            return Err(format!("the value of `{name}` contains a NUL byte"));
        }
    }
    Ok(())
}

/// Checks a command: no argument (and no shell line) carries a NUL byte. No process argument
/// can hold one, and the standard library would quietly run a placeholder in its place; the
/// request is refused instead. The error names the argument's position, never its text.
pub fn check_command(command: &Command) -> Result<(), String> {
    match command {
        Command::Argv(argv) => check_argv(argv),
        Command::Shell(line) if line.contains('\0') => {
            Err("the shell command line contains a NUL byte".into())
        }
        Command::Shell(_) => Ok(()),
    }
}

/// [`check_command`] for a bare argument vector (a terminal's, a detached process's).
pub fn check_argv(argv: &[String]) -> Result<(), String> {
    match argv.iter().position(|arg| arg.contains('\0')) {
        None => Ok(()),
        Some(0) => Err("the program name contains a NUL byte".into()),
        Some(n) => Err(format!("argument {n} of the command contains a NUL byte")),
    }
}

impl ExecRequest {
    /// A request for `command` with defaults.
    pub fn new(command: Command) -> Self {
        ExecRequest {
            command,
            cwd: None,
            env: BTreeMap::new(),
            timeout: None,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        }
    }

    /// A shell command line.
    pub fn shell(line: impl Into<String>) -> Self {
        Self::new(Command::Shell(line.into()))
    }

    /// An argument vector.
    pub fn argv<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(Command::Argv(args.into_iter().map(Into::into).collect()))
    }

    /// Sets the deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the working directory.
    pub fn with_cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Adds an environment variable.
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }
}

impl fmt::Debug for ExecRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecRequest")
            .field("command", &self.command)
            .field("cwd", &self.cwd)
            .field("env_names", &self.env.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("max_output_bytes", &self.max_output_bytes)
            .finish()
    }
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ExitStatus {
    /// The command exited with this code.
    Exited {
        /// The exit code.
        code: i32,
    },
    /// The command was killed by this signal (not by Berth's timeout).
    Signalled {
        /// The signal number.
        signal: i32,
    },
    /// Berth's deadline passed; the whole process tree was killed.
    TimedOut,
    /// The provider could not tell. The reason says why.
    Unknown {
        /// Why the status is unknown.
        reason: String,
    },
}

impl ExitStatus {
    /// `true` only for `Exited { code: 0 }`.
    pub fn success(&self) -> bool {
        matches!(self, ExitStatus::Exited { code: 0 })
    }

    /// The process exit code a CLI should use to mirror this status: the code itself, 124 for a
    /// timeout (as `timeout(1)`), 128 + signal, and 125 when unknown.
    pub fn shell_code(&self) -> i32 {
        match self {
            ExitStatus::Exited { code } => *code,
            ExitStatus::Signalled { signal } => 128 + signal,
            ExitStatus::TimedOut => 124,
            ExitStatus::Unknown { .. } => 125,
        }
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Exited { code } => write!(f, "exited with code {code}"),
            ExitStatus::Signalled { signal } => write!(f, "killed by signal {signal}"),
            ExitStatus::TimedOut => f.write_str("timed out (process tree killed)"),
            ExitStatus::Unknown { reason } => write!(f, "unknown ({reason})"),
        }
    }
}

/// The result of a buffered exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    /// How the command ended.
    pub status: ExitStatus,
    /// Captured stdout, at most `max_output_bytes`.
    pub stdout: Vec<u8>,
    /// Captured stderr; `None` when the provider merges it into stdout.
    pub stderr: Option<Vec<u8>>,
    /// Total stdout bytes the command wrote (may exceed what was captured).
    pub stdout_total: u64,
    /// Total stderr bytes, `None` when merged.
    pub stderr_total: Option<u64>,
    /// Wall time from spawn to exit.
    pub duration: Duration,
}

impl ExecOutput {
    /// Whether captured stdout is shorter than what the command wrote.
    pub fn stdout_truncated(&self) -> bool {
        (self.stdout.len() as u64) < self.stdout_total
    }

    /// Whether captured stderr is shorter than what the command wrote.
    pub fn stderr_truncated(&self) -> bool {
        match (&self.stderr, self.stderr_total) {
            (Some(bytes), Some(total)) => (bytes.len() as u64) < total,
            _ => false,
        }
    }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Receives output while a streaming exec runs.
pub trait OutputSink: Send {
    /// Called for every chunk, in order per stream.
    fn chunk(&mut self, stream: Stream, bytes: &[u8]);
}

/// The result of a streaming exec: the output went to the sink, the totals are here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSummary {
    /// How the command ended.
    pub status: ExitStatus,
    /// Bytes delivered on stdout.
    pub stdout_total: u64,
    /// Bytes delivered on stderr; `None` when merged.
    pub stderr_total: Option<u64>,
    /// Wall time from spawn to exit.
    pub duration: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_prints_env_values() {
        let req = ExecRequest::shell("env").with_env("API_TOKEN", "canary-s3cr3t-value");
        let shown = format!("{req:?}");
        assert!(shown.contains("API_TOKEN"));
        assert!(!shown.contains("canary-s3cr3t-value"), "{shown}");
    }

    #[test]
    fn shell_codes_follow_conventions() {
        assert_eq!(ExitStatus::Exited { code: 7 }.shell_code(), 7);
        assert_eq!(ExitStatus::Signalled { signal: 9 }.shell_code(), 137);
        assert_eq!(ExitStatus::TimedOut.shell_code(), 124);
        let unknown = ExitStatus::Unknown {
            reason: "stream lost".into(),
        };
        assert_eq!(unknown.shell_code(), 125);
        assert!(!unknown.success());
        assert!(ExitStatus::Exited { code: 0 }.success());
    }

    #[test]
    fn exit_status_json_shape_is_tagged() {
        let json = serde_json::to_value(ExitStatus::Exited { code: 7 }).unwrap();
        assert_eq!(json, serde_json::json!({"status": "exited", "code": 7}));
        let json = serde_json::to_value(ExitStatus::TimedOut).unwrap();
        assert_eq!(json, serde_json::json!({"status": "timed_out"}));
    }

    #[test]
    fn truncation_is_derived_from_totals() {
        let out = ExecOutput {
            status: ExitStatus::Exited { code: 0 },
            stdout: vec![b'x'; 4],
            stderr: None,
            stdout_total: 10,
            stderr_total: None,
            duration: Duration::from_millis(1),
        };
        assert!(out.stdout_truncated());
        assert!(!out.stderr_truncated());
    }
}

#[cfg(test)]
mod env_tests {
    use super::*;

    #[test]
    fn env_names_are_checked_and_values_never_shown() {
        for bad in ["", "A B", "1A", "A=B", "BERTH_SANDBOX", "a\0b", "é"] {
            let env = BTreeMap::from([(bad.to_owned(), "secret-value".to_owned())]);
            let err = check_env(&env).unwrap_err();
            assert!(!err.contains("secret-value"), "{err}");
        }
        let env = BTreeMap::from([("OK_1".to_owned(), "v".to_owned())]);
        assert!(check_env(&env).is_ok());
        let env = BTreeMap::from([("OK".to_owned(), "a\0b".to_owned())]);
        assert!(check_env(&env).is_err());
    }

    #[test]
    fn a_nul_in_a_command_is_refused_by_position_never_by_text() {
        let argv = |args: &[&str]| Command::Argv(args.iter().map(|a| (*a).to_owned()).collect());
        assert!(check_command(&argv(&["printf", "%s", "a b"])).is_ok());
        assert!(check_command(&Command::Shell("echo ok".into())).is_ok());
        let err = check_command(&argv(&["sh", "-c", "x", "SECRET\0y"])).unwrap_err();
        assert_eq!(err, "argument 3 of the command contains a NUL byte");
        let err = check_command(&argv(&["ech\0o"])).unwrap_err();
        assert_eq!(err, "the program name contains a NUL byte");
        let err = check_command(&Command::Shell("echo SECRET\0".into())).unwrap_err();
        assert!(!err.contains("SECRET"), "{err}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        #[test]
        fn env_checks_never_panic_and_never_echo_values(name in "\\PC{0,20}", value in "\\PC{0,20}") {
            let env = BTreeMap::from([(name, format!("CANARY{value}"))]);
            if let Err(message) = check_env(&env) {
                proptest::prop_assert!(!message.contains("CANARY"));
            }
        }
    }
}
