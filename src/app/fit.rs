//! Output that fits a terminal: tables at most [`WIDTH`] columns wide by default (`--wide` lifts
//! the bound), cells wrapped rather than cut, and prose lines wrapped at the same width.

use comfy_table::{presets::UTF8_BORDERS_ONLY, ContentArrangement, Table};

/// The width every default table and line of `status`, `runs` and the demo fits in.
pub(crate) const WIDTH: u16 = 100;

/// A table with tidemark's look: at most [`WIDTH`] columns (cells wrap at word boundaries),
/// or as wide as its contents with `wide`.
pub(crate) fn table(wide: bool) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    if !wide {
        t.set_content_arrangement(ContentArrangement::Dynamic)
            .set_width(WIDTH);
    }
    t
}

/// `text` with every line longer than [`WIDTH`] wrapped at word boundaries; continuation lines
/// are indented two spaces more than the line they continue. Table lines are left alone (a
/// table is fitted by [`table`]), and so is a single word longer than the width (a path must
/// stay whole to be pasted).
pub(crate) fn wrap(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        if textwrap::core::display_width(body) <= WIDTH as usize || is_table_line(body) {
            out.push_str(line);
            continue;
        }
        let indent = &body[..body.len() - body.trim_start().len()];
        let more = format!("{indent}  ");
        let opts = textwrap::Options::new(WIDTH as usize)
            .initial_indent(indent)
            .subsequent_indent(&more)
            .break_words(false);
        out.push_str(&textwrap::fill(body.trim_start(), &opts));
        out.push_str(end);
    }
    out
}

fn is_table_line(line: &str) -> bool {
    line.trim_start()
        .starts_with(['│', '┌', '└', '╞', '├', '╭', '╰'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_wrap_within_the_width_and_keep_their_words() {
        let long = format!("    {}", "payments restated whole ".repeat(10));
        let wrapped = wrap(&format!("short\n{long}\n"));
        assert!(wrapped.starts_with("short\n"));
        for line in wrapped.lines() {
            assert!(line.chars().count() <= WIDTH as usize, "{line}");
        }
        let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(words(&wrapped), words(&format!("short {long}")));
        assert!(wrapped
            .lines()
            .nth(2)
            .unwrap_or("")
            .starts_with("      payments"));
    }

    #[test]
    fn a_word_longer_than_the_width_is_not_broken() {
        let path = format!("/{}", "x".repeat(120));
        assert_eq!(wrap(&format!("see {path}\n")), format!("see\n  {path}\n"));
    }

    #[test]
    fn tables_fit_the_width_by_wrapping_cells() {
        let mut t = table(false);
        t.set_header(vec!["a", "error"]);
        t.add_row(vec!["1".to_string(), "word ".repeat(60)]);
        let text = t.to_string();
        assert!(
            text.lines().all(|l| l.chars().count() <= WIDTH as usize),
            "{text}"
        );
        assert!(text.contains("word word"), "{text}");
        let mut wide = table(true);
        wide.add_row(vec!["1".to_string(), "word ".repeat(60)]);
        assert!(wide
            .to_string()
            .lines()
            .any(|l| l.chars().count() > WIDTH as usize));
    }
}
