//! Redaction before durability: one scanner over every byte Berth is about to make durable
//! (artifact bundles, the store, agent logs, the model gateway's journal).
//!
//! Known secret values handed to Berth (a proxy's credential, a login's tokens) and common
//! token shapes (`sk-…`, `berth-gw-…`, `ghp_…`, `AKIA…`, PEM private keys, …) are masked in
//! place with `*` of the same length, so the structure of what holds them (a tar archive, a
//! JSON line) survives and offsets stay true. Every mask is counted.

/// Token shapes: a prefix, then at least `min_tail` characters of `[A-Za-z0-9_-]`.
const PATTERNS: &[(&str, usize)] = &[
    ("sk-", 20),
    ("berth-gw-", 32),
    ("ghp_", 30),
    ("gho_", 30),
    ("ghs_", 30),
    ("github_pat_", 30),
    ("glpat-", 20),
    ("xoxb-", 20),
    ("xoxp-", 20),
    ("AKIA", 16),
    ("ASIA", 16),
    ("hf_", 30),
];

const PEM_BEGIN: &[u8] = b"-----BEGIN ";
const PEM_PRIVATE: &[u8] = b"PRIVATE KEY-----";
const PEM_END: &[u8] = b"-----END ";

/// Shortest known value worth scanning for (shorter ones would mask ordinary text).
pub const MIN_SECRET_LEN: usize = 8;

/// Masks secrets in byte strings.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

fn token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

impl Redactor {
    /// A redactor for these known values (empty and too-short ones are ignored).
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Redactor {
        let mut secrets: Vec<Vec<u8>> = secrets
            .into_iter()
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .map(String::into_bytes)
            .collect();
        // Longest first, so a value containing another is masked whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redactor { secrets }
    }

    /// Masks every known value and token shape in `bytes`; how many were masked.
    pub fn redact(&self, bytes: &mut [u8]) -> usize {
        let mut count = self.redact_known(bytes);
        count += mask_patterns(bytes);
        count += mask_pem(bytes);
        count
    }

    /// The longest known value (a stream that writes in parts holds back at least this much,
    /// so a value is never split by a cut).
    pub fn longest_known(&self) -> usize {
        self.secrets.first().map_or(0, Vec::len)
    }

    /// Masks the known values only: each match is whole, so this is safe on a prefix of a
    /// stream (a value cut by its end is not found, not half-masked).
    pub fn redact_known(&self, bytes: &mut [u8]) -> usize {
        let mut count = 0;
        for secret in &self.secrets {
            let mut at = 0;
            while let Some(found) = find(&bytes[at..], secret) {
                let start = at + found;
                mask(&mut bytes[start..start + secret.len()]);
                count += 1;
                at = start + secret.len();
            }
        }
        count
    }
}

/// Whether `b` can be part of a token shape (a stream is cut only between such runs).
pub fn is_token_byte(b: u8) -> bool {
    token_byte(b)
}

fn mask(bytes: &mut [u8]) {
    bytes.fill(b'*');
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    memchr::memmem::find(haystack, needle)
}

/// Finds where some token shape's prefix starts (SIMD-prefiltered, so clean bytes are skipped
/// at memory speed instead of being looked at one by one).
fn prefixes() -> &'static aho_corasick::AhoCorasick {
    static FINDER: std::sync::OnceLock<aho_corasick::AhoCorasick> = std::sync::OnceLock::new();
    FINDER.get_or_init(|| {
        aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostFirst)
            .build(PATTERNS.iter().map(|(prefix, _)| prefix))
            .expect("the token prefixes build an automaton")
    })
}

fn mask_patterns(bytes: &mut [u8]) -> usize {
    let mut count = 0;
    let mut i = 0;
    while i < bytes.len() {
        let Some(found) = prefixes().find(aho_corasick::Input::new(&*bytes).span(i..bytes.len()))
        else {
            break;
        };
        i = found.start();
        // A token starts at a boundary (not in the middle of a longer word).
        if i > 0 && token_byte(bytes[i - 1]) {
            i += 1;
            continue;
        }
        let mut matched = None;
        for (prefix, min_tail) in PATTERNS {
            let p = prefix.as_bytes();
            if bytes[i..].starts_with(p) {
                let tail = bytes[i + p.len()..]
                    .iter()
                    .take_while(|b| token_byte(**b))
                    .count();
                if tail >= *min_tail {
                    matched = Some(p.len() + tail);
                    break;
                }
            }
        }
        match matched {
            Some(len) => {
                mask(&mut bytes[i..i + len]);
                count += 1;
                i += len;
            }
            None => i += 1,
        }
    }
    count
}

fn mask_pem(bytes: &mut [u8]) -> usize {
    let mut count = 0;
    let mut at = 0;
    while let Some(found) = find(&bytes[at..], PEM_BEGIN) {
        let start = at + found;
        let header_end = bytes[start..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(bytes.len(), |p| start + p);
        if find(&bytes[start..header_end], PEM_PRIVATE).is_none() {
            at = start + PEM_BEGIN.len();
            continue;
        }
        let end = find(&bytes[header_end..], PEM_END).map_or(bytes.len(), |p| header_end + p);
        // The key material between the header and the footer.
        mask(&mut bytes[header_end..end]);
        count += 1;
        at = end.max(start + 1);
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redacted(r: &Redactor, text: &str) -> (String, usize) {
        let mut bytes = text.as_bytes().to_vec();
        let n = r.redact(&mut bytes);
        (String::from_utf8(bytes).unwrap(), n)
    }

    #[test]
    fn known_values_and_token_shapes_are_masked_in_place() {
        let r = Redactor::new(["canary-9f2c1e-do-not-leak".to_owned(), "short".to_owned()]);
        let (out, n) = redacted(
            &r,
            "key=canary-9f2c1e-do-not-leak and short stays; sk-ant-api03-abcdefghijklmnopqrstu ok",
        );
        assert_eq!(n, 2, "{out}");
        assert!(!out.contains("canary") && !out.contains("sk-ant"), "{out}");
        assert!(out.contains("short stays"), "{out}");
        assert_eq!(
            out.len(),
            "key=canary-9f2c1e-do-not-leak and short stays; sk-ant-api03-abcdefghijklmnopqrstu ok"
                .len()
        );
        let (out, n) = redacted(&r, "task-sk-learn is fine; AKIAABCDEFGHIJKLMNOP is not");
        assert_eq!(n, 1, "{out}");
        assert!(out.contains("task-sk-learn"), "{out}");
        let token = format!("berth-gw-{}", "ab".repeat(24));
        let (out, n) = redacted(&r, &format!("{{\"x\":\"{token}\"}}"));
        assert_eq!((n, out.contains("berth-gw")), (1, false), "{out}");
    }

    #[test]
    fn every_token_is_found_among_near_misses_and_at_the_edges() {
        let r = Redactor::default();
        let tail = "x".repeat(40);
        // At the very start and end, after a too-short one, inside a word (kept), twice.
        let text = format!("ghp_{tail} sk-short xsk-{tail} sk-sk-{tail};AKIAABCDEFGHIJKLMNOP");
        let (out, n) = redacted(&r, &text);
        assert_eq!(n, 3, "{out}");
        assert!(
            out.starts_with("****") && out.contains(" sk-short xsk-x"),
            "{out}"
        );
        assert!(out.ends_with(";********************"), "{out}");
        assert!(!out.contains("ghp_") && !out.contains("AKIA"), "{out}");
    }

    #[test]
    fn pem_private_keys_lose_their_body_and_certificates_do_not() {
        let r = Redactor::default();
        let text = "a\n-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB\n-----END EC PRIVATE KEY-----\nb\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let (out, n) = redacted(&r, text);
        assert_eq!(n, 1);
        assert!(!out.contains("MHcCAQEEIB") && out.contains("MIIB"), "{out}");
        assert!(out.contains("-----END EC PRIVATE KEY-----"));
    }

    #[test]
    fn known_values_alone_are_masked_whole_or_not_at_all() {
        let r = Redactor::new(["canary-9f2c1e-do-not-leak".to_owned()]);
        assert_eq!(r.longest_known(), "canary-9f2c1e-do-not-leak".len());
        // Cut by the end of what has arrived: not found, not half-masked; token shapes untouched.
        let mut cut = b"x canary-9f2c1e-do-n sk-aaaaaaaaaaaaaaaaaaaaaaaaa".to_vec();
        assert_eq!(r.redact_known(&mut cut), 0);
        assert_eq!(&cut, b"x canary-9f2c1e-do-n sk-aaaaaaaaaaaaaaaaaaaaaaaaa");
        let mut whole = b"x canary-9f2c1e-do-not-leak y".to_vec();
        assert_eq!(r.redact_known(&mut whole), 1);
        assert_eq!(&whole, b"x ************************* y");
        assert!(is_token_byte(b'a') && !is_token_byte(b' ') && !is_token_byte(b'*'));
    }
}
