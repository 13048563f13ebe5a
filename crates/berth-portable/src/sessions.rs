//! Agent sessions kept by Berth (SPEC §7's `PortableAgentSession`): what an agent CLI needs to
//! go on with a conversation — its own session record and Berth's continuity state — apart
//! from any sandbox, so `berth prompt --resume as-…` continues it in any sandbox on any
//! provider (after a `berth move`, a restore, or in a fresh sandbox with the same files).
//!
//! Stored in Berth's object store beside checkpoints, under `sessions/OWNER/` (OWNER a digest
//! of the owner's name): `as-ID.json` (the record, replaced each turn), `as-ID.HEX.tar` (the
//! CLI's session record as Berth rebuilt it, HEX its SHA-256; the record names the one that is
//! current) and `as-ID.turn-N.claim` (made create-only by the first of the turns resumed from
//! turn N-1 to finish; the others become forks, so no turn overwrites another). Keys are flat,
//! so a local store keeps no empty directory of a deleted session. The archive comes from a
//! sandbox: it is read with the strict rules of a checkpoint (relative paths, every entry
//! beneath a directory made before it, no special files or links, bounded) and rebuilt by
//! Berth, so what a later sandbox unpacks is never the bytes an earlier one wrote. Each turn
//! claims its number, writes the new archive, then the record that names it; what a crash
//! leaves between them (an archive no record names, a claim) `gc` removes once it is old. A
//! claim names the run that made it, so that run's recovery goes on from its own claim.

use berth_artifacts::{ArtifactError, Objects};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::checkpoint::{parse_as, Checkpoint, Keep};
use crate::PortableError;

/// The schema of a session's record.
pub const SESSION_SCHEMA: &str = "berth.agent-session/v1";
/// A session id's prefix.
pub const SESSION_PREFIX: &str = "as-";
/// The largest record read back.
const MAX_RECORD_BYTES: u64 = 1 << 20;
/// The largest session archive kept (what the collection in the sandbox reads, at most).
pub const MAX_SESSION_ARCHIVE: usize = 64 << 20;
/// How old an archive no record names must be before `gc` takes it for a crash's leftover.
const ORPHAN_AFTER: std::time::Duration = std::time::Duration::from_secs(120);

/// How long deleting a session waits for a turn of it being saved.
const DELETE_WAITS_FOR: std::time::Duration = std::time::Duration::from_secs(60);
/// Turns a record lists (the most recent); the count goes on.
const LISTED_TURNS: usize = 100;

/// One turn of a session: one agent run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SessionTurn {
    /// The turn's number, from 1.
    pub turn: u64,
    /// When it finished.
    pub at: DateTime<Utc>,
    /// The sandbox it ran in.
    pub sandbox: String,
    /// That sandbox's provider.
    pub provider: String,
    /// The working directory, relative to the workspace.
    pub cwd: String,
    /// How the CLI's process ended.
    pub exit: String,
    /// `None`: the agent finished its turn and did something; otherwise why not.
    pub rejected: Option<String>,
    /// Tool calls made.
    pub tool_calls: u64,
    /// Where Berth kept the turn's logs (on the machine that ran it).
    pub logs: String,
}

/// A session's record: Berth's continuity state and the archive holding the CLI's own.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentSession {
    /// [`SESSION_SCHEMA`].
    pub schema: String,
    /// `as-` and 32 hex digits.
    pub id: String,
    /// Where the conversation began: `prompt`, or a mission attempt.
    pub origin: String,
    /// The agent CLI (`opencode`, `codex`, `claude-code`).
    pub harness: String,
    /// The CLI's own id of the conversation (what it resumes).
    pub cli_session: String,
    /// The model name the CLI was given.
    pub model: String,
    /// When the first turn finished.
    pub created_at: DateTime<Utc>,
    /// When the last turn finished.
    pub updated_at: DateTime<Utc>,
    /// Turns so far.
    pub turns: u64,
    /// The most recent turns, oldest first (at most 100).
    pub history: Vec<SessionTurn>,
    /// The session this one was forked from, when a turn found its session moved on by
    /// another turn run at the same time.
    pub forked_from: Option<String>,
    /// SHA-256 (hex) of the current archive.
    pub archive_sha256: String,
    /// Its size.
    pub archive_bytes: u64,
    /// What the CLI's session record held that the archive does not carry.
    pub not_carried: Vec<String>,
}

impl AgentSession {
    /// A new session of its first turn, under a new id (the archive's fields are set when it is
    /// saved).
    pub fn first(
        origin: String,
        harness: &str,
        cli_session: String,
        model: String,
        turn: SessionTurn,
    ) -> AgentSession {
        AgentSession {
            schema: SESSION_SCHEMA.into(),
            id: SessionStore::new_id(),
            origin,
            harness: harness.into(),
            cli_session,
            model,
            created_at: turn.at,
            updated_at: turn.at,
            turns: 1,
            history: vec![turn],
            forked_from: None,
            archive_sha256: String::new(),
            archive_bytes: 0,
            not_carried: Vec::new(),
        }
    }

    /// The last turn.
    pub fn last(&self) -> Option<&SessionTurn> {
        self.history.last()
    }
}

/// Whether a CLI's conversation id is plain enough to hand back to the CLI as an argument:
/// letters, digits, `-` and `_`, at most 128, not starting with `-` (it came from a sandbox, and
/// `--resume -c …` would be an option).
pub fn plain_cli_session(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && !id.starts_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A CLI's session record as Berth keeps it: read with the strict rules, rebuilt.
#[derive(Debug)]
pub struct SessionArchive {
    /// The archive Berth rebuilt.
    pub archive: Vec<u8>,
    /// What was not carried.
    pub not_carried: Vec<String>,
    /// Files it holds.
    pub files: u64,
}

impl SessionArchive {
    /// Reads an archive a sandbox wrote (the CLI's session record) with the rules of a
    /// checkpoint and rebuilds it.
    pub fn read(raw: &[u8]) -> Result<SessionArchive, PortableError> {
        if raw.len() > MAX_SESSION_ARCHIVE {
            return Err(PortableError::Workspace(format!(
                "the agent's session record is larger than {} MiB",
                MAX_SESSION_ARCHIVE >> 20
            )));
        }
        let Checkpoint {
            entries,
            not_carried,
            archive,
        } = parse_as(raw, Keep::Archive).map_err(|e| match e {
            PortableError::Workspace(why) => PortableError::Workspace(why.replacen(
                "the workspace's archive",
                "the agent's session record",
                1,
            )),
            other => other,
        })?;
        // A CLI's record is files and directories. A link would be unpacked into the next
        // run's home, and the CLI writing through it there would write wherever it points —
        // on another provider, outside the sandbox the record came from.
        if let Some((path, _)) = entries
            .iter()
            .find(|(_, e)| matches!(e.kind, crate::EntryKind::Symlink { .. }))
        {
            return Err(PortableError::Workspace(format!(
                "the agent's session record is refused: `{}` is a symbolic link (a session \
                 record holds files and directories only)",
                crate::checkpoint::shown(path)
            )));
        }
        let files = entries
            .values()
            .filter(|e| matches!(e.kind, crate::EntryKind::File { .. }))
            .count() as u64;
        Ok(SessionArchive {
            archive,
            not_carried,
            files,
        })
    }
}

/// One owner's agent sessions in an object store.
#[derive(Debug, Clone)]
pub struct SessionStore {
    objects: Objects,
    prefix: String,
}

fn no_session(id: &str, reason: &str) -> PortableError {
    PortableError::NoSession {
        id: id.escape_debug().to_string(),
        reason: reason.to_owned(),
    }
}

/// The durable steps of saving a turn, in order (for crash tests: each is passed once done).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveStep {
    /// The turn's number is claimed (a resumed turn only).
    Claimed,
    /// The new archive is written.
    Archived,
    /// The record names the new archive: the turn is saved.
    Recorded,
}

impl SaveStep {
    /// Its name (`claimed`, `archived`, `recorded`).
    pub fn as_str(self) -> &'static str {
        match self {
            SaveStep::Claimed => "claimed",
            SaveStep::Archived => "archived",
            SaveStep::Recorded => "recorded",
        }
    }
}

/// What saving a turn came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Saved {
    /// The session's record now names this turn.
    Advanced,
    /// The turn is kept as a new session forked from the one it resumed, which stays as it
    /// was: another run claimed its next turn first (a turn saved meanwhile, which is not
    /// overwritten, or one killed while saving), its record changed, or the CLI went on in
    /// another conversation.
    Forked {
        /// The session the turn resumed.
        from: String,
        /// Why.
        why: String,
    },
}

impl SessionStore {
    /// The sessions of `owner` in `objects`.
    pub fn new(objects: Objects, owner: &str) -> SessionStore {
        let hashed = hex::encode(&Sha256::digest(owner.as_bytes())[..12]);
        SessionStore {
            objects,
            prefix: format!("sessions/{hashed}"),
        }
    }

    /// A new session id.
    pub fn new_id() -> String {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the system's random source");
        format!("{SESSION_PREFIX}{}", hex::encode(bytes))
    }

    /// The id's hex, or why it is no session id (it becomes an object key).
    fn hex_of(id: &str) -> Result<&str, PortableError> {
        match id.strip_prefix(SESSION_PREFIX) {
            Some(hex)
                if hex.len() == 32
                    && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
            {
                Ok(hex)
            }
            _ => Err(no_session(
                id,
                "not a session id (`as-` and 32 lowercase hex digits)",
            )),
        }
    }

    fn record_key(&self, hex: &str) -> String {
        format!("{}/as-{hex}.json", self.prefix)
    }

    fn archive_key(&self, hex: &str, sha: &str) -> String {
        format!("{}/as-{hex}.{sha}.tar", self.prefix)
    }

    fn claim_key(&self, hex: &str, turn: u64) -> String {
        format!("{}/as-{hex}.turn-{turn:08}.claim", self.prefix)
    }

    /// A session's record.
    pub async fn record(&self, id: &str) -> Result<AgentSession, PortableError> {
        let hex = Self::hex_of(id)?;
        let key = self.record_key(hex);
        let bytes = match self.objects.get_bounded(&key, MAX_RECORD_BYTES).await {
            Err(ArtifactError::NotFound(_)) => {
                return Err(no_session(id, "no such session of this owner"))
            }
            other => other?,
        };
        let corrupt = |message: String| PortableError::Record {
            path: format!("{key} in {}", self.objects.location),
            message,
        };
        let record: AgentSession = serde_json::from_slice(&bytes)
            .map_err(|e| corrupt(format!("not a session record: {e}")))?;
        let sha_ok = record.archive_sha256.len() == 64
            && record
                .archive_sha256
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if record.schema != SESSION_SCHEMA
            || record.id != id
            || !sha_ok
            || !plain_cli_session(&record.cli_session)
        {
            return Err(corrupt(
                "not a record of this session (its schema, id, archive digest or CLI \
                 conversation id is not what one can be)"
                    .into(),
            ));
        }
        Ok(record)
    }

    /// A session's record and its archive, read back and checked: the archive must be the one
    /// the record names, and meet the strict rules again (whoever can write the store is
    /// untrusted).
    pub async fn get(&self, id: &str) -> Result<(AgentSession, Vec<u8>), PortableError> {
        let record = self.record(id).await?;
        let key = self.archive_key(Self::hex_of(id)?, &record.archive_sha256);
        let bytes = match self
            .objects
            .get_bounded(&key, MAX_SESSION_ARCHIVE as u64)
            .await
        {
            Err(ArtifactError::NotFound(_)) => {
                return Err(no_session(id, "its record names an archive that is gone"))
            }
            other => other?,
        };
        if hex::encode(Sha256::digest(&bytes)) != record.archive_sha256 {
            return Err(PortableError::Record {
                path: format!("{key} in {}", self.objects.location),
                message: "holds another archive than its name says".into(),
            });
        }
        let archive = SessionArchive::read(&bytes)?.archive;
        Ok((record, archive))
    }

    /// Saves a turn: `session` (its archive fields are set here) with `archive`. `resumed`: the
    /// record the turn started from; the turn claims the next turn's number, and when another
    /// turn claimed it first or the record changed meanwhile, the turn is saved under a new id,
    /// forked from it. `None`: a new session (or a fork the caller decided on), saved as it is.
    pub async fn save(
        &self,
        session: AgentSession,
        archive: SessionArchive,
        resumed: Option<&AgentSession>,
    ) -> Result<(AgentSession, Saved), PortableError> {
        self.save_observed(session, archive, resumed, None, &mut |_| {})
            .await
    }

    /// [`SessionStore::save`], telling `on_step` each durable step as it is done. `run` names
    /// the run saving the turn (unique to it) and goes in its claim: the same run saving again
    /// after it was killed while saving — its recovery — finds its own claim and goes on, where
    /// any other run's turn is a fork.
    pub async fn save_observed(
        &self,
        mut session: AgentSession,
        archive: SessionArchive,
        resumed: Option<&AgentSession>,
        run: Option<&str>,
        on_step: &mut (dyn FnMut(SaveStep) + Send),
    ) -> Result<(AgentSession, Saved), PortableError> {
        if !plain_cli_session(&session.cli_session) {
            return Err(PortableError::Workspace(format!(
                "the agent CLI named its conversation `{}`, not a plain id (letters, digits, `-`, \
                 `_`); it would not be handed back to the CLI",
                session
                    .cli_session
                    .chars()
                    .take(140)
                    .collect::<String>()
                    .escape_debug()
            )));
        }
        let mut saved = Saved::Advanced;
        if let Some(started) = resumed {
            // Of the turns resumed from the same record, the first to claim the next turn's
            // number goes on and every other becomes a fork: the claim is atomic in both
            // stores, where reading the record and then writing it is not.
            let started_hex = Self::hex_of(&started.id)?;
            let claim = self.claim_key(started_hex, started.turns + 1);
            let mine = match run {
                Some(run) => format!("run {run}"),
                None => {
                    let mut nonce = [0u8; 16];
                    getrandom::fill(&mut nonce).expect("the system's random source");
                    hex::encode(nonce)
                }
            };
            let claimed = self
                .objects
                .create_new(&claim, mine.clone().into_bytes().into())
                .await?
                || (run.is_some()
                    && self.objects.get_bounded(&claim, 1024).await.ok()
                        == Some(mine.into_bytes()));
            let why = if !claimed {
                Some(
                    "another run claimed its next turn first (a turn saved meanwhile, or one \
                     killed while saving: `berth gc` clears its claim once 2 minutes old)",
                )
            } else if self.record(&started.id).await.ok().as_ref() != Some(started) {
                self.objects.delete(&claim).await?;
                Some("its record changed while this turn ran")
            } else {
                None
            };
            if claimed {
                on_step(SaveStep::Claimed);
            }
            if let Some(why) = why {
                session.forked_from = Some(started.id.clone());
                session.id = Self::new_id();
                saved = Saved::Forked {
                    from: started.id.clone(),
                    why: why.into(),
                };
            }
        }
        let hex = Self::hex_of(&session.id)?.to_owned();
        let sha = hex::encode(Sha256::digest(&archive.archive));
        session.schema = SESSION_SCHEMA.into();
        session.archive_sha256 = sha.clone();
        session.archive_bytes = archive.archive.len() as u64;
        session.not_carried = archive.not_carried;
        if session.history.len() > LISTED_TURNS {
            let extra = session.history.len() - LISTED_TURNS;
            session.history.drain(..extra);
        }
        // The archive first: a record always names an archive that is whole.
        self.objects
            .put_overwrite(&self.archive_key(&hex, &sha), archive.archive.into())
            .await?;
        on_step(SaveStep::Archived);
        let json = serde_json::to_vec_pretty(&session).map_err(|e| PortableError::Record {
            path: self.record_key(&hex),
            message: e.to_string(),
        })?;
        self.objects
            .put_overwrite(&self.record_key(&hex), json.into())
            .await?;
        on_step(SaveStep::Recorded);
        // The archive this turn supersedes and the claim of the turn before go now; anything
        // else a crash leaves is `gc`'s once it is old.
        if let (Some(started), Saved::Advanced) = (resumed, &saved) {
            if started.archive_sha256 != sha {
                self.objects
                    .delete(&self.archive_key(&hex, &started.archive_sha256))
                    .await?;
            }
            self.objects
                .delete(&self.claim_key(&hex, started.turns))
                .await?;
        }
        Ok((session, saved))
    }

    /// This owner's sessions, most recently used last (a record that cannot be read is passed
    /// over).
    pub async fn list(&self) -> Result<Vec<AgentSession>, PortableError> {
        let mut found = Vec::new();
        for (key, _) in self.objects.listed(&self.prefix).await? {
            let Some(id) = key
                .strip_prefix(&format!("{}/", self.prefix))
                .and_then(|name| name.strip_suffix(".json"))
            else {
                continue;
            };
            if Self::hex_of(id).is_ok() {
                if let Ok(record) = self.record(id).await {
                    found.push(record);
                }
            }
        }
        found.sort_by_key(|s| s.updated_at);
        Ok(found)
    }

    /// Deletes what a crash left: an archive no record names (a turn stopped between writing
    /// its archive and its record), or a local store's staging file, once two minutes old (a
    /// turn being saved writes them).
    pub async fn gc(&self) -> Result<Vec<crate::Collected>, PortableError> {
        let mut collected = Vec::new();
        for (key, written) in self.objects.listed(&self.prefix).await? {
            if written.elapsed().unwrap_or_default() < ORPHAN_AFTER {
                continue;
            }
            let name = key.rsplit('/').next().unwrap_or_default();
            let Some((id, rest)) = name.split_once('.') else {
                continue;
            };
            if Self::hex_of(id).is_err() {
                continue;
            }
            let reason = if let Some(sha) = rest.strip_suffix(".tar") {
                let named = match self.record(id).await {
                    Ok(record) => record.archive_sha256 == sha,
                    Err(PortableError::NoSession { .. }) => false,
                    // A record that cannot be read is not proof the archive is unused.
                    Err(_) => true,
                };
                if named {
                    continue;
                }
                "an agent session's archive no record names (a crash between them)"
            } else if rest.ends_with(".claim") {
                // A claim matters only while its turn is saved (seconds); an old one is a
                // crash's (between claiming and writing the record) and would make every
                // resume a fork.
                "an agent session's turn claim a crash left"
            } else {
                continue;
            };
            self.objects.delete(&key).await?;
            collected.push(crate::Collected {
                name: name.to_owned(),
                reason: reason.into(),
            });
        }
        for staged in self
            .objects
            .remove_stale_staging(&self.prefix, ORPHAN_AFTER)?
        {
            collected.push(crate::Collected {
                name: staged,
                reason: "half-written by a crash".into(),
            });
        }
        Ok(collected)
    }

    /// Deletes an agent session: its record, archives and claims. A turn of it saved at the
    /// same time can no longer bring it back: the delete first claims the next turn's number
    /// (create-only, as a saving turn does), so a turn that has not claimed it yet finds it
    /// taken — or the record gone — and is kept as a fork; one that has claimed it is waited
    /// for (up to a minute; longer is [`PortableError::SessionBusy`]) and then
    /// deleted with the rest. A claim older than two minutes is a killed save's, and is
    /// cleared. `false`: there was nothing to delete.
    pub async fn delete(&self, id: &str) -> Result<bool, PortableError> {
        self.delete_waiting(id, DELETE_WAITS_FOR).await
    }

    pub(crate) async fn delete_waiting(
        &self,
        id: &str,
        wait: std::time::Duration,
    ) -> Result<bool, PortableError> {
        let hex = Self::hex_of(id)?.to_owned();
        let started = std::time::Instant::now();
        loop {
            let turns = match self.record(id).await {
                Ok(record) => record.turns,
                // Gone already (or unreadable): what is left of it goes.
                Err(_) => break,
            };
            let claim = self.claim_key(&hex, turns + 1);
            if self
                .objects
                .create_new(&claim, b"deleting".to_vec().into())
                .await?
            {
                break;
            }
            let stale =
                self.objects
                    .listed(&self.prefix)
                    .await?
                    .into_iter()
                    .any(|(key, written)| {
                        key == claim && written.elapsed().unwrap_or_default() >= ORPHAN_AFTER
                    });
            if stale {
                self.objects.delete(&claim).await?;
                continue;
            }
            if started.elapsed() >= wait {
                return Err(PortableError::SessionBusy {
                    id: id.to_owned(),
                    turn: turns + 1,
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        // The record first: a turn that claims after this finds no record to go on from.
        let mut existed = self.objects.delete(&self.record_key(&hex)).await?;
        let own = format!("as-{hex}.");
        for (key, _) in self.objects.listed(&self.prefix).await? {
            if key.rsplit('/').next().unwrap_or_default().starts_with(&own) {
                existed |= self.objects.delete(&key).await?;
            }
        }
        Ok(existed)
    }
}

#[cfg(test)]
#[path = "sessions/tests.rs"]
mod tests;
