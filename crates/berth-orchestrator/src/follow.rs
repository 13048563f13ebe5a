//! Following a log file that another process appends to, by (file identity, byte offset).
//!
//! A watcher that connects late starts at offset 0 and replays; one that reconnects resumes
//! from its offset; when the file is replaced (a rerun after a crash creates it anew) or cut
//! shorter than the offset, the follower starts over from 0 and says so. Only whole lines are
//! returned; a line being written stays buffered until its newline arrives.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// How often watchers poll (the monitor's latency floor).
pub const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(25);

/// The most bytes read per poll (the rest comes on the next one).
const MAX_READ: u64 = 4 << 20;

/// What one poll found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Polled {
    /// Whole new lines, without their newline.
    pub lines: Vec<String>,
    /// The file was replaced or truncated: these lines start over from its beginning.
    pub restarted: bool,
    /// The file does not exist (yet).
    pub missing: bool,
}

/// A follower of one file.
#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    identity: Option<(u64, u64)>,
    offset: u64,
    partial: Vec<u8>,
    modified: Option<SystemTime>,
}

impl Follower {
    /// Follows `path` from its beginning.
    pub fn new(path: &Path) -> Follower {
        Follower {
            path: path.to_owned(),
            identity: None,
            offset: 0,
            partial: Vec::new(),
            modified: None,
        }
    }

    /// The byte offset of the next unread byte (after the last whole line returned).
    pub fn offset(&self) -> u64 {
        self.offset - self.partial.len() as u64
    }

    /// When the file last changed, as of the last poll.
    pub fn modified(&self) -> Option<SystemTime> {
        self.modified
    }

    /// Reads what was appended since the last poll.
    pub fn poll(&mut self) -> std::io::Result<Polled> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Polled {
                    missing: true,
                    ..Polled::default()
                })
            }
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other(format!(
                "{} is not a regular file",
                self.path.display()
            )));
        }
        self.modified = meta.modified().ok();
        let identity = (meta.dev(), meta.ino());
        let mut polled = Polled::default();
        if self.identity.is_some_and(|seen| seen != identity) || meta.len() < self.offset {
            self.offset = 0;
            self.partial.clear();
            polled.restarted = self.identity.is_some();
        }
        self.identity = Some(identity);
        if meta.len() == self.offset {
            return Ok(polled);
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.take(MAX_READ).read_to_end(&mut bytes)?;
        self.offset += bytes.len() as u64;
        self.partial.extend_from_slice(&bytes);
        while let Some(at) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=at).collect();
            polled
                .lines
                .push(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
        }
        Ok(polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn follows_appends_holds_partial_lines_and_replays_a_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut f = Follower::new(&path);
        assert!(f.poll().unwrap().missing);
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(b"one\ntw").unwrap();
        assert_eq!(f.poll().unwrap().lines, ["one"]);
        assert_eq!(f.offset(), 4);
        file.write_all(b"o\nthree\n").unwrap();
        assert_eq!(f.poll().unwrap().lines, ["two", "three"]);
        assert_eq!(f.poll().unwrap(), Polled::default());
        // Replaced (a rerun): new identity, replay from 0.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "again\n").unwrap();
        let polled = f.poll().unwrap();
        assert!(polled.restarted);
        assert_eq!(polled.lines, ["again"]);
        // Truncated in place: start over too.
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(0).unwrap();
        std::fs::write(&path, "x\n").unwrap();
        let polled = f.poll().unwrap();
        assert_eq!(polled.lines, ["x"]);
    }
}
