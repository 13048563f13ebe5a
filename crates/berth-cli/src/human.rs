//! Output for people: tables for long lists, colour only on a terminal, and a progress line on
//! long work. None of it appears with `--json` or when the stream is a pipe or a file.

use std::io::{IsTerminal, Write};

/// Whether colour may be used on stdout: a terminal, and neither `NO_COLOR` nor `TERM=dumb`.
pub fn colour_on_stdout(config: &crate::config::Config) -> bool {
    config.colour_allowed && std::io::stdout().is_terminal()
}

/// `text` safe to print on a terminal: every control character (C0, DEL, C1: escape sequences
/// that could retitle a window, move the cursor or hide what follows) is written as `\u{..}`,
/// except line breaks and tabs when `lines` says the text may span lines. Error messages and
/// table cells carry names and text from sandboxes and repositories.
pub fn printable(text: &str, lines: bool) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && !(lines && (c == '\n' || c == '\t'));
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A style for one cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// As is.
    Plain,
    /// Good news (VERIFIED, created).
    Good,
    /// Bad news (FAILED, destroy failed).
    Bad,
    /// Unknown or pending.
    Warn,
    /// Not applicable, closed.
    Dim,
}

impl Style {
    fn code(self) -> Option<&'static str> {
        match self {
            Style::Plain => None,
            Style::Good => Some("32"),
            Style::Bad => Some("31"),
            Style::Warn => Some("33"),
            Style::Dim => Some("2"),
        }
    }
}

/// A table: a header row and rows of cells, each cell with its style. Columns are as wide as
/// their widest cell (measured in characters, before any colour is added).
#[derive(Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<(String, Style)>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row of styled cells (each shown on one line, control characters escaped).
    pub fn styled_row(&mut self, cells: Vec<(String, Style)>) {
        self.rows.push(
            cells
                .into_iter()
                .map(|(cell, style)| (printable(&cell, false).into_owned(), style))
                .collect(),
        );
    }

    /// Appends a row of plain cells.
    pub fn row(&mut self, cells: impl IntoIterator<Item = String>) {
        self.styled_row(cells.into_iter().map(|cell| (cell, Style::Plain)).collect());
    }

    /// The rendered table, one line per row, the last column unpadded.
    pub fn render(&self, colour: bool) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, (cell, _)) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let line = |cells: &mut dyn Iterator<Item = (&str, Style)>, out: &mut String| {
            let mut parts = Vec::new();
            for (i, (cell, style)) in cells.enumerate().take(columns) {
                let pad = if i + 1 == columns {
                    0
                } else {
                    widths[i].saturating_sub(cell.chars().count())
                };
                let text = match style.code().filter(|_| colour) {
                    Some(code) => format!("\x1b[{code}m{cell}\x1b[0m"),
                    None => cell.to_owned(),
                };
                parts.push(format!("{text}{}", " ".repeat(pad)));
            }
            out.push_str(parts.join("  ").trim_end());
            out.push('\n');
        };
        let header_style = if colour { Style::Dim } else { Style::Plain };
        line(
            &mut self.headers.iter().map(|h| (h.as_str(), header_style)),
            &mut out,
        );
        for row in &self.rows {
            line(&mut row.iter().map(|(c, s)| (c.as_str(), *s)), &mut out);
        }
        out
    }
}

/// A one-line progress display on stderr, rewritten in place; silent unless stderr is a
/// terminal and the command is not in `--json` mode.
#[derive(Debug)]
pub struct Progress {
    on: bool,
}

impl Progress {
    /// A progress line for this invocation.
    pub fn new(json: bool) -> Progress {
        Progress {
            on: !json && std::io::stderr().is_terminal(),
        }
    }

    /// Replaces the line with `message`.
    pub fn show(&self, message: &str) {
        if self.on {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{}", printable(message, false));
            let _ = err.flush();
        }
    }

    /// Clears the line (before normal output follows).
    pub fn clear(&self) {
        if self.on {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_colour_only_when_asked() {
        let mut table = Table::new(&["ID", "STATE"]);
        table.styled_row(vec![
            ("bx-1".into(), Style::Plain),
            ("created".into(), Style::Good),
        ]);
        table.styled_row(vec![
            ("bx-long-name".into(), Style::Plain),
            ("verified_gone".into(), Style::Plain),
        ]);
        let plain = table.render(false);
        assert_eq!(
            plain,
            "ID            STATE\nbx-1          created\nbx-long-name  verified_gone\n"
        );
        assert!(!plain.contains('\x1b'));
        let coloured = table.render(true);
        assert!(coloured.contains("\x1b[32mcreated\x1b[0m"), "{coloured:?}");
        // Colour never changes the layout: stripped of escapes, it is the plain table.
        let stripped = coloured
            .replace("\x1b[32m", "")
            .replace("\x1b[2m", "")
            .replace("\x1b[0m", "");
        assert_eq!(stripped, plain);
    }

    #[test]
    fn control_characters_are_shown_never_sent() {
        let hostile = "a\x1b]0;pwned\x07b\x1b[2Jc\u{9b}31md\x7fe";
        let shown = printable(hostile, true);
        assert_eq!(
            shown,
            "a\\u{1b}]0;pwned\\u{7}b\\u{1b}[2Jc\\u{9b}31md\\u{7f}e"
        );
        assert!(!shown.chars().any(char::is_control));
        // Messages keep their lines and tabs; a table cell or a progress line does not.
        assert_eq!(printable("one\n\ttwo", true), "one\n\ttwo");
        assert_eq!(printable("one\n\ttwo", false), "one\\u{a}\\u{9}two");
        assert!(matches!(
            printable("plain é 名", true),
            std::borrow::Cow::Borrowed(_)
        ));
        let mut table = Table::new(&["ID", "STATE"]);
        table.styled_row(vec![
            ("bx-\x1b[8m".into(), Style::Plain),
            ("x\ny".into(), Style::Good),
        ]);
        let rendered = table.render(false);
        assert_eq!(rendered, "ID            STATE\nbx-\\u{1b}[8m  x\\u{a}y\n");
    }
}
