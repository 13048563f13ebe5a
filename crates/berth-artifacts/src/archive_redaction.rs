//! Masking an archive (an agent CLI's session record) in place, and inside it an SQLite
//! write-ahead log: each frame carries a running checksum over every frame before it, so a
//! page masked in place would end the log there — SQLite drops every frame from the first bad
//! checksum on, and with them (in an agent CLI's session database) the conversation's last
//! turns. The frames that were valid before masking are summed again after it; the rest stay
//! as they were (invalid either way).
//!
//! Format: <https://www.sqlite.org/fileformat2.html#walformat> — a 32-byte header, then frames
//! of a 24-byte header and one page; every integer big-endian; the checksum's words read in
//! the byte order the magic names.

use crate::Redactor;

/// [`Redactor::redact`] over a tar archive, in place: the SQLite write-ahead logs in it
/// (`*-wal`) have the frames that were valid summed again, so a masked conversation database
/// still holds every turn. What cannot be read as an archive is masked as bytes. How many
/// values were masked.
pub fn redact_archive(redactor: &Redactor, archive: &mut [u8]) -> usize {
    let logs = write_ahead_logs(archive);
    let count = redactor.redact(archive);
    for (range, frames) in logs {
        sum_again(&mut archive[range], frames);
    }
    count
}

/// Where the SQLite write-ahead logs with valid frames are in a tar archive, and how many.
fn write_ahead_logs(archive: &[u8]) -> Vec<(std::ops::Range<usize>, usize)> {
    let mut found = Vec::new();
    let mut tar = tar::Archive::new(archive);
    let Ok(entries) = tar.entries() else {
        return found;
    };
    for entry in entries {
        let Ok(entry) = entry else {
            break;
        };
        if !entry.header().entry_type().is_file() || !entry.path_bytes().ends_with(b"-wal") {
            continue;
        }
        let start = entry.raw_file_position() as usize;
        let Some(end) = usize::try_from(entry.size())
            .ok()
            .and_then(|size| start.checked_add(size))
            .filter(|end| *end <= archive.len())
        else {
            break;
        };
        if let Some(frames @ 1..) = valid_frames(&archive[start..end]) {
            found.push((start..end, frames));
        }
    }
    found
}

const MAGIC_LITTLE: u32 = 0x377f_0682;
const MAGIC_BIG: u32 = 0x377f_0683;
const HEADER: usize = 32;
const FRAME_HEADER: usize = 24;

fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

/// The running checksum over `data` (a multiple of 8 bytes) from `sum`.
fn checksum(big_endian: bool, data: &[u8], sum: (u32, u32)) -> (u32, u32) {
    let (mut s0, mut s1) = sum;
    for pair in data.chunks_exact(8) {
        let word = |at: usize| {
            let bytes: [u8; 4] = pair[at..at + 4].try_into().expect("four bytes");
            if big_endian {
                u32::from_be_bytes(bytes)
            } else {
                u32::from_le_bytes(bytes)
            }
        };
        s0 = s0.wrapping_add(word(0)).wrapping_add(s1);
        s1 = s1.wrapping_add(word(4)).wrapping_add(s0);
    }
    (s0, s1)
}

/// A log's byte order and page size, when `wal` starts with a WAL header.
fn layout(wal: &[u8]) -> Option<(bool, usize)> {
    if wal.len() < HEADER {
        return None;
    }
    let big_endian = match be32(wal, 0) {
        MAGIC_LITTLE => false,
        MAGIC_BIG => true,
        _ => return None,
    };
    let page = be32(wal, 8) as usize;
    (page.is_power_of_two() && (512..=65536).contains(&page)).then_some((big_endian, page))
}

/// How many frames of `wal` SQLite would read (`None`: not a write-ahead log).
fn valid_frames(wal: &[u8]) -> Option<usize> {
    let (big_endian, page) = layout(wal)?;
    let mut sum = checksum(big_endian, &wal[..24], (0, 0));
    if sum != (be32(wal, 24), be32(wal, 28)) {
        return Some(0);
    }
    let salts = &wal[16..24];
    let mut frames = 0;
    let mut at = HEADER;
    while at + FRAME_HEADER + page <= wal.len() {
        let frame = &wal[at..at + FRAME_HEADER + page];
        if be32(frame, 0) == 0 || &frame[8..16] != salts {
            break;
        }
        sum = checksum(big_endian, &frame[..8], sum);
        sum = checksum(big_endian, &frame[FRAME_HEADER..], sum);
        if sum != (be32(frame, 16), be32(frame, 20)) {
            break;
        }
        frames += 1;
        at += FRAME_HEADER + page;
    }
    Some(frames)
}

/// Sums the header and the first `frames` frames of `wal` again, after its bytes changed.
fn sum_again(wal: &mut [u8], frames: usize) {
    let Some((big_endian, page)) = layout(wal) else {
        return;
    };
    let mut sum = checksum(big_endian, &wal[..24], (0, 0));
    if frames > 0 {
        wal[24..28].copy_from_slice(&sum.0.to_be_bytes());
        wal[28..32].copy_from_slice(&sum.1.to_be_bytes());
    }
    for n in 0..frames {
        let at = HEADER + n * (FRAME_HEADER + page);
        let frame = &mut wal[at..at + FRAME_HEADER + page];
        sum = checksum(big_endian, &frame[..8], sum);
        sum = checksum(big_endian, &frame[FRAME_HEADER..], sum);
        frame[16..20].copy_from_slice(&sum.0.to_be_bytes());
        frame[20..24].copy_from_slice(&sum.1.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::redact_archive;
    use crate::Redactor;

    const SECRET: &str = "berth-gw-0123456789abcdef0123456789abcdef0123456789abcdef";

    /// A conversation database as a CLI leaves it: in WAL mode, every turn still in the log
    /// (no checkpoint), one turn quoting the secret; the files archived as a session record.
    fn session_record(dir: &std::path::Path) -> Vec<u8> {
        let db = dir.join("opencode.db");
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
             CREATE TABLE turn (n INTEGER PRIMARY KEY, text TEXT);",
        )
        .unwrap();
        for n in 1..=40 {
            let text = if n == 7 {
                format!("the tool printed BERTH_GATEWAY_TOKEN={SECRET}")
            } else {
                format!("turn {n} {}", "x".repeat(3000))
            };
            conn.execute(
                "INSERT INTO turn VALUES (?1, ?2)",
                rusqlite::params![n, text],
            )
            .unwrap();
        }
        // Archived while the CLI still has it open, as a killed or exiting CLI leaves it.
        let mut tar = tar::Builder::new(Vec::new());
        for name in ["opencode.db", "opencode.db-wal"] {
            tar.append_path_with_name(dir.join(name), format!(".local/share/opencode/{name}"))
                .unwrap();
        }
        drop(conn);
        tar.into_inner().unwrap()
    }

    /// The turns a reader finds in the archive's database.
    fn turns(archive: &[u8]) -> Vec<(i64, String)> {
        let dir = tempfile::tempdir().unwrap();
        tar::Archive::new(archive).unpack(dir.path()).unwrap();
        let conn = rusqlite::Connection::open(dir.path().join(".local/share/opencode/opencode.db"))
            .unwrap();
        let mut read = conn.prepare("SELECT n, text FROM turn ORDER BY n").unwrap();
        read.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_masked_write_ahead_log_keeps_every_turn() {
        let dir = tempfile::tempdir().unwrap();
        let original = session_record(dir.path());
        let redactor = Redactor::new([SECRET.to_owned()]);
        assert_eq!(turns(&original).len(), 40, "the log holds every turn");

        // Masked as plain bytes, the log ends at the masked page: turns are lost.
        let mut plain = original.clone();
        assert!(redactor.redact(&mut plain) >= 1);
        assert!(turns(&plain).len() < 40, "the control lost nothing");

        let mut masked = original.clone();
        assert!(redact_archive(&redactor, &mut masked) >= 1);
        assert_eq!(masked.len(), original.len());
        let kept = turns(&masked);
        assert_eq!(kept.len(), 40);
        assert_eq!(
            kept[6].1,
            format!(
                "the tool printed BERTH_GATEWAY_TOKEN={}",
                "*".repeat(SECRET.len())
            )
        );
        assert!(!masked.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()));
        assert!(kept[39].1.starts_with("turn 40 "));
    }

    #[test]
    fn frames_past_the_valid_end_stay_invalid_and_other_bytes_are_masked_as_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut archive = session_record(dir.path());
        // A torn write: the log's last frame has a wrong checksum.
        let position = archive
            .windows(4)
            .position(|w| {
                w == super::MAGIC_LITTLE.to_be_bytes() || w == super::MAGIC_BIG.to_be_bytes()
            })
            .unwrap();
        let size = {
            let mut tar = tar::Archive::new(&archive[..]);
            let entries: Vec<u64> = tar.entries().unwrap().map(|e| e.unwrap().size()).collect();
            entries[1] as usize
        };
        let wal = position..position + size;
        let frames = super::valid_frames(&archive[wal.clone()]).unwrap();
        assert!(frames > 10);
        let last = wal.end - 4;
        archive[last] ^= 0xff;
        assert_eq!(super::valid_frames(&archive[wal.clone()]), Some(frames - 1));
        let before = turns(&archive).len();
        redact_archive(&Redactor::new([SECRET.to_owned()]), &mut archive);
        assert_eq!(super::valid_frames(&archive[wal]), Some(frames - 1));
        assert_eq!(turns(&archive).len(), before);

        // Not an archive: masked all the same.
        let mut text = format!("x {SECRET} y").into_bytes();
        assert_eq!(redact_archive(&Redactor::default(), &mut text), 1);
        assert!(!String::from_utf8(text).unwrap().contains("berth-gw-0"));
    }
}
