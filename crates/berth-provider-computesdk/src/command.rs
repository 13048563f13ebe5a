//! Berth commands as the shell lines ComputeSDK's `runCommand` takes.

use std::collections::BTreeMap;

use berth_contract::Command;

/// Quotes one argument for a POSIX shell line.
fn shell_quote(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        return arg.to_owned();
    }
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// The shell line ComputeSDK's `runCommand` takes for a Berth command.
pub fn command_line(command: &Command) -> String {
    match command {
        Command::Shell(line) => line.clone(),
        Command::Argv(argv) => argv
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// The command line and the `cwd` option for a request. A relative working directory means
/// relative to where a command starts (the sandbox's workspace), as on every other provider;
/// ComputeSDK passes `cwd` to the vendor as given, and just-bash resolves a relative one from
/// `/`. So a relative one is entered by the line itself, its name carried in the environment
/// (`BERTH_CWD`), never spliced into the line; an absolute one goes to the vendor.
pub(crate) fn with_cwd(
    command: &Command,
    cwd: Option<&str>,
    env: &mut BTreeMap<String, String>,
) -> (String, Option<String>) {
    match cwd {
        Some(dir) if !dir.starts_with('/') => {
            env.insert("BERTH_CWD".into(), dir.to_owned());
            (
                format!("cd -- \"$BERTH_CWD\" || exit 1\n{}", command_line(command)),
                None,
            )
        }
        other => (command_line(command), other.map(str::to_owned)),
    }
}
