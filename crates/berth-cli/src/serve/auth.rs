//! Bearer tokens: `berth token create --owner O --scope read|exec|admin` prints a token once;
//! the store keeps only its SHA-256. Scopes nest: `read` ⊂ `exec` ⊂ `admin`.

use anyhow::Result;
use berth_store::{AccessStore, ApiToken, Store};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::errors::{code, CliError};
use crate::output::emit;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// List and show.
    Read,
    /// Also create, exec in and destroy sandboxes.
    Exec,
    /// Also sweep the ledger and read the audit log.
    Admin,
}

impl Scope {
    pub fn parse(text: &str) -> Option<Scope> {
        match text {
            "read" => Some(Scope::Read),
            "exec" => Some(Scope::Exec),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Exec => "exec",
            Scope::Admin => "admin",
        }
    }
}

/// Tokens start with this, so a leaked one is recognisable (and scanners can find it).
const PREFIX: &str = "berth_";

pub fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(hex::encode(buf))
}

/// The token a request presents, if it is live: its record and its scope.
pub async fn verify(store: &Store, presented: &str) -> Result<Option<(ApiToken, Scope)>> {
    if !presented.starts_with(PREFIX) || presented.len() > 128 {
        return Ok(None);
    }
    let Some(token) = store.token_by_hash(&hash(presented)).await? else {
        return Ok(None);
    };
    // A scope this build does not know grants nothing.
    Ok(Scope::parse(&token.scope).map(|scope| (token, scope)))
}

/// `berth token create`.
pub async fn create(
    store: &Store,
    json: bool,
    owner: &str,
    scope: &str,
    name: &str,
) -> Result<i32> {
    let Some(scope) = Scope::parse(scope) else {
        return Err(CliError::invalid(
            format!("unknown scope `{scope}`"),
            "a scope is read, exec or admin",
        )
        .into());
    };
    if owner.is_empty() || owner.len() > 200 || owner.chars().any(char::is_control) {
        return Err(CliError::invalid(
            "an owner is 1–200 printable characters",
            "name the owner whose sandboxes the token reaches, e.g. --owner ci@team",
        )
        .into());
    }
    // The name is shown in `token list`'s table: no control character reaches a terminal.
    if name.len() > 200 || name.chars().any(char::is_control) {
        return Err(CliError::invalid(
            "a token's name is at most 200 printable characters",
            "name it for people, e.g. --name 'nightly CI'",
        )
        .into());
    }
    if crate::output::stdout_is_null() {
        return Err(CliError::invalid(
            "stdout is /dev/null: the new token, shown only once, would be lost",
            "send stdout somewhere that keeps it, e.g. `berth token create … > token.txt`",
        )
        .into());
    }
    let token = format!("{PREFIX}{}", random_hex(32)?);
    let id = format!("tk-{}", random_hex(6)?);
    let row = store
        .token_create(&id, &hash(&token), owner, scope.as_str(), name)
        .await?;
    if json {
        emit(
            "token create",
            json!({ "id": row.id, "owner": row.owner, "scope": row.scope, "name": row.name, "token": token }),
        );
    } else {
        outln!("{token}");
    }
    // The printed token is its only copy: one that never reached stdout (closed, a full disk)
    // is revoked, and the command fails, rather than leaving a live token nobody has.
    if !crate::output::delivered() {
        store.token_revoke(&row.id).await?;
        return Err(CliError {
            kind: "internal",
            exit_code: crate::errors::code::INTERNAL,
            message: format!(
                "the new token {} could not be written to stdout, so it was revoked",
                row.id
            ),
            hint: Some("create it again with stdout going somewhere that keeps it".into()),
        }
        .into());
    }
    if !json {
        errln!(
            "token {} for owner `{}` with scope {}: shown once, stored only as its hash",
            row.id,
            row.owner,
            row.scope
        );
    }
    Ok(code::OK)
}

/// `berth token list` (never a token, only ids).
pub async fn list(store: &Store, json: bool) -> Result<i32> {
    let tokens = store.token_list().await?;
    if json {
        emit("token list", json!({ "tokens": tokens }));
    } else {
        outln!(
            "{:<16} {:<6} {:<8} {:<24} NAME",
            "ID",
            "SCOPE",
            "STATE",
            "OWNER"
        );
        for t in &tokens {
            let state = if t.revoked_at.is_some() {
                "revoked"
            } else {
                "live"
            };
            outln!(
                "{:<16} {:<6} {:<8} {:<24} {}",
                t.id,
                t.scope,
                state,
                crate::human::printable(&t.owner, false),
                crate::human::printable(&t.name, false)
            );
        }
    }
    Ok(code::OK)
}

/// `berth token revoke ID`.
pub async fn revoke(store: &Store, json: bool, id: &str) -> Result<i32> {
    if !store.token_revoke(id).await? {
        return Err(CliError::not_found(
            format!("no live token `{id}`"),
            "`berth token list` shows the tokens",
        )
        .into());
    }
    if json {
        emit("token revoke", json!({ "id": id, "revoked": true }));
    } else {
        errln!("revoked {id}");
    }
    Ok(code::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_unknown_ones_grant_nothing() {
        assert!(Scope::Read < Scope::Exec && Scope::Exec < Scope::Admin);
        assert_eq!(Scope::parse("root"), None);
        assert_eq!(Scope::parse("exec"), Some(Scope::Exec));
    }

    #[test]
    fn the_hash_is_not_the_token() {
        let h = hash("berth_abc");
        assert_eq!(h.len(), 64);
        assert!(!h.contains("abc"));
    }
}
