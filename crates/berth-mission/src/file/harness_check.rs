//! Checks of the `[harness]` section: the script harness, agent CLIs, their gateway and login.

use super::{parse_duration, Harness, AGENT_HARNESSES};

/// What is wrong with a harness section, if anything: the key and the problem.
pub(super) fn harness_problem(harness: &Harness) -> Option<(&'static str, String)> {
    let kind = harness.kind.as_str();
    if kind == "script" {
        if harness
            .command
            .as_deref()
            .is_none_or(|c| c.trim().is_empty())
        {
            return Some(("command", "is required for the `script` harness".into()));
        }
        if harness.gateway.is_some()
            || harness.model.is_some()
            || harness.idle_timeout.is_some()
            || harness.login.is_some()
        {
            return Some((
                "kind",
                "is `script`, which takes only `command` (`model`, `gateway`, `idle_timeout` \
                 and `login` are for agent CLIs)"
                    .into(),
            ));
        }
        return None;
    }
    if !AGENT_HARNESSES.contains(&kind) {
        return Some((
            "kind",
            format!(
                "is `{}`; this berth runs `script`, `opencode`, `codex` or `claude-code`",
                kind.escape_debug()
            ),
        ));
    }
    if harness.command.is_some() {
        return Some((
            "command",
            format!("is for the `script` harness; `{kind}` is launched by Berth"),
        ));
    }
    if let Some(model) = &harness.model {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "._-:/@[]".contains(c);
        if model.is_empty() || model.len() > 128 || !model.chars().all(allowed) {
            return Some((
                "model",
                "is not a model name (letters, digits, `.`, `_`, `-`, `:`, `/`, `@`, `[`, `]`; \
                 at most 128)"
                    .into(),
            ));
        }
    }
    if let Some(idle) = &harness.idle_timeout {
        if parse_duration(idle).is_none_or(|d| d.is_zero()) {
            return Some((
                "idle_timeout",
                format!(
                    "`{}` is not a duration like `90s`, `5m`",
                    idle.escape_debug()
                ),
            ));
        }
    }
    if let Some(login) = &harness.login {
        if kind == "opencode" {
            return Some((
                "login",
                "is for `codex` and `claude-code` (OpenCode's logins are not supported)".into(),
            ));
        }
        if !is_login_name(login) {
            return Some((
                "login",
                "is not a login name (letters, digits, `_`, `-`, `.`; at most 64): name a login \
                 of $BERTH_HOME/logins.toml, never a path or a value"
                    .into(),
            ));
        }
    }
    let Some(gateway) = &harness.gateway else {
        return Some((
            "kind",
            format!(
                "is `{kind}`, which needs `[harness.gateway]`: `script = \"model.toml\"` (a \
                 scripted model) or `proxy = \"http://…\"` with `credential_env`"
            ),
        ));
    };
    match (&gateway.script, &gateway.proxy) {
        (Some(script), None) => {
            if gateway.credential_env.is_some() {
                return Some(("gateway", "`credential_env` is for `proxy`".into()));
            }
            if script.is_empty() || script.starts_with('/') || script.contains('\0') {
                return Some((
                    "gateway",
                    "`script` must be a path relative to the mission file".into(),
                ));
            }
            None
        }
        (None, Some(proxy)) => {
            if !(proxy.starts_with("http://") || proxy.starts_with("https://")) || proxy.len() > 512
            {
                return Some((
                    "gateway",
                    "`proxy` must be an http:// or https:// origin".into(),
                ));
            }
            if harness.login.is_some() {
                // The CLI authenticates with its own login; the proxy passes that through.
                if gateway.credential_env.is_some() {
                    return Some((
                        "gateway",
                        "with `login`, the proxy forwards the CLI's own login: drop \
                         `credential_env`"
                            .into(),
                    ));
                }
                return None;
            }
            let named = gateway.credential_env.as_deref().is_some_and(|v| {
                !v.is_empty()
                    && v.len() <= 128
                    && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !v.starts_with(|c: char| c.is_ascii_digit())
            });
            if !named {
                return Some((
                    "gateway",
                    "`proxy` needs `credential_env`: the NAME of the variable holding the \
                     credential (letters, digits, `_`)"
                        .into(),
                ));
            }
            None
        }
        _ => Some((
            "gateway",
            "needs exactly one of `script` (a scripted model) or `proxy`".into(),
        )),
    }
}

/// Whether `name` can name a login (`harness.login`, `$BERTH_HOME/logins.toml`).
pub fn is_login_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        && !name.starts_with('.')
}
