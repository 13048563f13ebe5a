//! The per-attempt journal: one JSON line per model request, redacted.
//!
//! Credentials never reach it: authorization headers are replaced by `[redacted]`, and every
//! secret value the gateway knows (a proxy's credential) is scrubbed from each line before it is
//! written. Bodies are kept (they are the trajectory's source), each bounded.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::script::Usage;

/// The journal's schema name; every line carries it.
pub const JOURNAL_SCHEMA: &str = "berth.gateway.journal/v1";

/// The most body bytes a journal line keeps (request and response each).
pub const MAX_JOURNALED_BODY: usize = 1 << 20;

/// Headers whose values are never journaled.
const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "proxy-authorization",
    "x-berth-token",
    "cookie",
    "set-cookie",
];

/// One journal line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Always [`JOURNAL_SCHEMA`].
    pub schema: String,
    /// The attempt the request's token belongs to.
    pub attempt: String,
    /// 0, 1, … per attempt, in the order requests finished.
    pub seq: u64,
    /// When the request arrived (milliseconds since the Unix epoch).
    pub at_unix_ms: u64,
    /// How long the gateway took to answer, up to the end of the response body.
    pub latency_ms: f64,
    /// `openai-chat`, `openai-responses` or `anthropic-messages`.
    pub dialect: String,
    /// `scripted` or `proxy`.
    pub upstream: String,
    /// The request's path (with query).
    pub path: String,
    /// The model the request named.
    pub model: Option<String>,
    /// Whether the answer streamed.
    pub stream: bool,
    /// The HTTP status answered.
    pub status: u16,
    /// Scripted: the step answered (0-based).
    pub step: Option<usize>,
    /// Request headers, secrets redacted.
    pub request_headers: BTreeMap<String, String>,
    /// The request body (bounded; see `request_truncated`).
    pub request_body: String,
    /// Whether `request_body` was cut at [`MAX_JOURNALED_BODY`].
    pub request_truncated: bool,
    /// The response body (bounded).
    pub response_body: String,
    /// Whether `response_body` was cut at [`MAX_JOURNALED_BODY`].
    pub response_truncated: bool,
    /// Tokens, when the response reported them (cached input counted once, inside `input`).
    pub usage: Option<Usage>,
    /// Cost in US dollars, when a price table names the model.
    pub cost_usd: Option<f64>,
    /// Why `cost_usd` is missing.
    pub cost_unknown: Option<String>,
}

/// Keeps at most [`MAX_JOURNALED_BODY`] bytes of `bytes` (at a character boundary).
pub(crate) fn bounded(bytes: &[u8]) -> (String, bool) {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_JOURNALED_BODY)]);
    (text.into_owned(), bytes.len() > MAX_JOURNALED_BODY)
}

/// Request headers with secret values replaced.
pub(crate) fn redacted_headers(headers: &hyper::HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .map(|(name, value)| {
            let name = name.as_str().to_ascii_lowercase();
            let value = if SECRET_HEADERS.contains(&name.as_str()) {
                "[redacted]".to_owned()
            } else {
                String::from_utf8_lossy(value.as_bytes()).into_owned()
            };
            (name, value)
        })
        .collect()
}

/// An attempt's journal file.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    next: AtomicU64,
    file: Mutex<Option<std::fs::File>>,
}

impl Journal {
    /// A journal appending to `path` (created on the first line, mode 0600).
    pub fn new(path: PathBuf) -> Journal {
        Journal {
            path,
            next: AtomicU64::new(0),
            file: Mutex::new(None),
        }
    }

    /// Where it writes.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Appends `entry` (its `seq` assigned here), scrubbing every value of `secrets`.
    pub(crate) fn append(&self, mut entry: Entry, secrets: &[String]) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        entry.seq = self.next.fetch_add(1, Ordering::SeqCst);
        let mut line = serde_json::to_string(&entry).map_err(std::io::Error::other)?;
        for secret in secrets.iter().filter(|s| !s.is_empty()) {
            line = line.replace(secret.as_str(), "[redacted]");
            // The JSON-escaped form too (a secret with quotes or backslashes).
            let escaped = Value::String(secret.clone()).to_string();
            let escaped = &escaped[1..escaped.len() - 1];
            if escaped != secret {
                line = line.replace(escaped, "[redacted]");
            }
        }
        // Then the one scanner every durable byte goes through: token shapes in the bodies
        // (a tool's output the agent sends back to the model) are masked too.
        let mut line = line.into_bytes();
        berth_redact::Redactor::new(secrets.iter().cloned()).redact(&mut line);
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if file.is_none() {
            *file = Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                    .open(&self.path)?,
            );
        }
        file.as_mut().expect("opened above").write_all(&line)
    }

    /// Reads every line back (tests, trajectories).
    pub fn read(path: &std::path::Path) -> std::io::Result<Vec<Entry>> {
        std::fs::read_to_string(path)?
            .lines()
            .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
            .collect()
    }
}
