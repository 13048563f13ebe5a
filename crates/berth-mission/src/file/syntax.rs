//! A TOML syntax error told in bounded words. The parser's own display repeats the whole line
//! it failed on: for a hostile one-line file, a megabyte of error.

/// Characters of the failing line shown on each side of the error.
const CONTEXT: usize = 40;
/// Characters of the parser's message kept (it quotes a value of the wrong type whole).
const MESSAGE: usize = 240;

/// "line L, column C: MESSAGE", then at most [`CONTEXT`] characters of the line on each side
/// of the error (escaped, so no control character reaches a terminal) and a caret under it.
pub(super) fn describe(text: &str, err: &toml::de::Error) -> String {
    let message = escape_controls(&err.message().trim_end().replace('\n', "; "));
    let message = match message.char_indices().nth(MESSAGE) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message,
    };
    let Some(at) = err.span().map(|span| span.start.min(text.len())) else {
        return message;
    };
    let at = (0..=at)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let line = text[..at].matches('\n').count() + 1;
    let column = text[line_start..at].chars().count() + 1;
    let before_all = &text[line_start..at];
    let skipped = before_all.chars().count().saturating_sub(CONTEXT);
    let before: String = before_all.chars().skip(skipped).collect();
    let after_all = &text[at..line_end];
    let after: String = after_all.chars().take(CONTEXT).collect();
    let lead = if skipped > 0 { "…" } else { "" };
    let tail = if after_all.chars().count() > CONTEXT {
        "…"
    } else {
        ""
    };
    let before = format!("{lead}{}", escape_controls(&before));
    let after = format!("{}{tail}", escape_controls(&after));
    let caret = " ".repeat(before.chars().count());
    format!("line {line}, column {column}: {message}\n  | {before}{after}\n  | {caret}^")
}

/// The text with each control character written as its escape (`\u{1b}`), the rest as is.
fn escape_controls(text: &str) -> String {
    text.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}
